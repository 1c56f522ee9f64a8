#pragma once
// Device-memory communicators (GridOptions::comm = nccl, mpi_staged) come
// from summa's CUDA component (libsumma_cuda, summa::cuda), which registers
// their factory here when the dynamic loader loads it (linked by the
// program, or loaded on first use: load_cuda_component); libsumma links no
// CUDA library (src/backend/cuda_component.hpp has the device side).
// Internal to the build: not installed.

#include <mpi.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "summa/comm/communicator.hpp"
#include "summa/grid/process_grid.hpp"

namespace summa::detail {

/// A device-memory communicator over `comm` (owned) for options.comm.
using DeviceCommunicatorFactory = std::unique_ptr<Communicator> (*)(MPI_Comm comm, CommAxis axis,
                                                                    TrafficCounter* counter,
                                                                    const GridOptions& options);

/// Called once by libsumma_cuda's static initialiser.
void register_device_communicators(DeviceCommunicatorFactory factory) noexcept;

/// The registered factory, or null when the program does not load the component.
DeviceCommunicatorFactory device_communicators() noexcept;

/// Why `what` cannot run in a summa built without CUDA.
std::string cuda_component_missing(std::string_view what);

/// Makes the CUDA component's factories (device and communicators)
/// available: registered already when the program links summa::cuda, else
/// libsumma_cuda is loaded on first use (dlopen, beside libsumma first), so a
/// CPU run of a CUDA build loads no CUDA library. Null when they are
/// registered, else why not (naming `what`). Local: callers agree on it.
std::optional<std::string> load_cuda_component(std::string_view what);

}  // namespace summa::detail

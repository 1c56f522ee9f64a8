#pragma once
// The CUDA device (make_device with backend "cuda") comes from summa's CUDA
// component (libsumma_cuda, summa::cuda), which registers its factory here
// when the dynamic loader loads it (linked, or loaded on first use:
// load_cuda_component in ../grid/device_communicators.hpp), next to the device communicators
// (src/grid/device_communicators.hpp). libsumma links no CUDA library.
// Internal to the build: not installed.

#include <mpi.h>

#include "../grid/device_communicators.hpp"
#include "summa/backend/device.hpp"

namespace summa::detail {

/// Fills `out` (backend, grid.compute_stream, name) with a CudaBackend on
/// the node-local rank's GPU; collective over `comm`. The options are
/// already checked; `comm_kind` is CommBackend::nccl or mpi_staged.
using CudaDeviceFactory = void (*)(MPI_Comm comm, const DeviceOptions& options,
                                   CommBackend comm_kind, Device& out);
/// The GPUs the process sees (0 without a driver or device; never throws).
using CudaDeviceCount = int (*)() noexcept;

/// Called once by libsumma_cuda's static initialiser.
void register_cuda_device(CudaDeviceFactory factory, CudaDeviceCount count) noexcept;

/// The registered factory, or null when the program does not load the component.
CudaDeviceFactory cuda_device() noexcept;

}  // namespace summa::detail

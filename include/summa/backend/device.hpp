#pragma once
/// \file device.hpp
/// The device factory: the backend of a rank and the communicators that go
/// with it, chosen by name — what a program (gpt_train, the benchmarks, the
/// tests) needs to run "on cpu" or "on cuda" without knowing the CUDA types.
///
///   summa::Device d = summa::make_device(MPI_COMM_WORLD, {.backend = "cuda"});
///   summa::ProcessGrid grid = summa::make_grid(MPI_COMM_WORLD, spec, d.grid);
///   ... layers on *d.backend ...

#include <mpi.h>

#include <memory>
#include <string>

#include "summa/backend/backend.hpp"
#include "summa/grid/process_grid.hpp"

namespace summa {

struct DeviceOptions {
  /// "cpu" (CpuBackend), "cpu_device" (CpuBackend emulating device memory,
  /// for tests) or "cuda" (CudaBackend on the node-local rank's GPU).
  std::string backend = "cpu";
  /// The grid's communicators: "mpi" (host memory; the default on the cpu
  /// backends), or on cuda "nccl" (one GPU per rank; the default) or
  /// "mpi_staged" (MPI through pinned host buffers; ranks may share a GPU).
  std::string comm{};
  /// cpu: the GEMM library (CpuOptions::gemm: "eigen", "openblas", "blis",
  /// "mkl"; "" for the default, $SUMMA_CPU_GEMM or the configured one).
  std::string cpu_gemm{};
  /// cpu: the threads of a rank's GEMMs (CpuOptions::threads).
  int threads = 1;
  /// cuda: TF32 tensor cores in float GEMMs.
  bool tf32 = false;
  /// cuda: check that every op's pointers are device memory (tests).
  bool check_pointers = false;
  /// The program's own grid options (placement, ranks per node, the
  /// watchdog, staging bytes): Device::grid is these with the device's
  /// communicators (comm, compute_stream) set, so nothing a program chose is
  /// lost on the way to its communicators.
  GridOptions grid{};
};

struct Device {
  std::unique_ptr<Backend> backend;
  /// DeviceOptions::grid with the backend's communicators (and its stream on
  /// cuda) set; pass to the grid (make_grid, ParallelGpt,
  /// TrainerOptions::grid).
  GridOptions grid;
  /// "cpu", or the GPU's name.
  std::string name = "cpu";
};

/// The backend and communicators of `options` for the calling rank.
/// Collective over `comm` (on cuda, select_device_for_rank: the node-local
/// rank's GPU). Throws summa::Error, the same on every rank, for an unknown
/// backend or communicator, a combination that cannot work (MPI
/// communicators with device memory, a device communicator or TF32 on the
/// cpu), a CPU GEMM library that does not load on some rank or differs between
/// ranks, or cuda in a build without CUDA or where the CUDA component
/// (libsumma_cuda) cannot be loaded: a program need not link summa::cuda,
/// libsumma loads the component beside it on first use, so a CPU run loads
/// no CUDA library.
Device make_device(MPI_Comm comm, const DeviceOptions& options);

/// The GPUs this process sees (cudaGetDeviceCount), through the CUDA
/// component (loaded on first use as make_device does); 0 in a build without
/// CUDA, where the component or its CUDA libraries cannot be loaded, or
/// without a driver or device. Local, never throws.
int cuda_device_count() noexcept;

}  // namespace summa

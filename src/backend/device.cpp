#include "summa/backend/device.hpp"

#include <fmt/format.h>

#include "summa/backend/cpu_backend.hpp"
#include "summa/build_info.hpp"
#if SUMMA_HAVE_CUDA
#include <cuda_runtime.h>

#include "summa/backend/cuda_backend.hpp"
#include "summa/comm/nccl_communicator.hpp"
#endif

namespace summa {

Device make_device(MPI_Comm comm, const DeviceOptions& o) {
  // Checked from the options alone: the same outcome on every rank.
  const bool cuda = o.backend == "cuda";
  require(cuda || o.backend == "cpu" || o.backend == "cpu_device", [&] {
    return fmt::format("device: backend '{}' is not one of cpu, cuda (or cpu_device)", o.backend);
  });
  const std::string c = o.comm.empty() ? (cuda ? "nccl" : "mpi") : o.comm;
  require(c == "mpi" || c == "nccl" || c == "mpi_staged", [&] {
    return fmt::format("device: communicators '{}' are not one of mpi, nccl, mpi_staged", c);
  });
  Device d;
  if (!cuda) {
    require(c == "mpi", [&] {
      return fmt::format(
          "device: communicators '{}' carry device memory and need the cuda backend (the {} "
          "backend uses mpi)",
          c, o.backend);
    });
    require(!o.tf32, "device: TF32 applies to the cuda backend only");
    d.backend = std::make_unique<CpuBackend>(o.backend == "cpu_device");
    d.grid.comm = CommBackend::mpi;
    return d;
  }
  require(c != "mpi",
          "device: the cuda backend with mpi communicators: MPI communicators cannot take device "
          "memory; use nccl (one GPU per rank) or mpi_staged (ranks may share a GPU)");
#if SUMMA_HAVE_CUDA
  CudaOptions co;
  co.device = select_device_for_rank(comm);  // collective; throws on every rank without a GPU
  co.allow_tf32 = o.tf32;
  co.check_pointers = o.check_pointers;
  auto backend = std::make_unique<CudaBackend>(co);
  d.grid.comm = c == "nccl" ? CommBackend::nccl : CommBackend::mpi_staged;
  d.grid.compute_stream = backend->stream();
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, co.device) == cudaSuccess) d.name = prop.name;
  d.backend = std::move(backend);
  return d;
#else
  (void)comm;
  throw Error(
      "device: the cuda backend: this summa was built without CUDA (summa/build_info.hpp "
      "SUMMA_HAVE_CUDA=0; configure with -DSUMMA_CUDA=ON where the CUDA toolkit, cuBLAS and NCCL "
      "are installed)");
#endif
}

}  // namespace summa

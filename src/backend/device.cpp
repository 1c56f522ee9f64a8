#include "summa/backend/device.hpp"

#include <fmt/format.h>

#include <sched.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "cuda_component.hpp"
#include "summa/backend/cpu_backend.hpp"
#include "summa/comm/consensus.hpp"

namespace summa {

namespace detail {
namespace {
constinit CudaDeviceFactory registered_cuda_device = nullptr;
constinit CudaDeviceCount registered_cuda_device_count = nullptr;
}  // namespace

void register_cuda_device(CudaDeviceFactory factory, CudaDeviceCount count) noexcept {
  registered_cuda_device = factory;
  registered_cuda_device_count = count;
}

CudaDeviceFactory cuda_device() noexcept {
  return registered_cuda_device;
}
}  // namespace detail

namespace {

// More GEMM threads than the cores a rank may run on (its CPU affinity, as
// mpirun binds ranks to one core each by default) makes the threads share
// those cores and spin at BLIS's barriers: several times slower than one
// thread. Said once, by rank 0, with the fix.
void warn_if_threads_share_cores(MPI_Comm comm, int threads) {
  if (threads <= 1) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  int cores = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : threads;
  int fewest = cores;
  MPI_Allreduce(&cores, &fewest, 1, MPI_INT, MPI_MIN, comm);
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  if (fewest < threads && rank == 0)
    std::fprintf(stderr,
                 "summa: warning: %d GEMM threads per rank, but a rank may run on only %d "
                 "core(s) (its CPU affinity): the threads share them. Launch with mpirun "
                 "--map-by slot:PE=%d (or --bind-to none).\n",
                 threads, fewest, threads);
}

}  // namespace

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
  d.grid = o.grid;  // what the program chose; the communicators are set below
  if (!cuda) {
    require(c == "mpi", [&] {
      return fmt::format(
          "device: communicators '{}' carry device memory and need the cuda backend (the {} "
          "backend uses mpi)",
          c, o.backend);
    });
    require(!o.tf32, "device: TF32 applies to the cuda backend only");
    require(o.threads >= 1,
            [&] { return fmt::format("device: threads {} (at least 1)", o.threads); });
    // Collective: a library that loads on some ranks only, or a different
    // one per rank (rounding would differ, replicas drift), is the same
    // error everywhere.
    std::optional<std::string> error;
    std::int64_t which = -1;
    try {
      auto cpu = std::make_unique<CpuBackend>(CpuOptions{
          .gemm = o.cpu_gemm, .threads = o.threads, .emulate_device = o.backend == "cpu_device"});
      const std::vector<std::string> names = {"eigen", "openblas", "blis", "mkl"};
      which = std::find(names.begin(), names.end(), cpu->gemm_library()) - names.begin();
      d.backend = std::move(cpu);
    } catch (const Error& e) {
      error = std::string("device: ") + e.what();
    }
    const std::int64_t values[] = {which};
    const char* const names[] = {"the CPU GEMM library (SUMMA_CPU_GEMM)"};
    agree_on(comm, error, values, names, "device");
    warn_if_threads_share_cores(comm, o.threads);
    d.grid.comm = CommBackend::mpi;
    return d;
  }
  require(o.cpu_gemm.empty() && o.threads == 1,
          "device: a CPU GEMM library and threads apply to the cpu backend only");
  require(c != "mpi",
          "device: the cuda backend with mpi communicators: MPI communicators cannot take device "
          "memory; use nccl (one GPU per rank) or mpi_staged (ranks may share a GPU)");
  // libsumma_cuda: linked by the program or loaded now (dlopen); agreed, so
  // that a rank that cannot load it fails with the others.
  std::optional<std::string> error = detail::load_cuda_component("device: the cuda backend");
  if (!error && detail::cuda_device() == nullptr)
    error = "device: the cuda backend: summa's CUDA component registered no device";
  agree_on(comm, error);
  const detail::CudaDeviceFactory make_cuda = detail::cuda_device();
  make_cuda(comm, o, c == "nccl" ? CommBackend::nccl : CommBackend::mpi_staged, d);
  return d;
}

int cuda_device_count() noexcept {
  try {
    if (detail::load_cuda_component("cuda_device_count")) return 0;
  } catch (...) {  // formatting the reason ran out of memory: no device to report
    return 0;
  }
  return detail::registered_cuda_device_count != nullptr ? detail::registered_cuda_device_count()
                                                         : 0;
}

}  // namespace summa

#pragma once
// The device options the benchmarks share (--backend, --comm, --tf32) and
// the backend and grid options they select: CpuBackend with MPI, or
// CudaBackend on the node-local rank's GPU with mpi_staged / nccl
// communicators ordered with its stream (make_device: libsumma loads its CUDA
// component on first use, so the benchmarks link no CUDA library for it).

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <utility>

#include "../examples/flag_checks.hpp"
#include "summa/summa.hpp"

namespace summa::bench {

/// --cpu-gemm and --threads (registered by add_device_options, read by
/// make_backend: a benchmark has one device).
inline std::string cpu_gemm_flag;
inline int cpu_threads_flag = 1;

/// Registers --backend, --comm and --tf32 on `app`, bound to the three
/// settings; `backend_note` is appended to --backend's help, `tf32_help` is
/// --tf32's.
inline void add_device_options(CLI::App& app, std::string& backend, std::string& comm, bool& tf32,
                               const std::string& backend_note, const std::string& tf32_help) {
  app.add_option("--backend", backend,
                 "cpu (CpuBackend, MPI) or cuda (CudaBackend on the node-local rank's GPU; "
                 "needs a libsumma built with CUDA" +
                     backend_note + ")")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--comm", comm,
                 "cuda: communicators, mpi_staged (ranks may share a GPU) or nccl (one GPU "
                 "per rank)")
      ->check(CLI::IsMember({"mpi_staged", "nccl"}))
      ->capture_default_str();
  app.add_flag("--tf32", tf32, tf32_help);
  summa::flags::add_cpu_options(app, cpu_gemm_flag, cpu_threads_flag);
}

/// What make_backend selected.
struct BenchBackend {
  std::unique_ptr<Backend> backend;
  GridOptions grid;            ///< communicators for the backend (MPI on the CPU)
  std::string device = "cpu";  ///< the GPU's name on cuda
};

/// The backend of --backend / --comm / --tf32, chosen before the grid (the
/// communicators order their work with its stream). Throws `UsageError`
/// (the benchmark's own type, reported the same on every rank) for cuda in
/// a build without CUDA, and for --tf32 / --comm without cuda.
template <class UsageError>
BenchBackend make_backend(const std::string& backend, const std::string& comm, bool tf32,
                          bool comm_given, const char* program) {
  const bool cuda = backend == "cuda";
  if (cuda && !SUMMA_HAVE_CUDA)
    throw UsageError(std::string("--backend cuda: this ") + program +
                     " was built without CUDA (libsumma has SUMMA_HAVE_CUDA=0; configure with "
                     "-DSUMMA_CUDA=ON)");
  if (!cuda && (tf32 || comm_given)) throw UsageError("--tf32 and --comm need --backend cuda");
  BenchBackend out;
  if (cuda && (!cpu_gemm_flag.empty() || cpu_threads_flag != 1))
    throw UsageError("--cpu-gemm and --threads apply to --backend cpu only");
  summa::Device d = summa::make_device(MPI_COMM_WORLD, {.backend = backend,
                                                        .comm = cuda ? comm : std::string(),
                                                        .cpu_gemm = cpu_gemm_flag,
                                                        .threads = cpu_threads_flag,
                                                        .tf32 = tf32});
  out.backend = std::move(d.backend);
  out.grid = d.grid;
  out.device = d.name;
  return out;
}

}  // namespace summa::bench

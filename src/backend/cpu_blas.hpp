#pragma once
// The CPU backend's BLAS: a CBLAS library (OpenBLAS, BLIS or MKL) loaded at
// run time with dlopen(RTLD_LOCAL), so one build can run each library it
// finds (tests run every backend test against each; summa_gemm
// --compare-libraries times them side by side) and no two BLAS exporting the
// same symbols clash. Internal to src/backend.

#include <string>
#include <string_view>
#include <vector>

namespace summa::cpu_detail {

// CBLAS's enumerations (the same values in every CBLAS).
inline constexpr int kCblasRowMajor = 101, kCblasColMajor = 102;
inline constexpr int kCblasNoTrans = 111, kCblasTrans = 112;

struct BlasLibrary {
  using Sgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int,
                         float, float*, int);
  using Dgemm = void (*)(int, int, int, int, int, int, double, const double*, int, const double*,
                         int, double, double*, int);
  std::string name;              ///< "openblas", "blis" or "mkl"
  std::string path;              ///< the file dlopen loaded
  std::string detail;            ///< the library's version and the kernels it chose for this CPU
  bool generic_kernels = false;  ///< BLIS runs its reference code (no kernels for this CPU)
  void* handle = nullptr;        ///< dlopen's
  Sgemm sgemm = nullptr;
  Dgemm dgemm = nullptr;
  /// Sets the library's thread count (process-wide; no-op where it has no setter).
  void set_threads(int threads) const;

  void* set_int_threads = nullptr;   // openblas_set_num_threads, MKL_Set_Num_Threads: (int)
  void* set_long_threads = nullptr;  // bli_thread_set_num_threads: (dim_t = int64)
};

/// The names summa knows, in the order "auto" prefers them.
const std::vector<std::string>& blas_names();

/// `name` ("openblas", "blis", "mkl") loaded once per process and kept for
/// its lifetime. `threads` sets the library's <NAME>_NUM_THREADS before its
/// first load when the environment does not (so it starts no thread pool
/// larger than asked). Throws summa::Error naming every file tried and why
/// it failed.
const BlasLibrary& load_blas(std::string_view name, int threads);

/// Whether `name` loads here (loads it on success).
bool blas_loads(std::string_view name);

}  // namespace summa::cpu_detail

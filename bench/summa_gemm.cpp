// summa_gemm: times SUMMA (summa::SummaEngine, forms AB, ABt, AtB) on a q x q
// mesh against a plain single-process Eigen GEMM of the same global size and,
// when built with ScaLAPACK, against PDGEMM/PSGEMM on the same q x q grid.
// With --backend cuda (a libsumma built with CUDA) the blocks live on the GPU
// (CudaBackend, communicators --comm) and the baseline is a plain
// cublasGemmEx of the global size on one GPU, timed with CUDA events in the
// same run. Prints one JSON object per line per case; see bench/README.md.
//
//   mpirun -np 4 ./summa_gemm [--size 2048,3072] [--forms AB,ABt,AtB] [--panel 256]
//                             [--overlap on|off|both] [--dtype f32,f64,bf16] [--reps 5] [--check]
//   ./summa_gemm --backend cuda --size 4096,8192 --panel 0 [--tf32] [--comm mpi_staged|nccl]
#include <dlfcn.h>
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "bench_device.hpp"
#include "bench_json.hpp"
#include "summa/summa.hpp"

#if SUMMA_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "summa/backend/cuda_backend.hpp"
#include "summa/comm/nccl_communicator.hpp"
#endif

#ifdef SUMMA_BENCH_HAVE_SCALAPACK
// ScaLAPACK / PBLAS / BLACS (LP64: Fortran INTEGER is int). PBLAS's p?gemm_
// entry points are C functions taking the transpose flags as char* (no hidden
// string lengths).
extern "C" {
void Cblacs_get(int context, int what, int* value);
void Cblacs_gridinit(int* context, const char* order, int nprow, int npcol);
void Cblacs_gridinfo(int context, int* nprow, int* npcol, int* myrow, int* mycol);
void Cblacs_gridexit(int context);
int numroc_(const int* n, const int* nb, const int* iproc, const int* isrcproc, const int* nprocs);
void descinit_(int* desc, const int* m, const int* n, const int* mb, const int* nb,
               const int* irsrc, const int* icsrc, const int* ictxt, const int* lld, int* info);
void pdgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
             const double* alpha, const double* a, const int* ia, const int* ja, const int* desca,
             const double* b, const int* ib, const int* jb, const int* descb, const double* beta,
             double* c, const int* ic, const int* jc, const int* descc);
void psgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
             const float* alpha, const float* a, const int* ia, const int* ja, const int* desca,
             const float* b, const int* ib, const int* jb, const int* descb, const float* beta,
             float* c, const int* ic, const int* jc, const int* descc);
// The Fortran BLAS GEMMs ScaLAPACK calls; only their addresses are used.
void dgemm_(const char*, const char*, const int*, const int*, const int*, const double*,
            const double*, const int*, const double*, const int*, const double*, double*,
            const int*);
void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*,
            const float*, const int*, const float*, const int*, const float*, float*, const int*);
}

// PBLAS cuts a PDGEMM into panels of PILAENV columns (32 in ScaLAPACK), however
// large the distribution blocks. This definition interposes on ScaLAPACK's
// (which calls pilaenv_ through its PLT) so that --pdgemm-nb can change it;
// with 0 it forwards to ScaLAPACK's own.
namespace {
int pilaenv_override = 0;
}
extern "C" int pilaenv_(const int* context, const char* precision) {
  if (pilaenv_override > 0) return pilaenv_override;
  using Fn = int (*)(const int*, const char*);
  static const Fn next = [] {
    Fn f = nullptr;
    void* p = dlsym(RTLD_NEXT, "pilaenv_");
    static_assert(sizeof(f) == sizeof(p));
    std::memcpy(&f, &p, sizeof f);
    return f;
  }();
  return next != nullptr ? next(context, precision) : 32;
}
#endif
#ifdef SUMMA_BENCH_HAVE_BLIS
extern "C" {
void bli_thread_set_num_threads(std::int64_t n);  // dim_t is 64-bit on x86_64
int bli_arch_query_id(void);                      // arch_t
const char* bli_arch_string(int id);
}
#endif

namespace {

using summa::Form;
using summa::index_t;
using summa::bench::Json;

/// A bad command line or size: detected identically on every rank.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Deterministic value of global element (i, j) of matrix `id` (1 = A, 2 = B) in
// [-0.5, 0.5): every rank fills its blocks from it and rebuilds the global rows
// and columns it needs for the check (the formula of examples/summa_demo.cpp).
double element(int id, index_t i, index_t j) {
  std::uint64_t x = static_cast<std::uint64_t>(id) * 0x9E3779B97F4A7C15ULL ^
                    static_cast<std::uint64_t>(i) * 0xBF58476D1CE4E5B9ULL ^
                    static_cast<std::uint64_t>(j) * 0x94D049BB133111EBULL;
  x ^= x >> 31;
  x *= 0xD6E8FEB86659FD39ULL;
  x ^= x >> 28;
  return static_cast<double>(x >> 11) / static_cast<double>(1ULL << 53) - 0.5;
}
template <class T>
T value(int id, index_t i, index_t j) {
  return static_cast<T>(element(id, i, j));
}

struct Dims {
  index_t rows, cols;
};
// Global shapes: AB A m x k, B k x n; ABt A m x k, B n x k; AtB A k x m, B k x n.
Dims a_dims(Form f, index_t m, index_t k) {
  return f == Form::AtB ? Dims{k, m} : Dims{m, k};
}
Dims b_dims(Form f, index_t n, index_t k) {
  return f == Form::ABt ? Dims{n, k} : Dims{k, n};
}

// Column-major block (bi, bj) (rows x cols elements) of global matrix `id`.
template <class T>
std::vector<T> fill_block(int id, int bi, int bj, index_t rows, index_t cols) {
  std::vector<T> v(static_cast<std::size_t>(rows * cols));
  for (index_t c = 0; c < cols; ++c)
    for (index_t r = 0; r < rows; ++r) v[r + c * rows] = value<T>(id, bi * rows + r, bj * cols + c);
  return v;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

// One run of `call` on every rank, started after a barrier: its time, the
// maximum over ranks.
template <class F>
double time_collective(F&& call) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = std::chrono::steady_clock::now();
  call();
  double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return dt;
}

// A barrier that sleeps instead of spinning, so that ranks waiting for rank 0's
// serial Eigen run leave its core alone (Open MPI polls in blocking calls).
void sleepy_barrier() {
  MPI_Request req;
  MPI_Ibarrier(MPI_COMM_WORLD, &req);
  int done = 0;
  for (;;) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

double gflops(index_t m, index_t n, index_t k, double seconds) {
  return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) / seconds *
         1e-9;
}

// ---------------------------------------------------------------- BLAS provenance
// Which shared object the dynamic linker resolved `sym` to (what ScaLAPACK's
// calls bind to as well): dladdr() on its address.
std::string provider_of(void* sym) {
  if (sym == nullptr) return "none";
  Dl_info info{};
  if (dladdr(sym, &info) == 0 || info.dli_fname == nullptr) return "unknown";
  std::string path = info.dli_fname;
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

template <class Fn>
void* address_of(Fn* fn) {
  void* p = nullptr;
  static_assert(sizeof(p) == sizeof(fn));
  std::memcpy(&p, &fn, sizeof p);
  return p;
}

struct Blas {
  std::string sgemm = "none", dgemm = "none", arch;
};

Blas blas_info() {
  Blas b;
#ifdef SUMMA_BENCH_HAVE_SCALAPACK
  b.dgemm = provider_of(address_of(&dgemm_));
  b.sgemm = provider_of(address_of(&sgemm_));
  // Cross-check against a global lookup, which is the binding ScaLAPACK gets.
  if (void* g = dlsym(RTLD_DEFAULT, "dgemm_"); g != nullptr && provider_of(g) != b.dgemm)
    b.dgemm += " (global lookup: " + provider_of(g) + ")";
#else
  b.dgemm = provider_of(dlsym(RTLD_DEFAULT, "dgemm_"));
  b.sgemm = provider_of(dlsym(RTLD_DEFAULT, "sgemm_"));
#endif
#ifdef SUMMA_BENCH_HAVE_BLIS
  if (b.dgemm.find("blis") != std::string::npos) b.arch = bli_arch_string(bli_arch_query_id());
#endif
  return b;
}

// ---------------------------------------------------------------- settings
struct Settings {
  std::vector<std::tuple<index_t, index_t, index_t>> sizes;
  std::vector<Form> forms;
  std::vector<index_t> panels;
  std::vector<bool> overlaps;
  std::vector<int> slices;
  std::vector<std::string> dtypes;
  int reps = 5;
  int warmup = 1;
  bool check = false;
  double tol = 0;  // 0: per-dtype default
  bool eigen = true;
  std::vector<std::string> libraries;  // --compare-libraries
  bool pdgemm = true;
  int pdgemm_nb = 0;                // PILAENV override; 0: ScaLAPACK's
  std::string backend = "cpu";      // "cpu" or "cuda"
  std::string comm = "mpi_staged";  // cuda: "mpi_staged" or "nccl"
  bool tf32 = false;                // cuda: TF32 tensor cores in fp32 GEMMs (summa and cuBLAS)
  bool cublas = true;               // cuda: the cublasGemmEx baseline
  bool guard_overhead = false;      // also time unguarded and watchdog-guarded calls
};

// Default tolerance on max_rel_error (see README): 64 unit roundoffs of T
// for f32 and f64. A bf16 GEMM accumulates in fp32 and rounds each element of
// C to bf16 (relative 2^-9, at most 2^-9 of max|A| max|B| k after the
// normalisation) once per panel step that adds to it; partial sums are far
// below that bound, so 2^-8 is twice the single rounding (measured: 4.3e-4 at
// q = 1, 2, 3 with panels 0 and 64, m, n, k = 576, 384, 1152).
template <class T>
double default_tol() {
  if constexpr (std::is_same_v<T, summa::bf16>)
    return 1.0 / 256;
  else
    return 64.0 * std::numeric_limits<T>::epsilon();
}

// ---------------------------------------------------------------- ScaLAPACK
struct Blacs {
  bool active = false;
  int context = -1, myrow = 0, mycol = 0;
};

#ifdef SUMMA_BENCH_HAVE_SCALAPACK
Blacs blacs_init(int q) {
  Blacs b;
  int nprow = 0, npcol = 0;
  Cblacs_get(-1, 0, &b.context);  // the system context: MPI_COMM_WORLD
  Cblacs_gridinit(&b.context, "Row", q, q);
  Cblacs_gridinfo(b.context, &nprow, &npcol, &b.myrow, &b.mycol);
  if (nprow != q || npcol != q) throw std::runtime_error("BLACS grid is not q x q");
  b.active = true;
  return b;
}

void pgemm(char ta, char tb, const int* mnk, const float* a, const int* da, const float* b,
           const int* db, float* c, const int* dc) {
  const int one = 1;
  const float alpha = 1, beta = 0;
  psgemm_(&ta, &tb, &mnk[0], &mnk[1], &mnk[2], &alpha, a, &one, &one, da, b, &one, &one, db, &beta,
          c, &one, &one, dc);
}
void pgemm(char ta, char tb, const int* mnk, const double* a, const int* da, const double* b,
           const int* db, double* c, const int* dc) {
  const int one = 1;
  const double alpha = 1, beta = 0;
  pdgemm_(&ta, &tb, &mnk[0], &mnk[1], &mnk[2], &alpha, a, &one, &one, da, b, &one, &one, db, &beta,
          c, &one, &one, dc);
}

// Descriptor of a rows x cols matrix in q x q blocks of (rows/q) x (cols/q):
// one block per process, the same distribution as summa's.
std::array<int, 9> descriptor(const Blacs& g, int q, index_t rows, index_t cols) {
  std::array<int, 9> d{};
  const int r = static_cast<int>(rows), c = static_cast<int>(cols);
  const int mb = r / q, nb = c / q, zero = 0;
  const int local_rows = numroc_(&r, &mb, &g.myrow, &zero, &q);
  const int local_cols = numroc_(&c, &nb, &g.mycol, &zero, &q);
  if (local_rows != mb || local_cols != nb)
    throw std::runtime_error("numroc disagrees with the one-block-per-process layout");
  const int lld = std::max(1, local_rows);
  int info = 0;
  descinit_(d.data(), &r, &c, &mb, &nb, &zero, &zero, &g.context, &lld, &info);
  if (info != 0) throw std::runtime_error("descinit_ failed, info=" + std::to_string(info));
  return d;
}
#endif

// ---------------------------------------------------------------- checking
// Reference block (bi, bj) of C, computed in double by Eigen from the global
// rows/columns of A and B (as rounded to T) that it needs.
template <class T>
Eigen::MatrixXd reference_block(Form f, index_t m, index_t n, index_t k, int q, int bi, int bj) {
  const index_t mb = m / q, nb = n / q;
  Eigen::MatrixXd L(mb, k), R(k, nb);  // C block = L * R
  for (index_t kk = 0; kk < k; ++kk)
    for (index_t r = 0; r < mb; ++r)
      L(r, kk) = f == Form::AtB ? static_cast<double>(value<T>(1, kk, bi * mb + r))
                                : static_cast<double>(value<T>(1, bi * mb + r, kk));
  for (index_t c = 0; c < nb; ++c)
    for (index_t kk = 0; kk < k; ++kk)
      R(kk, c) = f == Form::ABt ? static_cast<double>(value<T>(2, bj * nb + c, kk))
                                : static_cast<double>(value<T>(2, kk, bj * nb + c));
  return L * R;
}

// max |C - ref| over all ranks / (max|A| * max|B| * k).
template <class T>
double rel_error(const std::vector<T>& c, const Eigen::MatrixXd& ref, double scale) {
  double err = 0;
  for (index_t j = 0; j < ref.cols(); ++j)
    for (index_t i = 0; i < ref.rows(); ++i)
      err = std::max(err, std::abs(static_cast<double>(c[i + j * ref.rows()]) - ref(i, j)));
  MPI_Allreduce(MPI_IN_PLACE, &err, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return err / scale;
}

template <class T>
double max_abs(const std::vector<T>& v) {
  double x = 0;
  for (T e : v) x = std::max(x, std::abs(static_cast<double>(e)));
  MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return x;
}

// ---------------------------------------------------------------- Eigen baseline
// A serial Eigen product of the global size. Only rank 0 holds the matrices
// and computes; the other ranks sleep in a barrier meanwhile.
template <class T>
class EigenGemm {
 public:
  EigenGemm(Form f, index_t m, index_t n, index_t k, bool active) : form_(f), active_(active) {
    if (!active) return;
    const Dims ad = a_dims(f, m, k), bd = b_dims(f, n, k);
    A_.resize(ad.rows, ad.cols);
    B_.resize(bd.rows, bd.cols);
    C_.resize(m, n);
    for (index_t j = 0; j < ad.cols; ++j)
      for (index_t i = 0; i < ad.rows; ++i) A_(i, j) = value<T>(1, i, j);
    for (index_t j = 0; j < bd.cols; ++j)
      for (index_t i = 0; i < bd.rows; ++i) B_(i, j) = value<T>(2, i, j);
  }
  /// Collective: rank 0 returns the seconds of one product, the others 0.
  double run_once() {
    double dt = 0;
    if (active_) {
      const auto t0 = std::chrono::steady_clock::now();
      switch (form_) {
        case Form::AB:
          C_.noalias() = A_ * B_;
          break;
        case Form::ABt:
          C_.noalias() = A_ * B_.transpose();
          break;
        case Form::AtB:
          C_.noalias() = A_.transpose() * B_;
          break;
      }
      dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    sleepy_barrier();
    return dt;
  }

 private:
  using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;
  Form form_;
  bool active_;
  Mat A_, B_, C_;
};

// ---------------------------------------------------------------- library baselines
// --compare-libraries: one plain GEMM of the global size on rank 0 through a
// CpuBackend on each CPU GEMM library this machine loads (eigen, openblas,
// blis, mkl), with no SUMMA around it: the fastest of them is what summa at
// q = 1 is held to (vs_fastest), and which one is fastest is the answer to
// "which library should this machine use" (docs/design.md, "CPU GEMM").
template <class T>
class LibraryGemm {
 public:
  LibraryGemm(const std::string& library, Form f, index_t m, index_t n, index_t k, bool active)
      : form_(f), active_(active), m_(m), n_(n), k_(k) {
    if (!active) return;
    backend_.emplace(summa::CpuOptions{.gemm = library, .threads = summa::bench::cpu_threads_flag});
    const Dims ad = a_dims(f, m, k), bd = b_dims(f, n, k);
    a_ = fill_block<T>(1, 0, 0, ad.rows, ad.cols);
    b_ = fill_block<T>(2, 0, 0, bd.rows, bd.cols);
    c_.assign(static_cast<std::size_t>(m * n), T(0));
    scratch_.resize(backend_->gemm_scratch_bytes(m, n, k, summa::dtype_v<T>));
  }
  /// Collective: rank 0 returns the seconds of one product, the others 0.
  double run_once() {
    double dt = 0;
    if (active_) {
      const Dims ad = a_dims(form_, m_, k_), bd = b_dims(form_, n_, k_);
      auto A = summa::MatrixView<const T>::dense(a_.data(), ad.rows, ad.cols);
      auto B = summa::MatrixView<const T>::dense(b_.data(), bd.rows, bd.cols);
      auto C = summa::MatrixView<T>::dense(c_.data(), m_, n_);
      const auto t0 = std::chrono::steady_clock::now();
      backend_->gemm(form_ == Form::AtB ? summa::Op::T : summa::Op::N,
                     form_ == Form::ABt ? summa::Op::T : summa::Op::N, T(1), A, B, T(0), C,
                     {scratch_.data(), scratch_.size()});
      dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    sleepy_barrier();
    return dt;
  }
  std::string detail() const { return backend_ ? backend_->gemm_detail() : std::string(); }

 private:
  Form form_;
  bool active_;
  index_t m_, n_, k_;
  std::optional<summa::CpuBackend> backend_;
  std::vector<T> a_, b_, c_;
  std::vector<std::byte> scratch_;
};

// ---------------------------------------------------------------- backend memory
// n elements of T in a backend's memory space (host for CpuBackend, device for
// CudaBackend), filled from and read back to the host with upload/download.
template <class T>
class BackendArray {
 public:
  BackendArray(summa::Backend& backend, std::size_t n) : backend_(&backend), n_(n) {
    if (n_ > 0) data_ = static_cast<T*>(backend_->allocate(n_ * sizeof(T)));
  }
  BackendArray(summa::Backend& backend, const std::vector<T>& host)
      : BackendArray(backend, host.size()) {
    if (n_ > 0) backend_->upload(data_, host.data(), n_ * sizeof(T));
  }
  ~BackendArray() {
    if (data_ != nullptr) backend_->deallocate(data_, n_ * sizeof(T));
  }
  BackendArray(const BackendArray&) = delete;
  BackendArray& operator=(const BackendArray&) = delete;
  T* data() const { return data_; }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    if (n_ > 0) backend_->download(host.data(), data_, n_ * sizeof(T));
    return host;
  }

 private:
  summa::Backend* backend_;
  std::size_t n_;
  T* data_ = nullptr;
};

// ---------------------------------------------------------------- cuBLAS baseline
#if SUMMA_HAVE_CUDA
void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorString(e));
}
void cublas_check(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string(what) + " failed: " + cublasGetStatusString(st));
}

/// Elapsed milliseconds between two events recorded on `stream` around `work`.
class EventTimer {
 public:
  EventTimer() {
    cuda_check(cudaEventCreate(&start_), "cudaEventCreate");
    cuda_check(cudaEventCreate(&stop_), "cudaEventCreate");
  }
  ~EventTimer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  void start(cudaStream_t s) { cuda_check(cudaEventRecord(start_, s), "cudaEventRecord"); }
  void stop(cudaStream_t s) { cuda_check(cudaEventRecord(stop_, s), "cudaEventRecord"); }
  /// Seconds between start() and stop(); waits for stop().
  double seconds() {
    cuda_check(cudaEventSynchronize(stop_), "cudaEventSynchronize");
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
    return 1e-3 * static_cast<double>(ms);
  }

 private:
  cudaEvent_t start_{}, stop_{};
};

/// The baseline of the 85% criterion: one plain cublasGemmEx of the GLOBAL
/// m x n x k product of `form`, on rank 0's GPU, column-major A, B and C
/// filled with the same values as summa's blocks (the layouts summa uses at
/// q = 1), fp32 accumulation (CUBLAS_COMPUTE_32F; _FAST_TF32 only with
/// --tf32; bf16 operands CUDA_R_16BF) or fp64, its own stream, handle and a 32 MiB cuBLAS workspace
/// (as CudaBackend). Timed with CUDA events around the call alone.
template <class T>
class CublasGemm {
 public:
  CublasGemm(Form f, index_t m, index_t n, index_t k, bool tf32, bool active)
      : active_(active), m_(m), n_(n), k_(k) {
    if (!active) return;
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    cublas_check(cublasCreate(&handle_), "cublasCreate");
    cublas_check(cublasSetStream(handle_, stream_), "cublasSetStream");
    cuda_check(cudaMalloc(&workspace_, workspace_bytes), "cudaMalloc(cuBLAS workspace)");
    cublas_check(cublasSetWorkspace(handle_, workspace_, workspace_bytes), "cublasSetWorkspace");
    const Dims ad = a_dims(f, m, k), bd = b_dims(f, n, k);
    ta_ = f == Form::AtB ? CUBLAS_OP_T : CUBLAS_OP_N;
    tb_ = f == Form::ABt ? CUBLAS_OP_T : CUBLAS_OP_N;
    lda_ = static_cast<int>(ad.rows);
    ldb_ = static_cast<int>(bd.rows);
    a_ = upload(fill_block<T>(1, 0, 0, ad.rows, ad.cols));
    b_ = upload(fill_block<T>(2, 0, 0, bd.rows, bd.cols));
    cuda_check(cudaMalloc(&c_, static_cast<std::size_t>(m * n) * sizeof(T)), "cudaMalloc(C)");
    if constexpr (std::is_same_v<T, double>) {
      compute_ = CUBLAS_COMPUTE_64F;
      type_ = CUDA_R_64F;
    } else if constexpr (std::is_same_v<T, summa::bf16>) {
      compute_ = CUBLAS_COMPUTE_32F;  // fp32 accumulation, as CudaBackend
      type_ = CUDA_R_16BF;
    } else {
      compute_ = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
      type_ = CUDA_R_32F;
    }
  }
  ~CublasGemm() {
    if (!active_) return;
    cudaFree(a_);
    cudaFree(b_);
    cudaFree(c_);
    cudaFree(workspace_);
    cublasDestroy(handle_);
    cudaStreamDestroy(stream_);
  }
  CublasGemm(const CublasGemm&) = delete;
  CublasGemm& operator=(const CublasGemm&) = delete;

  /// Collective: rank 0 returns the seconds of one product (CUDA events),
  /// the others 0.
  double run_once() {
    double dt = 0;
    if (active_) {
      timer_.start(stream_);
      const summa::acc_t<T> alpha = 1, beta = 0;  // float for bf16 (CUBLAS_COMPUTE_32F)
      cublas_check(
          cublasGemmEx(handle_, ta_, tb_, static_cast<int>(m_), static_cast<int>(n_),
                       static_cast<int>(k_), &alpha, a_, type_, lda_, b_, type_, ldb_, &beta, c_,
                       type_, static_cast<int>(m_), compute_, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx");
      timer_.stop(stream_);
      dt = timer_.seconds();
      cuda_check(cudaGetLastError(), "cublasGemmEx (launch)");
    }
    MPI_Barrier(MPI_COMM_WORLD);
    return dt;
  }

  /// Rank 0: block (bi, bj) of C, rows x cols, column-major (the layout of
  /// summa's C block at mesh coordinates (bi, bj)), copied to the host.
  std::vector<T> block(int bi, int bj, index_t rows, index_t cols) {
    std::vector<T> out(static_cast<std::size_t>(rows * cols));
    cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    const T* first = c_ + static_cast<std::size_t>(bi * rows + bj * cols * m_);
    cuda_check(cudaMemcpy2D(out.data(), static_cast<std::size_t>(rows) * sizeof(T), first,
                            static_cast<std::size_t>(m_) * sizeof(T),
                            static_cast<std::size_t>(rows) * sizeof(T),
                            static_cast<std::size_t>(cols), cudaMemcpyDeviceToHost),
               "cudaMemcpy2D(C)");
    return out;
  }

 private:
  static constexpr std::size_t workspace_bytes = std::size_t{32} << 20;
  T* upload(const std::vector<T>& host) {
    void* p = nullptr;
    cuda_check(cudaMalloc(&p, host.size() * sizeof(T)), "cudaMalloc(operand)");
    cuda_check(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
               "cudaMemcpy(operand)");
    return static_cast<T*>(p);
  }
  bool active_;
  index_t m_, n_, k_;
  cudaStream_t stream_{};
  cublasHandle_t handle_{};
  void* workspace_ = nullptr;
  T *a_ = nullptr, *b_ = nullptr, *c_ = nullptr;
  cublasOperation_t ta_ = CUBLAS_OP_N, tb_ = CUBLAS_OP_N;
  int lda_ = 1, ldb_ = 1;
  cublasComputeType_t compute_ = CUBLAS_COMPUTE_32F;
  cudaDataType_t type_ = CUDA_R_32F;
  EventTimer timer_;
};
#endif

std::uint64_t mesh_bytes(const summa::ProcessGrid& g, bool sent) {
  const auto& row = g.traffic()[summa::CommAxis::mesh_row];
  const auto& col = g.traffic()[summa::CommAxis::mesh_col];
  return sent ? row.bytes_sent + col.bytes_sent : row.bytes_received + col.bytes_received;
}

std::uint64_t max_over_ranks(std::uint64_t v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  return v;
}

struct Context {
  summa::ProcessGrid* grid;
  summa::ProcessGrid* watched = nullptr;  ///< --guard-overhead: the mesh with a watchdog
  summa::Backend* backend;
  int q, ranks, rank;
  Blas blas;
  Blacs blacs;
  const Settings* s;
  int pdgemm_nb = 0;        ///< PBLAS's panel width in effect
  void* stream = nullptr;   ///< cuda: the CudaBackend's cudaStream_t
  std::string device_name;  ///< cuda: the GPU of rank 0
  /// --compare-libraries: per library, its GFLOP/s over the fastest's, per case
  std::map<std::string, std::vector<double>> library_ratios;
  std::vector<double> summa_vs_fastest;
};

// One (size, form, dtype). For every panel and overlap setting, each timed
// repetition runs the Eigen baseline (rank 0), PDGEMM and summa back to back,
// so that the ratios compare runs made under the same machine conditions.
// Returns false when a check failed.
template <class T>
bool run_case(Context& ctx, Form form, index_t m, index_t n, index_t k) {
  const Settings& s = *ctx.s;
  const int q = ctx.q;
  const summa::DType dtype = summa::dtype_v<T>;
  const summa::BlockShapes bs = summa::SummaEngine::block_shapes(form, m, n, k, q);
  const int bi = ctx.grid->coords().row, bj = ctx.grid->coords().col;
  const bool cuda = s.backend == "cuda";
  const auto a = fill_block<T>(1, bi, bj, bs.a_rows, bs.a_cols);
  const auto b = fill_block<T>(2, bi, bj, bs.b_rows, bs.b_cols);
  // The operands and result in the backend's memory (device memory on cuda).
  const BackendArray<T> a_mem(*ctx.backend, a), b_mem(*ctx.backend, b);
  BackendArray<T> c_mem(*ctx.backend, static_cast<std::size_t>(bs.c_rows * bs.c_cols));
  // TF32 rounds each operand to 10 mantissa bits (unit 2^-11): |error| <=
  // 2 * 2^-11 * k max|A| max|B| plus fp32 accumulation, hence 2e-3.
  const double tol = s.tol > 0                                      ? s.tol
                     : (cuda && s.tf32 && std::is_same_v<T, float>) ? 2e-3
                                                                    : default_tol<T>();
  bool ok = true;

  std::optional<Eigen::MatrixXd> ref;
  // max|A| * max|B| * k: the normalisation of every error below.
  const double scale = max_abs(a) * max_abs(b) * static_cast<double>(k);
  if (s.check) ref = reference_block<T>(form, m, n, k, q, bi, bj);

  // The host baselines exist for f32 and f64 only (neither Eigen nor
  // ScaLAPACK multiplies bf16).
  constexpr bool host_baselines = !std::is_same_v<T, summa::bf16>;
  std::optional<EigenGemm<std::conditional_t<host_baselines, T, float>>> eigen;
  if (s.eigen && host_baselines) {
    eigen.emplace(form, m, n, k, ctx.rank == 0);
    for (int w = 0; w < s.warmup; ++w) eigen->run_once();
  }

  std::vector<std::pair<std::string, LibraryGemm<std::conditional_t<host_baselines, T, float>>>>
      libraries;
  if (host_baselines && !cuda)
    for (const std::string& lib : s.libraries) {
      libraries.emplace_back(std::piecewise_construct, std::forward_as_tuple(lib),
                             std::forward_as_tuple(lib, form, m, n, k, ctx.rank == 0));
      for (int w = 0; w < std::max(s.warmup, 1); ++w) libraries.back().second.run_once();
    }

  // PDGEMM on the same grid and distribution: pdgemm_call is empty when not run.
  std::function<void()> pdgemm_call;
  std::optional<double> pdgemm_err;
#ifdef SUMMA_BENCH_HAVE_SCALAPACK
  const Blacs& g = ctx.blacs;
  std::array<int, 9> da{}, db{}, dc{};
  std::vector<T> pa, pb, pc;
  const int mnk[3] = {static_cast<int>(m), static_cast<int>(n), static_cast<int>(k)};
  const char ta = form == Form::AtB ? 'T' : 'N', tb = form == Form::ABt ? 'T' : 'N';
  if (s.pdgemm && g.active && host_baselines) {
    const Dims ad = a_dims(form, m, k), bd = b_dims(form, n, k);
    da = descriptor(g, q, ad.rows, ad.cols);
    db = descriptor(g, q, bd.rows, bd.cols);
    dc = descriptor(g, q, m, n);
    pa = fill_block<T>(1, g.myrow, g.mycol, bs.a_rows, bs.a_cols);
    pb = fill_block<T>(2, g.myrow, g.mycol, bs.b_rows, bs.b_cols);
    pc.resize(static_cast<std::size_t>(bs.c_rows * bs.c_cols));
    pdgemm_call = [&] {
      if constexpr (host_baselines)
        pgemm(ta, tb, mnk, pa.data(), da.data(), pb.data(), db.data(), pc.data(), dc.data());
    };
    for (int w = 0; w < std::max(s.warmup, s.check ? 1 : 0); ++w) pdgemm_call();
    if (s.check) {
      const bool same = g.myrow == bi && g.mycol == bj;
      pdgemm_err =
          same ? rel_error(pc, *ref, scale)
               : rel_error(pc, reference_block<T>(form, m, n, k, q, g.myrow, g.mycol), scale);
      if (!(*pdgemm_err <= tol)) ok = false;
    }
  }
#endif

#if SUMMA_HAVE_CUDA
  // The cuBLAS baseline of the global size on rank 0's GPU.
  std::optional<CublasGemm<T>> cublas;
  if (cuda && s.cublas) {
    cublas.emplace(form, m, n, k, s.tf32, ctx.rank == 0);
    for (int w = 0; w < std::max(s.warmup, 1); ++w) cublas->run_once();
  }
  std::optional<EventTimer> summa_timer;
  if (cuda) summa_timer.emplace();
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
#endif

  auto A = summa::MatrixView<const T>::dense(a_mem.data(), bs.a_rows, bs.a_cols);
  auto B = summa::MatrixView<const T>::dense(b_mem.data(), bs.b_rows, bs.b_cols);
  auto C = summa::MatrixView<T>::dense(c_mem.data(), bs.c_rows, bs.c_cols);
  summa::SummaEngine engine(*ctx.grid, *ctx.backend);
  // --guard-overhead: the call with the consensus all-reduce (consensus_checks,
  // the debug mode), the same call without it (the default), and with the
  // consensus on a mesh whose communicators have a watchdog.
  std::optional<summa::SummaEngine> unguarded, watched;
  if (s.guard_overhead) {
    unguarded.emplace(*ctx.grid, *ctx.backend);
    watched.emplace(*ctx.watched, *ctx.backend);
  }
  for (index_t panel : s.panels)
    for (bool overlap : s.overlaps)
      for (int slices : overlap ? s.slices : std::vector<int>{1}) {
        const summa::SummaOptions opts{.panel = panel,
                                       .overlap = overlap,
                                       .progress_slices = slices,
                                       .consensus_checks = s.guard_overhead};
        engine.set_options(opts);
        if (unguarded) {
          summa::SummaOptions u = opts;
          u.consensus_checks = false;
          unguarded->set_options(u);
          watched->set_options(opts);
        }
        const std::size_t ws_bytes = engine.workspace_bytes(form, m, n, k, dtype);
        summa::Workspace ws("workspace", *ctx.backend, ws_bytes);
        std::uint64_t sent = 0, received = 0;
        std::vector<double> t_events;  // cuda: summa's span on the compute stream
        [[maybe_unused]] bool timing_events = false;
        auto variant_call = [&](summa::SummaEngine& e) {
          return [&] {
            e.multiply(form, m, n, k, summa::acc_t<T>(1), A, B, summa::acc_t<T>(0), C, ws);
            ctx.backend->synchronize();
          };
        };
        auto summa_call = [&] {
          const std::uint64_t s0 = mesh_bytes(*ctx.grid, true), r0 = mesh_bytes(*ctx.grid, false);
#if SUMMA_HAVE_CUDA
          if (timing_events) summa_timer->start(stream);
#endif
          engine.multiply(form, m, n, k, summa::acc_t<T>(1), A, B, summa::acc_t<T>(0), C, ws);
#if SUMMA_HAVE_CUDA
          if (timing_events) summa_timer->stop(stream);
#endif
          // The product is complete when the call returns (no-op on the CPU).
          ctx.backend->synchronize();
#if SUMMA_HAVE_CUDA
          if (timing_events) t_events.push_back(summa_timer->seconds());
#endif
          sent = mesh_bytes(*ctx.grid, true) - s0;
          received = mesh_bytes(*ctx.grid, false) - r0;
        };
        // At least one untimed run on cuda: the first call of each GEMM shape
        // tunes CudaBackend's variants (docs/gpu.md).
        for (int w = 0; w < std::max(s.warmup, s.check || cuda ? 1 : 0); ++w) summa_call();
        std::optional<double> err, cublas_diff;
        if (s.check) {
          err = rel_error(c_mem.download(), *ref, scale);
          if (!(*err <= tol)) ok = false;
        }
        std::vector<double> t_summa, t_eigen, t_pdgemm, t_cublas, t_unguarded, t_watched;
        std::vector<std::vector<double>> t_libraries(libraries.size());
        timing_events = cuda;
        for (int r = 0; r < s.reps; ++r) {
          if (eigen) t_eigen.push_back(eigen->run_once());
          for (std::size_t l = 0; l < libraries.size(); ++l)
            t_libraries[l].push_back(libraries[l].second.run_once());
          if (pdgemm_call) t_pdgemm.push_back(time_collective(pdgemm_call));
#if SUMMA_HAVE_CUDA
          if (cublas) t_cublas.push_back(cublas->run_once());
#endif
          t_summa.push_back(time_collective(summa_call));
          if (unguarded) {
            t_unguarded.push_back(time_collective(variant_call(*unguarded)));
            t_watched.push_back(time_collective(variant_call(*watched)));
          }
        }
        timing_events = false;
#if SUMMA_HAVE_CUDA
        // Rank 0's block of summa's C against the same block of cuBLAS's
        // (independent code, same inputs): max |difference| / (max|A| max|B| k).
        if (cublas) {
          double d = 0;
          if (ctx.rank == 0) {
            const std::vector<T> mine = c_mem.download();
            const std::vector<T> theirs = cublas->block(bi, bj, bs.c_rows, bs.c_cols);
            for (std::size_t i = 0; i < mine.size(); ++i)
              d = std::max(d,
                           std::abs(static_cast<double>(mine[i]) - static_cast<double>(theirs[i])));
            d /= scale;
          }
          MPI_Bcast(&d, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
          cublas_diff = d;
          if (s.check && !(d <= tol)) ok = false;
        }
#endif
        sent = max_over_ranks(sent);  // of the last call
        received = max_over_ranks(received);

        const double seconds = median(t_summa);
        const double gf = gflops(m, n, k, seconds);
        Json j = {{"op", summa::name_of(form)},
                  {"dtype", summa::name_of(dtype)},
                  {"m", m},
                  {"n", n},
                  {"k", k},
                  {"q", q},
                  {"ranks", ctx.ranks},
                  {"panel", panel},
                  {"overlap", overlap},
                  {"progress_slices", slices},
                  {"reps", s.reps},
                  {"seconds", seconds},
                  {"seconds_min", *std::min_element(t_summa.begin(), t_summa.end())},
                  {"gflops", gf},
                  {"gflops_per_rank", gf / ctx.ranks},
                  {"bytes_sent_per_rank", sent},
                  {"bytes_received_per_rank", received},
                  {"workspace_bytes", ws_bytes}};
        if (unguarded) {
          // Paired per repetition: the median of the per-repetition ratios.
          std::vector<double> rc, rw;
          for (std::size_t r = 0; r < t_summa.size(); ++r) {
            rc.push_back(t_summa[r] / t_unguarded[r]);
            rw.push_back(t_watched[r] / t_summa[r]);
          }
          j["unguarded_seconds"] = median(t_unguarded);
          j["watchdog_seconds"] = median(t_watched);
          j["consensus_overhead"] = median(rc) - 1;
          j["watchdog_overhead"] = median(rw) - 1;
        }
        if (eigen) {
          double es = median(t_eigen);  // meaningful on rank 0
          MPI_Bcast(&es, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
          const double eg = gflops(m, n, k, es);
          j["eigen_seconds"] = es;
          j["eigen_gflops"] = eg;
          j["vs_eigen"] = gf / eg;
        }
        if (!libraries.empty()) {
          Json per = Json::object(), details = Json::object();
          std::string fastest;
          double best = 0;
          std::vector<double> median_rank0(libraries.size());
          for (std::size_t l = 0; l < libraries.size(); ++l) {
            double ls = median(t_libraries[l]);  // meaningful on rank 0
            MPI_Bcast(&ls, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
            median_rank0[l] = ls;
            const double lg = gflops(m, n, k, ls);
            per[libraries[l].first] = lg;
            details[libraries[l].first] = libraries[l].second.detail();
            if (lg > best) {
              best = lg;
              fastest = libraries[l].first;
            }
          }
          for (std::size_t l = 0; l < libraries.size(); ++l)
            ctx.library_ratios[libraries[l].first].push_back(gflops(m, n, k, median_rank0[l]) /
                                                             best);
          ctx.summa_vs_fastest.push_back(gf / best);
          j["libraries_gflops"] = per;
          if (ctx.rank == 0) j["libraries"] = details;
          j["fastest_library"] = fastest;
          j["vs_fastest"] = gf / best;
        }
        if (pdgemm_call) {
          const double ps = median(t_pdgemm), pg = gflops(m, n, k, ps);
          j["pdgemm_seconds"] = ps;
          j["pdgemm_gflops"] = pg;
          j["vs_pdgemm"] = gf / pg;
          j["pdgemm_nb"] = ctx.pdgemm_nb;
        }
        if (cuda) {
          j["backend"] = "cuda";
          j["comm"] = s.comm;
          j["tf32"] = s.tf32;
          j["device"] = ctx.device_name;
          // rank 0's summa span on the compute stream (events), its median
          double ev = t_events.empty() ? std::nan("") : median(t_events);
          MPI_Bcast(&ev, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
          j["event_seconds"] = ev;
          if (!t_cublas.empty()) {
            double cs = median(t_cublas);  // meaningful on rank 0
            MPI_Bcast(&cs, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
            j["cublas_seconds"] = cs;
            j["cublas_gflops"] = gflops(m, n, k, cs);
            j["vs_cublas"] = cs / seconds;
            j["vs_cublas_events"] = cs / ev;
            j["cublas_max_rel_diff"] = cublas_diff.value_or(std::nan(""));
          }
        } else {
          j["backend"] = "cpu";
          j["cpu_gemm"] = std::string(ctx.backend->name()).substr(4);  // "cpu-<library>"
          if (const auto* cpu = dynamic_cast<const summa::CpuBackend*>(ctx.backend))
            j["threads"] = cpu->threads();  // what reached the backend
          j["blas"] = dtype == summa::DType::f64 ? ctx.blas.dgemm : ctx.blas.sgemm;
          if (!ctx.blas.arch.empty()) j["blas_arch"] = ctx.blas.arch;
        }
        if (s.check) {
          j["max_rel_error"] = *err;
          if (pdgemm_err) j["pdgemm_max_rel_error"] = *pdgemm_err;
          j["tolerance"] = tol;
          j["check_ok"] = *err <= tol && (!pdgemm_err || *pdgemm_err <= tol) &&
                          (!cublas_diff || *cublas_diff <= tol);
        }
        if (ctx.rank == 0) {
          std::printf("%s\n", j.dump().c_str());
          std::fflush(stdout);
        }
      }
  return ok;
}

Form parse_form(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s == "ab") return Form::AB;
  if (s == "abt") return Form::ABt;
  if (s == "atb") return Form::AtB;
  throw UsageError("unknown form " + s);
}

index_t round_to(index_t v, index_t unit) {
  return std::max<index_t>(unit, (v + unit / 2) / unit * unit);
}

int run(int argc, char** argv, int rank, int ranks) {
  CLI::App app{
      "summa_gemm: SUMMA distributed GEMM vs a serial Eigen GEMM and ScaLAPACK PDGEMM.\n"
      "Run under mpirun with a square number of ranks; prints one JSON object per case."};
  std::vector<index_t> sizes;
  index_t m = 0, n = 0, k = 0;
  std::vector<std::string> forms{"AB", "ABt", "AtB"};
  std::vector<index_t> panels{256};
  std::string overlap = "on";
  std::vector<int> slices{summa::SummaOptions{}.progress_slices};
  std::vector<std::string> dtypes{"f32"};
  Settings s;
  bool no_eigen = false, no_pdgemm = false, no_cublas = false;
  app.add_option("--size", sizes,
                 "Square sizes m=n=k (list). Default: 2048,3072 rounded to multiples of 256*q")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  app.add_option("--m", m,
                 "Rows of C (one rectangular case; unset dims take the first set one "
                 "of m, n, k)")
      ->check(CLI::PositiveNumber);
  app.add_option("--n", n, "Columns of C")->check(CLI::PositiveNumber);
  app.add_option("--k", k, "Inner dimension")->check(CLI::PositiveNumber);
  app.add_option("--forms", forms, "Forms to run (list of AB, ABt, AtB)")
      ->delimiter(',')
      ->check(CLI::IsMember({"AB", "ABt", "AtB"}, CLI::ignore_case))
      ->capture_default_str();
  app.add_option("--panel", panels, "Panel widths (list); 0 = a whole block per step")
      ->delimiter(',')
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--overlap", overlap, "Double-buffered collectives: on, off or both")
      ->check(CLI::IsMember({"on", "off", "both"}))
      ->capture_default_str();
  app.add_option("--slices", slices,
                 "Progress slices per panel GEMM with overlap (list); 1 = no MPI polling")
      ->delimiter(',')
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--dtype", dtypes,
                 "Element types (list of f32, f64, bf16; bf16 accumulates in fp32 and has no "
                 "Eigen or PDGEMM baseline)")
      ->delimiter(',')
      ->check(CLI::IsMember({"f32", "f64", "bf16"}))
      ->capture_default_str();
  app.add_option("--reps", s.reps, "Timed runs per case (median reported)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--warmup", s.warmup, "Untimed runs before timing")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  app.add_flag("--check", s.check,
               "Compare with a serial double-precision Eigen product; exit 1 above tolerance");
  app.add_option("--tol", s.tol, "Tolerance on max_rel_error (default 64 eps of the dtype)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--guard-overhead", s.guard_overhead,
               "Time each call with the consensus all-reduce (consensus_checks, the debug "
               "mode), also without it (the default) and with a watchdog (600 s) on the mesh, "
               "in the same repetitions");
  app.add_flag("--no-eigen", no_eigen, "Skip the single-process Eigen baseline");
  bool compare_libraries = false;
  app.add_flag("--compare-libraries", compare_libraries,
               "Also time one plain GEMM of the global size on rank 0 through each CPU GEMM "
               "library this machine loads (eigen, openblas, blis, mkl): libraries_gflops, "
               "fastest_library and summa's vs_fastest in every line, and a verdict at the end");
  app.add_flag("--no-pdgemm", no_pdgemm, "Skip the ScaLAPACK PDGEMM comparison");
  summa::bench::add_device_options(app, s.backend, s.comm, s.tf32, "",
                                   "cuda: TF32 tensor cores in f32 GEMMs (summa and cuBLAS)");
  app.add_flag("--no-cublas", no_cublas, "cuda: skip the cublasGemmEx baseline");
  app.add_option("--pdgemm-nb", s.pdgemm_nb,
                 "PBLAS internal panel width (PILAENV) for PDGEMM; 0 keeps ScaLAPACK's (32)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (rank == 0) return app.exit(e);
    return e.get_exit_code();
  }
  const bool cuda = s.backend == "cuda";
  // On cuda the baseline is cuBLAS: the host Eigen GEMM and PDGEMM would
  // compare a GPU with the host's cores, not summa with its local library.
  s.eigen = !no_eigen && !cuda;
  s.pdgemm = !no_pdgemm && !cuda;
  if (compare_libraries && !cuda) s.libraries = summa::CpuBackend::gemm_libraries();
  s.cublas = !no_cublas;
  for (const auto& f : forms) s.forms.push_back(parse_form(f));
  s.panels = panels;
  s.slices = slices;
  if (overlap != "off") s.overlaps.push_back(true);
  if (overlap != "on") s.overlaps.push_back(false);
  s.dtypes = dtypes;

  // The backend first: the communicators order their work with its stream.
  summa::bench::BenchBackend chosen = summa::bench::make_backend<UsageError>(
      s.backend, s.comm, s.tf32, app.count("--comm") > 0, "summa_gemm");
  std::unique_ptr<summa::Backend> backend = std::move(chosen.backend);
  const std::string device_name = cuda ? chosen.device : std::string();
  summa::ProcessGrid grid = summa::ProcessGrid::mesh2d(MPI_COMM_WORLD, 0, 1, chosen.grid);
  const int q = grid.shape().rows;
  std::optional<summa::ProcessGrid> watched_grid;
  if (s.guard_overhead) {
    summa::GridOptions wo = chosen.grid;
    wo.watchdog.timeout_s = 600;
    watched_grid.emplace(summa::ProcessGrid::mesh2d(MPI_COMM_WORLD, 0, 1, wo));
  }

  if (m > 0 || n > 0 || k > 0) {
    const index_t first = m > 0 ? m : (n > 0 ? n : k);
    s.sizes.emplace_back(m > 0 ? m : first, n > 0 ? n : first, k > 0 ? k : first);
  }
  for (index_t x : sizes) s.sizes.emplace_back(x, x, x);
  if (s.sizes.empty())
    for (index_t x : {2048, 3072}) {
      const index_t r = round_to(x, 256 * static_cast<index_t>(q));
      s.sizes.emplace_back(r, r, r);
    }
  for (const auto& [mm, nn, kk] : s.sizes)
    if (mm % q || nn % q || kk % q)
      throw UsageError("m=" + std::to_string(mm) + " n=" + std::to_string(nn) +
                       " k=" + std::to_string(kk) + " must be multiples of q=" + std::to_string(q));
  // The host-staged (GPU) communicators hold every collective in flight in
  // one pinned buffer per axis. A panel is at most max(m, n, k)/q wide and
  // --panel deep (the whole block at --panel 0), and the broadcasts of the
  // current and the next panel and the reductions of C panels may be in
  // flight together: room for five such panels at the widest dtype asked
  // for (at --panel 0 the sum the H200 run needed). A need above the default
  // rebuilds the grids; mpi_staged only (nothing else stages).
  if (q > 1 && chosen.grid.comm == summa::CommBackend::mpi_staged) {
    std::size_t elem = 2;
    for (const auto& dt : s.dtypes) elem = std::max(elem, dt == "f64" ? std::size_t{8} : 4);
    std::size_t need = 0;
    for (const auto& [mm, nn, kk] : s.sizes) {
      const auto wide = static_cast<std::size_t>(std::max({mm, nn, kk}) / q);
      for (index_t panel : s.panels) {
        const std::size_t depth =
            panel == 0 ? wide : std::min(wide, static_cast<std::size_t>(panel));
        need = std::max(need, 5 * wide * depth * elem + (std::size_t{1} << 20));
      }
    }
    if (need > chosen.grid.staging_bytes) {
      chosen.grid.staging_bytes = need;
      grid = summa::ProcessGrid::mesh2d(MPI_COMM_WORLD, 0, 1, chosen.grid);
      if (watched_grid) {
        summa::GridOptions wo = chosen.grid;
        wo.watchdog.timeout_s = 600;
        watched_grid.emplace(summa::ProcessGrid::mesh2d(MPI_COMM_WORLD, 0, 1, wo));
      }
    }
  }

  Context ctx{&grid,
              watched_grid ? &*watched_grid : nullptr,
              backend.get(),
              q,
              ranks,
              rank,
              blas_info(),
              {},
              &s,
              0,
              nullptr,
              device_name,
              {},
              {}};
#if SUMMA_HAVE_CUDA
  if (cuda) ctx.stream = static_cast<summa::CudaBackend&>(*backend).stream();
#endif
#ifdef SUMMA_BENCH_HAVE_SCALAPACK
  if (s.pdgemm) ctx.blacs = blacs_init(q);
  pilaenv_override = s.pdgemm_nb;
  if (ctx.blacs.active) {
    const char d = 'D';
    ctx.pdgemm_nb = pilaenv_(&ctx.blacs.context, &d);
  }
#endif
  if (rank == 0 && cuda)
    std::fprintf(stderr, "summa_gemm: %d ranks, %dx%d mesh, backend %s on %s, comm %s%s\n", ranks,
                 q, q, std::string(backend->name()).c_str(), device_name.c_str(), s.comm.c_str(),
                 s.tf32 ? ", TF32" : "");
  else if (rank == 0)
    std::fprintf(stderr, "summa_gemm: %d ranks, %dx%d mesh, dgemm_ from %s, sgemm_ from %s%s%s\n",
                 ranks, q, q, ctx.blas.dgemm.c_str(), ctx.blas.sgemm.c_str(),
                 ctx.blas.arch.empty() ? "" : ", BLIS sub-configuration ", ctx.blas.arch.c_str());

  bool ok = true;
  for (const auto& dt : s.dtypes)
    for (const auto& [mm, nn, kk] : s.sizes)
      for (Form f : s.forms)
        ok = (dt == "f32"   ? run_case<float>(ctx, f, mm, nn, kk)
              : dt == "f64" ? run_case<double>(ctx, f, mm, nn, kk)
                            : run_case<summa::bf16>(ctx, f, mm, nn, kk)) &&
             ok;

  if (!ctx.library_ratios.empty() && rank == 0) {
    // The verdict: each library's geometric mean of (its rate / the fastest
    // rate) over the cases; the best mean is the library to use here.
    Json j = {{"summary", "libraries"}, {"cases", ctx.summa_vs_fastest.size()}};
    std::string best;
    double best_mean = 0;
    const auto geomean = [](const std::vector<double>& v) {
      double logs = 0;
      for (double x : v) logs += std::log(x);
      return std::exp(logs / static_cast<double>(v.size()));
    };
    for (const auto& [lib, ratios] : ctx.library_ratios) {
      const double g = geomean(ratios);
      j["geomean_vs_fastest"][lib] = g;
      j["worst_vs_fastest"][lib] = *std::min_element(ratios.begin(), ratios.end());
      if (g > best_mean) {
        best_mean = g;
        best = lib;
      }
    }
    j["fastest_library"] = best;
    j["summa_cpu_gemm"] = std::string(ctx.backend->name()).substr(4);
    j["summa_geomean_vs_fastest"] = geomean(ctx.summa_vs_fastest);
    j["summa_worst_vs_fastest"] =
        *std::min_element(ctx.summa_vs_fastest.begin(), ctx.summa_vs_fastest.end());
    std::printf("%s\n", j.dump().c_str());
    std::fprintf(stderr,
                 "summa_gemm: fastest CPU GEMM library here: %s (geometric mean %.2f of the "
                 "fastest per case); summa on %s: %.2f of the fastest (worst %.2f) over %zu "
                 "case(s)\n",
                 best.c_str(), best_mean, j["summa_cpu_gemm"].get<std::string>().c_str(),
                 j["summa_geomean_vs_fastest"].get<double>(),
                 j["summa_worst_vs_fastest"].get<double>(), ctx.summa_vs_fastest.size());
  }
#ifdef SUMMA_BENCH_HAVE_SCALAPACK
  if (ctx.blacs.active) Cblacs_gridexit(ctx.blacs.context);
#endif
  if (!ok && rank == 0) std::fprintf(stderr, "summa_gemm: CHECK FAILED (see max_rel_error)\n");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  // One thread per rank: BLIS and OpenMP read these lazily (BLIS at its first
  // call); bli_thread_set_num_threads below makes it explicit for BLIS.
  setenv("BLIS_NUM_THREADS", "1", 1);
  setenv("OMP_NUM_THREADS", "1", 1);
  setenv("OPENBLAS_NUM_THREADS", "1", 1);
#ifdef SUMMA_BENCH_HAVE_BLIS
  // ScaLAPACK's BLIS (linked) must run the kernels summa's BLIS (loaded)
  // runs: loading summa's first sets BLIS_ARCH_TYPE where BLIS does not know
  // this CPU (docs/design.md, "CPU GEMM"), before the linked copy
  // initialises (its first call, just below), which would otherwise pick its
  // reference code there and make PDGEMM several times slower than it is.
  // (BLIS_ARCH_TYPE is BLIS's arch_t number: both copies must be the same
  // BLIS version, as Debian's two builds of one package are.)
  // Not under AddressSanitizer: there summa loads BLIS without RTLD_DEEPBIND
  // (cpu_blas.cpp), so its copy's internal calls would bind to the linked
  // copy's and corrupt it (BLIS aborts: "Accessed uninitialized context").
#if !defined(__SANITIZE_ADDRESS__)
  try {
    summa::CpuBackend blis_first({.gemm = "blis"});
  } catch (const std::exception&) {  // no BLIS to load: nothing to align
  }
#endif
  bli_thread_set_num_threads(1);
#endif
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  int status = 0;
  try {
    status = run(argc, argv, rank, ranks);
  } catch (const UsageError& e) {  // the same on every rank
    if (rank == 0) std::fprintf(stderr, "summa_gemm: %s\n", e.what());
    status = 2;
  } catch (const summa::Error& e) {  // summa reports errors on every rank alike
    if (rank == 0) std::fprintf(stderr, "summa_gemm: %s\n", e.what());
    status = 2;
  } catch (const std::exception& e) {  // possibly on this rank only: do not hang
    std::fprintf(stderr, "summa_gemm (rank %d): %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  MPI_Finalize();
  return status;
}

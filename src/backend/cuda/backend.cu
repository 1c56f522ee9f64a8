// CudaBackend: device memory, the compute stream, cuBLAS GEMM with AxoNN's
// BLAS-mode tuning, and the hooks of Backend's ops (whose entry points have
// checked the arguments): CUDA's own checks, then a kernel (kernels.cu).
#include "summa/backend/cuda_backend.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels.cuh"
#include "summa/backend/optimizer_math.hpp"
#include "summa/core/error.hpp"

namespace summa {

namespace {

using cuda_detail::check_cuda;
using cuda_detail::dview;
using cuda_detail::kMaxPartials;

void check_cublas(cublasStatus_t s, const char* call) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string("CudaBackend: ") + call + " failed: " + cublasGetStatusString(s) +
                " (" + cublasGetStatusName(s) + ")");
}

constexpr std::size_t kDeviceAlign = 256;  // what cudaMalloc guarantees
constexpr std::size_t round_up(std::size_t bytes) {
  return (bytes + kDeviceAlign - 1) / kDeviceAlign * kDeviceAlign;
}

std::string shape(index_t rows, index_t cols) {
  return std::to_string(rows) + "x" + std::to_string(cols);
}

bool flips_a(GemmVariant v) {
  return v == GemmVariant::transpose_a || v == GemmVariant::transpose_both;
}
bool flips_b(GemmVariant v) {
  return v == GemmVariant::transpose_b || v == GemmVariant::transpose_both;
}

constexpr GemmVariant kVariants[4] = {GemmVariant::native, GemmVariant::transpose_a,
                                      GemmVariant::transpose_b, GemmVariant::transpose_both};

Order opposite(Order o) {
  return o == Order::col_major ? Order::row_major : Order::col_major;
}

// Bytes of a dense copy of a rows x cols matrix, rounded to the device alignment.
template <class T>
std::size_t dense_bytes(index_t rows, index_t cols) {
  return round_up(static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols) * sizeof(T));
}

// The cuBLAS call computing C (column-major) from the operands' storage:
// transposition flags of the first and second operand, with A and B swapped
// when C is row-major (row-major C = A B is column-major Cᵀ = Bᵀ Aᵀ).
struct CublasMode {
  bool first_t, second_t;
};
CublasMode cublas_mode(Op ta, Order a, Op tb, Order b, Order c) {
  const bool fa = (ta == Op::T) != (a == Order::row_major);
  const bool fb = (tb == Op::T) != (b == Order::row_major);
  if (c == Order::col_major) return {fa, fb};
  return {!fb, !fa};
}
CublasMode variant_mode(GemmVariant v, Op ta, Order a, Op tb, Order b, Order c) {
  return cublas_mode(ta, flips_a(v) ? opposite(a) : a, tb, flips_b(v) ? opposite(b) : b, c);
}
std::string mode_name(CublasMode m) {
  return std::string(m.first_t ? "T" : "N") + (m.second_t ? "T" : "N");
}

const char* order_name(Order o) {
  return o == Order::col_major ? "col" : "row";
}

std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

bool same_key(const GemmTuning& t, index_t m, index_t n, index_t k, Op ta, Op tb, DType d, Order a,
              Order b, Order c) {
  return t.m == m && t.n == n && t.k == k && t.ta == ta && t.tb == tb && t.dtype == d &&
         t.a_order == a && t.b_order == b && t.c_order == c;
}

}  // namespace

const char* to_string(GemmVariant v) {
  switch (v) {
    case GemmVariant::native:
      return "native";
    case GemmVariant::transpose_a:
      return "transpose_a";
    case GemmVariant::transpose_b:
      return "transpose_b";
    case GemmVariant::transpose_both:
      return "transpose_both";
  }
  return "?";
}

// ---------------------------------------------------------------- state

struct cuda_detail::CudaState {
  CudaOptions options;
  int device = 0;
  cuda_detail::Launch launch;
  bool own_stream = false;
  cublasHandle_t cublas = nullptr;
  void* cublas_workspace = nullptr;
  void* tune_workspace = nullptr;
  double* partials = nullptr;     // kMaxPartials + 1 doubles (device)
  double* host_result = nullptr;  // 1 double (pinned host)
  cudaEvent_t start = nullptr, stop = nullptr;
  cudaStream_t copy_stream = nullptr;  // stage_in / stage_out (created on first use)
  cudaEvent_t computed = nullptr, copied = nullptr;
  bool tuning = true;
  std::vector<GemmTuning> tunings;  // first-seen order; capacity fixed at construction
  std::vector<std::int32_t> slots;  // open-addressing hash: index into tunings, -1 empty

  ~CudaState() {
    // Best effort: errors while tearing down are ignored.
    if (launch.stream != nullptr) cudaStreamSynchronize(launch.stream);
    if (start != nullptr) cudaEventDestroy(start);
    if (stop != nullptr) cudaEventDestroy(stop);
    if (cublas != nullptr) cublasDestroy(cublas);
    if (cublas_workspace != nullptr) cudaFree(cublas_workspace);
    if (tune_workspace != nullptr) cudaFree(tune_workspace);
    if (partials != nullptr) cudaFree(partials);
    if (host_result != nullptr) cudaFreeHost(host_result);
    if (copy_stream != nullptr) {
      cudaStreamSynchronize(copy_stream);
      cudaStreamDestroy(copy_stream);
    }
    if (computed != nullptr) cudaEventDestroy(computed);
    if (copied != nullptr) cudaEventDestroy(copied);
    if (own_stream && launch.stream != nullptr) cudaStreamDestroy(launch.stream);
  }

  std::size_t slot_of(index_t m, index_t n, index_t k, Op ta, Op tb, DType d, Order a, Order b,
                      Order c) const {
    std::uint64_t h = mix(static_cast<std::uint64_t>(m));
    h = mix(h ^ static_cast<std::uint64_t>(n));
    h = mix(h ^ static_cast<std::uint64_t>(k));
    h = mix(h ^ (static_cast<std::uint64_t>(ta) | static_cast<std::uint64_t>(tb) << 1 |
                 static_cast<std::uint64_t>(d) << 2 | static_cast<std::uint64_t>(a) << 3 |
                 static_cast<std::uint64_t>(b) << 4 | static_cast<std::uint64_t>(c) << 5));
    const std::size_t mask = slots.size() - 1;
    std::size_t s = static_cast<std::size_t>(h) & mask;
    while (slots[s] >= 0 &&
           !same_key(tunings[static_cast<std::size_t>(slots[s])], m, n, k, ta, tb, d, a, b, c))
      s = (s + 1) & mask;
    return s;  // the matching slot, or the empty one where the key belongs
  }

  // Bytes of the tuning workspace a variant needs: its operand copies, plus
  // a dense C when timing must not touch the caller's C.
  template <class T>
  std::size_t variant_bytes(GemmVariant v, ConstMatrixView<T> A, ConstMatrixView<T> B) const {
    return (flips_a(v) ? dense_bytes<T>(A.rows, A.cols) : 0) +
           (flips_b(v) ? dense_bytes<T>(B.rows, B.cols) : 0);
  }

  template <class T>
  void cublas_gemm(Op ta, Op tb, acc_t<T> alpha, ConstMatrixView<T> A, ConstMatrixView<T> B,
                   acc_t<T> beta, MatrixView<T> C) {
    const CublasMode mode = cublas_mode(ta, A.order, tb, B.order, C.order);
    const bool col = C.order == Order::col_major;
    const ConstMatrixView<T>& first = col ? A : B;
    const ConstMatrixView<T>& second = col ? B : A;
    const index_t M = col ? C.rows : C.cols, N = col ? C.cols : C.rows;
    const index_t K = ta == Op::N ? A.cols : A.rows;
    // bf16: bf16 operands and C, fp32 scalars and accumulation (one
    // rounding of each element of C).
    constexpr bool is_float = std::is_same_v<T, float>, is_bf16 = std::is_same_v<T, bf16>;
    const cudaDataType_t type = is_bf16 ? CUDA_R_16BF : is_float ? CUDA_R_32F : CUDA_R_64F;
    const cublasComputeType_t compute =
        is_bf16     ? CUBLAS_COMPUTE_32F
        : !is_float ? CUBLAS_COMPUTE_64F
                    : (options.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F);
    check_cublas(
        cublasGemmEx(cublas, mode.first_t ? CUBLAS_OP_T : CUBLAS_OP_N,
                     mode.second_t ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(M),
                     static_cast<int>(N), static_cast<int>(K), &alpha, first.data, type,
                     static_cast<int>(first.ld), second.data, type, static_cast<int>(second.ld),
                     &beta, C.data, type, static_cast<int>(C.ld), compute, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
  }

  // A dense copy of `X` in the opposite storage order at `at` (device).
  template <class T>
  ConstMatrixView<T> transposed_copy(ConstMatrixView<T> X, void* at) {
    const Order o = opposite(X.order);
    MatrixView<T> out = MatrixView<T>::dense(static_cast<T*>(at), X.rows, X.cols, o);
    cuda_detail::axpby(launch, acc_t<T>(1), dview(X), acc_t<T>(0), dview(out));
    return out;
  }

  // Runs variant v; its operand copies go to the front of the tuning
  // workspace (the caller checked they fit).
  template <class T>
  void run_variant(GemmVariant v, Op ta, Op tb, acc_t<T> alpha, ConstMatrixView<T> A,
                   ConstMatrixView<T> B, acc_t<T> beta, MatrixView<T> C) {
    auto* at = static_cast<unsigned char*>(tune_workspace);
    if (flips_a(v)) {
      A = transposed_copy(A, at);
      at += dense_bytes<T>(A.rows, A.cols);
    }
    if (flips_b(v)) B = transposed_copy(B, at);
    cublas_gemm(ta, tb, alpha, A, B, beta, C);
  }

  // Times the candidate variants of a new GEMM shape and returns the entry
  // (milliseconds of each timed variant, the fastest chosen).
  template <class T>
  GemmTuning tune(Op ta, Op tb, acc_t<T> alpha, ConstMatrixView<T> A, ConstMatrixView<T> B,
                  acc_t<T> beta, MatrixView<T> C) {
    GemmTuning t;
    t.m = C.rows;
    t.n = C.cols;
    t.k = ta == Op::N ? A.cols : A.rows;
    t.ta = ta;
    t.tb = tb;
    t.dtype = dtype_v<T>;
    t.a_order = A.order;
    t.b_order = B.order;
    t.c_order = C.order;
    // Timing runs write C repeatedly: into C itself when beta == 0 (every
    // run overwrites it), else into a dense scratch C after the copies.
    const std::size_t c_bytes = beta == acc_t<T>(0) ? 0 : dense_bytes<T>(C.rows, C.cols);
    GemmVariant candidates[4];
    int count = 0;
    for (GemmVariant v : kVariants) {
      const CublasMode mode = variant_mode(v, ta, A.order, tb, B.order, C.order);
      const bool target = v == GemmVariant::native || !(mode.first_t && mode.second_t);
      if (target && variant_bytes<T>(v, A, B) + c_bytes <= options.tune_workspace_bytes)
        candidates[count++] = v;
    }
    if (count < 2) return t;  // nothing to choose between: native, untimed
    float best = -1;
    for (int i = 0; i < count; ++i) {
      const GemmVariant v = candidates[i];
      MatrixView<T> target = C;
      acc_t<T> target_beta = beta;
      if (c_bytes > 0) {
        target =
            MatrixView<T>::dense(reinterpret_cast<T*>(static_cast<unsigned char*>(tune_workspace) +
                                                      variant_bytes<T>(v, A, B)),
                                 C.rows, C.cols, C.order);
        target_beta = acc_t<T>(0);
      }
      run_variant(v, ta, tb, alpha, A, B, target_beta, target);  // warm-up
      check_cuda(cudaEventRecord(start, launch.stream), "cudaEventRecord");
      for (int r = 0; r < options.tune_repeats; ++r)
        run_variant(v, ta, tb, alpha, A, B, target_beta, target);
      check_cuda(cudaEventRecord(stop, launch.stream), "cudaEventRecord");
      check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
      float ms = 0;
      check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
      ms /= static_cast<float>(options.tune_repeats);
      t.milliseconds[static_cast<int>(v)] = ms;
      if (best < 0 || ms < best) {
        best = ms;
        t.chosen = v;
      }
    }
    return t;
  }

  template <class T>
  void gemm(Op ta, Op tb, acc_t<T> alpha, ConstMatrixView<T> A, ConstMatrixView<T> B, acc_t<T> beta,
            MatrixView<T> C) {
    const index_t m = C.rows, n = C.cols, k = ta == Op::N ? A.cols : A.rows;
    if (m == 0 || n == 0) return;
    if (alpha == acc_t<T>(0) || k == 0) {  // never reads A or B; beta == 0 never reads C
      scale(beta, C);
      return;
    }
    // CudaBackend's own limits (Backend::gemm checked the rest): cuBLAS's
    // int32 dimensions, a forced variant's tuning workspace.
    const index_t extents[] = {m, n, k, A.ld, B.ld, C.ld};
    for (index_t v : extents)
      require(v <= INT_MAX, [&] {
        return "gemm: dimension or leading dimension " + std::to_string(v) +
               " exceeds cuBLAS's int32 range (C " + shape(m, n) + ", k " + std::to_string(k) +
               ", ld " + std::to_string(A.ld) + "/" + std::to_string(B.ld) + "/" +
               std::to_string(C.ld) + ")";
      });
    GemmVariant v = GemmVariant::native;
    if (options.force_variant) {
      v = *options.force_variant;
      const std::size_t need = variant_bytes<T>(v, A, B);
      require(need <= options.tune_workspace_bytes, [&] {
        return std::string("gemm: forced variant ") + to_string(v) + " needs " +
               std::to_string(need) +
               " bytes of tuning workspace, CudaOptions::" + "tune_workspace_bytes is " +
               std::to_string(options.tune_workspace_bytes);
      });
    } else if (tuning && !slots.empty()) {
      const std::size_t s = slot_of(m, n, k, ta, tb, dtype_v<T>, A.order, B.order, C.order);
      if (slots[s] >= 0) {
        v = tunings[static_cast<std::size_t>(slots[s])].chosen;
      } else if (tunings.size() < options.max_tuned_gemms) {
        tunings.push_back(tune(ta, tb, alpha, A, B, beta, C));  // within the reserved capacity
        slots[s] = static_cast<std::int32_t>(tunings.size() - 1);
        v = tunings.back().chosen;
      }
    }
    run_variant(v, ta, tb, alpha, A, B, beta, C);
  }

  // Strided-batched GEMM: one cublasGemmStridedBatchedEx call, native
  // operand layout (no tuning), mapping as cublas_gemm().
  template <class T>
  void gemm_batched(Op ta, Op tb, acc_t<T> alpha, ConstMatrixView<T> A, index_t stride_a,
                    ConstMatrixView<T> B, index_t stride_b, acc_t<T> beta, MatrixView<T> C,
                    index_t stride_c, index_t batch) {
    const index_t m = C.rows, n = C.cols, k = ta == Op::N ? A.cols : A.rows;
    if (m == 0 || n == 0 || batch == 0) return;
    // CudaBackend's own checks (Backend::gemm_strided_batched checked the
    // rest): cuBLAS's int32 range, the pointer space.
    const index_t extents[] = {m, n, k, A.ld, B.ld, C.ld, batch};
    for (index_t v : extents)
      require(v <= INT_MAX, [&] {
        return "gemm_strided_batched: dimension, leading dimension or batch " + std::to_string(v) +
               " exceeds cuBLAS's int32 range (C " + shape(m, n) + ", k " + std::to_string(k) +
               ", batch " + std::to_string(batch) + ")";
      });
    const bool reads_ab = alpha != acc_t<T>(0) && k != 0;
    if (reads_ab) {
      check_pointer(A.data, "gemm_strided_batched", "A");
      check_pointer(B.data, "gemm_strided_batched", "B");
    }
    check_pointer(C.data, "gemm_strided_batched", "C");
    if (!reads_ab) {  // never reads A or B; beta == 0 never reads C
      for (index_t b = 0; b < batch; ++b) {
        MatrixView<T> Cb = C;
        Cb.data += b * stride_c;
        scale(beta, Cb);
      }
      return;
    }
    const CublasMode mode = cublas_mode(ta, A.order, tb, B.order, C.order);
    const bool col = C.order == Order::col_major;
    const ConstMatrixView<T>& first = col ? A : B;
    const ConstMatrixView<T>& second = col ? B : A;
    const long long first_stride = col ? stride_a : stride_b;
    const long long second_stride = col ? stride_b : stride_a;
    const index_t M = col ? C.rows : C.cols, N = col ? C.cols : C.rows;
    constexpr bool is_float = std::is_same_v<T, float>, is_bf16 = std::is_same_v<T, bf16>;
    const cudaDataType_t type = is_bf16 ? CUDA_R_16BF : is_float ? CUDA_R_32F : CUDA_R_64F;
    const cublasComputeType_t compute =
        is_bf16     ? CUBLAS_COMPUTE_32F
        : !is_float ? CUBLAS_COMPUTE_64F
                    : (options.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F);
    check_cublas(
        cublasGemmStridedBatchedEx(cublas, mode.first_t ? CUBLAS_OP_T : CUBLAS_OP_N,
                                   mode.second_t ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(M),
                                   static_cast<int>(N), static_cast<int>(k), &alpha, first.data,
                                   type, static_cast<int>(first.ld), first_stride, second.data,
                                   type, static_cast<int>(second.ld), second_stride, &beta, C.data,
                                   type, static_cast<int>(C.ld), static_cast<long long>(stride_c),
                                   static_cast<int>(batch), compute, CUBLAS_GEMM_DEFAULT),
        "cublasGemmStridedBatchedEx");
  }

  template <class T>
  void scale(acc_t<T> beta, MatrixView<T> C) {
    if (C.empty() || beta == acc_t<T>(1)) return;
    const bool row = C.order == Order::row_major;
    if (beta == acc_t<T>(0)) {  // all-zero bits are +0.0 (also in bf16); never reads C
      const std::size_t pitch = static_cast<std::size_t>(C.ld) * sizeof(T);
      const std::size_t width = static_cast<std::size_t>(row ? C.cols : C.rows) * sizeof(T);
      check_cuda(cudaMemset2DAsync(C.data, pitch, 0, width,
                                   static_cast<std::size_t>(row ? C.rows : C.cols), launch.stream),
                 "cudaMemset2DAsync");
      return;
    }
    cuda_detail::scale(launch, beta, dview(C));
  }

  // With CudaOptions::check_pointers, throws unless p is device memory.
  void check_pointer(const void* p, const char* op, const char* name) const {
    if (!options.check_pointers || p == nullptr) return;
    cudaPointerAttributes attributes{};
    const cudaError_t e = cudaPointerGetAttributes(&attributes, p);
    if (e != cudaSuccess) cudaGetLastError();  // clear it; reported below
    require(e == cudaSuccess && (attributes.type == cudaMemoryTypeDevice ||
                                 attributes.type == cudaMemoryTypeManaged),
            [&] {
              return std::string(op) + ": " + name +
                     " is not device memory (CudaBackend takes device pointers only)";
            });
  }
};

// ---------------------------------------------------------------- construction

CudaBackend::CudaBackend(CudaOptions options) : impl_(std::make_unique<cuda_detail::CudaState>()) {
  cuda_detail::CudaState& I = *impl_;
  I.options = std::move(options);
  const CudaOptions& o = I.options;
  require(o.tune_repeats >= 1, [&] {
    return "CudaBackend: CudaOptions::tune_repeats " + std::to_string(o.tune_repeats) +
           " must be at least 1";
  });
  require(o.max_tuned_gemms <= (std::size_t{1} << 24), [&] {
    return "CudaBackend: CudaOptions::max_tuned_gemms " + std::to_string(o.max_tuned_gemms) +
           " is more than 2^24";
  });
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();
    throw Error(std::string("CudaBackend: no CUDA device (cudaGetDeviceCount: ") +
                (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices") + ")");
  }
  require(o.device < count, [&] {
    return "CudaBackend: CudaOptions::device " + std::to_string(o.device) + " but only " +
           std::to_string(count) + " CUDA device(s)";
  });
  if (o.device >= 0) check_cuda(cudaSetDevice(o.device), "cudaSetDevice");
  check_cuda(cudaGetDevice(&I.device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&I.launch.sm_count, cudaDevAttrMultiProcessorCount, I.device),
             "cudaDeviceGetAttribute(MultiProcessorCount)");
  if (o.stream != nullptr) {
    I.launch.stream = static_cast<cudaStream_t>(o.stream);
  } else {
    check_cuda(cudaStreamCreateWithFlags(&I.launch.stream, cudaStreamNonBlocking),
               "cudaStreamCreateWithFlags");
    I.own_stream = true;
  }
  check_cublas(cublasCreate(&I.cublas), "cublasCreate");
  // cublasSetStream resets the workspace, so the workspace comes after it.
  check_cublas(cublasSetStream(I.cublas, I.launch.stream), "cublasSetStream");
  if (o.cublas_workspace_bytes > 0) {
    check_cuda(cudaMalloc(&I.cublas_workspace, o.cublas_workspace_bytes),
               "cudaMalloc(cuBLAS workspace)");
    check_cublas(cublasSetWorkspace(I.cublas, I.cublas_workspace, o.cublas_workspace_bytes),
                 "cublasSetWorkspace");
  }
  check_cublas(cublasSetMathMode(I.cublas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  check_cublas(cublasSetPointerMode(I.cublas, CUBLAS_POINTER_MODE_HOST), "cublasSetPointerMode");
  if (o.tune_workspace_bytes > 0)
    check_cuda(cudaMalloc(&I.tune_workspace, o.tune_workspace_bytes),
               "cudaMalloc(GEMM tuning workspace)");
  check_cuda(cudaMalloc(&I.partials, (kMaxPartials + 1) * sizeof(double)),
             "cudaMalloc(reduction partials)");
  check_cuda(cudaMallocHost(&I.host_result, sizeof(double)), "cudaMallocHost");
  check_cuda(cudaEventCreate(&I.start), "cudaEventCreate");
  check_cuda(cudaEventCreate(&I.stop), "cudaEventCreate");
  I.tuning = o.tune_gemm;
  I.tunings.reserve(o.max_tuned_gemms);
  std::size_t slots = 2;
  while (slots < 2 * o.max_tuned_gemms) slots *= 2;
  I.slots.assign(o.max_tuned_gemms > 0 ? slots : 0, -1);
}

CudaBackend::~CudaBackend() = default;

int CudaBackend::device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

int CudaBackend::device() const {
  return impl_->device;
}
void* CudaBackend::stream() const {
  return impl_->launch.stream;
}
const CudaOptions& CudaBackend::options() const {
  return impl_->options;
}

void* CudaBackend::allocate(std::size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes == 0 ? kDeviceAlign : bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    const std::string what = "CudaBackend::allocate: cudaMalloc(" + std::to_string(bytes) +
                             " bytes) failed: " + cudaGetErrorString(e);
    // like CpuBackend: out of memory is a std::bad_alloc naming the bytes
    if (e == cudaErrorMemoryAllocation)
      throw OutOfMemory(what + " (" + std::to_string(static_cast<long long>(memory_free_bytes())) +
                        " bytes free on the device)");
    throw Error(what);
  }
  note_allocated(bytes);
  return p;
}

std::string CudaBackend::memory_domain() const {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, impl_->device) != cudaSuccess) {
    cudaGetLastError();
    return "cuda:" + std::to_string(impl_->device);
  }
  std::string key = "cuda:";
  static const char* hex = "0123456789abcdef";
  for (char byte : prop.uuid.bytes) {
    const auto b = static_cast<unsigned char>(byte);
    key += hex[b >> 4];
    key += hex[b & 15];
  }
  return key;
}

double CudaBackend::memory_free_bytes() const {
  // cudaMemGetInfo reads the calling thread's current device: this backend's
  int current = -1;
  const bool switched = cudaGetDevice(&current) == cudaSuccess && current != impl_->device &&
                        cudaSetDevice(impl_->device) == cudaSuccess;
  std::size_t free = 0, total = 0;
  const bool ok = cudaMemGetInfo(&free, &total) == cudaSuccess;
  if (switched) cudaSetDevice(current);
  if (!ok) {
    cudaGetLastError();
    return -1;
  }
  return static_cast<double>(free);
}

void CudaBackend::deallocate(void* p, std::size_t bytes) noexcept {
  if (p == nullptr) return;
  note_deallocated(bytes);
  cudaFree(p);
}

std::size_t CudaBackend::gemm_scratch_bytes(index_t, index_t, index_t, DType) const {
  return 0;
}

namespace {
// The copy stream and its two events, created on first use.
// All three or none: a failure part way leaves nothing half made.
void ensure_copy_stream(cuda_detail::CudaState& I) {
  if (I.copy_stream != nullptr) return;
  cudaStream_t stream = nullptr;
  cudaEvent_t computed = nullptr, copied = nullptr;
  cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&computed, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&copied, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    if (copied != nullptr) cudaEventDestroy(copied);
    if (computed != nullptr) cudaEventDestroy(computed);
    if (stream != nullptr) cudaStreamDestroy(stream);
    check_cuda(e, "creating the copy stream and its events (optimizer offload)");
  }
  I.copy_stream = stream;
  I.computed = computed;
  I.copied = copied;
}
}  // namespace

void* CudaBackend::allocate_host(std::size_t bytes) {
  ensure_copy_stream(*impl_);  // here, not in a step
  void* p = nullptr;
  const cudaError_t e = cudaHostAlloc(&p, bytes == 0 ? kDeviceAlign : bytes,
                                      cudaHostAllocPortable | cudaHostAllocMapped);
  if (e != cudaSuccess) {
    cudaGetLastError();
    const std::string what = "CudaBackend::allocate_host: cudaHostAlloc(" + std::to_string(bytes) +
                             " bytes) failed: " + cudaGetErrorString(e);
    // like allocate: out of memory is a std::bad_alloc naming the bytes
    if (e == cudaErrorMemoryAllocation) throw OutOfMemory(what);
    throw Error(what);
  }
  note_host_allocated(bytes);
  return p;
}

void CudaBackend::deallocate_host(void* p, std::size_t bytes) noexcept {
  if (p == nullptr) return;
  note_host_deallocated(bytes);
  cudaFreeHost(p);
}

void CudaBackend::stage_in(void* dst, const void* host_src, std::size_t bytes) {
  if (bytes == 0) return;
  cuda_detail::CudaState& I = *impl_;
  ensure_copy_stream(I);
  check_cuda(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyDefault, I.copy_stream),
             "cudaMemcpyAsync(stage_in)");
}

void CudaBackend::stage_out(void* host_dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  cuda_detail::CudaState& I = *impl_;
  ensure_copy_stream(I);
  check_cuda(cudaEventRecord(I.computed, I.launch.stream), "cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(I.copy_stream, I.computed, 0), "cudaStreamWaitEvent");
  check_cuda(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDefault, I.copy_stream),
             "cudaMemcpyAsync(stage_out)");
}

void CudaBackend::stage_fence() {
  cuda_detail::CudaState& I = *impl_;
  if (I.copy_stream == nullptr) return;
  check_cuda(cudaEventRecord(I.copied, I.copy_stream), "cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(I.launch.stream, I.copied, 0), "cudaStreamWaitEvent");
}

void CudaBackend::stage_wait() {
  if (impl_->copy_stream != nullptr)
    check_cuda(cudaStreamSynchronize(impl_->copy_stream), "cudaStreamSynchronize(copy stream)");
}

void CudaBackend::do_upload(void* device_dst, const void* host_src, std::size_t bytes) {
  if (bytes == 0) return;
  check_cuda(cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyDefault, impl_->launch.stream),
             "cudaMemcpyAsync(host to device)");
  check_cuda(cudaStreamSynchronize(impl_->launch.stream), "cudaStreamSynchronize");
}

void CudaBackend::do_download(void* host_dst, const void* device_src, std::size_t bytes) {
  if (bytes == 0) return;
  check_cuda(cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDefault, impl_->launch.stream),
             "cudaMemcpyAsync(device to host)");
  check_cuda(cudaStreamSynchronize(impl_->launch.stream), "cudaStreamSynchronize");
}

void CudaBackend::fill_bytes(void* device_dst, int value, std::size_t bytes) {
  if (bytes == 0) return;
  check_cuda(cudaMemsetAsync(device_dst, value, bytes, impl_->launch.stream), "cudaMemsetAsync");
}

void CudaBackend::synchronize() {
  check_cuda(cudaStreamSynchronize(impl_->launch.stream), "cudaStreamSynchronize");
}

// ---------------------------------------------------------------- GEMM

void CudaBackend::do_gemm(Op ta, Op tb, float alpha, ConstMatrixView<float> A,
                          ConstMatrixView<float> B, float beta, MatrixView<float> C, Scratch) {
  impl_->gemm(ta, tb, alpha, A, B, beta, C);
}
void CudaBackend::do_gemm(Op ta, Op tb, double alpha, ConstMatrixView<double> A,
                          ConstMatrixView<double> B, double beta, MatrixView<double> C, Scratch) {
  impl_->gemm(ta, tb, alpha, A, B, beta, C);
}

void CudaBackend::do_gemm_strided_batched(Op ta, Op tb, float alpha, ConstMatrixView<float> A,
                                          index_t stride_a, ConstMatrixView<float> B,
                                          index_t stride_b, float beta, MatrixView<float> C,
                                          index_t stride_c, index_t batch, Scratch) {
  impl_->gemm_batched(ta, tb, alpha, A, stride_a, B, stride_b, beta, C, stride_c, batch);
}
void CudaBackend::do_gemm_strided_batched(Op ta, Op tb, double alpha, ConstMatrixView<double> A,
                                          index_t stride_a, ConstMatrixView<double> B,
                                          index_t stride_b, double beta, MatrixView<double> C,
                                          index_t stride_c, index_t batch, Scratch) {
  impl_->gemm_batched(ta, tb, alpha, A, stride_a, B, stride_b, beta, C, stride_c, batch);
}

void CudaBackend::set_gemm_tuning(bool on) {
  impl_->tuning = on;
}

std::vector<GemmTuning> CudaBackend::gemm_tunings() const {
  return impl_->tunings;
}

std::string CudaBackend::gemm_tuning_report() const {
  std::string out = "GEMM tuning (" + std::to_string(impl_->tunings.size()) + " shapes, " +
                    (impl_->tuning ? "on" : "off") + "): ms per call per variant [cuBLAS mode]\n";
  char buffer[64];
  for (const GemmTuning& t : impl_->tunings) {
    out += std::string(name_of(t.dtype)) + " C" + shape(t.m, t.n) + " k=" + std::to_string(t.k) +
           " op=" + (t.ta == Op::N ? "N" : "T") + (t.tb == Op::N ? "N" : "T") +
           " A=" + order_name(t.a_order) + " B=" + order_name(t.b_order) +
           " C=" + order_name(t.c_order) + " |";
    for (GemmVariant v : kVariants) {
      const double ms = t.milliseconds[static_cast<int>(v)];
      const CublasMode mode = variant_mode(v, t.ta, t.a_order, t.tb, t.b_order, t.c_order);
      if (ms >= 0)
        std::snprintf(buffer, sizeof buffer, " %.4f", ms);
      else
        std::snprintf(buffer, sizeof buffer, " -");
      out += std::string(" ") + to_string(v) + "[" + mode_name(mode) + "]" + buffer;
    }
    out += std::string(" -> ") + to_string(t.chosen) + "\n";
  }
  return out;
}

// ---------------------------------------------------------------- elementwise

// The remaining ops: Backend's entry points checked layouts, shapes, counts
// and null arrays; a hook adds only the pointer-space check
// (CudaOptions::check_pointers), then launches one kernel.
#define SUMMA_L impl_->launch

// The pointer space (CudaOptions::check_pointers) of an op's arrays, by name.
static void check_pointers(const cuda_detail::CudaState& I, const char* op,
                           std::initializer_list<std::pair<const void*, const char*>> arrays) {
  for (const auto& [p, name] : arrays) I.check_pointer(p, op, name);
}

template <class T>
static void copy_impl(const cuda_detail::Launch& L, ConstMatrixView<T> src, MatrixView<T> dst) {
  if (src.empty() || (src.data == dst.data && src.ld == dst.ld && src.order == dst.order)) return;
  if (src.order == dst.order) {
    const bool row = dst.order == Order::row_major;
    const auto inner = static_cast<std::size_t>(row ? dst.cols : dst.rows);
    const auto outer = static_cast<std::size_t>(row ? dst.rows : dst.cols);
    // One contiguous range (one line, or lines without gaps): a plain copy
    // (cudaMemcpy2DAsync refuses a pitch beyond cudaDevAttrMaxPitch, about
    // 2 GiB, which a long single line of a kept region or a flat buffer
    // reaches).
    if (outer == 1 ||
        (static_cast<std::size_t>(src.ld) == inner && static_cast<std::size_t>(dst.ld) == inner)) {
      check_cuda(cudaMemcpyAsync(dst.data, src.data, inner * outer * sizeof(T),
                                 cudaMemcpyDeviceToDevice, L.stream),
                 "cudaMemcpyAsync");
      return;
    }
    check_cuda(cudaMemcpy2DAsync(dst.data, static_cast<std::size_t>(dst.ld) * sizeof(T), src.data,
                                 static_cast<std::size_t>(src.ld) * sizeof(T),
                                 static_cast<std::size_t>(row ? dst.cols : dst.rows) * sizeof(T),
                                 static_cast<std::size_t>(row ? dst.rows : dst.cols),
                                 cudaMemcpyDeviceToDevice, L.stream),
               "cudaMemcpy2DAsync");
    return;
  }
  cuda_detail::axpby(L, acc_t<T>(1), dview(src), acc_t<T>(0), dview(dst));
}

void CudaBackend::do_copy(ConstMatrixView<float> src, MatrixView<float> dst) {
  copy_impl(SUMMA_L, src, dst);
}
void CudaBackend::do_copy(ConstMatrixView<double> src, MatrixView<double> dst) {
  copy_impl(SUMMA_L, src, dst);
}

template <class T>
static void axpby_impl(const cuda_detail::Launch& L, acc_t<T> alpha, ConstMatrixView<T> X,
                       acc_t<T> beta, MatrixView<T> C) {
  cuda_detail::axpby(L, alpha, dview(X), beta, dview(C));
}

void CudaBackend::do_axpby(float alpha, ConstMatrixView<float> X, float beta, MatrixView<float> C) {
  axpby_impl(SUMMA_L, alpha, X, beta, C);
}
void CudaBackend::do_axpby(double alpha, ConstMatrixView<double> X, double beta,
                           MatrixView<double> C) {
  axpby_impl(SUMMA_L, alpha, X, beta, C);
}

void CudaBackend::do_scale(float beta, MatrixView<float> C) {
  impl_->scale(beta, C);
}
void CudaBackend::do_scale(double beta, MatrixView<double> C) {
  impl_->scale(beta, C);
}

template <class T>
static void add_bias_impl(const cuda_detail::CudaState& I, MatrixView<T> Y, const T* bias) {
  I.check_pointer(bias, "add_bias", "bias");
  cuda_detail::add_bias(I.launch, dview(Y), cuda_detail::dptr(bias));
}
void CudaBackend::do_add_bias(MatrixView<float> Y, const float* bias) {
  add_bias_impl(*impl_, Y, bias);
}
void CudaBackend::do_add_bias(MatrixView<double> Y, const double* bias) {
  add_bias_impl(*impl_, Y, bias);
}

template <class T>
static void column_sums_impl(const cuda_detail::CudaState& I, ConstMatrixView<T> X, acc_t<T> beta,
                             T* out) {
  I.check_pointer(out, "column_sums", "out");
  cuda_detail::column_sums(I.launch, dview(X), beta, cuda_detail::dptr(out));
}
void CudaBackend::do_column_sums(ConstMatrixView<float> X, float beta, float* out) {
  column_sums_impl(*impl_, X, beta, out);
}
void CudaBackend::do_column_sums(ConstMatrixView<double> X, double beta, double* out) {
  column_sums_impl(*impl_, X, beta, out);
}

// ---------------------------------------------------------------- LayerNorm

template <class T>
static void ln_partial_sums_impl(const cuda_detail::CudaState& I, ConstMatrixView<T> X,
                                 const acc_t<T>* center, acc_t<T>* out) {
  I.check_pointer(out, "layernorm_partial_sums", "out");
  I.check_pointer(center, "layernorm_partial_sums", "center");
  cuda_detail::layernorm_partial_sums(I.launch, dview(X), center, out);
}
void CudaBackend::do_layernorm_partial_sums(ConstMatrixView<float> X, const float* center,
                                            float* out) {
  ln_partial_sums_impl(*impl_, X, center, out);
}
void CudaBackend::do_layernorm_partial_sums(ConstMatrixView<double> X, const double* center,
                                            double* out) {
  ln_partial_sums_impl(*impl_, X, center, out);
}

void CudaBackend::do_layernorm_mean(index_t n, index_t h, const float* sums, float* mean) {
  check_pointers(*impl_, "layernorm_mean", {{sums, "sums"}, {mean, "mean"}});
  cuda_detail::layernorm_mean(SUMMA_L, n, h, sums, mean);
}
void CudaBackend::do_layernorm_mean(index_t n, index_t h, const double* sums, double* mean) {
  check_pointers(*impl_, "layernorm_mean", {{sums, "sums"}, {mean, "mean"}});
  cuda_detail::layernorm_mean(SUMMA_L, n, h, sums, mean);
}
void CudaBackend::do_layernorm_rstd(index_t n, index_t h, double eps, const float* squares,
                                    float* rstd) {
  check_pointers(*impl_, "layernorm_rstd", {{squares, "squares"}, {rstd, "rstd"}});
  cuda_detail::layernorm_rstd(SUMMA_L, n, h, eps, squares, rstd);
}
void CudaBackend::do_layernorm_rstd(index_t n, index_t h, double eps, const double* squares,
                                    double* rstd) {
  check_pointers(*impl_, "layernorm_rstd", {{squares, "squares"}, {rstd, "rstd"}});
  cuda_detail::layernorm_rstd(SUMMA_L, n, h, eps, squares, rstd);
}

template <class T>
static void ln_apply_impl(const cuda_detail::CudaState& I, ConstMatrixView<T> X,
                          const acc_t<T>* mean, const acc_t<T>* rstd, const T* gamma, const T* beta,
                          MatrixView<T> Y) {
  check_pointers(I, "layernorm_apply",
                 {{mean, "mean"}, {rstd, "rstd"}, {gamma, "gamma"}, {beta, "beta"}});
  cuda_detail::layernorm_apply(I.launch, dview(X), mean, rstd, cuda_detail::dptr(gamma),
                               cuda_detail::dptr(beta), dview(Y));
}
void CudaBackend::do_layernorm_apply(ConstMatrixView<float> X, const float* mean, const float* rstd,
                                     const float* gamma, const float* beta, MatrixView<float> Y) {
  ln_apply_impl(*impl_, X, mean, rstd, gamma, beta, Y);
}
void CudaBackend::do_layernorm_apply(ConstMatrixView<double> X, const double* mean,
                                     const double* rstd, const double* gamma, const double* beta,
                                     MatrixView<double> Y) {
  ln_apply_impl(*impl_, X, mean, rstd, gamma, beta, Y);
}

template <class T>
static void ln_backward_partials_impl(const cuda_detail::CudaState& I, ConstMatrixView<T> X,
                                      ConstMatrixView<T> dY, const acc_t<T>* mean,
                                      const acc_t<T>* rstd, const T* gamma, acc_t<T>* a,
                                      acc_t<T>* b) {
  check_pointers(I, "layernorm_backward_partials",
                 {{mean, "mean"}, {rstd, "rstd"}, {gamma, "gamma"}, {a, "a"}, {b, "b"}});
  cuda_detail::layernorm_backward_partials(I.launch, dview(X), dview(dY), mean, rstd,
                                           cuda_detail::dptr(gamma), a, b);
}
void CudaBackend::do_layernorm_backward_partials(ConstMatrixView<float> X,
                                                 ConstMatrixView<float> dY, const float* mean,
                                                 const float* rstd, const float* gamma, float* a,
                                                 float* b) {
  ln_backward_partials_impl(*impl_, X, dY, mean, rstd, gamma, a, b);
}
void CudaBackend::do_layernorm_backward_partials(ConstMatrixView<double> X,
                                                 ConstMatrixView<double> dY, const double* mean,
                                                 const double* rstd, const double* gamma, double* a,
                                                 double* b) {
  ln_backward_partials_impl(*impl_, X, dY, mean, rstd, gamma, a, b);
}

template <class T>
static void ln_backward_apply_impl(const cuda_detail::CudaState& I, ConstMatrixView<T> X,
                                   ConstMatrixView<T> dY, const acc_t<T>* mean,
                                   const acc_t<T>* rstd, const T* gamma, const acc_t<T>* a,
                                   const acc_t<T>* b, index_t h, MatrixView<T> dX) {
  check_pointers(I, "layernorm_backward_apply",
                 {{mean, "mean"}, {rstd, "rstd"}, {gamma, "gamma"}, {a, "a"}, {b, "b"}});
  cuda_detail::layernorm_backward_apply(I.launch, dview(X), dview(dY), mean, rstd,
                                        cuda_detail::dptr(gamma), a, b, h, dview(dX));
}
void CudaBackend::do_layernorm_backward_apply(ConstMatrixView<float> X, ConstMatrixView<float> dY,
                                              const float* mean, const float* rstd,
                                              const float* gamma, const float* a, const float* b,
                                              index_t h, MatrixView<float> dX) {
  ln_backward_apply_impl(*impl_, X, dY, mean, rstd, gamma, a, b, h, dX);
}
void CudaBackend::do_layernorm_backward_apply(ConstMatrixView<double> X, ConstMatrixView<double> dY,
                                              const double* mean, const double* rstd,
                                              const double* gamma, const double* a, const double* b,
                                              index_t h, MatrixView<double> dX) {
  ln_backward_apply_impl(*impl_, X, dY, mean, rstd, gamma, a, b, h, dX);
}

template <class T>
static void ln_param_partials_impl(const cuda_detail::CudaState& I, ConstMatrixView<T> X,
                                   ConstMatrixView<T> dY, const acc_t<T>* mean,
                                   const acc_t<T>* rstd, T* dgamma, T* dbeta) {
  check_pointers(I, "layernorm_param_partials",
                 {{mean, "mean"}, {rstd, "rstd"}, {dgamma, "dgamma"}, {dbeta, "dbeta"}});
  cuda_detail::layernorm_param_partials(I.launch, dview(X), dview(dY), mean, rstd,
                                        cuda_detail::dptr(dgamma), cuda_detail::dptr(dbeta));
}
void CudaBackend::do_layernorm_param_partials(ConstMatrixView<float> X, ConstMatrixView<float> dY,
                                              const float* mean, const float* rstd, float* dgamma,
                                              float* dbeta) {
  ln_param_partials_impl(*impl_, X, dY, mean, rstd, dgamma, dbeta);
}
void CudaBackend::do_layernorm_param_partials(ConstMatrixView<double> X, ConstMatrixView<double> dY,
                                              const double* mean, const double* rstd,
                                              double* dgamma, double* dbeta) {
  ln_param_partials_impl(*impl_, X, dY, mean, rstd, dgamma, dbeta);
}

// ---------------------------------------------------------------- GeLU

template <class T>
static void gelu_forward_impl(const cuda_detail::Launch& L, ConstMatrixView<T> X, MatrixView<T> Y) {
  cuda_detail::gelu_forward(L, dview(X), dview(Y));
}
void CudaBackend::do_gelu_forward(ConstMatrixView<float> X, MatrixView<float> Y) {
  gelu_forward_impl(SUMMA_L, X, Y);
}
void CudaBackend::do_gelu_forward(ConstMatrixView<double> X, MatrixView<double> Y) {
  gelu_forward_impl(SUMMA_L, X, Y);
}

template <class T>
static void gelu_backward_impl(const cuda_detail::Launch& L, ConstMatrixView<T> X,
                               ConstMatrixView<T> dY, MatrixView<T> dX) {
  cuda_detail::gelu_backward(L, dview(X), dview(dY), dview(dX));
}
void CudaBackend::do_gelu_backward(ConstMatrixView<float> X, ConstMatrixView<float> dY,
                                   MatrixView<float> dX) {
  gelu_backward_impl(SUMMA_L, X, dY, dX);
}
void CudaBackend::do_gelu_backward(ConstMatrixView<double> X, ConstMatrixView<double> dY,
                                   MatrixView<double> dX) {
  gelu_backward_impl(SUMMA_L, X, dY, dX);
}

// ---------------------------------------------------------------- softmax

template <class T>
static void softmax_impl(const cuda_detail::Launch& L, ConstMatrixView<T> S, double scale,
                         MatrixView<T> P) {
  cuda_detail::softmax_causal(L, dview(S), scale, dview(P));
}
void CudaBackend::do_softmax_causal(ConstMatrixView<float> S, double scale, MatrixView<float> P) {
  softmax_impl(SUMMA_L, S, scale, P);
}
void CudaBackend::do_softmax_causal(ConstMatrixView<double> S, double scale, MatrixView<double> P) {
  softmax_impl(SUMMA_L, S, scale, P);
}

template <class T>
static void softmax_backward_impl(const cuda_detail::Launch& L, ConstMatrixView<T> P,
                                  ConstMatrixView<T> dP, double scale, MatrixView<T> dS) {
  cuda_detail::softmax_causal_backward(L, dview(P), dview(dP), scale, dview(dS));
}
void CudaBackend::do_softmax_causal_backward(ConstMatrixView<float> P, ConstMatrixView<float> dP,
                                             double scale, MatrixView<float> dS) {
  softmax_backward_impl(SUMMA_L, P, dP, scale, dS);
}
void CudaBackend::do_softmax_causal_backward(ConstMatrixView<double> P, ConstMatrixView<double> dP,
                                             double scale, MatrixView<double> dS) {
  softmax_backward_impl(SUMMA_L, P, dP, scale, dS);
}

// ---------------------------------------------------------------- cross-entropy

template <class T>
static void row_max_impl(const cuda_detail::CudaState& I, ConstMatrixView<T> Z, acc_t<T>* out) {
  I.check_pointer(out, "row_max", "out");
  cuda_detail::row_max(I.launch, dview(Z), out);
}
void CudaBackend::do_row_max(ConstMatrixView<float> Z, float* out) {
  row_max_impl(*impl_, Z, out);
}
void CudaBackend::do_row_max(ConstMatrixView<double> Z, double* out) {
  row_max_impl(*impl_, Z, out);
}

template <class T>
static void row_sum_exp_impl(const cuda_detail::CudaState& I, ConstMatrixView<T> Z,
                             const acc_t<T>* max, acc_t<T>* out) {
  I.check_pointer(out, "row_sum_exp", "out");
  I.check_pointer(max, "row_sum_exp", "max");
  cuda_detail::row_sum_exp(I.launch, dview(Z), max, out);
}
void CudaBackend::do_row_sum_exp(ConstMatrixView<float> Z, const float* max, float* out) {
  row_sum_exp_impl(*impl_, Z, max, out);
}
void CudaBackend::do_row_sum_exp(ConstMatrixView<double> Z, const double* max, double* out) {
  row_sum_exp_impl(*impl_, Z, max, out);
}

template <class T>
static void pick_targets_impl(const cuda_detail::CudaState& I, ConstMatrixView<T> Z,
                              const std::int32_t* targets, index_t col0, acc_t<T>* out) {
  I.check_pointer(targets, "pick_targets", "targets");
  I.check_pointer(out, "pick_targets", "out");
  cuda_detail::pick_targets(I.launch, dview(Z), targets, col0, out);
}
void CudaBackend::do_pick_targets(ConstMatrixView<float> Z, const std::int32_t* targets,
                                  index_t col0, float* out) {
  pick_targets_impl(*impl_, Z, targets, col0, out);
}
void CudaBackend::do_pick_targets(ConstMatrixView<double> Z, const std::int32_t* targets,
                                  index_t col0, double* out) {
  pick_targets_impl(*impl_, Z, targets, col0, out);
}

// Copies the one value the two-pass reduction left on the device back.
static double fetch_result(cuda_detail::CudaState& I) {
  check_cuda(cudaMemcpyAsync(I.host_result, I.partials + kMaxPartials, sizeof(double),
                             cudaMemcpyDeviceToHost, I.launch.stream),
             "cudaMemcpyAsync(device to host)");
  check_cuda(cudaStreamSynchronize(I.launch.stream), "cudaStreamSynchronize");
  return *I.host_result;
}

template <class T>
static double cross_entropy_sum_impl(cuda_detail::CudaState& I, index_t n, const T* max,
                                     const T* sum, const T* picked) {
  I.check_pointer(max, "cross_entropy_sum", "max");
  I.check_pointer(sum, "cross_entropy_sum", "sum");
  I.check_pointer(picked, "cross_entropy_sum", "picked");
  cuda_detail::cross_entropy_sum(I.launch, n, max, sum, picked, I.partials);
  return fetch_result(I);
}
double CudaBackend::do_cross_entropy_sum(index_t n, const float* max, const float* sum,
                                         const float* picked) {
  return cross_entropy_sum_impl(*impl_, n, max, sum, picked);
}
double CudaBackend::do_cross_entropy_sum(index_t n, const double* max, const double* sum,
                                         const double* picked) {
  return cross_entropy_sum_impl(*impl_, n, max, sum, picked);
}

template <class T>
static void cross_entropy_grad_impl(const cuda_detail::CudaState& I, MatrixView<T> Z,
                                    const acc_t<T>* max, const acc_t<T>* sum,
                                    const std::int32_t* targets, index_t col0, double scale) {
  I.check_pointer(max, "cross_entropy_grad", "max");
  I.check_pointer(sum, "cross_entropy_grad", "sum");
  I.check_pointer(targets, "cross_entropy_grad", "targets");
  cuda_detail::cross_entropy_grad(I.launch, dview(Z), max, sum, targets, col0, scale);
}
void CudaBackend::do_cross_entropy_grad(MatrixView<float> Z, const float* max, const float* sum,
                                        const std::int32_t* targets, index_t col0, double scale) {
  cross_entropy_grad_impl(*impl_, Z, max, sum, targets, col0, scale);
}
void CudaBackend::do_cross_entropy_grad(MatrixView<double> Z, const double* max, const double* sum,
                                        const std::int32_t* targets, index_t col0, double scale) {
  cross_entropy_grad_impl(*impl_, Z, max, sum, targets, col0, scale);
}

// ---------------------------------------------------------------- embedding rows

template <class T>
static void gather_rows_impl(const cuda_detail::CudaState& I, const std::int32_t* ids, index_t row0,
                             ConstMatrixView<T> table, bool accumulate, MatrixView<T> out) {
  I.check_pointer(ids, "gather_rows", "ids");
  cuda_detail::gather_rows(I.launch, ids, row0, dview(table), accumulate, dview(out));
}
void CudaBackend::do_gather_rows(const std::int32_t* ids, index_t row0,
                                 ConstMatrixView<float> table, bool accumulate,
                                 MatrixView<float> out) {
  gather_rows_impl(*impl_, ids, row0, table, accumulate, out);
}
void CudaBackend::do_gather_rows(const std::int32_t* ids, index_t row0,
                                 ConstMatrixView<double> table, bool accumulate,
                                 MatrixView<double> out) {
  gather_rows_impl(*impl_, ids, row0, table, accumulate, out);
}

template <class T>
static void scatter_add_rows_impl(const cuda_detail::CudaState& I, const std::int32_t* ids,
                                  index_t row0, ConstMatrixView<T> src, MatrixView<T> table) {
  I.check_pointer(ids, "scatter_add_rows", "ids");
  cuda_detail::scatter_add_rows(I.launch, ids, row0, dview(src), dview(table));
}
void CudaBackend::do_scatter_add_rows(const std::int32_t* ids, index_t row0,
                                      ConstMatrixView<float> src, MatrixView<float> table) {
  scatter_add_rows_impl(*impl_, ids, row0, src, table);
}
void CudaBackend::do_scatter_add_rows(const std::int32_t* ids, index_t row0,
                                      ConstMatrixView<double> src, MatrixView<double> table) {
  scatter_add_rows_impl(*impl_, ids, row0, src, table);
}

// ---------------------------------------------------------------- optimizer helpers

template <class T>
static double sum_of_squares_impl(cuda_detail::CudaState& I, const T* x, index_t rows, index_t cols,
                                  index_t ld) {
  if (rows > 0 && cols > 0) I.check_pointer(x, "sum_of_squares", "x");
  cuda_detail::sum_of_squares(I.launch, cuda_detail::dptr(x), rows, cols, ld, I.partials);
  return fetch_result(I);
}
template <class T>
static double sum_of_squares_impl(cuda_detail::CudaState& I, const T* x, index_t n) {
  return sum_of_squares_impl(I, x, n > 0 ? 1 : 0, n, n);
}
double CudaBackend::do_sum_of_squares(const float* x, index_t n) {
  return sum_of_squares_impl(*impl_, x, n);
}
double CudaBackend::do_sum_of_squares(const double* x, index_t n) {
  return sum_of_squares_impl(*impl_, x, n);
}
double CudaBackend::do_sum_of_squares(const float* x, index_t rows, index_t cols, index_t ld) {
  return sum_of_squares_impl(*impl_, x, rows, cols, ld);
}
double CudaBackend::do_sum_of_squares(const double* x, index_t rows, index_t cols, index_t ld) {
  return sum_of_squares_impl(*impl_, x, rows, cols, ld);
}

template <class T>
static void scale_in_place_impl(const cuda_detail::CudaState& I, T* x, index_t n, double factor) {
  I.check_pointer(x, "scale_in_place", "x");
  cuda_detail::scale_in_place(I.launch, cuda_detail::dptr(x), n, factor);
}
void CudaBackend::do_scale_in_place(float* x, index_t n, double factor) {
  scale_in_place_impl(*impl_, x, n, factor);
}
void CudaBackend::do_scale_in_place(double* x, index_t n, double factor) {
  scale_in_place_impl(*impl_, x, n, factor);
}

template <class T, class M>
static void adamw_impl(const cuda_detail::CudaState& I, T* param, const T* grad, M* exp_avg,
                       M* exp_avg_sq, index_t n, const optim::AdamWCoefficients& c) {
  I.check_pointer(param, "adamw_update", "param");
  I.check_pointer(grad, "adamw_update", "grad");
  I.check_pointer(exp_avg, "adamw_update", "exp_avg");
  I.check_pointer(exp_avg_sq, "adamw_update", "exp_avg_sq");
  cuda::adamw_update(param, grad, exp_avg, exp_avg_sq, n, c, I.launch.stream);
}
void CudaBackend::do_adamw_update(float* param, const float* grad, float* exp_avg,
                                  float* exp_avg_sq, index_t n, const optim::AdamWCoefficients& c) {
  adamw_impl(*impl_, param, grad, exp_avg, exp_avg_sq, n, c);
}
void CudaBackend::do_adamw_update(double* param, const double* grad, double* exp_avg,
                                  double* exp_avg_sq, index_t n,
                                  const optim::AdamWCoefficients& c) {
  adamw_impl(*impl_, param, grad, exp_avg, exp_avg_sq, n, c);
}

template <class T, class M>
static void sgd_impl(const cuda_detail::CudaState& I, T* param, const T* grad, M* momentum_buffer,
                     index_t n, const optim::SgdCoefficients& c) {
  I.check_pointer(param, "sgd_update", "param");
  I.check_pointer(grad, "sgd_update", "grad");
  I.check_pointer(momentum_buffer, "sgd_update", "momentum_buffer");
  cuda::sgd_update(param, grad, momentum_buffer, n, c, I.launch.stream);
}
void CudaBackend::do_sgd_update(float* param, const float* grad, float* momentum_buffer, index_t n,
                                const optim::SgdCoefficients& c) {
  sgd_impl(*impl_, param, grad, momentum_buffer, n, c);
}
void CudaBackend::do_sgd_update(double* param, const double* grad, double* momentum_buffer,
                                index_t n, const optim::SgdCoefficients& c) {
  sgd_impl(*impl_, param, grad, momentum_buffer, n, c);
}

// ---------------------------------------------------------------- bf16 (mixed precision)
// The templates above with T = bf16: device kernels on __nv_bfloat16 with fp32
// arithmetic (kernels.cuh), cublasGemmEx with CUDA_R_16BF and fp32 compute.

void CudaBackend::do_gemm(Op ta, Op tb, float alpha, ConstMatrixView<bf16> A,
                          ConstMatrixView<bf16> B, float beta, MatrixView<bf16> C, Scratch) {
  impl_->gemm<bf16>(ta, tb, alpha, A, B, beta, C);
}
void CudaBackend::do_gemm_strided_batched(Op ta, Op tb, float alpha, ConstMatrixView<bf16> A,
                                          index_t stride_a, ConstMatrixView<bf16> B,
                                          index_t stride_b, float beta, MatrixView<bf16> C,
                                          index_t stride_c, index_t batch, Scratch) {
  impl_->gemm_batched<bf16>(ta, tb, alpha, A, stride_a, B, stride_b, beta, C, stride_c, batch);
}
void CudaBackend::do_copy(ConstMatrixView<bf16> src, MatrixView<bf16> dst) {
  copy_impl(SUMMA_L, src, dst);
}
void CudaBackend::do_convert(ConstMatrixView<float> src, MatrixView<bf16> dst) {
  cuda_detail::convert(SUMMA_L, dview(src), dview(dst));
}
void CudaBackend::do_convert(ConstMatrixView<bf16> src, MatrixView<float> dst) {
  cuda_detail::convert(SUMMA_L, dview(src), dview(dst));
}
void CudaBackend::do_axpby(float alpha, ConstMatrixView<bf16> X, float beta, MatrixView<bf16> C) {
  axpby_impl(SUMMA_L, alpha, X, beta, C);
}
void CudaBackend::do_scale(float beta, MatrixView<bf16> C) {
  impl_->scale<bf16>(beta, C);
}
void CudaBackend::do_add_bias(MatrixView<bf16> Y, const bf16* bias) {
  add_bias_impl(*impl_, Y, bias);
}
void CudaBackend::do_column_sums(ConstMatrixView<bf16> X, float beta, bf16* out) {
  column_sums_impl(*impl_, X, beta, out);
}
void CudaBackend::do_layernorm_partial_sums(ConstMatrixView<bf16> X, const float* center,
                                            float* out) {
  ln_partial_sums_impl(*impl_, X, center, out);
}
void CudaBackend::do_layernorm_apply(ConstMatrixView<bf16> X, const float* mean, const float* rstd,
                                     const bf16* gamma, const bf16* beta, MatrixView<bf16> Y) {
  ln_apply_impl(*impl_, X, mean, rstd, gamma, beta, Y);
}
void CudaBackend::do_layernorm_backward_partials(ConstMatrixView<bf16> X, ConstMatrixView<bf16> dY,
                                                 const float* mean, const float* rstd,
                                                 const bf16* gamma, float* a, float* b) {
  ln_backward_partials_impl(*impl_, X, dY, mean, rstd, gamma, a, b);
}
void CudaBackend::do_layernorm_backward_apply(ConstMatrixView<bf16> X, ConstMatrixView<bf16> dY,
                                              const float* mean, const float* rstd,
                                              const bf16* gamma, const float* a, const float* b,
                                              index_t h, MatrixView<bf16> dX) {
  ln_backward_apply_impl(*impl_, X, dY, mean, rstd, gamma, a, b, h, dX);
}
void CudaBackend::do_layernorm_param_partials(ConstMatrixView<bf16> X, ConstMatrixView<bf16> dY,
                                              const float* mean, const float* rstd, bf16* dgamma,
                                              bf16* dbeta) {
  ln_param_partials_impl(*impl_, X, dY, mean, rstd, dgamma, dbeta);
}
void CudaBackend::do_gelu_forward(ConstMatrixView<bf16> X, MatrixView<bf16> Y) {
  gelu_forward_impl(SUMMA_L, X, Y);
}
void CudaBackend::do_gelu_backward(ConstMatrixView<bf16> X, ConstMatrixView<bf16> dY,
                                   MatrixView<bf16> dX) {
  gelu_backward_impl(SUMMA_L, X, dY, dX);
}
void CudaBackend::do_softmax_causal(ConstMatrixView<bf16> S, double scale, MatrixView<bf16> P) {
  softmax_impl(SUMMA_L, S, scale, P);
}
void CudaBackend::do_softmax_causal_backward(ConstMatrixView<bf16> P, ConstMatrixView<bf16> dP,
                                             double scale, MatrixView<bf16> dS) {
  softmax_backward_impl(SUMMA_L, P, dP, scale, dS);
}
void CudaBackend::do_row_max(ConstMatrixView<bf16> Z, float* out) {
  row_max_impl(*impl_, Z, out);
}
void CudaBackend::do_row_sum_exp(ConstMatrixView<bf16> Z, const float* max, float* out) {
  row_sum_exp_impl(*impl_, Z, max, out);
}
void CudaBackend::do_pick_targets(ConstMatrixView<bf16> Z, const std::int32_t* targets,
                                  index_t col0, float* out) {
  pick_targets_impl(*impl_, Z, targets, col0, out);
}
void CudaBackend::do_cross_entropy_grad(MatrixView<bf16> Z, const float* max, const float* sum,
                                        const std::int32_t* targets, index_t col0, double scale) {
  cross_entropy_grad_impl(*impl_, Z, max, sum, targets, col0, scale);
}
void CudaBackend::do_gather_rows(const std::int32_t* ids, index_t row0, ConstMatrixView<bf16> table,
                                 bool accumulate, MatrixView<bf16> out) {
  gather_rows_impl(*impl_, ids, row0, table, accumulate, out);
}
void CudaBackend::do_scatter_add_rows(const std::int32_t* ids, index_t row0,
                                      ConstMatrixView<bf16> src, MatrixView<bf16> table) {
  scatter_add_rows_impl(*impl_, ids, row0, src, table);
}
double CudaBackend::do_sum_of_squares(const bf16* x, index_t n) {
  return sum_of_squares_impl(*impl_, x, n);
}
double CudaBackend::do_sum_of_squares(const bf16* x, index_t rows, index_t cols, index_t ld) {
  return sum_of_squares_impl(*impl_, x, rows, cols, ld);
}
void CudaBackend::do_scale_in_place(bf16* x, index_t n, double factor) {
  scale_in_place_impl(*impl_, x, n, factor);
}

// The arithmetic of the float updates on the fp32 master, then param = bf16(master).
void CudaBackend::do_adamw_update(bf16* param, const bf16* grad, float* exp_avg, float* exp_avg_sq,
                                  float* master, index_t n, const optim::AdamWCoefficients& c) {
  check_pointers(*impl_, "adamw_update",
                 {{param, "param"},
                  {grad, "grad"},
                  {exp_avg, "exp_avg"},
                  {exp_avg_sq, "exp_avg_sq"},
                  {master, "master"}});
  cuda_detail::adamw_update_bf16(
      SUMMA_L, cuda_detail::dptr(param), cuda_detail::dptr(grad), exp_avg, exp_avg_sq, master, n,
      static_cast<float>(1.0 - c.lr * c.weight_decay), static_cast<float>(c.beta1),
      static_cast<float>(1.0 - c.beta1), static_cast<float>(c.beta2),
      static_cast<float>(1.0 - c.beta2), static_cast<float>(c.eps), static_cast<float>(c.step_size),
      static_cast<float>(c.bias_correction2_sqrt));
}
void CudaBackend::do_sgd_update(bf16* param, const bf16* grad, float* momentum_buffer,
                                float* master, index_t n, const optim::SgdCoefficients& c) {
  check_pointers(
      *impl_, "sgd_update",
      {{param, "param"}, {grad, "grad"}, {momentum_buffer, "momentum_buffer"}, {master, "master"}});
  cuda_detail::sgd_update_bf16(SUMMA_L, cuda_detail::dptr(param), cuda_detail::dptr(grad),
                               momentum_buffer, master, n, static_cast<float>(c.lr),
                               static_cast<float>(c.weight_decay), static_cast<float>(c.momentum),
                               c.nesterov);
}

#undef SUMMA_L

}  // namespace summa

#pragma once
// Internal to the CUDA backend: device views and the host-side launchers of
// the kernels in kernels.cu. Every launcher enqueues on `launch.stream`,
// never waits (except where named), validates nothing (CudaBackend does) and
// throws summa::Error when the launch itself fails.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "summa/core/bf16.hpp"
#include "summa/core/matrix_view.hpp"

namespace summa::cuda_detail {

/// What every launch needs: the stream, and the SM count to size grids.
struct Launch {
  cudaStream_t stream = nullptr;
  int sm_count = 1;
};

/// A MatrixView in a form kernels take by value.
template <class T>
struct DView {
  T* data;
  index_t rows, cols, ld;
  bool row_major;
  __host__ __device__ T& operator()(index_t r, index_t c) const {
    return row_major ? data[r * ld + c] : data[r + c * ld];
  }
};

template <class T>
DView<T> dview(MatrixView<T> v) {
  return DView<T>{v.data, v.rows, v.cols, v.ld, v.order == Order::row_major};
}

// summa::bf16 (host type) and __nv_bfloat16 share their bit layout: device
// code sees the same memory as __nv_bfloat16.
static_assert(sizeof(__nv_bfloat16) == sizeof(bf16) && alignof(__nv_bfloat16) == alignof(bf16));

/// The device element type of a host element type (bf16 -> __nv_bfloat16).
template <class T>
struct DeviceType {
  using type = T;
};
template <>
struct DeviceType<bf16> {
  using type = __nv_bfloat16;
};
template <>
struct DeviceType<const bf16> {
  using type = const __nv_bfloat16;
};
template <class T>
using device_t = typename DeviceType<T>::type;

/// Pointer to the same memory as device_t<T>.
template <class T>
device_t<T>* dptr(T* p) {
  return reinterpret_cast<device_t<T>*>(p);
}

inline DView<__nv_bfloat16> dview(MatrixView<bf16> v) {
  return DView<__nv_bfloat16>{dptr(v.data), v.rows, v.cols, v.ld, v.order == Order::row_major};
}
inline DView<const __nv_bfloat16> dview(MatrixView<const bf16> v) {
  return DView<const __nv_bfloat16>{dptr(v.data), v.rows, v.cols, v.ld,
                                    v.order == Order::row_major};
}

/// Arithmetic type of a device element type: float for __nv_bfloat16 (every
/// bf16 kernel computes in fp32 and rounds once per stored element), the
/// type itself otherwise. Scalars (alpha, beta) and per-row statistics
/// (mean, rstd, row max / sum, LayerNorm partials) are passed in it.
template <class T>
struct AccOf {
  using type = std::remove_const_t<T>;
};
template <>
struct AccOf<__nv_bfloat16> {
  using type = float;
};
template <>
struct AccOf<const __nv_bfloat16> {
  using type = float;
};
template <class T>
using acc_of = typename AccOf<T>::type;

/// Partial sums of the two-pass device reductions (cross_entropy_sum,
/// sum_of_squares): at most this many blocks, one double each, plus the
/// final value after them.
constexpr int kMaxPartials = 1024;

/// Throws summa::Error "CudaBackend: <call> failed: <cudaGetErrorString>
/// (<name>)" unless e is cudaSuccess.
void check_cuda(cudaError_t e, const char* call);

// ---- Kernels (T = float, double or __nv_bfloat16; explicit instantiations
// in kernels.cu). Orders of the views may differ; beta == 0 never reads the
// output. Scalars and per-row statistics are acc_of<T> (float for bf16);
// per-column parameters (bias, gamma, beta, dgamma, dbeta) are T.
// layernorm_mean / layernorm_rstd / cross_entropy_sum work on statistics
// only: float and double.

/// C = alpha X + beta C; a tiled transpose when the orders differ.
template <class T>
void axpby(const Launch& launch, acc_of<T> alpha, DView<const T> X, acc_of<T> beta, DView<T> C);
/// C = beta C (beta not 0).
template <class T>
void scale(const Launch& launch, acc_of<T> beta, DView<T> C);
template <class T>
void add_bias(const Launch& launch, DView<T> Y, const T* bias);
template <class T>
void column_sums(const Launch& launch, DView<const T> X, acc_of<T> beta, T* out);

template <class T>
void layernorm_partial_sums(const Launch& launch, DView<const T> X, const acc_of<T>* center,
                            acc_of<T>* out);
template <class T>
void layernorm_mean(const Launch& launch, index_t n, index_t h, const T* sums, T* mean);
template <class T>
void layernorm_rstd(const Launch& launch, index_t n, index_t h, double eps, const T* squares,
                    T* rstd);
template <class T>
void layernorm_apply(const Launch& launch, DView<const T> X, const acc_of<T>* mean,
                     const acc_of<T>* rstd, const T* gamma, const T* beta, DView<T> Y);
template <class T>
void layernorm_backward_partials(const Launch& launch, DView<const T> X, DView<const T> dY,
                                 const acc_of<T>* mean, const acc_of<T>* rstd, const T* gamma,
                                 acc_of<T>* a, acc_of<T>* b);
template <class T>
void layernorm_backward_apply(const Launch& launch, DView<const T> X, DView<const T> dY,
                              const acc_of<T>* mean, const acc_of<T>* rstd, const T* gamma,
                              const acc_of<T>* a, const acc_of<T>* b, index_t h, DView<T> dX);
template <class T>
void layernorm_param_partials(const Launch& launch, DView<const T> X, DView<const T> dY,
                              const acc_of<T>* mean, const acc_of<T>* rstd, T* dgamma, T* dbeta);

template <class T>
void gelu_forward(const Launch& launch, DView<const T> X, DView<T> Y);
template <class T>
void gelu_backward(const Launch& launch, DView<const T> X, DView<const T> dY, DView<T> dX);

template <class T>
void softmax_causal(const Launch& launch, DView<const T> S, double scale, DView<T> P);
template <class T>
void softmax_causal_backward(const Launch& launch, DView<const T> P, DView<const T> dP,
                             double scale, DView<T> dS);

template <class T>
void row_max(const Launch& launch, DView<const T> Z, acc_of<T>* out);
template <class T>
void row_sum_exp(const Launch& launch, DView<const T> Z, const acc_of<T>* max, acc_of<T>* out);
template <class T>
void pick_targets(const Launch& launch, DView<const T> Z, const std::int32_t* targets, index_t col0,
                  acc_of<T>* out);
/// Sums into partials[0..kMaxPartials) and writes the total to
/// partials[kMaxPartials] (device memory; the caller copies it back).
template <class T>
void cross_entropy_sum(const Launch& launch, index_t n, const T* max, const T* sum, const T* picked,
                       double* partials);
template <class T>
void cross_entropy_grad(const Launch& launch, DView<T> Z, const acc_of<T>* max,
                        const acc_of<T>* sum, const std::int32_t* targets, index_t col0,
                        double scale);

template <class T>
void gather_rows(const Launch& launch, const std::int32_t* ids, index_t row0, DView<const T> table,
                 bool accumulate, DView<T> out);
/// Deterministic, in row order like CpuBackend (no atomics): each addition
/// is done in acc_of<T> and rounded once, so a bf16 row hit k times is
/// rounded k times; float and double give the CPU's bits.
template <class T>
void scatter_add_rows(const Launch& launch, const std::int32_t* ids, index_t row0,
                      DView<const T> src, DView<T> table);

/// Σ x² in double of a row-major rows x cols block with leading dimension ld
/// (contiguous when ld == cols) into partials[kMaxPartials], like
/// cross_entropy_sum.
template <class T>
void sum_of_squares(const Launch& launch, const T* x, index_t rows, index_t cols, index_t ld,
                    double* partials);
template <class T>
void scale_in_place(const Launch& launch, T* x, index_t n, double factor);

/// dst = src element by element, widened or rounded to nearest even
/// (float <-> __nv_bfloat16; any orders, one element per thread: for
/// initialisation and checkpoints, not the training step).
template <class S, class D>
void convert(const Launch& launch, DView<const S> src, DView<D> dst);

/// bf16 optimizer updates with fp32 master weights (Backend::adamw_update /
/// sgd_update for bf16): the master is updated in fp32 with the widened
/// gradient, then param = bf16(master).
void adamw_update_bf16(const Launch& launch, __nv_bfloat16* param, const __nv_bfloat16* grad,
                       float* exp_avg, float* exp_avg_sq, float* master, index_t n, float decay,
                       float beta1, float one_minus_beta1, float beta2, float one_minus_beta2,
                       float eps, float step_size, float bias_correction2_sqrt);
void sgd_update_bf16(const Launch& launch, __nv_bfloat16* param, const __nv_bfloat16* grad,
                     float* momentum_buffer, float* master, index_t n, float lr, float weight_decay,
                     float momentum, bool nesterov);

}  // namespace summa::cuda_detail

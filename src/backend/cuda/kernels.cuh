#pragma once
// Internal to the CUDA backend: device views and the host-side launchers of
// the kernels in kernels.cu. Every launcher enqueues on `launch.stream`,
// never waits (except where named), validates nothing (CudaBackend does) and
// throws summa::Error when the launch itself fails.

#include <cuda_runtime.h>

#include <cstdint>

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

/// Partial sums of the two-pass device reductions (cross_entropy_sum,
/// sum_of_squares): at most this many blocks, one double each, plus the
/// final value after them.
constexpr int kMaxPartials = 1024;

/// Throws summa::Error "CudaBackend: <call> failed: <cudaGetErrorString>
/// (<name>)" unless e is cudaSuccess.
void check_cuda(cudaError_t e, const char* call);

// ---- Kernels (T = float or double; explicit instantiations in kernels.cu).
// Orders of the views may differ; beta == 0 never reads the output.

/// C = alpha X + beta C; a tiled transpose when the orders differ.
template <class T>
void axpby(const Launch& launch, T alpha, DView<const T> X, T beta, DView<T> C);
/// C = beta C (beta not 0).
template <class T>
void scale(const Launch& launch, T beta, DView<T> C);
template <class T>
void add_bias(const Launch& launch, DView<T> Y, const T* bias);
template <class T>
void column_sums(const Launch& launch, DView<const T> X, T beta, T* out);

template <class T>
void layernorm_partial_sums(const Launch& launch, DView<const T> X, const T* center, T* out);
template <class T>
void layernorm_mean(const Launch& launch, index_t n, index_t h, const T* sums, T* mean);
template <class T>
void layernorm_rstd(const Launch& launch, index_t n, index_t h, double eps, const T* squares,
                    T* rstd);
template <class T>
void layernorm_apply(const Launch& launch, DView<const T> X, const T* mean, const T* rstd,
                     const T* gamma, const T* beta, DView<T> Y);
template <class T>
void layernorm_backward_partials(const Launch& launch, DView<const T> X, DView<const T> dY,
                                 const T* mean, const T* rstd, const T* gamma, T* a, T* b);
template <class T>
void layernorm_backward_apply(const Launch& launch, DView<const T> X, DView<const T> dY,
                              const T* mean, const T* rstd, const T* gamma, const T* a, const T* b,
                              index_t h, DView<T> dX);
template <class T>
void layernorm_param_partials(const Launch& launch, DView<const T> X, DView<const T> dY,
                              const T* mean, const T* rstd, T* dgamma, T* dbeta);

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
void row_max(const Launch& launch, DView<const T> Z, T* out);
template <class T>
void row_sum_exp(const Launch& launch, DView<const T> Z, const T* max, T* out);
template <class T>
void pick_targets(const Launch& launch, DView<const T> Z, const std::int32_t* targets, index_t col0,
                  T* out);
/// Sums into partials[0..kMaxPartials) and writes the total to
/// partials[kMaxPartials] (device memory; the caller copies it back).
template <class T>
void cross_entropy_sum(const Launch& launch, index_t n, const T* max, const T* sum, const T* picked,
                       double* partials);
template <class T>
void cross_entropy_grad(const Launch& launch, DView<T> Z, const T* max, const T* sum,
                        const std::int32_t* targets, index_t col0, double scale);

template <class T>
void gather_rows(const Launch& launch, const std::int32_t* ids, index_t row0, DView<const T> table,
                 bool accumulate, DView<T> out);
template <class T>
void scatter_add_rows(const Launch& launch, const std::int32_t* ids, index_t row0,
                      DView<const T> src, DView<T> table);

/// Σ x² in double into partials[kMaxPartials], like cross_entropy_sum.
template <class T>
void sum_of_squares(const Launch& launch, const T* x, index_t n, double* partials);
template <class T>
void scale_in_place(const Launch& launch, T* x, index_t n, double factor);

}  // namespace summa::cuda_detail

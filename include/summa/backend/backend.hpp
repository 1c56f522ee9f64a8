#pragma once
/// \file backend.hpp
/// The local-math seam: everything the distributed algorithms compute on one
/// rank goes through a Backend. The CPU backend uses Eigen; a CUDA backend
/// (cuBLAS + kernels) implements the same interface. Pointers handed to a
/// backend live in the backend's memory space (host for CPU, device for CUDA).

#include <cstddef>
#include <string_view>

#include "summa/core/matrix_view.hpp"

namespace summa {

/// Caller-provided scratch memory a backend may use for one call.
struct Scratch {
  void* data = nullptr;
  std::size_t bytes = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;

  /// Memory in the backend's space, aligned to at least 64 bytes.
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* p, std::size_t bytes) noexcept = 0;

  /// Scratch bytes gemm() needs for an m x n x k product to run without
  /// allocating (0 when the implementation never allocates).
  virtual std::size_t gemm_scratch_bytes(index_t m, index_t n, index_t k, DType t) const = 0;

  /// C = alpha * op(A) * op(B) + beta * C, BLAS semantics: beta == 0 never
  /// reads C (NaN in C is overwritten), alpha == 0 or k == 0 never reads A
  /// or B. With scratch of at least gemm_scratch_bytes() no memory is
  /// allocated; with less (or none) the implementation may allocate.
  virtual void gemm(Op ta, Op tb, float alpha, ConstMatrixView<float> A, ConstMatrixView<float> B,
                    float beta, MatrixView<float> C, Scratch scratch = {}) = 0;
  virtual void gemm(Op ta, Op tb, double alpha, ConstMatrixView<double> A,
                    ConstMatrixView<double> B, double beta, MatrixView<double> C,
                    Scratch scratch = {}) = 0;

  /// dst = src (same shape; orders and leading dimensions may differ).
  virtual void copy(ConstMatrixView<float> src, MatrixView<float> dst) = 0;
  virtual void copy(ConstMatrixView<double> src, MatrixView<double> dst) = 0;

  /// C = alpha * X + beta * C; beta == 0 never reads C.
  virtual void axpby(float alpha, ConstMatrixView<float> X, float beta, MatrixView<float> C) = 0;
  virtual void axpby(double alpha, ConstMatrixView<double> X, double beta,
                     MatrixView<double> C) = 0;

  /// C = beta * C; beta == 0 writes zeros without reading C.
  virtual void scale(float beta, MatrixView<float> C) = 0;
  virtual void scale(double beta, MatrixView<double> C) = 0;

  /// Y[r, c] += bias[c] for every row r (bias holds Y.cols elements).
  virtual void add_bias(MatrixView<float> Y, const float* bias) = 0;
  virtual void add_bias(MatrixView<double> Y, const double* bias) = 0;

  /// out[c] = beta * out[c] + sum over rows r of X[r, c] (beta == 0 never reads out).
  virtual void column_sums(ConstMatrixView<float> X, float beta, float* out) = 0;
  virtual void column_sums(ConstMatrixView<double> X, double beta, double* out) = 0;

  // ---- LayerNorm kernels (LayerNorm2D) --------------------------------------
  // X, dY, Y and dX are local blocks of `n` rows; per-row arrays (center,
  // mean, rstd, a, b) hold X.rows elements, per-column arrays (gamma, beta,
  // dgamma, dbeta) X.cols. Sums accumulate in T (at least fp32). Outputs are
  // written without being read (NaN in them is overwritten).

  /// out[r] = sum_c X[r, c] when `center` is null, otherwise the sum of
  /// squared deviations sum_c (X[r, c] - center[r])^2 (the second pass of a
  /// two-pass variance).
  virtual void layernorm_partial_sums(ConstMatrixView<float> X, const float* center,
                                      float* out) = 0;
  virtual void layernorm_partial_sums(ConstMatrixView<double> X, const double* center,
                                      double* out) = 0;

  /// Finishes the statistics of n rows over a hidden size h from all-reduced
  /// sums: mean[r] = sums[r] / h; rstd[r] = 1 / sqrt(squares[r] / h + eps).
  /// In place (sums == mean, squares == rstd) is allowed.
  virtual void layernorm_mean(index_t n, index_t h, const float* sums, float* mean) = 0;
  virtual void layernorm_mean(index_t n, index_t h, const double* sums, double* mean) = 0;
  virtual void layernorm_rstd(index_t n, index_t h, double eps, const float* squares,
                              float* rstd) = 0;
  virtual void layernorm_rstd(index_t n, index_t h, double eps, const double* squares,
                              double* rstd) = 0;

  /// Y[r, c] = (X[r, c] - mean[r]) * rstd[r] * gamma[c] + beta[c].
  virtual void layernorm_apply(ConstMatrixView<float> X, const float* mean, const float* rstd,
                               const float* gamma, const float* beta, MatrixView<float> Y) = 0;
  virtual void layernorm_apply(ConstMatrixView<double> X, const double* mean, const double* rstd,
                               const double* gamma, const double* beta, MatrixView<double> Y) = 0;

  /// With xhat = (X - mean[r]) * rstd[r] and g = dY[r, c] * gamma[c], the
  /// per-row partial sums over the local columns: a[r] = sum_c g,
  /// b[r] = sum_c g * xhat.
  virtual void layernorm_backward_partials(ConstMatrixView<float> X, ConstMatrixView<float> dY,
                                           const float* mean, const float* rstd, const float* gamma,
                                           float* a, float* b) = 0;
  virtual void layernorm_backward_partials(ConstMatrixView<double> X, ConstMatrixView<double> dY,
                                           const double* mean, const double* rstd,
                                           const double* gamma, double* a, double* b) = 0;

  /// dX = rstd[r] * (g - a[r] / h - xhat * b[r] / h), with a and b the
  /// all-reduced partials above and h the global hidden size.
  virtual void layernorm_backward_apply(ConstMatrixView<float> X, ConstMatrixView<float> dY,
                                        const float* mean, const float* rstd, const float* gamma,
                                        const float* a, const float* b, index_t h,
                                        MatrixView<float> dX) = 0;
  virtual void layernorm_backward_apply(ConstMatrixView<double> X, ConstMatrixView<double> dY,
                                        const double* mean, const double* rstd, const double* gamma,
                                        const double* a, const double* b, index_t h,
                                        MatrixView<double> dX) = 0;

  /// Local column sums of the parameter gradients: dgamma[c] = sum_r dY * xhat,
  /// dbeta[c] = sum_r dY (overwritten, never read).
  virtual void layernorm_param_partials(ConstMatrixView<float> X, ConstMatrixView<float> dY,
                                        const float* mean, const float* rstd, float* dgamma,
                                        float* dbeta) = 0;
  virtual void layernorm_param_partials(ConstMatrixView<double> X, ConstMatrixView<double> dY,
                                        const double* mean, const double* rstd, double* dgamma,
                                        double* dbeta) = 0;

  /// Waits until every operation issued so far has finished (no-op on CPU).
  virtual void synchronize() {}
};

/// Throws summa::Error unless op(A) * op(B) fits C; names the operands.
void check_gemm_shapes(Op ta, Op tb, index_t a_rows, index_t a_cols, index_t b_rows, index_t b_cols,
                       index_t c_rows, index_t c_cols);

}  // namespace summa

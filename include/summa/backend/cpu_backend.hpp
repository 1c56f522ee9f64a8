#pragma once
/// \file cpu_backend.hpp
/// Backend on the host. GEMMs run on a CBLAS library (OpenBLAS, BLIS or MKL,
/// loaded at run time: CpuOptions::gemm) or on Eigen's GEMM, whose packing
/// buffers come from the caller's scratch; a BLAS packs into its own buffers,
/// allocated on its first call and reused after, so a warmed-up step
/// allocates nothing either way. The elementwise kernels are Eigen maps, one
/// thread. bf16 ops widen to fp32 per element (GEMM: the operands are
/// converted to fp32 panels in the caller's scratch and multiplied by the
/// float GEMM). docs/design.md, "CPU GEMM".

#include <cstdint>
#include <string>
#include <vector>

#include "summa/backend/backend.hpp"

namespace summa {

namespace cpu_detail {
struct BlasLibrary;
}

struct CpuOptions {
  /// The GEMM library: "eigen", "openblas", "blis", "mkl", or "" for the
  /// default: $SUMMA_CPU_GEMM when set, else the one chosen at configure
  /// time (SUMMA_CPU_GEMM_DEFAULT, summa/build_info.hpp). A library that
  /// cannot be loaded is an error naming the files tried.
  std::string gemm{};
  /// Threads of this rank's GEMMs (the BLAS's thread count; process-wide,
  /// so the last backend constructed sets it). Eigen's GEMM runs one thread
  /// in this build: more is an error. The elementwise kernels run one.
  int threads = 1;
  /// For tests on machines without a GPU: the backend runs on the host as
  /// usual but reports host_accessible() == false, so callers take the
  /// staging paths a device backend needs (upload and download through the
  /// seam instead of touching memory directly); it stays synchronous, so
  /// plain MPI communicators remain valid.
  bool emulate_device = false;
};

class CpuBackend final : public Backend {
 public:
  CpuBackend() : CpuBackend(CpuOptions{}) {}
  explicit CpuBackend(bool emulate_device)
      : CpuBackend(CpuOptions{.emulate_device = emulate_device}) {}
  /// Throws summa::Error for an unknown or unloadable library, or threads < 1
  /// (or > 1 on Eigen).
  explicit CpuBackend(const CpuOptions& options);
  /// "cpu-eigen", "cpu-openblas", "cpu-blis" or "cpu-mkl".
  std::string_view name() const override { return name_; }
  /// "eigen", "openblas", "blis" or "mkl".
  const std::string& gemm_library() const { return gemm_; }
  /// The library's file, version and the kernels it chose for this CPU
  /// ("Eigen <version>" for Eigen).
  const std::string& gemm_detail() const { return detail_; }
  int threads() const { return threads_; }
  /// The default of CpuOptions::gemm: $SUMMA_CPU_GEMM, else SUMMA_CPU_GEMM_DEFAULT.
  static std::string default_gemm();
  /// "eigen" and every BLAS that loads on this machine (loading them).
  static std::vector<std::string> gemm_libraries();
  void* allocate(std::size_t bytes) override;
  void deallocate(void* p, std::size_t bytes) noexcept override;
  std::size_t gemm_scratch_bytes(index_t m, index_t n, index_t k, DType t) const override;
  bool host_accessible() const override { return !emulate_device_; }
  /// The node's MemAvailable (/proc/meminfo), emulated device or not.
  double memory_free_bytes() const override { return host_available_bytes(); }
  /// The node's MemAvailable in bytes (/proc/meminfo); negative where it
  /// cannot be read.
  static double host_available_bytes();
  bool asynchronous() const override { return false; }

 private:
  // The hooks of Backend's ops (backend.hpp documents each op; arguments
  // arrive checked). gemm_strided_batched runs do_gemm for b = 0, 1, ... with
  // the same scratch; upload / download are std::memcpy; the optimizer ops are
  // summa::optim's (optimizer_math.hpp). bf16 overloads (cpu_backend_bf16.cpp):
  // fp32 math, bf16 storage.
  void do_gemm(Op ta, Op tb, float alpha, ConstMatrixView<float> A, ConstMatrixView<float> B,
               float beta, MatrixView<float> C, Scratch scratch) override;
  void do_gemm(Op ta, Op tb, double alpha, ConstMatrixView<double> A, ConstMatrixView<double> B,
               double beta, MatrixView<double> C, Scratch scratch) override;
  void do_gemm(Op ta, Op tb, float alpha, ConstMatrixView<bf16> A, ConstMatrixView<bf16> B,
               float beta, MatrixView<bf16> C, Scratch scratch) override;
  void do_gemm_strided_batched(Op ta, Op tb, float alpha, ConstMatrixView<float> A,
                               index_t stride_a, ConstMatrixView<float> B, index_t stride_b,
                               float beta, MatrixView<float> C, index_t stride_c, index_t batch,
                               Scratch scratch) override;
  void do_gemm_strided_batched(Op ta, Op tb, double alpha, ConstMatrixView<double> A,
                               index_t stride_a, ConstMatrixView<double> B, index_t stride_b,
                               double beta, MatrixView<double> C, index_t stride_c, index_t batch,
                               Scratch scratch) override;
  void do_gemm_strided_batched(Op ta, Op tb, float alpha, ConstMatrixView<bf16> A, index_t stride_a,
                               ConstMatrixView<bf16> B, index_t stride_b, float beta,
                               MatrixView<bf16> C, index_t stride_c, index_t batch,
                               Scratch scratch) override;
  void do_copy(ConstMatrixView<float> src, MatrixView<float> dst) override;
  void do_copy(ConstMatrixView<double> src, MatrixView<double> dst) override;
  void do_copy(ConstMatrixView<bf16> src, MatrixView<bf16> dst) override;
  void do_convert(ConstMatrixView<float> src, MatrixView<bf16> dst) override;
  void do_convert(ConstMatrixView<bf16> src, MatrixView<float> dst) override;
  void do_axpby(float alpha, ConstMatrixView<float> X, float beta, MatrixView<float> C) override;
  void do_axpby(double alpha, ConstMatrixView<double> X, double beta,
                MatrixView<double> C) override;
  void do_axpby(float alpha, ConstMatrixView<bf16> X, float beta, MatrixView<bf16> C) override;
  void do_scale(float beta, MatrixView<float> C) override;
  void do_scale(double beta, MatrixView<double> C) override;
  void do_scale(float beta, MatrixView<bf16> C) override;
  void do_add_bias(MatrixView<float> Y, const float* bias) override;
  void do_add_bias(MatrixView<double> Y, const double* bias) override;
  void do_add_bias(MatrixView<bf16> Y, const bf16* bias) override;
  void do_column_sums(ConstMatrixView<float> X, float beta, float* out) override;
  void do_column_sums(ConstMatrixView<double> X, double beta, double* out) override;
  void do_column_sums(ConstMatrixView<bf16> X, float beta, bf16* out) override;
  void do_layernorm_partial_sums(ConstMatrixView<float> X, const float* center,
                                 float* out) override;
  void do_layernorm_partial_sums(ConstMatrixView<double> X, const double* center,
                                 double* out) override;
  void do_layernorm_partial_sums(ConstMatrixView<bf16> X, const float* center, float* out) override;
  void do_layernorm_mean(index_t n, index_t h, const float* sums, float* mean) override;
  void do_layernorm_mean(index_t n, index_t h, const double* sums, double* mean) override;
  void do_layernorm_rstd(index_t n, index_t h, double eps, const float* squares,
                         float* rstd) override;
  void do_layernorm_rstd(index_t n, index_t h, double eps, const double* squares,
                         double* rstd) override;
  void do_layernorm_apply(ConstMatrixView<float> X, const float* mean, const float* rstd,
                          const float* gamma, const float* beta, MatrixView<float> Y) override;
  void do_layernorm_apply(ConstMatrixView<double> X, const double* mean, const double* rstd,
                          const double* gamma, const double* beta, MatrixView<double> Y) override;
  void do_layernorm_apply(ConstMatrixView<bf16> X, const float* mean, const float* rstd,
                          const bf16* gamma, const bf16* beta, MatrixView<bf16> Y) override;
  void do_layernorm_backward_partials(ConstMatrixView<float> X, ConstMatrixView<float> dY,
                                      const float* mean, const float* rstd, const float* gamma,
                                      float* a, float* b) override;
  void do_layernorm_backward_partials(ConstMatrixView<double> X, ConstMatrixView<double> dY,
                                      const double* mean, const double* rstd, const double* gamma,
                                      double* a, double* b) override;
  void do_layernorm_backward_partials(ConstMatrixView<bf16> X, ConstMatrixView<bf16> dY,
                                      const float* mean, const float* rstd, const bf16* gamma,
                                      float* a, float* b) override;
  void do_layernorm_backward_apply(ConstMatrixView<float> X, ConstMatrixView<float> dY,
                                   const float* mean, const float* rstd, const float* gamma,
                                   const float* a, const float* b, index_t h,
                                   MatrixView<float> dX) override;
  void do_layernorm_backward_apply(ConstMatrixView<double> X, ConstMatrixView<double> dY,
                                   const double* mean, const double* rstd, const double* gamma,
                                   const double* a, const double* b, index_t h,
                                   MatrixView<double> dX) override;
  void do_layernorm_backward_apply(ConstMatrixView<bf16> X, ConstMatrixView<bf16> dY,
                                   const float* mean, const float* rstd, const bf16* gamma,
                                   const float* a, const float* b, index_t h,
                                   MatrixView<bf16> dX) override;
  void do_layernorm_param_partials(ConstMatrixView<float> X, ConstMatrixView<float> dY,
                                   const float* mean, const float* rstd, float* dgamma,
                                   float* dbeta) override;
  void do_layernorm_param_partials(ConstMatrixView<double> X, ConstMatrixView<double> dY,
                                   const double* mean, const double* rstd, double* dgamma,
                                   double* dbeta) override;
  void do_layernorm_param_partials(ConstMatrixView<bf16> X, ConstMatrixView<bf16> dY,
                                   const float* mean, const float* rstd, bf16* dgamma,
                                   bf16* dbeta) override;
  void do_gelu_forward(ConstMatrixView<float> X, MatrixView<float> Y) override;
  void do_gelu_forward(ConstMatrixView<double> X, MatrixView<double> Y) override;
  void do_gelu_forward(ConstMatrixView<bf16> X, MatrixView<bf16> Y) override;
  void do_gelu_backward(ConstMatrixView<float> X, ConstMatrixView<float> dY,
                        MatrixView<float> dX) override;
  void do_gelu_backward(ConstMatrixView<double> X, ConstMatrixView<double> dY,
                        MatrixView<double> dX) override;
  void do_gelu_backward(ConstMatrixView<bf16> X, ConstMatrixView<bf16> dY,
                        MatrixView<bf16> dX) override;
  void do_softmax_causal(ConstMatrixView<float> S, double scale, MatrixView<float> P) override;
  void do_softmax_causal(ConstMatrixView<double> S, double scale, MatrixView<double> P) override;
  void do_softmax_causal(ConstMatrixView<bf16> S, double scale, MatrixView<bf16> P) override;
  void do_softmax_causal_backward(ConstMatrixView<float> P, ConstMatrixView<float> dP, double scale,
                                  MatrixView<float> dS) override;
  void do_softmax_causal_backward(ConstMatrixView<double> P, ConstMatrixView<double> dP,
                                  double scale, MatrixView<double> dS) override;
  void do_softmax_causal_backward(ConstMatrixView<bf16> P, ConstMatrixView<bf16> dP, double scale,
                                  MatrixView<bf16> dS) override;
  void do_row_max(ConstMatrixView<float> Z, float* out) override;
  void do_row_max(ConstMatrixView<double> Z, double* out) override;
  void do_row_max(ConstMatrixView<bf16> Z, float* out) override;
  void do_row_sum_exp(ConstMatrixView<float> Z, const float* max, float* out) override;
  void do_row_sum_exp(ConstMatrixView<double> Z, const double* max, double* out) override;
  void do_row_sum_exp(ConstMatrixView<bf16> Z, const float* max, float* out) override;
  void do_pick_targets(ConstMatrixView<float> Z, const std::int32_t* targets, index_t col0,
                       float* out) override;
  void do_pick_targets(ConstMatrixView<double> Z, const std::int32_t* targets, index_t col0,
                       double* out) override;
  void do_pick_targets(ConstMatrixView<bf16> Z, const std::int32_t* targets, index_t col0,
                       float* out) override;
  double do_cross_entropy_sum(index_t n, const float* max, const float* sum,
                              const float* picked) override;
  double do_cross_entropy_sum(index_t n, const double* max, const double* sum,
                              const double* picked) override;
  void do_cross_entropy_grad(MatrixView<float> Z, const float* max, const float* sum,
                             const std::int32_t* targets, index_t col0, double scale) override;
  void do_cross_entropy_grad(MatrixView<double> Z, const double* max, const double* sum,
                             const std::int32_t* targets, index_t col0, double scale) override;
  void do_cross_entropy_grad(MatrixView<bf16> Z, const float* max, const float* sum,
                             const std::int32_t* targets, index_t col0, double scale) override;
  void do_gather_rows(const std::int32_t* ids, index_t row0, ConstMatrixView<float> table,
                      bool accumulate, MatrixView<float> out) override;
  void do_gather_rows(const std::int32_t* ids, index_t row0, ConstMatrixView<double> table,
                      bool accumulate, MatrixView<double> out) override;
  void do_gather_rows(const std::int32_t* ids, index_t row0, ConstMatrixView<bf16> table,
                      bool accumulate, MatrixView<bf16> out) override;
  void do_scatter_add_rows(const std::int32_t* ids, index_t row0, ConstMatrixView<float> src,
                           MatrixView<float> table) override;
  void do_scatter_add_rows(const std::int32_t* ids, index_t row0, ConstMatrixView<double> src,
                           MatrixView<double> table) override;
  void do_scatter_add_rows(const std::int32_t* ids, index_t row0, ConstMatrixView<bf16> src,
                           MatrixView<bf16> table) override;
  void do_upload(void* dst, const void* host_src, std::size_t bytes) override;
  void do_download(void* host_dst, const void* src, std::size_t bytes) override;
  void do_adamw_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                       index_t n, const optim::AdamWCoefficients& c) override;
  void do_adamw_update(double* param, const double* grad, double* exp_avg, double* exp_avg_sq,
                       index_t n, const optim::AdamWCoefficients& c) override;
  void do_adamw_update(bf16* param, const bf16* grad, float* exp_avg, float* exp_avg_sq,
                       float* master, index_t n, const optim::AdamWCoefficients& c) override;
  void do_sgd_update(float* param, const float* grad, float* momentum_buffer, index_t n,
                     const optim::SgdCoefficients& c) override;
  void do_sgd_update(double* param, const double* grad, double* momentum_buffer, index_t n,
                     const optim::SgdCoefficients& c) override;
  void do_sgd_update(bf16* param, const bf16* grad, float* momentum_buffer, float* master,
                     index_t n, const optim::SgdCoefficients& c) override;
  double do_sum_of_squares(const float* x, index_t n) override;
  double do_sum_of_squares(const double* x, index_t n) override;
  double do_sum_of_squares(const bf16* x, index_t n) override;
  double do_sum_of_squares(const float* x, index_t rows, index_t cols, index_t ld) override;
  double do_sum_of_squares(const double* x, index_t rows, index_t cols, index_t ld) override;
  double do_sum_of_squares(const bf16* x, index_t rows, index_t cols, index_t ld) override;
  void do_scale_in_place(float* x, index_t n, double factor) override;
  void do_scale_in_place(double* x, index_t n, double factor) override;
  void do_scale_in_place(bf16* x, index_t n, double factor) override;

  bool emulate_device_ = false;
  std::string gemm_ = "eigen", name_ = "cpu-eigen", detail_;
  int threads_ = 1;
  const cpu_detail::BlasLibrary* blas_ = nullptr;  // null: Eigen
};

}  // namespace summa

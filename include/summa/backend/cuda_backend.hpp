#pragma once
/// \file cuda_backend.hpp
/// Backend on one NVIDIA GPU: cuBLAS for GEMM, hand-written CUDA kernels for
/// every other op, all issued on one compute stream.
///
/// This header needs no CUDA headers (the CUDA objects live behind a pimpl
/// and streams travel as `void*`), so host-only code and the installed
/// package can include it. The class is *defined* in summa's CUDA component
/// (libsumma_cuda, CMake target summa::cuda; built where summa/build_info.hpp
/// has SUMMA_HAVE_CUDA == 1); a program that uses it links summa::cuda.
///
/// Pointer contract: every pointer handed to a CudaBackend op — view data,
/// per-row / per-column arrays (bias, mean, rstd, gamma, ...), token ids and
/// targets — is a device pointer of the backend's device (cudaMalloc'd, e.g.
/// from allocate() or an Arena on this backend). Host memory moves in and out
/// through upload() / download(). Ops are asynchronous on stream(); only
/// cross_entropy_sum(), sum_of_squares(), upload(), download(),
/// synchronize() and the first gemm() of each shape while tuning wait for
/// the stream; none synchronises the whole device.
///
/// Numerics (see docs/gpu.md): GEMM accumulates in fp32 for float (TF32
/// tensor cores only with CudaOptions::allow_tf32) and bf16, fp64 for double.
/// LayerNorm sums accumulate in T; row_sum_exp and cross_entropy_sum in
/// double, like CpuBackend. Reductions run in a fixed order (results do not
/// depend on timing) except scatter_add_rows, whose atomics may add repeated
/// ids in any order.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "summa/backend/backend.hpp"

namespace summa {

namespace optim {
struct AdamWCoefficients;
struct SgdCoefficients;
}  // namespace optim
namespace cuda_detail {
struct CudaState;  // the CUDA objects behind a CudaBackend (src/backend/cuda/backend.cu)
}  // namespace cuda_detail

/// How a tuned GEMM is carried out. cuBLAS computes column-major products, so
/// the storage orders of A, B and C fix its mode (NN, NT, TN or TT); a
/// variant copies A and/or B into the opposite storage order first (a tiled
/// transpose kernel into the backend's tuning workspace), which changes
/// the mode cuBLAS runs while computing the same C (seed paper §V-C: some
/// modes are much slower than others for some shapes).
enum class GemmVariant : std::uint8_t {
  native,          ///< operands as they are
  transpose_a,     ///< A copied to the opposite storage order first
  transpose_b,     ///< B copied to the opposite storage order first
  transpose_both,  ///< both copied
};

/// "native", "transpose_a", "transpose_b" or "transpose_both".
const char* to_string(GemmVariant v);

/// Construction options of a CudaBackend.
struct CudaOptions {
  /// Device ordinal to use; the constructor makes it current on the calling
  /// thread (cudaSetDevice). -1 keeps the device current at construction.
  int device = -1;
  /// A cudaStream_t to issue every op on (not owned, not destroyed); null:
  /// the backend creates its own non-blocking stream.
  void* stream = nullptr;
  /// Allow TF32 tensor cores in float GEMMs (about 10 mantissa bits per
  /// product instead of 23; fp32 accumulation either way).
  bool allow_tf32 = false;
  /// Time the GEMM variants the first time each distinct GEMM is seen and
  /// keep the fastest (gemm_tuning_report() lists the choices). Off: always
  /// GemmVariant::native.
  bool tune_gemm = true;
  /// Timed runs per variant while tuning (after one untimed warm-up run).
  int tune_repeats = 3;
  /// Most distinct GEMMs remembered; later ones run native, untuned. The
  /// table is allocated at construction, so a lookup never allocates.
  std::size_t max_tuned_gemms = 1024;
  /// Device workspace for the transposed operand copies of the non-native
  /// variants and for timing runs when beta != 0 (allocated at
  /// construction). A variant whose copies do not fit is never chosen.
  std::size_t tune_workspace_bytes = std::size_t{64} << 20;
  /// cuBLAS workspace, set once with cublasSetWorkspace (allocated at
  /// construction; NVIDIA recommends 32 MiB on Hopper).
  std::size_t cublas_workspace_bytes = std::size_t{32} << 20;
  /// Testing and benchmarking: run every GEMM with this variant (throws
  /// summa::Error when its copies do not fit the tuning workspace).
  std::optional<GemmVariant> force_variant = std::nullopt;
  /// Debugging the pointer contract: every op checks with
  /// cudaPointerGetAttributes that its pointers are device (or managed)
  /// memory and throws summa::Error naming the argument otherwise. Costs a
  /// driver call per pointer; off by default.
  bool check_pointers = false;
};

/// One tuned GEMM shape and its choice.
struct GemmTuning {
  index_t m = 0, n = 0, k = 0;  ///< C is m x n, inner dimension k
  Op ta = Op::N, tb = Op::N;
  DType dtype = DType::f32;
  Order a_order = Order::col_major, b_order = Order::col_major, c_order = Order::col_major;
  GemmVariant chosen = GemmVariant::native;
  /// Milliseconds per call of each variant (index = GemmVariant), negative
  /// when the variant was not timed: its copies did not fit the tuning
  /// workspace, or it is the TT mode, which is never a target (all negative
  /// when nothing but native fitted: then native is chosen untimed).
  double milliseconds[4] = {-1, -1, -1, -1};
};

/// The ops (Backend's entry points, which check the arguments) on this
/// backend:
///  - gemm: cuBLAS (cublasGemmEx), row-major and column-major views with any
///    leading dimensions; dimensions and leading dimensions must fit in int32.
///    With tuning on, the first call of a distinct shape times the variants
///    (and waits for the stream); later calls of that shape never wait.
///  - gemm_strided_batched: one cublasGemmStridedBatchedEx call with gemm's
///    row/column-major mapping (fp32 accumulation; TF32 only with
///    allow_tf32). Not tuned: always the native operand layout
///    (GemmVariant::native), whatever tune_gemm / force_variant say. batch,
///    dimensions and leading dimensions must fit in int32 (checked).
///  - cross_entropy_sum and sum_of_squares reduce on the device and wait for
///    the stream to copy the one value back; upload / download copy on
///    stream() and return when done; every other op is asynchronous.
///  - scatter_add_rows: atomicAdd per element, so repeated ids accumulate in an
///    unspecified order.
///  - adamw_update / sgd_update: summa::cuda::adamw_update / sgd_update on
///    stream().
///  - bf16 (Backend, "Mixed precision"): kernels on __nv_bfloat16 with fp32
///    arithmetic and one rounding per stored element; GEMM is cublasGemmEx
///    with CUDA_R_16BF operands and CUBLAS_COMPUTE_32F (tuned like float,
///    keyed by DType::bf16); scatter_add_rows adds with bf16 atomics (one
///    rounding per hit, in any order).
class CudaBackend final : public Backend {
 public:
  /// Selects the device, creates (or adopts) the compute stream and the
  /// cuBLAS handle, allocates the workspaces. Throws summa::Error
  /// ("CudaBackend: no CUDA device (cudaGetDeviceCount: ...)") when no device
  /// is present, or naming the failing CUDA/cuBLAS call.
  explicit CudaBackend(CudaOptions options = {});
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  /// Number of CUDA devices visible; 0 when there is none or the runtime
  /// reports any error (no driver, ...). Never throws.
  static int device_count() noexcept;

  std::string_view name() const override { return "cuda-cublas"; }
  /// The device ordinal in use.
  int device() const;
  /// The compute stream (a cudaStream_t) every op is issued on, e.g. for a
  /// NCCL communicator to order its collectives with the math.
  void* stream() const;
  const CudaOptions& options() const;

  /// Device memory from cudaMalloc (256-byte aligned; never managed memory).
  /// Throws summa::Error naming the size when the device is out of memory.
  void* allocate(std::size_t bytes) override;
  /// cudaFree (which waits for the device); errors are ignored.
  void deallocate(void* p, std::size_t bytes) noexcept override;
  /// Always 0: cuBLAS uses the workspace set at construction.
  std::size_t gemm_scratch_bytes(index_t m, index_t n, index_t k, DType t) const override;

  /// Sets `bytes` bytes of device memory to `value` (asynchronous).
  void fill_bytes(void* device_dst, int value, std::size_t bytes);

  /// Turns GEMM tuning on or off (on keeps what was already tuned).
  void set_gemm_tuning(bool on);
  /// Every tuned GEMM so far, in the order first seen.
  std::vector<GemmTuning> gemm_tunings() const;
  /// A readable table of gemm_tunings(): shape, per-variant time, choice.
  std::string gemm_tuning_report() const;

  /// Device memory: false.
  bool host_accessible() const override { return false; }
  /// cudaMemGetInfo's free bytes of this backend's device; its UUID as the
  /// domain (ranks of a node on one device share it, whatever ordinal each
  /// sees: CUDA_VISIBLE_DEVICES, one GPU per task, MIG instances).
  double memory_free_bytes() const override;
  std::string memory_domain() const override;
  /// Ops are queued on stream(): true.
  bool asynchronous() const override { return true; }

  /// cudaStreamSynchronize(stream()).
  void synchronize() override;

  /// The host pool: cudaHostAlloc(portable | mapped), pinned so the staged
  /// copies run at the bus's rate and mapped so kernels and copies may
  /// reach it directly (unified addressing).
  void* allocate_host(std::size_t bytes) override;
  void deallocate_host(void* p, std::size_t bytes) noexcept override;
  /// cudaMemcpyAsync on a copy stream of its own (created on first use),
  /// ordered after the compute stream's work issued before (stage_out) or
  /// after the copies issued before (stage_in), so a bucket's copies run
  /// while another bucket's update does.
  void stage_in(void* dst, const void* host_src, std::size_t bytes) override;
  void stage_out(void* host_dst, const void* src, std::size_t bytes) override;
  /// The compute stream waits for the copy stream (an event).
  void stage_fence() override;
  /// cudaStreamSynchronize of the copy stream.
  void stage_wait() override;

 private:
  // The hooks of Backend's ops (backend.hpp documents each op, the list above
  // what it does here). Arguments arrive checked; a hook checks only what is
  // CudaBackend's own: cuBLAS's int32 limits, a forced variant's workspace,
  // and the pointer space with CudaOptions::check_pointers.
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

  std::unique_ptr<cuda_detail::CudaState> impl_;
};

/// Device versions of the optimizer arithmetic in summa::optim (same
/// signatures and per-element formulas, see optimizer.hpp), plus the stream
/// (a cudaStream_t; null = the legacy default stream) to run on. Every
/// pointer is a device pointer; asynchronous; no allocation.
namespace cuda {

/// summa::optim::adamw_update on the device. T is float or double; M is
/// master_t<T>.
template <class T, class M>
void adamw_update(T* param, const T* grad, M* exp_avg, M* exp_avg_sq, index_t n,
                  const optim::AdamWCoefficients& c, void* stream = nullptr);

/// summa::optim::sgd_update on the device.
template <class T, class M>
void sgd_update(T* param, const T* grad, M* momentum_buffer, index_t n,
                const optim::SgdCoefficients& c, void* stream = nullptr);

extern template void adamw_update(float*, const float*, float*, float*, index_t,
                                  const optim::AdamWCoefficients&, void*);
extern template void adamw_update(double*, const double*, double*, double*, index_t,
                                  const optim::AdamWCoefficients&, void*);
extern template void sgd_update(float*, const float*, float*, index_t,
                                const optim::SgdCoefficients&, void*);
extern template void sgd_update(double*, const double*, double*, index_t,
                                const optim::SgdCoefficients&, void*);

}  // namespace cuda

}  // namespace summa

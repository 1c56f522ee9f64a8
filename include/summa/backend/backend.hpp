#pragma once
/// \file backend.hpp
/// The local-math seam: everything the distributed algorithms compute on one
/// rank goes through a Backend. The CPU backend uses Eigen; a CUDA backend
/// (cuBLAS + kernels) implements the same interface. Pointers handed to a
/// backend live in the backend's memory space (host for CPU, device for CUDA).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "summa/core/bf16.hpp"
#include "summa/core/matrix_view.hpp"

namespace summa {

namespace optim {
struct AdamWCoefficients;  // summa/optim/optimizer.hpp
struct SgdCoefficients;
}  // namespace optim

/// Caller-provided scratch memory a backend may use for one call.
struct Scratch {
  void* data = nullptr;
  std::size_t bytes = 0;
};

/// The local math of one rank, as a non-virtual interface. Every op below
/// (gemm ... scale_in_place, upload, download) is a public non-virtual entry
/// point that checks its arguments once and then calls the private pure
/// virtual hook named like it with a do_ prefix (gemm -> do_gemm), one per
/// element type, with the same arguments. So every backend refuses a bad call
/// with the same summa::Error before anything is computed or enqueued, and an
/// implementation (CpuBackend, CudaBackend) overrides the hooks only, adding
/// just the checks that are its own (CudaBackend: cuBLAS's int32 limits, a
/// forced GEMM variant's workspace, the pointer space with
/// CudaOptions::check_pointers).
///
/// The entry points check (views' layouts first, then shapes, counts and
/// arrays), with messages that name the op, the argument and the values:
///  - every view's layout (MatrixView::check_layout: non-negative shape,
///    leading dimension at least max(1, rows or cols by order), data not null
///    when non-empty), the view named "op argument" ("gemm A", "copy dst");
///  - shapes that must agree ("copy: shapes differ (4x5 -> 4x3)";
///    check_gemm_shapes for gemm, check_gemm_batch for gemm_strided_batched;
///    equal column counts for gather_rows / scatter_add_rows);
///  - counts: n >= 0; h > 0 for layernorm_mean / layernorm_rstd and for
///    layernorm_backward_apply on a non-empty block; rows, cols >= 0 and
///    ld >= cols for the strided sum_of_squares;
///  - null pointers: an array the op reads or writes for a non-zero number of
///    elements must not be null ("add_bias: null bias for 3 elements"). Arrays
///    read per element of a block with no elements may be null (mean and gamma
///    of an empty LayerNorm block, max and targets of a block with no
///    columns), and so may the documented optional `center`.
///
/// name(), allocate(), deallocate(), gemm_scratch_bytes(), host_accessible(),
/// asynchronous() and synchronize() are not ops and have nothing to check:
/// they stay plain virtual functions.
class Backend {
 public:
  // ---- Mixed precision (bf16) -------------------------------------------------
  // Every op has a summa::bf16 overload (docs/gpu.md, "Mixed precision"):
  //  - matrices (activations, parameters, their gradients; bias, gamma, beta
  //    and their gradients) are bf16;
  //  - per-row statistics and cross-entropy row values (LayerNorm sums, mean,
  //    rstd and backward partials a/b; row max, sum of exponentials, picked
  //    logits) are float = acc_t<bf16>, so layernorm_mean / layernorm_rstd /
  //    cross_entropy_sum are the float overloads;
  //  - scalars (alpha, beta) are float; every arithmetic operation is done in
  //    fp32 (GEMM: fp32 accumulation) with one rounding to bf16 (nearest
  //    even) per stored element; column_sums and layernorm_param_partials sum
  //    in fp32 and round the result once;
  //  - the optimizer keeps fp32 master weights and state next to the bf16
  //    parameters: the master is updated and the parameter set to bf16(master).

  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;

  /// Memory in the backend's space, aligned to at least 64 bytes.
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* p, std::size_t bytes) noexcept = 0;

  /// Scratch bytes gemm() needs for an m x n x k product of element type t
  /// (DType::bf16 for the bf16 overload) to run without allocating (0 when
  /// the implementation never allocates).
  virtual std::size_t gemm_scratch_bytes(index_t m, index_t n, index_t k, DType t) const = 0;
  /// The scratch of a linear layer's three local products on X [m, k] and
  /// W [k, n]: Y = X W, dX = dY Wᵀ and dW = Xᵀ dY (the largest of the three
  /// gemm_scratch_bytes).
  std::size_t linear_scratch_bytes(index_t m, index_t k, index_t n, DType t) const {
    return std::max({gemm_scratch_bytes(m, n, k, t), gemm_scratch_bytes(m, k, n, t),
                     gemm_scratch_bytes(k, n, m, t)});
  }

  /// C = alpha * op(A) * op(B) + beta * C, BLAS semantics: beta == 0 never
  /// reads C (NaN in C is overwritten), alpha == 0 or k == 0 never reads A
  /// or B. With scratch of at least gemm_scratch_bytes() no memory is
  /// allocated; with less (or none) the implementation may allocate.
  void gemm(Op ta, Op tb, float alpha, ConstMatrixView<float> A, ConstMatrixView<float> B,
            float beta, MatrixView<float> C, Scratch scratch = {});
  void gemm(Op ta, Op tb, double alpha, ConstMatrixView<double> A, ConstMatrixView<double> B,
            double beta, MatrixView<double> C, Scratch scratch = {});
  /// bf16 operands and result, fp32 accumulation, C rounded once.
  void gemm(Op ta, Op tb, float alpha, ConstMatrixView<bf16> A, ConstMatrixView<bf16> B, float beta,
            MatrixView<bf16> C, Scratch scratch = {});

  /// Strided-batched GEMM: for b < batch, C_b = alpha * op(A_b) * op(B_b) +
  /// beta * C_b, where X_b is the view X with data + b * stride_x (elements):
  /// same shape, order and leading dimension for every b. BLAS semantics as
  /// gemm(); the C_b must not overlap each other (the A_b and B_b may). batch
  /// == 0 does nothing; check_gemm_batch() failures (negative batch or
  /// strides, shapes that do not fit, overlapping C_b) throw summa::Error
  /// before anything is computed. Scratch as for gemm():
  /// gemm_scratch_bytes() of ONE product suffices (the products reuse it).
  /// CpuBackend runs the products in order b = 0, 1, ... through gemm() (bit
  /// identical to that loop); CudaBackend makes one cublasGemmStridedBatchedEx
  /// call (native operand layout: no GEMM-mode tuning).
  void gemm_strided_batched(Op ta, Op tb, float alpha, ConstMatrixView<float> A, index_t stride_a,
                            ConstMatrixView<float> B, index_t stride_b, float beta,
                            MatrixView<float> C, index_t stride_c, index_t batch,
                            Scratch scratch = {});
  void gemm_strided_batched(Op ta, Op tb, double alpha, ConstMatrixView<double> A, index_t stride_a,
                            ConstMatrixView<double> B, index_t stride_b, double beta,
                            MatrixView<double> C, index_t stride_c, index_t batch,
                            Scratch scratch = {});
  /// bf16 operands and results, fp32 accumulation, each C_b rounded once.
  void gemm_strided_batched(Op ta, Op tb, float alpha, ConstMatrixView<bf16> A, index_t stride_a,
                            ConstMatrixView<bf16> B, index_t stride_b, float beta,
                            MatrixView<bf16> C, index_t stride_c, index_t batch,
                            Scratch scratch = {});

  /// dst = src (same shape; orders and leading dimensions may differ).
  void copy(ConstMatrixView<float> src, MatrixView<float> dst);
  void copy(ConstMatrixView<double> src, MatrixView<double> dst);
  void copy(ConstMatrixView<bf16> src, MatrixView<bf16> dst);
  /// dst = bf16(src) (round to nearest even) or dst = float(src) (exact);
  /// same shape, orders and leading dimensions may differ. For master-weight
  /// initialisation and checkpoints.
  void convert(ConstMatrixView<float> src, MatrixView<bf16> dst);
  void convert(ConstMatrixView<bf16> src, MatrixView<float> dst);

  /// C = alpha * X + beta * C; beta == 0 never reads C.
  void axpby(float alpha, ConstMatrixView<float> X, float beta, MatrixView<float> C);
  void axpby(double alpha, ConstMatrixView<double> X, double beta, MatrixView<double> C);
  void axpby(float alpha, ConstMatrixView<bf16> X, float beta, MatrixView<bf16> C);

  /// C = beta * C; beta == 0 writes zeros without reading C.
  void scale(float beta, MatrixView<float> C);
  void scale(double beta, MatrixView<double> C);
  void scale(float beta, MatrixView<bf16> C);

  /// Y[r, c] += bias[c] for every row r (bias holds Y.cols elements).
  void add_bias(MatrixView<float> Y, const float* bias);
  void add_bias(MatrixView<double> Y, const double* bias);
  void add_bias(MatrixView<bf16> Y, const bf16* bias);

  /// out[c] = beta * out[c] + sum over rows r of X[r, c] (beta == 0 never reads out).
  void column_sums(ConstMatrixView<float> X, float beta, float* out);
  void column_sums(ConstMatrixView<double> X, double beta, double* out);
  /// bf16: sums and beta * out in fp32, out rounded once.
  void column_sums(ConstMatrixView<bf16> X, float beta, bf16* out);

  // ---- LayerNorm kernels (SplitLayerNorm) --------------------------------------
  // X, dY, Y and dX are local blocks of `n` rows; per-row arrays (center,
  // mean, rstd, a, b) hold X.rows elements, per-column arrays (gamma, beta,
  // dgamma, dbeta) X.cols. Sums accumulate in T (at least fp32). Outputs are
  // written without being read (NaN in them is overwritten).

  /// out[r] = sum_c X[r, c] when `center` is null, otherwise the sum of
  /// squared deviations sum_c (X[r, c] - center[r])^2 (the second pass of a
  /// two-pass variance).
  void layernorm_partial_sums(ConstMatrixView<float> X, const float* center, float* out);
  void layernorm_partial_sums(ConstMatrixView<double> X, const double* center, double* out);
  /// bf16: X widened to fp32; center and out are fp32 per-row statistics.
  void layernorm_partial_sums(ConstMatrixView<bf16> X, const float* center, float* out);

  /// Finishes the statistics of n rows over a hidden size h from all-reduced
  /// sums: mean[r] = sums[r] / h; rstd[r] = 1 / sqrt(squares[r] / h + eps).
  /// In place (sums == mean, squares == rstd) is allowed.
  void layernorm_mean(index_t n, index_t h, const float* sums, float* mean);
  void layernorm_mean(index_t n, index_t h, const double* sums, double* mean);
  void layernorm_rstd(index_t n, index_t h, double eps, const float* squares, float* rstd);
  void layernorm_rstd(index_t n, index_t h, double eps, const double* squares, double* rstd);

  /// Y[r, c] = (X[r, c] - mean[r]) * rstd[r] * gamma[c] + beta[c].
  void layernorm_apply(ConstMatrixView<float> X, const float* mean, const float* rstd,
                       const float* gamma, const float* beta, MatrixView<float> Y);
  void layernorm_apply(ConstMatrixView<double> X, const double* mean, const double* rstd,
                       const double* gamma, const double* beta, MatrixView<double> Y);
  /// bf16: fp32 statistics, bf16 gamma / beta / Y.
  void layernorm_apply(ConstMatrixView<bf16> X, const float* mean, const float* rstd,
                       const bf16* gamma, const bf16* beta, MatrixView<bf16> Y);

  /// With xhat = (X - mean[r]) * rstd[r] and g = dY[r, c] * gamma[c], the
  /// per-row partial sums over the local columns: a[r] = sum_c g,
  /// b[r] = sum_c g * xhat.
  void layernorm_backward_partials(ConstMatrixView<float> X, ConstMatrixView<float> dY,
                                   const float* mean, const float* rstd, const float* gamma,
                                   float* a, float* b);
  void layernorm_backward_partials(ConstMatrixView<double> X, ConstMatrixView<double> dY,
                                   const double* mean, const double* rstd, const double* gamma,
                                   double* a, double* b);
  /// bf16: a and b are fp32 per-row statistics.
  void layernorm_backward_partials(ConstMatrixView<bf16> X, ConstMatrixView<bf16> dY,
                                   const float* mean, const float* rstd, const bf16* gamma,
                                   float* a, float* b);

  /// dX = rstd[r] * (g - a[r] / h - xhat * b[r] / h), with a and b the
  /// all-reduced partials above and h the global hidden size.
  void layernorm_backward_apply(ConstMatrixView<float> X, ConstMatrixView<float> dY,
                                const float* mean, const float* rstd, const float* gamma,
                                const float* a, const float* b, index_t h, MatrixView<float> dX);
  void layernorm_backward_apply(ConstMatrixView<double> X, ConstMatrixView<double> dY,
                                const double* mean, const double* rstd, const double* gamma,
                                const double* a, const double* b, index_t h, MatrixView<double> dX);
  void layernorm_backward_apply(ConstMatrixView<bf16> X, ConstMatrixView<bf16> dY,
                                const float* mean, const float* rstd, const bf16* gamma,
                                const float* a, const float* b, index_t h, MatrixView<bf16> dX);

  /// Local column sums of the parameter gradients: dgamma[c] = sum_r dY * xhat,
  /// dbeta[c] = sum_r dY (overwritten, never read).
  void layernorm_param_partials(ConstMatrixView<float> X, ConstMatrixView<float> dY,
                                const float* mean, const float* rstd, float* dgamma, float* dbeta);
  void layernorm_param_partials(ConstMatrixView<double> X, ConstMatrixView<double> dY,
                                const double* mean, const double* rstd, double* dgamma,
                                double* dbeta);
  /// bf16: column sums in fp32, dgamma / dbeta rounded once.
  void layernorm_param_partials(ConstMatrixView<bf16> X, ConstMatrixView<bf16> dY,
                                const float* mean, const float* rstd, bf16* dgamma, bf16* dbeta);

  // ---- GeLU (MLP) -------------------------------------------------------------
  // tanh form: gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))),
  // evaluated in at least fp32 (the CPU backend uses double per element).

  /// Y = gelu(X) elementwise (Y never read; Y may be X itself).
  void gelu_forward(ConstMatrixView<float> X, MatrixView<float> Y);
  void gelu_forward(ConstMatrixView<double> X, MatrixView<double> Y);
  void gelu_forward(ConstMatrixView<bf16> X, MatrixView<bf16> Y);
  /// dX = dY * gelu'(X) elementwise (dX never read; dX may be dY itself).
  void gelu_backward(ConstMatrixView<float> X, ConstMatrixView<float> dY, MatrixView<float> dX);
  void gelu_backward(ConstMatrixView<double> X, ConstMatrixView<double> dY, MatrixView<double> dX);
  void gelu_backward(ConstMatrixView<bf16> X, ConstMatrixView<bf16> dY, MatrixView<bf16> dX);

  // ---- Attention softmax (Attention) ------------------------------------------

  /// Row softmax of scale * S over the causal window: for a square S (s x s),
  /// P[r, c] = exp(scale*S[r,c] - m_r) / sum_{c' <= r} exp(scale*S[r,c'] - m_r)
  /// for c <= r (m_r the row max over c <= r), and P[r, c] = 0 for c > r.
  /// With fewer rows than columns the window is aligned at the bottom right:
  /// row r sees c <= r + (cols - rows) (the new queries of a decoding step
  /// against every cached key; one row sees all). P never read; P may be S
  /// itself (in place).
  void softmax_causal(ConstMatrixView<float> S, double scale, MatrixView<float> P);
  void softmax_causal(ConstMatrixView<double> S, double scale, MatrixView<double> P);
  void softmax_causal(ConstMatrixView<bf16> S, double scale, MatrixView<bf16> P);
  /// Backward of softmax_causal: with P its output and dP = dL/dP,
  /// dS[r, c] = scale * P[r, c] * (dP[r, c] - sum_c' dP[r, c'] * P[r, c']).
  /// (Zero outside the causal window since P is; the same window.) dS never read; dS may be dP
  /// itself.
  void softmax_causal_backward(ConstMatrixView<float> P, ConstMatrixView<float> dP, double scale,
                               MatrixView<float> dS);
  void softmax_causal_backward(ConstMatrixView<double> P, ConstMatrixView<double> dP, double scale,
                               MatrixView<double> dS);
  void softmax_causal_backward(ConstMatrixView<bf16> P, ConstMatrixView<bf16> dP, double scale,
                               MatrixView<bf16> dS);

  // ---- Vocabulary-parallel cross-entropy --------------------------------------
  // Z is a local block of logits [n, vcols] holding global vocabulary columns
  // [col0, col0 + vcols); targets[r] is row r's global target id. Per-row
  // outputs hold n values and are written without being read.

  /// out[r] = max_c Z[r, c].
  void row_max(ConstMatrixView<float> Z, float* out);
  void row_max(ConstMatrixView<double> Z, double* out);
  /// bf16 logits, fp32 per-row values (exact: the max of bf16 values).
  void row_max(ConstMatrixView<bf16> Z, float* out);
  /// out[r] = sum_c exp(Z[r, c] - max[r]).
  void row_sum_exp(ConstMatrixView<float> Z, const float* max, float* out);
  void row_sum_exp(ConstMatrixView<double> Z, const double* max, double* out);
  void row_sum_exp(ConstMatrixView<bf16> Z, const float* max, float* out);
  /// out[r] = Z[r, targets[r] - col0] when that column is local, else 0.
  void pick_targets(ConstMatrixView<float> Z, const std::int32_t* targets, index_t col0,
                    float* out);
  void pick_targets(ConstMatrixView<double> Z, const std::int32_t* targets, index_t col0,
                    double* out);
  void pick_targets(ConstMatrixView<bf16> Z, const std::int32_t* targets, index_t col0, float* out);
  /// sum over r < n of (log(sum[r]) + max[r] - picked[r]), accumulated in double:
  /// the summed cross-entropy of n rows from the globally reduced statistics.
  double cross_entropy_sum(index_t n, const float* max, const float* sum, const float* picked);
  double cross_entropy_sum(index_t n, const double* max, const double* sum, const double* picked);
  /// In place, logits to gradient: Z[r, c] = scale * (exp(Z[r, c] - max[r]) /
  /// sum[r] - [c + col0 == targets[r]]).
  void cross_entropy_grad(MatrixView<float> Z, const float* max, const float* sum,
                          const std::int32_t* targets, index_t col0, double scale);
  void cross_entropy_grad(MatrixView<double> Z, const double* max, const double* sum,
                          const std::int32_t* targets, index_t col0, double scale);
  void cross_entropy_grad(MatrixView<bf16> Z, const float* max, const float* sum,
                          const std::int32_t* targets, index_t col0, double scale);

  // ---- Embedding rows (Embedding2D) -------------------------------------------
  // ids[r] (r < out.rows / src.rows) selects global row ids[r]; the table
  // block holds global rows [row0, row0 + table.rows). Ids outside the block
  // contribute nothing.

  /// out[r, :] = table[ids[r] - row0, :] if local else 0; with `accumulate`
  /// out[r, :] += that instead (out read).
  void gather_rows(const std::int32_t* ids, index_t row0, ConstMatrixView<float> table,
                   bool accumulate, MatrixView<float> out);
  void gather_rows(const std::int32_t* ids, index_t row0, ConstMatrixView<double> table,
                   bool accumulate, MatrixView<double> out);
  void gather_rows(const std::int32_t* ids, index_t row0, ConstMatrixView<bf16> table,
                   bool accumulate, MatrixView<bf16> out);
  /// table[ids[r] - row0, :] += src[r, :] for every r whose id is local
  /// (repeated ids accumulate).
  void scatter_add_rows(const std::int32_t* ids, index_t row0, ConstMatrixView<float> src,
                        MatrixView<float> table);
  void scatter_add_rows(const std::int32_t* ids, index_t row0, ConstMatrixView<double> src,
                        MatrixView<double> table);
  /// bf16: each addition is done in fp32 and rounded, so a row hit by
  /// several ids is rounded once per hit.
  void scatter_add_rows(const std::int32_t* ids, index_t row0, ConstMatrixView<bf16> src,
                        MatrixView<bf16> table);

  // ---- Host <-> backend memory -----------------------------------------------

  /// True when pointers of the backend's memory space may be dereferenced
  /// by host code (CpuBackend); false for device memory (CudaBackend).
  virtual bool host_accessible() const = 0;
  /// True when ops return before their work is done (a device stream):
  /// host-driven MPI must not read or write the backend's memory until
  /// synchronize(), so models on such a backend need stream-ordered
  /// communicators (Communicator::stream_ordered()). CpuBackend: false.
  virtual bool asynchronous() const = 0;
  /// Bytes free in the memory this backend allocates from (the node's
  /// MemAvailable for CpuBackend, cudaMemGetInfo's free bytes of the device
  /// for CudaBackend), before any sharing between ranks; negative when not
  /// known. memory_domain() names that memory within a node: ranks of one
  /// node with the same domain share it ("host" for the host's memory; a
  /// GPU's UUID, the same whichever ordinal CUDA_VISIBLE_DEVICES gives it).
  virtual double memory_free_bytes() const { return -1; }
  virtual std::string memory_domain() const { return "host"; }
  /// Copies `bytes` from host memory to backend memory `dst`, ordered after
  /// the work issued before it; `host_src` may be reused on return.
  void upload(void* dst, const void* host_src, std::size_t bytes);
  /// Copies `bytes` of backend memory `src` to host memory after the work
  /// issued before it has finished; `host_dst` holds the data on return.
  void download(void* host_dst, const void* src, std::size_t bytes);

  // ---- The host pool and staged copies (optimizer offload) --------------------
  // Memory outside the backend's own, for what is kept off the device
  // (OptimizerOptions::offload_bucket: the optimizer state and fp32 master
  // weights). Host code may dereference it and the backend's ops may read
  // and write it (CudaBackend: pinned, mapped host memory, reached over the
  // bus), so it serves where backend memory is expected, only slower.
  // Counted apart from allocate()'s bytes (host_allocated_bytes).

  /// `bytes` of host-pool memory, 64-byte aligned; throws OutOfMemory.
  virtual void* allocate_host(std::size_t bytes);
  virtual void deallocate_host(void* p, std::size_t bytes) noexcept;
  /// Copies `bytes` from host-pool memory to backend memory `dst` on the
  /// backend's copy queue, after the stage_out()s issued before it (it may
  /// run while the compute work issued before it does: CudaBackend's copy
  /// stream). Neither side may be touched until stage_fence() or
  /// stage_wait(). CpuBackend: a plain copy, done on return.
  virtual void stage_in(void* dst, const void* host_src, std::size_t bytes);
  /// Copies `bytes` of backend memory `src` to host-pool memory on the copy
  /// queue, after the compute work issued before it.
  virtual void stage_out(void* host_dst, const void* src, std::size_t bytes);
  /// Compute work issued after this waits for the copies issued before it.
  virtual void stage_fence() {}
  /// Returns once every copy issued has finished (host-pool memory may be
  /// read).
  virtual void stage_wait() {}

  // ---- Optimizer arithmetic (summa/optim/optimizer.hpp) -----------------------
  // Per-element formulas of summa::optim::adamw_update / sgd_update on n
  // elements of backend memory; state in master precision (fp32 for float,
  // fp64 for double). No allocation.

  void adamw_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, index_t n,
                    const optim::AdamWCoefficients& c);
  void adamw_update(double* param, const double* grad, double* exp_avg, double* exp_avg_sq,
                    index_t n, const optim::AdamWCoefficients& c);
  /// bf16 parameters with fp32 master weights: the update runs on
  /// `master` (fp32, with fp32 state and the gradient widened to fp32) and
  /// then param[i] = bf16(master[i]). No allocation.
  void adamw_update(bf16* param, const bf16* grad, float* exp_avg, float* exp_avg_sq, float* master,
                    index_t n, const optim::AdamWCoefficients& c);
  void sgd_update(float* param, const float* grad, float* momentum_buffer, index_t n,
                  const optim::SgdCoefficients& c);
  void sgd_update(double* param, const double* grad, double* momentum_buffer, index_t n,
                  const optim::SgdCoefficients& c);
  /// bf16 parameters with fp32 master weights, as adamw_update above.
  void sgd_update(bf16* param, const bf16* grad, float* momentum_buffer, float* master, index_t n,
                  const optim::SgdCoefficients& c);
  /// Σ x[i]² over n elements, accumulated in double; returns the host value
  /// (a device backend waits for its stream).
  double sum_of_squares(const float* x, index_t n);
  double sum_of_squares(const double* x, index_t n);
  double sum_of_squares(const bf16* x, index_t n);
  /// Σ x² over a row-major rows x cols block with leading dimension ld >=
  /// cols (row r starts at x + r * ld), accumulated in double: one call, so
  /// a device backend waits for its stream once per block, not per row.
  double sum_of_squares(const float* x, index_t rows, index_t cols, index_t ld);
  double sum_of_squares(const double* x, index_t rows, index_t cols, index_t ld);
  double sum_of_squares(const bf16* x, index_t rows, index_t cols, index_t ld);
  /// x[i] ← x[i] · factor (factor rounded to T).
  void scale_in_place(float* x, index_t n, double factor);
  void scale_in_place(double* x, index_t n, double factor);
  /// bf16: x[i] = bf16(float(x[i]) * float(factor)).
  void scale_in_place(bf16* x, index_t n, double factor);

  /// Waits until every operation issued so far has finished (no-op on CPU).
  virtual void synchronize() {}

  /// Bytes this backend holds for its callers now (allocate() less
  /// deallocate(), the bytes asked for) and the most it held at once since
  /// construction or reset_peak_allocated(): the measured side of the memory
  /// planner (docs/memory.md, "The planner against the measured peak"). Every
  /// device buffer the library makes (arenas, the optimizer state, the key /
  /// value cache, token ids, the schemes' staging) goes through allocate().
  std::size_t allocated_bytes() const { return allocated_; }
  std::size_t peak_allocated_bytes() const { return peak_; }
  void reset_peak_allocated() { peak_ = allocated_; }
  /// The same for the host pool (allocate_host).
  std::size_t host_allocated_bytes() const { return host_allocated_; }
  std::size_t host_peak_allocated_bytes() const { return host_peak_; }

 protected:
  /// An implementation's allocate() and deallocate() report each success
  /// with the caller's byte count.
  void note_allocated(std::size_t bytes) {
    allocated_ += bytes;
    peak_ = std::max(peak_, allocated_);
  }
  void note_deallocated(std::size_t bytes) { allocated_ -= std::min(bytes, allocated_); }
  void note_host_allocated(std::size_t bytes) {
    host_allocated_ += bytes;
    host_peak_ = std::max(host_peak_, host_allocated_);
  }
  void note_host_deallocated(std::size_t bytes) {
    host_allocated_ -= std::min(bytes, host_allocated_);
  }

 private:
  std::size_t allocated_ = 0, peak_ = 0, host_allocated_ = 0, host_peak_ = 0;
  // ---- Per-type hooks -----------------------------------------------------------
  // do_X is op X above for one element type, called by X once X's checks have
  // passed (and by an implementation's own hooks, on arguments already
  // checked); X's documentation is its contract. An implementation overrides
  // every hook and checks only what is its own (see the class comment).

  virtual void do_gemm(Op ta, Op tb, float alpha, ConstMatrixView<float> A,
                       ConstMatrixView<float> B, float beta, MatrixView<float> C,
                       Scratch scratch) = 0;
  virtual void do_gemm(Op ta, Op tb, double alpha, ConstMatrixView<double> A,
                       ConstMatrixView<double> B, double beta, MatrixView<double> C,
                       Scratch scratch) = 0;
  virtual void do_gemm(Op ta, Op tb, float alpha, ConstMatrixView<bf16> A, ConstMatrixView<bf16> B,
                       float beta, MatrixView<bf16> C, Scratch scratch) = 0;

  virtual void do_gemm_strided_batched(Op ta, Op tb, float alpha, ConstMatrixView<float> A,
                                       index_t stride_a, ConstMatrixView<float> B, index_t stride_b,
                                       float beta, MatrixView<float> C, index_t stride_c,
                                       index_t batch, Scratch scratch) = 0;
  virtual void do_gemm_strided_batched(Op ta, Op tb, double alpha, ConstMatrixView<double> A,
                                       index_t stride_a, ConstMatrixView<double> B,
                                       index_t stride_b, double beta, MatrixView<double> C,
                                       index_t stride_c, index_t batch, Scratch scratch) = 0;
  virtual void do_gemm_strided_batched(Op ta, Op tb, float alpha, ConstMatrixView<bf16> A,
                                       index_t stride_a, ConstMatrixView<bf16> B, index_t stride_b,
                                       float beta, MatrixView<bf16> C, index_t stride_c,
                                       index_t batch, Scratch scratch) = 0;

  virtual void do_copy(ConstMatrixView<float> src, MatrixView<float> dst) = 0;
  virtual void do_copy(ConstMatrixView<double> src, MatrixView<double> dst) = 0;
  virtual void do_copy(ConstMatrixView<bf16> src, MatrixView<bf16> dst) = 0;

  virtual void do_convert(ConstMatrixView<float> src, MatrixView<bf16> dst) = 0;
  virtual void do_convert(ConstMatrixView<bf16> src, MatrixView<float> dst) = 0;

  virtual void do_axpby(float alpha, ConstMatrixView<float> X, float beta, MatrixView<float> C) = 0;
  virtual void do_axpby(double alpha, ConstMatrixView<double> X, double beta,
                        MatrixView<double> C) = 0;
  virtual void do_axpby(float alpha, ConstMatrixView<bf16> X, float beta, MatrixView<bf16> C) = 0;

  virtual void do_scale(float beta, MatrixView<float> C) = 0;
  virtual void do_scale(double beta, MatrixView<double> C) = 0;
  virtual void do_scale(float beta, MatrixView<bf16> C) = 0;

  virtual void do_add_bias(MatrixView<float> Y, const float* bias) = 0;
  virtual void do_add_bias(MatrixView<double> Y, const double* bias) = 0;
  virtual void do_add_bias(MatrixView<bf16> Y, const bf16* bias) = 0;

  virtual void do_column_sums(ConstMatrixView<float> X, float beta, float* out) = 0;
  virtual void do_column_sums(ConstMatrixView<double> X, double beta, double* out) = 0;
  virtual void do_column_sums(ConstMatrixView<bf16> X, float beta, bf16* out) = 0;

  virtual void do_layernorm_partial_sums(ConstMatrixView<float> X, const float* center,
                                         float* out) = 0;
  virtual void do_layernorm_partial_sums(ConstMatrixView<double> X, const double* center,
                                         double* out) = 0;
  virtual void do_layernorm_partial_sums(ConstMatrixView<bf16> X, const float* center,
                                         float* out) = 0;

  virtual void do_layernorm_mean(index_t n, index_t h, const float* sums, float* mean) = 0;
  virtual void do_layernorm_mean(index_t n, index_t h, const double* sums, double* mean) = 0;

  virtual void do_layernorm_rstd(index_t n, index_t h, double eps, const float* squares,
                                 float* rstd) = 0;
  virtual void do_layernorm_rstd(index_t n, index_t h, double eps, const double* squares,
                                 double* rstd) = 0;

  virtual void do_layernorm_apply(ConstMatrixView<float> X, const float* mean, const float* rstd,
                                  const float* gamma, const float* beta, MatrixView<float> Y) = 0;
  virtual void do_layernorm_apply(ConstMatrixView<double> X, const double* mean, const double* rstd,
                                  const double* gamma, const double* beta,
                                  MatrixView<double> Y) = 0;
  virtual void do_layernorm_apply(ConstMatrixView<bf16> X, const float* mean, const float* rstd,
                                  const bf16* gamma, const bf16* beta, MatrixView<bf16> Y) = 0;

  virtual void do_layernorm_backward_partials(ConstMatrixView<float> X, ConstMatrixView<float> dY,
                                              const float* mean, const float* rstd,
                                              const float* gamma, float* a, float* b) = 0;
  virtual void do_layernorm_backward_partials(ConstMatrixView<double> X, ConstMatrixView<double> dY,
                                              const double* mean, const double* rstd,
                                              const double* gamma, double* a, double* b) = 0;
  virtual void do_layernorm_backward_partials(ConstMatrixView<bf16> X, ConstMatrixView<bf16> dY,
                                              const float* mean, const float* rstd,
                                              const bf16* gamma, float* a, float* b) = 0;

  virtual void do_layernorm_backward_apply(ConstMatrixView<float> X, ConstMatrixView<float> dY,
                                           const float* mean, const float* rstd, const float* gamma,
                                           const float* a, const float* b, index_t h,
                                           MatrixView<float> dX) = 0;
  virtual void do_layernorm_backward_apply(ConstMatrixView<double> X, ConstMatrixView<double> dY,
                                           const double* mean, const double* rstd,
                                           const double* gamma, const double* a, const double* b,
                                           index_t h, MatrixView<double> dX) = 0;
  virtual void do_layernorm_backward_apply(ConstMatrixView<bf16> X, ConstMatrixView<bf16> dY,
                                           const float* mean, const float* rstd, const bf16* gamma,
                                           const float* a, const float* b, index_t h,
                                           MatrixView<bf16> dX) = 0;

  virtual void do_layernorm_param_partials(ConstMatrixView<float> X, ConstMatrixView<float> dY,
                                           const float* mean, const float* rstd, float* dgamma,
                                           float* dbeta) = 0;
  virtual void do_layernorm_param_partials(ConstMatrixView<double> X, ConstMatrixView<double> dY,
                                           const double* mean, const double* rstd, double* dgamma,
                                           double* dbeta) = 0;
  virtual void do_layernorm_param_partials(ConstMatrixView<bf16> X, ConstMatrixView<bf16> dY,
                                           const float* mean, const float* rstd, bf16* dgamma,
                                           bf16* dbeta) = 0;

  virtual void do_gelu_forward(ConstMatrixView<float> X, MatrixView<float> Y) = 0;
  virtual void do_gelu_forward(ConstMatrixView<double> X, MatrixView<double> Y) = 0;
  virtual void do_gelu_forward(ConstMatrixView<bf16> X, MatrixView<bf16> Y) = 0;

  virtual void do_gelu_backward(ConstMatrixView<float> X, ConstMatrixView<float> dY,
                                MatrixView<float> dX) = 0;
  virtual void do_gelu_backward(ConstMatrixView<double> X, ConstMatrixView<double> dY,
                                MatrixView<double> dX) = 0;
  virtual void do_gelu_backward(ConstMatrixView<bf16> X, ConstMatrixView<bf16> dY,
                                MatrixView<bf16> dX) = 0;

  virtual void do_softmax_causal(ConstMatrixView<float> S, double scale, MatrixView<float> P) = 0;
  virtual void do_softmax_causal(ConstMatrixView<double> S, double scale, MatrixView<double> P) = 0;
  virtual void do_softmax_causal(ConstMatrixView<bf16> S, double scale, MatrixView<bf16> P) = 0;

  virtual void do_softmax_causal_backward(ConstMatrixView<float> P, ConstMatrixView<float> dP,
                                          double scale, MatrixView<float> dS) = 0;
  virtual void do_softmax_causal_backward(ConstMatrixView<double> P, ConstMatrixView<double> dP,
                                          double scale, MatrixView<double> dS) = 0;
  virtual void do_softmax_causal_backward(ConstMatrixView<bf16> P, ConstMatrixView<bf16> dP,
                                          double scale, MatrixView<bf16> dS) = 0;

  virtual void do_row_max(ConstMatrixView<float> Z, float* out) = 0;
  virtual void do_row_max(ConstMatrixView<double> Z, double* out) = 0;
  virtual void do_row_max(ConstMatrixView<bf16> Z, float* out) = 0;

  virtual void do_row_sum_exp(ConstMatrixView<float> Z, const float* max, float* out) = 0;
  virtual void do_row_sum_exp(ConstMatrixView<double> Z, const double* max, double* out) = 0;
  virtual void do_row_sum_exp(ConstMatrixView<bf16> Z, const float* max, float* out) = 0;

  virtual void do_pick_targets(ConstMatrixView<float> Z, const std::int32_t* targets, index_t col0,
                               float* out) = 0;
  virtual void do_pick_targets(ConstMatrixView<double> Z, const std::int32_t* targets, index_t col0,
                               double* out) = 0;
  virtual void do_pick_targets(ConstMatrixView<bf16> Z, const std::int32_t* targets, index_t col0,
                               float* out) = 0;

  virtual double do_cross_entropy_sum(index_t n, const float* max, const float* sum,
                                      const float* picked) = 0;
  virtual double do_cross_entropy_sum(index_t n, const double* max, const double* sum,
                                      const double* picked) = 0;

  virtual void do_cross_entropy_grad(MatrixView<float> Z, const float* max, const float* sum,
                                     const std::int32_t* targets, index_t col0, double scale) = 0;
  virtual void do_cross_entropy_grad(MatrixView<double> Z, const double* max, const double* sum,
                                     const std::int32_t* targets, index_t col0, double scale) = 0;
  virtual void do_cross_entropy_grad(MatrixView<bf16> Z, const float* max, const float* sum,
                                     const std::int32_t* targets, index_t col0, double scale) = 0;

  virtual void do_gather_rows(const std::int32_t* ids, index_t row0, ConstMatrixView<float> table,
                              bool accumulate, MatrixView<float> out) = 0;
  virtual void do_gather_rows(const std::int32_t* ids, index_t row0, ConstMatrixView<double> table,
                              bool accumulate, MatrixView<double> out) = 0;
  virtual void do_gather_rows(const std::int32_t* ids, index_t row0, ConstMatrixView<bf16> table,
                              bool accumulate, MatrixView<bf16> out) = 0;

  virtual void do_scatter_add_rows(const std::int32_t* ids, index_t row0,
                                   ConstMatrixView<float> src, MatrixView<float> table) = 0;
  virtual void do_scatter_add_rows(const std::int32_t* ids, index_t row0,
                                   ConstMatrixView<double> src, MatrixView<double> table) = 0;
  virtual void do_scatter_add_rows(const std::int32_t* ids, index_t row0, ConstMatrixView<bf16> src,
                                   MatrixView<bf16> table) = 0;

  virtual void do_upload(void* dst, const void* host_src, std::size_t bytes) = 0;

  virtual void do_download(void* host_dst, const void* src, std::size_t bytes) = 0;

  virtual void do_adamw_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                               index_t n, const optim::AdamWCoefficients& c) = 0;
  virtual void do_adamw_update(double* param, const double* grad, double* exp_avg,
                               double* exp_avg_sq, index_t n,
                               const optim::AdamWCoefficients& c) = 0;
  virtual void do_adamw_update(bf16* param, const bf16* grad, float* exp_avg, float* exp_avg_sq,
                               float* master, index_t n, const optim::AdamWCoefficients& c) = 0;

  virtual void do_sgd_update(float* param, const float* grad, float* momentum_buffer, index_t n,
                             const optim::SgdCoefficients& c) = 0;
  virtual void do_sgd_update(double* param, const double* grad, double* momentum_buffer, index_t n,
                             const optim::SgdCoefficients& c) = 0;
  virtual void do_sgd_update(bf16* param, const bf16* grad, float* momentum_buffer, float* master,
                             index_t n, const optim::SgdCoefficients& c) = 0;

  virtual double do_sum_of_squares(const float* x, index_t n) = 0;
  virtual double do_sum_of_squares(const double* x, index_t n) = 0;
  virtual double do_sum_of_squares(const bf16* x, index_t n) = 0;
  virtual double do_sum_of_squares(const float* x, index_t rows, index_t cols, index_t ld) = 0;
  virtual double do_sum_of_squares(const double* x, index_t rows, index_t cols, index_t ld) = 0;
  virtual double do_sum_of_squares(const bf16* x, index_t rows, index_t cols, index_t ld) = 0;

  virtual void do_scale_in_place(float* x, index_t n, double factor) = 0;
  virtual void do_scale_in_place(double* x, index_t n, double factor) = 0;
  virtual void do_scale_in_place(bf16* x, index_t n, double factor) = 0;
};

/// Throws summa::Error unless op(A) * op(B) fits C; names the operands.
void check_gemm_shapes(Op ta, Op tb, index_t a_rows, index_t a_cols, index_t b_rows, index_t b_cols,
                       index_t c_rows, index_t c_cols);

/// Validates a gemm_strided_batched() call before anything is enqueued:
/// the shapes as check_gemm_shapes(); batch >= 0 and strides >= 0; and, for
/// batch > 1 with a non-empty C, that the C_b are disjoint, accepted when
/// stride_c >= the span of C (one C_b after another) or when the C_b sit side
/// by side inside the leading dimension (stride_c >= C's inner extent, i.e.
/// cols for row-major and rows for col-major, and (batch - 1) * stride_c +
/// inner extent <= ld). Throws summa::Error naming the value and the problem.
void check_gemm_batch(Op ta, Op tb, index_t a_rows, index_t a_cols, index_t b_rows, index_t b_cols,
                      index_t c_rows, index_t c_cols, index_t c_ld, Order c_order, index_t stride_a,
                      index_t stride_b, index_t stride_c, index_t batch);

}  // namespace summa

#pragma once
/// \file layers.hpp
/// The 1D tensor-parallel GPT-2 layers of Megatron-LM (Shoeybi et al. 2019)
/// on the p ranks of a tensor group (ProcessGrid::linear1d: grid.tensor(),
/// rank r = grid.tensor().rank()), behind the same Layer / Module interface
/// as the 2D (SUMMA) layers.
///
/// Distribution. Activations [b*s, h] are *replicated*: every rank holds all
/// tokens and the whole hidden dimension. Weights are split along one axis:
///   ColumnParallelLinear1D  W [in, out] by columns, rank r holds out/p of
///                           them (and the matching bias slice); input
///                           replicated, output [b*s, out/p] split by columns
///   RowParallelLinear1D     W [in, out] by rows, rank r holds in/p of them;
///                           input split by columns (a column-parallel
///                           output), output all-reduced, bias replicated
/// A column-parallel layer followed by a row-parallel one (attention: c_attn
/// then c_proj; MLP: c_fc then c_proj) communicates once in forward (the
/// row-parallel all-reduce, Megatron's g) and once in backward (the
/// column-parallel input-gradient all-reduce, Megatron's f).
///
/// Replicated parameters (LayerNorm gamma / beta, row-parallel biases, wpe)
/// are held in full by every rank: rank 0 is their owner (ParamShard::owner,
/// the copy the optimizer's bookkeeping and gather_global read), the others
/// hold replicas. Their gradients are computed redundantly from replicated
/// inputs, so they are the same on every rank and an optimizer that applies
/// the same update to every held shard keeps the replicas identical.
///
/// Per-call shape checks are local (require): every local shape of a 1D
/// layer is the same on every rank, so consistent arguments pass or fail
/// everywhere alike. Construction-time checks and token / target id checks
/// agree over the tensor group (ProcessGrid::agree), so they throw the same
/// summa::Error on every rank. Buffers that take part in a collective (the
/// row-parallel output, the column-parallel input gradient, the embedding
/// output, the LM head's input gradient) must be contiguous views.
///
/// Element types: float, double and summa::bf16 (mixed precision, docs/gpu.md):
/// activations, parameters and their gradients are T, and so are the
/// activation all-reduces; per-row statistics (LayerNorm mean / rstd and
/// backward partials, the cross-entropy row max, sum of exponentials and
/// target logits) are acc_t<T> (fp32 for bf16), in the arenas and in their
/// collectives; scalars handed to the backend are acc_t<T>.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "summa/core/bf16.hpp"
#include "summa/grid/process_grid.hpp"
#include "summa/layers/layer.hpp"

namespace summa {

// ---------------------------------------------------------------- shards

/// [rows, cols] split by columns over p ranks, rank r's share: local [rows,
/// cols/p]. With `groups` > 1 the columns form that many equal groups, each
/// split over the ranks (rank r holds columns [g*cols/groups + r*w, ... + w)
/// of every group g, w = cols/(groups*p), side by side): one piece per group.
ParamShard column_parallel_shard(std::string name, index_t rows, index_t cols, int p, int r,
                                 int groups = 1);
/// [n] split like the columns above (local [1, n/p]).
ParamShard column_parallel_vector_shard(std::string name, index_t n, int p, int r, int groups = 1);
/// [rows, cols] split by rows: rank r holds rows [r*rows/p, (r+1)*rows/p).
ParamShard row_parallel_shard(std::string name, index_t rows, index_t cols, int p, int r);
/// A tensor (1-D or 2-D `shape`) held in full by every rank; rank 0 owns it,
/// the others hold replicas (owner = false, the same one full piece).
ParamShard replicated_shard(std::string name, std::vector<index_t> shape, int r);

// ---------------------------------------------------------------- linear layers

/// Y [tokens, out/p] = X W_r + b_r with X [tokens, in] replicated and W_r,
/// b_r rank r's columns (HF Conv1D layout, `<name>.weight` [in, out],
/// `<name>.bias` [out]). `groups` as column_parallel_shard (3 for c_attn:
/// rank r's output is [Q_r | K_r | V_r], the q, k, v columns of its heads).
///
/// forward:  local GEMM, no communication.
/// backward: dX = dY_r W_rᵀ, a partial sum, all-reduced (sum) over the group
///           (tokens*in elements; overlapped with dW); dW_r = Xᵀ dY_r and
///           db_r = column sums of dY_r, local.
template <class T>
class ColumnParallelLinear1D final : public Layer<T> {
 public:
  /// Throws summa::Error (the same on every rank) unless the sizes are
  /// positive and out is divisible by groups*p.
  ColumnParallelLinear1D(ProcessGrid& grid, Backend& backend, std::string name, index_t tokens,
                         index_t in, index_t out, bool has_bias = true, int groups = 1);

  std::string_view name() const override { return name_; }
  void collect_parameters(std::vector<Param<T>*>& out) override;
  BufferNeeds buffer_needs() const override;
  void forward(ConstMatrixView<T> X, MatrixView<T> Y, StepBuffers& buffers) override;
  void backward(ConstMatrixView<T> dY, MatrixView<T> dX, StepBuffers& buffers,
                bool accumulate = false) override;

  index_t tokens() const { return tokens_; }
  index_t in() const { return in_; }
  index_t out() const { return out_; }
  index_t local_out() const { return out_ / p_; }
  Param<T>& weight() { return weight_; }
  Param<T>& bias() { return bias_; }

 private:
  std::size_t scratch_bytes() const;

  ProcessGrid* grid_;
  Backend* backend_;
  std::string name_;
  index_t tokens_, in_, out_;
  bool has_bias_;
  int p_;
  Param<T> weight_, bias_;
  ConstMatrixView<T> x_{};
};

/// Y [tokens, out] = sum over ranks of X_r W_r, plus b, with X_r [tokens,
/// in/p] rank r's columns of the input (a column-parallel output) and W_r
/// rank r's rows of `<name>.weight` [in, out]; `<name>.bias` [out] is
/// replicated (rank 0 owns it).
///
/// forward:  local GEMM, all-reduce (sum) of Y over the group (tokens*out
///           elements), then the bias, so it is added once.
/// backward: dX_r = dY W_rᵀ and dW_r = X_rᵀ dY, local; db = column sums of
///           dY, the same on every rank (dY is replicated). No communication.
template <class T>
class RowParallelLinear1D final : public Layer<T> {
 public:
  /// Throws summa::Error (the same on every rank) unless the sizes are
  /// positive and in is divisible by p.
  RowParallelLinear1D(ProcessGrid& grid, Backend& backend, std::string name, index_t tokens,
                      index_t in, index_t out, bool has_bias = true);

  std::string_view name() const override { return name_; }
  void collect_parameters(std::vector<Param<T>*>& out) override;
  BufferNeeds buffer_needs() const override;
  void forward(ConstMatrixView<T> X, MatrixView<T> Y, StepBuffers& buffers) override;
  void backward(ConstMatrixView<T> dY, MatrixView<T> dX, StepBuffers& buffers,
                bool accumulate = false) override;

  index_t tokens() const { return tokens_; }
  index_t in() const { return in_; }
  index_t out() const { return out_; }
  index_t local_in() const { return in_ / p_; }
  Param<T>& weight() { return weight_; }
  Param<T>& bias() { return bias_; }

 private:
  std::size_t scratch_bytes() const;

  ProcessGrid* grid_;
  Backend* backend_;
  std::string name_;
  index_t tokens_, in_, out_;
  bool has_bias_;
  int p_;
  Param<T> weight_, bias_;
  ConstMatrixView<T> x_{};
};

// ---------------------------------------------------------------- layer norm, GeLU

/// y = (x - mean) * rstd * gamma + beta per token on replicated activations
/// [tokens, hidden]: the hidden dimension is whole on every rank, so the
/// two-pass statistics are local (the backend's layernorm kernels) and
/// nothing is communicated. `<name>.weight` (gamma) and `<name>.bias` (beta)
/// [hidden] are replicated (rank 0 owns them); their gradients are the same
/// on every rank. forward() keeps mean and rstd (tokens acc_t<T> values
/// each) in buffers.forward.
template <class T>
class LayerNorm1D final : public Layer<T> {
 public:
  LayerNorm1D(ProcessGrid& grid, Backend& backend, std::string name, index_t tokens, index_t hidden,
              double eps = 1e-5);

  std::string_view name() const override { return name_; }
  void collect_parameters(std::vector<Param<T>*>& out) override;
  BufferNeeds buffer_needs() const override;
  void forward(ConstMatrixView<T> X, MatrixView<T> Y, StepBuffers& buffers) override;
  void backward(ConstMatrixView<T> dY, MatrixView<T> dX, StepBuffers& buffers,
                bool accumulate = false) override;

  index_t tokens() const { return tokens_; }
  index_t hidden() const { return hidden_; }
  Param<T>& weight() { return gamma_; }
  Param<T>& bias() { return beta_; }

 private:
  Backend* backend_;
  std::string name_;
  index_t tokens_, hidden_;
  double eps_;
  Param<T> gamma_, beta_;
  ConstMatrixView<T> x_{};
  acc_t<T>* mean_ = nullptr;  // statistics in acc_t<T> (fp32 for bf16)
  acc_t<T>* rstd_ = nullptr;
};

// ---------------------------------------------------------------- embedding, head, loss

/// Token and position embeddings, vocabulary-parallel: rank r holds wte rows
/// [r*V/p, (r+1)*V/p) (all h columns, the rows the tied head multiplies
/// with); wpe [n_positions, h] is replicated (rank 0 owns it).
///
/// forward:  Y [b*s, h] = the wte rows of the tokens in this rank's
///           vocabulary range (zero elsewhere), all-reduced (sum) over the
///           group (b*s*h elements), plus wpe[positions] locally.
/// backward: scatter-add of dY into the own wte rows and into wpe (the same
///           on every rank). No communication.
/// Token ids are the global batch ([batch*seq], row-major [batch, seq]), the
/// same on every rank.
template <class T>
class Embedding1D final : public EmbeddingModule<T> {
 public:
  Embedding1D(ProcessGrid& grid, Backend& backend, index_t batch, index_t seq, index_t vocab,
              index_t hidden, index_t n_positions);

  std::string_view name() const override { return ""; }
  void collect_parameters(std::vector<Param<T>*>& out) override;
  BufferNeeds buffer_needs() const override;

  /// Throws summa::Error on every rank unless `ids` holds batch*seq ids in
  /// [0, vocab) (what = "token" or "target", for the message).
  void check_ids(std::span<const std::int32_t> ids, const char* what) const override;
  void set_positions(std::span<const std::int32_t> positions) override;

  /// Y [batch*seq, h] (contiguous) = wte[tokens] + wpe[positions].
  /// `tokens` are host memory; they are copied to backend memory the layer
  /// owns (kept for backward, so the caller need not keep them alive).
  void forward(std::span<const std::int32_t> tokens, MatrixView<T> Y,
               StepBuffers& buffers) override;
  /// wte / wpe gradients (+)= the rows' gradients from dY [batch*seq, h].
  void backward(ConstMatrixView<T> dY, StepBuffers& buffers, bool accumulate = false) override;

  Param<T>& wte() override { return wte_; }
  Param<T>& wpe() { return wpe_; }
  /// First global vocabulary row this rank holds.
  index_t vocab_begin() const;

 private:
  ProcessGrid* grid_;
  Backend* backend_;
  index_t batch_, seq_, vocab_, hidden_, positions_;
  int p_;
  Param<T> wte_, wpe_;
  BackendIds position_ids_;  // r % seq for the global batch, uploaded once
  BackendIds tokens_;        // the last forward's token ids
};

/// Vocabulary-parallel cross-entropy (Megatron): the logits Z_r [tokens,
/// V/p] of rank r's vocabulary range; the row max is all-reduced (max, tokens
/// elements), then the row sums of exp(z - max) and the target logits (0
/// except on the rank holding the target) in one all-reduce (sum, 2*tokens
/// elements); both in acc_t<T> (fp32 for bf16 logits). Every rank then
/// holds every token's statistics: the loss is the sum over all tokens /
/// normalizer, computed locally (the same on every rank). backward turns Z_r
/// into dL/dZ_r = (softmax - onehot) / normalizer in place.
template <class T>
class CrossEntropy1D {
 public:
  /// `normalizer`: the token count the summed loss is divided by (0:
  /// tokens, the mean). A data-parallel model passes the global token count,
  /// so that the losses and gradients of its data groups simply add up.
  CrossEntropy1D(ProcessGrid& grid, Backend& backend, index_t tokens, index_t vocab,
                 index_t normalizer = 0);
  BufferNeeds buffer_needs() const;
  /// Z: local logits [tokens, vocab/p]; targets: global [tokens] ids, the
  /// same on every rank. Returns the summed loss / normalizer (the same on
  /// every rank) and keeps the row statistics (3 * tokens acc_t<T> values)
  /// in buffers.forward; the targets are copied (host to backend memory) for
  /// backward.
  double forward(ConstMatrixView<T> Z, std::span<const std::int32_t> targets, StepBuffers& buffers);
  /// In place: Z (the logits given to forward) becomes dL/dZ.
  void backward(MatrixView<T> Z, StepBuffers& buffers);

 private:
  ProcessGrid* grid_;
  Backend* backend_;
  index_t tokens_, vocab_, normalizer_;
  int p_;
  acc_t<T>* max_ = nullptr;    // row statistics in acc_t<T> (fp32 for bf16)
  acc_t<T>* stats_ = nullptr;  // sum | picked target logit
  BackendIds targets_;         // in backend memory
};

/// Tied LM head: logits_r [tokens, V/p] = X wte_rᵀ with the embedding's
/// local wte rows, X [tokens, h] replicated (local GEMM), then
/// CrossEntropy1D. backward: dX = dZ_r wte_r, all-reduced (sum, tokens*h
/// elements; overlapped with dwte), dwte_r (+)= dZ_rᵀ X locally.
template <class T>
class LMHead1D final : public LossHead<T> {
 public:
  /// `wte` is the embedding's parameter (tied; the head owns no parameter);
  /// `normalizer` as for CrossEntropy1D.
  LMHead1D(ProcessGrid& grid, Backend& backend, Param<T>& wte, index_t tokens, index_t hidden,
           index_t vocab, index_t normalizer = 0);

  std::string_view name() const override { return "lm_head"; }
  void collect_parameters(std::vector<Param<T>*>&) override {}
  BufferNeeds buffer_needs() const override;

  /// Logits of X [tokens, h] into buffers.forward, then the loss.
  double forward(ConstMatrixView<T> X, std::span<const std::int32_t> targets,
                 StepBuffers& buffers) override;
  /// dX [tokens, h] (contiguous, never read) and wte's gradient (+)=.
  void backward(MatrixView<T> dX, StepBuffers& buffers, bool accumulate = false) override;

  /// Local logits [tokens, V/p] (vocabulary columns [r*V/p, (r+1)*V/p)) of
  /// the last forward; backward overwrites them with dL/dlogits.
  ConstMatrixView<T> logits() const override { return logits_; }

 private:
  std::size_t scratch_bytes() const;

  ProcessGrid* grid_;
  Backend* backend_;
  Param<T>* wte_;
  index_t tokens_, hidden_, vocab_;
  int p_;
  CrossEntropy1D<T> loss_;
  MatrixView<T> logits_{};
  ConstMatrixView<T> x_{};
};

extern template class ColumnParallelLinear1D<float>;
extern template class ColumnParallelLinear1D<double>;
extern template class ColumnParallelLinear1D<bf16>;
extern template class RowParallelLinear1D<float>;
extern template class RowParallelLinear1D<double>;
extern template class RowParallelLinear1D<bf16>;
extern template class LayerNorm1D<float>;
extern template class LayerNorm1D<double>;
extern template class LayerNorm1D<bf16>;
extern template class Embedding1D<float>;
extern template class Embedding1D<double>;
extern template class Embedding1D<bf16>;
extern template class CrossEntropy1D<float>;
extern template class CrossEntropy1D<double>;
extern template class CrossEntropy1D<bf16>;
extern template class LMHead1D<float>;
extern template class LMHead1D<double>;
extern template class LMHead1D<bf16>;

}  // namespace summa

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
/// Sequence parallelism (`sequence_parallel`, Korthikanti et al. 2022): the
/// column-parallel input and the row-parallel output are split by tokens
/// ([tokens/p, ...], rank r rows [r*tokens/p, (r+1)*tokens/p)); each
/// all-reduce becomes a reduce-scatter and an all-gather of the same bytes:
///   column-parallel  forward:  all-gather X's rows into the workspace
///                    backward: all-gather X again (overlapped with dX's
///                              GEMM), reduce-scatter dX (overlapped with dW)
///   row-parallel     forward:  reduce-scatter Y, then the bias
///                    backward: all-gather dY; db = column sums of the
///                              gathered dY (the same on every rank)
/// Only the token shard of X is kept for backward (Megatron's saved input).
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
#include <utility>
#include <vector>

#include "summa/core/bf16.hpp"
#include "summa/grid/process_grid.hpp"
#include "summa/layers/layer.hpp"
#include "summa/layers/split_layer_norm.hpp"
#include "summa/layers/vocab_parallel.hpp"

namespace summa {

// ---------------------------------------------------------------- shards

// ---------------------------------------------------------------- linear layers

/// What the two 1D linears share: the sizes, `<name>.weight` and
/// `<name>.bias` (each linear shards them), the saved input, and the
/// workspace of its local GEMM (scratch_bytes).
template <class T>
class Linear1D : public Layer<T> {
 public:
  std::string_view name() const override { return name_; }
  void collect_parameters(std::vector<Param<T>*>& out) override;
  BufferNeeds buffer_needs() const override;

  index_t tokens() const { return tokens_; }
  index_t in() const { return in_; }
  index_t out() const { return out_; }
  Param<T>& weight() { return weight_; }
  Param<T>& bias() { return bias_; }

 protected:
  /// `grid` checked already (its group size is p).
  Linear1D(ProcessGrid& grid, Backend& backend, const std::string& name, index_t tokens, index_t in,
           index_t out, bool has_bias, bool sequence_parallel);
  /// The local GEMM's workspace.
  virtual std::size_t scratch_bytes() const = 0;
  /// Elements of the gathered (or to-be-scattered) activation block in the
  /// workspace under sequence parallelism, 0 without.
  virtual index_t gathered_elems() const = 0;
  /// Rows of the token-split side (tokens/p under sequence parallelism).
  index_t split_rows() const { return sp_ ? tokens_ / p_ : tokens_; }

  ProcessGrid* grid_;
  Backend* backend_;
  std::string name_;
  index_t tokens_, in_, out_;
  bool has_bias_;
  int p_;
  bool sp_;
  Param<T> weight_, bias_;
  ConstMatrixView<T> x_{};
};

/// Y [tokens, out/p] = X W_r + b_r with X [tokens, in] replicated and W_r,
/// b_r rank r's columns (HF Conv1D layout, `<name>.weight` [in, out],
/// `<name>.bias` [out]). `groups.out` (ColumnGroups) > 1: rank r's output is
/// [Q_r | K_r | V_r] for c_attn; `groups.in` changes nothing (X is whole).
///
/// forward:  local GEMM, no communication.
/// backward: dX = dY_r W_rᵀ, a partial sum, all-reduced (sum) over the group
///           (tokens*in elements; overlapped with dW); dW_r = Xᵀ dY_r and
///           db_r = column sums of dY_r, local.
template <class T>
class ColumnParallelLinear1D final : public Linear1D<T> {
 public:
  /// Throws summa::Error (the same on every rank) unless the sizes are
  /// positive and out is divisible by groups.out*p.
  ColumnParallelLinear1D(ProcessGrid& grid, Backend& backend, std::string name, index_t tokens,
                         index_t in, index_t out, bool has_bias = true, ColumnGroups groups = {},
                         bool sequence_parallel = false);

  void price(cost::Tally& t, model::Phase phase) const override;
  void forward(ConstMatrixView<T> X, MatrixView<T> Y, StepBuffers& buffers) override;
  void backward(ConstMatrixView<T> dY, MatrixView<T> dX, StepBuffers& buffers,
                bool accumulate = false) override;

  index_t local_out() const { return this->out_ / this->p_; }

 private:
  std::size_t scratch_bytes() const override;
  /// X gathered and the partial dX, both [tokens, in] (backward).
  index_t gathered_elems() const override { return this->sp_ ? 2 * this->tokens_ * this->in_ : 0; }
  void sequence_parallel_backward(ConstMatrixView<T> dY, MatrixView<T> dX, bool want_dx,
                                  acc_t<T> beta, StepBuffers& buffers);
};

/// Y [tokens, out] = sum over ranks of X_r W_r, plus b, with X_r [tokens,
/// in/p] rank r's columns of the input (a column-parallel output) and W_r
/// rank r's rows of `<name>.weight` [in, out] (with `groups.in` > 1, X_r
/// holds rank r's columns of each group, and W_r the rows that match);
/// `<name>.bias` [out] is replicated (rank 0 owns it). `groups.out` must be 1.
///
/// forward:  local GEMM, all-reduce (sum) of Y over the group (tokens*out
///           elements), then the bias, so it is added once.
/// backward: dX_r = dY W_rᵀ and dW_r = X_rᵀ dY, local; db = column sums of
///           dY, the same on every rank (dY is replicated). No communication.
template <class T>
class RowParallelLinear1D final : public Linear1D<T> {
 public:
  /// Throws summa::Error (the same on every rank) unless the sizes are
  /// positive and in is divisible by p.
  RowParallelLinear1D(ProcessGrid& grid, Backend& backend, std::string name, index_t tokens,
                      index_t in, index_t out, bool has_bias = true, ColumnGroups groups = {},
                      bool sequence_parallel = false);

  void price(cost::Tally& t, model::Phase phase) const override;
  void forward(ConstMatrixView<T> X, MatrixView<T> Y, StepBuffers& buffers) override;
  void backward(ConstMatrixView<T> dY, MatrixView<T> dX, StepBuffers& buffers,
                bool accumulate = false) override;

  index_t local_in() const { return this->in_ / this->p_; }

 private:
  std::size_t scratch_bytes() const override;
  index_t gathered_elems() const override { return this->sp_ ? this->tokens_ * this->out_ : 0; }
};

// ---------------------------------------------------------------- layer norm, GeLU

/// Megatron's LayerNorm layout (summa/layers/split_layer_norm.hpp): nothing
/// split (with `sequence_parallel`: the tokens over the tensor group, the
/// parameter gradients all-reduced over it), the parameters replicated over
/// the tensor group (rank 0 owns them).
NormLayout megatron1d_norm_layout(ProcessGrid& grid, bool sequence_parallel = false);

// ---------------------------------------------------------------- embedding, head, loss

/// Megatron's vocabulary-parallel layout (summa/layers/vocab_parallel.hpp):
/// the vocabulary split over the tensor group (p ranks, rank r holds wte
/// rows [r*V/p, (r+1)*V/p), all h columns); the hidden columns and the
/// tokens not split; wpe replicated (rank 0 owns it).
/// With `sequence_parallel` the outer activations' tokens are split over the
/// same axis (VocabLayout::sequence_parallel).
VocabLayout megatron1d_vocab_layout(ProcessGrid& grid, bool sequence_parallel = false);

/// Token and position embeddings: Y [b*s, h] = the wte rows of the tokens in
/// this rank's vocabulary range, all-reduced over the group (b*s*h
/// elements), plus wpe[positions] locally; backward scatter-adds dY into the
/// own wte rows and wpe with no communication (VocabEmbedding).
template <class T>
class Embedding1D final : public VocabEmbedding<T> {
 public:
  Embedding1D(ProcessGrid& grid, Backend& backend, index_t batch, index_t seq, index_t vocab,
              index_t hidden, index_t n_positions, bool sequence_parallel = false)
      : VocabEmbedding<T>(grid, backend, megatron1d_vocab_layout(grid, sequence_parallel), batch,
                          seq, vocab, hidden, n_positions) {}
};

/// Vocabulary-parallel cross-entropy (Megatron) on the logits [tokens, V/p]
/// of the rank's vocabulary range: the row max, then (sum exp | target
/// logit), all-reduced over the group in acc_t<T> (VocabCrossEntropy).
template <class T>
class CrossEntropy1D final : public VocabCrossEntropy<T> {
 public:
  CrossEntropy1D(ProcessGrid& grid, Backend& backend, index_t tokens, index_t vocab,
                 index_t normalizer = 0)
      : VocabCrossEntropy<T>(grid, backend, megatron1d_vocab_layout(grid), tokens, vocab,
                             normalizer) {}
};

/// Tied LM head: logits [tokens, V/p] = X wte_rᵀ (X replicated, a local
/// GEMM), then the cross-entropy; backward: dX = dZ wte_r all-reduced over
/// the group (overlapped with dwte_r (+)= dZᵀ X) (VocabLMHead).
template <class T>
class LMHead1D final : public VocabLMHead<T> {
 public:
  LMHead1D(ProcessGrid& grid, Backend& backend, Param<T>& wte, index_t tokens, index_t hidden,
           index_t vocab, index_t normalizer = 0, bool sequence_parallel = false)
      : VocabLMHead<T>(grid, backend, megatron1d_vocab_layout(grid, sequence_parallel), wte, tokens,
                       hidden, vocab, normalizer) {}
};

extern template class Linear1D<float>;
extern template class Linear1D<double>;
extern template class Linear1D<bf16>;
extern template class ColumnParallelLinear1D<float>;
extern template class ColumnParallelLinear1D<double>;
extern template class ColumnParallelLinear1D<bf16>;
extern template class RowParallelLinear1D<float>;
extern template class RowParallelLinear1D<double>;
extern template class RowParallelLinear1D<bf16>;

}  // namespace summa

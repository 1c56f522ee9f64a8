#pragma once
/// \file layers.hpp
/// The 2D (SUMMA, Optimus) layers on a q x q mesh: the linear, the LayerNorm,
/// the token and position embeddings, the tied LM head and the cross-entropy;
/// each section below says how it is distributed.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "summa/layers/layer.hpp"
#include "summa/layers/split_layer_norm.hpp"
#include "summa/layers/vocab_parallel.hpp"
#include "summa/summa/engine.hpp"

namespace summa {

// ---------------------------------------------------------------- linear

/// Y = X W + b on a q x q mesh (Optimus §3.2.1), the building block of every
/// projection of the 2D transformer.
///
/// Distribution, for X [tokens, in], W [in, out], Y [tokens, out] (HF Conv1D
/// layout, y = x W + b): every matrix is split into q x q blocks and rank
/// (i, j) holds block (i, j) — tokens over mesh rows, features over mesh
/// columns. The bias [out] is owned by mesh row 0: rank (0, j) holds
/// b[j*out/q, (j+1)*out/q), broadcasts it down mesh column j in forward, and
/// receives the column-reduced bias gradient in backward. Every bias element
/// thus has exactly one owner (the optimizer updates it once) and its gradient
/// sums every token's contribution; ranks of rows > 0 hold no bias.
///
/// forward:  Y = X W (SUMMA AB) + b
/// backward: dX = dY W' (SUMMA ABt), dW = X' dY (SUMMA AtB), db = column sums
///           of dY reduced along mesh columns to row 0.
class Linear2D {
 public:
  /// Global sizes; throws summa::Error (the same on every rank) when q does
  /// not divide them.
  Linear2D(SummaEngine& engine, index_t tokens, index_t in, index_t out, bool has_bias = true);

  SummaEngine& engine() const { return *engine_; }
  index_t tokens() const { return tokens_; }
  index_t in() const { return in_; }
  index_t out() const { return out_; }
  bool has_bias() const { return has_bias_; }
  /// True on the ranks that own a bias slice (mesh row 0).
  bool owns_bias() const;
  /// Local block shapes: X and dX [tokens/q, in/q], W and dW [in/q, out/q],
  /// Y and dY [tokens/q, out/q], bias and its gradient out/q on owners.
  index_t local_tokens() const { return tokens_ / q_; }
  index_t local_in() const { return in_ / q_; }
  index_t local_out() const { return out_ / q_; }

  /// Workspace a forward or backward call needs.
  std::size_t workspace_bytes(DType t) const;

  /// Y = X W + b. `bias` is read on owners only (may be null elsewhere).
  template <class T>
  void forward(ConstMatrixView<T> X, ConstMatrixView<T> W, const T* bias, MatrixView<T> Y,
               Workspace& ws);

  /// dX = dY W', dW (+)= X' dY, dbias (+)= column sums of dY (on owners; may
  /// be null elsewhere). With `accumulate` the parameter gradients are added
  /// to (gradient accumulation), otherwise overwritten (never read). An empty
  /// dX view (0 x 0) skips the input gradient (first layer).
  template <class T>
  void backward(ConstMatrixView<T> X, ConstMatrixView<T> W, ConstMatrixView<T> dY, MatrixView<T> dX,
                MatrixView<T> dW, T* dbias, Workspace& ws, bool accumulate = false);

 private:
  SummaEngine* engine_;
  index_t tokens_, in_, out_;
  bool has_bias_;
  int q_;
};

/// Linear2D as a Layer with its own parameters `<name>.weight` [in, out] and
/// `<name>.bias` [out] (Hugging Face Conv1D layout).
///
/// `groups.out` > 1 splits the output features into that many equal groups
/// (for c_attn: q | k | v) and distributes each group over the mesh columns,
/// so mesh column j holds columns [g*out/groups + j*w, g*out/groups + (j+1)*w)
/// of every group g (w = out/(groups*q)), stored side by side. For c_attn this
/// is exactly the q, k and v columns of column j's heads, so attention is
/// local. `groups.in` > 1 does the same to the weight's rows, for an input
/// grouped so (a concatenation). The weight shard is then several pieces of
/// the global tensor (see ParamShard); global names and shapes are unchanged.
template <class T>
class Linear2DLayer final : public Layer<T> {
 public:
  Linear2DLayer(SummaEngine& engine, std::string name, index_t tokens, index_t in, index_t out,
                bool has_bias = true, ColumnGroups groups = {});

  std::string_view name() const override { return name_; }
  void collect_parameters(std::vector<Param<T>*>& out) override;
  BufferNeeds buffer_needs() const override;
  void price(cost::Tally& t, model::Phase phase) const override;
  void forward(ConstMatrixView<T> X, MatrixView<T> Y, StepBuffers& buffers) override;
  void backward(ConstMatrixView<T> dY, MatrixView<T> dX, StepBuffers& buffers,
                bool accumulate = false) override;

  const Linear2D& op() const { return op_; }
  Param<T>& weight() { return weight_; }
  Param<T>& bias() { return bias_; }

 private:
  Linear2D op_;
  std::string name_;
  Param<T> weight_, bias_;
  ConstMatrixView<T> x_{};  // input saved by forward
};

extern template class Linear2DLayer<float>;
extern template class Linear2DLayer<double>;
extern template class Linear2DLayer<bf16>;

// ---------------------------------------------------------------- layer norm

/// Layer normalisation over the hidden dimension on a q x q mesh (Optimus
/// §3.2.1): y = (x - mean) * rstd * gamma + beta per token, SplitLayerNorm
/// (summa/layers/split_layer_norm.hpp) over the 2D layout.
///
/// Distribution, for X and Y [tokens, hidden]: split into q x q blocks, rank
/// (i, j) holds block (i, j) — tokens over mesh rows, hidden over mesh
/// columns. gamma and beta [hidden] are owned by mesh row 0 exactly like
/// Linear2D's bias: rank (0, j) holds slice j (hidden/q elements), broadcasts
/// it down mesh column j in forward (and gamma in backward) and receives the
/// column-reduced gradients; ranks of rows > 0 hold no parameters.
///
/// forward:  per token, mean = (sum over the full hidden dim) / hidden from
///           local partial sums all-reduced along the mesh row; then (two
///           passes, numerically stable) the all-reduced sum of squared
///           deviations from that mean gives var and rstd = 1/sqrt(var + eps).
///           mean and rstd (tokens/q values each, acc_t<T>) are kept in
///           buffers.forward for backward.
/// backward: with xhat = (x - mean) * rstd and g = dy * gamma, one all-reduce
///           along the mesh row of the 2 * tokens/q partials a = sum g and
///           b = sum g * xhat gives dx = rstd * (g - a/h - xhat * b/h);
///           dgamma = column sums of dy * xhat and dbeta = column sums of dy,
///           reduced along mesh columns to row 0.
///
/// The layout: the tokens over the mesh rows (mesh_col, q), the hidden
/// columns over the mesh columns (mesh_row, q), the parameters on mesh row 0
/// (NormLayout::rooted); Summa2DContext::norm_layout.
NormLayout summa2d_norm_layout(const ProcessGrid& grid);

// ---------------------------------------------------------------- embedding

/// Token and position embeddings on a q x q mesh, vocabulary partitioned.
///
/// wte [vocab, h] is split into q x q blocks: rank (i, j) holds vocabulary
/// rows [i*V/q, (i+1)*V/q) and hidden columns [j*h/q, (j+1)*h/q) — the same
/// blocks the tied LM head multiplies with (logits = X wteᵀ, SUMMA ABᵀ).
/// wpe [n_positions, h] is split the same way in chunks of ceil(P/q)
/// positions (the last mesh rows may hold fewer or none).
///
/// forward: every rank (r, j) builds, for all b*s tokens, the sum of the
/// wte and wpe rows it holds ([b*s, h/q], zero elsewhere); a reduce-scatter
/// along mesh column j leaves token block i on rank (i, j). backward: an
/// all-gather of dY along the mesh column, then each rank scatter-adds into
/// the rows it holds. Token ids are the *global* batch ([batch*seq],
/// row-major [batch, seq]), the same on every rank of the mesh.
template <class T>
class Embedding2D final : public EmbeddingModule<T> {
 public:
  Embedding2D(SummaEngine& engine, index_t batch, index_t seq, index_t vocab, index_t hidden,
              index_t n_positions);

  std::string_view name() const override { return ""; }
  void collect_parameters(std::vector<Param<T>*>& out) override;
  BufferNeeds buffer_needs() const override;
  void price(cost::Tally& t, model::Phase phase) const override;

  /// Throws summa::Error on every rank unless `ids` holds batch*seq ids in
  /// [0, vocab) (what = "token" or "target", for the message).
  void check_ids(std::span<const std::int32_t> ids, const char* what) const override;
  void set_positions(std::span<const std::int32_t> positions) override;
  void restore_tokens(std::span<const std::int32_t> tokens) override;

  /// Y [batch*seq/q, h/q] = wte[tokens] + wpe[positions] (local block).
  /// `tokens` are host memory; they are copied to backend memory the layer
  /// owns (kept for backward, so the caller need not keep them alive).
  void forward(std::span<const std::int32_t> tokens, MatrixView<T> Y,
               StepBuffers& buffers) override;
  /// wte / wpe gradients (+)= the rows' gradients from dY.
  void backward(ConstMatrixView<T> dY, StepBuffers& buffers, bool accumulate = false) override;

  Param<T>& wte() override { return wte_; }
  Param<T>& wpe() { return wpe_; }
  index_t position_chunk() const { return chunk_; }

 private:
  SummaEngine* engine_;
  index_t batch_, seq_, vocab_, hidden_, positions_;
  int q_;
  index_t chunk_;
  Param<T> wte_, wpe_;
  BackendIds position_ids_;  // r % seq for the global batch, uploaded once
  BackendIds tokens_;        // the last forward's token ids
};

extern template class Embedding2D<float>;
extern template class Embedding2D<double>;
extern template class Embedding2D<bf16>;

// ---------------------------------------------------------------- head, loss

/// Tied LM head and vocabulary-parallel cross-entropy on a q x q mesh.
///
/// LMHead2D: logits [b*s, V] = X wteᵀ with the embedding's wte blocks (SUMMA
/// ABᵀ); rank (i, j) holds logits of token block i and vocabulary block j.
/// backward: dX = dlogits · wte (SUMMA AB) and dwte += dlogitsᵀ · X (SUMMA
/// AᵀB), added to the gradient the embedding contributes.
///
/// CrossEntropy2D: mean over all b*s tokens of log-sum-exp(z) - z[target],
/// max-subtracted: the row max is all-reduced (max) along the mesh row, then
/// the row sums of exp(z - max) and the target logits (0 except on the rank
/// holding the target column) are all-reduced (sum) along the mesh row; the
/// per-row losses are summed in double and all-reduced along the mesh column.
/// backward turns the logits into dL/dz = (softmax - onehot) / (b*s) in place.
/// That is the vocabulary-parallel cross-entropy of
/// summa/layers/vocab_parallel.hpp (VocabCrossEntropy) over the mesh's axes.
/// The cross-entropy's layout on the mesh: logits block (i, j) holds token
/// block i (tokens over the mesh rows: mesh_col, q) and vocabulary block j
/// (over the mesh columns: mesh_row, q); nothing splits the hidden columns.
VocabLayout summa2d_loss_layout(const ProcessGrid& grid);

/// CrossEntropy2D on local logits [tokens/q, vocab/q] (see the file comment;
/// VocabCrossEntropy over summa2d_loss_layout).
template <class T>
class CrossEntropy2D final : public VocabCrossEntropy<T> {
 public:
  CrossEntropy2D(ProcessGrid& grid, Backend& backend, index_t tokens, index_t vocab,
                 index_t normalizer = 0)
      : VocabCrossEntropy<T>(grid, backend, summa2d_loss_layout(grid), tokens, vocab, normalizer) {}
};

template <class T>
class LMHead2D final : public LossHead<T> {
 public:
  /// `wte` is the embedding's parameter (tied; the head owns no parameter).
  /// `normalizer` as for CrossEntropy2D.
  LMHead2D(SummaEngine& engine, Param<T>& wte, index_t tokens, index_t hidden, index_t vocab,
           index_t normalizer = 0);

  std::string_view name() const override { return "lm_head"; }
  void collect_parameters(std::vector<Param<T>*>&) override {}
  BufferNeeds buffer_needs() const override;
  void price(cost::Tally& t, model::Phase phase) const override;

  /// Logits of X [tokens/q, h/q] into buffers.forward, then the loss.
  double forward(ConstMatrixView<T> X, std::span<const std::int32_t> targets,
                 StepBuffers& buffers) override;
  /// dX (never read) and wte's gradient (+)=.
  void backward(MatrixView<T> dX, StepBuffers& buffers, bool accumulate = false) override;

  /// Local logits block of the last forward; backward overwrites it with
  /// dL/dlogits.
  ConstMatrixView<T> logits() const override { return logits_; }

 private:
  SummaEngine* engine_;
  Param<T>* wte_;
  index_t tokens_, hidden_, vocab_;
  int q_;
  CrossEntropy2D<T> loss_;
  MatrixView<T> logits_{};
  ConstMatrixView<T> x_{};
};

extern template class LMHead2D<float>;
extern template class LMHead2D<double>;
extern template class LMHead2D<bf16>;

}  // namespace summa

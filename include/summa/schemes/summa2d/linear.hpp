#pragma once
/// \file linear.hpp
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

#include <string>

#include "summa/layers/layer.hpp"
#include "summa/summa/engine.hpp"

namespace summa {

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
/// `groups` > 1 splits the output features into that many equal groups (for
/// c_attn: q | k | v) and distributes each group over the mesh columns, so
/// mesh column j holds columns [g*out/groups + j*w, g*out/groups + (j+1)*w)
/// of every group g (w = out/(groups*q)), stored side by side. For c_attn this
/// is exactly the q, k and v columns of column j's heads, so attention is
/// local. The weight shard is then several pieces of the global tensor (see
/// ParamShard); global names and shapes are unchanged.
template <class T>
class Linear2DLayer final : public Layer<T> {
 public:
  Linear2DLayer(SummaEngine& engine, std::string name, index_t tokens, index_t in, index_t out,
                bool has_bias = true, int groups = 1);

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

/// Shard of a [rows, cols] matrix parameter split into q x q blocks (rank
/// (i, j) holds block (i, j)), with the columns in `groups` as Linear2DLayer
/// describes.
ParamShard matrix_shard(std::string name, index_t rows, index_t cols, int q, int i, int j,
                        int groups = 1);
/// Shard of a [n] vector parameter owned by mesh row 0: rank (0, j) holds
/// slice j (with `groups` as above); other rows hold nothing.
ParamShard row0_vector_shard(std::string name, index_t n, int q, int i, int j, int groups = 1);

}  // namespace summa

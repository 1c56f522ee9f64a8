#pragma once
/// \file split_layer_norm.hpp
/// A scheme's axes as its ops see them (AxisSplit), and the LayerNorm of
/// activations split by tokens over one axis and by hidden columns over
/// another (SplitLayerNorm): the 1D scheme's LayerNorm (nothing split:
/// local), the 3D scheme's (tokens over Z, columns over Y, parameters
/// replicated over X and Z) and the 2D scheme's (tokens over the mesh rows,
/// columns over the mesh columns, parameters on mesh row 0 only), written
/// once with its cost beside it.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "summa/backend/backend.hpp"
#include "summa/grid/process_grid.hpp"
#include "summa/layers/layer.hpp"

namespace summa {

namespace cost {
class Tally;
struct Elements;
}  // namespace cost

/// One axis an op splits a dimension over: the grid's communicator, its
/// size and this rank's index on it, and its name in messages ("p", "Gx").
/// A size of 1 splits nothing, and no collective runs over it.
struct AxisSplit {
  CommAxis axis = CommAxis::tensor;
  int size = 1, rank = 0;
  const char* name = "1";
};

/// Where a scheme runs its LayerNorm.
struct NormLayout {
  const char* scheme = "";  // "1D", "2D", "3D": in messages ("LayerNorm1D 'h.0.ln_1'")
  AxisSplit tokens;         // splits the tokens (rows); the parameter gradients are summed over it
  AxisSplit hidden;         // splits the hidden columns; the row statistics are summed over it
  /// The rank's index among the replicas of its parameter block besides
  /// the tokens axis (1D: the tensor rank; 3D: x); the rank with 0 here and
  /// on the tokens axis owns the block.
  int replica_rank = 0;
  CommAxis agree_axis = CommAxis::tensor;
  /// The parameters live on tokens-rank 0 only (2D: mesh row 0, as Optimus
  /// keeps them, Linear2D's bias alike): broadcast over the tokens axis at
  /// each use and their gradients reduced to it (instead of replicated, the
  /// gradients all-reduced). Ranks off it hold no parameter.
  bool rooted = false;
};

/// y = (x - mean) * rstd * gamma + beta per token on a block [tokens/Gt,
/// hidden/Gh]: the two-pass statistics all-reduced over the hidden axis
/// (tokens/Gt values each, in acc_t<T>: fp32 for bf16); backward all-reduces
/// the a | b row sums over the hidden axis and the dgamma | dbeta column
/// sums over the tokens axis (overlapped with the input gradient).
/// `<name>.weight` (gamma) and `<name>.bias` (beta) [hidden] are split like
/// the columns and replicated elsewhere; replicas compute identical
/// gradients. With NormLayout::rooted they live on tokens-rank 0 alone:
/// gamma | beta are broadcast over the tokens axis while the statistics are
/// computed, gamma again in backward, and dgamma | dbeta reduced to it.
/// forward() keeps mean and rstd in buffers.forward.
template <class T>
class SplitLayerNorm : public Layer<T> {
 public:
  SplitLayerNorm(ProcessGrid& grid, Backend& backend, NormLayout layout, std::string name,
                 index_t tokens, index_t hidden, double eps = 1e-5);

  std::string_view name() const override { return name_; }
  void price(cost::Tally& t, model::Phase phase) const override;
  void collect_parameters(std::vector<Param<T>*>& out) override;
  BufferNeeds buffer_needs() const override;
  void forward(ConstMatrixView<T> X, MatrixView<T> Y, StepBuffers& buffers) override;
  void backward(ConstMatrixView<T> dY, MatrixView<T> dX, StepBuffers& buffers,
                bool accumulate = false) override;
  /// The input the next backward reads, as forward(X) keeps it, without the
  /// forward: a pipeline stage that keeps its blocks' activations per
  /// microbatch differentiates one after other microbatches' forwards
  /// (the statistics it kept in buffers.forward put back by the caller).
  void restore_input(ConstMatrixView<T> X);

  index_t tokens() const { return tokens_; }
  index_t hidden() const { return hidden_; }
  index_t local_tokens() const { return tokens_ / layout_.tokens.size; }
  index_t local_hidden() const { return hidden_ / layout_.hidden.size; }
  Param<T>& weight() { return gamma_; }
  Param<T>& bias() { return beta_; }

 private:
  ProcessGrid* grid_;
  Backend* backend_;
  NormLayout layout_;
  std::string name_;
  index_t tokens_, hidden_;
  double eps_;
  /// Whether the parameters travel over the tokens axis (rooted, and split
  /// over more than one rank).
  bool broadcast() const { return layout_.rooted && layout_.tokens.size > 1; }

  Param<T> gamma_, beta_;
  ConstMatrixView<T> x_{};
  acc_t<T>* mean_ = nullptr;  // per-row statistics in acc_t<T> (fp32 for bf16)
  acc_t<T>* rstd_ = nullptr;
};

/// The LayerNorm's cost (bytes and calls per axis, memory traffic) on one
/// rank of `layout`, in the order the code runs it.
namespace norm_cost {
using u64 = std::uint64_t;
void forward(cost::Tally& t, const NormLayout& layout, const cost::Elements& el, u64 tokens,
             u64 hidden);
void backward(cost::Tally& t, const NormLayout& layout, const cost::Elements& el, u64 tokens,
              u64 hidden);
}  // namespace norm_cost

extern template class SplitLayerNorm<float>;
extern template class SplitLayerNorm<double>;
extern template class SplitLayerNorm<bf16>;

}  // namespace summa

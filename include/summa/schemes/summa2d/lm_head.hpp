#pragma once
/// \file lm_head.hpp
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

#include <cstdint>
#include <span>

#include "summa/layers/layer.hpp"
#include "summa/summa/engine.hpp"

namespace summa {

template <class T>
class CrossEntropy2D {
 public:
  /// `normalizer`: the token count the summed loss is divided by (0: tokens).
  /// A data-parallel model passes the global token count, so that the losses
  /// and gradients of its data groups simply add up.
  CrossEntropy2D(SummaEngine& engine, index_t tokens, index_t vocab, index_t normalizer = 0);
  BufferNeeds buffer_needs() const;
  /// Z: local logits [tokens/q, vocab/q]; targets: [tokens] ids, the same on
  /// every rank of the mesh. Returns the summed loss / normalizer (the same
  /// on every rank) and keeps the row statistics in buffers.forward. The
  /// local rows' targets are copied (host to backend memory) for backward.
  double forward(ConstMatrixView<T> Z, std::span<const std::int32_t> targets, StepBuffers& buffers);
  /// In place: Z (the logits given to forward) becomes dL/dZ.
  void backward(MatrixView<T> Z, StepBuffers& buffers);

 private:
  SummaEngine* engine_;
  index_t tokens_, vocab_, normalizer_;
  int q_;
  acc_t<T>* max_ = nullptr;
  acc_t<T>* stats_ = nullptr;  // sum | picked target logit
  BackendIds targets_;         // this mesh row's targets, in backend memory
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

extern template class CrossEntropy2D<float>;
extern template class CrossEntropy2D<double>;
extern template class CrossEntropy2D<bf16>;
extern template class LMHead2D<float>;
extern template class LMHead2D<double>;
extern template class LMHead2D<bf16>;

}  // namespace summa

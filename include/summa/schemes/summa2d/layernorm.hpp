#pragma once
/// \file layernorm.hpp
/// Layer normalisation over the hidden dimension on a q x q mesh (Optimus
/// §3.2.1): y = (x - mean) * rstd * gamma + beta per token.
///
/// Distribution, for X and Y [tokens, hidden]: split into q x q blocks, rank
/// (i, j) holds block (i, j) — tokens over mesh rows, hidden over mesh
/// columns. gamma and beta [hidden] are owned by mesh row 0 exactly like
/// Linear2D's bias: rank (0, j) holds slice j (hidden/q elements), broadcasts
/// it down mesh column j in forward and receives the column-reduced gradients
/// in backward; ranks of rows > 0 hold no parameters.
///
/// forward:  per token, mean = (sum over the full hidden dim) / hidden from
///           local partial sums all-reduced along the mesh row; then (two
///           passes, numerically stable) the all-reduced sum of squared
///           deviations from that mean gives var and rstd = 1/sqrt(var + eps).
///           mean and rstd (tokens/q values each) are saved for backward.
/// backward: with xhat = (x - mean) * rstd and g = dy * gamma, one all-reduce
///           along the mesh row of the 2 * tokens/q partials a = sum g and
///           b = sum g * xhat gives dx = rstd * (g - a/h - xhat * b/h);
///           dgamma = column sums of dy * xhat and dbeta = column sums of dy,
///           reduced along mesh columns to row 0.

#include <string>

#include "summa/layers/layer.hpp"
#include "summa/summa/engine.hpp"

namespace summa {

class LayerNorm2D {
 public:
  /// Global sizes; throws summa::Error (the same on every rank) unless they
  /// are positive and divisible by q.
  LayerNorm2D(SummaEngine& engine, index_t tokens, index_t hidden, double eps = 1e-5);

  SummaEngine& engine() const { return *engine_; }
  index_t tokens() const { return tokens_; }
  index_t hidden() const { return hidden_; }
  double eps() const { return eps_; }
  /// True on the ranks that own a gamma / beta slice (mesh row 0).
  bool owns_parameters() const;
  /// Local block shapes: X, Y, dY and dX [tokens/q, hidden/q]; mean and rstd
  /// tokens/q; gamma, beta and their gradients hidden/q on owners.
  index_t local_tokens() const { return tokens_ / q_; }
  index_t local_hidden() const { return hidden_ / q_; }

  /// Workspace a forward or backward call needs.
  std::size_t workspace_bytes(DType t) const;

  /// Y = LayerNorm(X) * gamma + beta; writes the per-token mean and rstd
  /// (local_tokens() each, never read; acc_t<T>: fp32 for bf16) for backward. `gamma` and `beta`
  /// are read on owners only (may be null elsewhere). Y is never read.
  template <class T>
  void forward(ConstMatrixView<T> X, const T* gamma, const T* beta, MatrixView<T> Y,
               acc_t<T>* mean_out, acc_t<T>* rstd_out, Workspace& ws);

  /// dX from dY and the saved mean / rstd (dX never read); dgamma and dbeta
  /// (+)= their column-reduced gradients on owners (may be null elsewhere).
  /// With `accumulate` the parameter gradients are added to, otherwise
  /// overwritten (never read). `gamma` is read on owners only.
  template <class T>
  void backward(ConstMatrixView<T> X, ConstMatrixView<T> dY, const T* gamma, const acc_t<T>* mean,
                const acc_t<T>* rstd, MatrixView<T> dX, T* dgamma, T* dbeta, Workspace& ws,
                bool accumulate = false);

 private:
  SummaEngine* engine_;
  index_t tokens_, hidden_;
  double eps_;
  int q_;
};

/// LayerNorm2D as a Layer with its parameters `<name>.weight` (gamma) and
/// `<name>.bias` (beta), [hidden] each, owned by mesh row 0. forward() keeps
/// the per-token mean and rstd (2 * tokens/q values) in buffers.forward.
template <class T>
class LayerNorm2DLayer final : public Layer<T> {
 public:
  LayerNorm2DLayer(SummaEngine& engine, std::string name, index_t tokens, index_t hidden,
                   double eps = 1e-5);

  std::string_view name() const override { return name_; }
  void collect_parameters(std::vector<Param<T>*>& out) override;
  BufferNeeds buffer_needs() const override;
  void price(cost::Tally& t, model::Phase phase) const override;
  void forward(ConstMatrixView<T> X, MatrixView<T> Y, StepBuffers& buffers) override;
  void backward(ConstMatrixView<T> dY, MatrixView<T> dX, StepBuffers& buffers,
                bool accumulate = false) override;

  const LayerNorm2D& op() const { return op_; }
  Param<T>& weight() { return gamma_; }
  Param<T>& bias() { return beta_; }

 private:
  LayerNorm2D op_;
  std::string name_;
  Param<T> gamma_, beta_;
  ConstMatrixView<T> x_{};
  acc_t<T>* mean_ = nullptr;
  acc_t<T>* rstd_ = nullptr;
};

extern template class LayerNorm2DLayer<float>;
extern template class LayerNorm2DLayer<double>;
extern template class LayerNorm2DLayer<bf16>;

}  // namespace summa

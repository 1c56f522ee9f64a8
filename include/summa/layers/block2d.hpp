#pragma once
/// \file block2d.hpp
/// One pre-LayerNorm GPT-2 block on a q x q mesh:
///   mid = X + Attn(LN1(X));  Y = mid + MLP(LN2(mid)).
/// Every activation is a [tokens/q, h/q] (or 3h/q, 4h/q) local block; the
/// block keeps ln_1, mid, ln_2 and its sublayers' saved activations in
/// buffers.forward, and takes dmid plus one [tokens/q, h/q] from
/// buffers.backward (on top of its sublayers' needs).

#include <string>

#include "summa/layers/attention2d.hpp"
#include "summa/layers/layernorm2d.hpp"
#include "summa/layers/mlp2d.hpp"

namespace summa {

template <class T>
class TransformerBlock2D final : public Layer<T> {
 public:
  /// `name` is the parameter prefix, e.g. "h.3".
  TransformerBlock2D(SummaEngine& engine, std::string name, index_t batch, index_t seq,
                     index_t hidden, index_t heads, double eps = 1e-5);

  std::string_view name() const override { return name_; }
  void collect_parameters(std::vector<Param<T>*>& out) override;
  BufferNeeds buffer_needs() const override;
  void forward(ConstMatrixView<T> X, MatrixView<T> Y, StepBuffers& buffers) override;
  void backward(ConstMatrixView<T> dY, MatrixView<T> dX, StepBuffers& buffers,
                bool accumulate = false) override;

  LayerNorm2DLayer<T>& ln_1() { return ln_1_; }
  Attention2D<T>& attn() { return attn_; }
  LayerNorm2DLayer<T>& ln_2() { return ln_2_; }
  MLP2D<T>& mlp() { return mlp_; }

 private:
  SummaEngine* engine_;
  std::string name_;
  index_t tokens_, hidden_;
  int q_;
  LayerNorm2DLayer<T> ln_1_;
  Attention2D<T> attn_;
  LayerNorm2DLayer<T> ln_2_;
  MLP2D<T> mlp_;
  MatrixView<T> ln1_{}, mid_{}, ln2_{};
  ConstMatrixView<T> x_{};
};

extern template class TransformerBlock2D<float>;
extern template class TransformerBlock2D<double>;
extern template class TransformerBlock2D<bf16>;

}  // namespace summa

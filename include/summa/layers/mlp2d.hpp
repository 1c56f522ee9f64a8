#pragma once
/// \file mlp2d.hpp
/// GPT-2 MLP on a q x q mesh: Y = gelu(X c_fc + b) c_proj + b with c_fc
/// h -> 4h and c_proj 4h -> h, both Linear2DLayer (SUMMA), GeLU local.
/// forward() keeps the pre- and post-GeLU activations [tokens/q, 4h/q] in
/// buffers.forward; backward() takes one [tokens/q, 4h/q] from
/// buffers.backward.

#include <string>

#include "summa/layers/gelu2d.hpp"
#include "summa/layers/linear2d.hpp"

namespace summa {

template <class T>
class MLP2D final : public Layer<T> {
 public:
  /// `name` is the parameter prefix, e.g. "h.0.mlp".
  MLP2D(SummaEngine& engine, std::string name, index_t tokens, index_t hidden);

  std::string_view name() const override { return name_; }
  void collect_parameters(std::vector<Param<T>*>& out) override;
  BufferNeeds buffer_needs() const override;
  void forward(ConstMatrixView<T> X, MatrixView<T> Y, StepBuffers& buffers) override;
  void backward(ConstMatrixView<T> dY, MatrixView<T> dX, StepBuffers& buffers,
                bool accumulate = false) override;

  Linear2DLayer<T>& c_fc() { return c_fc_; }
  Linear2DLayer<T>& c_proj() { return c_proj_; }

 private:
  std::string name_;
  index_t tokens_, hidden_;
  int q_;
  Linear2DLayer<T> c_fc_, c_proj_;
  GeLU2D<T> gelu_;
  MatrixView<T> fc_{}, act_{};
};

extern template class MLP2D<float>;
extern template class MLP2D<double>;
extern template class MLP2D<bf16>;

}  // namespace summa

#pragma once
/// \file gelu.hpp
/// GeLU (tanh form, as GPT-2) on local blocks: elementwise, so any
/// distribution works and nothing is communicated. forward() keeps a view of
/// X (the caller keeps X alive); backward() computes dX = dY * gelu'(X).

#include "summa/layers/layer.hpp"
#include "summa/summa/engine.hpp"

namespace summa {

template <class T>
class GeLU final : public Layer<T> {
 public:
  /// `rows` x `cols`: the local block it runs on, for price() (0: not
  /// given; price() then throws).
  explicit GeLU(Backend& backend, index_t rows = 0, index_t cols = 0)
      : backend_(&backend), rows_(rows), cols_(cols) {}
  std::string_view name() const override { return "gelu"; }
  void collect_parameters(std::vector<Param<T>*>&) override {}
  BufferNeeds buffer_needs() const override { return {}; }
  void price(cost::Tally& t, model::Phase phase) const override;
  void forward(ConstMatrixView<T> X, MatrixView<T> Y, StepBuffers& buffers) override;
  void backward(ConstMatrixView<T> dY, MatrixView<T> dX, StepBuffers& buffers,
                bool accumulate = false) override;

 private:
  Backend* backend_;
  index_t rows_, cols_;
  ConstMatrixView<T> x_{};
};

extern template class GeLU<float>;
extern template class GeLU<double>;
extern template class GeLU<bf16>;

}  // namespace summa

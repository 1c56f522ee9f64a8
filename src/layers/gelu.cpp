#include <fmt/format.h>

#include "summa/layers/gelu.hpp"

#include "summa/model/cost.hpp"

namespace summa {

template <class T>
void GeLU<T>::forward(ConstMatrixView<T> X, MatrixView<T> Y, StepBuffers&) {
  backend_->gelu_forward(X, Y);
  x_ = X;
}

template <class T>
void GeLU<T>::backward(ConstMatrixView<T> dY, MatrixView<T> dX, StepBuffers&, bool) {
  require(x_.data != nullptr, "GeLU: backward without forward");
  backend_->gelu_backward(x_, dY, dX);
}

// Cost: one pointwise pass, reading X (and dY) and writing the result.
template <class T>
void GeLU<T>::price(cost::Tally& t, model::Phase phase) const {
  if (rows_ * cols_ == 0) Layer<T>::price(t, phase);  // no shape given: throws
  const auto n = static_cast<cost::u64>(rows_ * cols_);
  const bool backward = phase == model::Phase::backward;
  t.pointwise(backward ? model::Pointwise::gelu_grad : model::Pointwise::gelu, n,
              (backward ? 3 : 2) * n * sizeof(T));
}

template class GeLU<float>;
template class GeLU<double>;
template class GeLU<bf16>;

}  // namespace summa

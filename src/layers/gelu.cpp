#include <fmt/format.h>

#include "summa/layers/gelu.hpp"

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

template class GeLU<float>;
template class GeLU<double>;
template class GeLU<bf16>;

}  // namespace summa

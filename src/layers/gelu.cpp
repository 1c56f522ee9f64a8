#include <fmt/format.h>

#include "summa/layers/gelu2d.hpp"

namespace summa {

template <class T>
void GeLU2D<T>::forward(ConstMatrixView<T> X, MatrixView<T> Y, StepBuffers&) {
  backend_->gelu_forward(X, Y);
  x_ = X;
}

template <class T>
void GeLU2D<T>::backward(ConstMatrixView<T> dY, MatrixView<T> dX, StepBuffers&, bool) {
  require(x_.data != nullptr, "GeLU2D: backward without forward");
  backend_->gelu_backward(x_, dY, dX);
}

template class GeLU2D<float>;
template class GeLU2D<double>;
template class GeLU2D<bf16>;

}  // namespace summa

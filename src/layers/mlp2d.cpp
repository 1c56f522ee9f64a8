#include "summa/layers/mlp2d.hpp"

#include <fmt/format.h>

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

template <class T>
MLP2D<T>::MLP2D(SummaEngine& engine, std::string name, index_t tokens, index_t hidden)
    : name_(std::move(name)),
      tokens_(tokens),
      hidden_(hidden),
      q_(engine.q()),
      c_fc_(engine, name_ + ".c_fc", tokens, hidden, 4 * hidden),
      c_proj_(engine, name_ + ".c_proj", tokens, 4 * hidden, hidden),
      gelu_(engine.backend()) {}

template <class T>
void MLP2D<T>::collect_parameters(std::vector<Param<T>*>& out) {
  c_fc_.collect_parameters(out);
  c_proj_.collect_parameters(out);
}

template <class T>
BufferNeeds MLP2D<T>::buffer_needs() const {
  const index_t n = (tokens_ / q_) * (4 * hidden_ / q_);
  ByteCount<T> fwd, bwd;
  fwd.add(n).add(n);
  bwd.add(n);
  BufferNeeds needs{.workspace = 0, .forward = fwd, .backward = bwd};
  needs.workspace = std::max(c_fc_.buffer_needs().workspace, c_proj_.buffer_needs().workspace);
  return needs;
}

template <class T>
void MLP2D<T>::forward(ConstMatrixView<T> X, MatrixView<T> Y, StepBuffers& buffers) {
  const index_t nt = tokens_ / q_, nf = 4 * hidden_ / q_;
  const auto count = static_cast<std::size_t>(nt * nf);
  fc_ = MatrixView<T>::dense(buffers.forward.take<T>(count), nt, nf, Order::row_major);
  act_ = MatrixView<T>::dense(buffers.forward.take<T>(count), nt, nf, Order::row_major);
  c_fc_.forward(X, fc_, buffers);
  gelu_.forward(fc_, act_, buffers);
  c_proj_.forward(act_, Y, buffers);
}

template <class T>
void MLP2D<T>::backward(ConstMatrixView<T> dY, MatrixView<T> dX, StepBuffers& buffers,
                        bool accumulate) {
  require(fc_.data != nullptr,
          [&] { return fmt::format("MLP2D '{}': backward without forward", name_); });
  const index_t nt = tokens_ / q_, nf = 4 * hidden_ / q_;
  ArenaScope scope(buffers.backward);
  const auto d4h = MatrixView<T>::dense(buffers.backward.take<T>(static_cast<std::size_t>(nt * nf)),
                                        nt, nf, Order::row_major);
  c_proj_.backward(dY, d4h, buffers, accumulate);
  gelu_.backward(d4h, d4h, buffers);  // in place: dgelu -> dfc
  c_fc_.backward(d4h, dX, buffers, accumulate);
}

template class GeLU2D<float>;
template class GeLU2D<double>;
template class GeLU2D<bf16>;
template class MLP2D<float>;
template class MLP2D<double>;
template class MLP2D<bf16>;

}  // namespace summa

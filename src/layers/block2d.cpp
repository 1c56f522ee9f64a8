#include "summa/layers/block2d.hpp"

#include <fmt/format.h>

namespace summa {

template <class T>
TransformerBlock2D<T>::TransformerBlock2D(SummaEngine& engine, std::string name, index_t batch,
                                          index_t seq, index_t hidden, index_t heads, double eps)
    : engine_(&engine),
      name_(std::move(name)),
      tokens_(batch * seq),
      hidden_(hidden),
      q_(engine.q()),
      ln_1_(engine, name_ + ".ln_1", batch * seq, hidden, eps),
      attn_(engine, name_ + ".attn", batch, seq, hidden, heads),
      ln_2_(engine, name_ + ".ln_2", batch * seq, hidden, eps),
      mlp_(engine, name_ + ".mlp", batch * seq, hidden) {}

template <class T>
void TransformerBlock2D<T>::collect_parameters(std::vector<Param<T>*>& out) {
  ln_1_.collect_parameters(out);
  attn_.collect_parameters(out);
  ln_2_.collect_parameters(out);
  mlp_.collect_parameters(out);
}

template <class T>
BufferNeeds TransformerBlock2D<T>::buffer_needs() const {
  const index_t n = (tokens_ / q_) * (hidden_ / q_);
  BufferNeeds needs;
  ByteCount<T> own_fwd;
  own_fwd.add(n).add(n).add(n);  // ln1, mid, ln2
  needs.forward = own_fwd;
  for (const BufferNeeds& sub :
       {ln_1_.buffer_needs(), attn_.buffer_needs(), ln_2_.buffer_needs(), mlp_.buffer_needs()})
    needs.then(sub);
  // backward: dmid and one [tokens/q, h/q] held while a sublayer runs.
  ByteCount<T> held;
  held.add(n).add(n);
  needs.backward += held;
  return needs;
}

template <class T>
void TransformerBlock2D<T>::forward(ConstMatrixView<T> X, MatrixView<T> Y, StepBuffers& buffers) {
  const index_t nt = tokens_ / q_, nh = hidden_ / q_;
  const auto count = static_cast<std::size_t>(nt * nh);
  Backend& be = engine_->backend();
  const auto take = [&] {
    return MatrixView<T>::dense(buffers.forward.take<T>(count), nt, nh, Order::row_major);
  };
  ln1_ = take();
  mid_ = take();
  ln2_ = take();
  ln_1_.forward(X, ln1_, buffers);
  attn_.forward(ln1_, mid_, buffers);
  be.axpby(acc_t<T>(1), X, acc_t<T>(1), mid_);  // mid = X + Attn(LN1(X))
  ln_2_.forward(mid_, ln2_, buffers);
  mlp_.forward(ln2_, Y, buffers);
  be.axpby(acc_t<T>(1), ConstMatrixView<T>(mid_), acc_t<T>(1), Y);  // Y = mid + MLP(LN2(mid))
  x_ = X;
}

template <class T>
void TransformerBlock2D<T>::backward(ConstMatrixView<T> dY, MatrixView<T> dX, StepBuffers& buffers,
                                     bool accumulate) {
  require(mid_.data != nullptr,
          [&] { return fmt::format("TransformerBlock2D '{}': backward without forward", name_); });
  const index_t nt = tokens_ / q_, nh = hidden_ / q_;
  const auto count = static_cast<std::size_t>(nt * nh);
  Backend& be = engine_->backend();
  Arena& bwd = buffers.backward;
  ArenaScope scope(bwd);
  const auto dmid = MatrixView<T>::dense(bwd.take<T>(count), nt, nh, Order::row_major);
  const auto dtmp = MatrixView<T>::dense(bwd.take<T>(count), nt, nh, Order::row_major);
  // MLP half: dmid = dY + LN2ᵀ(MLPᵀ(dY))
  mlp_.backward(dY, dtmp, buffers, accumulate);
  ln_2_.backward(dtmp, dmid, buffers, accumulate);
  be.axpby(acc_t<T>(1), dY, acc_t<T>(1), dmid);
  // attention half: dX = dmid + LN1ᵀ(Attnᵀ(dmid))
  attn_.backward(dmid, dtmp, buffers, accumulate);
  ln_1_.backward(dtmp, dX, buffers, accumulate);
  be.axpby(acc_t<T>(1), ConstMatrixView<T>(dmid), acc_t<T>(1), dX);
}

template class TransformerBlock2D<float>;
template class TransformerBlock2D<double>;
template class TransformerBlock2D<bf16>;

}  // namespace summa

// The 3D (AxoNN) attention, MLP and transformer block.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>

#include "attention_core.hpp"
#include "axonn3d_detail.hpp"
#include "summa/layers/axonn3d.hpp"

namespace summa {

using detail3d::take_scratch;

// ---------------------------------------------------------------- attention

namespace {

ProcessGrid& checked_attention(ProcessGrid& grid, const std::string& name, index_t batch,
                               index_t seq, index_t hidden, index_t heads) {
  const int gx = detail3d::gx(grid), gz = detail3d::gz(grid);
  std::optional<std::string> error;
  if (batch <= 0 || seq <= 0 || hidden <= 0 || heads <= 0)
    error = fmt::format("Attention3D '{}': batch={}, seq={}, hidden={}, heads={} must be positive",
                        name, batch, seq, hidden, heads);
  else if (hidden % heads != 0)
    error = fmt::format("Attention3D '{}': hidden={} must be divisible by heads={}", name, hidden,
                        heads);
  else if (heads % gx != 0)
    error =
        fmt::format("Attention3D '{}': heads={} must be divisible by Gx={} (whole heads per rank)",
                    name, heads, gx);
  else if (batch % gz != 0)
    error = fmt::format(
        "Attention3D '{}': batch={} must be divisible by Gz={} (whole sequences per rank)", name,
        batch, gz);
  detail3d::agree(grid, error);
  return grid;
}

}  // namespace

template <class T>
Attention3D<T>::Attention3D(ProcessGrid& grid, Backend& backend, std::string name, index_t batch,
                            index_t seq, index_t hidden, index_t heads, Axonn3DOptions options,
                            Overlap3D<T>* overlap)
    : backend_((checked_attention(grid, name, batch, seq, hidden, heads), &backend)),
      name_(std::move(name)),
      batch_(batch),
      seq_(seq),
      hidden_(hidden),
      heads_(heads),
      gx_(detail3d::gx(grid)),
      gz_(detail3d::gz(grid)),
      c_attn_(grid, backend, name_ + ".c_attn", batch * seq, hidden, 3 * hidden,
              Orientation3D::normal, true, 3, options, overlap),
      c_proj_(grid, backend, name_ + ".c_proj", batch * seq, hidden, hidden,
              Orientation3D::transposed, true, 1, options, overlap) {}

template <class T>
void Attention3D<T>::collect_parameters(std::vector<Param<T>*>& out) {
  c_attn_.collect_parameters(out);
  c_proj_.collect_parameters(out);
}

template <class T>
detail::LocalAttention Attention3D<T>::local() const {
  return {.seqs = batch_ / gz_, .seq = seq_, .heads = heads_ / gx_, .head_dim = hidden_ / heads_};
}

template <class T>
std::size_t Attention3D<T>::gemm_scratch() const {
  return local().scratch_bytes(*backend_, dtype_v<T>);
}

template <class T>
BufferNeeds Attention3D<T>::buffer_needs() const {
  const detail::LocalAttention a = local();
  const index_t nt = a.tokens(), w = a.width();
  ByteCount<T> fwd, bwd, ws;
  fwd.add(nt * 3 * w).add(a.probs_elems()).add(nt * w);   // qkv, probs, context
  bwd.add(nt * w).add(nt * 3 * w).add(a.dprobs_elems());  // dcontext, dqkv, dP
  ws.add_bytes(gemm_scratch());
  return {.workspace = std::max(
              {ws.bytes(), c_attn_.buffer_needs().workspace, c_proj_.buffer_needs().workspace}),
          .forward = fwd,
          .backward = bwd};
}

template <class T>
void Attention3D<T>::forward(ConstMatrixView<T> X, MatrixView<T> Y, StepBuffers& buffers) {
  const detail::LocalAttention a = local();
  const index_t nt = a.tokens(), w = a.width();
  Arena& fwd = buffers.forward;
  qkv_ = MatrixView<T>::dense(fwd.take<T>(static_cast<std::size_t>(nt * 3 * w)), nt, 3 * w,
                              Order::row_major);
  c_attn_.forward(X, qkv_, buffers);
  probs_ = fwd.take<T>(static_cast<std::size_t>(a.probs_elems()));
  ctx_ =
      MatrixView<T>::dense(fwd.take<T>(static_cast<std::size_t>(nt * w)), nt, w, Order::row_major);
  {
    ArenaScope scope(buffers.workspace);
    a.forward<T>(*backend_, qkv_, probs_, ctx_, take_scratch(buffers.workspace, gemm_scratch()));
  }
  c_proj_.forward(ctx_, Y, buffers);
}

template <class T>
void Attention3D<T>::backward(ConstMatrixView<T> dY, MatrixView<T> dX, StepBuffers& buffers,
                              bool accumulate) {
  require(probs_ != nullptr,
          [&] { return fmt::format("Attention3D '{}': backward without forward", name_); });
  const detail::LocalAttention a = local();
  const index_t nt = a.tokens(), w = a.width();
  Arena& bwd = buffers.backward;
  ArenaScope scope(bwd);
  const auto dctx =
      MatrixView<T>::dense(bwd.take<T>(static_cast<std::size_t>(nt * w)), nt, w, Order::row_major);
  c_proj_.backward(dY, dctx, buffers, accumulate);
  const auto dqkv = MatrixView<T>::dense(bwd.take<T>(static_cast<std::size_t>(nt * 3 * w)), nt,
                                         3 * w, Order::row_major);
  T* const dP = bwd.take<T>(static_cast<std::size_t>(a.dprobs_elems()));
  {
    ArenaScope ws_scope(buffers.workspace);
    a.backward<T>(*backend_, qkv_, probs_, dctx, dqkv, dP,
                  take_scratch(buffers.workspace, gemm_scratch()));
  }
  c_attn_.backward(dqkv, dX, buffers, accumulate);
}

// ---------------------------------------------------------------- MLP

template <class T>
MLP3D<T>::MLP3D(ProcessGrid& grid, Backend& backend, std::string name, index_t tokens,
                index_t hidden, Axonn3DOptions options, Overlap3D<T>* overlap)
    : name_(std::move(name)),
      c_fc_(grid, backend, name_ + ".c_fc", tokens, hidden, 4 * hidden, Orientation3D::normal, true,
            1, options, overlap),
      c_proj_(grid, backend, name_ + ".c_proj", tokens, 4 * hidden, hidden,
              Orientation3D::transposed, true, 1, options, overlap),
      gelu_(backend) {}

template <class T>
void MLP3D<T>::collect_parameters(std::vector<Param<T>*>& out) {
  c_fc_.collect_parameters(out);
  c_proj_.collect_parameters(out);
}

template <class T>
BufferNeeds MLP3D<T>::buffer_needs() const {
  const index_t n = c_fc_.local_tokens() * c_fc_.local_out();
  ByteCount<T> fwd, bwd;
  fwd.add(n).add(n);  // pre- and post-GeLU
  bwd.add(n);
  return {.workspace = std::max(c_fc_.buffer_needs().workspace, c_proj_.buffer_needs().workspace),
          .forward = fwd,
          .backward = bwd};
}

template <class T>
void MLP3D<T>::forward(ConstMatrixView<T> X, MatrixView<T> Y, StepBuffers& buffers) {
  const index_t m = c_fc_.local_tokens(), nf = c_fc_.local_out();
  const auto count = static_cast<std::size_t>(m * nf);
  fc_ = MatrixView<T>::dense(buffers.forward.take<T>(count), m, nf, Order::row_major);
  act_ = MatrixView<T>::dense(buffers.forward.take<T>(count), m, nf, Order::row_major);
  c_fc_.forward(X, fc_, buffers);
  gelu_.forward(fc_, act_, buffers);
  c_proj_.forward(act_, Y, buffers);
}

template <class T>
void MLP3D<T>::backward(ConstMatrixView<T> dY, MatrixView<T> dX, StepBuffers& buffers,
                        bool accumulate) {
  require(fc_.data != nullptr,
          [&] { return fmt::format("MLP3D '{}': backward without forward", name_); });
  const index_t m = c_fc_.local_tokens(), nf = c_fc_.local_out();
  ArenaScope scope(buffers.backward);
  const auto d4h = MatrixView<T>::dense(buffers.backward.take<T>(static_cast<std::size_t>(m * nf)),
                                        m, nf, Order::row_major);
  c_proj_.backward(dY, d4h, buffers, accumulate);
  gelu_.backward(d4h, d4h, buffers);  // in place: dgelu -> dfc
  c_fc_.backward(d4h, dX, buffers, accumulate);
}

// ---------------------------------------------------------------- block

template <class T>
TransformerBlock3D<T>::TransformerBlock3D(ProcessGrid& grid, Backend& backend, std::string name,
                                          index_t batch, index_t seq, index_t hidden, index_t heads,
                                          double eps, Axonn3DOptions options, Overlap3D<T>* overlap)
    : backend_(&backend),
      name_(std::move(name)),
      rows_(0),
      cols_(0),
      ln_1_(grid, backend, name_ + ".ln_1", batch * seq, hidden, eps),
      attn_(grid, backend, name_ + ".attn", batch, seq, hidden, heads, options, overlap),
      ln_2_(grid, backend, name_ + ".ln_2", batch * seq, hidden, eps),
      mlp_(grid, backend, name_ + ".mlp", batch * seq, hidden, options, overlap) {
  rows_ = ln_1_.local_tokens();
  cols_ = ln_1_.local_hidden();
}

template <class T>
void TransformerBlock3D<T>::collect_parameters(std::vector<Param<T>*>& out) {
  ln_1_.collect_parameters(out);
  attn_.collect_parameters(out);
  ln_2_.collect_parameters(out);
  mlp_.collect_parameters(out);
}

template <class T>
BufferNeeds TransformerBlock3D<T>::buffer_needs() const {
  const index_t n = rows_ * cols_;
  BufferNeeds needs;
  ByteCount<T> own_fwd;
  own_fwd.add(n).add(n).add(n);  // ln1, mid, ln2
  needs.forward = own_fwd;
  for (const BufferNeeds& sub :
       {ln_1_.buffer_needs(), attn_.buffer_needs(), ln_2_.buffer_needs(), mlp_.buffer_needs()})
    needs.then(sub);
  ByteCount<T> held;  // dmid and one block held while a sublayer runs backward
  held.add(n).add(n);
  needs.backward += held;
  return needs;
}

template <class T>
void TransformerBlock3D<T>::forward(ConstMatrixView<T> X, MatrixView<T> Y, StepBuffers& buffers) {
  const auto count = static_cast<std::size_t>(rows_ * cols_);
  Backend& be = *backend_;
  const auto take = [&] {
    return MatrixView<T>::dense(buffers.forward.take<T>(count), rows_, cols_, Order::row_major);
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
}

template <class T>
void TransformerBlock3D<T>::backward(ConstMatrixView<T> dY, MatrixView<T> dX, StepBuffers& buffers,
                                     bool accumulate) {
  require(mid_.data != nullptr,
          [&] { return fmt::format("TransformerBlock3D '{}': backward without forward", name_); });
  const auto count = static_cast<std::size_t>(rows_ * cols_);
  Backend& be = *backend_;
  Arena& bwd = buffers.backward;
  ArenaScope scope(bwd);
  const auto dmid = MatrixView<T>::dense(bwd.take<T>(count), rows_, cols_, Order::row_major);
  const auto dtmp = MatrixView<T>::dense(bwd.take<T>(count), rows_, cols_, Order::row_major);
  mlp_.backward(dY, dtmp, buffers, accumulate);
  ln_2_.backward(dtmp, dmid, buffers, accumulate);
  be.axpby(acc_t<T>(1), dY, acc_t<T>(1), dmid);
  attn_.backward(dmid, dtmp, buffers, accumulate);
  ln_1_.backward(dtmp, dX, buffers, accumulate);
  be.axpby(acc_t<T>(1), ConstMatrixView<T>(dmid), acc_t<T>(1), dX);
}

template class Attention3D<float>;
template class Attention3D<double>;
template class Attention3D<bf16>;
template class MLP3D<float>;
template class MLP3D<double>;
template class MLP3D<bf16>;
template class TransformerBlock3D<float>;
template class TransformerBlock3D<double>;
template class TransformerBlock3D<bf16>;

}  // namespace summa

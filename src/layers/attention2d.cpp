#include "summa/layers/attention2d.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "attention_core.hpp"

namespace summa {

namespace {

SummaEngine& checked(SummaEngine& engine, const std::string& name, index_t batch, index_t seq,
                     index_t hidden, index_t heads) {
  const int q = engine.q();
  std::optional<std::string> error;
  if (batch <= 0 || seq <= 0 || hidden <= 0 || heads <= 0)
    error = fmt::format("Attention2D '{}': batch={}, seq={}, hidden={}, heads={} must be positive",
                        name, batch, seq, hidden, heads);
  else if (batch % q != 0)
    error = fmt::format(
        "Attention2D '{}': batch={} must be divisible by q={} (whole sequences per mesh row)", name,
        batch, q);
  else if (hidden % heads != 0)
    error = fmt::format("Attention2D '{}': hidden={} must be divisible by heads={}", name, hidden,
                        heads);
  else if (heads % q != 0)
    error = fmt::format(
        "Attention2D '{}': heads={} must be divisible by q={} (whole heads per mesh column)", name,
        heads, q);
  engine.grid().agree(CommAxis::mesh, error);
  return engine;
}

}  // namespace

template <class T>
Attention2D<T>::Attention2D(SummaEngine& engine, std::string name, index_t batch, index_t seq,
                            index_t hidden, index_t heads)
    : engine_(&checked(engine, name, batch, seq, hidden, heads)),
      name_(std::move(name)),
      batch_(batch),
      seq_(seq),
      hidden_(hidden),
      heads_(heads),
      q_(engine.q()),
      c_attn_(engine, name_ + ".c_attn", batch * seq, hidden, 3 * hidden, true, 3),
      c_proj_(engine, name_ + ".c_proj", batch * seq, hidden, hidden) {}

template <class T>
void Attention2D<T>::collect_parameters(std::vector<Param<T>*>& out) {
  c_attn_.collect_parameters(out);
  c_proj_.collect_parameters(out);
}

template <class T>
detail::LocalAttention Attention2D<T>::local() const {
  return {.seqs = batch_ / q_, .seq = seq_, .heads = heads_ / q_, .head_dim = hidden_ / heads_};
}

template <class T>
std::size_t Attention2D<T>::gemm_scratch() const {
  return local().scratch_bytes(engine_->backend(), dtype_v<T>);
}

template <class T>
BufferNeeds Attention2D<T>::buffer_needs() const {
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
void Attention2D<T>::forward(ConstMatrixView<T> X, MatrixView<T> Y, StepBuffers& buffers) {
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
    a.forward<T>(engine_->backend(), qkv_, probs_, ctx_,
                 Scratch{buffers.workspace.take_bytes(gemm_scratch()), gemm_scratch()});
  }
  c_proj_.forward(ctx_, Y, buffers);
}

template <class T>
void Attention2D<T>::backward(ConstMatrixView<T> dY, MatrixView<T> dX, StepBuffers& buffers,
                              bool accumulate) {
  require(probs_ != nullptr,
          [&] { return fmt::format("Attention2D '{}': backward without forward", name_); });
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
    a.backward<T>(engine_->backend(), qkv_, probs_, dctx, dqkv, dP,
                  Scratch{buffers.workspace.take_bytes(gemm_scratch()), gemm_scratch()});
  }
  c_attn_.backward(dqkv, dX, buffers, accumulate);
}

template class Attention2D<float>;
template class Attention2D<double>;
template class Attention2D<bf16>;

}  // namespace summa

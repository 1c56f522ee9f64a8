#include "summa/layers/attention2d.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

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
std::size_t Attention2D<T>::gemm_scratch() const {
  const index_t s = seq_, d = hidden_ / heads_;
  const Backend& be = engine_->backend();
  return std::max(be.gemm_scratch_bytes(s, s, d, dtype_v<T>),
                  be.gemm_scratch_bytes(s, d, s, dtype_v<T>));
}

template <class T>
BufferNeeds Attention2D<T>::buffer_needs() const {
  const index_t nt = batch_ * seq_ / q_, hq = hidden_ / q_;
  const index_t pairs = (batch_ / q_) * (heads_ / q_);
  ByteCount<T> fwd, bwd, ws;
  fwd.add(nt * 3 * hq).add(pairs * seq_ * seq_).add(nt * hq);
  bwd.add(nt * hq).add(nt * 3 * hq).add((heads_ / q_) * seq_ * seq_);
  ws.add_bytes(gemm_scratch());
  BufferNeeds n{.workspace = std::max({ws.bytes(), c_attn_.buffer_needs().workspace,
                                       c_proj_.buffer_needs().workspace}),
                .forward = fwd,
                .backward = bwd};
  return n;
}

template <class T>
void Attention2D<T>::forward(ConstMatrixView<T> X, MatrixView<T> Y, StepBuffers& buffers) {
  const index_t s = seq_, d = hidden_ / heads_, hq = hidden_ / q_;
  const index_t nt = batch_ * seq_ / q_, lb = batch_ / q_, lh = heads_ / q_;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  Backend& be = engine_->backend();
  Arena& fwd = buffers.forward;
  qkv_ = MatrixView<T>::dense(fwd.take<T>(static_cast<std::size_t>(nt * 3 * hq)), nt, 3 * hq,
                              Order::row_major);
  c_attn_.forward(X, qkv_, buffers);
  probs_ = fwd.take<T>(static_cast<std::size_t>(lb * lh * s * s));
  ctx_ = MatrixView<T>::dense(fwd.take<T>(static_cast<std::size_t>(nt * hq)), nt, hq,
                              Order::row_major);
  {
    ArenaScope scope(buffers.workspace);
    const Scratch scratch{buffers.workspace.take_bytes(gemm_scratch()), gemm_scratch()};
    // Per sequence b, the lh local heads in one strided batch: Q/K/V/context
    // blocks of consecutive heads are d columns apart, probabilities s*s.
    for (index_t b = 0; b < lb; ++b) {
      const auto Q = qkv_.block(b * s, 0, s, d);
      const auto K = qkv_.block(b * s, hq, s, d);
      const auto V = qkv_.block(b * s, 2 * hq, s, d);
      T* const Pb = probs_ + b * lh * s * s;
      const auto P = MatrixView<T>::dense(Pb, s, s, Order::row_major);
      be.gemm_strided_batched(Op::N, Op::T, T(1), Q, d, K, d, T(0), P, s * s, lh, scratch);
      for (index_t k = 0; k < lh; ++k) {
        const auto Pk = MatrixView<T>::dense(Pb + k * s * s, s, s, Order::row_major);
        be.softmax_causal(Pk, scale, Pk);
      }
      be.gemm_strided_batched(Op::N, Op::N, T(1), P, s * s, V, d, T(0), ctx_.block(b * s, 0, s, d),
                              d, lh, scratch);
    }
  }
  c_proj_.forward(ctx_, Y, buffers);
}

template <class T>
void Attention2D<T>::backward(ConstMatrixView<T> dY, MatrixView<T> dX, StepBuffers& buffers,
                              bool accumulate) {
  require(probs_ != nullptr,
          [&] { return fmt::format("Attention2D '{}': backward without forward", name_); });
  const index_t s = seq_, d = hidden_ / heads_, hq = hidden_ / q_;
  const index_t nt = batch_ * seq_ / q_, lb = batch_ / q_, lh = heads_ / q_;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  Backend& be = engine_->backend();
  Arena& bwd = buffers.backward;
  ArenaScope scope(bwd);
  const auto dctx = MatrixView<T>::dense(bwd.take<T>(static_cast<std::size_t>(nt * hq)), nt, hq,
                                         Order::row_major);
  c_proj_.backward(dY, dctx, buffers, accumulate);
  const auto dqkv = MatrixView<T>::dense(bwd.take<T>(static_cast<std::size_t>(nt * 3 * hq)), nt,
                                         3 * hq, Order::row_major);
  const auto dP = MatrixView<T>::dense(bwd.take<T>(static_cast<std::size_t>(lh * s * s)), s, s,
                                       Order::row_major);  // lh heads, s*s apart
  {
    ArenaScope ws_scope(buffers.workspace);
    const Scratch scratch{buffers.workspace.take_bytes(gemm_scratch()), gemm_scratch()};
    // Batched over the lh local heads of sequence b, as in forward().
    for (index_t b = 0; b < lb; ++b) {
      const auto Q = qkv_.block(b * s, 0, s, d);
      const auto K = qkv_.block(b * s, hq, s, d);
      const auto V = qkv_.block(b * s, 2 * hq, s, d);
      const auto dC = dctx.block(b * s, 0, s, d);
      T* const Pb = probs_ + b * lh * s * s;
      const auto P = MatrixView<T>::dense(Pb, s, s, Order::row_major);
      const index_t ss = s * s;
      be.gemm_strided_batched(Op::N, Op::T, T(1), dC, d, V, d, T(0), dP, ss, lh,
                              scratch);  // dP = dC Vᵀ
      be.gemm_strided_batched(Op::T, Op::N, T(1), P, ss, dC, d, T(0),
                              dqkv.block(b * s, 2 * hq, s, d), d, lh, scratch);  // dV = Pᵀ dC
      for (index_t k = 0; k < lh; ++k) {
        const auto Pk = MatrixView<T>::dense(Pb + k * ss, s, s, Order::row_major);
        const auto dPk = MatrixView<T>::dense(dP.data + k * ss, s, s, Order::row_major);
        be.softmax_causal_backward(Pk, dPk, scale, dPk);  // dS
      }
      be.gemm_strided_batched(Op::N, Op::N, T(1), dP, ss, K, d, T(0), dqkv.block(b * s, 0, s, d), d,
                              lh, scratch);  // dQ = dS K
      be.gemm_strided_batched(Op::T, Op::N, T(1), dP, ss, Q, d, T(0), dqkv.block(b * s, hq, s, d),
                              d, lh, scratch);  // dK = dSᵀ Q
    }
  }
  c_attn_.backward(dqkv, dX, buffers, accumulate);
}

template class Attention2D<float>;
template class Attention2D<double>;

}  // namespace summa

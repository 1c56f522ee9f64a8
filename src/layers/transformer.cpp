// Attention, MLP and TransformerBlock, written once over a SchemeContext.
#include "summa/layers/transformer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "attention_core.hpp"
#include "summa/model/cost.hpp"

namespace summa {

namespace {

template <class T>
SchemeContext<T>& checked_attention(SchemeContext<T>& s, const std::string& name, index_t batch,
                                    index_t seq, index_t hidden, index_t heads) {
  std::optional<std::string> error;
  const std::string who = fmt::format("Attention ({}) '{}'", s.label(), name);
  if (batch <= 0 || seq <= 0 || hidden <= 0 || heads <= 0)
    error = fmt::format("{}: batch={}, seq={}, hidden={}, heads={} must be positive", who, batch,
                        seq, hidden, heads);
  else if (batch % s.sequence_split() != 0)
    error = fmt::format("{}: batch={} must be divisible by {}={} (whole sequences per rank)", who,
                        batch, s.sequence_split_name(), s.sequence_split());
  else if (hidden % heads != 0)
    error = fmt::format("{}: hidden={} must be divisible by heads={}", who, hidden, heads);
  else if (heads % s.head_split() != 0)
    error = fmt::format("{}: heads={} must be divisible by {}={} (whole heads per rank)", who,
                        heads, s.head_split_name(), s.head_split());
  s.agree(error);
  return s;
}

}  // namespace

// ---------------------------------------------------------------- attention

template <class T>
Attention<T>::Attention(SchemeContext<T>& scheme, std::string name, index_t batch, index_t seq,
                        index_t hidden, index_t heads)
    : backend_(&checked_attention(scheme, name, batch, seq, hidden, heads).backend()),
      name_(std::move(name)),
      batch_(batch),
      seq_(seq),
      hidden_(hidden),
      heads_(heads),
      sequence_split_(scheme.sequence_split()),
      head_split_(scheme.head_split()),
      c_attn_(scheme.linear(name_ + ".c_attn", batch * seq, hidden, 3 * hidden, LinearRole::expand,
                            true, {.out = 3})),
      c_proj_(scheme.linear(name_ + ".c_proj", batch * seq, hidden, hidden, LinearRole::contract)) {
}

template <class T>
void Attention<T>::collect_parameters(std::vector<Param<T>*>& out) {
  c_attn_->collect_parameters(out);
  c_proj_->collect_parameters(out);
}

template <class T>
detail::LocalAttention Attention<T>::local() const {
  return {.seqs = batch_ / sequence_split_,
          .seq = seq_,
          .heads = heads_ / head_split_,
          .head_dim = hidden_ / heads_};
}

template <class T>
std::size_t Attention<T>::gemm_scratch() const {
  return local().scratch_bytes(*backend_, dtype_v<T>);
}

template <class T>
void Attention<T>::use_cache(index_t length) {
  require(length >= seq_, [&] {
    return fmt::format("Attention '{}': a cache of {} positions is shorter than seq={}", name_,
                       length, seq_);
  });
  cache_length_ = length;
}

template <class T>
index_t Attention<T>::cache_elements() const {
  const detail::LocalAttention a = local();
  return a.seqs * a.heads * cache_length_ * a.head_dim;
}

template <class T>
void Attention<T>::attach_cache(T* keys, T* values) {
  require(cache_length_ > 0,
          [&] { return fmt::format("Attention '{}': attach_cache without use_cache", name_); });
  cache_k_ = keys;
  cache_v_ = values;
}

template <class T>
void Attention<T>::set_start(index_t start) {
  require(start >= 0 && start + seq_ <= cache_length_, [&] {
    return fmt::format(
        "Attention '{}': positions [{}, {}) do not fit the key/value cache of {} positions", name_,
        start, start + seq_, cache_length_);
  });
  start_ = start;
}

// The cached path: keys and values of this forward into the cache at
// [start, start + seq), then per local sequence and head the scores of its
// seq queries against the cached keys [0, start + seq), the causal softmax
// aligned at the bottom right (query t sees keys up to start + t), and the
// context from the cached values.
template <class T>
void Attention<T>::cached_forward(StepBuffers& buffers) {
  using A = acc_t<T>;
  const detail::LocalAttention a = local();
  const index_t s = seq_, d = a.head_dim, w = a.width(), L = start_ + s;
  ArenaScope scope(buffers.workspace);
  const auto S = MatrixView<T>::dense(buffers.workspace.take<T>(static_cast<std::size_t>(s * L)), s,
                                      L, Order::row_major);
  const std::size_t scratch_bytes =
      std::max(backend_->gemm_scratch_bytes(s, cache_length_, d, dtype_v<T>),
               backend_->gemm_scratch_bytes(s, d, cache_length_, dtype_v<T>));
  const Scratch scratch{buffers.workspace.take_bytes(scratch_bytes), scratch_bytes};
  for (index_t b = 0; b < a.seqs; ++b)
    for (index_t k = 0; k < a.heads; ++k) {
      const index_t at = (b * a.heads + k) * cache_length_ * d;
      const auto K = MatrixView<T>::dense(cache_k_ + at, cache_length_, d, Order::row_major);
      const auto V = MatrixView<T>::dense(cache_v_ + at, cache_length_, d, Order::row_major);
      backend_->copy(ConstMatrixView<T>(qkv_.block(b * s, w + k * d, s, d)),
                     K.block(start_, 0, s, d));
      backend_->copy(ConstMatrixView<T>(qkv_.block(b * s, 2 * w + k * d, s, d)),
                     V.block(start_, 0, s, d));
      backend_->gemm(Op::N, Op::T, A(1), ConstMatrixView<T>(qkv_.block(b * s, k * d, s, d)),
                     ConstMatrixView<T>(K.block(0, 0, L, d)), A(0), S, scratch);
      backend_->softmax_causal(ConstMatrixView<T>(S), a.scale(), S);
      backend_->gemm(Op::N, Op::N, A(1), ConstMatrixView<T>(S),
                     ConstMatrixView<T>(V.block(0, 0, L, d)), A(0), ctx_.block(b * s, k * d, s, d),
                     scratch);
    }
}

template <class T>
BufferNeeds Attention<T>::buffer_needs() const {
  const detail::LocalAttention a = local();
  const index_t nt = a.tokens(), w = a.width();
  if (cache_length_ > 0) {  // inference: qkv and context; scores of one head
    ByteCount<T> fwd, ws;
    fwd.add(nt * 3 * w).add(nt * w);
    ws.add(seq_ * cache_length_);
    ws.add_bytes(
        std::max(backend_->gemm_scratch_bytes(seq_, cache_length_, a.head_dim, dtype_v<T>),
                 backend_->gemm_scratch_bytes(seq_, a.head_dim, cache_length_, dtype_v<T>)));
    return {.workspace = std::max(
                {ws.bytes(), c_attn_->buffer_needs().workspace, c_proj_->buffer_needs().workspace}),
            .forward = fwd,
            .backward = 0};
  }
  ByteCount<T> fwd, bwd, ws;
  fwd.add(nt * 3 * w).add(recompute_ ? 0 : a.probs_elems()).add(nt * w);  // qkv, probs, context
  bwd.add(nt * w).add(nt * 3 * w).add(a.dprobs_elems());                  // dcontext, dqkv, dP
  if (recompute_) {  // one sequence's probabilities: formed in forward, again in backward
    ws.add(a.dprobs_elems());
    bwd.add(a.dprobs_elems());
  }
  ws.add_bytes(gemm_scratch());
  return {.workspace = std::max(
              {ws.bytes(), c_attn_->buffer_needs().workspace, c_proj_->buffer_needs().workspace}),
          .forward = fwd,
          .backward = bwd};
}

template <class T>
void Attention<T>::forward(ConstMatrixView<T> X, MatrixView<T> Y, StepBuffers& buffers) {
  const detail::LocalAttention a = local();
  const index_t nt = a.tokens(), w = a.width();
  Arena& fwd = buffers.forward;
  qkv_ = take_block<T>(fwd, nt, 3 * w);
  buffers.timed(block_op::c_attn, [&] { c_attn_->forward(X, qkv_, buffers); });
  if (cache_length_ > 0) {
    require(cache_k_ != nullptr, [&] {
      return fmt::format("Attention '{}': a cached forward without attach_cache", name_);
    });
    ctx_ = take_block<T>(fwd, nt, w);
    buffers.timed(block_op::core, [&] { cached_forward(buffers); });
    buffers.timed(block_op::attn_c_proj, [&] { c_proj_->forward(ctx_, Y, buffers); });
    return;
  }
  probs_ = recompute_ ? nullptr : fwd.take<T>(static_cast<std::size_t>(a.probs_elems()));
  ctx_ = take_block<T>(fwd, nt, w);
  forwarded_ = true;
  buffers.timed(block_op::core, [&] {
    ArenaScope scope(buffers.workspace);
    T* const probs =
        recompute_ ? buffers.workspace.take<T>(static_cast<std::size_t>(a.dprobs_elems())) : probs_;
    a.forward<T>(*backend_, qkv_, probs, !recompute_, ctx_,
                 Scratch{buffers.workspace.take_bytes(gemm_scratch()), gemm_scratch()});
  });
  buffers.timed(block_op::attn_c_proj, [&] { c_proj_->forward(ctx_, Y, buffers); });
}

template <class T>
void Attention<T>::backward(ConstMatrixView<T> dY, MatrixView<T> dX, StepBuffers& buffers,
                            bool accumulate) {
  require(cache_length_ == 0, [&] {
    return fmt::format("Attention '{}': backward with a key/value cache (inference only)", name_);
  });
  require(forwarded_,
          [&] { return fmt::format("Attention '{}': backward without forward", name_); });
  const detail::LocalAttention a = local();
  const index_t nt = a.tokens(), w = a.width();
  Arena& bwd = buffers.backward;
  ArenaScope scope(bwd);
  const auto dctx = take_block<T>(bwd, nt, w);
  buffers.timed(block_op::attn_c_proj, [&] { c_proj_->backward(dY, dctx, buffers, accumulate); });
  const auto dqkv = take_block<T>(bwd, nt, 3 * w);
  T* const dP = bwd.take<T>(static_cast<std::size_t>(a.dprobs_elems()));
  T* const probs = recompute_ ? bwd.take<T>(static_cast<std::size_t>(a.dprobs_elems())) : probs_;
  buffers.timed(block_op::core, [&] {
    ArenaScope ws_scope(buffers.workspace);
    a.backward<T>(*backend_, qkv_, probs, recompute_, dctx, dqkv, dP,
                  Scratch{buffers.workspace.take_bytes(gemm_scratch()), gemm_scratch()});
  });
  buffers.timed(block_op::c_attn, [&] { c_attn_->backward(dqkv, dX, buffers, accumulate); });
}

template <class T>
void Attention<T>::price(cost::Tally& t, model::Phase phase) const {
  const bool backward = phase == model::Phase::backward;
  const auto core = [&] {
    t.begin(block_op::core, phase);
    local().price(t, backward, sizeof(T), recompute_);
  };
  if (!backward) {
    t.begin(block_op::c_attn, phase);
    c_attn_->price(t, phase);
    core();
    t.begin(block_op::attn_c_proj, phase);
    c_proj_->price(t, phase);
  } else {
    t.begin(block_op::attn_c_proj, phase);
    c_proj_->price(t, phase);
    core();
    t.begin(block_op::c_attn, phase);
    c_attn_->price(t, phase);
  }
}

// ---------------------------------------------------------------- MLP

template <class T>
MLP<T>::MLP(SchemeContext<T>& scheme, std::string name, index_t tokens, index_t hidden)
    : name_(std::move(name)),
      rows_(scheme.local_rows(tokens, ActivationLayout::inner)),
      cols_(scheme.local_cols(4 * hidden, ActivationLayout::inner)),
      c_fc_(scheme.linear(name_ + ".c_fc", tokens, hidden, 4 * hidden, LinearRole::expand)),
      c_proj_(scheme.linear(name_ + ".c_proj", tokens, 4 * hidden, hidden, LinearRole::contract)),
      gelu_(scheme.backend(), rows_, cols_) {}

template <class T>
void MLP<T>::collect_parameters(std::vector<Param<T>*>& out) {
  c_fc_->collect_parameters(out);
  c_proj_->collect_parameters(out);
}

template <class T>
BufferNeeds MLP<T>::buffer_needs() const {
  const index_t n = rows_ * cols_;
  ByteCount<T> fwd, bwd;
  fwd.add(n).add(n);  // pre- and post-GeLU
  bwd.add(n);
  return {.workspace = std::max(c_fc_->buffer_needs().workspace, c_proj_->buffer_needs().workspace),
          .forward = fwd,
          .backward = bwd};
}

template <class T>
void MLP<T>::forward(ConstMatrixView<T> X, MatrixView<T> Y, StepBuffers& buffers) {
  fc_ = take_block<T>(buffers.forward, rows_, cols_);
  act_ = take_block<T>(buffers.forward, rows_, cols_);
  buffers.timed(block_op::c_fc, [&] { c_fc_->forward(X, fc_, buffers); });
  buffers.timed(block_op::gelu, [&] { gelu_.forward(fc_, act_, buffers); });
  buffers.timed(block_op::mlp_c_proj, [&] { c_proj_->forward(act_, Y, buffers); });
}

template <class T>
void MLP<T>::backward(ConstMatrixView<T> dY, MatrixView<T> dX, StepBuffers& buffers,
                      bool accumulate) {
  require(fc_.data != nullptr,
          [&] { return fmt::format("MLP '{}': backward without forward", name_); });
  ArenaScope scope(buffers.backward);
  const auto d4h = take_block<T>(buffers.backward, rows_, cols_);
  buffers.timed(block_op::mlp_c_proj, [&] { c_proj_->backward(dY, d4h, buffers, accumulate); });
  buffers.timed(block_op::gelu,
                [&] { gelu_.backward(d4h, d4h, buffers); });  // in place: dgelu -> dfc
  buffers.timed(block_op::c_fc, [&] { c_fc_->backward(d4h, dX, buffers, accumulate); });
}

template <class T>
void MLP<T>::price(cost::Tally& t, model::Phase phase) const {
  const bool backward = phase == model::Phase::backward;
  const Layer<T>* first = backward ? c_proj_.get() : c_fc_.get();
  const Layer<T>* last = backward ? c_fc_.get() : c_proj_.get();
  t.begin(backward ? block_op::mlp_c_proj : block_op::c_fc, phase);
  first->price(t, phase);
  t.begin(block_op::gelu, phase);
  gelu_.price(t, phase);
  t.begin(backward ? block_op::c_fc : block_op::mlp_c_proj, phase);
  last->price(t, phase);
}

// ---------------------------------------------------------------- block

template <class T>
TransformerBlock<T>::TransformerBlock(SchemeContext<T>& scheme, std::string name, index_t batch,
                                      index_t seq, index_t hidden, index_t heads, double eps)
    : backend_(&scheme.backend()),
      name_(std::move(name)),
      rows_(scheme.local_rows(batch * seq, ActivationLayout::outer)),
      cols_(scheme.local_cols(hidden, ActivationLayout::outer)),
      ln_1_(scheme.layer_norm(name_ + ".ln_1", batch * seq, hidden, eps)),
      attn_(scheme, name_ + ".attn", batch, seq, hidden, heads),
      ln_2_(scheme.layer_norm(name_ + ".ln_2", batch * seq, hidden, eps)),
      mlp_(scheme, name_ + ".mlp", batch * seq, hidden) {}

template <class T>
void TransformerBlock<T>::collect_parameters(std::vector<Param<T>*>& out) {
  ln_1_->collect_parameters(out);
  attn_.collect_parameters(out);
  ln_2_->collect_parameters(out);
  mlp_.collect_parameters(out);
}

template <class T>
BufferNeeds TransformerBlock<T>::buffer_needs() const {
  const index_t n = rows_ * cols_;
  BufferNeeds needs;
  ByteCount<T> own_fwd;
  own_fwd.add(n).add(n).add(n);  // ln1, mid, ln2
  needs.forward = own_fwd;
  for (const BufferNeeds& sub :
       {ln_1_->buffer_needs(), attn_.buffer_needs(), ln_2_->buffer_needs(), mlp_.buffer_needs()})
    needs.then(sub);
  ByteCount<T> held;  // dmid and one block held while a sublayer runs backward
  held.add(n).add(n);
  needs.backward += held;
  return needs;
}

template <class T>
void TransformerBlock<T>::forward(ConstMatrixView<T> X, MatrixView<T> Y, StepBuffers& buffers) {
  Backend& be = *backend_;
  ln1_ = take_block<T>(buffers.forward, rows_, cols_);
  mid_ = take_block<T>(buffers.forward, rows_, cols_);
  ln2_ = take_block<T>(buffers.forward, rows_, cols_);
  // Profiled, each residual add counts with the op before it, as the
  // step-time model prices it.
  buffers.timed(block_op::ln_1, [&] { ln_1_->forward(X, ln1_, buffers); });
  attn_.forward(ln1_, mid_, buffers);
  buffers.timed(
      block_op::attn_c_proj,
      [&] { be.axpby(acc_t<T>(1), X, acc_t<T>(1), mid_); },  // mid = X + Attn(LN1(X))
      false);
  buffers.timed(block_op::ln_2, [&] { ln_2_->forward(mid_, ln2_, buffers); });
  mlp_.forward(ln2_, Y, buffers);
  buffers.timed(
      block_op::mlp_c_proj,
      [&] {
        be.axpby(acc_t<T>(1), ConstMatrixView<T>(mid_), acc_t<T>(1), Y);  // Y = mid + MLP(LN2(mid))
      },
      false);
}

template <class T>
void TransformerBlock<T>::backward(ConstMatrixView<T> dY, MatrixView<T> dX, StepBuffers& buffers,
                                   bool accumulate) {
  require(mid_.data != nullptr,
          [&] { return fmt::format("TransformerBlock '{}': backward without forward", name_); });
  Backend& be = *backend_;
  Arena& bwd = buffers.backward;
  ArenaScope scope(bwd);
  const auto dmid = take_block<T>(bwd, rows_, cols_);
  const auto dtmp = take_block<T>(bwd, rows_, cols_);
  // MLP half: dmid = dY + LN2ᵀ(MLPᵀ(dY))
  mlp_.backward(dY, dtmp, buffers, accumulate);
  buffers.timed(block_op::ln_2, [&] {
    ln_2_->backward(dtmp, dmid, buffers, accumulate);
    be.axpby(acc_t<T>(1), dY, acc_t<T>(1), dmid);
  });
  // attention half: dX = dmid + LN1ᵀ(Attnᵀ(dmid))
  attn_.backward(dmid, dtmp, buffers, accumulate);
  buffers.timed(block_op::ln_1, [&] {
    ln_1_->backward(dtmp, dX, buffers, accumulate);
    be.axpby(acc_t<T>(1), ConstMatrixView<T>(dmid), acc_t<T>(1), dX);
  });
}

template <class T>
void TransformerBlock<T>::price(cost::Tally& t, model::Phase phase) const {
  const auto residual_add = [&] {  // read two blocks, write one
    t.memory(3 * static_cast<cost::u64>(rows_ * cols_) * sizeof(T));
  };
  if (phase != model::Phase::backward) {
    t.begin(block_op::ln_1, phase);
    ln_1_->price(t, phase);
    attn_.price(t, phase);
    residual_add();
    t.begin(block_op::ln_2, phase);
    ln_2_->price(t, phase);
    mlp_.price(t, phase);
    residual_add();
  } else {
    mlp_.price(t, phase);
    t.begin(block_op::ln_2, phase);
    ln_2_->price(t, phase);
    residual_add();
    attn_.price(t, phase);
    t.begin(block_op::ln_1, phase);
    ln_1_->price(t, phase);
    residual_add();
  }
}

template class Attention<float>;
template class Attention<double>;
template class Attention<bf16>;
template class MLP<float>;
template class MLP<double>;
template class MLP<bf16>;
template class TransformerBlock<float>;
template class TransformerBlock<double>;
template class TransformerBlock<bf16>;

}  // namespace summa

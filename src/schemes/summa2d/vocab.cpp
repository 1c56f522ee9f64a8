// The 2D (SUMMA) vocabulary ops (summa/schemes/summa2d/layers.hpp):
// Embedding2D, and LMHead2D with its cross-entropy (VocabCrossEntropy over
// the mesh's axes).
#include "summa/schemes/summa2d/layers.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "detail.hpp"

namespace summa {

// ---------------------------------------------------------------- embedding

namespace {

SummaEngine& checked(SummaEngine& engine, index_t batch, index_t seq, index_t vocab, index_t hidden,
                     index_t n_positions) {
  const int q = engine.q();
  std::optional<std::string> error;
  if (batch <= 0 || seq <= 0 || vocab <= 0 || hidden <= 0 || n_positions <= 0)
    error = fmt::format(
        "Embedding2D: batch={}, seq={}, vocab={}, hidden={}, n_positions={} must be positive",
        batch, seq, vocab, hidden, n_positions);
  else if (seq > n_positions)
    error = fmt::format("Embedding2D: seq={} is longer than the position table (n_positions={})",
                        seq, n_positions);
  else if (vocab % q != 0)
    error = fmt::format("Embedding2D: vocab={} must be divisible by q={}", vocab, q);
  else if (hidden % q != 0)
    error = fmt::format("Embedding2D: hidden={} must be divisible by q={}", hidden, q);
  else if ((batch * seq) % q != 0)
    error = fmt::format("Embedding2D: batch*seq={} must be divisible by q={}", batch * seq, q);
  engine.grid().agree(CommAxis::mesh, error);
  return engine;
}

}  // namespace

template <class T>
Embedding2D<T>::Embedding2D(SummaEngine& engine, index_t batch, index_t seq, index_t vocab,
                            index_t hidden, index_t n_positions)
    : engine_(&checked(engine, batch, seq, vocab, hidden, n_positions)),
      batch_(batch),
      seq_(seq),
      vocab_(vocab),
      hidden_(hidden),
      positions_(n_positions),
      q_(engine.q()),
      chunk_((n_positions + q_ - 1) / q_) {
  const GridCoords& c = engine.grid().coords();
  const index_t hq = hidden / q_;
  wte_.shard.name = "wte.weight";
  wte_.shard.global_shape = {vocab, hidden};
  wte_.shard.local_rows = vocab / q_;
  wte_.shard.local_cols = hq;
  wte_.shard.pieces.push_back({.global_row = c.row * (vocab / q_),
                               .global_col = c.col * hq,
                               .local_row = 0,
                               .local_col = 0,
                               .rows = vocab / q_,
                               .cols = hq});
  const index_t first = c.row * chunk_;
  const index_t rows = std::max<index_t>(0, std::min(n_positions, first + chunk_) - first);
  wpe_.shard.name = "wpe.weight";
  wpe_.shard.global_shape = {n_positions, hidden};
  if (rows > 0) {
    wpe_.shard.local_rows = rows;
    wpe_.shard.local_cols = hq;
    wpe_.shard.pieces.push_back({.global_row = first,
                                 .global_col = c.col * hq,
                                 .local_row = 0,
                                 .local_col = 0,
                                 .rows = rows,
                                 .cols = hq});
  }
  const auto token_rows = static_cast<std::size_t>(batch * seq);
  position_ids_ = BackendIds::cyclic(engine.backend(), token_rows, seq);
  tokens_ = BackendIds(engine.backend(), token_rows);
}

template <class T>
void Embedding2D<T>::collect_parameters(std::vector<Param<T>*>& out) {
  out.push_back(&wte_);
  out.push_back(&wpe_);
}

template <class T>
BufferNeeds Embedding2D<T>::buffer_needs() const {
  const index_t tokens = batch_ * seq_, hq = hidden_ / q_;
  ByteCount<T> fwd_ws, bwd_ws;
  fwd_ws.add(tokens * hq).add(tokens / q_ * hq);
  bwd_ws.add(tokens * hq);
  return {.workspace = std::max(fwd_ws.bytes(), bwd_ws.bytes()), .forward = 0, .backward = 0};
}

template <class T>
void Embedding2D<T>::check_ids(std::span<const std::int32_t> ids, const char* what) const {
  std::optional<std::string> error;
  const index_t expected = batch_ * seq_;
  if (static_cast<index_t>(ids.size()) != expected) {
    error = fmt::format("Embedding2D: {} ids has {} values, expected batch*seq = {}*{} = {}", what,
                        ids.size(), batch_, seq_, expected);
  } else {
    const auto bad = std::find_if(ids.begin(), ids.end(),
                                  [&](std::int32_t id) { return id < 0 || id >= vocab_; });
    if (bad != ids.end())
      error = fmt::format("Embedding2D: {} id {} at position {} is outside [0, vocab={})", what,
                          *bad, bad - ids.begin(), vocab_);
  }
  engine_->settle(error);
}

template <class T>
void Embedding2D<T>::set_positions(std::span<const std::int32_t> positions) {
  engine_->settle(positions_error("Embedding2D", positions, batch_ * seq_, positions_));
  position_ids_.assign(positions);
}

template <class T>
void Embedding2D<T>::restore_tokens(std::span<const std::int32_t> tokens) {
  check_ids(tokens, "token");
  tokens_.assign(tokens);
}

template <class T>
void Embedding2D<T>::forward(std::span<const std::int32_t> tokens, MatrixView<T> Y,
                             StepBuffers& buffers) {
  check_ids(tokens, "token");
  ProcessGrid& grid = engine_->grid();
  Backend& be = engine_->backend();
  const GridCoords& c = grid.coords();
  const index_t n = batch_ * seq_, nt = n / q_, hq = hidden_ / q_;
  require(Y.rows == nt && Y.cols == hq, [&] {
    return fmt::format("Embedding2D forward: local Y is {}x{}, expected {}x{}", Y.rows, Y.cols, nt,
                       hq);
  });
  tokens_.assign(tokens);
  ArenaScope scope(buffers.workspace);
  const auto partial = MatrixView<T>::dense(
      buffers.workspace.take<T>(static_cast<std::size_t>(n * hq)), n, hq, Order::row_major);
  be.gather_rows(tokens_.data(), c.row * (vocab_ / q_), wte_.value_view(), false, partial);
  if (wpe_.held())
    be.gather_rows(position_ids_.data(), c.row * chunk_, wpe_.value_view(), true, partial);
  T* mine = buffers.workspace.take<T>(static_cast<std::size_t>(nt * hq));
  grid.mesh_col().reduce_scatter(partial.data, mine, static_cast<std::size_t>(nt * hq), dtype_v<T>,
                                 ReduceOp::sum);
  be.copy(ConstMatrixView<T>::dense(mine, nt, hq, Order::row_major), Y);
}

template <class T>
void Embedding2D<T>::backward(ConstMatrixView<T> dY, StepBuffers& buffers, bool accumulate) {
  require(tokens_.size() > 0, "Embedding2D: backward without forward");
  ProcessGrid& grid = engine_->grid();
  Backend& be = engine_->backend();
  const GridCoords& c = grid.coords();
  const index_t n = batch_ * seq_, nt = n / q_, hq = hidden_ / q_;
  ArenaScope scope(buffers.workspace);
  T* full = buffers.workspace.take<T>(static_cast<std::size_t>(n * hq));
  T* mine = full + c.row * nt * hq;
  be.copy(dY, MatrixView<T>::dense(mine, nt, hq, Order::row_major));
  grid.mesh_col().all_gather(mine, full, static_cast<std::size_t>(nt * hq));
  const auto all = ConstMatrixView<T>::dense(full, n, hq, Order::row_major);
  if (!accumulate) {
    be.scale(acc_t<T>(0), wte_.grad_view());
    if (wpe_.held()) be.scale(acc_t<T>(0), wpe_.grad_view());
  }
  be.scatter_add_rows(tokens_.data(), c.row * (vocab_ / q_), all, wte_.grad_view());
  if (wpe_.held()) be.scatter_add_rows(position_ids_.data(), c.row * chunk_, all, wpe_.grad_view());
}

// Cost: the vocabulary-block lookups reduce-scattered over the mesh
// column in forward, dY all-gathered over it in backward.
template <class T>
void Embedding2D<T>::price(cost::Tally& t, model::Phase phase) const {
  const auto u = [](index_t v) { return static_cast<cost::u64>(v); };
  const detail2d::MeshRank r = detail2d::mesh_rank<T>(*engine_);
  const cost::u64 q = r.q, e = r.el.e, block = (u(batch_ * seq_) / q) * (u(hidden_) / q);
  if (phase != model::Phase::backward) {
    t.memory(3 * q * block * e);  // the lookups of every row block
    t.reduce_scatter(CommAxis::mesh_col, block, q, e);
  } else {
    t.all_gather(CommAxis::mesh_col, block, q, e);
    t.memory(3 * q * block * e);  // row scatter-adds
  }
}

template class Embedding2D<float>;
template class Embedding2D<double>;
template class Embedding2D<bf16>;

// ---------------------------------------------------------------- head, loss

VocabLayout summa2d_loss_layout(const ProcessGrid& grid) {
  const GridCoords& c = grid.coords();
  VocabLayout l;
  l.scheme = "2D";
  l.vocab = {.axis = CommAxis::mesh_row, .size = grid.shape().cols, .rank = c.col, .name = "q"};
  l.tokens = {.axis = CommAxis::mesh_col, .size = grid.shape().rows, .rank = c.row, .name = "q"};
  l.agree_axis = CommAxis::mesh;
  return l;
}

template <class T>
LMHead2D<T>::LMHead2D(SummaEngine& engine, Param<T>& wte, index_t tokens, index_t hidden,
                      index_t vocab, index_t normalizer)
    : engine_(&engine),
      wte_(&wte),
      tokens_(tokens),
      hidden_(hidden),
      vocab_(vocab),
      q_(engine.q()),
      loss_(engine.grid(), engine.backend(), tokens, vocab, normalizer) {
  std::optional<std::string> error;
  if (hidden <= 0 || hidden % q_ != 0)
    error = fmt::format("LMHead2D: hidden={} must be positive and divisible by q={}", hidden, q_);
  else if (wte.shard.local_rows != vocab / q_ || wte.shard.local_cols != hidden / q_)
    error = fmt::format("LMHead2D: the tied embedding block is {}x{}, expected {}x{}",
                        wte.shard.local_rows, wte.shard.local_cols, vocab / q_, hidden / q_);
  engine.grid().agree(CommAxis::mesh, error);
}

template <class T>
BufferNeeds LMHead2D<T>::buffer_needs() const {
  ByteCount<T> fwd;
  fwd.add((tokens_ / q_) * (vocab_ / q_));
  BufferNeeds needs{
      .workspace =
          std::max({engine_->workspace_bytes(Form::ABt, tokens_, vocab_, hidden_, dtype_v<T>),
                    engine_->workspace_bytes(Form::AB, tokens_, hidden_, vocab_, dtype_v<T>),
                    engine_->workspace_bytes(Form::AtB, vocab_, hidden_, tokens_, dtype_v<T>)}),
      .forward = fwd,
      .backward = 0};
  needs.then(loss_.buffer_needs());
  return needs;
}

template <class T>
double LMHead2D<T>::forward(ConstMatrixView<T> X, std::span<const std::int32_t> targets,
                            StepBuffers& buffers) {
  const index_t nt = tokens_ / q_, nv = vocab_ / q_;
  logits_ = MatrixView<T>::dense(buffers.forward.take<T>(static_cast<std::size_t>(nt * nv)), nt, nv,
                                 Order::row_major);
  engine_->abt(tokens_, vocab_, hidden_, acc_t<T>(1), X, ConstMatrixView<T>(wte_->value_view()),
               acc_t<T>(0), logits_, buffers.workspace);
  x_ = X;
  if (targets.empty()) return 0;  // logits only (LossHead::forward)
  return loss_.forward(logits_, targets, buffers);
}

template <class T>
void LMHead2D<T>::backward(MatrixView<T> dX, StepBuffers& buffers, bool accumulate) {
  require(logits_.data != nullptr, "LMHead2D: backward without forward");
  loss_.backward(logits_, buffers);  // logits_ now holds dL/dlogits
  engine_->ab(tokens_, hidden_, vocab_, acc_t<T>(1), ConstMatrixView<T>(logits_),
              ConstMatrixView<T>(wte_->value_view()), acc_t<T>(0), dX, buffers.workspace);
  engine_->atb(vocab_, hidden_, tokens_, acc_t<T>(1), ConstMatrixView<T>(logits_), x_,
               accumulate ? acc_t<T>(1) : acc_t<T>(0), wte_->grad_view(), buffers.workspace);
}

// Cost: logits Z = X wteᵀ by SUMMA, the cross-entropy's row max
// and (sum exp | target logit) all-reduced along the mesh rows in acc_t,
// the loss (a double) over the mesh column; backward dX = dZ wte and
// dwte += dZᵀ X by SUMMA.
template <class T>
void LMHead2D<T>::price(cost::Tally& t, model::Phase phase) const {
  const auto u = [](index_t v) { return static_cast<cost::u64>(v); };
  const detail2d::MeshRank r = detail2d::mesh_rank<T>(*engine_);
  const VocabLayout loss = summa2d_loss_layout(engine_->grid());
  const cost::u64 tokens = u(tokens_), vocab = u(vocab_), hidden = u(hidden_), e = r.el.e;
  if (phase != model::Phase::backward) {
    t.summa(Form::ABt, tokens, vocab, hidden, r.q, e, r.summa);
    vocab_cost::cross_entropy_forward(t, loss, r.el, tokens, vocab);
    return;
  }
  vocab_cost::cross_entropy_backward(t, loss, r.el, tokens, vocab);
  t.summa(Form::AB, tokens, hidden, vocab, r.q, e, r.summa);
  t.summa(Form::AtB, vocab, hidden, tokens, r.q, e, r.summa);
}

template class LMHead2D<float>;
template class LMHead2D<double>;
template class LMHead2D<bf16>;

}  // namespace summa

// The vocabulary-parallel embedding, tied LM head and cross-entropy, once
// for every scheme that splits the vocabulary (summa/layers/vocab_parallel.hpp).
#include "summa/layers/vocab_parallel.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>

#include "check_view.hpp"
#include "summa/model/cost.hpp"

namespace summa {

using detail::check_view;

namespace {

// ---------------------------------------------------------------- collectives

/// In-place all-reduce (sum unless `op`) over `a`; nothing on an axis of one.
template <class T>
void all_reduce(ProcessGrid& grid, const AxisSplit& a, T* data, index_t count,
                ReduceOp op = ReduceOp::sum) {
  if (a.size > 1)
    grid.comm(a.axis).all_reduce(data, data, static_cast<std::size_t>(count), dtype_v<T>, op);
}

Scratch take_scratch(Arena& ws, std::size_t bytes) {
  return Scratch{ws.take_bytes(bytes), bytes};
}

/// The rank's block of a global [tokens] id sequence on the tokens axis.
std::span<const std::int32_t> local_rows(std::span<const std::int32_t> ids, index_t tokens,
                                         const AxisSplit& t) {
  const auto n = static_cast<std::size_t>(tokens / t.size);
  return ids.subspan(static_cast<std::size_t>(t.rank) * n, n);
}

/// wte's local shard [V/(Gv*Gt), H/Gh] all-gathered over the tokens axis
/// into its block [V/Gv, H/Gh] (the shard itself on a tokens axis of one).
template <class T>
MatrixView<T> gather_wte(ProcessGrid& grid, const VocabLayout& l, Param<T>& wte, T* buffer,
                         index_t rows, index_t cols) {
  if (l.tokens.size == 1) return wte.value_view();
  grid.comm(l.tokens.axis)
      .all_gather(wte.value, buffer, static_cast<std::size_t>(wte.shard.local_size()));
  return MatrixView<T>::dense(buffer, rows, cols, Order::row_major);
}

/// Reduce-scatters the block-sized wte gradient `full` over the tokens axis
/// and adds the rank's part to (without `accumulate`: stores it in) wte's
/// gradient. On a tokens axis of one `full` is the gradient itself.
template <class T>
void scatter_wte_grad(ProcessGrid& grid, const VocabLayout& l, Backend& be, Param<T>& wte, T* full,
                      bool accumulate) {
  using A = acc_t<T>;
  if (l.tokens.size == 1) return;
  const auto shard = static_cast<std::size_t>(wte.shard.local_size());
  Communicator& c = grid.comm(l.tokens.axis);
  if (accumulate) {
    c.reduce_scatter(full, full, shard, dtype_v<T>, ReduceOp::sum);
    be.axpby(A(1),
             ConstMatrixView<T>::dense(full, wte.shard.local_rows, wte.shard.local_cols,
                                       Order::row_major),
             A(1), wte.grad_view());
  } else {
    c.reduce_scatter(full, wte.grad, shard, dtype_v<T>, ReduceOp::sum);
  }
}

index_t gv(const VocabLayout& l) {
  return l.vocab.size;
}
index_t gh(const VocabLayout& l) {
  return l.hidden.size;
}
index_t gt(const VocabLayout& l) {
  return l.tokens.size;
}

// ---------------------------------------------------------------- shards

/// `s` holding one piece: its whole local block at (row, col) of the global matrix.
ParamShard whole_block(ParamShard s, index_t row, index_t col) {
  s.pieces.push_back({.global_row = row,
                      .global_col = col,
                      .local_row = 0,
                      .local_col = 0,
                      .rows = s.local_rows,
                      .cols = s.local_cols});
  return s;
}

/// wte: rows [v*V/Gv + t*V/(Gv*Gt), +V/(Gv*Gt)), columns [h*H/Gh, +H/Gh).
ParamShard wte_shard(const VocabLayout& l, index_t vocab, index_t hidden) {
  ParamShard s;
  s.name = "wte.weight";
  s.global_shape = {vocab, hidden};
  s.local_rows = vocab / (gv(l) * gt(l));
  s.local_cols = hidden / gh(l);
  const index_t row = l.vocab.rank * (vocab / gv(l)) + l.tokens.rank * s.local_rows;
  return whole_block(std::move(s), row, l.hidden.rank * (hidden / gh(l)));
}

/// wpe: all rows, columns [h*H/Gh, +H/Gh); the rank with v = t = 0 owns it.
ParamShard wpe_shard(const VocabLayout& l, index_t n_positions, index_t hidden) {
  ParamShard s;
  s.name = "wpe.weight";
  s.global_shape = {n_positions, hidden};
  s.local_rows = n_positions;
  s.local_cols = hidden / gh(l);
  s.owner = l.vocab.rank == 0 && l.tokens.rank == 0;
  return whole_block(std::move(s), 0, l.hidden.rank * (hidden / gh(l)));
}

/// A class's name in messages ("Embedding1D", "LMHead3D forward"), on the
/// stack: a step formats and allocates nothing unless a check fails.
struct Name {
  char text[48];
  operator const char*() const { return text; }  // NOLINT: a C string where one is taken
};
Name who(const char* op, const VocabLayout& l, const char* phase = nullptr) {
  Name n{};
  std::snprintf(n.text, sizeof n.text, "%s%s%s%s", op, l.scheme, phase ? " " : "",
                phase ? phase : "");
  return n;
}

/// "Gx*Gz = 2*2" or "p=2" for the divisor of the vocabulary.
std::string vocab_divisor(const VocabLayout& l) {
  if (l.tokens.size == 1) return fmt::format("{}={}", l.vocab.name, l.vocab.size);
  return fmt::format("{}*{} = {}*{}", l.vocab.name, l.tokens.name, l.vocab.size, l.tokens.size);
}

/// The first id of `ids` outside [0, vocab), as an error of `op`.
/// `count_name()` is called only on failure.
template <class CountName>
std::optional<std::string> ids_error(const char* op, std::span<const std::int32_t> ids,
                                     index_t expected, index_t vocab, const char* what,
                                     const CountName& count_name) {
  if (static_cast<index_t>(ids.size()) != expected)
    return fmt::format("{}: {} ids has {} values, expected {} = {}", op, what, ids.size(),
                       count_name(), expected);
  const auto bad =
      std::find_if(ids.begin(), ids.end(), [&](std::int32_t id) { return id < 0 || id >= vocab; });
  if (bad != ids.end())
    return fmt::format("{}: {} id {} at position {} is outside [0, vocab={})", op, what, *bad,
                       bad - ids.begin(), vocab);
  return std::nullopt;
}

ProcessGrid& checked_embedding(ProcessGrid& grid, const VocabLayout& l, index_t batch, index_t seq,
                               index_t vocab, index_t hidden, index_t n_positions) {
  const std::string op = who("Embedding", l).text;
  std::optional<std::string> error;
  if (batch <= 0 || seq <= 0 || vocab <= 0 || hidden <= 0 || n_positions <= 0)
    error =
        fmt::format("{}: batch={}, seq={}, vocab={}, hidden={}, n_positions={} must be positive",
                    op, batch, seq, vocab, hidden, n_positions);
  else if (seq > n_positions)
    error = fmt::format("{}: seq={} is longer than the position table (n_positions={})", op, seq,
                        n_positions);
  else if (batch % gt(l) != 0)
    error = fmt::format("{}: batch={} must be divisible by {}={}", op, batch, l.tokens.name,
                        l.tokens.size);
  else if (vocab % (gv(l) * gt(l)) != 0)
    error = fmt::format("{}: vocab={} must be divisible by {}", op, vocab, vocab_divisor(l));
  else if (hidden % gh(l) != 0)
    error = fmt::format("{}: hidden={} must be divisible by {}={}", op, hidden, l.hidden.name,
                        l.hidden.size);
  else if (l.sequence_parallel && (batch * seq) % gv(l) != 0)
    error = fmt::format("{}: batch*seq = {}*{} must be divisible by {}={} (sequence parallelism)",
                        op, batch, seq, l.vocab.name, l.vocab.size);
  grid.agree(l.agree_axis, error);
  return grid;
}

}  // namespace

// ---------------------------------------------------------------- embedding

template <class T>
VocabEmbedding<T>::VocabEmbedding(ProcessGrid& grid, Backend& backend, VocabLayout layout,
                                  index_t batch, index_t seq, index_t vocab, index_t hidden,
                                  index_t n_positions)
    : grid_(&checked_embedding(grid, layout, batch, seq, vocab, hidden, n_positions)),
      backend_(&backend),
      layout_(layout),
      batch_(batch),
      seq_(seq),
      vocab_(vocab),
      hidden_(hidden),
      positions_(n_positions) {
  wte_.shard = wte_shard(layout_, vocab, hidden);
  wpe_.shard = wpe_shard(layout_, n_positions, hidden);
  const auto token_rows = static_cast<std::size_t>(batch * seq / gt(layout_));
  position_ids_ = BackendIds::cyclic(backend, token_rows, seq);
  tokens_ = BackendIds(backend, token_rows);
  require(!layout_.sequence_parallel || gt(layout_) == 1,
          "VocabEmbedding: sequence parallelism with a tokens axis");
  if (layout_.sequence_parallel) {
    const index_t own = batch * seq / gv(layout_);
    own_position_ids_ =
        BackendIds::cyclic(backend, static_cast<std::size_t>(own), seq, layout_.vocab.rank * own);
  }
}

template <class T>
void VocabEmbedding<T>::collect_parameters(std::vector<Param<T>*>& out) {
  out.push_back(&wte_);
  out.push_back(&wpe_);
}

template <class T>
void VocabEmbedding<T>::price(cost::Tally& t, model::Phase phase) const {
  constexpr cost::Elements el = cost::elements_of<T>();
  const auto u = [](index_t v) { return static_cast<cost::u64>(v); };
  if (phase == model::Phase::backward)
    vocab_cost::embedding_backward(t, layout_, el, u(batch_ * seq_), u(vocab_), u(hidden_),
                                   u(positions_));
  else
    vocab_cost::embedding_forward(t, layout_, el, u(batch_ * seq_), u(vocab_), u(hidden_));
}

template <class T>
BufferNeeds VocabEmbedding<T>::buffer_needs() const {
  // Without a tokens axis: gathers straight into Y and reduces in place
  // (sequence parallelism: every token's rows, reduce-scattered into Y).
  ByteCount<T> ws;
  if (layout_.sequence_parallel) ws.add(batch_ * seq_ * (hidden_ / gh(layout_)));
  if (gt(layout_) > 1)
    ws.add((vocab_ / gv(layout_)) * (hidden_ / gh(layout_)))
        .add(positions_ * (hidden_ / gh(layout_)));
  return {.workspace = ws, .forward = 0, .backward = 0};
}

template <class T>
index_t VocabEmbedding<T>::vocab_begin() const {
  return layout_.vocab.rank * (vocab_ / gv(layout_));
}

template <class T>
void VocabEmbedding<T>::check_ids(std::span<const std::int32_t> ids, const char* what) const {
  const auto count = [&] { return fmt::format("batch*seq = {}*{}", batch_, seq_); };
  grid_->agree_call(layout_.agree_axis,
                    ids_error(who("Embedding", layout_), ids, batch_ * seq_, vocab_, what, count));
}

template <class T>
void VocabEmbedding<T>::set_positions(std::span<const std::int32_t> positions) {
  grid_->agree_call(layout_.agree_axis, positions_error(who("Embedding", layout_), positions,
                                                        batch_ * seq_, positions_));
  position_ids_.assign(local_rows(positions, batch_ * seq_, layout_.tokens));
  if (layout_.sequence_parallel)
    own_position_ids_.assign(local_rows(positions, batch_ * seq_, layout_.vocab));
}

template <class T>
void VocabEmbedding<T>::restore_tokens(std::span<const std::int32_t> tokens) {
  check_ids(tokens, "token");
  tokens_.assign(local_rows(tokens, batch_ * seq_, layout_.tokens));
}

template <class T>
void VocabEmbedding<T>::forward(std::span<const std::int32_t> tokens, MatrixView<T> Y,
                                StepBuffers& buffers) {
  check_ids(tokens, "token");
  const index_t m = batch_ * seq_ / gt(layout_), n = hidden_ / gh(layout_);
  Backend& be = *backend_;
  tokens_.assign(local_rows(tokens, batch_ * seq_, layout_.tokens));
  ArenaScope scope(buffers.workspace);
  if (layout_.sequence_parallel) {  // every token's rows, reduce-scattered to the rank's
    check_view(who("Embedding", layout_, "forward"), "Y", Y, m / gv(layout_), n, true);
    const auto full = take_block<T>(buffers.workspace, m, n);
    be.gather_rows(tokens_.data(), vocab_begin(), ConstMatrixView<T>(wte_.value_view()), false,
                   full);
    grid_->comm(layout_.vocab.axis)
        .reduce_scatter(full.data, Y.data, static_cast<std::size_t>(Y.rows * n), dtype_v<T>,
                        ReduceOp::sum);
    be.gather_rows(own_position_ids_.data(), 0, wpe_.value_view(), true, Y);
    return;
  }
  check_view(who("Embedding", layout_, "forward"), "Y", Y, m, n, true);
  T* buf = gt(layout_) > 1
               ? buffers.workspace.take<T>(static_cast<std::size_t>((vocab_ / gv(layout_)) * n))
               : nullptr;
  const auto block =
      ConstMatrixView<T>(gather_wte(*grid_, layout_, wte_, buf, vocab_ / gv(layout_), n));
  // Exactly one rank of the vocabulary axis holds each token's row: the sum is exact.
  be.gather_rows(tokens_.data(), vocab_begin(), block, false, Y);
  all_reduce(*grid_, layout_.vocab, Y.data, m * n);
  be.gather_rows(position_ids_.data(), 0, wpe_.value_view(), true, Y);
}

template <class T>
void VocabEmbedding<T>::backward(ConstMatrixView<T> dY, StepBuffers& buffers, bool accumulate) {
  using A = acc_t<T>;
  require(tokens_.size() > 0, [&] {
    return std::string(who("Embedding", layout_).text) + ": backward without forward";
  });
  const index_t m = batch_ * seq_ / gt(layout_), n = hidden_ / gh(layout_),
                nv = vocab_ / gv(layout_);
  Backend& be = *backend_;
  ArenaScope scope(buffers.workspace);
  if (layout_.sequence_parallel) {  // every token's dY: the rows gathered
    check_view(who("Embedding", layout_, "backward"), "dY", dY, m / gv(layout_), n, true);
    const auto full = take_block<T>(buffers.workspace, m, n);
    grid_->comm(layout_.vocab.axis)
        .all_gather(dY.data, full.data, static_cast<std::size_t>(dY.rows * n), dtype_v<T>);
    dY = full;
  } else {
    check_view(who("Embedding", layout_, "backward"), "dY", dY, m, n);
  }
  if (gt(layout_) == 1) {
    if (!accumulate) {
      be.scale(A(0), wte_.grad_view());
      be.scale(A(0), wpe_.grad_view());
    }
    be.scatter_add_rows(tokens_.data(), vocab_begin(), dY, wte_.grad_view());
    // dY is the same over the vocabulary axis: so is wpe's gradient, replicas stay equal.
    be.scatter_add_rows(position_ids_.data(), 0, dY, wpe_.grad_view());
    return;
  }
  T* full = buffers.workspace.take<T>(static_cast<std::size_t>(nv * n));
  T* pos = buffers.workspace.take<T>(static_cast<std::size_t>(positions_ * n));
  const auto full_view = MatrixView<T>::dense(full, nv, n, Order::row_major);
  const auto pos_view = MatrixView<T>::dense(pos, positions_, n, Order::row_major);
  be.scale(A(0), full_view);
  be.scale(A(0), pos_view);
  be.scatter_add_rows(tokens_.data(), vocab_begin(), dY, full_view);
  be.scatter_add_rows(position_ids_.data(), 0, dY, pos_view);
  // wpe: the rank's tokens' rows, summed over the tokens axis; the same on every replica.
  all_reduce(*grid_, layout_.tokens, pos, positions_ * n);
  scatter_wte_grad(*grid_, layout_, be, wte_, full, accumulate);
  be.axpby(A(1), ConstMatrixView<T>(pos_view), accumulate ? A(1) : A(0), wpe_.grad_view());
}

// ---------------------------------------------------------------- cross-entropy

template <class T>
VocabCrossEntropy<T>::VocabCrossEntropy(ProcessGrid& grid, Backend& backend, VocabLayout layout,
                                        index_t tokens, index_t vocab, index_t normalizer)
    : grid_(&grid),
      backend_(&backend),
      layout_(layout),
      tokens_(tokens),
      vocab_(vocab),
      normalizer_(normalizer > 0 ? normalizer : tokens) {
  std::optional<std::string> error;
  if (tokens <= 0 || vocab <= 0 || vocab % gv(layout_) != 0 || tokens % gt(layout_) != 0)
    error = fmt::format(
        "{}: tokens={} and vocab={} must be positive, vocab divisible by {}={}, tokens by {}={}",
        who("CrossEntropy", layout_).text, tokens, vocab, layout_.vocab.name, layout_.vocab.size,
        layout_.tokens.name, layout_.tokens.size);
  grid.agree(layout_.agree_axis, error);
  targets_ = BackendIds(backend, static_cast<std::size_t>(tokens / gt(layout_)));
}

template <class T>
BufferNeeds VocabCrossEntropy<T>::buffer_needs() const {
  const index_t m = tokens_ / gt(layout_);
  ByteCount<acc_t<T>> fwd;  // row statistics in acc_t<T> (fp32 for bf16 logits)
  fwd.add(m).add(2 * m);    // max; sum | picked
  return {.workspace = 0, .forward = fwd, .backward = 0};
}

template <class T>
double VocabCrossEntropy<T>::forward(ConstMatrixView<T> Z, std::span<const std::int32_t> targets,
                                     StepBuffers& buffers) {
  const index_t nv = vocab_ / gv(layout_), m = tokens_ / gt(layout_);
  const Name op = who("CrossEntropy", layout_);
  {
    std::optional<std::string> error;
    if (Z.rows != m || Z.cols != nv)
      error =
          fmt::format("{}: local logits are {}x{}, expected {}x{}", op.text, Z.rows, Z.cols, m, nv);
    else
      error = ids_error(op, targets, tokens_, vocab_, "target", [] { return "tokens"; });
    grid_->agree_call(layout_.agree_axis, error);
  }
  Backend& be = *backend_;
  const auto n = static_cast<std::size_t>(m);
  const index_t col0 = layout_.vocab.rank * nv;
  targets_.assign(local_rows(targets, tokens_, layout_.tokens));
  max_ = buffers.forward.take<acc_t<T>>(n);
  stats_ = buffers.forward.take<acc_t<T>>(2 * n);
  be.row_max(Z, max_);
  all_reduce(*grid_, layout_.vocab, max_, m, ReduceOp::max);
  be.row_sum_exp(Z, max_, stats_);
  be.pick_targets(Z, targets_.data(), col0, stats_ + n);
  all_reduce(*grid_, layout_.vocab, stats_, 2 * m);
  // Every rank of the vocabulary axis holds its tokens' statistics.
  double total = be.cross_entropy_sum(m, max_, stats_, stats_ + n);
  all_reduce(*grid_, layout_.tokens, &total, 1);  // the token blocks
  return total / static_cast<double>(normalizer_);
}

template <class T>
void VocabCrossEntropy<T>::backward(MatrixView<T> Z, StepBuffers&) {
  require(max_ != nullptr, [&] {
    return std::string(who("CrossEntropy", layout_).text) + ": backward without forward";
  });
  check_view(who("CrossEntropy", layout_, "backward"), "Z", Z, tokens_ / gt(layout_),
             vocab_ / gv(layout_));
  backend_->cross_entropy_grad(Z, max_, stats_, targets_.data(),
                               layout_.vocab.rank * (vocab_ / gv(layout_)),
                               1.0 / static_cast<double>(normalizer_));
}

// ---------------------------------------------------------------- LM head

template <class T>
VocabLMHead<T>::VocabLMHead(ProcessGrid& grid, Backend& backend, VocabLayout layout, Param<T>& wte,
                            index_t tokens, index_t hidden, index_t vocab, index_t normalizer)
    : grid_(&grid),
      backend_(&backend),
      layout_(layout),
      wte_(&wte),
      tokens_(tokens),
      hidden_(hidden),
      vocab_(vocab),
      loss_(grid, backend, layout, tokens, vocab, normalizer) {
  const std::string op = who("LMHead", layout_).text;
  std::optional<std::string> error;
  if (hidden <= 0 || hidden % gh(layout_) != 0 || vocab % (gv(layout_) * gt(layout_)) != 0) {
    error = fmt::format("{}: hidden={} must be positive and divisible by {}={}, vocab={} by {}", op,
                        hidden, layout_.hidden.name, layout_.hidden.size, vocab,
                        vocab_divisor(layout_));
  } else if (layout_.sequence_parallel && (gt(layout_) != 1 || tokens % gv(layout_) != 0)) {
    error = fmt::format("{}: tokens={} must be divisible by {}={} (sequence parallelism)", op,
                        tokens, layout_.vocab.name, layout_.vocab.size);
  } else {
    const index_t rows = vocab / (gv(layout_) * gt(layout_)), cols = hidden / gh(layout_);
    if (wte.shard.local_rows != rows || wte.shard.local_cols != cols)
      error = fmt::format("{}: the tied embedding shard is {}x{}, expected {}x{}", op,
                          wte.shard.local_rows, wte.shard.local_cols, rows, cols);
  }
  grid.agree(layout_.agree_axis, error);
}

template <class T>
index_t VocabLMHead<T>::x_rows() const {
  return layout_.sequence_parallel ? tokens_ / gv(layout_) : tokens_ / gt(layout_);
}

template <class T>
std::size_t VocabLMHead<T>::scratch_bytes() const {
  const index_t m = tokens_ / gt(layout_), nv = vocab_ / gv(layout_), n = hidden_ / gh(layout_);
  const DType t = dtype_v<T>;
  return std::max({backend_->gemm_scratch_bytes(m, nv, n, t),    // Z = X wteᵀ
                   backend_->gemm_scratch_bytes(m, n, nv, t),    // dX = dZ wte
                   backend_->gemm_scratch_bytes(nv, n, m, t)});  // dwte = dZᵀ X
}

template <class T>
void VocabLMHead<T>::price(cost::Tally& t, model::Phase phase) const {
  constexpr cost::Elements el = cost::elements_of<T>();
  const auto u = [](index_t v) { return static_cast<cost::u64>(v); };
  if (phase == model::Phase::backward)
    vocab_cost::lm_head_backward(t, layout_, el, u(tokens_), u(vocab_), u(hidden_));
  else
    vocab_cost::lm_head_forward(t, layout_, el, u(tokens_), u(vocab_), u(hidden_));
}

template <class T>
BufferNeeds VocabLMHead<T>::buffer_needs() const {
  const index_t m = tokens_ / gt(layout_), nv = vocab_ / gv(layout_), n = hidden_ / gh(layout_);
  ByteCount<T> fwd, ws;
  fwd.add(m * nv);                      // logits
  if (gt(layout_) > 1) ws.add(nv * n);  // gathered wte block, reused for its gradient
  if (layout_.sequence_parallel) ws.add(m * n).add(m * n);  // X gathered, the partial dX
  ws.add_bytes(scratch_bytes());
  BufferNeeds needs{.workspace = ws, .forward = fwd, .backward = 0};
  needs.then(loss_.buffer_needs());
  return needs;
}

template <class T>
MatrixView<T> VocabLMHead<T>::gathered_wte(T* buffer) {
  return gather_wte(*grid_, layout_, *wte_, buffer, vocab_ / gv(layout_), hidden_ / gh(layout_));
}

template <class T>
double VocabLMHead<T>::forward(ConstMatrixView<T> X, std::span<const std::int32_t> targets,
                               StepBuffers& buffers) {
  using A = acc_t<T>;
  const index_t m = tokens_ / gt(layout_), nv = vocab_ / gv(layout_), n = hidden_ / gh(layout_);
  check_view(who("LMHead", layout_, "forward"), "X", X, x_rows(), n, layout_.sequence_parallel);
  logits_ = MatrixView<T>::dense(buffers.forward.take<T>(static_cast<std::size_t>(m * nv)), m, nv,
                                 Order::row_major);
  x_ = X;
  {
    ArenaScope scope(buffers.workspace);
    if (layout_.sequence_parallel) {  // every token's rows of X
      const auto xg = take_block<T>(buffers.workspace, m, n);
      grid_->comm(layout_.vocab.axis)
          .all_gather(X.data, xg.data, static_cast<std::size_t>(X.rows * n), dtype_v<T>);
      X = xg;
    }
    T* buf =
        gt(layout_) > 1 ? buffers.workspace.take<T>(static_cast<std::size_t>(nv * n)) : nullptr;
    const Scratch scratch = take_scratch(buffers.workspace, scratch_bytes());
    const auto W = ConstMatrixView<T>(gathered_wte(buf));
    backend_->gemm(Op::N, Op::T, A(1), X, W, A(0), logits_, scratch);
    all_reduce(*grid_, layout_.hidden, logits_.data, m * nv);
  }
  if (targets.empty()) return 0;  // logits only (LossHead::forward)
  return loss_.forward(logits_, targets, buffers);
}

template <class T>
void VocabLMHead<T>::backward(MatrixView<T> dX, StepBuffers& buffers, bool accumulate) {
  using A = acc_t<T>;
  require(logits_.data != nullptr,
          [&] { return std::string(who("LMHead", layout_).text) + ": backward without forward"; });
  const index_t m = tokens_ / gt(layout_), nv = vocab_ / gv(layout_), n = hidden_ / gh(layout_);
  check_view(who("LMHead", layout_, "backward"), "dX", dX, x_rows(), n, true);
  loss_.backward(logits_, buffers);  // logits_ now holds dL/dlogits
  if (layout_.sequence_parallel) {
    sequence_parallel_backward(dX, buffers, accumulate);
    return;
  }
  Backend& be = *backend_;
  ArenaScope scope(buffers.workspace);
  T* buf = gt(layout_) > 1 ? buffers.workspace.take<T>(static_cast<std::size_t>(nv * n)) : nullptr;
  const Scratch scratch = take_scratch(buffers.workspace, scratch_bytes());
  const auto dZ = ConstMatrixView<T>(logits_);
  be.gemm(Op::N, Op::N, A(1), dZ, ConstMatrixView<T>(gathered_wte(buf)), A(0), dX, scratch);
  Request request;
  if (layout_.vocab.size > 1) {
    Communicator& vc = grid_->comm(layout_.vocab.axis);
    const auto count = static_cast<std::size_t>(m * n);
    if (layout_.overlap_dx)
      request = vc.iall_reduce(dX.data, dX.data, count, dtype_v<T>, ReduceOp::sum);
    else
      vc.all_reduce(dX.data, dX.data, count, dtype_v<T>, ReduceOp::sum);
  }
  if (gt(layout_) == 1) {
    be.gemm(Op::T, Op::N, A(1), dZ, x_, accumulate ? A(1) : A(0), wte_->grad_view(), scratch);
  } else {
    be.gemm(Op::T, Op::N, A(1), dZ, x_, A(0), MatrixView<T>::dense(buf, nv, n, Order::row_major),
            scratch);
    scatter_wte_grad(*grid_, layout_, be, *wte_, buf, accumulate);
  }
  if (layout_.vocab.size > 1) grid_->comm(layout_.vocab.axis).wait(request);
}

// Sequence parallelism (a tokens axis of one): X's rows gathered again while
// the partial dX = dZ wte [tokens, H] is computed, then dX reduce-scattered
// to the rank's rows while dwte (+)= dZᵀ X_g is.
template <class T>
void VocabLMHead<T>::sequence_parallel_backward(MatrixView<T> dX, StepBuffers& buffers,
                                                bool accumulate) {
  using A = acc_t<T>;
  const index_t m = tokens_, n = hidden_ / gh(layout_);
  Backend& be = *backend_;
  Communicator& vc = grid_->comm(layout_.vocab.axis);
  ArenaScope scope(buffers.workspace);
  const auto xg = take_block<T>(buffers.workspace, m, n);
  const auto dxg = take_block<T>(buffers.workspace, m, n);
  const Scratch scratch = take_scratch(buffers.workspace, scratch_bytes());
  const auto count = static_cast<std::size_t>(dX.rows * n);
  Request gather = vc.iall_gather(x_.data, xg.data, count, dtype_v<T>);
  const auto dZ = ConstMatrixView<T>(logits_);
  be.gemm(Op::N, Op::N, A(1), dZ, ConstMatrixView<T>(wte_->value_view()), A(0), dxg, scratch);
  vc.wait(gather);
  Request scatter = vc.ireduce_scatter(dxg.data, dX.data, count, dtype_v<T>, ReduceOp::sum);
  be.gemm(Op::T, Op::N, A(1), dZ, ConstMatrixView<T>(xg), accumulate ? A(1) : A(0),
          wte_->grad_view(), scratch);
  vc.wait(scatter);
}

// ---------------------------------------------------------------- cost

namespace vocab_cost {

namespace {

void all_reduce(cost::Tally& t, const AxisSplit& a, u64 count, u64 e) {
  if (a.size > 1)
    t.all_reduce(a.axis, count, static_cast<u64>(a.size), static_cast<u64>(a.rank), e);
}
u64 shard(const VocabLayout& l, u64 vocab, u64 hidden) {
  return vocab * hidden / static_cast<u64>(gv(l) * gh(l) * gt(l));
}
void tokens_all_gather(cost::Tally& t, const VocabLayout& l, u64 per_rank, u64 e) {
  if (l.tokens.size > 1) t.all_gather(l.tokens.axis, per_rank, static_cast<u64>(l.tokens.size), e);
}
void tokens_reduce_scatter(cost::Tally& t, const VocabLayout& l, u64 per_rank, u64 e) {
  if (l.tokens.size > 1)
    t.reduce_scatter(l.tokens.axis, per_rank, static_cast<u64>(l.tokens.size), e);
}

}  // namespace

// The wte shard all-gathered over the tokens axis, the rows each vocabulary
// block holds all-reduced over the vocabulary axis.
void embedding_forward(cost::Tally& t, const VocabLayout& l, const cost::Elements& el, u64 tokens,
                       u64 vocab, u64 hidden) {
  const u64 block = tokens / static_cast<u64>(gt(l)) * (hidden / static_cast<u64>(gh(l)));
  if (l.sequence_parallel) {  // every token's lookup, reduce-scattered, then the position add
    const u64 own = block / static_cast<u64>(gv(l));
    t.memory(2 * block * el.e + own * el.e);
    t.reduce_scatter(l.vocab.axis, own, static_cast<u64>(gv(l)), el.e);
    t.memory(2 * own * el.e);
    return;
  }
  tokens_all_gather(t, l, shard(l, vocab, hidden), el.e);
  t.memory(3 * block * el.e);  // lookup and position add
  all_reduce(t, l.vocab, block, el.e);
}

// Row scatter-adds; over the tokens axis wpe's gradient all-reduced, dwte
// reduce-scattered.
void embedding_backward(cost::Tally& t, const VocabLayout& l, const cost::Elements& el, u64 tokens,
                        u64 vocab, u64 hidden, u64 positions) {
  const u64 cols = hidden / static_cast<u64>(gh(l));
  if (l.sequence_parallel)  // dY's rows gathered first
    t.all_gather(l.vocab.axis, tokens / static_cast<u64>(gv(l)) * cols, static_cast<u64>(gv(l)),
                 el.e);
  t.memory(3 * (tokens / static_cast<u64>(gt(l))) * cols * el.e);
  all_reduce(t, l.tokens, positions * cols, el.e);
  tokens_reduce_scatter(t, l, shard(l, vocab, hidden), el.e);
}

u64 embedding_params(const VocabLayout& l, u64 vocab, u64 hidden, u64 positions) {
  return shard(l, vocab, hidden) + positions * (hidden / static_cast<u64>(gh(l)));
}

// The logits' partial products all-reduced over the hidden axis, the
// cross-entropy's row max and (sum exp | target logit) over the vocabulary
// axis in acc_t, the loss (a double) over the tokens axis.
void lm_head_forward(cost::Tally& t, const VocabLayout& l, const cost::Elements& el, u64 tokens,
                     u64 vocab, u64 hidden) {
  const u64 m = tokens / static_cast<u64>(gt(l)), v = vocab / static_cast<u64>(gv(l));
  tokens_all_gather(t, l, shard(l, vocab, hidden), el.e);
  if (l.sequence_parallel)  // X's rows gathered
    t.all_gather(l.vocab.axis, m / static_cast<u64>(gv(l)) * hidden, static_cast<u64>(gv(l)), el.e);
  t.gemm(model::GemmMode::nt, m, v, hidden / static_cast<u64>(gh(l)), el.e);  // Z = X wteᵀ
  all_reduce(t, l.hidden, m * v, el.e);
  cross_entropy_forward(t, l, el, tokens, vocab);
}

// The row max, then (sum exp | target logit), all-reduced over the
// vocabulary axis in acc_t; the summed loss (a double) over the tokens axis.
void cross_entropy_forward(cost::Tally& t, const VocabLayout& l, const cost::Elements& el,
                           u64 tokens, u64 vocab) {
  const u64 m = tokens / static_cast<u64>(gt(l)), v = vocab / static_cast<u64>(gv(l));
  t.memory(m * v * el.e);  // row max
  all_reduce(t, l.vocab, m, el.a);
  t.pointwise(model::Pointwise::exp, m * v, m * v * el.e);  // sum exp, target
  all_reduce(t, l.vocab, 2 * m, el.a);
  all_reduce(t, l.tokens, 1, sizeof(double));
}

// dZ = softmax - onehot, in place.
void cross_entropy_backward(cost::Tally& t, const VocabLayout& l, const cost::Elements& el,
                            u64 tokens, u64 vocab) {
  const u64 m = tokens / static_cast<u64>(gt(l)), v = vocab / static_cast<u64>(gv(l));
  t.pointwise(model::Pointwise::exp, m * v, 2 * m * v * el.e);
}

// The wte shard gathered again, dX all-reduced over the vocabulary axis
// (overlapped with dwte's GEMM when the layout says so), dwte
// reduce-scattered over the tokens axis.
void lm_head_backward(cost::Tally& t, const VocabLayout& l, const cost::Elements& el, u64 tokens,
                      u64 vocab, u64 hidden) {
  const u64 m = tokens / static_cast<u64>(gt(l)), v = vocab / static_cast<u64>(gv(l)),
            k = hidden / static_cast<u64>(gh(l));
  cross_entropy_backward(t, l, el, tokens, vocab);
  if (l.sequence_parallel) {  // X gathered again, dX reduce-scattered (priced exposed, as 1D's)
    const u64 own = m / static_cast<u64>(gv(l)) * k, g = static_cast<u64>(gv(l));
    t.all_gather(l.vocab.axis, own, g, el.e);
    t.gemm(model::GemmMode::nn, m, k, v, el.e);  // dX = dZ wte
    t.overlapped = l.price_overlap_dx;
    t.reduce_scatter(l.vocab.axis, own, g, el.e);
    t.overlapped = false;
    t.gemm(model::GemmMode::tn, v, k, m, el.e);  // dwte = dZᵀ X
    return;
  }
  tokens_all_gather(t, l, shard(l, vocab, hidden), el.e);
  t.gemm(model::GemmMode::nn, m, k, v, el.e);  // dX = dZ wte
  t.overlapped = l.overlap_dx && l.price_overlap_dx;
  all_reduce(t, l.vocab, m * k, el.e);
  t.overlapped = false;
  t.gemm(model::GemmMode::tn, v, k, m, el.e);  // dwte = dZᵀ X
  tokens_reduce_scatter(t, l, shard(l, vocab, hidden), el.e);
}

}  // namespace vocab_cost

template class VocabEmbedding<float>;
template class VocabEmbedding<double>;
template class VocabEmbedding<bf16>;
template class VocabCrossEntropy<float>;
template class VocabCrossEntropy<double>;
template class VocabCrossEntropy<bf16>;
template class VocabLMHead<float>;
template class VocabLMHead<double>;
template class VocabLMHead<bf16>;

}  // namespace summa

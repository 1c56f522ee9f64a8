// The 3D (AxoNN) embedding, tied LM head and vocabulary-parallel
// cross-entropy.
#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <string>

#include "detail.hpp"
#include "summa/schemes/axonn3d/layers.hpp"

namespace summa {

using detail3d::check_view;
using detail3d::take_scratch;

namespace {

/// The rank's Z block of a global [batch*seq] id sequence.
std::span<const std::int32_t> local_rows(std::span<const std::int32_t> ids, index_t tokens, int gz,
                                         int z) {
  const auto n = static_cast<std::size_t>(tokens / gz);
  return ids.subspan(static_cast<std::size_t>(z) * n, n);
}

/// All-gathers the Z-sharded wte (local [V/(Gx*Gz), h/Gy]) into its block
/// [V/Gx, h/Gy] (the stored shard itself when Gz = 1).
template <class T>
MatrixView<T> gather_wte(ProcessGrid& grid, Param<T>& wte, T* buffer, index_t rows, index_t cols) {
  if (detail3d::gz(grid) == 1) return wte.value_view();
  grid.depth().all_gather(wte.value, buffer, static_cast<std::size_t>(wte.shard.local_size()));
  return MatrixView<T>::dense(buffer, rows, cols, Order::row_major);
}

/// Reduce-scatters the gathered-size wte gradient `full` [V/Gx, h/Gy] over Z
/// and adds the rank's shard to (or, without `accumulate`, stores it in)
/// wte's gradient. With Gz = 1 `full` must be the gradient itself (nothing
/// to do).
template <class T>
void scatter_wte_grad(ProcessGrid& grid, Backend& be, Param<T>& wte, T* full, bool accumulate) {
  using A = acc_t<T>;
  if (detail3d::gz(grid) == 1) return;
  const auto shard = static_cast<std::size_t>(wte.shard.local_size());
  if (accumulate) {
    grid.depth().reduce_scatter(full, full, shard, dtype_v<T>, ReduceOp::sum);
    be.axpby(A(1),
             ConstMatrixView<T>::dense(full, wte.shard.local_rows, wte.shard.local_cols,
                                       Order::row_major),
             A(1), wte.grad_view());
  } else {
    grid.depth().reduce_scatter(full, wte.grad, shard, dtype_v<T>, ReduceOp::sum);
  }
}

}  // namespace

// ---------------------------------------------------------------- embedding

namespace {

ProcessGrid& checked_embedding(ProcessGrid& grid, index_t batch, index_t seq, index_t vocab,
                               index_t hidden, index_t n_positions) {
  const int gx = detail3d::gx(grid), gy = detail3d::gy(grid), gz = detail3d::gz(grid);
  std::optional<std::string> error;
  if (batch <= 0 || seq <= 0 || vocab <= 0 || hidden <= 0 || n_positions <= 0)
    error = fmt::format(
        "Embedding3D: batch={}, seq={}, vocab={}, hidden={}, n_positions={} must be positive",
        batch, seq, vocab, hidden, n_positions);
  else if (seq > n_positions)
    error = fmt::format("Embedding3D: seq={} is longer than the position table (n_positions={})",
                        seq, n_positions);
  else if (batch % gz != 0)
    error = fmt::format("Embedding3D: batch={} must be divisible by Gz={}", batch, gz);
  else if (vocab % (static_cast<index_t>(gx) * gz) != 0)
    error = fmt::format("Embedding3D: vocab={} must be divisible by Gx*Gz = {}*{}", vocab, gx, gz);
  else if (hidden % gy != 0)
    error = fmt::format("Embedding3D: hidden={} must be divisible by Gy={}", hidden, gy);
  detail3d::agree(grid, error);
  return grid;
}

}  // namespace

template <class T>
Embedding3D<T>::Embedding3D(ProcessGrid& grid, Backend& backend, index_t batch, index_t seq,
                            index_t vocab, index_t hidden, index_t n_positions)
    : grid_(&checked_embedding(grid, batch, seq, vocab, hidden, n_positions)),
      backend_(&backend),
      batch_(batch),
      seq_(seq),
      vocab_(vocab),
      hidden_(hidden),
      positions_(n_positions),
      gx_(detail3d::gx(grid)),
      gy_(detail3d::gy(grid)),
      gz_(detail3d::gz(grid)) {
  const int x = detail3d::x_of(grid), y = detail3d::y_of(grid), z = detail3d::z_of(grid);
  wte_.shard = sharded3d("wte.weight", vocab, hidden, gx_, x, gz_, z, gy_, y);
  wpe_.shard = column_split3d("wpe.weight", {n_positions, hidden}, gy_, y, x == 0 && z == 0);
  const auto token_rows = static_cast<std::size_t>(batch * seq / gz_);
  position_ids_ = BackendIds::cyclic(backend, token_rows, seq);
  tokens_ = BackendIds(backend, token_rows);
}

template <class T>
void Embedding3D<T>::collect_parameters(std::vector<Param<T>*>& out) {
  out.push_back(&wte_);
  out.push_back(&wpe_);
}

template <class T>
BufferNeeds Embedding3D<T>::buffer_needs() const {
  ByteCount<T> ws;
  if (gz_ > 1) ws.add((vocab_ / gx_) * (hidden_ / gy_)).add(positions_ * (hidden_ / gy_));
  return {.workspace = ws, .forward = 0, .backward = 0};
}

template <class T>
index_t Embedding3D<T>::vocab_begin() const {
  return detail3d::x_of(*grid_) * (vocab_ / gx_);
}

template <class T>
void Embedding3D<T>::check_ids(std::span<const std::int32_t> ids, const char* what) const {
  std::optional<std::string> error;
  const index_t expected = batch_ * seq_;
  if (static_cast<index_t>(ids.size()) != expected) {
    error = fmt::format("Embedding3D: {} ids has {} values, expected batch*seq = {}*{} = {}", what,
                        ids.size(), batch_, seq_, expected);
  } else {
    const auto bad = std::find_if(ids.begin(), ids.end(),
                                  [&](std::int32_t id) { return id < 0 || id >= vocab_; });
    if (bad != ids.end())
      error = fmt::format("Embedding3D: {} id {} at position {} is outside [0, vocab={})", what,
                          *bad, bad - ids.begin(), vocab_);
  }
  grid_->agree_call(CommAxis::tensor, error);
}

template <class T>
void Embedding3D<T>::set_positions(std::span<const std::int32_t> positions) {
  grid_->agree_call(CommAxis::tensor,
                    positions_error("Embedding3D", positions, batch_ * seq_, positions_));
  // this rank's tokens: its Z slice
  position_ids_.assign(local_rows(positions, batch_ * seq_, gz_, detail3d::z_of(*grid_)));
}

template <class T>
void Embedding3D<T>::forward(std::span<const std::int32_t> tokens, MatrixView<T> Y,
                             StepBuffers& buffers) {
  check_ids(tokens, "token");
  const index_t m = batch_ * seq_ / gz_, n = hidden_ / gy_;
  check_view("Embedding3D forward", "Y", Y, m, n, true);
  Backend& be = *backend_;
  tokens_.assign(local_rows(tokens, batch_ * seq_, gz_, detail3d::z_of(*grid_)));
  ArenaScope scope(buffers.workspace);
  T* buf =
      gz_ > 1 ? buffers.workspace.take<T>(static_cast<std::size_t>((vocab_ / gx_) * n)) : nullptr;
  const auto block = ConstMatrixView<T>(gather_wte(*grid_, wte_, buf, vocab_ / gx_, n));
  // Exactly one X rank holds each token's row: the sum is exact.
  be.gather_rows(tokens_.data(), vocab_begin(), block, false, Y);
  detail3d::all_reduce(detail3d::x_comm(*grid_), Y.data, m * n);
  be.gather_rows(position_ids_.data(), 0, wpe_.value_view(), true, Y);
}

template <class T>
void Embedding3D<T>::backward(ConstMatrixView<T> dY, StepBuffers& buffers, bool accumulate) {
  using A = acc_t<T>;
  require(tokens_.size() > 0, "Embedding3D: backward without forward");
  const index_t m = batch_ * seq_ / gz_, n = hidden_ / gy_, nv = vocab_ / gx_;
  check_view("Embedding3D backward", "dY", dY, m, n);
  Backend& be = *backend_;
  if (gz_ == 1) {
    if (!accumulate) {
      be.scale(A(0), wte_.grad_view());
      be.scale(A(0), wpe_.grad_view());
    }
    be.scatter_add_rows(tokens_.data(), vocab_begin(), dY, wte_.grad_view());
    // dY is replicated over X: so is wpe's gradient, replicas stay equal.
    be.scatter_add_rows(position_ids_.data(), 0, dY, wpe_.grad_view());
    return;
  }
  ArenaScope scope(buffers.workspace);
  T* full = buffers.workspace.take<T>(static_cast<std::size_t>(nv * n));
  T* pos = buffers.workspace.take<T>(static_cast<std::size_t>(positions_ * n));
  const auto full_view = MatrixView<T>::dense(full, nv, n, Order::row_major);
  const auto pos_view = MatrixView<T>::dense(pos, positions_, n, Order::row_major);
  be.scale(A(0), full_view);
  be.scale(A(0), pos_view);
  be.scatter_add_rows(tokens_.data(), vocab_begin(), dY, full_view);
  be.scatter_add_rows(position_ids_.data(), 0, dY, pos_view);
  // wpe: the rank's tokens' rows, summed over Z; the same on every replica.
  detail3d::all_reduce(grid_->depth(), pos, positions_ * n);
  scatter_wte_grad(*grid_, be, wte_, full, accumulate);
  be.axpby(A(1), ConstMatrixView<T>(pos_view), accumulate ? A(1) : A(0), wpe_.grad_view());
}

// Cost of the embedding: the wte shard all-gathered over Z and
// the rows each vocabulary block holds all-reduced over X; backward
// all-reduces the wpe gradient over Z and reduce-scatters dwte over Z.
void detail3d::Cost3D::embedding_forward(cost::Tally& t, u64 tokens, u64 vocab, u64 hidden,
                                         u64) const {
  const u64 block = tokens / gz_ * (hidden / gy_);
  z_all_gather(t, wte_shard(vocab, hidden));
  t.memory(3 * block * el_.e);  // lookup and position add
  all_reduce(t, X(), block, el_.e);
}
void detail3d::Cost3D::embedding_backward(cost::Tally& t, u64 tokens, u64 vocab, u64 hidden,
                                          u64 positions) const {
  t.memory(3 * (tokens / gz_) * (hidden / gy_) * el_.e);  // row scatter-adds
  all_reduce(t, Z(), positions * (hidden / gy_), el_.e);
  z_reduce_scatter(t, wte_shard(vocab, hidden));
}
cost::u64 detail3d::Cost3D::embedding_params(u64 vocab, u64 hidden, u64 positions) const {
  return wte_shard(vocab, hidden) + positions * (hidden / gy_);
}

// ---------------------------------------------------------------- cross-entropy

template <class T>
CrossEntropy3D<T>::CrossEntropy3D(ProcessGrid& grid, Backend& backend, index_t tokens,
                                  index_t vocab, index_t normalizer)
    : grid_(&grid),
      backend_(&backend),
      tokens_(tokens),
      vocab_(vocab),
      normalizer_(normalizer > 0 ? normalizer : tokens),
      gx_(detail3d::gx(grid)),
      gz_(detail3d::gz(grid)) {
  std::optional<std::string> error;
  if (tokens <= 0 || vocab <= 0 || vocab % gx_ != 0 || tokens % gz_ != 0)
    error = fmt::format(
        "CrossEntropy3D: tokens={} and vocab={} must be positive, vocab divisible by Gx={}, tokens "
        "by Gz={}",
        tokens, vocab, gx_, gz_);
  detail3d::agree(grid, error);
  targets_ = BackendIds(backend, static_cast<std::size_t>(tokens / gz_));
}

template <class T>
BufferNeeds CrossEntropy3D<T>::buffer_needs() const {
  const index_t m = tokens_ / gz_;
  ByteCount<acc_t<T>> fwd;  // per-row statistics: fp32 for bf16
  fwd.add(m).add(2 * m);    // max; sum | picked
  return {.workspace = 0, .forward = fwd, .backward = 0};
}

template <class T>
double CrossEntropy3D<T>::forward(ConstMatrixView<T> Z, std::span<const std::int32_t> targets,
                                  StepBuffers& buffers) {
  const index_t nv = vocab_ / gx_, m = tokens_ / gz_;
  {
    std::optional<std::string> error;
    if (Z.rows != m || Z.cols != nv)
      error = fmt::format("CrossEntropy3D: local logits are {}x{}, expected {}x{}", Z.rows, Z.cols,
                          m, nv);
    else if (static_cast<index_t>(targets.size()) != tokens_)
      error = fmt::format("CrossEntropy3D: {} targets, expected {}", targets.size(), tokens_);
    else if (auto bad = std::find_if(targets.begin(), targets.end(),
                                     [&](std::int32_t t) { return t < 0 || t >= vocab_; });
             bad != targets.end())
      error = fmt::format("CrossEntropy3D: target id {} at position {} is outside [0, vocab={})",
                          *bad, bad - targets.begin(), vocab_);
    grid_->agree_call(CommAxis::tensor, error);
  }
  Backend& be = *backend_;
  Communicator& xc = detail3d::x_comm(*grid_);
  const auto n = static_cast<std::size_t>(m);
  const index_t col0 = detail3d::x_of(*grid_) * nv;
  targets_.assign(local_rows(targets, tokens_, gz_, detail3d::z_of(*grid_)));
  max_ = buffers.forward.take<acc_t<T>>(n);
  stats_ = buffers.forward.take<acc_t<T>>(2 * n);
  be.row_max(Z, max_);
  detail3d::all_reduce(xc, max_, m, ReduceOp::max);
  be.row_sum_exp(Z, max_, stats_);
  be.pick_targets(Z, targets_.data(), col0, stats_ + n);
  detail3d::all_reduce(xc, stats_, 2 * m);
  double total = be.cross_entropy_sum(m, max_, stats_, stats_ + n);
  detail3d::all_reduce(grid_->depth(), &total, 1);  // the Z blocks of tokens
  return total / static_cast<double>(normalizer_);
}

template <class T>
void CrossEntropy3D<T>::backward(MatrixView<T> Z, StepBuffers&) {
  require(max_ != nullptr, "CrossEntropy3D: backward without forward");
  check_view("CrossEntropy3D backward", "Z", Z, tokens_ / gz_, vocab_ / gx_);
  backend_->cross_entropy_grad(Z, max_, stats_, targets_.data(),
                               detail3d::x_of(*grid_) * (vocab_ / gx_),
                               1.0 / static_cast<double>(normalizer_));
}

// ---------------------------------------------------------------- LM head

template <class T>
LMHead3D<T>::LMHead3D(ProcessGrid& grid, Backend& backend, Param<T>& wte, index_t tokens,
                      index_t hidden, index_t vocab, index_t normalizer, Axonn3DOptions options)
    : grid_(&grid),
      backend_(&backend),
      wte_(&wte),
      tokens_(tokens),
      hidden_(hidden),
      vocab_(vocab),
      gx_(detail3d::gx(grid)),
      gy_(detail3d::gy(grid)),
      gz_(detail3d::gz(grid)),
      options_(options),
      loss_(grid, backend, tokens, vocab, normalizer) {
  std::optional<std::string> error;
  const index_t want_rows = vocab / (static_cast<index_t>(gx_) * gz_), want_cols = hidden / gy_;
  if (hidden <= 0 || hidden % gy_ != 0 || vocab % (static_cast<index_t>(gx_) * gz_) != 0)
    error = fmt::format(
        "LMHead3D: hidden={} must be positive and divisible by Gy={}, vocab={} by Gx*Gz={}", hidden,
        gy_, vocab, gx_ * gz_);
  else if (wte.shard.local_rows != want_rows || wte.shard.local_cols != want_cols)
    error = fmt::format("LMHead3D: the tied embedding shard is {}x{}, expected {}x{}",
                        wte.shard.local_rows, wte.shard.local_cols, want_rows, want_cols);
  detail3d::agree(grid, error);
}

template <class T>
std::size_t LMHead3D<T>::scratch_bytes() const {
  const index_t m = tokens_ / gz_, nv = vocab_ / gx_, n = hidden_ / gy_;
  const DType t = dtype_v<T>;
  return std::max({backend_->gemm_scratch_bytes(m, nv, n, t),    // Z = X wteᵀ
                   backend_->gemm_scratch_bytes(m, n, nv, t),    // dX = dZ wte
                   backend_->gemm_scratch_bytes(nv, n, m, t)});  // dwte = dZᵀ X
}

template <class T>
BufferNeeds LMHead3D<T>::buffer_needs() const {
  const index_t m = tokens_ / gz_, nv = vocab_ / gx_, n = hidden_ / gy_;
  ByteCount<T> fwd, ws;
  fwd.add(m * nv);              // logits
  if (gz_ > 1) ws.add(nv * n);  // gathered wte block, reused for its gradient
  ws.add_bytes(scratch_bytes());
  BufferNeeds needs{.workspace = ws, .forward = fwd, .backward = 0};
  needs.then(loss_.buffer_needs());
  return needs;
}

template <class T>
MatrixView<T> LMHead3D<T>::gathered_wte(T* buffer) {
  return gather_wte(*grid_, *wte_, buffer, vocab_ / gx_, hidden_ / gy_);
}

template <class T>
double LMHead3D<T>::forward(ConstMatrixView<T> X, std::span<const std::int32_t> targets,
                            StepBuffers& buffers) {
  using A = acc_t<T>;
  const index_t m = tokens_ / gz_, nv = vocab_ / gx_, n = hidden_ / gy_;
  check_view("LMHead3D forward", "X", X, m, n);
  logits_ = MatrixView<T>::dense(buffers.forward.take<T>(static_cast<std::size_t>(m * nv)), m, nv,
                                 Order::row_major);
  {
    ArenaScope scope(buffers.workspace);
    T* buf = gz_ > 1 ? buffers.workspace.take<T>(static_cast<std::size_t>(nv * n)) : nullptr;
    const Scratch scratch = take_scratch(buffers.workspace, scratch_bytes());
    const auto W = ConstMatrixView<T>(gathered_wte(buf));
    backend_->gemm(Op::N, Op::T, A(1), X, W, A(0), logits_, scratch);
    detail3d::all_reduce(detail3d::y_comm(*grid_), logits_.data, m * nv);
  }
  x_ = X;
  if (targets.empty()) return 0;  // logits only (LossHead::forward)
  return loss_.forward(logits_, targets, buffers);
}

template <class T>
void LMHead3D<T>::backward(MatrixView<T> dX, StepBuffers& buffers, bool accumulate) {
  using A = acc_t<T>;
  require(logits_.data != nullptr, "LMHead3D: backward without forward");
  const index_t m = tokens_ / gz_, nv = vocab_ / gx_, n = hidden_ / gy_;
  check_view("LMHead3D backward", "dX", dX, m, n, true);
  loss_.backward(logits_, buffers);  // logits_ now holds dL/dlogits
  Backend& be = *backend_;
  ArenaScope scope(buffers.workspace);
  T* buf = gz_ > 1 ? buffers.workspace.take<T>(static_cast<std::size_t>(nv * n)) : nullptr;
  const Scratch scratch = take_scratch(buffers.workspace, scratch_bytes());
  const auto dZ = ConstMatrixView<T>(logits_);
  be.gemm(Op::N, Op::N, A(1), dZ, ConstMatrixView<T>(gathered_wte(buf)), A(0), dX, scratch);
  Communicator& xc = detail3d::x_comm(*grid_);
  Request request;
  if (options_.overlap_all_reduce)
    request = detail3d::iall_reduce(xc, dX.data, m * n);
  else
    detail3d::all_reduce(xc, dX.data, m * n);
  if (gz_ == 1) {
    be.gemm(Op::T, Op::N, A(1), dZ, x_, accumulate ? A(1) : A(0), wte_->grad_view(), scratch);
  } else {
    be.gemm(Op::T, Op::N, A(1), dZ, x_, A(0), MatrixView<T>::dense(buf, nv, n, Order::row_major),
            scratch);
    scatter_wte_grad(*grid_, be, *wte_, buf, accumulate);
  }
  xc.wait(request);
}

// Cost of the LM head: the wte shard over Z, the logits' partial
// products all-reduced over Y, the cross-entropy's row max and (sum exp |
// target logit) over X in acc_t, the loss (a double) over Z; backward
// gathers the wte shard again, all-reduces dX over X and reduce-scatters
// dwte over Z.
void detail3d::Cost3D::lm_head_forward(cost::Tally& t, u64 tokens, u64 vocab, u64 hidden) const {
  const u64 m = tokens / gz_, v = vocab / gx_;
  z_all_gather(t, wte_shard(vocab, hidden));
  t.gemm(m, v, hidden / gy_, el_.e);  // Z = X wteᵀ
  all_reduce(t, Y(), m * v, el_.e);
  t.memory(m * v * el_.e);  // row max
  all_reduce(t, X(), m, el_.a);
  t.pointwise(model::Pointwise::exp, m * v, m * v * el_.e);  // sum exp, target
  all_reduce(t, X(), 2 * m, el_.a);
  all_reduce(t, Z(), 1, sizeof(double));
}
void detail3d::Cost3D::lm_head_backward(cost::Tally& t, u64 tokens, u64 vocab, u64 hidden) const {
  const u64 m = tokens / gz_, v = vocab / gx_, k = hidden / gy_;
  t.pointwise(model::Pointwise::exp, m * v, 2 * m * v * el_.e);  // dZ = softmax - onehot
  z_all_gather(t, wte_shard(vocab, hidden));
  t.gemm(m, k, v, el_.e);  // dX = dZ wte
  t.overlapped = overlap_.all_reduce;
  all_reduce(t, X(), m * k, el_.e);
  t.overlapped = false;
  t.gemm(v, k, m, el_.e);  // dwte = dZᵀ X
  z_reduce_scatter(t, wte_shard(vocab, hidden));
}

template class Embedding3D<float>;
template class Embedding3D<double>;
template class Embedding3D<bf16>;
template class CrossEntropy3D<float>;
template class CrossEntropy3D<double>;
template class CrossEntropy3D<bf16>;
template class LMHead3D<float>;
template class LMHead3D<double>;
template class LMHead3D<bf16>;

}  // namespace summa

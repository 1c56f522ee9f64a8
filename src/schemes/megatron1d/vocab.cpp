// The 1D (Megatron) vocabulary-parallel embedding, tied LM head and
// cross-entropy.
#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <string>

#include "detail.hpp"
#include "summa/schemes/megatron1d/layers.hpp"

namespace summa {

using detail1d::check_view;
using detail1d::take_scratch;

// ---------------------------------------------------------------- embedding

namespace {

ProcessGrid& checked_embedding(ProcessGrid& grid, index_t batch, index_t seq, index_t vocab,
                               index_t hidden, index_t n_positions) {
  const int p = detail1d::group_size(grid);
  std::optional<std::string> error;
  if (batch <= 0 || seq <= 0 || vocab <= 0 || hidden <= 0 || n_positions <= 0)
    error = fmt::format(
        "Embedding1D: batch={}, seq={}, vocab={}, hidden={}, n_positions={} must be positive",
        batch, seq, vocab, hidden, n_positions);
  else if (seq > n_positions)
    error = fmt::format("Embedding1D: seq={} is longer than the position table (n_positions={})",
                        seq, n_positions);
  else if (vocab % p != 0)
    error = fmt::format("Embedding1D: vocab={} must be divisible by p={}", vocab, p);
  detail1d::agree(grid, error);
  return grid;
}

}  // namespace

template <class T>
Embedding1D<T>::Embedding1D(ProcessGrid& grid, Backend& backend, index_t batch, index_t seq,
                            index_t vocab, index_t hidden, index_t n_positions)
    : grid_(&checked_embedding(grid, batch, seq, vocab, hidden, n_positions)),
      backend_(&backend),
      batch_(batch),
      seq_(seq),
      vocab_(vocab),
      hidden_(hidden),
      positions_(n_positions),
      p_(detail1d::group_size(grid)) {
  const int r = detail1d::group_rank(grid);
  wte_.shard = row_parallel_shard("wte.weight", vocab, hidden, p_, r);
  wpe_.shard = replicated_shard("wpe.weight", {n_positions, hidden}, r);
  const auto token_rows = static_cast<std::size_t>(batch * seq);
  position_ids_ = BackendIds::cyclic(backend, token_rows, seq);
  tokens_ = BackendIds(backend, token_rows);
}

template <class T>
void Embedding1D<T>::collect_parameters(std::vector<Param<T>*>& out) {
  out.push_back(&wte_);
  out.push_back(&wpe_);
}

template <class T>
BufferNeeds Embedding1D<T>::buffer_needs() const {
  return {};  // gathers straight into Y and reduces in place
}

template <class T>
index_t Embedding1D<T>::vocab_begin() const {
  return detail1d::group_rank(*grid_) * (vocab_ / p_);
}

template <class T>
void Embedding1D<T>::check_ids(std::span<const std::int32_t> ids, const char* what) const {
  std::optional<std::string> error;
  const index_t expected = batch_ * seq_;
  if (static_cast<index_t>(ids.size()) != expected) {
    error = fmt::format("Embedding1D: {} ids has {} values, expected batch*seq = {}*{} = {}", what,
                        ids.size(), batch_, seq_, expected);
  } else {
    const auto bad = std::find_if(ids.begin(), ids.end(),
                                  [&](std::int32_t id) { return id < 0 || id >= vocab_; });
    if (bad != ids.end())
      error = fmt::format("Embedding1D: {} id {} at position {} is outside [0, vocab={})", what,
                          *bad, bad - ids.begin(), vocab_);
  }
  grid_->agree_call(CommAxis::tensor, error);
}

template <class T>
void Embedding1D<T>::set_positions(std::span<const std::int32_t> positions) {
  grid_->agree_call(CommAxis::tensor,
                    positions_error("Embedding1D", positions, batch_ * seq_, positions_));
  position_ids_.assign(positions);
}

template <class T>
void Embedding1D<T>::forward(std::span<const std::int32_t> tokens, MatrixView<T> Y, StepBuffers&) {
  check_ids(tokens, "token");
  const index_t n = batch_ * seq_;
  check_view("Embedding1D forward", "Y", Y, n, hidden_, true);
  Backend& be = *backend_;
  tokens_.assign(tokens);
  // Exactly one rank holds each token's row: the sum is exact.
  be.gather_rows(tokens_.data(), vocab_begin(), wte_.value_view(), false, Y);
  grid_->tensor().all_reduce(Y.data, Y.data, static_cast<std::size_t>(n * hidden_), dtype_v<T>,
                             ReduceOp::sum);
  be.gather_rows(position_ids_.data(), 0, wpe_.value_view(), true, Y);
}

template <class T>
void Embedding1D<T>::backward(ConstMatrixView<T> dY, StepBuffers&, bool accumulate) {
  require(tokens_.size() > 0, "Embedding1D: backward without forward");
  check_view("Embedding1D backward", "dY", dY, batch_ * seq_, hidden_);
  Backend& be = *backend_;
  if (!accumulate) {
    be.scale(acc_t<T>(0), wte_.grad_view());
    be.scale(acc_t<T>(0), wpe_.grad_view());
  }
  be.scatter_add_rows(tokens_.data(), vocab_begin(), dY, wte_.grad_view());
  // dY is the same on every rank: so is wpe's gradient, replicas stay equal.
  be.scatter_add_rows(position_ids_.data(), 0, dY, wpe_.grad_view());
}

// Cost of the embedding: the vocabulary-parallel lookup's partial rows
// all-reduced in forward; backward is local (wpe replicated).
void detail1d::Cost1D::embedding_forward(cost::Tally& t, u64 tokens, u64, u64 hidden, u64) const {
  t.memory(3 * tokens * hidden * el_.e);  // lookup and position add
  all_reduce(t, tokens * hidden, el_.e);
}
void detail1d::Cost1D::embedding_backward(cost::Tally& t, u64 tokens, u64, u64 hidden, u64) const {
  t.memory(3 * tokens * hidden * el_.e);  // row scatter-adds
}
cost::u64 detail1d::Cost1D::embedding_params(u64 vocab, u64 hidden, u64 positions) const {
  return vocab / p_ * hidden + positions * hidden;
}

// ---------------------------------------------------------------- cross-entropy

template <class T>
CrossEntropy1D<T>::CrossEntropy1D(ProcessGrid& grid, Backend& backend, index_t tokens,
                                  index_t vocab, index_t normalizer)
    : grid_(&grid),
      backend_(&backend),
      tokens_(tokens),
      vocab_(vocab),
      normalizer_(normalizer > 0 ? normalizer : tokens),
      p_(detail1d::group_size(grid)) {
  std::optional<std::string> error;
  if (tokens <= 0 || vocab <= 0 || vocab % p_ != 0)
    error = fmt::format(
        "CrossEntropy1D: tokens={} and vocab={} must be positive, vocab divisible by p={}", tokens,
        vocab, p_);
  detail1d::agree(grid, error);
  targets_ = BackendIds(backend, static_cast<std::size_t>(tokens));
}

template <class T>
BufferNeeds CrossEntropy1D<T>::buffer_needs() const {
  ByteCount<acc_t<T>> fwd;            // row statistics in acc_t<T> (fp32 for bf16 logits)
  fwd.add(tokens_).add(2 * tokens_);  // max; sum | picked
  return {.workspace = 0, .forward = fwd, .backward = 0};
}

template <class T>
double CrossEntropy1D<T>::forward(ConstMatrixView<T> Z, std::span<const std::int32_t> targets,
                                  StepBuffers& buffers) {
  const index_t nv = vocab_ / p_;
  {
    std::optional<std::string> error;
    if (Z.rows != tokens_ || Z.cols != nv)
      error = fmt::format("CrossEntropy1D: local logits are {}x{}, expected {}x{}", Z.rows, Z.cols,
                          tokens_, nv);
    else if (static_cast<index_t>(targets.size()) != tokens_)
      error = fmt::format("CrossEntropy1D: {} targets, expected {}", targets.size(), tokens_);
    else if (auto bad = std::find_if(targets.begin(), targets.end(),
                                     [&](std::int32_t t) { return t < 0 || t >= vocab_; });
             bad != targets.end())
      error = fmt::format("CrossEntropy1D: target id {} at position {} is outside [0, vocab={})",
                          *bad, bad - targets.begin(), vocab_);
    grid_->agree_call(CommAxis::tensor, error);
  }
  Backend& be = *backend_;
  Communicator& group = grid_->tensor();
  const auto n = static_cast<std::size_t>(tokens_);
  const index_t col0 = detail1d::group_rank(*grid_) * nv;
  max_ = buffers.forward.take<acc_t<T>>(n);
  stats_ = buffers.forward.take<acc_t<T>>(2 * n);
  targets_.assign(targets);
  be.row_max(Z, max_);
  group.all_reduce(max_, max_, n, dtype_v<acc_t<T>>, ReduceOp::max);
  be.row_sum_exp(Z, max_, stats_);
  be.pick_targets(Z, targets_.data(), col0, stats_ + n);
  group.all_reduce(stats_, stats_, 2 * n, dtype_v<acc_t<T>>, ReduceOp::sum);
  // Every rank holds every token's statistics: the total is local.
  const double total = be.cross_entropy_sum(tokens_, max_, stats_, stats_ + n);
  return total / static_cast<double>(normalizer_);
}

template <class T>
void CrossEntropy1D<T>::backward(MatrixView<T> Z, StepBuffers&) {
  require(max_ != nullptr, "CrossEntropy1D: backward without forward");
  check_view("CrossEntropy1D backward", "Z", Z, tokens_, vocab_ / p_);
  backend_->cross_entropy_grad(Z, max_, stats_, targets_.data(),
                               detail1d::group_rank(*grid_) * (vocab_ / p_),
                               1.0 / static_cast<double>(normalizer_));
}

// ---------------------------------------------------------------- LM head

template <class T>
LMHead1D<T>::LMHead1D(ProcessGrid& grid, Backend& backend, Param<T>& wte, index_t tokens,
                      index_t hidden, index_t vocab, index_t normalizer)
    : grid_(&grid),
      backend_(&backend),
      wte_(&wte),
      tokens_(tokens),
      hidden_(hidden),
      vocab_(vocab),
      p_(detail1d::group_size(grid)),
      loss_(grid, backend, tokens, vocab, normalizer) {
  std::optional<std::string> error;
  if (hidden <= 0)
    error = fmt::format("LMHead1D: hidden={} must be positive", hidden);
  else if (wte.shard.local_rows != vocab / p_ || wte.shard.local_cols != hidden)
    error = fmt::format("LMHead1D: the tied embedding shard is {}x{}, expected {}x{}",
                        wte.shard.local_rows, wte.shard.local_cols, vocab / p_, hidden);
  detail1d::agree(grid, error);
}

template <class T>
std::size_t LMHead1D<T>::scratch_bytes() const {
  const index_t nv = vocab_ / p_;
  const DType t = dtype_v<T>;
  return std::max({backend_->gemm_scratch_bytes(tokens_, nv, hidden_, t),    // Z = X wte_rᵀ
                   backend_->gemm_scratch_bytes(tokens_, hidden_, nv, t),    // dX = dZ wte_r
                   backend_->gemm_scratch_bytes(nv, hidden_, tokens_, t)});  // dwte = dZᵀ X
}

template <class T>
BufferNeeds LMHead1D<T>::buffer_needs() const {
  ByteCount<T> fwd, ws;
  fwd.add(tokens_ * (vocab_ / p_));  // logits
  ws.add_bytes(scratch_bytes());
  BufferNeeds needs{.workspace = ws, .forward = fwd, .backward = 0};
  needs.then(loss_.buffer_needs());
  return needs;
}

template <class T>
double LMHead1D<T>::forward(ConstMatrixView<T> X, std::span<const std::int32_t> targets,
                            StepBuffers& buffers) {
  check_view("LMHead1D forward", "X", X, tokens_, hidden_);
  const index_t nv = vocab_ / p_;
  logits_ = MatrixView<T>::dense(buffers.forward.take<T>(static_cast<std::size_t>(tokens_ * nv)),
                                 tokens_, nv, Order::row_major);
  {
    ArenaScope scope(buffers.workspace);
    const Scratch scratch = take_scratch(buffers.workspace, scratch_bytes());
    backend_->gemm(Op::N, Op::T, acc_t<T>(1), X, ConstMatrixView<T>(wte_->value_view()),
                   acc_t<T>(0), logits_, scratch);
  }
  x_ = X;
  if (targets.empty()) return 0;  // logits only (LossHead::forward)
  return loss_.forward(logits_, targets, buffers);
}

template <class T>
void LMHead1D<T>::backward(MatrixView<T> dX, StepBuffers& buffers, bool accumulate) {
  require(logits_.data != nullptr, "LMHead1D: backward without forward");
  check_view("LMHead1D backward", "dX", dX, tokens_, hidden_, true);
  loss_.backward(logits_, buffers);  // logits_ now holds dL/dlogits
  ArenaScope scope(buffers.workspace);
  const Scratch scratch = take_scratch(buffers.workspace, scratch_bytes());
  const auto dZ = ConstMatrixView<T>(logits_);
  backend_->gemm(Op::N, Op::N, acc_t<T>(1), dZ, ConstMatrixView<T>(wte_->value_view()), acc_t<T>(0),
                 dX, scratch);
  Communicator& group = grid_->tensor();
  Request request = group.iall_reduce(dX.data, dX.data, static_cast<std::size_t>(tokens_ * hidden_),
                                      dtype_v<T>, ReduceOp::sum);
  backend_->gemm(Op::T, Op::N, acc_t<T>(1), dZ, x_, accumulate ? acc_t<T>(1) : acc_t<T>(0),
                 wte_->grad_view(), scratch);
  group.wait(request);
}

// Cost of the LM head: the vocabulary-split logits; forward all-reduces the
// cross-entropy's row max and (sum exp | target logit) in acc_t; backward
// all-reduces dX of the vocabulary-split product.
void detail1d::Cost1D::lm_head_forward(cost::Tally& t, u64 tokens, u64 vocab, u64 hidden) const {
  const u64 v = vocab / p_;
  t.gemm(tokens, v, hidden, el_.e);  // Z = X wteᵀ
  t.memory(tokens * v * el_.e);      // row max
  all_reduce(t, tokens, el_.a);
  t.pointwise(model::Pointwise::exp, tokens * v, tokens * v * el_.e);  // sum exp, target
  all_reduce(t, 2 * tokens, el_.a);
}
void detail1d::Cost1D::lm_head_backward(cost::Tally& t, u64 tokens, u64 vocab, u64 hidden) const {
  const u64 v = vocab / p_;
  t.pointwise(model::Pointwise::exp, tokens * v, 2 * tokens * v * el_.e);  // dZ = softmax - onehot
  t.gemm(tokens, hidden, v, el_.e);                                        // dX = dZ wte
  all_reduce(t, tokens * hidden, el_.e);
  t.gemm(v, hidden, tokens, el_.e);  // dwte = dZᵀ X
}

template class Embedding1D<float>;
template class Embedding1D<double>;
template class Embedding1D<bf16>;
template class CrossEntropy1D<float>;
template class CrossEntropy1D<double>;
template class CrossEntropy1D<bf16>;
template class LMHead1D<float>;
template class LMHead1D<double>;
template class LMHead1D<bf16>;

}  // namespace summa

#include "summa/schemes/summa2d/lm_head.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "detail.hpp"

namespace summa {

template <class T>
CrossEntropy2D<T>::CrossEntropy2D(SummaEngine& engine, index_t tokens, index_t vocab,
                                  index_t normalizer)
    : engine_(&engine),
      tokens_(tokens),
      vocab_(vocab),
      normalizer_(normalizer > 0 ? normalizer : tokens),
      q_(engine.q()) {
  std::optional<std::string> error;
  if (tokens <= 0 || vocab <= 0 || tokens % q_ != 0 || vocab % q_ != 0)
    error =
        fmt::format("CrossEntropy2D: tokens={} and vocab={} must be positive and divisible by q={}",
                    tokens, vocab, q_);
  engine.grid().agree(CommAxis::mesh, error);
  targets_ = BackendIds(engine.backend(), static_cast<std::size_t>(tokens / q_));
}

template <class T>
BufferNeeds CrossEntropy2D<T>::buffer_needs() const {
  ByteCount<acc_t<T>> fwd;  // row max | sum of exponentials, picked logits
  fwd.add(tokens_ / q_).add(2 * (tokens_ / q_));
  return {.workspace = 0, .forward = fwd, .backward = 0};
}

template <class T>
double CrossEntropy2D<T>::forward(ConstMatrixView<T> Z, std::span<const std::int32_t> targets,
                                  StepBuffers& buffers) {
  ProcessGrid& grid = engine_->grid();
  const GridCoords& c = grid.coords();
  const index_t nt = tokens_ / q_, nv = vocab_ / q_;
  {
    std::optional<std::string> error;
    if (Z.rows != nt || Z.cols != nv)
      error = fmt::format("CrossEntropy2D: local logits are {}x{}, expected {}x{}", Z.rows, Z.cols,
                          nt, nv);
    else if (static_cast<index_t>(targets.size()) != tokens_)
      error = fmt::format("CrossEntropy2D: {} targets, expected {}", targets.size(), tokens_);
    else if (auto bad = std::find_if(targets.begin(), targets.end(),
                                     [&](std::int32_t t) { return t < 0 || t >= vocab_; });
             bad != targets.end())
      error = fmt::format("CrossEntropy2D: target id {} at position {} is outside [0, vocab={})",
                          *bad, bad - targets.begin(), vocab_);
    engine_->settle(error);
  }
  Backend& be = engine_->backend();
  const auto n = static_cast<std::size_t>(nt);
  max_ = buffers.forward.take<acc_t<T>>(n);
  stats_ = buffers.forward.take<acc_t<T>>(2 * n);
  targets_.assign(targets.subspan(static_cast<std::size_t>(c.row * nt), n));
  Communicator& row = grid.mesh_row();
  be.row_max(Z, max_);
  row.all_reduce(max_, max_, n, dtype_v<acc_t<T>>, ReduceOp::max);
  be.row_sum_exp(Z, max_, stats_);
  be.pick_targets(Z, targets_.data(), c.col * nv, stats_ + n);
  row.all_reduce(stats_, stats_, 2 * n, dtype_v<acc_t<T>>, ReduceOp::sum);
  // Every rank of a mesh row now holds the same per-token statistics; summing
  // the row blocks along the mesh column gives the total over all tokens.
  double total = be.cross_entropy_sum(nt, max_, stats_, stats_ + n);
  grid.mesh_col().all_reduce(&total, &total, 1, DType::f64, ReduceOp::sum);
  return total / static_cast<double>(normalizer_);
}

template <class T>
void CrossEntropy2D<T>::backward(MatrixView<T> Z, StepBuffers&) {
  require(max_ != nullptr, "CrossEntropy2D: backward without forward");
  const index_t nv = vocab_ / q_;
  engine_->backend().cross_entropy_grad(Z, max_, stats_, targets_.data(),
                                        engine_->grid().coords().col * nv,
                                        1.0 / static_cast<double>(normalizer_));
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
      loss_(engine, tokens, vocab, normalizer) {
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
  const cost::u64 tokens = u(tokens_), vocab = u(vocab_), hidden = u(hidden_), q = r.q, e = r.el.e,
                  n = (tokens / q) * (vocab / q);
  if (phase != model::Phase::backward) {
    t.summa(Form::ABt, tokens, vocab, hidden, q, e, r.summa);
    t.memory(n * e);  // row max
    t.all_reduce(CommAxis::mesh_row, tokens / q, q, r.j, r.el.a);
    t.pointwise(model::Pointwise::exp, n, n * e);  // sum exp, target
    t.all_reduce(CommAxis::mesh_row, 2 * (tokens / q), q, r.j, r.el.a);
    t.all_reduce(CommAxis::mesh_col, 1, q, r.i, sizeof(double));
    return;
  }
  t.pointwise(model::Pointwise::exp, n, 2 * n * e);  // dZ = softmax - onehot, in place
  t.summa(Form::AB, tokens, hidden, vocab, q, e, r.summa);
  t.summa(Form::AtB, vocab, hidden, tokens, q, e, r.summa);
}

template class CrossEntropy2D<float>;
template class CrossEntropy2D<double>;
template class CrossEntropy2D<bf16>;
template class LMHead2D<float>;
template class LMHead2D<double>;
template class LMHead2D<bf16>;

}  // namespace summa

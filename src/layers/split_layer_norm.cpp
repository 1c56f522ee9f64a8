// The LayerNorm of split activations, once for the schemes that keep its
// parameters replicated (summa/layers/split_layer_norm.hpp).
#include "summa/layers/split_layer_norm.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <optional>
#include <string>
#include <utility>

#include "check_view.hpp"
#include "summa/model/cost.hpp"

namespace summa {

using detail::check_view;

namespace {

/// gamma or beta: [hidden] split like the columns, replicated elsewhere
/// (rooted: on tokens-rank 0 only).
ParamShard vector_shard(const NormLayout& l, std::string name, index_t hidden) {
  ParamShard s;
  s.name = std::move(name);
  s.global_shape = {hidden};
  if (l.rooted && l.tokens.rank != 0) return s;  // holds nothing
  s.local_rows = 1;
  s.local_cols = hidden / l.hidden.size;
  s.owner = l.replica_rank == 0 && l.tokens.rank == 0;
  s.pieces.push_back({.global_row = 0,
                      .global_col = l.hidden.rank * s.local_cols,
                      .local_row = 0,
                      .local_col = 0,
                      .rows = 1,
                      .cols = s.local_cols});
  return s;
}

ProcessGrid& checked(ProcessGrid& grid, const NormLayout& l, const std::string& name,
                     index_t tokens, index_t hidden, double eps) {
  const std::string op = fmt::format("LayerNorm{} '{}'", l.scheme, name);
  std::optional<std::string> error;
  if (tokens <= 0 || hidden <= 0)
    error = fmt::format("{}: tokens={} and hidden={} must be positive", op, tokens, hidden);
  else if (tokens % l.tokens.size != 0)
    error = fmt::format("{}: tokens={} must be divisible by {}={}", op, tokens, l.tokens.name,
                        l.tokens.size);
  else if (hidden % l.hidden.size != 0)
    error = fmt::format("{}: hidden={} must be divisible by {}={}", op, hidden, l.hidden.name,
                        l.hidden.size);
  else if (!(eps >= 0))
    error = fmt::format("{}: eps={} must be non-negative", op, eps);
  grid.agree(l.agree_axis, error);
  return grid;
}

/// "LayerNorm1D forward", on the stack: a step formats and allocates
/// nothing unless a check fails.
struct Where {
  char text[48];
};
Where where(const NormLayout& l, const char* phase) {
  Where w{};
  std::snprintf(w.text, sizeof w.text, "LayerNorm%s %s", l.scheme, phase);
  return w;
}

}  // namespace

template <class T>
SplitLayerNorm<T>::SplitLayerNorm(ProcessGrid& grid, Backend& backend, NormLayout layout,
                                  std::string name, index_t tokens, index_t hidden, double eps)
    : grid_(&checked(grid, layout, name, tokens, hidden, eps)),
      backend_(&backend),
      layout_(layout),
      name_(std::move(name)),
      tokens_(tokens),
      hidden_(hidden),
      eps_(eps) {
  gamma_.shard = vector_shard(layout_, name_ + ".weight", hidden);
  beta_.shard = vector_shard(layout_, name_ + ".bias", hidden);
}

template <class T>
void SplitLayerNorm<T>::collect_parameters(std::vector<Param<T>*>& out) {
  out.push_back(&gamma_);
  out.push_back(&beta_);
}

template <class T>
void SplitLayerNorm<T>::price(cost::Tally& t, model::Phase phase) const {
  constexpr cost::Elements el = cost::elements_of<T>();
  const auto u = [](index_t v) { return static_cast<cost::u64>(v); };
  if (phase == model::Phase::backward)
    norm_cost::backward(t, layout_, el, u(tokens_), u(hidden_));
  else
    norm_cost::forward(t, layout_, el, u(tokens_), u(hidden_));
}

template <class T>
BufferNeeds SplitLayerNorm<T>::buffer_needs() const {
  const index_t m = local_tokens(), n = local_hidden();
  // Per-row statistics in acc_t<T> (fp32 for bf16), parameter partials in T.
  ByteCount<acc_t<T>> fwd, ws;
  fwd.add(m).add(m);                                                     // mean, rstd
  ws.add(2 * m).add_bytes(static_cast<std::size_t>(2 * n) * sizeof(T));  // a | b; dgamma | dbeta
  // broadcast: forward's gamma | beta, backward's gamma (beside the above)
  if (broadcast()) ws.add_bytes(static_cast<std::size_t>(2 * n) * sizeof(T));
  return {.workspace = ws, .forward = fwd, .backward = 0};
}

template <class T>
void SplitLayerNorm<T>::forward(ConstMatrixView<T> X, MatrixView<T> Y, StepBuffers& buffers) {
  const index_t m = local_tokens(), n = local_hidden();
  const Where op = where(layout_, "forward");
  check_view(op.text, "X", X, m, n);
  check_view(op.text, "Y", Y, m, n);
  Backend& be = *backend_;
  mean_ = buffers.forward.take<acc_t<T>>(static_cast<std::size_t>(m));
  rstd_ = buffers.forward.take<acc_t<T>>(static_cast<std::size_t>(m));
  const auto sum_over_columns = [&](acc_t<T>* v) {
    if (layout_.hidden.size > 1)
      grid_->comm(layout_.hidden.axis)
          .all_reduce(v, v, static_cast<std::size_t>(m), dtype_v<acc_t<T>>, ReduceOp::sum);
  };
  ArenaScope scope(buffers.workspace);
  const T *gamma = gamma_.value, *beta = beta_.value;
  Request request;  // rooted: gamma | beta travel over the tokens axis during the statistics
  if (broadcast()) {
    T* params = buffers.workspace.take<T>(static_cast<std::size_t>(2 * n));
    if (layout_.tokens.rank == 0) {
      be.copy(ConstMatrixView<T>::dense(gamma, 1, n), MatrixView<T>::dense(params, 1, n));
      be.copy(ConstMatrixView<T>::dense(beta, 1, n), MatrixView<T>::dense(params + n, 1, n));
    }
    request = grid_->comm(layout_.tokens.axis)
                  .ibroadcast(params, static_cast<std::size_t>(2 * n), dtype_v<T>, 0);
    gamma = params;
    beta = params + n;
  }
  be.layernorm_partial_sums(X, nullptr, mean_);
  sum_over_columns(mean_);
  be.layernorm_mean(m, hidden_, mean_, mean_);
  be.layernorm_partial_sums(X, mean_, rstd_);  // second pass: squared deviations
  sum_over_columns(rstd_);
  be.layernorm_rstd(m, hidden_, eps_, rstd_, rstd_);
  if (broadcast()) grid_->comm(layout_.tokens.axis).wait(request);
  be.layernorm_apply(X, mean_, rstd_, gamma, beta, Y);
  x_ = X;
}

template <class T>
void SplitLayerNorm<T>::restore_input(ConstMatrixView<T> X) {
  const Where op = where(layout_, "restore_input");
  check_view(op.text, "X", X, local_tokens(), local_hidden());
  require(mean_ != nullptr, [&] {
    return fmt::format("LayerNorm{} '{}': restore_input without forward", layout_.scheme, name_);
  });
  x_ = X;
}

template <class T>
void SplitLayerNorm<T>::backward(ConstMatrixView<T> dY, MatrixView<T> dX, StepBuffers& buffers,
                                 bool accumulate) {
  using A = acc_t<T>;
  require(mean_ != nullptr, [&] {
    return fmt::format("LayerNorm{} '{}': backward without forward", layout_.scheme, name_);
  });
  const index_t m = local_tokens(), n = local_hidden();
  const Where op = where(layout_, "backward");
  check_view(op.text, "dY", dY, m, n);
  check_view(op.text, "dX", dX, m, n);
  Backend& be = *backend_;
  ArenaScope scope(buffers.workspace);
  A* ab = buffers.workspace.take<A>(static_cast<std::size_t>(2 * m));       // a | b row sums
  T* partial = buffers.workspace.take<T>(static_cast<std::size_t>(2 * n));  // dgamma | dbeta
  Communicator* tokens = layout_.tokens.size > 1 ? &grid_->comm(layout_.tokens.axis) : nullptr;
  const T* gamma = gamma_.value;
  Request request;  // rooted: gamma travels over the tokens axis during the parameter partials
  if (broadcast()) {
    T* g = buffers.workspace.take<T>(static_cast<std::size_t>(n));
    if (layout_.tokens.rank == 0)
      be.copy(ConstMatrixView<T>::dense(gamma, 1, n), MatrixView<T>::dense(g, 1, n));
    request = tokens->ibroadcast(g, static_cast<std::size_t>(n), dtype_v<T>, 0);
    gamma = g;
  }
  be.layernorm_param_partials(x_, dY, mean_, rstd_, partial, partial + n);  // needs no gamma
  if (broadcast()) tokens->wait(request);
  // dgamma | dbeta summed over the token blocks (rooted: to tokens-rank 0),
  // overlapped with dX
  if (broadcast())
    request = tokens->ireduce(partial, partial, static_cast<std::size_t>(2 * n), dtype_v<T>,
                              ReduceOp::sum, 0);
  else if (tokens != nullptr)
    request = tokens->iall_reduce(partial, partial, static_cast<std::size_t>(2 * n), dtype_v<T>,
                                  ReduceOp::sum);
  be.layernorm_backward_partials(x_, dY, mean_, rstd_, gamma, ab, ab + m);
  if (layout_.hidden.size > 1)
    grid_->comm(layout_.hidden.axis)
        .all_reduce(ab, ab, static_cast<std::size_t>(2 * m), dtype_v<A>, ReduceOp::sum);
  be.layernorm_backward_apply(x_, dY, mean_, rstd_, gamma, ab, ab + m, hidden_, dX);
  if (tokens != nullptr) tokens->wait(request);
  if (!gamma_.held()) return;  // rooted, off tokens-rank 0
  const A beta = accumulate ? A(1) : A(0);
  be.axpby(A(1), ConstMatrixView<T>::dense(partial, 1, n), beta, gamma_.grad_view());
  be.axpby(A(1), ConstMatrixView<T>::dense(partial + n, 1, n), beta, beta_.grad_view());
}

namespace norm_cost {

namespace {
void all_reduce(cost::Tally& t, const AxisSplit& a, u64 count, u64 e) {
  if (a.size > 1)
    t.all_reduce(a.axis, count, static_cast<u64>(a.size), static_cast<u64>(a.rank), e);
}
// rooted: the parameters' broadcast from tokens-rank 0
void broadcast(cost::Tally& t, const NormLayout& l, u64 count, u64 e) {
  if (l.rooted && l.tokens.size > 1)
    t.broadcast(l.tokens.axis, count, static_cast<u64>(l.tokens.size), l.tokens.rank == 0, e);
}
}  // namespace

// (rooted: gamma | beta broadcast over the tokens axis;) the two passes of
// the statistics and the apply; the row sums and squared deviations
// all-reduced over the hidden axis in acc_t.
void forward(cost::Tally& t, const NormLayout& l, const cost::Elements& el, u64 tokens,
             u64 hidden) {
  const u64 rows = tokens / static_cast<u64>(l.tokens.size);
  const u64 cols = hidden / static_cast<u64>(l.hidden.size);
  broadcast(t, l, 2 * cols, el.e);
  t.pointwise(model::Pointwise::layernorm, rows * cols, 4 * rows * cols * el.e);
  all_reduce(t, l.hidden, rows, el.a);
  all_reduce(t, l.hidden, rows, el.a);
}

// (rooted: gamma broadcast over the tokens axis;) the partials and parameter
// partials, then the apply; dgamma | dbeta summed over the tokens axis
// (rooted: reduced to tokens-rank 0), the a | b partials all-reduced over the
// hidden axis.
void backward(cost::Tally& t, const NormLayout& l, const cost::Elements& el, u64 tokens,
              u64 hidden) {
  const u64 rows = tokens / static_cast<u64>(l.tokens.size);
  const u64 cols = hidden / static_cast<u64>(l.hidden.size);
  broadcast(t, l, cols, el.e);
  t.pointwise(model::Pointwise::layernorm_grad, rows * cols, 7 * rows * cols * el.e);
  if (l.rooted && l.tokens.size > 1) {
    t.reduce(l.tokens.axis, 2 * cols, static_cast<u64>(l.tokens.size), l.tokens.rank == 0, el.e);
    all_reduce(t, l.hidden, 2 * rows, el.a);
  } else {
    all_reduce(t, l.hidden, 2 * rows, el.a);
    all_reduce(t, l.tokens, 2 * cols, el.e);
  }
}

}  // namespace norm_cost

template class SplitLayerNorm<float>;
template class SplitLayerNorm<double>;
template class SplitLayerNorm<bf16>;

}  // namespace summa

#include "summa/schemes/summa2d/layernorm.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "detail.hpp"

namespace summa {

namespace {

// Every local check of a call, then one agreement over the mesh (or a local
// throw without consensus checks) before any collective. Messages are built
// only on failure.
class Checks {
 public:
  Checks(const char* where, index_t rows, index_t cols) : where_(where), rows_(rows), cols_(cols) {}
  template <class V>
  void block(const char* what, const V& v) {
    if (error_) return;
    if (v.rows != rows_ || v.cols != cols_)
      error_ = fmt::format("{}: local {} block is {}x{}, expected {}x{}", where_, what, v.rows,
                           v.cols, rows_, cols_);
    else
      try {
        v.check_layout(what);
      } catch (const Error& e) {
        error_ = fmt::format("{}: {}", where_, e.what());
      }
  }
  void pointer(const char* what, const void* p) {
    if (!error_ && p == nullptr) error_ = fmt::format("{}: null {}", where_, what);
  }
  void workspace(const Workspace& ws, std::size_t needed) {
    const std::size_t free_bytes = ws.capacity() - ws.used();
    if (!error_ && free_bytes < needed)
      error_ = fmt::format("{}: workspace '{}' has {} bytes free, needs {}", where_, ws.name(),
                           free_bytes, needed);
  }
  void settle(SummaEngine& engine) { engine.settle(error_); }

 private:
  const char* where_;
  index_t rows_, cols_;
  std::optional<std::string> error_;
};

}  // namespace

LayerNorm2D::LayerNorm2D(SummaEngine& engine, index_t tokens, index_t hidden, double eps)
    : engine_(&engine), tokens_(tokens), hidden_(hidden), eps_(eps), q_(engine.q()) {
  std::optional<std::string> error;
  for (auto [name, v] : {std::pair<const char*, index_t>{"tokens", tokens}, {"hidden", hidden}})
    if (v <= 0 || v % q_ != 0) {
      error = fmt::format("LayerNorm2D: {}={} must be positive and divisible by q={}", name, v, q_);
      break;
    }
  if (!error && !(eps >= 0)) error = fmt::format("LayerNorm2D: eps={} must be non-negative", eps);
  engine.grid().agree(CommAxis::mesh, error);
}

bool LayerNorm2D::owns_parameters() const {
  return engine_->grid().coords().row == 0;
}

std::size_t LayerNorm2D::workspace_bytes(DType t) const {
  const auto nh = static_cast<std::size_t>(local_hidden());
  const auto nt = static_cast<std::size_t>(local_tokens());
  const std::size_t forward = Arena::rounded(2 * nh * size_of(t));    // gamma | beta
  const std::size_t backward = Arena::rounded(nh * size_of(t))        // gamma
                               + Arena::rounded(2 * nh * size_of(t))  // dgamma | dbeta partials
                               + Arena::rounded(2 * nt * size_of(acc_dtype(t)));  // a | b
  return std::max(forward, backward);
}

template <class T>
void LayerNorm2D::forward(ConstMatrixView<T> X, const T* gamma, const T* beta, MatrixView<T> Y,
                          acc_t<T>* mean_out, acc_t<T>* rstd_out, Workspace& ws) {
  ProcessGrid& grid = engine_->grid();
  Backend& be = engine_->backend();
  const bool owner = owns_parameters();
  const index_t nt = local_tokens(), nh = local_hidden();
  {
    Checks c("LayerNorm2D forward", nt, nh);
    c.block("X", X);
    c.block("Y", Y);
    if (owner) c.pointer("gamma on an owner", gamma);
    if (owner) c.pointer("beta on an owner", beta);
    c.pointer("mean output", mean_out);
    c.pointer("rstd output", rstd_out);
    c.workspace(ws, workspace_bytes(dtype_v<T>));
    c.settle(*engine_);
  }
  ArenaScope scope(ws);
  const auto n = static_cast<std::size_t>(nh), m = static_cast<std::size_t>(nt);
  // gamma | beta travel down the mesh column while the statistics are computed.
  T* params = ws.take<T>(2 * n);
  if (owner) {
    be.copy(ConstMatrixView<T>::dense(gamma, 1, nh), MatrixView<T>::dense(params, 1, nh));
    be.copy(ConstMatrixView<T>::dense(beta, 1, nh), MatrixView<T>::dense(params + n, 1, nh));
  }
  Request request = grid.mesh_col().ibroadcast(params, 2 * n, dtype_v<T>, 0);
  Communicator& row = grid.mesh_row();
  be.layernorm_partial_sums(X, nullptr, mean_out);
  row.all_reduce(mean_out, mean_out, m, dtype_v<acc_t<T>>, ReduceOp::sum);
  be.layernorm_mean(nt, hidden_, mean_out, mean_out);
  be.layernorm_partial_sums(X, mean_out, rstd_out);  // second pass: squared deviations
  row.all_reduce(rstd_out, rstd_out, m, dtype_v<acc_t<T>>, ReduceOp::sum);
  be.layernorm_rstd(nt, hidden_, eps_, rstd_out, rstd_out);
  grid.mesh_col().wait(request);
  be.layernorm_apply(X, mean_out, rstd_out, params, params + n, Y);
}

template <class T>
void LayerNorm2D::backward(ConstMatrixView<T> X, ConstMatrixView<T> dY, const T* gamma,
                           const acc_t<T>* mean, const acc_t<T>* rstd, MatrixView<T> dX, T* dgamma,
                           T* dbeta, Workspace& ws, bool accumulate) {
  ProcessGrid& grid = engine_->grid();
  Backend& be = engine_->backend();
  const bool owner = owns_parameters();
  const index_t nt = local_tokens(), nh = local_hidden();
  {
    Checks c("LayerNorm2D backward", nt, nh);
    c.block("X", X);
    c.block("dY", dY);
    c.block("dX", dX);
    if (owner) c.pointer("gamma on an owner", gamma);
    if (owner) c.pointer("gamma gradient on an owner", dgamma);
    if (owner) c.pointer("beta gradient on an owner", dbeta);
    c.pointer("mean", mean);
    c.pointer("rstd", rstd);
    c.workspace(ws, workspace_bytes(dtype_v<T>));
    c.settle(*engine_);
  }
  ArenaScope scope(ws);
  const auto n = static_cast<std::size_t>(nh), m = static_cast<std::size_t>(nt);
  T* g = ws.take<T>(n);
  T* partial = ws.take<T>(2 * n);           // dgamma | dbeta column sums
  acc_t<T>* ab = ws.take<acc_t<T>>(2 * m);  // a | b row sums
  if (owner) be.copy(ConstMatrixView<T>::dense(gamma, 1, nh), MatrixView<T>::dense(g, 1, nh));
  Communicator& col = grid.mesh_col();
  Request bcast = col.ibroadcast(g, n, dtype_v<T>, 0);
  be.layernorm_param_partials(X, dY, mean, rstd, partial, partial + n);  // needs no gamma
  col.wait(bcast);
  Request reduce = col.ireduce(partial, partial, 2 * n, dtype_v<T>, ReduceOp::sum, 0);
  be.layernorm_backward_partials(X, dY, mean, rstd, g, ab, ab + m);
  grid.mesh_row().all_reduce(ab, ab, 2 * m, dtype_v<acc_t<T>>, ReduceOp::sum);
  be.layernorm_backward_apply(X, dY, mean, rstd, g, ab, ab + m, hidden_, dX);
  col.wait(reduce);
  if (owner) {
    using A = acc_t<T>;
    const A beta = accumulate ? A(1) : A(0);
    be.axpby(A(1), ConstMatrixView<T>::dense(partial, 1, nh), beta,
             MatrixView<T>::dense(dgamma, 1, nh));
    be.axpby(A(1), ConstMatrixView<T>::dense(partial + n, 1, nh), beta,
             MatrixView<T>::dense(dbeta, 1, nh));
  }
}

// Cost: gamma | beta broadcast down the mesh columns from row 0,
// the row sums and squared deviations all-reduced along the mesh rows (in
// acc_t); backward broadcasts gamma, reduces dgamma | dbeta to row 0 and
// all-reduces the a | b partials along the rows.
template <class T>
void LayerNorm2DLayer<T>::price(cost::Tally& t, model::Phase phase) const {
  const auto u = [](index_t v) { return static_cast<cost::u64>(v); };
  const detail2d::MeshRank r = detail2d::mesh_rank<T>(op_.engine());
  const cost::u64 tokens = u(op_.tokens()), hidden = u(op_.hidden()), q = r.q, e = r.el.e,
                  block = (tokens / q) * (hidden / q) * e;
  if (phase != model::Phase::backward) {
    t.broadcast(CommAxis::mesh_col, 2 * (hidden / q), q, r.i == 0, e);
    // the two passes of the statistics, then apply
    t.pointwise(model::Pointwise::layernorm, block / e, 4 * block);
    t.all_reduce(CommAxis::mesh_row, tokens / q, q, r.j, r.el.a);  // sums
    t.all_reduce(CommAxis::mesh_row, tokens / q, q, r.j, r.el.a);  // squared deviations
    return;
  }
  t.broadcast(CommAxis::mesh_col, hidden / q, q, r.i == 0, e);
  // partials and parameter partials, then apply
  t.pointwise(model::Pointwise::layernorm_grad, block / e, 7 * block);
  t.reduce(CommAxis::mesh_col, 2 * (hidden / q), q, r.i == 0, e);
  t.all_reduce(CommAxis::mesh_row, 2 * (tokens / q), q, r.j, r.el.a);
}
template void LayerNorm2DLayer<float>::price(cost::Tally&, model::Phase) const;
template void LayerNorm2DLayer<double>::price(cost::Tally&, model::Phase) const;
template void LayerNorm2DLayer<bf16>::price(cost::Tally&, model::Phase) const;

#define SUMMA_LAYERNORM2D_INSTANTIATE(T)                                                          \
  template void LayerNorm2D::forward<T>(ConstMatrixView<T>, const T*, const T*, MatrixView<T>,    \
                                        acc_t<T>*, acc_t<T>*, Workspace&);                        \
  template void LayerNorm2D::backward<T>(ConstMatrixView<T>, ConstMatrixView<T>, const T*,        \
                                         const acc_t<T>*, const acc_t<T>*, MatrixView<T>, T*, T*, \
                                         Workspace&, bool);
SUMMA_LAYERNORM2D_INSTANTIATE(float)
SUMMA_LAYERNORM2D_INSTANTIATE(double)
SUMMA_LAYERNORM2D_INSTANTIATE(bf16)
#undef SUMMA_LAYERNORM2D_INSTANTIATE

}  // namespace summa

#include "summa/schemes/summa2d/linear.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "detail.hpp"

namespace summa {

Linear2D::Linear2D(SummaEngine& engine, index_t tokens, index_t in, index_t out, bool has_bias)
    : engine_(&engine), tokens_(tokens), in_(in), out_(out), has_bias_(has_bias), q_(engine.q()) {
  std::optional<std::string> error;
  for (auto [name, v] :
       {std::pair<const char*, index_t>{"tokens", tokens}, {"in", in}, {"out", out}})
    if (v <= 0 || v % q_ != 0) {
      error = fmt::format("Linear2D: {}={} must be positive and divisible by q={}", name, v, q_);
      break;
    }
  engine.grid().agree(CommAxis::mesh, error);
}

bool Linear2D::owns_bias() const {
  return has_bias_ && engine_->grid().coords().row == 0;
}

std::size_t Linear2D::workspace_bytes(DType t) const {
  const std::size_t bias =
      has_bias_ ? Arena::rounded(static_cast<std::size_t>(local_out()) * size_of(t)) : 0;
  const std::size_t summa = std::max({engine_->workspace_bytes(Form::AB, tokens_, out_, in_, t),
                                      engine_->workspace_bytes(Form::ABt, tokens_, in_, out_, t),
                                      engine_->workspace_bytes(Form::AtB, in_, out_, tokens_, t)});
  return bias + summa;
}

template <class T>
void Linear2D::forward(ConstMatrixView<T> X, ConstMatrixView<T> W, const T* bias, MatrixView<T> Y,
                       Workspace& ws) {
  ProcessGrid& grid = engine_->grid();
  const bool owner = owns_bias();
  engine_->settle(owner && bias == nullptr
                      ? std::optional<std::string>("Linear2D forward: null bias on an owner")
                      : std::nullopt);
  ArenaScope scope(ws);
  T* b = nullptr;
  Request request;
  const auto nb = static_cast<std::size_t>(local_out());
  if (has_bias_) {  // broadcast the bias down the mesh column while the GEMM runs
    b = ws.take<T>(nb);
    if (owner)
      engine_->backend().copy(
          ConstMatrixView<T>::dense(bias, 1, static_cast<index_t>(nb), Order::row_major),
          MatrixView<T>::dense(b, 1, static_cast<index_t>(nb), Order::row_major));
    request = grid.mesh_col().ibroadcast(b, nb, dtype_v<T>, 0);
  }
  engine_->multiply(Form::AB, tokens_, out_, in_, acc_t<T>(1), X, W, acc_t<T>(0), Y, ws);
  if (has_bias_) {
    grid.mesh_col().wait(request);
    engine_->backend().add_bias(Y, b);
  }
}

template <class T>
void Linear2D::backward(ConstMatrixView<T> X, ConstMatrixView<T> W, ConstMatrixView<T> dY,
                        MatrixView<T> dX, MatrixView<T> dW, T* dbias, Workspace& ws,
                        bool accumulate) {
  ProcessGrid& grid = engine_->grid();
  const bool owner = owns_bias();
  engine_->settle(
      owner && dbias == nullptr
          ? std::optional<std::string>("Linear2D backward: null bias gradient on an owner")
          : std::nullopt);
  using A = acc_t<T>;
  const A beta = accumulate ? A(1) : A(0);
  if (!(dX.rows == 0 && dX.cols == 0))
    engine_->multiply(Form::ABt, tokens_, in_, out_, A(1), dY, W, A(0), dX, ws);
  engine_->multiply(Form::AtB, in_, out_, tokens_, A(1), X, dY, beta, dW, ws);
  if (!has_bias_) return;
  ArenaScope scope(ws);
  const auto nb = static_cast<std::size_t>(local_out());
  T* partial = ws.take<T>(nb);
  engine_->backend().column_sums(dY, A(0), partial);
  grid.mesh_col().reduce(partial, partial, nb, dtype_v<T>, ReduceOp::sum, 0);
  if (owner) {
    const auto n = static_cast<index_t>(nb);
    engine_->backend().axpby(A(1), MatrixView<T>::dense(partial, 1, n), beta,
                             MatrixView<T>::dense(dbias, 1, n));
  }
}

// Cost: the SUMMA products (Y = X W; dX = dY Wᵀ, dW = Xᵀ dY),
// the bias broadcast down the mesh columns from row 0 in forward and its
// gradient reduced to row 0 in backward. Both roles alike (2D keeps one
// activation layout).
template <class T>
void Linear2DLayer<T>::price(cost::Tally& t, model::Phase phase) const {
  const auto u = [](index_t v) { return static_cast<cost::u64>(v); };
  const detail2d::MeshRank r = detail2d::mesh_rank<T>(op_.engine());
  const cost::u64 tokens = u(op_.tokens()), in = u(op_.in()), out = u(op_.out()), q = r.q,
                  e = r.el.e;
  const bool bias = op_.has_bias();
  if (phase != model::Phase::backward) {
    if (bias) {  // in flight while the product runs
      t.overlapped = true;
      t.broadcast(CommAxis::mesh_col, out / q, q, r.i == 0, e);
      t.overlapped = false;
    }
    t.summa(Form::AB, tokens, out, in, q, e, r.summa);
    if (bias) t.memory(2 * (tokens / q) * (out / q) * e);
    return;
  }
  t.summa(Form::ABt, tokens, in, out, q, e, r.summa);  // dX
  t.summa(Form::AtB, in, out, tokens, q, e, r.summa);  // dW
  if (bias) {
    t.memory((tokens / q) * (out / q) * e);
    t.reduce(CommAxis::mesh_col, out / q, q, r.i == 0, e);
  }
}
template void Linear2DLayer<float>::price(cost::Tally&, model::Phase) const;
template void Linear2DLayer<double>::price(cost::Tally&, model::Phase) const;
template void Linear2DLayer<bf16>::price(cost::Tally&, model::Phase) const;

template void Linear2D::forward<float>(ConstMatrixView<float>, ConstMatrixView<float>, const float*,
                                       MatrixView<float>, Workspace&);
template void Linear2D::forward<double>(ConstMatrixView<double>, ConstMatrixView<double>,
                                        const double*, MatrixView<double>, Workspace&);
template void Linear2D::backward<float>(ConstMatrixView<float>, ConstMatrixView<float>,
                                        ConstMatrixView<float>, MatrixView<float>,
                                        MatrixView<float>, float*, Workspace&, bool);
template void Linear2D::backward<double>(ConstMatrixView<double>, ConstMatrixView<double>,
                                         ConstMatrixView<double>, MatrixView<double>,
                                         MatrixView<double>, double*, Workspace&, bool);
template void Linear2D::forward<bf16>(ConstMatrixView<bf16>, ConstMatrixView<bf16>, const bf16*,
                                      MatrixView<bf16>, Workspace&);
template void Linear2D::backward<bf16>(ConstMatrixView<bf16>, ConstMatrixView<bf16>,
                                       ConstMatrixView<bf16>, MatrixView<bf16>, MatrixView<bf16>,
                                       bf16*, Workspace&, bool);

}  // namespace summa

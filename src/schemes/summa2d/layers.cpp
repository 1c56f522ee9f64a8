// The 2D (SUMMA) layers (summa/schemes/summa2d/layers.hpp): Linear2D and its
// Layer face with the shard descriptions, and the LayerNorm layout
// (the 2D LayerNorm is SplitLayerNorm over it).
#include "summa/schemes/summa2d/layers.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "detail.hpp"

namespace summa {

// ---------------------------------------------------------------- linear

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

// ---------------------------------------------------------------- shards and the Layer face

namespace {

// Linear2D's constructor checks divisibility by q; the groups need it too.
Linear2D make_linear(SummaEngine& engine, const std::string& name, index_t tokens, index_t in,
                     index_t out, bool has_bias, ColumnGroups groups) {
  const int q = engine.q();
  std::optional<std::string> error;
  if (groups.out < 1 || out % (static_cast<index_t>(groups.out) * q) != 0)
    error = fmt::format("Linear2DLayer '{}': out={} must be divisible by groups*q = {}*{}", name,
                        out, groups.out, q);
  else if (groups.in < 1 || in % (static_cast<index_t>(groups.in) * q) != 0)
    error = fmt::format("Linear2DLayer '{}': in={} must be divisible by input groups*q = {}*{}",
                        name, in, groups.in, q);
  engine.grid().agree(CommAxis::mesh, error);
  return Linear2D(engine, tokens, in, out, has_bias);
}

}  // namespace

template <class T>
Linear2DLayer<T>::Linear2DLayer(SummaEngine& engine, std::string name, index_t tokens, index_t in,
                                index_t out, bool has_bias, ColumnGroups groups)
    : op_(make_linear(engine, name, tokens, in, out, has_bias, groups)), name_(std::move(name)) {
  const GridCoords& c = engine.grid().coords();
  const int q = engine.q();
  const DimSplit columns{.parts = q, .block = c.col, .groups = groups.out};
  weight_.shard = split_shard(name_ + ".weight", {in, out},
                              {.parts = q, .block = c.row, .groups = groups.in}, columns);
  if (has_bias) {  // on mesh row 0; the other rows hold nothing
    bias_.shard = c.row == 0 ? split_shard(name_ + ".bias", {out}, {}, columns) : ParamShard{};
    bias_.shard.name = name_ + ".bias";
    bias_.shard.global_shape = {out};
  }
}

template <class T>
void Linear2DLayer<T>::collect_parameters(std::vector<Param<T>*>& out) {
  out.push_back(&weight_);
  if (op_.has_bias()) out.push_back(&bias_);
}

template <class T>
BufferNeeds Linear2DLayer<T>::buffer_needs() const {
  return {.workspace = op_.workspace_bytes(dtype_v<T>), .forward = 0, .backward = 0};
}

template <class T>
void Linear2DLayer<T>::forward(ConstMatrixView<T> X, MatrixView<T> Y, StepBuffers& buffers) {
  op_.forward<T>(X, weight_.value_view(), bias_.value, Y, buffers.workspace);
  x_ = X;
}

template <class T>
void Linear2DLayer<T>::backward(ConstMatrixView<T> dY, MatrixView<T> dX, StepBuffers& buffers,
                                bool accumulate) {
  require(x_.data != nullptr || x_.rows * x_.cols == 0,
          [&] { return fmt::format("Linear2DLayer '{}': backward without forward", name_); });
  op_.backward<T>(x_, weight_.value_view(), dY, dX, weight_.grad_view(), bias_.grad,
                  buffers.workspace, accumulate);
}

template class Linear2DLayer<float>;
template class Linear2DLayer<double>;
template class Linear2DLayer<bf16>;

// ---------------------------------------------------------------- layer norm

NormLayout summa2d_norm_layout(const ProcessGrid& grid) {
  const GridCoords& c = grid.coords();
  const GridShape& s = grid.shape();  // q x q: rows == cols
  NormLayout l;
  l.scheme = "2D";
  l.tokens = {.axis = CommAxis::mesh_col, .size = s.rows, .rank = c.row, .name = "q"};
  l.hidden = {.axis = CommAxis::mesh_row, .size = s.cols, .rank = c.col, .name = "q"};
  l.agree_axis = CommAxis::mesh;
  l.rooted = true;
  return l;
}

}  // namespace summa

// Shard descriptions and the Layer faces of Linear2D and LayerNorm2D.
#include <fmt/format.h>

#include "summa/schemes/summa2d/layernorm.hpp"
#include "summa/schemes/summa2d/linear.hpp"

namespace summa {

ParamShard matrix_shard(std::string name, index_t rows, index_t cols, int q, int i, int j,
                        int groups) {
  ParamShard s;
  s.name = std::move(name);
  s.global_shape = {rows, cols};
  s.local_rows = rows / q;
  s.local_cols = cols / q;
  const index_t w = cols / (static_cast<index_t>(groups) * q);
  for (int g = 0; g < groups; ++g)
    s.pieces.push_back({.global_row = i * s.local_rows,
                        .global_col = g * (cols / groups) + j * w,
                        .local_row = 0,
                        .local_col = g * w,
                        .rows = s.local_rows,
                        .cols = w});
  return s;
}

ParamShard row0_vector_shard(std::string name, index_t n, int q, int i, int j, int groups) {
  ParamShard s;
  s.name = std::move(name);
  s.global_shape = {n};
  if (i != 0) return s;
  s.local_rows = 1;
  s.local_cols = n / q;
  const index_t w = n / (static_cast<index_t>(groups) * q);
  for (int g = 0; g < groups; ++g)
    s.pieces.push_back({.global_row = 0,
                        .global_col = g * (n / groups) + j * w,
                        .local_row = 0,
                        .local_col = g * w,
                        .rows = 1,
                        .cols = w});
  return s;
}

namespace {

// Linear2D's constructor checks divisibility by q; the groups need it too.
Linear2D make_linear(SummaEngine& engine, const std::string& name, index_t tokens, index_t in,
                     index_t out, bool has_bias, int groups) {
  const int q = engine.q();
  std::optional<std::string> error;
  if (groups < 1 || out % (static_cast<index_t>(groups) * q) != 0)
    error = fmt::format("Linear2DLayer '{}': out={} must be divisible by groups*q = {}*{}", name,
                        out, groups, q);
  engine.grid().agree(CommAxis::mesh, error);
  return Linear2D(engine, tokens, in, out, has_bias);
}

}  // namespace

template <class T>
Linear2DLayer<T>::Linear2DLayer(SummaEngine& engine, std::string name, index_t tokens, index_t in,
                                index_t out, bool has_bias, int groups)
    : op_(make_linear(engine, name, tokens, in, out, has_bias, groups)), name_(std::move(name)) {
  const GridCoords& c = engine.grid().coords();
  weight_.shard = matrix_shard(name_ + ".weight", in, out, engine.q(), c.row, c.col, groups);
  if (has_bias)
    bias_.shard = row0_vector_shard(name_ + ".bias", out, engine.q(), c.row, c.col, groups);
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

template <class T>
LayerNorm2DLayer<T>::LayerNorm2DLayer(SummaEngine& engine, std::string name, index_t tokens,
                                      index_t hidden, double eps)
    : op_(engine, tokens, hidden, eps), name_(std::move(name)) {
  const GridCoords& c = engine.grid().coords();
  gamma_.shard = row0_vector_shard(name_ + ".weight", hidden, engine.q(), c.row, c.col);
  beta_.shard = row0_vector_shard(name_ + ".bias", hidden, engine.q(), c.row, c.col);
}

template <class T>
void LayerNorm2DLayer<T>::collect_parameters(std::vector<Param<T>*>& out) {
  out.push_back(&gamma_);
  out.push_back(&beta_);
}

template <class T>
BufferNeeds LayerNorm2DLayer<T>::buffer_needs() const {
  ByteCount<acc_t<T>> fwd;  // mean, rstd
  fwd.add(op_.local_tokens()).add(op_.local_tokens());
  return {.workspace = op_.workspace_bytes(dtype_v<T>), .forward = fwd, .backward = 0};
}

template <class T>
void LayerNorm2DLayer<T>::forward(ConstMatrixView<T> X, MatrixView<T> Y, StepBuffers& buffers) {
  const auto n = static_cast<std::size_t>(op_.local_tokens());
  mean_ = buffers.forward.take<acc_t<T>>(n);
  rstd_ = buffers.forward.take<acc_t<T>>(n);
  op_.forward<T>(X, gamma_.value, beta_.value, Y, mean_, rstd_, buffers.workspace);
  x_ = X;
}

template <class T>
void LayerNorm2DLayer<T>::backward(ConstMatrixView<T> dY, MatrixView<T> dX, StepBuffers& buffers,
                                   bool accumulate) {
  require(mean_ != nullptr,
          [&] { return fmt::format("LayerNorm2DLayer '{}': backward without forward", name_); });
  op_.backward<T>(x_, dY, gamma_.value, mean_, rstd_, dX, gamma_.grad, beta_.grad,
                  buffers.workspace, accumulate);
}

template class Linear2DLayer<float>;
template class Linear2DLayer<double>;
template class LayerNorm2DLayer<float>;
template class LayerNorm2DLayer<double>;
template class Linear2DLayer<bf16>;
template class LayerNorm2DLayer<bf16>;

}  // namespace summa

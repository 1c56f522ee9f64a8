// The 3D (AxoNN) shard descriptions, the 3D PMM linear layer and LayerNorm.
#include "summa/schemes/axonn3d/layers.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "detail.hpp"

namespace summa {

using detail3d::check_view;
using detail3d::take_scratch;

// ---------------------------------------------------------------- linear

namespace {

ProcessGrid& checked_linear(ProcessGrid& grid, const std::string& name, index_t tokens, index_t in,
                            index_t out, Orientation3D o, ColumnGroups groups) {
  const bool normal = o == Orientation3D::normal;
  const int a = normal ? detail3d::gy(grid) : detail3d::gx(grid);
  const int b = normal ? detail3d::gx(grid) : detail3d::gy(grid);
  const int gz = detail3d::gz(grid);
  const char* an = normal ? "Gy" : "Gx";
  const char* bn = normal ? "Gx" : "Gy";
  std::optional<std::string> error;
  if (tokens <= 0 || in <= 0 || out <= 0 || groups.in < 1 || groups.out < 1)
    error = fmt::format("Linear3D '{}': tokens={}, in={}, out={}, groups={}/{} must be positive",
                        name, tokens, in, out, groups.in, groups.out);
  else if (tokens % gz != 0)
    error = fmt::format("Linear3D '{}': tokens={} must be divisible by Gz={}", name, tokens, gz);
  else if (in % (static_cast<index_t>(a) * gz) != 0)
    error =
        fmt::format("Linear3D '{}': in={} must be divisible by {}*Gz = {}*{}", name, in, an, a, gz);
  else if (in % (static_cast<index_t>(groups.in) * a) != 0)
    error = fmt::format("Linear3D '{}': in={} must be divisible by input groups*{} = {}*{}", name,
                        in, an, groups.in, a);
  else if (out % (static_cast<index_t>(groups.out) * b) != 0)
    error = fmt::format("Linear3D '{}': out={} must be divisible by groups*{} = {}*{}", name, out,
                        bn, groups.out, b);
  detail3d::agree(grid, error);
  return grid;
}

}  // namespace

template <class T>
Linear3D<T>::Linear3D(ProcessGrid& grid, Backend& backend, std::string name, index_t tokens,
                      index_t in, index_t out, Orientation3D orientation, bool has_bias,
                      ColumnGroups groups, Axonn3DOptions options, Overlap3D<T>* overlap)
    : grid_(&checked_linear(grid, name, tokens, in, out, orientation, groups)),
      backend_(&backend),
      name_(std::move(name)),
      tokens_(tokens),
      in_(in),
      out_(out),
      orientation_(orientation),
      has_bias_(has_bias),
      options_(options),
      overlap_(overlap) {
  const bool normal = orientation == Orientation3D::normal;
  in_comm_ = normal ? &detail3d::y_comm(grid) : &detail3d::x_comm(grid);
  out_comm_ = normal ? &detail3d::x_comm(grid) : &detail3d::y_comm(grid);
  in_split_ = in_comm_->size();
  out_split_ = out_comm_->size();
  gz_ = detail3d::gz(grid);
  const int a = in_comm_->rank(), b = out_comm_->rank(), z = detail3d::z_of(grid);
  const DimSplit columns{.parts = out_split_, .block = b, .groups = groups.out};
  weight_.shard = split_shard(
      name_ + ".weight", {in, out},
      {.parts = in_split_, .block = a, .groups = groups.in, .sub_parts = gz_, .sub_block = z},
      columns);
  if (has_bias) bias_.shard = split_shard(name_ + ".bias", {out}, {}, columns, a == 0 && z == 0);
  if (overlap_ != nullptr && (overlap_->prefetching() || overlap_->deferring()))
    overlap_id_ = overlap_->add(weight_, local_in() * local_out());
  else
    overlap_ = nullptr;
}

template <class T>
void Linear3D<T>::collect_parameters(std::vector<Param<T>*>& out) {
  out.push_back(&weight_);
  if (has_bias_) out.push_back(&bias_);
}

template <class T>
std::size_t Linear3D<T>::scratch_bytes() const {
  return backend_->linear_scratch_bytes(local_tokens(), local_in(), local_out(), dtype_v<T>);
}

template <class T>
BufferNeeds Linear3D<T>::buffer_needs() const {
  ByteCount<T> ws;
  if (gz_ > 1) ws.add(local_in() * local_out());  // gathered W, reused for dW
  if (has_bias_ && gz_ > 1) ws.add(local_out());  // bias column sums
  ws.add_bytes(scratch_bytes());
  return {.workspace = ws, .forward = 0, .backward = 0};
}

template <class T>
MatrixView<T> Linear3D<T>::gathered_weight(T* buffer) {
  if (gz_ == 1) return weight_.value_view();
  if (overlap_ != nullptr && overlap_->prefetching())  // OAG
    return MatrixView<T>::dense(overlap_->gathered_weight(overlap_id_), local_in(), local_out(),
                                Order::row_major);
  grid_->depth().all_gather(weight_.value, buffer,
                            static_cast<std::size_t>(weight_.shard.local_size()));
  return MatrixView<T>::dense(buffer, local_in(), local_out(), Order::row_major);
}

template <class T>
void Linear3D<T>::forward(ConstMatrixView<T> X, MatrixView<T> Y, StepBuffers& buffers) {
  using A = acc_t<T>;
  check_view("Linear3D forward", "X", X, local_tokens(), local_in());
  check_view("Linear3D forward", "Y", Y, local_tokens(), local_out(), true);
  ArenaScope scope(buffers.workspace);
  T* wbuf = gz_ > 1 ? buffers.workspace.take<T>(static_cast<std::size_t>(local_in() * local_out()))
                    : nullptr;
  const Scratch scratch = take_scratch(buffers.workspace, scratch_bytes());
  const auto W = ConstMatrixView<T>(gathered_weight(wbuf));
  backend_->gemm(Op::N, Op::N, A(1), X, W, A(0), Y, scratch);
  detail3d::all_reduce(*in_comm_, Y.data, local_tokens() * local_out());
  if (has_bias_) backend_->add_bias(Y, bias_.value);  // once, after the sum
  x_ = X;
}

template <class T>
void Linear3D<T>::backward(ConstMatrixView<T> dY, MatrixView<T> dX, StepBuffers& buffers,
                           bool accumulate) {
  require(x_.data != nullptr,
          [&] { return fmt::format("Linear3D '{}': backward without forward", name_); });
  const bool want_dx = !(dX.rows == 0 && dX.cols == 0);
  const index_t m = local_tokens(), k = local_in(), n = local_out();
  check_view("Linear3D backward", "dY", dY, m, n);
  if (want_dx) check_view("Linear3D backward", "dX", dX, m, k, true);
  using A = acc_t<T>;
  const A beta = accumulate ? A(1) : A(0);
  Backend& be = *backend_;
  ArenaScope scope(buffers.workspace);
  T* wbuf = gz_ > 1 ? buffers.workspace.take<T>(static_cast<std::size_t>(k * n)) : nullptr;
  T* bsum = has_bias_ && gz_ > 1 ? buffers.workspace.take<T>(static_cast<std::size_t>(n)) : nullptr;
  const Scratch scratch = take_scratch(buffers.workspace, scratch_bytes());
  Request request;
  if (want_dx) {  // partial dX = dY W(a, b)ᵀ, summed over B
    const auto W = ConstMatrixView<T>(gathered_weight(wbuf));
    be.gemm(Op::N, Op::T, A(1), dY, W, A(0), dX, scratch);
    if (options_.overlap_all_reduce)
      request = detail3d::iall_reduce(*out_comm_, dX.data, m * k);
    else
      detail3d::all_reduce(*out_comm_, dX.data, m * k);
  }
  if (gz_ == 1) {
    be.gemm(Op::T, Op::N, A(1), x_, dY, beta, weight_.grad_view(), scratch);
  } else {
    // dW(a, b) = Xᵀ dY over the rank's tokens (W is no longer needed: reuse
    // its buffer), summed over Z and scattered: rank z keeps its row shard.
    // ORS: computed into the staging block and reduce-scattered at the
    // model's completion point.
    const bool defer = overlap_ != nullptr && overlap_->deferring();
    T* dw = defer ? overlap_->staging(overlap_id_) : wbuf;
    const auto dW = MatrixView<T>::dense(dw, k, n, Order::row_major);
    be.gemm(Op::T, Op::N, A(1), x_, dY, A(0), dW, scratch);
    const auto shard = static_cast<std::size_t>(weight_.shard.local_size());
    if (defer) {
      overlap_->defer(overlap_id_, weight_.grad, accumulate);
    } else if (accumulate) {
      grid_->depth().reduce_scatter(wbuf, wbuf, shard, dtype_v<T>, ReduceOp::sum);
      be.axpby(A(1), ConstMatrixView<T>::dense(wbuf, weight_.shard.local_rows, n, Order::row_major),
               A(1), weight_.grad_view());
    } else {
      grid_->depth().reduce_scatter(wbuf, weight_.grad, shard, dtype_v<T>, ReduceOp::sum);
    }
  }
  if (has_bias_) {
    // dY is replicated over A; the column sums over the rank's tokens are
    // summed over Z, so every replica gets the same gradient.
    if (gz_ == 1) {
      be.column_sums(dY, beta, bias_.grad);
    } else {
      be.column_sums(dY, A(0), bsum);
      detail3d::all_reduce(grid_->depth(), bsum, n);
      be.axpby(A(1), ConstMatrixView<T>::dense(bsum, 1, n), beta, bias_.grad_view());
    }
  }
  out_comm_->wait(request);
}

// Cost of a linear. The normal orientation (expand) reads input columns
// over Y and writes outputs over X; the transposed one (contract) the
// reverse. Forward all-gathers the weight shard over Z (OAG: prefetched
// while the previous linear computes), multiplies and all-reduces the
// partial outputs over the input axis; backward gathers the weight again
// (not cached), computes dX and all-reduces it over the output axis (OAR:
// while dW is computed), computes dW and reduce-scatters it over Z (ORS:
// deferred to the end of backward) and all-reduces the bias gradient over Z.
template <class T>
void Linear3D<T>::price(cost::Tally& t, model::Phase phase) const {
  using cost::u64;
  const auto u = [](auto v) { return static_cast<u64>(v); };
  struct Axis {
    CommAxis axis;
    u64 g, r;
  };
  const ProcessGrid& g = *grid_;
  const Axis X{CommAxis::mesh_col, u(detail3d::gx(g)), u(detail3d::x_of(g))},
      Y{CommAxis::mesh_row, u(detail3d::gy(g)), u(detail3d::y_of(g))},
      Z{CommAxis::depth, u(detail3d::gz(g)), u(detail3d::z_of(g))};
  const bool normal = orientation_ == Orientation3D::normal;
  const Axis A = normal ? Y : X, B = normal ? X : Y;  // the input and output column axes
  const u64 e = sizeof(T), m = u(tokens_) / Z.g, k = u(in_) / A.g, n = u(out_) / B.g;
  const u64 shard = u(in_) * u(out_) / (A.g * B.g * Z.g);
  // No collective over an axis of one rank (nothing to move): no bytes, no call.
  const auto all_reduce = [&](const Axis& a, u64 count, bool overlapped) {
    if (a.g == 1) return;
    t.overlapped = overlapped;
    t.all_reduce(a.axis, count, a.g, a.r, e);
    t.overlapped = false;
  };
  const auto over_z = [&](bool gather, bool overlapped) {  // the weight shard
    if (Z.g == 1) return;
    t.overlapped = overlapped;
    if (gather)
      t.all_gather(CommAxis::depth, shard, Z.g, e);
    else
      t.reduce_scatter(CommAxis::depth, shard, Z.g, e);
    t.overlapped = false;
  };
  over_z(true, options_.overlap_all_gather);  // the weight, in forward and again in backward
  if (phase != model::Phase::backward) {
    t.gemm(model::GemmMode::nn, m, n, k, e);
    all_reduce(A, m * n, false);
    if (has_bias_) t.memory(2 * m * n * e);
    return;
  }
  t.gemm(model::GemmMode::nt, m, k, n, e);  // dX = dY Wᵀ
  all_reduce(B, m * k, options_.overlap_all_reduce);
  t.gemm(model::GemmMode::tn, k, n, m, e);  // dW = Xᵀ dY
  over_z(false, options_.overlap_reduce_scatter);
  if (has_bias_) {
    t.memory(m * n * e);
    all_reduce(Z, n, false);
  }
}

// ---------------------------------------------------------------- layer norm

// The 3D LayerNorm is SplitLayerNorm over this layout (Y-layout blocks;
// Axonn3DContext::norm_layout): the
// tokens over Z, the columns over Y, the parameters replicated over X and Z
// (x = 0, z = 0 owns them).
namespace {
NormLayout norm_layout_3d(int gy, int gz, int x, int y, int z) {
  NormLayout l;
  l.scheme = "3D";
  l.tokens = {.axis = CommAxis::depth, .size = gz, .rank = z, .name = "Gz"};
  l.hidden = {.axis = CommAxis::mesh_row, .size = gy, .rank = y, .name = "Gy"};
  l.replica_rank = x;
  return l;
}
}  // namespace

NormLayout axonn3d_norm_layout(const ProcessGrid& grid) {
  return norm_layout_3d(detail3d::gy(grid), detail3d::gz(grid), detail3d::x_of(grid),
                        detail3d::y_of(grid), detail3d::z_of(grid));
}

template class Linear3D<float>;
template class Linear3D<double>;
template class Linear3D<bf16>;

}  // namespace summa

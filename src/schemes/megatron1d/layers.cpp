// The 1D (Megatron) shard descriptions, column- and row-parallel linear
// layers and the replicated LayerNorm.
#include "summa/schemes/megatron1d/layers.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "detail.hpp"

namespace summa {

using detail1d::check_view;
using detail1d::take_scratch;

namespace {

ProcessGrid& checked_linear(ProcessGrid& grid, const char* kind, const std::string& name,
                            index_t tokens, index_t in, index_t out, index_t split, int groups,
                            bool sequence_parallel) {
  const int p = detail1d::group_size(grid);
  std::optional<std::string> error;
  if (tokens <= 0 || in <= 0 || out <= 0 || groups < 1)
    error = fmt::format("{} '{}': tokens={}, in={}, out={}, groups={} must be positive", kind, name,
                        tokens, in, out, groups);
  else if (sequence_parallel && tokens % p != 0)
    error = fmt::format("{} '{}': tokens={} must be divisible by p={} (sequence parallelism)", kind,
                        name, tokens, p);
  else if (split % (static_cast<index_t>(groups) * p) != 0)
    error = groups > 1 ? fmt::format("{} '{}': {}={} must be divisible by groups*p = {}*{}", kind,
                                     name, split == out ? "out" : "in", split, groups, p)
                       : fmt::format("{} '{}': {}={} must be divisible by p={}", kind, name,
                                     split == out ? "out" : "in", split, p);
  detail1d::agree(grid, error);
  return grid;
}

}  // namespace

// ---------------------------------------------------------------- shared

template <class T>
Linear1D<T>::Linear1D(ProcessGrid& grid, Backend& backend, const std::string& name, index_t tokens,
                      index_t in, index_t out, bool has_bias, bool sequence_parallel)
    : grid_(&grid),
      backend_(&backend),
      name_(name),
      tokens_(tokens),
      in_(in),
      out_(out),
      has_bias_(has_bias),
      p_(detail1d::group_size(grid)),
      sp_(sequence_parallel && p_ > 1) {}

template <class T>
void Linear1D<T>::collect_parameters(std::vector<Param<T>*>& out) {
  out.push_back(&weight_);
  if (has_bias_) out.push_back(&bias_);
}

template <class T>
BufferNeeds Linear1D<T>::buffer_needs() const {
  ByteCount<T> ws;
  ws.add(gathered_elems()).add_bytes(scratch_bytes());
  return {.workspace = ws, .forward = 0, .backward = 0};
}

// ---------------------------------------------------------------- column-parallel

template <class T>
ColumnParallelLinear1D<T>::ColumnParallelLinear1D(ProcessGrid& grid, Backend& backend,
                                                  std::string name, index_t tokens, index_t in,
                                                  index_t out, bool has_bias, ColumnGroups groups,
                                                  bool sequence_parallel)
    : Linear1D<T>(checked_linear(grid, "ColumnParallelLinear1D", name, tokens, in, out, out,
                                 groups.out, sequence_parallel),
                  backend, name, tokens, in, out, has_bias, sequence_parallel) {
  // X is whole on every rank, so the input's groups leave the rows whole
  const DimSplit columns{
      .parts = this->p_, .block = detail1d::group_rank(grid), .groups = groups.out};
  this->weight_.shard = split_shard(name + ".weight", {in, out}, {}, columns);
  if (has_bias) this->bias_.shard = split_shard(name + ".bias", {out}, {}, columns);
}

template <class T>
std::size_t ColumnParallelLinear1D<T>::scratch_bytes() const {
  return this->backend_->linear_scratch_bytes(this->tokens_, this->in_, local_out(),
                                              dtype_v<T>);  // X W_r
}

template <class T>
void ColumnParallelLinear1D<T>::forward(ConstMatrixView<T> X, MatrixView<T> Y,
                                        StepBuffers& buffers) {
  check_view("ColumnParallelLinear1D forward", "X", X, this->split_rows(), this->in_, this->sp_);
  check_view("ColumnParallelLinear1D forward", "Y", Y, this->tokens_, local_out());
  ArenaScope scope(buffers.workspace);
  ConstMatrixView<T> x = X;
  if (this->sp_) {  // the whole sequence: X's rows gathered over the group
    const auto xg = take_block<T>(buffers.workspace, this->tokens_, this->in_);
    this->grid_->tensor().all_gather(
        X.data, xg.data, static_cast<std::size_t>(this->split_rows() * this->in_), dtype_v<T>);
    x = xg;
  }
  const Scratch scratch = take_scratch(buffers.workspace, scratch_bytes());
  this->backend_->gemm(Op::N, Op::N, acc_t<T>(1), x, ConstMatrixView<T>(this->weight_.value_view()),
                       acc_t<T>(0), Y, scratch);
  if (this->has_bias_) this->backend_->add_bias(Y, this->bias_.value);
  this->x_ = X;
}

template <class T>
void ColumnParallelLinear1D<T>::backward(ConstMatrixView<T> dY, MatrixView<T> dX,
                                         StepBuffers& buffers, bool accumulate) {
  require(this->x_.data != nullptr, [&] {
    return fmt::format("ColumnParallelLinear1D '{}': backward without forward", this->name_);
  });
  const bool want_dx = !(dX.rows == 0 && dX.cols == 0);
  check_view("ColumnParallelLinear1D backward", "dY", dY, this->tokens_, local_out());
  if (want_dx)
    check_view("ColumnParallelLinear1D backward", "dX", dX, this->split_rows(), this->in_, true);
  const acc_t<T> beta = accumulate ? acc_t<T>(1) : acc_t<T>(0);
  Communicator& group = this->grid_->tensor();
  ArenaScope scope(buffers.workspace);
  if (this->sp_) {
    sequence_parallel_backward(dY, dX, want_dx, beta, buffers);
    return;
  }
  const Scratch scratch = take_scratch(buffers.workspace, scratch_bytes());
  Request request;
  if (want_dx) {  // partial dX = dY_r W_rᵀ, summed over the group while dW is computed
    this->backend_->gemm(Op::N, Op::T, acc_t<T>(1), dY,
                         ConstMatrixView<T>(this->weight_.value_view()), acc_t<T>(0), dX, scratch);
    request =
        group.iall_reduce(dX.data, dX.data, static_cast<std::size_t>(this->tokens_ * this->in_),
                          dtype_v<T>, ReduceOp::sum);
  }
  this->backend_->gemm(Op::T, Op::N, acc_t<T>(1), this->x_, dY, beta, this->weight_.grad_view(),
                       scratch);
  if (this->has_bias_) this->backend_->column_sums(dY, beta, this->bias_.grad);
  group.wait(request);
}

// Sequence parallelism: X's rows gathered again while the partial dX = dY
// W_rᵀ [tokens, in] is computed, then dX reduce-scattered to the rank's
// rows while dW = X_gᵀ dY is (Megatron's order).
template <class T>
void ColumnParallelLinear1D<T>::sequence_parallel_backward(ConstMatrixView<T> dY, MatrixView<T> dX,
                                                           bool want_dx, acc_t<T> beta,
                                                           StepBuffers& buffers) {
  Communicator& group = this->grid_->tensor();
  const index_t rows = this->split_rows();
  const auto xg = take_block<T>(buffers.workspace, this->tokens_, this->in_);
  const auto dxg = take_block<T>(buffers.workspace, this->tokens_, this->in_);
  const Scratch scratch = take_scratch(buffers.workspace, scratch_bytes());
  Request gather = group.iall_gather(this->x_.data, xg.data,
                                     static_cast<std::size_t>(rows * this->in_), dtype_v<T>);
  Request scatter;
  if (want_dx) {
    this->backend_->gemm(Op::N, Op::T, acc_t<T>(1), dY,
                         ConstMatrixView<T>(this->weight_.value_view()), acc_t<T>(0), dxg, scratch);
    group.wait(gather);
    scatter = group.ireduce_scatter(dxg.data, dX.data, static_cast<std::size_t>(rows * this->in_),
                                    dtype_v<T>, ReduceOp::sum);
  } else {
    group.wait(gather);
  }
  this->backend_->gemm(Op::T, Op::N, acc_t<T>(1), ConstMatrixView<T>(xg), dY, beta,
                       this->weight_.grad_view(), scratch);
  if (this->has_bias_) this->backend_->column_sums(dY, beta, this->bias_.grad);
  group.wait(scatter);
}

// ---------------------------------------------------------------- row-parallel

template <class T>
RowParallelLinear1D<T>::RowParallelLinear1D(ProcessGrid& grid, Backend& backend, std::string name,
                                            index_t tokens, index_t in, index_t out, bool has_bias,
                                            ColumnGroups groups, bool sequence_parallel)
    : Linear1D<T>(checked_linear(grid, "RowParallelLinear1D", name, tokens, in, out, in, groups.in,
                                 sequence_parallel),
                  backend, name, tokens, in, out, has_bias, sequence_parallel) {
  const int r = detail1d::group_rank(grid);
  this->weight_.shard = split_shard(name + ".weight", {in, out},
                                    {.parts = this->p_, .block = r, .groups = groups.in}, {});
  if (has_bias) this->bias_.shard = split_shard(name + ".bias", {out}, {}, {}, r == 0);
}

template <class T>
std::size_t RowParallelLinear1D<T>::scratch_bytes() const {
  return this->backend_->linear_scratch_bytes(this->tokens_, local_in(), this->out_,
                                              dtype_v<T>);  // X_r W_r
}

template <class T>
void RowParallelLinear1D<T>::forward(ConstMatrixView<T> X, MatrixView<T> Y, StepBuffers& buffers) {
  check_view("RowParallelLinear1D forward", "X", X, this->tokens_, local_in());
  check_view("RowParallelLinear1D forward", "Y", Y, this->split_rows(), this->out_, true);
  if (this->sp_) {  // the partial sums of every token, reduce-scattered to the rank's rows
    ArenaScope scope(buffers.workspace);
    const auto yp = take_block<T>(buffers.workspace, this->tokens_, this->out_);
    const Scratch scratch = take_scratch(buffers.workspace, scratch_bytes());
    this->backend_->gemm(Op::N, Op::N, acc_t<T>(1), X,
                         ConstMatrixView<T>(this->weight_.value_view()), acc_t<T>(0), yp, scratch);
    this->grid_->tensor().reduce_scatter(yp.data, Y.data,
                                         static_cast<std::size_t>(this->split_rows() * this->out_),
                                         dtype_v<T>, ReduceOp::sum);
  } else {
    {
      ArenaScope scope(buffers.workspace);
      const Scratch scratch = take_scratch(buffers.workspace, scratch_bytes());
      this->backend_->gemm(Op::N, Op::N, acc_t<T>(1), X,
                           ConstMatrixView<T>(this->weight_.value_view()), acc_t<T>(0), Y, scratch);
    }
    this->grid_->tensor().all_reduce(Y.data, Y.data,
                                     static_cast<std::size_t>(this->tokens_ * this->out_),
                                     dtype_v<T>, ReduceOp::sum);
  }
  if (this->has_bias_) this->backend_->add_bias(Y, this->bias_.value);  // once, after the sum
  this->x_ = X;
}

template <class T>
void RowParallelLinear1D<T>::backward(ConstMatrixView<T> dY, MatrixView<T> dX, StepBuffers& buffers,
                                      bool accumulate) {
  require(this->x_.data != nullptr, [&] {
    return fmt::format("RowParallelLinear1D '{}': backward without forward", this->name_);
  });
  const bool want_dx = !(dX.rows == 0 && dX.cols == 0);
  check_view("RowParallelLinear1D backward", "dY", dY, this->split_rows(), this->out_, this->sp_);
  if (want_dx) check_view("RowParallelLinear1D backward", "dX", dX, this->tokens_, local_in());
  const acc_t<T> beta = accumulate ? acc_t<T>(1) : acc_t<T>(0);
  ArenaScope scope(buffers.workspace);
  if (this->sp_) {  // every token's dY: the rows gathered over the group
    const auto dyg = take_block<T>(buffers.workspace, this->tokens_, this->out_);
    this->grid_->tensor().all_gather(
        dY.data, dyg.data, static_cast<std::size_t>(this->split_rows() * this->out_), dtype_v<T>);
    dY = dyg;
  }
  const Scratch scratch = take_scratch(buffers.workspace, scratch_bytes());
  const auto W = ConstMatrixView<T>(this->weight_.value_view());
  if (want_dx) this->backend_->gemm(Op::N, Op::T, acc_t<T>(1), dY, W, acc_t<T>(0), dX, scratch);
  this->backend_->gemm(Op::T, Op::N, acc_t<T>(1), this->x_, dY, beta, this->weight_.grad_view(),
                       scratch);
  // dY (gathered under sequence parallelism) is the same on every rank: so
  // is this column sum, replicas stay equal.
  if (this->has_bias_) this->backend_->column_sums(dY, beta, this->bias_.grad);
}

// Cost of a linear: column-parallel (expand) multiplies its output columns
// and all-reduces dX in backward, row-parallel (contract) multiplies its
// input rows and all-reduces Y in forward; the row-parallel bias is
// replicated (added after the sum). The dX all-reduce (and the LM head's,
// vocab.cpp) is priced exposed although the code overlaps it with dW's
// GEMM: the 1D model of the calibrated predictions (docs/scaling.md: the
// Optimus tables' fitted 1D row, Megatron as the papers ran it, which
// overlapped nothing; CPU MPI, which progresses only inside calls), and
// 1D predicts as 3D with overlap=none (StepTime.ThreeDWithXOnlyIsOneD).
namespace {
void price_linear(cost::Tally& t, model::Phase phase, ProcessGrid& grid, cost::u64 e, index_t rows,
                  index_t width_in, index_t width_out, bool column, bool bias, bool sp) {
  const auto u = [](index_t v) { return static_cast<cost::u64>(v); };
  const cost::u64 p = u(detail1d::group_size(grid)), r = u(detail1d::group_rank(grid));
  const cost::u64 tokens = u(rows), in = u(width_in), out = u(width_out);
  const cost::u64 k = column ? in : in / p, n = column ? out / p : out;
  if (sp) {  // sequence parallelism: gathers and reduce-scatters of tokens/p rows
    const cost::u64 own = tokens / p;
    if (phase != model::Phase::backward) {
      if (column) t.all_gather(CommAxis::tensor, own * in, p, e);
      t.gemm(model::GemmMode::nn, tokens, n, k, e);
      if (!column) t.reduce_scatter(CommAxis::tensor, own * out, p, e);
      if (bias) t.memory(2 * (column ? tokens : own) * n * e);
      return;
    }
    t.all_gather(CommAxis::tensor, own * (column ? in : out), p, e);  // X again, or dY
    t.gemm(model::GemmMode::nt, tokens, k, n, e);                     // dX = dY Wᵀ
    if (column) t.reduce_scatter(CommAxis::tensor, own * in, p, e);
    t.gemm(model::GemmMode::tn, k, n, tokens, e);  // dW = Xᵀ dY
    if (bias) t.memory(tokens * n * e);
    return;
  }
  if (phase != model::Phase::backward) {
    t.gemm(model::GemmMode::nn, tokens, n, k, e);
    if (!column) t.all_reduce(CommAxis::tensor, tokens * out, p, r, e);
    if (bias) t.memory(2 * tokens * n * e);
    return;
  }
  t.gemm(model::GemmMode::nt, tokens, k, n, e);  // dX = dY Wᵀ
  if (column) t.all_reduce(CommAxis::tensor, tokens * in, p, r, e);
  t.gemm(model::GemmMode::tn, k, n, tokens, e);  // dW = Xᵀ dY
  if (bias) t.memory(tokens * n * e);
}
}  // namespace
template <class T>
void ColumnParallelLinear1D<T>::price(cost::Tally& t, model::Phase phase) const {
  price_linear(t, phase, *this->grid_, sizeof(T), this->tokens_, this->in_, this->out_, true,
               this->has_bias_, this->sp_);
}
template <class T>
void RowParallelLinear1D<T>::price(cost::Tally& t, model::Phase phase) const {
  price_linear(t, phase, *this->grid_, sizeof(T), this->tokens_, this->in_, this->out_, false,
               this->has_bias_, this->sp_);
}

// ---------------------------------------------------------------- layer norm

// The 1D LayerNorm is SplitLayerNorm over this layout (Megatron1DContext::
// norm_layout): nothing split (replicated
// activations, local statistics), the parameters replicated over the tensor
// group (rank 0 owns them).
NormLayout megatron1d_norm_layout(ProcessGrid& grid, bool sequence_parallel) {
  NormLayout l;
  l.scheme = "1D";
  const int p = detail1d::group_size(grid), r = detail1d::group_rank(grid);
  if (sequence_parallel && p > 1) {  // tokens split; the replicas are the token blocks
    l.tokens = {.axis = CommAxis::tensor, .size = p, .rank = r, .name = "p"};
    l.replica_rank = 0;
  } else {
    l.replica_rank = r;
  }
  return l;
}

template class Linear1D<float>;
template class Linear1D<double>;
template class Linear1D<bf16>;
template class ColumnParallelLinear1D<float>;
template class ColumnParallelLinear1D<double>;
template class ColumnParallelLinear1D<bf16>;
template class RowParallelLinear1D<float>;
template class RowParallelLinear1D<double>;
template class RowParallelLinear1D<bf16>;

}  // namespace summa

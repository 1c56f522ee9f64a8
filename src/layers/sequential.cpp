#include "summa/layers/sequential.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace summa {

template <class T>
Sequential<T>::Sequential(SchemeContext<T>& scheme, index_t tokens, index_t in_width,
                          ActivationLayout in_layout)
    : scheme_(&scheme), tokens_(tokens), in_width_(in_width), in_layout_(in_layout) {
  std::optional<std::string> error;
  if (tokens <= 0 || in_width <= 0)
    error = fmt::format("Sequential: tokens={} and in_width={} must be positive", tokens, in_width);
  else if (tokens % scheme.sequence_split() != 0)
    error = fmt::format("Sequential ({}): tokens={} must be divisible by {}={}", scheme.label(),
                        tokens, scheme.sequence_split_name(), scheme.sequence_split());
  scheme.agree(error);
}

template <class T>
Sequential<T>::~Sequential() = default;

template <class T>
Layer<T>& Sequential<T>::add(std::unique_ptr<Layer<T>> layer, index_t out_width,
                             ActivationLayout out_layout) {
  require(store_ == nullptr, "Sequential: add() after finish()");
  require(layer != nullptr, "Sequential: add() of a null layer");
  stages_.push_back({std::move(layer), out_width, out_layout});
  return *stages_.back().layer;
}

template <class T>
Layer<T>& Sequential<T>::linear(std::string name, index_t width, LinearRole role, bool has_bias) {
  const ActivationLayout in = out_layout();
  const ActivationLayout want =
      role == LinearRole::expand ? ActivationLayout::outer : ActivationLayout::inner;
  require(in == want, [&] {
    return fmt::format(
        "Sequential: linear '{}' ({}) reads the {} layout, but the activation before it is {}: "
        "pair an expanding linear with a contracting one",
        name, role == LinearRole::expand ? "expand" : "contract",
        want == ActivationLayout::outer ? "outer" : "inner",
        in == ActivationLayout::outer ? "outer" : "inner");
  });
  const index_t in_width = out_width();
  return add(scheme_->linear(std::move(name), tokens_, in_width, width, role, has_bias), width,
             role == LinearRole::expand ? ActivationLayout::inner : ActivationLayout::outer);
}

template <class T>
Layer<T>& Sequential<T>::layer_norm(std::string name, double eps) {
  require(out_layout() == ActivationLayout::outer,
          [&] { return fmt::format("Sequential: layer_norm '{}' needs the outer layout", name); });
  return add(scheme_->layer_norm(std::move(name), tokens_, out_width(), eps), out_width(),
             ActivationLayout::outer);
}

template <class T>
Layer<T>& Sequential<T>::gelu() {
  return add(std::make_unique<GeLU<T>>(scheme_->backend()), out_width(), out_layout());
}

template <class T>
index_t Sequential<T>::out_width() const {
  return stages_.empty() ? in_width_ : stages_.back().width;
}

template <class T>
ActivationLayout Sequential<T>::out_layout() const {
  return stages_.empty() ? in_layout_ : stages_.back().layout;
}

template <class T>
void Sequential<T>::collect_parameters(std::vector<Param<T>*>& out) {
  for (Stage& s : stages_) s.layer->collect_parameters(out);
}

template <class T>
BufferNeeds Sequential<T>::buffer_needs() const {
  BufferNeeds needs;
  for (const Stage& s : stages_) needs.then(s.layer->buffer_needs());
  return needs;
}

template <class T>
void Sequential<T>::finish(BufferNeeds extra) {
  require(store_ == nullptr, "Sequential: finish() twice");
  require(!stages_.empty(), "Sequential: finish() without layers");
  Backend& be = scheme_->backend();
  scheme_->finish_layers(false);  // state the layers share (3D: ORS / OAG buffers)
  BufferNeeds needs = buffer_needs();
  needs.then(extra);
  store_ = std::make_unique<ParameterStore<T>>(be, this->parameters());
  workspace_ = std::make_unique<Arena>("workspace", be, needs.workspace);
  forward_ = std::make_unique<Arena>("forward", be, needs.forward);
  backward_ = std::make_unique<Arena>("backward", be, needs.backward);
  const index_t rows = local_rows();
  ByteCount<T> outs;
  index_t widest = local_cols(in_width_, in_layout_);
  for (const Stage& s : stages_) {
    outs.add(rows * local_cols(s.width, s.layout));
    widest = std::max(widest, local_cols(s.width, s.layout));
  }
  activations_ = std::make_unique<Arena>("activations", be, outs.bytes());
  for (Stage& s : stages_) {
    const index_t cols = local_cols(s.width, s.layout);
    s.out = MatrixView<T>::dense(activations_->take<T>(static_cast<std::size_t>(rows * cols)), rows,
                                 cols, Order::row_major);
  }
  ByteCount<T> slot;
  slot.add(rows * widest);
  grads_ = std::make_unique<Arena>("activation gradients", be, 2 * slot.bytes());
  for (MatrixView<T>& g : grad_slot_)
    g = MatrixView<T>::dense(grads_->take<T>(static_cast<std::size_t>(rows * widest)), rows, widest,
                             Order::row_major);
}

template <class T>
void Sequential<T>::require_finished(const char* what) const {
  require(store_ != nullptr, [&] { return fmt::format("Sequential: {} before finish()", what); });
}

template <class T>
ParameterStore<T>& Sequential<T>::parameters_store() {
  require_finished("parameters_store()");
  return *store_;
}

template <class T>
StepBuffers Sequential<T>::buffers() {
  require_finished("buffers()");
  return {*workspace_, *forward_, *backward_};
}

template <class T>
MatrixView<T> Sequential<T>::forward(ConstMatrixView<T> X) {
  require_finished("forward()");
  const index_t rows = local_rows(), cols = local_cols(in_width_, in_layout_);
  require(X.rows == rows && X.cols == cols, [&] {
    return fmt::format("Sequential: the input block is {}x{}, expected {}x{}", X.rows, X.cols, rows,
                       cols);
  });
  workspace_->reset();
  forward_->reset();
  backward_->reset();
  scheme_->begin_forward();
  StepBuffers step = buffers();
  ConstMatrixView<T> x = X;
  for (Stage& s : stages_) {
    s.layer->forward(x, s.out, step);
    x = s.out;
  }
  have_forward_ = true;
  return stages_.back().out;
}

template <class T>
ConstMatrixView<T> Sequential<T>::backward(ConstMatrixView<T> dY, bool accumulate) {
  require(have_forward_, "Sequential: backward() without forward()");
  have_forward_ = false;
  if (!accumulate) store_->zero_grads();
  StepBuffers step = buffers();
  const index_t rows = local_rows();
  ConstMatrixView<T> dy = dY;
  int slot = 0;
  for (std::size_t i = stages_.size(); i-- > 0;) {
    const bool first = i == 0;
    const index_t cols = first ? local_cols(in_width_, in_layout_)
                               : local_cols(stages_[i - 1].width, stages_[i - 1].layout);
    // dense (contiguous) in the slot: collectives take it whole
    const auto dx = MatrixView<T>::dense(grad_slot_[slot].data, rows, cols, Order::row_major);
    stages_[i].layer->backward(dy, dx, step, true);
    dy = dx;
    slot = 1 - slot;
  }
  scheme_->complete_deferred();  // the one completion point (3D ORS reduce-scatters)
  return dy;
}

template <class T>
void Sequential<T>::sync_data_gradients() {
  require_finished("sync_data_gradients()");
  ProcessGrid& g = scheme_->grid();
  const index_t n = store_->local_elements();
  if (g.shape().data > 1 && n > 0)
    g.data().all_reduce(store_->grads_base(), store_->grads_base(), static_cast<std::size_t>(n),
                        ReduceOp::sum);
}

template <class T>
std::vector<T> scatter_activation(const SchemeContext<T>& scheme, std::span<const T> global,
                                  index_t tokens, index_t width, ActivationLayout layout) {
  require(global.size() == static_cast<std::size_t>(tokens * width), [&] {
    return fmt::format("scatter_activation: {} values, expected tokens*width = {}*{}",
                       global.size(), tokens, width);
  });
  const ActivationBlock b = scheme.activation_block(tokens, width, layout);
  std::vector<T> local(static_cast<std::size_t>(b.rows * b.cols));
  for (index_t r = 0; r < b.rows; ++r)
    std::copy_n(global.begin() + (b.row0 + r) * width + b.col0, b.cols, local.begin() + r * b.cols);
  return local;
}

template <class T>
std::vector<T> gather_activation(const SchemeContext<T>& scheme, std::span<const T> local,
                                 index_t tokens, index_t width, ActivationLayout layout) {
  const ActivationBlock b = scheme.activation_block(tokens, width, layout);
  require(local.size() == static_cast<std::size_t>(b.rows * b.cols), [&] {
    return fmt::format("gather_activation: {} values, expected the local {}x{}", local.size(),
                       b.rows, b.cols);
  });
  std::vector<T> global(static_cast<std::size_t>(tokens * width), T(0));
  if (b.owner)
    for (index_t r = 0; r < b.rows; ++r)
      std::copy_n(local.begin() + r * b.cols, b.cols,
                  global.begin() + (b.row0 + r) * width + b.col0);
  scheme.grid().tensor().all_reduce(global.data(), global.data(), global.size(), ReduceOp::sum);
  return global;
}

template class Sequential<float>;
template class Sequential<double>;
template class Sequential<bf16>;
#define SUMMA_INSTANTIATE(T)                                                                       \
  template std::vector<T> scatter_activation(const SchemeContext<T>&, std::span<const T>, index_t, \
                                             index_t, ActivationLayout);                           \
  template std::vector<T> gather_activation(const SchemeContext<T>&, std::span<const T>, index_t,  \
                                            index_t, ActivationLayout);
SUMMA_INSTANTIATE(float)
SUMMA_INSTANTIATE(double)
SUMMA_INSTANTIATE(bf16)
#undef SUMMA_INSTANTIATE

}  // namespace summa

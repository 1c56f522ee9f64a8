#include "summa/layers/sequential.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "summa/layers/transformer.hpp"
#include "summa/model/cost.hpp"

namespace summa {

namespace {

const char* layout_name(ActivationLayout l) {
  return l == ActivationLayout::outer ? "outer" : "inner";
}

}  // namespace

// ---------------------------------------------------------------- LayerStack

template <class T>
LayerStack<T>::LayerStack(SchemeContext<T>& scheme, index_t tokens, index_t in_width,
                          ActivationLayout in_layout, const char* who)
    : scheme_(&scheme), tokens_(tokens), in_width_(in_width), in_layout_(in_layout), who_(who) {
  std::optional<std::string> error;
  if (tokens <= 0 || in_width <= 0)
    error = fmt::format("{}: tokens={} and in_width={} must be positive", who, tokens, in_width);
  else if (tokens % scheme.sequence_split() != 0)
    error = fmt::format("{} ({}): tokens={} must be divisible by {}={}", who, scheme.label(),
                        tokens, scheme.sequence_split_name(), scheme.sequence_split());
  scheme.agree(error);
}

template <class T>
LayerStack<T>::~LayerStack() = default;

template <class T>
Layer<T>& LayerStack<T>::add(std::unique_ptr<Layer<T>> layer, index_t out_width,
                             ActivationLayout out_layout) {
  require(layer != nullptr, [&] { return fmt::format("{}: add() of a null layer", who_); });
  require_ungrouped(fmt::format("add() of '{}'", layer->name()));
  return add_stage(std::move(layer), out_width, out_layout, 1);
}

template <class T>
Layer<T>& LayerStack<T>::add_stage(std::unique_ptr<Layer<T>> layer, index_t out_width,
                                   ActivationLayout out_layout, int groups) {
  require(!sealed_, [&] { return fmt::format("{}: add() after finish()", who_); });
  stages_.push_back({std::move(layer), out_width, out_layout, {}, groups});
  return *stages_.back().layer;
}

template <class T>
void LayerStack<T>::require_ungrouped(const std::string& what) const {
  require(out_groups() == 1, [&] {
    return fmt::format(
        "{}: {} reads a concatenation of {} branches (grouped columns): only a linear or gelu "
        "may read one",
        who_, what, out_groups());
  });
}

template <class T>
Layer<T>& LayerStack<T>::linear(std::string name, index_t width, LinearRole role, bool has_bias) {
  const ActivationLayout in = out_layout();
  const ActivationLayout want =
      role == LinearRole::expand ? ActivationLayout::outer : ActivationLayout::inner;
  require(in == want, [&] {
    return fmt::format(
        "{}: linear '{}' ({}) reads the {} layout, but the activation before it is {}: "
        "pair an expanding linear with a contracting one",
        who_, name, role == LinearRole::expand ? "expand" : "contract", layout_name(want),
        layout_name(in));
  });
  const index_t in_width = out_width();
  // the weight's rows follow a concatenation's groups
  return add_stage(
      scheme_->linear(std::move(name), tokens_, in_width, width, role, has_bias,
                      {.in = out_groups()}),
      width, role == LinearRole::expand ? ActivationLayout::inner : ActivationLayout::outer, 1);
}

template <class T>
Layer<T>& LayerStack<T>::layer_norm(std::string name, double eps) {
  require(out_layout() == ActivationLayout::outer,
          [&] { return fmt::format("{}: layer_norm '{}' needs the outer layout", who_, name); });
  require_ungrouped(fmt::format("layer_norm '{}'", name));
  return add(scheme_->layer_norm(std::move(name), tokens_, out_width(), eps), out_width(),
             ActivationLayout::outer);
}

template <class T>
Layer<T>& LayerStack<T>::gelu() {
  // its local block, for its price; element-wise, so a concatenation stays grouped
  return add_stage(std::make_unique<GeLU<T>>(scheme_->backend(), local_rows(out_layout()),
                                             local_cols(out_width(), out_layout())),
                   out_width(), out_layout(), out_groups());
}

template <class T>
void LayerStack<T>::price_stages(cost::Tally& t, model::Phase phase) const {
  if (phase == model::Phase::backward)
    for (auto s = stages_.rbegin(); s != stages_.rend(); ++s) s->layer->price(t, phase);
  else
    for (const Stage& s : stages_) s.layer->price(t, phase);
}

template <class T>
Layer<T>& LayerStack<T>::attention(std::string name, index_t seq, index_t heads) {
  require(out_layout() == ActivationLayout::outer,
          [&] { return fmt::format("{}: attention '{}' needs the outer layout", who_, name); });
  require_ungrouped(fmt::format("attention '{}'", name));
  require(seq > 0 && tokens_ % seq == 0, [&] {
    return fmt::format("{}: attention '{}': tokens={} is not a whole number of sequences of {}",
                       who_, name, tokens_, seq);
  });
  const index_t width = out_width();
  return add(
      std::make_unique<Attention<T>>(*scheme_, std::move(name), tokens_ / seq, seq, width, heads),
      width, ActivationLayout::outer);
}

template <class T>
Parallel<T>& LayerStack<T>::residual(const std::function<void(Chain<T>&)>& body) {
  return add_branches({body}, true, Combine::sum);
}

template <class T>
Parallel<T>& LayerStack<T>::parallel(const std::vector<std::function<void(Chain<T>&)>>& branches,
                                     Combine combine) {
  return add_branches(branches, false, combine);
}

template <class T>
Parallel<T>& LayerStack<T>::add_branches(
    const std::vector<std::function<void(Chain<T>&)>>& branches, bool adds_input, Combine combine) {
  require(!branches.empty(), [&] { return fmt::format("{}: parallel() of no branch", who_); });
  const bool concat = combine == Combine::concat;
  require_ungrouped(adds_input ? "a residual" : "parallel()");
  const char* what = adds_input ? "residual body" : "parallel branch";
  std::vector<std::unique_ptr<Chain<T>>> chains;
  for (const auto& build : branches) {
    chains.push_back(
        std::make_unique<Chain<T>>(*scheme_, tokens_, out_width(), out_layout(), what));
    build(*chains.back());
    chains.back()->finish_building();
    const Chain<T>& c = *chains.back();
    // a residual body ends as it starts; summed branches end as branch 0
    const Chain<T>& first = *chains.front();
    const index_t width = adds_input ? c.in_width() : first.out_width();
    const ActivationLayout layout = adds_input ? c.in_layout() : first.out_layout();
    // a concatenation's branches, and a residual body, end ungrouped; summed
    // branches grouped alike (an element-wise sum of one layout)
    const int groups = concat || adds_input ? 1 : first.out_groups();
    require(c.out_groups() == groups, [&] {
      const auto ends = [](int g) {
        return g == 1 ? std::string("ungrouped")
                      : fmt::format("in a concatenation of {} branches (grouped columns)", g);
      };
      return fmt::format("{}: {} {} ends {}, expected {}", who_, what, chains.size() - 1,
                         ends(c.out_groups()), ends(groups));
    });
    require(c.out_width() == width && c.out_layout() == layout, [&] {
      return adds_input
                 ? fmt::format(
                       "{}: a residual body must end as it starts ([tokens, {}] {}), it "
                       "ends [tokens, {}] {}",
                       who_, width, layout_name(layout), c.out_width(), layout_name(c.out_layout()))
                 : fmt::format(
                       "{}: parallel branch {} ends [tokens, {}] {}, branch 0 [tokens, "
                       "{}] {}: {} branches end alike",
                       who_, chains.size() - 1, c.out_width(), layout_name(c.out_layout()), width,
                       layout_name(layout), concat ? "concatenated" : "summed");
    });
  }
  const index_t n = static_cast<index_t>(chains.size());
  const index_t width = concat ? n * chains.front()->out_width() : chains.front()->out_width();
  const ActivationLayout layout = chains.front()->out_layout();
  const int groups = concat ? static_cast<int>(n) : chains.front()->out_groups();
  return static_cast<Parallel<T>&>(
      add_stage(std::make_unique<Parallel<T>>(std::move(chains), adds_input, combine), width,
                layout, groups));
}

template <class T>
index_t LayerStack<T>::out_width() const {
  return stages_.empty() ? in_width_ : stages_.back().width;
}

template <class T>
ActivationLayout LayerStack<T>::out_layout() const {
  return stages_.empty() ? in_layout_ : stages_.back().layout;
}

template <class T>
int LayerStack<T>::out_groups() const {
  return stages_.empty() ? 1 : stages_.back().groups;
}

template <class T>
index_t LayerStack<T>::input_rows(std::size_t i) const {
  return local_rows(i == 0 ? in_layout_ : stages_[i - 1].layout);
}

template <class T>
index_t LayerStack<T>::input_cols(std::size_t i) const {
  return i == 0 ? local_cols(in_width_, in_layout_)
                : local_cols(stages_[i - 1].width, stages_[i - 1].layout);
}

template <class T>
index_t LayerStack<T>::widest_elems() const {
  index_t widest = local_elems(in_width_, in_layout_);
  for (const Stage& s : stages_) widest = std::max(widest, local_elems(s.width, s.layout));
  return widest;
}

// ---------------------------------------------------------------- Chain

template <class T>
Chain<T>::Chain(SchemeContext<T>& scheme, index_t tokens, index_t in_width,
                ActivationLayout in_layout, const char* who)
    : LayerStack<T>(scheme, tokens, in_width, in_layout, who) {}

template <class T>
void Chain<T>::collect_parameters(std::vector<Param<T>*>& out) {
  for (auto& s : this->stages_) s.layer->collect_parameters(out);
}

template <class T>
BufferNeeds Chain<T>::buffer_needs() const {
  BufferNeeds needs;
  for (const auto& s : this->stages_) needs.then(s.layer->buffer_needs());
  ByteCount<T> kept;  // every output but the last, kept for backward
  for (std::size_t i = 0; i + 1 < this->stages_.size(); ++i)
    kept.add(this->local_elems(this->stages_[i].width, this->stages_[i].layout));
  needs.forward += kept;
  ByteCount<T> slots;  // two gradient blocks held while the layers run backward
  slots.add(this->widest_elems()).add(this->widest_elems());
  needs.backward += slots;
  return needs;
}

template <class T>
void Chain<T>::forward(ConstMatrixView<T> X, MatrixView<T> Y, StepBuffers& buffers) {
  ConstMatrixView<T> x = X;
  const std::size_t n = this->stages_.size();
  for (std::size_t i = 0; i < n; ++i) {
    auto& s = this->stages_[i];
    s.out = i + 1 == n ? Y
                       : take_block<T>(buffers.forward, this->local_rows(s.layout),
                                       this->local_cols(s.width, s.layout));
    s.layer->forward(x, s.out, buffers);
    x = s.out;
  }
}

template <class T>
void Chain<T>::backward(ConstMatrixView<T> dY, MatrixView<T> dX, StepBuffers& buffers,
                        bool accumulate) {
  const auto widest = static_cast<std::size_t>(this->widest_elems());
  ArenaScope scope(buffers.backward);
  T* slot[2] = {buffers.backward.take<T>(widest), buffers.backward.take<T>(widest)};
  ConstMatrixView<T> dy = dY;
  int k = 0;
  for (std::size_t i = this->stages_.size(); i-- > 0;) {
    // dense (contiguous) in a slot: collectives take it whole; the first
    // layer writes the chain's dX
    const MatrixView<T> dx = i == 0 ? dX
                                    : MatrixView<T>::dense(slot[k], this->input_rows(i),
                                                           this->input_cols(i), Order::row_major);
    this->stages_[i].layer->backward(dy, dx, buffers, accumulate);
    dy = dx;
    k = 1 - k;
  }
}

// ---------------------------------------------------------------- Parallel

template <class T>
Parallel<T>::Parallel(std::vector<std::unique_ptr<Chain<T>>> branches, bool adds_input,
                      Combine combine)
    : branches_(std::move(branches)), adds_input_(adds_input), combine_(combine) {
  require(!branches_.empty(), "Parallel: no branch");
  require(!adds_input || combine == Combine::sum, "Parallel: a residual sums");
}

template <class T>
void Parallel<T>::collect_parameters(std::vector<Param<T>*>& out) {
  for (auto& b : branches_) b->collect_parameters(out);
}

template <class T>
BufferNeeds Parallel<T>::buffer_needs() const {
  BufferNeeds needs;
  for (const auto& b : branches_) needs.then(b->buffer_needs());
  const Chain<T>& c = *branches_.front();
  const SchemeContext<T>& s = c.scheme();
  ByteCount<T> out, in;
  out.add(s.local_rows(c.tokens(), c.out_layout()) * s.local_cols(c.out_width(), c.out_layout()));
  in.add(s.local_rows(c.tokens(), c.in_layout()) * s.local_cols(c.in_width(), c.in_layout()));
  if (combine_ == Combine::concat) {  // a branch's output (forward) and its dY (backward)
    needs.workspace += out;
    needs.backward += out;
  } else if (branches_.size() > 1) {  // one output block (forward: workspace)
    needs.workspace += out;
  }
  if (branches_.size() > 1) needs.backward += in;  // an input gradient
  return needs;
}

template <class T>
void Parallel<T>::price(cost::Tally& t, model::Phase phase) const {
  const Chain<T>& c = *branches_.front();
  const SchemeContext<T>& s = c.scheme();
  const bool backward = phase == model::Phase::backward;
  // a sum: read two blocks, write one (forward: outputs; backward: input gradients)
  const index_t in_block =
      s.local_rows(c.tokens(), c.in_layout()) * s.local_cols(c.in_width(), c.in_layout());
  const index_t out_block =
      s.local_rows(c.tokens(), c.out_layout()) * s.local_cols(c.out_width(), c.out_layout());
  const auto sum = [&] {
    t.memory(3 * static_cast<cost::u64>(backward ? in_block : out_block) * sizeof(T));
  };
  // a branch's block copied to or from its columns: read one, write one
  const auto copy = [&] { t.memory(2 * static_cast<cost::u64>(out_block) * sizeof(T)); };
  const bool concat = combine_ == Combine::concat;
  for (std::size_t k = 0; k < branches_.size(); ++k) {
    if (concat && backward) copy();
    branches_[k]->price(t, phase);
    if (concat && !backward) copy();
    if (k > 0 && (backward || !concat)) sum();
  }
  if (adds_input_) sum();
}

template <class T>
void Parallel<T>::forward(ConstMatrixView<T> X, MatrixView<T> Y, StepBuffers& buffers) {
  Backend& be = branches_.front()->scheme().backend();
  if (combine_ == Combine::concat) {  // each branch into a block, copied into its columns
    const index_t c = Y.cols / static_cast<index_t>(branches_.size());
    for (std::size_t k = 0; k < branches_.size(); ++k) {
      ArenaScope scope(buffers.workspace);
      const MatrixView<T> y = take_block<T>(buffers.workspace, Y.rows, c);
      branches_[k]->forward(X, y, buffers);
      be.copy(ConstMatrixView<T>(y), Y.block(0, static_cast<index_t>(k) * c, Y.rows, c));
    }
    return;
  }
  branches_.front()->forward(X, Y, buffers);
  for (std::size_t k = 1; k < branches_.size(); ++k) {
    ArenaScope scope(buffers.workspace);
    const MatrixView<T> y = take_block<T>(buffers.workspace, Y.rows, Y.cols);
    branches_[k]->forward(X, y, buffers);
    be.axpby(acc_t<T>(1), ConstMatrixView<T>(y), acc_t<T>(1), Y);
  }
  if (adds_input_) be.axpby(acc_t<T>(1), X, acc_t<T>(1), Y);  // Y = X + body(X)
}

template <class T>
void Parallel<T>::backward(ConstMatrixView<T> dY, MatrixView<T> dX, StepBuffers& buffers,
                           bool accumulate) {
  Backend& be = branches_.front()->scheme().backend();
  const bool input_grad = dX.rows > 0 && dX.cols > 0;
  const bool concat = combine_ == Combine::concat;
  const index_t c = dY.cols / static_cast<index_t>(branches_.size());
  // branch k's output gradient: dY, or (concatenated) its columns copied
  // into a dense block, as the branch's layers take it
  const auto branch_dy = [&](std::size_t k) -> ConstMatrixView<T> {
    if (!concat) return dY;
    const MatrixView<T> dy = take_block<T>(buffers.backward, dY.rows, c);
    be.copy(dY.block(0, static_cast<index_t>(k) * c, dY.rows, c), dy);
    return dy;
  };
  {
    ArenaScope scope(buffers.backward);
    branches_.front()->backward(branch_dy(0), dX, buffers, accumulate);
  }
  for (std::size_t k = 1; k < branches_.size(); ++k) {
    ArenaScope scope(buffers.backward);
    const ConstMatrixView<T> dy = branch_dy(k);
    const MatrixView<T> dx = input_grad ? take_block<T>(buffers.backward, dX.rows, dX.cols) : dX;
    branches_[k]->backward(dy, dx, buffers, accumulate);
    if (input_grad) be.axpby(acc_t<T>(1), ConstMatrixView<T>(dx), acc_t<T>(1), dX);
  }
  if (adds_input_ && input_grad) be.axpby(acc_t<T>(1), dY, acc_t<T>(1), dX);  // dX += dY
}

// ---------------------------------------------------------------- Sequential

template <class T>
Sequential<T>::Sequential(SchemeContext<T>& scheme, index_t tokens, index_t in_width,
                          ActivationLayout in_layout)
    : LayerStack<T>(scheme, tokens, in_width, in_layout, "Sequential") {}

template <class T>
Sequential<T>::~Sequential() = default;

template <class T>
void Sequential<T>::collect_parameters(std::vector<Param<T>*>& out) {
  for (auto& s : this->stages_) s.layer->collect_parameters(out);
}

template <class T>
BufferNeeds Sequential<T>::buffer_needs() const {
  BufferNeeds needs;
  for (const auto& s : this->stages_) needs.then(s.layer->buffer_needs());
  return needs;
}

template <class T>
void Sequential<T>::finish(BufferNeeds extra) {
  require(store_ == nullptr, "Sequential: finish() twice");
  require(!stages_.empty(), "Sequential: finish() without layers");
  require(this->out_groups() == 1, [&] {
    return fmt::format(
        "Sequential: the model ends in a concatenation of {} branches (grouped columns): end it "
        "with a linear",
        this->out_groups());
  });
  this->seal();
  Backend& be = scheme_->backend();
  scheme_->finish_layers(false);  // state the layers share (3D: ORS / OAG buffers)
  BufferNeeds needs = buffer_needs();
  needs.then(extra);
  store_ = std::make_unique<ParameterStore<T>>(be, this->parameters());
  workspace_ = std::make_unique<Arena>("workspace", be, needs.workspace);
  forward_ = std::make_unique<Arena>("forward", be, needs.forward);
  backward_ = std::make_unique<Arena>("backward", be, needs.backward);
  ByteCount<T> outs;
  for (const Stage& s : stages_) outs.add(local_elems(s.width, s.layout));
  activations_ = std::make_unique<Arena>("activations", be, outs.bytes());
  for (Stage& s : stages_) {
    const index_t rows = local_rows(s.layout), cols = local_cols(s.width, s.layout);
    s.out = MatrixView<T>::dense(activations_->take<T>(static_cast<std::size_t>(rows * cols)), rows,
                                 cols, Order::row_major);
  }
  const index_t widest = this->widest_elems();
  ByteCount<T> slot;
  slot.add(widest);
  grads_ = std::make_unique<Arena>("activation gradients", be, 2 * slot.bytes());
  for (MatrixView<T>& g : grad_slot_)  // reshaped at each use (backward)
    g = MatrixView<T>::dense(grads_->take<T>(static_cast<std::size_t>(widest)), 1, widest,
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
  const index_t rows = local_rows(in_layout_), cols = local_cols(in_width_, in_layout_);
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
  ConstMatrixView<T> dy = dY;
  int slot = 0;
  for (std::size_t i = stages_.size(); i-- > 0;) {
    // dense (contiguous) in the slot: collectives take it whole
    const auto dx = MatrixView<T>::dense(grad_slot_[slot].data, this->input_rows(i),
                                         this->input_cols(i), Order::row_major);
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

#define SUMMA_SEQUENTIAL_INSTANTIATE(T) \
  template class LayerStack<T>;         \
  template class Chain<T>;              \
  template class Parallel<T>;           \
  template class Sequential<T>;
SUMMA_SEQUENTIAL_INSTANTIATE(float)
SUMMA_SEQUENTIAL_INSTANTIATE(double)
SUMMA_SEQUENTIAL_INSTANTIATE(bf16)
#undef SUMMA_SEQUENTIAL_INSTANTIATE
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

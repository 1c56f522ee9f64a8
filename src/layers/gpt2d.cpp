#include "summa/layers/gpt2d.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace summa {

namespace {

SummaEngine& checked(SummaEngine& engine, const reference::GptConfig& c, index_t batch,
                     index_t seq) {
  const int q = engine.q();
  std::optional<std::string> error;
  try {
    c.validate();
  } catch (const Error& e) {
    error = fmt::format("GPT2D: {}", e.what());
  }
  const auto bad = [&](const char* what, index_t v) {
    if (!error && v % q != 0)
      error = fmt::format("GPT2D: {}={} must be divisible by q={}", what, v, q);
  };
  const int data = engine.grid().shape().data;
  if (!error && (batch <= 0 || seq <= 0))
    error = fmt::format("GPT2D: batch={} and seq={} must be positive", batch, seq);
  if (!error && batch % (static_cast<index_t>(data) * q) != 0)
    error = fmt::format(
        "GPT2D: batch={} must be divisible by data*q = {}*{} (whole sequences per mesh row of "
        "every data group)",
        batch, data, q);
  bad("n_embd (hidden)", c.n_embd);
  bad("n_head", c.n_head);
  bad("vocab_size", c.vocab_size);
  if (!error && seq > c.n_positions)
    error = fmt::format("GPT2D: seq={} is longer than the position table (n_positions={})", seq,
                        c.n_positions);
  engine.grid().agree(CommAxis::world, error);
  return engine;
}

}  // namespace

template <class T>
GPT2D<T>::GPT2D(SummaEngine& engine, const reference::GptConfig& config, index_t batch, index_t seq,
                GptOptions options)
    : engine_(&checked(engine, config, batch, seq)),
      config_(config),
      options_(options),
      batch_(batch),
      seq_(seq),
      q_(engine.q()),
      data_(engine.grid().shape().data),
      local_batch_(batch / data_) {
  // Each data group runs the whole model on its local_batch_ sequences.
  const index_t h = config.n_embd, tokens = local_batch_ * seq;
  embedding_ = std::make_unique<Embedding2D<T>>(engine, local_batch_, seq, config.vocab_size, h,
                                                config.n_positions);
  for (int i = 0; i < config.n_layer; ++i)
    blocks_.push_back(std::make_unique<TransformerBlock2D<T>>(engine, fmt::format("h.{}", i),
                                                              local_batch_, seq, h, config.n_head,
                                                              config.layer_norm_epsilon));
  ln_f_ =
      std::make_unique<LayerNorm2DLayer<T>>(engine, "ln_f", tokens, h, config.layer_norm_epsilon);
  // The loss is normalised by the global token count: group losses and
  // gradients add up over the data axis.
  head_ = std::make_unique<LMHead2D<T>>(engine, embedding_->wte(), tokens, h, config.vocab_size,
                                        batch * seq);
  store_ = std::make_unique<ParameterStore<T>>(engine.backend(), this->parameters());
  // Gradient buckets for the data-axis all-reduce, in the order backward
  // finishes them: ln_f, blocks N-1 .. 0, the embedding (wte gets the head's
  // and the embedding's parts).
  const auto bucket_of = [&](Module<T>& m) {
    Bucket b;
    for (Param<T>* p : m.parameters()) {
      if (!p->held()) continue;
      if (b.begin == nullptr) b.begin = p->grad;
      require(p->grad == b.begin + b.count, "GPT2D: a bucket's gradients are not contiguous");
      b.count += p->shard.local_size();
    }
    return b;
  };
  buckets_.push_back(bucket_of(*ln_f_));
  for (std::size_t i = blocks_.size(); i-- > 0;) buckets_.push_back(bucket_of(*blocks_[i]));
  buckets_.push_back(bucket_of(*embedding_));

  const BufferNeeds needs = buffer_needs();
  const index_t nt = tokens / q_, hq = h / q_;
  ByteCount<T> slot;
  slot.add(nt * hq);
  ModelBuffers::Sizes sizes{.workspace = needs.workspace,
                            .forward = needs.forward,
                            .backward = needs.backward,
                            .conjunction = 2 * slot.bytes(),
                            .checkpoint = static_cast<std::size_t>(config.n_layer + 1) * slot};
  buffers_ = std::make_unique<ModelBuffers>(engine.backend(), sizes);
  const auto take = [&](Arena& a) {
    return MatrixView<T>::dense(a.take<T>(static_cast<std::size_t>(nt * hq)), nt, hq,
                                Order::row_major);
  };
  for (int i = 0; i <= config.n_layer; ++i) boundaries_.push_back(take(buffers_->checkpoint));
  conj_[0] = take(buffers_->conjunction);
  conj_[1] = take(buffers_->conjunction);
  tokens_.resize(static_cast<std::size_t>(tokens));
  targets_.resize(static_cast<std::size_t>(tokens));
}

template <class T>
void GPT2D<T>::reduce_bucket(std::size_t k) {
  if (data_ == 1) return;
  Bucket& b = buckets_[k];
  if (b.count > 0)
    b.request = engine_->grid().data().iall_reduce(
        b.begin, b.begin, static_cast<std::size_t>(b.count), dtype_v<T>, ReduceOp::sum);
}

template <class T>
void GPT2D<T>::finish_gradients() {
  for (Bucket& b : buckets_) engine_->grid().data().wait(b.request);
}

template <class T>
GPT2D<T>::~GPT2D() = default;

template <class T>
void GPT2D<T>::collect_parameters(std::vector<Param<T>*>& out) {
  embedding_->collect_parameters(out);
  for (auto& b : blocks_) b->collect_parameters(out);
  ln_f_->collect_parameters(out);
  head_->collect_parameters(out);  // tied: nothing of its own
}

template <class T>
BufferNeeds GPT2D<T>::buffer_needs() const {
  const index_t nt = local_batch_ * seq_ / q_, hq = config_.n_embd / q_;
  ByteCount<T> slot;
  slot.add(nt * hq);
  const BufferNeeds block = blocks_.front()->buffer_needs();
  // the head: LN_f's output and statistics, the logits and loss statistics
  BufferNeeds head{.workspace = 0, .forward = slot, .backward = 0};
  head.then(ln_f_->buffer_needs()).then(head_->buffer_needs());
  const std::size_t head_backward = slot + head.backward;  // dL/d LN_f output
  BufferNeeds all;
  all.workspace = std::max({embedding_->buffer_needs().workspace, block.workspace, head.workspace});
  all.forward = options_.checkpoint
                    ? std::max(block.forward, head.forward)
                    : static_cast<std::size_t>(config_.n_layer) * block.forward + head.forward;
  all.backward = std::max(block.backward, head_backward);
  return all;
}

template <class T>
void GPT2D<T>::init(std::uint64_t seed) {
  store_->init_gpt(seed, config_);
}

template <class T>
ConstMatrixView<T> GPT2D<T>::boundary(int i) const {
  require(i >= 0 && i <= config_.n_layer,
          [&] { return fmt::format("GPT2D boundary {}: expected 0..{}", i, config_.n_layer); });
  return boundaries_[static_cast<std::size_t>(i)];
}

template <class T>
double GPT2D<T>::forward(std::span<const std::int32_t> tokens,
                         std::span<const std::int32_t> targets) {
  have_forward_ = false;
  {
    std::optional<std::string> error;
    const auto expected = static_cast<std::size_t>(batch_ * seq_);
    for (auto [what, ids] : {std::pair{"token", tokens}, std::pair{"target", targets}}) {
      if (error) break;
      if (ids.size() != expected) {
        error = fmt::format("GPT2D: {} ids has {} values, expected batch*seq = {}*{} = {}", what,
                            ids.size(), batch_, seq_, expected);
        break;
      }
      const auto bad = std::find_if(ids.begin(), ids.end(), [&](std::int32_t id) {
        return id < 0 || id >= config_.vocab_size;
      });
      if (bad != ids.end())
        error = fmt::format("GPT2D: {} id {} at position {} is outside [0, vocab={})", what, *bad,
                            bad - ids.begin(), config_.vocab_size);
    }
    engine_->grid().agree(CommAxis::world, error);
  }
  // This data group's sequences.
  const auto first = static_cast<std::size_t>(engine_->grid().coords().data) * tokens_.size();
  std::copy_n(tokens.begin() + static_cast<std::ptrdiff_t>(first), tokens_.size(), tokens_.begin());
  std::copy_n(targets.begin() + static_cast<std::ptrdiff_t>(first), targets_.size(),
              targets_.begin());
  ModelBuffers& B = *buffers_;
  B.forward.reset();
  B.backward.reset();
  B.workspace.reset();
  StepBuffers step = B.step();
  embedding_->forward(tokens_, boundaries_[0], step);
  for (std::size_t i = 0; i < blocks_.size(); ++i) {
    const std::size_t mark = B.forward.mark();
    blocks_[i]->forward(boundaries_[i], boundaries_[i + 1], step);
    if (options_.checkpoint) B.forward.release(mark);
  }
  const index_t nt = local_batch_ * seq_ / q_, hq = config_.n_embd / q_;
  lnf_ = MatrixView<T>::dense(B.forward.take<T>(static_cast<std::size_t>(nt * hq)), nt, hq,
                              Order::row_major);
  ln_f_->forward(boundaries_.back(), lnf_, step);
  double loss = head_->forward(lnf_, targets_, step);
  if (data_ > 1) engine_->grid().data().all_reduce(&loss, &loss, 1, DType::f64, ReduceOp::sum);
  have_forward_ = true;
  return loss;
}

template <class T>
void GPT2D<T>::backward(bool accumulate) {
  require(have_forward_, "GPT2D backward: no forward pass to differentiate");
  have_forward_ = false;
  ModelBuffers& B = *buffers_;
  StepBuffers step = B.step();
  if (!accumulate) {
    store_->zero_grads();
  } else if (data_ > 1) {
    // The data-axis sum below would count the accumulated (already summed,
    // identical) gradients once per group: pre-scale them by 1/data.
    const index_t total = store_->local_elements();
    if (total > 0)
      engine_->backend().scale(
          T(1) / static_cast<T>(data_),
          MatrixView<T>::dense(store_->grads_base(), 1, total, Order::row_major));
  }
  const index_t nt = local_batch_ * seq_ / q_, hq = config_.n_embd / q_;
  {
    ArenaScope scope(B.backward);
    const auto dlnf = MatrixView<T>::dense(B.backward.take<T>(static_cast<std::size_t>(nt * hq)),
                                           nt, hq, Order::row_major);
    head_->backward(dlnf, step, true);
    ln_f_->backward(dlnf, conj_[0], step, true);
  }
  std::size_t bucket = 0;
  reduce_bucket(bucket++);  // ln_f's gradients are final
  int cur = 0;
  for (std::size_t i = blocks_.size(); i-- > 0;) {
    if (options_.checkpoint) {
      // Recompute block i from its checkpointed input; its output goes to the
      // free conjunction slot (backward does not read a block's output).
      B.forward.reset();
      blocks_[i]->forward(boundaries_[i], conj_[1 - cur], step);
    }
    blocks_[i]->backward(conj_[cur], conj_[1 - cur], step, true);
    reduce_bucket(bucket++);  // in flight while the blocks below run
    cur = 1 - cur;
  }
  embedding_->backward(conj_[cur], step, true);
  reduce_bucket(bucket++);
  input_grad_ = conj_[cur];
  finish_gradients();  // the one completion point of the data-axis reduction
}

template <class T>
MemoryReport GPT2D<T>::memory_report() const {
  MemoryReport r;
  r.parameters = store_->values().capacity();
  r.gradients = store_->grads().capacity();
  r.activations = buffers_->forward.high_water() + buffers_->checkpoint.high_water();
  r.buffers.push_back({"parameters", store_->values().capacity(), store_->values().high_water()});
  r.buffers.push_back({"gradients", store_->grads().capacity(), store_->grads().high_water()});
  for (BufferUsage& u : buffers_->usage()) r.buffers.push_back(std::move(u));
  return r;
}

template class GPT2D<float>;
template class GPT2D<double>;

}  // namespace summa

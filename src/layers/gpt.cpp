#include "summa/layers/gpt.hpp"
#include "summa/model/cost.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>

namespace summa {

namespace {

ProcessGrid& checked(const std::string& what, ProcessGrid& grid, const Backend& backend,
                     const GptConfig& c, index_t batch, index_t seq, const GptOptions& options) {
  std::optional<std::string> error;
  try {
    c.validate();
  } catch (const Error& e) {
    error = fmt::format("{}: {}", what, e.what());
  }
  const int data = grid.shape().data;
  if (!error && (batch <= 0 || seq <= 0))
    error = fmt::format("{}: batch={} and seq={} must be positive", what, batch, seq);
  if (!error && batch % data != 0)
    error = fmt::format("{}: batch={} must be divisible by the data-parallel groups data={}", what,
                        batch, data);
  // Every size the model forms from these (tokens x a width, the weights,
  // the attention's batch x heads x seq x seq probabilities, the logits)
  // must stay far inside index_t: checked in floating point before any is
  // formed (was: signed overflow while planning, for flags in range).
  if (!error && batch > 0 && seq > 0) {
    const double tokens = static_cast<double>(batch) * static_cast<double>(seq);
    const double widest = std::max(
        {4.0 * c.n_embd, static_cast<double>(c.vocab_size), static_cast<double>(c.n_positions)});
    const double largest = std::max({tokens * widest, tokens * seq * c.n_head, widest * c.n_embd});
    if (largest > 0x1p62)
      error = fmt::format(
          "{}: batch={}, seq={} with n_embd={}, n_head={}, vocab_size={} make a buffer of "
          "{:.3g} elements (tokens x width, batch x heads x seq^2 attention probabilities, or "
          "a weight), beyond 2^62: no machine holds it",
          what, batch, seq, c.n_embd, c.n_head, c.vocab_size, largest);
  }
  if (!error && seq > c.n_positions)
    error = fmt::format("{}: seq={} is longer than the position table (n_positions={})", what, seq,
                        c.n_positions);
  if (!error && options.kv_cache != 0 &&
      (!options.inference || options.kv_cache < seq || options.kv_cache > c.n_positions))
    error = fmt::format(
        "{}: kv_cache={} needs inference and a length in [seq={}, n_positions={}]{}", what,
        options.kv_cache, seq, c.n_positions, options.inference ? "" : " (inference is off)");
  // The layers hand device buffers to the communicators without waiting for
  // the backend: only communicators ordered with its stream may take them.
  if (!error && !options.plan_only && backend.asynchronous() &&
      !(grid.tensor().stream_ordered() && grid.data().stream_ordered()))
    error = fmt::format(
        "{}: backend '{}' keeps activations and parameters in device memory, which the grid's "
        "host-driven MPI communicators cannot take: build the grid with GridOptions::comm = "
        "nccl or mpi_staged and the backend's stream",
        what, backend.name());
  grid.agree(CommAxis::world, error);
  return grid;
}

}  // namespace

std::string_view to_string(Recompute r) {
  switch (r) {
    case Recompute::none:
      return "none";
    case Recompute::full:
      return "full";
    case Recompute::selective:
      return "selective";
  }
  return "?";
}

Recompute parse_recompute(std::string_view text, std::string_view what) {
  for (const Recompute r : {Recompute::none, Recompute::full, Recompute::selective})
    if (text == to_string(r)) return r;
  throw Error(fmt::format("{} '{}': expected none, full or selective", what, text));
}

template <class T>
Gpt<T>::Gpt(SchemeContext<T>& scheme, const GptConfig& config, index_t batch, index_t seq,
            GptOptions options)
    : scheme_(&scheme),
      grid_(&checked(fmt::format("GPT ({})", scheme.label()), scheme.grid(), scheme.backend(),
                     config, batch, seq, options)),
      backend_(&scheme.backend()),
      config_(config),
      options_(options),
      batch_(batch),
      seq_(seq),
      data_(grid_->shape().data),
      local_batch_(batch / data_) {
  grid_->agree(CommAxis::world, scheme.check_gpt(config, batch));
  if (scheme.checkpoint_group() != nullptr && !options.inference) {
    std::optional<std::string> error;
    if (options.recompute != Recompute::full)
      error = fmt::format(
          "GPT ({}): distributed checkpoints (dc=on) split each block's checkpointed input over "
          "the tensor group, and recompute {} keeps no per-block checkpoints (give recompute "
          "full, or drop dc=on)",
          scheme.label(), to_string(options.recompute));
    grid_->agree(CommAxis::world, error);
    ckpt_group_ = scheme.checkpoint_group();
  }
  const PipelineStage& ps = options.pipeline;
  if (ps.active()) {
    std::optional<std::string> error;
    if (ps.stage < 0 || ps.stage >= ps.stages || ps.first_block < 0 ||
        ps.first_block >= ps.last_block || ps.last_block > config.n_layer || ps.slots < 1 ||
        ps.loss_tokens < batch * seq)
      error = fmt::format(
          "GPT ({}): pipeline stage {} of {} with blocks [{}, {}) of {}, {} slots and {} loss "
          "tokens is not a stage (each stage holds at least one block; the loss counts at least "
          "this microbatch's {} tokens)",
          scheme.label(), ps.stage, ps.stages, ps.first_block, ps.last_block, config.n_layer,
          ps.slots, ps.loss_tokens, batch * seq);
    else if (options.inference || options.kv_cache != 0 || options.shard_gradients ||
             options.shard_parameters)
      error = fmt::format(
          "GPT ({}): a pipeline stage runs training, without a sharding level above 1 (got{}{})",
          scheme.label(), options.inference || options.kv_cache != 0 ? " inference" : "",
          options.shard_gradients || options.shard_parameters ? " zero >= 2" : "");
    grid_->agree(CommAxis::world, error);
  }
  const BackendIds::PlanScope planning(options.plan_only);  // a plan allocates no ids
  const index_t h = config.n_embd, b = local_batch_, tokens = b * seq;
  const double eps = config.layer_norm_epsilon;
  // A pipeline's last stage keeps a copy of the embedding for the tied head.
  if (!ps.active() || ps.first() || ps.last())
    embedding_ = scheme.embedding(b, seq, config.vocab_size, h, config.n_positions);
  // That copy is a replica of the first stage's (PipelineGpt keeps the two
  // alike): the gradient norm and a checkpoint count the first stage's.
  if (ps.active() && ps.last() && !ps.first())
    for (Param<T>* p : embedding_->parameters()) p->shard.stage_copy = true;
  first_block_ = ps.active() ? ps.first_block : 0;
  const int last_block = ps.active() ? ps.last_block : config.n_layer;
  for (int i = first_block_; i < last_block; ++i)
    blocks_.push_back(std::make_unique<TransformerBlock<T>>(scheme, fmt::format("h.{}", i), b, seq,
                                                            h, config.n_head, eps));
  if (!ps.active() || ps.last()) {
    ln_f_ = scheme.layer_norm("ln_f", tokens, h, eps);
    // The loss is normalised by the global token count (see the file comment).
    head_ = scheme.lm_head(embedding_->wte(), tokens, h, config.vocab_size,
                           ps.active() ? ps.loss_tokens : batch * seq);
  }
  if (options.kv_cache > 0)
    for (auto& block : blocks_) block->attn().use_cache(options.kv_cache);
  // Selective recompute keeps no probabilities; nor does inference, which
  // never differentiates (each sequence's formed in the workspace).
  if (options.recompute == Recompute::selective || options.inference)
    for (auto& block : blocks_) block->attn().recompute_probabilities(true);
  scheme.finish_layers(options.plan_only);
  finish_construction(scheme.local_rows(tokens, ActivationLayout::outer),
                      scheme.local_cols(h, ActivationLayout::outer));
}

template <class T>
Gpt<T>::~Gpt() = default;

template <class T>
void Gpt<T>::finish_construction(index_t rows, index_t cols) {
  rows_ = rows;
  cols_ = cols;
  reset_profile();
  const BufferNeeds needs = buffer_needs();
  ByteCount<T> slot;
  slot.add(rows * cols);
  // Inference: no conjunction, and the boundaries x_0..x_N alternate
  // between two slots (nothing reads them after the next block).
  const bool inference = options_.inference;
  // Distributed checkpoints: rank r's chunk of each of x_0..x_{N-1}, and one
  // whole slot (x_N in forward; the gather before each recompute).
  // A pipeline stage: its blocks' inputs and its output, per slot, and per
  // slot the gradient of its output (in the conjunction buffer).
  const auto slots = static_cast<std::size_t>(options_.pipeline.slots);
  const auto stage_blocks = static_cast<std::size_t>(blocks_.size());
  std::size_t checkpoint =
      staged() ? slots * (stage_blocks + 1) * slot
               : static_cast<std::size_t>(inference ? 2 : config_.n_layer + 1) * slot;
  // A pipeline stage without per-block checkpoints: each block's forward
  // region per slot (keeps_activations()).
  if (keeps_activations()) {
    kept_block_bytes_ = Arena::rounded(blocks_.front()->buffer_needs().forward);
    checkpoint += slots * stage_blocks * kept_block_bytes_;
  }
  if (ckpt_group_ != nullptr) {
    const index_t g = ckpt_group_->size();
    require(rows * cols % g == 0, [&] {
      return fmt::format("GPT: distributed checkpoints split {}x{} boundaries over {} ranks", rows,
                         cols, g);
    });
    ckpt_chunk_ = rows * cols / g;
    ByteCount<T> chunk;
    chunk.add(ckpt_chunk_);
    // A stage: per slot its input and output whole (the pipe's messages)
    // and the chunks of its inner boundaries, and one whole slot for the
    // gather before each recompute.
    checkpoint = staged() ? slots * (2 * slot + (stage_blocks - 1) * chunk) + slot
                          : static_cast<std::size_t>(config_.n_layer) * chunk + slot;
  }
  sizes_ = {.workspace = needs.workspace,
            .forward = needs.forward,
            .backward = needs.backward,
            .conjunction = inference ? 0 : (2 + (staged() ? slots : 0)) * slot.bytes(),
            .checkpoint = checkpoint};
  parameter_elements_ =
      ParameterStore<T>::padded_elements(this->parameters(), options_.parameter_multiple);
  sharded_values_ = options_.shard_parameters && !inference;
  unit_grads_ = sharded_values_ || (options_.shard_gradients && !inference && data_ > 1);
  if (unit_grads_) {
    if (sharded_values_) block_value_slots_ = scheme_->prefetches_weights() ? 3 : 2;
    const ShardedStoreBytes b =
        ParameterStore<T>::sharded_bytes(this->parameters(), true, options_.parameter_multiple,
                                         data_, parameter_units(), sharded_values_);
    parameter_bytes_ = b.values;
    gradient_bytes_ = b.gradients;
    parameter_elements_ = b.padded_elements;
  } else {
    parameter_bytes_ = ByteCount<T>()
                           .add(ParameterStore<T>::padded_elements(this->parameters(),
                                                                   options_.parameter_multiple))
                           .bytes();
    gradient_bytes_ = inference ? 0 : parameter_bytes_;
  }
  ByteCount<T> kv;  // each block's keys, then its values
  if (options_.kv_cache > 0)
    for (const auto& block : blocks_)
      kv.add(block->attn().cache_elements()).add(block->attn().cache_elements());
  kv_bytes_ = kv.bytes();
  // A pipeline's first and last stage: room for the other copy's embedding
  // gradients (PipelineGpt adds them after the batch).
  exchange_elements_ = 0;
  if (staged() && options_.pipeline.stages > 1 && embedding_)
    for (Param<T>* p : embedding_->parameters())
      exchange_elements_ += static_cast<std::size_t>(p->shard.local_size());
  exchange_bytes_ = ByteCount<T>().add(static_cast<index_t>(exchange_elements_)).bytes();
  if (options_.plan_only) return;
  if (exchange_bytes_ > 0)
    exchange_ = std::make_unique<Arena>("pipeline", *backend_, exchange_bytes_);
  if (kv_bytes_ > 0) {
    kv_ = std::make_unique<Arena>("kv_cache", *backend_, kv_bytes_);
    for (auto& block : blocks_) {
      const auto n = static_cast<std::size_t>(block->attn().cache_elements());
      T* keys = kv_->take<T>(n);
      block->attn().attach_cache(keys, kv_->take<T>(n));
    }
    backend_->scale(
        acc_t<T>(0),
        MatrixView<T>::dense(static_cast<T*>(kv_->base()), 1,
                             static_cast<index_t>(kv_->capacity() / sizeof(T)), Order::row_major));
  }
  if (unit_grads_)
    store_ = std::make_unique<ParameterStore<T>>(
        *backend_, this->parameters(), true, options_.parameter_multiple,
        ValueSharding{
            .data = &grid_->data(), .units = parameter_units(), .values = sharded_values_});
  else
    store_ = std::make_unique<ParameterStore<T>>(*backend_, this->parameters(), !inference,
                                                 options_.parameter_multiple);
  buffers_ = std::make_unique<ModelBuffers>(*backend_, sizes_);
  const auto take = [&](Arena& a) {
    return MatrixView<T>::dense(a.take<T>(static_cast<std::size_t>(rows * cols)), rows, cols,
                                Order::row_major);
  };
  no_targets_.assign(static_cast<std::size_t>(batch_ * seq_), 0);
  if (inference) {
    const MatrixView<T> slot[2] = {take(buffers_->checkpoint), take(buffers_->checkpoint)};
    for (int i = 0; i <= config_.n_layer; ++i) boundaries_.push_back(slot[i % 2]);
    tokens_.resize(static_cast<std::size_t>(local_batch_ * seq_));
    targets_.resize(tokens_.size());
    return;
  }
  conj_[0] = take(buffers_->conjunction);
  conj_[1] = take(buffers_->conjunction);
  if (staged() && ckpt_group_ != nullptr) {
    // boundaries_ per slot: x[0] and x[n] its own, the inner ones the
    // conjunction slots forward runs through (their chunks in chunks_, per
    // slot); then the gather slot.
    for (std::size_t k = 0; k < slots; ++k) output_grads_.push_back(take(buffers_->conjunction));
    for (std::size_t k = 0; k < slots; ++k)
      for (std::size_t i = 0; i <= stage_blocks; ++i) {
        if (i == 0 || i == stage_blocks) {
          boundaries_.push_back(take(buffers_->checkpoint));
          continue;
        }
        boundaries_.push_back(conj_[i % 2]);
        chunks_.push_back(MatrixView<T>::dense(
            buffers_->checkpoint.take<T>(static_cast<std::size_t>(ckpt_chunk_)), 1, ckpt_chunk_,
            Order::row_major));
      }
    boundaries_.push_back(take(buffers_->checkpoint));
  } else if (staged()) {
    for (std::size_t k = 0; k < slots; ++k) output_grads_.push_back(take(buffers_->conjunction));
    for (std::size_t k = 0; k < slots * (stage_blocks + 1); ++k)
      boundaries_.push_back(take(buffers_->checkpoint));
    if (keeps_activations())
      kept_ = static_cast<std::byte*>(
          buffers_->checkpoint.take_bytes(slots * stage_blocks * kept_block_bytes_));
  } else if (ckpt_group_ != nullptr) {
    for (int i = 0; i < config_.n_layer; ++i) {
      chunks_.push_back(
          MatrixView<T>::dense(buffers_->checkpoint.take<T>(static_cast<std::size_t>(ckpt_chunk_)),
                               1, ckpt_chunk_, Order::row_major));
      boundaries_.push_back(conj_[i % 2]);
    }
    boundaries_.push_back(take(buffers_->checkpoint));
  } else {
    for (int i = 0; i <= config_.n_layer; ++i) boundaries_.push_back(take(buffers_->checkpoint));
  }
  // A pipeline stage keeps each slot's token ids: the embedding's backward
  // reads them, after the other microbatches' forwards.
  tokens_.resize(static_cast<std::size_t>(local_batch_ * seq_) * slots);
  targets_.resize(static_cast<std::size_t>(local_batch_ * seq_));
  // Gradient buckets for the data axis, in the order backward finishes them.
  const auto bucket_of = [&](Module<T>& m) {
    Bucket b;
    for (Param<T>* p : m.parameters()) {
      if (!p->held()) continue;
      if (b.begin == nullptr) b.begin = p->grad;
      require(p->grad == b.begin + b.count, "Gpt: a bucket's gradients are not contiguous");
      b.count += p->shard.local_size();
    }
    return b;
  };
  if (ln_f_) buckets_.push_back(bucket_of(*ln_f_));
  for (std::size_t i = blocks_.size(); i-- > 0;) buckets_.push_back(bucket_of(*blocks_[i]));
  if (embedding_) buckets_.push_back(bucket_of(*embedding_));
}

template <class T>
void Gpt<T>::price(cost::Tally& t, model::Phase phase) const {
  // The blocks are alike: each adds its bytes, the first records its ops
  // with count n_layer.
  const auto each_block = [&](auto&& price_block) {
    const cost::u64 repeat = t.repeat;
    const bool record = t.record;
    t.repeat = repeat * blocks_.size();
    for (std::size_t i = 0; i < blocks_.size(); ++i) {
      t.record = record && i == 0;
      price_block(*blocks_[i]);
    }
    t.repeat = repeat;
    t.record = record;
  };
  // A pipeline stage prices what it runs: the embedding on the first
  // stage, the head on the last.
  const bool embeds = embedding_ && (!staged() || options_.pipeline.first());
  if (phase != model::Phase::backward) {
    if (embeds) {
      t.begin(gpt_op::embedding, phase);
      embedding_->price(t, phase);
    }
    each_block([&](const TransformerBlock<T>& b) { b.price(t, phase); });
    if (head_) {
      t.begin(gpt_op::ln_f, phase);
      ln_f_->price(t, phase);
      t.begin(gpt_op::lm_head, phase);
      head_->price(t, phase);
    }
  } else {
    if (head_) {
      t.begin(gpt_op::lm_head, phase);
      head_->price(t, phase);
      t.begin(gpt_op::ln_f, phase);
      ln_f_->price(t, phase);
    }
    // Distributed checkpoints: a block's input gathered from its chunks.
    // A stage gathers its inner blocks' inputs (its first block's input is
    // its own, whole); the unpipelined model every block's.
    const auto gather = [&] {
      t.begin(gpt_op::checkpoint_gather, model::Phase::recompute);
      t.all_gather(CommAxis::tensor, static_cast<cost::u64>(ckpt_chunk_),
                   static_cast<cost::u64>(ckpt_group_->size()), sizeof(T));
    };
    if (ckpt_group_ != nullptr && staged() && blocks_.size() > 1) {
      const cost::u64 repeat = t.repeat;
      t.repeat = repeat * (blocks_.size() - 1);
      gather();
      t.repeat = repeat;
    }
    each_block([&](const TransformerBlock<T>& b) {
      if (ckpt_group_ != nullptr && !staged()) gather();
      if (checkpointed()) b.price(t, model::Phase::recompute);
      b.price(t, phase);
    });
    if (embeds) {
      t.begin(gpt_op::embedding, phase);
      embedding_->price(t, phase);
    }
  }
}

template <class T>
std::vector<std::uint64_t> Gpt<T>::data_bucket_elements() {
  const auto elements = [](Module<T>& m) {
    std::uint64_t n = 0;
    for (const Param<T>* p : m.parameters())
      if (p->held()) n += static_cast<std::uint64_t>(p->shard.local_size());
    return n;
  };
  std::vector<std::uint64_t> out;
  if (ln_f_) out.push_back(elements(*ln_f_));
  for (std::size_t i = blocks_.size(); i-- > 0;) out.push_back(elements(*blocks_[i]));
  if (embedding_) out.push_back(elements(*embedding_));
  return out;
}

template <class T>
void Gpt<T>::collect_parameters(std::vector<Param<T>*>& out) {
  if (embedding_) embedding_->collect_parameters(out);
  for (auto& b : blocks_) b->collect_parameters(out);
  if (ln_f_) ln_f_->collect_parameters(out);
  if (head_) head_->collect_parameters(out);  // tied: nothing of its own
}

template <class T>
BufferNeeds Gpt<T>::buffer_needs() const {
  ByteCount<T> slot;
  slot.add(rows_ * cols_);
  const BufferNeeds block = blocks_.front()->buffer_needs();
  // the head: LN_f's output and statistics, the logits and loss statistics
  // (a pipeline stage without the head: none)
  BufferNeeds head{.workspace = 0, .forward = head_ ? slot.bytes() : 0, .backward = 0};
  if (head_) head.then(ln_f_->buffer_needs()).then(head_->buffer_needs());
  const std::size_t head_backward = head_ ? slot + head.backward : 0;  // dL/d LN_f output
  BufferNeeds all;
  all.workspace = std::max(
      {embedding_ ? embedding_->buffer_needs().workspace : 0, block.workspace, head.workspace});
  // (a pipeline stage: one block's at a time; what it keeps per slot lies
  // in the checkpoint buffer)
  all.forward = checkpointed() || options_.inference || staged()
                    ? std::max(block.forward, head.forward)
                    : static_cast<std::size_t>(config_.n_layer) * block.forward + head.forward;
  all.backward = options_.inference ? 0 : std::max(block.backward, head_backward);
  return all;
}

template <class T>
void Gpt<T>::require_allocated(const char* what) const {
  require(!options_.plan_only, [&] {
    return fmt::format("GPT {}: this model was built with plan_only (no memory)", what);
  });
}

template <class T>
ParameterStore<T>& Gpt<T>::parameters_store() {
  require_allocated("parameters_store");
  return *store_;
}

template <class T>
ModelBuffers& Gpt<T>::buffers() {
  require_allocated("buffers");
  return *buffers_;
}

template <class T>
void Gpt<T>::init(std::uint64_t seed) {
  require_allocated("init");
  store_->init_gpt(seed, config_);
}

template <class T>
ConstMatrixView<T> Gpt<T>::boundary(int i) const {
  require_whole("boundary");
  require(i >= 0 && i <= config_.n_layer,
          [&] { return fmt::format("GPT boundary {}: expected 0..{}", i, config_.n_layer); });
  require(ckpt_group_ == nullptr || i == config_.n_layer, [&] {
    return fmt::format(
        "GPT boundary {}: with distributed checkpoints this rank keeps 1/{} of it (use "
        "gather_boundary)",
        i, ckpt_group_->size());
  });
  return boundaries_[static_cast<std::size_t>(i)];
}

template <class T>
void Gpt<T>::gather_boundary(int i, MatrixView<T> out) {
  require_allocated("gather_boundary");
  require_whole("gather_boundary");
  require(i >= 0 && i <= config_.n_layer, [&] {
    return fmt::format("GPT gather_boundary {}: expected 0..{}", i, config_.n_layer);
  });
  require(
      out.rows == rows_ && out.cols == cols_ && out.ld == cols_ && out.order == Order::row_major,
      [&] {
        return fmt::format("GPT gather_boundary: out is {}x{} (ld {}), expected dense {}x{}",
                           out.rows, out.cols, out.ld, rows_, cols_);
      });
  if (ckpt_group_ == nullptr || i == config_.n_layer) {
    backend_->copy(ConstMatrixView<T>(boundaries_[static_cast<std::size_t>(i)]), out);
    return;
  }
  ckpt_group_->all_gather(chunks_[static_cast<std::size_t>(i)].data, out.data,
                          static_cast<std::size_t>(ckpt_chunk_));
}

// Distributed checkpoints: this rank's chunk of the whole boundary x.
template <class T>
void Gpt<T>::keep_chunk(const MatrixView<T>& x, MatrixView<T> chunk) {
  const auto whole = ConstMatrixView<T>::dense(x.data, 1, rows_ * cols_, Order::row_major);
  backend_->copy(whole.block(0, ckpt_group_->rank() * ckpt_chunk_, 1, ckpt_chunk_), chunk);
}

// x_i's chunk (whole in boundaries_[i]).
template <class T>
void Gpt<T>::save_chunk(int i) {
  if (ckpt_group_ == nullptr || i >= config_.n_layer) return;
  keep_chunk(boundaries_[static_cast<std::size_t>(i)], chunks_[static_cast<std::size_t>(i)]);
}

// A pipeline stage's chunk of its slot's inner boundary `i` (0 < i < n).
template <class T>
MatrixView<T> Gpt<T>::stage_chunk(std::size_t slot, std::size_t i) const {
  return chunks_[slot * (blocks_.size() - 1) + i - 1];
}

template <class T>
void Gpt<T>::reduce_bucket(std::size_t k) {
  if (scheme_->defers_gradients()) return;  // deferred: all at the end
  if (unit_grads_) {  // bucket k: LN_f, the blocks from the last, the embedding
    const auto n = static_cast<std::size_t>(config_.n_layer);
    store_->reduce_unit_grads(k == 0   ? ln_f_unit()
                              : k <= n ? block_unit(static_cast<index_t>(n - k))
                                       : 0);
    return;
  }
  if (data_ == 1) return;
  issue_bucket(buckets_[k]);
}

template <class T>
std::vector<ParameterUnit> Gpt<T>::parameter_units() const {
  // The parameters in collect_parameters' order: the embedding's, each
  // block's, LN_f's (the tied head has none of its own).
  const index_t n = config_.n_layer;
  const index_t grad_slots = scheme_->defers_gradients() ? n : std::min<index_t>(2, n);
  std::vector<ParameterUnit> units;
  std::size_t at = 0;
  const auto add = [&](std::size_t count, int value_slot, int grad_slot) {
    units.push_back(
        {.first = at, .last = at + count, .value_slot = value_slot, .grad_slot = grad_slot});
    at += count;
  };
  add(embedding_->parameters().size(), 0, 0);
  for (index_t i = 0; i < n; ++i)
    add(blocks_[static_cast<std::size_t>(i)]->parameters().size(),
        static_cast<int>(2 + i % block_value_slots_), static_cast<int>(2 + i % grad_slots));
  add(ln_f_->parameters().size(), 1, 1);
  return units;
}

template <class T>
void Gpt<T>::stage_blocks(index_t i, index_t step) {
  const index_t n = config_.n_layer;
  for (index_t k = 0; k < block_value_slots_; ++k) {
    const index_t j = i + k * step;
    if (j >= 0 && j < n) store_->gather_unit(block_unit(j));
  }
  for (index_t k = 0; k + 1 < block_value_slots_; ++k) {
    const index_t j = i + k * step;
    if (j >= 0 && j < n) store_->wait_unit(block_unit(j));
  }
}

template <class T>
void Gpt<T>::issue_bucket(Bucket& b) {
  if (b.count == 0) return;  // nothing held here (2D: ln_f off mesh row 0)
  Communicator& data = grid_->data();
  b.request = data.iall_reduce(b.begin, b.begin, static_cast<std::size_t>(b.count), dtype_v<T>,
                               ReduceOp::sum);
}

template <class T>
void Gpt<T>::wait_bucket(Bucket& b) {
  grid_->data().wait(b.request);
}

template <class T>
template <class F>
void Gpt<T>::timed(Part part, F&& work) {
  if (!options_.profile) {
    work();
    return;
  }
  backend_->synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  work();
  backend_->synchronize();
  parts_[part].seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++parts_[part].calls;
}

template <class T>
void Gpt<T>::Clock::begin(std::string_view /*op*/) {
  owner_->backend_->synchronize();
  start_ = std::chrono::steady_clock::now();
}

template <class T>
void Gpt<T>::Clock::end(std::string_view op, bool counted) {
  owner_->backend_->synchronize();
  const double dt =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  for (std::size_t k = 0; k < block_ops.size(); ++k)
    if (block_ops[k] == op) {
      StepPart& p = owner_->parts_[part_count + phase * block_ops.size() + k];
      p.seconds += dt;
      if (counted) ++p.calls;
      return;
    }
}

template <class T>
StepBuffers Gpt<T>::step_buffers() {
  StepBuffers step = buffers_->step();
  if (options_.profile) step.clock = &clock_;
  return step;
}

// A forward's start: the scheme told, every step buffer empty.
template <class T>
StepBuffers Gpt<T>::begin_forward_step() {
  scheme_->begin_forward();
  buffers_->forward.reset();
  buffers_->backward.reset();
  buffers_->workspace.reset();
  clock_.phase = 0;
  return step_buffers();
}

template <class T>
std::span<const StepPart> Gpt<T>::profile() const {
  if (!options_.profile) return {};
  return parts_;
}

template <class T>
void Gpt<T>::reset_profile() {
  constexpr std::array<std::pair<std::string_view, std::string_view>, part_count> names = {{
      {gpt_op::embedding, "forward"},
      {"blocks", "forward"},
      {gpt_op::ln_f, "forward"},
      {gpt_op::lm_head, "forward"},
      {gpt_op::lm_head, "backward"},
      {gpt_op::ln_f, "backward"},
      {"blocks", "recompute"},
      {"blocks", "backward"},
      {gpt_op::embedding, "backward"},
      {gpt_op::data_axis, "backward"},
  }};
  for (std::size_t i = 0; i < part_count; ++i)
    parts_[i] = {.op = names[i].first, .phase = names[i].second, .seconds = 0, .calls = 0};
  constexpr std::array<std::string_view, block_phases> phases = {"forward", "recompute",
                                                                 "backward"};
  for (std::size_t ph = 0; ph < block_phases; ++ph)
    for (std::size_t k = 0; k < block_ops.size(); ++k)
      parts_[part_count + ph * block_ops.size() + k] = {
          .op = block_ops[k], .phase = phases[ph], .seconds = 0, .calls = 0};
}

template <class T>
void Gpt<T>::require_whole(const char* what) const {
  require(!staged(), [&] {
    return fmt::format(
        "GPT {}: this model is pipeline stage {} of {} (GptOptions::pipeline): run it through "
        "stage_forward / stage_backward (PipelineGpt)",
        what, options_.pipeline.stage, options_.pipeline.stages);
  });
}

template <class T>
void Gpt<T>::require_stage(const char* what, int slot) const {
  require_allocated(what);
  require(staged(), [&] {
    return fmt::format("GPT {}: this model is not a pipeline stage (GptOptions::pipeline)", what);
  });
  require(slot >= 0 && slot < options_.pipeline.slots, [&] {
    return fmt::format("GPT {}: slot {} outside [0, {})", what, slot, options_.pipeline.slots);
  });
}

// Checks the ids (those asked for) on every rank and keeps this data
// group's sequences of them.
template <class T>
void Gpt<T>::take_ids(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets,
                      bool check_tokens, bool check_targets, std::size_t slot) {
  {
    std::optional<std::string> error;
    const auto expected = static_cast<std::size_t>(batch_ * seq_);
    const struct {
      const char* what;
      std::span<const std::int32_t> ids;
      bool check;
    } lists[] = {{"token", tokens, check_tokens}, {"target", targets, check_targets}};
    for (const auto& [what, ids, check] : lists) {
      if (!check) continue;
      if (ids.size() != expected) {
        error = fmt::format("GPT: {} ids has {} values, expected batch*seq = {}*{} = {}", what,
                            ids.size(), batch_, seq_, expected);
        break;
      }
      const auto bad = std::find_if(ids.begin(), ids.end(), [&](std::int32_t id) {
        return id < 0 || id >= config_.vocab_size;
      });
      if (bad != ids.end()) {
        error = fmt::format("GPT: {} id {} at position {} is outside [0, vocab={})", what, *bad,
                            bad - ids.begin(), config_.vocab_size);
        break;
      }
    }
    grid_->agree_call(CommAxis::world, error);
  }
  // This data group's sequences.
  const std::size_t n = targets_.size();
  const auto first =
      static_cast<std::ptrdiff_t>(grid_->coords().data) * static_cast<std::ptrdiff_t>(n);
  if (check_tokens) std::copy_n(tokens.begin() + first, n, tokens_.begin() + slot * n);
  if (check_targets) std::copy_n(targets.begin() + first, n, targets_.begin());
}

template <class T>
double Gpt<T>::forward(std::span<const std::int32_t> tokens,
                       std::span<const std::int32_t> targets) {
  require_allocated("forward");
  require_whole("forward");
  have_forward_ = have_logits_ = false;
  take_ids(tokens, targets, true, true);
  ModelBuffers& B = *buffers_;
  StepBuffers step = begin_forward_step();
  if (sharded_values_) {  // ZeRO-3: the values may have changed since (a step, a load)
    store_->forget_gathered();
    store_->gather_unit(0);
    store_->gather_unit(ln_f_unit());
    stage_blocks(-1, 1);
    store_->wait_unit(0);
  }
  timed(fwd_embedding, [&] {
    embedding_->forward(tokens_, boundaries_[0], step);
    save_chunk(0);
  });
  timed(fwd_blocks, [&] {
    for (std::size_t i = 0; i < blocks_.size(); ++i) {
      const std::size_t mark = B.forward.mark();
      if (sharded_values_) stage_blocks(static_cast<index_t>(i), 1);
      blocks_[i]->forward(boundaries_[i], boundaries_[i + 1], step);
      save_chunk(static_cast<int>(i) + 1);
      if (checkpointed() || options_.inference) B.forward.release(mark);
    }
  });
  lnf_ = MatrixView<T>::dense(B.forward.take<T>(static_cast<std::size_t>(rows_ * cols_)), rows_,
                              cols_, Order::row_major);
  if (sharded_values_) store_->wait_unit(ln_f_unit());
  timed(fwd_ln_f, [&] { ln_f_->forward(boundaries_.back(), lnf_, step); });
  double loss = 0;
  timed(fwd_lm_head, [&] {
    if (logits_only_) {  // forward_logits: the head's logits, no loss
      static_cast<void>(head_->forward(lnf_, {}, step));
      return;
    }
    loss = head_->forward(lnf_, targets_, step);
    if (data_ > 1) grid_->data().all_reduce(&loss, &loss, 1, DType::f64, ReduceOp::sum);
  });
  have_forward_ = !logits_only_;  // backward needs the loss's statistics
  have_logits_ = true;
  return loss;
}

template <class T>
void Gpt<T>::backward(bool accumulate) {
  require(!options_.inference,
          "GPT backward: this model was built for inference (GptOptions::inference): it has no "
          "gradients");
  require_whole("backward");
  require(have_forward_, "GPT backward: no forward pass to differentiate");
  have_forward_ = false;
  ModelBuffers& B = *buffers_;
  StepBuffers step = step_buffers();
  const index_t total = store_->local_elements();
  if (unit_grads_) {
    // ZeRO-3: the embedding and LN_f (kept since forward, or gathered
    // again), the last blocks staged; ZeRO-2 and 3: the outer units'
    // gradient slots ready.
    if (!accumulate) store_->zero_grads();
    if (sharded_values_) {
      store_->gather_unit(0);
      store_->gather_unit(ln_f_unit());
      store_->wait_unit(0);
      store_->wait_unit(ln_f_unit());
    }
    store_->begin_unit_grads(0, accumulate);
    store_->begin_unit_grads(ln_f_unit(), accumulate);
    if (sharded_values_) stage_blocks(config_.n_layer, -1);
  } else if (!accumulate) {
    store_->zero_grads();
  } else if (data_ > 1 && total > 0) {
    // The data-axis sum below would count the accumulated (already summed,
    // identical) gradients once per group: pre-scale them by 1/data.
    const auto all_grads = MatrixView<T>::dense(store_->grads_base(), 1, total, Order::row_major);
    backend_->scale(acc_t<T>(1) / static_cast<acc_t<T>>(data_), all_grads);
  }
  {
    ArenaScope scope(B.backward);
    const auto dlnf =
        MatrixView<T>::dense(B.backward.take<T>(static_cast<std::size_t>(rows_ * cols_)), rows_,
                             cols_, Order::row_major);
    timed(bwd_lm_head, [&] { head_->backward(dlnf, step, true); });
    timed(bwd_ln_f, [&] { ln_f_->backward(dlnf, conj_[0], step, true); });
  }
  std::size_t bucket = 0;
  reduce_bucket(bucket++);  // LN_f's gradients are final
  int cur = 0;
  for (std::size_t i = blocks_.size(); i-- > 0;) {
    if (sharded_values_) stage_blocks(static_cast<index_t>(i), -1);
    if (unit_grads_) store_->begin_unit_grads(block_unit(static_cast<index_t>(i)), accumulate);
    if (checkpointed()) {
      // Recompute block i from its checkpointed input; its output goes to the
      // free conjunction slot (backward does not read a block's output).
      // With distributed checkpoints its input is gathered from the chunks
      // into x_N's slot first (LN_f's backward, done, was its last reader).
      B.forward.reset();
      clock_.phase = 1;
      timed(rec_blocks, [&] {
        MatrixView<T> input = boundaries_[i];
        if (ckpt_group_ != nullptr) {
          input = boundaries_.back();
          ckpt_group_->all_gather(chunks_[i].data, input.data,
                                  static_cast<std::size_t>(ckpt_chunk_));
        }
        blocks_[i]->forward(input, conj_[1 - cur], step);
      });
    }
    clock_.phase = 2;
    timed(bwd_blocks, [&] { blocks_[i]->backward(conj_[cur], conj_[1 - cur], step, true); });
    reduce_bucket(bucket++);  // in flight while the blocks below run
    cur = 1 - cur;
  }
  timed(bwd_embedding, [&] { embedding_->backward(conj_[cur], step, true); });
  reduce_bucket(bucket++);
  input_grad_ = conj_[cur];
  // The one completion point: deferred gradient work (ORS), then the
  // data-axis buckets (issued here when gradients were deferred).
  timed(bwd_data_axis, [&] {
    scheme_->complete_deferred();
    if (unit_grads_) {
      for (std::size_t u = 0; u < store_->unit_count(); ++u) {
        if (scheme_->defers_gradients()) store_->reduce_unit_grads(u);
      }
      for (std::size_t u = 0; u < store_->unit_count(); ++u) store_->wait_unit_grads(u);
      return;
    }
    if (data_ > 1 && scheme_->defers_gradients())
      for (Bucket& b : buckets_) issue_bucket(b);
    for (Bucket& b : buckets_) wait_bucket(b);
  });
}

template <class T>
MatrixView<T> Gpt<T>::stage_input(int slot) {
  require_stage("stage_input", slot);
  require(!options_.pipeline.first(), "GPT stage_input: the first stage embeds its tokens");
  return boundaries_[static_cast<std::size_t>(slot) * (blocks_.size() + 1)];
}

template <class T>
ConstMatrixView<T> Gpt<T>::stage_output(int slot) const {
  require_stage("stage_output", slot);
  require(!options_.pipeline.last(), "GPT stage_output: the last stage ends in the loss");
  return boundaries_[static_cast<std::size_t>(slot + 1) * (blocks_.size() + 1) - 1];
}

template <class T>
std::span<T> Gpt<T>::stage_embedding_grads() {
  require_stage("stage_embedding_grads", 0);
  if (exchange_elements_ == 0) return {};
  T* begin = nullptr;
  std::size_t count = 0;
  for (Param<T>* p : embedding_->parameters()) {
    if (!p->held()) continue;
    if (begin == nullptr) begin = p->grad;
    require(p->grad == begin + count, "GPT: the embedding's gradients are not contiguous");
    count += static_cast<std::size_t>(p->shard.local_size());
  }
  return {begin, count};
}

template <class T>
std::span<T> Gpt<T>::stage_exchange() {
  require_stage("stage_exchange", 0);
  if (exchange_elements_ == 0) return {};
  exchange_->reset();
  return {exchange_->take<T>(exchange_elements_), exchange_elements_};
}

template <class T>
MatrixView<T> Gpt<T>::stage_output_grad(int slot) {
  require_stage("stage_output_grad", slot);
  return output_grads_[static_cast<std::size_t>(slot)];
}

template <class T>
double Gpt<T>::stage_forward(int slot, std::span<const std::int32_t> tokens,
                             std::span<const std::int32_t> targets, bool differentiate) {
  require_stage("stage_forward", slot);
  const PipelineStage& ps = options_.pipeline;
  const auto ids = static_cast<std::size_t>(slot);
  take_ids(tokens, targets, ps.first(), ps.last(), ids);
  ModelBuffers& B = *buffers_;
  StepBuffers step = begin_forward_step();
  const std::size_t n = blocks_.size();
  MatrixView<T>* x = &boundaries_[static_cast<std::size_t>(slot) * (n + 1)];
  if (ps.first())
    timed(fwd_embedding, [&] {
      embedding_->forward(std::span(tokens_).subspan(ids * targets_.size(), targets_.size()), x[0],
                          step);
    });
  timed(fwd_blocks, [&] {
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t mark = B.forward.mark();
      blocks_[i]->forward(x[i], x[i + 1], step);
      if (differentiate && keeps_activations()) keep_block(ids, i, mark);
      // x[i + 1], whole in a conjunction slot until the next block's forward
      if (differentiate && ckpt_group_ != nullptr && i + 1 < n)
        keep_chunk(x[i + 1], stage_chunk(ids, i + 1));
      B.forward.release(mark);
    }
  });
  if (!ps.last()) return 0;
  lnf_ = MatrixView<T>::dense(B.forward.take<T>(static_cast<std::size_t>(rows_ * cols_)), rows_,
                              cols_, Order::row_major);
  timed(fwd_ln_f, [&] { ln_f_->forward(x[n], lnf_, step); });
  double loss = 0;
  timed(fwd_lm_head, [&] { loss = head_->forward(lnf_, targets_, step); });
  if (!differentiate) return loss;
  // The head's backward at once: its statistics are not kept across
  // microbatches (the gradients it adds are the same whenever it runs).
  ArenaScope scope(B.backward);
  const auto dlnf = MatrixView<T>::dense(
      B.backward.take<T>(static_cast<std::size_t>(rows_ * cols_)), rows_, cols_, Order::row_major);
  timed(bwd_lm_head, [&] { head_->backward(dlnf, step, true); });
  timed(bwd_ln_f,
        [&] { ln_f_->backward(dlnf, output_grads_[static_cast<std::size_t>(slot)], step, true); });
  return loss;
}

template <class T>
void Gpt<T>::stage_backward(int slot, bool final) {
  require_stage("stage_backward", slot);
  const PipelineStage& ps = options_.pipeline;
  ModelBuffers& B = *buffers_;
  StepBuffers step = step_buffers();
  const std::size_t n = blocks_.size();
  MatrixView<T>* x = &boundaries_[static_cast<std::size_t>(slot) * (n + 1)];
  std::size_t bucket = 0;
  const auto reduce_next = [&] {
    if (final && data_ > 1 && !scheme_->defers_gradients()) issue_bucket(buckets_[bucket]);
    ++bucket;
  };
  if (ln_f_) reduce_next();  // LN_f's gradients are final with the last head backward
  MatrixView<T> dy = output_grads_[static_cast<std::size_t>(slot)];
  int free = 0;
  for (std::size_t i = n; i-- > 0;) {
    // Recompute block i from its kept input into a free conjunction slot
    // (backward does not read a block's output), or put back what its
    // forward kept for this slot; then differentiate it.
    const MatrixView<T> out = conj_[free];
    if (!keeps_activations()) {
      B.forward.reset();
      clock_.phase = 1;
      timed(rec_blocks, [&] {
        // distributed checkpoints: an inner block's input gathered from its
        // chunks into the gather slot
        MatrixView<T> input = x[i];
        if (ckpt_group_ != nullptr && i > 0) {
          input = boundaries_.back();
          ckpt_group_->all_gather(stage_chunk(static_cast<std::size_t>(slot), i).data, input.data,
                                  static_cast<std::size_t>(ckpt_chunk_));
        }
        blocks_[i]->forward(input, out, step);
      });
    }
    clock_.phase = 2;
    timed(bwd_blocks, [&] {
      if (keeps_activations()) {
        restore_block(static_cast<std::size_t>(slot), i);
        blocks_[i]->restore_input(x[i]);
      }
      blocks_[i]->backward(dy, out, step, true);
    });
    reduce_next();  // in flight while the blocks below run
    dy = out;
    free = 1 - free;
  }
  if (ps.first())
    timed(bwd_embedding, [&] {
      // this microbatch's ids (kept in its slot; the embedding holds the
      // last forward's)
      const std::size_t n = targets_.size();
      embedding_->restore_tokens(
          std::span<const std::int32_t>(tokens_).subspan(static_cast<std::size_t>(slot) * n, n));
      embedding_->backward(dy, step, true);
    });
  if (embedding_) reduce_next();  // the last stage's copy: the head's gradients
  input_grad_ = dy;
  timed(bwd_data_axis, [&] {
    scheme_->complete_deferred();
    if (!final || data_ == 1) return;
    if (scheme_->defers_gradients())
      for (Bucket& b : buckets_) issue_bucket(b);
    for (Bucket& b : buckets_) wait_bucket(b);
  });
}

template <class T>
std::byte* Gpt<T>::kept_region(std::size_t slot, std::size_t block) const {
  return kept_ + (slot * blocks_.size() + block) * kept_block_bytes_;
}

// Block `block`'s forward of slot `slot` took buffers.forward from `mark`
// on: that region into the slot's (every block and slot takes the same).
template <class T>
void Gpt<T>::keep_block(std::size_t slot, std::size_t block, std::size_t mark) {
  const std::size_t used = buffers_->forward.mark() - mark;
  if (!kept_known_) {
    require(used <= kept_block_bytes_ && used % sizeof(T) == 0, [&] {
      return fmt::format("GPT: a block's forward took {} bytes, planned {}", used,
                         kept_block_bytes_);
    });
    kept_mark_ = mark;
    kept_used_ = used;
    kept_known_ = true;
  }
  require(mark == kept_mark_ && used == kept_used_, [&] {
    return fmt::format("GPT: block {} took {} bytes at {} (the first: {} at {})", block, used, mark,
                       kept_used_, kept_mark_);
  });
  const auto n = static_cast<index_t>(used / sizeof(T));
  auto* base = static_cast<std::byte*>(buffers_->forward.base());
  backend_->copy(
      ConstMatrixView<T>::dense(reinterpret_cast<const T*>(base + mark), 1, n, Order::row_major),
      MatrixView<T>::dense(reinterpret_cast<T*>(kept_region(slot, block)), 1, n, Order::row_major));
}

// The slot's region of block `block` back where its views point, taken
// from the forward buffer again (so that nothing taken later lands on it).
template <class T>
void Gpt<T>::restore_block(std::size_t slot, std::size_t block) {
  require(kept_known_, "GPT stage_backward: no forward kept this stage's activations");
  const auto n = static_cast<index_t>(kept_used_ / sizeof(T));
  Arena& forward = buffers_->forward;
  forward.reset();
  auto* base = static_cast<std::byte*>(forward.take_bytes(kept_mark_ + kept_used_));
  backend_->copy(
      ConstMatrixView<T>::dense(reinterpret_cast<const T*>(kept_region(slot, block)), 1, n,
                                Order::row_major),
      MatrixView<T>::dense(reinterpret_cast<T*>(base + kept_mark_), 1, n, Order::row_major));
}

template <class T>
void Gpt<T>::forward_logits(std::span<const std::int32_t> tokens) {
  require_allocated("forward_logits");
  logits_only_ = true;
  try {
    static_cast<void>(forward(tokens, no_targets_));  // the ids checked, the targets not used
  } catch (...) {
    logits_only_ = false;
    throw;
  }
  logits_only_ = false;
}

template <class T>
void Gpt<T>::forward_cached(std::span<const std::int32_t> tokens, index_t start) {
  require_allocated("forward_cached");
  {
    std::optional<std::string> error;
    if (options_.kv_cache == 0)
      error = "GPT forward_cached: the model has no key/value cache (GptOptions::kv_cache)";
    else if (start < 0 || start + seq_ > options_.kv_cache)
      error = fmt::format(
          "GPT forward_cached: positions [{}, {}) of every sequence do not fit its key/value cache "
          "of {} positions (n_positions={})",
          start, start + seq_, options_.kv_cache, config_.n_positions);
    grid_->agree_call(CommAxis::world, error);
  }
  cache_positions_.resize(static_cast<std::size_t>(local_batch_ * seq_));
  for (std::size_t k = 0; k < cache_positions_.size(); ++k)
    cache_positions_[k] = static_cast<std::int32_t>(start + static_cast<index_t>(k) % seq_);
  embedding_->set_positions(cache_positions_);
  for (auto& block : blocks_) block->attn().set_start(start);
  forward_logits(tokens);
}

template <class T>
ActivationBlock Gpt<T>::logits_block() const {
  return scheme_->activation_block(local_batch_ * seq_, config_.vocab_size,
                                   ActivationLayout::inner);
}

template <class T>
std::vector<std::int32_t> Gpt<T>::next_tokens(std::span<const index_t> positions,
                                              const SamplingOptions& options, std::uint64_t step,
                                              index_t vocab_limit) {
  const std::vector<std::uint64_t> steps(static_cast<std::size_t>(batch_), step);
  return next_tokens(positions, options, steps, vocab_limit);
}

template <class T>
std::vector<std::int32_t> Gpt<T>::next_tokens(std::span<const index_t> positions,
                                              const SamplingOptions& options,
                                              std::span<const std::uint64_t> steps,
                                              index_t vocab_limit) {
  require_allocated("next_tokens");
  const index_t limit = vocab_limit > 0 ? vocab_limit : config_.vocab_size;
  {
    std::optional<std::string> error;
    if (!have_logits_)
      error = "GPT next_tokens: no forward pass (forward_logits first)";
    else if (static_cast<index_t>(positions.size()) != batch_ ||
             static_cast<index_t>(steps.size()) != batch_)
      error = fmt::format("GPT next_tokens: {} positions and {} steps for a batch of {}",
                          positions.size(), steps.size(), batch_);
    else if (limit > config_.vocab_size || vocab_limit < 0)
      error = fmt::format("GPT next_tokens: vocab_limit={} outside [0, vocab={}]", vocab_limit,
                          config_.vocab_size);
    else if (const std::string e = check_sampling(options); !e.empty())
      error = "GPT next_tokens: " + e;
    for (std::size_t b = 0; !error && b < positions.size(); ++b)
      if (positions[b] < 0 || positions[b] >= seq_)
        error = fmt::format("GPT next_tokens: position {} of sequence {} outside [0, seq={})",
                            positions[b], b, seq_);
    grid_->agree_call(CommAxis::world, error);
  }
  const ActivationBlock block = logits_block();
  const ConstMatrixView<T> Z = head_->logits();
  require(Z.order == Order::row_major && Z.rows == block.rows && Z.cols == block.cols,
          "GPT next_tokens: the head's logits do not have the scheme's inner layout");
  const index_t first = grid_->coords().data * local_batch_;
  host_logits_.resize(static_cast<std::size_t>(local_batch_ * block.cols));
  std::vector<LogitsRow<T>> rows(static_cast<std::size_t>(local_batch_));
  std::vector<std::uint64_t> keys(rows.size()), row_steps(rows.size());
  for (index_t b = 0; b < local_batch_; ++b) {
    const auto k = static_cast<std::size_t>(b);
    keys[k] = static_cast<std::uint64_t>(first + b);
    row_steps[k] = steps[static_cast<std::size_t>(first + b)];
    const index_t row = b * seq_ + positions[static_cast<std::size_t>(first + b)];
    if (!block.owner || row < block.row0 || row >= block.row0 + block.rows) continue;
    const index_t count = std::clamp<index_t>(limit - block.col0, 0, block.cols);
    if (count == 0) continue;
    T* host = host_logits_.data() + b * block.cols;
    backend_->download(host, Z.data + (row - block.row0) * Z.ld,
                       static_cast<std::size_t>(count) * sizeof(T));
    rows[k] = {host, block.col0, count};
  }
  const std::vector<std::int32_t> mine =
      choose_tokens<T>(rows, limit, grid_->tensor(), options, row_steps, keys,
                       /*exchange_shapes=*/false);  // logits_block() tiles by construction
  if (data_ == 1) return mine;
  std::vector<double> send(mine.begin(), mine.end()), all(static_cast<std::size_t>(batch_));
  grid_->data().all_gather(send.data(), all.data(), send.size());
  return {all.begin(), all.end()};
}

template <class T>
MemoryReport Gpt<T>::memory_report() const {
  MemoryReport r;
  if (options_.plan_only) {
    const std::size_t gradient_bytes = gradient_bytes_;
    r.parameters = parameter_bytes_;
    r.parameter_elements = static_cast<std::size_t>(parameter_elements_);
    r.gradients = gradient_bytes;
    r.activations = sizes_.forward + sizes_.checkpoint;
    r.buffers = {{"parameters", parameter_bytes_, 0}, {"gradients", gradient_bytes, 0},
                 {"workspace", sizes_.workspace, 0},  {"forward", sizes_.forward, 0},
                 {"backward", sizes_.backward, 0},    {"conjunction", sizes_.conjunction, 0},
                 {"checkpoint", sizes_.checkpoint, 0}};
    if (kv_bytes_ > 0) r.buffers.push_back({"kv_cache", kv_bytes_, 0});
    if (exchange_bytes_ > 0) r.buffers.push_back({"pipeline", exchange_bytes_, 0});
    scheme_->append_buffers(r.buffers);
    return r;
  }
  r.parameters = store_->values().capacity();
  r.parameter_elements = static_cast<std::size_t>(store_->padded_elements());
  r.gradients = store_->grads().capacity();
  r.activations = buffers_->forward.high_water() + buffers_->checkpoint.high_water();
  r.buffers.push_back({"parameters", store_->values().capacity(), store_->values().high_water()});
  r.buffers.push_back({"gradients", store_->grads().capacity(), store_->grads().high_water()});
  for (BufferUsage& u : buffers_->usage()) r.buffers.push_back(std::move(u));
  if (kv_) r.buffers.push_back({"kv_cache", kv_->capacity(), kv_->high_water()});
  if (exchange_) r.buffers.push_back({"pipeline", exchange_->capacity(), exchange_->high_water()});
  scheme_->append_buffers(r.buffers);
  return r;
}

template class Gpt<float>;
template class Gpt<double>;
template class Gpt<bf16>;

}  // namespace summa

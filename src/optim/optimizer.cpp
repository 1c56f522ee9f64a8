#include "summa/optim/optimizer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numbers>

#include "summa/core/error.hpp"

namespace summa {

// ---------------------------------------------------------------- schedule

void LrSchedule::validate() const {
  require(std::isfinite(lr) && lr >= 0,
          [&] { return fmt::format("LrSchedule: lr={} must be finite and >= 0", lr); });
  require(std::isfinite(min_lr) && min_lr >= 0 && min_lr <= lr, [&] {
    return fmt::format("LrSchedule: min_lr={} must be finite with 0 <= min_lr <= lr={}", min_lr,
                       lr);
  });
  require(warmup >= 0, [&] { return fmt::format("LrSchedule: warmup={} must be >= 0", warmup); });
  require(total >= 0,
          [&] { return fmt::format("LrSchedule: total={} must be >= 0 (0: no decay)", total); });
  require(total == 0 || total >= warmup, [&] {
    return fmt::format("LrSchedule: total={} must be 0 (no decay) or >= warmup={}", total, warmup);
  });
}

double LrSchedule::at(std::int64_t step) const {
  validate();
  require(step >= 0, [&] { return fmt::format("LrSchedule::at: step={} must be >= 0", step); });
  if (warmup > 0 && step < warmup)
    return lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (total == 0) return lr;
  if (step >= total) return min_lr;
  const double r = static_cast<double>(step - warmup) / static_cast<double>(total - warmup);
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(std::numbers::pi * r));
}

// ---------------------------------------------------------------- options

void OptimizerOptions::validate() const {
  require(kind == "adamw" || kind == "sgd", [&] {
    return fmt::format("OptimizerOptions: unknown kind '{}' (expected 'adamw' or 'sgd')", kind);
  });
  const auto unit = [](double x) { return std::isfinite(x) && x >= 0 && x < 1; };
  require(unit(momentum),
          [&] { return fmt::format("OptimizerOptions: momentum={} must be in [0, 1)", momentum); });
  require(!nesterov || (kind == "sgd" && momentum > 0), [&] {
    return fmt::format(
        "OptimizerOptions: nesterov needs kind 'sgd' with momentum > 0 (kind '{}', momentum={})",
        kind, momentum);
  });
  require(unit(beta1),
          [&] { return fmt::format("OptimizerOptions: beta1={} must be in [0, 1)", beta1); });
  require(unit(beta2),
          [&] { return fmt::format("OptimizerOptions: beta2={} must be in [0, 1)", beta2); });
  require(std::isfinite(eps) && eps > 0,
          [&] { return fmt::format("OptimizerOptions: eps={} must be finite and > 0", eps); });
  require(std::isfinite(weight_decay) && weight_decay >= 0, [&] {
    return fmt::format("OptimizerOptions: weight_decay={} must be finite and >= 0", weight_decay);
  });
  require(offload_bucket >= 0, [&] {
    return fmt::format(
        "OptimizerOptions: offload_bucket={} must be >= 0 (elements per bucket; 0: no offload)",
        offload_bucket);
  });
}

// ---------------------------------------------------------------- optimizers

namespace {

// Elements between consecutive state slots: the packed local elements,
// rounded up so every slot starts on an arena-aligned boundary.
template <class M>
std::size_t slot_stride(index_t elements) {
  return Arena::rounded(static_cast<std::size_t>(elements) * sizeof(M)) / sizeof(M);
}

// `range` with its count resolved (all: the store's local elements), checked
// against the store's padded elements.
template <class T>
ElementRange resolved(ElementRange range, const ParameterStore<T>& store) {
  require(range.count >= 0 || !store.shards_gradients(),
          "Optimizer: the store is sharded over the data axis (zero=2 or 3): pass this data "
          "group's chunk (data_chunk) as the range");
  if (range.count < 0) return {0, store.local_elements()};
  require(range.begin >= 0 && range.begin + range.count <= store.padded_elements(), [&] {
    return fmt::format("Optimizer: elements [{}, {}) are not within the store's {}", range.begin,
                       range.begin + range.count, store.padded_elements());
  });
  return range;
}

}  // namespace

template <class T>
ElementRange data_chunk(const ParameterStore<T>& store, int rank, int groups) {
  const index_t padded = store.padded_elements();
  require(groups >= 1 && rank >= 0 && rank < groups && padded % groups == 0, [&] {
    return fmt::format(
        "data_chunk: {} padded elements do not split into {} equal chunks (rank {}): build the "
        "store with multiple = {}",
        padded, groups, rank, groups);
  });
  const index_t chunk = padded / groups;
  return {rank * chunk, chunk};
}

template <class T>
std::size_t offload_staging_bytes(const OptimizerOptions& options) {
  if (options.offload_bucket <= 0) return 0;
  using M = master_t<T>;
  const std::size_t slots = options.kind == "adamw" ? 2 : 1;
  const std::size_t buffers = slots + (std::is_same_v<T, M> ? 0 : 1);
  return 2 * buffers * Arena::rounded(static_cast<std::size_t>(options.offload_bucket) * sizeof(M));
}

template <class T>
Optimizer<T>::Optimizer(const OptimizerOptions& options, ParameterStore<T>& store,
                        std::vector<std::string> state_names, ElementRange range)
    : options_(options),
      store_(&store),
      state_names_(std::move(state_names)),
      range_(resolved(range, store)),
      partial_(range.count >= 0),  // the caller's choice, alike on every rank
      elements_(range_.count),
      slot_stride_(slot_stride<master_type>(elements_)),
      state_(options.offload_bucket > 0 ? "optimizer state (offloaded: the host pool)"
                                        : "optimizer state",
             store.values().backend(),
             (state_names_.size() + (keeps_master ? 1 : 0)) * slot_stride_ * sizeof(master_type),
             options.offload_bucket > 0 ? Arena::Pool::host : Arena::Pool::backend) {
  options_.validate();
  if (offloaded()) {
    const std::size_t buffers = state_names_.size() + (keeps_master ? 1 : 0);
    bucket_stride_ =
        Arena::rounded(static_cast<std::size_t>(options_.offload_bucket) * sizeof(master_type)) /
        sizeof(master_type);
    staging_ =
        std::make_unique<Arena>("optimizer offload staging (two buckets)", store.values().backend(),
                                offload_staging_bytes<T>(options_));
    for (master_type*& set : staged_) set = staging_->take<master_type>(buffers * bucket_stride_);
  }
  // Segments in params() order, each parameter's part within the range; a
  // parameter's offset is where the store put its value, so the state slots
  // share the packing of values_base() (from range_.begin on).
  // (A sharded store's packed layout is its data groups' chunks: a
  // parameter's elements in this range may be a part of it.)
  const index_t lo = range_.begin;
  for (std::size_t k = 0; k < store.params().size(); ++k) {
    const Param<T>* p = store.params()[k];
    if (!p->held()) continue;
    const bool matrix = p->shard.global_shape.size() == 2;
    store.for_each_run(k, range_.begin, range_.count, [&](index_t, index_t v, index_t n) {
      segments_.push_back(Segment{
          .offset = v, .count = n, .decay = matrix || options_.decay_vectors, .state = v - lo});
    });
  }
  if (elements_ > 0) {
    state_base_ = state_.take<master_type>(state_names_.size() * slot_stride_);
    auto all = MatrixView<master_type>::dense(
        state_base_, 1, static_cast<index_t>(state_names_.size() * slot_stride_), Order::row_major);
    if (offloaded())  // the host pool: host code writes it
      std::fill_n(state_base_, state_names_.size() * slot_stride_, master_type(0));
    else
      state_.backend().scale(master_type(0), all);
    if constexpr (keeps_master) {
      master_ = state_.take<master_type>(slot_stride_);
      refresh_master();
    }
  }
}

template <class T>
void Optimizer<T>::refresh_master() {
  if constexpr (keeps_master) {
    if (master_ == nullptr) return;
    store_->pull_chunk();
    if (offloaded()) {  // converted on the backend a bucket at a time, then copied out
      Backend& backend = state_.backend();
      master_type* buffer = staged_[0] + state_names_.size() * bucket_stride_;
      for (index_t lo = 0; lo < elements_; lo += options_.offload_bucket) {
        const index_t n = std::min(options_.offload_bucket, elements_ - lo);
        backend.convert(
            MatrixView<const T>::dense(store_->value_at(range_.begin + lo), 1, n, Order::row_major),
            MatrixView<master_type>::dense(buffer, 1, n, Order::row_major));
        backend.stage_out(master_ + lo, buffer, static_cast<std::size_t>(n) * sizeof(master_type));
        backend.stage_wait();
      }
      return;
    }
    // The parameters are packed without padding, so one conversion of the
    // whole packed range sets every element's master.
    state_.backend().convert(
        MatrixView<const T>::dense(store_->value_at(range_.begin), 1, elements_, Order::row_major),
        MatrixView<master_type>::dense(master_, 1, elements_, Order::row_major));
  }
}

template <class T>
Optimizer<T>::~Optimizer() = default;

template <class T>
void Optimizer<T>::step(double lr) {
  require(std::isfinite(lr) && lr >= 0, [&] {
    return fmt::format("Optimizer::step ({}): lr={} must be finite and >= 0", kind(), lr);
  });
  ++steps_;
  store_->pull_chunk();  // zero=2: its chunk of the values from the whole ones
  const std::size_t slots = state_names_.size();
  if (!offloaded()) {
    Staged all;
    for (std::size_t k = 0; k < slots && state_base_ != nullptr; ++k)
      all.slots[k] = state_base_ + k * slot_stride_;
    all.master = master_;
    all.hi = elements_;
    update(lr, all);
    store_->chunk_written();
    return;
  }
  if (elements_ == 0) return;
  // Two buckets' buffers, bucket j in staged_[j % 2]: bucket j + 1 copied in
  // and bucket j - 1 copied out while bucket j is updated (docs/training.md,
  // "Optimizer offload").
  Backend& backend = state_.backend();
  // The copies run beside the compute queue: work issued before the step
  // that wrote the host pool there (a checkpoint's load) must be done first.
  backend.synchronize();
  const index_t size = options_.offload_bucket;
  const index_t buckets = (elements_ + size - 1) / size;
  const std::size_t buffers = slots + (keeps_master ? 1 : 0);
  const auto at = [&](index_t j) {
    Staged s;
    master_type* set = staged_[j % 2];
    for (std::size_t k = 0; k < slots; ++k) s.slots[k] = set + k * bucket_stride_;
    s.master = keeps_master ? set + slots * bucket_stride_ : nullptr;
    s.lo = j * size;
    s.hi = std::min(s.lo + size, elements_);
    return s;
  };
  const auto move = [&](index_t j, bool in) {
    const Staged s = at(j);
    const auto bytes = static_cast<std::size_t>(s.hi - s.lo) * sizeof(master_type);
    for (std::size_t k = 0; k < buffers; ++k) {
      master_type* host = (k < slots ? state_base_ + k * slot_stride_ : master_) + s.lo;
      master_type* staged = staged_[j % 2] + k * bucket_stride_;
      if (in)
        backend.stage_in(staged, host, bytes);
      else
        backend.stage_out(host, staged, bytes);
    }
  };
  move(0, true);
  backend.stage_fence();
  for (index_t j = 0; j < buckets; ++j) {
    update(lr, at(j));
    if (j + 1 < buckets) {
      move(j + 1, true);
      backend.stage_fence();  // bucket j + 1's update waits for its copy in only
    }
    move(j, false);  // after bucket j's update
  }
  backend.stage_wait();
  store_->chunk_written();
}

template <class T>
void Optimizer<T>::set_steps(std::int64_t steps) {
  require(steps >= 0,
          [&] { return fmt::format("Optimizer::set_steps: steps={} must be >= 0", steps); });
  steps_ = steps;
}

template <class T>
auto Optimizer<T>::state(std::size_t slot) -> master_type* {
  require(slot < state_names_.size(), [&] {
    return fmt::format("Optimizer::state: slot {} out of range ({} has {} slots)", slot, kind(),
                       state_names_.size());
  });
  return state_base_ == nullptr ? nullptr : state_base_ + slot * slot_stride_;
}

template <class T>
auto Optimizer<T>::state(std::size_t slot) const -> const master_type* {
  return const_cast<Optimizer*>(this)->state(slot);
}

namespace {

template <class T>
class AdamW final : public Optimizer<T> {
 public:
  AdamW(const OptimizerOptions& options, ParameterStore<T>& store, ElementRange range)
      : Optimizer<T>(options, store, {"exp_avg", "exp_avg_sq"}, range) {}
  std::string_view kind() const override { return "adamw"; }

 protected:
  void update(double lr, const typename Optimizer<T>::Staged& at) override {
    const OptimizerOptions& o = this->options();
    const auto t = static_cast<double>(this->steps());
    optim::AdamWCoefficients c;
    c.lr = lr;
    c.beta1 = o.beta1;
    c.beta2 = o.beta2;
    c.eps = o.eps;
    c.step_size = lr / (1.0 - std::pow(o.beta1, t));
    c.bias_correction2_sqrt = std::sqrt(1.0 - std::pow(o.beta2, t));
    Backend& backend = this->store().backend();
    ParameterStore<T>& store = this->store();
    for (const auto& s : this->segments()) {
      const index_t a = std::max(s.state, at.lo), b = std::min(s.state + s.count, at.hi);
      if (a >= b) continue;
      const index_t p = s.offset + (a - s.state), i = a - at.lo;
      c.weight_decay = s.decay ? o.weight_decay : 0.0;
      if constexpr (std::is_same_v<T, typename Optimizer<T>::master_type>)
        backend.adamw_update(store.value_at(p), store.grad_at(p), at.slots[0] + i, at.slots[1] + i,
                             b - a, c);
      else
        backend.adamw_update(store.value_at(p), store.grad_at(p), at.slots[0] + i, at.slots[1] + i,
                             at.master + i, b - a, c);
    }
  }
};

template <class T>
class Sgd final : public Optimizer<T> {
 public:
  Sgd(const OptimizerOptions& options, ParameterStore<T>& store, ElementRange range)
      : Optimizer<T>(options, store, {"momentum_buffer"}, range) {}
  std::string_view kind() const override { return "sgd"; }

 protected:
  void update(double lr, const typename Optimizer<T>::Staged& at) override {
    const OptimizerOptions& o = this->options();
    optim::SgdCoefficients c;
    c.lr = lr;
    c.momentum = o.momentum;
    c.nesterov = o.nesterov;
    Backend& backend = this->store().backend();
    ParameterStore<T>& store = this->store();
    for (const auto& s : this->segments()) {
      const index_t a = std::max(s.state, at.lo), b = std::min(s.state + s.count, at.hi);
      if (a >= b) continue;
      const index_t p = s.offset + (a - s.state), i = a - at.lo;
      c.weight_decay = s.decay ? o.weight_decay : 0.0;
      if constexpr (std::is_same_v<T, typename Optimizer<T>::master_type>)
        backend.sgd_update(store.value_at(p), store.grad_at(p), at.slots[0] + i, b - a, c);
      else
        backend.sgd_update(store.value_at(p), store.grad_at(p), at.slots[0] + i, at.master + i,
                           b - a, c);
    }
  }
};

}  // namespace

template <class T>
std::unique_ptr<Optimizer<T>> make_optimizer(const OptimizerOptions& options,
                                             ParameterStore<T>& store, ElementRange range) {
  options.validate();
  if (options.kind == "adamw") return std::make_unique<AdamW<T>>(options, store, range);
  return std::make_unique<Sgd<T>>(options, store, range);
}

template <class T>
void require_data_chunk(const Optimizer<T>& optimizer, ProcessGrid& grid, const char* who) {
  const Communicator& data = grid.data();
  const ElementRange r = optimizer.range();
  require(r.begin == static_cast<index_t>(data.rank()) * r.count &&
              r.count * data.size() == optimizer.store().padded_elements(),
          [&] {
            return fmt::format(
                "{}: the optimizer's elements [{}, {}) are not data rank {}'s chunk of {} "
                "(data_chunk)",
                who, r.begin, r.begin + r.count, data.rank(), optimizer.store().padded_elements());
          });
}

template <class T>
void all_gather_updates(Optimizer<T>& optimizer, ProcessGrid& grid) {
  // zero=3: the values stay sharded; the next forward gathers them.
  if (!optimizer.partial() || optimizer.store().shards_values()) return;
  require_data_chunk(optimizer, grid, "all_gather_updates");
  if (optimizer.store().shards_gradients()) {  // zero=2: one all-gather per unit
    optimizer.store().gather_chunks();
    return;
  }
  Communicator& data = grid.data();
  const ElementRange r = optimizer.range();
  T* values = optimizer.store().values_base();
  data.all_gather(values + r.begin, values, static_cast<std::size_t>(r.count));
}

// ---------------------------------------------------------------- clipping

namespace {

// Σ g² over the pieces of this rank's owner shards, through the store's
// backend (the gradients may be device memory; a device backend waits for
// its stream once per sum_of_squares call). Each piece is one row-major
// block of the local shard (leading dimension local_cols), summed in one
// call whether or not it spans whole local rows. With a range (ZeRO-2's
// chunk, count >= 0) only the elements of the packed gradients within it:
// a piece's rows inside it in one call, and the (at most two) rows it cuts
// in one call each.
template <class T>
double local_norm_sq(const ParameterStore<T>& store, ElementRange range) {
  require(!store.shards_gradients() || range.count >= 0,
          "clip_grad_norm / global_norm_sq: the gradients are sharded over the data axis (zero=2 "
          "or 3): pass the optimizer's range (this group's chunk)");
  Backend& backend = store.backend();
  double sum = 0;
  for (std::size_t k = 0; k < store.params().size(); ++k) {
    const Param<T>* p = store.params()[k];
    const ParamShard& s = p->shard;
    if (!s.owner || s.stage_copy || !p->held()) continue;
    // Each run of the parameter's local elements [x0, x0 + n) in the range
    // sits at packed positions from v0 on; a piece's rows inside it in one
    // call, the (at most two) rows it cuts in one call each.
    store.for_each_run(k, range.begin, range.count, [&](index_t x0, index_t v0, index_t n) {
      for (const ShardPiece& piece : s.pieces)
        for_each_block_within(piece, s.local_cols, x0, x0 + n, [&](const ShardPiece& b) {
          const index_t x = b.local_row * s.local_cols + b.local_col;
          sum += backend.sum_of_squares(store.grad_at(v0 + (x - x0)), b.rows, b.cols, s.local_cols);
        });
    });
  }
  return sum;
}

}  // namespace

template <class T>
double global_norm_sq(const ParameterStore<T>& store, ProcessGrid& grid, ElementRange sharded) {
  double sum = local_norm_sq(store, sharded);
  grid.tensor().all_reduce(&sum, &sum, 1);
  if (sharded.count >= 0) grid.data().all_reduce(&sum, &sum, 1);
  return sum;
}

template <class T>
double clip_grad_norm(ParameterStore<T>& store, ProcessGrid& grid, double max_norm,
                      ElementRange sharded, Communicator* stages) {
  const bool bad = !(std::isfinite(max_norm) && max_norm >= 0);
  // The validity flag travels with the sum, so every rank of the tensor group
  // learns of a bad argument on any of them without a second collective.
  double sums[2] = {bad ? 0.0 : local_norm_sq(store, sharded), bad ? 1.0 : 0.0};
  grid.tensor().all_reduce(sums, sums, 2);
  if (sharded.count >= 0) grid.data().all_reduce(sums, sums, 2);
  if (stages != nullptr) stages->all_reduce(sums, sums, 2);
  // a stream-ordered communicator may copy a host result out on the compute
  // stream (StagedCommunicator's contract): the host reads it next
  if (grid.tensor().stream_ordered() || grid.data().stream_ordered() ||
      (stages != nullptr && stages->stream_ordered()))
    store.backend().synchronize();
  require(sums[1] == 0, [&] {
    return fmt::format(
        "clip_grad_norm: max_norm must be finite and >= 0 (got {} here; invalid on {} rank(s) "
        "of the tensor group)",
        max_norm, sums[1]);
  });
  const double norm = std::sqrt(sums[0]);
  if (max_norm > 0 && std::isfinite(norm)) {
    const double factor = max_norm / (norm + 1e-6);
    if (factor < 1) {
      if (sharded.count < 0)
        store.backend().scale_in_place(store.grads_base(), store.local_elements(), factor);
      else if (sharded.count > 0)
        store.backend().scale_in_place(store.grad_at(sharded.begin), sharded.count, factor);
    }
  }
  return norm;
}

template ElementRange data_chunk(const ParameterStore<float>&, int, int);
template ElementRange data_chunk(const ParameterStore<double>&, int, int);
template ElementRange data_chunk(const ParameterStore<bf16>&, int, int);
template void require_data_chunk(const Optimizer<float>&, ProcessGrid&, const char*);
template void require_data_chunk(const Optimizer<double>&, ProcessGrid&, const char*);
template void require_data_chunk(const Optimizer<bf16>&, ProcessGrid&, const char*);
template void all_gather_updates(Optimizer<float>&, ProcessGrid&);
template void all_gather_updates(Optimizer<double>&, ProcessGrid&);
template void all_gather_updates(Optimizer<bf16>&, ProcessGrid&);
template std::size_t offload_staging_bytes<float>(const OptimizerOptions&);
template std::size_t offload_staging_bytes<double>(const OptimizerOptions&);
template std::size_t offload_staging_bytes<bf16>(const OptimizerOptions&);
template class Optimizer<float>;
template class Optimizer<double>;
template class Optimizer<bf16>;
template std::unique_ptr<Optimizer<bf16>> make_optimizer(const OptimizerOptions&,
                                                         ParameterStore<bf16>&, ElementRange);
template double global_norm_sq(const ParameterStore<bf16>&, ProcessGrid&, ElementRange);
template double clip_grad_norm(ParameterStore<bf16>&, ProcessGrid&, double, ElementRange,
                               Communicator*);
template std::unique_ptr<Optimizer<float>> make_optimizer(const OptimizerOptions&,
                                                          ParameterStore<float>&, ElementRange);
template std::unique_ptr<Optimizer<double>> make_optimizer(const OptimizerOptions&,
                                                           ParameterStore<double>&, ElementRange);
template double global_norm_sq(const ParameterStore<float>&, ProcessGrid&, ElementRange);
template double global_norm_sq(const ParameterStore<double>&, ProcessGrid&, ElementRange);
template double clip_grad_norm(ParameterStore<float>&, ProcessGrid&, double, ElementRange,
                               Communicator*);
template double clip_grad_norm(ParameterStore<double>&, ProcessGrid&, double, ElementRange,
                               Communicator*);

}  // namespace summa

#include "summa/layers/parameters.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace summa {

index_t ParamShard::global_size() const {
  index_t n = global_shape.empty() ? 0 : 1;
  for (index_t d : global_shape) n *= d;
  return n;
}

namespace {

/// A run of a split dimension: `length` elements at global `global`, local `local`.
struct Run {
  index_t global, local, length;
};

/// The runs of a dimension of global `extent` split as `d`, in local order.
std::vector<Run> runs(index_t extent, const DimSplit& d) {
  const index_t group = extent / d.groups;  // a group's global extent
  const index_t w = group / d.parts;        // this rank's block of one group
  const index_t kept = d.local(extent);     // of the blocks side by side, part sub_block
  const index_t lo = d.sub_block * kept, hi = lo + kept;
  std::vector<Run> out;
  for (index_t g = 0; g < d.groups; ++g) {
    const index_t a = std::max(lo, g * w), b = std::min(hi, (g + 1) * w);  // local, unkept offset
    if (a >= b) continue;
    out.push_back({g * group + d.block * w + (a - g * w), a - lo, b - a});
  }
  return out;
}

}  // namespace

ParamShard split_shard(std::string name, std::vector<index_t> shape, DimSplit rows, DimSplit cols,
                       bool owner) {
  ParamShard s;
  s.name = std::move(name);
  s.global_shape = std::move(shape);
  s.owner = owner;
  const index_t R = s.global_rows(), C = s.global_cols();
  s.local_rows = rows.local(R);
  s.local_cols = cols.local(C);
  for (const Run& r : runs(R, rows))
    for (const Run& c : runs(C, cols))
      s.pieces.push_back({.global_row = r.global,
                          .global_col = c.global,
                          .local_row = r.local,
                          .local_col = c.local,
                          .rows = r.length,
                          .cols = c.length});
  return s;
}

template <class T>
index_t ParameterStore<T>::padded_elements(const std::vector<Param<T>*>& params, index_t multiple) {
  require(multiple >= 1,
          [&] { return fmt::format("ParameterStore: multiple={} must be >= 1", multiple); });
  index_t total = 0;
  for (const Param<T>* p : params) total += p->shard.local_size();
  return (total + multiple - 1) / multiple * multiple;
}

template <class T>
std::size_t ParameterStore<T>::bytes_for(const std::vector<Param<T>*>& params, index_t multiple) {
  return ByteCount<T>().add(padded_elements(params, multiple)).bytes();
}

template <class T>
ParameterStore<T>::ParameterStore(Backend& backend, std::vector<Param<T>*> params, bool gradients,
                                  index_t multiple)
    : params_(std::move(params)),
      backend_(&backend),
      has_gradients_(gradients),
      padded_(padded_elements(params_, multiple)),
      values_("parameters", backend, bytes_for(params_, multiple)),
      grads_("gradients", backend, gradients ? bytes_for(params_, multiple) : 0) {
  // Packed: the parameters follow each other without padding, so the
  // gradients of consecutive parameters (a block's) form one contiguous range;
  // the padding (zero) follows the last.
  const auto total = static_cast<std::size_t>(padded_);
  T* values = values_.take<T>(total);
  T* grads = gradients ? grads_.take<T>(total) : nullptr;
  bind_whole(values, grads);
  const auto all = MatrixView<T>::dense(values, 1, static_cast<index_t>(total), Order::row_major);
  backend.scale(acc_t<T>(0), all);
  if (gradients)
    backend.scale(acc_t<T>(0),
                  MatrixView<T>::dense(grads, 1, static_cast<index_t>(total), Order::row_major));
}

namespace {

int data_groups_of(const ValueSharding& sharding) {
  require(sharding.data != nullptr, "ParameterStore: a sharded store needs the data communicator");
  return sharding.data->size();
}

// The elements of each slot: the largest unit it takes, `sizes[i]` for
// unit i (ZeRO-3: padded, D pieces; ZeRO-2: its elements).
std::vector<index_t> slot_elements(const std::vector<ParameterUnit>& units,
                                   const std::vector<index_t>& sizes, bool values) {
  std::vector<index_t> out;
  for (std::size_t i = 0; i < units.size(); ++i) {
    const auto slot = static_cast<std::size_t>(values ? units[i].value_slot : units[i].grad_slot);
    if (out.size() <= slot) out.resize(slot + 1, 0);
    out[slot] = std::max(out[slot], sizes[i]);
  }
  return out;
}

std::vector<index_t> padded_units(const std::vector<index_t>& pieces, int groups) {
  std::vector<index_t> out;
  for (index_t piece : pieces) out.push_back(groups * piece);
  return out;
}

}  // namespace

template <class T>
typename ParameterStore<T>::Layout ParameterStore<T>::layout_of(
    const std::vector<Param<T>*>& params, const std::vector<ParameterUnit>& units, int groups) {
  require(groups >= 1, "ParameterStore: a sharded store needs at least one data group");
  Layout l;
  index_t begin = 0;     // the unit's first element among the whole values
  std::size_t next = 0;  // the units cover params() once, in order
  for (const ParameterUnit& u : units) {
    require(u.first == next && u.first <= u.last && u.last <= params.size() && u.value_slot >= 0 &&
                u.grad_slot >= 0,
            "ParameterStore: the units of a sharded store must cover every parameter once, in "
            "order, with slots >= 0");
    index_t n = 0;
    for (std::size_t k = u.first; k < u.last; ++k) n += params[k]->shard.local_size();
    l.counts.push_back(n);
    l.pieces.push_back((n + groups - 1) / groups);
    l.chunk += l.pieces.back();
    // the unit's gather fills D pieces from its first element on
    l.whole = std::max(l.whole, begin + groups * l.pieces.back());
    begin += n;
    next = u.last;
  }
  require(next == params.size(),
          "ParameterStore: the units of a sharded store must cover every parameter once");
  l.whole = std::max(l.whole, begin);
  return l;
}

template <class T>
ShardedStoreBytes ParameterStore<T>::sharded_bytes(const std::vector<Param<T>*>& params,
                                                   bool gradients, index_t /*multiple*/,
                                                   int data_groups,
                                                   const std::vector<ParameterUnit>& units,
                                                   bool values_sharded) {
  // (`multiple` pads an unsharded store; a sharded one's units are padded)
  ShardedStoreBytes b;
  ByteCount<T> values, grads;
  const Layout l = layout_of(params, units, data_groups);
  const std::vector<index_t> padded = padded_units(l.pieces, data_groups);
  if (values_sharded) {
    values.add(l.chunk);
    for (index_t n : slot_elements(units, padded, true)) values.add(n);
  } else {  // ZeRO-2: the values whole, then this group's chunk of them
    values.add(l.whole).add(l.chunk);
  }
  grads.add(l.chunk);
  for (index_t n : slot_elements(units, padded, false)) grads.add(n);
  b.padded_elements = data_groups * l.chunk;
  b.values = values.bytes();
  b.gradients = gradients ? grads.bytes() : 0;
  return b;
}

template <class T>
ParameterStore<T>::ParameterStore(Backend& backend, std::vector<Param<T>*> params, bool gradients,
                                  index_t multiple, const ValueSharding& sharding)
    : params_(std::move(params)),
      backend_(&backend),
      has_gradients_(gradients),
      padded_(0),
      values_(sharding.values ? "parameters (this data group's chunk and the unit slots)"
                              : "parameters (whole, and this data group's chunk of them)",
              backend,
              sharded_bytes(params_, gradients, multiple, data_groups_of(sharding), sharding.units,
                            sharding.values)
                  .values),
      grads_("gradients (this data group's chunk and the unit slots)", backend,
             sharded_bytes(params_, gradients, multiple, data_groups_of(sharding), sharding.units,
                           sharding.values)
                 .gradients),
      data_(sharding.data),
      values_sharded_(sharding.values) {
  const int groups = data_->size();
  const Layout l = layout_of(params_, sharding.units, groups);
  chunk_ = l.chunk;
  whole_elements_ = l.whole;
  padded_ = groups * chunk_;
  lo_ = data_->rank() * chunk_;
  if (values_sharded_) {
    bind_whole(nullptr, nullptr);  // the offsets
    chunk_values_ = values_.take<T>(static_cast<std::size_t>(chunk_));
    for (index_t n : slot_elements(sharding.units, padded_units(l.pieces, groups), true))
      value_slots_.push_back(values_.take<T>(static_cast<std::size_t>(n)));
  } else {  // ZeRO-2: the whole values (room for the last unit's gather), then the chunk
    T* values = values_.take<T>(static_cast<std::size_t>(l.whole));
    bind_whole(values, nullptr);  // the offsets; the gradients in the slots
    backend.scale(acc_t<T>(0), MatrixView<T>::dense(values, 1, l.whole, Order::row_major));
    chunk_values_ = values_.take<T>(static_cast<std::size_t>(chunk_));
  }
  if (gradients) {
    chunk_grads_ = grads_.take<T>(static_cast<std::size_t>(chunk_));
    for (index_t n : slot_elements(sharding.units, padded_units(l.pieces, groups), false))
      grad_slots_.push_back(grads_.take<T>(static_cast<std::size_t>(n)));
  }
  resident_.assign(value_slots_.size(), -1);
  unit_of_.assign(params_.size(), 0);
  index_t at = 0;
  for (std::size_t i = 0; i < sharding.units.size(); ++i) {
    const ParameterUnit& pu = sharding.units[i];
    Unit u;
    u.begin = pu.first < params_.size() ? offsets_[pu.first] : local_elements();
    u.count = l.counts[i];
    u.piece = l.pieces[i];
    u.at = at;
    at += u.piece;
    u.value_slot = pu.value_slot;
    u.grad_slot = pu.grad_slot;
    for (std::size_t k = pu.first; k < pu.last; ++k) unit_of_[k] = i;
    units_.push_back(u);
  }
  bind_slots();
  const auto zero = [&](T* p, index_t n) {
    if (n > 0) backend.scale(acc_t<T>(0), MatrixView<T>::dense(p, 1, n, Order::row_major));
  };
  zero(chunk_values_, chunk_);                // the padding stays zero
  if (gradients) zero(chunk_grads_, chunk_);  // the slots: begin_unit_grads zeroes them
}

template <class T>
ParameterStore<T>::~ParameterStore() {
  // Requests still in flight (a forward without its backward) complete
  // here: every group issued them.
  if (data_ == nullptr) return;
  try {
    forget_gathered();
    for (std::size_t u = 0; u < units_.size(); ++u) wait_unit_grads(u);
  } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor must not throw
  }
}

template <class T>
void ParameterStore<T>::bind_whole(T* values, T* grads) {
  offsets_.assign(params_.size(), 0);
  index_t offset = 0;
  for (std::size_t k = 0; k < params_.size(); ++k) {
    Param<T>* p = params_[k];
    require(p != nullptr, "ParameterStore: null parameter");
    p->backend = backend_;
    offsets_[k] = offset;
    if (!p->held()) {
      p->value = p->grad = nullptr;
      continue;
    }
    p->value = values != nullptr ? values + offset : nullptr;
    p->grad = grads != nullptr ? grads + offset : nullptr;
    offset += p->shard.local_size();
  }
}

template <class T>
void ParameterStore<T>::bind_slots() {
  for (const Unit& u : units_)
    for (std::size_t k = 0; k < params_.size(); ++k) {
      Param<T>* p = params_[k];
      if (!p->held() || offsets_[k] < u.begin || offsets_[k] >= u.begin + u.count) continue;
      const index_t at = offsets_[k] - u.begin;
      if (values_sharded_) p->value = value_slots_[static_cast<std::size_t>(u.value_slot)] + at;
      p->grad = has_gradients_ ? grad_slots_[static_cast<std::size_t>(u.grad_slot)] + at : nullptr;
    }
}

template <class T>
void ParameterStore<T>::require_whole(const char* what) const {
  require(!shards_values() || whole_ != nullptr, [&] {
    return fmt::format(
        "ParameterStore::{}: the values are sharded over the data axis (zero=3); only a "
        "WholeValues scope holds them whole",
        what);
  });
}

template <class T>
T* ParameterStore<T>::values_base() const {
  if (!shards_values()) return static_cast<T*>(values_.base());
  require_whole("values_base");
  return static_cast<T*>(whole_->base());
}

template <class T>
T* ParameterStore<T>::grads_base() const {
  require(data_ == nullptr,
          "ParameterStore::grads_base: the gradients are sharded over the data axis (zero=2 or "
          "3): grad_at() reaches this group's chunk");
  return static_cast<T*>(grads_.base());
}

template <class T>
T* ParameterStore<T>::value_at(index_t v) const {
  if (data_ == nullptr || whole_ != nullptr) return values_base() + v;
  require(v >= lo_ && v <= lo_ + chunk_, [&] {
    return fmt::format("ParameterStore::value_at({}): this data group holds [{}, {})", v, lo_,
                       lo_ + chunk_);
  });
  return chunk_values_ + (v - lo_);
}

template <class T>
T* ParameterStore<T>::grad_at(index_t v) const {
  if (data_ == nullptr) return grads_base() + v;
  require(v >= lo_ && v <= lo_ + chunk_, [&] {
    return fmt::format("ParameterStore::grad_at({}): this data group holds [{}, {})", v, lo_,
                       lo_ + chunk_);
  });
  return chunk_grads_ + (v - lo_);
}

template <class T>
void ParameterStore<T>::gather_unit(std::size_t k) {
  require(shards_values(), "ParameterStore::gather_unit: the values are not sharded (zero=3)");
  Unit& u = units_.at(k);
  const auto slot = static_cast<std::size_t>(u.value_slot);
  if (resident_[slot] == static_cast<int>(k)) return;
  // The slot's previous unit is done with (the caller's schedule); its
  // gather, if still in flight, completes first.
  if (resident_[slot] >= 0) wait_unit(static_cast<std::size_t>(resident_[slot]));
  resident_[slot] = static_cast<int>(k);
  if (u.piece == 0) return;  // nothing held here (2D: LN_f off mesh row 0)
  u.gather = data_->iall_gather(chunk_values_ + u.at, value_slots_[slot],
                                static_cast<std::size_t>(u.piece), dtype_v<T>);
}

template <class T>
void ParameterStore<T>::wait_unit(std::size_t k) {
  data_->wait(units_.at(k).gather);
}

template <class T>
void ParameterStore<T>::forget_gathered() {
  for (std::size_t k = 0; k < units_.size(); ++k) wait_unit(k);
  std::fill(resident_.begin(), resident_.end(), -1);
}

template <class T>
void ParameterStore<T>::begin_unit_grads(std::size_t k, bool accumulate) {
  Unit& u = units_.at(k);
  for (std::size_t j = 0; j < units_.size(); ++j)  // the slot's earlier units' reduces
    if (units_[j].grad_slot == u.grad_slot) wait_unit_grads(j);
  T* slot = grad_slots_[static_cast<std::size_t>(u.grad_slot)];
  if (u.piece == 0) return;
  const index_t padded = data_->size() * u.piece;
  backend_->scale(acc_t<T>(0), MatrixView<T>::dense(slot, 1, padded, Order::row_major));
  if (!accumulate) return;
  backend_->copy(
      ConstMatrixView<T>::dense(chunk_grads_ + u.at, 1, u.piece, Order::row_major),
      MatrixView<T>::dense(slot + data_->rank() * u.piece, 1, u.piece, Order::row_major));
}

template <class T>
void ParameterStore<T>::reduce_unit_grads(std::size_t k) {
  Unit& u = units_.at(k);
  T* slot = grad_slots_[static_cast<std::size_t>(u.grad_slot)];
  if (u.piece == 0) return;
  u.reduce = data_->ireduce_scatter(slot, chunk_grads_ + u.at, static_cast<std::size_t>(u.piece),
                                    dtype_v<T>, ReduceOp::sum);
}

template <class T>
void ParameterStore<T>::wait_unit_grads(std::size_t k) {
  data_->wait(units_.at(k).reduce);
}

template <class T>
void ParameterStore<T>::chunk_from(const T* whole, bool zero_padding) {
  for_each_piece([&](index_t at, index_t from, index_t kept, index_t piece) {
    if (kept > 0)
      backend_->copy(ConstMatrixView<T>::dense(whole + from, 1, kept, Order::row_major),
                     MatrixView<T>::dense(chunk_values_ + at, 1, kept, Order::row_major));
    if (zero_padding && kept < piece)
      backend_->scale(acc_t<T>(0), MatrixView<T>::dense(chunk_values_ + at + kept, 1, piece - kept,
                                                        Order::row_major));
  });
}

template <class T>
void ParameterStore<T>::pull_chunk() {
  // the padding is zero since construction: no step or load writes it
  if (data_ != nullptr && !values_sharded_ && !chunk_ahead_) chunk_from(values_base(), false);
}

template <class T>
void ParameterStore<T>::gather_chunks() {
  if (data_ == nullptr || values_sharded_) return;
  gather_whole(chunk_values_, values_base(), dtype_v<T>);
  chunk_ahead_ = false;
}

template <class T>
index_t ParameterStore<T>::whole_elements() const {
  return data_ == nullptr ? padded_ : whole_elements_;
}

template <class T>
void ParameterStore<T>::gather_whole(const void* chunk, void* whole, DType type) const {
  require(data_ != nullptr, "ParameterStore::gather_whole: the store is not sharded");
  const std::size_t e = size_of(type);
  // In order: a unit's padding lands on the next unit's first elements,
  // which that unit's gather then writes.
  for (const Unit& u : units_)
    if (u.piece > 0)
      data_->all_gather(static_cast<const char*>(chunk) + static_cast<std::size_t>(u.at) * e,
                        static_cast<char*>(whole) + static_cast<std::size_t>(u.begin) * e,
                        static_cast<std::size_t>(u.piece), type);
}

template <class T>
ParameterStore<T>::WholeValues::WholeValues(ParameterStore& store, bool write_back,
                                            const ProcessGrid* grid) {
  if (!store.shards_values()) return;
  store_ = &store;
  if (store.whole_depth_++ > 0) return;  // an outer scope holds them
  outer_ = true;
  write_back_ = write_back;
  try {
    store.forget_gathered();
    const auto n = static_cast<std::size_t>(store.whole_elements());
    std::optional<std::string> error;
    try {
      store.whole_ = std::make_unique<Arena>("parameters (whole, WholeValues)", *store.backend_,
                                             ByteCount<T>().add(static_cast<index_t>(n)).bytes());
    } catch (const std::exception& e) {
      error = fmt::format("the whole parameters for an export or import (zero=3): {}", e.what());
    }
    if (grid != nullptr)
      grid->agree(CommAxis::world, error);
    else if (error)
      throw Error(*error);
    T* whole = store.whole_->take<T>(n);
    store.gather_whole(store.chunk_values_, whole, dtype_v<T>);
    for (std::size_t k = 0; k < store.params_.size(); ++k)
      if (store.params_[k]->held()) store.params_[k]->value = whole + store.offsets_[k];
  } catch (...) {
    store.whole_.reset();
    --store.whole_depth_;
    store.bind_slots();
    throw;
  }
}

template <class T>
ParameterStore<T>::WholeValues::~WholeValues() {
  if (store_ == nullptr) return;
  --store_->whole_depth_;
  if (!outer_) return;
  ParameterStore& s = *store_;
  if (write_back_) {
    try {  // this group's piece of every unit, the padding zero
      s.chunk_from(static_cast<const T*>(s.whole_->base()), true);
    } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor must not throw
    }
  }
  s.whole_.reset();
  s.bind_slots();
  std::fill(s.resident_.begin(), s.resident_.end(), -1);
}

template <class T>
Param<T>& ParameterStore<T>::find(std::string_view name) const {
  for (Param<T>* p : params_)
    if (p->shard.name == name) return *p;
  throw Error(fmt::format("ParameterStore: no parameter named '{}'", name));
}

template <class T>
void ParameterStore<T>::read_local(std::size_t k, T* host) const {
  const Param<T>& p = *params_[k];
  const index_t n = p.shard.local_size();
  if (!shards_values()) {
    backend_->download(host, p.value, static_cast<std::size_t>(n) * sizeof(T));
    return;
  }
  // sharded: the part in this group's chunk; zero elsewhere (not kept here)
  std::fill_n(host, n, T(0));
  for_each_run(k, lo_, chunk_, [&](index_t x, index_t v, index_t count) {
    backend_->download(host + x, chunk_values_ + (v - lo_),
                       static_cast<std::size_t>(count) * sizeof(T));
  });
}

template <class T>
void ParameterStore<T>::write_local(std::size_t k, const T* host) {
  const Param<T>& p = *params_[k];
  if (!shards_values()) {
    backend_->upload(p.value, host, static_cast<std::size_t>(p.shard.local_size()) * sizeof(T));
    return;
  }
  for_each_run(k, lo_, chunk_, [&](index_t x, index_t v, index_t count) {
    backend_->upload(chunk_values_ + (v - lo_), host + x,
                     static_cast<std::size_t>(count) * sizeof(T));
  });
}

// A sharded store (zero=3) initialises its chunk only, each parameter
// through a host image: no whole copy of the values on the backend.
template <class T>
void ParameterStore<T>::init_gpt(std::uint64_t seed, const GptConfig& config) {
  require(whole_ == nullptr, "ParameterStore::init_gpt inside a WholeValues scope");
  if constexpr (std::is_same_v<T, bf16>) {
    // bf16: the reference value rounded to float, then to bf16 (the rounding
    // of bf16(double)), through a float host image of each parameter: the
    // reference fills float, never bf16.
    std::vector<bf16> narrow;
    std::vector<float> wide;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const Param<T>* p = params_[i];
      if (!p->held()) continue;
      const auto n = static_cast<std::size_t>(p->shard.local_size());
      narrow.resize(n);
      wide.resize(n);
      // Elements outside the pieces keep their values.
      read_local(i, narrow.data());
      for (std::size_t k = 0; k < n; ++k) wide[k] = float(narrow[k]);
      const auto local = MatrixView<float>::dense(wide.data(), p->shard.local_rows,
                                                  p->shard.local_cols, Order::row_major);
      for (const ShardPiece& piece : p->shard.pieces)
        init_fill_block<float>(
            seed, p->shard.name, piece.global_row, piece.global_col,
            local.block(piece.local_row, piece.local_col, piece.rows, piece.cols), config);
      for (std::size_t k = 0; k < n; ++k) narrow[k] = bf16(wide[k]);
      write_local(i, narrow.data());
    }
  } else {
    const bool direct = backend_->host_accessible() && !shards_values();
    std::vector<T> staging;  // a device backend's values are filled on the host, then uploaded
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const Param<T>* p = params_[i];
      if (!p->held()) continue;
      MatrixView<T> local = p->value_view();
      if (!direct) {
        // Elements outside the pieces keep their values, as on the host.
        staging.resize(static_cast<std::size_t>(p->shard.local_size()));
        read_local(i, staging.data());
        local = MatrixView<T>::dense(staging.data(), p->shard.local_rows, p->shard.local_cols,
                                     Order::row_major);
      }
      for (const ShardPiece& piece : p->shard.pieces)
        init_fill_block<T>(seed, p->shard.name, piece.global_row, piece.global_col,
                           local.block(piece.local_row, piece.local_col, piece.rows, piece.cols),
                           config);
      if (!direct) write_local(i, staging.data());
    }
  }
  if (shards_values()) forget_gathered();  // the slots hold old values
}

double uniform_init_value(std::uint64_t seed, std::string_view name, index_t index, double scale) {
  std::uint64_t h = 1469598103934665603ULL;  // FNV-1a of the name
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  std::uint64_t z = seed + h * 0x9e3779b97f4a7c15ULL + static_cast<std::uint64_t>(index);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;  // splitmix64 finaliser
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  const double u = static_cast<double>(z >> 11) * 0x1.0p-53;
  return scale * (2 * u - 1);
}

template <class T>
void ParameterStore<T>::init_uniform(std::uint64_t seed, double scale) {
  require(whole_ == nullptr, "ParameterStore::init_uniform inside a WholeValues scope");
  std::vector<T> host;  // through the host, whatever the backend's memory
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Param<T>* p = params_[i];
    if (!p->held()) continue;
    const ParamShard& s = p->shard;
    host.resize(static_cast<std::size_t>(s.local_size()));
    read_local(i, host.data());
    for (const ShardPiece& piece : s.pieces)
      for (index_t r = 0; r < piece.rows; ++r)
        for (index_t c = 0; c < piece.cols; ++c) {
          const index_t global = (piece.global_row + r) * s.global_cols() + piece.global_col + c;
          host[static_cast<std::size_t>((piece.local_row + r) * s.local_cols + piece.local_col +
                                        c)] =
              static_cast<T>(static_cast<float>(uniform_init_value(seed, s.name, global, scale)));
        }
    write_local(i, host.data());
  }
  if (shards_values()) forget_gathered();  // the slots hold old values
}

template <class T>
void ParameterStore<T>::zero_grads() {
  if (data_ != nullptr) {  // this group's chunk
    if (chunk_grads_ != nullptr && chunk_ > 0)
      backend_->scale(acc_t<T>(0), MatrixView<T>::dense(chunk_grads_, 1, chunk_, Order::row_major));
    return;
  }
  const index_t total = local_elements();
  if (total > 0 && has_gradients_)
    backend_->scale(acc_t<T>(0), MatrixView<T>::dense(grads_base(), 1, total, Order::row_major));
}

template <class T>
index_t ParameterStore<T>::local_elements() const {
  index_t n = 0;
  for (const Param<T>* p : params_) n += p->shard.local_size();
  return n;
}

template <class T>
std::vector<T> gather_global(const Param<T>& p, ProcessGrid& grid, bool grad) {
  const ParamShard& s = p.shard;
  const index_t cols = s.global_cols(), total = s.global_size();
  // Sent and placed in acc_t<T> (bf16 widened exactly, and back), so that
  // no bf16 collective is needed.
  using G = acc_t<T>;
  std::optional<std::string> error;
  const T* local = grad ? p.grad : p.value;
  if (p.held() && local == nullptr)
    error = fmt::format("gather_global '{}': the local {} is not bound", s.name,
                        grad ? "gradient" : "value");
  std::vector<T> host;  // the local shard, downloaded from a device backend
  if (!error && p.held() && s.owner && p.backend != nullptr && !p.backend->host_accessible()) {
    host.resize(static_cast<std::size_t>(s.local_size()));
    p.backend->download(host.data(), local, host.size() * sizeof(T));
    local = host.data();
  }
  // This rank's owned pieces (global row, column, rows, columns), placed
  // into a zeroed whole tensor.
  std::vector<G> global(static_cast<std::size_t>(total), G(0));
  std::vector<index_t> mine;
  for (const ShardPiece& piece : s.pieces) {
    if (error || !s.owner) break;
    if (piece.global_row < 0 || piece.global_col < 0 || piece.rows < 0 || piece.cols < 0 ||
        piece.global_row + piece.rows > s.global_rows() || piece.global_col + piece.cols > cols ||
        piece.local_row + piece.rows > s.local_rows ||
        piece.local_col + piece.cols > s.local_cols) {
      error = fmt::format("gather_global '{}': a shard piece lies outside the tensor", s.name);
      break;
    }
    mine.insert(mine.end(), {piece.global_row, piece.global_col, piece.rows, piece.cols});
    for (index_t r = 0; r < piece.rows; ++r) {
      const T* row = local + (piece.local_row + r) * s.local_cols + piece.local_col;
      G* to = global.data() + (piece.global_row + r) * cols + piece.global_col;
      for (index_t c = 0; c < piece.cols; ++c) to[c] = static_cast<G>(row[c]);
    }
  }
  grid.agree(CommAxis::tensor, error);
  // The elements: one all-reduce (each has one nonzero term when the pieces
  // tile the tensor). The ownership check needs only the pieces: every
  // rank's are all-gathered (a few numbers each; as doubles, exact: every
  // offset and extent of a tensor that fits a rank is below 2^53) and each
  // element's owners counted locally.
  Communicator& group = grid.tensor();
  group.all_reduce(global.data(), global.data(), global.size());
  const auto n = static_cast<std::size_t>(group.size());
  double most = static_cast<double>(mine.size());
  group.all_reduce(&most, &most, 1, ReduceOp::max);
  const auto meta_count = static_cast<std::size_t>(most) + 1;  // + the field count
  std::vector<double> meta(meta_count, 0.0), all_meta(n * meta_count);
  meta[0] = static_cast<double>(mine.size());
  for (std::size_t k = 0; k < mine.size(); ++k) meta[k + 1] = static_cast<double>(mine[k]);
  group.all_gather(meta.data(), all_meta.data(), meta_count);
  const auto for_each_piece = [&](auto&& body) {  // body(row0, col0, rows, cols)
    for (std::size_t r = 0; r < n; ++r) {
      const double* f = all_meta.data() + r * meta_count;
      for (std::size_t k = 0; k + 4 <= static_cast<std::size_t>(f[0]); k += 4)
        body(static_cast<index_t>(f[1 + k]), static_cast<index_t>(f[2 + k]),
             static_cast<index_t>(f[3 + k]), static_cast<index_t>(f[4 + k]));
    }
  };
  std::vector<std::uint8_t> held(static_cast<std::size_t>(total), 0);  // saturates at 2
  for_each_piece([&](index_t row0, index_t col0, index_t rows, index_t width) {
    for (index_t i = 0; i < rows; ++i) {
      std::uint8_t* h = held.data() + (row0 + i) * cols + col0;
      for (index_t c = 0; c < width; ++c) h[c] = static_cast<std::uint8_t>(h[c] < 2 ? h[c] + 1 : 2);
    }
  });
  const auto bad = std::find_if(held.begin(), held.end(), [](std::uint8_t h) { return h != 1; });
  require(bad == held.end(), [&] {
    const index_t k = bad - held.begin(), row = k / cols, col = k % cols;
    long long owners = 0;  // the exact count, for the message
    for_each_piece([&](index_t row0, index_t col0, index_t rows, index_t width) {
      owners += row >= row0 && row < row0 + rows && col >= col0 && col < col0 + width;
    });
    return fmt::format(
        "gather_global '{}': element {} is held by {} ranks (every element needs exactly one "
        "owner)",
        s.name, k, owners);
  });
  if constexpr (std::is_same_v<G, T>) {
    return global;
  } else {
    std::vector<T> narrow(global.size());
    for (std::size_t k = 0; k < global.size(); ++k) narrow[k] = T(global[k]);
    return narrow;
  }
}

template class ParameterStore<float>;
template class ParameterStore<double>;
template std::vector<float> gather_global(const Param<float>&, ProcessGrid&, bool);
template std::vector<double> gather_global(const Param<double>&, ProcessGrid&, bool);
template class ParameterStore<bf16>;
template std::vector<bf16> gather_global(const Param<bf16>&, ProcessGrid&, bool);

}  // namespace summa

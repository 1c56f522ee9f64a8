// The ORS / OAG overlap state of the 3D (AxoNN) layers: gathered-weight
// prefetch slots and the deferred weight-gradient reduce-scatters.
#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "detail.hpp"
#include "summa/schemes/axonn3d/layers.hpp"

namespace summa {

template <class T>
Overlap3D<T>::Overlap3D(ProcessGrid& grid, Backend& backend, Axonn3DOptions options)
    : grid_(&grid), backend_(&backend), options_(options) {
  const bool z = detail3d::gz(grid) > 1;
  prefetch_on_ = options.overlap_all_gather && z;
  defer_on_ = options.overlap_reduce_scatter && z;
}

template <class T>
Overlap3D<T>::~Overlap3D() {
  // A forward pass without its backward may leave a prefetch in flight; every
  // rank issued it, so completing it here cannot hang.
  if (pending_slot_ >= 0) grid_->depth().wait(pending_);
}

template <class T>
int Overlap3D<T>::add(const Param<T>& weight, index_t gathered) {
  require(prefetch_ == nullptr && deferred_ == nullptr,
          "Overlap3D: add() after allocate() (register every linear first)");
  const Entry e{.weight = &weight, .gathered = gathered, .offset = deferred_bytes_};
  entries_.push_back(e);
  max_gathered_ = std::max(max_gathered_, gathered);
  deferred_bytes_ += Arena::rounded(static_cast<std::size_t>(gathered) * sizeof(T));
  return static_cast<int>(entries_.size()) - 1;
}

template <class T>
void Overlap3D<T>::allocate(bool plan_only) {
  // Capacity for a few steps' traces, so recording never allocates in a step.
  trace_.reserve(4 * entries_.size() + 8);
  current_.reserve(4 * entries_.size() + 8);
  deferred_list_.reserve(4 * entries_.size() + 8);
  if (plan_only) return;
  if (prefetch_on_) {
    const std::size_t slot = Arena::rounded(static_cast<std::size_t>(max_gathered_) * sizeof(T));
    prefetch_ = std::make_unique<Arena>("prefetch", *backend_, 2 * slot);
    slot_[0] = prefetch_->take<T>(static_cast<std::size_t>(max_gathered_));
    slot_[1] = prefetch_->take<T>(static_cast<std::size_t>(max_gathered_));
  }
  if (defer_on_) {
    deferred_ = std::make_unique<Arena>("deferred", *backend_, deferred_bytes_);
    deferred_->take_bytes(deferred_bytes_);  // one block per linear, fixed offsets
  }
}

template <class T>
std::vector<BufferUsage> Overlap3D<T>::usage() const {
  std::vector<BufferUsage> u;
  if (prefetch_on_) {
    const std::size_t cap = 2 * Arena::rounded(static_cast<std::size_t>(max_gathered_) * sizeof(T));
    u.push_back({"prefetch", cap, prefetch_ ? prefetch_->high_water() : 0});
  }
  if (defer_on_)
    u.push_back({"deferred", deferred_bytes_, deferred_ ? deferred_->high_water() : 0});
  return u;
}

template <class T>
void Overlap3D<T>::drain_prefetch() {
  if (pending_slot_ < 0) return;
  grid_->depth().wait(pending_);
  pending_slot_ = -1;
}

template <class T>
void Overlap3D<T>::begin_step() {
  drain_prefetch();
  if (!current_.empty()) std::swap(trace_, current_);
  current_.clear();
  following_ = true;
}

template <class T>
T* Overlap3D<T>::gathered_weight(int id) {
  require(prefetch_ != nullptr, "Overlap3D: gathered_weight() without OAG or allocate()");
  const auto& e = entries_.at(static_cast<std::size_t>(id));
  Communicator& z = grid_->depth();
  int slot;
  if (pending_slot_ >= 0 && slot_id_[pending_slot_] == id) {
    slot = pending_slot_;  // prefetched: wait for it
    z.wait(pending_);
    pending_slot_ = -1;
    ++hits_;
  } else {
    // Not predicted (first step, or the order changed): complete any
    // prefetch of another weight, then gather now.
    drain_prefetch();
    slot = 0;  // either slot: the previous call is done with its weight
    ++misses_;
    z.all_gather(e.weight->value, slot_[slot],
                 static_cast<std::size_t>(e.weight->shard.local_size()), dtype_v<T>);
  }
  slot_id_[slot] = -2;  // in use by this call
  slot_id_[1 - slot] = -1;
  const std::size_t pos = current_.size();
  if (current_.size() < current_.capacity())
    current_.push_back(id);
  else
    following_ = false;  // longer than any recorded step: stop predicting
  if (following_ && pos < trace_.size() && trace_[pos] == id && pos + 1 < trace_.size()) {
    const int next = trace_[pos + 1];
    const auto& n = entries_.at(static_cast<std::size_t>(next));
    pending_ = z.iall_gather(n.weight->value, slot_[1 - slot],
                             static_cast<std::size_t>(n.weight->shard.local_size()), dtype_v<T>);
    pending_slot_ = 1 - slot;
    slot_id_[1 - slot] = next;
  } else if (pos >= trace_.size() || trace_[pos] != id) {
    following_ = false;
  }
  return slot_[slot];
}

template <class T>
T* Overlap3D<T>::staging(int id) {
  require(deferred_ != nullptr, "Overlap3D: staging() without ORS or allocate()");
  return reinterpret_cast<T*>(static_cast<char*>(deferred_->base()) +
                              entries_.at(static_cast<std::size_t>(id)).offset);
}

template <class T>
void Overlap3D<T>::defer(int id, T* grad, bool accumulate) {
  const auto& e = entries_.at(static_cast<std::size_t>(id));
  require(deferred_list_.size() < deferred_list_.capacity(), [&] {
    return fmt::format("Overlap3D: more than {} deferred reduce-scatters in one backward",
                       deferred_list_.capacity());
  });
  T* stage = staging(id);
  const auto shard = static_cast<std::size_t>(e.weight->shard.local_size());
  // Overwrite: straight into the gradient. Accumulate: in place (the rank's
  // reduced shard lands at the start of its staging block), added at complete().
  Request r = grid_->depth().ireduce_scatter(stage, accumulate ? stage : grad, shard, dtype_v<T>,
                                             ReduceOp::sum);
  deferred_list_.push_back({.id = id, .grad = grad, .accumulate = accumulate, .request = r});
  ++deferred_count_;
}

template <class T>
void Overlap3D<T>::complete() {
  Communicator& z = grid_->depth();
  for (Deferred& d : deferred_list_) {
    z.wait(d.request);
    if (d.accumulate) {
      const auto& e = entries_.at(static_cast<std::size_t>(d.id));
      const index_t n = e.weight->shard.local_size();
      backend_->axpby(acc_t<T>(1), ConstMatrixView<T>::dense(staging(d.id), 1, n, Order::row_major),
                      acc_t<T>(1), MatrixView<T>::dense(d.grad, 1, n, Order::row_major));
    }
  }
  deferred_list_.clear();
  drain_prefetch();
}

template class Overlap3D<float>;
template class Overlap3D<double>;
template class Overlap3D<bf16>;

}  // namespace summa

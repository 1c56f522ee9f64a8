#pragma once
/// \file parameters.hpp
/// Storage for the local shards of a set of parameters: one "parameters"
/// arena for the values and one "gradients" arena (the parameter-gradient
/// buffer of Optimus §3.2.3) for their gradients, both sized exactly from the
/// shard descriptions and bound to the layers' Param pointers.
///
/// Gradients persist across the step (the optimizer reads them); Optimus's
/// trick of updating a layer's parameters right after its backward and
/// reusing one layer-sized gradient buffer is left to the optimizer.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "summa/comm/communicator.hpp"
#include "summa/grid/process_grid.hpp"
#include "summa/layers/layer.hpp"
#include "summa/model/config.hpp"
#include "summa/model/init.hpp"

namespace summa {

/// A sharded data axis (ValueSharding): a run of consecutive parameters
/// (params()[first, last), a module's, e.g. one transformer block) whose
/// gradients are formed in a gradient slot and reduced onto the data groups
/// whose chunks hold them (ZeRO-2 and 3), and, ZeRO-3, whose values are
/// gathered over the data axis into a value slot ahead of its use. Units
/// sharing a slot take turns in it.
struct ParameterUnit {
  std::size_t first = 0, last = 0;
  int value_slot = 0, grad_slot = 0;
};

/// How a ParameterStore shards over the data axis: the data groups'
/// communicator and the units covering every parameter (in params()
/// order), whose gradients are formed in their gradient slots and reduced
/// onto the groups holding them.
///
/// `values` true (ZeRO-3, GptOptions::shard_parameters): the values too.
/// Each unit is padded to a multiple of the D data groups and split into D
/// equal pieces (FSDP's flat parameters): data group d keeps piece d of
/// every unit, the pieces one after another, as its chunk of the values and
/// of the gradients. The store's packed layout (padded_elements() = D
/// chunks; value_at, grad_at, an optimizer's range) is the D chunks side by
/// side; a unit is gathered into its value slot with one all-gather and its
/// gradients reduce-scattered from its gradient slot with one
/// reduce-scatter.
///
/// `values` false (ZeRO-2, GptOptions::shard_gradients): the same units,
/// pieces and chunk for the gradients and the optimizer (ZeRO-2 is ZeRO-3's
/// layout, as Megatron's distributed optimizer and FSDP's SHARD_GRAD_OP
/// shard each bucket evenly), but the values stay whole (packed as an
/// unsharded store's) and no value slots are taken: the store keeps this
/// group's chunk of the values beside them, for the optimizer and
/// checkpoints. pull_chunk() copies it from the whole values (where it is
/// read), gather_chunks() all-gathers every group's chunk into them (after
/// it is written: all_gather_updates). A unit's gradients are
/// reduce-scattered from its slot with one reduce-scatter, as ZeRO-3's.
struct ValueSharding {
  Communicator* data = nullptr;
  std::vector<ParameterUnit> units;
  bool values = true;
};

/// Bytes of a sharded store's values and gradients arenas: this rank's
/// chunk of the padded packed layout plus each slot (the largest unit it
/// takes); the values whole (padded for gather_whole's last unit) and this
/// chunk of them (and no value slots) when only the gradients are sharded. `gradients` false: no
/// gradient arena.
struct ShardedStoreBytes {
  std::size_t values = 0, gradients = 0;
  /// The store's padded_elements(): the D chunks' elements.
  index_t padded_elements = 0;
};

template <class T>
class ParameterStore {
 public:
  /// Allocates values and gradients for `params` (in that order) from
  /// `backend` and binds each Param's value / grad pointer (null where the
  /// rank holds nothing). Values and gradients start at zero. Without
  /// `gradients` (a model built for inference) the gradient arena is empty
  /// and every grad pointer null. `multiple`: the values and gradients hold
  /// a multiple of this many elements, the padding (zero, owned by no
  /// parameter) after the last parameter's, so D data groups can split them
  /// into equal chunks (ZeRO; padded_elements()).
  ParameterStore(Backend& backend, std::vector<Param<T>*> params, bool gradients = true,
                 index_t multiple = 1);
  /// ZeRO-3: values and gradients sharded over `sharding.data`'s groups
  /// (`multiple` a multiple of their count). Every parameter of a unit is
  /// bound to the unit's value and gradient slots, at its offset within the
  /// unit; the slots hold nothing until gather_unit / begin_unit_grads.
  /// ZeRO-2 (`sharding.values` false): the values whole (and this chunk's
  /// copy of them), each parameter's gradient bound to its unit's gradient
  /// slot. Values and gradients start at zero.
  ParameterStore(Backend& backend, std::vector<Param<T>*> params, bool gradients, index_t multiple,
                 const ValueSharding& sharding);
  ~ParameterStore();
  /// False for a store built without gradients.
  bool has_gradients() const { return has_gradients_; }
  ParameterStore(const ParameterStore&) = delete;
  ParameterStore& operator=(const ParameterStore&) = delete;

  const std::vector<Param<T>*>& params() const { return params_; }
  /// The backend whose memory holds the values and gradients (pointers
  /// into it may be device memory: see Backend::host_accessible()).
  Backend& backend() const { return *backend_; }
  /// The parameter called `name`; throws summa::Error if there is none.
  Param<T>& find(std::string_view name) const;

  /// Layout-invariant GPT-2 initialisation (init_value):
  /// every local element gets the value the serial reference gives the same
  /// global element, whatever the mesh (for bf16: that value rounded to
  /// bf16, through a float host image). Allocates (host staging).
  void init_gpt(std::uint64_t seed, const GptConfig& config);
  /// Layout-invariant uniform initialisation for any model: every global
  /// element (index i = row * cols + col of the tensor `name`) gets
  /// uniform_init_value(seed, name, i, scale), whatever the scheme, so a
  /// model starts from the same global weights under every scheme.
  void init_uniform(std::uint64_t seed, double scale);
  /// Every gradient = 0 (nothing without gradients).
  void zero_grads();
  /// All local values / gradients, packed in the order of params() (each
  /// parameter's local elements follow the previous one's, no padding).
  /// A store with sharded values (shards_values()) has them whole only
  /// inside a WholeValues scope (values_base()), and a store with sharded
  /// gradients (shards_gradients(): ZeRO-2 or 3) never whole gradients:
  /// both throw summa::Error.
  T* values_base() const;
  T* grads_base() const;
  /// Element `v` of the packed layout: values_base() + v, and with sharded
  /// gradients (ZeRO-2 or 3, whose packed layout is the data groups' chunks
  /// side by side) this data group's chunk's element, `v` within it
  /// (data_chunk; throws summa::Error elsewhere): ZeRO-3's values outside a
  /// WholeValues scope, ZeRO-2's copy of its chunk of the values
  /// (pull_chunk). grad_at likewise.
  T* value_at(index_t v) const;
  T* grad_at(index_t v) const;
  /// Where params()[k] starts among values_base()'s elements (whole values:
  /// the parameters one after another).
  index_t offset(std::size_t k) const { return offsets_.at(k); }
  /// Calls fn(x, v, n) for each run of params()[k]'s local elements
  /// [x, x + n) that lies at packed positions [v, v + n) within
  /// [lo, lo + count) (count < 0: everywhere), in increasing x: one run for
  /// an unsharded store, at most one per data group for a sharded one
  /// (ZeRO-2 or 3: the packed layout is the data groups' chunks).
  /// Allocates nothing.
  template <class F>
  void for_each_run(std::size_t k, index_t lo, index_t count, F&& fn) const {
    const index_t n = params_[k]->shard.local_size(), hi = count < 0 ? padded_ : lo + count;
    if (n == 0) return;
    if (data_ == nullptr) {
      const index_t a = std::max(offsets_[k], lo), b = std::min(offsets_[k] + n, hi);
      if (a < b) fn(a - offsets_[k], a, b - a);
      return;
    }
    const Unit& u = units_[unit_of_[k]];
    const index_t q = offsets_[k] - u.begin;  // the parameter within its unit
    if (u.piece == 0) return;
    const int groups = data_->size();
    for (int e = static_cast<int>(q / u.piece); e < groups && e * u.piece < q + n; ++e) {
      const index_t x0 = std::max(q, e * u.piece), x1 = std::min(q + n, (e + 1) * u.piece);
      const index_t v0 = e * chunk_ + u.at + (x0 - e * u.piece);  // packed position of x0
      const index_t a = std::max(v0, lo), b = std::min(v0 + (x1 - x0), hi);
      if (a < b) fn(x0 - q + (a - v0), a, b - a);
    }
  }

  /// ZeRO-3 (the second constructor, ValueSharding::values): the values
  /// (and gradients) are sharded over the data groups.
  bool shards_values() const { return data_ != nullptr && values_sharded_; }
  /// The second constructor (ZeRO-2 or 3): the gradients are sharded over
  /// the data groups: grad_at() reaches this group's chunk, the units'
  /// gradient slots hold the rest while backward forms them.
  bool shards_gradients() const { return data_ != nullptr; }
  std::size_t unit_count() const { return units_.size(); }
  /// Issues the all-gather of unit `u`'s values into its value slot (one
  /// all-gather of the groups' pieces; ZeRO-3 only), unless
  /// the slot already holds the unit; wait_unit completes it. Collective
  /// over the data axis, in the same order on every group.
  void gather_unit(std::size_t u);
  void wait_unit(std::size_t u);
  /// Forgets what the value slots hold (after the values changed: an
  /// optimizer step, a load), completing any gather in flight.
  void forget_gathered();
  /// Zeroes unit `u`'s gradient slot (first completing the reduces of the
  /// units before it in the slot), and with `accumulate` puts this group's
  /// chunk of its gradients (the sum so far) back in its place, so that
  /// reduce_unit_grads adds to it. ZeRO-2 or 3.
  void begin_unit_grads(std::size_t u, bool accumulate);
  /// Issues the reduce-scatter of unit `u`'s gradient slot onto the groups'
  /// gradient chunks (each group its piece); wait_unit_grads completes it.
  /// Collective over the data axis, in the same order on every group.
  void reduce_unit_grads(std::size_t u);
  void wait_unit_grads(std::size_t u);
  /// zero=2 or 3: fn(chunk_offset, whole_offset, kept, piece) for each
  /// unit: this group's piece of `piece` elements sits at chunk_offset of
  /// its chunk and holds whole-values elements [whole_offset, + kept), the
  /// rest (piece - kept) padding.
  template <class F>
  void for_each_piece(F&& fn) const {
    require(shards_gradients(),
            "ParameterStore::for_each_piece: the store is not sharded over the data axis");
    const index_t d = data_->rank();
    for (const Unit& u : units_)
      fn(u.at, u.begin + d * u.piece, std::clamp<index_t>(u.count - d * u.piece, 0, u.piece),
         u.piece);
  }
  /// ZeRO-2 (values whole, gradients sharded): this group's chunk of the
  /// values (value_at) := its pieces of the whole values. Local; called
  /// where the chunk is read (an optimizer's step and master refresh, a
  /// checkpoint), so the whole values stay the one truth, except after
  /// chunk_written() until gather_chunks(): the chunk is then ahead of them
  /// and kept. A no-op for other stores.
  void pull_chunk();
  /// ZeRO-2: the chunk was written (an optimizer's step) and is ahead of the
  /// whole values until gather_chunks(). A no-op for other stores.
  void chunk_written() { chunk_ahead_ = data_ != nullptr && !values_sharded_; }
  /// ZeRO-2: the whole values := every data group's chunk, one all-gather
  /// per unit (after the chunk was written: an optimizer step, a load;
  /// all_gather_updates). Collective over the data axis. A no-op for other
  /// stores.
  void gather_chunks();
  /// The bytes the sharded constructor allocates, without allocating.
  static ShardedStoreBytes sharded_bytes(const std::vector<Param<T>*>& params, bool gradients,
                                         index_t multiple, int data_groups,
                                         const std::vector<ParameterUnit>& units,
                                         bool values = true);

  /// RAII: the whole values in a temporary buffer (allocates
  /// padded_elements(); for HF exports and imports and tests, never in a
  /// step; checkpoints save and load each group's chunk instead), each
  /// parameter bound to it, values_base() its start; with `write_back`,
  /// this group's chunk is copied back from it at the end (after an
  /// import). Collective over the data axis (an all-gather). Nests:
  /// only the outermost scope gathers (and writes back if it was asked
  /// to). A no-op for a store whose values are not sharded. With `grid`
  /// the buffer's allocation is agreed over its world first, so a rank that
  /// cannot hold it fails with every other instead of leaving them in the
  /// gather (exports and imports pass it).
  class WholeValues {
   public:
    WholeValues(ParameterStore& store, bool write_back, const ProcessGrid* grid = nullptr);
    ~WholeValues();
    WholeValues(const WholeValues&) = delete;
    WholeValues& operator=(const WholeValues&) = delete;

   private:
    ParameterStore* store_ = nullptr;  // null: not sharded, nothing to undo
    bool outer_ = false, write_back_ = false;
  };
  /// True inside a WholeValues scope of a store whose values are sharded
  /// (values_base() then the whole values, value_at() in their order).
  bool whole_values_open() const { return whole_ != nullptr; }

  /// Bytes of the values arena (rounded up to the arena alignment): the
  /// local values, or with sharded values the chunk and the slots (ZeRO-2:
  /// the whole values, with room for the last unit's padding, and the
  /// chunk).
  std::size_t bytes() const { return values_.capacity(); }
  /// Local elements held.
  index_t local_elements() const;
  /// local_elements() rounded up to the constructor's `multiple`: the
  /// elements values_base() and grads_base() hold; sharded over the data
  /// axis (ZeRO-2, 3) the D chunks' elements (each unit padded to a
  /// multiple of D), the extent of the packed layout (value_at, grad_at),
  /// while ZeRO-2's whole values hold local_elements() (and the last
  /// unit's padding).
  index_t padded_elements() const { return padded_; }
  /// What padded_elements() would be for `params` and `multiple`.
  static index_t padded_elements(const std::vector<Param<T>*>& params, index_t multiple);
  const Arena& values() const { return values_; }
  const Arena& grads() const { return grads_; }

 private:
  // Elements a buffer packed like the whole values needs for
  // gather_whole (the last unit's padding past the local elements).
  index_t whole_elements() const;
  // This group's chunk of the values := its pieces of `whole` (packed as
  // the whole values), with `zero_padding` each piece's padding zeroed.
  void chunk_from(const T* whole, bool zero_padding);
  // zero=2 (gather_chunks) or 3 (WholeValues): all-gathers `chunk` (laid
  // out as this group's chunk, chunk elements of `type`) over the data axis
  // into `whole` (whole_elements() of `type`), packed as the whole values
  // (values_base()'s order), one all-gather per unit. Collective.
  void gather_whole(const void* chunk, void* whole, DType type) const;
  static std::size_t bytes_for(const std::vector<Param<T>*>& params, index_t multiple);
  // The sharded layout: each unit's elements and piece, the chunk, and
  // the elements of a whole-values buffer gather_whole fills (whole).
  struct Layout {
    std::vector<index_t> counts, pieces;
    index_t chunk = 0, whole = 0;
  };
  static Layout layout_of(const std::vector<Param<T>*>& params,
                          const std::vector<ParameterUnit>& units, int groups);
  void bind_whole(T* values, T* grads);
  // Parameter k's local values through host memory `host` (local_size()
  // elements): a sharded store reads its chunk's part (zero elsewhere) and
  // writes only that part.
  void read_local(std::size_t k, T* host) const;
  void write_local(std::size_t k, const T* host);
  void bind_slots();
  void require_whole(const char* what) const;
  std::vector<Param<T>*> params_;
  Backend* backend_;
  bool has_gradients_;
  index_t padded_;
  Arena values_, grads_;
  std::vector<index_t> offsets_;  // each parameter's start in the packed layout

  // ZeRO-2 or 3 (null data_: not sharded).
  struct Unit {
    index_t begin = 0, count = 0;  // its elements among the whole values
    index_t piece = 0;             // ceil(count / D): each group's piece
    index_t at = 0;                // the piece's offset in a chunk
    int value_slot = 0, grad_slot = 0;
    Request gather, reduce;  // its values' all-gather (ZeRO-3), its gradients' reduce-scatter
  };
  Communicator* data_ = nullptr;
  bool values_sharded_ = false;  // ZeRO-3; false: ZeRO-2 (values whole)
  index_t chunk_ = 0, lo_ = 0;   // this group's chunk: [lo_, lo_ + chunk_)
  index_t whole_elements_ = 0;   // Layout::whole
  T* chunk_values_ = nullptr;    // ZeRO-3: the values; ZeRO-2: their copy (pull_chunk)
  bool chunk_ahead_ = false;     // ZeRO-2: chunk_written() and not yet gathered
  T* chunk_grads_ = nullptr;
  std::vector<T*> value_slots_, grad_slots_;
  std::vector<int> resident_;  // per value slot: the unit it holds (or is gathering), -1 none
  std::vector<Unit> units_;
  std::vector<std::size_t> unit_of_;  // per parameter
  std::unique_ptr<Arena> whole_;      // WholeValues' buffer
  int whole_depth_ = 0;
};

/// The global tensor (row-major, global_size() elements) of a parameter's
/// value, or of its gradient with `grad`, assembled on every rank of the
/// tensor group (grid.tensor(): the mesh, line or 3D grid of one data group)
/// from the owners' pieces. Collective over grid.tensor(); allocates (for
/// tests, checkpoints and reports, not for steps). Throws summa::Error on
/// every rank unless the owners' pieces cover each element exactly once.
/// scale * (2u - 1), u in [0, 1) a hash of (seed, name, index): the value
/// ParameterStore::init_uniform gives global element `index` of `name`.
double uniform_init_value(std::uint64_t seed, std::string_view name, index_t index, double scale);

template <class T>
std::vector<T> gather_global(const Param<T>& p, ProcessGrid& grid, bool grad = false);

extern template class ParameterStore<float>;
extern template class ParameterStore<double>;
extern template std::vector<float> gather_global(const Param<float>&, ProcessGrid&, bool);
extern template std::vector<double> gather_global(const Param<double>&, ProcessGrid&, bool);
extern template class ParameterStore<bf16>;
extern template std::vector<bf16> gather_global(const Param<bf16>&, ProcessGrid&, bool);

}  // namespace summa

#pragma once
/// \file optimizer.hpp
/// Optimizers on local parameter shards, the learning-rate schedule and
/// global-norm gradient clipping.
///
/// Every rank updates exactly the elements it holds (ParameterStore values,
/// from the store's gradients), owners and replicas alike: a replica receives
/// a gradient bit-identical to its owner's, so the same update keeps it
/// bit-identical. No communication is needed for the step itself; only the
/// gradient norm of clipping is reduced (over the tensor group).
///
/// Optimizer state (moments, momentum buffers) is kept in master_t<T>: fp32
/// for float and bf16 parameters, fp64 for double ones, so double runs match
/// a serial double implementation to rounding. Each state slot is packed
/// exactly like the store's packed layout (ParameterStore::value_at:
/// values_base()'s order, same params() order, same local element counts,
/// no padding; a store sharded over the data axis, zero=2 or 3, its data
/// groups' chunks), so a checkpoint writer locates any element of it with
/// the parameter's ParamShard pieces (ParameterStore::for_each_run).
///
/// Mixed precision (T = bf16): the optimizer also keeps fp32 master weights
/// (master(), packed like the state slots). Every update runs in fp32 on the
/// master, with the gradient widened to fp32, and then sets each parameter to
/// bf16(master) — the same fp32 arithmetic as a float run, so an fp32 master
/// fed the same gradients is bit-identical to the float optimizer's values.
///
/// The state lives in the store's backend memory (device memory on a
/// CudaBackend), or with OptimizerOptions::offload_bucket in the backend's
/// host pool, streamed through backend buffers bucket by bucket; every update, norm and scaling
/// runs through that backend's seam ops (Backend::adamw_update, sgd_update, sum_of_squares,
/// scale_in_place), so the optimizer never dereferences parameter, gradient
/// or state memory on the host. The per-element formulas are the small free
/// functions on host pointers in namespace summa::optim: CpuBackend calls
/// them, CudaBackend's kernels implement the same arithmetic. See
/// docs/training.md for the formulas.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "summa/backend/optimizer_math.hpp"
#include "summa/core/types.hpp"
#include "summa/grid/process_grid.hpp"
#include "summa/layers/parameters.hpp"
#include "summa/memory/arena.hpp"

namespace summa {

/// Element type of optimizer state for parameters of type T: double for
/// double, float otherwise (fp32 master precision for float / bf16).
template <class T>
using master_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

/// Learning rate as a function of the step (counted from 0):
///
///   warm-up  (warmup > 0, step < warmup):   lr · (step + 1) / warmup
///   constant (total == 0, step >= warmup):  lr
///   cosine   (warmup <= step < total):      min_lr + ½ (lr − min_lr) (1 + cos(π·r)),
///                                           r = (step − warmup) / (total − warmup)
///   after    (total > 0, step >= total):    min_lr
///
/// So at(0) = lr / warmup, at(warmup − 1) = lr, at(warmup) = lr, the cosine
/// midpoint is (lr + min_lr) / 2 and at(total) = min_lr.
struct LrSchedule {
  double lr = 3e-4;         ///< peak learning rate
  std::int64_t warmup = 0;  ///< linear warm-up steps (0: none)
  std::int64_t total = 0;   ///< step at which the cosine reaches min_lr (0: no decay)
  double min_lr = 0;        ///< floor of the cosine decay

  /// The learning rate of step `step` (see above). Throws summa::Error for a
  /// negative step or an invalid schedule. Does not allocate unless it throws.
  double at(std::int64_t step) const;
  /// Throws summa::Error naming the field and value unless lr and min_lr are
  /// finite with 0 <= min_lr <= lr, warmup >= 0, total >= 0 and (total == 0
  /// or total >= warmup).
  void validate() const;
};

/// What make_optimizer builds.
///
/// kind "adamw": torch.optim.AdamW — decoupled weight decay then Adam with
///   bias correction (beta1, beta2, eps, weight_decay).
/// kind "sgd": torch.optim.SGD — weight decay added to the gradient (L2, not
///   decoupled), momentum buffer with dampening 0, optional Nesterov.
/// Weight decay applies to 2-D parameters only (linear weights, wte, wpe);
/// 1-D ones (biases, LayerNorm) are excluded unless decay_vectors.
struct OptimizerOptions {
  std::string kind = "adamw";                    ///< "adamw" or "sgd"
  double momentum = 0.9;                         ///< sgd: in [0, 1)
  bool nesterov = false;                         ///< sgd: Nesterov momentum (needs momentum > 0)
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;  ///< adamw: betas in [0, 1), eps > 0
  double weight_decay = 0.0;                     ///< >= 0
  bool decay_vectors = false;                    ///< also decay 1-D parameters (biases, LayerNorm)
  /// Optimizer offload (AxoNN's asynchronous framework, section V; ZeRO-
  /// Offload): > 0 keeps the state slots and (bf16) the fp32 master weights
  /// in the backend's host pool (Backend::allocate_host) and streams them
  /// through the update in buckets of this many elements, two buckets'
  /// buffers on the backend reused across buckets, the next bucket's copy in
  /// and the last one's copy out running while the update does (CudaBackend:
  /// a copy stream). Backend memory then holds 2 x slots x bucket state
  /// elements instead of slots x parameters (offload_staging_bytes). 0 (the
  /// default): everything on the backend. The arithmetic is the same either
  /// way: an offloaded step equals the plain one bit for bit.
  index_t offload_bucket = 0;

  /// Throws summa::Error naming the option and its value when one is out of
  /// range, non-finite, or the kind is unknown.
  void validate() const;
};

/// The part of a store's packed elements an optimizer updates and keeps
/// state for: `count` elements from packed position `begin`
/// (ParameterStore::value_at; count < 0: all of them, the default). A
/// sharded data axis (SchemeSpec::zero) gives each data group its chunk
/// (data_chunk); a store sharded over it (zero=2, 3) needs one.
struct ElementRange {
  index_t begin = 0, count = -1;
};

/// Data group `rank` of `groups`' chunk of `store`'s packed elements: the
/// padded elements (ParameterStore::padded_elements, a multiple of `groups`)
/// in `groups` equal chunks. Throws summa::Error unless they divide.
template <class T>
ElementRange data_chunk(const ParameterStore<T>& store, int rank, int groups);

/// An optimizer over the local shards of a ParameterStore (see the file
/// comment), or over a range of their packed elements (ElementRange: ZeRO's
/// optimizer-state sharding, the rest of the elements updated elsewhere and
/// all-gathered). Built by make_optimizer; holds a reference to the store, which
/// must outlive it. Not collective: each rank steps on its own.
template <class T>
class Optimizer {
 public:
  using master_type = master_t<T>;

  virtual ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// One update of every locally held element (owners and replicas) from the
  /// store's current gradients, with learning rate `lr` (e.g.
  /// LrSchedule::at(steps())). Increments steps() first, so AdamW's bias
  /// correction uses t = steps() after the increment (1 on the first step).
  /// Over a data-axis chunk (partial()) the update reaches the other groups
  /// (and, zero=2, this rank's own whole values) only with
  /// all_gather_updates, which must follow before the values are read;
  /// steps and checkpoint saves in between see the updated chunk.
  /// Throws summa::Error if lr is negative or not finite. No heap allocation.
  void step(double lr);

  /// Steps taken (or set for a resume).
  std::int64_t steps() const { return steps_; }
  /// Sets the step count, e.g. after loading the state from a checkpoint;
  /// throws summa::Error if negative.
  void set_steps(std::int64_t steps);

  /// "adamw" or "sgd".
  virtual std::string_view kind() const = 0;
  const OptimizerOptions& options() const { return options_; }
  ParameterStore<T>& store() const { return *store_; }

  /// True when the state lives in the host pool (options().offload_bucket > 0).
  bool offloaded() const { return options_.offload_bucket > 0; }

  /// Names of the state slots: AdamW {"exp_avg", "exp_avg_sq"}, SGD
  /// {"momentum_buffer"} (PyTorch's state keys).
  const std::vector<std::string>& state_names() const { return state_names_; }
  /// Slot `slot` (an index into state_names()): state_elements() values
  /// packed like the store's packed layout from range().begin on, in the memory
  /// of store().backend()
  /// (device memory on a device backend: read it with Backend::download;
  /// offloaded(): the backend's host pool, which host code may read too).
  /// Starts at zero. Throws summa::Error for a slot out of range. Null when
  /// the rank holds no elements.
  master_type* state(std::size_t slot);
  const master_type* state(std::size_t slot) const;
  /// Elements per slot (= store().local_elements(), or the range's count).
  index_t state_elements() const { return elements_; }
  /// The packed elements this optimizer updates (begin, count >= 0).
  ElementRange range() const { return range_; }
  /// True when make_optimizer was given a range (a data-axis chunk), even
  /// one that covers every element: alike on every rank, so the collectives
  /// that follow (all_gather_updates, checkpoints) are too.
  bool partial() const { return partial_; }

  /// The fp32 master weights of bf16 parameters: state_elements() values
  /// packed like the store's packed layout from range().begin on, in the memory
  /// of store().backend(),
  /// set from the parameters at construction; step() updates them and sets
  /// parameter = bf16(master). Null when T == master_type (float / double
  /// parameters are their own master) or when the rank holds no elements.
  master_type* master() { return master_; }
  const master_type* master() const { return master_; }
  /// master = the current parameter values (widened: exact). Call after
  /// writing parameter values outside the optimizer, e.g. an HF import or a
  /// manual edit, or the next step() overwrites them from the stale master;
  /// load_checkpoint(…, Optimizer&, …) does it for you. No-op when master()
  /// is null. No heap allocation.
  void refresh_master();

 protected:
  /// A parameter's range (within range()) in the packed local buffers, and
  /// where its state starts in the slots (offset - range().begin).
  struct Segment {
    index_t offset = 0, count = 0;
    bool decay = false;  ///< weight decay applies to it
    index_t state = 0;
  };

  Optimizer(const OptimizerOptions& options, ParameterStore<T>& store,
            std::vector<std::string> state_names, ElementRange range);
  /// Where the update finds the state of elements [lo, hi) of the range
  /// (state indices, Segment::state): slot k's element i at slots[k][i - lo],
  /// the master's (bf16) at master[i - lo]. The whole state when not
  /// offloaded; one staged bucket when it is.
  struct Staged {
    master_type* slots[2] = {nullptr, nullptr};
    master_type* master = nullptr;
    index_t lo = 0, hi = 0;
  };
  /// The update of the elements `at` holds, with steps() already
  /// incremented (called once per bucket when offloaded).
  virtual void update(double lr, const Staged& at) = 0;

  const std::vector<Segment>& segments() const { return segments_; }

 private:
  static constexpr bool keeps_master = !std::is_same_v<T, master_type>;
  OptimizerOptions options_;
  ParameterStore<T>* store_;
  std::vector<std::string> state_names_;
  std::vector<Segment> segments_;
  ElementRange range_;
  bool partial_ = false;
  index_t elements_ = 0;
  std::size_t slot_stride_ = 0;  ///< elements between consecutive slots in state_
  Arena state_;                  ///< the state slots, then (T != master_type) the master weights
  /// offloaded(): two buckets' buffers on the backend, each the slots then
  /// the master, bucket_stride_ elements apart
  std::unique_ptr<Arena> staging_;
  master_type* staged_[2] = {nullptr, nullptr};
  std::size_t bucket_stride_ = 0;
  master_type* state_base_ = nullptr;
  master_type* master_ = nullptr;
  std::int64_t steps_ = 0;
};

/// Backend memory an offloaded optimizer of `options` over elements of type
/// T keeps for its staging buffers (0 unless options.offload_bucket > 0):
/// two buckets of every state slot and, for bf16, the master weights, each
/// rounded up to Arena::alignment. The memory planner adds it in place of
/// the per-parameter state (docs/memory.md).
template <class T>
std::size_t offload_staging_bytes(const OptimizerOptions& options);

/// Validates `options` (summa::Error naming the bad option) and builds the
/// optimizer of options.kind over `store`, with zero state and steps() = 0
/// (and, for bf16, master weights set from the store's current values).
/// The state is allocated here from the store's backend; step() allocates
/// nothing. `range`: the elements it updates (default: all; throws
/// summa::Error when it is not within the store's padded elements).
template <class T>
std::unique_ptr<Optimizer<T>> make_optimizer(const OptimizerOptions& options,
                                             ParameterStore<T>& store, ElementRange range = {});

/// Throws summa::Error (`who` naming the caller) unless `optimizer` covers
/// data rank grid.data().rank()'s chunk (data_chunk) of its store.
template <class T>
void require_data_chunk(const Optimizer<T>& optimizer, ProcessGrid& grid, const char* who);

/// ZeRO's all-gather: after step() of an optimizer over data group d's chunk
/// (make_optimizer with data_chunk(store, grid.data().rank(), D)), every
/// group's updated chunk gathered over grid.data() (in place in
/// values_base(); zero=2's store, whose chunk is its units' pieces: one
/// all-gather per unit, ParameterStore::gather_chunks), so every rank holds
/// every updated element, as after an unsharded step. No-op for an
/// optimizer over the whole store and for zero=3's store (its values stay
/// sharded). Throws
/// summa::Error unless the range is this rank's data chunk. Collective over
/// grid.data(); no heap allocation unless it throws.
template <class T>
void all_gather_updates(Optimizer<T>& optimizer, ProcessGrid& grid);

/// Σ g² over the gradient of the whole model, in double: each global element
/// counted exactly once (the pieces of owner shards only; replicas skipped),
/// summed over grid.tensor(). Data groups hold identical gradients after the
/// data all-reduce, so nothing is reduced over the data axis. With
/// `sharded` (count >= 0: ZeRO-2, GptOptions::shard_gradients, whose
/// gradients are defined only in this data group's chunk: pass
/// data_chunk(...) or the optimizer's range()), only the elements of the
/// packed gradients within it, summed over grid.data() too. The same on
/// every rank of a tensor group (of the grid with `sharded`). Collective
/// over grid.tensor() (and grid.data()); no heap allocation.
template <class T>
double global_norm_sq(const ParameterStore<T>& store, ProcessGrid& grid, ElementRange sharded = {});

/// torch.nn.utils.clip_grad_norm_: norm = sqrt(global_norm_sq(store, grid,
/// sharded)); when max_norm > 0 and c = max_norm / (norm + 1e-6) < 1 (so
/// whenever norm > max_norm), every local gradient (owners and replicas;
/// with `sharded`, those within it) is multiplied by c.
/// max_norm = 0 only measures. A non-finite norm (inf / NaN gradients) leaves
/// the gradients as they are; the caller sees it in the result (and may skip
/// the step). Returns the pre-clip norm, the same on every rank.
/// Collective over grid.tensor() (one all-reduce of 2 doubles; with
/// `sharded`, one over grid.data() too); throws summa::Error on every rank
/// of the tensor group if max_norm is negative or not finite on any of
/// them. No heap allocation unless it throws.
///
/// `stages` (a pipeline's pipe communicator, PipelineGpt::pipe): the store
/// is one stage's, and the norm is summed over the stages too (one more
/// all-reduce of 2 doubles); the stages' copies of a parameter
/// (ParamShard::stage_copy) count once.
template <class T>
double clip_grad_norm(ParameterStore<T>& store, ProcessGrid& grid, double max_norm,
                      ElementRange sharded = {}, Communicator* stages = nullptr);

extern template ElementRange data_chunk(const ParameterStore<float>&, int, int);
extern template ElementRange data_chunk(const ParameterStore<double>&, int, int);
extern template ElementRange data_chunk(const ParameterStore<bf16>&, int, int);
extern template void require_data_chunk(const Optimizer<float>&, ProcessGrid&, const char*);
extern template void require_data_chunk(const Optimizer<double>&, ProcessGrid&, const char*);
extern template void require_data_chunk(const Optimizer<bf16>&, ProcessGrid&, const char*);
extern template void all_gather_updates(Optimizer<float>&, ProcessGrid&);
extern template void all_gather_updates(Optimizer<double>&, ProcessGrid&);
extern template void all_gather_updates(Optimizer<bf16>&, ProcessGrid&);
extern template std::size_t offload_staging_bytes<float>(const OptimizerOptions&);
extern template std::size_t offload_staging_bytes<double>(const OptimizerOptions&);
extern template std::size_t offload_staging_bytes<bf16>(const OptimizerOptions&);
extern template class Optimizer<float>;
extern template class Optimizer<double>;
extern template class Optimizer<bf16>;
extern template std::unique_ptr<Optimizer<float>> make_optimizer(const OptimizerOptions&,
                                                                 ParameterStore<float>&,
                                                                 ElementRange);
extern template std::unique_ptr<Optimizer<double>> make_optimizer(const OptimizerOptions&,
                                                                  ParameterStore<double>&,
                                                                  ElementRange);
extern template std::unique_ptr<Optimizer<bf16>> make_optimizer(const OptimizerOptions&,
                                                                ParameterStore<bf16>&,
                                                                ElementRange);
extern template double global_norm_sq(const ParameterStore<float>&, ProcessGrid&, ElementRange);
extern template double global_norm_sq(const ParameterStore<double>&, ProcessGrid&, ElementRange);
extern template double global_norm_sq(const ParameterStore<bf16>&, ProcessGrid&, ElementRange);
extern template double clip_grad_norm(ParameterStore<float>&, ProcessGrid&, double, ElementRange,
                                      Communicator*);
extern template double clip_grad_norm(ParameterStore<double>&, ProcessGrid&, double, ElementRange,
                                      Communicator*);
extern template double clip_grad_norm(ParameterStore<bf16>&, ProcessGrid&, double, ElementRange,
                                      Communicator*);

namespace optim {
extern template void adamw_update(float*, const float*, float*, float*, index_t,
                                  const AdamWCoefficients&);
extern template void adamw_update(double*, const double*, double*, double*, index_t,
                                  const AdamWCoefficients&);
extern template void sgd_update(float*, const float*, float*, index_t, const SgdCoefficients&);
extern template void sgd_update(double*, const double*, double*, index_t, const SgdCoefficients&);
extern template double sum_of_squares(const float*, index_t);
extern template double sum_of_squares(const double*, index_t);
extern template void scale_in_place(float*, index_t, double);
extern template void scale_in_place(double*, index_t, double);
}  // namespace optim

}  // namespace summa

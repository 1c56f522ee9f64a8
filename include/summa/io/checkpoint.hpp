#pragma once
/// \file checkpoint.hpp
/// Sharded checkpoints of a model's parameters and optimizer state, loadable
/// under any other scheme, mesh or rank count (resharding).
///
/// A checkpoint is a directory root/step_<N>/ (N zero-padded to 8 digits)
/// holding one shard file per rank of data group 0 (shard_<tensor rank>.bin,
/// that rank's *owner* pieces of every parameter and of every optimizer slot;
/// a sharded data axis: one per rank, each its data chunk's elements) and a
/// text manifest (step, free-form metadata, the parameter list, the
/// slots, the shard files with sizes and checksums, and every piece with its
/// global rectangle, byte offsets and checksums). root/latest names the newest
/// complete checkpoint. Writing goes to root/step_<N>.tmp/ and is renamed into
/// place only when complete, so a crash at any point leaves the previous
/// checkpoint loadable. Loading reads, for each local piece of each parameter
/// (owners and replicas), exactly the saved pieces that intersect it, and
/// converts element types (f32 <-> f64) where the saved and the live types
/// differ. See docs/checkpoints.md for the layout and the guarantees.
///
/// Parameter values are saved in master_t<T>: as themselves for float and
/// double, in fp32 for bf16 (from the optimizer's fp32 master when saved
/// through the Optimizer overloads, otherwise widened from bf16), so that a
/// bf16 run resumes without loss and float and bf16 runs load each other's
/// checkpoints (the file never holds bf16; its format is the same version).
/// Loading into bf16 sets the master (Optimizer overloads) from the file and
/// every parameter to bf16(master) (Backend::convert), or, without an
/// optimizer, every parameter to bf16(saved value).
///
/// Every collective function here is collective over grid.world() and reports
/// errors as a summa::Error thrown on every rank (message of the lowest failing
/// rank), naming the file and the problem. All ranks must see one shared file
/// system. Parameter values and slot buffers live in the memory of the
/// store's backend (ParameterStore::backend()): read and written in place
/// when it is host-accessible (CpuBackend), otherwise staged through host
/// copies of this rank's elements (Backend::download on save; download,
/// fill, Backend::upload on load). The files are byte-identical either way.

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "summa/core/types.hpp"
#include "summa/grid/process_grid.hpp"
#include "summa/layers/parameters.hpp"
#include "summa/optim/optimizer.hpp"

namespace summa {

/// One optimizer state buffer (e.g. Adam's "exp_avg"): `data` (memory of the
/// store's backend, like Optimizer::state()) holds
/// ParameterStore::local_elements() elements of `dtype`, packed exactly like
/// ParameterStore::values_base() (params() order, each parameter's local
/// row-major elements, replicas included); for a store sharded over the
/// data axis (zero=2 or 3), the elements of its data chunk (data_chunk),
/// packed like it. `data` may be null only on a rank
/// that holds no elements.
struct StateSlot {
  std::string name;
  DType dtype = DType::f32;
  void* data = nullptr;
};

/// What a checkpoint carries besides tensors: the training step and free-form
/// text metadata (scheme, model config, optimizer kind, data seed, learning
/// rate schedule, ...), round-tripped byte for byte (any characters).
struct CheckpointInfo {
  std::int64_t step = 0;
  std::map<std::string, std::string> meta;
  friend bool operator==(const CheckpointInfo&, const CheckpointInfo&) = default;
};

/// Writes the checkpoint of `info.step` under `root` (created if needed):
/// root/step_<N>.tmp/ is filled (every file fsync'ed), then world rank 0
/// renames it to root/step_<N> (atomically replacing an existing one) and
/// atomically rewrites root/latest. Only ranks of data group 0 write shards
/// (the other data groups hold identical copies); replica pieces are skipped.
/// A store sharded over the data axis (zero=2 or 3) is the exception: every
/// rank writes (and load_checkpoint reads) its data chunk (data_chunk) of
/// the values, and `slots` are packed like that chunk.
/// Every rank must pass the same slot names and dtypes, in the same order.
/// Collective over grid.world(); throws summa::Error on every rank on bad
/// input (negative step, empty or duplicate slot names, a null slot buffer
/// where elements are held, slots differing across ranks) or any I/O error,
/// in which case root/latest and earlier checkpoints are untouched.
/// A bf16 store's values are saved widened to f32; a bf16 run with an
/// optimizer should use the Optimizer overload below, which saves the fp32
/// master instead.
template <class T>
void save_checkpoint(const std::filesystem::path& root, ParameterStore<T>& store,
                     std::span<const StateSlot> slots, const CheckpointInfo& info,
                     ProcessGrid& grid);

/// Loads a checkpoint into `store` and `slots`, whatever scheme and grid wrote
/// it. `path_or_root` is a checkpoint directory (one containing a manifest) or
/// a root, whose `latest` is then followed. Every local element of every
/// parameter and slot (of a zero=2 or 3 store: of its data chunk, then
/// zero=2's chunks all-gathered into its whole values), owners and
/// replicas, is set from the saved piece that covers it, converted to the live element type.
/// Returns the step and the metadata. Collective over grid.world(); throws summa::Error on every
/// rank (naming the file and the problem) for: no manifest or `latest`, a bad magic or version, a
/// corrupted manifest or shard (checksum mismatch), a missing or truncated shard file, a parameter
/// list that differs from the store's (names or global shapes; both are named), slot names that
/// differ, or saved pieces that do not cover every local element exactly once. On error the
/// contents of the store and slots are unspecified. A bf16 store gets bf16(saved value); an
/// Optimizer<bf16> over it then needs refresh_master() — or use the Optimizer overload below, which
/// loads the master itself.
template <class T>
CheckpointInfo load_checkpoint(const std::filesystem::path& path_or_root, ParameterStore<T>& store,
                               std::span<const StateSlot> slots, ProcessGrid& grid);

/// A pipeline's stages (parallel/pipeline.hpp) saving or loading one
/// checkpoint together: each rank's store is its stage's. The shard files of
/// stage s are numbered s x (tensor group size) + tensor rank (with a
/// sharded data axis, that times D plus the data rank), the manifest
/// lists every stage's parameters (a stage's copy of another's,
/// ParamShard::stage_copy, is not saved, and is loaded from the original's
/// pieces), and every agreement runs over `world`. A checkpoint saved so is
/// the same format as any other: it loads under any scheme, pipelined or
/// not, and a pipelined run loads any checkpoint of the model.
struct CheckpointStages {
  MPI_Comm world = MPI_COMM_NULL;  ///< every rank of every stage
  MPI_Comm pipe = MPI_COMM_NULL;   ///< the ranks with this rank's place in every stage
  int stage = 0;
  int stages = 1;  ///< the pipeline's stages
};

/// save_checkpoint of `optimizer.store()` with the optimizer's state slots
/// (state_names(), master_t<T>) — for bf16 parameters with the values taken
/// from optimizer.master() (fp32), so nothing of the run is rounded away.
/// An optimizer over a data-axis chunk (partial(): zero=1, 2, 3; its range
/// must be this rank's data_chunk) is saved sharded: every rank writes the
/// elements of its range, of the values and of every slot (shard file
/// (stage x tensor ranks + tensor rank) x D + data rank), nothing gathered;
/// the files are the same format and load under any scheme. Collective and
/// throwing as the store overload.
template <class T>
void save_checkpoint(const std::filesystem::path& root, Optimizer<T>& optimizer,
                     const CheckpointInfo& info, ProcessGrid& grid,
                     const CheckpointStages* stages = nullptr);

/// load_checkpoint into `optimizer.store()` and the optimizer's state slots
/// (the saved slots must be named like state_names()); for bf16 parameters
/// the fp32 master is set from the saved values (converted from f64 if the
/// file holds f64) and every parameter to bf16(master), so no
/// refresh_master() is needed. An optimizer over a data-axis chunk loads its
/// range of the values, master and slots, then (zero=1, 2) all-gathers the
/// values over grid.data() as after a step (all_gather_updates). Does not
/// change optimizer.steps(): call set_steps(info.step) if the saved step is
/// the optimizer's. Collective and throwing as the store overload.
template <class T>
CheckpointInfo load_checkpoint(const std::filesystem::path& path_or_root, Optimizer<T>& optimizer,
                               ProcessGrid& grid, const CheckpointStages* stages = nullptr);

/// The parameter values alone of a checkpoint (a directory or a root, as
/// for load_checkpoint), whatever optimizer slots it also holds (they are
/// not read): a model for inference, or one that starts a fresh optimizer.
/// Loads into any scheme and element type as load_checkpoint; collective
/// and throwing as it does (a parameter list that differs is named).
template <class T>
CheckpointInfo load_parameters(const std::filesystem::path& path_or_root, ParameterStore<T>& store,
                               ProcessGrid& grid);

/// Throws summa::CollectiveError on every rank of `grid` when any value of
/// `store` on any rank is NaN or infinite (a diverged run's export, a
/// damaged import), naming `what` (e.g. "--checkpoint DIR") and the first
/// such tensor. One pass over this rank's values, copied to the host in
/// pieces of 16384 elements; allocates (for loading, not for steps).
template <class T>
void require_finite_values(const ParameterStore<T>& store, ProcessGrid& grid,
                           const std::string& what);

/// The checkpoint directory root/latest points to, or nullopt when there is no
/// root/latest (nothing was ever completely saved). Not collective; throws
/// summa::Error when `latest` is unreadable or malformed.
std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& root);

/// The checkpoint a resuming run should load from a root, and why.
struct ResumePoint {
  std::filesystem::path dir;  ///< the step directory
  CheckpointInfo info;        ///< its step and metadata (manifest verified)
  /// Empty when root/latest named it; otherwise why `latest` was passed over
  /// ("missing", "corrupted: ...", "names a step without a valid manifest").
  std::string note;
};

/// Where to resume under `root`: the checkpoint root/latest names when that
/// file is readable and the manifest it leads to verifies; otherwise the
/// newest root/step_<N> whose manifest verifies, with a note saying why
/// `latest` was passed over. nullopt only when root holds no step_<N>
/// directory at all (nothing was saved: a fresh start). Throws summa::Error
/// when step directories exist but none has a valid manifest, naming each
/// and its problem (never a silent fresh start over saved checkpoints). Not
/// collective.
std::optional<ResumePoint> find_resume_point(const std::filesystem::path& root);
/// The same, collective over `comm`: rank 0 searches; every rank gets the
/// result or the same summa::CollectiveError.
std::optional<ResumePoint> find_resume_point(const std::filesystem::path& root, MPI_Comm comm);

/// The step directories (root/step_<N>, complete or not; never the .tmp ones
/// of an unfinished save) under `root`, oldest first. Not collective.
std::vector<std::filesystem::path> step_directories(const std::filesystem::path& root);

/// Step and metadata of a checkpoint (a directory or a root, as for
/// load_checkpoint), e.g. to rebuild the model before loading into it. Reads
/// and verifies only the manifest. Not collective.
CheckpointInfo read_checkpoint_info(const std::filesystem::path& path_or_root);
/// The same, collective over `comm`: rank 0 reads, every rank gets the result
/// or the same summa::Error.
CheckpointInfo read_checkpoint_info(const std::filesystem::path& path_or_root, MPI_Comm comm);

/// Full offline verification of one checkpoint (a directory or a root): the
/// manifest, then every shard file's existence, size, header, whole-file
/// checksum and every piece's checksum. Throws summa::Error at the first
/// problem; returns the info otherwise. Not collective (reads everything).
CheckpointInfo verify_checkpoint(const std::filesystem::path& path_or_root);

/// XXH64 (xxHash, 64-bit, Yann Collet's algorithm; computed by libxxhash) of
/// a byte stream: the checksum of checkpoint pieces, shard files and
/// manifests. update() any number of times, then digest() (which does not
/// consume the state). Fast (about the speed of memory) and allocation-free.
class Checksum64 {
 public:
  explicit Checksum64(std::uint64_t seed = 0);
  Checksum64& update(const void* data, std::size_t bytes);
  std::uint64_t digest() const;

 private:
  /// libxxhash's XXH64_state_t, kept opaque so that <xxhash.h> stays out of
  /// summa's headers (its size is checked where it is used).
  std::uint64_t state_[11];
};

/// One-shot XXH64 of `bytes` bytes at `data`.
std::uint64_t checksum64(const void* data, std::size_t bytes, std::uint64_t seed = 0);

extern template void save_checkpoint<float>(const std::filesystem::path&, ParameterStore<float>&,
                                            std::span<const StateSlot>, const CheckpointInfo&,
                                            ProcessGrid&);
extern template void save_checkpoint<double>(const std::filesystem::path&, ParameterStore<double>&,
                                             std::span<const StateSlot>, const CheckpointInfo&,
                                             ProcessGrid&);
extern template CheckpointInfo load_checkpoint<float>(const std::filesystem::path&,
                                                      ParameterStore<float>&,
                                                      std::span<const StateSlot>, ProcessGrid&);
extern template CheckpointInfo load_checkpoint<double>(const std::filesystem::path&,
                                                       ParameterStore<double>&,
                                                       std::span<const StateSlot>, ProcessGrid&);
extern template void save_checkpoint<bf16>(const std::filesystem::path&, ParameterStore<bf16>&,
                                           std::span<const StateSlot>, const CheckpointInfo&,
                                           ProcessGrid&);
extern template CheckpointInfo load_checkpoint<bf16>(const std::filesystem::path&,
                                                     ParameterStore<bf16>&,
                                                     std::span<const StateSlot>, ProcessGrid&);
extern template void save_checkpoint<float>(const std::filesystem::path&, Optimizer<float>&,
                                            const CheckpointInfo&, ProcessGrid&,
                                            const CheckpointStages*);
extern template void save_checkpoint<double>(const std::filesystem::path&, Optimizer<double>&,
                                             const CheckpointInfo&, ProcessGrid&,
                                             const CheckpointStages*);
extern template void save_checkpoint<bf16>(const std::filesystem::path&, Optimizer<bf16>&,
                                           const CheckpointInfo&, ProcessGrid&,
                                           const CheckpointStages*);
extern template CheckpointInfo load_checkpoint<float>(const std::filesystem::path&,
                                                      Optimizer<float>&, ProcessGrid&,
                                                      const CheckpointStages*);
extern template CheckpointInfo load_checkpoint<double>(const std::filesystem::path&,
                                                       Optimizer<double>&, ProcessGrid&,
                                                       const CheckpointStages*);
extern template CheckpointInfo load_checkpoint<bf16>(const std::filesystem::path&, Optimizer<bf16>&,
                                                     ProcessGrid&, const CheckpointStages*);

extern template void require_finite_values<float>(const ParameterStore<float>&, ProcessGrid&,
                                                  const std::string&);
extern template void require_finite_values<double>(const ParameterStore<double>&, ProcessGrid&,
                                                   const std::string&);
extern template void require_finite_values<bf16>(const ParameterStore<bf16>&, ProcessGrid&,
                                                 const std::string&);
extern template CheckpointInfo load_parameters<float>(const std::filesystem::path&,
                                                      ParameterStore<float>&, ProcessGrid&);
extern template CheckpointInfo load_parameters<double>(const std::filesystem::path&,
                                                       ParameterStore<double>&, ProcessGrid&);
extern template CheckpointInfo load_parameters<bf16>(const std::filesystem::path&,
                                                     ParameterStore<bf16>&, ProcessGrid&);

}  // namespace summa

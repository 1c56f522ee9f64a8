#pragma once
/// \file layer.hpp
/// The one layer interface of summa.
///
/// A layer computes on *local* blocks of distributed activations and holds
/// *local* shards of global parameters. What a rank holds is described by
/// ParamShard: the parameter's global (Hugging Face) name and shape, and the
/// pieces of the global tensor its local storage covers. Parameter values and
/// gradients live in buffers owned by the caller (a ParameterStore or a
/// model); layers only point into them.
///
/// Memory during a step comes from three arenas handed in as StepBuffers:
///   workspace  temporaries of one operation (SUMMA panels, partial sums);
///              free again when the operation returns
///   forward    what forward() keeps for backward() (saved activations and
///              statistics); the caller decides when to release it
///   backward   temporaries of backward() (activation gradients inside a
///              layer); free again when backward() returns
/// A layer reports how many bytes of each it takes (BufferNeeds), so the
/// caller sizes the arenas before the first step; running out throws, naming
/// the arena, the request and the capacity.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "summa/core/error.hpp"
#include "summa/core/matrix_view.hpp"
#include "summa/memory/arena.hpp"
#include "summa/memory/buffers.hpp"

namespace summa {

namespace cost {
class Tally;  // summa/model/cost.hpp
}
namespace model {
enum class Phase : std::uint8_t;  // summa/model/cost.hpp
}

/// A rectangle of a global parameter held locally: global rows [global_row,
/// global_row + rows) and columns [global_col, global_col + cols) sit at
/// local rows [local_row, ...) and columns [local_col, ...). 1-D tensors are
/// seen as one row (global_row = 0).
struct ShardPiece {
  index_t global_row = 0, global_col = 0;
  index_t local_row = 0, local_col = 0;
  index_t rows = 0, cols = 0;
};

/// Calls fn(block) for each block of `piece` (of a local shard with leading
/// dimension `ld`: local element x = row · ld + col) whose elements are
/// exactly the piece's within local elements [lo, hi): at most three, in
/// increasing x: the row the range's start cuts, the whole rows inside it,
/// the row its end cuts. Each block is a ShardPiece (global and local
/// corners moved alike). Allocates nothing.
template <class F>
void for_each_block_within(const ShardPiece& piece, index_t ld, index_t lo, index_t hi, F&& fn) {
  if (piece.rows <= 0 || piece.cols <= 0 || lo >= hi) return;
  const auto floor_div = [](index_t a, index_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); };
  const index_t base = piece.local_row * ld + piece.local_col;
  const auto start = [&](index_t r) { return base + r * ld; };
  // the rows that meet [lo, hi): start(r) + cols > lo and start(r) < hi
  const index_t r0 = std::max<index_t>(0, floor_div(lo - base - piece.cols, ld) + 1);
  const index_t r1 = std::min<index_t>(piece.rows, floor_div(hi - 1 - base, ld) + 1);
  if (r0 >= r1) return;
  const auto block = [&](index_t a, index_t b, index_t c0, index_t c1) {
    fn(ShardPiece{.global_row = piece.global_row + a,
                  .global_col = piece.global_col + c0,
                  .local_row = piece.local_row + a,
                  .local_col = piece.local_col + c0,
                  .rows = b - a,
                  .cols = c1 - c0});
  };
  const auto cols_of = [&](index_t r) {
    return std::pair{std::clamp<index_t>(lo - start(r), 0, piece.cols),
                     std::clamp<index_t>(hi - start(r), 0, piece.cols)};
  };
  if (r1 - r0 == 1) {
    const auto [c0, c1] = cols_of(r0);
    block(r0, r1, c0, c1);
    return;
  }
  index_t whole_lo = r0, whole_hi = r1;
  if (const auto [c0, c1] = cols_of(r0); c0 > 0) {
    block(r0, r0 + 1, c0, piece.cols);
    ++whole_lo;
  }
  const index_t l1 = cols_of(r1 - 1).second;
  if (l1 < piece.cols) --whole_hi;
  if (whole_lo < whole_hi) block(whole_lo, whole_hi, 0, piece.cols);
  if (l1 < piece.cols) block(r1 - 1, r1, 0, l1);
}

/// What one rank holds of a global parameter. Local storage is row-major
/// local_rows x local_cols (ld = local_cols). A rank that holds nothing has
/// local_rows = local_cols = 0 and no pieces. Across the ranks of a tensor
/// group, the pieces of the owners (owner = true) cover every global element
/// exactly once: each element has exactly one owner, which the optimizer
/// updates and gather_global reads. A replica (owner = false, e.g. a
/// LayerNorm weight replicated on every rank of a 1D group) holds a copy
/// that its layer keeps identical to the owner's (same gradient, computed
/// redundantly or broadcast).
struct ParamShard {
  std::string name;                   ///< global name, e.g. "h.0.attn.c_attn.weight"
  std::vector<index_t> global_shape;  ///< Hugging Face logical shape (1-D or 2-D)
  index_t local_rows = 0, local_cols = 0;
  std::vector<ShardPiece> pieces;
  bool owner = true;
  /// A whole copy of a parameter another pipeline stage holds (the tied
  /// embedding on a pipeline's last stage, parallel/pipeline.hpp): updated
  /// like the original, counted by neither the gradient norm nor a
  /// checkpoint (the original is).
  bool stage_copy = false;

  index_t local_size() const { return local_rows * local_cols; }
  index_t global_size() const;
  index_t global_rows() const { return global_shape.size() == 2 ? global_shape[0] : 1; }
  index_t global_cols() const { return global_shape.empty() ? 0 : global_shape.back(); }
};

/// How one dimension of a parameter is split over ranks: the extent is
/// `groups` equal groups (c_attn's Q, K, V; the branches of a concatenation),
/// each split into `parts` equal blocks of which this rank holds block
/// `block`, its blocks of every group side by side locally; of that local
/// extent the rank keeps contiguous part `sub_block` of `sub_parts` (3D's
/// split of a weight's rows over Z). The default is the whole dimension.
struct DimSplit {
  int parts = 1, block = 0, groups = 1, sub_parts = 1, sub_block = 0;
  /// The local extent of a global `extent`.
  index_t local(index_t extent) const { return extent / parts / sub_parts; }
};

/// How a linear's input and output columns are grouped: `in` (`out`) equal
/// groups, each split over the ranks as a whole activation would be, a
/// rank's block the blocks of every group side by side. c_attn's output has
/// 3 (a rank's qkv block is [Q | K | V] of its heads); the input of a linear
/// that reads a concatenation (LayerStack::parallel, Combine::concat) one per
/// branch. Only the shards of the weight and bias follow the groups: the
/// arithmetic is the ungrouped linear's.
struct ColumnGroups {
  int in = 1, out = 1;
};

/// The shard of a parameter of global `shape` ([rows, cols], or [cols] for a
/// vector) split along its rows and columns as given: local
/// [rows.local(R), cols.local(C)], one piece per group of rows (or its part
/// a sub-split keeps) and group of columns. The extents must
/// divide as the splits say (the layers check them, naming the user's sizes).
ParamShard split_shard(std::string name, std::vector<index_t> shape, DimSplit rows, DimSplit cols,
                       bool owner = true);

/// A parameter of a layer: its description and pointers to the local value
/// and gradient (bound by a ParameterStore; null until then or where the
/// rank holds nothing).
template <class T>
struct Param {
  ParamShard shard;
  T* value = nullptr;
  T* grad = nullptr;
  /// The backend whose memory `value` and `grad` point into (set by the
  /// ParameterStore that binds them); null means host memory. Code outside
  /// a backend reads them through it (Backend::download) when
  /// !backend->host_accessible().
  Backend* backend = nullptr;

  MatrixView<T> value_view() const {
    return MatrixView<T>::dense(value, shard.local_rows, shard.local_cols, Order::row_major);
  }
  MatrixView<T> grad_view() const {
    return MatrixView<T>::dense(grad, shard.local_rows, shard.local_cols, Order::row_major);
  }
  bool held() const { return shard.local_size() > 0; }
};

/// Token ids (targets, positions) in a backend's memory, where the
/// backend's row kernels (gather_rows, pick_targets, ...) can read them.
/// Allocated once at construction; a layer copies the host ids of a step in
/// with assign() (Backend::upload: a memcpy on the CPU, a small host-to-device
/// copy on a GPU; never an allocation).
class BackendIds {
 public:
  /// While one is alive on this thread with `on` set (a model built
  /// GptOptions::plan_only, i.e. the memory planner), BackendIds record their
  /// capacity and allocate nothing: planning a batch of 10^9 sequences must
  /// not need the memory it is asked about.
  class PlanScope {
   public:
    explicit PlanScope(bool on) : previous_(planning_) { planning_ = previous_ || on; }
    ~PlanScope() { planning_ = previous_; }
    PlanScope(const PlanScope&) = delete;
    PlanScope& operator=(const PlanScope&) = delete;

   private:
    bool previous_;
  };
  /// True inside a PlanScope that is on.
  static bool planning() { return planning_; }

  BackendIds() = default;
  /// Room for `capacity` ids in `backend`'s memory (none while planning).
  BackendIds(Backend& backend, std::size_t capacity) : backend_(&backend), capacity_(capacity) {
    if (capacity_ > 0 && !planning_)
      data_ = static_cast<std::int32_t*>(backend.allocate(capacity_ * sizeof(std::int32_t)));
  }
  /// `count` ids (first + r) % `period` for r = 0..count-1 (the position of
  /// every token row of a batch from row `first`), written in small pieces:
  /// no host copy of the whole.
  static BackendIds cyclic(Backend& backend, std::size_t count, std::int64_t period,
                           std::int64_t first = 0) {
    BackendIds ids(backend, count);
    if (ids.data_ == nullptr) return ids;
    constexpr std::size_t piece = 4096;
    std::int32_t host[piece];
    for (std::size_t at = 0; at < count; at += piece) {
      const std::size_t n = std::min(piece, count - at);
      for (std::size_t k = 0; k < n; ++k)
        host[k] = static_cast<std::int32_t>((first + static_cast<std::int64_t>(at + k)) % period);
      backend.upload(ids.data_ + at, host, n * sizeof(std::int32_t));
    }
    ids.size_ = count;
    return ids;
  }
  ~BackendIds() {
    if (data_ != nullptr) backend_->deallocate(data_, capacity_ * sizeof(std::int32_t));
  }
  BackendIds(BackendIds&& o) noexcept { swap(o); }
  BackendIds& operator=(BackendIds&& o) noexcept {
    swap(o);
    return *this;
  }
  BackendIds(const BackendIds&) = delete;
  BackendIds& operator=(const BackendIds&) = delete;

  /// Copies `ids` (at most capacity() of them; throws summa::Error otherwise)
  /// to the start of the backend memory.
  void assign(std::span<const std::int32_t> ids) {
    require(ids.size() <= capacity_, "BackendIds: more ids than the buffer holds");
    if (!ids.empty() && data_ != nullptr) backend_->upload(data_, ids.data(), ids.size_bytes());
    size_ = ids.size();
  }
  /// The ids in backend memory (null before construction with a capacity).
  const std::int32_t* data() const { return data_; }
  /// Ids of the last assign() (0 before the first).
  std::size_t size() const { return size_; }
  std::size_t capacity() const { return capacity_; }

 private:
  void swap(BackendIds& o) noexcept {
    std::swap(backend_, o.backend_);
    std::swap(data_, o.data_);
    std::swap(capacity_, o.capacity_);
    std::swap(size_, o.size_);
  }
  Backend* backend_ = nullptr;
  std::int32_t* data_ = nullptr;
  std::size_t capacity_ = 0, size_ = 0;
  static inline thread_local bool planning_ = false;
};

/// Parameter side of the interface, shared by every layer and model.
template <class T>
class Module {
 public:
  virtual ~Module() = default;
  /// Name prefix of the parameters (e.g. "h.0.attn"); may be empty.
  virtual std::string_view name() const = 0;
  /// Appends this module's parameters (and its children's) in a fixed order.
  virtual void collect_parameters(std::vector<Param<T>*>& out) = 0;
  /// Arena bytes forward + backward take (see BufferNeeds).
  virtual BufferNeeds buffer_needs() const = 0;
  /// Adds what one run of this module costs on this rank to `t` (bytes and
  /// calls per axis; with t.ops set, its ops and their work for the
  /// step-time model; summa/model/cost.hpp): its forward for
  /// Phase::forward and Phase::recompute, its backward for Phase::backward.
  /// Each op prices itself in its own file; Attention, MLP,
  /// TransformerBlock and Gpt price their children in the order they run
  /// them. The traffic and step-time models walk a built (plan-only) GPT
  /// this way, and a user's Sequential (its layers, Chain and Parallel
  /// price themselves alike). The default throws summa::Error: a module
  /// that does not price itself cannot be predicted.
  virtual void price(cost::Tally& t, model::Phase phase) const {
    static_cast<void>(t);
    static_cast<void>(phase);
    throw Error(std::string(name()) +
                ": this module does not price itself (Module::price), so the traffic and "
                "step-time models cannot predict it");
  }

  std::vector<Param<T>*> parameters() {
    std::vector<Param<T>*> list;
    collect_parameters(list);
    return list;
  }
};

/// Activation to activation layers: X [tokens, in] -> Y [tokens, out], both
/// as local blocks of the layer's distribution.
///
/// forward() may keep views of X and takes what it saves from
/// buffers.forward; X and those allocations must stay valid until
/// backward(). backward() writes dX (never read; an empty 0x0 view skips the
/// input gradient) and sets the parameter gradients (overwrites them, or adds
/// to them with `accumulate`), using buffers.backward and
/// buffers.workspace for temporaries. Collective: every rank of the layer's
/// grid calls each method with consistent arguments.
template <class T>
class Layer : public Module<T> {
 public:
  virtual void forward(ConstMatrixView<T> X, MatrixView<T> Y, StepBuffers& buffers) = 0;
  virtual void backward(ConstMatrixView<T> dY, MatrixView<T> dX, StepBuffers& buffers,
                        bool accumulate = false) = 0;
};

/// Token ids in, activations out (Embedding2D, Embedding1D, ...).
template <class T>
class EmbeddingModule : public Module<T> {
 public:
  /// Throws summa::Error on every rank of the tensor group unless `ids`
  /// holds the layer's batch*seq ids, each in [0, vocab).
  virtual void check_ids(std::span<const std::int32_t> ids, const char* what) const = 0;
  virtual void forward(std::span<const std::int32_t> tokens, MatrixView<T> Y,
                       StepBuffers& buffers) = 0;
  virtual void backward(ConstMatrixView<T> dY, StepBuffers& buffers, bool accumulate = false) = 0;
  /// The ids the next backward scatters its gradient to, as forward(tokens)
  /// keeps them, without the forward: a pipeline stage differentiates a
  /// microbatch after other microbatches' forwards (parallel/pipeline.hpp).
  /// The scheme's embeddings implement it; this default throws.
  virtual void restore_tokens(std::span<const std::int32_t> /*tokens*/) {
    throw Error("this embedding cannot restore its ids (restore_tokens)");
  }
  /// The token embedding [vocab, hidden] (the tied LM head multiplies with it).
  virtual Param<T>& wte() = 0;
  /// The position of each of the layer's batch*seq tokens (its data
  /// group's, sequence after sequence) for the following forwards, instead
  /// of each token's index in its sequence: a decoding step with a key /
  /// value cache embeds a token at position p. The same on every rank;
  /// throws summa::Error on every rank of the tensor group unless there are
  /// batch*seq positions, each in [0, n_positions). The scheme's embeddings
  /// implement it; this default throws.
  virtual void set_positions(std::span<const std::int32_t> /*positions*/) {
    throw Error("this embedding does not take explicit positions (set_positions)");
  }
};

/// set_positions' check: `who`'s error for `positions` (expected count and
/// n_positions), or nothing.
inline std::optional<std::string> positions_error(const char* who,
                                                  std::span<const std::int32_t> positions,
                                                  index_t expected, index_t n_positions) {
  if (static_cast<index_t>(positions.size()) != expected)
    return std::string(who) + ": " + std::to_string(positions.size()) +
           " positions, expected batch*seq = " + std::to_string(expected);
  for (std::size_t k = 0; k < positions.size(); ++k)
    if (positions[k] < 0 || positions[k] >= n_positions)
      return std::string(who) + ": position " + std::to_string(positions[k]) + " of token " +
             std::to_string(k) + " is outside [0, n_positions=" + std::to_string(n_positions) + ")";
  return std::nullopt;
}

/// Activations and targets in, loss out (LMHead2D, LMHead1D, ...).
template <class T>
class LossHead : public Module<T> {
 public:
  /// The logits, then the loss on `targets`; with no targets (empty: a
  /// forward for inference) the logits alone, returning 0 (backward must
  /// not follow).
  virtual double forward(ConstMatrixView<T> X, std::span<const std::int32_t> targets,
                         StepBuffers& buffers) = 0;
  virtual void backward(MatrixView<T> dX, StepBuffers& buffers, bool accumulate = false) = 0;
  /// Local logits of the last forward (backward overwrites them with dL/dlogits).
  virtual ConstMatrixView<T> logits() const = 0;
};

}  // namespace summa

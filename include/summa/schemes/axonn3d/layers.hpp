#pragma once
/// \file layers.hpp
/// The 3D parallel-matrix-multiply GPT-2 layers of AxoNN (Singh et al.,
/// "A 4D hybrid algorithm to scale parallel training to thousands of GPUs",
/// §V-A, Algorithm 1) on a Gx x Gy x Gz grid (ProcessGrid::grid3d), behind
/// the same Layer / Module interface as the 1D and 2D layers.
///
/// Axes. Rank (x, y, z) = (coords().row, coords().col, coords().depth):
///   X group  grid.mesh_col()  ranks sharing (z, y), x varies (Gx = rows)
///   Y group  grid.mesh_row()  ranks sharing (z, x), y varies (Gy = cols)
///   Z group  grid.depth()     ranks sharing (x, y), z varies (Gz = depth)
///
/// Activations [T, h] (T = batch*seq tokens) are split by token rows over Z
/// (rank z holds rows [z*T/Gz, (z+1)*T/Gz), whole sequences) and by columns
/// over Y or X: a "Y-layout" block [T/Gz, h/Gy] holds column block y and is
/// replicated over X, an "X-layout" block [T/Gz, n/Gx] column block x,
/// replicated over Y. Block inputs and outputs are Y-layout.
///
/// Linear3D, Y = X W + b (HF Conv1D: W [in, out]). Orientation normal: the
/// input is Y-layout, W's block (y, x) (rows block y of in/Gy, columns block
/// x of out/Gx) lives on the ranks (x, y, *), further sharded over Z by rows
/// (rank z stores rows [z*in/(Gy*Gz), ...) of the block: Ŵ, local
/// [in/(Gy*Gz), out/Gx]); the output is X-layout. Transposed: X and Y swap
/// roles (input X-layout, W rows over X and columns over Y, output Y-layout).
/// Consecutive linears alternate (c_attn / c_fc normal, c_proj transposed),
/// so no activation is ever redistributed. With A the axis of the input
/// columns (normal: Y) and B that of the output columns (normal: X):
///   forward   all-gather_Z(Ŵ) -> W(a, b)   [in/A, out/B] (workspace)
///             Ô = X W(a, b); all-reduce_A(Ô) -> O; O += b
///   backward  all-gather_Z(Ŵ) again (W is not cached: FSDP-style);
///             dX̂ = dO Wᵀ, all-reduce_B (non-blocking with OAR, overlapped
///             with the next two steps); dW = Xᵀ dO [in/A, out/B],
///             reduce-scatter_Z -> the rank's shard of dŴ;
///             db = column sums of dO, all-reduce_Z.
/// The bias [out] is split over B like the output columns and replicated
/// over A and Z; its owner is the rank with a = 0 and z = 0. dO is
/// replicated over A and the Z all-reduce sums the token blocks, so every
/// replica computes the same (bit-identical) gradient.
///
/// The LayerNorm on a Y-layout block (SplitLayerNorm over axonn3d_norm_layout): the two-pass
/// statistics are all-reduced over Y (T/Gz values each); dX needs one all-reduce over Y of 2*T/Gz
/// partial sums. gamma / beta [h] are split over Y (local h/Gy), replicated
/// over X and Z (owner x = 0, z = 0); their gradients, column sums over the
/// rank's tokens, are all-reduced over Z (2*h/Gy values); inputs and output
/// gradients are replicated over X, so X replicas agree bit for bit.
///
/// Embedding3D / LMHead3D (tied). wte [V, h] is stored like a weight whose
/// rows are split over X (vocabulary block x of V/Gx) and columns over Y
/// (hidden block y), Z-sharded by rows: local [V/(Gx*Gz), h/Gy]. The head
/// treats wteᵀ [h, V] as a normal linear: logits [T/Gz, V/Gx] (X-layout) =
/// X wte(x, y)ᵀ all-reduced over Y; vocabulary-parallel cross-entropy over X
/// (row max, then sum of exp and target logit); the loss is summed over Z.
/// The embedding gathers the rows of the tokens in vocabulary block x (zero
/// elsewhere) from the all-gathered block and all-reduces over X. wpe [P, h]
/// is split over Y, replicated over X and Z (owner x = 0, z = 0). Backward:
/// each of head and embedding scatters / multiplies into a gathered-size
/// [V/Gx, h/Gy] gradient and reduce-scatters it over Z into the shard (two
/// reduce-scatters per step); wpe's gradient is all-reduced over Z.
///
/// Attention heads are split over X (heads % Gx == 0), sequences over Z
/// (batch % Gz == 0); attention itself is local and computed redundantly by
/// the Y ranks (which hold the same q, k, v).
///
/// Per-call shape checks are local: every rank's local shapes are the same,
/// so consistent arguments pass or fail everywhere alike. Construction-time
/// checks and id checks agree over grid.tensor(). Buffers that take part in
/// a collective (Linear3D outputs and input gradients, the embedding output,
/// the head's input gradient) must be contiguous.
///
/// Element types: every class is instantiated for float, double and
/// summa::bf16. With bf16 (docs/gpu.md, "Mixed precision"), parameters,
/// activations, their gradients and the collectives on them are bf16; the
/// per-row statistics (LayerNorm mean / rstd / backward row sums, the
/// cross-entropy row max / sum of exp / target logit) are acc_t<bf16> =
/// float in the forward and workspace arenas, all-reduced over Y / X in
/// float; GEMM and Backend scalars are acc_t<T>; the loss is a double.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "summa/core/bf16.hpp"
#include "summa/grid/process_grid.hpp"
#include "summa/layers/layer.hpp"
#include "summa/layers/split_layer_norm.hpp"
#include "summa/layers/vocab_parallel.hpp"
#include "summa/memory/buffers.hpp"

namespace summa {

/// How a Linear3D maps its matrices on the grid (see the file comment).
enum class Orientation3D : std::uint8_t {
  normal,      ///< input columns over Y, output columns over X
  transposed,  ///< input columns over X, output columns over Y
};

/// The overlap switches of AxoNN §V-D. Each changes only when a
/// collective completes, never what it computes: results are bit-identical
/// on and off (tested), and the bytes sent are the same.
struct Axonn3DOptions {
  /// OAR: the input-gradient all-reduce of a linear is non-blocking and
  /// overlapped with its weight-gradient GEMM and reduce-scatter.
  bool overlap_all_reduce = true;
  /// ORS: a linear's weight-gradient reduce-scatter over Z is issued
  /// non-blocking and completed only at the end of backward (the model's
  /// one completion point), so it overlaps every layer below. The unreduced
  /// gradients wait in the "deferred" buffer: one [in/A, out/B] block per
  /// Linear3D, i.e. Gz times the weight shards — the memory price of the
  /// overlap, hence off by default. No effect when Gz = 1. With a data axis
  /// the gradient buckets are all-reduced after that completion.
  bool overlap_reduce_scatter = false;
  /// OAG: while a linear computes, the all-gather over Z of the weight of
  /// the linear that ran next in the previous step is already in flight
  /// (the order is recorded each step, so checkpoint recomputation and
  /// backward are covered from the second step on). Two gathered-weight
  /// slots (the "prefetch" buffer). No effect when Gz = 1. Off by default:
  /// on CPU MPI without a progress thread the gather advances only inside
  /// MPI calls, so it pays mainly on GPUs (NCCL streams).
  bool overlap_all_gather = false;
};

template <class T>
class Linear3D;

/// The cross-layer state of the ORS and OAG overlaps, shared by the
/// Linear3D layers of one model (its Axonn3DContext owns it). Collective protocol: every
/// rank of the grid makes the same calls in the same order.
template <class T>
class Overlap3D {
 public:
  Overlap3D(ProcessGrid& grid, Backend& backend, Axonn3DOptions options);
  ~Overlap3D();
  Overlap3D(const Overlap3D&) = delete;
  Overlap3D& operator=(const Overlap3D&) = delete;

  const Axonn3DOptions& options() const { return options_; }
  /// OAG / ORS in effect (switched on and Gz > 1).
  bool prefetching() const { return prefetch_on_; }
  bool deferring() const { return defer_on_; }

  /// Construction time: registers a linear's weight (its shard is
  /// all-gathered into [gathered] elements); returns the linear's id.
  int add(const Param<T>& weight, index_t gathered);
  /// After every add(): sizes the "prefetch" (two slots of the largest
  /// gathered weight) and "deferred" (every linear's gathered size) buffers
  /// and allocates them unless `plan_only`.
  void allocate(bool plan_only);
  /// Capacities and high-water marks of the two buffers.
  std::vector<BufferUsage> usage() const;

  /// Start of a forward pass: ends any prediction of the previous pass.
  void begin_step();
  /// OAG: linear `id`'s all-gathered weight (waits for its prefetch, or
  /// gathers now), after issuing the prefetch of the linear predicted next.
  /// Valid until the next call.
  T* gathered_weight(int id);
  /// ORS: where linear `id` computes its unreduced weight gradient.
  T* staging(int id);
  /// ORS: reduce-scatters staging(id) over Z into `grad` (overwrite) or, with
  /// `accumulate`, adds it there at complete().
  void defer(int id, T* grad, bool accumulate);
  /// The completion point: waits for every deferred reduce-scatter (and
  /// accumulates) and for an unused prefetch; records this step's order.
  void complete();

  /// OAG statistics since construction: weights found already gathered
  /// (prefetched) and weights gathered on demand.
  std::int64_t prefetch_hits() const { return hits_; }
  std::int64_t prefetch_misses() const { return misses_; }
  /// ORS: reduce-scatters deferred since construction.
  std::int64_t deferred_count() const { return deferred_count_; }

 private:
  struct Entry {
    const Param<T>* weight;
    index_t gathered;
    std::size_t offset;  // in the deferred buffer
  };
  struct Deferred {
    int id;
    T* grad;
    bool accumulate;
    Request request;
  };
  void drain_prefetch();

  ProcessGrid* grid_;
  Backend* backend_;
  Axonn3DOptions options_;
  bool prefetch_on_ = false, defer_on_ = false;
  std::vector<Entry> entries_;
  index_t max_gathered_ = 0;
  std::size_t deferred_bytes_ = 0;
  std::unique_ptr<Arena> prefetch_, deferred_;
  T* slot_[2] = {nullptr, nullptr};
  int slot_id_[2] = {-1, -1};  // which linear's weight a slot holds (or receives)
  int pending_slot_ = -1;      // slot with an all-gather in flight
  Request pending_;
  std::vector<int> trace_, current_;  // gather order of the previous / this step
  bool following_ = true;             // this step matches trace_ so far
  std::vector<Deferred> deferred_list_;
  std::int64_t hits_ = 0, misses_ = 0, deferred_count_ = 0;
};

// ---------------------------------------------------------------- linear

/// Y = X W + b with the 3D PMM of AxoNN (see the file comment). `tokens` is
/// the global token count T (divisible by Gz); X is [T/Gz, in/A], Y
/// [T/Gz, out/B] with A, B the input / output column axes of the
/// orientation. The weight [in, out] is split [in/(A*Gz), out/B]: its rows
/// over A, then over Z (all-gathered over Z for use). `groups.out` (3 for
/// c_attn: the output block x is [Q_x | K_x | V_x]) and `groups.in` (an input
/// that concatenates branches) group the columns of Y and X, the weight's
/// columns and rows following (ColumnGroups).
template <class T>
class Linear3D final : public Layer<T> {
 public:
  /// Throws summa::Error (the same on every rank) unless the sizes are
  /// positive, tokens % Gz == 0, in % (groups.in*A) == 0, (in/A) % Gz == 0
  /// and out % (groups.out*B) == 0.
  Linear3D(ProcessGrid& grid, Backend& backend, std::string name, index_t tokens, index_t in,
           index_t out, Orientation3D orientation, bool has_bias = true, ColumnGroups groups = {},
           Axonn3DOptions options = {}, Overlap3D<T>* overlap = nullptr);

  std::string_view name() const override { return name_; }
  void collect_parameters(std::vector<Param<T>*>& out) override;
  BufferNeeds buffer_needs() const override;
  void price(cost::Tally& t, model::Phase phase) const override;
  void forward(ConstMatrixView<T> X, MatrixView<T> Y, StepBuffers& buffers) override;
  void backward(ConstMatrixView<T> dY, MatrixView<T> dX, StepBuffers& buffers,
                bool accumulate = false) override;

  Orientation3D orientation() const { return orientation_; }
  index_t local_tokens() const { return tokens_ / gz_; }
  index_t local_in() const { return in_ / in_split_; }
  index_t local_out() const { return out_ / out_split_; }
  Param<T>& weight() { return weight_; }
  Param<T>& bias() { return bias_; }

 private:
  std::size_t scratch_bytes() const;
  /// W(a, b) [local_in, local_out]: the stored shard itself when Gz = 1,
  /// otherwise all-gathered over Z into `buffer`.
  MatrixView<T> gathered_weight(T* buffer);

  ProcessGrid* grid_;
  Backend* backend_;
  std::string name_;
  index_t tokens_, in_, out_;
  Orientation3D orientation_;
  bool has_bias_;
  Axonn3DOptions options_;
  Overlap3D<T>* overlap_;  // ORS / OAG state (null: neither)
  int overlap_id_ = -1;
  Communicator* in_comm_;   // A: the all-reduce of the forward output
  Communicator* out_comm_;  // B: the all-reduce of the input gradient
  int in_split_, out_split_, gz_;
  Param<T> weight_, bias_;
  ConstMatrixView<T> x_{};
};

// ---------------------------------------------------------------- layer norm, GeLU

/// AxoNN's LayerNorm layout (summa/layers/split_layer_norm.hpp): Y-layout
/// blocks, the tokens over Z, the columns over Y; gamma and beta replicated
/// over X and Z (x = 0, z = 0 owns them).
NormLayout axonn3d_norm_layout(const ProcessGrid& grid);

// ---------------------------------------------------------------- embedding, head, loss

/// AxoNN's vocabulary-parallel layout (summa/layers/vocab_parallel.hpp; see
/// the file comment): the vocabulary over X, the hidden columns over Y, the
/// tokens over Z, which also shards wte's rows; `overlap_dx`: the LM head's
/// dX all-reduce over X overlapped (OAR).
VocabLayout axonn3d_vocab_layout(const ProcessGrid& grid, bool overlap_dx = true);

/// Token and position embeddings (see the file comment; VocabEmbedding).
/// Token ids are the global batch; rank z embeds its Z block of them.
template <class T>
class Embedding3D final : public VocabEmbedding<T> {
 public:
  Embedding3D(ProcessGrid& grid, Backend& backend, index_t batch, index_t seq, index_t vocab,
              index_t hidden, index_t n_positions)
      : VocabEmbedding<T>(grid, backend, axonn3d_vocab_layout(grid), batch, seq, vocab, hidden,
                          n_positions) {}
};

/// Vocabulary-parallel cross-entropy on X-layout logits [T/Gz, V/Gx]: row
/// statistics over X, the loss summed over Z (VocabCrossEntropy).
template <class T>
class CrossEntropy3D final : public VocabCrossEntropy<T> {
 public:
  CrossEntropy3D(ProcessGrid& grid, Backend& backend, index_t tokens, index_t vocab,
                 index_t normalizer = 0)
      : VocabCrossEntropy<T>(grid, backend, axonn3d_vocab_layout(grid), tokens, vocab, normalizer) {
  }
};

/// Tied LM head: logits = X wteᵀ as a normal 3D linear (see the file
/// comment), then CrossEntropy3D (VocabLMHead).
template <class T>
class LMHead3D final : public VocabLMHead<T> {
 public:
  LMHead3D(ProcessGrid& grid, Backend& backend, Param<T>& wte, index_t tokens, index_t hidden,
           index_t vocab, index_t normalizer = 0, Axonn3DOptions options = {})
      : VocabLMHead<T>(grid, backend, axonn3d_vocab_layout(grid, options.overlap_all_reduce), wte,
                       tokens, hidden, vocab, normalizer) {}
};

extern template class Overlap3D<float>;
extern template class Overlap3D<double>;
extern template class Overlap3D<bf16>;
extern template class Linear3D<float>;
extern template class Linear3D<double>;
extern template class Linear3D<bf16>;

}  // namespace summa

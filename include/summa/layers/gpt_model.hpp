#pragma once
/// \file gpt_model.hpp
/// The scheme-independent face of a distributed GPT-2: whatever the
/// tensor-parallel scheme (2D SUMMA, 1D Megatron, ...), the same
/// training-step code drives it through this interface, and parameters keep
/// their global Hugging Face names and shapes.

#include <cstdint>
#include <span>
#include <string_view>

#include "summa/grid/process_grid.hpp"
#include "summa/layers/parameters.hpp"
#include "summa/memory/buffers.hpp"
#include "summa/model/config.hpp"

namespace summa {

/// What a training step keeps for backward and what it recomputes instead
/// (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
/// Transformer Models"). docs/memory.md, "Recompute", has the bytes and the
/// cost of each.
enum class Recompute : std::uint8_t {
  /// Keep every activation of every block: the most memory, no recompute.
  none,
  /// Per-block activation checkpoints: keep only the block boundaries
  /// x_0..x_N; backward runs each block's forward again from its boundary.
  full,
  /// Keep everything but attention's scores and probabilities (per block
  /// batch x heads x seq^2, the one term that grows with seq^2): backward
  /// recomputes softmax(Q Kᵀ) from the kept Q and K, one sequence at a time.
  /// The results are the same arithmetic as `none`.
  selective,
};

/// "none", "full" or "selective".
std::string_view to_string(Recompute r);
/// The inverse of to_string; anything else throws summa::Error naming
/// `text` and `what` (the flag or field it came from).
Recompute parse_recompute(std::string_view text, std::string_view what);

/// A pipeline stage's share of the model (GptOptions::pipeline, set by
/// PipelineGpt, parallel/pipeline.hpp): blocks [first_block, last_block)
/// with their global names, the embedding on the first stage, LN_f and the
/// LM head on the last (which keeps its own copy of the tied embedding, as
/// Megatron-LM does), and activation slots for `slots` microbatches in
/// flight. Inactive (stages = 0): the whole model, run by forward() and
/// backward(). A pipeline of one stage is the whole model run per
/// microbatch (gradient accumulation).
struct PipelineStage {
  int stage = 0;        ///< this stage, 0 .. stages - 1
  int stages = 0;       ///< pipeline stages; 0: not a pipeline stage
  int first_block = 0;  ///< the stage's blocks: [first_block, last_block)
  int last_block = 0;
  int slots = 1;  ///< microbatches whose activations this stage keeps at once
  /// Tokens of the whole batch (all microbatches, all data groups): the
  /// loss's normaliser, so that the microbatches' losses and gradients add
  /// up to the batch's.
  index_t loss_tokens = 0;
  bool active() const { return stages > 0; }
  bool first() const { return stage == 0; }
  bool last() const { return stage == stages - 1; }
};

struct GptOptions {
  /// What backward recomputes (Recompute): full per-block checkpointing by
  /// default.
  Recompute recompute = Recompute::full;
  /// Build the layers and size every buffer, but allocate nothing: the model
  /// only answers memory_report() (capacities, high water 0). This is the
  /// memory planner (summa::plan_memory); init, forward, backward and
  /// parameters_store() throw.
  bool plan_only = false;
  /// Time the step's parts (GptModel::profile): each part is bracketed by
  /// Backend::synchronize() and a clock read, so the figures are the
  /// device's; off, the step runs untouched.
  bool profile = false;
  /// Forward only (inference, generation): no gradients, no backward or
  /// conjunction buffer, two block-boundary slots instead of n_layer + 1,
  /// each block's activations released as it finishes (as with
  /// checkpointing) and attention's probabilities not kept (one sequence's
  /// at a time in the workspace); backward() throws. The memory report and the planner
  /// show it.
  bool inference = false;
  /// With `inference`: a key / value cache of this many positions per
  /// sequence (at most n_positions, at least seq), sized up front and never
  /// reallocated; Gpt::forward_cached then runs a window of seq new tokens
  /// at any position of it (seq = 1: one decoding step). 0: none.
  index_t kv_cache = 0;
  /// The parameter and gradient buffers hold a multiple of this many
  /// elements (ParameterStore's `multiple`): ParallelGpt sets it to the data
  /// groups when the data axis is sharded (SchemeSpec::zero), for equal
  /// chunks.
  index_t parameter_multiple = 1;
  /// ZeRO-2's sharded gradients (SchemeSpec::zero >= 2, set by
  /// ParallelGpt): each data group keeps only its chunk (data_chunk) of
  /// the gradients, its piece of every unit (the embedding, each block,
  /// LN_f; each padded to D pieces), and backward forms each unit's in a
  /// gradient slot of the store and reduce-scatters them over the data
  /// axis (one reduce-scatter per unit, on the same schedule as the
  /// all-reduces it replaces; under a scheme that defers its gradients,
  /// 3D's ORS, every block has a slot and all are reduced at the end). The
  /// values stay whole (ParameterStore's ValueSharding::values false).
  bool shard_gradients = false;
  /// ZeRO-3 (SchemeSpec::zero = 3, set by ParallelGpt with shard_gradients
  /// and parameter_multiple = the data groups): the parameters too are
  /// sharded over the data axis. Each data group keeps its chunk of the
  /// packed values and gradients (ParameterStore's sharded constructor);
  /// the embedding and LN_f are gathered at the start of each forward and
  /// kept to the end of backward, each block is gathered into one of two
  /// rotating value slots (three when the scheme prefetches weights, 3D's
  /// OAG) ahead of its use, the next one in flight while a block runs, and
  /// again in backward; each block's gradients are formed in one of two
  /// rotating gradient slots (one per block when the scheme defers its
  /// gradients, 3D's ORS) and reduce-scattered as zero=2's.
  /// Training only: a model built for inference ignores it.
  bool shard_parameters = false;
  /// A pipeline stage (PipelineStage; set by PipelineGpt): the model holds
  /// only the stage's modules and runs per microbatch through
  /// Gpt::stage_forward / stage_backward (forward() and backward() throw).
  /// Needs recompute full and training; not with distributed checkpoints,
  /// zero >= 2 or a key/value cache.
  PipelineStage pipeline{};
};

/// One part of a training step as GptModel::profile reports it: its name in
/// the step-time model's terms (model/step_time.hpp, OpTime::op: the block
/// ops summed as "blocks", and each block op, "block.attn.core", on its
/// own), its phase ("forward", "backward", "recompute"), and the wall time
/// and calls since the last reset.
struct StepPart {
  std::string_view op, phase;
  double seconds = 0;
  std::uint64_t calls = 0;
};

template <class T>
class GptModel : public Module<T> {
 public:
  /// Layout-invariant initialisation: the global weights of
  /// reference::Gpt<T>(config, seed), whatever the scheme and grid.
  virtual void init(std::uint64_t seed) = 0;
  /// Mean cross-entropy over all batch*seq tokens of the global batch (the
  /// same on every rank). tokens and targets: the global [batch, seq] ids
  /// (row-major, targets already shifted), the same on every rank.
  virtual double forward(std::span<const std::int32_t> tokens,
                         std::span<const std::int32_t> targets) = 0;
  /// Gradients of the last forward's loss: overwritten, or added to with
  /// `accumulate` (with GptOptions::shard_gradients: added to this data
  /// group's chunk, the only part defined after a backward).
  virtual void backward(bool accumulate = false) = 0;

  virtual const GptConfig& config() const = 0;
  virtual const GptOptions& options() const = 0;
  /// Global batch (sequences) and sequence length the buffers are sized for.
  virtual index_t batch() const = 0;
  virtual index_t seq() const = 0;
  virtual ProcessGrid& grid() const = 0;
  virtual ParameterStore<T>& parameters_store() = 0;
  /// Bytes per rank: parameters, gradients, activations, every buffer.
  virtual MemoryReport memory_report() const = 0;
  /// The step's parts timed on this rank since reset_profile() (empty
  /// unless built with GptOptions::profile): embedding, blocks, ln_f and
  /// lm_head forward; lm_head, ln_f, blocks (recompute and backward),
  /// embedding and the data axis's wait backward — these ten cover the
  /// step; then the eight block ops (block.ln_1, block.attn.c_attn,
  /// block.attn.core, block.attn.c_proj, block.ln_2, block.mlp.c_fc,
  /// block.mlp.gelu, block.mlp.c_proj; each residual add counted with the
  /// op the step-time model prices it with) in forward, recompute and
  /// backward, nested in the blocks parts (their sum is the blocks part
  /// less the block's own bookkeeping).
  virtual std::span<const StepPart> profile() const { return {}; }
  virtual void reset_profile() {}
};

}  // namespace summa

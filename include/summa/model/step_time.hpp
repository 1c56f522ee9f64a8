#pragma once
/// \file step_time.hpp
/// The step-time model (docs/scaling.md): a GPT training step of any scheme
/// priced on a machine description (model/machine.hpp). The step is the one
/// the traffic model counts (model/traffic.hpp; same ops, same collectives,
/// the same bytes), plus each op's compute: local GEMMs at the machine's
/// GEMM rate for their shapes, element-wise work at its memory bandwidth.
/// Each collective is priced by the α-β formula of its algorithm on the link
/// level its group spans under the node placement; communication the
/// implementation overlaps (SUMMA's double-buffered panels, the 2D bias
/// broadcasts, the 3D OAR / ORS / OAG switches, the data-axis buckets) is
/// exposed only where it outlasts the compute it overlaps. No MPI, no
/// allocation of the model: a 4096-device prediction takes milliseconds.

#include <array>
#include <cstdint>
#include <optional>

#include <string_view>
#include <vector>

#include "summa/comm/counters.hpp"
#include "summa/grid/placement.hpp"
#include "summa/layers/gpt_model.hpp"
#include "summa/model/config.hpp"
#include "summa/model/cost.hpp"
#include "summa/model/machine.hpp"
#include "summa/schemes/spec.hpp"

namespace summa::model {

std::string_view name_of(Phase p);

/// One op of the step on the critical rank: its name ("embedding",
/// "block.attn.c_attn", "lm_head", "optimizer", "data_axis"), phase, how
/// often a step runs it (the layer count for block ops) and, per run, its
/// compute, its communication per grid axis and the part of that
/// communication not hidden behind compute.
struct OpTime {
  std::string_view op;
  Phase phase = Phase::forward;
  std::uint64_t count = 1;
  double compute_s = 0;
  std::array<double, comm_axis_count> comm_s{};
  double exposed_s = 0;
  double seconds() const { return compute_s + exposed_s; }
  double comm_total_s() const;
};

struct StepTimeOptions {
  /// Where ranks sit on nodes (grid/placement.hpp), devices_per_node from
  /// the machine.
  Placement placement = Placement::natural;
  /// Price the AdamW update of the rank's parameter shards.
  bool optimizer = true;
  /// The optimizer offloaded (OptimizerOptions::offload_bucket, elements per
  /// bucket; 0: not): its state (AdamW's two moments, bf16's master) is
  /// copied in and out over the device's host link
  /// (DeviceModel::host_bandwidth) while the update runs, so the update
  /// takes max(its memory traffic, the copies) plus one bucket's copy in
  /// and one's copy out that nothing hides.
  index_t offload_bucket = 0;
  /// Price this rank only (grid coordinates) instead of the slowest.
  std::optional<GridCoords> rank = {};
  /// Ranks sharing one device (an oversubscribed launch: more ranks per
  /// node than cores or GPUs). Each rank's compute and element-wise work
  /// take this many times longer (the device is time-shared), and a node
  /// holds devices_per_node x ranks_per_device ranks.
  int ranks_per_device = 1;
  /// Collectives an op issues non-blocking (cost::Work::overlapped: 2D's
  /// bias broadcasts, 3D's OAR / ORS / OAG, the LM head's dX) hidden
  /// behind the op's compute where they fit; false: each is waited for at
  /// once and priced exposed, as an implementation that overlaps nothing
  /// (model/implementation.hpp's 2021 profiles).
  bool overlap_collectives = true;
  /// The data axis's gradient buckets reduced behind backward as each
  /// becomes final; false: all of them after backward (Megatron-LM 2021's
  /// local DDP).
  bool overlap_data_axis = true;
  /// A local GEMM the model records as `calls` strided-batched calls of
  /// `batch` products (the attention's: one call of the local heads per
  /// sequence, as this library runs it) priced as one call of all
  /// calls x batch products: PyTorch's bmm over the whole local batch, as
  /// Megatron-LM's and Optimus's attention ran (the 2021 profiles).
  bool batch_calls = false;
};

struct StepTime {
  /// The step: the sum over phases (the data axis's exposed part included
  /// in backward).
  double step_s = 0;
  std::array<double, phase_count> phase_s{};
  double compute_s = 0;
  /// Communication per grid axis (all of it) and the part not hidden.
  std::array<double, comm_axis_count> comm_s{};
  double exposed_s = 0;
  /// Every op of the critical rank, in step order.
  std::vector<OpTime> ops;
  /// The rank (grid coordinates) whose step is the longest: the step time.
  GridCoords critical{};
  double phase(Phase p) const { return phase_s[static_cast<std::size_t>(p)]; }
};

/// The step time of a GPT of `config` with global `batch` sequences of
/// `seq` tokens under `spec` on `machine`, elements of `dtype`. Throws
/// summa::Error when the machine has no GEMM rate for dtype or the batch
/// does not split over the data groups. Local sizes are global sizes
/// divided by the scheme's factors (rounded down): check a configuration's
/// divisibility with the scheme first (ParallelGpt, plan_memory).
StepTime predict_step_time(const SchemeSpec& spec, const GptConfig& config, index_t batch,
                           index_t seq, const GptOptions& options, DType dtype,
                           const Machine& machine, const StepTimeOptions& time_options = {});

/// One pipeline stage's share of a pipelined step (predict_pipeline_step_time):
/// per microbatch its forward and its backward (recompute included) on its
/// critical rank, and its part of the once-per-batch work.
struct PipelineStageTime {
  int first_block = 0, last_block = 0;   ///< its blocks [first, last)
  double forward_s = 0, backward_s = 0;  ///< per microbatch
  double data_axis_s = 0;                ///< the data axis's exposed reduction, once per batch
  double optimizer_s = 0;                ///< its optimizer step
};

/// A pipelined training step (spec.pipeline active): the stages' work per
/// microbatch, the schedule's span, and what follows the flush.
struct PipelineStepTime {
  double step_s = 0;
  /// From the first microbatch's forward to the last one's backward: for
  /// the flushed schedules (gpipe, 1f1b) the first microbatch's way through
  /// every stage and back, plus M - 1 times the slowest stage's forward and
  /// backward; for axonn with a limit L below M the larger of that and
  /// ceil(M / L) round trips (L microbatches circulate).
  double pipeline_s = 0;
  /// The slowest stage's idle share of pipeline_s: 1 - M x its work / span
  /// ((P - 1) / (M + P - 1) for balanced stages and free messages).
  double bubble = 0;
  /// One stage message (a microbatch's activations, or their gradient)
  /// between neighbouring stages, by the link level they span.
  double message_s = 0;
  /// The data axis exposed after the flush: each stage's reduction is
  /// issued with its final backward, and overlaps the backwards of the
  /// stages before it (and the messages between) still to run; the
  /// largest remainder over the stages.
  double data_axis_s = 0;
  double optimizer_s = 0;  ///< the slowest stage's
  double embedding_s = 0;  ///< the tied embedding's gradients between the end stages
  std::vector<PipelineStageTime> stages;
  int busiest_stage = 0;  ///< the largest forward + backward per microbatch
};

/// The step of `spec` with its pipeline axis (spec.pipeline.active()) on
/// `machine`. Each stage is priced from one step of the unpipelined scheme
/// (spec.stage()) for one microbatch: per block, the embedding, the head,
/// the data axis and the optimizer (those two shared by the stages by their
/// parameters); the messages by the link level neighbouring stages span
/// under natural placement (a stage's ranks are consecutive). The stages
/// run their microbatches as the schedule orders them (PipelineStepTime).
/// Throws summa::Error as predict_step_time does, and for a spec without a
/// pipeline or a batch that does not divide into the microbatches.
PipelineStepTime predict_pipeline_step_time(const SchemeSpec& spec, const GptConfig& config,
                                            index_t batch, index_t seq, const GptOptions& options,
                                            DType dtype, const Machine& machine,
                                            const StepTimeOptions& time_options = {});

/// One local GEMM shape of a step: `batch` products m x n x k in one call,
/// in `mode`.
struct GemmShape {
  index_t m = 0, n = 0, k = 0, batch = 1;
  GemmMode mode = GemmMode::nn;
  friend auto operator<=>(const GemmShape&, const GemmShape&) = default;
};

/// Every distinct local GEMM the step-time model prices for this step, on
/// every rank it evaluates (SUMMA's panel products included): what
/// `calibrate --gpt` measures so that the machine's GEMM table holds the
/// configuration's own shapes.
std::vector<GemmShape> step_gemm_shapes(const SchemeSpec& spec, const GptConfig& config,
                                        index_t batch, index_t seq, const GptOptions& options,
                                        DType dtype);

}  // namespace summa::model

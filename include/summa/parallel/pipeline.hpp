#pragma once
/// \file pipeline.hpp
/// A pipeline axis over any tensor scheme and data axis (issue 28): the
/// model's blocks split into P contiguous stages, each stage a ParallelGpt
/// of the tensor scheme (its own grid of data x tensor ranks), the batch cut
/// into M microbatches that flow through the stages and are flushed every
/// batch, so the gradients are exactly the whole batch's.
///
/// Ranks: P x spec.ranks(); rank r is in stage r / spec.ranks() (a stage's
/// ranks are consecutive, so a tensor group stays inside a node), and the
/// pipe communicator (CommAxis::pipe) joins the ranks with the same place
/// in every stage. Stage messages (a microbatch's activations forward, their
/// gradient backward) are non-blocking point-to-point calls on it, counted
/// by its traffic counter and guarded by the grid's watchdog settings.
/// The pipe communicator is MPI: an MpiCommunicator when the grid's
/// communicators are (GridOptions::comm = mpi), else (nccl or mpi_staged
/// stage grids, device memory) a StagedCommunicator, MPI point to point on
/// pinned host copies, sized for the messages a stage can have in flight
/// (pipe_staging()). AxoNN's stage messages are MPI point to point too; NCCL's
/// send and receive are ordered on a stream, so a receive posted from
/// each neighbour at once (the message-driven schedule) would serialise
/// them rather than take whichever arrives first.
///
/// Schedules (PipeSchedule):
///  - axonn: AxoNN's message-driven schedule (Singh and Bhatele, IPDPS 2022,
///    section IV): every stage keeps a receive posted from each neighbour and
///    acts on whichever message arrives first, forward from the previous
///    stage or backward from the next (as the stage's tensor group's first
///    rank sees them: it broadcasts its choice to the group, whose
///    collectives need one order); the first stage injects a new microbatch
///    whenever fewer than `limit` are in flight; the last stage runs a
///    microbatch's backward as soon as its forward is done. While both are
///    due the first rank waits for either (Communicator::wait_any, guarded
///    by the watchdog like any wait: a stalled neighbour is named by the
///    report, the waiting stages are not).
///  - gpipe: every forward, then every backward (Huang et al. 2019).
///  - one_f_one_b: PipeDream-flush as Megatron-LM runs it: P - 1 - s
///    warm-up forwards on stage s, then one forward and one backward in
///    turn, then the remaining backwards.
/// Every schedule runs each stage's backwards in microbatch order, so the
/// gradients are the same bits whatever the schedule.
///
/// Tied embedding: the last stage keeps its own copy of the embedding (the
/// token embedding for the LM head, as Megatron-LM does, and the unused
/// position embedding); after the flush the two copies' gradients are
/// exchanged and added over the pipe communicator, so both copies take the
/// same update and stay equal bit for bit.

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "summa/comm/mpi_communicator.hpp"
#include "summa/comm/watchdog.hpp"
#include "summa/parallel/scheme.hpp"

namespace summa {

/// The pipeline's options: the scheme text's pipe= item (schemes/spec.hpp).
using PipelineOptions = PipelineSpec;

/// Blocks per stage: options.split checked (summa::Error naming it), or the
/// stages balanced by the modules' cost under `recompute`
/// (pipeline_costs): the contiguous
/// split whose costliest stage costs least, the first stage also
/// embedding and the last also running LN_f, the LM head and the loss.
/// Where spreading n_layer as evenly as it divides (the remainder to the
/// middle stages first) is as good, that split. Throws summa::Error when a
/// stage would hold no block (n_layer < stages) or the options are not
/// positive.
std::vector<int> pipeline_split(const GptConfig& config, const PipelineOptions& options,
                                Recompute recompute = Recompute::full);

/// The modules' cost pipeline_split balances: flops per token of a step,
/// attention at n_positions tokens: a block's forward F = 24 h^2 + 4 s h
/// and its backward 2F, plus what `recompute` runs again: full F (the
/// block's forward; 4F in all), none nothing (3F), selective the scores
/// S = QK^T, 2 s h (3F + 2 s h); the embedding 6 h (lookup and position
/// add, the backward's scatter-add); LN_f, the LM head and the loss 6 h V
/// (logits, their backward at twice) plus their element-wise work. A
/// stage's copies of its kept activations (recompute none and selective)
/// move memory, not flops, and are not weighed.
struct PipelineCosts {
  double embedding = 0, block = 0, head = 0;
};
PipelineCosts pipeline_costs(const GptConfig& config, Recompute recompute = Recompute::full);

/// One operation of a stage: the forward or the backward of a microbatch.
struct PipeOp {
  bool forward = true;
  int micro = 0;
  friend bool operator==(const PipeOp&, const PipeOp&) = default;
};

/// When a stage ran one of its operations: seconds since its step began
/// (PipelineGpt::step's entry on this rank, a host clock).
struct PipeTiming {
  double start_s = 0, end_s = 0;
};

/// The static order of stage `stage`'s operations under gpipe or
/// one_f_one_b (axonn has none: it follows the messages); throws
/// summa::Error for axonn.
std::vector<PipeOp> pipeline_order(PipeSchedule schedule, int stage, int stages, int micro);

/// Activation slots stage `stage` needs: the most microbatches it holds at
/// once (gpipe: M; 1f1b: min(M, P - s); axonn: min(M, limit)).
int pipeline_slots(const PipelineOptions& options, int stage);

/// What a stage's pipe communicator holds at once: its requests in flight
/// and the bytes of their payloads. During a step, a stage's messages of
/// `message_bytes` each: a forward send per slot (`slots`), the input
/// gradient's send and a receive from each neighbour; after the flush, the
/// tied embedding's exchange (`exchange_bytes` sent and as many received);
/// then the loss's broadcast and the gradient norm's sum. Each payload is
/// counted rounded up to 256 bytes, plus 256 (a staging buffer's alignment).
/// It sizes the StagedCommunicator a device-memory grid's pipe uses
/// (GridOptions::staging_bytes, staging_requests).
struct PipeStaging {
  std::size_t bytes = 0;
  int requests = 0;
};
PipeStaging pipe_staging(std::size_t message_bytes, std::size_t exchange_bytes, int slots);

/// What stage `stage` of `spec`'s pipeline holds (GptOptions::pipeline) for
/// a global batch of `batch` sequences: its blocks (pipeline_split), its
/// slots (pipeline_slots) and the loss's token count. Throws summa::Error
/// for a split that does not fit the model or a batch that does not divide
/// into the microbatches.
PipelineStage pipeline_stage(const SchemeSpec& spec, const GptConfig& config, index_t batch,
                             index_t seq, int stage, Recompute recompute = Recompute::full);

/// A GPT trained through a pipeline of stages (see the file comment): the
/// scheme `spec` with its pipeline axis (spec.pipeline; every stage runs
/// spec.stage()). Collective over `comm`, whose size must be spec.ranks().
/// The stage grids use `grid`'s communicators (mpi, or on a GPU nccl or
/// mpi_staged); the pipe is MPI (a StagedCommunicator on device memory).
template <class T>
class PipelineGpt {
 public:
  /// `batch`: the global batch (sequences); each microbatch takes batch / M
  /// consecutive sequences of it, which must divide over the data groups.
  /// Throws the same summa::Error on every rank for a bad combination.
  PipelineGpt(MPI_Comm comm, const SchemeSpec& spec, Backend& backend, const GptConfig& config,
              index_t batch, index_t seq, GptOptions options = {}, GridOptions grid = {});
  ~PipelineGpt();
  PipelineGpt(const PipelineGpt&) = delete;
  PipelineGpt& operator=(const PipelineGpt&) = delete;

  /// Initialises every stage's weights (the global weights of
  /// reference::Gpt(config, seed), both embedding copies alike).
  void init(std::uint64_t seed);
  /// Forward and backward of the whole batch (global [batch, seq] ids, the
  /// same on every rank) through the schedule, flushed: this stage's
  /// gradients of the batch's mean loss in its store (overwritten), the
  /// data axis reduced, the embedding copies' gradients added. Returns the
  /// mean loss on every rank. Bad ids throw before any message, the same on
  /// every rank (agreed over every stage in the debug mode,
  /// GridOptions::check_calls); any other failure inside a step leaves
  /// messages in flight: the pipeline is then unusable (build another).
  double step(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets);
  /// The batch's mean loss without gradients (evaluation): the microbatches'
  /// forwards one after another through the stages; the gradients are left
  /// as they are. On every rank.
  double evaluate(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets);

  int stage() const { return stage_; }
  int stages() const { return options_.stages; }
  const PipelineOptions& options() const { return options_; }
  /// This rank's memory: its stage model's (with GptOptions::plan_only, the
  /// plan), the embedding exchange's "pipeline" buffer included.
  MemoryReport memory_report() const;
  /// This stage's blocks [first, last).
  int first_block() const { return model().first_block(); }
  int last_block() const { return model().last_block(); }
  ParallelGpt<T>& stage_run() { return *run_; }
  Gpt<T>& model() const { return run_->model(); }
  ProcessGrid& grid() { return run_->grid(); }
  Communicator& pipe() { return *pipe_; }
  /// The MPI communicators of every rank of every stage (a duplicate of the
  /// constructor's) and of the pipe axis (for checkpoints and exports).
  MPI_Comm world() const { return world_; }
  MPI_Comm pipe_native() const { return pipe_native_; }
  /// Bytes and calls of the stage messages (and the embedding exchange and
  /// the loss's broadcast) on this rank since construction or the reset.
  const TrafficCounter& pipe_traffic() const { return pipe_counter_; }
  void reset_pipe_traffic() { pipe_counter_ = {}; }
  /// The operations this stage ran in the last step, in order.
  std::span<const PipeOp> trace() const { return trace_; }
  /// When each of trace()'s operations ran (the stage's forward or
  /// backward of the microbatch, its messages' waits outside), for a
  /// timeline of the step (compare_schemes --timeline).
  std::span<const PipeTiming> timings() const { return timings_; }
  /// The most microbatches this stage held at once in the last step.
  int peak_in_flight() const { return peak_in_flight_; }

 private:
  void check_ids(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets) const;
  double reduce_loss(double loss);
  // One microbatch's ids.
  std::span<const std::int32_t> micro_ids(std::span<const std::int32_t> ids, int m) const;
  void forward_micro(int m, int slot);
  void backward_micro(int m);
  void post_receives();
  void run_static();
  void run_message_driven();
  void exchange_embedding_grads();

  PipelineOptions options_;
  int stage_ = 0;
  index_t batch_ = 0, seq_ = 0, micro_batch_ = 0;
  MPI_Comm world_ = MPI_COMM_NULL;
  std::unique_ptr<ParallelGpt<T>> run_;
  TrafficCounter pipe_counter_;
  std::unique_ptr<Watchdog> watchdog_;  // outlives the communicator it guards
  std::unique_ptr<Communicator> pipe_;
  MPI_Comm pipe_native_ = MPI_COMM_NULL;  // pipe_'s (owned by it)
  bool grid_checks_calls_ = false;

  // A step's state.
  std::span<const std::int32_t> tokens_, targets_;
  std::vector<int> free_slots_, slot_of_;
  std::vector<Request> forward_sends_;  // per slot
  Request input_grad_send_, forward_recv_, backward_recv_;
  int forward_recv_micro_ = -1, forward_recv_slot_ = -1, backward_recv_micro_ = -1;
  int next_forward_ = 0, next_backward_ = 0, next_recv_forward_ = 0, next_recv_backward_ = 0;
  std::vector<char> received_;  // per micro: its gradient (or input) has arrived
  double loss_ = 0;
  std::vector<PipeOp> trace_;
  std::vector<PipeTiming> timings_;
  std::chrono::steady_clock::time_point started_;
  double since_start() const;
  // Fixed at construction (no allocation in a step): the static schedule's
  // order (gpipe, 1f1b), and on the end stages the embedding's gradients and
  // the room for the other copy's.
  std::vector<PipeOp> order_;
  std::span<T> embedding_grads_, exchange_;
  int in_flight_ = 0, peak_in_flight_ = 0;
};

extern template class PipelineGpt<float>;
extern template class PipelineGpt<double>;
extern template class PipelineGpt<bf16>;

}  // namespace summa

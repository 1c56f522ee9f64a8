// The step-time model of a pipelined step (model/step_time.hpp,
// predict_pipeline_step_time): the stages priced from the unpipelined
// scheme's step for one microbatch, then run as the schedule orders them.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "summa/backend/cpu_backend.hpp"
#include "summa/model/step_time.hpp"
#include "summa/parallel/pipeline.hpp"

namespace summa::model {

namespace {

// Per rank of stage 0, from the planner (one microbatch's stage model):
// a stage message, the slot of a microbatch's outer activations (the
// conjunction buffer holds two slots plus one per microbatch slot); and
// without per-block checkpoints (recompute none or selective) one block's
// activations a slot keeps, the checkpoint buffer's growth over full
// recompute's per slot and block (0 with full).
struct StageBytes {
  double message = 0, kept = 0;
};

template <class T>
StageBytes stage_bytes(const SchemeSpec& spec, const GptConfig& config, index_t batch, index_t seq,
                       GptOptions options) {
  CpuBackend backend;  // a plan allocates nothing
  options.pipeline = pipeline_stage(spec, config, batch, seq, 0, options.recompute);
  // {conjunction, checkpoint} capacities of the stage's plan under `o`
  const auto capacities = [&](const GptOptions& o) {
    const MemoryReport r = plan_memory<T>(spec.stage(), backend, config,
                                          batch / spec.pipeline.micro, seq, GridCoords{}, o);
    std::pair<double, double> c{0, 0};
    for (const BufferUsage& b : r.buffers) {
      if (b.name == "conjunction") c.first = static_cast<double>(b.capacity);
      if (b.name == "checkpoint") c.second = static_cast<double>(b.capacity);
    }
    return c;
  };
  const auto [conjunction, checkpoint] = capacities(options);
  const double slots = options.pipeline.slots;
  StageBytes out{.message = conjunction / (2 + slots), .kept = 0};
  if (options.recompute != Recompute::full) {
    GptOptions full = options;
    full.recompute = Recompute::full;
    const double blocks = options.pipeline.last_block - options.pipeline.first_block;
    out.kept = (checkpoint - capacities(full).second) / (slots * blocks);
  }
  return out;
}

}  // namespace

PipelineStepTime predict_pipeline_step_time(const SchemeSpec& spec, const GptConfig& config,
                                            index_t batch, index_t seq, const GptOptions& options,
                                            DType dtype, const Machine& machine,
                                            const StepTimeOptions& time_options) {
  const PipelineSpec& p = spec.pipeline;
  require(p.active(), [&] {
    return fmt::format("predict_pipeline_step_time: scheme '{}' has no pipeline axis", spec.str());
  });
  const std::vector<int> split = pipeline_split(config, p, options.recompute);
  require(batch > 0 && batch % p.micro == 0, [&] {
    return fmt::format("predict_pipeline_step_time: batch={} does not divide into micro={}", batch,
                       p.micro);
  });
  const index_t micro_batch = batch / p.micro;
  // One microbatch through the whole model on one stage's grid.
  const StepTime one = predict_step_time(spec.stage(), config, micro_batch, seq, options, dtype,
                                         machine, time_options);
  double block_f = 0, block_b = 0, embed_f = 0, embed_b = 0, head_f = 0, head_b = 0, data = 0,
         optimizer = 0;
  for (const OpTime& o : one.ops) {
    const double s = o.seconds() * static_cast<double>(o.count);
    const bool forward = o.phase == Phase::forward;
    if (o.op.starts_with("block."))
      (forward ? block_f : block_b) += s;
    else if (o.op == "embedding")
      (forward ? embed_f : embed_b) += s;
    else if (o.op == "ln_f" || o.op == "lm_head")
      (forward ? head_f : head_b) += s;
    else if (o.op == "optimizer" || o.phase == Phase::optimizer)
      optimizer += s;
    else
      data += s;  // the data axis's exposed wait
  }
  const double layers = static_cast<double>(config.n_layer);
  block_f /= layers;
  block_b /= layers;
  // Without per-block checkpoints a stage copies each block's activations
  // into the microbatch's slot after its forward and back before its
  // backward (Gpt::stage_backward): each copy reads and writes them.
  const StageBytes bytes =
      dtype == DType::f64    ? stage_bytes<double>(spec, config, batch, seq, options)
      : dtype == DType::bf16 ? stage_bytes<bf16>(spec, config, batch, seq, options)
                             : stage_bytes<float>(spec, config, batch, seq, options);
  if (const double kept = bytes.kept; kept > 0) {
    const double share = time_options.ranks_per_device;
    const double copy =
        share * (2 * kept / machine.device.memory_bandwidth + machine.device.launch_s);
    block_f += copy;
    block_b += copy;
  }
  // Parameters per block, of the embedding and of LN_f (GPT-2's), for the
  // stages' shares of the data axis and of the optimizer.
  const double h = config.n_embd;
  const double per_block = 12 * h * h + 13 * h;
  const double embedding = (static_cast<double>(config.vocab_size) + config.n_positions) * h;
  const double all = per_block * layers + embedding + 2 * h;

  PipelineStepTime t;
  const int stages = p.stages;
  double first_way = 0, slowest = 0;
  for (int s = 0, first = 0; s < stages; first += split[static_cast<std::size_t>(s)], ++s) {
    const int blocks = split[static_cast<std::size_t>(s)];
    const bool is_first = s == 0, is_last = s == stages - 1;
    PipelineStageTime st;
    st.first_block = first;
    st.last_block = first + blocks;
    st.forward_s = blocks * block_f + (is_first ? embed_f : 0) + (is_last ? head_f : 0);
    st.backward_s = blocks * block_b + (is_first ? embed_b : 0) + (is_last ? head_b : 0);
    const double share =
        (blocks * per_block + (is_first || is_last ? embedding : 0) + (is_last ? 2 * h : 0)) / all;
    st.data_axis_s = data * share;
    st.optimizer_s = optimizer * share;
    const double work = st.forward_s + st.backward_s;
    first_way += work;
    if (work > slowest) {
      slowest = work;
      t.busiest_stage = s;
    }
    t.optimizer_s = std::max(t.optimizer_s, st.optimizer_s);
    t.stages.push_back(st);
  }
  // Neighbouring stages: the same place in stages `per_stage` ranks apart,
  // on one node when two stages fit it.
  const double per_stage = static_cast<double>(spec.stage().ranks());
  const LinkLevel& link =
      2 * per_stage <= machine.devices_per_node ? machine.intra_node : machine.inter_node;
  const auto message = [&](double bytes) {
    return collective_seconds(link[Collective::broadcast], Collective::broadcast, 2, bytes);
  };
  t.message_s = stages > 1 ? message(bytes.message) : 0;
  // The data axis: a stage issues its buckets with its final backward,
  // which ends before the flush does by the backwards of the stages
  // before it and the messages between (the gradient still travelling to
  // stage 0); its reduction is exposed only past that lead.
  for (int s = 0; s < stages; ++s) {
    double lead = 0;
    for (int k = 0; k < s; ++k)
      lead += t.stages[static_cast<std::size_t>(k)].backward_s + t.message_s;
    t.data_axis_s = std::max(
        t.data_axis_s, std::max(0.0, t.stages[static_cast<std::size_t>(s)].data_axis_s - lead));
  }
  const double round_trip = first_way + 2.0 * (stages - 1) * t.message_s;
  const double m = p.micro;
  t.pipeline_s = round_trip + (m - 1) * slowest;
  if (p.schedule == PipeSchedule::axonn) {
    const int limit = std::min(p.limit > 0 ? p.limit : stages, p.micro);
    t.pipeline_s = std::max(t.pipeline_s, std::ceil(m / limit) * round_trip);
  }
  t.bubble = t.pipeline_s > 0 ? 1 - m * slowest / t.pipeline_s : 0;
  // The tied embedding's gradients between the end stages (its local
  // elements over the stage's tensor group; once per batch).
  const double tensor = static_cast<double>(spec.stage().tensor_ranks());
  t.embedding_s =
      stages > 1 ? message(embedding / tensor * static_cast<double>(size_of(dtype))) : 0;
  t.step_s = t.pipeline_s + t.data_axis_s + t.embedding_s + t.optimizer_s;
  return t;
}

}  // namespace summa::model

// A training step's communication: the bytes of the step walked from the
// model (step.hpp), plus the data axis.
#include "summa/model/traffic.hpp"

#include <fmt/format.h>

#include "step.hpp"
#include "summa/backend/cpu_backend.hpp"
#include "summa/layers/gpt.hpp"
#include "summa/parallel/pipeline.hpp"
#include "summa/schemes/registry.hpp"

namespace summa::model {

namespace {

// One pipelined step (PipelineGpt::step) on the rank at `coords` of stage
// `stage`: its stage model's tensor collectives for each of the M
// microbatches; the data axis once (the buckets of the final microbatch's
// backward: LN_f on the last stage, the stage's blocks, the embedding on
// the first stage and its copy on the last; the loss on the last stage);
// and the pipe axis: a microbatch's activations to the next stage and
// their gradient back, the tied embedding's gradients between the end
// stages, the loss broadcast from the last stage.
template <class T>
TrafficCounters pipeline_traffic(const SchemeSpec& spec, const GptConfig& config, index_t batch,
                                 index_t seq, GptOptions options, int stage,
                                 const GridCoords& coords, bool optimizer_step) {
  const auto u = [](auto v) { return static_cast<cost::u64>(v); };
  const PipelineSpec& p = spec.pipeline;
  require(stage >= 0 && stage < p.stages, [&] {
    return fmt::format("predict_step_traffic: stage {} is not one of the {} stages of '{}'", stage,
                       p.stages, spec.str());
  });
  const SchemeSpec one = spec.stage();
  options.plan_only = true;
  options.pipeline = pipeline_stage(spec, config, batch, seq, stage, options.recompute);
  const PipelineStage& ps = options.pipeline;
  CpuBackend backend;  // a plan allocates nothing
  ProcessGrid grid = ProcessGrid::plan(scheme_row(one.scheme).grid_shape(one), coords);
  const std::unique_ptr<SchemeContext<T>> context = make_context<T>(one, grid, backend);
  Gpt<T> model(*context, config, batch / p.micro, seq, options);
  cost::Tally t;
  for (int m = 0; m < p.micro; ++m) {
    model.price(t, Phase::forward);
    model.price(t, Phase::backward);
  }
  const cost::u64 data = u(one.data), d = u(coords.data), e = sizeof(T);
  if (data > 1) {
    if (ps.last()) t.all_reduce(CommAxis::data, 1, data, d, sizeof(double));
    for (const std::uint64_t count : model.data_bucket_elements())
      if (count > 0) t.all_reduce(CommAxis::data, count, data, d, e);
    if (one.zero > 0 && optimizer_step)
      t.all_gather(CommAxis::data,
                   u(ParameterStore<T>::padded_elements(model.parameters(), one.data)) / data, data,
                   e);
  }
  if (p.stages > 1) {
    const cost::u64 message = u(model.stage_message_elements()) * e * u(p.micro);
    const cost::u64 neighbours = (ps.first() ? 0 : 1) + (ps.last() ? 0 : 1);
    const cost::u64 exchange = u(model.stage_exchange_elements()) * e;
    TrafficCounter& a = t.t[CommAxis::pipe];
    a.bytes_sent += neighbours * message + exchange;
    a.bytes_received += neighbours * message + exchange;
    // a send and a receive each way per microbatch, both of the exchange
    a.calls += neighbours * 2 * u(p.micro) + (exchange > 0 ? 2 : 0);
    t.broadcast(CommAxis::pipe, 1, u(p.stages), ps.last(), sizeof(double));
  }
  return t.t;
}

}  // namespace

TrafficCounters predict_step_traffic(const SchemeSpec& spec, const GptConfig& config, index_t batch,
                                     index_t seq, const GptOptions& options, DType dtype,
                                     const GridCoords& coords, bool optimizer_step, int stage) {
  if (spec.pipeline.active()) {
    if (dtype == DType::f64)
      return pipeline_traffic<double>(spec, config, batch, seq, options, stage, coords,
                                      optimizer_step);
    if (dtype == DType::bf16)
      return pipeline_traffic<bf16>(spec, config, batch, seq, options, stage, coords,
                                    optimizer_step);
    return pipeline_traffic<float>(spec, config, batch, seq, options, stage, coords,
                                   optimizer_step);
  }
  const auto u = [](auto v) { return static_cast<cost::u64>(v); };
  const cost::u64 data = u(spec.data), d = u(coords.data), e = u(size_of(dtype));
  cost::Tally t;
  const detail::Buckets b =
      detail::walk_step(spec, config, batch, seq, options, dtype, coords, t, nullptr);
  // The data axis: the loss and each gradient bucket (ln_f, every block,
  // the embedding) all-reduced over the data groups; a bucket this rank
  // holds no element of (2D: ln_f off mesh row 0) is not all-reduced.
  // zero=2, 3: each bucket (a unit, padded to D pieces) reduce-scattered;
  // zero=3 also every unit's values all-gathered in forward, the blocks not
  // still held from forward again in backward.
  if (data > 1) {
    t.all_reduce(CommAxis::data, 1, data, d, sizeof(double));
    const std::vector<detail::Buckets::Span> spans = b.spans(u(config.n_layer));
    for (const detail::Buckets::Span& s : spans) {
      if (s.count == 0) continue;
      if (spec.zero >= 2) {
        t.reduce_scatter(CommAxis::data, detail::Buckets::piece(s, data), data, e);
        if (spec.zero >= 3) t.all_gather(CommAxis::data, detail::Buckets::piece(s, data), data, e);
        // zero=2: after the optimizer's step, every group's piece of the
        // unit all-gathered into the whole values (all_gather_updates)
        if (spec.zero == 2 && optimizer_step)
          t.all_gather(CommAxis::data, detail::Buckets::piece(s, data), data, e);
      } else {
        t.all_reduce(CommAxis::data, s.count, data, d, e);
      }
    }
    if (spec.zero >= 3)  // spans: ln_f, block n-1 .. 0, the embedding
      for (cost::u64 k = 0, again = b.regathered_blocks(u(config.n_layer)); k < again; ++k)
        t.all_gather(CommAxis::data, detail::Buckets::piece(spans[spans.size() - 2 - k], data),
                     data, e);
    // zero=1: after the optimizer's step on its chunk, every data group's
    // updated chunk all-gathered (Trainer, all_gather_updates)
    if (spec.zero == 1 && optimizer_step)
      t.all_gather(CommAxis::data, b.parameters / data, data, e);
    // zero=2: the gradient norm's sum over the data groups (clip_grad_norm)
    if (spec.zero >= 2 && optimizer_step) t.all_reduce(CommAxis::data, 2, data, d, sizeof(double));
  }
  return t.t;
}

}  // namespace summa::model

#include "step.hpp"

#include "summa/backend/cpu_backend.hpp"
#include "summa/layers/gpt.hpp"
#include "summa/parallel/scheme.hpp"
#include "summa/schemes/registry.hpp"

namespace summa::model::detail {

namespace {
template <class T>
Buckets walk(const SchemeSpec& spec, const GptConfig& config, index_t batch, index_t seq,
             GptOptions options, const GridCoords& coords, cost::Tally& t,
             std::vector<StepOp>* ops) {
  options.plan_only = true;
  CpuBackend backend;  // a plan allocates nothing
  ProcessGrid grid = ProcessGrid::plan(scheme_row(spec.scheme).grid_shape(spec), coords);
  const std::unique_ptr<SchemeContext<T>> context = make_context<T>(spec, grid, backend);
  Gpt<T> model(*context, config, batch, seq, options);
  t.ops = ops;
  model.price(t, Phase::forward);
  model.price(t, Phase::backward);
  t.ops = nullptr;
  t.log = nullptr;
  const std::vector<std::uint64_t> b = model.data_bucket_elements();
  const index_t multiple = spec.zero > 0 ? spec.data : 1;
  return {.ln_f = b.front(),
          .block = b.size() > 2 ? b[1] : 0,
          .embedding = b.back(),
          .parameters =
              static_cast<u64>(ParameterStore<T>::padded_elements(model.parameters(), multiple)),
          .defers_gradients = context->defers_gradients(),
          .block_value_slots = context->prefetches_weights() ? 3U : 2U};
}
}  // namespace

Buckets walk_step(const SchemeSpec& spec, const GptConfig& config, index_t batch, index_t seq,
                  GptOptions options, DType dtype, const GridCoords& coords, cost::Tally& t,
                  std::vector<StepOp>* ops) {
  if (const auto error = pipeline_refused(spec, "the traffic and step-time models"))
    throw Error(*error);
  if (dtype == DType::f64) return walk<double>(spec, config, batch, seq, options, coords, t, ops);
  if (dtype == DType::bf16) return walk<bf16>(spec, config, batch, seq, options, coords, t, ops);
  return walk<float>(spec, config, batch, seq, options, coords, t, ops);
}

}  // namespace summa::model::detail

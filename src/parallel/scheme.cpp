#include "summa/parallel/scheme.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "summa/parallel/pipeline.hpp"
#include "summa/schemes/registry.hpp"

namespace summa {

std::optional<std::string> pipeline_refused(const SchemeSpec& spec, std::string_view what) {
  if (!spec.pipeline.active()) return std::nullopt;
  return fmt::format(
      "scheme '{}': {} does not run a pipeline axis (pipe=P:micro=M); pipelines train through "
      "the summa::Trainer and PipelineGpt APIs for now (docs/training.md, \"Pipelines\")",
      spec.str(), what);
}

ProcessGrid make_grid(MPI_Comm comm, const SchemeSpec& spec, GridOptions options) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  std::optional<std::string> error =
      pipeline_refused(spec, "a single grid (make_grid, ParallelGpt)");
  if (!error && size != spec.ranks())
    error = fmt::format("scheme '{}' needs {} ranks, the communicator has {}", spec.str(),
                        spec.ranks(), size);
  agree_on(comm, error);
  return scheme_row(spec.scheme).make_grid(comm, spec, options);
}

namespace {

// A sharded data axis splits the parameters' packed buffers into equal chunks.
GptOptions sharded(GptOptions options, const SchemeSpec& spec) {
  if (spec.zero > 0) options.parameter_multiple = spec.data;
  options.shard_gradients = spec.zero >= 2;
  options.shard_parameters = spec.zero >= 3;
  return options;
}

}  // namespace

template <class T>
ParallelGpt<T>::ParallelGpt(MPI_Comm comm, const SchemeSpec& spec, Backend& backend,
                            const GptConfig& config, index_t batch, index_t seq, GptOptions options,
                            GridOptions grid)
    : spec_(spec),
      grid_(make_grid(comm, spec, grid)),
      scheme_(make_context<T>(spec, grid_, backend)),
      model_(std::make_unique<Gpt<T>>(*scheme_, config, batch, seq, sharded(options, spec))) {}

template <class T>
ParallelGpt<T>::~ParallelGpt() = default;

index_t batch_granularity(const SchemeSpec& spec) {
  return static_cast<index_t>(spec.pipeline.micro) * spec.data *
         scheme_row(spec.scheme).sequence_split(spec);
}

template <class T>
MemoryReport plan_memory(MPI_Comm comm, const SchemeSpec& spec, Backend& backend,
                         const GptConfig& config, index_t batch, index_t seq, GptOptions options,
                         GridOptions grid) {
  options.plan_only = true;
  if (spec.pipeline.active()) {  // this rank's stage
    const PipelineGpt<T> pipe(comm, spec, backend, config, batch, seq, options, grid);
    return pipe.memory_report();
  }
  ParallelGpt<T> run(comm, spec, backend, config, batch, seq, options, grid);
  return run.model().memory_report();
}

template <class T>
MemoryReport plan_memory(const SchemeSpec& spec, Backend& backend, const GptConfig& config,
                         index_t batch, index_t seq, const GridCoords& coords, GptOptions options) {
  options.plan_only = true;
  if (const auto error = pipeline_refused(spec, "the memory planner")) throw Error(*error);
  ProcessGrid grid = ProcessGrid::plan(scheme_row(spec.scheme).grid_shape(spec), coords);
  const std::unique_ptr<SchemeContext<T>> context = make_context<T>(spec, grid, backend);
  const Gpt<T> model(*context, config, batch, seq, sharded(options, spec));
  return model.memory_report();
}

namespace {
// The coordinates of one axis of n that plan_memory_busiest visits: all of
// them, or the first and the last.
std::vector<int> axis_coordinates(int n, bool every) {
  if (every) {
    std::vector<int> all(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) all[static_cast<std::size_t>(i)] = i;
    return all;
  }
  return n > 1 ? std::vector<int>{0, n - 1} : std::vector<int>{0};
}
}  // namespace

template <class T>
RankMemory plan_memory_busiest(const SchemeSpec& spec, Backend& backend, const GptConfig& config,
                               index_t batch, index_t seq, GptOptions options,
                               std::int64_t every_rank_up_to) {
  if (spec.pipeline.active()) {  // each stage's busiest rank; the busiest of them
    std::optional<RankMemory> busiest;
    for (int s = 0; s < spec.pipeline.stages; ++s) {
      GptOptions stage = options;
      stage.pipeline = pipeline_stage(spec, config, batch, seq, s, options.recompute);
      RankMemory r = plan_memory_busiest<T>(
          spec.stage(), backend, config, batch / spec.pipeline.micro, seq, stage, every_rank_up_to);
      r.stage = s;
      if (!busiest || r.report.total() > busiest->report.total()) busiest = std::move(r);
    }
    return std::move(*busiest);
  }
  const GridShape shape = scheme_row(spec.scheme).grid_shape(spec);
  const bool every =
      static_cast<std::int64_t>(shape.depth) * shape.rows * shape.cols <= every_rank_up_to;
  std::optional<RankMemory> busiest;
  for (int depth : axis_coordinates(shape.depth, every))
    for (int row : axis_coordinates(shape.rows, every))
      for (int col : axis_coordinates(shape.cols, every)) {
        const GridCoords at{.data = 0, .depth = depth, .row = row, .col = col};
        MemoryReport r = plan_memory<T>(spec, backend, config, batch, seq, at, options);
        if (!busiest || r.total() > busiest->report.total()) busiest = RankMemory{at, std::move(r)};
      }
  return std::move(*busiest);
}

template <class T>
index_t largest_batch(MPI_Comm comm, const SchemeSpec& spec, Backend& backend,
                      const GptConfig& config, index_t seq, GptOptions options,
                      std::size_t budget_bytes, index_t max_batch, GridOptions grid) {
  const index_t step = batch_granularity(spec);
  const auto fits = [&](index_t units) {
    const MemoryReport r =
        plan_memory<T>(comm, spec, backend, config, units * step, seq, options, grid);
    unsigned long long total = r.total();
    MPI_Allreduce(MPI_IN_PLACE, &total, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, comm);
    return total <= budget_bytes;
  };
  const index_t max_units = max_batch / step;
  if (max_units < 1 || !fits(1)) return 0;
  index_t good = 1, bad = 2;
  while (bad <= max_units && fits(bad)) {
    good = bad;
    bad *= 2;
  }
  if (bad > max_units) {
    if (fits(max_units)) return max_units * step;
    bad = max_units;
  }
  while (bad - good > 1) {
    const index_t mid = good + (bad - good) / 2;
    (fits(mid) ? good : bad) = mid;
  }
  return good * step;
}

template class ParallelGpt<float>;
template MemoryReport plan_memory<float>(const SchemeSpec&, Backend&, const GptConfig&, index_t,
                                         index_t, const GridCoords&, GptOptions);
template RankMemory plan_memory_busiest<float>(const SchemeSpec&, Backend&, const GptConfig&,
                                               index_t, index_t, GptOptions, std::int64_t);
template class ParallelGpt<double>;
template MemoryReport plan_memory<double>(const SchemeSpec&, Backend&, const GptConfig&, index_t,
                                          index_t, const GridCoords&, GptOptions);
template RankMemory plan_memory_busiest<double>(const SchemeSpec&, Backend&, const GptConfig&,
                                                index_t, index_t, GptOptions, std::int64_t);
template class ParallelGpt<bf16>;
template MemoryReport plan_memory<bf16>(const SchemeSpec&, Backend&, const GptConfig&, index_t,
                                        index_t, const GridCoords&, GptOptions);
template RankMemory plan_memory_busiest<bf16>(const SchemeSpec&, Backend&, const GptConfig&,
                                              index_t, index_t, GptOptions, std::int64_t);
template MemoryReport plan_memory<float>(MPI_Comm, const SchemeSpec&, Backend&, const GptConfig&,
                                         index_t, index_t, GptOptions, GridOptions);
template MemoryReport plan_memory<double>(MPI_Comm, const SchemeSpec&, Backend&, const GptConfig&,
                                          index_t, index_t, GptOptions, GridOptions);
template index_t largest_batch<float>(MPI_Comm, const SchemeSpec&, Backend&, const GptConfig&,
                                      index_t, GptOptions, std::size_t, index_t, GridOptions);
template index_t largest_batch<double>(MPI_Comm, const SchemeSpec&, Backend&, const GptConfig&,
                                       index_t, GptOptions, std::size_t, index_t, GridOptions);
template MemoryReport plan_memory<bf16>(MPI_Comm, const SchemeSpec&, Backend&, const GptConfig&,
                                        index_t, index_t, GptOptions, GridOptions);
template index_t largest_batch<bf16>(MPI_Comm, const SchemeSpec&, Backend&, const GptConfig&,
                                     index_t, GptOptions, std::size_t, index_t, GridOptions);

}  // namespace summa

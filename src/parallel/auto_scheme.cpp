#include "summa/parallel/auto_scheme.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <thread>

#include "summa/core/error.hpp"
#include "summa/parallel/memory_check.hpp"
#include "summa/schemes/megatron1d/spec.hpp"
#include "summa/schemes/registry.hpp"

namespace summa {

int ranks_per_device(MPI_Comm comm, const std::string& domain) {
  int share = 1;
  if (domain == "host") {  // CpuBackend: the node's ranks over its cores
    MPI_Comm node = MPI_COMM_NULL;
    MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    int local = 1;
    MPI_Comm_size(node, &local);
    MPI_Comm_free(&node);
    const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    share = (local + cores - 1) / cores;
  } else {  // a device: the node's ranks on this one (its memory domain)
    share = ranks_in_memory_domain(comm, domain);
  }
  MPI_Allreduce(MPI_IN_PLACE, &share, 1, MPI_INT, MPI_MAX, comm);
  return share;
}

std::vector<SchemeSpec> candidate_schemes(int ranks, const GptOptions& options) {
  std::vector<SchemeSpec> all = schemes_for(ranks);
  if (options.inference) return all;  // no optimizer state, no checkpoints
  const std::size_t listed = all.size();
  // the data axis sharded: the optimizer state (zero=1), the gradients too
  // (zero=2), then the parameters too (zero=3)
  for (const int level : {1, 2, 3})
    for (std::size_t i = 0; i < listed; ++i) {
      if (all[i].data == 1) continue;
      SchemeSpec sharded = all[i];
      sharded.zero = level;
      all.push_back(std::move(sharded));
    }
  if (options.recompute != Recompute::full) return all;
  for (std::size_t i = 0; i < listed; ++i) {
    if (!all[i].holds<Megatron1DSpec>()) continue;
    const Megatron1DSpec& o = all[i].as<Megatron1DSpec>();
    if (o.p == 1 || o.sequence_parallel) continue;
    SchemeSpec dc = all[i];
    dc.as<Megatron1DSpec>().distribute_checkpoints = true;
    all.push_back(std::move(dc));
  }
  return all;
}

std::vector<SchemeSpec> candidate_pipelines(int ranks, const GptConfig& config, index_t batch,
                                            const GptOptions& options,
                                            const AutoSchemeOptions& auto_options) {
  std::vector<SchemeSpec> out;
  if (!auto_options.pipelines || options.inference) return out;
  for (int p = 2; p <= std::min({ranks, auto_options.max_stages, config.n_layer}); ++p) {
    if (ranks % p != 0) continue;
    for (const SchemeSpec& stage : candidate_schemes(ranks / p, options)) {
      if (stage.zero > 1) continue;  // what a stage runs
      // microbatches of k times the stage's granularity (k sequences per
      // data group and batch split): the two largest k of 8, 4, 2, 1 that
      // leave at least 2P of them (at most a third of the flush idle; the
      // smaller one holds less memory)
      const index_t unit = batch_granularity(stage);
      int taken = 0;
      for (const index_t k : {8, 4, 2, 1}) {
        const index_t m = batch % (unit * k) == 0 ? batch / (unit * k) : 0;
        if (m < 2 * p || m > std::numeric_limits<int>::max()) continue;
        SchemeSpec spec = stage;
        spec.pipeline.stages = p;
        spec.pipeline.micro = static_cast<int>(m);
        out.push_back(std::move(spec));
        if (++taken == 2) break;
      }
    }
  }
  return out;
}

template <class T>
std::vector<SchemeCandidate> rank_schemes(int ranks, Backend& backend, const GptConfig& config,
                                          index_t batch, index_t seq, const GptOptions& options,
                                          const model::Machine& machine,
                                          const AutoSchemeOptions& auto_options) {
  std::vector<SchemeSpec> specs = candidate_schemes(ranks, options);
  for (SchemeSpec& p : candidate_pipelines(ranks, config, batch, options, auto_options))
    specs.push_back(std::move(p));
  std::vector<SchemeCandidate> all;
  for (const SchemeSpec& spec : specs) {
    SchemeCandidate c{.spec = spec, .rejected = {}, .memory_bytes = 0, .busiest = {}, .time = {}};
    try {  // the scheme's own checks, as a launch would make them
      const RankMemory plan = plan_memory_busiest<T>(spec, backend, config, batch, seq, options);
      // a sharded data axis (zero=1, 2, 3) keeps 1/data of the optimizer state
      c.memory_bytes = plan.report.total() +
                       plan.report.parameter_elements * auto_options.state_bytes_per_parameter /
                           (spec.zero > 0 ? spec.data : 1) +
                       auto_options.state_bytes_fixed;
      c.busiest = plan.coords;
      if (spec.pipeline.active()) {
        c.pipeline = model::predict_pipeline_step_time(spec, config, batch, seq, options,
                                                       dtype_v<T>, machine, auto_options.time);
        c.time.step_s = c.pipeline->step_s;
      } else {
        c.time = model::predict_step_time(spec, config, batch, seq, options, dtype_v<T>, machine,
                                          auto_options.time);
      }
      if (c.memory_bytes > auto_options.budget_bytes)
        c.rejected = fmt::format("{:.1f} MiB per rank exceeds the budget of {:.1f} MiB",
                                 static_cast<double>(c.memory_bytes) / (1 << 20),
                                 static_cast<double>(auto_options.budget_bytes) / (1 << 20));
    } catch (const Error& e) {
      c.rejected = e.what();
    }
    all.push_back(std::move(c));
  }
  std::stable_sort(all.begin(), all.end(), [](const SchemeCandidate& a, const SchemeCandidate& b) {
    if (a.rejected.empty() != b.rejected.empty()) return a.rejected.empty();
    return a.rejected.empty() && a.time.step_s < b.time.step_s;
  });
  return all;
}

template <class T>
std::vector<SchemeCandidate> rank_schemes(MPI_Comm comm, Backend& backend, const GptConfig& config,
                                          index_t batch, index_t seq, const GptOptions& options,
                                          const model::Machine& machine,
                                          const AutoSchemeOptions& auto_options,
                                          GridOptions /*grid*/) {
  int ranks = 1;
  check_mpi(MPI_Comm_size(comm, &ranks), "MPI_Comm_size");
  return rank_schemes<T>(ranks, backend, config, batch, seq, options, machine, auto_options);
}

template std::vector<SchemeCandidate> rank_schemes<float>(int, Backend&, const GptConfig&, index_t,
                                                          index_t, const GptOptions&,
                                                          const model::Machine&,
                                                          const AutoSchemeOptions&);
template std::vector<SchemeCandidate> rank_schemes<float>(MPI_Comm, Backend&, const GptConfig&,
                                                          index_t, index_t, const GptOptions&,
                                                          const model::Machine&,
                                                          const AutoSchemeOptions&, GridOptions);
template std::vector<SchemeCandidate> rank_schemes<double>(int, Backend&, const GptConfig&, index_t,
                                                           index_t, const GptOptions&,
                                                           const model::Machine&,
                                                           const AutoSchemeOptions&);
template std::vector<SchemeCandidate> rank_schemes<double>(MPI_Comm, Backend&, const GptConfig&,
                                                           index_t, index_t, const GptOptions&,
                                                           const model::Machine&,
                                                           const AutoSchemeOptions&, GridOptions);
template std::vector<SchemeCandidate> rank_schemes<bf16>(int, Backend&, const GptConfig&, index_t,
                                                         index_t, const GptOptions&,
                                                         const model::Machine&,
                                                         const AutoSchemeOptions&);
template std::vector<SchemeCandidate> rank_schemes<bf16>(MPI_Comm, Backend&, const GptConfig&,
                                                         index_t, index_t, const GptOptions&,
                                                         const model::Machine&,
                                                         const AutoSchemeOptions&, GridOptions);

}  // namespace summa

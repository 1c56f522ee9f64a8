#pragma once
/// \file scheme.hpp
/// The model built from a scheme (schemes/spec.hpp: a tensor-parallel scheme
/// and its grid as one runtime value, parsed from a short text): the same
/// GPT configuration and the same training-step code under any scheme.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "summa/backend/backend.hpp"
#include "summa/grid/process_grid.hpp"
#include "summa/layers/gpt.hpp"
#include "summa/schemes/spec.hpp"
#include "summa/summa/engine.hpp"

namespace summa {

/// The grid of a scheme on `comm` (whose size must be spec.ranks(); the same
/// error on every rank otherwise). A scheme with a pipeline axis
/// (spec.pipeline.active()) has no single grid: refused (PipelineGpt builds
/// one per stage).
ProcessGrid make_grid(MPI_Comm comm, const SchemeSpec& spec, GridOptions options = {});

/// The error a consumer of single-grid schemes (`what`) gives a spec with a
/// pipeline axis, or nothing.
std::optional<std::string> pipeline_refused(const SchemeSpec& spec, std::string_view what);

/// A distributed GPT under a scheme: owns the grid, the scheme's layer
/// context (schemes/registry.hpp; for 2D with its SUMMA engine, whose options
/// are the spec's Summa2DSpec::summa) and the model. Collective over `comm`.
///
/// `grid` chooses the communicators: the default (MPI) for CpuBackend; for
/// a CudaBackend, CommBackend::nccl (one GPU per rank) or
/// CommBackend::mpi_staged (ranks may share a GPU) with
/// compute_stream = CudaBackend::stream() — a device backend with MPI
/// communicators is refused (summa::Error on every rank).
template <class T>
class ParallelGpt {
 public:
  ParallelGpt(MPI_Comm comm, const SchemeSpec& spec, Backend& backend, const GptConfig& config,
              index_t batch, index_t seq, GptOptions options = {}, GridOptions grid = {});
  ~ParallelGpt();
  ParallelGpt(const ParallelGpt&) = delete;
  ParallelGpt& operator=(const ParallelGpt&) = delete;

  const SchemeSpec& spec() const { return spec_; }
  ProcessGrid& grid() { return grid_; }
  /// The scheme's layer factory (its layers make up the model).
  SchemeContext<T>& scheme() { return *scheme_; }
  Gpt<T>& model() { return *model_; }

 private:
  SchemeSpec spec_;
  ProcessGrid grid_;
  std::unique_ptr<SchemeContext<T>> scheme_;
  std::unique_ptr<Gpt<T>> model_;
};

/// Sequences per data group must be a multiple of this for the scheme
/// (2D: q, 3D: Z, 1D: 1; 1D with sp=on: p, so that the token rows divide
/// for any sequence length); a global batch, of data times that (times the
/// microbatches with a pipeline axis).
index_t batch_granularity(const SchemeSpec& spec);

/// The memory planner: the report (capacities of parameters, gradients and
/// every step buffer on this rank) of the GPT `spec` would build, computed
/// from the layers' analytic sizes without allocating them
/// (GptOptions::plan_only). Collective over `comm`. `grid` as for
/// ParallelGpt (the plan does not depend on it; an mpi_staged grid allocates
/// its pinned staging buffers while the plan is made). With a pipeline axis,
/// this rank's stage's (a plan-only PipelineGpt).
template <class T>
MemoryReport plan_memory(MPI_Comm comm, const SchemeSpec& spec, Backend& backend,
                         const GptConfig& config, index_t batch, index_t seq,
                         GptOptions options = {}, GridOptions grid = {});

/// The memory planner without a launch: the report of the rank at `coords`
/// of the grid `spec` builds, from a model built on a plan-only grid
/// (ProcessGrid::plan) — no MPI, no other rank, nothing allocated; the same
/// report plan_memory gives that rank inside a launch. Throws summa::Error
/// (the scheme's own message) for a configuration the scheme refuses.
template <class T>
MemoryReport plan_memory(const SchemeSpec& spec, Backend& backend, const GptConfig& config,
                         index_t batch, index_t seq, const GridCoords& coords,
                         GptOptions options = {});

/// The rank with the largest planned total and its report.
struct RankMemory {
  GridCoords coords;  ///< in its stage's grid
  MemoryReport report;
  int stage = 0;  ///< its pipeline stage (0 without a pipeline)
};

/// Tensor groups up to this many ranks are planned rank by rank.
inline constexpr std::int64_t plan_every_rank_up_to = 64;

/// The busiest rank of `spec` (largest MemoryReport::total(); the first in
/// rank order on ties), planned without a launch, in one data group (data
/// replicas plan alike): every rank of a tensor group of at most
/// `every_rank_up_to` ranks; in a larger one, the first and the last
/// coordinate of each axis (up to 8 ranks). That is exact for the shipped
/// schemes, whose shards are even (the schemes refuse a model that does
/// not divide) and whose replicated pieces (biases, LayerNorm) sit on an
/// axis's first or last rank: tests/schemes/test_schemes.cpp checks it
/// against a launch of 1 to 9 ranks. Roughly 0.2-0.5 ms a rank for a large
/// GPT. With a pipeline axis: each stage's busiest rank (the stage's model
/// for one microbatch and its slots), and the busiest of those, with its
/// stage in RankMemory::stage. Throws as plan_memory.
template <class T>
RankMemory plan_memory_busiest(const SchemeSpec& spec, Backend& backend, const GptConfig& config,
                               index_t batch, index_t seq, GptOptions options = {},
                               std::int64_t every_rank_up_to = plan_every_rank_up_to);

/// Largest global batch, a multiple of batch_granularity(spec) and at most
/// `max_batch`, whose planned total (MemoryReport::total(), the largest over
/// ranks) fits in `budget_bytes` per rank; 0 when even the smallest does not.
/// Memory grows with the batch, so this is a doubling then bisection search
/// over plans. Collective over `comm`; `grid` as for plan_memory.
template <class T>
index_t largest_batch(MPI_Comm comm, const SchemeSpec& spec, Backend& backend,
                      const GptConfig& config, index_t seq, GptOptions options,
                      std::size_t budget_bytes, index_t max_batch, GridOptions grid = {});

extern template class ParallelGpt<float>;
extern template MemoryReport plan_memory<float>(const SchemeSpec&, Backend&, const GptConfig&,
                                                index_t, index_t, const GridCoords&, GptOptions);
extern template RankMemory plan_memory_busiest<float>(const SchemeSpec&, Backend&, const GptConfig&,
                                                      index_t, index_t, GptOptions, std::int64_t);
extern template class ParallelGpt<double>;
extern template MemoryReport plan_memory<double>(const SchemeSpec&, Backend&, const GptConfig&,
                                                 index_t, index_t, const GridCoords&, GptOptions);
extern template RankMemory plan_memory_busiest<double>(const SchemeSpec&, Backend&,
                                                       const GptConfig&, index_t, index_t,
                                                       GptOptions, std::int64_t);
extern template class ParallelGpt<bf16>;
extern template MemoryReport plan_memory<bf16>(const SchemeSpec&, Backend&, const GptConfig&,
                                               index_t, index_t, const GridCoords&, GptOptions);
extern template RankMemory plan_memory_busiest<bf16>(const SchemeSpec&, Backend&, const GptConfig&,
                                                     index_t, index_t, GptOptions, std::int64_t);
extern template MemoryReport plan_memory<float>(MPI_Comm, const SchemeSpec&, Backend&,
                                                const GptConfig&, index_t, index_t, GptOptions,
                                                GridOptions);
extern template MemoryReport plan_memory<double>(MPI_Comm, const SchemeSpec&, Backend&,
                                                 const GptConfig&, index_t, index_t, GptOptions,
                                                 GridOptions);
extern template index_t largest_batch<float>(MPI_Comm, const SchemeSpec&, Backend&,
                                             const GptConfig&, index_t, GptOptions, std::size_t,
                                             index_t, GridOptions);
extern template index_t largest_batch<double>(MPI_Comm, const SchemeSpec&, Backend&,
                                              const GptConfig&, index_t, GptOptions, std::size_t,
                                              index_t, GridOptions);
extern template MemoryReport plan_memory<bf16>(MPI_Comm, const SchemeSpec&, Backend&,
                                               const GptConfig&, index_t, index_t, GptOptions,
                                               GridOptions);
extern template index_t largest_batch<bf16>(MPI_Comm, const SchemeSpec&, Backend&, const GptConfig&,
                                            index_t, GptOptions, std::size_t, index_t, GridOptions);

}  // namespace summa

#pragma once
/// \file scheme.hpp
/// The model built from a scheme (schemes/spec.hpp: a tensor-parallel scheme
/// and its grid as one runtime value, parsed from a short text): the same
/// GPT configuration and the same training-step code under any scheme.

#include <memory>
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
/// error on every rank otherwise).
ProcessGrid make_grid(MPI_Comm comm, const SchemeSpec& spec, GridOptions options = {});

/// A distributed GPT under a scheme: owns the grid, the scheme's layer
/// context (schemes/registry.hpp; for 2D with its SUMMA engine, whose options
/// are spec.summa) and the model. Collective over `comm`.
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
/// (2D: q, 3D: Z, 1D: 1); a global batch, of data times that.
index_t batch_granularity(const SchemeSpec& spec);

/// The memory planner: the report (capacities of parameters, gradients and
/// every step buffer on this rank) of the GPT `spec` would build, computed
/// from the layers' analytic sizes without allocating them
/// (GptOptions::plan_only). Collective over `comm`. `grid` as for
/// ParallelGpt (the plan does not depend on it; an mpi_staged grid allocates
/// its pinned staging buffers while the plan is made).
template <class T>
MemoryReport plan_memory(MPI_Comm comm, const SchemeSpec& spec, Backend& backend,
                         const GptConfig& config, index_t batch, index_t seq,
                         GptOptions options = {}, GridOptions grid = {});

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
extern template class ParallelGpt<double>;
extern template class ParallelGpt<bf16>;
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

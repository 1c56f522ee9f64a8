#pragma once
/// \file scheme.hpp
/// A tensor-parallel scheme and its grid as one runtime value, parsed from a
/// short text, and the model built from it: the same GPT configuration and
/// the same training-step code under any scheme.
///
/// Grammar (items separated by commas, in any order, exactly one scheme):
///   1d:p=P          Megatron-LM 1D over P ranks
///   2d:q=Q          Optimus 2D SUMMA on a Q x Q mesh
///   3d:XxYxZ        AxoNN 3D parallel matrix multiply on an X x Y x Z grid
///   data=D          D data-parallel groups on top (default 1)
///   overlap=LIST    3D only: the AxoNN overlaps on, '+'-separated from
///                   oar, ors, oag, or 'none' (default: oar; see Axonn3DOptions)
/// e.g. "2d:q=3", "1d:p=4", "3d:2x2x2", "data=2,2d:q=2", "3d:1x1x4,overlap=oar+ors+oag".

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "summa/backend/backend.hpp"
#include "summa/grid/process_grid.hpp"
#include "summa/layers/gpt.hpp"
#include "summa/summa/engine.hpp"

namespace summa {

enum class Scheme { megatron1d, summa2d, axonn3d };

struct SchemeSpec {
  Scheme scheme = Scheme::summa2d;
  int p = 1;                   ///< 1D: ranks of the tensor group
  int q = 1;                   ///< 2D: mesh side
  int gx = 1, gy = 1, gz = 1;  ///< 3D: grid
  int data = 1;                ///< data-parallel groups
  /// 3D overlap switches (Axonn3DOptions: OAR, ORS, OAG).
  bool oar = true, ors = false, oag = false;

  /// Ranks of one tensor group (P, Q², X·Y·Z).
  std::int64_t tensor_ranks() const;
  /// All ranks: data · tensor_ranks() (64-bit; parse() refuses a spec whose
  /// product exceeds what an MPI communicator holds).
  std::int64_t ranks() const { return static_cast<std::int64_t>(data) * tensor_ranks(); }
  /// Canonical text, parseable back ("data=2,2d:q=2"; "data=1" omitted).
  std::string str() const;
  /// Throws summa::Error naming the offending item and the grammar.
  static SchemeSpec parse(std::string_view text);
  friend bool operator==(const SchemeSpec&, const SchemeSpec&) = default;
};

/// Every scheme (without a data axis and with every data factor) whose rank
/// count is exactly `ranks`: 1D at p = ranks / data, 2D when ranks / data is
/// a square, 3D for every factorisation X·Y·Z.
std::vector<SchemeSpec> schemes_for(int ranks);

/// The grid of a scheme on `comm` (whose size must be spec.ranks(); the same
/// error on every rank otherwise).
ProcessGrid make_grid(MPI_Comm comm, const SchemeSpec& spec, GridOptions options = {});

/// A distributed GPT under a scheme: owns the grid, the SUMMA engine (2D)
/// and the model. Collective over `comm`.
///
/// `grid` chooses the communicators: the default (MPI) for CpuBackend; for
/// a CudaBackend, CommBackend::nccl (one GPU per rank) or
/// CommBackend::mpi_staged (ranks may share a GPU) with
/// compute_stream = CudaBackend::stream() — a device backend with MPI
/// communicators is refused (summa::Error on every rank).
template <class T>
class ParallelGpt {
 public:
  ParallelGpt(MPI_Comm comm, const SchemeSpec& spec, Backend& backend,
              const reference::GptConfig& config, index_t batch, index_t seq,
              GptOptions options = {}, SummaOptions summa = {}, GridOptions grid = {});
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
  std::unique_ptr<SummaEngine> engine_;
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
                         const reference::GptConfig& config, index_t batch, index_t seq,
                         GptOptions options = {}, GridOptions grid = {});

/// Largest global batch, a multiple of batch_granularity(spec) and at most
/// `max_batch`, whose planned total (MemoryReport::total(), the largest over
/// ranks) fits in `budget_bytes` per rank; 0 when even the smallest does not.
/// Memory grows with the batch, so this is a doubling then bisection search
/// over plans. Collective over `comm`; `grid` as for plan_memory.
template <class T>
index_t largest_batch(MPI_Comm comm, const SchemeSpec& spec, Backend& backend,
                      const reference::GptConfig& config, index_t seq, GptOptions options,
                      std::size_t budget_bytes, index_t max_batch, GridOptions grid = {});

extern template class ParallelGpt<float>;
extern template class ParallelGpt<double>;
extern template class ParallelGpt<bf16>;
extern template MemoryReport plan_memory<float>(MPI_Comm, const SchemeSpec&, Backend&,
                                                const reference::GptConfig&, index_t, index_t,
                                                GptOptions, GridOptions);
extern template MemoryReport plan_memory<double>(MPI_Comm, const SchemeSpec&, Backend&,
                                                 const reference::GptConfig&, index_t, index_t,
                                                 GptOptions, GridOptions);
extern template index_t largest_batch<float>(MPI_Comm, const SchemeSpec&, Backend&,
                                             const reference::GptConfig&, index_t, GptOptions,
                                             std::size_t, index_t, GridOptions);
extern template index_t largest_batch<double>(MPI_Comm, const SchemeSpec&, Backend&,
                                              const reference::GptConfig&, index_t, GptOptions,
                                              std::size_t, index_t, GridOptions);
extern template MemoryReport plan_memory<bf16>(MPI_Comm, const SchemeSpec&, Backend&,
                                               const reference::GptConfig&, index_t, index_t,
                                               GptOptions, GridOptions);
extern template index_t largest_batch<bf16>(MPI_Comm, const SchemeSpec&, Backend&,
                                            const reference::GptConfig&, index_t, GptOptions,
                                            std::size_t, index_t, GridOptions);

}  // namespace summa

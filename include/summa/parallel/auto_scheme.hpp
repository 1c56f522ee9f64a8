#pragma once
/// \file auto_scheme.hpp
/// `--scheme auto`: every scheme and factorisation of a rank count that
/// accepts a GPT configuration, with its planned memory per rank (the
/// memory planner, parallel/scheme.hpp) and its predicted step time (the
/// step-time model, model/step_time.hpp on a machine file), ranked fastest
/// first among those within a memory budget (docs/scaling.md).

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include <optional>

#include "summa/backend/backend.hpp"
#include "summa/grid/process_grid.hpp"
#include "summa/model/step_time.hpp"
#include "summa/parallel/scheme.hpp"

namespace summa {

struct SchemeCandidate {
  SchemeSpec spec;
  /// Empty when the scheme is a choice; otherwise why not: the scheme's
  /// own error for the configuration, or the planned memory over budget.
  std::string rejected;
  /// Planned total per rank (MemoryReport::total(), the largest over
  /// ranks) plus the optimizer state (AutoSchemeOptions).
  std::uint64_t memory_bytes = 0;
  /// The rank with that total (grid coordinates; data group 0).
  GridCoords busiest{};
  /// The predicted step (forward, backward, recomputation and, when
  /// asked, the optimizer); 0 when rejected by the scheme. For a pipeline,
  /// step_s alone (the schedule's step, `pipeline` has its parts).
  model::StepTime time;
  std::optional<model::PipelineStepTime> pipeline = {};
};

struct AutoSchemeOptions {
  /// Memory per rank the plan must fit in (bytes).
  std::uint64_t budget_bytes = 0;
  /// Optimizer state per parameter element of the rank's shards, counted
  /// with the plan against the budget: AdamW keeps two master_t<T>
  /// moments (8 bytes), plus an fp32 master copy under bf16 (12 bytes);
  /// divided by the data groups for a sharded data axis (zero=1).
  std::uint64_t state_bytes_per_parameter = 0;
  /// Optimizer state bytes per rank whatever the shards: an offloaded
  /// optimizer's staging buffers (offload_staging_bytes; its state per
  /// element is then 0, kept in the host pool).
  std::uint64_t state_bytes_fixed = 0;
  model::StepTimeOptions time = {};
  /// Also pipelines (rank_schemes): P stages for every P dividing the
  /// ranks, 2 <= P <= min(max_stages, n_layer), each stage any training
  /// candidate of ranks / P (zero <= 1: what a stage runs; dc=on under full recompute), the
  /// message-driven schedule over microbatches of k times the stage's
  /// batch granularity, for the two largest k of 8, 4, 2, 1 that leave at
  /// least 2P microbatches (none when no k does); under every recompute
  /// mode (without per-block checkpoints a stage keeps its blocks'
  /// activations per microbatch), not for inference.
  bool pipelines = true;
  int max_stages = 8;
};

/// The schemes a configuration search over `ranks` ranks considers: every
/// one of schemes_for; for training (not options.inference) also each with
/// a data axis sharded ("data=D:zero=1,..."), and with per-block checkpoints
/// (options.recompute == full) each plain 1D over p > 1 ranks with
/// distributed checkpoints ("1d:p=P,dc=on", as Megatron runs them), in
/// that order after schemes_for's.
std::vector<SchemeSpec> candidate_schemes(int ranks, const GptOptions& options);

/// The pipelines rank_schemes adds to candidate_schemes (see
/// AutoSchemeOptions::pipelines) for a GPT of `config` and a global batch
/// of `batch` sequences, in order of P, then of the stage's candidates.
std::vector<SchemeSpec> candidate_pipelines(int ranks, const GptConfig& config, index_t batch,
                                            const GptOptions& options,
                                            const AutoSchemeOptions& auto_options);

/// Every scheme of `ranks` ranks (candidate_schemes, then
/// candidate_pipelines) for a GPT of `config` with
/// global `batch` sequences of `seq` tokens: planned without a launch (the
/// busiest rank, plan_memory_busiest) and priced, the choices first,
/// fastest first (ties in the order of candidate_schemes), then the rejected
/// ones. No MPI: the same result wherever it is called, in milliseconds to
/// seconds (every rank of one tensor group is planned).
template <class T>
std::vector<SchemeCandidate> rank_schemes(int ranks, Backend& backend, const GptConfig& config,
                                          index_t batch, index_t seq, const GptOptions& options,
                                          const model::Machine& machine,
                                          const AutoSchemeOptions& auto_options);

/// The same for the communicator's size, called on every rank of `comm`
/// (nothing is communicated: every rank computes the same ranking). `grid`
/// is not used (the plan does not depend on the communicators); it stays
/// for the callers that pass it.
template <class T>
std::vector<SchemeCandidate> rank_schemes(MPI_Comm comm, Backend& backend, const GptConfig& config,
                                          index_t batch, index_t seq, const GptOptions& options,
                                          const model::Machine& machine,
                                          const AutoSchemeOptions& auto_options,
                                          GridOptions grid = {});

/// Ranks sharing one device on the busiest node of `comm`
/// (StepTimeOptions::ranks_per_device): with a backend on the host's memory
/// (CpuBackend, Backend::memory_domain "host") the node's ranks over its
/// cores, rounded up (an oversubscribed launch); with a device backend the
/// node's ranks on the same device (the same memory domain: several ranks
/// sharing one GPU over mpi_staged count each other; one GPU per rank gives
/// 1). Collective; the same on every rank. `domain`: this rank's
/// Backend::memory_domain.
int ranks_per_device(MPI_Comm comm, const std::string& domain);
inline int ranks_per_device(MPI_Comm comm, const Backend& backend) {
  return ranks_per_device(comm, backend.memory_domain());
}

extern template std::vector<SchemeCandidate> rank_schemes<float>(int, Backend&, const GptConfig&,
                                                                 index_t, index_t,
                                                                 const GptOptions&,
                                                                 const model::Machine&,
                                                                 const AutoSchemeOptions&);
extern template std::vector<SchemeCandidate> rank_schemes<float>(
    MPI_Comm, Backend&, const GptConfig&, index_t, index_t, const GptOptions&,
    const model::Machine&, const AutoSchemeOptions&, GridOptions);
extern template std::vector<SchemeCandidate> rank_schemes<double>(int, Backend&, const GptConfig&,
                                                                  index_t, index_t,
                                                                  const GptOptions&,
                                                                  const model::Machine&,
                                                                  const AutoSchemeOptions&);
extern template std::vector<SchemeCandidate> rank_schemes<double>(
    MPI_Comm, Backend&, const GptConfig&, index_t, index_t, const GptOptions&,
    const model::Machine&, const AutoSchemeOptions&, GridOptions);
extern template std::vector<SchemeCandidate> rank_schemes<bf16>(int, Backend&, const GptConfig&,
                                                                index_t, index_t, const GptOptions&,
                                                                const model::Machine&,
                                                                const AutoSchemeOptions&);
extern template std::vector<SchemeCandidate> rank_schemes<bf16>(
    MPI_Comm, Backend&, const GptConfig&, index_t, index_t, const GptOptions&,
    const model::Machine&, const AutoSchemeOptions&, GridOptions);

}  // namespace summa

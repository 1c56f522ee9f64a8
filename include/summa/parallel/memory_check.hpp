#pragma once
/// Sizes checked before memory: every program that builds a GPT from sizes a
/// user gave (flags, an HF config.json, a checkpoint manifest) asks here
/// first, so a configuration that cannot fit ends with the planner's message
/// (the bytes it needs and the budget) on every rank, never in bad_alloc or
/// minutes of growing memory.
///
/// Two stages: memory_lower_bound, from the sizes alone in floating point
/// (no overflow, no object built), refuses what is hopeless at once — the
/// planner itself builds a plan-only model whose layer objects take host
/// memory per block (about 5 kB), so a plan of 10^6 blocks would take GB;
/// then the planner (plan_memory) gives the exact per-rank figure, and for a
/// batch that does not fit, the largest that does.

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "summa/parallel/scheme.hpp"

namespace summa {

/// Host memory of one layer block's objects (descriptors, names, shard
/// pieces), an upper estimate of what was measured (about 5 kB a block on
/// x86-64) that memory_lower_bound counts per block.
inline constexpr double host_bytes_per_block = 8192;

/// Bytes a rank of a tensor group of `tensor_ranks` needs at least for
/// `config`: the parameters and, `training`, their gradients (element_bytes
/// each; `gradient_share` of them: 1/D for a data axis whose gradients are
/// sharded over D groups, zero=2), plus `state_bytes_per_parameter` of
/// optimizer state per element, all divided over the group; plus the
/// blocks' host objects. In double: any size (n_layer 2e9, vocab 2^31)
/// gives a finite figure. Validates `config` (GptConfig::validate).
double memory_lower_bound(std::int64_t tensor_ranks, const GptConfig& config,
                          std::size_t element_bytes, bool training,
                          double state_bytes_per_parameter, double gradient_share = 1);

/// Host memory this rank may use: the node's MemAvailable (/proc/meminfo)
/// shared by the ranks of `comm` on that node, the smallest over `comm`.
/// Collective. 0 where /proc/meminfo cannot be read.
double available_memory_per_rank(MPI_Comm comm);

/// The memory `backend` allocates from that this rank may use: its free
/// bytes (Backend::memory_free_bytes: the node's MemAvailable for the CPU,
/// the device's free memory for a GPU) shared by the ranks of `comm` on the
/// same node and memory domain (several ranks on one GPU share it), the
/// smallest over `comm`. Collective. 0 (nothing checked) when any rank
/// cannot tell.
double available_memory_per_rank(MPI_Comm comm, const Backend& backend);

/// The ranks of `comm` on this rank's node whose memory domain
/// (Backend::memory_domain, compared by its first 64 bytes: "host", a GPU's
/// UUID) is `domain`, this rank included. Collective over `comm`; each rank
/// gets its own node's and domain's count.
int ranks_in_memory_domain(MPI_Comm comm, const std::string& domain);

/// How a budget from available_memory_per_rank(comm, backend) is named in
/// errors: "available on this node" or "free on this device".
const char* available_memory_source(const Backend& backend);

/// The budget a program checks against and how it names it.
struct MemoryBudget {
  double bytes = 0;                      ///< per rank; 0: no budget (nothing is checked)
  std::string source;                    ///< e.g. "of --memory-budget", "available on this node"
  double state_bytes_per_parameter = 0;  ///< optimizer state per parameter element
  /// optimizer state bytes per rank besides: an offloaded optimizer's staging
  /// buffers (offload_staging_bytes)
  double state_bytes_fixed = 0;
  std::string batch_option = "--batch";  ///< the program's name for the global batch
};

/// "12.2 GB": `bytes` with a decimal prefix, three significant digits.
std::string human_bytes(double bytes);

/// The first stage of require_memory_fits alone: throws its message when
/// memory_lower_bound exceeds `budget` (for a choice among schemes, pass the
/// largest tensor group: the most optimistic). Collective over `comm`.
/// Returns the bound. `gradient_share` as for memory_lower_bound.
double require_lower_bound_fits(MPI_Comm comm, std::int64_t tensor_ranks, const GptConfig& config,
                                std::size_t element_bytes, bool training,
                                const MemoryBudget& budget, const std::string& program,
                                double gradient_share = 1);

/// Throws summa::CollectiveError (the same message on every rank of `comm`)
/// starting "<program>: " (nothing for an empty name), naming the bytes needed per rank and the
/// budget, when `config` at `batch` x `seq` under `spec` cannot fit `budget`: first against
/// memory_lower_bound (before anything is built), then against the busiest rank's plan_memory total
/// plus the optimizer state, adding the largest batch that fits. Returns the plan's total (plus
/// state) of this rank's busiest peer, or the lower bound when `budget.bytes` is 0 (then nothing is
/// planned). Collective over `comm`; `options` and `grid` as for plan_memory.
template <class T>
double require_memory_fits(MPI_Comm comm, const SchemeSpec& spec, Backend& backend,
                           const GptConfig& config, index_t batch, index_t seq,
                           const GptOptions& options, const GridOptions& grid,
                           const MemoryBudget& budget, const std::string& program);

}  // namespace summa

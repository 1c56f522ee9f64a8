#include "summa/parallel/memory_check.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "summa/backend/cpu_backend.hpp"
#include "summa/comm/consensus.hpp"

namespace summa {

namespace {
// The largest (op MPI_MAX) or smallest (MPI_MIN) `value` over `comm`, waited under the live
// watchdog.
double reduce_over(MPI_Comm comm, double value, MPI_Op op, const char* what) {
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Iallreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, op, comm, &request);
  wait_guarded(request, comm, what, sizeof value);
  return value;
}
// "<program>: ", or nothing for an empty name.
std::string prefix(const std::string& program) {
  return program.empty() ? std::string() : program + ": ";
}
}  // namespace

double memory_lower_bound(std::int64_t tensor_ranks, const GptConfig& config,
                          std::size_t element_bytes, bool training,
                          double state_bytes_per_parameter, double gradient_share) {
  config.validate();
  const double h = config.n_embd;
  // per block: c_attn 3h^2+3h, c_proj h^2+h, c_fc 4h^2+4h, c_proj 4h^2+h,
  // two LayerNorms 4h; then wte, wpe and ln_f
  const double per_block = 12 * h * h + 13 * h;
  const double parameters = config.n_layer * per_block +
                            (static_cast<double>(config.vocab_size) + config.n_positions) * h +
                            2 * h;
  const double per_element =
      static_cast<double>(element_bytes) * (training ? 1 + gradient_share : 1) +
      (training ? state_bytes_per_parameter : 0);
  return parameters * per_element / static_cast<double>(std::max<std::int64_t>(1, tensor_ranks)) +
         config.n_layer * host_bytes_per_block;
}

int ranks_in_memory_domain(MPI_Comm comm, const std::string& domain) {
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int local = 1;
  MPI_Comm_size(node, &local);
  constexpr std::size_t kKey = 64;  // longer keys compare by their first 64 bytes
  std::array<char, kKey> mine{};
  std::copy_n(domain.data(), std::min(domain.size(), kKey), mine.data());
  std::vector<char> all(kKey * static_cast<std::size_t>(local));
  MPI_Allgather(mine.data(), static_cast<int>(kKey), MPI_CHAR, all.data(), static_cast<int>(kKey),
                MPI_CHAR, node);
  MPI_Comm_free(&node);
  int count = 0;
  for (int r = 0; r < local; ++r)
    count +=
        std::equal(mine.begin(), mine.end(),
                   all.begin() + static_cast<std::ptrdiff_t>(r) * static_cast<std::ptrdiff_t>(kKey))
            ? 1
            : 0;
  return count;
}

namespace {

// `free` bytes of memory domain `domain` shared by the ranks of `comm` on
// this node with the same domain; the smallest over `comm`, 0 when any rank
// passes a negative `free` (not known).
double shared_per_rank(MPI_Comm comm, double free, const std::string& domain) {
  const int count = ranks_in_memory_domain(comm, domain);
  const double unknown = reduce_over(comm, free < 0 ? 1.0 : 0.0, MPI_MAX, "available memory");
  const double least = reduce_over(comm, free / count, MPI_MIN, "available memory");
  return unknown > 0 ? 0.0 : least;
}

}  // namespace

double available_memory_per_rank(MPI_Comm comm) {
  return shared_per_rank(comm, CpuBackend::host_available_bytes(), "host");
}

double available_memory_per_rank(MPI_Comm comm, const Backend& backend) {
  return shared_per_rank(comm, backend.memory_free_bytes(), backend.memory_domain());
}

const char* available_memory_source(const Backend& backend) {
  return backend.memory_domain() == "host" ? "available on this node" : "free on this device";
}

std::string human_bytes(double bytes) {
  const char* prefix[] = {"", "k", "M", "G", "T", "P", "E", "Z", "Y"};
  int k = 0;
  while (std::abs(bytes) >= 1000 && k < 8) {
    bytes /= 1000;
    ++k;
  }
  return fmt::format("{:.3g} {}B", bytes, prefix[k]);
}

double require_lower_bound_fits(MPI_Comm comm, std::int64_t tensor_ranks, const GptConfig& config,
                                std::size_t element_bytes, bool training,
                                const MemoryBudget& budget, const std::string& program,
                                double gradient_share) {
  std::optional<std::string> error;
  double bound = 0;
  try {
    bound = memory_lower_bound(tensor_ranks, config, element_bytes, training,
                               budget.state_bytes_per_parameter, gradient_share) +
            (training ? budget.state_bytes_fixed : 0);
  } catch (const Error& e) {
    error = prefix(program) + e.what();
  }
  if (!error && budget.bytes > 0 && bound > budget.bytes)
    error = fmt::format(
        "{}this model (n_layer={}, n_embd={}, vocab={}, n_positions={}) needs at least {} per "
        "rank for its parameters{} over {} tensor rank(s), more than the {} per rank {}; use "
        "fewer layers, a smaller hidden size or vocabulary, or more ranks",
        prefix(program), config.n_layer, config.n_embd, config.vocab_size, config.n_positions,
        human_bytes(bound),
        training ? (budget.state_bytes_per_parameter + budget.state_bytes_fixed > 0
                        ? ", gradients and optimizer state"
                        : " and gradients")
                 : "",
        tensor_ranks, human_bytes(budget.bytes), budget.source);
  agree_on(comm, error);
  return bound;
}

template <class T>
double require_memory_fits(MPI_Comm comm, const SchemeSpec& spec, Backend& backend,
                           const GptConfig& config, index_t batch, index_t seq,
                           const GptOptions& options, const GridOptions& grid,
                           const MemoryBudget& budget, const std::string& program) {
  const bool training = !options.inference;
  // a sharded data axis (zero=1, 2, 3) keeps 1/data of the optimizer state per rank
  const double state =
      training ? budget.state_bytes_per_parameter / (spec.zero > 0 ? spec.data : 1) : 0;
  {
    // the planner sizes [batch·seq, width] arrays in 64 bits: a product past
    // that would wrap (a manifest's batch 2^62 planned as 0 tokens)
    std::optional<std::string> error;
    const long double elements = static_cast<long double>(batch) * static_cast<long double>(seq) *
                                 std::max<long double>(config.n_embd, config.vocab_size) * 4;
    if (batch < 1 || seq < 1 || elements > static_cast<long double>(INT64_MAX))
      error = fmt::format(
          "{}batch {} x seq {} is not a size this library can hold (batch and seq at least 1, "
          "batch x seq x max(n_embd, vocab) x 4 within 64 bits)",
          prefix(program), batch, seq);
    agree_on(comm, error);
  }
  // The lower bound with the state as this rank keeps it: zero=1, 2 divide
  // the state over the data groups, zero=2 the gradients too (their chunk;
  // the slots are not counted); zero=3 the parameters and gradients too, so
  // its bound counts everything over tensor x data ranks.
  MemoryBudget sharded = budget;
  const bool all_sharded = spec.zero >= 3;
  sharded.state_bytes_per_parameter =
      budget.state_bytes_per_parameter / (spec.zero > 0 && !all_sharded ? spec.data : 1);
  const double bound = require_lower_bound_fits(
      comm, spec.tensor_ranks() * (all_sharded ? spec.data : 1), config, sizeof(T), training,
      sharded, program, spec.zero == 2 ? 1.0 / spec.data : 1.0);
  if (budget.bytes <= 0) return bound;

  const auto state_of = [&](const MemoryReport& r) {
    return static_cast<double>(r.parameter_elements) * state +
           (training ? budget.state_bytes_fixed : 0);
  };
  const MemoryReport plan = plan_memory<T>(comm, spec, backend, config, batch, seq, options, grid);
  const double need = reduce_over(comm, static_cast<double>(plan.total()) + state_of(plan), MPI_MAX,
                                  "require_memory_fits");
  if (need > budget.bytes) {
    const double room = std::max(0.0, budget.bytes - state_of(plan));
    const index_t fits = largest_batch<T>(comm, spec, backend, config, seq, options,
                                          static_cast<std::size_t>(room), batch, grid);
    throw CollectiveError(fmt::format(
        "{}this configuration needs about {} per rank (parameters, {}activations for {} {}, "
        "seq {}{}), more than the {} per rank {}; {}",
        prefix(program), human_bytes(need), training ? "gradients, " : "", budget.batch_option,
        batch, seq, state_of(MemoryReport{}) + state > 0 ? ", optimizer state" : "",
        human_bytes(budget.bytes), budget.source,
        fits > 0 ? fmt::format("the largest {} that fits is {}", budget.batch_option, fits)
                 : std::string("even the smallest batch does not fit: use fewer layers, a "
                               "smaller hidden size, or more ranks")));
  }
  return need;
}

template double require_memory_fits<float>(MPI_Comm, const SchemeSpec&, Backend&, const GptConfig&,
                                           index_t, index_t, const GptOptions&, const GridOptions&,
                                           const MemoryBudget&, const std::string&);
template double require_memory_fits<double>(MPI_Comm, const SchemeSpec&, Backend&, const GptConfig&,
                                            index_t, index_t, const GptOptions&, const GridOptions&,
                                            const MemoryBudget&, const std::string&);
template double require_memory_fits<bf16>(MPI_Comm, const SchemeSpec&, Backend&, const GptConfig&,
                                          index_t, index_t, const GptOptions&, const GridOptions&,
                                          const MemoryBudget&, const std::string&);

}  // namespace summa

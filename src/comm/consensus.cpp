#include "summa/comm/consensus.hpp"

#include <fmt/format.h>

#include <array>
#include <atomic>
#include <limits>

#include "fault_stop.hpp"
#include "summa/comm/mpi_communicator.hpp"
#include "summa/comm/watchdog.hpp"
#include "summa/core/error.hpp"

namespace summa {

namespace {
// SUMMA_FAULT_STOP_AGREE (fault_stop.hpp): before every agree_on.
detail::FaultStop agree_stop("SUMMA_FAULT_STOP_AGREE");
std::atomic<std::uint64_t> agreements{0};
}  // namespace

std::uint64_t agreements_made() {
  return agreements.load(std::memory_order_relaxed);
}

void wait_guarded(MPI_Request& request, MPI_Comm comm, const char* what, std::uint64_t bytes) {
  Watchdog* w = Watchdog::active();
  if (w == nullptr || !w->wait_if_covered(request, comm, what, bytes))
    check_mpi(MPI_Wait(&request, MPI_STATUS_IGNORE), "MPI_Wait");
}

void agree_on(MPI_Comm comm, const std::optional<std::string>& local_error) {
  agree_on(comm, local_error, {}, {}, "agree_on");
}

void agree_on(MPI_Comm comm, const std::optional<std::string>& local_error,
              std::span<const std::int64_t> values, std::span<const char* const> names,
              const char* what) {
  constexpr std::size_t kMax = 8;
  agreements.fetch_add(1, std::memory_order_relaxed);
  agree_stop.reached();
  if (values.size() > kMax || names.size() != values.size())
    throw Error(fmt::format("agree_on: {} values and {} names (at most {}, one name each)",
                            values.size(), names.size(), kMax));
  int rank = 0, size = 0;
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  // Maxima of (-first failing rank, v..., -v...): one all-reduce gives the
  // lowest failing rank and every value's range.
  std::array<std::int64_t, 1 + 2 * kMax> buf{};
  const std::size_t n = values.size();
  buf[0] =
      local_error ? -static_cast<std::int64_t>(rank) : std::numeric_limits<std::int64_t>::min();
  for (std::size_t i = 0; i < n; ++i) {
    buf[1 + i] = values[i];
    // -INT64_MIN overflows: such a value is clamped (and then differs anyway).
    buf[1 + n + i] = values[i] == std::numeric_limits<std::int64_t>::min()
                         ? std::numeric_limits<std::int64_t>::max()
                         : -values[i];
  }
  // under the process's watchdog when there is one (a stopped rank is then
  // reported instead of leaving the others here for ever)
  const auto wait = [&](MPI_Request& request, std::uint64_t bytes) {
    wait_guarded(request, comm, what, bytes);
  };
  MPI_Request request;
  check_mpi(MPI_Iallreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(1 + 2 * n), MPI_INT64_T,
                           MPI_MAX, comm, &request),
            "MPI_Iallreduce");
  wait(request, (1 + 2 * n) * sizeof(std::int64_t));
  if (buf[0] != std::numeric_limits<std::int64_t>::min()) {
    const int first = static_cast<int>(-buf[0]);
    std::string message = rank == first ? *local_error : std::string();
    int length = static_cast<int>(message.size());
    check_mpi(MPI_Ibcast(&length, 1, MPI_INT, first, comm, &request), "MPI_Ibcast");
    wait(request, sizeof length);
    message.resize(static_cast<std::size_t>(length));
    check_mpi(MPI_Ibcast(message.data(), length, MPI_CHAR, first, comm, &request), "MPI_Ibcast");
    wait(request, static_cast<std::uint64_t>(length));
    throw CollectiveError(message);
  }
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t hi = buf[1 + i], lo = -buf[1 + n + i];
    if (hi != lo) {
      std::string all;
      for (std::size_t j = 0; j < n; ++j) all += fmt::format("{}{}", j ? ", " : "", names[j]);
      throw CollectiveError(fmt::format(
          "{}: ranks disagree on {}: it ranges over [{}, {}] across the {} ranks (every rank "
          "must pass the same {})",
          what, names[i], lo, hi, size, all));
    }
  }
}

}  // namespace summa

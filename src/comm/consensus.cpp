#include "summa/comm/consensus.hpp"

#include <fmt/format.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <thread>

#include "fault_stop.hpp"
#include "setup_limit.hpp"
#include "summa/comm/mpi_communicator.hpp"
#include "summa/comm/watchdog.hpp"
#include "summa/core/error.hpp"

namespace summa {

namespace {
// SUMMA_FAULT_STOP_AGREE (fault_stop.hpp): before every agree_on.
detail::FaultStop agree_stop("SUMMA_FAULT_STOP_AGREE");
// SUMMA_FAULT_STOP_GUARDED: before every wait_guarded of a caller (a
// program's or the library's own MPI request; agree_on's are counted above).
detail::FaultStop guarded_stop("SUMMA_FAULT_STOP_GUARDED");
std::atomic<std::uint64_t> agreements{0};
}  // namespace

std::uint64_t agreements_made() {
  return agreements.load(std::memory_order_relaxed);
}

namespace detail {

namespace {
thread_local double setup_limit_s = 0;
}  // namespace

SetupLimit::SetupLimit(double seconds) noexcept : previous_(setup_limit_s) {
  setup_limit_s = seconds > 0 ? seconds : 0;
}
SetupLimit::~SetupLimit() {
  setup_limit_s = previous_;
}
double SetupLimit::current() noexcept {
  return setup_limit_s;
}

}  // namespace detail

namespace {

// A wait no watchdog covers, under the thread's SetupLimit: polled; past the
// limit, one report from each waiting rank and the job is aborted.
void wait_under_setup_limit(MPI_Request& request, MPI_Comm comm, const char* what, double limit) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  for (std::uint64_t polls = 0;; ++polls) {
    int done = 0;
    check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (done) return;
    if (polls % 64 == 63) {
      if (std::chrono::duration<double>(clock::now() - start).count() > limit) break;
      std::this_thread::yield();
    }
  }
  int rank = 0, size = 0, world = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &world);
  std::fprintf(stderr,
               "summa watchdog: rank %d has waited %g s in %s over %d ranks (world rank %d), "
               "before any watchdog exists: a rank of the group did not arrive (stopped, lost or "
               "busy); aborting the job\n",
               rank, limit, what, size, world);
  std::fflush(stderr);
  MPI_Abort(comm, 3);
  std::abort();  // MPI_Abort does not return
}

void wait_covered(MPI_Request& request, MPI_Comm comm, const char* what, std::uint64_t bytes) {
  Watchdog* w = Watchdog::active();
  if (w != nullptr && w->wait_if_covered(request, comm, what, bytes)) return;
  if (const double limit = detail::SetupLimit::current(); limit > 0) {
    wait_under_setup_limit(request, comm, what, limit);
    return;
  }
  check_mpi(MPI_Wait(&request, MPI_STATUS_IGNORE), "MPI_Wait");
}
}  // namespace

void wait_guarded(MPI_Request& request, MPI_Comm comm, const char* what, std::uint64_t bytes) {
  guarded_stop.reached();
  wait_covered(request, comm, what, bytes);
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
    wait_covered(request, comm, what, bytes);
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

#include "summa/comm/mpi_init.hpp"

#include "fault_stop.hpp"
#include "running_limit.hpp"

#include <mpi.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace summa {

namespace {

// The watchdog's own largest limit (the programs' --watchdog range).
constexpr double kMaxSeconds = 1e7;

// A number of seconds in [0, kMaxSeconds], or -1.
double parse_seconds(const char* text) {
  if (text == nullptr || *text == '\0') return -1;
  char* end = nullptr;
  const double v = std::strtod(text, &end);
  if (end == text || *end != '\0' || !std::isfinite(v) || v < 0 || v > kMaxSeconds) return -1;
  return v;
}

// The launcher's rank of this process (MPI is not initialised yet), or -1.
int launcher_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    const char* v = std::getenv(var);
    if (v != nullptr && *v != '\0') return std::atoi(v);
  }
  return -1;
}

}  // namespace

double init_timeout_s(int argc, const char* const* argv, double default_s) {
  if (const double env = parse_seconds(std::getenv("SUMMA_INIT_TIMEOUT")); env >= 0) return env;
  double flag = -1;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    if (std::strcmp(a, "--watchdog") == 0 && i + 1 < argc) {
      flag = parse_seconds(argv[i + 1]);  // the last one counts, as in the parser
    } else if (std::strncmp(a, "--watchdog=", 11) == 0) {
      flag = parse_seconds(a + 11);
    }
  }
  if (flag == 0) return 0;
  if (flag > 0) return flag < 30 ? 30 : flag;
  return default_s;
}

namespace {
double init_limit_s = 0;  // init_mpi's, for finalize_mpi
}  // namespace

void init_mpi(int* argc, char*** argv, double default_s) {
  const double limit = init_timeout_s(*argc, *argv, default_s);
  init_limit_s = limit;
  const int rank = launcher_rank();
  if (const char* stop = std::getenv("SUMMA_FAULT_STOP_INIT");
      stop != nullptr && rank >= 0 && std::atoi(stop) == rank)
    std::raise(SIGSTOP);
  const detail::RunningLimit timer(limit, [rank](double seconds) {
    const std::string who = rank >= 0 ? "rank " + std::to_string(rank) : std::string("a rank");
    std::fprintf(stderr,
                 "summa: %s: MPI_Init did not finish within %g s: another rank of the job was "
                 "stopped, lost or never started (limit: --watchdog, at least 30 s, or "
                 "SUMMA_INIT_TIMEOUT); exiting with status %d\n",
                 who.c_str(), seconds, kInitTimeoutExit);
    std::fflush(stderr);
    std::_Exit(kInitTimeoutExit);
  });
  MPI_Init(argc, argv);
}

namespace {

// SUMMA_FAULT_STOP_FINALIZE / _SPLIT (fault_stop.hpp): before finalize_mpi's
// MPI_Finalize, before split_under_limit's MPI_Comm_split.
detail::FaultStop finalize_stop("SUMMA_FAULT_STOP_FINALIZE");
detail::FaultStop split_stop("SUMMA_FAULT_STOP_SPLIT");

int world_rank_now() {
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

}  // namespace

void finalize_mpi() {
  const double limit_s = init_limit_s;
  std::fflush(stdout);
  std::fflush(stderr);
  const int rank = world_rank_now();
  const detail::RunningLimit timer(limit_s, [rank](double seconds) {
    detail::exit_blocked(rank, "MPI_Finalize (this rank's work is done and saved)", seconds);
  });
  finalize_stop.reached();
  MPI_Finalize();
}

MPI_Comm split_under_limit(MPI_Comm comm, int color, int key, const char* what, double limit_s) {
  MPI_Comm out = MPI_COMM_NULL;
  const int rank = world_rank_now();
  const detail::RunningLimit timer(
      limit_s, [rank, what](double seconds) { detail::exit_blocked(rank, what, seconds); });
  split_stop.reached();
  MPI_Comm_split(comm, color, key, &out);
  return out;
}

void wait_sleeping(MPI_Request& request, const char* what, double limit_s) {
  const int rank = world_rank_now();
  const detail::RunningLimit timer(
      limit_s, [rank, what](double seconds) { detail::exit_blocked(rank, what, seconds); });
  for (int finished = 0; !finished;) {
    MPI_Test(&request, &finished, MPI_STATUS_IGNORE);
    if (!finished) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace summa

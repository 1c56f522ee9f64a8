#pragma once
/// \file consensus.hpp
/// Agreement on errors and values across the ranks of an MPI communicator,
/// so that a failure some ranks see becomes the same summa::Error on every
/// rank instead of a hang: used before any collective whose arguments only
/// some ranks could find wrong (ProcessGrid::agree is the per-axis form).

#include <mpi.h>

#include <cstdint>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <utility>

namespace summa {

/// Collective version of require(): every rank of `comm` calls it; if any
/// rank's `condition` is false, all throw the message of the lowest failing
/// rank. For checks made before a grid exists.
void agree_on(MPI_Comm comm, const std::optional<std::string>& local_error);

/// MPI_Wait of a program's or the library's own MPI request on `comm`,
/// under the process's live watchdog when there is one that covers `comm`
/// (comm/watchdog.hpp: a rank that never arrives is reported, `what` naming
/// the wait); agree_on waits this way.
void wait_guarded(MPI_Request& request, MPI_Comm comm, const char* what, std::uint64_t bytes);

/// agree_on that also checks that every rank passed the same `values`
/// (at most 8, e.g. the global sizes of a call): one MPI_Allreduce of
/// 1 + 2 * values.size() 64-bit integers. A rank's local error wins; else, when
/// the values differ, every rank throws "<what>: ranks disagree on <name>: it
/// ranges over [lo, hi] across the N ranks (every rank must pass the same
/// <names>)" naming the first differing value: the same message on every
/// rank. Throws CollectiveError. Allocates nothing unless it throws (hot-path checks).
void agree_on(MPI_Comm comm, const std::optional<std::string>& local_error,
              std::span<const std::int64_t> values, std::span<const char* const> names,
              const char* what);

/// How many agreements (agree_on calls, ProcessGrid::agree included) this
/// process has made since it started: the control all-reduces that are not
/// on the traffic counters. A built model's steady-state training or
/// decoding step makes none unless GridOptions::check_calls is on (tests
/// check it). Thread-safe.
std::uint64_t agreements_made();

/// Rank 0 runs `f`; every rank returns normally when it succeeded, or throws
/// the same CollectiveError carrying the message of the summa::Error (or
/// std::exception) it threw. For a file-system step one rank performs for all
/// (creating directories, reading a small file) so that the others never wait
/// in a collective for a rank that has failed. Collective over `comm`.
template <class F>
void on_root_agreed(MPI_Comm comm, F&& f) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  std::optional<std::string> error;
  if (rank == 0) {
    try {
      std::forward<F>(f)();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  agree_on(comm, error);
}

}  // namespace summa

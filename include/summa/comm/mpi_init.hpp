#pragma once
/// \file mpi_init.hpp
/// MPI_Init under a time limit: a rank stopped, lost or never started while
/// the job starts leaves the others waiting inside MPI_Init (Open MPI's
/// start-up exchange), before any communicator, and so before any watchdog,
/// exists. init_mpi starts a timer thread first; if MPI_Init has not
/// returned when it fires, the rank prints one line naming itself and the
/// limit on stderr and exits with kInitTimeoutExit (the launcher then ends
/// the rest of the job). docs/reliability.md, section 2.

namespace summa {

/// Exit status of a rank whose MPI_Init outlived the limit.
inline constexpr int kInitTimeoutExit = 4;

/// Seconds init_mpi waits: SUMMA_INIT_TIMEOUT when set (0: no limit);
/// otherwise `--watchdog S` (or `--watchdog=S`) from the command line, at
/// least 30 s (start-up of an oversubscribed job takes seconds), 0 when the
/// program's watchdog is off; otherwise `default_s`. A value that is not a
/// number in [0, 1e7] is ignored (the program's own parser refuses it after
/// MPI_Init). The limit counts the time the process runs: a rank that was
/// itself stopped and continued does not report.
double init_timeout_s(int argc, const char* const* argv, double default_s);

/// MPI_Init(argc, argv) under init_timeout_s(*argc, *argv, default_s).
/// SUMMA_FAULT_STOP_INIT=<rank> (fault suite only) stops that rank (by the
/// launcher's rank variable) just before MPI_Init.
void init_mpi(int* argc, char*** argv, double default_s);

}  // namespace summa

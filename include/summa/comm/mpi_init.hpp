#pragma once
/// \file mpi_init.hpp
/// MPI_Init under a time limit: a rank stopped, lost or never started while
/// the job starts leaves the others waiting inside MPI_Init (Open MPI's
/// start-up exchange), before any communicator, and so before any watchdog,
/// exists. init_mpi starts a timer thread first; if MPI_Init has not
/// returned when it fires, the rank prints one line naming itself and the
/// limit on stderr and exits with kInitTimeoutExit (the launcher then ends
/// the rest of the job). docs/reliability.md, section 2.

#include <mpi.h>

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

/// Exit status of a rank that waited past its limit in one of the blocking
/// calls below (as the watchdog's abort).
inline constexpr int kBlockedExit = 3;

/// MPI_Finalize under the limit init_mpi used (SUMMA_INIT_TIMEOUT, else
/// --watchdog at least 30 s, else the program's default; none when MPI was
/// not initialised by init_mpi): a rank stopped or lost after its work would
/// otherwise keep the others in MPI_Finalize for ever. stdout and stderr are
/// flushed first (what the program printed is out before the wait); past
/// the limit the waiting rank prints one line (its work is done and saved;
/// another rank did not finish) and exits with kBlockedExit.
void finalize_mpi();

/// MPI_Comm_split(comm, color, key) under a limit of `limit_s` seconds of
/// running time (0: none): MPI_Comm_split blocks and cannot be polled, so a
/// rank stopped before it would leave the others there for ever. Past the
/// limit the waiting rank prints one line naming `what` and exits with
/// kBlockedExit. Returns the new communicator (MPI_COMM_NULL for
/// MPI_UNDEFINED).
MPI_Comm split_under_limit(MPI_Comm comm, int color, int key, const char* what, double limit_s);

/// Waits for `request` by testing it with 1 ms sleeps in between (the cores
/// stay free for ranks that compute), under a limit of `limit_s` seconds of
/// running time (0: none); past it, one line naming `what` and exit with
/// kBlockedExit.
void wait_sleeping(MPI_Request& request, const char* what, double limit_s);

}  // namespace summa

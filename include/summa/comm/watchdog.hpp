#pragma once
/// \file watchdog.hpp
/// A collective watchdog: a time limit on every blocking wait of the
/// communicators it guards, and a desync report when the limit is reached.
///
/// A guarded wait polls its request instead of blocking in MPI_Wait. While it
/// polls it answers the watchdog's probes from other ranks with what it is
/// waiting in (axis, operation, sequence number of the call on that
/// communicator, bytes). When a wait outlives `timeout_s`, the rank probes
/// every member of the group it waits on, collects their answers for
/// `report_s` seconds, and reports, for each member, whether it is in the same
/// call (arrived), in another call (the ranks' calls are out of step: a
/// mismatched collective), or did not answer (busy in computation, stuck in
/// something that is not a guarded collective, or dead). Then it calls
/// `on_expiry`, by default: print the report on stderr and MPI_Abort the job
/// with status 3, so a hang ends within timeout_s + report_s seconds with a
/// message naming the lagging ranks (the behaviour of PyTorch's NCCL watchdog
/// and its desync report; docs/reliability.md). With that default, of the
/// ranks waiting when the limit passes only the lowest reports: a rank that
/// finds a lower rank waiting too stays silent and waits on, once more up to
/// timeout_s + report_s, then reports itself (the lower rank may have been
/// released meanwhile), so the bound per rank is twice that.
///
/// Guarded: every blocking call, wait() and barrier() of a communicator whose
/// waits block the host (MpiCommunicator, StagedCommunicator). An
/// NcclCommunicator's waits are stream-ordered (the host does not wait), so
/// they are not guarded; a hung NCCL call surfaces at the backend's
/// synchronisation, which this watchdog does not cover.
///
/// The watchdog's own messages travel on a duplicate of the communicator it
/// was built on, so they never match the job's messages. Cost of a guarded
/// wait: a clock read and an MPI_Iprobe every 64 polls; nothing is allocated
/// unless the limit is reached.

#include <mpi.h>

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "summa/comm/communicator.hpp"

namespace summa {

struct WatchdogOptions {
  /// Seconds a blocking wait may last before the report; 0 turns the
  /// watchdog off (every wait blocks in the communicator's own wait).
  double timeout_s = 0;
  /// Seconds to collect the group members' answers after the limit.
  double report_s = 2;
  /// Receives the report on a rank whose wait expired. Empty: print it on
  /// stderr and MPI_Abort the job (status 3). A handler that returns (it may
  /// also throw, abandoning the collective) lets the wait go on without a
  /// limit: a report-only mode, e.g. to log slow collectives, and for tests.
  std::function<void(const std::string& report)> on_expiry;

  /// The longest a guarded wait lasts before the job ends: timeout_s +
  /// report_s, or 0 when the watchdog is off (or its values are not valid).
  /// The limit for the blocking calls no watchdog polls (grid set-up,
  /// finalize_mpi, split_under_limit in comm/mpi_init.hpp).
  double limit_s() const {
    const bool valid = timeout_s > 0 && timeout_s < 1e300 && report_s >= 0 && report_s < 1e300;
    return valid ? timeout_s + report_s : 0;
  }
};

class Watchdog {
 public:
  /// Collective over `comm` (duplicated for the watchdog's messages). Every
  /// rank must pass the same timeout_s (checked: the same CollectiveError on
  /// every rank otherwise); a negative or non-finite value is refused.
  Watchdog(MPI_Comm comm, WatchdogOptions options);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  const WatchdogOptions& options() const { return options_; }
  bool enabled() const { return options_.timeout_s > 0; }

  /// Guards `c`'s blocking waits from now on (no-op when disabled). `native`
  /// is the MPI communicator `c` was built on (its group must be a subset of
  /// the watchdog's). Not collective. `c` must not outlive the watchdog.
  void attach(Communicator& c, MPI_Comm native);

  /// Waits for a raw MPI request (a program's own collective, e.g. on
  /// MPI_COMM_WORLD, a subset of the watchdog's group) under the same limit;
  /// `what` names it in the report, `group` is the communicator it runs on
  /// (wait_if_covered; a plain MPI_Wait when the watchdog is off or `group`
  /// holds a rank outside its communicator).
  void wait(MPI_Request& request, MPI_Comm group, const char* what, std::uint64_t bytes);

  /// The enabled watchdog constructed last and still alive in this process
  /// (null: none). agree_on (comm/consensus.hpp) waits under it, so the
  /// shape and error agreements of the layers and programs are guarded like
  /// the communicators' own collectives.
  static Watchdog* active();
  /// wait() when every rank of `group` is in the watchdog's communicator
  /// (true), else nothing (false: the caller waits). Allocates only the
  /// first time it meets a communicator (a few are remembered).
  bool wait_if_covered(MPI_Request& request, MPI_Comm group, const char* what, std::uint64_t bytes);

 private:
  friend class Communicator;
  struct Pending {
    bool active = false;
    int axis = 0;
    int leader = 0;  ///< lowest watchdog rank of the group: with axis, names the group
    int kind = 0;
    std::uint64_t sequence = 0;
    std::uint64_t bytes = 0;
    const char* what = nullptr;  ///< raw MPI waits: their label
  };
  static bool point_to_point(const Pending& p);
  static Pending pending_of(int kind, std::uint64_t sequence, std::uint64_t bytes, CommAxis axis,
                            const std::vector<int>& members);
  /// Polls `poll` until it returns true; reports and calls on_expiry when the
  /// limit is reached. `members`: watchdog ranks of the group.
  template <class Poll>
  void guard(const Pending& pending, const std::vector<int>& members, Poll&& poll);
  void serve_probes();
  /// Probes, reports and calls on_expiry (or aborts). Returns false, having
  /// reported nothing, when `may_defer`, the default on_expiry is in force
  /// and a lower rank answered that it waits too: that rank's own expiry
  /// reports and ends the job, so a job prints one report, not one per
  /// waiting rank. guard() then re-arms the limit once without deferral.
  bool expire(const std::vector<int>& members, double waited_s, bool may_defer);
  std::string describe(const Pending& p) const;
  std::vector<int> members_of(MPI_Comm native) const;

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  WatchdogOptions options_;
  Pending pending_;
  /// wait_if_covered: communicators met, and whether the watchdog covers them
  struct Known {
    MPI_Comm comm = MPI_COMM_NULL;
    bool covered = false;
    std::vector<int> members;
  };
  std::array<Known, 8> known_{};
  std::size_t next_known_ = 0;
};

}  // namespace summa

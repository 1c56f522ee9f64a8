#pragma once
// A time limit on a blocking MPI call that cannot be polled (MPI_Init,
// MPI_Comm_split, MPI_Comm_dup): a timer thread that, past `seconds` of the
// time this process runs, calls `expire` on the timer thread, which reports
// and ends the process (std::_Exit: the launcher then ends the rest of the
// job). Cancelled when the object dies. The limit counts running time only:
// the timer ticks every 100 ms and a tick that took far longer (the process
// was stopped, SIGSTOP, then continued, e.g. by the launcher ending the job)
// adds one tick. So only the ranks that waited report, once each, and a rank
// that was itself stopped does not blame another. Internal to the comm and
// grid areas (docs/reliability.md, section 2).

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace summa::detail {

/// What a RunningLimit's `expire` usually does: one line on stderr from
/// the rank that waited past `seconds` in `what` ("summa watchdog: world rank
/// R has waited S s in WHAT: another rank of the job was stopped, lost or is
/// busy; exiting with status 3"), then std::_Exit(3) (kBlockedExit; no MPI
/// call: it runs on the timer thread).
[[noreturn]] void exit_blocked(int world_rank, const std::string& what, double seconds);

class RunningLimit {
 public:
  /// `seconds` <= 0: no limit (no thread). `expire(seconds)` must not return.
  RunningLimit(double seconds, std::function<void(double)> expire);
  ~RunningLimit();
  RunningLimit(const RunningLimit&) = delete;
  RunningLimit& operator=(const RunningLimit&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread timer_;
};

}  // namespace summa::detail

#pragma once
// Fault injection for the fault suite (tests/fault/watchdog_programs.sh): a
// rank that stops itself (SIGSTOP) at a chosen point, so that the others wait
// for a rank that never arrives, which only the watchdog (--watchdog) ends.
// `<world rank>:<n>` in an environment variable names the rank and the n-th
// call of reached(), counted from 1 in the process. Read once; unset, a call
// costs one predictable branch. Internal to the build: not installed.
//   SUMMA_FAULT_STOP        before every collective a Communicator starts
//                           (comm/communicator.cpp)
//   SUMMA_FAULT_STOP_AGREE  before every agree_on (comm/consensus.cpp): a
//                           rank stopped while a program sets up
//   SUMMA_FAULT_STOP_GUARDED  before every wait_guarded (comm/consensus.cpp):
//                           a program's own MPI requests (gpt_train's
//                           memory and stop-signal all-reduces), memory
//                           checks, checkpoint metadata
//   SUMMA_FAULT_STOP_GRID   in each ProcessGrid's set-up, before its
//                           communicators are split (grid/process_grid.cpp)
//   SUMMA_FAULT_STOP_FINALIZE  before finalize_mpi's MPI_Finalize
//   SUMMA_FAULT_STOP_SPLIT  before split_under_limit's MPI_Comm_split
//                           (comm/mpi_init.cpp)

#include <atomic>

namespace summa::detail {

class FaultStop {
 public:
  explicit FaultStop(const char* variable) noexcept;
  void reached() noexcept {
    if (at_ != 0) [[unlikely]]
      count();
  }

 private:
  void count() noexcept;
  int rank_ = -1;
  unsigned long long at_ = 0;  // 0: off
  std::atomic<unsigned long long> calls_{0};
};

}  // namespace summa::detail

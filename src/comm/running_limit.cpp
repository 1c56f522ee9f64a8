#include "running_limit.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "summa/comm/mpi_init.hpp"

namespace summa::detail {

void exit_blocked(int world_rank, const std::string& what, double seconds) {
  std::fprintf(stderr,
               "summa watchdog: world rank %d has waited %g s in %s: another rank of the job "
               "was stopped, lost or is busy; exiting with status %d\n",
               world_rank, seconds, what.c_str(), kBlockedExit);
  std::fflush(stderr);
  std::_Exit(kBlockedExit);
}

RunningLimit::RunningLimit(double seconds, std::function<void(double)> expire) {
  if (!(seconds > 0)) return;
  timer_ = std::thread([this, seconds, expire = std::move(expire)] {
    using clock = std::chrono::steady_clock;
    constexpr auto tick = std::chrono::milliseconds(100);
    double waited = 0;
    std::unique_lock lock(mutex_);
    while (waited < seconds) {
      const auto t0 = clock::now();
      if (cv_.wait_for(lock, tick, [&] { return done_; })) return;
      waited += std::min(std::chrono::duration<double>(clock::now() - t0).count(), 0.2);
    }
    expire(seconds);
  });
}

RunningLimit::~RunningLimit() {
  if (!timer_.joinable()) return;
  {
    const std::lock_guard lock(mutex_);
    done_ = true;
  }
  cv_.notify_one();
  timer_.join();
}

}  // namespace summa::detail

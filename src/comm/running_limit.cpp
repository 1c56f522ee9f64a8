#include "running_limit.hpp"

#include <algorithm>
#include <chrono>
#include <utility>

namespace summa::detail {

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

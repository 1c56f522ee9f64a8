#pragma once
// A time limit for the waits that no watchdog covers yet: the agreement a
// Watchdog makes while it is built (on its limit) runs before it exists, so
// a rank stopped before it would leave the others waiting for ever. While a
// SetupLimit is alive on a thread, wait_guarded (comm/consensus.cpp) polls a
// wait no live watchdog covers and, past the limit, reports and aborts the
// job (status 3), as a watchdog does. Internal to the comm area.

namespace summa::detail {

class SetupLimit {
 public:
  /// `seconds` <= 0: no limit (the waits block as before).
  explicit SetupLimit(double seconds) noexcept;
  ~SetupLimit();
  SetupLimit(const SetupLimit&) = delete;
  SetupLimit& operator=(const SetupLimit&) = delete;
  /// The innermost live limit on this thread (0: none).
  static double current() noexcept;

 private:
  double previous_;
};

}  // namespace summa::detail

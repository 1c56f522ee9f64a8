#pragma once
/// \file counters.hpp
/// Exact per-axis traffic counters. The convention (docs/communication.md) is
/// the "direct-exchange" model: every byte of payload is counted once when it
/// leaves the rank that produced it and once when it arrives at a rank that
/// needs it, independent of the algorithm the transport happens to use. For a
/// group of g ranks and a message of n bytes:
///
///   broadcast        root sends (g-1)*n; every other rank receives n
///   reduce           every non-root sends n; the root receives (g-1)*n
///   all-gather       each rank contributes c bytes: sends and receives (g-1)*c
///   reduce-scatter   each rank keeps c bytes of the result: sends and receives (g-1)*c
///   all-reduce       reduce-scatter + all-gather over chunks c_r of the buffer
///                    (c_r = count/g, the first count%g ranks one element more):
///                    sends and receives (count - c_r) + (g-1)*c_r elements
///
/// A group of one moves nothing. These equal the bandwidth terms of the
/// Optimus (Table 1) and AxoNN (eqs. 1-5) cost models.

#include <array>
#include <cstdint>
#include <string_view>

namespace summa {

/// The communicators a ProcessGrid builds; each has its own counters.
enum class CommAxis : std::uint8_t {
  world,     ///< every rank of the grid
  data,      ///< ranks with the same (depth, row, col): one per data-parallel replica
  depth,     ///< ranks with the same (data, row, col)
  mesh_row,  ///< ranks in my mesh row: same (data, depth, row), col varies
  mesh_col,  ///< ranks in my mesh column: same (data, depth, col), row varies
  mesh,      ///< my rows x cols plane: same (data, depth)
  tensor,    ///< my depth x rows x cols model-parallel group: same data
  pipe,      ///< pipeline stages: same rank in every stage (parallel/pipeline.hpp)
  other,     ///< communicators made by the user outside a grid
};
inline constexpr std::size_t comm_axis_count = 9;

std::string_view name_of(CommAxis axis);

/// Traffic of one axis, as bytes and calls, and the time spent waiting on
/// it.
struct TrafficCounter {
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
  std::uint64_t calls = 0;
  /// Wall time (host clock, seconds) this rank spent inside the axis's
  /// blocking collectives and in waits on its non-blocking ones: the
  /// communication a step did not hide behind compute (on an asynchronous
  /// device, the time the host waited for it). Not part of equality:
  /// counters compare by traffic.
  double wait_seconds = 0;

  TrafficCounter& operator+=(const TrafficCounter& o) {
    bytes_sent += o.bytes_sent;
    bytes_received += o.bytes_received;
    calls += o.calls;
    wait_seconds += o.wait_seconds;
    return *this;
  }
  friend bool operator==(const TrafficCounter& a, const TrafficCounter& b) {
    return a.bytes_sent == b.bytes_sent && a.bytes_received == b.bytes_received &&
           a.calls == b.calls;
  }
};

/// One TrafficCounter per CommAxis.
class TrafficCounters {
 public:
  TrafficCounter& operator[](CommAxis a) { return counters_[static_cast<std::size_t>(a)]; }
  const TrafficCounter& operator[](CommAxis a) const {
    return counters_[static_cast<std::size_t>(a)];
  }
  /// Sum over all axes.
  TrafficCounter total() const {
    TrafficCounter t;
    for (const auto& c : counters_) t += c;
    return t;
  }
  void reset() { counters_ = {}; }

 private:
  std::array<TrafficCounter, comm_axis_count> counters_{};
};

}  // namespace summa

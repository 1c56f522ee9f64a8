#pragma once
// Where a request's bytes go in a staging buffer that requests in flight
// share (StagedCommunicator's pinned buffer, src/backend/cuda): the lowest
// aligned offset clear of every range still held, so that a range given
// back below others is used again whatever order requests complete in (a
// pipeline's stage messages complete out of issue order, and a buffer that
// only gave back its top would run out within a step). Pure functions over
// the held ranges, tested on the CPU (tests/comm/test_comm.cpp).
// Internal to the build: not installed.

#include <cstddef>
#include <optional>
#include <span>

namespace summa::detail {

/// A staging range [begin, end) held by a request in flight; an empty range
/// (begin == end) holds nothing.
struct StagingRange {
  std::size_t begin = 0;
  std::size_t end = 0;
};

inline std::size_t staging_align_up(std::size_t n, std::size_t alignment) {
  return (n + alignment - 1) / alignment * alignment;
}

/// Whether [at, at + bytes) meets no held range.
inline bool staging_clear(std::span<const StagingRange> held, std::size_t at, std::size_t bytes) {
  for (const StagingRange& r : held)
    if (r.begin < r.end && r.begin < at + bytes && at < r.end) return false;
  return true;
}

/// The lowest offset, a multiple of `alignment`, at which `bytes` (> 0) fit
/// within [0, capacity) beside the held ranges; nullopt when nowhere. The
/// candidates are 0 and each held range's aligned end: the lowest clear
/// offset is one of them.
inline std::optional<std::size_t> staging_first_fit(std::span<const StagingRange> held,
                                                    std::size_t bytes, std::size_t capacity,
                                                    std::size_t alignment) {
  std::optional<std::size_t> best;
  const auto consider = [&](std::size_t at) {
    if (best && *best <= at) return;
    if (at > capacity || bytes > capacity - at) return;
    if (staging_clear(held, at, bytes)) best = at;
  };
  consider(0);
  for (const StagingRange& r : held)
    if (r.begin < r.end) consider(staging_align_up(r.end, alignment));
  return best;
}

/// The most bytes one new request could take now: the longest clear run
/// from an aligned candidate offset (0 or a held range's aligned end) to
/// the next held range or the capacity (for error messages).
inline std::size_t staging_largest_free(std::span<const StagingRange> held, std::size_t capacity,
                                        std::size_t alignment) {
  std::size_t largest = 0;
  const auto from = [&](std::size_t at) {
    if (at >= capacity) return;
    std::size_t limit = capacity;
    for (const StagingRange& r : held) {
      if (r.begin >= r.end) continue;
      if (r.begin <= at && at < r.end) return;  // inside a held range
      if (r.begin > at && r.begin < limit) limit = r.begin;
    }
    if (limit - at > largest) largest = limit - at;
  };
  from(0);
  for (const StagingRange& r : held)
    if (r.begin < r.end) from(staging_align_up(r.end, alignment));
  return largest;
}

}  // namespace summa::detail

#pragma once
/// \file arena.hpp
/// A named, pre-sized region of backend memory handed out by bump allocation.
/// The Optimus buffers (workspace, forward, backward, parameter-gradient,
/// conjunction) are arenas; they are sized before the first step and never
/// grow: a request beyond capacity throws, naming the arena, the request and
/// the capacity.

#include <cstddef>
#include <string>

#include "summa/backend/backend.hpp"

namespace summa {

class Arena {
 public:
  static constexpr std::size_t alignment = 64;

  /// Where an arena's memory comes from: the backend's own (allocate) or its
  /// host pool (allocate_host: what an offloaded optimizer keeps off the
  /// device).
  enum class Pool { backend, host };

  /// Allocates `capacity` bytes from `backend` (rounded up to the alignment).
  Arena(std::string name, Backend& backend, std::size_t capacity, Pool pool = Pool::backend);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  /// `count` elements of T, 64-byte aligned. Throws summa::Error on overflow.
  template <class T>
  T* take(std::size_t count) {
    return static_cast<T*>(take_bytes(count * sizeof(T)));
  }
  void* take_bytes(std::size_t bytes);
  /// What is left at the current position, for handing to a callee.
  Scratch rest();

  /// Position to return to with release(): allocations are stack-like.
  std::size_t mark() const { return used_; }
  void release(std::size_t mark);
  void reset() { release(0); }

  const std::string& name() const { return name_; }
  std::size_t capacity() const { return capacity_; }
  std::size_t used() const { return used_; }
  std::size_t high_water() const { return high_water_; }
  Backend& backend() const { return *backend_; }
  Pool pool() const { return pool_; }
  /// Start of the arena's memory.
  void* base() const { return base_; }

  /// Bytes `bytes` occupies once rounded up to the alignment.
  static constexpr std::size_t rounded(std::size_t bytes) {
    return (bytes + alignment - 1) / alignment * alignment;
  }

 private:
  std::string name_;
  Backend* backend_;
  Pool pool_ = Pool::backend;
  std::byte* base_ = nullptr;
  std::size_t capacity_ = 0;
  std::size_t used_ = 0;
  std::size_t high_water_ = 0;
};

/// The SUMMA temporaries live in an arena called "workspace".
using Workspace = Arena;

/// A dense row-major rows x cols block of T taken from `arena`.
template <class T>
MatrixView<T> take_block(Arena& arena, index_t rows, index_t cols) {
  return MatrixView<T>::dense(arena.take<T>(static_cast<std::size_t>(rows * cols)), rows, cols,
                              Order::row_major);
}

/// RAII: releases an arena back to the mark taken at construction.
class ArenaScope {
 public:
  explicit ArenaScope(Arena& a) : arena_(a), mark_(a.mark()) {}
  ~ArenaScope() { arena_.release(mark_); }
  ArenaScope(const ArenaScope&) = delete;
  ArenaScope& operator=(const ArenaScope&) = delete;

 private:
  Arena& arena_;
  std::size_t mark_;
};

}  // namespace summa

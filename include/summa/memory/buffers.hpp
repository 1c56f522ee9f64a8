#pragma once
/// \file buffers.hpp
/// The step buffers of Optimus §3.2.3 / Fig. 6, each an Arena sized before
/// the first step from the model configuration and the mesh:
///   workspace    temporaries of one operation (SUMMA panels, reductions,
///                attention GEMM scratch); sized to the largest operation
///   forward      activations a layer keeps for its backward; with
///                activation checkpointing one block's worth (plus the head),
///                otherwise every block's
///   backward     activation gradients inside one block
///   conjunction  the gradient handed from block i+1 to block i (two slots)
///   checkpoint   the block boundaries x_0 .. x_N (block inputs and the last
///                output), kept for the whole step
/// The parameter values and the parameter-gradient buffer are the
/// "parameters" and "gradients" arenas of a ParameterStore. A request beyond
/// an arena's capacity throws summa::Error naming the arena, the request and
/// the capacity; high-water marks are read through usage().

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "summa/core/types.hpp"
#include "summa/memory/arena.hpp"

namespace summa {

/// Receives the wall time of a step's named sub-ops while a model is
/// profiled (GptOptions::profile): a layer runs each sub-op between begin()
/// and end() through StepBuffers::timed. The op names are the step-time
/// model's ("block.attn.c_attn", model/step_time.hpp); end()'s `counted` is
/// false for a second stretch of an op already counted once in this call
/// (the residual add the model prices with the op before it).
class OpClock {
 public:
  virtual void begin(std::string_view op) = 0;
  virtual void end(std::string_view op, bool counted) = 0;

 protected:
  ~OpClock() = default;
};

/// The arenas of one step (see the file comment): what a layer's forward and
/// backward take temporaries and saved activations from; and the clock that
/// times named sub-ops when the model is profiled (null otherwise).
struct StepBuffers {
  Arena& workspace;
  Arena& forward;
  Arena& backward;
  OpClock* clock = nullptr;

  /// Runs `work`, timed as `op` when there is a clock.
  template <class F>
  void timed(std::string_view op, F&& work, bool counted = true) {
    if (clock == nullptr) {
      work();
      return;
    }
    clock->begin(op);
    work();
    clock->end(op, counted);
  }
};

/// Bytes of each step arena a layer takes at most (each request rounded up
/// to Arena::alignment).
struct BufferNeeds {
  std::size_t workspace = 0;  ///< peak during any one call
  std::size_t forward = 0;    ///< kept from forward() until backward()
  std::size_t backward = 0;   ///< peak during backward()

  /// Sequential composition: forward adds up, the peaks take the maximum.
  BufferNeeds& then(const BufferNeeds& o);
};

/// Accumulates arena requests of T elements the way Arena::take rounds them.
template <class T>
class ByteCount {
 public:
  ByteCount& add(index_t count) {
    bytes_ += Arena::rounded(static_cast<std::size_t>(count) * sizeof(T));
    return *this;
  }
  ByteCount& add_bytes(std::size_t b) {
    bytes_ += Arena::rounded(b);
    return *this;
  }
  std::size_t bytes() const { return bytes_; }
  operator std::size_t() const { return bytes_; }

 private:
  std::size_t bytes_ = 0;
};

/// One arena's size and use.
struct BufferUsage {
  std::string name;
  std::size_t capacity = 0;
  std::size_t high_water = 0;
};

/// Per-rank memory of a model, in bytes.
struct MemoryReport {
  std::size_t parameters = 0;   ///< local parameter shards (the "parameters" arena)
  std::size_t gradients = 0;    ///< the parameter-gradient buffer
  std::size_t activations = 0;  ///< high water of forward + checkpoint (saved activations)
  /// The local parameter elements, padded (ParameterStore::padded_elements):
  /// what an optimizer keeps state for, or with a sharded data axis
  /// (zero=1, 2, 3) D chunks of it. With zero=3 `parameters` holds only a
  /// chunk of them and the slots.
  std::size_t parameter_elements = 0;
  std::vector<BufferUsage> buffers;  ///< every arena, parameters and gradients included
  /// Sum of all capacities.
  std::size_t total() const;
  /// A small human-readable table (one line per buffer).
  std::string to_string() const;
};

class ModelBuffers {
 public:
  struct Sizes {
    std::size_t workspace = 0, forward = 0, backward = 0, conjunction = 0, checkpoint = 0;
  };
  ModelBuffers(Backend& backend, const Sizes& sizes);

  Arena workspace, forward, backward, conjunction, checkpoint;

  StepBuffers step() { return {workspace, forward, backward}; }
  std::vector<BufferUsage> usage() const;
};

}  // namespace summa

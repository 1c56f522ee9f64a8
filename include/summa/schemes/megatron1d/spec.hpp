#pragma once
/// \file spec.hpp
/// The 1D (Megatron-LM) scheme's options in a SchemeSpec ("1d:p=P", option
/// sp=on|off: Megatron's sequence parallelism; option dc=on|off: Megatron's
/// distributed activation checkpoints).

#include "summa/schemes/spec.hpp"

namespace summa {

struct Megatron1DSpec : SchemeOptionsOf<Megatron1DSpec> {
  explicit Megatron1DSpec(int p = 1, bool sequence_parallel = false,
                          bool distribute_checkpoints = false)
      : p(p),
        sequence_parallel(sequence_parallel),
        distribute_checkpoints(distribute_checkpoints) {}
  int p;  ///< ranks of the tensor group
  /// Megatron's sequence parallelism (Korthikanti et al. 2022): the outer
  /// activations (residual stream, LayerNorm, block boundaries and
  /// checkpoints) split by tokens over the p ranks instead of replicated
  /// (context.hpp).
  bool sequence_parallel = false;
  /// Megatron's distributed activation checkpoints
  /// (--distribute-saved-activations): with per-block checkpoints
  /// (Recompute::full) each rank keeps 1/p of every checkpointed block input
  /// (N*T*h/p instead of N*T*h), all-gathered over the tensor group before
  /// the block's recompute (SchemeContext::checkpoint_group). Needs
  /// Recompute::full (the Gpt refuses it otherwise, as Megatron does);
  /// excludes sequence_parallel (whose checkpoints are split already).
  bool distribute_checkpoints = false;
  friend bool operator==(const Megatron1DSpec&, const Megatron1DSpec&) = default;
};

}  // namespace summa

#pragma once
/// \file spec.hpp
/// The 1D (Megatron-LM) scheme's options in a SchemeSpec ("1d:p=P", option
/// sp=on|off: Megatron's sequence parallelism).

#include "summa/schemes/spec.hpp"

namespace summa {

struct Megatron1DSpec : SchemeOptionsOf<Megatron1DSpec> {
  explicit Megatron1DSpec(int p = 1, bool sequence_parallel = false)
      : p(p), sequence_parallel(sequence_parallel) {}
  int p;  ///< ranks of the tensor group
  /// Megatron's sequence parallelism (Korthikanti et al. 2022): the outer
  /// activations (residual stream, LayerNorm, block boundaries and
  /// checkpoints) split by tokens over the p ranks instead of replicated
  /// (context.hpp).
  bool sequence_parallel = false;
  friend bool operator==(const Megatron1DSpec&, const Megatron1DSpec&) = default;
};

}  // namespace summa

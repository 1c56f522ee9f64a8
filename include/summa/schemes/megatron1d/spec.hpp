#pragma once
/// \file spec.hpp
/// The 1D (Megatron-LM) scheme's options in a SchemeSpec ("1d:p=P").

#include "summa/schemes/spec.hpp"

namespace summa {

struct Megatron1DSpec : SchemeOptionsOf<Megatron1DSpec> {
  explicit Megatron1DSpec(int p = 1) : p(p) {}
  int p;  ///< ranks of the tensor group
  friend bool operator==(const Megatron1DSpec&, const Megatron1DSpec&) = default;
};

}  // namespace summa

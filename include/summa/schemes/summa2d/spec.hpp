#pragma once
/// \file spec.hpp
/// The 2D (Optimus, SUMMA) scheme's options in a SchemeSpec ("2d:q=Q",
/// options panel=N and overlap=on|off).

#include "summa/schemes/spec.hpp"
#include "summa/summa/engine.hpp"

namespace summa {

struct Summa2DSpec : SchemeOptionsOf<Summa2DSpec> {
  explicit Summa2DSpec(int q = 1, SummaOptions summa = {}) : q(q), summa(summa) {}
  int q;  ///< mesh side
  /// The SUMMA engine's options (panel and overlap settable in the text).
  SummaOptions summa;
  friend bool operator==(const Summa2DSpec&, const Summa2DSpec&) = default;
};

}  // namespace summa

#pragma once
// Helpers shared by the sources of the 2D (SUMMA) layers; not installed.

#include "summa/schemes/cost.hpp"

namespace summa::detail2d {

/// The 2D ops' communication (cost::OpCost) on mesh rank (i, j) of a q x q
/// mesh: mesh_row rank j, mesh_col rank i, roots on mesh row 0. Each op's
/// part is defined beside the op (linear.cpp, layernorm.cpp, embedding.cpp,
/// lm_head.cpp).
class Cost2D final : public cost::OpCost {
 public:
  using u64 = cost::u64;
  Cost2D(u64 q, u64 i, u64 j, cost::Elements el, const SummaOptions& summa)
      : q_(q), i_(i), j_(j), el_(el), summa_(summa) {}

  SUMMA_OP_COST_OVERRIDES
  u64 local_rows(u64 tokens) const override { return tokens / q_; }
  u64 local_cols(u64 width, ActivationLayout) const override { return width / q_; }
  u64 head_split() const override { return q_; }

 private:
  u64 q_, i_, j_;
  cost::Elements el_;
  SummaOptions summa_;  ///< the engine's (its panel width cuts the SUMMA collectives)
};

/// The cost of the 2D ops on this engine's rank, for a model of T.
template <class T>
Cost2D cost_at(const SummaEngine& engine) {
  const GridCoords& c = engine.grid().coords();
  const auto u = [](int v) { return static_cast<cost::u64>(v); };
  return Cost2D(u(engine.q()), u(c.row), u(c.col), cost::elements_of<T>(), engine.options());
}

}  // namespace summa::detail2d

#pragma once
// Helpers shared by the sources of the 2D (SUMMA) layers; not installed.

#include "summa/grid/process_grid.hpp"
#include "summa/model/cost.hpp"

namespace summa::detail2d {

/// A rank of the q x q mesh as the 2D ops price themselves (their price()
/// in layers.cpp and vocab.cpp): mesh row i
/// (its mesh_col rank), mesh column j (its mesh_row rank), roots on mesh
/// row 0; the element sizes of the model and the options of the engine
/// that runs the ops (its panel width cuts the SUMMA collectives).
struct MeshRank {
  cost::u64 q, i, j;
  cost::Elements el;
  SummaOptions summa;
};
template <class T>
MeshRank mesh_rank(const SummaEngine& engine) {
  const GridCoords& c = engine.grid().coords();
  const auto u = [](int v) { return static_cast<cost::u64>(v); };
  return {.q = u(engine.q()),
          .i = u(c.row),
          .j = u(c.col),
          .el = cost::elements_of<T>(),
          .summa = engine.options()};
}

}  // namespace summa::detail2d

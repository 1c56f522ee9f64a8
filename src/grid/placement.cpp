#include "summa/grid/placement.hpp"

#include <cstdlib>

#include "summa/core/error.hpp"

namespace summa {

Tile bunched_tile(int rows, int cols, int ranks_per_node) {
  Tile best;
  if (rows <= 0 || cols <= 0 || ranks_per_node <= 0) return best;
  // Most square factorisation tr x tc = ranks_per_node with tr | rows, tc | cols.
  for (int tr = 1; tr <= ranks_per_node; ++tr) {
    if (ranks_per_node % tr != 0) continue;
    const int tc = ranks_per_node / tr;
    if (rows % tr != 0 || cols % tc != 0) continue;
    if (best.rows == 0 || std::abs(tr - tc) < std::abs(best.rows - best.cols)) best = {tr, tc};
  }
  return best;
}

std::vector<GridCoords> place(const GridShape& shape, Placement placement, int ranks_per_node) {
  require(shape.data > 0 && shape.depth > 0 && shape.rows > 0 && shape.cols > 0,
          "grid shape must be positive");
  const int plane = shape.rows * shape.cols;
  std::vector<GridCoords> coords(static_cast<std::size_t>(shape.size()));
  Tile tile{1, shape.cols};  // natural: a tile is one mesh row
  if (placement == Placement::bunched && ranks_per_node < plane) {
    Tile t = bunched_tile(shape.rows, shape.cols, ranks_per_node);
    if (t.rows > 0) tile = t;
  }
  const int tiles_per_row = shape.cols / tile.cols;
  const int tile_size = tile.rows * tile.cols;
  for (int slot = 0; slot < shape.size(); ++slot) {
    const int outer = slot / plane;  // data * depth + depth index
    const int in_plane = slot % plane;
    const int t = in_plane / tile_size;
    const int within = in_plane % tile_size;
    GridCoords& c = coords[static_cast<std::size_t>(slot)];
    c.data = outer / shape.depth;
    c.depth = outer % shape.depth;
    c.row = (t / tiles_per_row) * tile.rows + within / tile.cols;
    c.col = (t % tiles_per_row) * tile.cols + within % tile.cols;
  }
  return coords;
}

}  // namespace summa

#pragma once
/// \file placement.hpp
/// Where each process sits in the grid. Pure functions, no MPI: testable alone.

#include <vector>

namespace summa {

/// Shape of a process grid: data x depth x rows x cols. The 2D mesh is rows x
/// cols; depth is the third axis of 3D schemes; data replicates the model.
struct GridShape {
  int data = 1;
  int depth = 1;
  int rows = 1;
  int cols = 1;
  int size() const { return data * depth * rows * cols; }
  friend bool operator==(const GridShape&, const GridShape&) = default;
};

/// Coordinates of one rank in the grid.
struct GridCoords {
  int data = 0;
  int depth = 0;
  int row = 0;
  int col = 0;
  friend bool operator==(const GridCoords&, const GridCoords&) = default;
};

enum class Placement {
  /// slot s -> coordinates in row-major order (col fastest, then row, depth, data).
  natural,
  /// Optimus Fig. 8 "bunched": each node holds a tr x tc tile of a mesh plane
  /// (tr * tc = ranks per node, as square as possible), so that row and column
  /// collectives cross as few node boundaries as possible. Falls back to
  /// natural when the node size does not tile the rows x cols plane.
  bunched,
};

/// The tile (tile_rows x tile_cols) that bunched placement uses for nodes of
/// `ranks_per_node` ranks on a rows x cols plane, or {0, 0} when none fits.
struct Tile {
  int rows = 0;
  int cols = 0;
};
Tile bunched_tile(int rows, int cols, int ranks_per_node);

/// Coordinates of every slot. Slots number the processes node by node:
/// slot = node_index * ranks_per_node + local_rank. With Placement::natural
/// the result does not depend on ranks_per_node.
std::vector<GridCoords> place(const GridShape& shape, Placement placement, int ranks_per_node);

}  // namespace summa

#pragma once
// Helpers shared by the sources of the 3D (AxoNN) layers; not installed.

#include <fmt/format.h>

#include <cstddef>
#include <optional>
#include <string>

#include "../../layers/check_view.hpp"
#include "summa/grid/process_grid.hpp"
#include "summa/layers/layer.hpp"
#include "summa/layers/vocab_parallel.hpp"
#include "summa/model/cost.hpp"

namespace summa::detail3d {

/// Sizes and this rank's index along the three tensor axes.
inline int gx(const ProcessGrid& g) {
  return g.shape().rows;
}
inline int gy(const ProcessGrid& g) {
  return g.shape().cols;
}
inline int gz(const ProcessGrid& g) {
  return g.shape().depth;
}
inline int x_of(const ProcessGrid& g) {
  return g.coords().row;
}
inline int y_of(const ProcessGrid& g) {
  return g.coords().col;
}
inline int z_of(const ProcessGrid& g) {
  return g.coords().depth;
}
/// The X group (x varies) and the Y group (y varies).
inline Communicator& x_comm(ProcessGrid& g) {
  return g.mesh_col();
}
inline Communicator& y_comm(ProcessGrid& g) {
  return g.mesh_row();
}

/// Construction-time agreement over the tensor group.
inline void agree(ProcessGrid& grid, const std::optional<std::string>& error) {
  grid.agree(CommAxis::tensor, error);
}

inline Scratch take_scratch(Arena& ws, std::size_t bytes) {
  return Scratch{ws.take_bytes(bytes), bytes};
}

/// In-place all-reduce (sum unless `op`) of a contiguous buffer; nothing for
/// a group of one.
template <class T>
void all_reduce(Communicator& c, T* data, index_t count, ReduceOp op = ReduceOp::sum) {
  if (c.size() > 1) c.all_reduce(data, data, static_cast<std::size_t>(count), dtype_v<T>, op);
}
template <class T>
Request iall_reduce(Communicator& c, T* data, index_t count) {
  if (c.size() <= 1) return {};
  return c.iall_reduce(data, data, static_cast<std::size_t>(count), dtype_v<T>, ReduceOp::sum);
}

using detail::check_view;

}  // namespace summa::detail3d

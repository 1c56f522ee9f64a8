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
#include "summa/schemes/cost.hpp"

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

/// The 3D ops' communication (cost::OpCost) on the rank (x, y, z) of an
/// X x Y x Z grid: X = mesh_col, Y = mesh_row, Z = depth. Each op's part is
/// defined beside the op (layers.cpp: linear, LayerNorm; vocab.cpp:
/// embedding, LM head).
class Cost3D final : public cost::LayoutCost {
 public:
  using u64 = cost::u64;
  /// The overlap switches of Axonn3DOptions: OAR, ORS, OAG.
  struct Overlap {
    bool all_reduce = true, reduce_scatter = false, all_gather = false;
  };
  Cost3D(u64 gx, u64 gy, u64 gz, u64 x, u64 y, u64 z, cost::Elements el, Overlap overlap)
      : gx_(gx), gy_(gy), gz_(gz), x_(x), y_(y), z_(z), el_(el), overlap_(overlap) {}

  SUMMA_OP_COST_LINEAR_OVERRIDES
  NormLayout norm_layout() const override;    // layers.cpp
  VocabLayout vocab_layout() const override;  // vocab.cpp
  cost::Elements elements() const override { return el_; }
  u64 local_rows(u64 tokens) const override { return tokens / gz_; }
  u64 local_cols(u64 width, ActivationLayout layout) const override {
    return width / (layout == ActivationLayout::inner ? gx_ : gy_);
  }
  u64 head_split() const override { return gx_; }
  bool defers_gradients() const override { return overlap_.reduce_scatter && gz_ > 1; }

 private:
  struct Axis {
    CommAxis axis;
    u64 g, r;
  };
  Axis X() const { return {CommAxis::mesh_col, gx_, x_}; }
  Axis Y() const { return {CommAxis::mesh_row, gy_, y_}; }
  Axis Z() const { return {CommAxis::depth, gz_, z_}; }
  // The 3D ops make no collective over an axis of one rank (nothing to
  // move), so neither does their cost: no bytes and no call.
  static void all_reduce(cost::Tally& t, Axis a, u64 count, u64 e) {
    if (a.g > 1) t.all_reduce(a.axis, count, a.g, a.r, e);
  }
  /// An all-gather or reduce-scatter over Z of `per_rank` elements each,
  /// overlapped or not.
  void z_all_gather(cost::Tally& t, u64 per_rank, bool overlapped = false) const {
    if (gz_ == 1) return;
    t.overlapped = overlapped;
    t.all_gather(CommAxis::depth, per_rank, gz_, el_.e);
    t.overlapped = false;
  }
  void z_reduce_scatter(cost::Tally& t, u64 per_rank, bool overlapped = false) const {
    if (gz_ == 1) return;
    t.overlapped = overlapped;
    t.reduce_scatter(CommAxis::depth, per_rank, gz_, el_.e);
    t.overlapped = false;
  }
  u64 gx_, gy_, gz_, x_, y_, z_;
  cost::Elements el_;
  Overlap overlap_;
};

}  // namespace summa::detail3d

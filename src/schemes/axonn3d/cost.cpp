// The closed-form communication of one 3D (AxoNN) training step
// (docs/communication.md): what the registry row's step_traffic adds.
#include <algorithm>

#include "summa/grid/placement.hpp"
#include "summa/schemes/cost.hpp"
#include "summa/schemes/spec.hpp"

namespace summa {

namespace {

using cost::Shape;
using cost::Tally;
using cost::u64;

// ---- 3D (AxoNN): X = mesh_col (rank x), Y = mesh_row (rank y), Z = depth (rank z).
struct Model3D {
  Tally& t;
  const Shape& s;
  u64 gx, gy, gz, x, y, z;

  struct Axis {
    CommAxis axis;
    u64 g, r;
  };
  Axis X() const { return {CommAxis::mesh_col, gx, x}; }
  Axis Y() const { return {CommAxis::mesh_row, gy, y}; }
  Axis Z() const { return {CommAxis::depth, gz, z}; }
  void ar(Axis a, u64 count, u64 e) { t.all_reduce(a.axis, count, a.g, a.r, e); }
  void ag_rs_z(u64 per_rank) { t.gather_or_scatter(CommAxis::depth, per_rank, gz, s.e); }
  u64 m() const { return s.T / gz; }

  // normal: input columns over Y (A), outputs over X (B); transposed: swapped.
  void linear_forward(u64 in, u64 out, bool transposed) {
    const Axis A = transposed ? X() : Y(), B = transposed ? Y() : X();
    ag_rs_z(in * out / (A.g * B.g * gz));  // all-gather the weight shard over Z
    ar(A, m() * out / B.g, s.e);           // partial outputs over the input axis
  }
  void linear_backward(u64 in, u64 out, bool transposed) {
    const Axis A = transposed ? X() : Y(), B = transposed ? Y() : X();
    const u64 shard = in * out / (A.g * B.g * gz);
    ag_rs_z(shard);              // the weight again (not cached)
    ar(B, m() * in / A.g, s.e);  // dX over the output axis
    ag_rs_z(shard);              // dW reduce-scatter over Z
    ar(Z(), out / B.g, s.e);     // bias gradient over Z
  }
  void layernorm_forward() {
    ar(Y(), m(), s.a);
    ar(Y(), m(), s.a);
  }
  void layernorm_backward() {
    ar(Y(), 2 * m(), s.a);
    ar(Z(), 2 * (s.h / gy), s.e);
  }
  void block_forward() {
    const u64 h = s.h;
    layernorm_forward();
    linear_forward(h, 3 * h, false);
    linear_forward(h, h, true);
    layernorm_forward();
    linear_forward(h, 4 * h, false);
    linear_forward(4 * h, h, true);
  }
  void block_backward() {
    const u64 h = s.h;
    linear_backward(4 * h, h, true);
    linear_backward(h, 4 * h, false);
    layernorm_backward();
    linear_backward(h, h, true);
    linear_backward(h, 3 * h, false);
    layernorm_backward();
  }
  void step() {
    const u64 wte_shard = s.V * s.h / (gx * gy * gz);
    // forward
    ag_rs_z(wte_shard);            // embedding: the wte shard
    ar(X(), m() * s.h / gy, s.e);  // rows held per vocabulary block
    for (u64 l = 0; l < s.L; ++l) block_forward();
    layernorm_forward();           // ln_f
    ag_rs_z(wte_shard);            // head: the wte shard
    ar(Y(), m() * s.V / gx, s.e);  // logits
    ar(X(), m(), s.a);             // row max
    ar(X(), 2 * m(), s.a);         // sum exp | target
    ar(Z(), 1, sizeof(double));    // loss
    // backward
    ag_rs_z(wte_shard);            // head: the wte shard again
    ar(X(), m() * s.h / gy, s.e);  // dX
    ag_rs_z(wte_shard);            // dwte reduce-scatter
    layernorm_backward();          // ln_f
    for (u64 l = 0; l < s.L; ++l) {
      if (s.checkpoint) block_forward();
      block_backward();
    }
    ar(Z(), s.P * (s.h / gy), s.e);  // embedding: wpe gradient
    ag_rs_z(wte_shard);              // embedding: dwte reduce-scatter
  }
  u64 block_params() const {
    const u64 h = s.h;
    return 12 * h * h / (gx * gy * gz) + 7 * h / gx + 6 * h / gy;
  }
  u64 ln_f_params() const { return 2 * (s.h / gy); }
  u64 embedding_params() const { return s.V * s.h / (gx * gy * gz) + s.P * (s.h / gy); }
};

}  // namespace

cost::BucketSizes axonn3d_step_traffic(cost::Tally& t, const cost::Shape& s, const SchemeSpec& spec,
                                       const GridCoords& c) {
  const auto u = [](int v) { return static_cast<u64>(v); };
  Model3D m{t, s, u(spec.gx), u(spec.gy), u(spec.gz), u(c.row), u(c.col), u(c.depth)};
  m.step();
  return {m.ln_f_params(), m.block_params(), m.embedding_params()};
}

}  // namespace summa

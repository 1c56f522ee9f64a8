// The closed-form communication of one 2D (SUMMA) training step
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

// ---- 2D (Optimus): rank (i, j); mesh_row rank j, mesh_col rank i, roots on row 0.
struct Model2D {
  Tally& t;
  const Shape& s;
  u64 q, i, j;

  void linear_forward(u64 in, u64 out) {
    t.summa(Form::AB, s.T, out, in, q, s.e);
    t.broadcast(CommAxis::mesh_col, out / q, q, i == 0, s.e);  // bias from row 0
  }
  void linear_backward(u64 in, u64 out) {
    t.summa(Form::ABt, s.T, in, out, q, s.e);               // dX
    t.summa(Form::AtB, in, out, s.T, q, s.e);               // dW
    t.reduce(CommAxis::mesh_col, out / q, q, i == 0, s.e);  // dbias to row 0
  }
  void layernorm_forward() {
    t.broadcast(CommAxis::mesh_col, 2 * (s.h / q), q, i == 0, s.e);  // gamma | beta
    t.all_reduce(CommAxis::mesh_row, s.T / q, q, j, s.a);            // sums
    t.all_reduce(CommAxis::mesh_row, s.T / q, q, j, s.a);            // squared deviations
  }
  void layernorm_backward() {
    t.broadcast(CommAxis::mesh_col, s.h / q, q, i == 0, s.e);     // gamma
    t.reduce(CommAxis::mesh_col, 2 * (s.h / q), q, i == 0, s.e);  // dgamma | dbeta
    t.all_reduce(CommAxis::mesh_row, 2 * (s.T / q), q, j, s.a);   // a | b partials
  }
  void block_forward() {
    const u64 h = s.h;
    layernorm_forward();
    linear_forward(h, 3 * h);
    linear_forward(h, h);
    layernorm_forward();
    linear_forward(h, 4 * h);
    linear_forward(4 * h, h);
  }
  void block_backward() {
    const u64 h = s.h;
    linear_backward(4 * h, h);
    linear_backward(h, 4 * h);
    layernorm_backward();
    linear_backward(h, h);
    linear_backward(h, 3 * h);
    layernorm_backward();
  }
  void step() {
    const u64 tq = s.T / q, hq = s.h / q;
    // forward
    t.gather_or_scatter(CommAxis::mesh_col, tq * hq, q, s.e);  // embedding reduce-scatter
    for (u64 l = 0; l < s.L; ++l) block_forward();
    layernorm_forward();                                        // ln_f
    t.summa(Form::ABt, s.T, s.V, s.h, q, s.e);                  // logits
    t.all_reduce(CommAxis::mesh_row, tq, q, j, s.a);            // row max
    t.all_reduce(CommAxis::mesh_row, 2 * tq, q, j, s.a);        // sum exp | target
    t.all_reduce(CommAxis::mesh_col, 1, q, i, sizeof(double));  // loss
    // backward
    t.summa(Form::AB, s.T, s.h, s.V, q, s.e);   // dX = dZ wte
    t.summa(Form::AtB, s.V, s.h, s.T, q, s.e);  // dwte += dZᵀ X
    layernorm_backward();                       // ln_f
    for (u64 l = 0; l < s.L; ++l) {
      if (s.checkpoint) block_forward();  // recomputation
      block_backward();
    }
    t.gather_or_scatter(CommAxis::mesh_col, tq * hq, q, s.e);  // embedding all-gather
  }
  // Local parameter elements of the data-axis buckets.
  u64 block_params() const {
    const u64 h = s.h, hq = h / q;
    return 12 * h * h / (q * q) + (i == 0 ? 13 * hq : 0);
  }
  u64 ln_f_params() const { return i == 0 ? 2 * (s.h / q) : 0; }
  u64 embedding_params() const {
    const u64 chunk = (s.P + q - 1) / q, first = i * chunk;
    const u64 rows = first >= s.P ? 0 : std::min(s.P, first + chunk) - first;
    return (s.V / q) * (s.h / q) + rows * (s.h / q);
  }
};

}  // namespace

cost::BucketSizes summa2d_step_traffic(cost::Tally& t, const cost::Shape& s, const SchemeSpec& spec,
                                       const GridCoords& c) {
  Model2D m{t, s, static_cast<u64>(spec.q), static_cast<u64>(c.row), static_cast<u64>(c.col)};
  m.step();
  return {m.ln_f_params(), m.block_params(), m.embedding_params()};
}

}  // namespace summa

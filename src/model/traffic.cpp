#include "summa/model/traffic.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>

namespace summa::model {

namespace {

using u64 = std::uint64_t;

// Adds collectives to per-axis counters with the formulas of
// docs/communication.md; g = group size, r = this rank's group rank, e =
// element size, counts in elements. Per-row statistics (LayerNorm sums and
// a | b partials, cross-entropy row max, sum exp and target logit) travel in
// acc_t (fp32 for bf16 models), everything else in the element type.
class Tally {
 public:
  TrafficCounters t;

  void both(CommAxis a, u64 bytes) {
    t[a].bytes_sent += bytes;
    t[a].bytes_received += bytes;
  }
  void all_reduce(CommAxis a, u64 count, u64 g, u64 r, u64 e) {
    const u64 c = count / g + (r < count % g ? 1 : 0);
    both(a, (count - c + (g - 1) * c) * e);
  }
  void broadcast(CommAxis a, u64 count, u64 g, bool root, u64 e) {
    if (root)
      t[a].bytes_sent += (g - 1) * count * e;
    else
      t[a].bytes_received += count * e;
  }
  void reduce(CommAxis a, u64 count, u64 g, bool root, u64 e) {
    if (root)
      t[a].bytes_received += (g - 1) * count * e;
    else
      t[a].bytes_sent += count * e;
  }
  void gather_or_scatter(CommAxis a, u64 per_rank, u64 g, u64 e) {
    both(a, (g - 1) * per_rank * e);
  }
  // SUMMA (docs/communication.md, "SUMMA per call"), global m x n x k.
  void summa(Form f, u64 m, u64 n, u64 k, u64 q, u64 e) {
    const u64 mb = m / q, nb = n / q, kb = k / q;
    switch (f) {
      case Form::AB:
        both(CommAxis::mesh_row, (q - 1) * mb * kb * e);
        both(CommAxis::mesh_col, (q - 1) * kb * nb * e);
        break;
      case Form::ABt:
        both(CommAxis::mesh_row, (q - 1) * mb * nb * e);
        both(CommAxis::mesh_col, (q - 1) * nb * kb * e);
        break;
      case Form::AtB:
        both(CommAxis::mesh_row, (q - 1) * kb * mb * e);
        both(CommAxis::mesh_col, (q - 1) * mb * nb * e);
        break;
    }
  }
};

struct Shape {
  u64 L, h, V, P, T;  // layers, hidden, vocabulary, positions, tokens per data group
  u64 e;              // element size
  u64 a;              // statistics element size: acc_t (fp32 for bf16), e otherwise
  bool checkpoint;
};

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

// ---- 1D (Megatron): every collective an all-reduce over the p ranks.
struct Model1D {
  Tally& t;
  const Shape& s;
  u64 p, r;

  void ar(u64 count, u64 e) { t.all_reduce(CommAxis::tensor, count, p, r, e); }
  void ar(u64 count) { ar(count, s.e); }
  void step() {
    const u64 Th = s.T * s.h;
    ar(Th);  // embedding
    for (u64 l = 0; l < s.L; ++l) {
      ar(Th);  // attention c_proj (row-parallel)
      ar(Th);  // MLP c_proj (row-parallel)
    }
    ar(s.T, s.a);      // cross-entropy row max
    ar(2 * s.T, s.a);  // sum exp | target logit
    ar(Th);            // head dX
    for (u64 l = 0; l < s.L; ++l) {
      if (s.checkpoint) {
        ar(Th);
        ar(Th);
      }
      ar(Th);  // MLP c_fc dX (column-parallel)
      ar(Th);  // attention c_attn dX (column-parallel)
    }
  }
  u64 block_params() const {
    const u64 h = s.h;
    return 12 * h * h / p + 7 * h / p + 6 * h;  // + replicated LayerNorms and row-parallel biases
  }
  u64 ln_f_params() const { return 2 * s.h; }
  u64 embedding_params() const { return (s.V / p) * s.h + s.P * s.h; }  // wpe replicated
};

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

template <class M>
void data_axis(Tally& t, const M& m, const Shape& s, u64 data, u64 d) {
  if (data == 1) return;
  t.all_reduce(CommAxis::data, 1, data, d, sizeof(double));  // the loss
  t.all_reduce(CommAxis::data, m.ln_f_params(), data, d, s.e);
  for (u64 l = 0; l < s.L; ++l) t.all_reduce(CommAxis::data, m.block_params(), data, d, s.e);
  t.all_reduce(CommAxis::data, m.embedding_params(), data, d, s.e);
}

}  // namespace

TrafficCounters predict_step_traffic(const SchemeSpec& spec, const reference::GptConfig& config,
                                     index_t batch, index_t seq, const GptOptions& options,
                                     DType dtype, const GridCoords& coords) {
  const auto u = [](auto v) { return static_cast<u64>(v); };
  const Shape s{.L = u(config.n_layer),
                .h = u(config.n_embd),
                .V = u(config.vocab_size),
                .P = u(config.n_positions),
                .T = u(batch / spec.data * seq),
                .e = u(size_of(dtype)),
                .a = u(size_of(acc_dtype(dtype))),
                .checkpoint = options.checkpoint};
  Tally t;
  switch (spec.scheme) {
    case Scheme::summa2d: {
      Model2D m{t, s, u(spec.q), u(coords.row), u(coords.col)};
      m.step();
      data_axis(t, m, s, u(spec.data), u(coords.data));
      break;
    }
    case Scheme::megatron1d: {
      Model1D m{t, s, u(spec.p), u(coords.col)};
      m.step();
      data_axis(t, m, s, u(spec.data), u(coords.data));
      break;
    }
    case Scheme::axonn3d: {
      Model3D m{
          t, s, u(spec.gx), u(spec.gy), u(spec.gz), u(coords.row), u(coords.col), u(coords.depth)};
      m.step();
      data_axis(t, m, s, u(spec.data), u(coords.data));
      break;
    }
  }
  return t.t;
}

}  // namespace summa::model

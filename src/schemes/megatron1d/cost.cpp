// The closed-form communication of one 1D (Megatron) training step
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

}  // namespace

cost::BucketSizes megatron1d_step_traffic(cost::Tally& t, const cost::Shape& s,
                                          const SchemeSpec& spec, const GridCoords& c) {
  Model1D m{t, s, static_cast<u64>(spec.p), static_cast<u64>(c.col)};
  m.step();
  return {m.ln_f_params(), m.block_params(), m.embedding_params()};
}

}  // namespace summa

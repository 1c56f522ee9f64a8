// A training step's communication: the bytes of the step walked from the
// model (step.hpp), plus the data axis.
#include "summa/model/traffic.hpp"

#include "step.hpp"
#include "summa/schemes/registry.hpp"

namespace summa::model {

TrafficCounters predict_step_traffic(const SchemeSpec& spec, const GptConfig& config, index_t batch,
                                     index_t seq, const GptOptions& options, DType dtype,
                                     const GridCoords& coords, bool optimizer_step) {
  const auto u = [](auto v) { return static_cast<cost::u64>(v); };
  const cost::u64 data = u(spec.data), d = u(coords.data), e = u(size_of(dtype));
  cost::Tally t;
  const detail::Buckets b =
      detail::walk_step(spec, config, batch, seq, options, dtype, coords, t, nullptr);
  // The data axis: the loss and each gradient bucket (ln_f, every block,
  // the embedding) all-reduced over the data groups; a bucket this rank
  // holds no element of (2D: ln_f off mesh row 0) is not all-reduced.
  // zero=2: each bucket reduced onto the groups whose chunks it meets.
  if (data > 1) {
    t.all_reduce(CommAxis::data, 1, data, d, sizeof(double));
    for (const detail::Buckets::Span& s : b.spans(u(config.n_layer))) {
      if (s.count == 0) continue;
      if (spec.zero < 2) {
        t.all_reduce(CommAxis::data, s.count, data, d, e);
        continue;
      }
      for (const auto& [root, count] : b.pieces(s, data))
        t.reduce(CommAxis::data, count, data, root == d, e);
    }
    // zero=3: every unit's values gathered in forward (one broadcast per
    // piece, from its chunk's group), and the blocks not still held from
    // forward again in backward
    if (spec.zero >= 3) {
      const std::vector<detail::Buckets::Span> spans = b.spans(u(config.n_layer));
      const auto gather = [&](const detail::Buckets::Span& s) {
        for (const auto& [root, count] : b.pieces(s, data))
          t.broadcast(CommAxis::data, count, data, root == d, e);
      };
      for (const detail::Buckets::Span& s : spans) gather(s);
      // spans: ln_f, block n-1 .. 0, the embedding; backward gathers the
      // blocks below the last block_value_slots again
      const cost::u64 again = b.regathered_blocks(u(config.n_layer));
      for (cost::u64 k = 0; k < again; ++k) gather(spans[spans.size() - 2 - k]);
    }
    // zero=1, 2: after the optimizer's step on its chunk, every data group's
    // updated chunk all-gathered (Trainer, all_gather_updates)
    if (spec.zero > 0 && spec.zero < 3 && optimizer_step)
      t.all_gather(CommAxis::data, b.parameters / data, data, e);
    // zero=2: the gradient norm's sum over the data groups (clip_grad_norm)
    if (spec.zero >= 2 && optimizer_step) t.all_reduce(CommAxis::data, 2, data, d, sizeof(double));
  }
  return t.t;
}

}  // namespace summa::model

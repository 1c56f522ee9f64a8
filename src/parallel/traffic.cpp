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
  // zero=3: each bucket (a unit, padded to D pieces) reduce-scattered, and
  // every unit's values all-gathered in forward, the blocks not still held
  // from forward again in backward.
  if (data > 1) {
    t.all_reduce(CommAxis::data, 1, data, d, sizeof(double));
    const std::vector<detail::Buckets::Span> spans = b.spans(u(config.n_layer));
    for (const detail::Buckets::Span& s : spans) {
      if (s.count == 0) continue;
      if (spec.zero >= 3) {
        t.reduce_scatter(CommAxis::data, detail::Buckets::piece(s, data), data, e);
        t.all_gather(CommAxis::data, detail::Buckets::piece(s, data), data, e);
      } else if (spec.zero == 2) {
        for (const auto& [root, count] : b.pieces(s, data))
          t.reduce(CommAxis::data, count, data, root == d, e);
      } else {
        t.all_reduce(CommAxis::data, s.count, data, d, e);
      }
    }
    if (spec.zero >= 3)  // spans: ln_f, block n-1 .. 0, the embedding
      for (cost::u64 k = 0, again = b.regathered_blocks(u(config.n_layer)); k < again; ++k)
        t.all_gather(CommAxis::data, detail::Buckets::piece(spans[spans.size() - 2 - k], data),
                     data, e);
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

#include "summa/model/traffic.hpp"

#include <fmt/format.h>

#include <cstdint>

#include "summa/schemes/registry.hpp"

namespace summa::model {

namespace {

using cost::u64;

// The data axis, on top of any scheme: the loss and each gradient bucket
// (LN_f, every block, the embedding) all-reduced over the data groups.
void data_axis(cost::Tally& t, const cost::BucketSizes& b, const cost::Shape& s, u64 data, u64 d) {
  if (data == 1) return;
  t.all_reduce(CommAxis::data, 1, data, d, sizeof(double));  // the loss
  t.all_reduce(CommAxis::data, b.ln_f, data, d, s.e);
  for (u64 l = 0; l < s.L; ++l) t.all_reduce(CommAxis::data, b.block, data, d, s.e);
  t.all_reduce(CommAxis::data, b.embedding, data, d, s.e);
}

}  // namespace

TrafficCounters predict_step_traffic(const SchemeSpec& spec, const GptConfig& config, index_t batch,
                                     index_t seq, const GptOptions& options, DType dtype,
                                     const GridCoords& coords) {
  const auto u = [](auto v) { return static_cast<u64>(v); };
  const cost::Shape s{.L = u(config.n_layer),
                      .h = u(config.n_embd),
                      .V = u(config.vocab_size),
                      .P = u(config.n_positions),
                      .T = u(batch / spec.data * seq),
                      .e = u(size_of(dtype)),
                      .a = u(size_of(acc_dtype(dtype))),
                      .checkpoint = options.checkpoint};
  cost::Tally t;
  const cost::BucketSizes buckets = scheme_row(spec.scheme).step_traffic(t, s, spec, coords);
  data_axis(t, buckets, s, u(spec.data), u(coords.data));
  return t.t;
}

}  // namespace summa::model

// A training step's communication, composed once for every scheme from the
// scheme's op costs (schemes/cost.hpp) in the order Gpt runs its layers
// (layers/gpt.hpp, transformer.hpp), plus the data axis.
#include "summa/model/traffic.hpp"

#include <cstdint>

#include "summa/schemes/registry.hpp"

namespace summa::model {

namespace {

using cost::u64;

// A GPT as its layers see it: tokens of a data group, global widths.
struct Model {
  const cost::OpCost& op;
  cost::Tally& t;
  u64 tokens, h, V, P;

  void linear_forward(u64 in, u64 out, LinearRole role) {
    op.linear_forward(t, tokens, in, out, role, true);
  }
  void linear_backward(u64 in, u64 out, LinearRole role) {
    op.linear_backward(t, tokens, in, out, role, true);
  }
  // TransformerBlock: ln_1, attention (c_attn expand, c_proj contract), ln_2,
  // MLP (c_fc expand, c_proj contract); attention itself is local.
  void block_forward() {
    op.layer_norm_forward(t, tokens, h);
    linear_forward(h, 3 * h, LinearRole::expand);
    linear_forward(h, h, LinearRole::contract);
    op.layer_norm_forward(t, tokens, h);
    linear_forward(h, 4 * h, LinearRole::expand);
    linear_forward(4 * h, h, LinearRole::contract);
  }
  void block_backward() {
    linear_backward(4 * h, h, LinearRole::contract);
    linear_backward(h, 4 * h, LinearRole::expand);
    op.layer_norm_backward(t, tokens, h);
    linear_backward(h, h, LinearRole::contract);
    linear_backward(h, 3 * h, LinearRole::expand);
    op.layer_norm_backward(t, tokens, h);
  }
  u64 block_params() const {
    return 2 * op.layer_norm_params(h) + op.linear_params(h, 3 * h, LinearRole::expand, true) +
           op.linear_params(h, h, LinearRole::contract, true) +
           op.linear_params(h, 4 * h, LinearRole::expand, true) +
           op.linear_params(4 * h, h, LinearRole::contract, true);
  }
};

}  // namespace

TrafficCounters predict_step_traffic(const SchemeSpec& spec, const GptConfig& config, index_t batch,
                                     index_t seq, const GptOptions& options, DType dtype,
                                     const GridCoords& coords) {
  const auto u = [](auto v) { return static_cast<u64>(v); };
  const u64 L = u(config.n_layer), data = u(spec.data), d = u(coords.data);
  const cost::Elements el{.e = u(size_of(dtype)), .a = u(size_of(acc_dtype(dtype)))};
  const auto op = scheme_row(spec.scheme).op_cost(spec, coords, el);
  cost::Tally t;
  Model m{*op,
          t,
          u(batch / spec.data * seq),
          u(config.n_embd),
          u(config.vocab_size),
          u(config.n_positions)};
  // forward
  op->embedding_forward(t, m.tokens, m.V, m.h, m.P);
  for (u64 l = 0; l < L; ++l) m.block_forward();
  op->layer_norm_forward(t, m.tokens, m.h);  // ln_f
  op->lm_head_forward(t, m.tokens, m.V, m.h);
  // backward (a checkpointed block recomputes its forward first)
  op->lm_head_backward(t, m.tokens, m.V, m.h);
  op->layer_norm_backward(t, m.tokens, m.h);
  for (u64 l = 0; l < L; ++l) {
    if (options.checkpoint) m.block_forward();
    m.block_backward();
  }
  op->embedding_backward(t, m.tokens, m.V, m.h, m.P);
  // The data axis: the loss and each gradient bucket (ln_f, every block,
  // the embedding) all-reduced over the data groups.
  if (data > 1) {
    t.all_reduce(CommAxis::data, 1, data, d, sizeof(double));
    t.all_reduce(CommAxis::data, op->layer_norm_params(m.h), data, d, el.e);
    for (u64 l = 0; l < L; ++l) t.all_reduce(CommAxis::data, m.block_params(), data, d, el.e);
    t.all_reduce(CommAxis::data, op->embedding_params(m.V, m.h, m.P), data, d, el.e);
  }
  return t.t;
}

}  // namespace summa::model

#include "step.hpp"

#include "summa/backend/cpu_backend.hpp"
#include "summa/layers/gpt.hpp"
#include "summa/schemes/registry.hpp"

namespace summa::model::detail {

namespace {

// Records into ops (when given) while composing.
class Composer {
 public:
  Composer(const cost::OpCost& op, cost::Tally& t, const StepDims& d, std::vector<StepOp>* ops)
      : op_(op), t_(t), d_(d), ops_(ops) {}

  /// Starts an op; its work is recorded only while `record` (the first of
  /// the layers' repetitions).
  void begin(std::string_view name, Phase phase, u64 count, bool record = true) {
    if (ops_ == nullptr || !record) {
      t_.log = nullptr;
      return;
    }
    ops_->push_back({.name = name, .phase = phase, .count = count, .work = {}});
    t_.log = &ops_->back().work;
  }

  // A block's own work (attention core, GeLU, residual adds): local, the
  // same under every scheme but for the local sizes.
  void attention_core(bool backward) {
    const u64 e = element();
    const u64 rows = op_.local_rows(d_.tokens), sequences = rows / d_.seq;
    const u64 heads = d_.heads / op_.head_split(), head_dim = d_.hidden / d_.heads;
    // Attention makes one strided-batched call of `heads` products per
    // sequence (layers/attention_core.hpp)
    const u64 s = d_.seq, batch = sequences * heads;
    const u64 scores = batch * s * s * e;
    const u64 qkv = rows * op_.local_cols(3 * d_.hidden, ActivationLayout::inner) * e;
    if (!backward) {
      t_.memory(qkv);                                            // head-major copies of q, k, v
      t_.gemm(s, s, head_dim, e, heads, sequences);              // S = Q Kᵀ
      t_.pointwise(Pointwise::softmax, scores / e, 3 * scores);  // masked softmax
      t_.gemm(s, head_dim, s, e, heads, sequences);              // O = P V
      t_.memory(2 * (qkv / 3));                                  // context back to token-major
    } else {
      t_.memory(2 * (qkv / 3));
      t_.gemm(s, s, head_dim, e, heads, sequences);      // dP = dO Vᵀ
      t_.gemm(s, head_dim, s, e, heads, sequences);      // dV = Pᵀ dO
      t_.memory(4 * scores);                             // softmax backward
      t_.gemm(s, head_dim, s, e, heads, 2 * sequences);  // dQ = dS K, dK = dSᵀ Q
      t_.memory(qkv);
    }
  }
  void gelu(bool backward) {
    const u64 n =
        op_.local_rows(d_.tokens) * op_.local_cols(4 * d_.hidden, ActivationLayout::inner);
    t_.pointwise(backward ? Pointwise::gelu_grad : Pointwise::gelu, n,
                 (backward ? 3 : 2) * n * element());
  }
  void residual_add() {
    const u64 n = op_.local_rows(d_.tokens) * op_.local_cols(d_.hidden, ActivationLayout::outer);
    t_.memory(3 * n * element());
  }

  void linear_forward(u64 in, u64 out, LinearRole role) {
    op_.linear_forward(t_, d_.tokens, in, out, role, true);
  }
  void linear_backward(u64 in, u64 out, LinearRole role) {
    op_.linear_backward(t_, d_.tokens, in, out, role, true);
  }

  // TransformerBlock: ln_1, attention (c_attn expand, core, c_proj
  // contract), residual, ln_2, MLP (c_fc expand, GeLU, c_proj contract),
  // residual.
  void block_forward(Phase phase, bool record) {
    const u64 h = d_.hidden, L = d_.layers;
    begin("block.ln_1", phase, L, record);
    op_.layer_norm_forward(t_, d_.tokens, h);
    begin("block.attn.c_attn", phase, L, record);
    linear_forward(h, 3 * h, LinearRole::expand);
    begin("block.attn.core", phase, L, record);
    attention_core(false);
    begin("block.attn.c_proj", phase, L, record);
    linear_forward(h, h, LinearRole::contract);
    residual_add();
    begin("block.ln_2", phase, L, record);
    op_.layer_norm_forward(t_, d_.tokens, h);
    begin("block.mlp.c_fc", phase, L, record);
    linear_forward(h, 4 * h, LinearRole::expand);
    begin("block.mlp.gelu", phase, L, record);
    gelu(false);
    begin("block.mlp.c_proj", phase, L, record);
    linear_forward(4 * h, h, LinearRole::contract);
    residual_add();
  }
  void block_backward(bool record) {
    const u64 h = d_.hidden, L = d_.layers;
    const Phase b = Phase::backward;
    begin("block.mlp.c_proj", b, L, record);
    linear_backward(4 * h, h, LinearRole::contract);
    begin("block.mlp.gelu", b, L, record);
    gelu(true);
    begin("block.mlp.c_fc", b, L, record);
    linear_backward(h, 4 * h, LinearRole::expand);
    begin("block.ln_2", b, L, record);
    op_.layer_norm_backward(t_, d_.tokens, h);
    residual_add();
    begin("block.attn.c_proj", b, L, record);
    linear_backward(h, h, LinearRole::contract);
    begin("block.attn.core", b, L, record);
    attention_core(true);
    begin("block.attn.c_attn", b, L, record);
    linear_backward(h, 3 * h, LinearRole::expand);
    begin("block.ln_1", b, L, record);
    op_.layer_norm_backward(t_, d_.tokens, h);
    residual_add();
  }

  Buckets step() {
    const u64 L = d_.layers, h = d_.hidden;
    begin("embedding", Phase::forward, 1);
    op_.embedding_forward(t_, d_.tokens, d_.vocab, h, d_.positions);
    for (u64 l = 0; l < L; ++l) block_forward(Phase::forward, l == 0);
    begin("ln_f", Phase::forward, 1);
    op_.layer_norm_forward(t_, d_.tokens, h);
    begin("lm_head", Phase::forward, 1);
    op_.lm_head_forward(t_, d_.tokens, d_.vocab, h);
    // backward (a checkpointed block recomputes its forward first)
    begin("lm_head", Phase::backward, 1);
    op_.lm_head_backward(t_, d_.tokens, d_.vocab, h);
    begin("ln_f", Phase::backward, 1);
    op_.layer_norm_backward(t_, d_.tokens, h);
    for (u64 l = 0; l < L; ++l) {
      if (d_.checkpoint) block_forward(Phase::recompute, l == 0);
      block_backward(l == 0);
    }
    begin("embedding", Phase::backward, 1);
    op_.embedding_backward(t_, d_.tokens, d_.vocab, h, d_.positions);
    t_.log = nullptr;
    const u64 block = 2 * op_.layer_norm_params(h) +
                      op_.linear_params(h, 3 * h, LinearRole::expand, true) +
                      op_.linear_params(h, h, LinearRole::contract, true) +
                      op_.linear_params(h, 4 * h, LinearRole::expand, true) +
                      op_.linear_params(4 * h, h, LinearRole::contract, true);
    return {.ln_f = op_.layer_norm_params(h),
            .block = block,
            .embedding = op_.embedding_params(d_.vocab, h, d_.positions)};
  }

 private:
  u64 element() const { return d_.element; }

  const cost::OpCost& op_;
  cost::Tally& t_;
  const StepDims& d_;
  std::vector<StepOp>* ops_;
};

}  // namespace

StepDims step_dims(const GptConfig& config, index_t batch, index_t seq, int data, DType dtype,
                   bool checkpoint) {
  const auto u = [](auto v) { return static_cast<u64>(v); };
  return {.layers = u(config.n_layer),
          .tokens = u(batch / data * seq),
          .seq = u(seq),
          .hidden = u(config.n_embd),
          .heads = u(config.n_head),
          .vocab = u(config.vocab_size),
          .positions = u(config.n_positions),
          .element = u(size_of(dtype)),
          .checkpoint = checkpoint};
}

Buckets compose_step(const cost::OpCost& op, cost::Tally& t, const StepDims& d,
                     std::vector<StepOp>* ops) {
  return Composer(op, t, d, ops).step();
}

namespace {
template <class T>
Buckets walk(const SchemeSpec& spec, const GptConfig& config, index_t batch, index_t seq,
             GptOptions options, const GridCoords& coords, cost::Tally& t,
             std::vector<StepOp>* ops) {
  options.plan_only = true;
  CpuBackend backend;  // a plan allocates nothing
  ProcessGrid grid = ProcessGrid::plan(scheme_row(spec.scheme).grid_shape(spec), coords);
  const std::unique_ptr<SchemeContext<T>> context = make_context<T>(spec, grid, backend);
  Gpt<T> model(*context, config, batch, seq, options);
  t.ops = ops;
  model.price(t, Phase::forward);
  model.price(t, Phase::backward);
  t.ops = nullptr;
  t.log = nullptr;
  const std::vector<std::uint64_t> b = model.data_bucket_elements();
  return {.ln_f = b.front(),
          .block = b.size() > 2 ? b[1] : 0,
          .embedding = b.back(),
          .defers_gradients = context->defers_gradients()};
}
}  // namespace

Buckets walk_step(const SchemeSpec& spec, const GptConfig& config, index_t batch, index_t seq,
                  GptOptions options, DType dtype, const GridCoords& coords, cost::Tally& t,
                  std::vector<StepOp>* ops) {
  if (dtype == DType::f64) return walk<double>(spec, config, batch, seq, options, coords, t, ops);
  if (dtype == DType::bf16) return walk<bf16>(spec, config, batch, seq, options, coords, t, ops);
  return walk<float>(spec, config, batch, seq, options, coords, t, ops);
}

}  // namespace summa::model::detail

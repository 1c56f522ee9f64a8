// Each 2D layer alone against the serial reference GPT at whatever q the rank
// count gives (CTest: 1, 4 and 9 ranks): Linear2DLayer (plain and with the
// q|k|v column groups of c_attn), LayerNorm2DLayer, GeLU2D, Attention2D,
// MLP2D, TransformerBlock2D, Embedding2D and the tied LMHead2D with the
// vocabulary-parallel cross-entropy.
//
// Oracle: a serial reference::Gpt (1 layer) runs forward and backward on
// fresh random weights and tokens; it exposes every activation and the
// gradient of the loss with respect to it. A layer alone gets the
// reference's input activation (its local block) and, in backward, the
// reference's gradient of its output; its output, its input gradient and
// every parameter gradient (gathered to the global tensor) must match the
// reference's. Parameters come from the same layout-invariant
// initialisation. Errors are max |a - b| / max |b| over the whole tensor,
// tolerance 1e-9 in double and 2e-3 in float (see test_gpt2d.cpp). The same
// tolerances hold on the CUDA backend: its float GEMMs accumulate in fp32
// (like Eigen's; TF32 off) and its float GeLU / softmax / exp, evaluated in
// float instead of double per element, add a few float ulps (~1e-6
// relative) per element, far below 2e-3.
//
// Backend: test_backend() (mesh_env()). Activations are built on the host,
// uploaded, and outputs, intermediates and gradients downloaded before they
// are compared; token ids and targets are passed as host spans.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "test_util.hpp"

namespace summa::test {
namespace {

// Local block of a global row-major [rows, cols] tensor: token rows of block
// i; columns of block j within each of `groups` equal column groups.
template <class T>
std::vector<T> local_of(std::span<const T> global, index_t rows, index_t cols, int groups = 1) {
  MeshEnv& e = mesh_env();
  const int q = e.engine.q(), i = e.grid.coords().row, j = e.grid.coords().col;
  const index_t gw = cols / groups, w = gw / q;
  std::vector<T> out;
  for (index_t r = i * rows / q; r < (i + 1) * rows / q; ++r)
    for (int g = 0; g < groups; ++g)
      for (index_t c = g * gw + j * w; c < g * gw + (j + 1) * w; ++c)
        out.push_back(global[static_cast<std::size_t>(r * cols + c)]);
  return out;
}

// A local activation block stored row-major in the test backend's memory:
// `d` uploaded, NaN where it has no data (outputs that must be written).
template <class T>
struct Local {
  index_t rows, cols;
  DeviceArray<T> array;
  Local(index_t r, index_t c, std::vector<T> d = {})
      : rows(r), cols(c), array(static_cast<std::size_t>(r * c)) {
    d.resize(static_cast<std::size_t>(r * c), std::numeric_limits<T>::quiet_NaN());
    array.upload(d);
  }
  MatrixView<T> view() { return array.view(rows, cols, Order::row_major); }
  /// The contents, downloaded.
  std::vector<T> data() const { return array.download(); }
};

// Arenas sized from a layer's declared needs.
struct Arenas {
  Arena workspace, forward, backward;
  StepBuffers step{workspace, forward, backward};
  Arenas(Backend& b, const BufferNeeds& n)
      : workspace("workspace", b, n.workspace),
        forward("forward", b, n.forward),
        backward("backward", b, n.backward) {}
};

// The serial model the layers are checked against.
template <class T>
struct Oracle {
  reference::GptConfig config;
  index_t batch, seq, tokens_n;
  std::uint64_t seed;
  std::vector<std::int32_t> tokens, targets;
  reference::Gpt<T> ref;

  static reference::GptConfig make_config(int q) {
    reference::GptConfig c;
    c.n_layer = 1;
    c.n_head = 2 * q;
    c.n_embd = 8 * q;
    c.n_positions = 7;
    c.vocab_size = 13 * q;
    return c;
  }
  explicit Oracle(int q)
      : config(make_config(q)),
        batch(2 * q),
        seq(5),
        tokens_n(batch * seq),
        seed(fresh_seed()),
        ref(config, seed) {
    std::mt19937_64 gen(seed);
    std::uniform_int_distribution<int> dist(0, config.vocab_size - 1);
    for (index_t k = 0; k < tokens_n; ++k) tokens.push_back(dist(gen));
    for (index_t k = 0; k < tokens_n; ++k) targets.push_back(dist(gen));
    ref.forward(tokens, targets, batch, seq);
    ref.backward();
  }
  std::span<const T> act(const std::string& n) const { return ref.activation(n); }
  std::span<const T> dact(const std::string& n) const { return ref.activation_grad(n); }
};

// Every parameter gradient of `layer`, gathered, against the reference.
template <class T>
void expect_param_grads(Module<T>& layer, const reference::Gpt<T>& ref) {
  for (Param<T>* p : layer.parameters()) {
    const auto global = gather_global(*p, mesh_env().grid, true);
    EXPECT_LE(rel_error(global, ref.grad(p->shard.name)), model_tolerance<T>()) << p->shard.name;
  }
}

template <class T>
void expect_close(const std::vector<T>& got, const std::vector<T>& want, const char* what) {
  EXPECT_LE(max_over_ranks(rel_error(got, want)), model_tolerance<T>()) << what;
}

// Runs an activation-to-activation layer: input activation `in` (out_cols
// wide output `out`), output gradient from the reference, compares Y, dX
// and the parameter gradients.
template <class T>
void check_layer(Layer<T>& layer, const Oracle<T>& o, const std::string& in, index_t in_cols,
                 const std::string& out, index_t out_cols, const std::vector<T>& want_dx,
                 int in_groups = 1, int out_groups = 1,
                 const std::function<void()>& after_forward = {}) {
  MeshEnv& e = mesh_env();
  const int q = e.engine.q();
  ParameterStore<T> store(e.backend, layer.parameters());
  store.init_gpt(o.seed, o.config);
  Arenas arenas(e.backend, layer.buffer_needs());
  const index_t nt = o.tokens_n / q;
  Local<T> x(nt, in_cols / q, local_of(o.act(in), o.tokens_n, in_cols, in_groups));
  Local<T> y(nt, out_cols / q), dx(nt, in_cols / q);
  Local<T> dy(nt, out_cols / q, local_of(o.dact(out), o.tokens_n, out_cols, out_groups));
  layer.forward(x.view(), y.view(), arenas.step);
  if (after_forward) after_forward();
  expect_close(y.data(), local_of(o.act(out), o.tokens_n, out_cols, out_groups), "Y");
  layer.backward(dy.view(), dx.view(), arenas.step);
  expect_close(dx.data(), want_dx, "dX");
  expect_param_grads<T>(layer, o.ref);
}

template <class T>
void linear_plain() {
  MeshEnv& e = mesh_env();
  Oracle<T> o(e.engine.q());
  SCOPED_TRACE(seed_note(o.seed));
  const index_t h = o.config.n_embd;
  Linear2DLayer<T> fc(e.engine, "h.0.mlp.c_fc", o.tokens_n, h, 4 * h);
  // ln_2's output only feeds c_fc: its gradient is c_fc's input gradient.
  check_layer<T>(fc, o, "h.0.ln_2", h, "h.0.mlp.c_fc", 4 * h,
                 local_of(o.dact("h.0.ln_2"), o.tokens_n, h));
}
TEST(Layers2D, LinearDouble) {
  linear_plain<double>();
}
TEST(Layers2D, LinearFloat) {
  linear_plain<float>();
}

template <class T>
void linear_grouped() {
  MeshEnv& e = mesh_env();
  Oracle<T> o(e.engine.q());
  SCOPED_TRACE(seed_note(o.seed));
  const index_t h = o.config.n_embd;
  Linear2DLayer<T> attn(e.engine, "h.0.attn.c_attn", o.tokens_n, h, 3 * h, true, 3);
  check_layer<T>(attn, o, "h.0.ln_1", h, "h.0.attn.c_attn", 3 * h,
                 local_of(o.dact("h.0.ln_1"), o.tokens_n, h), 1, 3);
}
TEST(Layers2D, LinearQkvGroupsDouble) {
  linear_grouped<double>();
}
TEST(Layers2D, LinearQkvGroupsFloat) {
  linear_grouped<float>();
}

template <class T>
void layernorm() {
  MeshEnv& e = mesh_env();
  Oracle<T> o(e.engine.q());
  SCOPED_TRACE(seed_note(o.seed));
  const index_t h = o.config.n_embd;
  LayerNorm2DLayer<T> ln(e.engine, "h.0.ln_2", o.tokens_n, h, o.config.layer_norm_epsilon);
  // mid feeds the residual and ln_2: ln_2's input gradient is d mid - d output.
  auto want = local_of(o.dact("h.0.mid"), o.tokens_n, h);
  const auto out = local_of(o.dact("h.0.output"), o.tokens_n, h);
  for (std::size_t k = 0; k < want.size(); ++k) want[k] -= out[k];
  check_layer<T>(ln, o, "h.0.mid", h, "h.0.ln_2", h, want);
}
TEST(Layers2D, LayerNormDouble) {
  layernorm<double>();
}
TEST(Layers2D, LayerNormFloat) {
  layernorm<float>();
}

template <class T>
void gelu() {
  MeshEnv& e = mesh_env();
  Oracle<T> o(e.engine.q());
  SCOPED_TRACE(seed_note(o.seed));
  const index_t f = 4 * o.config.n_embd;
  GeLU2D<T> layer(e.backend);
  check_layer<T>(layer, o, "h.0.mlp.c_fc", f, "h.0.mlp.gelu", f,
                 local_of(o.dact("h.0.mlp.c_fc"), o.tokens_n, f));
}
TEST(Layers2D, GeLUDouble) {
  gelu<double>();
}
TEST(Layers2D, GeLUFloat) {
  gelu<float>();
}

template <class T>
void attention() {
  MeshEnv& e = mesh_env();
  Oracle<T> o(e.engine.q());
  SCOPED_TRACE(seed_note(o.seed));
  const index_t h = o.config.n_embd;
  Attention2D<T> attn(e.engine, "h.0.attn", o.batch, o.seq, h, o.config.n_head);
  // the intermediate activations too: q | k | v of this column's heads, context
  const auto intermediates = [&] {
    expect_close(download_view(attn.qkv()),
                 local_of(o.act("h.0.attn.c_attn"), o.tokens_n, 3 * h, 3), "qkv");
    expect_close(download_view(attn.context()), local_of(o.act("h.0.attn.context"), o.tokens_n, h),
                 "context");
  };
  check_layer<T>(attn, o, "h.0.ln_1", h, "h.0.attn.c_proj", h,
                 local_of(o.dact("h.0.ln_1"), o.tokens_n, h), 1, 1, intermediates);
}
TEST(Layers2D, AttentionDouble) {
  attention<double>();
}
TEST(Layers2D, AttentionFloat) {
  attention<float>();
}

template <class T>
void mlp() {
  MeshEnv& e = mesh_env();
  Oracle<T> o(e.engine.q());
  SCOPED_TRACE(seed_note(o.seed));
  const index_t h = o.config.n_embd;
  MLP2D<T> layer(e.engine, "h.0.mlp", o.tokens_n, h);
  check_layer<T>(layer, o, "h.0.ln_2", h, "h.0.mlp.c_proj", h,
                 local_of(o.dact("h.0.ln_2"), o.tokens_n, h));
}
TEST(Layers2D, MLPDouble) {
  mlp<double>();
}
TEST(Layers2D, MLPFloat) {
  mlp<float>();
}

template <class T>
void block() {
  MeshEnv& e = mesh_env();
  Oracle<T> o(e.engine.q());
  SCOPED_TRACE(seed_note(o.seed));
  const index_t h = o.config.n_embd;
  TransformerBlock2D<T> layer(e.engine, "h.0", o.batch, o.seq, h, o.config.n_head,
                              o.config.layer_norm_epsilon);
  EXPECT_EQ(layer.parameters().size(), 12u);
  check_layer<T>(layer, o, "embeddings", h, "h.0.output", h,
                 local_of(o.dact("embeddings"), o.tokens_n, h));
}
TEST(Layers2D, BlockDouble) {
  block<double>();
}
TEST(Layers2D, BlockFloat) {
  block<float>();
}

template <class T>
void embedding() {
  MeshEnv& e = mesh_env();
  const int q = e.engine.q();
  Oracle<T> o(q);
  SCOPED_TRACE(seed_note(o.seed));
  const index_t h = o.config.n_embd, V = o.config.vocab_size, nt = o.tokens_n / q;
  Embedding2D<T> emb(e.engine, o.batch, o.seq, V, h, o.config.n_positions);
  ParameterStore<T> store(e.backend, emb.parameters());
  store.init_gpt(o.seed, o.config);
  Arenas arenas(e.backend, emb.buffer_needs());
  Local<T> y(nt, h / q), dy(nt, h / q, local_of(o.dact("embeddings"), o.tokens_n, h));
  emb.forward(o.tokens, y.view(), arenas.step);
  expect_close(y.data(), local_of(o.act("embeddings"), o.tokens_n, h), "embeddings");
  emb.backward(dy.view(), arenas.step);
  // wpe is only used here: the reference's gradient is exactly this layer's.
  EXPECT_LE(rel_error(gather_global(emb.wpe(), e.grid, true), o.ref.grad("wpe.weight")),
            model_tolerance<T>());
  // wte's embedding part, independently: rows of d embeddings added by token id.
  std::vector<double> want(static_cast<std::size_t>(V * h), 0.0);
  const auto d = o.dact("embeddings");
  for (index_t r = 0; r < o.tokens_n; ++r)
    for (index_t c = 0; c < h; ++c)
      want[static_cast<std::size_t>(o.tokens[static_cast<std::size_t>(r)] * h + c)] +=
          static_cast<double>(d[static_cast<std::size_t>(r * h + c)]);
  EXPECT_LE(rel_error(gather_global(emb.wte(), e.grid, true), want), model_tolerance<T>());
}
TEST(Layers2D, EmbeddingDouble) {
  embedding<double>();
}
TEST(Layers2D, EmbeddingFloat) {
  embedding<float>();
}

template <class T>
void lm_head() {
  MeshEnv& e = mesh_env();
  const int q = e.engine.q();
  Oracle<T> o(q);
  SCOPED_TRACE(seed_note(o.seed));
  const index_t h = o.config.n_embd, V = o.config.vocab_size, nt = o.tokens_n / q;
  Embedding2D<T> emb(e.engine, o.batch, o.seq, V, h, o.config.n_positions);
  LMHead2D<T> head(e.engine, emb.wte(), o.tokens_n, h, V);
  EXPECT_TRUE(head.parameters().empty());  // tied
  ParameterStore<T> store(e.backend, emb.parameters());
  store.init_gpt(o.seed, o.config);
  BufferNeeds needs = head.buffer_needs();
  Arenas arenas(e.backend, needs);
  Local<T> x(nt, h / q, local_of(o.act("ln_f"), o.tokens_n, h)), dx(nt, h / q);
  const double loss = head.forward(x.view(), o.targets, arenas.step);
  EXPECT_NEAR(loss, static_cast<double>(o.ref.loss()),
              model_tolerance<T>() * std::abs(static_cast<double>(o.ref.loss())));
  expect_close(download_view(head.logits()), local_of(o.act("logits"), o.tokens_n, V), "logits");
  head.backward(dx.view(), arenas.step);
  expect_close(download_view(head.logits()), local_of(o.dact("logits"), o.tokens_n, V), "dlogits");
  expect_close(dx.data(), local_of(o.dact("ln_f"), o.tokens_n, h), "dX");
  // wte's head part, independently: dlogitsᵀ · ln_f.
  std::vector<double> want(static_cast<std::size_t>(V * h), 0.0);
  const auto dz = o.dact("logits");
  const auto xf = o.act("ln_f");
  for (index_t r = 0; r < o.tokens_n; ++r)
    for (index_t v = 0; v < V; ++v)
      for (index_t c = 0; c < h; ++c)
        want[static_cast<std::size_t>(v * h + c)] +=
            static_cast<double>(dz[static_cast<std::size_t>(r * V + v)]) *
            static_cast<double>(xf[static_cast<std::size_t>(r * h + c)]);
  EXPECT_LE(rel_error(gather_global(emb.wte(), e.grid, true), want), model_tolerance<T>());
}
TEST(Layers2D, LMHeadCrossEntropyDouble) {
  lm_head<double>();
}
TEST(Layers2D, LMHeadCrossEntropyFloat) {
  lm_head<float>();
}

// The shard descriptions cover every global element exactly once (gather
// checks it) and keep Hugging Face names and shapes.
TEST(Layers2D, ShardsCoverEachElementOnce) {
  MeshEnv& e = mesh_env();
  const int q = e.engine.q();
  TransformerBlock2D<double> layer(e.engine, "h.0", q, 3, 8 * q, 2 * q);
  ParameterStore<double> store(e.backend, layer.parameters());
  const reference::GptConfig config = Oracle<double>::make_config(q);
  store.init_gpt(11, config);
  const std::vector<reference::ParamInfo> infos = reference::parameter_list(config);
  for (Param<double>* p : store.params()) {
    const auto info = std::find_if(infos.begin(), infos.end(),
                                   [&](const auto& i) { return i.name == p->shard.name; });
    ASSERT_NE(info, infos.end()) << p->shard.name;
    EXPECT_EQ(p->shard.global_shape, info->shape) << p->shard.name;
    const auto global = gather_global(*p, e.grid);  // throws unless covered exactly once
    for (index_t k = 0; k < p->shard.global_size(); ++k)
      ASSERT_EQ(global[static_cast<std::size_t>(k)],
                reference::init_value(11, p->shard.name, k, config))
          << p->shard.name << " element " << k;
  }
}

TEST(Layers2D, AttentionConfigErrors) {
  MeshEnv& e = mesh_env();
  const int q = e.engine.q();
  const auto error_of = [&](index_t batch, index_t hidden, index_t heads) {
    std::string msg;
    try {
      Attention2D<float> a(e.engine, "h.0.attn", batch, 4, hidden, heads);
    } catch (const Error& err) {
      msg = err.what();
    }
    EXPECT_TRUE(same_on_all_ranks(msg)) << msg;
    return msg;
  };
  EXPECT_NE(error_of(q, 8 * q + q, 2 * q).find("divisible by heads"), std::string::npos);
  if (q > 1) {
    EXPECT_NE(error_of(q + 1, 8 * q, 2 * q).find("batch="), std::string::npos);
    EXPECT_NE(error_of(q, 2 * q * (q + 1), q + 1).find("heads="), std::string::npos);
  }
}

}  // namespace
}  // namespace summa::test

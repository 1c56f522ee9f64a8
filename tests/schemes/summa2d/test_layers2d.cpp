// Each 2D layer alone against the serial reference GPT at whatever q the rank
// count gives (CTest: 1, 4 and 9 ranks): Linear2DLayer (plain and with the
// q|k|v column groups of c_attn), LayerNorm2DLayer, GeLU, Attention (2D),
// MLP (2D), TransformerBlock (2D), Embedding2D and the tied LMHead2D with the
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
// bf16 (mixed precision): each layer in bf16 against the double reference
// run on the bf16-rounded weights (what ParameterStore<bf16>::init_gpt
// holds), on the reference's input and output gradient rounded to bf16.
// Errors are norm-wise, ||a - b|| / ||b|| over the whole tensor, in units of
// u = 2^-8 (bf16's unit roundoff): activations 4u, gradients 6u, the loss 1u,
// the bounds of the 1D block test (test_gpt1d.cpp), about 2x the worst
// measured (see kBf16ActTolerance below). A wrong result (a missing block, a
// wrong sign or layout) is off by O(1) of the norm.
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
#include <type_traits>
#include <vector>

#include "test_util.hpp"

namespace summa::test {
namespace {

template <class T>
constexpr bool kIsBf16 = std::is_same_v<T, bf16>;
// The reference's element type for layers in T: double for bf16 layers.
template <class T>
using Ref = std::conditional_t<kIsBf16<T>, double, T>;

// bf16 bounds (norm-wise, see the file comment). Measured worst over 13 runs
// of every bf16 test at each of q = 1, 2, 3 (SUMMA_TEST_PRINT_ERRORS=1 prints
// each test's errors): activations 1.9u (MLP output), gradients 3.0u
// (ln_2.bias through the whole block), loss below 0.01u.
constexpr double kBf16ActTolerance = 4 * kBf16Unit;
constexpr double kBf16GradTolerance = 6 * kBf16Unit;
constexpr double kBf16LossTolerance = kBf16Unit;

enum class Kind { activation, gradient };

template <class T>
T nan_of() {
  if constexpr (kIsBf16<T>)
    return bf16(std::numeric_limits<float>::quiet_NaN());
  else
    return std::numeric_limits<T>::quiet_NaN();
}

template <class T, class R>
std::vector<T> as(const std::vector<R>& v) {
  std::vector<T> out;
  out.reserve(v.size());
  for (const R& x : v) out.push_back(static_cast<T>(x));
  return out;
}

// Prints a bf16 error (rank 0) when SUMMA_TEST_PRINT_ERRORS is set.
void note_bf16(const char* what, double err) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0 || std::getenv("SUMMA_TEST_PRINT_ERRORS") == nullptr) return;
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  std::printf("[bf16 errors] %s %s = %.2f u\n", info ? info->name() : "", what, err / kBf16Unit);
}

// The error of a whole tensor held identically on every rank (a gathered
// parameter gradient) against the reference's, checked against T's bound.
template <class T, class A, class B>
void expect_global_close(const A& got, const B& want, const std::string& what, Kind kind) {
  if constexpr (kIsBf16<T>) {
    const double err = norm_error(got, want);
    note_bf16(what.c_str(), err);
    EXPECT_LE(err, kind == Kind::activation ? kBf16ActTolerance : kBf16GradTolerance) << what;
  } else {
    EXPECT_LE(rel_error(got, want), model_tolerance<T>()) << what;
  }
}

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
    d.resize(static_cast<std::size_t>(r * c), nan_of<T>());
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
  /// With `bf16_weights` the reference runs on its weights rounded to bf16,
  /// so that a bf16 layer's error is that of computing in bf16 alone.
  explicit Oracle(int q, bool bf16_weights = false)
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
    if (bf16_weights) round_to_bf16(ref.params());
    ref.forward(tokens, targets, batch, seq);
    ref.backward();
  }
  std::span<const T> act(const std::string& n) const { return ref.activation(n); }
  std::span<const T> dact(const std::string& n) const { return ref.activation_grad(n); }
};

// The reference model of layers in T: bf16-rounded weights for bf16.
template <class T>
using OracleOf = Oracle<Ref<T>>;

// Every parameter gradient of `layer`, gathered, against the reference.
template <class T>
void expect_param_grads(Module<T>& layer, const reference::Gpt<Ref<T>>& ref) {
  for (Param<T>* p : layer.parameters())
    expect_global_close<T>(gather_global(*p, mesh_env().grid, true), ref.grad(p->shard.name),
                           p->shard.name, Kind::gradient);
}

// A tensor spread over the ranks (each rank its local block) against the
// reference's local blocks.
template <class T>
void expect_close(const std::vector<T>& got, const std::vector<Ref<T>>& want, const char* what,
                  Kind kind = Kind::activation) {
  if constexpr (kIsBf16<T>) {
    const double err = norm_error_over_ranks(got, want);
    note_bf16(what, err);
    EXPECT_LE(err, kind == Kind::activation ? kBf16ActTolerance : kBf16GradTolerance) << what;
  } else {
    EXPECT_LE(max_over_ranks(rel_error(got, want)), model_tolerance<T>()) << what;
  }
}

// Runs an activation-to-activation layer: input activation `in` (out_cols
// wide output `out`), output gradient from the reference, compares Y, dX
// and the parameter gradients.
template <class T>
void check_layer(Layer<T>& layer, const OracleOf<T>& o, const std::string& in, index_t in_cols,
                 const std::string& out, index_t out_cols, const std::vector<Ref<T>>& want_dx,
                 int in_groups = 1, int out_groups = 1,
                 const std::function<void()>& after_forward = {}) {
  MeshEnv& e = mesh_env();
  const int q = e.engine.q();
  ParameterStore<T> store(e.backend, layer.parameters());
  store.init_gpt(o.seed, o.config);
  Arenas arenas(e.backend, layer.buffer_needs());
  const index_t nt = o.tokens_n / q;
  Local<T> x(nt, in_cols / q, as<T>(local_of(o.act(in), o.tokens_n, in_cols, in_groups)));
  Local<T> y(nt, out_cols / q), dx(nt, in_cols / q);
  Local<T> dy(nt, out_cols / q, as<T>(local_of(o.dact(out), o.tokens_n, out_cols, out_groups)));
  layer.forward(x.view(), y.view(), arenas.step);
  if (after_forward) after_forward();
  expect_close(y.data(), local_of(o.act(out), o.tokens_n, out_cols, out_groups), "Y");
  layer.backward(dy.view(), dx.view(), arenas.step);
  expect_close(dx.data(), want_dx, "dX", Kind::gradient);
  expect_param_grads<T>(layer, o.ref);
}

template <class T>
void linear_plain() {
  MeshEnv& e = mesh_env();
  OracleOf<T> o(e.engine.q(), kIsBf16<T>);
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
TEST(Layers2D, LinearBf16) {
  linear_plain<bf16>();
}

template <class T>
void linear_grouped() {
  MeshEnv& e = mesh_env();
  OracleOf<T> o(e.engine.q(), kIsBf16<T>);
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
TEST(Layers2D, LinearQkvGroupsBf16) {
  linear_grouped<bf16>();
}

template <class T>
void layernorm() {
  MeshEnv& e = mesh_env();
  OracleOf<T> o(e.engine.q(), kIsBf16<T>);
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
TEST(Layers2D, LayerNormBf16) {
  layernorm<bf16>();
}

template <class T>
void gelu() {
  MeshEnv& e = mesh_env();
  OracleOf<T> o(e.engine.q(), kIsBf16<T>);
  SCOPED_TRACE(seed_note(o.seed));
  const index_t f = 4 * o.config.n_embd;
  GeLU<T> layer(e.backend);
  check_layer<T>(layer, o, "h.0.mlp.c_fc", f, "h.0.mlp.gelu", f,
                 local_of(o.dact("h.0.mlp.c_fc"), o.tokens_n, f));
}
TEST(Layers2D, GeLUDouble) {
  gelu<double>();
}
TEST(Layers2D, GeLUFloat) {
  gelu<float>();
}
TEST(Layers2D, GeLUBf16) {
  gelu<bf16>();
}

template <class T>
void attention() {
  MeshEnv& e = mesh_env();
  OracleOf<T> o(e.engine.q(), kIsBf16<T>);
  SCOPED_TRACE(seed_note(o.seed));
  const index_t h = o.config.n_embd;
  Summa2DContext<T> attn_scheme(e.engine);
  Attention<T> attn(attn_scheme, "h.0.attn", o.batch, o.seq, h, o.config.n_head);
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
TEST(Layers2D, AttentionBf16) {
  attention<bf16>();
}

template <class T>
void mlp() {
  MeshEnv& e = mesh_env();
  OracleOf<T> o(e.engine.q(), kIsBf16<T>);
  SCOPED_TRACE(seed_note(o.seed));
  const index_t h = o.config.n_embd;
  Summa2DContext<T> layer_scheme(e.engine);
  MLP<T> layer(layer_scheme, "h.0.mlp", o.tokens_n, h);
  check_layer<T>(layer, o, "h.0.ln_2", h, "h.0.mlp.c_proj", h,
                 local_of(o.dact("h.0.ln_2"), o.tokens_n, h));
}
TEST(Layers2D, MLPDouble) {
  mlp<double>();
}
TEST(Layers2D, MLPFloat) {
  mlp<float>();
}
TEST(Layers2D, MLPBf16) {
  mlp<bf16>();
}

template <class T>
void block() {
  MeshEnv& e = mesh_env();
  OracleOf<T> o(e.engine.q(), kIsBf16<T>);
  SCOPED_TRACE(seed_note(o.seed));
  const index_t h = o.config.n_embd;
  Summa2DContext<T> layer_scheme(e.engine);
  TransformerBlock<T> layer(layer_scheme, "h.0", o.batch, o.seq, h, o.config.n_head,
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
TEST(Layers2D, BlockBf16) {
  block<bf16>();
}

template <class T>
void embedding() {
  MeshEnv& e = mesh_env();
  const int q = e.engine.q();
  OracleOf<T> o(q, kIsBf16<T>);
  SCOPED_TRACE(seed_note(o.seed));
  const index_t h = o.config.n_embd, V = o.config.vocab_size, nt = o.tokens_n / q;
  Embedding2D<T> emb(e.engine, o.batch, o.seq, V, h, o.config.n_positions);
  ParameterStore<T> store(e.backend, emb.parameters());
  store.init_gpt(o.seed, o.config);
  Arenas arenas(e.backend, emb.buffer_needs());
  Local<T> y(nt, h / q), dy(nt, h / q, as<T>(local_of(o.dact("embeddings"), o.tokens_n, h)));
  emb.forward(o.tokens, y.view(), arenas.step);
  expect_close(y.data(), local_of(o.act("embeddings"), o.tokens_n, h), "embeddings");
  emb.backward(dy.view(), arenas.step);
  // wpe is only used here: the reference's gradient is exactly this layer's.
  expect_global_close<T>(gather_global(emb.wpe(), e.grid, true), o.ref.grad("wpe.weight"),
                         "wpe grad", Kind::gradient);
  // wte's embedding part, independently: rows of d embeddings added by token id.
  std::vector<double> want(static_cast<std::size_t>(V * h), 0.0);
  const auto d = o.dact("embeddings");
  for (index_t r = 0; r < o.tokens_n; ++r)
    for (index_t c = 0; c < h; ++c)
      want[static_cast<std::size_t>(o.tokens[static_cast<std::size_t>(r)] * h + c)] +=
          static_cast<double>(d[static_cast<std::size_t>(r * h + c)]);
  expect_global_close<T>(gather_global(emb.wte(), e.grid, true), want, "wte grad", Kind::gradient);
}
TEST(Layers2D, EmbeddingDouble) {
  embedding<double>();
}
TEST(Layers2D, EmbeddingFloat) {
  embedding<float>();
}
TEST(Layers2D, EmbeddingBf16) {
  embedding<bf16>();
}

template <class T>
void lm_head() {
  MeshEnv& e = mesh_env();
  const int q = e.engine.q();
  OracleOf<T> o(q, kIsBf16<T>);
  SCOPED_TRACE(seed_note(o.seed));
  const index_t h = o.config.n_embd, V = o.config.vocab_size, nt = o.tokens_n / q;
  Embedding2D<T> emb(e.engine, o.batch, o.seq, V, h, o.config.n_positions);
  LMHead2D<T> head(e.engine, emb.wte(), o.tokens_n, h, V);
  EXPECT_TRUE(head.parameters().empty());  // tied
  ParameterStore<T> store(e.backend, emb.parameters());
  store.init_gpt(o.seed, o.config);
  BufferNeeds needs = head.buffer_needs();
  Arenas arenas(e.backend, needs);
  Local<T> x(nt, h / q, as<T>(local_of(o.act("ln_f"), o.tokens_n, h))), dx(nt, h / q);
  const double loss = head.forward(x.view(), o.targets, arenas.step);
  const double want_loss = static_cast<double>(o.ref.loss());
  if constexpr (kIsBf16<T>) note_bf16("loss", std::abs(loss - want_loss) / std::abs(want_loss));
  EXPECT_NEAR(loss, want_loss,
              (kIsBf16<T> ? kBf16LossTolerance : model_tolerance<T>()) * std::abs(want_loss));
  expect_close(download_view(head.logits()), local_of(o.act("logits"), o.tokens_n, V), "logits");
  head.backward(dx.view(), arenas.step);
  expect_close(download_view(head.logits()), local_of(o.dact("logits"), o.tokens_n, V), "dlogits",
               Kind::gradient);
  expect_close(dx.data(), local_of(o.dact("ln_f"), o.tokens_n, h), "dX", Kind::gradient);
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
  expect_global_close<T>(gather_global(emb.wte(), e.grid, true), want, "wte grad", Kind::gradient);
}
TEST(Layers2D, LMHeadCrossEntropyDouble) {
  lm_head<double>();
}
TEST(Layers2D, LMHeadCrossEntropyFloat) {
  lm_head<float>();
}
TEST(Layers2D, LMHeadCrossEntropyBf16) {
  lm_head<bf16>();
}

// The shard descriptions cover every global element exactly once (gather
// checks it) and keep Hugging Face names and shapes.
TEST(Layers2D, ShardsCoverEachElementOnce) {
  MeshEnv& e = mesh_env();
  const int q = e.engine.q();
  Summa2DContext<double> layer_scheme(e.engine);
  TransformerBlock<double> layer(layer_scheme, "h.0", q, 3, 8 * q, 2 * q);
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
      Summa2DContext<float> a_scheme(e.engine);
      Attention<float> a(a_scheme, "h.0.attn", batch, 4, hidden, heads);
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

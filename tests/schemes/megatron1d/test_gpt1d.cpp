// The 1D (Megatron-LM) tensor-parallel scheme against the serial reference
// summa::reference::Gpt on p ranks in a line (ProcessGrid::linear1d; CTest:
// 1, 2 and 4 ranks).
//
// Layers1D: each 1D layer alone — ColumnParallelLinear1D (plain and with the
// q|k|v groups of c_attn), RowParallelLinear1D, LayerNorm1D, Attention (1D),
// MLP (1D), TransformerBlock (1D), Embedding1D and the tied LMHead1D with the
// vocabulary-parallel CrossEntropy1D. Oracle as in test_layers2d.cpp: a
// serial one-layer reference runs forward and backward on fresh random
// weights and tokens; a layer gets the reference's input activation (its
// local part: the whole tensor where activations are replicated, the rank's
// columns where they are split) and, in backward, the reference's gradient
// of its output; its output, input gradient and every parameter gradient
// (gathered to the global tensor) must match the reference's.
//
// Gpt1D: the whole model — loss, every block boundary, the final norm, the
// local logits, the input gradient and every parameter gradient, in float
// and double, with activation checkpointing on and off; replicated
// parameters (LayerNorms, row-parallel biases, wpe) get gradients that are
// bit-identical on every rank; the communication of a step is exactly the
// all-reduces the scheme prescribes; no heap allocation in a training step;
// buffers sized exactly; configuration and id errors thrown the same on
// every rank.
//
// Tolerances: max |a - b| / max |b| over a whole tensor, 1e-9 in double and
// 2e-3 in float (test_util.hpp model_tolerance; see test_gpt2d.cpp). The
// config (n_head = 4, n_embd = 32, vocab = 44 for p in {1, 2, 4}) is
// divisible by p; the batch (3) is not: 1D needs no batch divisibility.
//
// bf16 (mixed precision, issue 6): Gpt<bf16> (1D) (checkpointing on and off)
// and TransformerBlock<bf16> (1D) against the double reference run on the same
// weights rounded to bf16, so that what is measured is the error of
// computing in bf16 (bf16 storage, fp32 arithmetic and statistics). Measure:
// the norm-wise relative error ||x - x_ref||_2 / ||x_ref||_2 of each tensor,
// in units of u = 2^-8. Measured over 144 runs at p = 1, 2, 4 (CPU backend;
// SUMMA_TEST_PRINT_ERRORS=1 prints them): loss <= 0.04u, block output and
// logits <= 1.4u, input gradient <= 1.8u, parameter gradients <= 1.9u for
// one block and <= 3.9u for the two-block model. Tolerances: loss 1u,
// activations 4u, gradients 6u*sqrt(depth) (kBf16* below). A formula error
// (a missing term or all-reduce, a wrong scale) moves a tensor by O(1), i.e.
// by ~100u or more, far above them; even scaling one residual gradient by
// 1.05 was seen to read 12-26u and fail. Replicas stay bit-identical, the
// traffic is Megatron's with the loss statistics travelling as fp32, and a
// bf16 step allocates nothing, as in float. (On CUDA the bf16 GEMMs are
// cuBLAS's with fp32 accumulation: the same error model, not yet measured
// on a GPU.)
//
// Backend: test_backend() (SUMMA_TEST_BACKEND=cpu|cuda) with its
// communicators (test_grid_options()). Inputs are built on the host and
// uploaded, outputs downloaded; on CUDA float runs in fp32 (no TF32) and
// double in fp64, so the tolerances above hold unchanged.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "test_util.hpp"

namespace summa::test {
namespace {

// ---------------------------------------------------------------- environment

struct LineEnv {
  Backend& backend = test_backend();  // first: selects the rank's device
  ProcessGrid grid = ProcessGrid::linear1d(MPI_COMM_WORLD, 0, 1, test_grid_options());
};
LineEnv& line_env() {
  static LineEnv e;
  return e;
}
int group_size() {
  return line_env().grid.tensor().size();
}
int group_rank() {
  return line_env().grid.tensor().rank();
}

reference::GptConfig test_config(int n_layer = 2) {
  const int m = std::lcm(4, group_size());
  reference::GptConfig c;
  c.n_layer = n_layer;
  c.n_head = m;
  c.n_embd = 8 * m;   // head dim 8
  c.n_positions = 7;  // wpe is replicated: any size
  c.vocab_size = 11 * m;
  return c;
}

std::vector<std::int32_t> random_ids(index_t n, int vocab, std::mt19937_64& gen) {
  std::uniform_int_distribution<int> dist(0, vocab - 1);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(n));
  for (auto& id : ids) id = dist(gen);
  return ids;
}

// How an activation is laid out: replicated (every rank holds all `cols`
// columns) or split by columns (rank r holds columns [r*w, (r+1)*w) of each
// of `groups` equal column groups, side by side).
struct Dist {
  index_t cols;
  bool split = false;
  int groups = 1;
  index_t local_cols() const { return split ? cols / group_size() : cols; }
};

// This rank's part of a global row-major [rows, d.cols] tensor.
template <class T>
std::vector<T> local_of(std::span<const T> global, index_t rows, Dist d) {
  if (!d.split) return std::vector<T>(global.begin(), global.end());
  const int p = group_size(), r = group_rank();
  const index_t gw = d.cols / d.groups, w = gw / p;
  std::vector<T> out;
  for (index_t row = 0; row < rows; ++row)
    for (int g = 0; g < d.groups; ++g)
      for (index_t c = g * gw + r * w; c < g * gw + (r + 1) * w; ++c)
        out.push_back(global[static_cast<std::size_t>(row * d.cols + c)]);
  return out;
}

// A local activation stored row-major in test_backend()'s memory, NaN
// until written.
template <class T>
struct Local {
  index_t rows, cols;
  DeviceArray<T> array;
  Local(index_t r, index_t c, std::vector<T> d = {}) : rows(r), cols(c) {
    d.resize(static_cast<std::size_t>(r * c), std::numeric_limits<T>::quiet_NaN());
    array = DeviceArray<T>(d);
  }
  MatrixView<T> view() { return MatrixView<T>::dense(array.data(), rows, cols, Order::row_major); }
  /// The contents, on the host.
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

template <class T>
void expect_close(const std::vector<T>& got, const std::vector<T>& want, const char* what) {
  EXPECT_LE(max_over_ranks(rel_error(got, want)), model_tolerance<T>()) << what;
}

// True when `v` is bit-identical on every rank. Collective.
template <class T>
bool identical_on_all_ranks(std::vector<T> v) {
  std::vector<T> root = v;
  MPI_Bcast(root.data(), static_cast<int>(root.size() * sizeof(T)), MPI_BYTE, 0, MPI_COMM_WORLD);
  int same = std::equal(v.begin(), v.end(), root.begin(),
                        [](T a, T b) { return std::memcmp(&a, &b, sizeof(T)) == 0; })
                 ? 1
                 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return same == 1;
}

// ---------------------------------------------------------------- bf16 helpers

// bf16 tolerances, norm-wise relative errors (norm_error) against the double
// reference on the same bf16-rounded weights, in units of bf16's unit
// roundoff u = 2^-8 (see the file comment for the measurements).
// The loss (a mean over tokens of log-sum-exp minus the target logit):
// measured <= 0.04u; 1u leaves a margin of 25.
constexpr double kBf16LossTolerance = kBf16Unit;
// Forward activations (a block's output, the logits): measured <= 1.4u.
constexpr double kBf16ActTolerance = 4 * kBf16Unit;
// Gradients (input and every parameter) through `depth` blocks: 6u
// sqrt(depth); measured <= 1.9u for one block and <= 3.9u for two.
double bf16_grad_tolerance(int depth) {
  return 6 * kBf16Unit * std::sqrt(static_cast<double>(depth));
}

// Prints the measured bf16 errors once (rank 0), so a tolerance can be
// re-derived from what a run shows.
void bf16_note(const std::string& what, const std::vector<std::pair<std::string, double>>& errs) {
  if (group_rank() != 0 || std::getenv("SUMMA_TEST_PRINT_ERRORS") == nullptr) return;
  std::string line = "[bf16 errors] " + what + " p=" + std::to_string(group_size()) + ":";
  for (const auto& [name, err] : errs)
    line += " " + name + "=" + std::to_string(err / kBf16Unit) + "u";
  std::printf("%s\n", line.c_str());
}

// ---------------------------------------------------------------- layers alone

// The serial one-layer model the layers are checked against.
template <class T>
struct Oracle {
  reference::GptConfig config = test_config(1);
  index_t batch = 3, seq = 5, tokens_n = batch * seq;
  std::uint64_t seed = fresh_seed();
  std::vector<std::int32_t> tokens, targets;
  reference::Gpt<T> ref{config, seed};

  /// With `bf16_weights` the reference runs on its weights rounded to bf16
  /// (what ParameterStore<bf16>::init_gpt holds), so that a bf16 layer's
  /// error is that of computing in bf16 alone.
  explicit Oracle(bool bf16_weights = false) {
    if (bf16_weights) round_to_bf16(ref.params());
    std::mt19937_64 gen(seed);
    tokens = random_ids(tokens_n, config.vocab_size, gen);
    targets = random_ids(tokens_n, config.vocab_size, gen);
    ref.forward(tokens, targets, batch, seq);
    ref.backward();
  }
  std::span<const T> act(const std::string& n) const { return ref.activation(n); }
  std::span<const T> dact(const std::string& n) const { return ref.activation_grad(n); }
  std::vector<T> local(const std::string& n, Dist d) const { return local_of(act(n), tokens_n, d); }
  std::vector<T> dlocal(const std::string& n, Dist d) const {
    return local_of(dact(n), tokens_n, d);
  }
};

// Every parameter gradient of `layer`, gathered, against the reference.
template <class T>
void expect_param_grads(Module<T>& layer, const reference::Gpt<T>& ref) {
  for (Param<T>* p : layer.parameters()) {
    const auto global = gather_global(*p, line_env().grid, true);
    EXPECT_LE(rel_error(global, ref.grad(p->shard.name)), model_tolerance<T>()) << p->shard.name;
  }
}

// Runs an activation-to-activation layer on the reference's input `in`,
// compares Y with the reference's `out`, then backward from the reference's
// gradient of `out`: dX against want_dx and every parameter gradient.
template <class T>
void check_layer(Layer<T>& layer, const Oracle<T>& o, const std::string& in, Dist din,
                 const std::string& out, Dist dout, const std::vector<T>& want_dx,
                 const std::function<void()>& after_forward = {}) {
  LineEnv& e = line_env();
  ParameterStore<T> store(e.backend, layer.parameters());
  store.init_gpt(o.seed, o.config);
  Arenas arenas(e.backend, layer.buffer_needs());
  const index_t nt = o.tokens_n;
  Local<T> x(nt, din.local_cols(), o.local(in, din));
  Local<T> y(nt, dout.local_cols()), dx(nt, din.local_cols());
  Local<T> dy(nt, dout.local_cols(), o.dlocal(out, dout));
  layer.forward(x.view(), y.view(), arenas.step);
  if (after_forward) after_forward();
  expect_close(y.data(), o.local(out, dout), "Y");
  layer.backward(dy.view(), dx.view(), arenas.step);
  expect_close(dx.data(), want_dx, "dX");
  expect_param_grads<T>(layer, o.ref);
}

template <class T>
void column_plain() {
  LineEnv& e = line_env();
  Oracle<T> o;
  SCOPED_TRACE(seed_note(o.seed));
  const index_t h = o.config.n_embd;
  ColumnParallelLinear1D<T> fc(e.grid, e.backend, "h.0.mlp.c_fc", o.tokens_n, h, 4 * h);
  EXPECT_EQ(fc.local_out(), 4 * h / group_size());
  // ln_2's output only feeds c_fc: its gradient is c_fc's input gradient.
  check_layer<T>(fc, o, "h.0.ln_2", {h}, "h.0.mlp.c_fc", {4 * h, true}, o.dlocal("h.0.ln_2", {h}));
}
TEST(Layers1D, ColumnParallelLinearDouble) {
  column_plain<double>();
}
TEST(Layers1D, ColumnParallelLinearFloat) {
  column_plain<float>();
}

template <class T>
void column_grouped() {
  LineEnv& e = line_env();
  Oracle<T> o;
  SCOPED_TRACE(seed_note(o.seed));
  const index_t h = o.config.n_embd;
  ColumnParallelLinear1D<T> attn(e.grid, e.backend, "h.0.attn.c_attn", o.tokens_n, h, 3 * h, true,
                                 3);
  EXPECT_EQ(attn.weight().shard.pieces.size(), 3u);
  check_layer<T>(attn, o, "h.0.ln_1", {h}, "h.0.attn.c_attn", {3 * h, true, 3},
                 o.dlocal("h.0.ln_1", {h}));
}
TEST(Layers1D, ColumnParallelQkvGroupsDouble) {
  column_grouped<double>();
}
TEST(Layers1D, ColumnParallelQkvGroupsFloat) {
  column_grouped<float>();
}

template <class T>
void row_parallel() {
  LineEnv& e = line_env();
  Oracle<T> o;
  SCOPED_TRACE(seed_note(o.seed));
  const index_t h = o.config.n_embd;
  RowParallelLinear1D<T> proj(e.grid, e.backend, "h.0.mlp.c_proj", o.tokens_n, 4 * h, h);
  EXPECT_EQ(proj.bias().shard.owner, group_rank() == 0);
  // the GeLU output only feeds c_proj: its gradient is c_proj's input gradient.
  check_layer<T>(proj, o, "h.0.mlp.gelu", {4 * h, true}, "h.0.mlp.c_proj", {h},
                 o.dlocal("h.0.mlp.gelu", {4 * h, true}));
}
TEST(Layers1D, RowParallelLinearDouble) {
  row_parallel<double>();
}
TEST(Layers1D, RowParallelLinearFloat) {
  row_parallel<float>();
}

template <class T>
void layernorm() {
  LineEnv& e = line_env();
  Oracle<T> o;
  SCOPED_TRACE(seed_note(o.seed));
  const index_t h = o.config.n_embd;
  LayerNorm1D<T> ln(e.grid, e.backend, "h.0.ln_2", o.tokens_n, h, o.config.layer_norm_epsilon);
  // mid feeds the residual and ln_2: ln_2's input gradient is d mid - d output.
  auto want = o.dlocal("h.0.mid", {h});
  const auto out = o.dlocal("h.0.output", {h});
  for (std::size_t k = 0; k < want.size(); ++k) want[k] -= out[k];
  check_layer<T>(ln, o, "h.0.mid", {h}, "h.0.ln_2", {h}, want);
}
TEST(Layers1D, LayerNormDouble) {
  layernorm<double>();
}
TEST(Layers1D, LayerNormFloat) {
  layernorm<float>();
}

template <class T>
void attention() {
  LineEnv& e = line_env();
  Oracle<T> o;
  SCOPED_TRACE(seed_note(o.seed));
  const index_t h = o.config.n_embd;
  Megatron1DContext<T> attn_scheme(e.grid, e.backend);
  Attention<T> attn(attn_scheme, "h.0.attn", o.batch, o.seq, h, o.config.n_head);
  // the intermediates too: q | k | v of this rank's heads, its context columns
  const auto intermediates = [&] {
    expect_close(download_view<T>(attn.qkv()), o.local("h.0.attn.c_attn", {3 * h, true, 3}), "qkv");
    expect_close(download_view<T>(attn.context()), o.local("h.0.attn.context", {h, true}),
                 "context");
  };
  check_layer<T>(attn, o, "h.0.ln_1", {h}, "h.0.attn.c_proj", {h}, o.dlocal("h.0.ln_1", {h}),
                 intermediates);
}
TEST(Layers1D, AttentionDouble) {
  attention<double>();
}
TEST(Layers1D, AttentionFloat) {
  attention<float>();
}

template <class T>
void mlp() {
  LineEnv& e = line_env();
  Oracle<T> o;
  SCOPED_TRACE(seed_note(o.seed));
  const index_t h = o.config.n_embd;
  Megatron1DContext<T> layer_scheme(e.grid, e.backend);
  MLP<T> layer(layer_scheme, "h.0.mlp", o.tokens_n, h);
  check_layer<T>(layer, o, "h.0.ln_2", {h}, "h.0.mlp.c_proj", {h}, o.dlocal("h.0.ln_2", {h}));
}
TEST(Layers1D, MLPDouble) {
  mlp<double>();
}
TEST(Layers1D, MLPFloat) {
  mlp<float>();
}

template <class T>
void block() {
  LineEnv& e = line_env();
  Oracle<T> o;
  SCOPED_TRACE(seed_note(o.seed));
  const index_t h = o.config.n_embd;
  Megatron1DContext<T> layer_scheme(e.grid, e.backend);
  TransformerBlock<T> layer(layer_scheme, "h.0", o.batch, o.seq, h, o.config.n_head,
                            o.config.layer_norm_epsilon);
  EXPECT_EQ(layer.parameters().size(), 12u);
  check_layer<T>(layer, o, "embeddings", {h}, "h.0.output", {h}, o.dlocal("embeddings", {h}));
}
TEST(Layers1D, BlockDouble) {
  block<double>();
}
TEST(Layers1D, BlockFloat) {
  block<float>();
}

// A bf16 block on the bf16-rounded input activation and output gradient of
// the double reference (with bf16-rounded weights): Y, dX and every
// parameter gradient, norm-wise (tolerances: kBf16ActTolerance, bf16_grad_tolerance).
TEST(Layers1D, BlockBf16) {
  LineEnv& e = line_env();
  const Oracle<double> o(/*bf16_weights=*/true);
  SCOPED_TRACE(seed_note(o.seed));
  const index_t h = o.config.n_embd, nt = o.tokens_n;
  Megatron1DContext<bf16> layer_scheme(e.grid, e.backend);
  TransformerBlock<bf16> layer(layer_scheme, "h.0", o.batch, o.seq, h, o.config.n_head,
                               o.config.layer_norm_epsilon);
  ParameterStore<bf16> store(e.backend, layer.parameters());
  store.init_gpt(o.seed, o.config);
  Arenas arenas(e.backend, layer.buffer_needs());
  DeviceArray<bf16> x(to_bf16(o.local("embeddings", {h}))), y(static_cast<std::size_t>(nt * h));
  DeviceArray<bf16> dy(to_bf16(o.dlocal("h.0.output", {h}))), dx(static_cast<std::size_t>(nt * h));
  layer.forward(x.view(nt, h), y.view(nt, h), arenas.step);
  const double y_err = max_over_ranks(norm_error(y.download(), o.act("h.0.output")));
  layer.backward(dy.view(nt, h), dx.view(nt, h), arenas.step);
  const double dx_err = max_over_ranks(norm_error(dx.download(), o.dact("embeddings")));
  double grad_err = 0;
  for (Param<bf16>* p : layer.parameters()) {
    const double err = norm_error(gather_global(*p, e.grid, true), o.ref.grad(p->shard.name));
    EXPECT_LE(err, bf16_grad_tolerance(1)) << p->shard.name;
    grad_err = std::max(grad_err, err);
  }
  EXPECT_LE(y_err, kBf16ActTolerance);
  EXPECT_LE(dx_err, bf16_grad_tolerance(1));
  bf16_note("BlockBf16", {{"Y", y_err}, {"dX", dx_err}, {"max param grad", grad_err}});
}

template <class T>
void embedding() {
  LineEnv& e = line_env();
  Oracle<T> o;
  SCOPED_TRACE(seed_note(o.seed));
  const index_t h = o.config.n_embd, V = o.config.vocab_size, nt = o.tokens_n;
  Embedding1D<T> emb(e.grid, e.backend, o.batch, o.seq, V, h, o.config.n_positions);
  EXPECT_EQ(emb.vocab_begin(), group_rank() * (V / group_size()));
  ParameterStore<T> store(e.backend, emb.parameters());
  store.init_gpt(o.seed, o.config);
  Arenas arenas(e.backend, emb.buffer_needs());
  Local<T> y(nt, h), dy(nt, h, o.dlocal("embeddings", {h}));
  emb.forward(o.tokens, y.view(), arenas.step);
  expect_close(y.data(), o.local("embeddings", {h}), "embeddings");
  emb.backward(dy.view(), arenas.step);
  // wpe is only used here: the reference's gradient is exactly this layer's.
  EXPECT_LE(rel_error(gather_global(emb.wpe(), e.grid, true), o.ref.grad("wpe.weight")),
            model_tolerance<T>());
  // wte's embedding part, independently: rows of d embeddings added by token id.
  std::vector<double> want(static_cast<std::size_t>(V * h), 0.0);
  const auto d = o.dact("embeddings");
  for (index_t r = 0; r < nt; ++r)
    for (index_t c = 0; c < h; ++c)
      want[static_cast<std::size_t>(o.tokens[static_cast<std::size_t>(r)] * h + c)] +=
          static_cast<double>(d[static_cast<std::size_t>(r * h + c)]);
  EXPECT_LE(rel_error(gather_global(emb.wte(), e.grid, true), want), model_tolerance<T>());
}
TEST(Layers1D, EmbeddingDouble) {
  embedding<double>();
}
TEST(Layers1D, EmbeddingFloat) {
  embedding<float>();
}

template <class T>
void lm_head() {
  LineEnv& e = line_env();
  Oracle<T> o;
  SCOPED_TRACE(seed_note(o.seed));
  const index_t h = o.config.n_embd, V = o.config.vocab_size, nt = o.tokens_n;
  Embedding1D<T> emb(e.grid, e.backend, o.batch, o.seq, V, h, o.config.n_positions);
  LMHead1D<T> head(e.grid, e.backend, emb.wte(), nt, h, V);
  EXPECT_TRUE(head.parameters().empty());  // tied
  ParameterStore<T> store(e.backend, emb.parameters());
  store.init_gpt(o.seed, o.config);
  Arenas arenas(e.backend, head.buffer_needs());
  Local<T> x(nt, h, o.local("ln_f", {h})), dx(nt, h);
  const double loss = head.forward(x.view(), o.targets, arenas.step);
  EXPECT_NEAR(loss, static_cast<double>(o.ref.loss()),
              model_tolerance<T>() * std::abs(static_cast<double>(o.ref.loss())));
  EXPECT_TRUE(identical_on_all_ranks(std::vector<double>{loss}));
  expect_close(download_view<T>(head.logits()), o.local("logits", {V, true}), "logits");
  head.backward(dx.view(), arenas.step);
  expect_close(download_view<T>(head.logits()), o.dlocal("logits", {V, true}), "dlogits");
  expect_close(dx.data(), o.dlocal("ln_f", {h}), "dX");
  // wte's head part, independently: dlogitsᵀ · ln_f.
  std::vector<double> want(static_cast<std::size_t>(V * h), 0.0);
  const auto dz = o.dact("logits");
  const auto xf = o.act("ln_f");
  for (index_t r = 0; r < nt; ++r)
    for (index_t v = 0; v < V; ++v)
      for (index_t c = 0; c < h; ++c)
        want[static_cast<std::size_t>(v * h + c)] +=
            static_cast<double>(dz[static_cast<std::size_t>(r * V + v)]) *
            static_cast<double>(xf[static_cast<std::size_t>(r * h + c)]);
  EXPECT_LE(rel_error(gather_global(emb.wte(), e.grid, true), want), model_tolerance<T>());
}
TEST(Layers1D, LMHeadCrossEntropyDouble) {
  lm_head<double>();
}
TEST(Layers1D, LMHeadCrossEntropyFloat) {
  lm_head<float>();
}

// The shard descriptions cover every global element exactly once (gather
// checks it), keep Hugging Face names and shapes, and mark exactly the
// replicated parameters as replicas off rank 0.
TEST(Layers1D, ShardsCoverEachElementOnce) {
  LineEnv& e = line_env();
  const reference::GptConfig config = test_config(1);
  const index_t h = config.n_embd;
  Megatron1DContext<double> layer_scheme(e.grid, e.backend);
  TransformerBlock<double> layer(layer_scheme, "h.0", 2, 3, h, config.n_head);
  Embedding1D<double> emb(e.grid, e.backend, 2, 3, config.vocab_size, h, config.n_positions);
  std::vector<Param<double>*> params = emb.parameters();
  for (Param<double>* p : layer.parameters()) params.push_back(p);
  ParameterStore<double> store(e.backend, params);
  store.init_gpt(11, config);
  const std::set<std::string> replicated = {
      "wpe.weight",    "h.0.ln_1.weight",      "h.0.ln_1.bias",      "h.0.ln_2.weight",
      "h.0.ln_2.bias", "h.0.attn.c_proj.bias", "h.0.mlp.c_proj.bias"};
  const std::vector<reference::ParamInfo> infos = reference::parameter_list(config);
  for (Param<double>* p : store.params()) {
    const auto info = std::find_if(infos.begin(), infos.end(),
                                   [&](const auto& i) { return i.name == p->shard.name; });
    ASSERT_NE(info, infos.end()) << p->shard.name;
    EXPECT_EQ(p->shard.global_shape, info->shape) << p->shard.name;
    const bool is_replica = replicated.count(p->shard.name) > 0;
    EXPECT_EQ(p->shard.owner, !is_replica || group_rank() == 0) << p->shard.name;
    if (is_replica) {
      EXPECT_EQ(p->shard.local_size(), p->shard.global_size()) << p->shard.name;
    } else {
      EXPECT_EQ(p->shard.local_size() * group_size(), p->shard.global_size()) << p->shard.name;
    }
    const auto global = gather_global(*p, e.grid);  // throws unless covered exactly once
    for (index_t k = 0; k < p->shard.global_size(); ++k)
      ASSERT_EQ(global[static_cast<std::size_t>(k)],
                reference::init_value(11, p->shard.name, k, config))
          << p->shard.name << " element " << k;
  }
}

// Construction errors are the same summa::Error on every rank.
template <class Make>
std::string error_of(Make make) {
  std::string msg;
  try {
    make();
  } catch (const Error& err) {
    msg = err.what();
  }
  EXPECT_TRUE(same_on_all_ranks(msg)) << msg;
  return msg;
}

TEST(Layers1D, ConfigErrors) {
  LineEnv& e = line_env();
  const int p = group_size();
  const auto attention = [&](index_t hidden, index_t heads) {
    return error_of([&] {
      Megatron1DContext<float> a_scheme(e.grid, e.backend);
      Attention<float> a(a_scheme, "h.0.attn", 1, 4, hidden, heads);
    });
  };
  EXPECT_NE(attention(8 * p + p, 2 * p).find("divisible by heads"), std::string::npos);
  const auto column = [&](index_t out, int groups) {
    return error_of(
        [&] { ColumnParallelLinear1D<float> l(e.grid, e.backend, "c", 4, 8, out, true, groups); });
  };
  EXPECT_NE(column(0, 1).find("must be positive"), std::string::npos);
  EXPECT_EQ(column(3 * p, 3), "");
  const auto row = [&](index_t in) {
    return error_of([&] { RowParallelLinear1D<float> l(e.grid, e.backend, "c", 4, in, 8); });
  };
  EXPECT_EQ(row(2 * p), "");
  if (p > 1) {
    EXPECT_NE(attention(2 * p * (p + 1), p + 1).find("heads="), std::string::npos);
    EXPECT_NE(column(p + 1, 1).find("out=" + std::to_string(p + 1)), std::string::npos);
    EXPECT_NE(column(3 * (p + 1), 3).find("groups*p"), std::string::npos);
    EXPECT_NE(row(p + 1).find("in=" + std::to_string(p + 1)), std::string::npos);
    EXPECT_NE(error_of([&] {
                Embedding1D<float> m(e.grid, e.backend, 1, 4, p + 1, 8, 8);
              }).find("vocab="),
              std::string::npos);
  }
  EXPECT_NE(error_of([&] {
              Embedding1D<float> m(e.grid, e.backend, 1, 9, 4 * p, 8, 8);
            }).find("longer than the position table"),
            std::string::npos);
}

// ---------------------------------------------------------------- the model

template <class T>
struct StepResult {
  double loss = 0;
  std::vector<std::vector<T>> grads;  // gathered, in parameter order
  std::vector<T> input_grad;          // replicated
};

template <class T>
StepResult<T> run_step(Gpt<T>& model, const std::vector<std::int32_t>& tokens,
                       const std::vector<std::int32_t>& targets) {
  StepResult<T> r;
  r.loss = model.forward(tokens, targets);
  model.backward();
  for (Param<T>* p : model.parameters_store().params())
    r.grads.push_back(gather_global(*p, line_env().grid, true));
  r.input_grad = download_view<T>(model.input_grad());
  return r;
}

// Largest error of a replicated (or column-split) view against the reference.
template <class T>
double view_error(ConstMatrixView<T> local, std::span<const T> global, Dist d) {
  return max_over_ranks(rel_error(download_view<T>(local), local_of(global, local.rows, d)));
}

template <class T>
void check_against_reference(bool checkpoint) {
  LineEnv& e = line_env();
  const reference::GptConfig config = test_config();
  const index_t batch = 3, seq = 5, tokens_n = batch * seq, h = config.n_embd;
  const index_t V = config.vocab_size;
  const std::uint64_t seed = fresh_seed();
  std::mt19937_64 gen(seed);
  const auto tokens = random_ids(tokens_n, config.vocab_size, gen);
  const auto targets = random_ids(tokens_n, config.vocab_size, gen);
  SCOPED_TRACE(seed_note(seed));

  reference::Gpt<T> ref(config, seed);
  const double ref_loss = ref.forward(tokens, targets, batch, seq);
  Megatron1DContext<T> model_scheme(e.grid, e.backend);
  Gpt<T> model(model_scheme, config, batch, seq, {.checkpoint = checkpoint});
  model.init(seed);

  // identical global weights
  for (Param<T>* p : model.parameters_store().params()) {
    const auto global = gather_global(*p, e.grid);
    const auto want = ref.param(p->shard.name);
    ASSERT_EQ(global.size(), want.size()) << p->shard.name;
    EXPECT_TRUE(std::equal(global.begin(), global.end(), want.begin())) << p->shard.name;
  }

  const double loss = model.forward(tokens, targets);
  const double tol = model_tolerance<T>();
  EXPECT_NEAR(loss, ref_loss, tol * std::abs(ref_loss));
  EXPECT_TRUE(identical_on_all_ranks(std::vector<double>{loss}));
  EXPECT_LE(view_error<T>(model.boundary(0), ref.activation("embeddings"), {h}), tol);
  for (int i = 0; i < config.n_layer; ++i)
    EXPECT_LE(view_error<T>(model.boundary(i + 1),
                            ref.activation("h." + std::to_string(i) + ".output"), {h}),
              tol)
        << "block " << i;
  EXPECT_LE(view_error<T>(model.final_norm(), ref.activation("ln_f"), {h}), tol);
  EXPECT_LE(view_error<T>(model.logits(), ref.activation("logits"), {V, true}), tol);

  model.backward();
  ref.backward();
  EXPECT_LE(view_error<T>(model.input_grad(), ref.activation_grad("embeddings"), {h}), tol);
  const auto params = model.parameters_store().params();
  EXPECT_EQ(params.size(), reference::parameter_list(config).size());
  for (Param<T>* p : params) {
    const auto global = gather_global(*p, e.grid, true);
    EXPECT_LE(rel_error(global, ref.grad(p->shard.name)), tol) << p->shard.name;
  }
}

TEST(Gpt1D, MatchesReferenceDoubleCheckpointed) {
  check_against_reference<double>(true);
}
TEST(Gpt1D, MatchesReferenceDoubleNoCheckpoint) {
  check_against_reference<double>(false);
}
TEST(Gpt1D, MatchesReferenceFloatCheckpointed) {
  check_against_reference<float>(true);
}
TEST(Gpt1D, MatchesReferenceFloatNoCheckpoint) {
  check_against_reference<float>(false);
}

// Gpt<bf16> (1D) (bf16 parameters, activations and gradients; fp32 statistics)
// against the double reference on the same bf16-rounded weights: the loss,
// the logits, the input gradient and every parameter gradient, norm-wise.
void check_bf16_against_reference(bool checkpoint) {
  LineEnv& e = line_env();
  const reference::GptConfig config = test_config();
  const index_t batch = 3, seq = 5, tokens_n = batch * seq;
  const index_t V = config.vocab_size;
  const std::uint64_t seed = fresh_seed();
  std::mt19937_64 gen(seed);
  const auto tokens = random_ids(tokens_n, config.vocab_size, gen);
  const auto targets = random_ids(tokens_n, config.vocab_size, gen);
  SCOPED_TRACE(seed_note(seed));

  reference::Gpt<double> ref(config, seed);
  round_to_bf16(ref.params());
  const double ref_loss = ref.forward(tokens, targets, batch, seq);
  Megatron1DContext<bf16> model_scheme(e.grid, e.backend);
  Gpt<bf16> model(model_scheme, config, batch, seq, {.checkpoint = checkpoint});
  model.init(seed);
  for (Param<bf16>* p : model.parameters_store().params()) {  // the same weights, exactly
    const auto global = gather_global(*p, e.grid);
    const auto want = ref.param(p->shard.name);
    ASSERT_EQ(global.size(), want.size()) << p->shard.name;
    EXPECT_TRUE(std::equal(global.begin(), global.end(), want.begin(), [](bf16 a, double b) {
      return static_cast<double>(a) == b;
    })) << p->shard.name;
  }

  const double loss = model.forward(tokens, targets);
  const double loss_err = std::abs(loss - ref_loss) / std::abs(ref_loss);
  EXPECT_LE(loss_err, kBf16LossTolerance) << loss << " vs " << ref_loss;
  EXPECT_TRUE(identical_on_all_ranks(std::vector<double>{loss}));
  const double logits_err = max_over_ranks(
      norm_error(download_view<bf16>(model.logits()),
                 std::span<const double>(local_of(ref.activation("logits"), tokens_n, {V, true}))));
  EXPECT_LE(logits_err, kBf16ActTolerance);

  model.backward();
  ref.backward();
  const double dx_err = max_over_ranks(
      norm_error(download_view<bf16>(model.input_grad()), ref.activation_grad("embeddings")));
  const double grad_tol = bf16_grad_tolerance(config.n_layer);
  EXPECT_LE(dx_err, grad_tol);
  double grad_err = 0;
  std::string worst;
  for (Param<bf16>* p : model.parameters_store().params()) {
    const double err = norm_error(gather_global(*p, e.grid, true), ref.grad(p->shard.name));
    EXPECT_LE(err, grad_tol) << p->shard.name;
    if (err > grad_err) worst = p->shard.name;
    grad_err = std::max(grad_err, err);
  }
  bf16_note(checkpoint ? "Gpt1D bf16 checkpointed" : "Gpt1D bf16",
            {{"loss", loss_err},
             {"logits", logits_err},
             {"input grad", dx_err},
             {"max param grad (" + worst + ")", grad_err}});
}

TEST(Gpt1D, MatchesReferenceBf16Checkpointed) {
  check_bf16_against_reference(true);
}
TEST(Gpt1D, MatchesReferenceBf16NoCheckpoint) {
  check_bf16_against_reference(false);
}

// Checkpointing changes memory, not results; a second step with
// `accumulate` doubles the gradients.
TEST(Gpt1D, CheckpointingAgreesAndAccumulates) {
  LineEnv& e = line_env();
  const reference::GptConfig config = test_config();
  const index_t batch = 2, seq = 6;
  const std::uint64_t seed = fresh_seed();
  std::mt19937_64 gen(seed);
  const auto tokens = random_ids(batch * seq, config.vocab_size, gen);
  const auto targets = random_ids(batch * seq, config.vocab_size, gen);
  Megatron1DContext<double> with_scheme(e.grid, e.backend);
  Gpt<double> with(with_scheme, config, batch, seq, {.checkpoint = true});
  Megatron1DContext<double> without_scheme(e.grid, e.backend);
  Gpt<double> without(without_scheme, config, batch, seq, {.checkpoint = false});
  with.init(seed);
  without.init(seed);
  const StepResult<double> a = run_step(with, tokens, targets);
  const StepResult<double> b = run_step(without, tokens, targets);
  EXPECT_NEAR(a.loss, b.loss, 1e-12 * std::abs(b.loss));
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (std::size_t k = 0; k < a.grads.size(); ++k)
    EXPECT_LE(rel_error(a.grads[k], b.grads[k]), 1e-12);
  EXPECT_LE(max_over_ranks(rel_error(a.input_grad, b.input_grad)), 1e-12);
  EXPECT_LT(with.buffers().forward.capacity(), without.buffers().forward.capacity());

  with.forward(tokens, targets);
  with.backward(/*accumulate=*/true);
  const auto params = with.parameters_store().params();
  for (std::size_t k = 0; k < params.size(); ++k) {
    auto twice = a.grads[k];
    for (double& v : twice) v *= 2;
    EXPECT_LE(rel_error(gather_global(*params[k], e.grid, true), twice), 1e-12)
        << params[k]->shard.name;
  }
}

// Replicated activations and parameters stay bit-identical on every rank:
// the block boundaries and input gradient, and the value and gradient of
// every replica (compared with rank 0's, the owner's).
template <class T>
void replicas_identical() {
  LineEnv& e = line_env();
  const reference::GptConfig config = test_config();
  const index_t batch = 3, seq = 4;
  const std::uint64_t seed = fresh_seed();
  std::mt19937_64 gen(seed);
  const auto tokens = random_ids(batch * seq, config.vocab_size, gen);
  const auto targets = random_ids(batch * seq, config.vocab_size, gen);
  Megatron1DContext<T> model_scheme(e.grid, e.backend);
  Gpt<T> model(model_scheme, config, batch, seq, {.checkpoint = true});
  model.init(seed);
  model.forward(tokens, targets);
  for (int i = 0; i <= config.n_layer; ++i)
    EXPECT_TRUE(identical_on_all_ranks(download_view<T>(model.boundary(i)))) << "boundary " << i;
  EXPECT_TRUE(identical_on_all_ranks(download_view<T>(model.final_norm())));
  model.backward();
  model.forward(tokens, targets);  // and again, accumulating
  model.backward(true);
  EXPECT_TRUE(identical_on_all_ranks(download_view<T>(model.input_grad())));
  int replicas = 0;
  for (Param<T>* p : model.parameters_store().params()) {
    int replica = p->shard.owner ? 0 : 1;  // a replica somewhere: replicated
    MPI_Allreduce(MPI_IN_PLACE, &replica, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (replica == 0) continue;
    ++replicas;
    EXPECT_TRUE(identical_on_all_ranks(download_view<T>(ConstMatrixView<T>(p->value_view()))))
        << p->shard.name;
    EXPECT_TRUE(identical_on_all_ranks(download_view<T>(ConstMatrixView<T>(p->grad_view()))))
        << p->shard.name;
  }
  // per block: ln_1, ln_2 (weight, bias), attn / mlp c_proj bias; ln_f; wpe
  EXPECT_EQ(replicas, group_size() > 1 ? 6 * config.n_layer + 3 : 0);
}
TEST(Gpt1D, ReplicasIdenticalAcrossRanksDouble) {
  replicas_identical<double>();
}
TEST(Gpt1D, ReplicasIdenticalAcrossRanksFloat) {
  replicas_identical<float>();
}
TEST(Gpt1D, ReplicasIdenticalAcrossRanksBf16) {
  replicas_identical<bf16>();
}

// Bytes the traffic counters book for one all-reduce of `count` elements.
std::uint64_t all_reduce_bytes(std::uint64_t count, std::uint64_t element) {
  const auto g = static_cast<std::uint64_t>(group_size());
  const auto r = static_cast<std::uint64_t>(group_rank());
  if (g <= 1) return 0;
  const std::uint64_t chunk = count / g + (r < count % g ? 1 : 0);
  return ((count - chunk) + (g - 1) * chunk) * element;
}

// The tensor-axis traffic of a step is exactly Megatron's: forward one
// all-reduce of T*h for the embedding and per row-parallel layer, T and 2T
// for the loss statistics; backward one T*h for the head and per
// column-parallel layer, plus the recomputed forward with checkpointing.
// Activations travel as T, the loss statistics as acc_t<T> (fp32 for bf16).
template <class T>
void traffic_is_megatrons() {
  LineEnv& e = line_env();
  const reference::GptConfig config = test_config();
  const index_t batch = 3, seq = 5, nt = batch * seq, h = config.n_embd;
  const std::uint64_t L = static_cast<std::uint64_t>(config.n_layer), el = sizeof(T),
                      stat = sizeof(acc_t<T>);
  std::mt19937_64 gen(fresh_seed());
  const auto tokens = random_ids(nt, config.vocab_size, gen);
  const auto targets = random_ids(nt, config.vocab_size, gen);
  for (bool checkpoint : {true, false}) {
    Megatron1DContext<T> model_scheme(e.grid, e.backend);
    Gpt<T> model(model_scheme, config, batch, seq, {.checkpoint = checkpoint});
    model.init(2);
    const auto big = all_reduce_bytes(static_cast<std::uint64_t>(nt * h), el);
    e.grid.reset_traffic();
    model.forward(tokens, targets);
    const TrafficCounter fwd = e.grid.traffic()[CommAxis::tensor];
    EXPECT_EQ(fwd.calls, 1 + 2 * L + 2);
    const std::uint64_t fwd_bytes = (1 + 2 * L) * big +
                                    all_reduce_bytes(static_cast<std::uint64_t>(nt), stat) +
                                    all_reduce_bytes(static_cast<std::uint64_t>(2 * nt), stat);
    EXPECT_EQ(fwd.bytes_sent, fwd_bytes);
    EXPECT_EQ(fwd.bytes_received, fwd_bytes);
    e.grid.reset_traffic();
    model.backward();
    const TrafficCounter bwd = e.grid.traffic()[CommAxis::tensor];
    const std::uint64_t n_bwd = 1 + 2 * L + (checkpoint ? 2 * L : 0);
    EXPECT_EQ(bwd.calls, n_bwd) << "checkpoint " << checkpoint;
    EXPECT_EQ(bwd.bytes_sent, n_bwd * big) << "checkpoint " << checkpoint;
    EXPECT_EQ(bwd.bytes_received, n_bwd * big) << "checkpoint " << checkpoint;
    // nothing on any other axis
    EXPECT_EQ(e.grid.traffic().total().calls, bwd.calls);
  }
}
TEST(Gpt1D, TrafficIsMegatrons) {
  traffic_is_megatrons<float>();
}
TEST(Gpt1D, TrafficIsMegatronsBf16) {
  traffic_is_megatrons<bf16>();
}

// After one warm-up step, a training step (forward + backward, checkpointing
// on) makes no heap allocation outside MPI's internals.
template <class T>
void training_step_allocates_nothing() {
  if (!allocation_counting_available()) GTEST_SKIP() << "allocation counting unavailable (ASan)";
  if (test_backend().asynchronous())
    GTEST_SKIP() << "the CUDA runtime allocates host memory internally (pinned staging, "
                    "launch bookkeeping): allocation counting runs on the CPU backend";
  LineEnv& e = line_env();
  const reference::GptConfig config = test_config();
  const index_t batch = 3, seq = 5;
  std::mt19937_64 gen(fresh_seed());
  const auto tokens = random_ids(batch * seq, config.vocab_size, gen);
  const auto targets = random_ids(batch * seq, config.vocab_size, gen);
  Megatron1DContext<T> model_scheme(e.grid, e.backend);
  Gpt<T> model(model_scheme, config, batch, seq, {.checkpoint = true});
  model.init(1);
  model.forward(tokens, targets);
  model.backward();
  std::uint64_t count = 0, mpi = 0;
  std::string caller;
  {
    CountAllocations counter;
    model.forward(tokens, targets);
    model.backward();
    count = counter.count();
    mpi = counter.mpi_count();
    caller = counter.first_caller();
  }
  EXPECT_EQ(count, 0u) << "first allocation from " << caller;
  ::testing::Test::RecordProperty("mpi_internal_allocations", static_cast<int>(mpi));
}
TEST(Gpt1D, TrainingStepAllocatesNothing) {
  training_step_allocates_nothing<float>();
}
TEST(Gpt1D, TrainingStepAllocatesNothingBf16) {
  training_step_allocates_nothing<bf16>();
}

// Buffers are sized analytically before the first step: after a step the
// high-water marks reach (and never pass) the capacities (bf16: statistics
// in fp32 next to bf16 activations).
template <class T>
void buffers_sized_exactly() {
  LineEnv& e = line_env();
  const reference::GptConfig config = test_config();
  const index_t batch = 3, seq = 4;
  std::mt19937_64 gen(fresh_seed());
  const auto tokens = random_ids(batch * seq, config.vocab_size, gen);
  const auto targets = random_ids(batch * seq, config.vocab_size, gen);
  for (bool checkpoint : {true, false}) {
    Megatron1DContext<T> model_scheme(e.grid, e.backend);
    Gpt<T> model(model_scheme, config, batch, seq, {.checkpoint = checkpoint});
    model.init(3);
    model.forward(tokens, targets);
    model.backward();
    const MemoryReport r = model.memory_report();
    for (const BufferUsage& b : r.buffers) {
      EXPECT_LE(b.high_water, b.capacity) << b.name;
      if (b.name != "workspace") {
        EXPECT_EQ(b.high_water, b.capacity) << b.name;
      }
      EXPECT_GT(b.high_water, 0u) << b.name;
    }
    EXPECT_EQ(
        model.buffers().checkpoint.capacity(),
        static_cast<std::size_t>(config.n_layer + 1) *
            Arena::rounded(static_cast<std::size_t>(batch * seq * config.n_embd) * sizeof(T)));
    EXPECT_EQ(r.activations,
              model.buffers().forward.high_water() + model.buffers().checkpoint.high_water());
  }
}
TEST(Gpt1D, BuffersSizedExactly) {
  buffers_sized_exactly<double>();
}
TEST(Gpt1D, BuffersSizedExactlyBf16) {
  buffers_sized_exactly<bf16>();
}

// Each invalid configuration throws the same summa::Error on every rank.
void expect_config_error(const reference::GptConfig& c, index_t batch, index_t seq,
                         const std::string& needle) {
  LineEnv& e = line_env();
  const std::string msg = error_of([&] {
    Megatron1DContext<float> model_scheme(e.grid, e.backend);
    Gpt<float> model(model_scheme, c, batch, seq);
  });
  EXPECT_NE(msg.find(needle), std::string::npos) << "'" << msg << "' lacks '" << needle << "'";
}

TEST(Gpt1D, InvalidConfigurationsThrowEverywhere) {
  LineEnv& e = line_env();
  const int p = group_size();
  const reference::GptConfig good = test_config();
  {
    auto c = good;
    c.n_embd = good.n_embd + 1;
    expect_config_error(c, 1, 4, "divisible by n_head");
  }
  expect_config_error(good, 1, good.n_positions + 1, "longer than the position table");
  expect_config_error(good, 0, 4, "must be positive");
  // any batch works: no batch divisibility in 1D
  EXPECT_EQ(error_of([&] {
              Megatron1DContext<float> m_scheme(e.grid, e.backend);
              Gpt<float> m(m_scheme, good, p + 1, 3);
            }),
            "");
  if (p > 1) {
    auto c = good;
    c.n_head = 1;
    c.n_embd = 8 * p + 1;  // a valid GPT-2 shape, not divisible by p
    expect_config_error(c, 1, 4, "n_embd (hidden)");
    c = good;
    c.n_head = p + 1;
    c.n_embd = (p + 1) * p * 2;  // divisible by p and by n_head; n_head not by p
    expect_config_error(c, 1, 4, "n_head=");
    c = good;
    c.vocab_size = good.vocab_size + 1;
    expect_config_error(c, 1, 4, "vocab_size");
    // a grid with a data axis: every rank its own tensor group of one
    ProcessGrid data_grid = ProcessGrid::linear1d(MPI_COMM_WORLD, 1, p, test_grid_options());
    const std::string msg = error_of([&] {
      Megatron1DContext<float> m_scheme(data_grid, e.backend);
      Gpt<float> m(m_scheme, good, 1, 3);
    });
    EXPECT_NE(msg.find("data-parallel"), std::string::npos) << msg;
  }
}

TEST(Gpt1D, BadIdsThrowEverywhere) {
  LineEnv& e = line_env();
  const reference::GptConfig config = test_config();
  const index_t batch = 2, seq = 3;
  Megatron1DContext<float> model_scheme(e.grid, e.backend);
  Gpt<float> model(model_scheme, config, batch, seq);
  model.init(5);
  std::vector<std::int32_t> ok(static_cast<std::size_t>(batch * seq), 1);
  for (auto [where, value, needle] :
       {std::tuple{0, config.vocab_size, "token id"}, std::tuple{1, -1, "target id"}}) {
    auto tokens = ok, targets = ok;
    (where == 0 ? tokens : targets)[2] = value;
    const std::string msg = error_of([&] { model.forward(tokens, targets); });
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }
  const std::string msg =
      error_of([&] { model.forward(std::vector<std::int32_t>(ok.size() + 1, 0), ok); });
  EXPECT_NE(msg.find("expected batch*seq"), std::string::npos) << msg;
  EXPECT_THROW(model.backward(), Error);  // failed forwards leave nothing to differentiate
}

}  // namespace
}  // namespace summa::test

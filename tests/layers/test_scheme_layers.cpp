// One typed suite over the tensor-parallel schemes: every layer written once
// over SchemeContext (the scheme's linear, LayerNorm, embedding, LM head and
// cross-entropy; GeLU, Attention, MLP, TransformerBlock) and the whole Gpt,
// against the serial reference summa::reference::Gpt, under every scheme of
// the rank count without a data axis (schemes_for(ranks) with data = 1: 1D at
// p = ranks, 2D when ranks is a square, 3D on every X x Y x Z
// factorisation; CTest: 1, 2, 4, 8 and 9 ranks), in double, float and bf16.
// Written once with the scheme-generic API only (make_context,
// SchemeContext::activation_block / local_rows / local_cols / the splits,
// the layers the context makes, Gpt and its views). Each case is a
// value-parameterised test per scheme, e.g.
// Every/SchemeLayers.AttentionFloat/3d_2x1x2. The data axis is covered by
// test_schemes.cpp and test_gpt2d_data.cpp; what only one scheme has (1D's
// traffic and replica set, 3D's overlap switches and per-axis collectives,
// the SUMMA forms, 2D's LayerNorm kernels, each scheme's own configuration
// messages) stays in tests/schemes/<scheme>/.
//
// SchemeLayers: each layer alone. Oracle: a one-block reference runs forward
// and backward on fresh random weights (the layout-invariant initialisation
// the layer's ParameterStore gets too) and tokens; the layer gets the
// reference's input activation (its local block, activation_block:
// replicated, split by columns, rows or both, depending on the scheme and
// the layout) and, in backward, the reference's gradient of its output; its
// output, its input gradient and every parameter gradient (gathered to the
// global tensor with gather_global, which also checks that the shards cover
// each element exactly once) must match the reference's. Linear expand
// (c_fc), expand with the q|k|v groups (c_attn), contract (c_proj),
// LayerNorm, GeLU, Attention (and its qkv and context), MLP,
// TransformerBlock, the embedding (wpe's gradient, and wte's by an
// independent scatter-add of d embeddings) and the tied LM head with the
// scheme's vocabulary-parallel cross-entropy (loss, the same on every rank;
// logits, dlogits, dX, wte's head part = dlogitsᵀ ln_f independently). Also:
// the shards of a GPT keep Hugging Face names and shapes, cover each element
// once with the reference's initial values and replicas hold their owner's;
// attention's configuration errors, the same on every rank.
//
// SchemeGpt: the whole model on the same global weights (init(seed), equal
// to the reference's exactly): loss (bit-identical on every rank), every
// block boundary, LN_f, the logits, each block's qkv and context (without
// checkpointing, which releases them), the input gradient and every
// parameter gradient, with checkpointing on and off, in double, float and
// bf16, and the memory report (buffers sized exactly: high water = capacity
// but for the workspace, the checkpoint buffer n_layer + 1 block
// boundaries); two steps, the second accumulating: checkpointing and the
// scheme's options on vs off agree (float, double), accumulation doubles the
// gradients, replicated activations and parameters (values and gradients)
// stay bit-identical to their owners'; no heap allocation in a training step
// after warm-up (skipped under ASan and on CUDA); generic configuration
// errors (n_embd % n_head, seq > n_positions, an empty batch, the batch and
// heads the scheme's attention splits) and bad ids throw the same
// summa::Error on every rank.
//
// Options: every model and layer runs the scheme "overlapped" (2D: SUMMA
// panels of 5, so that a block takes several panels and a remainder,
// double-buffered; 3D: OAR, ORS and OAG on; a layer alone runs the
// context's hooks as a model does); the second model of the agreement test
// runs it "plain" (2D: a whole block per SUMMA step, no overlap; 3D: no
// overlap) and without checkpointing. The default options (2D panel 256, 3D
// OAR only) run in test_schemes.cpp against the same reference.
//
// Shapes: m = max(ranks, 4) heads of dimension 4 (n_embd = 4m), vocab 40
// rounded up to a multiple of the ranks (45 at 9), n_positions 7 (not a
// multiple of 2, 3 or 4: uneven position chunks), seq 4, and a batch of the
// smallest size every scheme of the rank count splits into at least two
// sequences per part (common_batch), rounded up to at least 8 sequences (8
// at 1, 2 and 4 ranks, 16 at 8, 18 at 9), so every size divides by every p,
// q, Gx, Gy, Gz the rank count gives; 2 blocks for the model, 1 for the
// layers.
//
// Tolerances. Double and float: max |a - b| / max |b| of a whole tensor (of
// a rank's block, the largest over ranks, for activations),
// model_tolerance<T>(): 1e-9 in double (observed ~1e-14) and 2e-3 in float
// (observed ~1e-5). Both sides start from the same global weights, so only
// rounding differs: the distributed layers sum GEMM products in another
// order (SUMMA panels, reductions over the grid) and keep LayerNorm /
// softmax statistics in T where the reference uses double; at these sizes
// accumulated rounding is ~k eps with k <= 4h. A wrong shard, head
// permutation or reduction gives errors of order 1. Checkpointing and the
// options on vs off agree to 1e-12 (double) and 1e-5 (float), an
// accumulated second step doubles the gradients to 1e-12 / 1e-6.
// bf16 (bf16 storage, fp32 arithmetic and statistics): the double reference
// on the same weights rounded to bf16 (what ParameterStore<bf16> holds), so
// that what is measured is the error of computing in bf16; a layer's inputs
// are the reference's, rounded to bf16. Metric: the norm-wise relative error
// ||a - b||_2 / ||b||_2 of a whole tensor (over all ranks' blocks), in units
// of bf16's unit roundoff u = 2^-8 (SUMMA_TEST_PRINT_ERRORS=1 prints every
// error). Bounds, the per-scheme files' (test_layers2d, test_gpt1d,
// test_gpt3d), against the worst measured here over 28 runs at 1, 2, 4, 8
// and 9 ranks, every scheme (CPU): the loss 1u (measured 0.01u); a layer's
// output and the model's activations and logits 4u (2.1u, the MLP's
// output); a layer's gradients 8u (3.4u over those runs, ln_1.bias through a
// block, whose column sum cancels; 6.006u once in CI, 3d:1x4x1, seed
// 8229079158553933711, so 6u was too tight); the
// model's input gradient 6u sqrt(L) (1.6u) and parameter gradients 10u
// sqrt(L) (4.7u at L = 2, ln_1.bias: a column sum over the tokens of terms
// of both signs, whose cancellation magnifies the activation gradients'
// ~1.5u; with n_embd 8 and 16 tokens it reached 10.9u, hence the sizes
// above). A missing or doubled term of a sum over ranks, a wrong sign or
// layout moves a tensor by O(1) of its norm, ~100u, far above them.
//
// Cost: the reference of a case is computed once and shared by its schemes
// (they run one after another; fresh data every case and run): every rank
// computes it, which at 9 ranks on a few cores otherwise took most of the
// time. Replicas and model-to-model comparisons assemble all parameters
// with one all-reduce (globals_of) instead of a gather per tensor.
//
// Backend: test_backend() (SUMMA_TEST_BACKEND=cpu|cpu_device|cuda) with its
// communicators (test_grid_options(), small staging buffers: a grid per
// scheme). Inputs are built on the host and uploaded, outputs downloaded; on
// CUDA float runs in fp32 (no TF32), double in fp64 and bf16 with fp32
// accumulation, so the tolerances hold unchanged.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <ostream>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "summa/parallel/scheme.hpp"
#include "summa/schemes/megatron1d/spec.hpp"
#include "summa/schemes/registry.hpp"
#include "test_util.hpp"

namespace summa {
// A scheme in gtest's messages (a case's parameter): its text.
static void PrintTo(const SchemeSpec& spec, std::ostream* os) {
  *os << spec.str();
}
}  // namespace summa

namespace summa::test {
namespace {

// ---------------------------------------------------------------- schemes

int world_size() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

// Every scheme of the rank count without a data axis.
std::vector<SchemeSpec> tensor_schemes() {
  std::vector<SchemeSpec> out;
  for (const SchemeSpec& s : schemes_for(world_size()))
    if (s.data == 1) out.push_back(s);
  return out;
}

// "3d:2x1x2" -> "3d_2x1x2": the scheme in a test's name.
std::string scheme_name(const testing::TestParamInfo<SchemeSpec>& info) {
  std::string name = info.param.str();
  for (char& c : name)
    if (std::isalnum(static_cast<unsigned char>(c)) == 0) c = '_';
  return name;
}

// The scheme with its collectives overlapped (see the file comment).
SchemeSpec overlapped(SchemeSpec s) {
  if (s.holds<Summa2DSpec>()) {
    s.as<Summa2DSpec>().summa.panel = 5;
    s.as<Summa2DSpec>().summa.overlap = true;
  }
  if (s.holds<Axonn3DSpec>()) {
    Axonn3DSpec& g = s.as<Axonn3DSpec>();
    g.oar = g.ors = g.oag = true;
  }
  return s;
}
// ... and without overlap.
SchemeSpec plain(SchemeSpec s) {
  if (s.holds<Summa2DSpec>()) {
    s.as<Summa2DSpec>().summa.panel = 0;
    s.as<Summa2DSpec>().summa.overlap = false;
  }
  if (s.holds<Axonn3DSpec>()) {
    Axonn3DSpec& g = s.as<Axonn3DSpec>();
    g.oar = g.ors = g.oag = false;
  }
  return s;
}

// test_grid_options() with small staging buffers (mpi_staged pins one per
// axis of every grid, and there is a grid per scheme; the largest collective
// here is a few KB).
GridOptions grid_options() {
  GridOptions o = test_grid_options();
  o.staging_bytes = std::size_t{1} << 20;
  return o;
}

// The grid of every scheme, built once (collective: on first use, which is
// the same test on every rank).
struct Env {
  Backend& backend = test_backend();  // first: selects the rank's device
  std::vector<SchemeSpec> specs = tensor_schemes();
  std::vector<ProcessGrid> grids;
  Env() {
    grids.reserve(specs.size());
    for (const SchemeSpec& s : specs) grids.push_back(make_grid(MPI_COMM_WORLD, s, grid_options()));
  }
};
Env& env() {
  static Env e;
  return e;
}

// The grid of a scheme (whatever its options).
ProcessGrid& grid_of(const SchemeSpec& spec) {
  Env& e = env();
  SchemeSpec key = plain(spec);  // 1D's distributed checkpoints: the plain 1D grid
  if (key.holds<Megatron1DSpec>()) key.as<Megatron1DSpec>().distribute_checkpoints = false;
  for (std::size_t k = 0; k < e.specs.size(); ++k) {
    const SchemeSpec& s = e.specs[k];
    if (plain(s) == key) return e.grids[k];  // the same scheme and grid
  }
  throw Error("no grid for " + spec.str());
}

template <class T>
std::unique_ptr<SchemeContext<T>> context_of(const SchemeSpec& spec) {
  return make_context<T>(spec, grid_of(spec), env().backend);
}

// ---------------------------------------------------------------- the model

// The GPT of every test at this rank count (see the file comment).
GptConfig test_config(int n_layer) {
  const int n = world_size(), m = std::max(n, 4);
  GptConfig c;
  c.n_layer = n_layer;
  c.n_head = m;
  c.n_embd = 4 * m;
  c.n_positions = 7;
  c.vocab_size = (40 + n - 1) / n * n;
  return c;
}
index_t test_batch() {
  const index_t b = common_batch(tensor_schemes());
  return b * ((8 + b - 1) / b);  // at least 8 sequences
}
constexpr index_t kSeq = 4;

std::vector<std::int32_t> random_ids(index_t n, int vocab, std::mt19937_64& gen) {
  std::uniform_int_distribution<int> dist(0, vocab - 1);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(n));
  for (auto& id : ids) id = dist(gen);
  return ids;
}

template <class T>
constexpr bool kIsBf16 = std::is_same_v<T, bf16>;
// The reference's element type for a model in T: double for bf16.
template <class T>
using Ref = std::conditional_t<kIsBf16<T>, double, T>;

// bf16 bounds, norm-wise, in units of u (see the file comment).
constexpr double kBf16Loss = kBf16Unit;
constexpr double kBf16Act = 4 * kBf16Unit;
constexpr double kBf16LayerGrad = 8 * kBf16Unit;
// The model's gradients through `depth` blocks: the input gradient 6u
// sqrt(depth), every parameter gradient 10u sqrt(depth).
double bf16_input_grad_tolerance(int depth) {
  return 6 * kBf16Unit * std::sqrt(static_cast<double>(depth));
}
double bf16_grad_tolerance(int depth) {
  return 10 * kBf16Unit * std::sqrt(static_cast<double>(depth));
}

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

// A bf16 error (rank 0) when SUMMA_TEST_PRINT_ERRORS is set.
void note_bf16(const std::string& what, double err) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0 || std::getenv("SUMMA_TEST_PRINT_ERRORS") == nullptr) return;
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  std::printf("[bf16 errors] %s %s = %.2f u\n", info ? info->name() : "", what.c_str(),
              err / kBf16Unit);
}

// The same double on every rank, bit for bit. Collective.
bool same_value_on_all_ranks(double v) {
  double all[2] = {v, -v};
  MPI_Allreduce(MPI_IN_PLACE, all, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  int same = std::memcmp(&all[0], &v, sizeof v) == 0 && all[0] == -all[1] ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return same == 1;
}

// A tensor spread over the ranks (each rank its local block, replicas
// included: every global element is held by equally many ranks) against the
// reference's blocks: max-norm per rank in float and double, norm-wise over
// the ranks in bf16 with bound `bf16_tol`. Collective.
// (A rank whose sizes differ fails and still joins the collective.)
template <class T, class R>
void expect_close(const std::vector<T>& got, const std::vector<R>& want, const std::string& what,
                  double bf16_tol) {
  EXPECT_EQ(got.size(), want.size()) << what;
  const bool sizes = got.size() == want.size();
  if constexpr (kIsBf16<T>) {
    const double err =
        norm_error_over_ranks(sizes ? got : std::vector<T>{}, sizes ? want : std::vector<R>{});
    note_bf16(what, err);
    EXPECT_LE(err, bf16_tol) << what;
  } else {
    const double err = sizes ? rel_error(got, want) : std::numeric_limits<double>::infinity();
    EXPECT_LE(max_over_ranks(err), model_tolerance<T>()) << what;
  }
}

// A whole tensor, the same on every rank (a gathered parameter gradient),
// against the reference's.
template <class T, class W>
void expect_global_close(const std::vector<T>& got, const W& want, const std::string& what,
                         double bf16_tol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  if constexpr (kIsBf16<T>) {
    const double err = norm_error(got, want);
    note_bf16(what, err);
    EXPECT_LE(err, bf16_tol) << what;
  } else {
    EXPECT_LE(rel_error(got, want), model_tolerance<T>()) << what;
  }
}

// ---------------------------------------------------------------- activations

// A reference activation in a scheme's layout: `groups` equal column groups,
// each laid out like a whole activation (c_attn's q | k | v).
struct Act {
  std::string name;
  index_t width;
  ActivationLayout layout;
  int groups = 1;
};
constexpr ActivationLayout kOuter = ActivationLayout::outer;
constexpr ActivationLayout kInner = ActivationLayout::inner;

// This rank's block of a global row-major [tokens, width] tensor in
// `layout` (activation_block of each column group, side by side).
template <class T, class R>
std::vector<R> local_of(const SchemeContext<T>& ctx, std::span<const R> global, index_t tokens,
                        index_t width, ActivationLayout layout, int groups = 1) {
  const index_t gw = width / groups;
  const ActivationBlock b = ctx.activation_block(tokens, gw, layout);
  std::vector<R> out;
  out.reserve(static_cast<std::size_t>(b.rows * b.cols * groups));
  for (index_t r = b.row0; r < b.row0 + b.rows; ++r)
    for (int g = 0; g < groups; ++g)
      for (index_t c = g * gw + b.col0; c < g * gw + b.col0 + b.cols; ++c)
        out.push_back(global[static_cast<std::size_t>(r * width + c)]);
  return out;
}

// Local columns of an activation (all its column groups).
template <class T>
index_t local_width(const SchemeContext<T>& ctx, index_t tokens, const Act& a) {
  return ctx.activation_block(tokens, a.width / a.groups, a.layout).cols * a.groups;
}

// Largest error of a local view of a global activation against the
// reference's (bf16: norm-wise over the ranks). Collective.
template <class T, class R>
void expect_view_close(const SchemeContext<T>& ctx, ConstMatrixView<T> local,
                       std::span<const R> global, index_t tokens, const Act& a, double bf16_tol) {
  EXPECT_EQ(local.rows, ctx.local_rows(tokens, a.layout)) << a.name;
  EXPECT_EQ(local.cols, local_width(ctx, tokens, a)) << a.name;
  expect_close<T>(download_view<T>(local),
                  local_of(ctx, global, tokens, a.width, a.layout, a.groups), a.name, bf16_tol);
}

// True when every rank holding a block of the global [tokens, width]
// activation in `layout` holds exactly what the block's owner holds (the
// owners' blocks summed into the global tensor in double, exact for every T:
// one addend is not zero; only the sign of a zero is not told apart).
// Collective.
template <class T>
bool activation_replicas_match(const SchemeContext<T>& ctx, ConstMatrixView<T> local,
                               index_t tokens, index_t width, ActivationLayout layout) {
  const ActivationBlock b = ctx.activation_block(tokens, width, layout);
  const std::vector<T> mine = download_view<T>(local);
  std::vector<double> global(static_cast<std::size_t>(tokens * width), 0.0);
  const auto at = [&](index_t r, index_t c) {
    return static_cast<std::size_t>((b.row0 + r) * width + b.col0 + c);
  };
  int same = mine.size() == static_cast<std::size_t>(b.rows * b.cols) ? 1 : 0;
  if (same == 1 && b.owner)
    for (index_t r = 0; r < b.rows; ++r)
      for (index_t c = 0; c < b.cols; ++c)
        global[at(r, c)] = static_cast<double>(mine[static_cast<std::size_t>(r * b.cols + c)]);
  MPI_Allreduce(MPI_IN_PLACE, global.data(), static_cast<int>(global.size()), MPI_DOUBLE, MPI_SUM,
                MPI_COMM_WORLD);
  if (same == 1)
    for (index_t r = 0; r < b.rows; ++r)
      for (index_t c = 0; c < b.cols; ++c)
        if (static_cast<double>(mine[static_cast<std::size_t>(r * b.cols + c)]) != global[at(r, c)])
          same = 0;
  MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return same == 1;
}

// A parameter's local value or gradient, on the host.
template <class T>
std::vector<T> local_values(const Param<T>& p, bool grad) {
  std::vector<T> host(static_cast<std::size_t>(p.shard.local_size()));
  if (!host.empty())
    env().backend.download(host.data(), grad ? p.grad : p.value, host.size() * sizeof(T));
  return host;
}

// Every parameter's global tensor (values, or gradients with `grad`) in
// double (exact for every T), assembled from the owners' pieces with one
// all-reduce (every element has one owner, so one addend is not zero): for
// comparing models with each other and replicas with their owners in a
// single collective (the gradients compared with the reference go through
// gather_global). Collective.
template <class T>
std::vector<std::vector<double>> globals_of(const std::vector<Param<T>*>& params, bool grad) {
  std::vector<std::size_t> offset{0};
  for (const Param<T>* p : params)
    offset.push_back(offset.back() + static_cast<std::size_t>(p->shard.global_size()));
  std::vector<double> all(offset.back(), 0.0);
  for (std::size_t k = 0; k < params.size(); ++k) {
    const ParamShard& s = params[k]->shard;
    if (!s.owner) continue;
    const std::vector<T> local = local_values(*params[k], grad);
    for (const ShardPiece& piece : s.pieces)
      for (index_t r = 0; r < piece.rows; ++r)
        for (index_t c = 0; c < piece.cols; ++c)
          all[offset[k] + static_cast<std::size_t>((piece.global_row + r) * s.global_cols() +
                                                   piece.global_col + c)] =
              static_cast<double>(local[static_cast<std::size_t>(
                  (piece.local_row + r) * s.local_cols + piece.local_col + c)]);
  }
  MPI_Allreduce(MPI_IN_PLACE, all.data(), static_cast<int>(all.size()), MPI_DOUBLE, MPI_SUM,
                MPI_COMM_WORLD);
  std::vector<std::vector<double>> out;
  for (std::size_t k = 0; k < params.size(); ++k)
    out.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(offset[k]),
                     all.begin() + static_cast<std::ptrdiff_t>(offset[k + 1]));
  return out;
}

// The parameters of which some rank's local elements (owner or replica)
// differ from the owners' (replicas must stay exact copies; compared as
// above). Collective.
template <class T>
std::string replicas_differ(const std::vector<Param<T>*>& params, bool grad) {
  const std::vector<std::vector<double>> global = globals_of(params, grad);
  std::vector<int> same(params.size(), 1);
  for (std::size_t k = 0; k < params.size(); ++k) {
    const ParamShard& s = params[k]->shard;
    const std::vector<T> local = local_values(*params[k], grad);
    for (const ShardPiece& piece : s.pieces)
      for (index_t r = 0; r < piece.rows; ++r)
        for (index_t c = 0; c < piece.cols; ++c)
          if (static_cast<double>(local[static_cast<std::size_t>(
                  (piece.local_row + r) * s.local_cols + piece.local_col + c)]) !=
              global[k][static_cast<std::size_t>((piece.global_row + r) * s.global_cols() +
                                                 piece.global_col + c)])
            same[k] = 0;
  }
  MPI_Allreduce(MPI_IN_PLACE, same.data(), static_cast<int>(same.size()), MPI_INT, MPI_MIN,
                MPI_COMM_WORLD);
  std::string names;
  for (std::size_t k = 0; k < params.size(); ++k)
    if (same[k] == 0) names += " " + params[k]->shard.name;
  return names;
}

// A local activation stored row-major in test_backend()'s memory, NaN until
// written.
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
  std::vector<T> data() const { return array.download(); }
};

// The message of the summa::Error `f` throws ("" if none), which must be the
// same on every rank. Collective.
template <class F>
std::string agreed_error_of(F&& f) {
  const std::string msg = error_of(std::forward<F>(f));
  EXPECT_TRUE(same_on_all_ranks(msg)) << msg;
  return msg;
}

// ---------------------------------------------------------------- layers alone

// The serial model the layers are checked against: one block, fresh weights
// and tokens (bf16_weights: its weights rounded to bf16, what a bf16 layer's
// ParameterStore holds).
template <class R>
struct Oracle {
  GptConfig config;
  index_t batch = test_batch(), seq = kSeq, tokens_n = batch * seq;
  std::uint64_t seed = fresh_seed();
  std::vector<std::int32_t> tokens, targets;
  reference::Gpt<R> ref;

  Oracle(int n_layer, bool bf16_weights) : config(test_config(n_layer)), ref(config, seed) {
    if (bf16_weights) round_to_bf16(ref.params());
    std::mt19937_64 gen(seed);
    tokens = random_ids(tokens_n, config.vocab_size, gen);
    targets = random_ids(tokens_n, config.vocab_size, gen);
    ref.forward(tokens, targets, batch, seq);
    ref.backward();
  }
  std::span<const R> act(const std::string& n) const { return ref.activation(n); }
  std::span<const R> dact(const std::string& n) const { return ref.activation_grad(n); }
  template <class T>
  std::vector<R> local(const SchemeContext<T>& ctx, const Act& a) const {
    return local_of(ctx, act(a.name), tokens_n, a.width, a.layout, a.groups);
  }
  template <class T>
  std::vector<R> dlocal(const SchemeContext<T>& ctx, const Act& a) const {
    return local_of(ctx, dact(a.name), tokens_n, a.width, a.layout, a.groups);
  }
};
template <class T>
using OracleOf = Oracle<Ref<T>>;

// The running case without its scheme ("Every/SchemeLayers.AttentionFloat").
std::string case_name() {
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  const std::string name = std::string(info->test_suite_name()) + "." + info->name();
  return name.substr(0, name.rfind('/'));
}

// The oracle (an O made from `args`) of the running case, made on its first
// scheme and shared by the others (a case's schemes run one after another):
// fresh data for every case and every run, the same for each of its schemes,
// at one reference computation per case instead of one per scheme (every
// rank computes it: at 9 ranks on a few cores that was most of the suite's
// time). Collective when it is made.
template <class O, class... Args>
const O& case_oracle(Args... args) {
  static std::string key;
  static std::unique_ptr<O> cached;
  const std::string name = case_name();
  if (cached == nullptr || key != name) {
    cached.reset();
    cached = std::make_unique<O>(args...);
    key = name;
  }
  return *cached;
}

// Every parameter gradient of `m`, gathered, against the reference.
template <class T>
void expect_param_grads(ProcessGrid& grid, Module<T>& m, const reference::Gpt<Ref<T>>& ref,
                        double bf16_tol) {
  for (Param<T>* p : m.parameters())
    expect_global_close<T>(gather_global(*p, grid, true), ref.grad(p->shard.name), p->shard.name,
                           bf16_tol);
}

// Runs an activation-to-activation layer on the reference's input `in`,
// compares Y with the reference's `out`, then backward from the reference's
// gradient of `out`: dX against `dx` (a global tensor laid out like `in`) and
// every parameter gradient. Runs the context's hooks as a model does.
template <class T>
void check_layer(SchemeContext<T>& ctx, Layer<T>& layer, const OracleOf<T>& o, const Act& in,
                 const Act& out, std::span<const Ref<T>> dx,
                 const std::function<void()>& after_forward = {}) {
  Backend& be = ctx.backend();
  ctx.finish_layers(false);
  ParameterStore<T> store(be, layer.parameters());
  store.init_gpt(o.seed, o.config);
  Arenas arenas(be, layer.buffer_needs());
  const index_t nt = o.tokens_n;
  const index_t in_rows = ctx.local_rows(nt, in.layout), out_rows = ctx.local_rows(nt, out.layout);
  const index_t in_cols = local_width(ctx, nt, in), out_cols = local_width(ctx, nt, out);
  Local<T> x(in_rows, in_cols, as<T>(o.local(ctx, in))), y(out_rows, out_cols),
      dx_local(in_rows, in_cols);
  Local<T> dy(out_rows, out_cols, as<T>(o.dlocal(ctx, out)));
  ctx.begin_forward();
  layer.forward(x.view(), y.view(), arenas.step);
  if (after_forward) after_forward();
  expect_close<T>(y.data(), o.local(ctx, out), "Y", kBf16Act);
  layer.backward(dy.view(), dx_local.view(), arenas.step);
  ctx.complete_deferred();
  expect_close<T>(dx_local.data(), local_of(ctx, dx, nt, in.width, in.layout, in.groups), "dX",
                  kBf16LayerGrad);
  expect_param_grads<T>(ctx.grid(), layer, o.ref, kBf16LayerGrad);
}

class SchemeLayers : public testing::TestWithParam<SchemeSpec> {};
class SchemeGpt : public testing::TestWithParam<SchemeSpec> {};

// Cases for every element type: <Case>Double, <Case>Float, <Case>Bf16.
#define SCHEME_CASE_TYPES(Suite, Case, function) \
  TEST_P(Suite, Case##Double) {                  \
    function<double>(GetParam());                \
  }                                              \
  TEST_P(Suite, Case##Float) {                   \
    function<float>(GetParam());                 \
  }                                              \
  TEST_P(Suite, Case##Bf16) {                    \
    function<bf16>(GetParam());                  \
  }

template <class T>
void linear_expand(const SchemeSpec& spec) {
  const OracleOf<T>& o = case_oracle<OracleOf<T>>(1, kIsBf16<T>);
  SCOPED_TRACE(seed_note(o.seed));
  const auto ctx = context_of<T>(overlapped(spec));
  const index_t h = o.config.n_embd;
  const auto fc = ctx->linear("h.0.mlp.c_fc", o.tokens_n, h, 4 * h, LinearRole::expand);
  // ln_2's output only feeds c_fc: its gradient is c_fc's input gradient.
  check_layer<T>(*ctx, *fc, o, {"h.0.ln_2", h, kOuter}, {"h.0.mlp.c_fc", 4 * h, kInner},
                 o.dact("h.0.ln_2"));
}
SCHEME_CASE_TYPES(SchemeLayers, LinearExpand, linear_expand)

template <class T>
void linear_expand_groups(const SchemeSpec& spec) {
  const OracleOf<T>& o = case_oracle<OracleOf<T>>(1, kIsBf16<T>);
  SCOPED_TRACE(seed_note(o.seed));
  const auto ctx = context_of<T>(overlapped(spec));
  const index_t h = o.config.n_embd;
  const auto attn =
      ctx->linear("h.0.attn.c_attn", o.tokens_n, h, 3 * h, LinearRole::expand, true, {.out = 3});
  check_layer<T>(*ctx, *attn, o, {"h.0.ln_1", h, kOuter}, {"h.0.attn.c_attn", 3 * h, kInner, 3},
                 o.dact("h.0.ln_1"));
}
SCHEME_CASE_TYPES(SchemeLayers, LinearExpandQkvGroups, linear_expand_groups)

template <class T>
void linear_contract(const SchemeSpec& spec) {
  const OracleOf<T>& o = case_oracle<OracleOf<T>>(1, kIsBf16<T>);
  SCOPED_TRACE(seed_note(o.seed));
  const auto ctx = context_of<T>(overlapped(spec));
  const index_t h = o.config.n_embd;
  const auto proj = ctx->linear("h.0.mlp.c_proj", o.tokens_n, 4 * h, h, LinearRole::contract);
  // the GeLU output only feeds c_proj: its gradient is c_proj's input gradient.
  check_layer<T>(*ctx, *proj, o, {"h.0.mlp.gelu", 4 * h, kInner}, {"h.0.mlp.c_proj", h, kOuter},
                 o.dact("h.0.mlp.gelu"));
}
SCHEME_CASE_TYPES(SchemeLayers, LinearContract, linear_contract)

template <class T>
void layer_norm(const SchemeSpec& spec) {
  const OracleOf<T>& o = case_oracle<OracleOf<T>>(1, kIsBf16<T>);
  SCOPED_TRACE(seed_note(o.seed));
  const auto ctx = context_of<T>(overlapped(spec));
  const index_t h = o.config.n_embd;
  const auto ln = ctx->layer_norm("h.0.ln_2", o.tokens_n, h, o.config.layer_norm_epsilon);
  // mid feeds the residual and ln_2: ln_2's input gradient is d mid - d output.
  std::vector<Ref<T>> want(o.dact("h.0.mid").begin(), o.dact("h.0.mid").end());
  const auto out = o.dact("h.0.output");
  for (std::size_t k = 0; k < want.size(); ++k) want[k] -= out[k];
  check_layer<T>(*ctx, *ln, o, {"h.0.mid", h, kOuter}, {"h.0.ln_2", h, kOuter}, want);
}
SCHEME_CASE_TYPES(SchemeLayers, LayerNorm, layer_norm)

template <class T>
void gelu(const SchemeSpec& spec) {
  const OracleOf<T>& o = case_oracle<OracleOf<T>>(1, kIsBf16<T>);
  SCOPED_TRACE(seed_note(o.seed));
  const auto ctx = context_of<T>(overlapped(spec));
  const index_t f = 4 * o.config.n_embd;
  GeLU<T> layer(ctx->backend());
  check_layer<T>(*ctx, layer, o, {"h.0.mlp.c_fc", f, kInner}, {"h.0.mlp.gelu", f, kInner},
                 o.dact("h.0.mlp.c_fc"));
}
SCHEME_CASE_TYPES(SchemeLayers, GeLU, gelu)

template <class T>
void attention(const SchemeSpec& spec) {
  const OracleOf<T>& o = case_oracle<OracleOf<T>>(1, kIsBf16<T>);
  SCOPED_TRACE(seed_note(o.seed));
  const auto ctx = context_of<T>(overlapped(spec));
  const index_t h = o.config.n_embd, nt = o.tokens_n;
  Attention<T> attn(*ctx, "h.0.attn", o.batch, o.seq, h, o.config.n_head);
  // the intermediates too: q | k | v of this rank's heads, its context
  const auto intermediates = [&] {
    expect_view_close<T>(*ctx, attn.qkv(), o.act("h.0.attn.c_attn"), nt,
                         {"h.0.attn.c_attn", 3 * h, kInner, 3}, kBf16Act);
    expect_view_close<T>(*ctx, attn.context(), o.act("h.0.attn.context"), nt,
                         {"h.0.attn.context", h, kInner}, kBf16Act);
  };
  check_layer<T>(*ctx, attn, o, {"h.0.ln_1", h, kOuter}, {"h.0.attn.c_proj", h, kOuter},
                 o.dact("h.0.ln_1"), intermediates);
}
SCHEME_CASE_TYPES(SchemeLayers, Attention, attention)

template <class T>
void mlp(const SchemeSpec& spec) {
  const OracleOf<T>& o = case_oracle<OracleOf<T>>(1, kIsBf16<T>);
  SCOPED_TRACE(seed_note(o.seed));
  const auto ctx = context_of<T>(overlapped(spec));
  const index_t h = o.config.n_embd;
  MLP<T> layer(*ctx, "h.0.mlp", o.tokens_n, h);
  check_layer<T>(*ctx, layer, o, {"h.0.ln_2", h, kOuter}, {"h.0.mlp.c_proj", h, kOuter},
                 o.dact("h.0.ln_2"));
}
SCHEME_CASE_TYPES(SchemeLayers, MLP, mlp)

// bf16: the block on the bf16-rounded input activation and output gradient
// of the double reference with bf16-rounded weights.
template <class T>
void block(const SchemeSpec& spec) {
  const OracleOf<T>& o = case_oracle<OracleOf<T>>(1, kIsBf16<T>);
  SCOPED_TRACE(seed_note(o.seed));
  const auto ctx = context_of<T>(overlapped(spec));
  const index_t h = o.config.n_embd;
  TransformerBlock<T> layer(*ctx, "h.0", o.batch, o.seq, h, o.config.n_head,
                            o.config.layer_norm_epsilon);
  EXPECT_EQ(layer.parameters().size(), kParamsPerBlock);
  check_layer<T>(*ctx, layer, o, {"embeddings", h, kOuter}, {"h.0.output", h, kOuter},
                 o.dact("embeddings"));
}
SCHEME_CASE_TYPES(SchemeLayers, Block, block)

// The parameter called `name` of a module.
template <class T>
Param<T>& param_named(Module<T>& m, const std::string& name) {
  for (Param<T>* p : m.parameters())
    if (p->shard.name == name) return *p;
  throw Error("no parameter " + name);
}

template <class T>
void embedding(const SchemeSpec& spec) {
  const OracleOf<T>& o = case_oracle<OracleOf<T>>(1, kIsBf16<T>);
  SCOPED_TRACE(seed_note(o.seed));
  const auto ctx = context_of<T>(overlapped(spec));
  const index_t h = o.config.n_embd, V = o.config.vocab_size, nt = o.tokens_n;
  const auto emb = ctx->embedding(o.batch, o.seq, V, h, o.config.n_positions);
  ctx->finish_layers(false);
  ParameterStore<T> store(ctx->backend(), emb->parameters());
  store.init_gpt(o.seed, o.config);
  Arenas arenas(ctx->backend(), emb->buffer_needs());
  const Act out{"embeddings", h, kOuter};
  const index_t rows = ctx->local_rows(nt, kOuter), cols = local_width(*ctx, nt, out);
  Local<T> y(rows, cols), dy(rows, cols, as<T>(o.dlocal(*ctx, out)));
  ctx->begin_forward();
  emb->forward(o.tokens, y.view(), arenas.step);
  expect_close<T>(y.data(), o.local(*ctx, out), "embeddings", kBf16Act);
  emb->backward(dy.view(), arenas.step);
  ctx->complete_deferred();
  // wpe is only used here: the reference's gradient is exactly this layer's.
  expect_global_close<T>(gather_global(param_named(*emb, "wpe.weight"), ctx->grid(), true),
                         o.ref.grad("wpe.weight"), "wpe grad", kBf16LayerGrad);
  // wte's embedding part, independently: rows of d embeddings added by token id.
  std::vector<double> want(static_cast<std::size_t>(V * h), 0.0);
  const auto d = o.dact("embeddings");
  for (index_t r = 0; r < nt; ++r)
    for (index_t c = 0; c < h; ++c)
      want[static_cast<std::size_t>(o.tokens[static_cast<std::size_t>(r)] * h + c)] +=
          static_cast<double>(d[static_cast<std::size_t>(r * h + c)]);
  expect_global_close<T>(gather_global(emb->wte(), ctx->grid(), true), want, "wte grad",
                         kBf16LayerGrad);
}
SCHEME_CASE_TYPES(SchemeLayers, Embedding, embedding)

template <class T>
void lm_head(const SchemeSpec& spec) {
  const OracleOf<T>& o = case_oracle<OracleOf<T>>(1, kIsBf16<T>);
  SCOPED_TRACE(seed_note(o.seed));
  const auto ctx = context_of<T>(overlapped(spec));
  const index_t h = o.config.n_embd, V = o.config.vocab_size, nt = o.tokens_n;
  const auto emb = ctx->embedding(o.batch, o.seq, V, h, o.config.n_positions);
  const auto head = ctx->lm_head(emb->wte(), nt, h, V);
  EXPECT_TRUE(head->parameters().empty());  // tied
  ctx->finish_layers(false);
  ParameterStore<T> store(ctx->backend(), emb->parameters());
  store.init_gpt(o.seed, o.config);
  Arenas arenas(ctx->backend(), head->buffer_needs());
  const Act in{"ln_f", h, kOuter}, logits{"logits", V, kInner};
  const index_t rows = ctx->local_rows(nt, kOuter), cols = local_width(*ctx, nt, in);
  Local<T> x(rows, cols, as<T>(o.local(*ctx, in))), dx(rows, cols);
  ctx->begin_forward();
  const double loss = head->forward(x.view(), o.targets, arenas.step);
  const double want_loss = static_cast<double>(o.ref.loss());
  const double loss_err = std::abs(loss - want_loss) / std::abs(want_loss);
  if constexpr (kIsBf16<T>) note_bf16("loss", loss_err);
  EXPECT_LE(loss_err, kIsBf16<T> ? kBf16Loss : model_tolerance<T>()) << loss << " vs " << want_loss;
  EXPECT_TRUE(same_value_on_all_ranks(loss)) << loss;
  expect_view_close<T>(*ctx, head->logits(), o.act("logits"), nt, logits, kBf16Act);
  head->backward(dx.view(), arenas.step);
  ctx->complete_deferred();
  expect_view_close<T>(*ctx, head->logits(), o.dact("logits"), nt, {"dlogits", V, kInner},
                       kBf16LayerGrad);
  expect_close<T>(dx.data(), o.dlocal(*ctx, in), "dX", kBf16LayerGrad);
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
  expect_global_close<T>(gather_global(emb->wte(), ctx->grid(), true), want, "wte grad",
                         kBf16LayerGrad);
}
SCHEME_CASE_TYPES(SchemeLayers, LMHeadCrossEntropy, lm_head)

// The shards of a whole GPT keep Hugging Face names and shapes, cover every
// global element exactly once (gather_global throws otherwise) with the
// reference's initial values, and replicas hold their owner's values.
// The spec's options reach the context: the outer rows are split over the
// ranks the scheme text names (1D: none, or p with sp=on; 2D: q; 3D: Z), so
// an sp=on dropped on the way (the context built plain) fails here, where
// the layer tests would pass against the layout the context reports.
TEST_P(SchemeLayers, OuterRowsFollowTheSpec) {
  const SchemeSpec& spec = GetParam();
  const auto ctx = context_of<float>(spec);
  index_t split = 1;
  if (spec.holds<Megatron1DSpec>() && spec.as<Megatron1DSpec>().sequence_parallel)
    split = spec.as<Megatron1DSpec>().p;
  else if (spec.holds<Summa2DSpec>())
    split = spec.as<Summa2DSpec>().q;
  else if (spec.holds<Axonn3DSpec>())
    split = spec.as<Axonn3DSpec>().gz;
  const index_t tokens = 72 * split;
  EXPECT_EQ(ctx->local_rows(tokens, ActivationLayout::outer), tokens / split);
  // inner: 1D keeps every token (attention and the MLP's 4h are whole over the tokens)
  if (spec.holds<Megatron1DSpec>()) {
    EXPECT_EQ(ctx->local_rows(tokens, ActivationLayout::inner), tokens);
  }
  EXPECT_EQ(ctx->activation_block(tokens, 8, ActivationLayout::outer).rows, tokens / split);
}

TEST_P(SchemeLayers, ShardsCoverEachElementOnce) {
  const GptConfig config = test_config(1);
  const auto ctx = context_of<double>(GetParam());
  Gpt<double> model(*ctx, config, test_batch(), kSeq);
  model.init(11);
  const std::vector<ParamInfo> infos = parameter_list(config);
  const auto params = model.parameters_store().params();
  EXPECT_EQ(params.size(), infos.size());
  for (Param<double>* p : params) {
    const auto info = std::find_if(infos.begin(), infos.end(),
                                   [&](const auto& i) { return i.name == p->shard.name; });
    ASSERT_NE(info, infos.end()) << p->shard.name;
    EXPECT_EQ(p->shard.global_shape, info->shape) << p->shard.name;
    const auto global = gather_global(*p, ctx->grid());
    for (index_t k = 0; k < p->shard.global_size(); ++k)
      ASSERT_EQ(global[static_cast<std::size_t>(k)], init_value(11, p->shard.name, k, config))
          << p->shard.name << " element " << k;
  }
  EXPECT_EQ(replicas_differ(params, false), "");
}

// Attention's own constraints, through the context's splits: the same
// summa::Error on every rank.
TEST_P(SchemeLayers, AttentionConfigErrors) {
  const auto ctx = context_of<float>(GetParam());
  const int ss = ctx->sequence_split(), hs = ctx->head_split();
  const index_t hidden = 8 * hs * world_size();  // divisible by the heads and every split
  // the ranks the outer rows are split over (1D with sp=on: p, its linears' tokens)
  const index_t probe = 4 * ss * world_size(), row_split = probe / ctx->local_rows(probe, kOuter);
  const index_t b0 = std::lcm(static_cast<index_t>(ss), row_split);
  const auto error = [&](index_t batch, index_t hidden_, index_t heads) {
    return agreed_error_of([&] { Attention<float> a(*ctx, "h.0.attn", batch, 4, hidden_, heads); });
  };
  EXPECT_EQ(error(b0, hidden, 2 * hs), "");
  EXPECT_NE(error(b0, hidden + 1, 2 * hs).find("divisible by heads"), std::string::npos);
  EXPECT_NE(error(0, hidden, 2 * hs).find("must be positive"), std::string::npos);
  if (ss > 1) {
    EXPECT_NE(error(ss + 1, hidden, 2 * hs).find("batch="), std::string::npos);
  }
  if (row_split > ss &&
      4 % row_split != 0) {  // rows split within sequences: 4 tokens do not divide
    EXPECT_NE(error(1, hidden, 2 * hs).find("sequence parallelism"), std::string::npos);
  }
  if (hs > 1) {
    EXPECT_NE(error(b0, 2 * hs * (hs + 1), hs + 1).find("heads="), std::string::npos);
  }
}

// ---------------------------------------------------------------- the model

// A Gpt under one scheme (its context from make_context on the scheme's grid).
template <class T>
struct Model {
  std::unique_ptr<SchemeContext<T>> ctx;
  Gpt<T> gpt;
  Model(const SchemeSpec& spec, const GptConfig& config, index_t batch, index_t seq,
        GptOptions options)
      : ctx(context_of<T>(spec)), gpt(*ctx, config, batch, seq, options) {}
  ProcessGrid& grid() { return ctx->grid(); }
};

// Fresh tokens and targets for a model of `config`.
struct Batch {
  std::uint64_t seed = fresh_seed();
  index_t batch = test_batch(), seq = kSeq;
  std::vector<std::int32_t> tokens, targets;
  explicit Batch(const GptConfig& config) {
    std::mt19937_64 gen(seed);
    tokens = random_ids(batch * seq, config.vocab_size, gen);
    targets = random_ids(batch * seq, config.vocab_size, gen);
  }
};

// Buffers are sized analytically before the first step: after a step the
// high-water marks reach (and never pass) the capacities, the workspace
// excepted (bf16: fp32 statistics next to bf16 activations); the checkpoint
// buffer holds the n_layer + 1 block boundaries exactly (with distributed
// checkpoints: n_layer chunks and x_N whole).
template <class T>
void expect_buffers_sized_exactly(Model<T>& m, index_t tokens) {
  const GptConfig& config = m.gpt.config();
  const MemoryReport r = m.gpt.memory_report();
  for (const BufferUsage& u : r.buffers) {
    EXPECT_LE(u.high_water, u.capacity) << u.name;
    if (u.name != "workspace") {
      EXPECT_EQ(u.high_water, u.capacity) << u.name;
    }
  }
  for (const BufferUsage& u : m.gpt.buffers().usage()) EXPECT_GT(u.high_water, 0u) << u.name;
  const index_t slot = m.ctx->local_rows(tokens, kOuter) * m.ctx->local_cols(config.n_embd, kOuter);
  const auto rounded = [](index_t n) {
    return Arena::rounded(static_cast<std::size_t>(n) * sizeof(T));
  };
  if (m.gpt.distributes_checkpoints()) {  // a 1/g chunk of x_0..x_{N-1}, x_N whole
    const index_t g = m.ctx->checkpoint_group()->size();
    ASSERT_EQ(slot % g, 0);
    EXPECT_EQ(m.gpt.buffers().checkpoint.capacity(),
              static_cast<std::size_t>(config.n_layer) * rounded(slot / g) + rounded(slot));
  } else {
    EXPECT_EQ(m.gpt.buffers().checkpoint.capacity(),
              static_cast<std::size_t>(config.n_layer + 1) * rounded(slot));
  }
  EXPECT_EQ(r.activations,
            m.gpt.buffers().forward.high_water() + m.gpt.buffers().checkpoint.high_water());
  EXPECT_NE(r.to_string().find("conjunction"), std::string::npos);
}

// The reference GPT of a model case after forward and backward on a fresh
// batch (for bf16: the double reference on bf16-rounded weights).
template <class T>
struct GptOracle {
  GptConfig config = test_config(2);
  Batch batch{config};
  reference::Gpt<Ref<T>> ref{config, batch.seed};
  double loss = 0;
  GptOracle() {
    if constexpr (kIsBf16<T>) round_to_bf16(ref.params());
    loss = static_cast<double>(ref.forward(batch.tokens, batch.targets, batch.batch, batch.seq));
    ref.backward();
  }
};

// The whole model against the reference on the same global weights; then its
// memory report.
template <class T>
void gpt_matches_reference(const SchemeSpec& spec, Recompute recompute) {
  const GptOracle<T>& o = case_oracle<GptOracle<T>>();
  const GptConfig& config = o.config;
  const Batch& b = o.batch;
  const reference::Gpt<Ref<T>>& ref = o.ref;
  SCOPED_TRACE(seed_note(b.seed));
  const index_t nt = b.batch * b.seq, h = config.n_embd, V = config.vocab_size;
  const bool checkpoint = recompute == Recompute::full;
  Model<T> m(overlapped(spec), config, b.batch, b.seq, {.recompute = recompute});
  Gpt<T>& model = m.gpt;
  const SchemeContext<T>& ctx = *m.ctx;
  model.init(b.seed);
  const auto params = model.parameters_store().params();
  ASSERT_EQ(params.size(), parameter_list(config).size());
  const auto weights = globals_of(params, false);
  for (std::size_t k = 0; k < params.size(); ++k) {  // the same global weights, exactly
    const auto want = ref.param(params[k]->shard.name);
    EXPECT_TRUE(std::equal(weights[k].begin(), weights[k].end(), want.begin(), want.end(),
                           [](double a, Ref<T> r) { return a == static_cast<double>(r); }))
        << params[k]->shard.name;
  }

  const double loss = model.forward(b.tokens, b.targets);
  const double loss_err = std::abs(loss - o.loss) / std::abs(o.loss);
  if constexpr (kIsBf16<T>) note_bf16("loss", loss_err);
  EXPECT_LE(loss_err, kIsBf16<T> ? kBf16Loss : model_tolerance<T>()) << loss << " vs " << o.loss;
  EXPECT_TRUE(same_value_on_all_ranks(loss)) << loss;
  // x_i whole: with distributed checkpoints gathered from the ranks' chunks
  // (Gpt::gather_boundary), which boundary() refuses to hand out
  std::vector<T> gathered(
      static_cast<std::size_t>(ctx.local_rows(nt, kOuter) * ctx.local_cols(h, kOuter)));
  const auto whole_boundary = [&](int i) -> ConstMatrixView<T> {
    if (!model.distributes_checkpoints()) return model.boundary(i);
    if (i < config.n_layer) {
      EXPECT_THROW(static_cast<void>(model.boundary(i)), Error);
    }
    const auto out = MatrixView<T>::dense(gathered.data(), ctx.local_rows(nt, kOuter),
                                          ctx.local_cols(h, kOuter), Order::row_major);
    model.gather_boundary(i, out);
    return out;
  };
  expect_view_close<T>(ctx, whole_boundary(0), ref.activation("embeddings"), nt,
                       {"embeddings", h, kOuter}, kBf16Act);
  for (int i = 0; i < config.n_layer; ++i) {
    const std::string block = "h." + std::to_string(i);
    expect_view_close<T>(ctx, whole_boundary(i + 1), ref.activation(block + ".output"), nt,
                         {block + ".output", h, kOuter}, kBf16Act);
    if (!checkpoint) {  // checkpointing releases a block's saved activations
      expect_view_close<T>(ctx, model.block(i).attn().qkv(), ref.activation(block + ".attn.c_attn"),
                           nt, {block + ".attn.c_attn", 3 * h, kInner, 3}, kBf16Act);
      expect_view_close<T>(ctx, model.block(i).attn().context(),
                           ref.activation(block + ".attn.context"), nt,
                           {block + ".attn.context", h, kInner}, kBf16Act);
    }
  }
  expect_view_close<T>(ctx, model.final_norm(), ref.activation("ln_f"), nt, {"ln_f", h, kOuter},
                       kBf16Act);
  expect_view_close<T>(ctx, model.logits(), ref.activation("logits"), nt, {"logits", V, kInner},
                       kBf16Act);

  model.backward();
  expect_view_close<T>(ctx, model.input_grad(), ref.activation_grad("embeddings"), nt,
                       {"input grad", h, kOuter}, bf16_input_grad_tolerance(config.n_layer));
  for (Param<T>* p : params)
    expect_global_close<T>(gather_global(*p, m.grid(), true), ref.grad(p->shard.name),
                           p->shard.name, bf16_grad_tolerance(config.n_layer));
  EXPECT_EQ(replicas_differ(params, true), "") << "gradients";
  expect_buffers_sized_exactly(m, nt);
  if (recompute == Recompute::selective) {
    // Selective recompute keeps everything none keeps but each block's
    // probabilities: local sequences x local heads x seq^2 (plans of both).
    const auto capacity = [](const MemoryReport& r, const std::string& name) {
      for (const BufferUsage& u : r.buffers)
        if (u.name == name) return u.capacity;
      ADD_FAILURE() << "no buffer " << name;
      return std::size_t{0};
    };
    const auto forward_capacity = [&](Recompute r) {
      auto ctx_plan = context_of<T>(spec);
      const Gpt<T> plan(*ctx_plan, config, b.batch, b.seq, {.recompute = r, .plan_only = true});
      return capacity(plan.memory_report(), "forward");
    };
    const index_t probs = b.batch / m.grid().shape().data / ctx.sequence_split() *
                          (config.n_head / ctx.head_split()) * b.seq * b.seq;
    EXPECT_EQ(forward_capacity(Recompute::none) - forward_capacity(Recompute::selective),
              config.n_layer * Arena::rounded(static_cast<std::size_t>(probs) * sizeof(T)));
    EXPECT_EQ(forward_capacity(Recompute::selective), capacity(model.memory_report(), "forward"));
  }
}

TEST_P(SchemeGpt, MatchesReferenceDoubleCheckpointed) {
  gpt_matches_reference<double>(GetParam(), Recompute::full);
}
TEST_P(SchemeGpt, MatchesReferenceDoubleNoCheckpoint) {
  gpt_matches_reference<double>(GetParam(), Recompute::none);
}
TEST_P(SchemeGpt, MatchesReferenceDoubleSelectiveRecompute) {
  gpt_matches_reference<double>(GetParam(), Recompute::selective);
}
TEST_P(SchemeGpt, MatchesReferenceFloatCheckpointed) {
  gpt_matches_reference<float>(GetParam(), Recompute::full);
}
TEST_P(SchemeGpt, MatchesReferenceFloatNoCheckpoint) {
  gpt_matches_reference<float>(GetParam(), Recompute::none);
}
TEST_P(SchemeGpt, MatchesReferenceBf16Checkpointed) {
  gpt_matches_reference<bf16>(GetParam(), Recompute::full);
}
TEST_P(SchemeGpt, MatchesReferenceBf16SelectiveRecompute) {
  gpt_matches_reference<bf16>(GetParam(), Recompute::selective);
}

// 1D with distributed checkpoints (Megatron's --distribute-saved-activations,
// "1d:p=P,dc=on" over every rank; the data axis: test_traffic's bytes): the loss, every boundary
// (gathered from the chunks), the logits and every gradient against the
// serial reference; the checkpoint buffer n_layer chunks of 1/p and x_N
// whole (expect_buffers_sized_exactly); recompute none or selective refused
// with one error naming dc=on.
template <class T>
void distributed_checkpoints_match_reference() {
  const int n = world_size();
  if (n < 2) GTEST_SKIP() << "distributed checkpoints need p > 1";
  if (test_config(2).n_embd % n != 0) GTEST_SKIP() << "1d:p=" << n << " does not split the model";
  {
    const SchemeSpec spec = SchemeSpec::parse("1d:p=" + std::to_string(n) + ",dc=on");
    SCOPED_TRACE(spec.str());
    {  // the option reaches the model (else the checks below test plain 1D)
      Model<T> m(spec, test_config(2), test_batch(), kSeq, {.recompute = Recompute::full});
      ASSERT_TRUE(m.gpt.distributes_checkpoints());
      ASSERT_EQ(m.ctx->checkpoint_group()->size(), n);
    }
    gpt_matches_reference<T>(spec, Recompute::full);
    for (const Recompute r : {Recompute::none, Recompute::selective}) {
      try {
        Model<T> m(spec, test_config(2), test_batch(), kSeq, {.recompute = r});
        ADD_FAILURE() << "recompute " << to_string(r) << " accepted with dc=on";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("dc=on"), std::string::npos) << e.what();
      }
    }
  }
}
TEST(SchemeGptDistributedCheckpoints, MatchesReferenceDouble) {
  distributed_checkpoints_match_reference<double>();
}
TEST(SchemeGptDistributedCheckpoints, MatchesReferenceBf16) {
  distributed_checkpoints_match_reference<bf16>();
}

// Two steps of a checkpointed model, the second accumulating. Replicated
// activations (the block boundaries, LN_f, the logits, the input gradient)
// and parameters (values and gradients) are bit-identical to their owners'
// on every rank. In float and double also: checkpointing (and the scheme's
// overlap options, see the file comment) changes memory, not results (the
// first step against a model without either), and the accumulating step
// doubles the gradients.
template <class T>
void replicas_identical(const SchemeSpec& spec) {
  const GptConfig config = test_config(2);
  const Batch b(config);
  SCOPED_TRACE(seed_note(b.seed));
  const index_t nt = b.batch * b.seq, h = config.n_embd;
  Model<T> m(overlapped(spec), config, b.batch, b.seq, {.recompute = Recompute::full});
  const SchemeContext<T>& ctx = *m.ctx;
  const auto params = m.gpt.parameters_store().params();
  m.gpt.init(b.seed);
  const double loss = m.gpt.forward(b.tokens, b.targets);
  for (int i = 0; i <= config.n_layer; ++i)
    EXPECT_TRUE(activation_replicas_match(ctx, m.gpt.boundary(i), nt, h, kOuter))
        << "boundary " << i;
  EXPECT_TRUE(activation_replicas_match(ctx, m.gpt.final_norm(), nt, h, kOuter));
  EXPECT_TRUE(activation_replicas_match(ctx, m.gpt.logits(), nt, config.vocab_size, kInner));
  m.gpt.backward();
  if constexpr (!kIsBf16<T>) {
    const double agree = std::is_same_v<T, float> ? 1e-5 : 1e-12;
    const auto grads = globals_of(params, true);
    const auto input_grad = download_view<T>(m.gpt.input_grad());
    Model<T> without(plain(spec), config, b.batch, b.seq, {.recompute = Recompute::none});
    without.gpt.init(b.seed);
    const double loss_without = without.gpt.forward(b.tokens, b.targets);
    without.gpt.backward();
    EXPECT_NEAR(loss, loss_without, agree * std::abs(loss_without));
    const auto grads_without = globals_of(without.gpt.parameters_store().params(), true);
    for (std::size_t k = 0; k < params.size(); ++k)
      EXPECT_LE(rel_error(grads[k], grads_without[k]), agree) << params[k]->shard.name;
    EXPECT_LE(max_over_ranks(rel_error(input_grad, download_view<T>(without.gpt.input_grad()))),
              agree);
    // checkpointing keeps less in the forward buffer
    EXPECT_LT(m.gpt.buffers().forward.capacity(), without.gpt.buffers().forward.capacity());

    m.gpt.forward(b.tokens, b.targets);
    m.gpt.backward(/*accumulate=*/true);
    const double twice_tol = std::is_same_v<T, float> ? 1e-6 : 1e-12;
    const auto accumulated = globals_of(params, true);
    for (std::size_t k = 0; k < params.size(); ++k) {
      auto twice = grads[k];
      for (double& v : twice) v *= 2;
      EXPECT_LE(rel_error(accumulated[k], twice), twice_tol) << params[k]->shard.name;
    }
  } else {
    m.gpt.forward(b.tokens, b.targets);
    m.gpt.backward(/*accumulate=*/true);
  }
  EXPECT_TRUE(activation_replicas_match(ctx, m.gpt.input_grad(), nt, h, kOuter));
  EXPECT_EQ(replicas_differ(params, false), "") << "values";
  EXPECT_EQ(replicas_differ(params, true), "") << "gradients";
}
TEST_P(SchemeGpt, ReplicasIdenticalAndCheckpointingAgreesDouble) {
  replicas_identical<double>(GetParam());
}
TEST_P(SchemeGpt, ReplicasIdenticalAndCheckpointingAgreesFloat) {
  replicas_identical<float>(GetParam());
}
TEST_P(SchemeGpt, ReplicasIdenticalBf16) {
  replicas_identical<bf16>(GetParam());
}

// After one warm-up step, a training step (forward + backward, checkpointing
// on, every overlap on) makes no heap allocation outside MPI's internals.
template <class T>
void training_step_allocates_nothing(const SchemeSpec& spec) {
  if (!allocation_counting_available()) GTEST_SKIP() << "allocation counting unavailable (ASan)";
  if (test_backend().asynchronous())
    GTEST_SKIP() << "the CUDA runtime allocates host memory internally (pinned staging, "
                    "launch bookkeeping): allocation counting runs on the CPU backend";
  const GptConfig config = test_config(2);
  const Batch b(config);
  Model<T> m(overlapped(spec), config, b.batch, b.seq, {.recompute = Recompute::full});
  m.gpt.init(1);
  m.gpt.forward(b.tokens, b.targets);
  m.gpt.backward();
  std::uint64_t count = 0, mpi = 0;
  std::string caller;
  {
    CountAllocations counter;
    m.gpt.forward(b.tokens, b.targets);
    m.gpt.backward();
    count = counter.count();
    mpi = counter.mpi_count();
    caller = counter.first_caller();
  }
  EXPECT_EQ(count, 0u) << "first allocation from " << caller;
  ::testing::Test::RecordProperty("mpi_internal_allocations", static_cast<int>(mpi));
}
TEST_P(SchemeGpt, TrainingStepAllocatesNothingFloat) {
  training_step_allocates_nothing<float>(GetParam());
}
TEST_P(SchemeGpt, TrainingStepAllocatesNothingBf16) {
  training_step_allocates_nothing<bf16>(GetParam());
}

// What every scheme checks of a configuration (the scheme's own divisibility
// messages are tested in its file): the same summa::Error on every rank.
TEST_P(SchemeGpt, InvalidConfigurationsThrowEverywhere) {
  const SchemeSpec& spec = GetParam();
  const GptConfig good = test_config(2);
  const index_t batch = test_batch();
  const auto ctx = context_of<float>(spec);
  const auto expect_error = [&](const GptConfig& c, index_t batch_, index_t seq,
                                const std::string& needle) {
    const std::string msg = agreed_error_of([&] { Gpt<float> model(*ctx, c, batch_, seq); });
    EXPECT_NE(msg.find(needle), std::string::npos) << "'" << msg << "' lacks '" << needle << "'";
  };
  EXPECT_EQ(agreed_error_of([&] { Gpt<float> model(*ctx, good, batch, kSeq); }), "");
  {
    auto c = good;
    c.n_embd = good.n_embd + 1;
    expect_error(c, batch, kSeq, "divisible by n_head");
  }
  expect_error(good, batch, good.n_positions + 1, "longer than the position table");
  expect_error(good, 0, kSeq, "must be positive");
  // the attention splits of the scheme: whole sequences and whole heads per rank
  if (ctx->sequence_split() > 1) expect_error(good, batch + 1, kSeq, "batch=");
  if (ctx->head_split() > 1) {
    auto c = good;
    c.n_head = ctx->head_split() + 1;
    c.n_embd = c.n_head * 4 * world_size();  // divisible by n_head and every scheme's splits
    expect_error(c, batch, kSeq, "n_head");
  }
}

TEST_P(SchemeGpt, BadIdsThrowEverywhere) {
  const GptConfig config = test_config(2);
  const index_t batch = test_batch();
  Model<float> m(overlapped(GetParam()), config, batch, kSeq, {});
  m.gpt.init(5);
  std::vector<std::int32_t> ok(static_cast<std::size_t>(batch * kSeq), 1);
  for (auto [where, value, needle] :
       {std::tuple{0, config.vocab_size, "token id"}, std::tuple{1, -1, "target id"}}) {
    auto tokens = ok, targets = ok;
    (where == 0 ? tokens : targets)[2] = value;
    const std::string msg = agreed_error_of([&] { m.gpt.forward(tokens, targets); });
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }
  const std::string msg =
      agreed_error_of([&] { m.gpt.forward(std::vector<std::int32_t>(ok.size() + 1, 0), ok); });
  EXPECT_NE(msg.find("expected batch*seq"), std::string::npos) << msg;
  EXPECT_THROW(m.gpt.backward(), Error);  // failed forwards leave nothing to differentiate
}

INSTANTIATE_TEST_SUITE_P(Every, SchemeLayers, testing::ValuesIn(tensor_schemes()), scheme_name);
INSTANTIATE_TEST_SUITE_P(Every, SchemeGpt, testing::ValuesIn(tensor_schemes()), scheme_name);

}  // namespace
}  // namespace summa::test

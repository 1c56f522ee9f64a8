// The 3D (AxoNN) parallel-matrix-multiply scheme against serial oracles, on
// every Gx x Gy x Gz factorisation of the rank count (CTest: 1, 4 and 8
// ranks; at 4: 1x1x4, 1x2x2, 1x4x1, 2x1x2, 2x2x1, 4x1x1; at 8 the ten
// factorisations of 8, 2x2x2 and 1x2x4 among them), each grid built once
// with ProcessGrid::grid3d(MPI_COMM_WORLD, gx, gy, gz).
//
// Layers3D: Linear3D in both orientations (plain and with the q|k|v groups
// of c_attn) against a serial Eigen product on random data: output, input
// gradient, weight and bias gradients (gathered), accumulation, OAR on vs
// off; the shard descriptions of a block and the embedding cover every
// global element once with the reference's initial values.
//
// Gpt3D: the whole model against summa::reference::Gpt on fresh random
// weights and tokens: loss, every block boundary, the final norm, the local
// logits, the input gradient and every parameter gradient, in float and
// double, with activation checkpointing on and off; replicas (biases,
// LayerNorms, wpe) bit-identical to their owners in value and gradient;
// OAR on vs off; no heap allocation in a step; buffers sized exactly;
// configuration and id errors thrown the same on every rank.
//
// bf16 (mixed precision): Gpt<bf16> (3D) against the serial double reference
// (loss, logits, input gradient, every parameter gradient, replicas, with
// and without checkpointing), one TransformerBlock<bf16> (3D) against
// TransformerBlock<double> (3D), and no heap allocation in a bf16 step.
//
// Tolerances: test_util.hpp model_tolerance (1e-9 double, 2e-3 float); bf16
// norm-wise bounds in units of u = 2^-8, derived and measured in the bf16
// section below.
//
// Backend: test_backend() (SUMMA_TEST_BACKEND=cpu|cuda) with its
// communicators (test_grid_options(), small staging buffers). Inputs and
// weights are built on the host and uploaded, results downloaded; on CUDA
// float runs in fp32 (no TF32), double in fp64 and bf16 with fp32
// accumulation (cuBLAS ...Ex), so the tolerances hold.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "test_util.hpp"

namespace summa::test {
namespace {

// ---------------------------------------------------------------- environment

int world_size() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

// test_grid_options() with small staging buffers (mpi_staged pins one per
// axis of every grid, and there is a grid per factorisation of the ranks;
// the largest collective here is a few KB).
GridOptions grid_options() {
  GridOptions o = test_grid_options();
  o.staging_bytes = std::size_t{1} << 20;
  return o;
}

struct GridEnv {
  Backend& backend = test_backend();  // first: selects the rank's device
  std::vector<ProcessGrid> grids;
  GridEnv() {
    const int p = world_size();
    for (int x = 1; x <= p; ++x)
      for (int y = 1; x * y <= p; ++y)
        if (p % (x * y) == 0)
          grids.push_back(
              ProcessGrid::grid3d(MPI_COMM_WORLD, x, y, p / (x * y), 1, grid_options()));
  }
};
GridEnv& env() {
  static GridEnv e;
  return e;
}

std::string describe(const ProcessGrid& g) {
  return std::to_string(g.shape().rows) + "x" + std::to_string(g.shape().cols) + "x" +
         std::to_string(g.shape().depth);
}

reference::GptConfig test_config(int n_layer = 2) {
  reference::GptConfig c;
  c.n_layer = n_layer;
  c.n_head = 8;
  c.n_embd = 32;
  c.n_positions = 8;
  c.vocab_size = 48;
  return c;
}
constexpr index_t kBatch = 8, kSeq = 4;

std::vector<std::int32_t> random_ids(index_t n, int vocab, std::mt19937_64& gen) {
  std::uniform_int_distribution<int> dist(0, vocab - 1);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(n));
  for (auto& id : ids) id = dist(gen);
  return ids;
}

// How an activation [T, cols] is laid out: token rows split over Z, columns
// over X, over Y, or whole (`groups` equal column groups, each split, side
// by side locally).
enum class Axis { none, x, y };
struct Dist {
  index_t cols;
  Axis axis = Axis::y;
  int groups = 1;
};

template <class T>
std::vector<T> local_of(const ProcessGrid& g, std::span<const T> global, index_t rows, Dist d) {
  const int gz = g.shape().depth, z = g.coords().depth;
  const int split = d.axis == Axis::x ? g.shape().rows : d.axis == Axis::y ? g.shape().cols : 1;
  const int block = d.axis == Axis::x ? g.coords().row : d.axis == Axis::y ? g.coords().col : 0;
  const index_t lr = rows / gz, gw = d.cols / d.groups, w = gw / split;
  std::vector<T> out;
  for (index_t r = z * lr; r < (z + 1) * lr; ++r)
    for (int gr = 0; gr < d.groups; ++gr)
      for (index_t c = gr * gw + block * w; c < gr * gw + (block + 1) * w; ++c)
        out.push_back(global[static_cast<std::size_t>(r * d.cols + c)]);
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

// A parameter's local value or gradient, on the host.
template <class T>
std::vector<T> local_values(const Param<T>& p, bool grad) {
  std::vector<T> host(static_cast<std::size_t>(p.shard.local_size()));
  if (!host.empty())
    env().backend.download(host.data(), grad ? p.grad : p.value, host.size() * sizeof(T));
  return host;
}

struct Arenas {
  Arena workspace, forward, backward;
  StepBuffers step{workspace, forward, backward};
  Arenas(Backend& b, const BufferNeeds& n)
      : workspace("workspace", b, n.workspace),
        forward("forward", b, n.forward),
        backward("backward", b, n.backward) {}
};

// Sets a parameter's local storage (owner or replica) from its global tensor.
template <class T>
void set_global(Param<T>& p, const std::vector<T>& global) {
  const index_t cols = p.shard.global_cols();
  std::vector<T> local = local_values(p, false);
  for (const ShardPiece& piece : p.shard.pieces)
    for (index_t r = 0; r < piece.rows; ++r)
      for (index_t c = 0; c < piece.cols; ++c)
        local[static_cast<std::size_t>((piece.local_row + r) * p.shard.local_cols +
                                       piece.local_col + c)] =
            global[static_cast<std::size_t>((piece.global_row + r) * cols + piece.global_col + c)];
  if (!local.empty()) env().backend.upload(p.value, local.data(), local.size() * sizeof(T));
}

// True when every rank's local value (or gradient) equals, bit for bit, the
// global tensor gathered from the owners at every element it holds. Collective.
template <class T>
bool replicas_match(const Param<T>& p, ProcessGrid& g, bool grad) {
  const std::vector<T> global = gather_global(p, g, grad);
  const std::vector<T> host = local_values(p, grad);
  const T* local = host.data();
  const index_t cols = p.shard.global_cols();
  int same = 1;
  for (const ShardPiece& piece : p.shard.pieces)
    for (index_t r = 0; r < piece.rows; ++r)
      for (index_t c = 0; c < piece.cols; ++c) {
        const T a = local[(piece.local_row + r) * p.shard.local_cols + piece.local_col + c];
        const T b =
            global[static_cast<std::size_t>((piece.global_row + r) * cols + piece.global_col + c)];
        if (std::memcmp(&a, &b, sizeof(T)) != 0) same = 0;
      }
  MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return same == 1;
}

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

template <class T>
std::vector<T> flat(const Mat<T>& m) {  // row-major
  std::vector<T> v;
  for (index_t r = 0; r < m.rows(); ++r)
    for (index_t c = 0; c < m.cols(); ++c) v.push_back(m(r, c));
  return v;
}

// ---------------------------------------------------------------- Linear3D alone

template <class T>
void linear_vs_eigen(Orientation3D orientation, int groups) {
  const index_t tokens = 16, in = 16, out = 24;
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  const Mat<T> X = random_matrix<T>(tokens, in, gen), W = random_matrix<T>(in, out, gen);
  const Mat<T> b = random_matrix<T>(1, out, gen), dY = random_matrix<T>(tokens, out, gen);
  Mat<T> Y = X * W;
  Y.rowwise() += b.row(0);
  const Mat<T> dX = dY * W.transpose(), dW = X.transpose() * dY;
  const Mat<T> db = dY.colwise().sum();
  const bool normal = orientation == Orientation3D::normal;
  const Dist din{in, normal ? Axis::y : Axis::x}, dout{out, normal ? Axis::x : Axis::y, groups};
  const std::vector<T> gX = flat(X), gY = flat(Y), gdX = flat(dX), gdY = flat(dY);
  for (ProcessGrid& g : env().grids) {
    SCOPED_TRACE(describe(g));
    std::vector<std::vector<T>> results[2];  // OAR on, off
    for (bool oar : {true, false}) {
      Linear3D<T> layer(g, env().backend, "lin", tokens, in, out, orientation, true, groups,
                        {.overlap_all_reduce = oar});
      ParameterStore<T> store(env().backend, layer.parameters());
      set_global(layer.weight(), flat(W));
      set_global(layer.bias(), flat(b));
      Arenas arenas(env().backend, layer.buffer_needs());
      const index_t m = layer.local_tokens();
      Local<T> x(m, layer.local_in(), local_of<T>(g, gX, tokens, din));
      Local<T> y(m, layer.local_out()), dx(m, layer.local_in());
      Local<T> dy(m, layer.local_out(), local_of<T>(g, gdY, tokens, dout));
      layer.forward(x.view(), y.view(), arenas.step);
      EXPECT_LE(max_over_ranks(rel_error(y.data(), local_of<T>(g, gY, tokens, dout))),
                model_tolerance<T>());
      layer.backward(dy.view(), dx.view(), arenas.step);
      EXPECT_LE(max_over_ranks(rel_error(dx.data(), local_of<T>(g, gdX, tokens, din))),
                model_tolerance<T>());
      const auto gw = gather_global(layer.weight(), g, true);
      const auto gb = gather_global(layer.bias(), g, true);
      EXPECT_LE(rel_error(gw, flat(dW)), model_tolerance<T>());
      EXPECT_LE(rel_error(gb, flat(db)), model_tolerance<T>());
      EXPECT_TRUE(replicas_match(layer.bias(), g, true));
      results[oar ? 0 : 1] = {y.data(), dx.data(), gw, gb};
      // a second backward with accumulate doubles the parameter gradients
      layer.backward(dy.view(), dx.view(), arenas.step, true);
      auto twice = gw;
      for (T& v : twice) v *= T(2);
      EXPECT_LE(rel_error(gather_global(layer.weight(), g, true), twice), 1e-6);
    }
    for (std::size_t k = 0; k < 4; ++k)
      EXPECT_LE(max_over_ranks(rel_error(results[0][k], results[1][k])), 1e-12) << k;
  }
}

TEST(Layers3D, LinearNormalDouble) {
  linear_vs_eigen<double>(Orientation3D::normal, 1);
}
TEST(Layers3D, LinearTransposedDouble) {
  linear_vs_eigen<double>(Orientation3D::transposed, 1);
}
TEST(Layers3D, LinearNormalGroupsFloat) {
  linear_vs_eigen<float>(Orientation3D::normal, 3);
}
TEST(Layers3D, LinearTransposedFloat) {
  linear_vs_eigen<float>(Orientation3D::transposed, 1);
}

// Shards keep Hugging Face names and shapes and cover every element once
// with the reference's initial values; replicas hold the same values.
TEST(Layers3D, ShardsCoverEachElementOnce) {
  const reference::GptConfig config = test_config(1);
  const std::vector<reference::ParamInfo> infos = reference::parameter_list(config);
  for (ProcessGrid& g : env().grids) {
    SCOPED_TRACE(describe(g));
    Axonn3DContext<double> model_scheme(g, env().backend);
    Gpt<double> model(model_scheme, config, kBatch, kSeq);
    model.init(11);
    const auto params = model.parameters_store().params();
    EXPECT_EQ(params.size(), infos.size());
    for (Param<double>* p : params) {
      const auto info = std::find_if(infos.begin(), infos.end(),
                                     [&](const auto& i) { return i.name == p->shard.name; });
      ASSERT_NE(info, infos.end()) << p->shard.name;
      EXPECT_EQ(p->shard.global_shape, info->shape) << p->shard.name;
      const auto global = gather_global(*p, g);  // throws unless covered exactly once
      for (index_t k = 0; k < p->shard.global_size(); ++k)
        ASSERT_EQ(global[static_cast<std::size_t>(k)],
                  reference::init_value(11, p->shard.name, k, config))
            << p->shard.name << " element " << k;
      EXPECT_TRUE(replicas_match(*p, g, false)) << p->shard.name;
    }
  }
}

TEST(Layers3D, ConfigErrors) {
  for (ProcessGrid& g : env().grids) {
    SCOPED_TRACE(describe(g));
    const int gx = g.shape().rows, gy = g.shape().cols, gz = g.shape().depth;
    const auto linear = [&](index_t tokens, index_t in, index_t out, Orientation3D o) {
      return error_of([&] { Linear3D<float> l(g, env().backend, "c", tokens, in, out, o); });
    };
    const index_t ok = 2 * gx * gy * gz;
    EXPECT_EQ(linear(ok, ok, ok, Orientation3D::normal), "");
    EXPECT_NE(linear(0, ok, ok, Orientation3D::normal).find("must be positive"), std::string::npos);
    if (gz > 1) {
      EXPECT_NE(linear(gz + 1, ok, ok, Orientation3D::normal).find("tokens="), std::string::npos);
    }
    if (gy * gz > 1) {
      EXPECT_NE(linear(ok, gy * gz + 1, ok, Orientation3D::normal).find("in="), std::string::npos);
    }
    if (gx > 1) {
      EXPECT_NE(linear(ok, ok, gx + 1, Orientation3D::normal).find("out="), std::string::npos);
    }
    if (gy > 1) {
      EXPECT_NE(linear(ok, ok, gy + 1, Orientation3D::transposed).find("out="), std::string::npos);
    }
  }
}

// ---------------------------------------------------------------- the model

template <class T>
double view_error(const ProcessGrid& g, ConstMatrixView<T> local, std::span<const T> global,
                  Dist d) {
  return max_over_ranks(
      rel_error(download_view<T>(local), local_of<T>(g, global, kBatch * kSeq, d)));
}

template <class T>
void check_against_reference(bool checkpoint) {
  const reference::GptConfig config = test_config();
  const index_t tokens_n = kBatch * kSeq, h = config.n_embd, V = config.vocab_size;
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  const auto tokens = random_ids(tokens_n, config.vocab_size, gen);
  const auto targets = random_ids(tokens_n, config.vocab_size, gen);
  reference::Gpt<T> ref(config, seed);
  const double ref_loss = ref.forward(tokens, targets, kBatch, kSeq);
  ref.backward();
  const double tol = model_tolerance<T>();
  for (ProcessGrid& g : env().grids) {
    SCOPED_TRACE(describe(g));
    Axonn3DContext<T> model_scheme(g, env().backend);
    Gpt<T> model(model_scheme, config, kBatch, kSeq, {.checkpoint = checkpoint});
    model.init(seed);
    for (Param<T>* p : model.parameters_store().params()) {
      const auto global = gather_global(*p, g);
      const auto want = ref.param(p->shard.name);
      ASSERT_EQ(global.size(), want.size()) << p->shard.name;
      EXPECT_TRUE(std::equal(global.begin(), global.end(), want.begin())) << p->shard.name;
    }
    const double loss = model.forward(tokens, targets);
    EXPECT_NEAR(loss, ref_loss, tol * std::abs(ref_loss));
    double all[2] = {loss, -loss};  // the same on every rank
    MPI_Allreduce(MPI_IN_PLACE, all, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    EXPECT_EQ(all[0], -all[1]);
    EXPECT_LE(view_error<T>(g, model.boundary(0), ref.activation("embeddings"), {h}), tol);
    for (int i = 0; i < config.n_layer; ++i)
      EXPECT_LE(view_error<T>(g, model.boundary(i + 1),
                              ref.activation("h." + std::to_string(i) + ".output"), {h}),
                tol)
          << "block " << i;
    EXPECT_LE(view_error<T>(g, model.final_norm(), ref.activation("ln_f"), {h}), tol);
    EXPECT_LE(view_error<T>(g, model.logits(), ref.activation("logits"), {V, Axis::x}), tol);
    if (!checkpoint) {  // block 0's saved activations are released with checkpointing
      EXPECT_LE(view_error<T>(g, ConstMatrixView<T>(model.block(0).attn().qkv()),
                              ref.activation("h.0.attn.c_attn"), {3 * h, Axis::x, 3}),
                tol);
    }
    model.backward();
    EXPECT_LE(view_error<T>(g, model.input_grad(), ref.activation_grad("embeddings"), {h}), tol);
    for (Param<T>* p : model.parameters_store().params())
      EXPECT_LE(max_over_ranks(rel_error(gather_global(*p, g, true), ref.grad(p->shard.name))), tol)
          << p->shard.name;
  }
}

TEST(Gpt3D, MatchesReferenceDoubleCheckpointed) {
  check_against_reference<double>(true);
}
TEST(Gpt3D, MatchesReferenceDoubleNoCheckpoint) {
  check_against_reference<double>(false);
}
TEST(Gpt3D, MatchesReferenceFloatCheckpointed) {
  check_against_reference<float>(true);
}
TEST(Gpt3D, MatchesReferenceFloatNoCheckpoint) {
  check_against_reference<float>(false);
}

// Replicas stay bit-identical to their owners (values and gradients, after
// an accumulating second step); `accumulate` doubles the gradients; OAR on
// and off agree.
template <class T>
void replicas_and_switches() {
  const reference::GptConfig config = test_config();
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  const auto tokens = random_ids(kBatch * kSeq, config.vocab_size, gen);
  const auto targets = random_ids(kBatch * kSeq, config.vocab_size, gen);
  for (ProcessGrid& g : env().grids) {
    SCOPED_TRACE(describe(g));
    Axonn3DContext<T> a_scheme(g, env().backend, {.overlap_all_reduce = true});
    Axonn3DContext<T> b_scheme(g, env().backend, {.overlap_all_reduce = false});
    Gpt<T> a(a_scheme, config, kBatch, kSeq, {.checkpoint = true});
    Gpt<T> b(b_scheme, config, kBatch, kSeq, {.checkpoint = false});
    a.init(seed);
    b.init(seed);
    const double la = a.forward(tokens, targets), lb = b.forward(tokens, targets);
    EXPECT_NEAR(la, lb, 1e-12 * std::abs(lb));
    a.backward();
    b.backward();
    const auto pa = a.parameters_store().params(), pb = b.parameters_store().params();
    std::vector<std::vector<T>> first;
    for (std::size_t k = 0; k < pa.size(); ++k) {
      first.push_back(gather_global(*pa[k], g, true));
      EXPECT_LE(rel_error(first.back(), gather_global(*pb[k], g, true)),
                (std::is_same_v<T, float> ? 1e-5 : 1e-12))
          << pa[k]->shard.name;
    }
    a.forward(tokens, targets);
    a.backward(/*accumulate=*/true);
    for (std::size_t k = 0; k < pa.size(); ++k) {
      auto twice = first[k];
      for (T& v : twice) v *= T(2);
      EXPECT_LE(rel_error(gather_global(*pa[k], g, true), twice), 1e-6) << pa[k]->shard.name;
      EXPECT_TRUE(replicas_match(*pa[k], g, false)) << pa[k]->shard.name;
      EXPECT_TRUE(replicas_match(*pa[k], g, true)) << pa[k]->shard.name;
    }
  }
}
TEST(Gpt3D, ReplicasIdenticalAndSwitchesAgreeDouble) {
  replicas_and_switches<double>();
}
TEST(Gpt3D, ReplicasIdenticalAndSwitchesAgreeFloat) {
  replicas_and_switches<float>();
}

// The overlap switches (OAR, ORS, OAG: every combination, with and without
// checkpointing) change when collectives complete, never what is computed
// or sent: two steps (the second accumulating, so OAG replays a recorded
// order and ORS takes its accumulate path) give the same loss and gradients
// as everything off, and the same bytes on every axis. OAG's gathers are
// bit-identical; sums from non-blocking and blocking MPI collectives may
// associate differently for Gz > 2, hence 1e-12 (double) on gradients.
TEST(Gpt3D, OverlapSwitchesAgree) {
  const reference::GptConfig config = test_config();
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  const auto tokens = random_ids(kBatch * kSeq, config.vocab_size, gen);
  const auto targets = random_ids(kBatch * kSeq, config.vocab_size, gen);
  const std::uint64_t L = static_cast<std::uint64_t>(config.n_layer);
  for (ProcessGrid& g : env().grids) {
    SCOPED_TRACE(describe(g));
    const bool Z = g.shape().depth > 1;
    for (bool checkpoint : {false, true}) {
      SCOPED_TRACE(checkpoint ? "checkpointed" : "no checkpointing");
      std::vector<std::vector<double>> want;
      double want_loss[2] = {0, 0};
      TrafficCounters want_traffic{};
      for (int bits = 0; bits < 8; ++bits) {
        const Axonn3DOptions o{.overlap_all_reduce = (bits & 1) != 0,
                               .overlap_reduce_scatter = (bits & 2) != 0,
                               .overlap_all_gather = (bits & 4) != 0};
        SCOPED_TRACE(fmt::format("OAR {} ORS {} OAG {}", o.overlap_all_reduce,
                                 o.overlap_reduce_scatter, o.overlap_all_gather));
        Axonn3DContext<double> scheme(g, env().backend, o);
        Gpt<double> model(scheme, config, kBatch, kSeq, {.checkpoint = checkpoint});
        model.init(seed);
        g.reset_traffic();
        double loss[2];
        loss[0] = model.forward(tokens, targets);
        model.backward();
        loss[1] = model.forward(tokens, targets);
        model.backward(/*accumulate=*/true);
        const TrafficCounters traffic = g.traffic();
        std::vector<std::vector<double>> grads;
        for (Param<double>* p : model.parameters_store().params())
          grads.push_back(gather_global(*p, g, true));
        const Overlap3D<double>& ov = scheme.overlap();
        // ORS defers every linear's reduce-scatter (4 per block, 2 steps).
        EXPECT_EQ(ov.deferred_count(), o.overlap_reduce_scatter && Z ? 2 * 4 * L : 0);
        if (o.overlap_all_gather && Z) {
          // Step 1 records the order (all on demand); step 2 prefetches all
          // but its first gather.
          const std::uint64_t per_step = (checkpoint ? 3 : 2) * 4 * L;
          EXPECT_EQ(ov.prefetch_misses(), static_cast<std::int64_t>(per_step + 1));
          EXPECT_EQ(ov.prefetch_hits(), static_cast<std::int64_t>(per_step - 1));
        } else {
          EXPECT_EQ(ov.prefetch_hits() + ov.prefetch_misses(), 0);
        }
        if (bits == 0) {
          want = grads;
          want_loss[0] = loss[0];
          want_loss[1] = loss[1];
          want_traffic = traffic;
          continue;
        }
        EXPECT_EQ(loss[0], want_loss[0]);
        EXPECT_EQ(loss[1], want_loss[1]);
        for (std::size_t k = 0; k < grads.size(); ++k)
          EXPECT_LE(rel_error(grads[k], want[k]), 1e-12)
              << model.parameters_store().params()[k]->shard.name;
        for (CommAxis a : {CommAxis::depth, CommAxis::mesh_row, CommAxis::mesh_col}) {
          EXPECT_EQ(traffic[a].bytes_sent, want_traffic[a].bytes_sent);
          EXPECT_EQ(traffic[a].calls, want_traffic[a].calls);
        }
      }
    }
  }
}

// ORS with a data axis: the buckets are all-reduced after the deferred
// reduce-scatters complete, and the gradients equal those without ORS.
TEST(Gpt3D, DeferredReduceScatterWithDataAxis) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world < 4 || world % 2 != 0) GTEST_SKIP() << "needs an even world of at least 4 ranks";
  const reference::GptConfig config = test_config();
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  const auto tokens = random_ids(kBatch * kSeq, config.vocab_size, gen);
  const auto targets = random_ids(kBatch * kSeq, config.vocab_size, gen);
  ProcessGrid g = ProcessGrid::grid3d(MPI_COMM_WORLD, 1, 1, world / 2, 2, grid_options());
  reference::Gpt<double> ref(config, seed);
  ref.forward(tokens, targets, kBatch, kSeq);
  ref.backward();
  std::vector<std::vector<double>> off;
  for (bool ors : {false, true}) {
    Axonn3DContext<double> scheme(g, env().backend,
                                  {.overlap_reduce_scatter = ors, .overlap_all_gather = ors});
    Gpt<double> model(scheme, config, kBatch, kSeq, {.checkpoint = true});
    model.init(seed);
    model.forward(tokens, targets);
    model.backward();
    std::size_t k = 0;
    for (Param<double>* p : model.parameters_store().params()) {
      const auto grad = gather_global(*p, g, true);
      EXPECT_LE(max_over_ranks(rel_error(grad, ref.grad(p->shard.name))), 1e-9) << p->shard.name;
      if (!ors)
        off.push_back(grad);
      else
        EXPECT_LE(rel_error(grad, off[k]), 1e-12) << p->shard.name;
      ++k;
    }
  }
}

// ---------------------------------------------------------------- bf16

// bf16 mixed precision (docs/gpu.md): bf16 parameters, activations and
// gradients, fp32 statistics and accumulation. Oracles are double: the serial
// reference GPT (or TransformerBlock<double> (3D), itself checked against it
// above) given exactly the bf16 weights and inputs the bf16 model holds, so
// the measured error is that of the bf16 computation alone.
//
// Metric: the norm-wise relative error ||a - b||_2 / ||b||_2 of a whole
// tensor. With u = 2^-8 (bf16's unit roundoff, 3.9e-3), every stored
// intermediate is rounded once (relative error <= u/2), so a tensor L
// layers deep carries roughly c*u*sqrt(L) of accumulated, mostly
// independent rounding errors. Measured worst over ~70 runs (np 1, 4, 8,
// every factorisation, CPU and cpu_device, fresh seeds; L = 2 blocks): loss
// 8.4e-5 (0.02 u: a mean over 32 tokens, the rounding errors average out),
// logits 5.5e-3 (1.4 u), embedding gradient 6.3e-3 (1.6 u), parameter
// gradients 1.9e-2 (4.8 u; typically 2.5-3.5 u, always a LayerNorm gain or
// bias or c_attn's bias: column sums over the tokens of terms of both signs,
// whose cancellation magnifies the ~1.5 u error of the bf16 activation
// gradients); one block alone: output and dX 3.9e-3 (1.0 u), gradients
// 1.1e-2 (2.7 u). Bounds, about 3x over the worst measured (the loss 45x):
//   loss (relative)                1 u           = 3.9e-3
//   logits, input gradient         4 u           = 1.6e-2
//   parameter gradients            10 u sqrt(L)  = 5.5e-2 (L = 2)
//   one block (output, dX, grads)  8 u           = 3.1e-2
// They stay far below what a wrong result gives: a missing, doubled or
// misplaced term of a sum over ranks (a Z block of tokens, a Y block of
// hidden columns, the X vocabulary blocks) changes a tensor by O(1) of its
// norm (error >= 0.3 at Gz, Gy or Gx = 2), and a wrong sign or layout by 1
// to 2: each bound fails such a result by an order of magnitude (checked:
// skipping the Z all-reduce of the bf16 bias gradients gives 0.8-0.9).

double round_bf16(double v) {
  return static_cast<double>(bf16(v));
}

template <class T>
std::vector<double> widen(const std::vector<T>& v) {
  std::vector<double> out(v.size());
  for (std::size_t k = 0; k < v.size(); ++k) out[k] = static_cast<double>(v[k]);
  return out;
}

// Prints the worst measured errors once (rank 0), for choosing tolerances.
void print_measured(const std::string& what, const std::vector<std::pair<std::string, double>>& e) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) return;
  std::string line = "[ bf16     ] " + what + " worst norm-wise errors:";
  for (const auto& [name, v] : e)
    line += fmt::format(" {} {:.2e} ({:.2f} u)", name, v, v / kBf16Unit);
  std::printf("%s\n", line.c_str());
}

void bf16_model_vs_reference(bool checkpoint) {
  const reference::GptConfig config = test_config();
  const index_t tokens_n = kBatch * kSeq, h = config.n_embd, V = config.vocab_size;
  const double L = static_cast<double>(config.n_layer);
  const double loss_tol = kBf16Unit, act_tol = 4 * kBf16Unit;
  const double grad_tol = 10 * kBf16Unit * std::sqrt(L);
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  const auto tokens = random_ids(tokens_n, config.vocab_size, gen);
  const auto targets = random_ids(tokens_n, config.vocab_size, gen);
  reference::Gpt<double> ref(config, seed);
  for (double& v : ref.params()) v = round_bf16(v);  // the weights the bf16 model holds
  const double ref_loss = ref.forward(tokens, targets, kBatch, kSeq);
  ref.backward();
  double worst_loss = 0, worst_logits = 0, worst_dx = 0, worst_grad = 0;
  std::string worst_name;
  for (ProcessGrid& g : env().grids) {
    SCOPED_TRACE(describe(g));
    Axonn3DContext<bf16> model_scheme(g, env().backend);
    Gpt<bf16> model(model_scheme, config, kBatch, kSeq, {.checkpoint = checkpoint});
    model.init(seed);
    for (Param<bf16>* p : model.parameters_store().params()) {
      const auto global = widen(gather_global(*p, g));
      const auto want = ref.param(p->shard.name);
      ASSERT_EQ(global.size(), want.size()) << p->shard.name;
      EXPECT_TRUE(std::equal(global.begin(), global.end(), want.begin())) << p->shard.name;
    }
    const double loss = model.forward(tokens, targets);
    const double loss_err = std::abs(loss - ref_loss) / std::abs(ref_loss);
    EXPECT_LE(loss_err, loss_tol) << "loss " << loss << " vs " << ref_loss;
    double all[2] = {loss, -loss};  // the same on every rank
    MPI_Allreduce(MPI_IN_PLACE, all, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    EXPECT_EQ(all[0], -all[1]);
    const double logits_err = norm_error_over_ranks(
        download_view<bf16>(model.logits()),
        local_of<double>(g, ref.activation("logits"), tokens_n, {V, Axis::x}));
    EXPECT_LE(logits_err, act_tol);
    model.backward();
    const double dx_err = norm_error_over_ranks(
        download_view<bf16>(model.input_grad()),
        local_of<double>(g, ref.activation_grad("embeddings"), tokens_n, {h}));
    EXPECT_LE(dx_err, act_tol);
    for (Param<bf16>* p : model.parameters_store().params()) {
      const double e =
          max_over_ranks(norm_error(gather_global(*p, g, true), ref.grad(p->shard.name)));
      EXPECT_LE(e, grad_tol) << p->shard.name;
      if (e > worst_grad) {
        worst_grad = e;
        worst_name = p->shard.name;
      }
      // replicas (biases, LayerNorms, wpe) stay bit-identical in bf16 too
      EXPECT_TRUE(replicas_match(*p, g, true)) << p->shard.name;
    }
    worst_loss = std::max(worst_loss, max_over_ranks(loss_err));
    worst_logits = std::max(worst_logits, logits_err);
    worst_dx = std::max(worst_dx, dx_err);
  }
  print_measured(fmt::format("Gpt (3D) (checkpoint {})", checkpoint),
                 {{"loss", worst_loss},
                  {"logits", worst_logits},
                  {"input_grad", worst_dx},
                  {"grad(" + worst_name + ")", worst_grad}});
}

TEST(Gpt3D, Bf16MatchesReferenceCheckpointed) {
  bf16_model_vs_reference(true);
}
TEST(Gpt3D, Bf16MatchesReferenceNoCheckpoint) {
  bf16_model_vs_reference(false);
}

// One TransformerBlock<bf16> (3D) against TransformerBlock<double> (3D) on the same
// grid, with the same bf16-representable weights, input and output gradient:
// output, input gradient and every parameter gradient (tolerance above).
TEST(Layers3D, BlockBf16MatchesDouble) {
  const index_t batch = kBatch, seq = kSeq, hidden = 32, heads = 8, tokens = batch * seq;
  const double tol = 8 * kBf16Unit;
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  const auto random_bf16 = [&](index_t n, double center, double scale) {
    std::vector<double> v(static_cast<std::size_t>(n));
    for (double& x : v) x = round_bf16(center + scale * dist(gen));
    return v;
  };
  const std::vector<double> gX = random_bf16(tokens * hidden, 0, 1);
  const std::vector<double> gdY = random_bf16(tokens * hidden, 0, 1);
  const auto narrow = [](const std::vector<double>& v) {
    std::vector<bf16> out(v.size());
    for (std::size_t k = 0; k < v.size(); ++k) out[k] = bf16(v[k]);
    return out;
  };
  double worst[3] = {0, 0, 0};  // output, dX, gradients
  for (ProcessGrid& g : env().grids) {
    SCOPED_TRACE(describe(g));
    Axonn3DContext<double> want_scheme(g, env().backend);
    Axonn3DContext<bf16> got_scheme(g, env().backend);
    TransformerBlock<double> want(want_scheme, "h.0", batch, seq, hidden, heads);
    TransformerBlock<bf16> got(got_scheme, "h.0", batch, seq, hidden, heads);
    ParameterStore<double> want_store(env().backend, want.parameters());
    ParameterStore<bf16> got_store(env().backend, got.parameters());
    const auto pw = want.parameters();
    const auto pg = got.parameters();
    ASSERT_EQ(pw.size(), pg.size());
    for (std::size_t k = 0; k < pw.size(); ++k) {
      // Weights ~ 1/sqrt(fan-in) keep the activations O(1); LayerNorm gains near 1.
      const std::string& name = pw[k]->shard.name;
      const bool gain =
          name.find("ln_") != std::string::npos && name.find(".weight") != std::string::npos;
      const double scale = pw[k]->shard.global_shape.size() == 2
                               ? 1.0 / std::sqrt(static_cast<double>(pw[k]->shard.global_rows()))
                               : 0.2;
      const auto values = random_bf16(pw[k]->shard.global_size(), gain ? 1.0 : 0.0, scale);
      set_global(*pw[k], values);
      set_global(*pg[k], narrow(values));
    }
    Arenas aw(env().backend, want.buffer_needs()), ag(env().backend, got.buffer_needs());
    const index_t m = tokens / g.shape().depth, n = hidden / g.shape().cols;
    const auto x_local = local_of<double>(g, gX, tokens, {hidden});
    const auto dy_local = local_of<double>(g, gdY, tokens, {hidden});
    DeviceArray<double> xw(x_local), dyw(dy_local), yw(x_local.size()), dxw(x_local.size());
    DeviceArray<bf16> xg(narrow(x_local)), dyg(narrow(dy_local)), yg(x_local.size()),
        dxg(x_local.size());
    want.forward(xw.view(m, n), yw.view(m, n), aw.step);
    got.forward(xg.view(m, n), yg.view(m, n), ag.step);
    want.backward(dyw.view(m, n), dxw.view(m, n), aw.step);
    got.backward(dyg.view(m, n), dxg.view(m, n), ag.step);
    const double ey = norm_error_over_ranks(yg.download(), yw.download());
    const double edx = norm_error_over_ranks(dxg.download(), dxw.download());
    EXPECT_LE(ey, tol);
    EXPECT_LE(edx, tol);
    worst[0] = std::max(worst[0], ey);
    worst[1] = std::max(worst[1], edx);
    for (std::size_t k = 0; k < pw.size(); ++k) {
      const double e = max_over_ranks(
          norm_error(gather_global(*pg[k], g, true), gather_global(*pw[k], g, true)));
      EXPECT_LE(e, tol) << pw[k]->shard.name;
      worst[2] = std::max(worst[2], e);
    }
  }
  print_measured("TransformerBlock (3D)",
                 {{"output", worst[0]}, {"input_grad", worst[1]}, {"grads", worst[2]}});
}

// The collectives of a step, per axis, are exactly those gpt3d.hpp lists
// (calls; groups of one issue nothing). Without checkpointing, L blocks:
//   forward   Z: wte gather (embedding, head), 4L weight gathers, the loss
//             sum; Y: 2 per LayerNorm (2L+1), the normal linears' output
//             (2L), the logits; X: the embedding, the transposed linears'
//             output (2L), max and sums of the loss
//   backward  Z: per linear a gather, a reduce-scatter and the bias sum
//             (12L), per LayerNorm one (2L+1), wpe, 2 wte reduce-scatters,
//             the head's gather; Y: per LayerNorm one (2L+1), transposed
//             linears' dX (2L); X: normal linears' dX (2L), the head's dX
TEST(Gpt3D, CollectivesPerAxis) {
  const reference::GptConfig config = test_config();
  const std::uint64_t L = static_cast<std::uint64_t>(config.n_layer);
  std::mt19937_64 gen(fresh_seed());
  const auto tokens = random_ids(kBatch * kSeq, config.vocab_size, gen);
  const auto targets = random_ids(kBatch * kSeq, config.vocab_size, gen);
  for (ProcessGrid& g : env().grids) {
    SCOPED_TRACE(describe(g));
    const bool X = g.shape().rows > 1, Y = g.shape().cols > 1, Z = g.shape().depth > 1;
    Axonn3DContext<float> model_scheme(g, env().backend);
    Gpt<float> model(model_scheme, config, kBatch, kSeq, {.checkpoint = false});
    model.init(4);
    g.reset_traffic();
    model.forward(tokens, targets);
    const TrafficCounters fwd = g.traffic();
    EXPECT_EQ(fwd[CommAxis::depth].calls, Z ? 3 + 4 * L : 0);
    EXPECT_EQ(fwd[CommAxis::mesh_row].calls, Y ? 6 * L + 3 : 0);
    EXPECT_EQ(fwd[CommAxis::mesh_col].calls, X ? 2 * L + 3 : 0);
    EXPECT_EQ(fwd.total().calls, fwd[CommAxis::depth].calls + fwd[CommAxis::mesh_row].calls +
                                     fwd[CommAxis::mesh_col].calls);
    g.reset_traffic();
    model.backward();
    const TrafficCounters bwd = g.traffic();
    EXPECT_EQ(bwd[CommAxis::depth].calls, Z ? 14 * L + 5 : 0);
    EXPECT_EQ(bwd[CommAxis::mesh_row].calls, Y ? 4 * L + 1 : 0);
    EXPECT_EQ(bwd[CommAxis::mesh_col].calls, X ? 2 * L + 1 : 0);
    EXPECT_EQ(bwd.total().calls, bwd[CommAxis::depth].calls + bwd[CommAxis::mesh_row].calls +
                                     bwd[CommAxis::mesh_col].calls);
  }
}

template <class T>
void training_step_allocates_nothing() {
  if (!allocation_counting_available()) GTEST_SKIP() << "allocation counting unavailable (ASan)";
  if (test_backend().asynchronous())
    GTEST_SKIP() << "the CUDA runtime allocates host memory internally (pinned staging, "
                    "launch bookkeeping): allocation counting runs on the CPU backend";
  const reference::GptConfig config = test_config();
  std::mt19937_64 gen(fresh_seed());
  const auto tokens = random_ids(kBatch * kSeq, config.vocab_size, gen);
  const auto targets = random_ids(kBatch * kSeq, config.vocab_size, gen);
  for (ProcessGrid& g : env().grids) {
    SCOPED_TRACE(describe(g));
    // Every overlap on: OAG's recorded order and ORS's deferred list too.
    Axonn3DContext<T> scheme(
        g, env().backend,
        {.overlap_all_reduce = true, .overlap_reduce_scatter = true, .overlap_all_gather = true});
    Gpt<T> model(scheme, config, kBatch, kSeq, {.checkpoint = true});
    model.init(1);
    model.forward(tokens, targets);
    model.backward();
    std::uint64_t count = 0;
    std::string caller;
    {
      CountAllocations counter;
      model.forward(tokens, targets);
      model.backward();
      count = counter.count();
      caller = counter.first_caller();
    }
    EXPECT_EQ(count, 0u) << "first allocation from " << caller;
  }
}
TEST(Gpt3D, TrainingStepAllocatesNothing) {
  training_step_allocates_nothing<float>();
}
TEST(Gpt3D, TrainingStepAllocatesNothingBf16) {
  training_step_allocates_nothing<bf16>();
}

TEST(Gpt3D, BuffersSizedExactly) {
  const reference::GptConfig config = test_config();
  std::mt19937_64 gen(fresh_seed());
  const auto tokens = random_ids(kBatch * kSeq, config.vocab_size, gen);
  const auto targets = random_ids(kBatch * kSeq, config.vocab_size, gen);
  for (ProcessGrid& g : env().grids) {
    SCOPED_TRACE(describe(g));
    for (bool checkpoint : {true, false}) {
      Axonn3DContext<double> scheme(
          g, env().backend,
          {.overlap_all_reduce = true, .overlap_reduce_scatter = true, .overlap_all_gather = true});
      Gpt<double> model(scheme, config, kBatch, kSeq, {.checkpoint = checkpoint});
      model.init(3);
      model.forward(tokens, targets);
      model.backward();
      const MemoryReport r = model.memory_report();
      for (const BufferUsage& b : r.buffers) {
        EXPECT_LE(b.high_water, b.capacity) << b.name;
        if (b.name != "workspace") {
          EXPECT_EQ(b.high_water, b.capacity) << b.name;
        }
      }
    }
  }
}

void expect_config_error(ProcessGrid& g, const reference::GptConfig& c, index_t batch, index_t seq,
                         const std::string& needle) {
  const std::string msg = error_of([&] {
    Axonn3DContext<float> model_scheme(g, env().backend);
    Gpt<float> model(model_scheme, c, batch, seq);
  });
  EXPECT_NE(msg.find(needle), std::string::npos) << "'" << msg << "' lacks '" << needle << "'";
}

TEST(Gpt3D, InvalidConfigurationsThrowEverywhere) {
  const reference::GptConfig good = test_config();
  for (ProcessGrid& g : env().grids) {
    SCOPED_TRACE(describe(g));
    const int gx = g.shape().rows, gy = g.shape().cols, gz = g.shape().depth;
    expect_config_error(g, good, kBatch, good.n_positions + 1, "longer than the position table");
    expect_config_error(g, good, 0, 4, "must be positive");
    if (gz > 1) expect_config_error(g, good, gz + 1, 4, "batch=");
    if (gx > 1) {
      auto c = good;
      c.n_head = gx + 1;
      c.n_embd = (gx + 1) * 8 * gx * gy * gz;
      expect_config_error(g, c, kBatch, 4, "n_head=");
    }
    if (gx * gz > 1) {
      auto c = good;
      c.vocab_size = good.vocab_size + 1;
      expect_config_error(g, c, kBatch, 4, "vocab_size");
    }
    if (gx == 1 && gy * gz > 1) {
      auto c = good;
      c.n_head = 1;
      c.n_embd = 8 * gx * gy * gz + 1;
      expect_config_error(g, c, kBatch, 4, "n_embd (hidden)");
    }
  }
  const int p = world_size();
  if (p > 1) {
    // with a data axis the global batch must split over the data groups
    ProcessGrid data_grid = ProcessGrid::grid3d(MPI_COMM_WORLD, 1, 1, 1, p, grid_options());
    expect_config_error(data_grid, good, kBatch * p + 1, 4, "data-parallel");
  }
}

TEST(Gpt3D, BadIdsThrowEverywhere) {
  const reference::GptConfig config = test_config();
  for (ProcessGrid& g : env().grids) {
    SCOPED_TRACE(describe(g));
    Axonn3DContext<float> model_scheme(g, env().backend);
    Gpt<float> model(model_scheme, config, kBatch, kSeq);
    model.init(5);
    std::vector<std::int32_t> ok(static_cast<std::size_t>(kBatch * kSeq), 1);
    for (auto [where, value, needle] :
         {std::tuple{0, config.vocab_size, "token id"}, std::tuple{1, -1, "target id"}}) {
      auto tokens = ok, targets = ok;
      (where == 0 ? tokens : targets)[2] = value;
      const std::string msg = error_of([&] { model.forward(tokens, targets); });
      EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    }
    EXPECT_THROW(model.backward(), Error);
  }
}

}  // namespace
}  // namespace summa::test

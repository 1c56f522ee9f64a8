// What only the 3D (AxoNN) parallel-matrix-multiply scheme has, on every
// Gx x Gy x Gz factorisation of the rank count (CTest: 1, 4 and 8 ranks; at
// 4: 1x1x4, 1x2x2, 1x4x1, 2x1x2, 2x2x1, 4x1x1; at 8 the ten factorisations
// of 8, 2x2x2 and 1x2x4 among them), each grid built once with
// ProcessGrid::grid3d(MPI_COMM_WORLD, gx, gy, gz). The 3D layers and Gpt
// against the serial reference (each layer alone, the whole model in double,
// float and bf16, checkpointing, accumulation, replicas, allocation, buffers,
// shards, generic configuration and id errors) are checked with the other
// schemes' in one typed suite, tests/layers/test_scheme_layers.cpp (every
// factorisation of 1, 2, 4, 8 and 9 ranks); here:
//
// Layers3D: Linear3D in both orientations (plain and with the q|k|v groups
// of c_attn) against a serial Eigen product on random data: output, input
// gradient, weight and bias gradients (gathered), accumulation, OAR on vs
// off; Linear3D's shape errors.
//
// Gpt3D: the overlap switches (OAR, ORS, OAG, every combination, with and
// without checkpointing) agree with everything off in losses, gradients and
// bytes per axis, with the expected prefetch hits and deferred counts; ORS
// with a data axis against the reference; the collectives of a step per
// axis; the 3D divisibility rules and a data axis in configuration errors.
//
// Tolerances: test_util.hpp model_tolerance (1e-9 double, 2e-3 float); runs
// that differ only in the overlap switches agree to 1e-12 (double).
//
// Backend: test_backend() (SUMMA_TEST_BACKEND=cpu|cuda) with its
// communicators (test_grid_options(), small staging buffers). Inputs and
// weights are built on the host and uploaded, results downloaded; on CUDA
// float runs in fp32 (no TF32) and double in fp64, so the tolerances hold.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <random>
#include <string>
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
      Linear3D<T> layer(g, env().backend, "lin", tokens, in, out, orientation, true,
                        {.out = groups}, {.overlap_all_reduce = oar});
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

// The overlap switches (OAR, ORS, OAG: every combination where there is a Z
// axis, OAR alone and all three without one; with and without
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
        // without a Z axis ORS and OAG have nothing to defer or prefetch:
        // their combinations reduce to OAR's, so only all on is run there
        if (!Z && (bits & 6) != 0 && bits != 7) continue;
        const Axonn3DOptions o{.overlap_all_reduce = (bits & 1) != 0,
                               .overlap_reduce_scatter = (bits & 2) != 0,
                               .overlap_all_gather = (bits & 4) != 0};
        SCOPED_TRACE(fmt::format("OAR {} ORS {} OAG {}", o.overlap_all_reduce,
                                 o.overlap_reduce_scatter, o.overlap_all_gather));
        Axonn3DContext<double> scheme(g, env().backend, o);
        Gpt<double> model(scheme, config, kBatch, kSeq,
                          {.recompute = checkpoint ? Recompute::full : Recompute::none});
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
    Gpt<double> model(scheme, config, kBatch, kSeq, {.recompute = Recompute::full});
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
    Gpt<float> model(model_scheme, config, kBatch, kSeq, {.recompute = Recompute::none});
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

void expect_config_error(ProcessGrid& g, const reference::GptConfig& c, index_t batch, index_t seq,
                         const std::string& needle) {
  const std::string msg = error_of([&] {
    Axonn3DContext<float> model_scheme(g, env().backend);
    Gpt<float> model(model_scheme, c, batch, seq);
  });
  EXPECT_NE(msg.find(needle), std::string::npos) << "'" << msg << "' lacks '" << needle << "'";
}

// The 3D rules (what every scheme checks, the attention splits Gz and Gx
// included: test_scheme_layers.cpp).
TEST(Gpt3D, InvalidConfigurationsThrowEverywhere) {
  const reference::GptConfig good = test_config();
  for (ProcessGrid& g : env().grids) {
    SCOPED_TRACE(describe(g));
    const int gx = g.shape().rows, gy = g.shape().cols, gz = g.shape().depth;
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

}  // namespace
}  // namespace summa::test

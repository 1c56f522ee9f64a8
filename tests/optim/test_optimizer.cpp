// Optimizers, learning-rate schedule and global-norm clipping on local shards
// (CTest: 1, 2, 4 and 8 ranks; the schemes of test_util.hpp's
// representative_schemes at that rank count: 1D, 2D, 3D, each with and
// without a data axis).
//
// Oracles:
//  - the gradient norm against sqrt(Σ g²) of the serial reference GPT's
//    gradients (each element once; a replica counted twice or a data group
//    reduced over would be off by far more than the tolerance);
//  - clipped gradients against the reference gradients times the factor;
//  - three AdamW / SGD steps (each after a fresh forward and backward)
//    against an independent serial implementation written here in the
//    textbook form (PyTorch's documented algorithms), run on the reference
//    GPT's weights with its own gradients;
//  - every replica equals its owner bit for bit, and every data group holds
//    the same weights;
//  - the state slots are packed like the parameter values;
//  - bad options and arguments throw summa::Error (on every rank);
//  - step() and clip_grad_norm() allocate nothing once warmed up (offloaded
//    optimizers too);
//  - an offloaded optimizer steps as the plain one, bit for bit, and keeps
//    its state in the host pool.
//
// Tolerances (double): the norm is one sum of ~2.6·10⁴ squares whose order
// differs between layouts, so its relative error is ~1e-15; we ask 1e-12.
// Clipped gradients inherit the model's gradient tolerance against the
// reference (model_tolerance, 1e-9: see test_util.hpp). After the steps the
// weights are compared per tensor as max|a − b| / max(max|b|, lr) — the lr
// floor because a tensor that starts at zero (biases) holds only updates of
// size ~lr. SGD is linear in the gradient: 1e-12 (measured ~1e-15). AdamW:
// 1e-9, because its normalisation amplifies the tiny differences between the
// distributed and the serial gradients for elements whose gradient is tiny
// (|Δ update| ≲ lr·|Δg|/eps); measured 3e-12 to 9e-12 (recorded as the
// max_weight_error property).
// The optimizer arithmetic alone is checked to 1e-12 on the same gradients.
//
// Backend: test_backend() with test_grid_options() (SUMMA_TEST_BACKEND=cpu|
// cuda). Parameters, gradients and optimizer state live in its memory and
// are read back with Backend::download / gather_global. On CUDA the model
// and the optimizer kernels compute in the same precisions (fp64 for the
// double runs), so the tolerances above hold unchanged; the seam-op test
// (BackendOpsMatchReference) states its own. Allocation counting runs on the
// CPU backend only (the CUDA runtime allocates host memory internally).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "summa/optim/optimizer.hpp"
#include "summa/parallel/scheme.hpp"
#include "test_util.hpp"

namespace summa::test {
namespace {

int world_size() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

// Divisible by what every scheme at 1, 2, 4 and 8 ranks needs: heads and
// hidden by p, q, Gx, Gy; vocab by p and Gx·Gz (24 = 8·3).
reference::GptConfig test_config() {
  reference::GptConfig c;
  c.n_layer = 2;
  c.n_head = 8;
  c.n_embd = 32;
  c.n_positions = 8;
  c.vocab_size = 24;
  return c;
}
constexpr index_t kSeq = 4;

struct Ids {
  std::vector<std::int32_t> tokens, targets;
};

// A model under `spec` on the test backend and its communicators.
template <class T>
std::unique_ptr<ParallelGpt<T>> make_run(const SchemeSpec& spec, const reference::GptConfig& c,
                                         index_t batch) {
  return std::make_unique<ParallelGpt<T>>(MPI_COMM_WORLD, spec, test_backend(), c, batch, kSeq,
                                          GptOptions{}, test_grid_options());
}

// n elements of test-backend memory at `data`, on the host.
template <class T>
std::vector<T> host_copy(const T* data, index_t n) {
  std::vector<T> out(static_cast<std::size_t>(n));
  if (n > 0) test_backend().download(out.data(), data, out.size() * sizeof(T));
  return out;
}

// A parameter's local value (or gradient) elements, on the host.
template <class T>
std::vector<T> local_host(const Param<T>& p, bool grad = false) {
  return host_copy(grad ? p.grad : p.value, p.shard.local_size());
}

Ids random_ids(index_t batch, int vocab, std::mt19937_64& gen) {
  std::uniform_int_distribution<int> dist(0, vocab - 1);
  Ids ids;
  ids.tokens.resize(static_cast<std::size_t>(batch * kSeq));
  ids.targets.resize(ids.tokens.size());
  for (auto& t : ids.tokens) t = dist(gen);
  for (auto& t : ids.targets) t = dist(gen);
  return ids;
}

index_t batch_for(const SchemeSpec& spec) {
  return 2 * batch_granularity(spec);
}

// max over tensors of max|a − b| / max(max|b|, floor), the largest over ranks.
double weights_error(ParallelGpt<double>& run, const reference::Gpt<double>& ref, bool grad,
                     double scale, double floor) {
  double worst = 0;
  for (Param<double>* p : run.model().parameters_store().params()) {
    const auto got = gather_global(*p, run.grid(), grad);
    const auto want = grad ? ref.grad(p->shard.name) : ref.param(p->shard.name);
    double diff = 0, size = floor;
    for (std::size_t k = 0; k < want.size(); ++k) {
      diff = std::max(diff, std::abs(got[k] - scale * want[k]));
      size = std::max(size, std::abs(scale * want[k]));
    }
    worst = std::max(worst, size > 0 ? diff / size : diff);
  }
  return max_over_ranks(worst);
}

// Every local element (owner or replica, every piece) equals the gathered
// global tensor bit for bit; and the gathered tensors are identical in every
// data group. Returns the number of mismatches over all ranks.
template <class T>
long replica_mismatches(GptModel<T>& model, ProcessGrid& grid) {
  long bad = 0;
  for (Param<T>* p : model.parameters_store().params()) {
    const auto global = gather_global(*p, grid);
    const ParamShard& s = p->shard;
    const std::vector<T> value = local_host(*p);
    for (const ShardPiece& piece : s.pieces)
      for (index_t r = 0; r < piece.rows; ++r)
        for (index_t c = 0; c < piece.cols; ++c) {
          const T local = value[static_cast<std::size_t>((piece.local_row + r) * s.local_cols +
                                                         piece.local_col + c)];
          const T want = global[static_cast<std::size_t>((piece.global_row + r) * s.global_cols() +
                                                         piece.global_col + c)];
          if (std::memcmp(&local, &want, sizeof(T)) != 0) ++bad;
        }
    // the same global tensor in every data group
    std::vector<T> low(global), high(global);
    MPI_Comm data = grid.native(CommAxis::data);
    const MPI_Datatype type = std::is_same_v<T, double> ? MPI_DOUBLE : MPI_FLOAT;
    MPI_Allreduce(MPI_IN_PLACE, low.data(), static_cast<int>(low.size()), type, MPI_MIN, data);
    MPI_Allreduce(MPI_IN_PLACE, high.data(), static_cast<int>(high.size()), type, MPI_MAX, data);
    for (std::size_t k = 0; k < global.size(); ++k)
      if (low[k] != global[k] || high[k] != global[k]) ++bad;
  }
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  return bad;
}

// ---------------------------------------------------------------- the serial optimizer
//
// Written from PyTorch's documented algorithms (torch.optim.AdamW / SGD), in
// the textbook form with bias-corrected moments, on the reference GPT's flat
// parameter and gradient arrays.
struct SerialOptimizer {
  explicit SerialOptimizer(const OptimizerOptions& options) : o(options) {}

  OptimizerOptions o;
  std::vector<double> first, second;  // AdamW m, v; SGD buffer in first
  std::int64_t t = 0;

  void step(reference::Gpt<double>& ref, double lr) {
    ++t;
    auto params = ref.params();
    auto grads = ref.grads();
    if (first.empty()) {
      first.assign(params.size(), 0.0);
      second.assign(params.size(), 0.0);
    }
    std::size_t k = 0;
    for (const reference::ParamInfo& info : ref.parameter_info()) {
      const bool matrix = info.shape.size() == 2;
      const double wd = (matrix || o.decay_vectors) ? o.weight_decay : 0.0;
      for (index_t e = 0; e < info.size(); ++e, ++k) {
        double& p = params[k];
        double g = grads[k];
        if (o.kind == "adamw") {
          p -= lr * wd * p;
          first[k] = o.beta1 * first[k] + (1 - o.beta1) * g;
          second[k] = o.beta2 * second[k] + (1 - o.beta2) * g * g;
          const double m_hat = first[k] / (1 - std::pow(o.beta1, static_cast<double>(t)));
          const double v_hat = second[k] / (1 - std::pow(o.beta2, static_cast<double>(t)));
          p -= lr * m_hat / (std::sqrt(v_hat) + o.eps);
        } else {
          g += wd * p;
          first[k] = t == 1 ? g : o.momentum * first[k] + g;
          const double d = o.nesterov ? g + o.momentum * first[k] : first[k];
          p -= lr * d;
        }
      }
    }
  }
};

// ---------------------------------------------------------------- LrSchedule

TEST(LrSchedule, WarmupCosineAndFloor) {
  std::mt19937_64 gen(fresh_seed());
  std::uniform_real_distribution<double> u(0.1, 1.0);
  LrSchedule s;
  s.lr = u(gen);
  s.min_lr = s.lr * u(gen) / 2;
  s.warmup = 10;
  s.total = 110;
  // warm-up: linear from lr/warmup, reaching lr at step warmup-1
  EXPECT_DOUBLE_EQ(s.at(0), s.lr / 10);
  for (std::int64_t k = 0; k < 10; ++k)
    EXPECT_NEAR(s.at(k), s.lr * static_cast<double>(k + 1) / 10, 1e-15) << k;
  EXPECT_NEAR(s.at(4) - s.at(3), s.at(8) - s.at(7), 1e-15);
  EXPECT_DOUBLE_EQ(s.at(9), s.lr);
  // cosine: lr at warmup, the mean at the midpoint, min_lr at total and after
  EXPECT_DOUBLE_EQ(s.at(10), s.lr);
  EXPECT_NEAR(s.at(60), (s.lr + s.min_lr) / 2, 1e-15);
  EXPECT_NEAR(s.at(35), s.min_lr + 0.5 * (s.lr - s.min_lr) * (1 + std::cos(M_PI * 0.25)), 1e-15);
  EXPECT_DOUBLE_EQ(s.at(110), s.min_lr);
  EXPECT_DOUBLE_EQ(s.at(1000), s.min_lr);
  for (std::int64_t k = 10; k < 110; ++k) EXPECT_GE(s.at(k), s.at(k + 1)) << k;  // monotone
  // no warm-up, no decay: constant
  LrSchedule constant{.lr = s.lr};
  EXPECT_DOUBLE_EQ(constant.at(0), s.lr);
  EXPECT_DOUBLE_EQ(constant.at(123456), s.lr);
  // warm-up then constant
  LrSchedule warm{.lr = s.lr, .warmup = 4};
  EXPECT_DOUBLE_EQ(warm.at(1), s.lr / 2);
  EXPECT_DOUBLE_EQ(warm.at(100), s.lr);
  // no warm-up, cosine from step 0
  LrSchedule cosine{.lr = s.lr, .warmup = 0, .total = 4, .min_lr = 0};
  EXPECT_DOUBLE_EQ(cosine.at(0), s.lr);
  EXPECT_NEAR(cosine.at(2), s.lr / 2, 1e-15);
  EXPECT_DOUBLE_EQ(cosine.at(4), 0.0);
}

TEST(LrSchedule, BadScheduleThrows) {
  const auto message = [](const LrSchedule& s) {
    try {
      s.validate();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message({.lr = -1e-3}).find("lr=-0.001"), std::string::npos);
  EXPECT_NE(message({.lr = std::nan("")}).find("lr=nan"), std::string::npos);
  EXPECT_NE(message({.warmup = -1}).find("warmup=-1"), std::string::npos);
  EXPECT_NE(message({.warmup = 10, .total = 5}).find("total=5"), std::string::npos);
  EXPECT_NE(message({.total = -2}).find("total=-2"), std::string::npos);
  EXPECT_NE(message({.lr = 1e-3, .min_lr = 1e-2}).find("min_lr=0.01"), std::string::npos);
  EXPECT_EQ(message({.warmup = 5, .total = 5}), "");  // decays to min_lr right after warm-up
  EXPECT_THROW(LrSchedule{.lr = -1}.at(0), Error);
  EXPECT_THROW(LrSchedule{}.at(-1), Error);
}

// ---------------------------------------------------------------- options

TEST(Optimizer, BadOptionsThrow) {
  const auto message = [](const OptimizerOptions& o) {
    try {
      o.validate();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(message({}), "");
  EXPECT_EQ(message({.kind = "sgd", .nesterov = true}), "");
  EXPECT_NE(message({.kind = "adam"}).find("unknown kind 'adam'"), std::string::npos);
  EXPECT_NE(message({.beta1 = 1.0}).find("beta1=1"), std::string::npos);
  EXPECT_NE(message({.beta1 = -0.1}).find("beta1=-0.1"), std::string::npos);
  EXPECT_NE(message({.beta2 = 1.5}).find("beta2=1.5"), std::string::npos);
  EXPECT_NE(message({.eps = 0}).find("eps=0"), std::string::npos);
  EXPECT_NE(message({.weight_decay = -0.1}).find("weight_decay=-0.1"), std::string::npos);
  EXPECT_NE(message({.kind = "sgd", .momentum = -0.5}).find("momentum=-0.5"), std::string::npos);
  EXPECT_NE(message({.kind = "sgd", .momentum = 0, .nesterov = true}).find("nesterov"),
            std::string::npos);
  EXPECT_NE(message({.kind = "adamw", .nesterov = true}).find("nesterov"), std::string::npos);

  // make_optimizer validates; step, set_steps and state check their arguments
  const SchemeSpec spec = schemes_for(world_size()).front();
  const auto owned = make_run<double>(spec, test_config(), batch_for(spec));
  ParallelGpt<double>& run = *owned;
  auto& store = run.model().parameters_store();
  EXPECT_THROW(make_optimizer<double>({.kind = "lamb"}, store), Error);
  auto opt = make_optimizer<double>({}, store);
  EXPECT_THROW(opt->step(-1e-3), Error);
  EXPECT_THROW(opt->step(std::numeric_limits<double>::infinity()), Error);
  EXPECT_EQ(opt->steps(), 0);
  EXPECT_THROW(opt->set_steps(-1), Error);
  EXPECT_THROW(opt->state(2), Error);
  EXPECT_EQ(make_optimizer<double>({.kind = "sgd"}, store)->state_names(),
            std::vector<std::string>{"momentum_buffer"});

  // clip_grad_norm: a bad max_norm on any rank of a tensor group throws on
  // all of them (no hang), and the grid works afterwards
  for (double bad : {-1.0, std::nan("")}) {
    const double mine = run.grid().world().rank() == 0 ? bad : 1.0;
    std::string msg;
    try {
      clip_grad_norm(store, run.grid(), mine);
    } catch (const Error& e) {
      msg = e.what();
    }
    // every rank of world rank 0's tensor group throws; the others do not
    int lowest = run.grid().world().rank();
    MPI_Allreduce(MPI_IN_PLACE, &lowest, 1, MPI_INT, MPI_MIN, run.grid().native(CommAxis::tensor));
    if (lowest == 0) {
      EXPECT_NE(msg.find("max_norm"), std::string::npos) << msg;
    } else {
      EXPECT_EQ(msg, "");
    }
  }
  EXPECT_GE(clip_grad_norm(store, run.grid(), 0.0), 0.0);
}

// ---------------------------------------------------------------- clipping

// for_each_block_within (the clipping of a range and the checkpoints of a
// data-axis chunk cut a shard's pieces with it), against the elements
// enumerated one by one: over every small piece and range, the blocks hold
// exactly the piece's elements in [lo, hi), each once, at most three, in
// increasing order, their global corners moved with their local ones.
TEST(ClipGradNorm, BlocksWithinARangeAreThePiecesElementsInIt) {
  int checked = 0;
  for (index_t ld = 1; ld <= 6; ++ld)
    for (index_t row = 0; row <= 2; ++row)
      for (index_t col = 0; col < ld; ++col)
        for (index_t cols = 1; col + cols <= ld; ++cols)
          for (index_t rows = 1; rows <= 3; ++rows) {
            const ShardPiece piece{.global_row = 7,
                                   .global_col = 11,
                                   .local_row = row,
                                   .local_col = col,
                                   .rows = rows,
                                   .cols = cols};
            const index_t end = (row + rows) * ld + 2;
            for (index_t lo = -1; lo <= end; ++lo)
              for (index_t hi = lo; hi <= end; ++hi) {
                std::vector<index_t> want, got;
                for (index_t r = 0; r < rows; ++r)
                  for (index_t c = 0; c < cols; ++c)
                    if (const index_t x = (row + r) * ld + col + c; x >= lo && x < hi)
                      want.push_back(x);
                int blocks = 0;
                bool moved_alike = true;
                for_each_block_within(piece, ld, lo, hi, [&](const ShardPiece& b) {
                  ++blocks;
                  moved_alike = moved_alike && b.rows > 0 && b.cols > 0 &&
                                b.global_row - piece.global_row == b.local_row - row &&
                                b.global_col - piece.global_col == b.local_col - col;
                  for (index_t r = 0; r < b.rows; ++r)
                    for (index_t c = 0; c < b.cols; ++c)
                      got.push_back((b.local_row + r) * ld + b.local_col + c);
                });
                ASSERT_EQ(got, want) << "ld " << ld << ", piece at (" << row << ", " << col << ") "
                                     << rows << "x" << cols << ", [" << lo << ", " << hi << ")";
                ASSERT_LE(blocks, 3);
                ASSERT_TRUE(moved_alike);
                ++checked;
              }
          }
  EXPECT_GT(checked, 10000);
}

TEST(ClipGradNorm, CountsEveryElementOnceAndScales) {
  const reference::GptConfig config = test_config();
  int tested = 0;
  for (const SchemeSpec& spec : representative_schemes(world_size())) {
    SCOPED_TRACE(spec.str());
    const std::uint64_t seed = fresh_seed();
    SCOPED_TRACE(seed_note(seed));
    std::mt19937_64 gen(seed);
    const index_t batch = batch_for(spec);
    const Ids ids = random_ids(batch, config.vocab_size, gen);
    reference::Gpt<double> ref(config, seed);
    ref.forward(ids.tokens, ids.targets, batch, kSeq);
    ref.backward();
    double ref_sq = 0;
    for (double g : ref.grads()) ref_sq += g * g;
    const double ref_norm = std::sqrt(ref_sq);

    const auto owned = make_run<double>(spec, config, batch);
    ParallelGpt<double>& run = *owned;
    auto& store = run.model().parameters_store();
    run.model().init(seed);
    run.model().forward(ids.tokens, ids.targets);
    run.model().backward();

    // (a) the norm: each global element once, the same on every rank
    const double norm_sq = global_norm_sq(store, run.grid());
    EXPECT_NEAR(norm_sq, ref_sq, 1e-12 * ref_sq);
    const double norm = clip_grad_norm(store, run.grid(), 0.0);  // measure only
    EXPECT_NEAR(norm, ref_norm, 1e-12 * ref_norm);
    EXPECT_EQ(max_over_ranks(norm), -max_over_ranks(-norm)) << "norm differs between ranks";
    EXPECT_LE(weights_error(run, ref, true, 1.0, 0.0), model_tolerance<double>());
    // ... and over ranges of the packed gradients (ZeRO-2's chunks): ranges
    // cut at random points (inside rows, pieces and parameters) add up to
    // the whole (summed over grid.data() too, a single group here when the
    // spec has none)
    if (spec.data == 1) {
      const index_t n = store.padded_elements();
      std::vector<index_t> cuts{0, n};
      std::uniform_int_distribution<index_t> at(0, n);
      for (int k = 0; k < 7; ++k) cuts.push_back(at(gen));  // the same on every rank
      std::sort(cuts.begin(), cuts.end());
      double sum = 0;
      for (std::size_t k = 0; k + 1 < cuts.size(); ++k)
        sum += global_norm_sq(store, run.grid(), {cuts[k], cuts[k + 1] - cuts[k]});
      EXPECT_NEAR(sum, ref_sq, 1e-12 * ref_sq);
      // a clip over one range scales only it
      const ElementRange mid{cuts[3], cuts[5] - cuts[3]};
      const double part = std::sqrt(global_norm_sq(store, run.grid(), mid));
      const std::vector<double> before = host_copy(store.grads_base(), store.padded_elements());
      EXPECT_EQ(clip_grad_norm(store, run.grid(), part / 2, mid), part);
      const std::vector<double> after = host_copy(store.grads_base(), store.padded_elements());
      const double c = (part / 2) / (part + 1e-6);
      long wrong = 0;
      for (index_t i = 0; i < static_cast<index_t>(after.size()); ++i) {
        const bool inside = i >= mid.begin && i < mid.begin + mid.count;
        const double want =
            inside ? before[static_cast<std::size_t>(i)] * c : before[static_cast<std::size_t>(i)];
        if (std::abs(after[static_cast<std::size_t>(i)] - want) > 1e-15 * std::abs(want)) ++wrong;
      }
      EXPECT_EQ(max_over_ranks(static_cast<double>(wrong)), 0);
      // back to the unscaled gradients for the rest of the test
      run.model().forward(ids.tokens, ids.targets);
      run.model().backward();
    }

    // a max_norm above the norm leaves the gradients alone
    EXPECT_EQ(clip_grad_norm(store, run.grid(), 2 * norm), norm);
    EXPECT_LE(weights_error(run, ref, true, 1.0, 0.0), model_tolerance<double>());

    // (b) clipping to half: pre-clip norm returned, gradients scaled by
    // max_norm / (norm + 1e-6) everywhere (replicas too: see below)
    const double max_norm = norm / 2;
    EXPECT_EQ(clip_grad_norm(store, run.grid(), max_norm), norm);
    const double factor = max_norm / (norm + 1e-6);
    EXPECT_LE(weights_error(run, ref, true, factor, 0.0), model_tolerance<double>());
    EXPECT_NEAR(std::sqrt(global_norm_sq(store, run.grid())), norm * factor, 1e-12 * norm * factor);
    // replicas' gradients were scaled like their owners': bit-identical
    long bad = 0;
    for (Param<double>* p : store.params()) {
      const auto global = gather_global(*p, run.grid(), true);
      const ParamShard& s = p->shard;
      const std::vector<double> grad = local_host(*p, true);
      for (const ShardPiece& piece : s.pieces)
        for (index_t r = 0; r < piece.rows; ++r)
          for (index_t c = 0; c < piece.cols; ++c)
            if (grad[static_cast<std::size_t>((piece.local_row + r) * s.local_cols +
                                              piece.local_col + c)] !=
                global[static_cast<std::size_t>((piece.global_row + r) * s.global_cols() +
                                                piece.global_col + c)])
              ++bad;
    }
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    EXPECT_EQ(bad, 0);
    ++tested;
  }
  RecordProperty("schemes", tested);
}

// ---------------------------------------------------------------- steps

void steps_match_serial(const OptimizerOptions& options, double tolerance) {
  const reference::GptConfig config = test_config();
  const LrSchedule schedule{.lr = 5e-3, .warmup = 2, .total = 3, .min_lr = 1e-3};
  double worst = 0;
  for (const SchemeSpec& spec : representative_schemes(world_size())) {
    SCOPED_TRACE(spec.str());
    const std::uint64_t seed = fresh_seed();
    SCOPED_TRACE(seed_note(seed));
    std::mt19937_64 gen(seed);
    const index_t batch = batch_for(spec);
    reference::Gpt<double> ref(config, seed);
    SerialOptimizer serial(options);
    const auto owned = make_run<double>(spec, config, batch);
    ParallelGpt<double>& run = *owned;
    run.model().init(seed);
    auto opt = make_optimizer(options, run.model().parameters_store());
    EXPECT_EQ(opt->kind(), options.kind);
    for (std::int64_t step = 0; step < 3; ++step) {
      const Ids ids = random_ids(batch, config.vocab_size, gen);
      ref.forward(ids.tokens, ids.targets, batch, kSeq);
      ref.backward();
      run.model().forward(ids.tokens, ids.targets);
      run.model().backward();
      const double lr = schedule.at(step);
      opt->step(lr);
      serial.step(ref, lr);
    }
    EXPECT_EQ(opt->steps(), 3);
    const double error = weights_error(run, ref, false, 1.0, schedule.lr);
    EXPECT_LE(error, tolerance);
    worst = std::max(worst, error);
    // (d) replicas bit-identical to owners, data groups identical
    EXPECT_EQ(replica_mismatches(run.model(), run.grid()), 0);
  }
  testing::Test::RecordProperty("max_weight_error", fmt::format("{:.3g}", worst));
}

TEST(Optimizer, AdamWStepsMatchSerial) {
  steps_match_serial({.kind = "adamw", .beta1 = 0.9, .beta2 = 0.95, .weight_decay = 0.1}, 1e-9);
}
TEST(Optimizer, SgdMomentumStepsMatchSerial) {
  steps_match_serial({.kind = "sgd", .momentum = 0.9, .weight_decay = 0.01}, 1e-12);
}
TEST(Optimizer, SgdNesterovDecayVectorsStepsMatchSerial) {
  steps_match_serial({.kind = "sgd",
                      .momentum = 0.8,
                      .nesterov = true,
                      .weight_decay = 0.05,
                      .decay_vectors = true},
                     1e-12);
}

// The optimizer arithmetic alone, on the gathered distributed gradients
// themselves (no gradient differences): 1e-12. Also: the state slots are
// packed like values_base(), and a resumed optimizer (state copied,
// set_steps) continues bit for bit.
TEST(Optimizer, ArithmeticStateLayoutAndResume) {
  const reference::GptConfig config = test_config();
  for (const SchemeSpec& spec : representative_schemes(world_size())) {
    SCOPED_TRACE(spec.str());
    const std::uint64_t seed = fresh_seed();
    SCOPED_TRACE(seed_note(seed));
    std::mt19937_64 gen(seed);
    const index_t batch = batch_for(spec);
    const OptimizerOptions options{.kind = "adamw", .weight_decay = 0.1};
    const auto owned = make_run<double>(spec, config, batch);
    ParallelGpt<double>& run = *owned;
    auto& store = run.model().parameters_store();
    run.model().init(seed);
    auto opt = make_optimizer(options, store);
    ASSERT_EQ(opt->state_names(), (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
    ASSERT_EQ(opt->state_elements(), store.local_elements());
    // the serial optimizer on the gathered weights and gradients
    reference::Gpt<double> mirror(config, seed);
    SerialOptimizer serial(options);
    for (std::int64_t step = 0; step < 2; ++step) {
      const Ids ids = random_ids(batch, config.vocab_size, gen);
      run.model().forward(ids.tokens, ids.targets);
      run.model().backward();
      for (Param<double>* p : store.params()) {
        const auto g = gather_global(*p, run.grid(), true);
        std::copy(g.begin(), g.end(), mirror.grad(p->shard.name).begin());
      }
      opt->step(1e-2);
      serial.step(mirror, 1e-2);
    }
    EXPECT_LE(weights_error(run, mirror, false, 1.0, 0.0), 1e-12);
    // exp_avg of each parameter sits at its value's offset in values_base():
    // compare with the serial first moment at the pieces
    long bad = 0;
    double worst = 0;
    index_t offset = 0;
    const std::vector<double> state[2] = {host_copy(opt->state(0), opt->state_elements()),
                                          host_copy(opt->state(1), opt->state_elements())};
    std::vector<index_t> flat_offset;
    for (const reference::ParamInfo& info : mirror.parameter_info()) {
      flat_offset.push_back(offset);
      offset += info.size();
    }
    // exp_avg_sq (a sum of squares) cannot cancel: relative per element.
    // exp_avg can (β1·m + (1−β1)·g of opposite signs), and a device rounds it
    // in another order (FMA) than the serial code: relative to the largest
    // exp_avg of the same tensor.
    for (Param<double>* p : store.params()) {
      if (!p->held()) continue;
      const auto at = static_cast<std::size_t>(p->value - store.values_base());
      std::size_t index = 0;
      while (mirror.parameter_info()[index].name != p->shard.name) ++index;
      const ParamShard& s = p->shard;
      double tensor_scale = 0;
      for (std::size_t i = 0; i < static_cast<std::size_t>(mirror.parameter_info()[index].size());
           ++i)
        tensor_scale = std::max(
            tensor_scale, std::abs(serial.first[static_cast<std::size_t>(flat_offset[index]) + i]));
      for (const ShardPiece& piece : s.pieces)
        for (index_t r = 0; r < piece.rows; ++r)
          for (index_t c = 0; c < piece.cols; ++c) {
            const auto local = static_cast<std::size_t>((piece.local_row + r) * s.local_cols +
                                                        piece.local_col + c);
            const auto global = static_cast<std::size_t>(flat_offset[index] +
                                                         (piece.global_row + r) * s.global_cols() +
                                                         piece.global_col + c);
            for (std::size_t slot = 0; slot < 2; ++slot) {
              const double want = slot == 0 ? serial.first[global] : serial.second[global];
              const double got = state[slot][at + local];
              const double size = std::abs(want) + (slot == 0 ? tensor_scale : 0.0);
              worst = std::max(worst, std::abs(got - want) / std::max(size, 1e-300));
              if (!(std::abs(got - want) <= 1e-12 * size)) ++bad;
            }
          }
    }
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    EXPECT_EQ(bad, 0) << "worst relative state error " << worst;

    // resume: a fresh optimizer given the state and the step count continues
    // exactly like the original
    // (through the host, as a checkpoint would)
    Backend& backend = store.backend();
    const auto bytes = static_cast<std::size_t>(store.local_elements()) * sizeof(double);
    auto resumed = make_optimizer(options, store);
    for (std::size_t slot = 0; slot < 2; ++slot)
      if (bytes > 0) backend.upload(resumed->state(slot), state[slot].data(), bytes);
    resumed->set_steps(opt->steps());
    const std::vector<double> saved = host_copy(store.values_base(), store.local_elements());
    opt->step(1e-2);
    const std::vector<double> after = host_copy(store.values_base(), store.local_elements());
    if (bytes > 0) backend.upload(store.values_base(), saved.data(), bytes);
    resumed->step(1e-2);
    EXPECT_EQ(host_copy(store.values_base(), store.local_elements()), after);
  }
}

// A matrix (decayed), a bias and a LayerNorm weight: 35 + 7 + 11 = 53
// elements (a store of them padded for 3 chunks holds 54).
template <class T>
std::vector<Param<T>> three_params() {
  std::vector<Param<T>> p(3);
  p[0].shard = split_shard("w", {5, 7}, {}, {});
  p[1].shard = split_shard("b", {7}, {}, {});
  p[2].shard = split_shard("ln", {11}, {}, {});
  return p;
}
template <class T>
std::vector<Param<T>*> pointers(std::vector<Param<T>>& p) {
  std::vector<Param<T>*> out;
  for (Param<T>& x : p) out.push_back(&x);
  return out;
}

// An optimizer over a range of the packed elements (ZeRO's data-axis chunk,
// data_chunk) updates exactly those elements as the whole-store optimizer
// does, and keeps state for them only: three chunk optimizers of a store
// padded to a multiple of 3, whose chunks cut through parameters, together
// give the whole optimizer's values bit for bit over three steps (AdamW with
// decay, SGD with Nesterov momentum; bf16 with its fp32 master chunks too).
template <class T>
void chunked_optimizers_update_as_one() {
  Backend& backend = test_backend();
  std::mt19937_64 gen(fresh_seed());
  std::uniform_real_distribution<double> u(-1, 1);
  // chunks [0, 18) [18, 36) [36, 54) of the padded store cut the matrix and
  // the bias
  std::vector<Param<T>> whole_params = three_params<T>(), chunked_params = three_params<T>();
  ParameterStore<T> whole(backend, pointers(whole_params));
  ParameterStore<T> chunked(backend, pointers(chunked_params), true, 3);
  ASSERT_EQ(whole.local_elements(), 53);
  ASSERT_EQ(chunked.padded_elements(), 54);
  std::vector<T> values(53), grads(53);
  for (T& v : values) v = static_cast<T>(static_cast<float>(u(gen)));
  for (ParameterStore<T>* st : {&whole, &chunked}) {
    backend.upload(st->values_base(), values.data(), values.size() * sizeof(T));
  }
  for (const OptimizerOptions& options :
       {OptimizerOptions{.kind = "adamw", .weight_decay = 0.1},
        OptimizerOptions{.kind = "sgd", .momentum = 0.9, .nesterov = true, .weight_decay = 0.1}}) {
    SCOPED_TRACE(options.kind);
    auto one = make_optimizer(options, whole);
    std::vector<std::unique_ptr<Optimizer<T>>> three;
    for (int d = 0; d < 3; ++d) {
      three.push_back(make_optimizer(options, chunked, data_chunk(chunked, d, 3)));
      EXPECT_EQ(three.back()->range().begin, 18 * d);
      EXPECT_EQ(three.back()->state_elements(), 18);
      EXPECT_TRUE(three.back()->partial());
    }
    EXPECT_FALSE(one->partial());
    for (int step = 0; step < 3; ++step) {
      for (T& g : grads) g = static_cast<T>(static_cast<float>(u(gen)));
      for (ParameterStore<T>* st : {&whole, &chunked})
        backend.upload(st->grads_base(), grads.data(), grads.size() * sizeof(T));
      one->step(1e-2);
      for (auto& o : three) o->step(1e-2);
      EXPECT_EQ(host_copy(chunked.values_base(), 53), host_copy(whole.values_base(), 53))
          << "step " << step;
    }
  }
  // a range outside the padded elements, and chunks that do not divide
  EXPECT_THROW(make_optimizer<T>({}, chunked, {.begin = 40, .count = 18}), Error);
  EXPECT_THROW(data_chunk(whole, 0, 2), Error);
}

TEST(Optimizer, ChunkedOptimizersUpdateAsOne) {
  chunked_optimizers_update_as_one<double>();
}
TEST(OptimizerBf16, ChunkedOptimizersUpdateAsOne) {
  chunked_optimizers_update_as_one<bf16>();
}

// Optimizer offload (OptimizerOptions::offload_bucket): the state and the
// bf16 master weights in the backend's host pool, streamed through two
// buckets of backend buffers. The arithmetic is the plain optimizer's, so an
// offloaded optimizer beside a plain one on a copy of the same store gives
// the same values, state and master bit for bit over three steps, for every
// bucket size (1 element; ones that cut parameters; one bucket; larger than
// the elements), over the whole store and over a data chunk that cuts
// parameters (ZeRO's zero=1, 2 with offload). Its memory: the host pool holds
// exactly the state the plain optimizer keeps on the backend, and the
// backend only offload_staging_bytes.
template <class T>
void offloaded_optimizer_steps_as_on_backend() {
  using M = master_t<T>;
  Backend& backend = test_backend();
  std::mt19937_64 gen(fresh_seed());
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<Param<T>> plain_params = three_params<T>(), offload_params = three_params<T>();
  ParameterStore<T> plain(backend, pointers(plain_params), true, 3);
  ParameterStore<T> offload(backend, pointers(offload_params), true, 3);
  std::vector<T> values(53), grads(53);
  for (const OptimizerOptions& base :
       {OptimizerOptions{.kind = "adamw", .weight_decay = 0.1},
        OptimizerOptions{.kind = "sgd", .momentum = 0.9, .nesterov = true, .weight_decay = 0.1}})
    for (const ElementRange range : {ElementRange{}, data_chunk(plain, 1, 3)})
      for (const index_t bucket : {1, 5, 18, 53, 64}) {
        SCOPED_TRACE(fmt::format("{}, range [{}, +{}), bucket {}", base.kind, range.begin,
                                 range.count, bucket));
        for (T& v : values) v = static_cast<T>(static_cast<float>(u(gen)));
        for (ParameterStore<T>* st : {&plain, &offload})
          backend.upload(st->values_base(), values.data(), values.size() * sizeof(T));
        OptimizerOptions options = base;
        options.offload_bucket = bucket;
        auto on_backend = make_optimizer(base, plain, range);
        const std::size_t device0 = backend.allocated_bytes(),
                          host0 = backend.host_allocated_bytes();
        auto offloaded = make_optimizer(options, offload, range);
        EXPECT_TRUE(offloaded->offloaded());
        EXPECT_FALSE(on_backend->offloaded());
        const std::size_t buffers =
            offloaded->state_names().size() + (std::is_same_v<T, M> ? 0 : 1);
        EXPECT_EQ(backend.allocated_bytes() - device0, offload_staging_bytes<T>(options));
        EXPECT_EQ(offload_staging_bytes<T>(options),
                  2 * buffers * Arena::rounded(static_cast<std::size_t>(bucket) * sizeof(M)));
        EXPECT_EQ(backend.host_allocated_bytes() - host0,
                  buffers * Arena::rounded(static_cast<std::size_t>(offloaded->state_elements()) *
                                           sizeof(M)));
        const index_t n = offloaded->state_elements();
        for (int step = 0; step < 3; ++step) {
          for (T& g : grads) g = static_cast<T>(static_cast<float>(u(gen)));
          for (ParameterStore<T>* st : {&plain, &offload})
            backend.upload(st->grads_base(), grads.data(), grads.size() * sizeof(T));
          on_backend->step(1e-2);
          offloaded->step(1e-2);
          EXPECT_EQ(host_copy(offload.values_base(), 53), host_copy(plain.values_base(), 53))
              << "step " << step;
          for (std::size_t k = 0; k < offloaded->state_names().size(); ++k)
            EXPECT_EQ(host_copy(offloaded->state(k), n), host_copy(on_backend->state(k), n))
                << offloaded->state_names()[k] << ", step " << step;
          if constexpr (!std::is_same_v<T, M>) {
            EXPECT_EQ(host_copy(offloaded->master(), n), host_copy(on_backend->master(), n))
                << "master, step " << step;
          }
        }
        if constexpr (!std::is_same_v<T, M>) {  // refresh_master through the buckets
          for (T& v : values) v = static_cast<T>(static_cast<float>(u(gen)));
          for (ParameterStore<T>* st : {&plain, &offload})
            backend.upload(st->values_base(), values.data(), values.size() * sizeof(T));
          on_backend->refresh_master();
          offloaded->refresh_master();
          EXPECT_EQ(host_copy(offloaded->master(), n), host_copy(on_backend->master(), n));
        }
      }
  EXPECT_THROW(make_optimizer<T>({.offload_bucket = -1}, plain), Error);
}

TEST(Optimizer, OffloadedStepsAsOnBackend) {
  offloaded_optimizer_steps_as_on_backend<double>();
  offloaded_optimizer_steps_as_on_backend<float>();
}
TEST(OptimizerBf16, OffloadedStepsAsOnBackend) {
  offloaded_optimizer_steps_as_on_backend<bf16>();
}

// The fp32 kernels against the same formulas in double (relative error of
// the update ~ a few float ulps); and a float model's SGD step against the
// serial reference at the float model tolerance.
TEST(Optimizer, FloatKernelsAndModel) {
  std::mt19937_64 gen(fresh_seed());
  std::normal_distribution<double> normal;
  const index_t n = 1000;
  std::vector<float> p(n), g(n), m(n), v(n);
  for (index_t i = 0; i < n; ++i) {
    p[static_cast<std::size_t>(i)] = static_cast<float>(normal(gen));
    g[static_cast<std::size_t>(i)] = static_cast<float>(normal(gen));
  }
  std::vector<double> pd(p.begin(), p.end()), gd(g.begin(), g.end()), md(n), vd(n);
  optim::AdamWCoefficients c{.lr = 1e-2,
                             .weight_decay = 0.1,
                             .beta1 = 0.9,
                             .beta2 = 0.95,
                             .eps = 1e-8,
                             .step_size = 1e-2 / (1 - 0.9),
                             .bias_correction2_sqrt = std::sqrt(1 - 0.95)};
  optim::adamw_update(p.data(), g.data(), m.data(), v.data(), n, c);
  optim::adamw_update(pd.data(), gd.data(), md.data(), vd.data(), n, c);
  EXPECT_LE(rel_error(p, pd), 1e-6);
  EXPECT_LE(rel_error(m, md), 1e-6);
  EXPECT_LE(rel_error(v, vd), 1e-6);
  EXPECT_NEAR(optim::sum_of_squares(g.data(), n), optim::sum_of_squares(gd.data(), n), 0);

  const reference::GptConfig config = test_config();
  const SchemeSpec spec = schemes_for(world_size()).back();
  SCOPED_TRACE(spec.str());
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 ids_gen(seed);
  const index_t batch = batch_for(spec);
  const Ids ids = random_ids(batch, config.vocab_size, ids_gen);
  reference::Gpt<double> ref(config, seed);
  ref.forward(ids.tokens, ids.targets, batch, kSeq);
  ref.backward();
  const auto owned = make_run<float>(spec, config, batch);
  ParallelGpt<float>& run = *owned;
  run.model().init(seed);
  run.model().forward(ids.tokens, ids.targets);
  run.model().backward();
  const OptimizerOptions options{.kind = "sgd", .momentum = 0.9, .weight_decay = 0.01};
  auto opt = make_optimizer(options, run.model().parameters_store());
  opt->step(0.1);
  SerialOptimizer serial(options);
  serial.step(ref, 0.1);
  double worst = 0;
  for (Param<float>* param : run.model().parameters_store().params())
    worst =
        std::max(worst, rel_error(gather_global(*param, run.grid()), ref.param(param->shard.name)));
  EXPECT_LE(max_over_ranks(worst), model_tolerance<float>());
  EXPECT_EQ(replica_mismatches(run.model(), run.grid()), 0);
}

// ---------------------------------------------------------------- bf16 (fp32 master weights)

// A ParameterStore<S> on the test backend over copies of the parameters of
// `layout` (a real scheme's shards: pieces, owners and replicas), so that a
// bf16 store and a float store with identical layouts can be stepped side by
// side without a bf16 model.
template <class S>
struct CopiedStore {
  std::vector<Param<S>> params;
  std::unique_ptr<ParameterStore<S>> store;

  explicit CopiedStore(const ParameterStore<float>& layout) : params(layout.params().size()) {
    std::vector<Param<S>*> pointers;
    for (std::size_t k = 0; k < params.size(); ++k) {
      params[k].shard = layout.params()[k]->shard;
      pointers.push_back(&params[k]);
    }
    store = std::make_unique<ParameterStore<S>>(test_backend(), pointers);
  }
  // Every local element (owner or replica) of every piece set from `global`
  // (one host vector per parameter, bf16-representable floats): values, or
  // gradients with `grad`. Elements outside the pieces get 0.
  void set(const std::vector<std::vector<float>>& global, bool grad) {
    set_from_global<S>(params, global, grad);
  }
};

// One bf16-representable normal deviate times `scale` per global element of
// every parameter (the same on every rank: drawn from `gen` in order).
std::vector<std::vector<float>> random_globals(const ParameterStore<float>& layout, double scale,
                                               std::mt19937_64& gen) {
  std::normal_distribution<double> normal;
  std::vector<std::vector<float>> out;
  for (const Param<float>* p : layout.params()) {
    std::vector<float> v(static_cast<std::size_t>(p->shard.global_size()));
    for (float& x : v) x = float(bf16(scale * normal(gen)));
    out.push_back(std::move(v));
  }
  return out;
}

// Elements where a and b differ bit for bit (exact), or by more than
// `tol` relative to max(|b|, floor).
long differing(const std::vector<float>& a, const std::vector<float>& b, double tol, double floor,
               double& worst) {
  long bad = 0;
  for (std::size_t k = 0; k < b.size(); ++k) {
    const double err =
        std::abs(double(a[k]) - double(b[k])) / std::max(std::abs(double(b[k])), floor);
    worst = std::max(worst, std::isfinite(err) ? err : 1e300);
    if (tol == 0 ? std::memcmp(&a[k], &b[k], sizeof(float)) != 0 : !(err <= tol)) ++bad;
  }
  return bad;
}

// Optimizer<bf16> against Optimizer<float> on the same layout, from the same
// bf16-representable values and fed the same bf16-representable gradients
// for several steps: the bf16 optimizer's fp32 master is updated by the same
// fp32 arithmetic as the float optimizer's values, so master == float values
// and the state slots agree bit for bit (CpuBackend: both run the same
// formulas compiled without FP contraction); every bf16 parameter ==
// bf16(master) bit for bit. On a GPU the two kernels may contract
// multiply-adds differently: there the master must agree within 8 fp32
// epsilons relative to max(|value|, 1e-3) after the steps (each step's update
// is ~lr, rounded a few times), and the bf16 rounding of the master is still
// exact. A bug such as updating the bf16 values instead of the master (the
// update of ~1e-3 is below bf16's resolution for values ~1) would be off by
// ~lr, i.e. 1e5 times these tolerances.
void bf16_matches_float(const OptimizerOptions& options) {
  const reference::GptConfig config = test_config();
  const LrSchedule schedule{.lr = 5e-3, .warmup = 2, .total = 5, .min_lr = 1e-3};
  const bool exact = !test_backend().asynchronous();
  const double tol = exact ? 0.0 : 8 * std::numeric_limits<float>::epsilon();
  double worst = 0;
  int tested = 0;
  for (const SchemeSpec& spec : representative_schemes(world_size())) {
    SCOPED_TRACE(spec.str());
    const std::uint64_t seed = fresh_seed();
    SCOPED_TRACE(seed_note(seed));
    std::mt19937_64 gen(seed);
    const auto owned = make_run<float>(spec, config, batch_for(spec));
    const ParameterStore<float>& layout = owned->model().parameters_store();
    CopiedStore<float> f32(layout);
    CopiedStore<bf16> b16(layout);
    const auto values = random_globals(layout, 1.0, gen);
    f32.set(values, false);
    b16.set(values, false);
    auto opt32 = make_optimizer(options, *f32.store);
    auto opt16 = make_optimizer(options, *b16.store);
    EXPECT_EQ(opt32->master(), nullptr) << "float parameters are their own master";
    const index_t n = b16.store->local_elements();
    ASSERT_EQ(opt16->master() == nullptr, n == 0);
    // the master starts as the parameters, widened
    EXPECT_EQ(host_copy(opt16->master(), n), host_copy(f32.store->values_base(), n));
    for (std::int64_t step = 0; step < 5; ++step) {
      const auto grads = random_globals(layout, 1.0, gen);
      f32.set(grads, true);
      b16.set(grads, true);
      opt32->step(schedule.at(step));
      opt16->step(schedule.at(step));
    }
    const std::vector<float> master = host_copy(opt16->master(), n);
    const std::vector<float> want = host_copy(f32.store->values_base(), n);
    long bad = differing(master, want, tol, 1e-3, worst);
    for (std::size_t slot = 0; slot < opt16->state_names().size(); ++slot)
      bad += differing(host_copy(opt16->state(slot), n), host_copy(opt32->state(slot), n), tol,
                       1e-3, worst);
    // the bf16 parameters are the master rounded once
    const std::vector<bf16> params = host_copy(b16.store->values_base(), n);
    for (std::size_t k = 0; k < params.size(); ++k)
      if (params[k].bits != bf16(master[k]).bits) ++bad;
    // and the updates were not lost to bf16 resolution: the master moved
    // away from its bf16 rounding somewhere
    long off_grid = 0;
    for (std::size_t k = 0; k < params.size(); ++k)
      if (float(params[k]) != master[k]) ++off_grid;
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &off_grid, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    EXPECT_EQ(bad, 0) << "worst relative difference " << worst;
    EXPECT_GT(off_grid, 0);
    EXPECT_EQ(opt16->steps(), 5);
    ++tested;
  }
  testing::Test::RecordProperty("schemes", tested);
  testing::Test::RecordProperty("worst_master_vs_f32",
                                fmt::format("{:.3g}", max_over_ranks(worst)));
}

TEST(OptimizerBf16, AdamWMasterMatchesFloat) {
  bf16_matches_float({.kind = "adamw", .beta1 = 0.9, .beta2 = 0.95, .weight_decay = 0.1});
}
TEST(OptimizerBf16, SgdMomentumDecayMasterMatchesFloat) {
  bf16_matches_float({.kind = "sgd", .momentum = 0.9, .weight_decay = 0.05, .decay_vectors = true});
}
TEST(OptimizerBf16, SgdNesterovMasterMatchesFloat) {
  bf16_matches_float({.kind = "sgd", .momentum = 0.8, .nesterov = true, .weight_decay = 0.01});
}

// refresh_master(): parameter values written outside the optimizer (as an HF
// import does) become the master; without it the next step would start from
// the stale master.
TEST(OptimizerBf16, RefreshMasterAfterExternalWrite) {
  const reference::GptConfig config = test_config();
  const SchemeSpec spec = schemes_for(world_size()).back();
  SCOPED_TRACE(spec.str());
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  const auto owned = make_run<float>(spec, config, batch_for(spec));
  const ParameterStore<float>& layout = owned->model().parameters_store();
  CopiedStore<bf16> b16(layout);
  CopiedStore<float> f32(layout);
  b16.set(random_globals(layout, 1.0, gen), false);
  auto opt = make_optimizer<bf16>({.kind = "sgd", .momentum = 0.0}, *b16.store);
  const auto edited = random_globals(layout, 1.0, gen);
  b16.set(edited, false);
  f32.set(edited, false);
  const index_t n = b16.store->local_elements();
  EXPECT_NE(host_copy(opt->master(), n), host_copy(f32.store->values_base(), n))
      << "the master is a copy, not the parameters";
  opt->refresh_master();
  EXPECT_EQ(host_copy(opt->master(), n), host_copy(f32.store->values_base(), n));
}

// clip_grad_norm / global_norm_sq on a bf16 store against plain double loops
// over the global gradients: the norm sums the same widened squares in
// double in another order (relative 1e-12, as for double stores); clipping
// rounds float(g)·float(c) to bf16 once per element, which the reference does
// the same way: exact.
TEST(OptimizerBf16, ClipGradNormMatchesDoubleReference) {
  const reference::GptConfig config = test_config();
  int tested = 0;
  for (const SchemeSpec& spec : representative_schemes(world_size())) {
    SCOPED_TRACE(spec.str());
    const std::uint64_t seed = fresh_seed();
    SCOPED_TRACE(seed_note(seed));
    std::mt19937_64 gen(seed);
    const auto owned = make_run<float>(spec, config, batch_for(spec));
    const ParameterStore<float>& layout = owned->model().parameters_store();
    ProcessGrid& grid = owned->grid();
    CopiedStore<bf16> b16(layout);
    const auto grads = random_globals(layout, 0.5, gen);
    b16.set(grads, true);
    double ref_sq = 0;
    for (const auto& g : grads)
      for (float x : g) ref_sq += double(x) * double(x);
    const double ref_norm = std::sqrt(ref_sq);
    EXPECT_NEAR(global_norm_sq(*b16.store, grid), ref_sq, 1e-12 * ref_sq);
    EXPECT_NEAR(clip_grad_norm(*b16.store, grid, 2 * ref_norm), ref_norm, 1e-12 * ref_norm);
    const double norm = clip_grad_norm(*b16.store, grid, ref_norm / 3);
    EXPECT_NEAR(norm, ref_norm, 1e-12 * ref_norm);
    const auto factor = static_cast<float>((ref_norm / 3) / (norm + 1e-6));
    long bad = 0;
    for (std::size_t k = 0; k < b16.params.size(); ++k) {
      const Param<bf16>& p = b16.params[k];
      if (!p.held()) continue;
      const std::vector<bf16> got = local_host(p, true);
      const ParamShard& s = p.shard;
      for (const ShardPiece& piece : s.pieces)
        for (index_t r = 0; r < piece.rows; ++r)
          for (index_t c = 0; c < piece.cols; ++c) {
            const float g = grads[k][static_cast<std::size_t>(
                (piece.global_row + r) * s.global_cols() + piece.global_col + c)];
            const bf16 local = got[static_cast<std::size_t>((piece.local_row + r) * s.local_cols +
                                                            piece.local_col + c)];
            if (local.bits != bf16(g * factor).bits) ++bad;
          }
    }
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    EXPECT_EQ(bad, 0);
    // gather_global<bf16> assembles the clipped tensors
    for (std::size_t k = 0; k < b16.params.size(); ++k) {
      const std::vector<bf16> global = gather_global(b16.params[k], grid, true);
      long off = 0;
      for (std::size_t e = 0; e < global.size(); ++e)
        if (global[e].bits != bf16(grads[k][e] * factor).bits) ++off;
      EXPECT_EQ(off, 0) << b16.params[k].shard.name;
    }
    ++tested;
  }
  RecordProperty("schemes", tested);
}

// ---------------------------------------------------------------- backend seam ops

// Count of elements where |got - want| > tol · max(|want|, 1); worst: the largest ratio.
template <class T>
long count_off(const std::vector<T>& got, const std::vector<T>& want, double tol, double& worst) {
  long bad = 0;
  for (std::size_t k = 0; k < want.size(); ++k) {
    const double w = want[k], scale = std::max(1.0, std::abs(w));
    const double err = std::abs(static_cast<double>(got[k]) - w) / scale;
    if (!(err <= tol)) ++bad;
    worst = std::max(worst, std::isfinite(err) ? err : 1e300);
  }
  return bad;
}

// Backend::adamw_update / sgd_update / sum_of_squares / scale_in_place (the
// seam Optimizer and clip_grad_norm call) against the summa::optim reference
// formulas, in T, on fresh random data of an odd length (parameters, moments
// and gradients ~ N(0, 1), second moments = N(0, 1)², weight decay on).
//
// Tolerances: CpuBackend runs these very functions, so it must agree bit for
// bit (0). A device backend's kernels evaluate the same formulas in T with
// their own rounding (fused multiply-adds; IEEE sqrt and division): every
// element within 8 units of T's epsilon relative to max(|want|, 1) (the
// update is a sum of terms of size <= ~1 here, each rounded a few times).
// sum_of_squares accumulates in double in another order: 1e-12 relative
// (~n·2⁻⁵³ ≈ 1e-13 worst case for n ~ 1000). scale_in_place is one correctly
// rounded product per element by the factor rounded to T: exact on both.
template <class T>
void backend_ops_match_reference() {
  Backend& backend = test_backend();
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> normal;
  std::uniform_int_distribution<index_t> length(900, 1100);
  const index_t n = length(gen) | 1;
  const auto random = [&](bool square) {
    std::vector<T> v(static_cast<std::size_t>(n));
    for (T& x : v) {
      const double z = normal(gen);
      x = static_cast<T>(square ? z * z : z);
    }
    return v;
  };
  const bool exact = backend.host_accessible();
  const double tol = exact ? 0.0 : 8 * std::numeric_limits<T>::epsilon();
  const std::vector<T> p0 = random(false), g = random(false), m0 = random(false), v0 = random(true);
  double worst = 0;

  // AdamW at step t = 3
  {
    const double lr = 1e-2, b1 = 0.9, b2 = 0.95, t = 3;
    const optim::AdamWCoefficients c{.lr = lr,
                                     .weight_decay = 0.1,
                                     .beta1 = b1,
                                     .beta2 = b2,
                                     .eps = 1e-8,
                                     .step_size = lr / (1 - std::pow(b1, t)),
                                     .bias_correction2_sqrt = std::sqrt(1 - std::pow(b2, t))};
    std::vector<T> p = p0, m = m0, v = v0;
    optim::adamw_update(p.data(), g.data(), m.data(), v.data(), n, c);
    DeviceArray<T> dp(p0), dg(g), dm(m0), dv(v0);
    backend.adamw_update(dp.data(), dg.data(), dm.data(), dv.data(), n, c);
    EXPECT_EQ(count_off(dp.download(), p, tol, worst), 0) << "adamw param, worst " << worst;
    EXPECT_EQ(count_off(dm.download(), m, tol, worst), 0) << "adamw exp_avg, worst " << worst;
    EXPECT_EQ(count_off(dv.download(), v, tol, worst), 0) << "adamw exp_avg_sq, worst " << worst;
    EXPECT_EQ(count_off(dg.download(), g, 0.0, worst), 0) << "adamw wrote the gradient";
  }
  // SGD with momentum, plain and Nesterov
  for (const bool nesterov : {false, true}) {
    SCOPED_TRACE(nesterov ? "nesterov" : "momentum");
    const optim::SgdCoefficients c{
        .lr = 0.05, .weight_decay = 0.01, .momentum = 0.9, .nesterov = nesterov};
    std::vector<T> p = p0, b = m0;
    optim::sgd_update(p.data(), g.data(), b.data(), n, c);
    DeviceArray<T> dp(p0), dg(g), db(m0);
    backend.sgd_update(dp.data(), dg.data(), db.data(), n, c);
    EXPECT_EQ(count_off(dp.download(), p, tol, worst), 0) << "sgd param, worst " << worst;
    EXPECT_EQ(count_off(db.download(), b, tol, worst), 0) << "sgd buffer, worst " << worst;
  }
  // Σ x², and x · factor
  {
    DeviceArray<T> dx(g);
    const double want = optim::sum_of_squares(g.data(), n);
    const double got = backend.sum_of_squares(dx.data(), n);
    if (exact)
      EXPECT_EQ(got, want);
    else
      EXPECT_NEAR(got, want, 1e-12 * want);
    const double factor = 0.5 + std::abs(normal(gen));
    std::vector<T> x = g;
    optim::scale_in_place(x.data(), n, factor);
    backend.scale_in_place(dx.data(), n, factor);
    EXPECT_EQ(dx.download(), x) << "scale_in_place by " << factor;
    // an empty range is a no-op
    EXPECT_EQ(backend.sum_of_squares(dx.data(), 0), 0.0);
  }
  testing::Test::RecordProperty(std::is_same_v<T, float> ? "worst_f32" : "worst_f64",
                                fmt::format("{:.3g}", worst));
}

TEST(Optimizer, BackendOpsMatchReferenceFloat) {
  backend_ops_match_reference<float>();
}
TEST(Optimizer, BackendOpsMatchReferenceDouble) {
  backend_ops_match_reference<double>();
}

// ---------------------------------------------------------------- allocation

TEST(Optimizer, StepAndClipAllocateNothing) {
  if (!allocation_counting_available()) GTEST_SKIP() << "allocation counting unavailable (ASan)";
  if (test_backend().asynchronous())
    GTEST_SKIP() << "the CUDA runtime allocates host memory internally: allocation counting "
                    "runs on the CPU backend";
  const reference::GptConfig config = test_config();
  for (const SchemeSpec& spec : representative_schemes(world_size())) {
    SCOPED_TRACE(spec.str());
    std::mt19937_64 gen(fresh_seed());
    const index_t batch = batch_for(spec);
    const Ids ids = random_ids(batch, config.vocab_size, gen);
    const auto owned = make_run<float>(spec, config, batch);
    ParallelGpt<float>& run = *owned;
    auto& store = run.model().parameters_store();
    run.model().init(1);
    run.model().forward(ids.tokens, ids.targets);
    run.model().backward();
    for (const index_t offload : {index_t{0}, index_t{100}})
      for (const char* kind : {"adamw", "sgd"}) {
        auto opt = make_optimizer<float>({.kind = kind, .offload_bucket = offload}, store);
        clip_grad_norm(store, run.grid(), 1.0);  // warm-up
        opt->step(1e-3);
        std::uint64_t count = 0;
        std::string caller;
        {
          CountAllocations counter;
          const double norm = clip_grad_norm(store, run.grid(), 0.5);
          global_norm_sq(store, run.grid());
          opt->step(1e-3);
          count = counter.count();
          caller = counter.first_caller();
          EXPECT_TRUE(std::isfinite(norm));
        }
        EXPECT_EQ(count, 0u) << kind << ", offload " << offload << ": first allocation from "
                             << caller;
      }
    // bf16 parameters with fp32 master weights, on the same layout
    CopiedStore<bf16> b16(store);
    b16.set(random_globals(store, 1.0, gen), false);
    b16.set(random_globals(store, 1.0, gen), true);
    for (const index_t offload : {index_t{0}, index_t{100}})
      for (const char* kind : {"adamw", "sgd"}) {
        auto opt = make_optimizer<bf16>({.kind = kind, .offload_bucket = offload}, *b16.store);
        clip_grad_norm(*b16.store, run.grid(), 1.0);  // warm-up
        opt->step(1e-3);
        std::uint64_t count = 0;
        std::string caller;
        {
          CountAllocations counter;
          const double norm = clip_grad_norm(*b16.store, run.grid(), 0.5);
          global_norm_sq(*b16.store, run.grid());
          opt->step(1e-3);
          opt->refresh_master();
          count = counter.count();
          caller = counter.first_caller();
          EXPECT_TRUE(std::isfinite(norm));
        }
        EXPECT_EQ(count, 0u) << kind << " (bf16), offload " << offload << ": first allocation from "
                             << caller;
      }
  }
}

}  // namespace
}  // namespace summa::test

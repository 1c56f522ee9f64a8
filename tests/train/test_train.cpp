// Training end to end (summa::Trainer) against an independent serial oracle:
// reference::Gpt<double> trained by a plain AdamW / clipping loop written
// here (PyTorch semantics), on the same batches from io::TokenLoader.
//
//  - TrainingMatchesSerialReference: ten AdamW steps (warm-up + cosine,
//    weight decay, clipping) under every scheme the world size runs —
//    serial (1 rank), 2D q=2, 1D p=4, 3D 2x1x2 (4 ranks), data x 2D and
//    data x 3D (8 ranks) — give the reference's loss curve, gradient norms
//    and final weights.
//  - ReshardedResumeContinuesTheCurve (4 ranks): two steps each under 2D
//    2x2 -> 1D p=4 -> 3D 2x1x2 -> serial (one rank), saving and resuming
//    through sharded checkpoints in between, give the uninterrupted curve.
//  - Mismatched resumes (model shape, optimizer, data seed) throw on every rank.
//  - A sharded data axis (data=D:zero=1 and zero=2) trains as the unsharded
//    one, under every scheme with a data axis the world size runs (3D with
//    its deferred gradients too), in double and bf16: every loss, gradient
//    norm and final weight over 20 steps (bf16: 10) within 1e-12 relative
//    (zero=1: each element's update is the same arithmetic on whichever rank
//    makes it, so in practice they are equal; zero=2 with more than 2 data
//    groups in bf16 on a device backend: 5e-2, see
//    sharded_trains_as_unsharded); its data-axis
//    bytes equal predict_step_traffic; its checkpoints resume under any
//    level and data size.
//
// Tolerance (double): 1e-9 relative on losses and norms, 1e-8 on weights —
// the reference and the distributed model sum in different orders, and ten
// Adam steps amplify rounding (the update divides by sqrt(v)).
//
// Backend: test_backend() and its communicators test_grid_options()
// (SUMMA_TEST_BACKEND=cpu|cuda; TrainerOptions::grid). The model computes in
// double on either, so the tolerances hold unchanged on CUDA. There, a
// device backend with the default (MPI) communicators must be refused too.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "summa/summa.hpp"
#include "test_util.hpp"

namespace {

using namespace summa;
using namespace summa::test;
namespace fs = std::filesystem;

int world_size() {
  int s = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}
int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

TrainerOptions options_for(const std::string& scheme, std::uint64_t seed) {
  TrainerOptions o;
  o.config.n_layer = 2;
  o.config.n_head = 4;
  o.config.n_embd = 16;
  o.config.n_positions = 8;
  o.config.vocab_size = 32;
  o.scheme = scheme;
  o.batch = 8;
  o.seq = 8;
  o.optimizer.kind = "adamw";
  o.optimizer.weight_decay = 0.1;
  o.schedule = {.lr = 1e-2, .warmup = 3, .total = 10, .min_lr = 1e-3};
  o.clip = 0.5;  // small enough to clip some steps
  o.init_seed = seed;
  o.data_seed = seed ^ 0x5eedULL;
  o.val_fraction = 0.1;
  o.grid = test_grid_options();
  return o;
}

// A learnable stream: mostly x' = x + 3 (mod vocab), one token in ten random.
std::vector<std::uint16_t> random_tokens(std::uint64_t seed, int vocab, std::size_t n) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int> d(0, vocab - 1), coin(0, 9);
  std::vector<std::uint16_t> t(n);
  int x = d(gen);
  for (auto& v : t) {
    x = coin(gen) == 0 ? d(gen) : (x + 3) % vocab;
    v = static_cast<std::uint16_t>(x);
  }
  return t;
}

// The serial oracle: reference::Gpt<double>, PyTorch-style AdamW, clipping.
struct Curve {
  std::vector<double> loss, norm;
  reference::Gpt<double> model;
};

Curve reference_curve(const TrainerOptions& o, const std::vector<std::uint16_t>& tokens,
                      int steps) {
  Curve c{.loss = {}, .norm = {}, .model = reference::Gpt<double>(o.config, o.init_seed)};
  io::TokenLoader loader(
      tokens, o.config.vocab_size,
      {.batch = o.batch, .seq = o.seq, .seed = o.data_seed, .val_fraction = o.val_fraction});
  const auto& info = c.model.parameter_info();
  std::vector<double> m(c.model.params().size(), 0.0), v(m.size(), 0.0);
  const double b1 = o.optimizer.beta1, b2 = o.optimizer.beta2, eps = o.optimizer.eps,
               wd = o.optimizer.weight_decay;
  for (int s = 0; s < steps; ++s) {
    const io::Batch b = loader.batch(s);
    c.loss.push_back(c.model.forward(b.tokens, b.targets, o.batch, o.seq));
    c.model.backward();
    std::span<double> g = c.model.grads(), p = c.model.params();
    double sq = 0;
    for (double x : g) sq += x * x;
    const double norm = std::sqrt(sq);
    c.norm.push_back(norm);
    if (o.clip > 0 && norm > o.clip)
      for (double& x : g) x *= o.clip / (norm + 1e-6);
    const double lr = o.schedule.at(s), t = s + 1;
    const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
    std::size_t k = 0;
    for (const reference::ParamInfo& pi : info) {
      const bool decay = pi.shape.size() == 2;
      for (index_t e = 0; e < pi.size(); ++e, ++k) {
        if (decay) p[k] *= 1 - lr * wd;
        m[k] = b1 * m[k] + (1 - b1) * g[k];
        v[k] = b2 * v[k] + (1 - b2) * g[k] * g[k];
        p[k] -= lr / bc1 * m[k] / (std::sqrt(v[k]) / std::sqrt(bc2) + eps);
      }
    }
  }
  return c;
}

// The message of the summa::Error `make` throws ("" if none).
template <class Make>
std::string error_of(Make make) {
  try {
    make();
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

double rel(double a, double b) {
  return std::abs(a - b) / std::max(std::abs(b), 1e-300);
}

// The schemes of `candidates` that run on this world size.
std::vector<std::string> runnable(std::initializer_list<const char*> candidates) {
  std::vector<std::string> out;
  for (const char* s : candidates)
    if (SchemeSpec::parse(s).ranks() == world_size()) out.push_back(s);
  return out;
}

// A fresh seed, the tokens and the serial reference curve over `steps`
// AdamW steps: what the curve tests compare every scheme with. Collective.
struct CurveCase {
  std::uint64_t seed;
  std::vector<std::uint16_t> tokens;
  Curve want;
};
CurveCase curve_case(int steps) {
  const std::uint64_t seed = fresh_seed();
  const TrainerOptions base = options_for("2d:q=1", seed);
  auto tokens = random_tokens(seed, base.config.vocab_size, 1500);
  Curve want = reference_curve(base, tokens, steps);
  return {seed, std::move(tokens), std::move(want)};
}

TEST(Train, TrainingMatchesSerialReference) {
  const auto schemes =
      runnable({"2d:q=1", "2d:q=2", "1d:p=4", "3d:2x1x2", "data=2,2d:q=2", "data=2,3d:2x1x2",
                "data=2,1d:p=2", "1d:p=4,dc=on", "data=2,1d:p=2,dc=on"});
  if (schemes.empty()) GTEST_SKIP() << "no listed scheme runs on " << world_size() << " ranks";
  const int steps = 10;
  const CurveCase c = curve_case(steps);
  SCOPED_TRACE(seed_note(c.seed));
  const Curve& want = c.want;
  for (const std::string& scheme : schemes) {
    SCOPED_TRACE(scheme);
    Trainer<double> t(MPI_COMM_WORLD, options_for(scheme, c.seed), test_backend(), c.tokens);
    for (int s = 0; s < steps; ++s) {
      const StepStats st = t.train_step();
      EXPECT_EQ(st.step, s);
      EXPECT_LE(rel(st.loss, want.loss[static_cast<std::size_t>(s)]), 1e-9) << "step " << s;
      EXPECT_LE(rel(st.grad_norm, want.norm[static_cast<std::size_t>(s)]), 1e-9) << "step " << s;
    }
    EXPECT_LT(want.loss.back(), want.loss.front());  // it trains
    for (Param<double>* p : t.model().parameters_store().params())
      EXPECT_LE(max_over_ranks(rel_error(gather_global(*p, t.parallel().grid()),
                                         want.model.param(p->shard.name))),
                1e-8)
          << p->shard.name;
  }
}

// A directory every rank agrees on (rank 0 picks it), removed at the end.
struct SharedTempDir {
  fs::path path;
  SharedTempDir() {
    std::uint64_t id = fresh_seed();
    MPI_Bcast(&id, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    path = fs::temp_directory_path() / ("summa_train_" + std::to_string(id));
    if (world_rank() == 0) fs::create_directories(path);
    MPI_Barrier(MPI_COMM_WORLD);
  }
  ~SharedTempDir() {
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) fs::remove_all(path);
  }
};

// The memory planner against the measured peak (issue: "the planner is the
// truth"). For the demo model (gpt_train's defaults: 4 layers, h 128, 4
// heads, seq 64, vocab 256, batch 16) under every scheme the configuration
// search considers at this rank count (candidate_schemes: sharded data axes
// and 1D's distributed checkpoints too), each recompute mode and bf16: a
// Trainer on its own CpuBackend, one step and a checkpoint, then the most
// that backend held at once (Backend::peak_allocated_bytes: every buffer the
// library allocates)
// against the plan (plan_memory's capacities plus the optimizer state per
// parameter element: AdamW's two moments, bf16's fp32 master too, over the
// data groups with zero=1). Within 2 % on every rank; the worst figure is
// printed (docs/memory.md, "The planner against the measured peak").
template <class T>
double planned_over_measured(const std::string& scheme, Recompute recompute,
                             const std::vector<std::uint16_t>& tokens, std::uint64_t seed,
                             index_t offload = 0, index_t batch = 16) {
  TrainerOptions o = options_for(scheme, seed);
  o.optimizer.offload_bucket = offload;
  o.config.n_layer = 4;
  o.config.n_head = 4;
  o.config.n_embd = 128;
  o.config.n_positions = 64;
  o.config.vocab_size = 256;
  o.batch = batch;
  o.seq = 64;
  o.gpt.recompute = recompute;
  CpuBackend backend;
  double measured = 0;
  std::size_t host_state = 0;  // offloaded: the state the host pool should hold
  {
    Trainer<T> t(MPI_COMM_WORLD, o, backend, tokens);
    static_cast<void>(t.train_step());
    // a checkpoint too: each data group writes its chunk of the state from
    // where it is (nothing gathered, nothing allocated on the backend or in
    // its host pool)
    {
      SharedTempDir dir;
      t.save(dir.path / "checkpoint");
    }
    measured = static_cast<double>(backend.peak_allocated_bytes());
    const Optimizer<T>& opt = t.optimizer();
    host_state =
        (opt.state_names().size() + (opt.master() != nullptr ? 1 : 0)) *
        Arena::rounded(static_cast<std::size_t>(opt.state_elements()) * sizeof(master_t<T>));
  }
  EXPECT_EQ(backend.allocated_bytes(), 0u) << "freed with the trainer";
  EXPECT_EQ(backend.host_allocated_bytes(), 0u) << "freed with the trainer";
  EXPECT_EQ(backend.host_peak_allocated_bytes(), offload > 0 ? host_state : 0u);
  const SchemeSpec spec = SchemeSpec::parse(scheme);
  CpuBackend planner;
  const MemoryReport plan = plan_memory<T>(MPI_COMM_WORLD, spec, planner, o.config, o.batch, o.seq,
                                           o.gpt, test_grid_options());
  EXPECT_EQ(planner.peak_allocated_bytes(), 0u) << "a plan allocates nothing";
  const double state_per_element = offload > 0
                                       ? 0.0
                                       : (std::is_same_v<T, bf16> ? 3.0 : 2.0) *
                                             sizeof(master_t<T>) / (spec.zero > 0 ? spec.data : 1);
  const double planned = static_cast<double>(plan.total()) +
                         static_cast<double>(plan.parameter_elements) * state_per_element +
                         static_cast<double>(offload_staging_bytes<T>(o.optimizer));
  return planned / measured;
}

// The same with the optimizer offloaded (OptimizerOptions::offload_bucket):
// the plan adds offload_staging_bytes in place of the per-element state, and
// the host pool holds exactly the state (checked in planned_over_measured),
// also after a checkpoint is saved (each data group writes its chunk from
// the host pool). At batch 4: the state and its staging do not depend on
// the batch.
TEST(Train, PlannerEqualsMeasuredPeakOffloaded) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  const auto tokens = random_tokens(seed, 256, 4000);
  const std::vector<SchemeSpec> list = candidate_schemes(world_size(), {});
  std::vector<SchemeSpec> cases{list.front(), list.back()};
  for (const SchemeSpec& s : list)  // and the first with a sharded data axis
    if (s.zero > 0) {
      cases.push_back(s);
      break;
    }
  for (const SchemeSpec& s : cases)
    for (const bool low : {false, true}) {
      SCOPED_TRACE(s.str() + (low ? " bf16" : " f32"));
      double ratio = 0;
      try {
        ratio = low ? planned_over_measured<bf16>(s.str(), Recompute::full, tokens, seed, 4096, 4)
                    : planned_over_measured<float>(s.str(), Recompute::full, tokens, seed, 4096, 4);
      } catch (const Error&) {  // a scheme that refuses the demo model (1D at 8 ranks)
        continue;
      }
      EXPECT_GE(-max_over_ranks(-ratio), 0.98);
      EXPECT_LE(max_over_ranks(ratio), 1.02);
    }
}

TEST(Train, PlannerEqualsMeasuredPeak) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  const auto tokens = random_tokens(seed, 256, 4000);
  struct Case {
    std::string scheme;
    Recompute recompute;
    bool bf16;
    index_t batch;
  };
  // Each recompute mode's first and last candidate on the demo model (batch
  // 16); at 4 ranks every other configuration too (the table,
  // docs/memory.md) at batch 4: the same buffers, a quarter of the
  // arithmetic (the checked build's CI time: 105 configurations took 474 s
  // at batch 16).
  std::vector<Case> cases;
  for (const Recompute r : {Recompute::full, Recompute::selective, Recompute::none}) {
    const std::vector<SchemeSpec> list = candidate_schemes(world_size(), {.recompute = r});
    for (const SchemeSpec& s : list) {
      const bool ends = s == list.front() || s == list.back();
      if (world_size() != 4 && !ends) continue;
      cases.push_back({s.str(), r, false, ends ? 16 : 4});
    }
  }
  const std::vector<SchemeSpec> all = schemes_for(world_size());
  cases.push_back({all.front().str(), Recompute::full, true, 16});
  cases.push_back({all.back().str(), Recompute::selective, true, 16});
  double worst = 0;
  std::string table;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.scheme + " " + std::string(to_string(c.recompute)) + (c.bf16 ? " bf16" : "") +
                 " batch " + std::to_string(c.batch));
    double ratio = 0;
    try {
      ratio = c.bf16
                  ? planned_over_measured<bf16>(c.scheme, c.recompute, tokens, seed, 0, c.batch)
                  : planned_over_measured<float>(c.scheme, c.recompute, tokens, seed, 0, c.batch);
    } catch (const Error& e) {  // a scheme that refuses the demo model, alike everywhere
      table += fmt::format("{:>28} {:>9} {} b{:<2}: refused ({})\n", c.scheme,
                           to_string(c.recompute), c.bf16 ? "bf16" : "f32 ", c.batch, e.what());
      continue;
    }
    const double lo = -max_over_ranks(-ratio), hi = max_over_ranks(ratio);
    EXPECT_GE(lo, 0.98);
    EXPECT_LE(hi, 1.02);
    worst = std::max({worst, std::abs(lo - 1), std::abs(hi - 1)});
    table += fmt::format("{:>28} {:>9} {} b{:<2}: planned/measured {:.4f}..{:.4f}\n", c.scheme,
                         to_string(c.recompute), c.bf16 ? "bf16" : "f32 ", c.batch, lo, hi);
  }
  if (world_rank() == 0)
    std::printf("%sworst |planned/measured - 1| over %zu cases: %.4f %%\n", table.c_str(),
                cases.size(), 100 * worst);
}

// bf16 training (bf16 parameters, activations and gradients; fp32 master
// weights and AdamW state) follows the double reference's curve: every
// step's loss and gradient norm within kBf16LossTol / kBf16NormTol relative. The model
// starts from bf16-rounded weights and every stored activation and gradient
// is rounded to bf16 (u = 2^-8), so the two runs drift apart slowly; the
// observed worst over 10 steps, ~50 seeds and 1, 4 and 8 ranks is 1.3e-3
// (loss) and 8.6e-2 (norm: late in the run the gradient is small and
// dominated by a few cancelling column-sum gradients) in the Release build;
// the checked build (-O1, sanitizers: other rounding of the fp32 paths)
// once gave 0.30 on the norm (seed 3536373092752973542, 3d:2x1x2 at 4 ranks,
// step 7; the Release build gives less with that seed). The bounds are
// about 4x the loss's and 1.3x that norm; a broken update or gradient is
// off by O(1) from the first steps.
constexpr double kBf16LossTol = 5e-3, kBf16NormTol = 0.4;

TEST(Train, Bf16FollowsTheReferenceCurve) {
  const auto schemes = runnable({"2d:q=1", "2d:q=2", "1d:p=4", "3d:2x1x2", "data=2,2d:q=2"});
  if (schemes.empty()) GTEST_SKIP() << "no listed scheme runs on " << world_size() << " ranks";
  const int steps = 10;
  const CurveCase c = curve_case(steps);
  SCOPED_TRACE(seed_note(c.seed));
  const Curve& want = c.want;
  for (const std::string& scheme : schemes) {
    SCOPED_TRACE(scheme);
    Trainer<bf16> t(MPI_COMM_WORLD, options_for(scheme, c.seed), test_backend(), c.tokens);
    for (int s = 0; s < steps; ++s) {
      const StepStats st = t.train_step();
      const auto k = static_cast<std::size_t>(s);
      EXPECT_LE(rel(st.loss, want.loss[k]), kBf16LossTol) << "step " << s;
      EXPECT_LE(rel(st.grad_norm, want.norm[k]), kBf16NormTol) << "step " << s;
    }
  }
}

TEST(Train, ReshardedResumeContinuesTheCurve) {
  if (world_size() != 4)
    GTEST_SKIP() << "the 2x2 -> 1D p=4 -> 3D 2x1x2 -> serial chain needs 4 ranks";
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  const TrainerOptions base = options_for("2d:q=1", seed);
  const auto tokens = random_tokens(seed, base.config.vocab_size, 1500);
  const Curve want = reference_curve(base, tokens, 8);
  SharedTempDir dir;
  const fs::path root = dir.path / "ckpt";
  Backend& backend = test_backend();
  const auto check = [&](const StepStats& st) {
    EXPECT_LE(rel(st.loss, want.loss[static_cast<std::size_t>(st.step)]), 1e-9)
        << "step " << st.step;
  };
  std::int64_t step = 0;
  for (const char* scheme : {"2d:q=2", "1d:p=4", "3d:2x1x2"}) {
    SCOPED_TRACE(scheme);
    Trainer<double> t(MPI_COMM_WORLD, options_for(scheme, seed), backend, tokens);
    if (step > 0) t.load(root);
    EXPECT_EQ(t.step(), step);
    check(t.train_step());
    check(t.train_step());
    t.save(root);
    step = t.step();
  }
  // The last leg on one rank (its own communicator); the others wait.
  MPI_Comm solo;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() == 0 ? 0 : MPI_UNDEFINED, 0, &solo);
  if (solo != MPI_COMM_NULL) {
    Trainer<double> t(solo, options_for("2d:q=1", seed), backend, tokens);
    t.load(root);
    EXPECT_EQ(t.step(), 6);
    check(t.train_step());
    check(t.train_step());
    for (Param<double>* p : t.model().parameters_store().params())
      EXPECT_LE(rel_error(gather_global(*p, t.parallel().grid()), want.model.param(p->shard.name)),
                1e-8)
          << p->shard.name;
    MPI_Comm_free(&solo);
  }
  MPI_Barrier(MPI_COMM_WORLD);

  // Resuming into a different model, optimizer or data stream is refused on
  // every rank, naming what differs.
  const auto refused = [&](TrainerOptions o, const std::string& needle) {
    const std::string msg = error_of([&] {
      Trainer<double> t(MPI_COMM_WORLD, o, backend, tokens);
      t.load(root);
    });
    EXPECT_NE(msg.find(needle), std::string::npos) << "'" << msg << "' lacks '" << needle << "'";
    EXPECT_TRUE(same_on_all_ranks(msg)) << msg;
  };
  TrainerOptions wide = options_for("2d:q=2", seed);
  wide.config.n_embd = 32;
  refused(wide, "config");
  TrainerOptions sgd = options_for("2d:q=2", seed);
  sgd.optimizer.kind = "sgd";
  refused(sgd, "optimizer");
  TrainerOptions other_data = options_for("2d:q=2", seed);
  other_data.data_seed += 1;
  refused(other_data, "data_seed");
}

// Every parameter of `t`'s model gathered whole (global_shape order), a
// zero=3 store's values gathered over the data axis first.
template <class T>
std::vector<std::vector<T>> global_weights(Trainer<T>& t) {
  ParameterStore<T>& store = t.model().parameters_store();
  const typename ParameterStore<T>::WholeValues whole(store, false);
  std::vector<std::vector<T>> w;
  for (Param<T>* p : store.params()) w.push_back(gather_global(*p, t.parallel().grid()));
  return w;
}

// A bf16 run resumed from its checkpoint continues bit-identically (same
// scheme and ranks, so the same arithmetic): the checkpoint holds the fp32
// master weights and AdamW state. Saving the bf16 values instead would round
// the master by up to 2^-9 relative and change every later update.
// A sharded data axis too (each data group saves and loads its chunk of the
// master and the state, the values gathered after; zero=3 keeps them
// sharded), with the state offloaded (host memory) in one case.
TEST(Train, Bf16ResumeIsExact) {
  const int ranks = world_size();
  std::vector<std::pair<std::string, index_t>> cases;  // scheme, offload bucket
  if (ranks == 1) cases = {{"2d:q=1", 0}};
  if (ranks == 4)
    cases = {{"2d:q=2", 0}, {"data=2:zero=2,1d:p=2", 0}, {"data=4:zero=1,2d:q=1", 53}};
  if (ranks == 8) cases = {{"data=2,2d:q=2", 0}, {"data=2:zero=3,2d:q=2", 0}};
  if (cases.empty()) GTEST_SKIP() << "no scheme listed for " << ranks << " ranks";
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  for (const auto& [scheme, offload] : cases) {
    SCOPED_TRACE(scheme + (offload > 0 ? ", offloaded" : ""));
    TrainerOptions o = options_for(scheme, seed);
    o.optimizer.offload_bucket = offload;
    const auto tokens = random_tokens(seed, o.config.vocab_size, 1500);
    Backend& backend = test_backend();
    SharedTempDir dir;
    const fs::path root = dir.path / "ckpt";
    std::vector<double> losses;
    std::vector<std::vector<bf16>> finals;
    {
      Trainer<bf16> t(MPI_COMM_WORLD, o, backend, tokens);
      for (int s = 0; s < 3; ++s) t.train_step();
      t.save(root);
      for (int s = 0; s < 3; ++s) losses.push_back(t.train_step().loss);
      finals = global_weights(t);
    }
    Trainer<bf16> t(MPI_COMM_WORLD, o, backend, tokens);
    t.load(root);
    EXPECT_EQ(t.step(), 3);
    for (double want : losses) EXPECT_EQ(t.train_step().loss, want);
    const auto resumed = global_weights(t);
    const auto& params = t.model().parameters_store().params();
    for (std::size_t k = 0; k < params.size(); ++k)
      EXPECT_EQ(rel_error(resumed[k], finals[k]), 0.0) << params[k]->shard.name;
  }
}

// A step whose loss or gradient norm is not finite never reaches the
// optimizer: with `stop` every rank throws the same error and the weights stay
// those of before it; with `skip` the step is reported as skipped, the weights
// are unchanged, and the (max_skipped_steps + 1)-th such step in a row throws.
// lr = 1e300 makes the first update finite but so large that the next
// forward pass overflows (fp64).
TEST(Train, NonFiniteStepStopsOrSkipsBeforeTheUpdate) {
  const int ranks = world_size();
  // A tensor axis of at most 4 (n_head) and the rest on the data axis.
  const int p = ranks % 4 == 0 ? 4 : ranks % 2 == 0 ? 2 : 1;
  const std::string scheme = "data=" + std::to_string(ranks / p) + ",1d:p=" + std::to_string(p);
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  TrainerOptions o = options_for(scheme, seed);
  o.schedule = {.lr = 1e300, .warmup = 0, .total = 10, .min_lr = 1e300};
  o.clip = 0;
  const auto tokens = random_tokens(seed, o.config.vocab_size, 1500);
  Backend& backend = test_backend();
  const auto weights = [](Trainer<double>& t) {
    std::vector<std::vector<double>> w;
    for (Param<double>* p : t.model().parameters_store().params())
      w.push_back(gather_global(*p, t.parallel().grid()));
    return w;
  };
  {
    Trainer<double> t(MPI_COMM_WORLD, o, backend, tokens);
    ASSERT_TRUE(std::isfinite(t.train_step().loss));
    const auto before = weights(t);
    const std::string msg = error_of([&] { t.train_step(); });
    EXPECT_NE(msg.find("step 2: the loss is"), std::string::npos) << msg;
    EXPECT_NE(msg.find("on_non_finite = skip"), std::string::npos) << msg;
    EXPECT_TRUE(same_on_all_ranks(msg)) << msg;
    EXPECT_EQ(weights(t), before);
  }
  o.on_non_finite = TrainerOptions::NonFinite::skip;
  o.max_skipped_steps = 2;
  Trainer<double> t(MPI_COMM_WORLD, o, backend, tokens);
  EXPECT_FALSE(t.train_step().skipped);
  const auto before = weights(t);
  for (int s = 0; s < 2; ++s) {
    const StepStats st = t.train_step();
    EXPECT_TRUE(st.skipped) << "step " << st.step;
    EXPECT_FALSE(std::isfinite(st.loss) && std::isfinite(st.grad_norm));
    EXPECT_EQ(weights(t), before);
  }
  EXPECT_EQ(t.step(), 3);
  const std::string msg = error_of([&] { t.train_step(); });
  EXPECT_NE(msg.find("after 2 skipped steps in a row (the limit)"), std::string::npos) << msg;
  EXPECT_TRUE(same_on_all_ranks(msg)) << msg;
  EXPECT_EQ(weights(t), before);
}

// `text` with its data axis sharded at `level` (zero=1, 2, 3).
std::string sharded(const std::string& text, int level = 1) {
  SchemeSpec s = SchemeSpec::parse(text);
  s.zero = level;
  return s.str();
}

// The data-axis schemes of every family the world size runs (with the batch
// of options_for), unsharded; at 9 ranks data=9 (with a batch of 9: see
// data_options; not in CTest, run by hand: mpirun -np 9).
std::vector<std::string> data_schemes() {
  return runnable({"data=2,2d:q=1", "data=2,1d:p=2", "data=4,2d:q=1", "data=2,3d:2x1x1",
                   "data=2,3d:1x1x2,overlap=oar+oag", "data=2,2d:q=2",
                   "data=2,3d:2x1x2,overlap=oar+ors", "data=2,1d:p=4", "data=8,2d:q=1",
                   "data=9,2d:q=1"});
}

// options_for(scheme), with a batch the data axis divides (9 for data=9).
TrainerOptions data_options(const std::string& scheme, std::uint64_t seed) {
  TrainerOptions o = options_for(scheme, seed);
  if (SchemeSpec::parse(scheme).data % 3 == 0) o.batch = 9;
  return o;
}

// Each sharding level (zero=1, 2, zero=2 with the optimizer offloaded:
// OptimizerOptions::offload_bucket, whose arithmetic is zero=2's, and zero=3,
// whose gathers copy the values and whose reduce-scatters are zero=2's) stepped
// beside one unsharded trainer. The schemes include 3D with OAG (zero=3
// gathers two blocks ahead) and with ORS (one gradient slot per block).
// zero=1 does the unsharded arithmetic (the same all-reduce, each element's
// update on one rank): equal within `tol` (1e-12; in practice equal).
// zero=2 reduce-scatters each unit's gradients instead of all-reducing them.
// Open MPI adds the groups' terms in the same order for both when the groups
// are a power of two (measured: the bf16 runs at 4 and 8 ranks are equal),
// so `tol` holds for it too. With 9 groups the order may differ: double
// stays within 1e-12, but bf16 (measured with the earlier per-chunk
// reduces) had norms 5.6e-4 apart after one step and weights drifting apart
// (0.07 to 0.7 relative after 10 steps), so the bf16 run skips data=9.
// NCCL's reduce-scatter and all-reduce may
// add in another order on any count (not with 2 groups, whose sum
// commutes): on a device backend bf16 then differs by its rounding,
// amplified by Adam, and `tol2` is 5e-2 on the loss and norm and 1.6e-2
// (2 bf16 ulps) on the weights (not yet run on a GPU).
template <class T>
void sharded_trains_as_unsharded(int steps) {
  constexpr bool low = std::is_same_v<T, bf16>;
  auto schemes = data_schemes();
  if (low)  // 9 groups: double only (see above)
    std::erase_if(schemes, [](const std::string& t) {
      const int data = SchemeSpec::parse(t).data;
      return (data & (data - 1)) != 0;
    });
  if (schemes.empty()) GTEST_SKIP() << "no data axis listed for " << world_size() << " ranks";
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  const auto tokens = random_tokens(seed, 32, 1500);
  Backend& backend = test_backend();
  constexpr double tol = 1e-12;
  for (const std::string& scheme : schemes) {
    SCOPED_TRACE(scheme);
    const int data = SchemeSpec::parse(scheme).data;
    const bool reordered = low && data > 2 && backend.asynchronous();
    const double tol2 = reordered ? 5e-2 : tol, weight_tol2 = reordered ? 1.6e-2 : tol;
    Trainer<T> plain(MPI_COMM_WORLD, data_options(scheme, seed), backend, tokens);
    std::vector<std::unique_ptr<Trainer<T>>> zero;
    // variant 3: zero=2 with the optimizer offloaded; 4: zero=3
    const auto level_of = [](int variant) { return variant == 4 ? 3 : std::min(variant, 2); };
    for (const int variant : {1, 2, 3, 4}) {
      const int level = level_of(variant);
      TrainerOptions o = data_options(sharded(scheme, level), seed);
      if (variant == 3) o.optimizer.offload_bucket = 37;  // cuts parameters and chunks
      zero.push_back(std::make_unique<Trainer<T>>(MPI_COMM_WORLD, o, backend, tokens));
      EXPECT_EQ(zero.back()->optimizer().offloaded(), variant == 3);
      // each data group keeps the state of its chunk only
      const SchemeSpec spec = SchemeSpec::parse(sharded(scheme, level));
      Trainer<T>& z = *zero.back();
      const ParameterStore<T>& store = z.model().parameters_store();
      EXPECT_EQ(store.padded_elements() % spec.data, 0);
      EXPECT_EQ(z.optimizer().state_elements(), store.padded_elements() / spec.data);
      EXPECT_EQ(z.optimizer().range().begin,
                z.parallel().grid().data().rank() * z.optimizer().state_elements());
      EXPECT_EQ(z.model().options().shard_gradients, level >= 2) << "variant " << variant;
      // zero=3: the values too (the store's chunk and slots)
      EXPECT_EQ(store.shards_values(), level == 3) << "variant " << variant;
      EXPECT_EQ(z.model().options().shard_parameters, level == 3) << "variant " << variant;
    }
    const auto label = [](std::size_t k) {
      return k == 2 ? std::string("zero=2, offloaded") : fmt::format("zero={}", k == 3 ? 3 : k + 1);
    };
    EXPECT_EQ(plain.optimizer().state_elements(),
              plain.model().parameters_store().local_elements());
    for (int s = 0; s < steps; ++s) {
      const StepStats a = plain.train_step();
      for (std::size_t k = 0; k < zero.size(); ++k) {
        Trainer<T>& z = *zero[k];
        const double t = k == 0 ? tol : tol2;
        ProcessGrid& grid = z.parallel().grid();
        grid.reset_traffic();
        const StepStats b = z.train_step();
        EXPECT_LE(rel(b.loss, a.loss), t) << label(k) << " step " << s;
        EXPECT_LE(rel(b.grad_norm, a.grad_norm), t) << label(k) << " step " << s;
        if (s == 0) {  // the data axis: forward, backward and the chunks' all-gather
          const TrafficCounters want = model::predict_step_traffic(
              z.parallel().spec(), z.options().config, z.options().batch, z.options().seq,
              z.options().gpt, dtype_v<T>, grid.coords());
          EXPECT_EQ(grid.traffic()[CommAxis::data].bytes_sent, want[CommAxis::data].bytes_sent)
              << label(k);
          EXPECT_EQ(grid.traffic()[CommAxis::data].bytes_received,
                    want[CommAxis::data].bytes_received)
              << label(k);
        }
      }
    }
    for (std::size_t k = 0; k < zero.size(); ++k) {
      ParameterStore<T>& store = zero[k]->model().parameters_store();
      const typename ParameterStore<T>::WholeValues whole(store, false);  // zero=3: gathered
      for (Param<T>* p : store.params())
        EXPECT_LE(max_over_ranks(
                      rel_error(gather_global(*p, zero[k]->parallel().grid()),
                                gather_global(plain.model().parameters_store().find(p->shard.name),
                                              plain.parallel().grid()))),
                  k == 0 ? tol : weight_tol2)
            << label(k) << " " << p->shard.name;
    }
  }
}

TEST(Train, ShardedDataAxisTrainsAsUnsharded) {
  sharded_trains_as_unsharded<double>(20);
}
TEST(Train, ShardedDataAxisTrainsAsUnshardedBf16) {
  sharded_trains_as_unsharded<bf16>(10);
}

// zero=2's and zero=3's gradients, step by step: a forward and backward,
// then another on other tokens accumulating (backward(true)), leave in each
// data group's chunk (its piece of every unit) what a zero=1 model
// (gradients whole) holds for those elements, within 1e-12 (a
// reduce-scatter against an all-reduce), and zero=2's AdamW steps on them
// zero=1's weights within the rounding Adam amplifies (below); the other groups' chunks are not
// held (grad_at throws). The second pair makes no heap allocation outside
// MPI (the CPU backend). Five blocks: backward gathers the blocks below the
// last two (three with OAG) again, and the two gradient slots are reused.
// zero=2's gradient arena is its chunk and the slots (the embedding's,
// LN_f's and two blocks', each padded to D pieces), smaller than the whole
// gradients (under 3D's ORS, whose deferred gradients are all in flight at
// once, every block has a slot); its values arena the whole values (room
// for the last unit's padding) and its chunk of them.
TEST(Train, ShardedGradientsAccumulateAsZeroOne) {
  auto schemes = data_schemes();
  std::erase_if(schemes, [](const std::string& t) { return SchemeSpec::parse(t).data == 9; });
  if (schemes.empty()) GTEST_SKIP() << "no data axis listed for " << world_size() << " ranks";
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  Backend& backend = test_backend();
  std::mt19937_64 gen(seed);
  for (const std::string& scheme : schemes)
    for (const int level : {2, 3}) {
      SCOPED_TRACE(sharded(scheme, level));
      TrainerOptions o = options_for(scheme, seed);
      o.config.n_layer = 5;  // backward gathers blocks again (beyond the 2 or 3 slots)
      const auto ids = [&] {
        std::uniform_int_distribution<int> d(0, o.config.vocab_size - 1);
        std::vector<std::int32_t> v(static_cast<std::size_t>(o.batch * o.seq));
        for (std::int32_t& x : v) x = d(gen);
        return v;
      };
      const std::vector<std::int32_t> t1 = ids(), y1 = ids(), t2 = ids(), y2 = ids();
      ParallelGpt<double> one(MPI_COMM_WORLD, SchemeSpec::parse(sharded(scheme, 1)), backend,
                              o.config, o.batch, o.seq, o.gpt, o.grid);
      ParallelGpt<double> z(MPI_COMM_WORLD, SchemeSpec::parse(sharded(scheme, level)), backend,
                            o.config, o.batch, o.seq, o.gpt, o.grid);
      ParameterStore<double>& a = one.model().parameters_store();
      ParameterStore<double>& b = z.model().parameters_store();
      const bool deferred = scheme.find("ors") != std::string::npos;  // 3D's ORS
      EXPECT_EQ(b.shards_values(), level == 3);
      EXPECT_TRUE(b.shards_gradients());
      one.model().init(seed);
      z.model().init(seed);
      const int data = z.grid().data().size(), d = z.grid().data().rank();
      const index_t chunk = b.padded_elements() / data, lo = d * chunk;
      if (level == 2) {
        // the chunk, then the slots: the embedding's, LN_f's, two blocks'
        // (every block has as many local elements; ORS: all five), each
        // padded to D pieces
        const auto count = [&](std::string_view prefix) {
          index_t n = 0;
          for (const Param<double>* p : b.params())
            if (p->shard.name.starts_with(prefix)) n += p->shard.local_size();
          return n;
        };
        const auto padded = [&](index_t n) { return (n + data - 1) / data * data; };
        const index_t block = count("h.0.");
        ByteCount<double> want;
        want.add(chunk).add(padded(count("wte.") + count("wpe."))).add(padded(count("ln_f.")));
        for (int k = 0; k < (deferred ? o.config.n_layer : 2); ++k) want.add(padded(block));
        EXPECT_EQ(b.grads().capacity(), want.bytes());
        if (!deferred) {
          EXPECT_LT(b.grads().capacity(), a.grads().capacity());
        }
        // the whole values, as far as a unit's gather reaches (its padded
        // pieces from its first element on), then the chunk
        index_t begin = 0, whole = b.local_elements();
        for (const index_t n :
             {count("wte.") + count("wpe."), block, block, block, block, block, count("ln_f.")}) {
          whole = std::max(whole, begin + padded(n));
          begin += n;
        }
        ByteCount<double> values;
        values.add(whole).add(chunk);
        EXPECT_EQ(b.values().capacity(), values.bytes());
      }
      // this group's chunk of the sharded gradients against the same
      // elements of zero=1's whole gradients, element by element through
      // the chunk's runs (ParameterStore::for_each_run)
      double grad_diff = 0;  // max |zero=level - zero=1| of a gradient, over the ranks
      const auto compare = [&](const char* what) {
        std::vector<double> ga, gb;
        for (std::size_t k = 0; k < b.params().size(); ++k)
          b.for_each_run(k, lo, chunk, [&](index_t x, index_t v, index_t n) {
            const std::size_t at = ga.size();
            ga.resize(at + static_cast<std::size_t>(n));
            gb.resize(ga.size());
            backend.download(ga.data() + at, a.grad_at(a.offset(k) + x),
                             static_cast<std::size_t>(n) * sizeof(double));
            backend.download(gb.data() + at, b.grad_at(v),
                             static_cast<std::size_t>(n) * sizeof(double));
          });
        // the runs cover the chunk but for each unit's padding
        index_t held = 0;
        b.for_each_piece([&](index_t, index_t, index_t kept, index_t) { held += kept; });
        EXPECT_EQ(static_cast<index_t>(ga.size()), held);
        EXPECT_LE(max_over_ranks(rel_error(gb, ga)), 1e-12) << what;
        double diff = 0;
        for (std::size_t i = 0; i < ga.size(); ++i) diff = std::max(diff, std::abs(gb[i] - ga[i]));
        grad_diff = max_over_ranks(diff);
      };
      const double l1 = one.model().forward(t1, y1);
      one.model().backward();
      z.grid().reset_traffic();
      const double lz = z.model().forward(t1, y1);
      z.model().backward();
      EXPECT_LE(rel(lz, l1), 1e-12);
      // the data axis's bytes: the gathers (the blocks below the slots
      // twice) and the reduces, as the model counts them
      const TrafficCounters want = model::predict_step_traffic(z.spec(), o.config, o.batch, o.seq,
                                                               o.gpt, DType::f64, z.grid().coords(),
                                                               /*optimizer_step=*/false);
      EXPECT_EQ(z.grid().traffic()[CommAxis::data].bytes_sent, want[CommAxis::data].bytes_sent);
      EXPECT_EQ(z.grid().traffic()[CommAxis::data].bytes_received,
                want[CommAxis::data].bytes_received);
      compare("one step");
      one.model().forward(t2, y2);
      one.model().backward(/*accumulate=*/true);
      std::uint64_t count = 0;
      std::string caller;
      {
        const bool counting = allocation_counting_available() && !backend.asynchronous();
        std::optional<CountAllocations> counter;
        if (counting) counter.emplace();
        z.model().forward(t2, y2);
        z.model().backward(/*accumulate=*/true);
        if (counting) {
          count = counter->count();
          caller = counter->first_caller();
        }
      }
      EXPECT_EQ(count, 0u) << "first allocation from " << caller;
      compare("accumulated");
      if (data > 1 && b.shards_gradients()) {
        const index_t other = d == 0 ? chunk + 1 : 0;  // outside [lo, lo + chunk]
        EXPECT_THROW(static_cast<void>(b.grad_at(other)), Error);
      }
      // an optimizer over a sharded store needs its chunk
      EXPECT_THROW(static_cast<void>(make_optimizer(OptimizerOptions{}, b)), Error);
      if (level == 3) continue;
      // zero=2: two AdamW steps on these gradients, then one all-gather,
      // leave the whole values zero=1's (the second step reads the chunk
      // the first wrote, not the whole values it has not yet reached)
      const OptimizerOptions adam;
      constexpr double lr = 1e-2;
      constexpr int steps = 2;
      const auto oa = make_optimizer(adam, a, data_chunk(a, d, data));
      const auto ob = make_optimizer(adam, b, data_chunk(b, d, data));
      for (const auto& opt : {oa.get(), ob.get()})
        for (int k = 0; k < steps; ++k) opt->step(lr);
      all_gather_updates(*oa, z.grid());
      all_gather_updates(*ob, z.grid());
      const auto n = static_cast<std::size_t>(b.local_elements());
      std::vector<double> va(n), vb(n);
      if (n > 0) {
        backend.download(va.data(), a.values_base(), n * sizeof(double));
        backend.download(vb.data(), b.values_base(), n * sizeof(double));
      }
      // The accumulated gradients differ by their summation order (the
      // reduce-scatter's sum of the two backward passes against zero=1's
      // all-reduce): grad_diff, a rounding of the largest gradient. AdamW
      // moves a weight by lr g / (|g| + eps) each step (m-hat = g and v-hat
      // = g^2 on repeated gradients), whose slope in g is at most 1 / eps
      // (at g = 0): a gradient near eps turns grad_diff into up to
      // steps lr grad_diff / eps of weight (measured: 2.2e-12 relative at 8
      // ranks, data=2 x 2D q=2, seed 982769662624174025, over the 1e-12 this
      // test had). A wrong chunk read moves weights by lr.
      // In absolute terms, over every rank's values.
      double scale = 0, diff = 0;
      for (std::size_t i = 0; i < n; ++i) {
        scale = std::max(scale, std::abs(va[i]));
        diff = std::max(diff, std::abs(vb[i] - va[i]));
      }
      EXPECT_LE(max_over_ranks(diff),
                1e-12 * max_over_ranks(scale) + steps * lr * grad_diff / adam.eps)
          << "two steps, one all-gather";
    }
}

// A checkpoint of a sharded data axis is written by every data group, each
// its chunk of the state (one shard file per tensor rank and data group,
// together the bytes of an unsharded one's, nothing gathered): it resumes
// unsharded, and an unsharded one resumes sharded, at the same data size
// exactly as the uninterrupted run; under another data size, scheme and
// level (zero=2, 3) along the serial reference's curve (1e-9, as
// ReshardedResumeContinuesTheCurve).
TEST(Train, ShardedCheckpointsResumeAcrossLevels) {
  if (world_size() != 4) GTEST_SKIP() << "data=2 x 1D p=2 <-> data=4 x serial needs 4 ranks";
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  const TrainerOptions base = options_for("2d:q=1", seed);
  const auto tokens = random_tokens(seed, base.config.vocab_size, 1500);
  const Curve want = reference_curve(base, tokens, 6);
  Backend& backend = test_backend();
  SharedTempDir dir;
  const fs::path sharded_root = dir.path / "sharded", plain_root = dir.path / "plain";
  std::vector<double> uninterrupted;
  {
    Trainer<double> t(MPI_COMM_WORLD, options_for("data=2,1d:p=2", seed), backend, tokens);
    for (int s = 0; s < 6; ++s) uninterrupted.push_back(t.train_step().loss);
  }
  // the state offloaded (OptimizerOptions::offload_bucket) in the run that
  // saves and in one that loads: a checkpoint holds the same either way
  const auto offloaded = [&](const std::string& scheme) {
    TrainerOptions o = options_for(scheme, seed);
    o.optimizer.offload_bucket = 37;
    return o;
  };
  {
    Trainer<double> t(MPI_COMM_WORLD, offloaded("data=2:zero=1,1d:p=2"), backend, tokens);
    ASSERT_TRUE(t.optimizer().offloaded());
    for (int s = 0; s < 3; ++s) t.train_step();
    t.save(sharded_root);
  }
  // the same data size, unsharded, then sharded again from its checkpoint
  {
    Trainer<double> t(MPI_COMM_WORLD, options_for("data=2,1d:p=2", seed), backend, tokens);
    t.load(sharded_root);
    ASSERT_EQ(t.step(), 3);
    t.save(plain_root);
    // shard files: 2 tensor ranks x 2 data groups against 2 tensor ranks,
    // holding the same bytes besides their 64-byte headers
    const auto shards = [](const fs::path& root) {
      std::pair<int, std::uintmax_t> files{0, 0};
      for (const auto& e : fs::directory_iterator(root / "step_00000003"))
        if (e.path().filename().string().starts_with("shard_")) {
          ++files.first;
          files.second += fs::file_size(e.path()) - 64;
        }
      return files;
    };
    const auto sharded = shards(sharded_root), plain = shards(plain_root);
    EXPECT_EQ(sharded.first, 4);
    EXPECT_EQ(plain.first, 2);
    EXPECT_EQ(sharded.second, plain.second);
    for (int s = 3; s < 6; ++s)
      EXPECT_EQ(t.train_step().loss, uninterrupted[static_cast<std::size_t>(s)]) << "step " << s;
  }
  {
    Trainer<double> t(MPI_COMM_WORLD, offloaded("data=2:zero=1,1d:p=2"), backend, tokens);
    t.load(plain_root);
    for (int s = 3; s < 6; ++s)
      EXPECT_EQ(t.train_step().loss, uninterrupted[static_cast<std::size_t>(s)]) << "step " << s;
  }
  // zero=3 (the values sharded too) resumes a zero=1 checkpoint, and its
  // own checkpoint resumes zero=3 bit for bit and unsharded along the
  // uninterrupted run. Its clipping sums the norm over the chunks (zero=2's
  // order), so its weights may differ from the unsharded run's in the last
  // bit (measured: 4.4e-16 in the loss three steps on): 1e-12 there.
  const fs::path zero3_root = dir.path / "zero3";
  const auto near = [&](double loss, int s, const char* what) {
    EXPECT_LE(rel(loss, uninterrupted[static_cast<std::size_t>(s)]), 1e-12)
        << what << ", step " << s;
  };
  {
    Trainer<double> t(MPI_COMM_WORLD, options_for("data=2:zero=3,1d:p=2", seed), backend, tokens);
    t.load(sharded_root);
    for (int s = 3; s < 6; ++s) near(t.train_step().loss, s, "zero=3 from zero=1");
  }
  std::vector<double> zero3;
  {
    Trainer<double> t(MPI_COMM_WORLD, options_for("data=2:zero=3,1d:p=2", seed), backend, tokens);
    for (int s = 0; s < 3; ++s) near(t.train_step().loss, s, "zero=3");
    t.save(zero3_root);
    for (int s = 3; s < 6; ++s) zero3.push_back(t.train_step().loss);
  }
  {
    Trainer<double> t(MPI_COMM_WORLD, options_for("data=2:zero=3,1d:p=2", seed), backend, tokens);
    t.load(zero3_root);
    ASSERT_EQ(t.step(), 3);
    for (int s = 3; s < 6; ++s)
      EXPECT_EQ(t.train_step().loss, zero3[static_cast<std::size_t>(s - 3)])
          << "zero=3 from zero=3, step " << s;
  }
  {
    Trainer<double> t(MPI_COMM_WORLD, options_for("data=2,1d:p=2", seed), backend, tokens);
    t.load(zero3_root);
    ASSERT_EQ(t.step(), 3);
    for (int s = 3; s < 6; ++s) near(t.train_step().loss, s, "unsharded from zero=3");
  }
  // another data size, scheme and level (the gradients sharded too; the
  // values too)
  for (const char* scheme : {"data=4:zero=2,2d:q=1", "data=4:zero=3,2d:q=1"}) {
    SCOPED_TRACE(scheme);
    Trainer<double> t(MPI_COMM_WORLD, options_for(scheme, seed), backend, tokens);
    t.load(sharded_root);
    for (int s = 3; s < 6; ++s)
      EXPECT_LE(rel(t.train_step().loss, want.loss[static_cast<std::size_t>(s)]), 1e-9)
          << "step " << s;
    const ParameterStore<double>::WholeValues whole(t.model().parameters_store(), false);
    for (Param<double>* p : t.model().parameters_store().params())
      EXPECT_LE(max_over_ranks(rel_error(gather_global(*p, t.parallel().grid()),
                                         want.model.param(p->shard.name))),
                1e-8)
          << p->shard.name;
  }
}

// The store overloads with a zero=3 store (no optimizer): each data group
// saves and loads its chunk of the values. A zero=3 run's parameters
// saved so load exactly into another zero=3 run and into an unsharded
// scheme; saving inside a WholeValues scope (which rebinds the values to
// the whole order) is refused on every rank.
TEST(Train, ZeroThreeStoreSavesAndLoadsItsChunk) {
  if (world_size() != 4) GTEST_SKIP() << "data=2 x 1D p=2 needs 4 ranks";
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  const TrainerOptions o = options_for("data=2:zero=3,1d:p=2", seed);
  const auto tokens = random_tokens(seed, o.config.vocab_size, 1500);
  Backend& backend = test_backend();
  SharedTempDir dir;
  const fs::path root = dir.path / "store";
  Trainer<double> a(MPI_COMM_WORLD, o, backend, tokens);
  for (int s = 0; s < 2; ++s) a.train_step();
  ParameterStore<double>& store = a.model().parameters_store();
  save_checkpoint<double>(root, store, {}, CheckpointInfo{.step = 2, .meta = {}},
                          a.parallel().grid());
  const auto want = global_weights(a);
  for (const char* scheme : {"data=2:zero=3,1d:p=2", "1d:p=4"}) {
    SCOPED_TRACE(scheme);
    Trainer<double> b(MPI_COMM_WORLD, options_for(scheme, seed + 1), backend, tokens);
    EXPECT_EQ(load_parameters<double>(root, b.model().parameters_store(), b.parallel().grid()).step,
              2);
    EXPECT_EQ(global_weights(b), want);
  }
  const ParameterStore<double>::WholeValues whole(store, false);
  const std::string msg = error_of([&] {
    save_checkpoint<double>(root, store, {}, CheckpointInfo{.step = 3, .meta = {}},
                            a.parallel().grid());
  });
  EXPECT_NE(msg.find("WholeValues scope is open"), std::string::npos) << msg;
  EXPECT_TRUE(same_on_all_ranks(msg)) << msg;
}

TEST(Train, InvalidOptionsThrowEverywhere) {
  const std::uint64_t seed = fresh_seed();
  const auto tokens = random_tokens(seed, 32, 500);
  Backend& backend = test_backend();
  const auto expect = [&](TrainerOptions o, const std::string& needle) {
    const std::string msg =
        error_of([&] { Trainer<double> t(MPI_COMM_WORLD, o, backend, tokens); });
    EXPECT_NE(msg.find(needle), std::string::npos) << "'" << msg << "' lacks '" << needle << "'";
    EXPECT_TRUE(same_on_all_ranks(msg)) << msg;
  };
  const std::string fits = world_size() == 1 ? "2d:q=1" : "1d:p=" + std::to_string(world_size());
  TrainerOptions o = options_for(fits, seed);
  o.scheme = "1d:p=" + std::to_string(world_size() + 1);
  expect(o, "needs");
  o = options_for(fits, seed);
  o.seq = 9;  // > n_positions
  expect(o, "n_positions");
  o = options_for(fits, seed);
  o.clip = -1;
  expect(o, "clip");
  o = options_for(fits, seed);
  o.scheme = "data=1:zero=1," + fits;  // nothing to shard over
  expect(o, "data=1 has one");
  o = options_for(fits, seed);
  o.optimizer.offload_bucket = -1;
  expect(o, "offload_bucket=-1");
  o = options_for(fits, seed);
  o.config.vocab_size = 16;  // the tokens go up to 31
  expect(o, "vocab");
  const std::string msg = error_of([&] {
    Trainer<double> t(MPI_COMM_WORLD, options_for(fits, seed), backend,
                      std::vector<std::uint16_t>(5, 1));  // shorter than seq + 1
  });
  EXPECT_NE(msg.find("short"), std::string::npos) << msg;
  if (test_backend().asynchronous()) {
    o = options_for(fits, seed);
    o.grid = GridOptions{};  // MPI communicators cannot take device memory
    expect(o, "mpi_staged");
  }
}

}  // namespace

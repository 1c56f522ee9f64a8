// Gpt (2D) with a data-parallel axis: data = 2 groups, each a q x q mesh (CTest:
// 2 ranks = 2 x 1x1, 8 ranks = 2 x 2x2). Every group takes half of the global
// batch; the loss and every gathered parameter gradient must equal the serial
// reference's on the *global* batch, on every group (tolerances as in
// test_gpt2d.cpp). Also: gradient accumulation under data parallelism, the
// bytes sent on the data axis (exactly the counter model's all-reduce volume
// of the gradient buckets plus the loss), no heap allocation in a step, and
// a batch not divisible by data*q rejected on every rank. Runs on
// test_backend() (SUMMA_TEST_BACKEND=cpu|cuda) with test_grid_options().
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "test_util.hpp"

namespace summa::test {
namespace {

constexpr int kData = 2;

struct DataEnv {
  Backend& backend = test_backend();  // first: selects the rank's device
  ProcessGrid grid = ProcessGrid::mesh2d(MPI_COMM_WORLD, 0, kData, test_grid_options());
  SummaEngine engine{grid, backend, {.panel = 5, .overlap = true}};
};
DataEnv& env() {
  static DataEnv e;
  return e;
}

reference::GptConfig config_for(int q) {
  reference::GptConfig c;
  c.n_layer = 2;
  c.n_head = 2 * q;
  c.n_embd = 8 * q;
  c.n_positions = 6;
  c.vocab_size = 10 * q;
  return c;
}

std::vector<std::int32_t> random_ids(std::size_t n, int vocab, std::mt19937_64& gen) {
  std::uniform_int_distribution<int> dist(0, vocab - 1);
  std::vector<std::int32_t> ids(n);
  for (auto& id : ids) id = dist(gen);
  return ids;
}

template <class T>
void matches_reference(bool checkpoint) {
  DataEnv& e = env();
  const int q = e.engine.q();
  const reference::GptConfig config = config_for(q);
  const index_t batch = 2 * kData * q, seq = 5;
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  const auto tokens = random_ids(static_cast<std::size_t>(batch * seq), config.vocab_size, gen);
  const auto targets = random_ids(tokens.size(), config.vocab_size, gen);
  reference::Gpt<T> ref(config, seed);
  const double ref_loss = ref.forward(tokens, targets, batch, seq);
  ref.backward();

  Summa2DContext<T> model_scheme(e.engine);
  Gpt<T> model(model_scheme, config, batch, seq,
               {.recompute = checkpoint ? Recompute::full : Recompute::none});
  model.init(seed);
  const double loss = model.forward(tokens, targets);
  model.backward();
  const double tol = model_tolerance<T>();
  EXPECT_NEAR(loss, ref_loss, tol * std::abs(ref_loss));
  for (Param<T>* p : model.parameters_store().params()) {
    const auto global = gather_global(*p, e.grid, true);
    EXPECT_LE(max_over_ranks(rel_error(global, ref.grad(p->shard.name))), tol) << p->shard.name;
  }
}

TEST(Gpt2DData, MatchesReferenceDouble) {
  matches_reference<double>(true);
}
TEST(Gpt2DData, MatchesReferenceFloat) {
  matches_reference<float>(true);
}
TEST(Gpt2DData, MatchesReferenceNoCheckpoint) {
  matches_reference<double>(false);
}

// Two accumulated steps on the same batch give twice the gradients.
TEST(Gpt2DData, AccumulatesAcrossSteps) {
  DataEnv& e = env();
  const int q = e.engine.q();
  const reference::GptConfig config = config_for(q);
  const index_t batch = kData * q, seq = 4;
  std::mt19937_64 gen(fresh_seed());
  const auto tokens = random_ids(static_cast<std::size_t>(batch * seq), config.vocab_size, gen);
  const auto targets = random_ids(tokens.size(), config.vocab_size, gen);
  Summa2DContext<double> model_scheme(e.engine);
  Gpt<double> model(model_scheme, config, batch, seq);
  model.init(7);
  model.forward(tokens, targets);
  model.backward();
  std::vector<std::vector<double>> once;
  for (Param<double>* p : model.parameters_store().params())
    once.push_back(gather_global(*p, e.grid, true));
  model.forward(tokens, targets);
  model.backward(/*accumulate=*/true);
  const auto params = model.parameters_store().params();
  for (std::size_t k = 0; k < params.size(); ++k) {
    auto twice = once[k];
    for (double& v : twice) v *= 2;
    EXPECT_LE(rel_error(gather_global(*params[k], e.grid, true), twice), 1e-12)
        << params[k]->shard.name;
  }
}

// Bytes sent on the data axis in one step = the all-reduce of every gradient
// bucket and of the loss, in the counter model of docs/communication.md
// (all-reduce of n elements over g ranks, rank r: (n - c_r) + (g - 1) c_r
// elements with c_r = n/g + (r < n mod g)).
TEST(Gpt2DData, DataAxisBytesMatchTheModel) {
  DataEnv& e = env();
  const int q = e.engine.q();
  const reference::GptConfig config = config_for(q);
  const index_t batch = kData * q, seq = 4;
  std::mt19937_64 gen(fresh_seed());
  const auto tokens = random_ids(static_cast<std::size_t>(batch * seq), config.vocab_size, gen);
  const auto targets = random_ids(tokens.size(), config.vocab_size, gen);
  Summa2DContext<float> model_scheme(e.engine);
  Gpt<float> model(model_scheme, config, batch, seq);
  model.init(9);
  e.grid.reset_traffic();
  model.forward(tokens, targets);
  model.backward();
  const auto all_reduce = [&](std::uint64_t n, std::uint64_t bytes) {
    const std::uint64_t g = kData, r = static_cast<std::uint64_t>(e.grid.data().rank());
    const std::uint64_t c = n / g + (r < n % g ? 1 : 0);
    return ((n - c) + (g - 1) * c) * bytes;
  };
  // buckets: ln_f, each block, the embedding (wte + wpe)
  const auto elements = [](Module<float>& m) {
    std::uint64_t n = 0;
    for (Param<float>* p : m.parameters()) n += static_cast<std::uint64_t>(p->shard.local_size());
    return n;
  };
  std::uint64_t expected = all_reduce(1, sizeof(double));  // the loss
  expected += all_reduce(elements(model.ln_f()), sizeof(float));
  for (int i = 0; i < config.n_layer; ++i)
    expected += all_reduce(elements(model.block(i)), sizeof(float));
  expected += all_reduce(elements(model.embedding()), sizeof(float));
  EXPECT_EQ(e.grid.traffic()[CommAxis::data].bytes_sent, expected);
}

TEST(Gpt2DData, TrainingStepAllocatesNothing) {
  if (!allocation_counting_available()) GTEST_SKIP() << "allocation counting unavailable (ASan)";
  if (test_backend().asynchronous())
    GTEST_SKIP() << "the CUDA runtime allocates host memory internally (pinned staging, "
                    "launch bookkeeping): allocation counting runs on the CPU backend";
  DataEnv& e = env();
  const int q = e.engine.q();
  const reference::GptConfig config = config_for(q);
  const index_t batch = kData * q, seq = 5;
  std::mt19937_64 gen(fresh_seed());
  const auto tokens = random_ids(static_cast<std::size_t>(batch * seq), config.vocab_size, gen);
  const auto targets = random_ids(tokens.size(), config.vocab_size, gen);
  Summa2DContext<float> model_scheme(e.engine);
  Gpt<float> model(model_scheme, config, batch, seq);
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

TEST(Gpt2DData, BatchMustSplitOverDataAndMesh) {
  DataEnv& e = env();
  const int q = e.engine.q();
  std::string msg;
  try {
    Summa2DContext<float> model_scheme(e.engine);
    Gpt<float> model(model_scheme, config_for(q), kData * q + q, 4);
  } catch (const Error& err) {
    msg = err.what();
  }
  EXPECT_NE(msg.find("batch="), std::string::npos) << msg;
  EXPECT_NE(msg.find("data"), std::string::npos) << msg;
  EXPECT_TRUE(same_on_all_ranks(msg)) << msg;
}

}  // namespace
}  // namespace summa::test

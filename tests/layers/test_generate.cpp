// Generation under every scheme (summa/layers/generate.hpp), at 1, 2, 4, 8
// and 9 ranks in one launch (sub-communicators), every scheme of each rank
// count with its data factors.
//
// Oracle: the serial reference GPT (reference::Gpt, same weights from the
// same seed), each prompt alone and unpadded, its whole sequence recomputed
// every step, the next token chosen from its full logits by the sampler on
// one rank with the same (seed, step, prompt) keys. Prompts of different
// lengths in one batch; greedy and sampled (temperature, top-k, top-p):
// every generated id must equal the oracle's (double: the logits agree to
// ~1e-13, far below the gaps the choices depend on). Also: a model built
// for inference has no gradients, backward or conjunction buffer and two
// boundary slots (planned and allocated alike) and refuses backward; the
// end token stops a sequence; prompts that do not fit are refused naming
// the prompt, on every rank.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <random>
#include <string>
#include <vector>

#include "summa/comm/mpi_communicator.hpp"
#include "summa/layers/generate.hpp"
#include "summa/parallel/scheme.hpp"
#include "summa/reference/gpt.hpp"
#include "test_util.hpp"

namespace summa::test {
namespace {

const std::vector<int> kRankCounts = {1, 2, 4, 8, 9};
using Prompts = std::vector<std::vector<std::int32_t>>;

GptConfig small_config() {
  GptConfig c;
  c.n_layer = 2;
  c.n_head = 72;  // divisible by p up to 9 and q = 2, 3
  c.n_embd = 144;
  c.n_positions = 16;
  c.vocab_size = 72;
  return c;
}

// The oracle: each prompt alone through the serial reference, recomputed
// whole every step; the sampler on one rank picks from the full logits.
Prompts reference_generation(const GptConfig& config, std::uint64_t seed, const Prompts& prompts,
                             const GenerateOptions& o) {
  reference::Gpt<double> ref(config, seed);
  TrafficCounter counter;
  MpiCommunicator self(MPI_COMM_SELF, false, CommAxis::tensor, &counter);
  const index_t V = config.vocab_size;
  const index_t limit = o.vocab_limit > 0 ? o.vocab_limit : V;
  Prompts out(prompts.size());
  for (std::size_t p = 0; p < prompts.size(); ++p) {
    std::vector<std::int32_t> seq = prompts[p];
    for (index_t step = 0; step < o.max_new_tokens; ++step) {
      const auto n = static_cast<index_t>(seq.size());
      const std::vector<std::int32_t> targets(seq.size(), 0);
      ref.forward(seq, targets, 1, n);
      const double* last = ref.logits().data() + (n - 1) * V;
      const std::uint64_t key = p;
      const auto id = choose_tokens<double>(last, 1, limit, V, 0, limit, self, o.sampling,
                                            static_cast<std::uint64_t>(step),
                                            std::span<const std::uint64_t>(&key, 1))[0];
      out[p].push_back(id);
      seq.push_back(id);
      if (id == o.eos) break;
    }
  }
  return out;
}

void generation_matches_the_reference(MPI_Comm comm, int ranks) {
  CpuBackend backend;
  const GptConfig config = small_config();
  const index_t batch = common_batch(schemes_for(ranks)), seq = 12;
  std::mt19937_64 rng(fresh_seed());
  const std::uint64_t seed = rng();
  // prompts of 1 to 6 tokens, one fewer than the batch (a dummy row runs)
  Prompts prompts(static_cast<std::size_t>(std::max<index_t>(1, batch - 1)));
  for (auto& p : prompts) {
    p.resize(1 + rng() % 6);
    for (auto& id : p) id = static_cast<std::int32_t>(rng() % 72);
  }
  const std::vector<GenerateOptions> settings = {
      {.max_new_tokens = 6},
      {.max_new_tokens = 6,
       .sampling = {.greedy = false, .temperature = 0.8, .seed = rng()},
       .vocab_limit = 60},
      {.max_new_tokens = 5,
       .sampling = {.greedy = false, .temperature = 1.2, .top_k = 7, .seed = rng()}},
      {.max_new_tokens = 5, .sampling = {.greedy = false, .top_p = 0.6, .seed = rng()}},
  };
  std::vector<Prompts> want;
  for (const GenerateOptions& o : settings)
    want.push_back(reference_generation(config, seed, prompts, o));
  for (const SchemeSpec& spec : schemes_for(ranks)) {
    SCOPED_TRACE(spec.str());
    ParallelGpt<double> run(comm, spec, backend, config, batch, seq, {.inference = true});
    run.model().init(seed);
    for (std::size_t k = 0; k < settings.size(); ++k) {
      SCOPED_TRACE(fmt::format("setting {}", k));
      const Generation g = generate<double>(run.model(), prompts, settings[k]);
      ASSERT_EQ(g.tokens.size(), prompts.size());
      for (std::size_t p = 0; p < prompts.size(); ++p)
        EXPECT_EQ(g.tokens[p], want[k][p])
            << "prompt " << p << " " << fmt::format("{}", prompts[p]);
      EXPECT_TRUE(same_on_all_ranks(fmt::format("{}", g.tokens)));
    }
  }
}

TEST(Generate, EverySchemeMatchesTheSerialReference) {
  for_each_group(kRankCounts, generation_matches_the_reference);
}

TEST(Generate, InferenceModelsHoldNoTrainingBuffers) {
  for_each_group(kRankCounts, [](MPI_Comm comm, int ranks) {
    CpuBackend backend;
    const GptConfig config = small_config();
    const index_t batch = common_batch(schemes_for(ranks)), seq = 12;
    for (const SchemeSpec& spec : schemes_for(ranks)) {
      SCOPED_TRACE(spec.str());
      const MemoryReport train = plan_memory<float>(comm, spec, backend, config, batch, seq, {});
      const MemoryReport plan =
          plan_memory<float>(comm, spec, backend, config, batch, seq, {.inference = true});
      ParallelGpt<float> run(comm, spec, backend, config, batch, seq, {.inference = true});
      const MemoryReport got = run.model().memory_report();
      ASSERT_EQ(plan.buffers.size(), got.buffers.size());
      for (std::size_t k = 0; k < got.buffers.size(); ++k)
        EXPECT_EQ(plan.buffers[k].capacity, got.buffers[k].capacity) << got.buffers[k].name;
      const auto capacity = [](const MemoryReport& r, const std::string& name) {
        for (const BufferUsage& u : r.buffers)
          if (u.name == name) return u.capacity;
        ADD_FAILURE() << "no buffer " << name;
        return std::size_t{0};
      };
      EXPECT_EQ(capacity(got, "gradients"), 0u);
      EXPECT_EQ(capacity(got, "backward"), 0u);
      EXPECT_EQ(capacity(got, "conjunction"), 0u);
      EXPECT_EQ(capacity(got, "parameters"), capacity(train, "parameters"));
      // two boundary slots instead of n_layer + 1 = 3
      EXPECT_EQ(capacity(got, "checkpoint") * 3, capacity(train, "checkpoint") * 2);
      EXPECT_LT(got.total(), train.total());
      EXPECT_FALSE(run.model().parameters_store().has_gradients());
      run.model().init(3);
      std::vector<std::int32_t> tokens(static_cast<std::size_t>(batch * seq), 1);
      run.model().forward_logits(tokens);
      EXPECT_THROW(run.model().backward(), Error);
    }
  });
}

TEST(Generate, EndTokenAndErrors) {
  for_each_group(kRankCounts, [](MPI_Comm comm, int ranks) {
    CpuBackend backend;
    const GptConfig config = small_config();
    const index_t batch = common_batch(schemes_for(ranks)), seq = 8;
    const SchemeSpec spec = schemes_for(ranks).back();
    ParallelGpt<float> run(comm, spec, backend, config, batch, seq, {.inference = true});
    run.model().init(5);
    const Prompts prompts = {{1, 2, 3}, {4}};
    // greedy from a known start: the first greedy token becomes the end token
    const Generation free_run = generate<float>(run.model(), prompts, {.max_new_tokens = 4});
    ASSERT_EQ(free_run.tokens[0].size(), 4u);
    const Generation stopped =
        generate<float>(run.model(), prompts, {.max_new_tokens = 4, .eos = free_run.tokens[0][0]});
    EXPECT_EQ(stopped.tokens[0], std::vector<std::int32_t>{free_run.tokens[0][0]});
    const auto message = [&](auto&& call) {
      try {
        call();
      } catch (const Error& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    };
    std::string m = message([&] {
      generate<float>(run.model(), Prompts{{1}, {1, 2, 3, 4, 5, 6}}, {.max_new_tokens = 3});
    });
    EXPECT_NE(m.find("prompt 1 has 6 tokens"), std::string::npos) << m;
    EXPECT_NE(m.find("model's 8"), std::string::npos) << m;
    EXPECT_TRUE(same_on_all_ranks(m));
    m = message([&] { generate<float>(run.model(), Prompts{{1}, {}}, {.max_new_tokens = 2}); });
    EXPECT_NE(m.find("prompt 1 is empty"), std::string::npos) << m;
    m = message([&] { generate<float>(run.model(), Prompts{{1, 99}}, {.max_new_tokens = 2}); });
    EXPECT_NE(m.find("id 99"), std::string::npos) << m;
    m = message([&] {
      generate<float>(run.model(), Prompts{{1}},
                      {.max_new_tokens = 2, .sampling = {.greedy = false, .top_p = 0}});
    });
    EXPECT_NE(m.find("top_p=0"), std::string::npos) << m;
    EXPECT_TRUE(same_on_all_ranks(m));
  });
}

}  // namespace
}  // namespace summa::test

// Generation (summa/layers/generate.hpp) at 1, 2, 4, 8 and 9 ranks in one
// launch (sub-communicators), under every family and data factor of each
// rank count (test_util.hpp's representative_schemes: 1D, 2D at q = 1, 2, 3,
// 3D, with and without a data axis).
//
// Oracle: the serial reference GPT (reference::Gpt, same weights from the
// same seed), each prompt alone and unpadded, its whole sequence recomputed
// every step, the next token chosen from its full logits by the sampler on
// one rank with the same (seed, step, prompt) keys. Prompts of different
// lengths in one batch; greedy and sampled (temperature, top-k, top-p):
// every generated id must equal the oracle's (double: the logits agree to
// ~1e-13, far below the gaps the choices depend on), both with the whole
// window recomputed every step and with one position a step through the
// key/value cache; the cached logits equal the recomputed ones at every
// position within 1e-10. Also: a model built
// for inference has no gradients, backward or conjunction buffer and two
// boundary slots (planned and allocated alike) and refuses backward; its
// key/value cache is exactly the keys and values of every layer's local
// sequences and heads; the end token stops a sequence; prompts that do not
// fit the window or the cache are refused naming the prompt, on every rank.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <random>
#include <string>
#include <type_traits>
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
  // 1D with sequence parallelism too: its embedding's own position rows
  const std::vector<SchemeSpec> specs = with_sequence_parallel(representative_schemes(ranks), true);
  const index_t batch = common_batch(specs), seq = 9;
  std::mt19937_64 rng(fresh_seed());
  const std::uint64_t seed = rng();
  // prompts of 1 to 5 tokens, one fewer than the batch (a dummy row runs)
  Prompts prompts(static_cast<std::size_t>(std::max<index_t>(1, batch - 1)));
  for (auto& p : prompts) {
    p.resize(1 + rng() % 5);
    for (auto& id : p) id = static_cast<std::int32_t>(rng() % 72);
  }
  const std::vector<GenerateOptions> settings = {
      {.max_new_tokens = 4},
      {.max_new_tokens = 4,
       .sampling = {.greedy = false, .temperature = 0.8, .seed = rng()},
       .vocab_limit = 60},
      {.max_new_tokens = 4,
       .sampling = {.greedy = false, .temperature = 1.2, .top_k = 7, .seed = rng()}},
      {.max_new_tokens = 4, .sampling = {.greedy = false, .top_p = 0.6, .seed = rng()}},
  };
  std::vector<Prompts> want;
  for (const GenerateOptions& o : settings)
    want.push_back(reference_generation(config, seed, prompts, o));
  for (const SchemeSpec& spec : specs) {
    SCOPED_TRACE(spec.str());
    // every scheme greedy and sampled; top-k and top-p (the same gathered
    // candidates whatever the split: sampling_np9) on the first and the
    // last scheme of the rank count, to keep the launch short
    const bool every_setting = &spec == &specs.front() || &spec == &specs.back();
    // the whole window recomputed each step, and one position a step
    // through the key/value cache
    ParallelGpt<double> run(comm, spec, backend, config, batch, seq, {.inference = true});
    ParallelGpt<double> cached(comm, spec, backend, config, batch, 1,
                               {.inference = true, .kv_cache = seq});
    run.model().init(seed);
    cached.model().init(seed);
    for (std::size_t k = 0; k < (every_setting ? settings.size() : 2); ++k) {
      SCOPED_TRACE(fmt::format("setting {}", k));
      for (Gpt<double>* model : {&run.model(), &cached.model()}) {
        SCOPED_TRACE(model == &run.model() ? "recomputed" : "kv cache");
        const Generation g = generate<double>(*model, prompts, settings[k]);
        ASSERT_EQ(g.tokens.size(), prompts.size());
        for (std::size_t p = 0; p < prompts.size(); ++p)
          EXPECT_EQ(g.tokens[p], want[k][p])
              << "prompt " << p << " " << fmt::format("{}", prompts[p]);
        EXPECT_TRUE(same_on_all_ranks(fmt::format("{}", g.tokens)));
      }
    }
  }
}

// The cached decoder's logits at every position equal the whole
// sequence's recomputed at that position (each sequence's row, where this
// rank holds it; double: within 1e-10 of the logits' scale). The cached
// model takes two positions a step, so its tokens' positions differ
// (Gpt::forward_cached's set_positions), under 1D with sequence
// parallelism too (the embedding's own rows of them).
template <class T>
void cached_logits_match_recomputed(MPI_Comm comm, int ranks) {
  // double: rounding only; bf16: the two paths round their GEMMs and
  // softmaxes differently (see the test below)
  const double tolerance = std::is_same_v<T, bf16> ? 0.02 : 1e-10;
  CpuBackend backend;
  const GptConfig config = small_config();
  const std::vector<SchemeSpec> specs = with_sequence_parallel(representative_schemes(ranks), true);
  const index_t batch = common_batch(specs), seq = 10, chunk = 2;
  std::mt19937_64 rng(fresh_seed());
  const std::uint64_t seed = rng();
  std::vector<std::int32_t> window(static_cast<std::size_t>(batch * seq));
  for (auto& id : window) id = static_cast<std::int32_t>(rng() % 72);
  for (const SchemeSpec& spec : specs) {
    SCOPED_TRACE(spec.str());
    ParallelGpt<T> run(comm, spec, backend, config, batch, seq, {.inference = true});
    ParallelGpt<T> cached(comm, spec, backend, config, batch, chunk,
                          {.inference = true, .kv_cache = seq});
    run.model().init(seed);
    cached.model().init(seed);
    run.model().forward_logits(window);
    const ActivationBlock full = run.model().logits_block();
    const ConstMatrixView<T> Z = run.model().logits();
    double worst = 0, scale = 0;
    int compared = 0;
    for (index_t t = 0; t < seq; t += chunk) {
      std::vector<std::int32_t> step(static_cast<std::size_t>(batch * chunk));
      for (index_t b = 0; b < batch; ++b)
        for (index_t j = 0; j < chunk; ++j)
          step[static_cast<std::size_t>(b * chunk + j)] =
              window[static_cast<std::size_t>(b * seq + t + j)];
      cached.model().forward_cached(step, t);
      const ActivationBlock one = cached.model().logits_block();
      const ConstMatrixView<T> C = cached.model().logits();
      ASSERT_EQ(one.cols, full.cols);
      ASSERT_EQ(one.col0, full.col0);
      for (index_t r = 0; r < one.rows; ++r) {
        const index_t token = one.row0 + r;  // of the data group's step
        const index_t row = token / chunk * seq + t + token % chunk - full.row0;
        ASSERT_TRUE(row >= 0 && row < full.rows) << "token " << token;
        for (index_t c = 0; c < one.cols; ++c) {
          worst = std::max(worst,
                           std::abs(static_cast<double>(C(r, c)) - static_cast<double>(Z(row, c))));
          scale = std::max(scale, std::abs(static_cast<double>(Z(row, c))));
          ++compared;
        }
      }
    }
    EXPECT_GT(compared, 0);
    EXPECT_LE(worst, tolerance * std::max(1.0, scale)) << "largest logit " << scale;
  }
}

TEST(Generate, CachedLogitsEqualTheRecomputedOnes) {
  for_each_group(kRankCounts, cached_logits_match_recomputed<double>);
}
// bf16 (activations and the cache in bf16, statistics in fp32): within 0.02
// of the logits' scale; the worst measured over every scheme of 1-9 ranks
// was 0.0069 (about two bf16 ulps: the paths round their GEMMs and softmaxes
// in different shapes).
TEST(Generate, CachedLogitsEqualTheRecomputedOnesBf16) {
  for_each_group(kRankCounts, cached_logits_match_recomputed<bf16>);
}

TEST(Generate, EverySchemeMatchesTheSerialReference) {
  for_each_group(kRankCounts, generation_matches_the_reference);
}

TEST(Generate, InferenceModelsHoldNoTrainingBuffers) {
  for_each_group(kRankCounts, [](MPI_Comm comm, int ranks) {
    CpuBackend backend;
    const GptConfig config = small_config();
    const index_t batch = common_batch(representative_schemes(ranks)), seq = 12;
    for (const SchemeSpec& spec : representative_schemes(ranks)) {
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
      // one block at a time as with checkpointing (train's default), but
      // without attention's probabilities
      EXPECT_LT(capacity(got, "forward"), capacity(train, "forward"));
      EXPECT_LT(got.total(), train.total());
      EXPECT_FALSE(run.model().parameters_store().has_gradients());
      // a cache of 12 positions: keys and values of every layer's local
      // sequences and heads, sized up front, planned alike
      const GptOptions kv{.inference = true, .kv_cache = 12};
      const MemoryReport kv_plan = plan_memory<float>(comm, spec, backend, config, batch, 1, kv);
      ParallelGpt<float> decoder(comm, spec, backend, config, batch, 1, kv);
      const MemoryReport kv_got = decoder.model().memory_report();
      const index_t seqs = batch / batch_granularity(spec),  // per rank, as the scheme splits
          heads = config.n_head / decoder.scheme().head_split(), d = config.n_embd / config.n_head;
      EXPECT_EQ(
          capacity(kv_got, "kv_cache"),
          static_cast<std::size_t>(2 * config.n_layer * seqs * heads * 12 * d) * sizeof(float));
      EXPECT_EQ(capacity(kv_plan, "kv_cache"), capacity(kv_got, "kv_cache"));
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
    const index_t batch = common_batch(representative_schemes(ranks)), seq = 8;
    const SchemeSpec spec = representative_schemes(ranks).back();
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
    EXPECT_NE(m.find("max_new_tokens=2 fits"), std::string::npos) << m;
    EXPECT_TRUE(same_on_all_ranks(m));
    // a training build: forward_logits gives forward's logits bit for bit,
    // without a loss, so backward cannot follow it
    {
      ParallelGpt<float> train(comm, spec, backend, config, batch, seq, {});
      train.model().init(5);
      std::vector<std::int32_t> tokens(static_cast<std::size_t>(batch * seq));
      for (std::size_t k = 0; k < tokens.size(); ++k) tokens[k] = static_cast<std::int32_t>(k % 61);
      static_cast<void>(train.model().forward(tokens, tokens));
      const ConstMatrixView<float> Z = train.model().logits();
      const std::vector<float> with_loss(Z.data, Z.data + Z.rows * Z.cols);
      train.model().forward_logits(tokens);
      const ConstMatrixView<float> L = train.model().logits();
      EXPECT_TRUE(std::equal(with_loss.begin(), with_loss.end(), L.data));
      EXPECT_THROW(train.model().backward(), Error);
    }
    // with a cache of 6 positions
    ParallelGpt<float> cached(comm, spec, backend, config, batch, 1,
                              {.inference = true, .kv_cache = 6});
    cached.model().init(5);
    m = message([&] {
      generate<float>(cached.model(), Prompts{{1, 2, 3, 4}}, {.max_new_tokens = 3});
    });
    EXPECT_NE(m.find("prompt 0 has 4 tokens"), std::string::npos) << m;
    EXPECT_NE(m.find("kv_cache"), std::string::npos) << m;
    EXPECT_TRUE(same_on_all_ranks(m));
    m = message([&] {
      cached.model().forward_cached(std::vector<std::int32_t>(static_cast<std::size_t>(batch), 1),
                                    6);
    });
    EXPECT_NE(m.find("do not fit its key/value cache of 6"), std::string::npos) << m;
    m = message(
        [&] { ParallelGpt<float>(comm, spec, backend, config, batch, 1, {.kv_cache = 6}); });
    EXPECT_NE(m.find("kv_cache=6 needs inference"), std::string::npos) << m;
    EXPECT_TRUE(same_on_all_ranks(m));
    // the cached model stops at the end token as the recomputing one does
    const Generation cached_stop = generate<float>(
        cached.model(), prompts, {.max_new_tokens = 3, .eos = free_run.tokens[0][0]});
    EXPECT_EQ(cached_stop.tokens[0], stopped.tokens[0]);
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

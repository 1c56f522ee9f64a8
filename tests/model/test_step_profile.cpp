// GptOptions::profile (GptModel::profile): the step's parts timed under
// every scheme of the rank count. Profiling changes nothing computed (loss
// and every gradient bit-identical to an unprofiled model); each part is
// counted as often as the step runs it; the parts add up to no more than
// the step's wall time and to most of it; without the option the profile
// is empty.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>

#include "test_util.hpp"

namespace summa::test {
namespace {

TEST(StepProfile, TimesEveryPartAndChangesNothing) {
  int ranks = 1;
  MPI_Comm_size(test_comm(), &ranks);
  CpuBackend backend;
  GptConfig c;
  c.n_layer = 3;
  c.n_head = 4;
  c.n_embd = 32;
  c.n_positions = 8;
  c.vocab_size = 64;
  const index_t batch = 8, seq = 8;
  std::mt19937_64 rng(fresh_seed());
  std::vector<std::int32_t> tokens(batch * seq), targets(batch * seq);
  for (auto* v : {&tokens, &targets})
    for (auto& t : *v) t = static_cast<std::int32_t>(rng() % 64);
  for (const SchemeSpec& spec : schemes_for(ranks)) {
    SCOPED_TRACE(spec.str());
    ParallelGpt<float> plain(test_comm(), spec, backend, c, batch, seq, {.checkpoint = true});
    ParallelGpt<float> timed(test_comm(), spec, backend, c, batch, seq,
                             {.checkpoint = true, .profile = true});
    EXPECT_TRUE(plain.model().profile().empty());
    plain.model().init(7);
    timed.model().init(7);
    const double want = plain.model().forward(tokens, targets);
    plain.model().backward();
    timed.model().reset_profile();
    const auto t0 = std::chrono::steady_clock::now();
    const double got = timed.model().forward(tokens, targets);
    timed.model().backward();
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(got, want);
    const auto& a = plain.model().parameters_store();
    const auto& b = timed.model().parameters_store();
    const auto n = static_cast<std::size_t>(a.local_elements());
    EXPECT_EQ(std::memcmp(a.grads_base(), b.grads_base(), n * sizeof(float)), 0);

    const auto parts = timed.model().profile();
    ASSERT_EQ(parts.size(), 10u);
    double sum = 0;
    for (const StepPart& p : parts) {
      SCOPED_TRACE(std::string(p.op) + "." + std::string(p.phase));
      const std::uint64_t want_calls =
          p.op == "blocks" && p.phase != "forward" ? static_cast<std::uint64_t>(c.n_layer) : 1;
      EXPECT_EQ(p.calls, want_calls);
      EXPECT_GE(p.seconds, 0);
      sum += p.seconds;
    }
    EXPECT_LE(sum, wall);
    EXPECT_GT(sum, 0.25 * wall) << "the parts miss most of the step";
    timed.model().reset_profile();
    for (const StepPart& p : timed.model().profile()) EXPECT_EQ(p.calls, 0u);
  }
}

}  // namespace
}  // namespace summa::test

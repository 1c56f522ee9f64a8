// GptOptions::profile (GptModel::profile): the step's parts, and each
// block op inside them, timed under every scheme of the rank count. Profiling changes nothing
// computed (loss and every gradient bit-identical to an unprofiled model); each part is counted as
// often as the step runs it; the parts add up to no more than the step's wall time and to most of
// it; without the option the profile is empty.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>

#include <fmt/format.h>
#include <map>
#include <set>
#include <string>

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
    ParallelGpt<float> plain(test_comm(), spec, backend, c, batch, seq,
                             {.recompute = Recompute::full});
    ParallelGpt<float> timed(test_comm(), spec, backend, c, batch, seq,
                             {.recompute = Recompute::full, .profile = true});
    EXPECT_TRUE(plain.model().profile().empty());
    plain.model().init(7);
    timed.model().init(7);
    const double want = plain.model().forward(tokens, targets);
    plain.model().backward();
    // The figures are wall times on shared cores: a step may be preempted
    // outside the parts, so coverage has to hold in one of a few steps
    // (the ranks agree when to stop); the counts hold in every one.
    std::string figures;
    for (int attempt = 0; attempt < 5; ++attempt) {
      timed.model().reset_profile();
      const auto t0 = std::chrono::steady_clock::now();
      const double got = timed.model().forward(tokens, targets);
      timed.model().backward();
      const double wall =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      EXPECT_EQ(got, want);
      if (attempt == 0) {
        const auto& a = plain.model().parameters_store();
        const auto& b = timed.model().parameters_store();
        const auto n = static_cast<std::size_t>(a.local_elements());
        EXPECT_EQ(std::memcmp(a.grads_base(), b.grads_base(), n * sizeof(float)), 0);
      }
      const auto parts = timed.model().profile();
      ASSERT_EQ(parts.size(), 10u + 3 * 8);
      double sum = 0;
      std::map<std::string, double> blocks, block_ops;  // by phase
      std::set<std::string> names;
      for (const StepPart& p : parts) {
        const std::string name = std::string(p.op) + "." + std::string(p.phase);
        SCOPED_TRACE(name);
        EXPECT_TRUE(names.insert(name).second) << "reported twice";
        EXPECT_GE(p.seconds, 0);
        if (p.op.starts_with("block.")) {  // nested in blocks: once per layer and pass
          EXPECT_EQ(p.calls, static_cast<std::uint64_t>(c.n_layer));
          EXPECT_GT(p.seconds, 0);
          block_ops[std::string(p.phase)] += p.seconds;
          continue;
        }
        const std::uint64_t want_calls =
            p.op == "blocks" && p.phase != "forward" ? static_cast<std::uint64_t>(c.n_layer) : 1;
        EXPECT_EQ(p.calls, want_calls);
        if (p.op == "blocks") blocks[std::string(p.phase)] = p.seconds;
        sum += p.seconds;
      }
      EXPECT_LE(sum, wall);
      // the parts make up most of the step, the block ops most of each
      // blocks part (and never more than it)
      bool covered = sum > 0.25 * wall;
      figures = fmt::format("parts {:.6f} s of a {:.6f} s step", sum, wall);
      for (const auto& [phase, total] : blocks) {
        EXPECT_LE(block_ops[phase], total) << phase;
        covered = covered && block_ops[phase] > 0.5 * total;
        figures += fmt::format("; block ops {:.6f} s of blocks.{} {:.6f} s", block_ops[phase],
                               phase, total);
      }
      int all = covered ? 1 : 0;
      MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_MIN, test_comm());
      if (all == 1) {
        figures.clear();
        break;
      }
    }
    EXPECT_EQ(figures, "") << "the parts miss most of the step in every try";
    timed.model().reset_profile();
    for (const StepPart& p : timed.model().profile()) EXPECT_EQ(p.calls, 0u);
  }
}

}  // namespace
}  // namespace summa::test

// Communication accounting: for every implemented scheme of 1, 2, 4, 8 and
// 9 ranks, the bytes each rank sends and receives and the collectives it
// makes on every axis in one training step, read from the counters, equal
// the closed form of
// summa::model::predict_step_traffic exactly — float and double,
// checkpointing on and off (on: the configuration search's candidates,
// 1D's distributed checkpoints and sharded data axes too, forward and
// backward without the optimizer's step), with and without a data axis (bf16: the covering
// subset, representative_schemes). One launch of 9
// ranks covers every rank count on sub-communicators (for_each_group:
// [9], then [8, 1], then [4, 2] at once); a smaller launch covers the
// counts that fit.
//
// Agreements: a steady-state training step (forward, backward) and a
// decoding step (forward_cached, next_tokens) of every scheme make no
// agreement (summa::agreements_made(): the control all-reduces that are not
// on the traffic counters); with GridOptions::check_calls (the debug mode)
// such steps make some (the first scheme of each rank count).
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "fourth_scheme.hpp"
#include "summa/comm/consensus.hpp"
#include "summa/model/traffic.hpp"
#include "summa/parallel/auto_scheme.hpp"
#include "test_util.hpp"

namespace summa::test {

namespace {
// The fourth scheme (fourth_scheme.hpp): its measured bytes must equal the
// model's too (step_bytes_match walks schemes_for).
[[maybe_unused]] const bool kFourthScheme = (register_fourth_scheme(), true);
}  // namespace
namespace {

// The rank counts the suite covers.
const std::vector<int> kRankCounts = {1, 2, 4, 8, 9};

// A small GPT (n_head divisible by every p and q the suite covers), a batch
// every scheme of `ranks` can split, and fresh random token and target ids.
struct Step {
  reference::GptConfig config;
  index_t batch = 0, seq = 3;
  std::vector<std::int32_t> tokens, targets;
};
Step small_step(int ranks, index_t positions) {
  Step s;
  s.config.n_layer = 2;
  s.config.n_head = 72;
  s.config.n_embd = 144;
  s.config.n_positions = positions;
  s.config.vocab_size = 72;
  s.batch = common_batch(schemes_for(ranks));
  std::mt19937_64 gen(fresh_seed());
  std::uniform_int_distribution<int> dist(0, s.config.vocab_size - 1);
  s.tokens.resize(static_cast<std::size_t>(s.batch * s.seq));
  s.targets.resize(s.tokens.size());
  for (auto& t : s.tokens) t = dist(gen);
  for (auto& t : s.targets) t = dist(gen);
  return s;
}

// `all`: every scheme of the rank count, else the covering subset
// (representative_schemes).
template <class T, bool all = true>
void step_bytes_match(MPI_Comm comm, int ranks, Recompute recompute) {
  const Step step = small_step(ranks, 7);  // uneven position chunks at q = 2, 3
  const auto& [config, batch, seq, tokens, targets] = step;
  CpuBackend backend;
  int tested = 0;
  const GptOptions options{.recompute = recompute};
  // (candidate_schemes: with full recompute also 1D's distributed checkpoints)
  for (const SchemeSpec& spec :
       all ? candidate_schemes(ranks, options) : representative_schemes(ranks)) {
    SCOPED_TRACE(spec.str());
    ParallelGpt<T> run(comm, spec, backend, config, batch, seq, options);
    run.model().init(1);
    run.grid().reset_traffic();
    run.model().forward(tokens, targets);
    run.model().backward();
    const TrafficCounters want =
        model::predict_step_traffic(spec, config, batch, seq, options, dtype_v<T>,
                                    run.grid().coords(), /*optimizer_step=*/false);
    for (std::size_t a = 0; a < comm_axis_count; ++a) {
      const auto axis = static_cast<CommAxis>(a);
      EXPECT_EQ(run.grid().traffic()[axis].bytes_sent, want[axis].bytes_sent) << name_of(axis);
      EXPECT_EQ(run.grid().traffic()[axis].bytes_received, want[axis].bytes_received)
          << name_of(axis);
      EXPECT_EQ(run.grid().traffic()[axis].calls, want[axis].calls) << name_of(axis) << " calls";
    }
    ++tested;
  }
  EXPECT_GE(tested, 1);
}

TEST(Traffic, StepBytesMatchClosedFormFloat) {
  for_each_group(kRankCounts,
                 [](MPI_Comm c, int n) { step_bytes_match<float>(c, n, Recompute::full); });
}
TEST(Traffic, StepBytesMatchClosedFormDoubleNoCheckpoint) {
  for_each_group(kRankCounts,
                 [](MPI_Comm c, int n) { step_bytes_match<double>(c, n, Recompute::none); });
}
// bf16: 2-byte activations and parameters, 4-byte (fp32) row statistics; the
// covering subset (every scheme's algebra is the float and double tests';
// bf16 changes the element sizes, which every scheme takes from one place),
// with selective recompute (the same bytes as none: attention's recomputed
// probabilities are local).
TEST(Traffic, StepBytesMatchClosedFormBf16) {
  for_each_group(kRankCounts, [](MPI_Comm c, int n) {
    step_bytes_match<bf16, false>(c, n, Recompute::selective);
  });
}

// The agreements one call of `step` makes on this process.
template <class F>
std::uint64_t agreements_in(F&& step) {
  const std::uint64_t before = agreements_made();
  step();
  return agreements_made() - before;
}

void steady_steps_agree_nothing(MPI_Comm comm, int ranks) {
  const Step step = small_step(ranks, 8);
  const auto& [config, batch, seq, tokens, targets] = step;
  const std::vector<std::int32_t> window(tokens.begin(), tokens.begin() + batch);
  const std::vector<index_t> positions(static_cast<std::size_t>(batch), 0);
  CpuBackend backend;
  const std::vector<SchemeSpec> specs = representative_schemes(ranks);
  for (const SchemeSpec& spec : specs)
    for (bool debug : {false, true}) {
      // the debug mode's agreements (that the counter sees them) on the
      // first scheme of the rank count
      if (debug && &spec != &specs.front()) continue;
      SCOPED_TRACE(spec.str() + (debug ? " check_calls" : ""));
      GridOptions grid;
      grid.check_calls = debug;
      ParallelGpt<double> run(comm, spec, backend, config, batch, seq, {}, grid);
      run.model().init(1);
      const auto train = [&] {
        run.model().forward(tokens, targets);
        run.model().backward();
      };
      train();  // the first step may size what it needs
      const std::uint64_t trained = agreements_in(train);
      ParallelGpt<double> decoder(comm, spec, backend, config, batch, 1,
                                  {.inference = true, .kv_cache = config.n_positions}, grid);
      decoder.model().init(1);
      index_t start = 0;
      const auto decode = [&] {
        decoder.model().forward_cached(window, start++);
        (void)decoder.model().next_tokens(positions, SamplingOptions{}, 0);
      };
      decode();
      const std::uint64_t decoded = agreements_in(decode);
      if (debug) {
        EXPECT_GT(trained, 0u);
        EXPECT_GT(decoded, 0u);
      } else {
        EXPECT_EQ(trained, 0u) << "agreements in a training step";
        EXPECT_EQ(decoded, 0u) << "agreements in a decoding step";
      }
    }
}
TEST(Traffic, SteadyStepsMakeNoAgreement) {
  for_each_group(kRankCounts, steady_steps_agree_nothing);
}

// AxoNN §V-A: with X only, 3D is Megatron (the same bytes as 1D, on the X
// axis instead of the tensor axis); with Z only it is FSDP / ZeRO-3 (no
// activation traffic over X or Y, everything over Z).
void three_d_reduces(MPI_Comm comm, int ranks) {
  if (ranks == 1) return;  // needs more than one rank
  reference::GptConfig config;
  config.n_layer = 2;
  config.n_head = 72;
  config.n_embd = 144;
  config.n_positions = 8;
  config.vocab_size = 72;
  const index_t batch = 72, seq = 3;
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(batch * seq), 5), targets = tokens;
  CpuBackend backend;
  const auto measured = [&](const std::string& text) {
    ParallelGpt<float> run(comm, SchemeSpec::parse(text), backend, config, batch, seq);
    run.model().init(1);
    run.grid().reset_traffic();
    run.model().forward(tokens, targets);
    run.model().backward();
    return run.grid().traffic();
  };
  const std::string p = std::to_string(ranks);
  const TrafficCounters megatron = measured("1d:p=" + p);
  const TrafficCounters x_only = measured("3d:" + p + "x1x1");
  EXPECT_EQ(x_only[CommAxis::mesh_col].bytes_sent, megatron[CommAxis::tensor].bytes_sent);
  EXPECT_EQ(x_only.total().bytes_sent, megatron.total().bytes_sent);
  const TrafficCounters z_only = measured("3d:1x1x" + p);
  EXPECT_EQ(z_only[CommAxis::mesh_col].bytes_sent, 0u);
  EXPECT_EQ(z_only[CommAxis::mesh_row].bytes_sent, 0u);
  EXPECT_GT(z_only[CommAxis::depth].bytes_sent, 0u);
  EXPECT_EQ(z_only.total().bytes_sent, z_only[CommAxis::depth].bytes_sent);
}
TEST(Traffic, ThreeDReducesToMegatronAndFsdp) {
  const std::vector<int> covered = for_each_group(kRankCounts, three_d_reduces);
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world == 9) {
    EXPECT_EQ(covered, (std::vector<int>{9, 8, 4, 2, 1}));
  }
}

}  // namespace
}  // namespace summa::test

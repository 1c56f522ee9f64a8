// Communication accounting: for every implemented scheme of 1, 2, 4, 8 and
// 9 ranks, the bytes each rank sends and receives on every axis in one
// training step, read from the counters, equal the closed form of
// summa::model::predict_step_traffic exactly — float and double,
// checkpointing on and off, with and without a data axis. One launch of 9
// ranks covers every rank count on sub-communicators (for_each_group:
// [9], then [8, 1], then [4, 2] at once); a smaller launch covers the
// counts that fit.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "summa/model/traffic.hpp"
#include "test_util.hpp"

namespace summa::test {
namespace {

// The rank counts the suite covers.
const std::vector<int> kRankCounts = {1, 2, 4, 8, 9};

template <class T>
void step_bytes_match(MPI_Comm comm, int ranks, bool checkpoint) {
  reference::GptConfig config;
  config.n_layer = 2;
  config.n_head = 72;
  config.n_embd = 144;
  config.n_positions = 7;  // uneven position chunks at q = 2, 3
  config.vocab_size = 72;
  const index_t batch = common_batch(schemes_for(ranks)), seq = 3;
  std::mt19937_64 gen(fresh_seed());
  std::uniform_int_distribution<int> dist(0, config.vocab_size - 1);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(batch * seq)), targets(tokens.size());
  for (auto& t : tokens) t = dist(gen);
  for (auto& t : targets) t = dist(gen);
  CpuBackend backend;
  int tested = 0;
  for (const SchemeSpec& spec : schemes_for(ranks)) {
    SCOPED_TRACE(spec.str());
    const GptOptions options{.checkpoint = checkpoint};
    ParallelGpt<T> run(comm, spec, backend, config, batch, seq, options);
    run.model().init(1);
    run.grid().reset_traffic();
    run.model().forward(tokens, targets);
    run.model().backward();
    const TrafficCounters want = model::predict_step_traffic(spec, config, batch, seq, options,
                                                             dtype_v<T>, run.grid().coords());
    for (std::size_t a = 0; a < comm_axis_count; ++a) {
      const auto axis = static_cast<CommAxis>(a);
      EXPECT_EQ(run.grid().traffic()[axis].bytes_sent, want[axis].bytes_sent) << name_of(axis);
      EXPECT_EQ(run.grid().traffic()[axis].bytes_received, want[axis].bytes_received)
          << name_of(axis);
    }
    ++tested;
  }
  EXPECT_GE(tested, 1);
}

TEST(Traffic, StepBytesMatchClosedFormFloat) {
  for_each_group(kRankCounts, [](MPI_Comm c, int n) { step_bytes_match<float>(c, n, true); });
}
TEST(Traffic, StepBytesMatchClosedFormDoubleNoCheckpoint) {
  for_each_group(kRankCounts, [](MPI_Comm c, int n) { step_bytes_match<double>(c, n, false); });
}
// bf16: 2-byte activations and parameters, 4-byte (fp32) row statistics.
TEST(Traffic, StepBytesMatchClosedFormBf16) {
  for_each_group(kRankCounts, [](MPI_Comm c, int n) { step_bytes_match<bf16>(c, n, true); });
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

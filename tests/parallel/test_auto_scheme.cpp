// --scheme auto (summa/parallel/auto_scheme.hpp) on 4 ranks: every scheme of
// the rank count is a candidate; a choice's memory is the planner's total
// (the largest over ranks) and its time the step-time model's prediction;
// the choices come fastest first, the ones over the memory budget or refused
// by their scheme after them with the reason; every rank gets the same list.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <thread>

#include "summa/parallel/auto_scheme.hpp"
#include "summa/parallel/memory_check.hpp"
#include "summa/schemes/megatron1d/spec.hpp"
#include "summa/schemes/registry.hpp"
#include "test_util.hpp"

namespace summa::test {
namespace {

model::Machine machine() {
  model::Machine m;
  m.name = "test";
  m.devices_per_node = 2;
  m.device.memory_bytes = 1ull << 34;
  m.device.memory_bandwidth = 1e10;
  m.device.gemm_of(DType::f32) = {
      .peak_flops = 1e11, .max_efficiency = 0.9, .half_flops = 1e6, .table = {}};
  for (model::Collective c : model::all_collectives) {
    m.intra_node[c] = {1e-6, 5e9, model::Algorithm::ring, {}};
    m.inter_node[c] = {5e-6, 1e9, model::Algorithm::ring, {}};
  }
  return m;
}

GptConfig config(int heads) {
  GptConfig c;
  c.n_layer = 2;
  c.n_head = heads;
  c.n_embd = 16 * heads;
  c.n_positions = 8;
  c.vocab_size = 64;
  return c;
}

std::string listing(const std::vector<SchemeCandidate>& all) {
  std::string s;
  for (const SchemeCandidate& c : all)
    s += c.spec.str() + " " + std::to_string(c.memory_bytes) + " " + std::to_string(c.time.step_s) +
         " " + c.rejected + "\n";
  return s;
}

TEST(AutoScheme, RanksEverySchemeByPredictedStepWithinTheBudget) {
  int ranks = 1;
  MPI_Comm_size(test_comm(), &ranks);
  CpuBackend backend;
  const model::Machine m = machine();
  const GptConfig c = config(4);
  const index_t batch = 8, seq = 8;
  const GptOptions o{.recompute = Recompute::full};
  const auto all = rank_schemes<float>(test_comm(), backend, c, batch, seq, o, m,
                                       {.budget_bytes = ~std::uint64_t{0}});
  ASSERT_EQ(all.size(), candidate_schemes(ranks, o).size() +
                            candidate_pipelines(ranks, c, batch, o, {}).size());
  EXPECT_TRUE(same_on_all_ranks(listing(all)));
  for (std::size_t i = 0; i < all.size(); ++i) {
    SCOPED_TRACE(all[i].spec.str());
    EXPECT_EQ(all[i].rejected, "");
    if (i > 0) {
      EXPECT_LE(all[i - 1].time.step_s, all[i].time.step_s);
    }
    if (all[i].spec.pipeline.active()) {
      ASSERT_TRUE(all[i].pipeline.has_value());
      EXPECT_EQ(
          all[i].time.step_s,
          model::predict_pipeline_step_time(all[i].spec, c, batch, seq, o, DType::f32, m).step_s);
    } else {
      EXPECT_EQ(all[i].time.step_s,
                model::predict_step_time(all[i].spec, c, batch, seq, o, DType::f32, m).step_s);
    }
    unsigned long long want =
        plan_memory<float>(test_comm(), all[i].spec, backend, c, batch, seq, o).total();
    MPI_Allreduce(MPI_IN_PLACE, &want, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, test_comm());
    EXPECT_EQ(all[i].memory_bytes, want);
  }
  // A budget between the smallest and the largest plan: the rest are
  // rejected, named, after the choices.
  std::uint64_t lo = ~std::uint64_t{0}, hi = 0;
  for (const SchemeCandidate& x : all) {
    lo = std::min<std::uint64_t>(lo, x.memory_bytes);
    hi = std::max<std::uint64_t>(hi, x.memory_bytes);
  }
  ASSERT_LT(lo, hi);
  const std::uint64_t budget = (lo + hi) / 2;
  const auto tight =
      rank_schemes<float>(test_comm(), backend, c, batch, seq, o, m, {.budget_bytes = budget});
  bool rejecting = false;
  int rejected = 0;
  for (const SchemeCandidate& x : tight) {
    SCOPED_TRACE(x.spec.str());
    EXPECT_EQ(x.rejected.empty(), x.memory_bytes <= budget);
    if (!x.rejected.empty()) {
      EXPECT_NE(x.rejected.find("exceeds the budget"), std::string::npos) << x.rejected;
      ++rejected;
    }
    EXPECT_FALSE(rejecting && x.rejected.empty()) << "a choice after a rejected scheme";
    rejecting = rejecting || !x.rejected.empty();
  }
  EXPECT_GT(rejected, 0);
  EXPECT_LT(rejected, static_cast<int>(tight.size()));
}

// Pipelines are candidates: P stages for each P dividing the ranks up to
// min(max_stages, n_layer), each stage every training candidate of ranks / P
// but zero >= 2 (1D with dc=on too under full recompute), over microbatches
// of the two largest k <= 8 units leaving 2P of them; the same but dc=on
// under the other recompute modes; none for inference.
// On links so slow that the tensor and data collectives dominate, a
// pipeline of single-rank stages (only its activations travel) is the
// fastest.
TEST(AutoScheme, PipelinesAreCandidates) {
  int ranks = 1;
  MPI_Comm_size(test_comm(), &ranks);
  if (ranks < 2) GTEST_SKIP() << "a pipeline needs 2 ranks";
  GptConfig c = config(4);
  c.n_layer = 4;
  const GptOptions o{.recompute = Recompute::full};
  const std::vector<SchemeSpec> pipes = candidate_pipelines(ranks, c, 16, o, {});
  ASSERT_FALSE(pipes.empty());
  for (const SchemeSpec& p : pipes) {
    SCOPED_TRACE(p.str());
    EXPECT_EQ(ranks % p.pipeline.stages, 0);
    EXPECT_LE(p.pipeline.stages, std::min(ranks, c.n_layer));
    EXPECT_LE(p.zero, 1);
    const index_t micro_batch = 16 / p.pipeline.micro;  // sequences per microbatch
    EXPECT_EQ(16 % p.pipeline.micro, 0);
    EXPECT_EQ(micro_batch % batch_granularity(p.stage()), 0);
    EXPECT_GE(p.pipeline.micro, 2 * p.pipeline.stages);
    EXPECT_EQ(p.ranks(), ranks);
  }
  // per stage scheme and P: microbatches of the two largest k of 8, 4, 2, 1
  // units that leave 2P of them
  std::map<std::string, std::vector<index_t>> ks;
  for (const SchemeSpec& p : pipes)
    ks[p.stage().str() + " P=" + std::to_string(p.pipeline.stages)].push_back(
        16 / p.pipeline.micro / batch_granularity(p.stage()));
  for (const auto& [key, got] : ks) {
    SCOPED_TRACE(key);
    const SchemeSpec stage = SchemeSpec::parse(key.substr(0, key.find(' ')));
    const int stages = std::stoi(key.substr(key.find("P=") + 2));
    std::vector<index_t> want;
    for (const index_t k : {8, 4, 2, 1}) {
      const index_t unit = batch_granularity(stage) * k;
      if (16 % unit == 0 && 16 / unit >= 2 * stages && want.size() < 2) want.push_back(k);
    }
    EXPECT_EQ(got, want);
  }
  // every recompute mode (a stage keeps its blocks' activations per slot
  // without checkpoints), without dc=on, not inference
  const auto dc = [](const SchemeSpec& p) {
    return p.stage().holds<Megatron1DSpec>() &&
           p.stage().as<Megatron1DSpec>().distribute_checkpoints;
  };
  std::vector<SchemeSpec> without_dc = pipes;
  std::erase_if(without_dc, dc);
  // 1D stages of p > 1 ranks with distributed checkpoints, as unpipelined
  if (ranks >= 4) {
    EXPECT_LT(without_dc.size(), pipes.size());
  }
  for (const Recompute r : {Recompute::none, Recompute::selective}) {
    const std::vector<SchemeSpec> kept = candidate_pipelines(ranks, c, 16, {.recompute = r}, {});
    EXPECT_EQ(kept, without_dc) << to_string(r);
  }
  EXPECT_TRUE(candidate_pipelines(ranks, c, 16, {.inference = true}, {}).empty());
  EXPECT_TRUE(candidate_pipelines(ranks, c, 16, o, {.pipelines = false}).empty());
  EXPECT_TRUE(candidate_pipelines(ranks, c, 16, o, {.max_stages = 1}).empty());
  model::Machine slow = machine();
  for (model::Collective k : model::all_collectives) {
    slow.intra_node[k].beta_bytes_s = 1e5;
    slow.inter_node[k].beta_bytes_s = 1e5;
  }
  CpuBackend backend;
  const auto all = rank_schemes<float>(test_comm(), backend, c, 16, 8, o, slow,
                                       {.budget_bytes = ~std::uint64_t{0}});
  EXPECT_TRUE(all.front().spec.pipeline.active()) << listing(all);
  EXPECT_EQ(all.front().spec.pipeline.stages, std::min(ranks, c.n_layer)) << listing(all);
}

// With per-block checkpoints the search also tries each plain 1D over p > 1
// ranks with distributed checkpoints, which plans less memory: n_layer
// boundaries of (p-1)/p of a slot less in the checkpoint buffer.
TEST(AutoScheme, DistributedCheckpointsAreCandidatesWithFullRecompute) {
  int ranks = 1;
  MPI_Comm_size(test_comm(), &ranks);
  const auto plain_1d = [](const SchemeSpec& s) {
    return s.holds<Megatron1DSpec>() && s.as<Megatron1DSpec>().p > 1 &&
           !s.as<Megatron1DSpec>().sequence_parallel &&
           !s.as<Megatron1DSpec>().distribute_checkpoints;
  };
  std::size_t want = 0, sharded = 0;
  for (const SchemeSpec& s : schemes_for(ranks)) {
    want += plain_1d(s) ? 1 : 0;
    sharded += s.data > 1 ? 1 : 0;
  }
  const std::size_t listed = schemes_for(ranks).size();
  for (const Recompute r : {Recompute::none, Recompute::selective, Recompute::full}) {
    SCOPED_TRACE(to_string(r));
    const std::vector<SchemeSpec> list = candidate_schemes(ranks, {.recompute = r});
    ASSERT_EQ(list.size(), listed + 3 * sharded + (r == Recompute::full ? want : 0));
    for (std::size_t i = 0; i < list.size(); ++i) {
      SCOPED_TRACE(list[i].str());
      const bool dc =
          list[i].holds<Megatron1DSpec>() && list[i].as<Megatron1DSpec>().distribute_checkpoints;
      // zero=1 next, then zero=2, zero=3, dc=on last
      const int level = i < listed || i >= listed + 3 * sharded
                            ? 0
                            : 1 + static_cast<int>((i - listed) / sharded);
      EXPECT_EQ(list[i].zero, level);
      EXPECT_EQ(dc, i >= listed + 3 * sharded);
    }
  }
  // inference: no optimizer state to shard, no checkpoints to distribute
  EXPECT_EQ(candidate_schemes(ranks, {.inference = true}).size(), listed);
  if (want == 0) return;
  CpuBackend backend;
  const GptConfig c = config(4);
  const index_t batch = 8, seq = 8;
  const GptOptions o{.recompute = Recompute::full};
  for (const SchemeSpec& dc : candidate_schemes(ranks, o)) {
    if (!dc.holds<Megatron1DSpec>() || !dc.as<Megatron1DSpec>().distribute_checkpoints) continue;
    SCOPED_TRACE(dc.str());
    SchemeSpec whole = dc;
    whole.as<Megatron1DSpec>().distribute_checkpoints = false;
    const auto checkpoint = [&](const SchemeSpec& s) {
      for (const BufferUsage& u :
           plan_memory_busiest<float>(s, backend, c, batch, seq, o).report.buffers)
        if (u.name == "checkpoint") return u.capacity;
      ADD_FAILURE() << "no checkpoint buffer";
      return std::size_t{0};
    };
    const index_t p = dc.as<Megatron1DSpec>().p;
    const index_t slot = batch / dc.data * seq * c.n_embd;
    EXPECT_EQ(checkpoint(whole) - checkpoint(dc),
              static_cast<std::size_t>(c.n_layer) * (Arena::rounded(slot * sizeof(float)) -
                                                     Arena::rounded(slot / p * sizeof(float))));
  }
}

TEST(AutoScheme, SchemesThatRefuseTheModelAreRejectedWithTheirReason) {
  int ranks = 1;
  MPI_Comm_size(test_comm(), &ranks);
  if (ranks < 2) GTEST_SKIP() << "every scheme of one rank accepts any model";
  CpuBackend backend;
  // 3 heads: no scheme splitting heads over 2 or 4 ranks takes it
  const auto all = rank_schemes<float>(test_comm(), backend, config(3), 8, 8, {}, machine(),
                                       {.budget_bytes = ~std::uint64_t{0}});
  int refused = 0;
  for (const SchemeCandidate& x : all)
    if (!x.rejected.empty()) {
      ++refused;
      EXPECT_EQ(x.rejected.find("exceeds the budget"), std::string::npos) << x.rejected;
      // planned without a launch, refused with the launch's own message
      try {
        static_cast<void>(plan_memory<float>(test_comm(), x.spec, backend, config(3), 8, 8, {}));
        ADD_FAILURE() << x.spec.str() << " refused without a launch but accepted in one";
      } catch (const Error& e) {
        EXPECT_EQ(x.rejected, e.what()) << x.spec.str();
      }
    }
  EXPECT_GT(refused, 0);
  ASSERT_FALSE(all.empty());
  EXPECT_TRUE(all.front().rejected.empty()) << "the data axis alone always takes it";
  EXPECT_TRUE(same_on_all_ranks(listing(all)));
}

// Without a launch (a rank count instead of a communicator): the same
// ranking, and the optimizer state counted against the budget.
TEST(AutoScheme, LaunchFreeRankingAndOptimizerState) {
  int ranks = 1;
  MPI_Comm_size(test_comm(), &ranks);
  CpuBackend backend;
  const GptConfig c = config(4);
  const auto launched = rank_schemes<float>(test_comm(), backend, c, 8, 8, {}, machine(),
                                            {.budget_bytes = ~std::uint64_t{0}});
  const auto alone = rank_schemes<float>(ranks, backend, c, 8, 8, {}, machine(),
                                         {.budget_bytes = ~std::uint64_t{0}});
  EXPECT_EQ(listing(alone), listing(launched));
  const auto with_state =
      rank_schemes<float>(ranks, backend, c, 8, 8, {}, machine(),
                          {.budget_bytes = ~std::uint64_t{0}, .state_bytes_per_parameter = 8});
  ASSERT_EQ(with_state.size(), alone.size());
  for (const SchemeCandidate& x : with_state) {
    SCOPED_TRACE(x.spec.str());
    const RankMemory plan = plan_memory_busiest<float>(x.spec, backend, c, 8, 8);
    EXPECT_EQ(x.memory_bytes, plan.report.total() + plan.report.parameter_elements * 8 /
                                                        (x.spec.zero > 0 ? x.spec.data : 1));
    EXPECT_EQ(x.busiest, plan.coords);
  }
}

// Ranks per device: on the host's memory the node's ranks over its cores
// (rounded up); on a device the node's ranks with the same memory domain,
// the busiest node's on every rank. The domains below stand for GPUs: ranks
// on one node (a CTest launch) in pairs, alone, or all on one.
TEST(AutoScheme, RanksPerDevice) {
  int rank = 0, ranks = 1, local = 1;
  MPI_Comm_rank(test_comm(), &rank);
  MPI_Comm_size(test_comm(), &ranks);
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(test_comm(), MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  MPI_Comm_size(node, &local);
  MPI_Comm_free(&node);
  CpuBackend cpu;
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  EXPECT_EQ(ranks_per_device(test_comm(), cpu), (local + cores - 1) / cores);
  EXPECT_EQ(ranks_in_memory_domain(test_comm(), "host"), local);
  EXPECT_EQ(ranks_in_memory_domain(test_comm(), "cuda:" + std::to_string(rank)), 1);
  EXPECT_EQ(ranks_in_memory_domain(test_comm(), "cuda:pair" + std::to_string(rank / 2)),
            std::min(2, ranks - rank / 2 * 2));
  // a UUID longer than the compared 64 bytes: told apart by its start only
  EXPECT_EQ(ranks_in_memory_domain(test_comm(), std::string(64, 'u') + std::to_string(rank)),
            local);
  // a device: its ranks on the node, the most on any rank (every rank alike)
  EXPECT_EQ(ranks_per_device(test_comm(), "cuda:" + std::to_string(rank)), 1);
  EXPECT_EQ(ranks_per_device(test_comm(), "cuda:pair" + std::to_string(rank / 2)),
            std::min(2, ranks));
  EXPECT_EQ(ranks_per_device(test_comm(), rank == 0 ? "cuda:a" : "cuda:b"), std::max(1, local - 1));
  EXPECT_EQ(ranks_per_device(test_comm(), "cuda:one"), local);
}

// The memory check's lower bound counts zero=2's gradients as this group's
// chunk (a 1/D share): the bound scales the gradients' bytes alone by it,
// and at 4 ranks a zero=2 run whose plan fits its budget is not refused by
// a bound that would exceed that budget with the gradients counted whole.
TEST(MemoryCheck, ZeroTwoBoundCountsTheGradientChunk) {
  GptConfig c = config(4);
  c.n_layer = 8;
  const double host = c.n_layer * host_bytes_per_block;
  const double values = memory_lower_bound(1, c, 4, false, 0) - host;  // the parameters' bytes
  EXPECT_DOUBLE_EQ(memory_lower_bound(2, c, 4, true, 8, 0.25) - host,
                   (values * 1.25 + values * 2) / 2);
  EXPECT_DOUBLE_EQ(memory_lower_bound(2, c, 4, true, 8) - host, (values * 2 + values * 2) / 2);
  int ranks = 1;
  MPI_Comm_size(test_comm(), &ranks);
  if (ranks != 4) GTEST_SKIP() << "data=4:zero=2 needs 4 ranks";
  const SchemeSpec spec = SchemeSpec::parse("data=4:zero=2,2d:q=1");
  CpuBackend backend;
  const index_t batch = 4, seq = 4;
  const GptOptions o{.recompute = Recompute::full};
  const double state = 8;  // AdamW's two fp32 moments per element, over the 4 groups below
  const MemoryReport plan = plan_memory<float>(test_comm(), spec, backend, c, batch, seq, o);
  double need =
      static_cast<double>(plan.total()) + static_cast<double>(plan.parameter_elements) * state / 4;
  MPI_Allreduce(MPI_IN_PLACE, &need, 1, MPI_DOUBLE, MPI_MAX, test_comm());
  const MemoryBudget budget{
      .bytes = need * 1.001, .source = "of the test", .state_bytes_per_parameter = state};
  // counted whole, the gradients alone would refuse it
  ASSERT_GT(memory_lower_bound(1, c, sizeof(float), true, state / 4), budget.bytes);
  EXPECT_NO_THROW(static_cast<void>(require_memory_fits<float>(test_comm(), spec, backend, c, batch,
                                                               seq, o, {}, budget, "test")));
  // zero=1 keeps them whole: its bound refuses the same budget
  EXPECT_THROW(static_cast<void>(require_memory_fits<float>(
                   test_comm(), SchemeSpec::parse("data=4:zero=1,2d:q=1"), backend, c, batch, seq,
                   o, {}, budget, "test")),
               Error);
}

}  // namespace
}  // namespace summa::test

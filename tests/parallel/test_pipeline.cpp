// The pipeline axis (parallel/pipeline.hpp): the stage split and the static
// schedules' orders as properties; then PipelineGpt under every schedule,
// composed with tensor schemes and a data axis, against the serial
// reference on fresh data: the loss and every parameter gradient of every
// stage (both copies of the tied embedding), the stage messages' bytes
// against their count, the traces (each stage's backwards in microbatch
// order, never more in flight than the slots or the limit), and the same
// gradient bits under every schedule. Tolerance model_tolerance<double>()
// (1e-9 relative per tensor, test_util.hpp: microbatching only reorders
// the sums of the batch's gradients). One launch of 8 ranks covers 8, 4, 3,
// 2 and 1 ranks on sub-communicators (for_each_group).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "../../src/comm/staging_fit.hpp"
#include "summa/backend/cpu_backend.hpp"
#include "summa/model/traffic.hpp"
#include "summa/parallel/pipeline.hpp"
#include "summa/reference/gpt.hpp"
#include "summa/train/trainer.hpp"
#include "test_util.hpp"

namespace summa::test {
namespace {

TEST(Pipeline, SplitBalancesAndChecks) {
  GptConfig config;
  for (int layers = 1; layers <= 9; ++layers)
    for (int stages = 1; stages <= layers; ++stages) {
      config.n_layer = layers;
      PipelineOptions o;
      o.stages = stages;
      const std::vector<int> split = pipeline_split(config, o);
      ASSERT_EQ(static_cast<int>(split.size()), stages);
      EXPECT_EQ(std::accumulate(split.begin(), split.end(), 0), layers);
      const auto [lo, hi] = std::minmax_element(split.begin(), split.end());
      EXPECT_GE(*lo, 1);
      EXPECT_LE(*hi - *lo, 1) << layers << " over " << stages;
      // the extra blocks go to the middle stages before the ends
      if (stages > 2 && layers % stages != 0 && layers % stages <= stages - 2) {
        EXPECT_EQ(split.front(), layers / stages);
        EXPECT_EQ(split.back(), layers / stages);
      }
    }
  // By cost under each recompute mode (GPT-2 small: the LM head's 6 h V
  // per token is 3.4 blocks with full recompute, 4.5 without): the split's
  // costliest stage costs the least any contiguous split achieves (every
  // split enumerated), and the last stage, which runs the head, holds
  // fewer blocks than the others.
  config = {.n_layer = 0, .n_head = 12, .n_embd = 768, .n_positions = 1024, .vocab_size = 50257};
  {
    const double h = 768, s = 1024, forward = 24 * h * h + 4 * s * h;
    EXPECT_DOUBLE_EQ(pipeline_costs(config, Recompute::full).block, 4 * forward);
    EXPECT_DOUBLE_EQ(pipeline_costs(config, Recompute::none).block, 3 * forward);
    EXPECT_DOUBLE_EQ(pipeline_costs(config, Recompute::selective).block, 3 * forward + 2 * s * h);
    EXPECT_EQ(pipeline_costs(config).block, pipeline_costs(config, Recompute::full).block);
  }
  int differ = 0;  // splits that weigh the block differently
  for (const Recompute recompute : {Recompute::full, Recompute::none, Recompute::selective}) {
    SCOPED_TRACE(to_string(recompute));
    const PipelineCosts c = pipeline_costs(config, recompute);
    EXPECT_GT(c.head, 3 * c.block);
    EXPECT_LT(c.embedding, c.block / 1000);
    for (int layers = 1; layers <= 12; ++layers)
      for (int stages = 1; stages <= layers; ++stages) {
        config.n_layer = layers;
        PipelineOptions o;
        o.stages = stages;
        const auto worst = [&](const std::vector<int>& split) {
          double w = 0;
          for (int s = 0; s < stages; ++s)
            w = std::max(w, split[static_cast<std::size_t>(s)] * c.block +
                                (s == 0 ? c.embedding : 0) + (s == stages - 1 ? c.head : 0));
          return w;
        };
        double least = std::numeric_limits<double>::infinity();
        std::vector<int> parts;  // every composition of `layers` into `stages` parts
        const auto each = [&](auto&& self, int left) -> void {
          if (static_cast<int>(parts.size()) == stages - 1) {
            if (left < 1) return;
            parts.push_back(left);
            least = std::min(least, worst(parts));
            parts.pop_back();
            return;
          }
          for (int b = 1; b < left; ++b) {
            parts.push_back(b);
            self(self, left - b);
            parts.pop_back();
          }
        };
        each(each, layers);
        const std::vector<int> split = pipeline_split(config, o, recompute);
        EXPECT_EQ(std::accumulate(split.begin(), split.end(), 0), layers);
        EXPECT_LE(worst(split), least * (1 + 1e-9)) << layers << " over " << stages;
        if (stages > 1 && layers >= 4 * stages) {
          EXPECT_LT(split.back(), split.front()) << layers << " over " << stages;
        }
        if (split != pipeline_split(config, o)) ++differ;
      }
  }
  EXPECT_GT(differ, 0) << "no split weighs the recompute mode";
  config.n_layer = 24;  // 24 blocks of GPT-2 small's width over 3 stages
  PipelineOptions three;
  three.stages = 3;
  EXPECT_EQ(pipeline_split(config, three, Recompute::full), (std::vector<int>{9, 9, 6}));
  EXPECT_EQ(pipeline_split(config, three, Recompute::none), (std::vector<int>{9, 10, 5}));
  config.n_layer = 12;
  PipelineOptions four;
  four.stages = 4;
  EXPECT_EQ(pipeline_split(config, four), (std::vector<int>{3, 4, 4, 1}));  // the rest even

  config = {};
  config.n_layer = 4;
  PipelineOptions o;
  o.stages = 2;
  o.split = {3, 1};
  EXPECT_EQ(pipeline_split(config, o), (std::vector<int>{3, 1}));
  for (const std::vector<int>& bad : std::vector<std::vector<int>>{{4, 0}, {2, 1}, {1, 1, 2}}) {
    o.split = bad;
    EXPECT_THROW((void)pipeline_split(config, o), Error);
  }
  o.split.clear();
  o.stages = 5;
  EXPECT_THROW((void)pipeline_split(config, o), Error);  // a stage without a block
  o.stages = 2;
  o.micro = 0;
  EXPECT_THROW((void)pipeline_split(config, o), Error);
  EXPECT_EQ(parse_pipe_schedule("1f1b", "schedule"), PipeSchedule::one_f_one_b);
  EXPECT_THROW((void)parse_pipe_schedule("zb", "schedule"), Error);
}

// Every microbatch's forward, then its backward, once each, backwards in
// order; 1F1B's warm-up is P - 1 - s forwards; the most in flight is the
// slots pipeline_slots gives.
TEST(Pipeline, SchemeTextTakesThePipeline) {
  const SchemeSpec s =
      SchemeSpec::parse("data=2,pipe=4:micro=8:limit=3:schedule=1f1b:split=1+2+2+1,1d:p=2");
  EXPECT_EQ(s.pipeline.stages, 4);
  EXPECT_EQ(s.pipeline.micro, 8);
  EXPECT_EQ(s.pipeline.limit, 3);
  EXPECT_EQ(s.pipeline.schedule, PipeSchedule::one_f_one_b);
  EXPECT_EQ(s.pipeline.split, (std::vector<int>{1, 2, 2, 1}));
  EXPECT_EQ(s.ranks(), 16);
  EXPECT_EQ(s.stage().ranks(), 4);
  EXPECT_FALSE(s.stage().pipeline.active());
  EXPECT_EQ(SchemeSpec::parse(s.str()), s);
  EXPECT_EQ(SchemeSpec::parse("pipe=1:micro=4,2d:q=1").ranks(), 1);  // accumulation
  EXPECT_TRUE(SchemeSpec::parse("pipe=1:micro=4,2d:q=1").pipeline.active());
  EXPECT_EQ(SchemeSpec::parse("pipe=2,2d:q=1").str(), "pipe=2,2d:q=1");
  for (const char* bad :
       {"pipe=0,2d:q=1", "pipe=2:micro=0,2d:q=1", "pipe=2:schedule=zb,2d:q=1",
        "pipe=2:split=1+1+1,2d:q=1", "pipe=2:micro=2:micro=3,2d:q=1", "pipe=2:depth=2,2d:q=1",
        "pipe=2,pipe=2,2d:q=1", "pipe=2:split=1+0,2d:q=1"})
    EXPECT_THROW((void)SchemeSpec::parse(bad), Error) << bad;
}

TEST(Pipeline, StaticOrdersAreFlushedSchedules) {
  for (const PipeSchedule schedule : {PipeSchedule::gpipe, PipeSchedule::one_f_one_b})
    for (int stages = 1; stages <= 5; ++stages)
      for (int micro = 1; micro <= 7; ++micro)
        for (int s = 0; s < stages; ++s) {
          SCOPED_TRACE(std::string(to_string(schedule)) + " stage " + std::to_string(s) + "/" +
                       std::to_string(stages) + " micro " + std::to_string(micro));
          const std::vector<PipeOp> ops = pipeline_order(schedule, s, stages, micro);
          ASSERT_EQ(static_cast<int>(ops.size()), 2 * micro);
          std::vector<int> forwarded(static_cast<std::size_t>(micro), 0);
          int next_backward = 0, in_flight = 0, peak = 0, warm = 0;
          bool warming = true;
          for (const PipeOp& op : ops) {
            if (op.forward) {
              EXPECT_EQ(forwarded[static_cast<std::size_t>(op.micro)]++, 0);
              peak = std::max(peak, ++in_flight);
              if (warming) ++warm;
            } else {
              warming = false;
              EXPECT_EQ(op.micro, next_backward++);
              EXPECT_EQ(forwarded[static_cast<std::size_t>(op.micro)], 1);
              --in_flight;
            }
          }
          PipelineOptions o;
          o.stages = stages;
          o.micro = micro;
          o.schedule = schedule;
          EXPECT_EQ(peak, pipeline_slots(o, s));
          if (schedule == PipeSchedule::one_f_one_b)
            EXPECT_EQ(warm, std::min(micro, stages - s));
          else
            EXPECT_EQ(warm, micro);
        }
  EXPECT_THROW((void)pipeline_order(PipeSchedule::axonn, 0, 2, 2), Error);
}

struct Case {
  int stages;
  const char* scheme;
  int micro;
  int limit;
};

// Per rank count: pipelines over 1D, 2D and 3D, with and without a data
// axis (sharded too), 1 to 4 stages.
std::vector<Case> cases_for(int ranks) {
  switch (ranks) {
    case 1:
      return {{1, "2d:q=1", 4, 2}};
    case 2:
      return {{2, "2d:q=1", 4, 0}, {2, "2d:q=1", 3, 1}, {1, "1d:p=2", 2, 1}};
    case 3:
      return {{3, "1d:p=1", 4, 2}};
    case 4:
      return {{2, "1d:p=2", 4, 0},       {2, "data=2,2d:q=1", 2, 0},
              {4, "2d:q=1", 5, 3},       {2, "data=2:zero=1,1d:p=1", 4, 2},
              {2, "1d:p=2,sp=on", 4, 2}, {2, "1d:p=2,dc=on", 4, 2}};
    case 8:
      // middle stages of tensor groups of 2 (the message-driven schedule's
      // choice of message agreed over the group)
      return {{2, "2d:q=2", 2, 0},
              {2, "3d:1x2x2", 2, 1},
              {2, "3d:2x2x1,overlap=oar+ors+oag", 3, 0},
              {4, "data=2,1d:p=1", 4, 0},
              {4, "1d:p=2", 6, 2},
              {4, "3d:1x1x2", 4, 2},
              {2, "1d:p=4,dc=on", 3, 0}};
    case 9:
      // three stages of 1D groups of 3, and of 3 data groups
      return {{3, "1d:p=3", 3, 0}, {3, "data=3,2d:q=1", 3, 2}};
    default:
      return {};
  }
}

void pipeline_matches_reference(MPI_Comm comm, int ranks) {
  GptConfig config;
  config.n_layer = 4;
  config.n_head = ranks % 3 == 0 ? 6 : 4;  // heads and hidden over 1D groups of 3
  config.n_embd = ranks % 3 == 0 ? 24 : 16;
  config.n_positions = 8;
  config.vocab_size = 24;
  const index_t seq = 4;
  for (const Case& c : cases_for(ranks)) {
    const index_t batch = c.micro * batch_granularity(SchemeSpec::parse(c.scheme));
    SCOPED_TRACE(std::string(c.scheme) + " x pipe " + std::to_string(c.stages) + ", micro " +
                 std::to_string(c.micro));
    const std::uint64_t seed = fresh_seed();
    SCOPED_TRACE(seed_note(seed));
    std::mt19937_64 gen(seed);
    std::uniform_int_distribution<int> dist(0, config.vocab_size - 1);
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(batch * seq)), targets(tokens.size());
    for (auto& t : tokens) t = dist(gen);
    for (auto& t : targets) t = dist(gen);
    reference::Gpt<double> ref(config, seed);
    const double ref_loss = ref.forward(tokens, targets, batch, seq);
    ref.backward();

    std::vector<std::vector<double>> first_grads;  // of the first run
    // every schedule under every recompute mode (without per-block
    // checkpoints the blocks' activations are kept per slot)
    struct Run {
      PipeSchedule schedule;
      Recompute recompute;
    };
    std::vector<Run> runs;
    const bool dc = std::string_view(c.scheme).ends_with("dc=on");  // recompute full only
    for (const Recompute recompute : {Recompute::full, Recompute::none, Recompute::selective})
      if (!dc || recompute == Recompute::full)
        for (const PipeSchedule schedule :
             {PipeSchedule::axonn, PipeSchedule::gpipe, PipeSchedule::one_f_one_b})
          runs.push_back({schedule, recompute});
    for (const Run run : runs) {
      const PipeSchedule schedule = run.schedule;
      const GptOptions options{.recompute = run.recompute};
      SCOPED_TRACE(std::string(to_string(schedule)) + ", recompute " +
                   std::string(to_string(run.recompute)));
      // through the scheme text, as every program takes it
      const std::string text = "pipe=" + std::to_string(c.stages) +
                               ":micro=" + std::to_string(c.micro) +
                               (c.limit > 0 ? ":limit=" + std::to_string(c.limit) : std::string()) +
                               ":schedule=" + std::string(to_string(schedule)) + "," + c.scheme;
      const SchemeSpec spec = SchemeSpec::parse(text);
      const PipelineOptions& o = spec.pipeline;
      EXPECT_EQ(o.stages, c.stages);
      EXPECT_EQ(o.schedule, schedule);
      EXPECT_EQ(SchemeSpec::parse(spec.str()), spec);
      PipelineGpt<double> pipe(comm, spec, test_backend(), config, batch, seq, options,
                               test_grid_options());
      pipe.init(seed);
      pipe.grid().reset_traffic();
      pipe.reset_pipe_traffic();
      const double loss = pipe.step(tokens, targets);
      {  // every axis's bytes and calls equal the traffic model's
        TrafficCounters got = pipe.grid().traffic();
        got[CommAxis::pipe] = pipe.pipe_traffic();
        const TrafficCounters want =
            model::predict_step_traffic(spec, config, batch, seq, options, DType::f64,
                                        pipe.grid().coords(), false, pipe.stage());
        for (std::size_t a = 0; a < comm_axis_count; ++a) {
          const auto axis = static_cast<CommAxis>(a);
          EXPECT_EQ(got[axis].bytes_sent, want[axis].bytes_sent) << name_of(axis);
          EXPECT_EQ(got[axis].bytes_received, want[axis].bytes_received) << name_of(axis);
          EXPECT_EQ(got[axis].calls, want[axis].calls) << name_of(axis) << " calls";
        }
      }
      EXPECT_NEAR(loss, ref_loss, model_tolerance<double>() * std::abs(ref_loss));
      Gpt<double>& g = pipe.model();
      const PipelineStage& ps = g.options().pipeline;
      // every parameter this stage holds, against the reference's gradient
      std::vector<std::vector<double>> grads;
      double worst = 0;
      for (Param<double>* p : g.parameters_store().params()) {
        // the last stage's embedding copy: the norm and checkpoints count
        // the first stage's
        EXPECT_EQ(p->shard.stage_copy, ps.last() && !ps.first() && p->shard.name.starts_with("w"))
            << p->shard.name;
        grads.push_back(gather_global(*p, pipe.grid(), true));
        worst = std::max(worst, rel_error(grads.back(), ref.grad(p->shard.name)));
        EXPECT_LE(rel_error(grads.back(), ref.grad(p->shard.name)), model_tolerance<double>())
            << p->shard.name;
      }
      EXPECT_LE(max_over_ranks(worst), model_tolerance<double>());
      // The same bits under every schedule and recompute: each parameter's
      // gradients are added in microbatch order, and a recomputed or kept
      // activation is the same. Not with one stage, whose tied embedding
      // takes the head's and the embedding's terms in the schedule's order.
      if (first_grads.empty()) {
        first_grads = grads;
      } else if (c.stages > 1) {
        EXPECT_EQ(grads, first_grads);
      }
      // the stage's blocks and where they sit
      const std::vector<int> split = pipeline_split(config, o, run.recompute);
      EXPECT_EQ(g.first_block(), std::accumulate(split.begin(), split.begin() + pipe.stage(), 0));
      EXPECT_EQ(g.last_block() - g.first_block(), split[static_cast<std::size_t>(pipe.stage())]);
      EXPECT_EQ(g.has_embedding(), ps.first() || ps.last());
      EXPECT_EQ(g.has_head(), ps.last());
      // the trace: every microbatch forward then backward, backwards in order
      std::vector<int> backwards;
      int in_flight = 0, peak = 0;
      for (const PipeOp& op : pipe.trace()) {
        if (op.forward) {
          peak = std::max(peak, ++in_flight);
        } else {
          --in_flight;
          backwards.push_back(op.micro);
        }
      }
      std::vector<int> order(static_cast<std::size_t>(c.micro));
      std::iota(order.begin(), order.end(), 0);
      EXPECT_EQ(backwards, order);
      EXPECT_EQ(peak, pipe.peak_in_flight());
      // when each ran: one span per operation, in order, none overlapping
      ASSERT_EQ(pipe.timings().size(), pipe.trace().size());
      double last_end = 0;
      for (const PipeTiming& t : pipe.timings()) {
        EXPECT_GE(t.start_s, last_end);
        EXPECT_GE(t.end_s, t.start_s);
        last_end = t.end_s;
      }
      EXPECT_LE(peak, ps.slots);
      if (schedule == PipeSchedule::axonn) {
        EXPECT_LE(peak, c.limit > 0 ? c.limit : c.stages);
      } else {
        std::vector<PipeOp> want = pipeline_order(schedule, pipe.stage(), c.stages, c.micro);
        EXPECT_TRUE(std::equal(want.begin(), want.end(), pipe.trace().begin(), pipe.trace().end()));
      }
      // the stage messages: a microbatch's activations forward and their
      // gradient backward, the embedding copies' gradients (wte and wpe),
      // the loss
      const MatrixView<double> x = ps.last() ? g.stage_output_grad(0) : MatrixView<double>{};
      const auto activation = static_cast<std::uint64_t>(
          ps.last() ? x.rows * x.cols : g.stage_output(0).rows * g.stage_output(0).cols);
      std::uint64_t wte = 0;
      if (c.stages > 1 && (ps.first() || ps.last()))
        for (const Param<double>* p : g.embedding().parameters())
          wte += static_cast<std::uint64_t>(p->shard.local_size());
      const std::uint64_t m = static_cast<std::uint64_t>(c.micro), e = sizeof(double);
      const std::uint64_t neighbours =
          (ps.first() ? 0 : 1) + (ps.last() ? 0 : 1);  // a message each way per microbatch
      const std::uint64_t loss_sent = c.stages > 1 && ps.last() ? (c.stages - 1) * e : 0;
      const std::uint64_t loss_received = c.stages > 1 && !ps.last() ? e : 0;
      EXPECT_EQ(pipe.pipe_traffic().bytes_sent,
                neighbours * m * activation * e + wte * e + loss_sent);
      EXPECT_EQ(pipe.pipe_traffic().bytes_received,
                neighbours * m * activation * e + wte * e + loss_received);
    }
  }
}

TEST(Pipeline, EveryScheduleMatchesReference) {
  for_each_group({9, 8, 4, 3, 2, 1}, pipeline_matches_reference);
}

// No allocation in a pipelined step (the slots, the messages' buffers, the
// static orders and the embedding exchange are all set up at
// construction): the second step of each schedule, with a data axis and a
// tensor group, allocates nothing on any rank (CPU backend; off under
// ASan, which owns malloc).
void pipeline_step_allocates_nothing(MPI_Comm comm, int ranks) {
  GptConfig config;
  config.n_layer = 4;
  config.n_head = 4;
  config.n_embd = 16;
  config.n_positions = 8;
  config.vocab_size = 24;
  const index_t seq = 4;
  std::vector<std::pair<const char*, Recompute>> schemes;
  if (ranks == 2)
    schemes = {{"pipe=2:micro=4,2d:q=1", Recompute::full},
               {"pipe=2:micro=4:schedule=gpipe,2d:q=1", Recompute::full},
               {"pipe=2:micro=4:schedule=gpipe,2d:q=1", Recompute::none}};
  if (ranks == 4)
    schemes = {{"pipe=2:micro=4:schedule=1f1b,data=2:zero=1,2d:q=1", Recompute::full},
               {"pipe=2:micro=2,1d:p=2", Recompute::full},
               {"pipe=2:micro=2,1d:p=2", Recompute::selective}};
  for (const auto& [scheme, recompute] : schemes) {
    SCOPED_TRACE(std::string(scheme) + ", recompute " + std::string(to_string(recompute)));
    const SchemeSpec spec = SchemeSpec::parse(scheme);
    const index_t batch = batch_granularity(spec);
    std::mt19937_64 gen(fresh_seed());
    std::uniform_int_distribution<int> dist(0, config.vocab_size - 1);
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(batch * seq)), targets(tokens.size());
    for (auto& t : tokens) t = dist(gen);
    for (auto& t : targets) t = dist(gen);
    CpuBackend backend;
    PipelineGpt<float> pipe(comm, spec, backend, config, batch, seq, {.recompute = recompute},
                            test_grid_options());
    pipe.init(1);
    const double first = pipe.step(tokens, targets);
    std::uint64_t count = 0;
    std::string caller;
    double second = 0;
    {
      CountAllocations counter;
      second = pipe.step(tokens, targets);
      count = counter.count();
      caller = counter.first_caller();
    }
    EXPECT_EQ(count, 0u) << "first allocation from " << caller;
    EXPECT_EQ(second, first);  // the same batch, the same weights: the same loss
  }
}

TEST(Pipeline, StepAllocatesNothing) {
  if (!allocation_counting_available()) GTEST_SKIP() << "allocation counting is off under ASan";
  for_each_group({4, 2}, pipeline_step_allocates_nothing);
}

// A directory every rank of `comm` agrees on, removed at the end.
struct SharedDir {
  std::filesystem::path path;
  MPI_Comm comm;
  explicit SharedDir(MPI_Comm c) : comm(c) {
    const std::uint64_t id = fresh_seed();
    path = std::filesystem::temp_directory_path() / ("summa_pipeline_" + std::to_string(id));
    int rank = 0;
    MPI_Comm_rank(comm, &rank);
    if (rank == 0) std::filesystem::create_directories(path);
    MPI_Barrier(comm);
  }
  ~SharedDir() {
    MPI_Barrier(comm);
    int rank = 0;
    MPI_Comm_rank(comm, &rank);
    if (rank == 0) std::filesystem::remove_all(path);
  }
  SharedDir(const SharedDir&) = delete;
  SharedDir& operator=(const SharedDir&) = delete;
};

// The trainers' small GPT (3 blocks, h 16, vocabulary 32; batch 8 of 8
// tokens) with `seed`'s weights and data order, and 1500 random tokens.
TrainerOptions small_trainer(std::uint64_t seed) {
  TrainerOptions o;
  o.config.n_layer = 3;
  o.config.n_head = 4;
  o.config.n_embd = 16;
  o.config.n_positions = 8;
  o.config.vocab_size = 32;
  o.batch = 8;
  o.seq = 8;
  o.init_seed = seed;
  o.data_seed = seed ^ 0x5eedULL;
  o.grid = test_grid_options();
  return o;
}
std::vector<std::uint16_t> small_tokens(std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<std::uint16_t> tokens(1500);
  for (auto& t : tokens) t = static_cast<std::uint16_t>(gen() % 32);
  return tokens;
}

// The final weights of pipelined trainer `b` against unpipelined `a`,
// norm-wise over b's stage (every parameter as one vector; the largest over
// the ranks): AdamW's first steps move an element whose gradient is
// rounding noise (the key bias's, exactly 0 in exact arithmetic) by a whole
// learning rate either way, so an element-wise bound would test noise (and
// in f32 / bf16 a norm-wise one too: low_precision_follows_unpipelined).
template <class T>
double weights_difference(Trainer<T>& b, Trainer<T>& a) {
  double diff = 0, norm = 0;
  for (Param<T>* p : b.model().parameters_store().params()) {
    const std::vector<T> x = gather_global(*p, b.parallel().grid()),
                         y = gather_global(a.model().parameters_store().find(p->shard.name),
                                           a.parallel().grid());
    for (std::size_t k = 0; k < y.size(); ++k) {
      const double d = static_cast<double>(x[k]) - static_cast<double>(y[k]);
      diff += d * d;
      norm += static_cast<double>(y[k]) * static_cast<double>(y[k]);
    }
  }
  return max_over_ranks(std::sqrt(diff / norm));
}

// The Trainer through a pipeline: the same losses, gradient norms (summed
// over the stages, the tied embedding once), validation losses and final
// weights as the unpipelined scheme whose data groups take the
// microbatches' sequences (the tensor groups are the same ranks), within
// 1e-12 relative over 10 AdamW steps with clipping, in double (only the
// order of the batch's sums differs). Checkpoints: the pipelined run's at
// step 5 resumes under `resume` (another pipeline, or none) and continues
// the unpipelined curve within 1e-12; its Hugging Face export, imported by
// an unpipelined model, gives every stage's weights (f32 in the file).
void trainer_matches_unpipelined(MPI_Comm comm, int ranks) {
  struct Pair {
    const char* pipelined;
    const char* plain;
    const char* resume;
  };
  std::vector<Pair> pairs;
  if (ranks == 2) pairs = {{"pipe=2:micro=2,2d:q=1", "data=2,2d:q=1", "1d:p=2"}};
  if (ranks == 4)
    pairs = {{"pipe=2:micro=4:schedule=1f1b,1d:p=2", "data=2,1d:p=2",
              "data=2,pipe=2:micro=2:schedule=gpipe:split=1+2,2d:q=1"},
             {"data=2:zero=1,pipe=2:micro=2:schedule=gpipe,2d:q=1", "data=4,2d:q=1",
              "pipe=2:micro=4:split=1+2,1d:p=2"}};
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  const std::vector<std::uint16_t> tokens = small_tokens(seed);
  for (const auto& [pipelined, plain, resume] : pairs) {
    SCOPED_TRACE(pipelined);
    SharedDir dir(comm);
    TrainerOptions o = small_trainer(seed);
    o.optimizer.weight_decay = 0.1;
    o.schedule = {.lr = 1e-2, .warmup = 3, .total = 10, .min_lr = 1e-3};
    o.clip = 0.5;  // clips some steps
    o.scheme = plain;
    Trainer<double> a(comm, o, test_backend(), tokens);
    o.scheme = pipelined;
    Trainer<double> b(comm, o, test_backend(), tokens);
    ASSERT_NE(b.pipeline(), nullptr);
    EXPECT_EQ(a.pipeline(), nullptr);
    constexpr double tol = 1e-12;
    double worst = 0;
    std::vector<double> losses;
    for (int step = 0; step < 10; ++step) {
      if (step == 5) {
        b.save(dir.path / "checkpoints");
        a.save(dir.path / "unpipelined");
      }
      const StepStats x = a.train_step(), y = b.train_step();
      losses.push_back(x.loss);
      worst = std::max({worst, std::abs(y.loss - x.loss) / std::abs(x.loss),
                        std::abs(y.grad_norm - x.grad_norm) / x.grad_norm});
      EXPECT_NEAR(y.loss, x.loss, tol * std::abs(x.loss)) << "step " << step;
      EXPECT_NEAR(y.grad_norm, x.grad_norm, tol * x.grad_norm) << "step " << step;
    }
    const double va = a.evaluate(2), vb = b.evaluate(2);
    EXPECT_NEAR(vb, va, tol * std::abs(va));
    EXPECT_LE(weights_difference(b, a), tol);
    testing::Test::RecordProperty("worst_relative_difference",
                                  std::to_string(max_over_ranks(worst)));
    {  // resumed under another layout, the curve goes on
      SCOPED_TRACE(std::string("resumed under ") + resume);
      o.scheme = resume;
      Trainer<double> c(comm, o, test_backend(), tokens);
      c.load(dir.path / "checkpoints");
      EXPECT_EQ(c.step(), 5);
      if (const PipelineGpt<double>* pl = c.pipeline()) {  // a given split reaches the stages
        const std::vector<int>& split = pl->options().split;
        ASSERT_FALSE(split.empty());  // 1+2: not the balance (2+1)
        EXPECT_EQ(pl->last_block() - pl->first_block(),
                  split[static_cast<std::size_t>(pl->stage())]);
      }
      for (int step = 5; step < 10; ++step) {
        const StepStats z = c.train_step();
        EXPECT_NEAR(z.loss, losses[static_cast<std::size_t>(step)],
                    tol * losses[static_cast<std::size_t>(step)])
            << "step " << step;
      }
    }
    {  // and a pipeline resumes an unpipelined run's checkpoint
      o.scheme = pipelined;
      Trainer<double> e(comm, o, test_backend(), tokens);
      e.load(dir.path / "unpipelined");
      EXPECT_NEAR(e.train_step().loss, losses[5], tol * losses[5]);
    }
    {  // the export holds every stage's parameters
      b.export_hf(dir.path / "export");
      o.scheme = plain;
      Trainer<double> d(comm, o, test_backend(), tokens);
      d.import_hf(dir.path / "export");
      for (Param<double>* p : b.model().parameters_store().params())
        EXPECT_LE(rel_error(gather_global(*p, b.parallel().grid()),
                            gather_global(d.model().parameters_store().find(p->shard.name),
                                          d.parallel().grid())),
                  1e-7)  // f32 in the file
            << p->shard.name;
    }
  }
}

TEST(Pipeline, TrainerTrainsAsUnpipelined) {
  for_each_group({4, 2}, trainer_matches_unpipelined);
}

// In f32 and bf16 the pipelined Trainer follows the unpipelined one of the
// same precision (the same tensor groups, the microbatches' sequences on
// data groups): only the order of the batch's gradient sums differs (added
// microbatch by microbatch in the stage against all-reduced over the data
// groups), a rounding of the element type per sum. Bounds, relative, on
// every loss and gradient norm over 6 steps, and norm-wise on the final
// weights: f32 1e-5, bf16 (its gradients summed in bf16; unit roundoff u =
// 2^-8) 8u = 3.1e-2; the worst figures are recorded (docs/testing.md).
// Under AdamW (the default) the curves only: its step m/(sqrt(v) + eps) is
// scale-free per element, so an element whose gradient is mostly rounding
// (the key bias's, exactly 0 in exact arithmetic, or one whose microbatch
// terms nearly cancel) moves by up to a whole learning rate either way
// with the rounding (measured here up to 1.5e-5 norm-wise, on CI's host
// 1.9e-5): a weight bound would test that noise. Under SGD with momentum
// the weights are linear in the gradients, so the same runs under SGD
// bound the final weights too (and they moved at least 1e-2 from the
// initial ones).
template <class T>
void low_precision_follows_unpipelined(MPI_Comm comm, int ranks) {
  const double tol = std::is_same_v<T, bf16> ? 8 * kBf16Unit : 1e-5;
  struct Pair {
    const char *pipelined, *plain;
    Recompute recompute;
  };
  std::vector<Pair> pairs;
  if (ranks == 2)
    pairs = {{"pipe=2:micro=2:schedule=gpipe,2d:q=1", "data=2,2d:q=1", Recompute::full},
             {"pipe=2:micro=2:schedule=gpipe,2d:q=1", "data=2,2d:q=1", Recompute::none}};
  if (ranks == 4) pairs = {{"pipe=2:micro=4,1d:p=2", "data=2,1d:p=2", Recompute::full}};
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  const std::vector<std::uint16_t> tokens = small_tokens(seed);
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  for (const auto& [pipelined, plain, recompute] : pairs)
    for (const char* optimizer : {"adamw", "sgd"}) {
      SCOPED_TRACE(std::string(pipelined) + ", recompute " + std::string(to_string(recompute)) +
                   ", " + optimizer);
      TrainerOptions o = small_trainer(seed);
      o.gpt.recompute = recompute;
      o.optimizer.kind = optimizer;
      o.schedule = {.lr = 1e-2, .warmup = 2, .total = 6, .min_lr = 1e-3};
      if (o.optimizer.kind == "sgd") o.schedule.lr = o.schedule.min_lr = 0.5;
      o.scheme = plain;
      Trainer<T> a(comm, o, test_backend(), tokens);
      o.scheme = pipelined;
      Trainer<T> b(comm, o, test_backend(), tokens);
      double worst = 0;
      for (int step = 0; step < 6; ++step) {
        const StepStats x = a.train_step(), y = b.train_step();
        worst = std::max({worst, std::abs(y.loss - x.loss) / std::abs(x.loss),
                          std::abs(y.grad_norm - x.grad_norm) / x.grad_norm});
        EXPECT_NEAR(y.loss, x.loss, tol * std::abs(x.loss)) << "step " << step;
        EXPECT_NEAR(y.grad_norm, x.grad_norm, tol * x.grad_norm) << "step " << step;
      }
      double e = 0;
      if (o.optimizer.kind == "sgd") {
        e = weights_difference(b, a);
        EXPECT_LE(e, tol) << "the final weights";
        o.scheme = plain;  // and they moved: the bound is not the initial weights'
        Trainer<T> initial(comm, o, test_backend(), tokens);
        EXPECT_GT(weights_difference(a, initial), 1e-2) << "the steps moved the weights";
      }
      const double all = max_over_ranks(std::max(worst, e)), weights = max_over_ranks(e);
      testing::Test::RecordProperty(
          std::string(std::is_same_v<T, bf16> ? "bf16" : "f32") + "_worst_" + optimizer,
          std::to_string(all));
      if (rank == 0 && std::getenv("SUMMA_TEST_PRINT_ERRORS") != nullptr)
        std::printf("[pipeline %s %s] %s worst relative difference %.3g (weights %.3g)\n",
                    std::is_same_v<T, bf16> ? "bf16" : "f32", optimizer, pipelined, all, weights);
    }
}

TEST(Pipeline, LowPrecisionFollowsUnpipelined) {
  for_each_group({4, 2}, [](MPI_Comm comm, int ranks) {
    low_precision_follows_unpipelined<float>(comm, ranks);
    low_precision_follows_unpipelined<bf16>(comm, ranks);
  });
}

// The planner of a pipelined scheme: each rank's plan (plan_memory inside
// the launch: its stage's model for one microbatch, its slots, the
// embedding exchange) plus the optimizer state equals what a Trainer step
// allocates on that rank within 2 % (docs/memory.md's bound; the CPU
// backend counts every allocation the library makes); the plan without a
// launch (plan_memory_busiest) finds the busiest of those ranks exactly
// and names its stage; GPipe holds more than 1F1B, and the message-driven
// schedule's limit bounds it.
void planner_equals_measured(MPI_Comm comm, int ranks) {
  // each scheme text, with a recompute mode other than full after a '/'
  std::vector<std::string> schemes;
  if (ranks == 2)
    schemes = {"pipe=2:micro=4,2d:q=1", "pipe=2:micro=4:schedule=gpipe,2d:q=1",
               "pipe=2:micro=4:schedule=gpipe,2d:q=1/none"};
  if (ranks == 4)
    schemes = {
        "pipe=4:micro=8:limit=2,2d:q=1",        "pipe=2:micro=4:schedule=1f1b,1d:p=2",
        "data=2:zero=1,pipe=2:micro=2,2d:q=1",  "pipe=2:micro=2:split=3+1,1d:p=2",
        "pipe=4:micro=8:limit=2,2d:q=1/none",   "pipe=2:micro=4:schedule=1f1b,1d:p=2/selective",
        "pipe=2:micro=2:split=3+1,1d:p=2/none", "pipe=2:micro=4:schedule=gpipe,1d:p=2,dc=on",
        "pipe=2:micro=4:schedule=gpipe,1d:p=2"};
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  std::vector<std::uint16_t> tokens(4000);
  for (auto& t : tokens) t = static_cast<std::uint16_t>(gen() % 256);
  std::map<std::string, std::size_t> busiest;
  for (const std::string& text : schemes) {
    SCOPED_TRACE(text);
    const std::string scheme = text.substr(0, text.find('/'));
    TrainerOptions o;
    if (text.find('/') != std::string::npos)
      o.gpt.recompute = parse_recompute(text.substr(text.find('/') + 1), "recompute");
    o.config.n_layer = 4;
    o.config.n_head = 4;
    o.config.n_embd = 64;
    o.config.n_positions = 32;
    o.config.vocab_size = 256;
    o.batch = 16;
    o.seq = 32;
    o.scheme = scheme;
    o.grid = test_grid_options();
    CpuBackend backend;
    double measured = 0;
    {
      Trainer<float> t(comm, o, backend, tokens);
      static_cast<void>(t.train_step());
      measured = static_cast<double>(backend.peak_allocated_bytes());
    }
    EXPECT_EQ(backend.allocated_bytes(), 0u) << "freed with the trainer";
    const SchemeSpec spec = SchemeSpec::parse(scheme);
    CpuBackend planner;
    const MemoryReport plan = plan_memory<float>(comm, spec, planner, o.config, o.batch, o.seq,
                                                 o.gpt, test_grid_options());
    EXPECT_EQ(planner.peak_allocated_bytes(), 0u) << "a plan allocates nothing";
    const double state = 2.0 * sizeof(float) / (spec.zero > 0 ? spec.data : 1);  // AdamW
    const double planned =
        static_cast<double>(plan.total()) + static_cast<double>(plan.parameter_elements) * state;
    const double ratio = planned / measured;
    const double low = -max_over_ranks(-ratio), high = max_over_ranks(ratio);
    EXPECT_GE(low, 0.98);
    EXPECT_LE(high, 1.02);
    if (int rank = 0; MPI_Comm_rank(comm, &rank) == MPI_SUCCESS && rank == 0 &&
                      std::getenv("SUMMA_TEST_PRINT_ERRORS") != nullptr)
      std::printf("[planner] %s planned / measured %.4f to %.4f\n", text.c_str(), low, high);
    // without a launch: the busiest rank, exactly
    const RankMemory most =
        plan_memory_busiest<float>(spec, planner, o.config, o.batch, o.seq, o.gpt);
    const double total = static_cast<double>(plan.total());
    EXPECT_EQ(static_cast<double>(most.report.total()), max_over_ranks(total));
    EXPECT_GE(most.stage, 0);
    EXPECT_LT(most.stage, spec.pipeline.stages);
    busiest[text] = most.report.total();
  }
  if (ranks == 2) {  // GPipe keeps all four microbatches, the message-driven schedule two
    EXPECT_GT(busiest["pipe=2:micro=4:schedule=gpipe,2d:q=1"], busiest["pipe=2:micro=4,2d:q=1"]);
    // and without checkpoints, each one's activations too
    EXPECT_GT(busiest["pipe=2:micro=4:schedule=gpipe,2d:q=1/none"],
              busiest["pipe=2:micro=4:schedule=gpipe,2d:q=1"]);
  }
  if (ranks == 4) {  // selective keeps more than full
    EXPECT_GT(busiest["pipe=2:micro=4:schedule=1f1b,1d:p=2/selective"],
              busiest["pipe=2:micro=4:schedule=1f1b,1d:p=2"]);
    // distributed checkpoints keep half of each slot's inner boundary (one
    // per stage of 2 blocks, over 2 ranks) and add one gather slot: 4 slots
    // under GPipe save 4 x 1/2 - 1 = 1 boundary of 16 x 32 x 64 floats
    EXPECT_EQ(busiest["pipe=2:micro=4:schedule=gpipe,1d:p=2"] -
                  busiest["pipe=2:micro=4:schedule=gpipe,1d:p=2,dc=on"],
              std::size_t{16 / 4 * 32 * 64 * sizeof(float)});
  }
}

// On device-memory grids the pipe is a StagedCommunicator sized by
// pipe_staging: every request a stage can have in flight finds room in its
// buffer (placed as the communicator places it, staging_fit.hpp) whatever
// order they complete in, and their count stays within its requests. A
// random walk over a stage's messages: up to `slots` forward sends, the
// input gradient's send and a receive from each neighbour, given back in
// random order; then the flush's exchange, then the scalars.
TEST(Pipeline, StagingHoldsWhatAStageHasInFlight) {
  using detail::StagingRange;
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  for (int round = 0; round < 200; ++round) {
    const std::size_t message = 1 + gen() % 100000, exchange = gen() % 300000;
    const int slots = 1 + static_cast<int>(gen() % 70);
    const PipeStaging staging = pipe_staging(message, exchange, slots);
    EXPECT_EQ(staging.requests, slots + 3);
    std::vector<StagingRange> held(static_cast<std::size_t>(staging.requests));
    // kinds: 0 .. slots-1 a slot's forward send, slots the input
    // gradient's send, slots+1 and slots+2 the receives
    for (int op = 0; op < 400; ++op) {
      const std::size_t k = gen() % held.size();
      if (held[k].begin < held[k].end) {
        if (gen() % 2 == 0) held[k] = {};
        continue;
      }
      const std::optional<std::size_t> at =
          detail::staging_first_fit(held, message, staging.bytes, 256);
      ASSERT_TRUE(at.has_value()) << "message " << message << ", slots " << slots;
      held[k] = {*at, *at + message};
    }
    std::fill(held.begin(), held.end(), StagingRange{});  // the flush waited for every message
    if (exchange > 0) {
      for (int i = 0; i < 2; ++i) {  // sent and received
        const auto at = detail::staging_first_fit(held, exchange, staging.bytes, 256);
        ASSERT_TRUE(at.has_value()) << "exchange " << exchange;
        held[static_cast<std::size_t>(i)] = {*at, *at + exchange};
      }
    }
    std::fill(held.begin(), held.end(), StagingRange{});
    EXPECT_TRUE(detail::staging_first_fit(held, 2 * sizeof(double), staging.bytes, 256));
  }
  EXPECT_THROW((void)pipe_staging(8, 8, 0), Error);
}

TEST(Pipeline, PlannerEqualsMeasuredPeak) {
  for_each_group({4, 2}, planner_equals_measured);
}

// A refusal on one stage is everyone's: the same error on every rank.
TEST(Pipeline, BadOptionsThrowEverywhere) {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 2) GTEST_SKIP() << "needs 2 ranks";
  for_each_group({2}, [](MPI_Comm comm, int) {
    GptConfig config;
    config.n_layer = 2;
    config.n_head = 2;
    config.n_embd = 8;
    config.n_positions = 4;
    config.vocab_size = 8;
    const auto build = [&](const char* text, index_t batch, GptOptions g = {}) {
      PipelineGpt<double> p(comm, SchemeSpec::parse(text), test_backend(), config, batch, 2, g,
                            test_grid_options());
    };
    EXPECT_THROW(build("pipe=2:micro=2,2d:q=1", 3), Error);  // 3 sequences in 2 microbatches
    EXPECT_THROW(build("pipe=3:micro=2,2d:q=1", 2), Error);  // 3 stages on 2 ranks
    EXPECT_THROW(build("pipe=2:micro=2:split=2+1,2d:q=1", 2), Error);  // 3 blocks of 2
    GptOptions inference;
    inference.inference = true;
    EXPECT_THROW(build("pipe=2:micro=2,2d:q=1", 2, inference), Error);        // stages train
    EXPECT_THROW(build("pipe=2:micro=2:split=1+1,data=2,2d:q=1", 2), Error);  // 4 ranks
    // the models of a single grid refuse a pipeline, naming it
    for (const char* text : {"pipe=2,2d:q=1", "pipe=1:micro=2,2d:q=1"}) {
      const SchemeSpec spec = SchemeSpec::parse(text);
      EXPECT_THROW((void)plan_memory<double>(spec, test_backend(), config, 2, 2, GridCoords{}),
                   Error);
    }
    // the traffic model takes a stage of the pipeline, not one beyond it
    EXPECT_THROW(
        (void)model::predict_step_traffic(SchemeSpec::parse("pipe=2:micro=2,2d:q=1"), config, 2, 2,
                                          {}, DType::f64, GridCoords{}, false, 2),
        Error);
    // a single grid refuses a pipeline, naming it
    try {
      ParallelGpt<double> run(comm, SchemeSpec::parse("pipe=2,2d:q=1"), test_backend(), config, 2,
                              2);
      ADD_FAILURE() << "ParallelGpt took a pipeline";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("pipe"), std::string::npos) << e.what();
    }
    PipelineGpt<double> p(comm, SchemeSpec::parse("pipe=2:micro=2,2d:q=1"), test_backend(), config,
                          2, 2, {}, test_grid_options());
    std::vector<std::int32_t> ids(4, 1), bad(4, 1);
    bad[3] = 8;  // outside the vocabulary: refused on every stage before any message
    EXPECT_THROW((void)p.step(ids, bad), Error);
    EXPECT_THROW((void)p.step(ids, std::vector<std::int32_t>(3, 1)), Error);
    EXPECT_NO_THROW((void)p.step(ids, ids));
  });
}

}  // namespace
}  // namespace summa::test

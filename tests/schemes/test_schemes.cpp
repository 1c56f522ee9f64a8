// One model, any scheme: every implemented scheme of 1, 2, 4, 8 and 9 ranks
// (one CTest launch of 9 ranks covers them all on sub-communicators:
// for_each_group in test_util.hpp) is built from its text with ParallelGpt
// and driven by the same training-step code; loss and every gathered
// parameter gradient must equal the serial reference's on the same global
// weights and batch (tolerances as in test_scheme_layers.cpp): in double
// every scheme, in float the covering subset of test_util.hpp's
// representative_schemes (likewise the memory planner: float every scheme,
// bf16 the subset). Also the
// scheme grammar: parsing, canonical text, errors.
//
// The models run on test_backend() (SUMMA_TEST_BACKEND=cpu|cuda) with its
// communicators (test_grid_options(), handed to ParallelGpt / plan_memory /
// largest_batch); on CUDA float runs in fp32 (no TF32) and double in fp64,
// so the same tolerances hold.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "fourth_scheme.hpp"
#include "summa/parallel/scheme.hpp"
#include "test_util.hpp"

namespace summa::test {
namespace {

// The fourth scheme (fourth_scheme.hpp) is registered before any test runs:
// every test below that walks schemes_for runs it too.
[[maybe_unused]] const bool kFourthScheme = (register_fourth_scheme(), true);

int world_size() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

// test_grid_options() with staging buffers sized for these models (the
// data-axis gradient buckets of a step are in flight together: at most ~5 MB
// in double) rather than the 64 MB default, since every scheme builds a grid.
GridOptions grid_options() {
  GridOptions o = test_grid_options();
  o.staging_bytes = std::size_t{16} << 20;
  return o;
}

// The same training step whatever the scheme.
template <class T>
double train_step(GptModel<T>& model, const std::vector<std::int32_t>& tokens,
                  const std::vector<std::int32_t>& targets) {
  const double loss = model.forward(tokens, targets);
  model.backward();
  return loss;
}

// `all`: every scheme of the rank count (schemes_for), else the covering
// subset (representative_schemes, test_util.hpp).
template <class T, bool all = true>
void every_scheme_matches_reference(MPI_Comm comm, int ranks) {
  const std::vector<SchemeSpec> schemes = all ? schemes_for(ranks) : representative_schemes(ranks);
  // Divisible by every tensor size up to 9 that these rank counts give:
  // heads by p (1, 2, 4, 8) and q (1, 2, 3); the batch by every scheme's
  // granularity (common_batch).
  reference::GptConfig config;
  config.n_layer = 2;
  config.n_head = 72;  // divisible by p up to 9 and by q = 2, 3
  config.n_embd = 144;
  config.n_positions = 8;
  config.vocab_size = 72;
  const index_t batch = common_batch(schemes), seq = 4;
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int> dist(0, config.vocab_size - 1);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(batch * seq)), targets(tokens.size());
  for (auto& t : tokens) t = dist(gen);
  for (auto& t : targets) t = dist(gen);
  reference::Gpt<T> ref(config, seed);
  const double ref_loss = ref.forward(tokens, targets, batch, seq);
  ref.backward();

  Backend& backend = test_backend();
  int tested = 0;
  std::vector<SchemeSpec> specs = schemes;
  for (const SchemeSpec& s : schemes) {
    if (s.holds<Axonn3DSpec>() && s.as<Axonn3DSpec>().gz > 1 && s.data > 1) {  // every 3D
      SchemeSpec every = s;                                                    // overlap on
      every.as<Axonn3DSpec>().ors = every.as<Axonn3DSpec>().oag = true;
      specs.push_back(every);
    }
    if (s.holds<Summa2DSpec>() && s.as<Summa2DSpec>().q > 1) {  // the SUMMA options from the
      specs.push_back(SchemeSpec::parse(s.str() + ",panel=3,overlap=off"));  // scheme text
      ASSERT_EQ(specs.back().as<Summa2DSpec>().summa.panel, 3);
    }
  }
  for (const SchemeSpec& spec : specs) {
    SCOPED_TRACE(spec.str());
    ParallelGpt<T> run(comm, spec, backend, config, batch, seq, {}, grid_options());
    if (spec.scheme == "2d") {  // the scheme text's SUMMA options reach the engine
      EXPECT_EQ(dynamic_cast<Summa2DContext<T>&>(run.scheme()).engine().options(),
                spec.as<Summa2DSpec>().summa);
    }
    run.model().init(seed);
    // one seed, the same global weights under every scheme (layout invariance)
    for (Param<T>* p : run.model().parameters_store().params()) {
      const auto global = gather_global(*p, run.grid());
      const auto want = ref.param(p->shard.name);
      EXPECT_TRUE(std::equal(global.begin(), global.end(), want.begin(), want.end()))
          << p->shard.name;
    }
    const double loss = train_step(run.model(), tokens, targets);
    EXPECT_NEAR(loss, ref_loss, model_tolerance<T>() * std::abs(ref_loss));
    for (Param<T>* p : run.model().parameters_store().params())
      EXPECT_LE(
          max_over_ranks(rel_error(gather_global(*p, run.grid(), true), ref.grad(p->shard.name))),
          model_tolerance<T>())
          << p->shard.name;
    ++tested;
  }
  EXPECT_GE(tested, 1);
  testing::Test::RecordProperty("schemes", tested);
}

// The rank counts the heavy cases cover, on sub-communicators of one launch
// (for_each_group; CTest launches 9 ranks: [9], then [8, 1], then [4, 2]).
const std::vector<int> kRankCounts = {1, 2, 4, 8, 9};

TEST(Schemes, EverySchemeMatchesReferenceDouble) {
  for_each_group(kRankCounts, every_scheme_matches_reference<double>);
}
// float: the covering subset (the algebra of every scheme is the double
// test's; float adds its rounding, which no scheme treats apart)
TEST(Schemes, EverySchemeMatchesReferenceFloat) {
  for_each_group(kRankCounts, every_scheme_matches_reference<float, false>);
}

TEST(Schemes, ParseAndPrint) {
  const SchemeSpec a = SchemeSpec::parse("2d:q=3");
  EXPECT_EQ(a.scheme, "2d");
  EXPECT_EQ(a.as<Summa2DSpec>().q, 3);
  EXPECT_EQ(a.ranks(), 9);
  const SchemeSpec b = SchemeSpec::parse("1d:p=4");
  EXPECT_EQ(b.scheme, "1d");
  EXPECT_EQ(b.ranks(), 4);
  const SchemeSpec c = SchemeSpec::parse("3d:2x1x4");
  EXPECT_EQ(c.scheme, "3d");
  EXPECT_EQ(c.as<Axonn3DSpec>().gx, 2);
  EXPECT_EQ(c.as<Axonn3DSpec>().gy, 1);
  EXPECT_EQ(c.as<Axonn3DSpec>().gz, 4);
  EXPECT_EQ(b.as<Megatron1DSpec>().p, 4);
  EXPECT_FALSE(b.holds<Summa2DSpec>());
  EXPECT_THROW((void)b.as<Summa2DSpec>(), Error);  // another scheme's options
  const SchemeSpec d = SchemeSpec::parse("data=2,2d:q=2");
  EXPECT_EQ(d.data, 2);
  EXPECT_EQ(d.ranks(), 8);
  EXPECT_EQ(SchemeSpec::parse("2d:q=2,data=2"), d);
  for (const SchemeSpec& s : {a, b, c, d}) EXPECT_EQ(SchemeSpec::parse(s.str()), s) << s.str();
  EXPECT_EQ(d.str(), "data=2,2d:q=2");
  EXPECT_EQ(d.zero, 0);
  // the data axis sharded (ZeRO level 1)
  const SchemeSpec z = SchemeSpec::parse("1d:p=2,data=4:zero=1");
  EXPECT_EQ(z.data, 4);
  EXPECT_EQ(z.zero, 1);
  EXPECT_EQ(z.ranks(), 8);
  EXPECT_EQ(z.str(), "data=4:zero=1,1d:p=2");
  EXPECT_EQ(SchemeSpec::parse(z.str()), z);
  EXPECT_NE(z, SchemeSpec::parse("data=4,1d:p=2"));                             // the level counts
  EXPECT_EQ(SchemeSpec::parse("data=4:zero=0,1d:p=2").str(), "data=4,1d:p=2");  // the default
  // ZeRO level 2: the gradients too
  const SchemeSpec z2 = SchemeSpec::parse("2d:q=2,data=2:zero=2");
  EXPECT_EQ(z2.zero, 2);
  EXPECT_EQ(z2.str(), "data=2:zero=2,2d:q=2");
  EXPECT_EQ(SchemeSpec::parse(z2.str()), z2);
  EXPECT_NE(z2, SchemeSpec::parse("data=2:zero=1,2d:q=2"));
  const SchemeSpec z3 = SchemeSpec::parse("3d:2x1x1,data=2:zero=3");
  EXPECT_EQ(z3.zero, 3);
  EXPECT_EQ(z3.str(), "data=2:zero=3,3d:2x1x1");
  const SchemeSpec e = SchemeSpec::parse("3d:1x1x4,overlap=ors+oag");
  EXPECT_FALSE(e.as<Axonn3DSpec>().oar);
  EXPECT_TRUE(e.as<Axonn3DSpec>().ors);
  EXPECT_TRUE(e.as<Axonn3DSpec>().oag);
  EXPECT_EQ(e.str(), "3d:1x1x4,overlap=ors+oag");
  const SchemeSpec f = SchemeSpec::parse("overlap=none,3d:2x1x2");
  const Axonn3DSpec& fo = f.as<Axonn3DSpec>();
  EXPECT_FALSE(fo.oar || fo.ors || fo.oag);
  for (const SchemeSpec& s : {e, f}) EXPECT_EQ(SchemeSpec::parse(s.str()), s) << s.str();
  EXPECT_EQ(SchemeSpec::parse("3d:2x1x2,overlap=oar").str(), "3d:2x1x2");  // the default
  // 2D: the SUMMA engine's panel and overlap
  const SchemeSpec g = SchemeSpec::parse("overlap=off,2d:q=2,panel=128");
  EXPECT_EQ(g.as<Summa2DSpec>().summa.panel, 128);
  EXPECT_FALSE(g.as<Summa2DSpec>().summa.overlap);
  EXPECT_NE(SchemeSpec::parse("2d:q=2,panel=64"), SchemeSpec::parse("2d:q=2"));  // options count
  EXPECT_EQ(g.str(), "2d:q=2,panel=128,overlap=off");
  EXPECT_EQ(SchemeSpec::parse(g.str()), g);
  EXPECT_EQ(SchemeSpec::parse("2d:q=2,panel=0").as<Summa2DSpec>().summa.panel,
            0);  // a whole block per step
  EXPECT_EQ(SchemeSpec::parse("2d:q=2,panel=256,overlap=on").str(), "2d:q=2");  // the defaults
  // 1D: sequence parallelism
  const SchemeSpec h = SchemeSpec::parse("sp=on,data=2,1d:p=4");
  EXPECT_TRUE(h.as<Megatron1DSpec>().sequence_parallel);
  EXPECT_EQ(h.str(), "data=2,1d:p=4,sp=on");
  EXPECT_EQ(SchemeSpec::parse(h.str()), h);
  EXPECT_NE(SchemeSpec::parse("1d:p=4,sp=on"), SchemeSpec::parse("1d:p=4"));
  EXPECT_EQ(SchemeSpec::parse("1d:p=4,sp=off").str(), "1d:p=4");  // the default
  EXPECT_EQ(batch_granularity(h), 8);  // data x p: the token rows divide for any seq
  EXPECT_EQ(batch_granularity(SchemeSpec::parse("data=2,1d:p=4")), 2);
  // 1D: distributed checkpoints
  const SchemeSpec dc = SchemeSpec::parse("dc=on,data=2,1d:p=4");
  EXPECT_TRUE(dc.as<Megatron1DSpec>().distribute_checkpoints);
  EXPECT_FALSE(dc.as<Megatron1DSpec>().sequence_parallel);
  EXPECT_EQ(dc.str(), "data=2,1d:p=4,dc=on");
  EXPECT_EQ(SchemeSpec::parse(dc.str()), dc);
  EXPECT_NE(dc, SchemeSpec::parse("data=2,1d:p=4"));
  EXPECT_EQ(SchemeSpec::parse("1d:p=4,dc=off").str(), "1d:p=4");  // the default
  EXPECT_EQ(batch_granularity(dc), 2);                            // the tokens are not split
}

TEST(Schemes, BadTextThrows) {
  for (const char* text : {"",
                           "2d",
                           "2d:q=0",
                           "2d:q=-1",
                           "1d:p=2,2d:q=2",
                           "3d:2x2",
                           "3d:2x2x2x2",
                           "data=2",
                           "data=2,data=2,1d:p=1",
                           "4d:q=2",
                           "2d:q=2x",
                           "2d:q=2,",
                           "2d:q=2,overlap=ors",
                           "3d:1x1x2,overlap=xyz",
                           "3d:1x1x2,overlap=ors+ors",
                           "3d:1x1x2,overlap=",
                           "3d:1x1x2,overlap=oar,overlap=ors",
                           "2d:q=2,panel=-1",
                           "2d:q=2,panel=x",
                           "2d:q=2,overlap=yes",
                           "2d:q=2,panel=8,panel=8",
                           "1d:p=2,panel=8",
                           "3d:1x1x2,panel=8",
                           "1d:p=2,overlap=on",
                           "1d:p=2,sp=yes",
                           "1d:p=2,sp=",
                           "1d:p=2,sp=on,sp=off",
                           "1d:p=2,dc=yes",
                           "1d:p=2,dc=on,dc=on",
                           "1d:p=2,dc=on,sp=on",
                           "sp=on,1d:p=2,dc=on",
                           "2d:q=2,dc=on",
                           "3d:1x1x2,dc=on",
                           "2d:q=2,sp=on",
                           "2d:q=2,slices=2",
                           "1d:q=2",
                           "2d:p=2",
                           "data=2:zero=x,2d:q=1",
                           "data=2:zero=-1,2d:q=1",
                           "data=2:zero=4,2d:q=1",
                           "data=2:zero=,2d:q=1",
                           "data=2:shard=1,2d:q=1",
                           "data=2:,2d:q=1",
                           "data=1:zero=1,2d:q=1",
                           "data=1:zero=2,2d:q=1",
                           "data=1:zero=3,2d:q=1"}) {
    EXPECT_THROW(SchemeSpec::parse(text), Error) << text;
  }
  const auto message = [](const char* text) {
    try {
      SchemeSpec::parse(text);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message("2d:q=two").find("'two'"), std::string::npos) << message("2d:q=two");
  EXPECT_NE(message("1d:p=2,panel=8").find("not an option of the 1d scheme"), std::string::npos)
      << message("1d:p=2,panel=8");
  EXPECT_NE(message("2d:q=2,overlap=yes").find("'on' or 'off'"), std::string::npos)
      << message("2d:q=2,overlap=yes");
  EXPECT_NE(message("1d:p=2,dc=yes").find("distributed checkpoints is 'on' or 'off', not 'yes'"),
            std::string::npos)
      << message("1d:p=2,dc=yes");
  EXPECT_NE(message("1d:p=2,sp=on,dc=on").find("sp=on and dc=on exclude each other"),
            std::string::npos)
      << message("1d:p=2,sp=on,dc=on");
  // a sharding level: 0-3, and only over more than one group
  EXPECT_NE(message("data=2:zero=4,2d:q=1").find("zero=4 is not a sharding level"),
            std::string::npos)
      << message("data=2:zero=4,2d:q=1");
  EXPECT_NE(message("data=1:zero=3,2d:q=1").find("data=1 has one"), std::string::npos)
      << message("data=1:zero=3,2d:q=1");
  EXPECT_NE(message("data=1:zero=2,2d:q=1").find("data=1 has one"), std::string::npos)
      << message("data=1:zero=2,2d:q=1");
  EXPECT_NE(message("data=1:zero=1,2d:q=1").find("data=1 has one"), std::string::npos)
      << message("data=1:zero=1,2d:q=1");
  EXPECT_NE(message("data=2:shard=1,2d:q=1").find("not an option of the data axis"),
            std::string::npos)
      << message("data=2:shard=1,2d:q=1");
  // a grid whose product wraps a 64-bit integer (to 4 here) is refused,
  // not taken for 4 ranks (was: SIGSEGV in predict_step_time)
  for (const char* text : {"3d:111620x429509837x384773", "3d:2147483647x2147483647x2147483647",
                           "data=2147483647,3d:2147483647x2147483647x3"})
    EXPECT_NE(message(text).find("more than an MPI communicator holds"), std::string::npos)
        << text << ": " << message(text);
}

TEST(Schemes, SchemesForRankCount) {
  for (int ranks : {1, 4, 8, 9}) {
    for (const SchemeSpec& s : schemes_for(ranks)) EXPECT_EQ(s.ranks(), ranks) << s.str();
  }
  const auto eight = schemes_for(8);
  const auto has = [&](const char* text) {
    const SchemeSpec want = SchemeSpec::parse(text);
    return std::find(eight.begin(), eight.end(), want) != eight.end();
  };
  EXPECT_TRUE(has("1d:p=8"));
  EXPECT_TRUE(has("3d:2x2x2"));
  EXPECT_TRUE(has("data=2,2d:q=2"));
  EXPECT_TRUE(has("data=2,3d:1x2x2"));
  EXPECT_FALSE(has("2d:q=2"));
}

// A scheme from outside the library is one row: its text parses and prints,
// the registry finds and enumerates it (so the reference, planner and
// traffic tests run it), its grid is its own (the mesh transposed), and
// register_scheme refuses a bad or repeated row.
TEST(Schemes, AFourthSchemeIsOneRow) {
  const SchemeSpec t = SchemeSpec::parse("data=2,2dt:q=2,panel=64");
  EXPECT_EQ(t.scheme, "2dt");
  EXPECT_EQ(t.ranks(), 8);
  EXPECT_EQ(t.as<Summa2DSpec>().summa.panel, 64);
  EXPECT_EQ(t.str(), "data=2,2dt:q=2,panel=64");
  EXPECT_EQ(SchemeSpec::parse(t.str()), t);
  EXPECT_NE(SchemeSpec::parse("2dt:q=2"), SchemeSpec::parse("2d:q=2"));
  const auto four = schemes_for(4);
  EXPECT_NE(std::find(four.begin(), four.end(), SchemeSpec::parse("2dt:q=2")), four.end());
  EXPECT_EQ(&scheme_row("2dt"), &fourth_scheme_row());
  try {
    (void)SchemeSpec::parse("2dt:q=0");
    ADD_FAILURE() << "2dt:q=0 parsed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'2dt:q=0'"), std::string::npos) << e.what();
  }
  // register_scheme: a repeated tag, a bad tag, a row without a function
  const auto refused = [](const SchemeRow& row, const char* why) {
    try {
      register_scheme(row);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "register_scheme accepted " << row.tag;
  };
  refused(fourth_scheme_row(), "exists already");
  SchemeRow bad = fourth_scheme_row();
  bad.tag = "2d:x";
  refused(bad, "must be non-empty, without ':'");
  bad.tag = "";
  refused(bad, "must be non-empty");
  bad.tag = "2dx";
  bad.make_grid = nullptr;
  refused(bad, "lacks a function");
  EXPECT_THROW(scheme_row("2dx"), Error);
  // the grid: world rank 1 of 4 sits at row 1, column 0 (2D: row 0, column 1)
  if (world_size() == 4 || world_size() == 9) {
    const int q = world_size() == 4 ? 2 : 3;
    const SchemeSpec two = SchemeSpec::parse("2d:q=" + std::to_string(q));
    SchemeSpec transposed = two;
    transposed.scheme = "2dt";
    const ProcessGrid a = make_grid(MPI_COMM_WORLD, two), b = make_grid(MPI_COMM_WORLD, transposed);
    EXPECT_EQ(a.coords().row, b.coords().col);
    EXPECT_EQ(a.coords().col, b.coords().row);
  }
}

TEST(Schemes, WrongRankCountThrowsEverywhere) {
  const int ranks = world_size();
  std::string msg;
  try {
    make_grid(MPI_COMM_WORLD, SchemeSpec::parse("1d:p=" + std::to_string(ranks + 1)));
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("needs"), std::string::npos) << msg;
  EXPECT_TRUE(same_on_all_ranks(msg));
}

}  // namespace
}  // namespace summa::test

namespace summa::test {
namespace {

// The planner's capacities are those a real model allocates, and the
// largest batch under a budget is the boundary: it fits, one more step does not.
// `all` as in every_scheme_matches_reference.
template <class T, bool all = true>
void memory_planner_matches_real_models(MPI_Comm comm, int ranks) {
  const std::vector<SchemeSpec> schemes = all ? schemes_for(ranks) : representative_schemes(ranks);
  reference::GptConfig config;
  config.n_layer = 2;
  config.n_head = 72;
  config.n_embd = 144;
  config.n_positions = 8;
  config.vocab_size = 72;
  const index_t seq = 4;
  Backend& backend = test_backend();
  const GridOptions grid = grid_options();
  std::vector<SchemeSpec> specs = schemes;
  for (const SchemeSpec& s : schemes) {
    if (s.holds<Axonn3DSpec>() && s.as<Axonn3DSpec>().gz > 1 && s.data > 1) {  // every 3D
      SchemeSpec every = s;                                                    // overlap on
      every.as<Axonn3DSpec>().ors = every.as<Axonn3DSpec>().oag = true;
      specs.push_back(every);
    }
    if (s.holds<Summa2DSpec>() && s.as<Summa2DSpec>().q > 1) {  // the SUMMA options from the
      specs.push_back(SchemeSpec::parse(s.str() + ",panel=3,overlap=off"));  // scheme text
      ASSERT_EQ(specs.back().as<Summa2DSpec>().summa.panel, 3);
    }
  }
  for (const SchemeSpec& spec : specs) {
    SCOPED_TRACE(spec.str());
    const index_t batch = 2 * batch_granularity(spec);
    const MemoryReport plan = plan_memory<T>(comm, spec, backend, config, batch, seq, {}, grid);
    ParallelGpt<T> real(comm, spec, backend, config, batch, seq, {}, grid);
    const MemoryReport got = real.model().memory_report();
    ASSERT_EQ(plan.buffers.size(), got.buffers.size());
    for (std::size_t k = 0; k < got.buffers.size(); ++k)
      EXPECT_EQ(plan.buffers[k].capacity, got.buffers[k].capacity) << got.buffers[k].name;
    EXPECT_EQ(plan.parameters, got.parameters);
    EXPECT_EQ(plan.total(), got.total());
    // Without a launch: this rank's plan on a plan-only grid, and the
    // busiest rank, whose total is the largest over the launch's ranks.
    const MemoryReport alone =
        plan_memory<T>(spec, backend, config, batch, seq, real.grid().coords());
    ASSERT_EQ(alone.buffers.size(), got.buffers.size());
    for (std::size_t k = 0; k < got.buffers.size(); ++k)
      EXPECT_EQ(alone.buffers[k].capacity, got.buffers[k].capacity) << got.buffers[k].name;
    unsigned long long largest = got.total();
    MPI_Allreduce(MPI_IN_PLACE, &largest, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, comm);
    const RankMemory busiest = plan_memory_busiest<T>(spec, backend, config, batch, seq);
    EXPECT_EQ(busiest.report.total(), largest);
    EXPECT_EQ(busiest.coords.data, 0);
    // the first and last coordinate of each axis find it too (what a
    // tensor group beyond plan_every_rank_up_to gets)
    EXPECT_EQ(plan_memory_busiest<T>(spec, backend, config, batch, seq, {}, 0).report.total(),
              largest);
    EXPECT_THROW(ParallelGpt<T>(comm, spec, backend, config, batch, seq, {.plan_only = true}, grid)
                     .model()
                     .forward({}, {}),
                 Error);

    // a budget between two batch sizes
    const index_t step = batch_granularity(spec);
    const auto planned_max = [&](index_t b) {
      unsigned long long t = plan_memory<T>(comm, spec, backend, config, b, seq, {}, grid).total();
      MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, comm);
      return static_cast<std::size_t>(t);
    };
    const std::size_t budget = (planned_max(5 * step) + planned_max(6 * step)) / 2;
    const index_t best =
        largest_batch<T>(comm, spec, backend, config, seq, {}, budget, 64 * step, grid);
    EXPECT_EQ(best, 5 * step);
    EXPECT_EQ(largest_batch<T>(comm, spec, backend, config, seq, {}, 1, 64 * step, grid), 0);
    EXPECT_EQ(largest_batch<T>(comm, spec, backend, config, seq, {}, planned_max(3 * step),
                               3 * step, grid),
              3 * step);
  }
}
TEST(Schemes, MemoryPlannerMatchesRealModels) {
  for_each_group(kRankCounts, memory_planner_matches_real_models<float>);
}
// bf16: 2-byte buffers and parameters next to fp32 statistics, master
// weights outside the model (the optimizer's); the covering subset (the
// element size is the only difference from the float test above).
TEST(Schemes, MemoryPlannerMatchesRealModelsBf16) {
  for_each_group(kRankCounts, memory_planner_matches_real_models<bf16, false>);
}

}  // namespace
}  // namespace summa::test

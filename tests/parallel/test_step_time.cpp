// The step-time model (summa/model/step_time.hpp), serial (no ranks are
// launched: the model prices any grid). Oracles:
//  - with α = 0, compute free and every collective priced by the direct
//    algorithm (the traffic counters' volumes), each rank's communication
//    time on each axis is exactly (sent + received) / 2β of the traffic
//    model's bytes for that rank (summa/model/traffic.hpp, itself checked
//    against measured counters by test_traffic), for every scheme of 1 to
//    16 ranks, with and without checkpointing, in every element type;
//  - 3D with X only and no overlap takes 1D's time (same products, the
//    same all-reduces on another axis); 3D with Z only does the compute of
//    the data-parallel model;
//  - monotone where it must be: more bandwidth, less latency, faster GEMMs
//    or fewer tokens never make a step slower; overlap never makes it
//    slower;
//  - groups of an axis leaving a node share its network bandwidth;
//  - an offloaded optimizer is priced as max(update, state copies) plus one
//    bucket's copy each way;
//  - a 4096-device prediction runs in well under a second;
//  - an implementation profile that overlaps nothing (optimus-2021,
//    megatron-2021) prices the step as its compute plus every collective,
//    with the system's own scheme options; this library's overlap makes
//    the same step shorter.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <tuple>

#include "summa/layers/transformer.hpp"
#include "summa/model/implementation.hpp"
#include "summa/model/step_time.hpp"
#include "summa/model/traffic.hpp"
#include "summa/schemes/registry.hpp"
#include "test_util.hpp"

namespace summa::test {
namespace {

using model::Algorithm;
using model::Collective;
using model::Machine;

Machine machine(double alpha, double beta, Algorithm algorithm, int per_node = 4) {
  Machine m;
  m.name = "test";
  m.devices_per_node = per_node;
  m.device.memory_bytes = 1ull << 34;
  m.device.memory_bandwidth = 1e11;
  for (DType t : {DType::f32, DType::f64, DType::bf16})
    m.device.gemm_of(t) = {
        .peak_flops = 1e12, .max_efficiency = 0.8, .half_flops = 1e7, .table = {}};
  for (Collective c : model::all_collectives) {
    m.intra_node[c] = {alpha, beta, algorithm, {}};
    m.inter_node[c] = {4 * alpha, beta / 8, algorithm, {}};
  }
  return m;
}

// A GPT every scheme of the tests can build (the model is walked from a
// built plan-only GPT, which checks divisibility): 144 heads and widths
// divisible by 1, 2, 4, 8, 9, 12 and 16.
GptConfig config(int heads = 144) {
  GptConfig c;
  c.n_layer = 3;
  c.n_head = heads;
  c.n_embd = 8 * heads;
  c.n_positions = 16;
  c.vocab_size = 8 * heads;
  return c;
}

std::vector<GridCoords> every_rank(const SchemeSpec& spec) {
  const GridShape s = scheme_row(spec.scheme).grid_shape(spec);
  std::vector<GridCoords> out;
  for (int d = 0; d < s.data; ++d)
    for (int z = 0; z < s.depth; ++z)
      for (int r = 0; r < s.rows; ++r)
        for (int c = 0; c < s.cols; ++c) out.push_back({d, z, r, c});
  return out;
}

TEST(StepTime, CommunicationIsTrafficOverBandwidthWithoutLatency) {
  const double beta = 1e9;
  Machine m = machine(0, beta, Algorithm::direct, 64);  // one node

  for (DType t : {DType::f32, DType::f64, DType::bf16}) m.device.gemm_of(t).peak_flops = 1e300;
  m.device.memory_bandwidth = 1e300;
  int checked = 0;
  for (int ranks : {1, 2, 4, 8, 9, 12, 16})
    for (SchemeSpec spec : schemes_for(ranks)) {
      if (spec.holds<Summa2DSpec>())  // the shape agreement is not counted traffic
        spec.as<Summa2DSpec>().summa.consensus_checks = false;
      for (Recompute recompute : {Recompute::full, Recompute::none, Recompute::selective})
        for (DType dtype : {DType::f32, DType::bf16}) {
          SCOPED_TRACE(spec.str());
          const index_t batch = 2 * common_batch({spec}) * spec.data, seq = 8;
          const GptOptions options{.recompute = recompute};
          for (const GridCoords& at : every_rank(spec)) {
            const TrafficCounters bytes =
                model::predict_step_traffic(spec, config(), batch, seq, options, dtype, at);
            const model::StepTime time = model::predict_step_time(
                spec, config(), batch, seq, options, dtype, m, {.optimizer = false, .rank = at});
            for (std::size_t a = 0; a < comm_axis_count; ++a) {
              const auto& b = bytes[static_cast<CommAxis>(a)];
              const double want = static_cast<double>(b.bytes_sent + b.bytes_received) / (2 * beta);
              EXPECT_NEAR(time.comm_s[a], want, 1e-12 * want + 1e-18)
                  << name_of(static_cast<CommAxis>(a));
            }
            EXPECT_LT(time.compute_s, 1e-200);
            ++checked;
          }
        }
    }
  EXPECT_GT(checked, 100);
}

// Groups of an axis that leave a node share its links (AxoNN eq. 7): with
// α = 0 and the direct algorithm a rank's time on a node-spanning axis is
// its bytes over β_inter divided by the number of such groups on its node.
TEST(StepTime, GroupsLeavingANodeShareItsBandwidth) {
  const double beta = 1e9;
  Machine m = machine(0, 1e30, Algorithm::direct, 2);
  for (Collective c : model::all_collectives) m.inter_node[c] = {0, beta, Algorithm::direct, {}};
  for (m.device.gemm_of(DType::f32).peak_flops = 1e300;
       const auto& [text, axis, flows] : {std::tuple{"data=4,1d:p=2", CommAxis::data, 2},
                                          {"1d:p=8", CommAxis::tensor, 1},
                                          {"data=4,1d:p=1", CommAxis::data, 1}}) {
    SCOPED_TRACE(text);
    const SchemeSpec spec = SchemeSpec::parse(text);
    for (const GridCoords& at : every_rank(spec)) {
      const auto bytes = model::predict_step_traffic(spec, config(), 8, 16, {}, DType::f32, at);
      const auto t = model::predict_step_time(spec, config(), 8, 16, {}, DType::f32, m,
                                              {.optimizer = false, .rank = at});
      const auto& b = bytes[axis];
      const double want = static_cast<double>(b.bytes_sent + b.bytes_received) / (2 * beta / flows);
      EXPECT_NEAR(t.comm_s[static_cast<std::size_t>(axis)], want, 1e-12 * want);
    }
  }
}

TEST(StepTime, ThreeDWithXOnlyIsOneD) {
  const Machine m = machine(2e-6, 5e9, Algorithm::ring);
  for (int p : {2, 4, 8}) {
    const auto one = SchemeSpec::parse("1d:p=" + std::to_string(p));
    // 1D's dX all-reduces are priced exposed (src/schemes/megatron1d/layers.cpp)
    const auto three = SchemeSpec::parse("3d:" + std::to_string(p) + "x1x1,overlap=none");
    for (Recompute recompute : {Recompute::full, Recompute::none, Recompute::selective}) {
      const GptOptions o{.recompute = recompute};
      const auto a = model::predict_step_time(one, config(), 4, 16, o, DType::f32, m);
      const auto b = model::predict_step_time(three, config(), 4, 16, o, DType::f32, m);
      EXPECT_NEAR(a.step_s, b.step_s, 1e-12 * a.step_s) << p;
      EXPECT_NEAR(a.compute_s, b.compute_s, 1e-12 * a.compute_s) << p;
      // the overlap can only help, and the model sees it
      const auto oar = model::predict_step_time(
          SchemeSpec::parse("3d:" + std::to_string(p) + "x1x1"), config(), 4, 16, o, DType::f32, m);
      EXPECT_LE(oar.step_s, b.step_s * (1 + 1e-12));
      EXPECT_LT(oar.step_s, b.step_s);
    }
  }
}

TEST(StepTime, ThreeDWithZOnlyComputesAsDataParallel) {
  const Machine m = machine(2e-6, 5e9, Algorithm::ring);
  for (int z : {2, 4}) {
    const auto fsdp = SchemeSpec::parse("3d:1x1x" + std::to_string(z));
    const auto dp = SchemeSpec::parse("data=" + std::to_string(z) + ",1d:p=1");
    const auto a = model::predict_step_time(fsdp, config(), 8, 16, {}, DType::f32, m);
    const auto b = model::predict_step_time(dp, config(), 8, 16, {}, DType::f32, m);
    const double fwd = [&] {
      double s = 0;
      for (const auto& op : a.ops) s += op.compute_s * static_cast<double>(op.count);
      return s;
    }();
    EXPECT_NEAR(fwd, a.compute_s, 1e-12 * fwd);
    // optimizer aside (FSDP updates 1/Z of the weights), the compute is the same
    const auto no_opt = [&](const model::StepTime& t) {
      double s = 0;
      for (const auto& op : t.ops)
        if (op.op != "optimizer") s += op.compute_s * static_cast<double>(op.count);
      return s;
    };
    EXPECT_NEAR(no_opt(a), no_opt(b), 1e-12 * no_opt(b)) << z;
    EXPECT_EQ(a.comm_s[static_cast<std::size_t>(CommAxis::mesh_row)], 0);
    EXPECT_EQ(a.comm_s[static_cast<std::size_t>(CommAxis::mesh_col)], 0);
  }
}

TEST(StepTime, Monotone) {
  const GptOptions o{};
  for (const char* text : {"1d:p=4", "2d:q=2", "3d:2x1x2", "data=2,2d:q=2", "2d:q=4"}) {
    SCOPED_TRACE(text);
    const SchemeSpec spec = SchemeSpec::parse(text);
    const auto t = [&](const Machine& m, index_t batch = 8) {
      return model::predict_step_time(spec, config(), batch, 16, o, DType::f32, m).step_s;
    };
    const Machine base = machine(5e-6, 5e9, Algorithm::ring);
    const double t0 = t(base);
    EXPECT_GT(t0, 0);
    Machine faster_links = machine(5e-6, 10e9, Algorithm::ring);
    EXPECT_LE(t(faster_links), t0);
    Machine less_latency = machine(1e-6, 5e9, Algorithm::ring);
    EXPECT_LE(t(less_latency), t0);
    Machine faster_gemm = base;
    for (DType d : {DType::f32, DType::f64, DType::bf16})
      faster_gemm.device.gemm_of(d).peak_flops *= 2;
    EXPECT_LT(t(faster_gemm), t0);
    EXPECT_LT(t(base, 4), t0);
    Machine faster_network = base;
    for (Collective c : model::all_collectives) faster_network.inter_node[c].beta_bytes_s *= 2;
    EXPECT_LE(t(faster_network), t0);
    // a compute-bound element-wise kernel (a rate below its bytes' pace)
    // only adds; a slower one adds more
    Machine slow_gelu = base, slower_gelu = base;
    slow_gelu.device.pointwise[0][static_cast<std::size_t>(model::Pointwise::gelu)] = 1e8;
    slower_gelu.device.pointwise[0][static_cast<std::size_t>(model::Pointwise::gelu)] = 1e7;
    EXPECT_GT(t(slow_gelu), t0);
    EXPECT_GT(t(slower_gelu), t(slow_gelu));
    // SUMMA's overlap is never slower when it does not slice the products
    // (with progress slices the smaller GEMMs may cost more than is hidden)
    if (spec.scheme == "2d" && spec.as<Summa2DSpec>().q > 1) {
      SchemeSpec on = spec, off = spec;
      on.as<Summa2DSpec>().summa.progress_slices = 1;
      off.as<Summa2DSpec>().summa.overlap = false;
      EXPECT_GE(
          model::predict_step_time(off, config(), 8, 16, o, DType::f32, base).step_s,
          model::predict_step_time(on, config(), 8, 16, o, DType::f32, base).step_s * (1 - 1e-12));
    }
  }
}

// Selective recompute (Korthikanti et al. 2022) prices one more S = Q Kᵀ and
// softmax in attention's backward and nothing else: with free links and
// element-wise work, its backward core exceeds none's by half the forward
// core (S = Q Kᵀ and O = P V have the same flops); every other op is none's.
// Full recompute prices every block's forward again, so costs more still.
TEST(StepTime, SelectiveRecomputePricesTheScoresAgain) {
  Machine m = machine(0, 1e300, Algorithm::direct);
  m.device.memory_bandwidth = 1e300;
  for (const char* text : {"1d:p=4", "1d:p=4,sp=on", "2d:q=2", "3d:2x1x2", "data=2,2d:q=2"}) {
    SCOPED_TRACE(text);
    const SchemeSpec spec = SchemeSpec::parse(text);
    const auto t = [&](Recompute r) {
      return model::predict_step_time(spec, config(), 8, 16, {.recompute = r}, DType::f32, m,
                                      {.optimizer = false});
    };
    const auto none = t(Recompute::none), selective = t(Recompute::selective),
               full = t(Recompute::full);
    const auto core = [](const model::StepTime& st, model::Phase phase) {
      for (const auto& op : st.ops)
        if (op.op == block_op::core && op.phase == phase)
          return op.compute_s * static_cast<double>(op.count);
      ADD_FAILURE() << "no attention core op";
      return 0.0;
    };
    const double extra =
        core(selective, model::Phase::backward) - core(none, model::Phase::backward);
    EXPECT_GT(extra, 0);
    EXPECT_NEAR(extra, core(none, model::Phase::forward) / 2, 1e-12 * extra);
    EXPECT_NEAR(selective.step_s - none.step_s, extra, 1e-9 * selective.step_s);
    EXPECT_EQ(selective.phase(model::Phase::recompute), 0);
    EXPECT_GT(full.step_s, selective.step_s);
  }
}

// An offloaded optimizer (StepTimeOptions::offload_bucket): the update takes
// max(its memory traffic, the state copied in and out over the host link)
// plus one bucket's copy each way; nothing else changes. The elements
// updated come from the plain update's time (28 bytes per f32 element at
// the memory bandwidth); AdamW's f32 state is 8 bytes per element. A host
// link of 0 (a CPU) is priced at the memory bandwidth.
TEST(StepTime, OffloadedOptimizerStreamsItsState) {
  for (const char* text : {"2d:q=2", "data=2:zero=1,1d:p=2", "3d:2x1x2"})
    for (const double host : {1e9, 0.0}) {
      SCOPED_TRACE(fmt::format("{}, host_bandwidth {}", text, host));
      Machine m = machine(1e-6, 1e10, Algorithm::ring);
      m.device.host_bandwidth = host;
      const SchemeSpec spec = SchemeSpec::parse(text);
      const auto optimizer = [](const model::StepTime& st) {
        for (const auto& op : st.ops)
          if (op.op == "optimizer") return op.compute_s;
        ADD_FAILURE() << "no optimizer op";
        return 0.0;
      };
      const auto plain = model::predict_step_time(spec, config(), 8, 16, {}, DType::f32, m, {});
      const double n = optimizer(plain) * m.device.memory_bandwidth / 28;
      ASSERT_GT(n, 1000);
      const double bw = host > 0 ? host : m.device.memory_bandwidth;
      for (const index_t bucket : {index_t{100}, index_t{1} << 40}) {
        const auto off = model::predict_step_time(spec, config(), 8, 16, {}, DType::f32, m,
                                                  {.offload_bucket = bucket});
        const double want = std::max(optimizer(plain), 2 * n * 8 / bw) +
                            2 * std::min(static_cast<double>(bucket), n) * 8 / bw;
        EXPECT_NEAR(optimizer(off), want, 1e-9 * want) << "bucket " << bucket;
        EXPECT_NEAR(off.step_s - plain.step_s, optimizer(off) - optimizer(plain),
                    1e-9 * off.step_s);
      }
    }
}

// The optimizer of a sharded data axis updates this group's chunk: zero=1 a
// contiguous 1/data of the (padded) parameters, zero=2 and 3 piece d of every unit
// (the embedding, each block, LN_f; each padded to data pieces), priced at
// 28 bytes per f32 element. A model whose units do not divide by data = 3
// tells the two apart (a few elements of padding).
TEST(StepTime, ShardedOptimizerUpdatesItsChunk) {
  GptConfig c = config(5);  // h = 40, vocabulary 40, 16 positions, 3 blocks
  const Machine m = machine(1e-6, 1e10, Algorithm::ring);
  const auto updated = [&](const char* text) {
    const auto st =
        model::predict_step_time(SchemeSpec::parse(text), c, 6, 16, {}, DType::f32, m, {});
    for (const auto& op : st.ops)
      if (op.op == "optimizer") return op.compute_s * m.device.memory_bandwidth / 28;
    ADD_FAILURE() << "no optimizer op";
    return 0.0;
  };
  const std::uint64_t h = 40, d = 3;
  const std::uint64_t embedding = (40 + 16) * h, block = 12 * h * h + 13 * h, ln_f = 2 * h;
  const auto piece = [&](std::uint64_t n) { return (n + d - 1) / d; };
  // zero=1's chunk: the parameters padded to a multiple of data, over data
  const double zero1 = static_cast<double>(piece(embedding + 3 * block + ln_f));
  const double zero2 = static_cast<double>(piece(embedding) + 3 * piece(block) + piece(ln_f));
  ASSERT_GT(zero2, zero1);
  EXPECT_NEAR(updated("data=3:zero=1,1d:p=1"), zero1, 1e-6 * zero1);
  EXPECT_NEAR(updated("data=3:zero=2,1d:p=1"), zero2, 1e-6 * zero2);
  EXPECT_NEAR(updated("data=3:zero=3,1d:p=1"), zero2, 1e-6 * zero2);
}

// zero=3 (data=4, three blocks, two value slots): every unit all-gathered in
// forward, the block below the slots (block 0) again in backward, each
// unit's gradients reduce-scattered, no all-gather after the step. On a
// ring without latency an all-gather and a reduce-scatter of the same
// pieces cost the same, so forward's gathers cost what backward's
// reduce-scatters do (the data_axis op, less the loss's one double); zero=1
// has no gather op and a dearer optimizer (its all-gather).
TEST(StepTime, ZeroThreeGathersWhatItReduceScatters) {
  const Machine m = machine(0, 1e10, Algorithm::ring);
  const auto op = [](const model::StepTime& st, std::string_view name, model::Phase phase) {
    for (const auto& o : st.ops)
      if (o.op == name && o.phase == phase) return o;
    return model::OpTime{};
  };
  const auto data = [](const model::OpTime& o) {
    return o.comm_s[static_cast<std::size_t>(CommAxis::data)];
  };
  const auto three = model::predict_step_time(SchemeSpec::parse("data=4:zero=3,1d:p=2"), config(),
                                              8, 16, {}, DType::f32, m, {});
  const auto one = model::predict_step_time(SchemeSpec::parse("data=4:zero=1,1d:p=2"), config(), 8,
                                            16, {}, DType::f32, m, {});
  const model::OpTime forward = op(three, "data_axis.gather", model::Phase::forward);
  const model::OpTime backward = op(three, "data_axis.gather", model::Phase::backward);
  const model::OpTime reduces = op(three, "data_axis", model::Phase::backward);
  ASSERT_GT(data(forward), 0);
  EXPECT_NEAR(data(forward), data(reduces), 1e-6 * data(forward));
  EXPECT_GT(data(backward), 0);                  // block 0 again
  EXPECT_LT(3 * data(backward), data(forward));  // less than the three blocks and the rest
  EXPECT_LE(forward.exposed_s, data(forward));
  EXPECT_EQ(data(op(one, "data_axis.gather", model::Phase::forward)), 0);
  EXPECT_LT(data(op(three, "optimizer", model::Phase::optimizer)),
            data(op(one, "optimizer", model::Phase::optimizer)));
}

// An oversubscribed launch (ranks_per_device = 2) time-shares the device:
// exactly twice each op's compute; a GeLU kernel's time is its elements at
// the kernel's rate when that is slower than its bytes, and its bytes at
// the memory bandwidth otherwise.
TEST(StepTime, OversubscriptionAndPointwiseKernels) {
  const SchemeSpec spec = SchemeSpec::parse("2d:q=2");
  Machine m = machine(5e-6, 5e9, Algorithm::ring);
  m.inter_node = m.intra_node;  // the placement does not matter
  const auto at = [&](const Machine& mm, int share) {
    return model::predict_step_time(spec, config(), 8, 16, {}, DType::f32, mm,
                                    {.optimizer = true, .ranks_per_device = share});
  };
  const auto one = at(m, 1), two = at(m, 2);
  EXPECT_NEAR(two.compute_s, 2 * one.compute_s, 1e-12 * two.compute_s);
  for (std::size_t i = 0; i < one.ops.size(); ++i)
    EXPECT_NEAR(two.ops[i].compute_s, 2 * one.ops[i].compute_s,
                1e-12 * two.ops[i].compute_s + 1e-300);
  // GeLU forward on the q = 2 mesh: (tokens / 2) x (4h / 2) elements, read and written
  const double elements = (8.0 * 16 / 2) * (4.0 * config().n_embd / 2), bytes = 2 * elements * 4;
  const auto gelu = [](const model::StepTime& t) {
    for (const auto& op : t.ops)
      if (op.op == "block.mlp.gelu" && op.phase == model::Phase::forward) return op.compute_s;
    return -1.0;
  };
  EXPECT_NEAR(gelu(one), bytes / m.device.memory_bandwidth, 1e-9 * gelu(one));
  m.device.pointwise[0][static_cast<std::size_t>(model::Pointwise::gelu)] = 1e6;
  EXPECT_NEAR(gelu(at(m, 1)), elements / 1e6, 1e-9 * gelu(at(m, 1)));
  EXPECT_THROW(at(m, 0), Error);
}

// The GEMM shapes the model prices (what calibrate --gpt measures): the
// linears' local products and the attention's batched ones for 1D on one
// rank; SUMMA's panel products for 2D.
TEST(StepTime, GemmShapes) {
  const GptConfig c = config();
  const index_t h = c.n_embd, tokens = 8 * 16, hd = h / c.n_head;
  const auto has = [](const std::vector<model::GemmShape>& v, model::GemmShape s) {
    return std::find(v.begin(), v.end(), s) != v.end();
  };
  using model::GemmMode;
  const auto one = model::step_gemm_shapes(SchemeSpec::parse("1d:p=1"), c, 8, 16, {}, DType::f32);
  EXPECT_TRUE(has(one, {tokens, 3 * h, h, 1, GemmMode::nn}));         // c_attn forward
  EXPECT_TRUE(has(one, {tokens, h, 3 * h, 1, GemmMode::nt}));         // its dX = dY Wᵀ
  EXPECT_TRUE(has(one, {h, 4 * h, tokens, 1, GemmMode::tn}));         // c_fc weight gradient
  EXPECT_TRUE(has(one, {16, 16, hd, c.n_head, GemmMode::nt}));        // S = Q Kᵀ per head
  EXPECT_TRUE(has(one, {16, hd, 16, c.n_head, GemmMode::nn}));        // O = P V
  EXPECT_TRUE(has(one, {16, hd, 16, c.n_head, GemmMode::tn}));        // dV = Pᵀ dO
  EXPECT_TRUE(has(one, {tokens, c.vocab_size, h, 1, GemmMode::nt}));  // logits
  EXPECT_FALSE(has(one, {tokens, 3 * h, h, 1, GemmMode::tn}));
  SchemeSpec two = SchemeSpec::parse("2d:q=2");
  two.as<Summa2DSpec>().summa.panel = 16;
  two.as<Summa2DSpec>().summa.progress_slices = 1;
  const auto panels = model::step_gemm_shapes(two, c, 8, 16, {}, DType::f32);
  EXPECT_TRUE(has(panels, {tokens / 2, 3 * h / 2, 16, 1, GemmMode::nn}));  // c_attn: A B panel
  EXPECT_FALSE(has(panels, {tokens, 3 * h, h, 1, GemmMode::nn}));
}

// A GEMM table measured by mode prices each product at its mode's rate: a
// step whose table makes tn products slow takes longer by their work alone.
TEST(StepTime, GemmModesPriceTheirOwnRates) {
  Machine m = machine(5e-6, 5e9, Algorithm::ring, 1);
  model::GemmModel& g = m.device.gemm_of(DType::f32);
  g.table.clear();
  for (model::GemmMode mode : model::all_gemm_modes)
    for (index_t s : {16, 64, 256})
      g.table.push_back({.m = s, .n = s, .k = s, .efficiency = 0.5, .mode = mode});
  const auto spec = SchemeSpec::parse("1d:p=1");
  const auto even = model::predict_step_time(spec, config(), 8, 16, {}, DType::f32, m);
  for (auto& p : g.table)
    if (p.mode == model::GemmMode::tn) p.efficiency = 0.25;
  const auto slow = model::predict_step_time(spec, config(), 8, 16, {}, DType::f32, m);
  EXPECT_EQ(slow.phase(model::Phase::forward), even.phase(model::Phase::forward));  // no tn
  EXPECT_GT(slow.phase(model::Phase::backward), even.phase(model::Phase::backward));
  // nt products (the logits, Q Kᵀ) run in the forward
  for (auto& p : g.table) p.efficiency = p.mode == model::GemmMode::nt ? 0.25 : 0.5;
  const auto slow_nt = model::predict_step_time(spec, config(), 8, 16, {}, DType::f32, m);
  EXPECT_GT(slow_nt.phase(model::Phase::forward), even.phase(model::Phase::forward));
}

// DeviceModel::launch_s: every kernel call of a step (its GEMM calls,
// element-wise passes and pointwise kernels) costs it once, on the compute
// side: the step grows by a whole number of launches, and fewer when the
// implementation batches its per-sequence calls (StepTimeOptions::batch_calls).
TEST(StepTime, LaunchOverheadPerKernelCall) {
  Machine m = machine(5e-6, 5e9, Algorithm::ring, 1);
  const auto spec = SchemeSpec::parse("1d:p=1");
  const double launch = 1e-3;
  const auto calls = [&](const model::StepTimeOptions& o) {
    m.device.launch_s = 0;
    const auto base = model::predict_step_time(spec, config(), 8, 16, {}, DType::f32, m, o);
    m.device.launch_s = launch;
    const auto with = model::predict_step_time(spec, config(), 8, 16, {}, DType::f32, m, o);
    EXPECT_NEAR(with.compute_s - base.compute_s, with.step_s - base.step_s, 1e-9);
    return (with.step_s - base.step_s) / launch;
  };
  const double each = calls({});
  EXPECT_GT(each, 20);
  EXPECT_NEAR(each, std::round(each), 1e-6 * each);
  const double batched = calls({.batch_calls = true});
  EXPECT_NEAR(batched, std::round(batched), 1e-6 * batched);
  EXPECT_LT(batched, each);  // 8 sequences' attention products in one call each
}

// Machine::contention reaches every overlap the model prices: SUMMA's
// pipelined panels, an op's overlapped collectives (3D's OAR / ORS / OAG)
// and the data axis's buckets beside the backward; a step that overlaps
// nothing (1D without a data axis) is unchanged.
TEST(StepTime, ContentionSlowsEveryOverlap) {
  Machine m = machine(5e-6, 2e9, Algorithm::ring, 4);
  const auto step = [&](const char* text, const model::Contention& c) {
    m.contention = c;
    return model::predict_step_time(SchemeSpec::parse(text), config(), 8, 16, {}, DType::f32, m)
        .step_s;
  };
  const model::Contention none{}, both{.compute = 0.5, .comm = 0.5};
  for (const char* text : {"2d:q=2", "3d:2x2x1,overlap=oar+ors+oag", "data=2,1d:p=2"}) {
    SCOPED_TRACE(text);
    EXPECT_GT(step(text, both), step(text, none));
    EXPECT_GT(step(text, {.compute = 0.5, .comm = 0}), step(text, none));
  }
  EXPECT_EQ(step("1d:p=4", both), step("1d:p=4", none));
}

TEST(StepTime, BreakdownAddsUp) {
  const Machine m = machine(5e-6, 5e9, Algorithm::ring, 2);
  const auto spec = SchemeSpec::parse("data=2,3d:2x2x2,overlap=oar+ors+oag");
  const auto t = model::predict_step_time(spec, config(), 8, 16, {}, DType::bf16, m);
  double phases = 0, ops = 0;
  for (double p : t.phase_s) phases += p;
  for (const auto& op : t.ops) ops += op.seconds() * static_cast<double>(op.count);
  EXPECT_NEAR(t.step_s, phases, 1e-12 * t.step_s);
  EXPECT_NEAR(t.step_s, ops, 1e-12 * t.step_s);
  EXPECT_NEAR(t.step_s, t.compute_s + t.exposed_s, 1e-12 * t.step_s);
  EXPECT_GT(t.phase(model::Phase::recompute), 0);
  EXPECT_GT(t.comm_s[static_cast<std::size_t>(CommAxis::data)], 0);
  // no checkpointing: no recomputation
  const auto plain = model::predict_step_time(spec, config(), 8, 16, {.recompute = Recompute::none},
                                              DType::bf16, m);
  EXPECT_EQ(plain.phase(model::Phase::recompute), 0);
  EXPECT_LT(plain.step_s, t.step_s);
}

TEST(StepTime, ThousandsOfDevicesInMilliseconds) {
  const Machine m = machine(5e-6, 25e9, Algorithm::ring, 8);
  GptConfig c = config(64);
  c.n_embd = 8192;
  c.n_layer = 24;
  c.n_positions = 512;
  const auto start = std::chrono::steady_clock::now();
  for (const char* text : {"2d:q=64", "data=64,1d:p=64", "3d:16x16x16", "data=64,2d:q=8"}) {
    const auto t =
        model::predict_step_time(SchemeSpec::parse(text), c, 4096, 512, {}, DType::bf16, m);
    EXPECT_GT(t.step_s, 0) << text;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(s, 2.0);  // four 4096-device predictions (typically a few ms each)
  testing::Test::RecordProperty("seconds", std::to_string(s));
}

// A pipelined step (predict_pipeline_step_time): the stages split the
// unpipelined microbatch's forward and backward exactly (every op on one
// stage); the flushed schedules take the first microbatch's way through the
// stages and back plus M - 1 times the slowest stage, so the bubble is the
// slowest stage's idle share and falls with more microbatches; the
// message-driven schedule with one microbatch in flight takes M round
// trips; the messages cross a node's link only when two stages do not fit
// a node; a scheme without a pipeline is refused.
TEST(StepTime, PipelineSchedulesPriceTheirBubble) {
  GptConfig c = config(8);
  c.n_layer = 6;
  const Machine m = machine(1e-5, 1e10, Algorithm::ring, 8);
  const index_t seq = 16, micro_batch = 2;
  const auto predict = [&](const std::string& text, int micro,
                           const Machine& on = machine(1e-5, 1e10, Algorithm::ring, 8)) {
    return model::predict_pipeline_step_time(SchemeSpec::parse(text), c, micro * micro_batch, seq,
                                             {}, DType::f32, on);
  };
  const model::StepTime one = model::predict_step_time(SchemeSpec::parse("data=2,2d:q=1"), c,
                                                       micro_batch, seq, {}, DType::f32, m);
  const model::PipelineStepTime t = predict("pipe=3:micro=4:schedule=gpipe,data=2,2d:q=1", 4);
  ASSERT_EQ(t.stages.size(), 3u);
  double forward = 0, backward = 0, way = 0, slowest = 0;
  for (const model::PipelineStageTime& s : t.stages) {
    forward += s.forward_s;
    backward += s.backward_s;
    way += s.forward_s + s.backward_s;
    slowest = std::max(slowest, s.forward_s + s.backward_s);
  }
  EXPECT_EQ(t.stages.front().first_block, 0);
  EXPECT_EQ(t.stages.back().last_block, c.n_layer);
  EXPECT_NEAR(forward, one.phase(model::Phase::forward), 1e-12 * forward);
  double data_wait = 0;  // the data axis's exposed wait is once per batch, not per microbatch
  for (const model::OpTime& o : one.ops)
    if (o.op == "data_axis") data_wait += o.seconds() * static_cast<double>(o.count);
  EXPECT_NEAR(backward + data_wait,
              one.phase(model::Phase::backward) + one.phase(model::Phase::recompute),
              1e-12 * backward);
  EXPECT_GT(t.message_s, 0);
  EXPECT_NEAR(t.pipeline_s, way + 4 * t.message_s + 3 * slowest, 1e-12 * t.pipeline_s);
  EXPECT_NEAR(t.bubble, 1 - 4 * slowest / t.pipeline_s, 1e-12);
  EXPECT_GT(t.bubble, 0);
  EXPECT_NEAR(t.step_s, t.pipeline_s + t.data_axis_s + t.embedding_s + t.optimizer_s,
              1e-12 * t.step_s);
  // the data axis: stage 0's reduction starts last, so all of it is
  // exposed; a later stage's overlaps the backwards below it, so none
  // exposes more than its own
  double most = 0;
  for (const model::PipelineStageTime& s : t.stages) most = std::max(most, s.data_axis_s);
  EXPECT_GT(t.stages.front().data_axis_s, 0);
  EXPECT_GE(t.data_axis_s, t.stages.front().data_axis_s);
  EXPECT_LE(t.data_axis_s, most);
  // more microbatches of the same size: a smaller bubble; 1F1B the same time
  EXPECT_LT(predict("pipe=3:micro=8:schedule=gpipe,data=2,2d:q=1", 8).bubble, t.bubble);
  EXPECT_EQ(predict("pipe=3:micro=4:schedule=1f1b,data=2,2d:q=1", 4).pipeline_s, t.pipeline_s);
  // AxoNN's schedule with one microbatch in flight: M round trips
  const model::PipelineStepTime one_at_a_time = predict("pipe=3:micro=4:limit=1,data=2,2d:q=1", 4);
  EXPECT_NEAR(one_at_a_time.pipeline_s, 4 * (way + 4 * t.message_s), 1e-12 * t.pipeline_s);
  EXPECT_EQ(predict("pipe=3:micro=4:limit=3,data=2,2d:q=1", 4).pipeline_s, t.pipeline_s);
  // two stages of 2 ranks on a node of 8: the node's link; of 4, the network's
  const double near = predict("pipe=2:micro=2,data=2,2d:q=1", 2).message_s;
  const double far =
      predict("pipe=2:micro=2,data=2,2d:q=1", 2, machine(1e-5, 1e10, Algorithm::ring, 2)).message_s;
  EXPECT_GT(far, near);
  EXPECT_THROW((void)model::predict_pipeline_step_time(SchemeSpec::parse("2d:q=1"), c, 4, seq, {},
                                                       DType::f32, m),
               Error);
  EXPECT_THROW((void)predict("pipe=2:micro=3,2d:q=1", 1), Error);  // 2 sequences in 3
}

// A pipeline stage without per-block checkpoints (recompute none or
// selective): no recompute, and each block's activations copied into the
// microbatch's slot after its forward and back before its backward, each
// copy reading and writing a block's forward need at the memory bandwidth
// (plus a call). The oracle for that need: the unpipelined plan's forward
// buffer under none grows by it per layer.
TEST(StepTime, PipelineWithoutCheckpointsPricesTheSlotCopies) {
  GptConfig c = config(8);
  c.n_layer = 6;
  const index_t seq = 16, micro_batch = 2, micro = 4;
  const std::string text = "pipe=3:micro=4:schedule=gpipe,data=2,2d:q=1";
  const SchemeSpec spec = SchemeSpec::parse(text);
  for (const Recompute recompute : {Recompute::none, Recompute::selective}) {
    SCOPED_TRACE(to_string(recompute));
    const GptOptions options{.recompute = recompute};
    const auto block_need = [&] {  // the forward buffer of n and n - 1 layers
      CpuBackend backend;
      const auto forward = [&](int layers) {
        GptConfig d = c;
        d.n_layer = layers;
        const MemoryReport r =
            plan_memory<float>(spec.stage(), backend, d, micro_batch, seq, GridCoords{}, options);
        for (const BufferUsage& b : r.buffers)
          if (b.name == "forward") return static_cast<double>(b.capacity);
        return 0.0;
      };
      return forward(c.n_layer) - forward(c.n_layer - 1);
    }();
    ASSERT_GT(block_need, 0);
    for (const double launch : {0.0, 3e-6}) {
      Machine m = machine(1e-5, 1e10, Algorithm::ring, 8);
      m.device.launch_s = launch;
      const model::StepTime one =
          model::predict_step_time(spec.stage(), c, micro_batch, seq, options, DType::f32, m);
      EXPECT_EQ(one.phase(model::Phase::recompute), 0);
      const model::PipelineStepTime t = model::predict_pipeline_step_time(
          spec, c, micro * micro_batch, seq, options, DType::f32, m);
      double forward = 0, backward = 0, data_wait = 0;
      for (const model::PipelineStageTime& st : t.stages) {
        forward += st.forward_s;
        backward += st.backward_s;
      }
      for (const model::OpTime& o : one.ops)
        if (o.op == "data_axis") data_wait += o.seconds() * static_cast<double>(o.count);
      const double copy = 2 * block_need / m.device.memory_bandwidth + launch;
      EXPECT_NEAR(forward, one.phase(model::Phase::forward) + c.n_layer * copy, 1e-9 * forward);
      EXPECT_NEAR(backward + data_wait, one.phase(model::Phase::backward) + c.n_layer * copy,
                  1e-9 * backward);
    }
  }
}

// The 2021 profiles overlap nothing: every collective on the critical
// rank is exposed (step = compute + all communication, the data axis
// after backward included), with the system's options (Optimus: whole
// blocks, no SUMMA overlap; Megatron: distributed checkpoints) and rings;
// summa's own implementation of the same text hides some of it.
TEST(StepTime, ImplementationProfiles) {
  Machine m = machine(5e-6, 5e9, Algorithm::tree, 2);
  using model::Implementation;
  const GptOptions options{};
  struct Case {
    Implementation impl;
    const char* scheme;
  };
  for (const Case& c : {Case{Implementation::optimus_2021, "data=2,2d:q=2"},
                        Case{Implementation::megatron_2021, "data=2,1d:p=4"},
                        Case{Implementation::optimus_2021, "2d:q=3,panel=64"}}) {
    SCOPED_TRACE(c.scheme);
    const SchemeSpec given = SchemeSpec::parse(c.scheme);
    const model::Implemented run = model::implement(c.impl, given, options, m);
    for (const model::LinkLevel* level : {&run.machine.intra_node, &run.machine.inter_node})
      for (const model::CollectiveCost& cost : level->collectives)
        EXPECT_EQ(cost.algorithm, Algorithm::ring);
    EXPECT_FALSE(run.time.overlap_collectives);
    EXPECT_FALSE(run.time.overlap_data_axis);
    if (given.scheme == "2d") {
      EXPECT_EQ(run.spec.as<Summa2DSpec>().summa.panel, 0);
      EXPECT_FALSE(run.spec.as<Summa2DSpec>().summa.overlap);
    } else {
      EXPECT_TRUE(run.spec.as<Megatron1DSpec>().distribute_checkpoints);
      EXPECT_EQ(run.spec.str(), "data=2,1d:p=4,dc=on");
    }
    const index_t batch = 12 * given.data;
    const model::StepTime t = model::predict_step_time(run.spec, config(), batch, 16, options,
                                                       DType::f32, run.machine, run.time);
    double comm = 0;
    for (double a : t.comm_s) comm += a;
    EXPECT_GT(comm, 0);
    EXPECT_NEAR(t.step_s, t.compute_s + comm, 1e-12 * t.step_s);
    EXPECT_NEAR(t.exposed_s, comm, 1e-12 * comm);
    // this library's implementation of the same text on the same machine
    // (its own algorithms, tree) hides part of its communication
    const model::StepTime ours =
        model::predict_step_time(given, config(), batch, 16, options, DType::f32, m);
    double our_comm = 0;
    for (double a : ours.comm_s) our_comm += a;
    EXPECT_LT(ours.exposed_s, our_comm);
  }
  // summa leaves everything as given; axonn turns every 3D overlap on
  const SchemeSpec three = SchemeSpec::parse("data=2,3d:2x1x2");
  const model::Implemented same = model::implement(Implementation::summa, three, options, m);
  EXPECT_EQ(same.spec, three);
  EXPECT_EQ(same.machine, m);
  EXPECT_TRUE(same.time.overlap_collectives && same.time.overlap_data_axis);
  const model::Implemented axonn = model::implement(Implementation::axonn, three, options, m);
  EXPECT_EQ(axonn.spec, SchemeSpec::parse("data=2,3d:2x1x2,overlap=oar+ors+oag"));
  EXPECT_EQ(axonn.machine, m);
  // Megatron's distributed checkpoints need per-block recompute: without
  // it the profile keeps the checkpoints as the text has them
  EXPECT_FALSE(model::implement(Implementation::megatron_2021, SchemeSpec::parse("1d:p=2"),
                                {.recompute = Recompute::none}, m)
                   .spec.as<Megatron1DSpec>()
                   .distribute_checkpoints);
  // names round-trip; the wrong scheme, sp=on under 2021's Megatron and an
  // unknown name are refused, naming what was given
  for (Implementation i : model::all_implementations())
    EXPECT_EQ(model::parse_implementation(model::to_string(i), "x"), i);
  EXPECT_NE(error_of([&] {
              model::implement(Implementation::optimus_2021, SchemeSpec::parse("1d:p=4"), options,
                               m);
            })
                .find("'optimus-2021' prices 2d schemes (the system it profiles runs no other); "
                      "the scheme is '1d:p=4'"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              model::implement(Implementation::megatron_2021, SchemeSpec::parse("1d:p=4,sp=on"),
                               options, m);
            }).find("no sequence parallelism"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              model::parse_implementation("megatron", "study x");
            }).find("study x: implementation 'megatron' is not summa, optimus-2021"),
            std::string::npos);
}

TEST(StepTime, Errors) {
  Machine m = machine(5e-6, 5e9, Algorithm::ring);
  m.device.gemm_of(DType::bf16).peak_flops = 0;
  EXPECT_NE(error_of([&] {
              model::predict_step_time(SchemeSpec::parse("2d:q=2"), config(), 8, 16, {},
                                       DType::bf16, m);
            }).find("no GEMM rate for bf16"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              model::predict_step_time(SchemeSpec::parse("data=2,2d:q=2"), config(), 3, 16, {},
                                       DType::f32, m);
            }).find("divisible by data=2"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              model::predict_step_time(SchemeSpec::parse("2d:q=2"), config(), 8, 16, {}, DType::f32,
                                       m, {.rank = GridCoords{0, 0, 2, 0}});
            }).find("not on the 2d:q=2 grid"),
            std::string::npos);
}

}  // namespace
}  // namespace summa::test

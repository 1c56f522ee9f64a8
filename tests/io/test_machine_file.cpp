// Machine files (summa/io/machine_file.hpp) and the machine model's pieces
// (summa/model/machine.hpp), serial: every shipped file in machines/ parses
// and survives a write / parse round trip unchanged; a bad file is refused
// with a message naming the file, the key and the value; the collective
// formulas reduce to bytes/β with α = 0 and to the step count times α with
// no bytes; the GEMM model saturates as documented and a calibration table
// is read nearest-neighbour.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "summa/core/error.hpp"
#include "summa/io/machine_file.hpp"
#include "test_util.hpp"

namespace summa::test {
namespace {

namespace fs = std::filesystem;
using model::Algorithm;
using model::Collective;

TEST(MachineFile, ShippedFilesParseAndRoundTrip) {
  int files = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(SUMMA_SOURCE_DIR) / "machines")) {
    if (entry.path().extension() != ".json") continue;
    SCOPED_TRACE(entry.path().string());
    const model::Machine m = io::load_machine(entry.path().string());
    EXPECT_FALSE(m.name.empty());
    EXPECT_GE(m.devices_per_node, 1);
    EXPECT_GT(m.device.memory_bytes, 0u);
    EXPECT_GT(m.device.gemm_of(DType::f32).peak_flops, 0);
    EXPECT_EQ(io::parse_machine(io::machine_json(m), "round trip"), m);
    ++files;
  }
  EXPECT_GE(files, 3);
}

std::string valid() {
  model::Machine m;
  m.name = "test";
  m.devices_per_node = 2;
  m.device.name = "dev";
  m.device.memory_bytes = 1 << 30;
  m.device.memory_bandwidth = 1e10;
  m.device.gemm_of(DType::f64) = {
      .peak_flops = 1e10, .max_efficiency = 0.5, .half_flops = 1e6, .table = {}};
  m.device.gemm_of(DType::f64).table.push_back({.m = 8, .n = 8, .k = 8, .efficiency = 0.25});
  m.device.pointwise[static_cast<std::size_t>(DType::f64)]
                    [static_cast<std::size_t>(model::Pointwise::gelu)] = 3e7;
  for (Collective c : model::all_collectives) m.intra_node[c] = {1e-6, 1e9, Algorithm::ring, {}};
  for (Collective c : model::all_collectives) m.inter_node[c] = {1e-5, 1e8, Algorithm::tree, {}};
  return io::machine_json(m);
}

std::string error_of_text(const std::string& text) {
  try {
    io::parse_machine(text, "m.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return text.replace(at, from.size(), to);
}

TEST(MachineFile, BadFilesAreRefusedByName) {
  const std::string ok = valid();
  EXPECT_EQ(error_of_text(ok), "");
  const auto expect = [&](const std::string& text, const std::string& want) {
    const std::string got = error_of_text(text);
    EXPECT_NE(got.find("m.json"), std::string::npos) << got;
    EXPECT_NE(got.find(want), std::string::npos) << got << "\n(wanted: " << want << ")";
  };
  expect("{", "not valid JSON");
  expect("[]", "expected an object");
  expect(replaced(ok, "summa-machine/1", "summa-machine/9"), "\"summa-machine/9\"");
  expect(replaced(ok, "\"devices_per_node\": 2", "\"devices_per_node\": 0"),
         "\"devices_per_node\" is number 0, expected a positive integer");
  expect(replaced(ok, "\"devices_per_node\": 2", "\"devices_per_nodes\": 2"),
         "has no \"devices_per_node\"");
  expect(replaced(ok, "\"name\": \"test\"", "\"name\": \"test\", \"colour\": 1"),
         "unknown key \"colour\"");
  expect(replaced(ok, "\"beta_bytes_s\": 1000000000.0", "\"beta_bytes_s\": -1"),
         "\"links\".\"intra_node\".\"broadcast\".\"beta_bytes_s\" is number -1");
  expect(replaced(ok, "\"algorithm\": \"tree\"", "\"algorithm\": \"star\""),
         "\"star\", expected one of ring, tree, direct");
  expect(replaced(ok, "\"max_efficiency\": 0.5", "\"max_efficiency\": 1.5"),
         "\"max_efficiency\" is above 1");
  expect(replaced(ok, "0.25", "2.5"), "with 0 < efficiency <= 1");
  expect(replaced(ok, "\"f64\"", "\"f16\""), "unknown key \"f16\"");
  expect(replaced(ok, "\"gelu\": 30000000.0", "\"gelu\": 0"),
         "\"pointwise\".\"f64\".\"gelu\" is number 0, expected a number > 0");
  expect(replaced(ok, "\"gelu\": 30000000.0", "\"tanh\": 1"), "unknown key \"tanh\"");
  // the pointwise rates survive the round trip; a file without them has none
  const model::Machine back = io::parse_machine(ok, "m.json");
  EXPECT_EQ(back.device.pointwise_rate(DType::f64, model::Pointwise::gelu), 3e7);
  EXPECT_EQ(back.device.pointwise_rate(DType::f64, model::Pointwise::exp), 0);
  EXPECT_EQ(io::parse_machine(io::machine_json(back), "again"), back);
  // the host link: optional (0, a CPU, when absent), read and written back
  EXPECT_EQ(back.device.host_bandwidth, 0);
  const std::string linked =
      replaced(ok, "\"memory_bandwidth\": 10000000000.0",
               "\"memory_bandwidth\": 10000000000.0, \"host_bandwidth\": 25000000000.0");
  const model::Machine with_link = io::parse_machine(linked, "m.json");
  EXPECT_EQ(with_link.device.host_bandwidth, 2.5e10);
  EXPECT_EQ(io::parse_machine(io::machine_json(with_link), "again"), with_link);
  expect(replaced(linked, "25000000000.0", "-1"),
         "\"device\".\"host_bandwidth\" is number -1, expected a number >= 0");
  EXPECT_THROW(io::load_machine("/nonexistent/machine.json"), Error);
}

// A calibration's spreads: optional, read and written back, refused by
// name when negative or of an unknown key; at_spread prices the machine at
// both ends (rates divided or multiplied by 1 + spread, α the other way,
// overlap's contention factors plus or minus theirs), leaves a figure
// without a spread alone, and is the machine itself at 0.
TEST(MachineFile, SpreadsAndTheirEnds) {
  model::Machine m = io::parse_machine(valid(), "m.json");
  EXPECT_FALSE(m.spread.any());
  EXPECT_EQ(io::machine_json(m).find("spread"), std::string::npos);
  m.spread.gemm[static_cast<std::size_t>(DType::f64)] = 0.1;
  m.spread.pointwise[static_cast<std::size_t>(DType::f64)] = 0.2;
  m.spread.memory_bandwidth = 0.05;
  m.spread.intra_node = 1.5;  // quartiles further apart than the median: allowed
  const std::string text = io::machine_json(m);
  const model::Machine back = io::parse_machine(text, "m.json");
  EXPECT_EQ(back, m);
  EXPECT_TRUE(back.spread.any());
  const auto expect = [&](const std::string& t, const std::string& want) {
    const std::string got = error_of_text(t);
    EXPECT_NE(got.find(want), std::string::npos) << got << "\n(wanted: " << want << ")";
  };
  expect(replaced(text, "\"memory_bandwidth\": 0.05", "\"memory_bandwidth\": -0.05"),
         "\"spread\".\"memory_bandwidth\" is number -0.05, expected a number >= 0");
  expect(replaced(text, "\"memory_bandwidth\": 0.05", "\"bandwidth\": 0.05"),
         "unknown key \"bandwidth\"");
  const std::size_t f64 = static_cast<std::size_t>(DType::f64);
  const std::size_t gelu = static_cast<std::size_t>(model::Pointwise::gelu);
  const model::Machine slow = model::at_spread(m, 1), fast = model::at_spread(m, -1);
  EXPECT_EQ(model::at_spread(m, 0), m);
  EXPECT_DOUBLE_EQ(slow.device.gemm[f64].peak_flops, 1e10 / 1.1);
  EXPECT_DOUBLE_EQ(fast.device.gemm[f64].peak_flops, 1e10 * 1.1);
  EXPECT_DOUBLE_EQ(slow.device.pointwise[f64][gelu], 3e7 / 1.2);
  EXPECT_DOUBLE_EQ(slow.device.memory_bandwidth, 1e10 / 1.05);
  EXPECT_DOUBLE_EQ(slow.intra_node[Collective::all_reduce].beta_bytes_s, 1e9 / 2.5);
  EXPECT_DOUBLE_EQ(slow.intra_node[Collective::all_reduce].alpha_s, 1e-6 * 2.5);
  EXPECT_DOUBLE_EQ(fast.intra_node[Collective::all_reduce].alpha_s, 1e-6 / 2.5);
  EXPECT_EQ(slow.inter_node, m.inter_node);  // no spread recorded there
  EXPECT_EQ(slow.contention, m.contention);  // none recorded: overlap stays free
  // overlap's contention: an absolute spread, added at the slow end and
  // taken off (not below 0) at the fast end
  m.contention = {.compute = 0.6, .comm = 0.05};
  m.spread.contention = 0.2;
  EXPECT_EQ(io::parse_machine(io::machine_json(m), "m.json"), m);
  const model::Machine slow2 = model::at_spread(m, 1), fast2 = model::at_spread(m, -1);
  EXPECT_DOUBLE_EQ(slow2.contention.compute, 0.8);
  EXPECT_DOUBLE_EQ(slow2.contention.comm, 0.25);
  EXPECT_DOUBLE_EQ(fast2.contention.compute, 0.4);
  EXPECT_DOUBLE_EQ(fast2.contention.comm, 0.0);
  expect(replaced(io::machine_json(m), "\"contention\": 0.2", "\"contention\": -0.2"),
         "\"spread\".\"contention\" is number -0.2, expected a number >= 0");
}

// A collective's size ranges (calibrate's two lines): each message takes
// its range's α and β (one beyond the last: the last's), the ranges survive
// a round trip, share a link's bandwidth and move with the spread; ranges
// out of order or malformed are refused by name.
TEST(MachineFile, CollectiveSizeRanges) {
  model::Machine m = io::parse_machine(valid(), "m.json");
  model::CollectiveCost& ar = m.intra_node[Collective::all_reduce];
  ar.ranges = {{4096, 2e-6, 1e8}, {1 << 22, 5e-6, 4e9}};
  m.spread.intra_node = 0.25;
  const std::string text = io::machine_json(m);
  const model::Machine back = io::parse_machine(text, "m.json");
  EXPECT_EQ(back, m);
  const auto ring_all_reduce = [](double alpha, double beta, std::int64_t g, double n) {
    const auto steps = static_cast<double>(g - 1);
    return 2 * steps * alpha + 2 * steps / static_cast<double>(g) * n / beta;
  };
  for (const double n : {8.0, 4096.0, 4097.0, 1e6, 1e8}) {  // 1e8: past the last range
    const bool small = n <= 4096;
    EXPECT_DOUBLE_EQ(model::collective_seconds(back.intra_node[Collective::all_reduce],
                                               Collective::all_reduce, 4, n),
                     ring_all_reduce(small ? 2e-6 : 5e-6, small ? 1e8 : 4e9, 4, n))
        << n;
  }
  // the other collectives keep their one line
  EXPECT_DOUBLE_EQ(model::collective_seconds(back.intra_node[Collective::broadcast],
                                             Collective::broadcast, 4, 1e6),
                   3 * 1e-6 + 1e6 / 1e9);
  model::CollectiveCost shared = ar;
  shared.share_bandwidth(4);
  EXPECT_DOUBLE_EQ(shared.ranges[0].beta_bytes_s, 1e8 / 4);
  EXPECT_DOUBLE_EQ(shared.ranges[1].beta_bytes_s, 1e9);
  EXPECT_DOUBLE_EQ(shared.beta_bytes_s, 1e9 / 4);
  const model::Machine slow = model::at_spread(m, 1);
  EXPECT_DOUBLE_EQ(slow.intra_node[Collective::all_reduce].ranges[1].beta_bytes_s, 4e9 / 1.25);
  EXPECT_DOUBLE_EQ(slow.intra_node[Collective::all_reduce].ranges[0].alpha_s, 2e-6 * 1.25);
  const auto expect = [&](const std::string& t, const std::string& want) {
    const std::string got = error_of_text(t);
    EXPECT_NE(got.find(want), std::string::npos) << got << "\n(wanted: " << want << ")";
  };
  const auto at = text.find("\"sizes\"");
  ASSERT_NE(at, std::string::npos) << text;
  std::size_t end = text.find('[', at), depth = 0;  // the array's matching ']'
  for (; end < text.size(); ++end) {
    depth += text[end] == '[' ? 1 : 0;
    depth -= text[end] == ']' ? 1 : 0;
    if (depth == 0) break;
  }
  const std::string sizes = text.substr(at, end - at + 1);
  expect(replaced(text, "4096.0", "8388608.0"), "\"intra_node\".\"all_reduce\".\"sizes\"[1] is");
  expect(replaced(text, "4096.0", "8388608.0"), "up_to_bytes above the previous range's");
  expect(replaced(text, sizes, "\"sizes\": []"), "expected a non-empty array");
  expect(replaced(text, "4096.0", "-1.0"),
         "expected [up_to_bytes, alpha_s, beta_bytes_s] with up_to_bytes and beta > 0");
}

// Overlap's contention: read and written back, refused when negative; the
// span of a pair is max(compute + compute-slowdown x overlap, slowed
// collective), max(compute, comm) without contention.
TEST(MachineFile, ContentionAndOverlappedSeconds) {
  model::Machine m = io::parse_machine(valid(), "m.json");
  EXPECT_FALSE(m.contention.any());
  EXPECT_EQ(io::machine_json(m).find("contention"), std::string::npos);
  m.contention = {.compute = 0.5, .comm = 0.25};
  const std::string text = io::machine_json(m);
  EXPECT_EQ(io::parse_machine(text, "m.json"), m);
  const std::string got = error_of_text(replaced(text, "\"compute\": 0.5", "\"compute\": -0.5"));
  EXPECT_NE(got.find("\"contention\".\"compute\" is number -0.5, expected a number >= 0"),
            std::string::npos)
      << got;
  const model::Contention none{};
  EXPECT_DOUBLE_EQ(model::overlapped_seconds(none, 3, 2), 3);
  EXPECT_DOUBLE_EQ(model::overlapped_seconds(none, 2, 3), 3);
  // compute-bound: 3 + 0.5 x min(3, 2 x 1.25)
  EXPECT_DOUBLE_EQ(model::overlapped_seconds(m.contention, 3, 2), 3 + 0.5 * 2.5);
  // comm-bound: the slowed collective, 8 x 1.25 = 10 > 1 + 0.5
  EXPECT_DOUBLE_EQ(model::overlapped_seconds(m.contention, 1, 8), 10);
  EXPECT_DOUBLE_EQ(model::overlapped_seconds(m.contention, 4, 0), 4);
}

TEST(MachineModel, CollectiveFormulas) {
  const double n = 3e6, beta = 2e9;
  const model::CollectiveCost ring{0, beta, Algorithm::ring, {}};
  for (std::int64_t g : {2, 3, 8}) {
    const double share = static_cast<double>(g - 1) / static_cast<double>(g);
    EXPECT_DOUBLE_EQ(model::collective_seconds(ring, Collective::all_reduce, g, n),
                     2 * share * n / beta);
    EXPECT_DOUBLE_EQ(model::collective_seconds(ring, Collective::all_gather, g, n),
                     share * n / beta);
    EXPECT_DOUBLE_EQ(model::collective_seconds(ring, Collective::broadcast, g, n), n / beta);
    const model::CollectiveCost latency{1e-5, beta, Algorithm::ring, {}};
    EXPECT_DOUBLE_EQ(model::collective_seconds(latency, Collective::reduce_scatter, g, 0),
                     static_cast<double>(g - 1) * 1e-5);
    const model::CollectiveCost tree{1e-5, beta, Algorithm::tree, {}};
    EXPECT_DOUBLE_EQ(model::collective_seconds(tree, Collective::all_reduce, g, n),
                     2 * std::ceil(std::log2(static_cast<double>(g))) * (1e-5 + n / beta));
    const model::CollectiveCost direct{1e-5, beta, Algorithm::direct, {}};
    EXPECT_DOUBLE_EQ(model::collective_seconds(direct, Collective::broadcast, g, n),
                     static_cast<double>(g - 1) * 1e-5 + share * n / beta);
    // a broadcast's root sends (g-1) n, the others receive n
    EXPECT_DOUBLE_EQ(model::direct_seconds(direct, g, static_cast<double>(g - 1) * n, 0),
                     static_cast<double>(g - 1) * (1e-5 + n / (2 * beta)));
  }
  EXPECT_EQ(model::collective_seconds(ring, Collective::all_reduce, 1, n), 0);
  // more ranks never make a ring all-reduce of the same buffer faster
  double last = 0;
  for (std::int64_t g = 2; g <= 4096; g *= 2) {
    const double t =
        model::collective_seconds({1e-6, beta, Algorithm::ring, {}}, Collective::all_reduce, g, n);
    EXPECT_GE(t, last);
    last = t;
  }
}

TEST(MachineModel, GemmEfficiency) {
  model::GemmModel g{.peak_flops = 1e12, .max_efficiency = 0.8, .half_flops = 2e6, .table = {}};
  // f = 2mnk = half_flops: half of max_efficiency
  EXPECT_DOUBLE_EQ(g.efficiency(100, 100, 100), 0.8 * 2e6 / (2e6 + 2e6));
  EXPECT_NEAR(g.efficiency(10000, 10000, 10000), 0.8, 1e-5);
  EXPECT_DOUBLE_EQ(g.seconds(100, 100, 100), 2e6 / (1e12 * 0.4));
  EXPECT_EQ(g.seconds(0, 100, 100), 0);
  // a batched call of 4 products saturates like one product of its whole work
  EXPECT_DOUBLE_EQ(g.efficiency(100, 100, 100, 4), 0.8 * 8e6 / (8e6 + 2e6));
  EXPECT_DOUBLE_EQ(g.seconds(100, 100, 100, 4), 8e6 / (1e12 * 0.8 * 8e6 / (8e6 + 2e6)));
  g.table = {{.m = 64, .n = 64, .k = 64, .efficiency = 0.3},
             {.m = 1024, .n = 1024, .k = 1024, .efficiency = 0.7}};
  EXPECT_EQ(g.efficiency(70, 60, 64), 0.3);
  EXPECT_EQ(g.efficiency(900, 2000, 1024), 0.7);
  // a table of nn entries prices every mode; one with a mode's own entries
  // prices that mode from them alone
  EXPECT_EQ(g.efficiency(70, 60, 64, 1, model::GemmMode::tn), 0.3);
  g.table.push_back(
      {.m = 1024, .n = 1024, .k = 1024, .efficiency = 0.2, .mode = model::GemmMode::tn});
  EXPECT_EQ(g.efficiency(70, 60, 64, 1, model::GemmMode::tn), 0.2);
  EXPECT_EQ(g.efficiency(70, 60, 64, 1, model::GemmMode::nt), 0.3);
  EXPECT_EQ(g.efficiency(70, 60, 64, 1, model::GemmMode::nn), 0.3);
  EXPECT_DOUBLE_EQ(g.seconds(1024, 1024, 1024, 1, model::GemmMode::tn),
                   2.0 * 1024 * 1024 * 1024 / (1e12 * 0.2));
  // written with its mode, read back the same; a bad mode is refused
  model::Machine m = io::parse_machine(valid(), "m.json");
  m.device.gemm_of(DType::f64)
      .table.push_back({.m = 16, .n = 8, .k = 8, .efficiency = 0.5, .mode = model::GemmMode::nt});
  const std::string text = io::machine_json(m);
  EXPECT_NE(text.find("\"nt\""), std::string::npos) << text;
  EXPECT_EQ(io::parse_machine(text, "m.json"), m);
  const std::string got = error_of_text(replaced(text, "\"nt\"", "\"tt\""));
  EXPECT_NE(got.find("with mode nn, nt or tn"), std::string::npos) << got;
}

}  // namespace
}  // namespace summa::test

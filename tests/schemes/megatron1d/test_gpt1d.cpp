// What only the 1D (Megatron-LM) tensor-parallel scheme has, on p ranks in a
// line (ProcessGrid::linear1d; CTest: 1, 2 and 4 ranks). The 1D layers and
// Gpt against the serial reference (each layer alone, the whole model in
// double, float and bf16, checkpointing, accumulation, replicas, allocation,
// buffers, generic configuration and id errors) are checked with the other
// schemes' in one typed suite, tests/layers/test_scheme_layers.cpp; here:
//
// Layers1D.SplitsAndReplicas: how 1D splits — a column-parallel linear holds
// out/p output columns (c_attn one piece per q|k|v group), a row-parallel
// linear's bias is owned by rank 0, the embedding's vocabulary rows of rank
// r start at r*V/p; exactly the replicated parameters (LayerNorms, the
// row-parallel biases, wpe: 6 per block + 3) are whole replicas owned by
// rank 0, every other parameter is split into p equal shards.
// Layers1D.ConfigErrors: the 1D layers' own shape errors, the same on every
// rank.
// Gpt1D.TrafficIsMegatrons: the communication of a step is exactly the
// all-reduces the scheme prescribes (float, and bf16 with its loss
// statistics travelling as fp32).
// Gpt1D.InvalidConfigurationsThrowEverywhere: the 1D divisibility rules
// (n_embd and vocab by p; no batch divisibility), and a data axis.
//
// Backend: test_backend() (SUMMA_TEST_BACKEND=cpu|cuda) with its
// communicators (test_grid_options()).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "test_util.hpp"

namespace summa::test {
namespace {

// ---------------------------------------------------------------- environment

struct LineEnv {
  Backend& backend = test_backend();  // first: selects the rank's device
  ProcessGrid grid = ProcessGrid::linear1d(MPI_COMM_WORLD, 0, 1, test_grid_options());
};
LineEnv& line_env() {
  static LineEnv e;
  return e;
}
int group_size() {
  return line_env().grid.tensor().size();
}
int group_rank() {
  return line_env().grid.tensor().rank();
}

reference::GptConfig test_config(int n_layer = 2) {
  const int m = std::lcm(4, group_size());
  reference::GptConfig c;
  c.n_layer = n_layer;
  c.n_head = m;
  c.n_embd = 8 * m;   // head dim 8
  c.n_positions = 7;  // wpe is replicated: any size
  c.vocab_size = 11 * m;
  return c;
}

std::vector<std::int32_t> random_ids(index_t n, int vocab, std::mt19937_64& gen) {
  std::uniform_int_distribution<int> dist(0, vocab - 1);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(n));
  for (auto& id : ids) id = dist(gen);
  return ids;
}

// Construction errors are the same summa::Error on every rank.
template <class Make>
std::string agreed_error_of(Make make) {
  const std::string msg = error_of(make);
  EXPECT_TRUE(same_on_all_ranks(msg)) << msg;
  return msg;
}

// ---------------------------------------------------------------- layers

// How 1D splits the layers and which parameters it replicates.
TEST(Layers1D, SplitsAndReplicas) {
  LineEnv& e = line_env();
  const int p = group_size(), r = group_rank();
  const reference::GptConfig config = test_config();
  const index_t h = config.n_embd, V = config.vocab_size, tokens = 6;
  ColumnParallelLinear1D<float> fc(e.grid, e.backend, "h.0.mlp.c_fc", tokens, h, 4 * h);
  EXPECT_EQ(fc.local_out(), 4 * h / p);
  EXPECT_EQ(fc.weight().shard.pieces.size(), 1u);
  ColumnParallelLinear1D<float> attn(e.grid, e.backend, "h.0.attn.c_attn", tokens, h, 3 * h, true,
                                     {.out = 3});
  EXPECT_EQ(attn.local_out(), 3 * h / p);
  EXPECT_EQ(attn.weight().shard.pieces.size(), 3u);  // one per q|k|v group
  RowParallelLinear1D<float> proj(e.grid, e.backend, "h.0.mlp.c_proj", tokens, 4 * h, h);
  EXPECT_TRUE(proj.weight().shard.owner);
  EXPECT_EQ(proj.bias().shard.owner, r == 0);
  Embedding1D<float> emb(e.grid, e.backend, 2, 3, V, h, config.n_positions);
  EXPECT_EQ(emb.vocab_begin(), r * (V / p));

  // In a whole model: exactly the replicated parameters are replicas (whole
  // tensors, owned by rank 0); every other parameter is split in p shards.
  Megatron1DContext<float> scheme(e.grid, e.backend);
  Gpt<float> model(scheme, config, 3, 4);
  std::set<std::string> replicated = {"wpe.weight", "ln_f.weight", "ln_f.bias"};
  for (int i = 0; i < config.n_layer; ++i)
    for (const char* name : {"ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias",
                             "attn.c_proj.bias", "mlp.c_proj.bias"})
      replicated.insert("h." + std::to_string(i) + "." + name);
  EXPECT_EQ(replicated.size(), static_cast<std::size_t>(6 * config.n_layer + 3));
  for (Param<float>* q : model.parameters_store().params()) {
    const ParamShard& s = q->shard;
    const bool is_replica = replicated.count(s.name) > 0;
    EXPECT_EQ(s.owner, !is_replica || r == 0) << s.name;
    if (is_replica) {
      EXPECT_EQ(s.local_size(), s.global_size()) << s.name;
    } else {
      EXPECT_EQ(s.local_size() * p, s.global_size()) << s.name;
    }
  }
}

// gather_global places the owners' pieces and checks that they cover each
// element exactly once: a replica every rank claims (held p times) or none
// claims (held 0 times) is the same error on every rank.
TEST(Layers1D, GatherGlobalNeedsExactlyOneOwner) {
  LineEnv& e = line_env();
  const int p = group_size();
  Megatron1DContext<double> scheme(e.grid, e.backend);
  Gpt<double> model(scheme, test_config(), 3, 4);
  model.init(fresh_seed());
  Param<double> replica = model.parameters_store().find("ln_f.weight");
  const auto n = static_cast<std::size_t>(replica.shard.global_size());
  EXPECT_EQ(gather_global(replica, e.grid), std::vector<double>(replica.value, replica.value + n));
  const Param<double>& split = model.parameters_store().find("h.0.mlp.c_fc.weight");
  EXPECT_EQ(gather_global(split, e.grid).size(),
            static_cast<std::size_t>(split.shard.global_size()));
  for (const bool owner : {true, false}) {
    replica.shard.owner = owner;
    const int held = owner ? p : 0;
    if (held == 1) continue;  // one rank: claimed once, no error
    const std::string msg = agreed_error_of([&] { (void)gather_global(replica, e.grid); });
    EXPECT_NE(msg.find(fmt::format("'ln_f.weight': element 0 is held by {} ranks", held)),
              std::string::npos)
        << msg;
  }
}

// The 1D layers' own shape errors (attention's: test_scheme_layers.cpp).
TEST(Layers1D, ConfigErrors) {
  LineEnv& e = line_env();
  const int p = group_size();
  const auto column = [&](index_t out, int groups) {
    return agreed_error_of([&] {
      ColumnParallelLinear1D<float> l(e.grid, e.backend, "c", 4, 8, out, true, {.out = groups});
    });
  };
  EXPECT_NE(column(0, 1).find("must be positive"), std::string::npos);
  EXPECT_EQ(column(3 * p, 3), "");
  const auto row = [&](index_t in) {
    return agreed_error_of([&] { RowParallelLinear1D<float> l(e.grid, e.backend, "c", 4, in, 8); });
  };
  EXPECT_EQ(row(2 * p), "");
  if (p > 1) {
    EXPECT_NE(column(p + 1, 1).find("out=" + std::to_string(p + 1)), std::string::npos);
    EXPECT_NE(column(3 * (p + 1), 3).find("groups*p"), std::string::npos);
    EXPECT_NE(row(p + 1).find("in=" + std::to_string(p + 1)), std::string::npos);
    EXPECT_NE(agreed_error_of([&] {
                Embedding1D<float> m(e.grid, e.backend, 1, 4, p + 1, 8, 8);
              }).find("vocab="),
              std::string::npos);
  }
  EXPECT_NE(agreed_error_of([&] {
              Embedding1D<float> m(e.grid, e.backend, 1, 9, 4 * p, 8, 8);
            }).find("longer than the position table"),
            std::string::npos);
}

// ---------------------------------------------------------------- the model

// Bytes the traffic counters book for one all-reduce of `count` elements.
std::uint64_t all_reduce_bytes(std::uint64_t count, std::uint64_t element) {
  const auto g = static_cast<std::uint64_t>(group_size());
  const auto r = static_cast<std::uint64_t>(group_rank());
  if (g <= 1) return 0;
  const std::uint64_t chunk = count / g + (r < count % g ? 1 : 0);
  return ((count - chunk) + (g - 1) * chunk) * element;
}

// The tensor-axis traffic of a step is exactly Megatron's: forward one
// all-reduce of T*h for the embedding and per row-parallel layer, T and 2T
// for the loss statistics; backward one T*h for the head and per
// column-parallel layer, plus the recomputed forward with checkpointing.
// Activations travel as T, the loss statistics as acc_t<T> (fp32 for bf16).
template <class T>
void traffic_is_megatrons() {
  LineEnv& e = line_env();
  const reference::GptConfig config = test_config();
  const index_t batch = 3, seq = 5, nt = batch * seq, h = config.n_embd;
  const std::uint64_t L = static_cast<std::uint64_t>(config.n_layer), el = sizeof(T),
                      stat = sizeof(acc_t<T>);
  std::mt19937_64 gen(fresh_seed());
  const auto tokens = random_ids(nt, config.vocab_size, gen);
  const auto targets = random_ids(nt, config.vocab_size, gen);
  for (bool checkpoint : {true, false}) {
    Megatron1DContext<T> model_scheme(e.grid, e.backend);
    Gpt<T> model(model_scheme, config, batch, seq,
                 {.recompute = checkpoint ? Recompute::full : Recompute::none});
    model.init(2);
    const auto big = all_reduce_bytes(static_cast<std::uint64_t>(nt * h), el);
    e.grid.reset_traffic();
    model.forward(tokens, targets);
    const TrafficCounter fwd = e.grid.traffic()[CommAxis::tensor];
    // The vocabulary-parallel ops (embedding, loss statistics, the head's
    // dX) make no collective in a group of one; the linears' count anyway.
    const std::uint64_t vocab_calls = e.grid.tensor().size() > 1 ? 1 : 0;
    EXPECT_EQ(fwd.calls, vocab_calls + 2 * L + 2 * vocab_calls);
    const std::uint64_t fwd_bytes = (1 + 2 * L) * big +
                                    all_reduce_bytes(static_cast<std::uint64_t>(nt), stat) +
                                    all_reduce_bytes(static_cast<std::uint64_t>(2 * nt), stat);
    EXPECT_EQ(fwd.bytes_sent, fwd_bytes);
    EXPECT_EQ(fwd.bytes_received, fwd_bytes);
    e.grid.reset_traffic();
    model.backward();
    const TrafficCounter bwd = e.grid.traffic()[CommAxis::tensor];
    const std::uint64_t n_bwd = 1 + 2 * L + (checkpoint ? 2 * L : 0);
    EXPECT_EQ(bwd.calls, n_bwd - 1 + vocab_calls) << "checkpoint " << checkpoint;
    EXPECT_EQ(bwd.bytes_sent, n_bwd * big) << "checkpoint " << checkpoint;
    EXPECT_EQ(bwd.bytes_received, n_bwd * big) << "checkpoint " << checkpoint;
    // nothing on any other axis
    EXPECT_EQ(e.grid.traffic().total().calls, bwd.calls);
  }
}
TEST(Gpt1D, TrafficIsMegatrons) {
  traffic_is_megatrons<float>();
}
TEST(Gpt1D, TrafficIsMegatronsBf16) {
  traffic_is_megatrons<bf16>();
}

// Each invalid configuration throws the same summa::Error on every rank.
void expect_config_error(const reference::GptConfig& c, index_t batch, index_t seq,
                         const std::string& needle) {
  LineEnv& e = line_env();
  const std::string msg = agreed_error_of([&] {
    Megatron1DContext<float> model_scheme(e.grid, e.backend);
    Gpt<float> model(model_scheme, c, batch, seq);
  });
  EXPECT_NE(msg.find(needle), std::string::npos) << "'" << msg << "' lacks '" << needle << "'";
}

// The 1D rules (what every scheme checks: test_scheme_layers.cpp).
TEST(Gpt1D, InvalidConfigurationsThrowEverywhere) {
  LineEnv& e = line_env();
  const int p = group_size();
  const reference::GptConfig good = test_config();
  // any batch works: no batch divisibility in 1D
  EXPECT_EQ(agreed_error_of([&] {
              Megatron1DContext<float> m_scheme(e.grid, e.backend);
              Gpt<float> m(m_scheme, good, p + 1, 3);
            }),
            "");
  if (p > 1) {
    auto c = good;
    c.n_head = 1;
    c.n_embd = 8 * p + 1;  // a valid GPT-2 shape, not divisible by p
    expect_config_error(c, 1, 4, "n_embd (hidden)");
    c = good;
    c.vocab_size = good.vocab_size + 1;
    expect_config_error(c, 1, 4, "vocab_size");
    // a grid with a data axis: every rank its own tensor group of one
    ProcessGrid data_grid = ProcessGrid::linear1d(MPI_COMM_WORLD, 1, p, test_grid_options());
    const std::string msg = agreed_error_of([&] {
      Megatron1DContext<float> m_scheme(data_grid, e.backend);
      Gpt<float> m(m_scheme, good, 1, 3);
    });
    EXPECT_NE(msg.find("data-parallel"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace summa::test

// Hugging Face GPT-2 export / import (CTest hf_gpt2_np1/np4/np8 and hf_torch):
//  - export from every scheme of test_util.hpp's representative_schemes
//    (every family and data factor of the rank count) and import into the
//    next one: every local element (owners and replicas) equals the exported
//    global tensor bit for bit, and the loss on a random batch equals the
//    loss of the same scheme given the same weights directly (bit for bit)
//    and the source scheme's (model tolerance, test_util.hpp);
//  - the exported file equals reference::Gpt<T>(config, seed)'s parameters
//    bit for bit (F64 / F32), BF16 export rounds to nearest even;
//  - config mismatches, missing / mis-shaped / unexpected tensors throw the
//    same summa::Error on every rank and leave the model unchanged; the
//    "transformer." prefix, a tied lm_head.weight and attn.bias buffers are
//    accepted;
//  - HfTorch (CTest hf_torch): scripts/hf_check.py rebuilds GPT-2 in plain
//    PyTorch (float64) from the exported directory and prints its loss, which
//    must equal summa's to 1e-9 relative, and writes every position's logits,
//    which must equal summa's (assembled from the vocabulary-parallel
//    blocks) within 1e-9 of their scale; skipped without torch.
//
// Backend: test_backend() with test_grid_options() (SUMMA_TEST_BACKEND=cpu|
// cuda): the parameters live in its memory, so the test writes and reads
// local shards through upload / download, and export / import stage through
// the host. The same exactness applies on both (bytes are copied).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "summa/io/hf_gpt2.hpp"
#include "summa/io/safetensors.hpp"
#include "summa/parallel/scheme.hpp"
#include "test_util.hpp"

namespace summa::test {
namespace {

namespace fs = std::filesystem;

int world_size() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}
int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

std::string broadcast_string(std::string text) {
  int length = static_cast<int>(text.size());
  MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD);
  text.resize(static_cast<std::size_t>(length));
  MPI_Bcast(text.data(), length, MPI_CHAR, 0, MPI_COMM_WORLD);
  return text;
}

/// A directory every rank sees (one machine): made by rank 0, removed at the end.
class SharedTempDir {
 public:
  SharedTempDir() {
    std::string name;
    if (world_rank() == 0) {
      name = (fs::temp_directory_path() /
              ("summa_hf_" + std::to_string(mix(std::random_device{}() ^ fresh_seed()))))
                 .string();
      fs::create_directories(name);
    } else {
      fresh_seed();  // collective
    }
    path_ = broadcast_string(name);
    MPI_Barrier(MPI_COMM_WORLD);
  }
  ~SharedTempDir() {
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) {
      std::error_code ignored;
      fs::remove_all(path_, ignored);
    }
  }
  fs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
};

reference::GptConfig test_config() {
  reference::GptConfig c;
  c.n_layer = 2;
  c.n_head = 8;  // divisible by every p, q, X, Y, Z up to 8 ranks
  c.n_embd = 64;
  c.n_positions = 8;
  c.vocab_size = 64;
  return c;
}
constexpr index_t batch = 16,
                  seq = 4;  // batch: a multiple of every batch_granularity at <= 8 ranks

/// Every local element (owners and replicas) gets 0.1 · z(seed, name, global
/// index), plus 1 for LayerNorm weights: random everywhere (biases and
/// LayerNorm parameters included), the same global tensors under any layout.
template <class T>
void randomize(GptModel<T>& model, std::uint64_t seed) {
  Backend& backend = model.parameters_store().backend();
  for (Param<T>* p : model.parameters_store().params()) {
    if (!p->held()) continue;
    const ParamShard& s = p->shard;
    const bool ln_weight = s.name.find("ln_") != std::string::npos && s.name.ends_with(".weight");
    const double offset = ln_weight ? 1.0 : 0.0;
    std::vector<T> local(static_cast<std::size_t>(s.local_size()));
    backend.download(local.data(), p->value, local.size() * sizeof(T));
    for (const ShardPiece& piece : s.pieces)
      for (index_t r = 0; r < piece.rows; ++r)
        for (index_t c = 0; c < piece.cols; ++c) {
          const auto index = static_cast<std::uint64_t>((piece.global_row + r) * s.global_cols() +
                                                        piece.global_col + c);
          local[static_cast<std::size_t>((piece.local_row + r) * s.local_cols + piece.local_col +
                                         c)] =
              static_cast<T>(0.1 * reference::init_normal(seed, s.name, index) + offset);
        }
    backend.upload(p->value, local.data(), local.size() * sizeof(T));
  }
}

/// Number of local elements (every piece, owners and replicas) that differ
/// from the given global tensors; 0 when every rank holds exactly them.
template <class T>
long long local_mismatches(GptModel<T>& model, const std::map<std::string, std::vector<T>>& want) {
  long long bad = 0;
  Backend& backend = model.parameters_store().backend();
  for (const Param<T>* p : model.parameters_store().params()) {
    const ParamShard& s = p->shard;
    const std::vector<T>& g = want.at(s.name);
    std::vector<T> local(static_cast<std::size_t>(s.local_size()));
    if (!local.empty()) backend.download(local.data(), p->value, local.size() * sizeof(T));
    for (const ShardPiece& piece : s.pieces)
      for (index_t r = 0; r < piece.rows; ++r)
        for (index_t c = 0; c < piece.cols; ++c)
          if (local[static_cast<std::size_t>((piece.local_row + r) * s.local_cols +
                                             piece.local_col + c)] !=
              g[static_cast<std::size_t>((piece.global_row + r) * s.global_cols() +
                                         piece.global_col + c)])
            ++bad;
  }
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  return bad;
}

template <class T>
std::map<std::string, std::vector<T>> gather_all(ParallelGpt<T>& run) {
  std::map<std::string, std::vector<T>> out;
  for (const Param<T>* p : run.model().parameters_store().params())
    out[p->shard.name] = gather_global(*p, run.grid());
  return out;
}

struct RandomBatch {
  std::vector<std::int32_t> tokens, targets;
};
RandomBatch random_batch(std::uint64_t seed, int vocab, index_t b, index_t s) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int> dist(0, vocab - 1);
  RandomBatch out;
  out.tokens.resize(static_cast<std::size_t>(b * s));
  out.targets.resize(out.tokens.size());
  for (auto& t : out.tokens) t = dist(gen);
  for (auto& t : out.targets) t = dist(gen);
  return out;
}

// ------------------------------------------------------------------ scheme to scheme

template <class T>
void export_import_across_schemes(io::DTypeOut dtype) {
  const reference::GptConfig config = test_config();
  const std::vector<SchemeSpec> schemes = representative_schemes(world_size());
  ASSERT_FALSE(schemes.empty());
  Backend& backend = test_backend();
  SharedTempDir tmp;
  for (std::size_t i = 0; i < schemes.size(); ++i) {
    const SchemeSpec& src = schemes[i];
    const SchemeSpec& dst = schemes[(i + 1) % schemes.size()];
    SCOPED_TRACE(src.str() + " -> " + dst.str());
    const std::uint64_t seed = fresh_seed();
    SCOPED_TRACE(seed_note(seed));
    const RandomBatch data = random_batch(seed + 1, config.vocab_size, batch, seq);
    const fs::path dir = tmp / ("pair" + std::to_string(i));

    ParallelGpt<T> a(MPI_COMM_WORLD, src, backend, config, batch, seq, GptOptions{},
                     test_grid_options());
    randomize(a.model(), seed);
    io::export_hf_gpt2(a.model(), dir, dtype);
    const auto want = gather_all(a);
    const double loss_a = a.model().forward(data.tokens, data.targets);

    ParallelGpt<T> b(MPI_COMM_WORLD, dst, backend, config, batch, seq, GptOptions{},
                     test_grid_options());
    b.model().init(seed + 2);  // different weights before the import
    ASSERT_GT(local_mismatches(b.model(), want), 0);
    io::import_hf_gpt2(b.model(), dir);
    EXPECT_EQ(local_mismatches(b.model(), want), 0);
    for (const Param<T>* p : b.model().parameters_store().params()) {
      const auto got = gather_global(*p, b.grid());
      EXPECT_TRUE(got == want.at(p->shard.name)) << p->shard.name;
    }
    const double loss_b = b.model().forward(data.tokens, data.targets);

    ParallelGpt<T> c(MPI_COMM_WORLD, dst, backend, config, batch, seq, GptOptions{},
                     test_grid_options());
    randomize(c.model(), seed);
    const double loss_c = c.model().forward(data.tokens, data.targets);
    EXPECT_EQ(loss_b, loss_c) << "same scheme, same weights: the same loss bit for bit";
    EXPECT_NEAR(loss_b, loss_a, model_tolerance<T>() * std::abs(loss_a));
  }
}

TEST(HfGpt2, ExportImportAcrossSchemesDouble) {
  export_import_across_schemes<double>(io::DTypeOut::f64);
}
TEST(HfGpt2, ExportImportAcrossSchemesFloat) {
  export_import_across_schemes<float>(io::DTypeOut::f32);
}

// ------------------------------------------------------------------ the file itself

template <class T>
void export_matches_reference(io::DTypeOut dtype, io::TensorDType stored) {
  const reference::GptConfig config = test_config();
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  Backend& backend = test_backend();
  SharedTempDir tmp;
  const SchemeSpec spec = schemes_for(world_size()).back();
  SCOPED_TRACE(spec.str());
  ParallelGpt<T> run(MPI_COMM_WORLD, spec, backend, config, batch, seq, GptOptions{},
                     test_grid_options());
  run.model().init(seed);
  io::export_hf_gpt2(run.model(), tmp / "ref", dtype);
  if (world_rank() == 0) {
    const reference::Gpt<T> ref(config, seed);
    io::SafetensorsFile file(tmp / "ref" / "model.safetensors");
    EXPECT_EQ(file.metadata().at("format"), "pt");
    const auto list = reference::parameter_list(config);
    ASSERT_EQ(file.tensors().size(), list.size()) << "exactly the parameters; no lm_head";
    for (const reference::ParamInfo& info : list) {
      SCOPED_TRACE(info.name);
      ASSERT_TRUE(file.contains(info.name));
      EXPECT_EQ(file.info(info.name).shape, info.shape);
      EXPECT_EQ(file.info(info.name).dtype, stored);
      const auto got = file.read<T>(info.name);
      const auto want = ref.param(info.name);
      if (stored == io::TensorDType::bf16) {
        for (std::size_t k = 0; k < got.size(); ++k)
          EXPECT_EQ(got[k], static_cast<T>(
                                io::bf16_to_float(io::float_to_bf16(static_cast<float>(want[k])))))
              << k;
      } else {
        EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin(), want.end()));
      }
    }
    const reference::GptConfig back = io::read_hf_gpt2_config(tmp / "ref");
    EXPECT_EQ(back.n_layer, config.n_layer);
    EXPECT_EQ(back.n_head, config.n_head);
    EXPECT_EQ(back.n_embd, config.n_embd);
    EXPECT_EQ(back.n_positions, config.n_positions);
    EXPECT_EQ(back.vocab_size, config.vocab_size);
    EXPECT_EQ(back.layer_norm_epsilon, config.layer_norm_epsilon);
  }
}

TEST(HfGpt2, ExportEqualsReferenceDoubleF64) {
  export_matches_reference<double>(io::DTypeOut::f64, io::TensorDType::f64);
}
TEST(HfGpt2, ExportEqualsReferenceFloatF32) {
  export_matches_reference<float>(io::DTypeOut::f32, io::TensorDType::f32);
}
TEST(HfGpt2, ExportBf16RoundsToNearestEven) {
  export_matches_reference<double>(io::DTypeOut::bf16, io::TensorDType::bf16);
}

// ------------------------------------------------------------------ errors and tolerated names

TEST(HfGpt2, ConfigMismatchThrowsOnEveryRank) {
  const reference::GptConfig config = test_config();
  Backend& backend = test_backend();
  SharedTempDir tmp;
  const SchemeSpec spec = schemes_for(world_size()).front();
  {
    ParallelGpt<double> run(MPI_COMM_WORLD, spec, backend, config, batch, seq, GptOptions{},
                            test_grid_options());
    run.model().init(fresh_seed());
    io::export_hf_gpt2(run.model(), tmp / "m");
  }
  struct Case {
    const char* field;
    reference::GptConfig config;
    std::string expect;
  };
  std::vector<Case> cases;
  auto c = config;
  c.n_layer = 3;
  cases.push_back({"n_layer", c, "n_layer=2 but the model has n_layer=3"});
  c = config;
  c.n_embd = 128;
  cases.push_back({"n_embd", c, "n_embd=64 but the model has n_embd=128"});
  c = config;
  c.vocab_size = 128;
  cases.push_back({"vocab_size", c, "vocab_size=64 but the model has vocab_size=128"});
  c = config;
  c.n_positions = 16;
  cases.push_back({"n_positions", c, "n_positions=8 but the model has n_positions=16"});
  c = config;
  c.n_head = 16;
  cases.push_back({"n_head", c, "n_head=8 but the model has n_head=16"});
  c = config;
  c.layer_norm_epsilon = 1e-6;
  cases.push_back({"epsilon", c, "layer_norm_epsilon"});
  for (const Case& k : cases) {
    SCOPED_TRACE(k.field);
    ParallelGpt<double> run(MPI_COMM_WORLD, spec, backend, k.config, batch, seq, GptOptions{},
                            test_grid_options());
    const std::string msg = error_of([&] { io::import_hf_gpt2(run.model(), tmp / "m"); });
    EXPECT_NE(msg.find(k.expect), std::string::npos) << msg;
    EXPECT_NE(msg.find((tmp / "m").string()), std::string::npos) << msg;
    EXPECT_TRUE(same_on_all_ranks(msg)) << msg;
  }
  ParallelGpt<double> run(MPI_COMM_WORLD, spec, backend, config, batch, seq, GptOptions{},
                          test_grid_options());
  std::string msg = error_of([&] { io::import_hf_gpt2(run.model(), tmp / "nowhere"); });
  EXPECT_NE(msg.find("no such file"), std::string::npos) << msg;
  EXPECT_TRUE(same_on_all_ranks(msg)) << msg;
  // A file where the directory should be: export fails everywhere.
  if (world_rank() == 0) std::ofstream(tmp / "plain_file") << "x";
  MPI_Barrier(MPI_COMM_WORLD);
  msg = error_of([&] { io::export_hf_gpt2(run.model(), tmp / "plain_file"); });
  EXPECT_NE(msg.find("cannot create the directory"), std::string::npos) << msg;
  EXPECT_TRUE(same_on_all_ranks(msg)) << msg;
  // Bad config.json contents.
  const auto config_error = [&](const std::string& json) {
    if (world_rank() == 0) std::ofstream(tmp / "m" / "config.json", std::ios::trunc) << json;
    MPI_Barrier(MPI_COMM_WORLD);
    const std::string m = error_of([&] { io::import_hf_gpt2(run.model(), tmp / "m"); });
    EXPECT_TRUE(same_on_all_ranks(m)) << m;
    return m;
  };
  const std::string good = io::hf_gpt2_config_json(config);
  EXPECT_NE(config_error("{").find("not valid JSON"), std::string::npos);
  EXPECT_NE(config_error("{\"model_type\": \"gpt2\"}").find("missing \"n_layer\""),
            std::string::npos);
  std::string bad = good;
  bad.replace(bad.find("\"n_layer\": 2"), 12, "\"n_layer\": 2.5");
  EXPECT_NE(config_error(bad).find("\"n_layer\" must be a positive integer"), std::string::npos);
  bad = good;
  bad.replace(bad.find("gelu_new"), 8, "relu");
  EXPECT_NE(config_error(bad).find("activation_function"), std::string::npos);
  bad = good;
  bad.replace(bad.find("\"gpt2\""), 6, "\"bert\"");
  EXPECT_NE(config_error(bad).find("model_type"), std::string::npos);
  bad = good;
  bad.replace(bad.find("\"tie_word_embeddings\": true"), 27, "\"tie_word_embeddings\": false");
  EXPECT_NE(config_error(bad).find("tie_word_embeddings"), std::string::npos);
  EXPECT_EQ(config_error(good), "");
}

TEST(HfGpt2, ToleratedNamesAndBadTensors) {
  const reference::GptConfig config = test_config();
  Backend& backend = test_backend();
  SharedTempDir tmp;
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  const std::vector<SchemeSpec> schemes = representative_schemes(world_size());
  const SchemeSpec spec = schemes[schemes.size() / 2];
  SCOPED_TRACE(spec.str());
  ParallelGpt<double> src(MPI_COMM_WORLD, spec, backend, config, batch, seq, GptOptions{},
                          test_grid_options());
  randomize(src.model(), seed);
  io::export_hf_gpt2(src.model(), tmp / "m", io::DTypeOut::f64);
  const auto want = gather_all(src);

  // Rewrites tmp/m/model.safetensors on rank 0 from the exported tensors,
  // edited by `edit`.
  std::map<std::string, std::vector<double>> tensors;
  std::map<std::string, std::vector<index_t>> shapes;
  for (const reference::ParamInfo& info : reference::parameter_list(config)) {
    tensors[info.name] = want.at(info.name);
    shapes[info.name] = info.shape;
  }
  const auto rewrite = [&](auto edit) {
    if (world_rank() == 0) {
      auto t = tensors;
      auto s = shapes;
      edit(t, s);
      std::vector<io::TensorEntry> entries;
      for (const auto& [name, values] : t)
        entries.push_back(
            {{name, s.at(name), io::TensorDType::f64}, std::span<const double>(values)});
      io::write_safetensors(tmp / "m" / "model.safetensors", entries);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  };
  using Tensors = std::map<std::string, std::vector<double>>;
  using Shapes = std::map<std::string, std::vector<index_t>>;

  ParallelGpt<double> dst(MPI_COMM_WORLD, schemes.front(), backend, config, batch, seq,
                          GptOptions{}, test_grid_options());
  // Hugging Face GPT2LMHeadModel names: "transformer." prefix, tied lm_head,
  // causal-mask buffers.
  rewrite([&](Tensors& t, Shapes& s) {
    Tensors renamed;
    Shapes reshaped;
    for (auto& [name, v] : t) {
      renamed["transformer." + name] = v;
      reshaped["transformer." + name] = s.at(name);
    }
    renamed["lm_head.weight"] = t.at("wte.weight");
    reshaped["lm_head.weight"] = s.at("wte.weight");
    renamed["transformer.h.0.attn.bias"] = std::vector<double>(64, 1.0);
    reshaped["transformer.h.0.attn.bias"] = {1, 1, 8, 8};
    renamed["h.1.attn.masked_bias"] = {-1e4};
    reshaped["h.1.attn.masked_bias"] = {};
    t = renamed;
    s = reshaped;
  });
  dst.model().init(seed + 1);
  io::import_hf_gpt2(dst.model(), tmp / "m");
  EXPECT_EQ(local_mismatches(dst.model(), want), 0);

  // Errors: each names the tensor, is the same on every rank and leaves the model as it was.
  dst.model().init(seed + 1);
  reference::Gpt<double> before_ref(config, seed + 1);
  std::map<std::string, std::vector<double>> before;
  for (const reference::ParamInfo& info : reference::parameter_list(config)) {
    const auto p = before_ref.param(info.name);
    before[info.name].assign(p.begin(), p.end());
  }
  const auto expect_error = [&](auto edit, const std::string& needle) {
    rewrite(edit);
    const std::string msg = error_of([&] { io::import_hf_gpt2(dst.model(), tmp / "m"); });
    EXPECT_NE(msg.find(needle), std::string::npos) << "message: '" << msg << "'";
    EXPECT_TRUE(same_on_all_ranks(msg)) << msg;
    EXPECT_EQ(local_mismatches(dst.model(), before), 0) << "the model changed: " << needle;
  };
  expect_error([](Tensors& t, Shapes&) { t.erase("h.1.mlp.c_fc.bias"); },
               "missing tensor 'h.1.mlp.c_fc.bias'");
  expect_error(
      [](Tensors&, Shapes& s) {
        s["h.0.attn.c_attn.weight"] = {192, 64};  // transposed: the nn.Linear layout
      },
      "tensor 'h.0.attn.c_attn.weight' has shape [192, 64], the model needs [64, 192]");
  expect_error(
      [](Tensors& t, Shapes& s) {
        t["h.2.ln_1.weight"] = std::vector<double>(64, 1.0);
        s["h.2.ln_1.weight"] = {64};
      },
      "unexpected tensor 'h.2.ln_1.weight'");
  expect_error(
      [](Tensors& t, Shapes& s) {
        t["transformer.wte.weight"] = t.at("wte.weight");
        s["transformer.wte.weight"] = s.at("wte.weight");
      },
      "holds both 'transformer.wte.weight' and 'wte.weight'");
  expect_error(
      [](Tensors& t, Shapes& s) {
        t["lm_head.weight"] = std::vector<double>(32 * 64, 0.5);
        s["lm_head.weight"] = {32, 64};
      },
      "untied output heads are not supported");
}

// ------------------------------------------------------------------ PyTorch

struct PythonRun {
  int status = 0;
  std::string output;
};
PythonRun run_command(const std::string& command) {
  PythonRun r;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return {-1, "popen failed"};
  char buf[4096];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) r.output.append(buf, n);
  r.status = pclose(pipe);
  return r;
}
std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

/// The value printed as `key=<value>` on its own line, or NaN.
double parse_printed(const std::string& output, const std::string& key) {
  std::size_t at = 0;
  while ((at = output.find(key + "=", at)) != std::string::npos) {
    if (at == 0 || output[at - 1] == '\n')
      return std::strtod(output.c_str() + at + key.size() + 1, nullptr);
    ++at;
  }
  return std::nan("");
}

TEST(HfTorch, LossMatchesPyTorch) {
  // Rank 0 decides whether PyTorch is there; everyone skips together.
  const char* python = std::getenv("SUMMA_PYTHON");
  const char* script = std::getenv("SUMMA_HF_CHECK");
  std::string skip;
  if (world_rank() == 0) {
    if (python == nullptr || script == nullptr || *python == '\0')
      skip = "SUMMA_PYTHON / SUMMA_HF_CHECK not set (CTest sets them for hf_torch)";
    else if (run_command(shell_quote(python) + " -c 'import torch, numpy'").status != 0)
      skip = std::string(python) + " cannot import torch and numpy: install python3-torch";
  }
  skip = broadcast_string(skip);
  if (!skip.empty()) GTEST_SKIP() << skip;

  reference::GptConfig config = test_config();
  config.vocab_size = 96;  // not a power of two
  const index_t b = 16, s = 8;
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  const RandomBatch data = random_batch(seed + 7, config.vocab_size, b, s);
  Backend& backend = test_backend();
  SharedTempDir tmp;
  const fs::path batch_file = tmp / "batch.bin";
  if (world_rank() == 0) {
    std::ofstream out(batch_file, std::ios::binary);
    for (const auto* v : {&data.tokens, &data.targets})
      for (std::int32_t id : *v) {
        const auto u = static_cast<std::uint32_t>(id);
        const char bytes[4] = {static_cast<char>(u & 0xFF), static_cast<char>((u >> 8) & 0xFF),
                               static_cast<char>((u >> 16) & 0xFF),
                               static_cast<char>((u >> 24) & 0xFF)};
        out.write(bytes, 4);
      }
  }
  const std::vector<SchemeSpec> schemes = representative_schemes(world_size());
  const SchemeSpec spec = schemes[schemes.size() / 2];

  // (export dtype, directory): F64 is exact; BF16 weights are re-imported
  // into summa so both sides compute with the same rounded values.
  const std::pair<io::DTypeOut, const char*> exports[] = {{io::DTypeOut::f64, "f64"},
                                                          {io::DTypeOut::bf16, "bf16"}};
  for (const auto& [dtype, label] : exports) {
    SCOPED_TRACE(std::string(label) + " on " + spec.str());
    const fs::path dir = tmp / label;
    ParallelGpt<double> run(MPI_COMM_WORLD, spec, backend, config, b, s, GptOptions{},
                            test_grid_options());
    randomize(run.model(), seed);
    io::export_hf_gpt2(run.model(), dir, dtype);
    io::import_hf_gpt2(run.model(), dir);  // no-op for f64; bf16-rounds the weights
    const double summa_loss = run.model().forward(data.tokens, data.targets);
    // every position's logits, assembled from the owners' blocks (each data
    // group's rows after the previous groups')
    const index_t V = config.vocab_size;
    std::vector<double> logits(static_cast<std::size_t>(b * s * V), 0.0);
    {
      const ActivationBlock block = run.model().logits_block();
      const ConstMatrixView<double> Z = run.model().logits();
      std::vector<double> local(static_cast<std::size_t>(Z.rows * Z.cols));
      backend.download(local.data(), Z.data, local.size() * sizeof(double));
      const index_t first = run.grid().coords().data * run.model().local_batch() * s;
      if (block.owner)
        for (index_t r = 0; r < block.rows; ++r)
          for (index_t c = 0; c < block.cols; ++c)
            logits[static_cast<std::size_t>((first + block.row0 + r) * V + block.col0 + c)] =
                local[static_cast<std::size_t>(r * Z.cols + c)];
      MPI_Allreduce(MPI_IN_PLACE, logits.data(), static_cast<int>(logits.size()), MPI_DOUBLE,
                    MPI_SUM, MPI_COMM_WORLD);
    }
    const fs::path logits_file = tmp / (std::string(label) + "_logits.bin");
    double torch_loss = 0, transformers_loss = 0, worst_logit = -1;
    std::string output;
    if (world_rank() == 0) {
      const std::string command =
          shell_quote(python) + " " + shell_quote(script) + " " + shell_quote(dir.string()) + " " +
          shell_quote(batch_file.string()) + " " + std::to_string(b) + " " + std::to_string(s) +
          " --logits " + shell_quote(logits_file.string());
      const PythonRun r = run_command(command);
      output = r.output;
      torch_loss = r.status == 0 ? parse_printed(r.output, "loss") : std::nan("");
      transformers_loss = parse_printed(r.output, "loss_transformers");
      std::printf("%s", r.output.c_str());
      std::ifstream in(logits_file, std::ios::binary);
      std::vector<double> torch_logits(logits.size(), std::nan(""));
      in.read(reinterpret_cast<char*>(torch_logits.data()),
              static_cast<std::streamsize>(torch_logits.size() * sizeof(double)));
      double scale = 0;
      worst_logit = in ? 0.0 : std::nan("");
      for (std::size_t k = 0; k < logits.size(); ++k) {
        worst_logit = std::max(worst_logit, std::abs(logits[k] - torch_logits[k]));
        scale = std::max(scale, std::abs(torch_logits[k]));
      }
      worst_logit /= std::max(1.0, scale);
      std::printf("[%s] logits: largest difference %.3g of their scale %.3g\n", label, worst_logit,
                  scale);
      std::printf("[%s] summa loss=%.17g  PyTorch loss=%.17g  relative difference %.3g%s\n", label,
                  summa_loss, torch_loss, std::abs(summa_loss - torch_loss) / std::abs(torch_loss),
                  std::isnan(transformers_loss)
                      ? "  (transformers not installed)"
                      : ("  transformers loss=" + std::to_string(transformers_loss)).c_str());
    }
    MPI_Bcast(&torch_loss, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    MPI_Bcast(&transformers_loss, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    MPI_Bcast(&worst_logit, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    // every logit (what generation picks from), within 1e-9 of their scale
    EXPECT_TRUE(worst_logit >= 0 && worst_logit <= 1e-9) << worst_logit << "\n" << output;
    EXPECT_TRUE(std::isfinite(torch_loss)) << output;
    EXPECT_NEAR(torch_loss, summa_loss, 1e-9 * std::abs(summa_loss)) << output;
    if (!std::isnan(transformers_loss)) {
      EXPECT_NEAR(transformers_loss, summa_loss, 1e-9 * std::abs(summa_loss)) << output;
    }
    testing::Test::RecordProperty(std::string("summa_loss_") + label, std::to_string(summa_loss));
  }
}

}  // namespace
}  // namespace summa::test

// Sharded checkpoints (summa/io/checkpoint.hpp), at 1, 2, 4 and 8 ranks.
//
// Oracle: every parameter element is the layout-invariant GPT-2 initial value
// reference::init_value(seed, name, global index) and every optimizer-slot
// element a pure function of (seed, slot, name, global index), so what a rank
// must hold after loading is known from its own pieces whatever scheme saved
// the checkpoint. A checkpoint is saved under every scheme fitting the world
// size (schemes_for) with its own fresh seed and loaded under every scheme;
// values (owners and replicas, and gather_global of every tensor) and slots
// must then equal the oracle exactly (bit for bit: the bytes are copied, and a
// type conversion is the one static_cast applied to the saved element). Then
// steps and `latest`, leftovers of a crashed save, element-type conversion, and
// every error (truncated, corrupted or missing files, other model, other
// slots, bad arguments), each of which must throw on every rank with the
// expected words while the previous checkpoint still loads.
//
// Backend: test_backend() with test_grid_options() (SUMMA_TEST_BACKEND=cpu|
// cuda). The values and the slot buffers live in its memory (device memory
// on CUDA, where save/load stage through host copies); the test fills and
// checks them through host mirrors (upload / download), so the oracle and
// its exactness are the same on both backends.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "summa/io/checkpoint.hpp"
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
void barrier() {
  MPI_Barrier(MPI_COMM_WORLD);
}

// Concatenation (GCC 12 warns falsely about `"literal" + std::string`).
std::string cat(std::initializer_list<std::string_view> parts) {
  std::string out;
  for (std::string_view p : parts) out.append(p);
  return out;
}

// Divisible as every scheme up to 8 ranks needs: heads by p and Gx (8), hidden
// by q, Gy and Gz, vocab by Gx*Gz (8), batch by data*q and Gz.
reference::GptConfig small_config(int n_embd = 16, int n_layer = 2) {
  reference::GptConfig c;
  c.n_layer = n_layer;
  c.n_head = 8;
  c.n_embd = n_embd;
  c.n_positions = 4;
  c.vocab_size = 24;
  return c;
}
constexpr index_t kBatch = 8, kSeq = 2;

// Value of slot `k` at flat global index `g` of tensor `name`: in [-1, 1).
double slot_value(std::uint64_t seed, int k, const std::string& name, index_t g) {
  const std::uint64_t h = mix(mix(seed ^ hash_string(name)) +
                              static_cast<std::uint64_t>(k + 1) * 0x632BE59BD9B4E019ULL +
                              static_cast<std::uint64_t>(g));
  return static_cast<double>(h >> 11) * 0x1p-52 - 1.0;
}

// A unique directory under the system temp dir, agreed on rank 0; removed at
// the end of the test.
class TempRoot {
 public:
  TempRoot() {
    const std::uint64_t salt = fresh_seed();  // collective
    std::string name;
    if (world_rank() == 0) {
      name = (fs::temp_directory_path() /
              cat({"summa_ckpt_", std::to_string(::getpid()), "_", std::to_string(salt % 1000003)}))
                 .string();
      fs::remove_all(name);
    }
    int length = static_cast<int>(name.size());
    MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD);
    name.resize(static_cast<std::size_t>(length));
    MPI_Bcast(name.data(), length, MPI_CHAR, 0, MPI_COMM_WORLD);
    path_ = name;
  }
  ~TempRoot() {
    barrier();
    if (world_rank() == 0) {
      std::error_code ec;
      fs::remove_all(path_, ec);
    }
    barrier();
  }
  TempRoot(const TempRoot&) = delete;
  TempRoot& operator=(const TempRoot&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// A model under a scheme (on `backend`, with test_grid_options()) with two
// optimizer slots of element type S in the backend's memory, packed like the
// store's values. exp_avg / exp_avg_sq are their host mirrors: push()
// uploads them, pull() downloads the slots (and the values) into them.
template <class T, class S = T>
struct Model {
  ParallelGpt<T> gpt;
  std::vector<S> exp_avg, exp_avg_sq;
  DeviceArray<S> device_exp_avg, device_exp_avg_sq;
  std::vector<T> values;  // host copy of the store's values (pull())
  std::vector<StateSlot> slots;

  Model(const SchemeSpec& spec, Backend& backend, const reference::GptConfig& config)
      : gpt(MPI_COMM_WORLD, spec, backend, config, kBatch, kSeq, GptOptions{},
            test_grid_options()) {
    const auto n = static_cast<std::size_t>(store().local_elements());
    exp_avg.assign(n, std::numeric_limits<S>::quiet_NaN());
    exp_avg_sq.assign(n, std::numeric_limits<S>::quiet_NaN());
    device_exp_avg = DeviceArray<S>(n, backend);
    device_exp_avg_sq = DeviceArray<S>(n, backend);
    push();
    slots = {{"exp_avg", dtype_v<S>, device_exp_avg.data()},
             {"exp_avg_sq", dtype_v<S>, device_exp_avg_sq.data()}};
  }
  ParameterStore<T>& store() { return gpt.model().parameters_store(); }
  ProcessGrid& grid() { return gpt.grid(); }
  S* slot(int k) { return k == 0 ? exp_avg.data() : exp_avg_sq.data(); }
  void push() {
    if (exp_avg.empty()) return;  // a rank holding nothing
    device_exp_avg.upload(exp_avg);
    device_exp_avg_sq.upload(exp_avg_sq);
  }
  void pull() {
    values.resize(static_cast<std::size_t>(store().local_elements()));
    if (values.empty()) return;
    exp_avg = device_exp_avg.download();
    exp_avg_sq = device_exp_avg_sq.download();
    store().backend().download(values.data(), store().values_base(), values.size() * sizeof(T));
  }

  // Calls f(param, local flat index, global flat index) for every element of
  // every local piece (owners and replicas).
  template <class F>
  void each_element(F&& f) {
    for (Param<T>* p : store().params()) {
      if (!p->held()) continue;
      const ParamShard& s = p->shard;
      for (const ShardPiece& piece : s.pieces)
        for (index_t r = 0; r < piece.rows; ++r)
          for (index_t c = 0; c < piece.cols; ++c)
            f(*p, (piece.local_row + r) * s.local_cols + piece.local_col + c,
              (piece.global_row + r) * s.global_cols() + piece.global_col + c);
    }
  }
  std::size_t offset(const Param<T>& p) {
    return static_cast<std::size_t>(p.value - store().values_base());
  }

  // The state a checkpoint of `seed` holds: weights of reference GPT `seed`,
  // slots slot_value(seed, ...).
  void fill(std::uint64_t seed) {
    gpt.model().init(seed);
    each_element([&](Param<T>& p, index_t local, index_t g) {
      for (int k = 0; k < 2; ++k)
        slot(k)[offset(p) + static_cast<std::size_t>(local)] =
            static_cast<S>(slot_value(seed, k, p.shard.name, g));
    });
    push();
  }
  // Something else, so that a load that misses an element is seen.
  void scramble(std::uint64_t seed) {
    gpt.model().init(mix(seed));
    std::fill(exp_avg.begin(), exp_avg.end(), std::numeric_limits<S>::quiet_NaN());
    std::fill(exp_avg_sq.begin(), exp_avg_sq.end(), std::numeric_limits<S>::quiet_NaN());
    push();
  }

  // Elements (local values and slots of every piece, then, with `gather`,
  // every tensor assembled by gather_global) differing from what a
  // checkpoint of `seed` saved with value type TS and slot type SS gives
  // after conversion; the maximum over ranks. Collective.
  template <class TS, class SS>
  long long mismatches(std::uint64_t seed, bool gather = true) {
    const reference::GptConfig& config = gpt.model().config();
    const auto want_value = [&](const std::string& name, index_t g) {
      return static_cast<T>(static_cast<TS>(reference::init_value(seed, name, g, config)));
    };
    long long bad = 0;
    pull();
    each_element([&](Param<T>& p, index_t local, index_t g) {
      if (!(values[offset(p) + static_cast<std::size_t>(local)] == want_value(p.shard.name, g)))
        ++bad;
      for (int k = 0; k < 2; ++k)
        if (!(slot(k)[offset(p) + static_cast<std::size_t>(local)] ==
              static_cast<S>(static_cast<SS>(slot_value(seed, k, p.shard.name, g)))))
          ++bad;
    });
    for (Param<T>* p : store().params()) {
      if (!gather) break;
      const std::vector<T> global = gather_global(*p, grid());
      for (std::size_t g = 0; g < global.size(); ++g)
        if (!(global[g] == want_value(p->shard.name, static_cast<index_t>(g)))) ++bad;
    }
    return static_cast<long long>(max_over_ranks(static_cast<double>(bad)));
  }
};

CheckpointInfo make_info(std::int64_t step, const std::string& scheme) {
  CheckpointInfo info;
  info.step = step;
  info.meta["scheme"] = scheme;
  info.meta["gpt"] = "n_layer=2 n_head=8 n_embd=16";
  info.meta["odd text"] = "spaces, 100% escapes\nnew line\ttab \xc3\xa9 end ";
  info.meta["empty"] = "";
  info.meta[""] = "empty key";
  return info;
}

std::string step_name(int step) {
  std::string digits = std::to_string(step);
  return cat({"step_", std::string(8 - digits.size(), '0'), digits});
}

// f() must throw summa::Error on every rank, with the same message containing
// every word of `words`.
template <class F>
void expect_error_everywhere(F&& f, const std::vector<std::string>& words,
                             const std::string& what) {
  SCOPED_TRACE(what);
  std::string message;
  int threw = 0;
  try {
    f();
  } catch (const Error& e) {
    threw = 1;
    message = e.what();
  }
  int all = threw;
  MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  EXPECT_EQ(all, 1) << "not every rank threw";
  for (const std::string& w : words)
    EXPECT_NE(message.find(w), std::string::npos) << "'" << w << "' not in: " << message;
  EXPECT_TRUE(same_on_all_ranks(message)) << message;
}

// Rank 0 changes a file; the others wait.
template <class F>
void on_rank0(F&& f) {
  if (world_rank() == 0) f();
  barrier();
}

void flip_byte(const fs::path& file, std::uintmax_t at) {
  std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  io.read(&c, 1);
  c = static_cast<char>(c ^ 0x20);
  io.seekp(static_cast<std::streamoff>(at));
  io.write(&c, 1);
}

fs::path last_shard(const fs::path& dir) {
  fs::path last;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("shard_", 0) == 0 && e.path() > last) last = e.path();
  return last;
}

TEST(Checksum64, MatchesXxh64ReferenceVectors) {
  EXPECT_EQ(checksum64("", 0), 0xEF46DB3751D8E999ULL);
  EXPECT_EQ(checksum64("a", 1), 0xD24EC4F1A98C6E5BULL);
  EXPECT_EQ(checksum64("abc", 3), 0x44BC2CF5AD770999ULL);
  const std::string nobody = "Nobody inspects the spammish repetition";  // 39 bytes: stripes
  EXPECT_EQ(checksum64(nobody.data(), nobody.size()), 0xFBCEA83C8A378BF1ULL);
  // xxHash's own sanity buffer (101 bytes), seeds 0 and 2654435761
  unsigned char sanity[101];
  std::uint32_t gen = 2654435761U;
  for (unsigned char& b : sanity) {
    b = static_cast<unsigned char>(gen >> 24);
    gen *= gen;
  }
  EXPECT_EQ(checksum64(sanity, 1), 0x4FCE394CC88952D8ULL);
  EXPECT_EQ(checksum64(sanity, 14), 0xCFFA8DB881BC3A3DULL);
  EXPECT_EQ(checksum64(sanity, 101), 0x0EAB543384F878ADULL);
  EXPECT_EQ(checksum64(sanity, 101, 2654435761U), 0xCAA65939306F1E21ULL);
  EXPECT_EQ(checksum64(sanity, 14, 2654435761U), 0x5B9611585EFCC9CBULL);

  // streamed in random pieces == one shot, on fresh random data
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen64(seed);
  std::vector<unsigned char> data(1000 + gen64() % 3000);
  for (auto& b : data) b = static_cast<unsigned char>(gen64());
  for (int trial = 0; trial < 20; ++trial) {
    Checksum64 sum(trial);
    std::size_t at = 0;
    while (at < data.size()) {
      const std::size_t n = std::min<std::size_t>(gen64() % 70, data.size() - at);
      sum.update(data.data() + at, n);
      at += n;
    }
    EXPECT_EQ(sum.digest(),
              checksum64(data.data(), data.size(), static_cast<std::uint64_t>(trial)));
  }
  // one flipped bit changes it
  const std::uint64_t before = checksum64(data.data(), data.size());
  data[gen64() % data.size()] ^= 0x04;
  EXPECT_NE(checksum64(data.data(), data.size()), before);
}

// Save under every scheme of this world size, load under every scheme. Every
// load checks every local element (owners and replicas) of values and slots;
// the gathered tensors (gather_global, two all-gathers per tensor) are checked
// for every pair up to 4 ranks (15 schemes) and, to keep 8 ranks (26 schemes,
// 676 pairs) in seconds, for every fifth pair there (each checkpoint under 5
// or 6 loading schemes).
TEST(Checkpoint, ReshardsBetweenEveryPairOfSchemes) {
  TempRoot tmp;
  Backend& backend = test_backend();
  const auto config = small_config();
  const std::vector<SchemeSpec> schemes = schemes_for(world_size());
  std::vector<std::uint64_t> seeds;
  for (std::size_t i = 0; i < schemes.size(); ++i) {
    seeds.push_back(fresh_seed());
    SCOPED_TRACE(cat({"save under ", schemes[i].str(), ", ", seed_note(seeds[i])}));
    Model<double> run(schemes[i], backend, config);
    run.fill(seeds[i]);
    const fs::path root = tmp.path() / cat({"s", std::to_string(i)});
    save_checkpoint(root, run.store(), run.slots,
                    make_info(static_cast<std::int64_t>(10 + i), schemes[i].str()), run.grid());
    // saving does not change the state; one shard per rank of a tensor group
    EXPECT_EQ((run.mismatches<double, double>(seeds[i])), 0);
    if (world_rank() == 0) {
      int shards = 0;
      for (const auto& e : fs::directory_iterator(root / step_name(static_cast<int>(10 + i))))
        shards += e.path().filename().string().rfind("shard_", 0) == 0 ? 1 : 0;
      EXPECT_EQ(shards, schemes[i].tensor_ranks());
      EXPECT_NO_THROW(verify_checkpoint(root));
    }
  }
  const std::size_t gather_stride = schemes.size() <= 15 ? 1 : 5;
  for (std::size_t j = 0; j < schemes.size(); ++j) {
    const SchemeSpec& spec = schemes[j];
    Model<double> run(spec, backend, config);
    for (std::size_t i = 0; i < schemes.size(); ++i) {
      SCOPED_TRACE(cat({"saved under ", schemes[i].str(), ", loaded under ", spec.str(), ", ",
                        seed_note(seeds[i])}));
      run.scramble(seeds[i]);
      const CheckpointInfo info = load_checkpoint(tmp.path() / cat({"s", std::to_string(i)}),
                                                  run.store(), run.slots, run.grid());
      EXPECT_EQ(info, make_info(static_cast<std::int64_t>(10 + i), schemes[i].str()));
      EXPECT_EQ((run.mismatches<double, double>(seeds[i], (i + j) % gather_stride == 0)), 0);
    }
  }
}

// float <-> double: each element is the one static_cast of the saved element.
TEST(Checkpoint, ConvertsElementTypes) {
  TempRoot tmp;
  Backend& backend = test_backend();
  const auto config = small_config();
  const std::vector<SchemeSpec> schemes = schemes_for(world_size());
  const SchemeSpec& a = schemes.front();
  const SchemeSpec& b = schemes.back();
  const std::uint64_t s1 = fresh_seed(), s2 = fresh_seed(), s3 = fresh_seed();
  SCOPED_TRACE(seed_note(s1));
  {
    Model<float> run(a, backend, config);
    run.fill(s1);
    save_checkpoint(tmp.path() / "f", run.store(), run.slots, make_info(1, a.str()), run.grid());
  }
  {
    Model<double> run(b, backend, config);
    run.fill(s2);
    save_checkpoint(tmp.path() / "d", run.store(), run.slots, make_info(2, b.str()), run.grid());
  }
  {
    Model<double, float> run(a, backend, config);  // double weights, float slots
    run.fill(s3);
    save_checkpoint(tmp.path() / "df", run.store(), run.slots, make_info(3, a.str()), run.grid());
  }
  {
    Model<double> run(b, backend, config);
    load_checkpoint(tmp.path() / "f", run.store(), run.slots, run.grid());
    EXPECT_EQ((run.mismatches<float, float>(s1)), 0) << "float -> double";
    load_checkpoint(tmp.path() / "df", run.store(), run.slots, run.grid());
    EXPECT_EQ((run.mismatches<double, float>(s3)), 0) << "double, float slots -> double";
  }
  {
    Model<float> run(a, backend, config);
    load_checkpoint(tmp.path() / "d", run.store(), run.slots, run.grid());
    EXPECT_EQ((run.mismatches<double, double>(s2)), 0) << "double -> float";
    load_checkpoint(tmp.path() / "f", run.store(), run.slots, run.grid());
    EXPECT_EQ((run.mismatches<float, float>(s1)), 0) << "float -> float";
  }
}

// A checkpoint written by the code before its checksums and file writes moved
// to libraries (libxxhash, the atomic-file helper; tests/data/README.md): at
// 4 ranks under "2d:q=2", Model<float>::fill(kFixtureSeed) of
// small_config(8, 1), make_info(7, "2d:q=2"). It must verify and load under
// every scheme of this world size (values and slots bit-exact: the oracle
// regenerates them from the seed), and a copy with one flipped shard byte
// must be refused by its checksum.
constexpr std::uint64_t kFixtureSeed = 20240613;

TEST(Checkpoint, LoadsCheckpointWrittenBeforeTheLibraries) {
  const fs::path fixture = fs::path(SUMMA_SOURCE_DIR) / "tests" / "data" / "checkpoint_v1";
  Backend& backend = test_backend();
  const auto config = small_config(8, 1);
  if (world_rank() == 0) {
    CheckpointInfo info;
    EXPECT_NO_THROW(info = verify_checkpoint(fixture));
    EXPECT_EQ(info, make_info(7, "2d:q=2"));
  }
  for (const SchemeSpec& spec : schemes_for(world_size())) {
    SCOPED_TRACE(cat({"loaded under ", spec.str()}));
    Model<float> run(spec, backend, config);
    run.scramble(kFixtureSeed);
    EXPECT_EQ(load_checkpoint(fixture, run.store(), run.slots, run.grid()), make_info(7, "2d:q=2"));
    EXPECT_EQ((run.mismatches<float, float>(kFixtureSeed)), 0);
  }
  // a damaged copy is refused (the checksums are checked, not just read)
  TempRoot tmp;
  on_rank0([&] {
    fs::create_directories(tmp.path());
    fs::copy(fixture, tmp.path() / "copy", fs::copy_options::recursive);
    flip_byte(tmp.path() / "copy" / step_name(7) / "shard_00003.bin", 100);
  });
  Model<float> run(schemes_for(world_size()).front(), backend, config);
  expect_error_everywhere(
      [&] { load_checkpoint(tmp.path() / "copy", run.store(), run.slots, run.grid()); },
      {"shard_00003.bin", "corrupted"}, "a flipped byte in the fixture's last shard");
}

// Steps, `latest`, replacing a step, leftovers of a crashed save, failed saves.
TEST(Checkpoint, StepsLatestAndCrashLeftovers) {
  TempRoot tmp;
  Backend& backend = test_backend();
  const auto config = small_config();
  const std::vector<SchemeSpec> schemes = schemes_for(world_size());
  const SchemeSpec& a = schemes.front();
  const SchemeSpec& b = schemes[schemes.size() / 2];
  const fs::path root = tmp.path() / "run";
  const std::uint64_t s1 = fresh_seed(), s2 = fresh_seed(), s3 = fresh_seed(), s4 = fresh_seed();
  SCOPED_TRACE(seed_note(s1));
  EXPECT_FALSE(latest_checkpoint(root).has_value());

  Model<double> saver(a, backend, config);
  Model<double> loader(b, backend, config);
  saver.fill(s1);
  save_checkpoint(root, saver.store(), saver.slots, make_info(1, a.str()), saver.grid());
  saver.fill(s2);
  save_checkpoint(root, saver.store(), saver.slots, make_info(2, a.str()), saver.grid());
  EXPECT_EQ(latest_checkpoint(root), root / step_name(2));
  EXPECT_EQ(read_checkpoint_info(root).step, 2);
  EXPECT_EQ(read_checkpoint_info(root / step_name(1), MPI_COMM_WORLD), make_info(1, a.str()));

  loader.scramble(s1);
  EXPECT_EQ(load_checkpoint(root, loader.store(), loader.slots, loader.grid()).step, 2);
  EXPECT_EQ((loader.mismatches<double, double>(s2)), 0);
  EXPECT_EQ(load_checkpoint(root / step_name(1), loader.store(), loader.slots, loader.grid()).step,
            1);
  EXPECT_EQ((loader.mismatches<double, double>(s1)), 0);

  // a crash while writing step 3 leaves step_00000003.tmp: ignored
  on_rank0([&] {
    fs::create_directories(root / (step_name(3) + ".tmp"));
    std::ofstream(root / (step_name(3) + ".tmp") / "manifest") << "summa-checkpoint 1\nstep 3\n";
    std::ofstream(root / (step_name(3) + ".tmp") / "shard_00000.bin") << "partial";
  });
  EXPECT_EQ(latest_checkpoint(root), root / step_name(2));
  loader.scramble(s1);
  EXPECT_EQ(load_checkpoint(root, loader.store(), loader.slots, loader.grid()).step, 2);
  EXPECT_EQ((loader.mismatches<double, double>(s2)), 0);

  // saving step 2 again replaces it (and clears the leftover)
  saver.fill(s3);
  save_checkpoint(root, saver.store(), saver.slots, make_info(2, "again"), saver.grid());
  if (world_rank() == 0) {
    EXPECT_FALSE(fs::exists(root / (step_name(3) + ".tmp")));
  }
  EXPECT_EQ(load_checkpoint(root, loader.store(), loader.slots, loader.grid()),
            make_info(2, "again"));
  EXPECT_EQ((loader.mismatches<double, double>(s3)), 0);
  load_checkpoint(root / step_name(1), loader.store(), loader.slots, loader.grid());
  EXPECT_EQ((loader.mismatches<double, double>(s1)), 0);

  // failed saves write nothing and leave `latest` alone
  saver.fill(s4);
  std::vector<StateSlot> twice = saver.slots;
  twice[1].name = twice[0].name;
  expect_error_everywhere(
      [&] { save_checkpoint(root, saver.store(), twice, make_info(4, a.str()), saver.grid()); },
      {"save_checkpoint", "'exp_avg'", "twice"}, "duplicate slot names");
  expect_error_everywhere(
      [&] {
        save_checkpoint(root, saver.store(), saver.slots, make_info(-4, a.str()), saver.grid());
      },
      {"step -4", "negative"}, "negative step");
  std::vector<StateSlot> null_on_0 = saver.slots;
  if (world_rank() == 0) null_on_0[1].data = nullptr;
  expect_error_everywhere(
      [&] { save_checkpoint(root, saver.store(), null_on_0, make_info(4, a.str()), saver.grid()); },
      {"'exp_avg_sq'", "null"}, "a null slot buffer on rank 0 only");
  if (world_size() > 1) {
    std::vector<StateSlot> other = saver.slots;
    if (world_rank() == world_size() - 1) std::swap(other[0].name, other[1].name);
    expect_error_everywhere(
        [&] { save_checkpoint(root, saver.store(), other, make_info(4, a.str()), saver.grid()); },
        {"differ across ranks"}, "slots differing across ranks");
  }
  EXPECT_EQ(latest_checkpoint(root), root / step_name(2));
  if (world_rank() == 0) {
    EXPECT_FALSE(fs::exists(root / step_name(4)));
    EXPECT_NO_THROW(verify_checkpoint(root));
  }
  save_checkpoint(root, saver.store(), saver.slots, make_info(4, a.str()), saver.grid());
  EXPECT_EQ(latest_checkpoint(root), root / step_name(4));
  EXPECT_EQ(load_checkpoint(root, loader.store(), loader.slots, loader.grid()).step, 4);
  EXPECT_EQ((loader.mismatches<double, double>(s4)), 0);
}

// A checkpoint holding NaN or infinity is never written (`latest` stays);
// find_resume_point falls back to the newest step with a valid manifest when
// `latest` is damaged or missing, and never reports "nothing saved" while a
// step directory exists.
TEST(Checkpoint, NonFiniteRefusedAndResumePointFallsBack) {
  TempRoot tmp;
  Backend& backend = test_backend();
  const SchemeSpec a = schemes_for(world_size()).front();
  const fs::path root = tmp.path() / "run";
  const std::uint64_t s1 = fresh_seed(), s2 = fresh_seed();
  SCOPED_TRACE(seed_note(s1));
  Model<double> saver(a, backend, small_config());
  EXPECT_FALSE(find_resume_point(root, MPI_COMM_WORLD).has_value());
  saver.fill(s1);
  save_checkpoint(root, saver.store(), saver.slots, make_info(1, a.str()), saver.grid());
  saver.fill(s2);
  save_checkpoint(root, saver.store(), saver.slots, make_info(2, a.str()), saver.grid());

  for (const double bad :
       {std::numeric_limits<double>::quiet_NaN(), -std::numeric_limits<double>::infinity()}) {
    saver.fill(s2);
    if (world_rank() == 0) {  // rank 0 always writes a shard (data group 0)
      const auto n = static_cast<std::size_t>(saver.store().local_elements());
      const std::vector<double> poison(n, bad);
      backend.upload(saver.store().values_base(), poison.data(), n * sizeof(double));
    }
    expect_error_everywhere(
        [&] {
          save_checkpoint(root, saver.store(), saver.slots, make_info(3, a.str()), saver.grid());
        },
        {"save_checkpoint", "non-finite value", "latest"}, "non-finite values");
    EXPECT_EQ(latest_checkpoint(root), root / step_name(2));
    EXPECT_FALSE(fs::exists(root / step_name(3)));
  }

  auto point = find_resume_point(root, MPI_COMM_WORLD);
  ASSERT_TRUE(point.has_value());
  EXPECT_EQ(point->dir, root / step_name(2));
  EXPECT_EQ(point->info.step, 2);
  EXPECT_EQ(point->note, "");
  on_rank0([&] { std::ofstream(root / "latest") << "../../etc/passwd\n"; });
  point = find_resume_point(root, MPI_COMM_WORLD);
  ASSERT_TRUE(point.has_value());
  EXPECT_EQ(point->dir, root / step_name(2));
  EXPECT_NE(point->note.find("corrupted"), std::string::npos) << point->note;
  on_rank0([&] { fs::remove(root / "latest"); });
  point = find_resume_point(root, MPI_COMM_WORLD);
  ASSERT_TRUE(point.has_value());
  EXPECT_EQ(point->dir, root / step_name(2));
  EXPECT_NE(point->note.find("is missing"), std::string::npos) << point->note;
  on_rank0([&] { std::ofstream(root / step_name(2) / "manifest", std::ios::app) << "x\n"; });
  point = find_resume_point(root, MPI_COMM_WORLD);
  ASSERT_TRUE(point.has_value());
  EXPECT_EQ(point->dir, root / step_name(1));
  EXPECT_EQ(point->info.step, 1);
  on_rank0([&] { std::ofstream(root / step_name(1) / "manifest", std::ios::app) << "x\n"; });
  expect_error_everywhere(
      [&] { (void)find_resume_point(root, MPI_COMM_WORLD); },
      {"no step directory has a valid manifest", step_name(1), step_name(2), "--resume-from"},
      "every step damaged");
  EXPECT_EQ(step_directories(root),
            (std::vector<fs::path>{root / step_name(1), root / step_name(2)}));
}

// Every error throws on every rank, naming the problem; the previous
// checkpoint still loads.
TEST(Checkpoint, ErrorsThrowOnEveryRank) {
  TempRoot tmp;
  Backend& backend = test_backend();
  const auto config = small_config();
  const std::vector<SchemeSpec> schemes = schemes_for(world_size());
  const SchemeSpec& a = schemes.back();
  const SchemeSpec& b = schemes.front();
  const fs::path root = tmp.path() / "run";
  const std::uint64_t s1 = fresh_seed(), s2 = fresh_seed();
  SCOPED_TRACE(seed_note(s1));
  Model<double> saver(a, backend, config);
  Model<double> loader(b, backend, config);
  saver.fill(s1);
  save_checkpoint(root, saver.store(), saver.slots, make_info(1, a.str()), saver.grid());
  saver.fill(s2);
  const fs::path step2 = root / step_name(2);
  const auto fresh_step2 = [&] {
    save_checkpoint(root, saver.store(), saver.slots, make_info(2, a.str()), saver.grid());
  };
  const auto load = [&](const fs::path& p) {
    return load_checkpoint(p, loader.store(), loader.slots, loader.grid());
  };
  const auto previous_still_loads = [&] {
    loader.scramble(s2);
    EXPECT_EQ(load(root / step_name(1)).step, 1);
    EXPECT_EQ((loader.mismatches<double, double>(s1)), 0);
  };

  fresh_step2();
  on_rank0([&] {
    const fs::path shard = last_shard(step2);
    fs::resize_file(shard, fs::file_size(shard) - 8);
  });
  expect_error_everywhere([&] { load(root); }, {"shard_", "truncated"}, "truncated shard");
  previous_still_loads();

  fresh_step2();
  on_rank0([&] {
    const fs::path shard = last_shard(step2);
    flip_byte(shard, fs::file_size(shard) - 3);
  });
  expect_error_everywhere([&] { load(root); }, {"shard_", "corrupted", "checksum"},
                          "flipped byte in a shard");
  previous_still_loads();

  fresh_step2();
  on_rank0([&] { flip_byte(step2 / "manifest", fs::file_size(step2 / "manifest") / 2); });
  expect_error_everywhere([&] { load(root); }, {"manifest", "corrupted"},
                          "flipped byte in the manifest");
  previous_still_loads();

  fresh_step2();
  on_rank0([&] { fs::remove(last_shard(step2)); });
  expect_error_everywhere([&] { load(root); }, {"shard_", "missing"}, "deleted shard");
  previous_still_loads();

  fresh_step2();
  on_rank0([&] { flip_byte(last_shard(step2), 0); });
  expect_error_everywhere([&] { load(root); }, {"shard_", "bad magic"}, "bad shard magic");
  previous_still_loads();

  fresh_step2();
  on_rank0([&] { fs::remove(step2 / "manifest"); });
  expect_error_everywhere([&] { load(step2); }, {step2.string(), "no checkpoint", "missing"},
                          "no manifest");
  expect_error_everywhere([&] { load(root); }, {"latest", "no manifest"},
                          "latest pointing to a directory without a manifest");
  previous_still_loads();

  fresh_step2();
  on_rank0([&] {
    std::fstream io(step2 / "manifest", std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(static_cast<std::streamoff>(std::string("summa-checkpoint ").size()));
    io.write("7", 1);
  });
  expect_error_everywhere([&] { load(root); }, {"manifest", "version '7'"}, "future version");
  on_rank0([&] { std::ofstream(step2 / "manifest") << "hello\n"; });
  expect_error_everywhere([&] { load(root); }, {"manifest", "bad magic"}, "not a manifest");
  expect_error_everywhere([&] { read_checkpoint_info(root, MPI_COMM_WORLD); },
                          {"manifest", "bad magic"}, "read_checkpoint_info of a bad manifest");
  previous_still_loads();

  expect_error_everywhere([&] { load(tmp.path() / "nothing"); }, {"nothing", "no checkpoint"},
                          "no checkpoint at all");
  // a gpt_train --out directory given for its checkpoints: the message says
  // where they are (its checkpoints/ holds `latest`)
  const fs::path out = tmp.path() / "out";
  on_rank0([&] {
    fs::create_directories(out);
    fs::create_directory_symlink(fs::absolute(root), out / "checkpoints");
  });
  MPI_Barrier(MPI_COMM_WORLD);
  expect_error_everywhere([&] { load(out); },
                          {"no checkpoint at", "a run's checkpoints are in", "out/checkpoints"},
                          "a run's --out directory");

  // a dangling or looping link as the manifest or as `latest` is named as
  // such (was: "no checkpoint ... neither a manifest nor a 'latest' file")
  const fs::path links = tmp.path() / "links";
  on_rank0([&] {
    fs::create_directories(links / "a");
    fs::create_directories(links / "b");
    fs::create_symlink("nowhere", links / "a" / "manifest");
    fs::create_symlink("latest", links / "b" / "latest");
  });
  MPI_Barrier(MPI_COMM_WORLD);
  expect_error_everywhere([&] { load(links / "a"); },
                          {"checkpoint manifest", "a dangling symbolic link (to 'nowhere')"},
                          "dangling manifest link");
  expect_error_everywhere([&] { load(links / "b"); },
                          {"checkpoint 'latest'", "a symbolic link loop"}, "looping latest link");

  // another model: the differing tensor and both shapes are named
  fresh_step2();
  {
    Model<double> wider(b, backend, small_config(24));
    expect_error_everywhere(
        [&] { load_checkpoint(root, wider.store(), wider.slots, wider.grid()); },
        {"parameter list mismatch", "'wte.weight'", "[24, 16]", "[24, 24]"}, "wider model");
  }
  {
    Model<double> shallower(b, backend, small_config(16, 1));
    expect_error_everywhere(
        [&] { load_checkpoint(root, shallower.store(), shallower.slots, shallower.grid()); },
        {"parameter list mismatch", "'h.1."}, "fewer layers");
  }
  {
    Model<double> deeper(b, backend, small_config(16, 3));
    expect_error_everywhere(
        [&] { load_checkpoint(root, deeper.store(), deeper.slots, deeper.grid()); },
        {"parameter list mismatch", "'h.2."}, "more layers");
  }
  // other slots
  const std::vector<StateSlot> one(loader.slots.begin(), loader.slots.begin() + 1);
  expect_error_everywhere([&] { load_checkpoint(root, loader.store(), one, loader.grid()); },
                          {"slot mismatch", "exp_avg_sq"}, "one slot of two");
  std::vector<StateSlot> renamed = loader.slots;
  renamed[1].name = "momentum_buffer";
  expect_error_everywhere([&] { load_checkpoint(root, loader.store(), renamed, loader.grid()); },
                          {"slot mismatch", "momentum_buffer"}, "renamed slot");
  // nothing above damaged step 2
  loader.scramble(s1);
  EXPECT_EQ(load(root).step, 2);
  EXPECT_EQ((loader.mismatches<double, double>(s2)), 0);
  previous_still_loads();
}

// ---------------------------------------------------------------- bf16

// A ParameterStore<S> on the test backend over copies of the parameters of a
// float model under some scheme (its real shards: pieces, owners, replicas),
// so bf16 stores can be checkpointed before there is a bf16 model.
template <class S>
struct CopiedStore {
  ParallelGpt<float> layout;
  std::vector<Param<S>> params;
  std::unique_ptr<ParameterStore<S>> store;

  CopiedStore(const SchemeSpec& spec, const reference::GptConfig& config)
      : layout(MPI_COMM_WORLD, spec, test_backend(), config, kBatch, kSeq, GptOptions{},
               test_grid_options()),
        params(layout.model().parameters_store().params().size()) {
    std::vector<Param<S>*> pointers;
    for (std::size_t k = 0; k < params.size(); ++k) {
      params[k].shard = layout.model().parameters_store().params()[k]->shard;
      pointers.push_back(&params[k]);
    }
    store = std::make_unique<ParameterStore<S>>(test_backend(), pointers);
  }
  ProcessGrid& grid() { return layout.grid(); }
  index_t n() const { return store->local_elements(); }

  // Every local element of every piece (owners and replicas) set from the
  // global tensors `global` (values, or gradients with `grad`).
  void set(const std::vector<std::vector<float>>& global, bool grad) {
    set_from_global<S>(params, global, grad);
  }
  // n() elements of test-backend memory packed like values_base() (values,
  // master, a state slot), assembled into global tensors with gather_global
  // (which also checks that replicas agree with owners: every element once).
  template <class E>
  std::vector<std::vector<E>> gather(const E* packed) {
    std::vector<E> host(static_cast<std::size_t>(n()));
    if (!host.empty()) test_backend().download(host.data(), packed, host.size() * sizeof(E));
    std::vector<std::vector<E>> out;
    for (const Param<S>& p : params) {
      Param<E> view;
      view.shard = p.shard;
      if (p.held()) view.value = host.data() + (p.value - store->values_base());
      out.push_back(gather_global(view, grid()));
    }
    return out;
  }
};

// One bf16-representable N(0, 1) deviate per global element of every
// parameter of `config` (the same on every rank).
std::vector<std::vector<float>> random_globals(const ParameterStore<float>& layout,
                                               std::mt19937_64& gen) {
  std::normal_distribution<double> normal;
  std::vector<std::vector<float>> out;
  for (const Param<float>* p : layout.params()) {
    std::vector<float> v(static_cast<std::size_t>(p->shard.global_size()));
    for (float& x : v) x = float(bf16(normal(gen)));
    out.push_back(std::move(v));
  }
  return out;
}

// Bitwise equality of two sets of global tensors (+0 vs -0 and NaN payloads
// count as different).
template <class A>
bool same_bits(const std::vector<std::vector<A>>& a, const std::vector<std::vector<A>>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t k = 0; k < a.size(); ++k)
    if (a[k].size() != b[k].size() ||
        (!a[k].empty() && std::memcmp(a[k].data(), b[k].data(), a[k].size() * sizeof(A)) != 0))
      return false;
  return true;
}

// The global state of an optimizer over a CopiedStore: values, the fp32
// master (bf16) and every state slot.
template <class S>
struct Snapshot {
  std::vector<std::vector<S>> values;
  std::vector<std::vector<float>> master;
  std::vector<std::vector<std::vector<float>>> slots;

  Snapshot(CopiedStore<S>& cs, Optimizer<S>& opt) {
    values = cs.gather(cs.store->values_base());
    if constexpr (std::is_same_v<S, bf16>)
      master = cs.template gather<float>(opt.master());
    else
      master = values;
    for (std::size_t k = 0; k < opt.state_names().size(); ++k)
      slots.push_back(cs.template gather<float>(opt.state(k)));
  }
};
template <class S>
long long snapshot_mismatches(const Snapshot<S>& got, const Snapshot<S>& want) {
  long long bad = 0;
  bad += same_bits(got.values, want.values) ? 0 : 1;
  bad += same_bits(got.master, want.master) ? 0 : 10;
  bad += got.slots.size() == want.slots.size() ? 0 : 100;
  for (std::size_t k = 0; k < std::min(got.slots.size(), want.slots.size()); ++k)
    bad += same_bits(got.slots[k], want.slots[k]) ? 0 : 100;
  return bad;
}

// A bf16 run with AdamW (fp32 master and state) saved after 3 steps under one
// scheme and loaded under the same and under another scheme: right after the
// load, values, master and state equal the saver's bit for bit, and 2 more
// steps with the same gradients give bit-identical values, master and state
// to the run that never stopped. The saved values are the fp32 master
// ('values f32'), not bf16 values: loading from widened bf16 values instead
// would lose the master's low bits (after 3 steps of lr 1e-2 on N(0, 1)
// values, the master is off the bf16 grid almost everywhere: checked).
TEST(CheckpointBf16, ResumeIsBitIdentical) {
  TempRoot tmp;
  const auto config = small_config();
  const std::vector<SchemeSpec> schemes = representative_schemes(world_size());
  const OptimizerOptions options{.kind = "adamw", .weight_decay = 0.1};
  // every scheme saves; loaded under itself and under the next one (all
  // pairs are ReshardsBetweenEveryPairOfSchemes' business)
  for (std::size_t i = 0; i < schemes.size(); ++i) {
    const std::uint64_t seed = fresh_seed();
    SCOPED_TRACE(cat({"save under ", schemes[i].str(), ", ", seed_note(seed)}));
    std::mt19937_64 gen(seed);
    CopiedStore<bf16> saver(schemes[i], config);
    const ParameterStore<float>& layout = saver.layout.model().parameters_store();
    std::vector<std::vector<std::vector<float>>> grads;
    saver.set(random_globals(layout, gen), false);
    auto opt = make_optimizer(options, *saver.store);
    for (int step = 0; step < 5; ++step) grads.push_back(random_globals(layout, gen));
    for (int step = 0; step < 3; ++step) {
      saver.set(grads[static_cast<std::size_t>(step)], true);
      opt->step(1e-2);
    }
    const fs::path root = tmp.path() / cat({"bf16_", std::to_string(i)});
    save_checkpoint(root, *opt, make_info(3, schemes[i].str()), saver.grid());
    const Snapshot<bf16> at_save(saver, *opt);
    long long off_grid = 0;
    for (std::size_t k = 0; k < at_save.master.size(); ++k)
      for (std::size_t e = 0; e < at_save.master[k].size(); ++e)
        off_grid += float(bf16(at_save.master[k][e])) != at_save.master[k][e] ? 1 : 0;
    EXPECT_GT(off_grid, 0) << "the master never left the bf16 grid: the test would not see a "
                              "checkpoint of bf16 values";
    for (int step = 3; step < 5; ++step) {
      saver.set(grads[static_cast<std::size_t>(step)], true);
      opt->step(1e-2);
    }
    const Snapshot<bf16> continued(saver, *opt);
    if (world_rank() == 0) {
      std::ifstream manifest(root / step_name(3) / "manifest");
      const std::string text((std::istreambuf_iterator<char>(manifest)),
                             std::istreambuf_iterator<char>());
      EXPECT_NE(text.find("\nvalues f32\n"), std::string::npos) << "bf16 values saved as fp32";
      EXPECT_NO_THROW(verify_checkpoint(root));
    }

    for (const std::size_t j : {i, (i + 1) % schemes.size()}) {
      SCOPED_TRACE(cat({"loaded under ", schemes[j].str()}));
      CopiedStore<bf16> loader(schemes[j], config);
      loader.set(random_globals(layout, gen), false);  // something else
      auto resumed = make_optimizer(options, *loader.store);
      const CheckpointInfo info = load_checkpoint(root, *resumed, loader.grid());
      EXPECT_EQ(info, make_info(3, schemes[i].str()));
      EXPECT_EQ(resumed->steps(), 0) << "load_checkpoint leaves steps() to the caller";
      resumed->set_steps(info.step);
      EXPECT_EQ(snapshot_mismatches(Snapshot<bf16>(loader, *resumed), at_save), 0);
      for (int step = 3; step < 5; ++step) {
        loader.set(grads[static_cast<std::size_t>(step)], true);
        resumed->step(1e-2);
      }
      EXPECT_EQ(snapshot_mismatches(Snapshot<bf16>(loader, *resumed), continued), 0);
    }
  }
}

// float <-> bf16: a float run's checkpoint resumes a bf16 run (master = the
// float values exactly, values = bf16(master), state copied) and continues
// like the float run (same fp32 arithmetic: master == float values bit for
// bit, as in test_optimizer); a bf16 run's checkpoint resumes a float run
// with values = the master. Without an optimizer, a bf16 store saves its
// values widened (exact) and loads bf16(saved value).
TEST(CheckpointBf16, CrossLoadsFloatAndBf16) {
  TempRoot tmp;
  const auto config = small_config();
  const std::vector<SchemeSpec> schemes = schemes_for(world_size());
  const SchemeSpec& a = schemes.front();
  const SchemeSpec& b = schemes.back();
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  const OptimizerOptions options{.kind = "sgd", .momentum = 0.9, .weight_decay = 0.01};
  CopiedStore<float> f32(a, config);
  CopiedStore<bf16> b16(b, config);
  const ParameterStore<float>& layout = f32.layout.model().parameters_store();
  const auto start = random_globals(layout, gen);
  f32.set(start, false);
  b16.set(random_globals(layout, gen), false);
  auto opt32 = make_optimizer(options, *f32.store);
  auto opt16 = make_optimizer(options, *b16.store);
  for (int step = 0; step < 2; ++step) {
    const auto g = random_globals(layout, gen);
    f32.set(g, true);
    opt32->step(1e-2);
  }
  // float -> bf16
  save_checkpoint(tmp.path() / "f32", *opt32, make_info(2, a.str()), f32.grid());
  load_checkpoint(tmp.path() / "f32", *opt16, b16.grid());
  opt16->set_steps(2);
  {
    const Snapshot<float> want(f32, *opt32);
    const Snapshot<bf16> got(b16, *opt16);
    EXPECT_TRUE(same_bits(got.master, want.values)) << "master = the float values";
    EXPECT_TRUE(same_bits(got.slots.at(0), want.slots.at(0))) << "momentum buffer";
    long long bad = 0;
    for (std::size_t k = 0; k < got.values.size(); ++k)
      for (std::size_t e = 0; e < got.values[k].size(); ++e)
        bad += got.values[k][e].bits != bf16(want.values[k][e]).bits ? 1 : 0;
    EXPECT_EQ(bad, 0) << "values = bf16(master)";
  }
  for (int step = 2; step < 4; ++step) {
    const auto g = random_globals(layout, gen);
    f32.set(g, true);
    b16.set(g, true);
    opt32->step(1e-2);
    opt16->step(1e-2);
  }
  if (!test_backend().asynchronous()) {  // the GPU kernels may contract differently
    EXPECT_TRUE(same_bits(Snapshot<bf16>(b16, *opt16).master, Snapshot<float>(f32, *opt32).values))
        << "after the resume the bf16 master follows the float run bit for bit";
  }
  // bf16 -> float
  save_checkpoint(tmp.path() / "bf16", *opt16, make_info(4, b.str()), b16.grid());
  f32.set(start, false);  // something else
  load_checkpoint(tmp.path() / "bf16", *opt32, f32.grid());
  {
    const Snapshot<bf16> want(b16, *opt16);
    const Snapshot<float> got(f32, *opt32);
    EXPECT_TRUE(same_bits(got.values, want.master)) << "float values = the bf16 run's master";
    EXPECT_TRUE(same_bits(got.slots.at(0), want.slots.at(0))) << "momentum buffer";
  }
  // stores without an optimizer: bf16 values widened, then rounded back
  const std::vector<StateSlot> none;
  save_checkpoint(tmp.path() / "plain16", *b16.store, none, make_info(5, b.str()), b16.grid());
  const auto b16_values = b16.gather(b16.store->values_base());
  load_checkpoint(tmp.path() / "plain16", *f32.store, none, f32.grid());
  {
    const auto got = f32.gather(f32.store->values_base());
    long long bad = 0;
    for (std::size_t k = 0; k < got.size(); ++k)
      for (std::size_t e = 0; e < got[k].size(); ++e)
        bad += got[k][e] != float(b16_values[k][e]) ? 1 : 0;
    EXPECT_EQ(bad, 0) << "bf16 values saved widened";
  }
  f32.set(start, false);
  save_checkpoint(tmp.path() / "plain32", *f32.store, none, make_info(6, a.str()), f32.grid());
  load_checkpoint(tmp.path() / "plain32", *b16.store, none, b16.grid());
  {
    const auto got = b16.gather(b16.store->values_base());
    long long bad = 0;
    for (std::size_t k = 0; k < got.size(); ++k)
      for (std::size_t e = 0; e < got[k].size(); ++e)
        bad += got[k][e].bits != bf16(start[k][e]).bits ? 1 : 0;
    EXPECT_EQ(bad, 0) << "float values loaded rounded to bf16";
    // refresh_master() picks the loaded values up
    opt16->refresh_master();
    const auto master = b16.gather(opt16->master());
    bad = 0;
    for (std::size_t k = 0; k < master.size(); ++k)
      for (std::size_t e = 0; e < master[k].size(); ++e)
        bad += master[k][e] != float(got[k][e]) ? 1 : 0;
    EXPECT_EQ(bad, 0) << "refresh_master";
  }
}

// Errors of a bf16 load throw on every rank (the checks are the store
// overload's: one shared path), and the good checkpoint still loads.
TEST(CheckpointBf16, ErrorsThrowOnEveryRank) {
  TempRoot tmp;
  const auto config = small_config();
  const std::vector<SchemeSpec> schemes = schemes_for(world_size());
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  CopiedStore<bf16> saver(schemes.back(), config);
  CopiedStore<bf16> loader(schemes.front(), config);
  const ParameterStore<float>& layout = saver.layout.model().parameters_store();
  saver.set(random_globals(layout, gen), false);
  auto opt = make_optimizer<bf16>({.kind = "adamw"}, *saver.store);
  saver.set(random_globals(layout, gen), true);
  opt->step(1e-2);
  const fs::path root = tmp.path() / "run";
  save_checkpoint(root, *opt, make_info(1, "bf16"), saver.grid());
  save_checkpoint(root, *opt, make_info(2, "bf16"), saver.grid());
  auto adamw = make_optimizer<bf16>({.kind = "adamw"}, *loader.store);
  auto sgd = make_optimizer<bf16>({.kind = "sgd"}, *loader.store);
  const fs::path step2 = root / step_name(2);
  on_rank0([&] {
    const fs::path shard = last_shard(step2);
    flip_byte(shard, fs::file_size(shard) - 3);
  });
  expect_error_everywhere([&] { load_checkpoint(root, *adamw, loader.grid()); },
                          {"shard_", "corrupted", "checksum"}, "flipped byte in a bf16 shard");
  on_rank0([&] {
    const fs::path shard = last_shard(step2);
    fs::resize_file(shard, fs::file_size(shard) - 8);
  });
  expect_error_everywhere([&] { load_checkpoint(root, *adamw, loader.grid()); },
                          {"shard_", "truncated"}, "truncated bf16 shard");
  expect_error_everywhere([&] { load_checkpoint(root / step_name(1), *sgd, loader.grid()); },
                          {"slot mismatch", "momentum_buffer", "exp_avg"},
                          "an sgd optimizer loading adamw state");
  EXPECT_EQ(load_checkpoint(root / step_name(1), *adamw, loader.grid()).step, 1);
  adamw->set_steps(1);
  EXPECT_EQ(snapshot_mismatches(Snapshot<bf16>(loader, *adamw), Snapshot<bf16>(saver, *opt)), 0);
}

}  // namespace
}  // namespace summa::test

// Tokenizer, token files and the deterministic batch loader (summa/io/data.hpp).
// Oracles: hand-written byte layouts, an independent re-implementation of the
// documented offset formula, and direct searches of the token stream; data
// is fresh random per test (seed printed on failure).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "summa/io/data.hpp"
#include "test_util.hpp"

namespace {

namespace fs = std::filesystem;
using summa::Error;
using summa::index_t;
using summa::io::Batch;
using summa::io::ByteTokenizer;
using summa::io::LoaderOptions;
using summa::io::Split;
using summa::io::TokenLoader;
using summa::test::fresh_seed;
using summa::test::seed_note;

/// A scratch directory removed at the end of the test.
class ScratchDir {
 public:
  explicit ScratchDir(std::uint64_t seed)
      : path_(fs::temp_directory_path() / ("summa_test_data_" + std::to_string(seed))) {
    fs::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

void write_raw(const fs::path& file, const std::string& bytes) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_raw(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

/// The message of the summa::Error `f` throws (fails the test when it throws
/// nothing or something else).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-summa exception: " << e.what();
    return {};
  }
  ADD_FAILURE() << "did not throw";
  return {};
}

#define EXPECT_ERROR_HAS(statement, ...)                                   \
  do {                                                                     \
    const std::string message_ = error_of([&] { statement; });             \
    for (const std::string& part_ : std::vector<std::string>{__VA_ARGS__}) \
      EXPECT_NE(message_.find(part_), std::string::npos)                   \
          << "message \"" << message_ << "\" lacks \"" << part_ << "\"";   \
  } while (0)

std::vector<std::uint16_t> random_ids(std::size_t n, int vocab, std::mt19937_64& gen) {
  std::uniform_int_distribution<int> dist(0, vocab - 1);
  std::vector<std::uint16_t> ids(n);
  for (auto& id : ids) id = static_cast<std::uint16_t>(dist(gen));
  return ids;
}

/// Independent statement of the documented offset rule.
std::uint64_t splitmix(std::uint64_t x) {
  return summa::test::mix(x);
}
index_t expected_offset(std::uint64_t seed, std::int64_t step, index_t row, Split split,
                        std::size_t split_length, index_t seq) {
  const std::uint64_t lane = 2 * static_cast<std::uint64_t>(row) + (split == Split::val ? 1 : 0);
  const std::uint64_t h =
      splitmix(splitmix(splitmix(seed) ^ static_cast<std::uint64_t>(step)) ^ lane);
  return static_cast<index_t>(h % (split_length - static_cast<std::uint64_t>(seq)));
}

/// Every row of `b` is seq+1 consecutive tokens of `stream` (tokens then
/// targets shifted by one); returns the window starts found by searching.
std::vector<std::vector<index_t>> windows_in(const Batch& b, std::span<const std::uint16_t> stream,
                                             index_t batch, index_t seq) {
  std::vector<std::vector<index_t>> starts(static_cast<std::size_t>(batch));
  for (index_t r = 0; r < batch; ++r) {
    std::vector<std::int32_t> window(static_cast<std::size_t>(seq + 1));
    for (index_t c = 0; c < seq; ++c) {
      const auto k = static_cast<std::size_t>(r * seq + c);
      window[static_cast<std::size_t>(c)] = b.tokens[k];
      // targets are the tokens shifted by one within the row ...
      if (c + 1 < seq) {
        EXPECT_EQ(b.targets[k], b.tokens[k + 1]) << "row " << r << " col " << c;
      }
    }
    window[static_cast<std::size_t>(seq)] = b.targets[static_cast<std::size_t>(r * seq + seq - 1)];
    // ... and the whole window occurs in the stream.
    for (std::size_t o = 0; o + window.size() <= stream.size(); ++o)
      if (std::equal(
              window.begin(), window.end(), stream.begin() + static_cast<std::ptrdiff_t>(o),
              [](std::int32_t a, std::uint16_t s) { return a == static_cast<std::int32_t>(s); }))
        starts[static_cast<std::size_t>(r)].push_back(static_cast<index_t>(o));
    EXPECT_FALSE(starts[static_cast<std::size_t>(r)].empty())
        << "row " << r << " is not a contiguous window of the split";
  }
  return starts;
}

// ---------------------------------------------------------------- tokenizer

TEST(ByteTokenizer, RoundTripOfRandomBytes) {
  const auto seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::string text(4096, '\0');
  for (auto& ch : text) ch = static_cast<char>(static_cast<unsigned char>(byte(gen)));
  text += std::string("\0\x7f\x80\xff", 4);  // the extremes, whatever the draw
  ByteTokenizer tok;
  const auto ids = tok.encode(text);
  ASSERT_EQ(ids.size(), text.size());
  for (std::size_t i = 0; i < text.size(); ++i)
    ASSERT_EQ(ids[i], static_cast<unsigned char>(text[i])) << "byte " << i;
  EXPECT_EQ(tok.decode(ids), text);
  EXPECT_EQ(tok.encode("Ab\n"), (std::vector<std::uint16_t>{65, 98, 10}));
  EXPECT_TRUE(tok.encode("").empty());
  EXPECT_EQ(ByteTokenizer::base_vocab, 256);
}

TEST(ByteTokenizer, PaddingIdsDecodeToReplacementCharacter) {
  const std::vector<std::uint16_t> ids{72, 256, 105, 65535, 300};
  EXPECT_EQ(ByteTokenizer().decode(ids), "H\xEF\xBF\xBDi\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(ByteTokenizer, PaddedVocab) {
  EXPECT_EQ(ByteTokenizer::padded_vocab(256, 1), 256);
  EXPECT_EQ(ByteTokenizer::padded_vocab(256, 4), 256);
  EXPECT_EQ(ByteTokenizer::padded_vocab(256, 3), 258);
  EXPECT_EQ(ByteTokenizer::padded_vocab(257, 4), 260);
  EXPECT_EQ(ByteTokenizer::padded_vocab(50257, 128), 50304);
  const auto seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int> vocab(1, 70000), multiple(1, 300);
  for (int trial = 0; trial < 1000; ++trial) {
    const int v = vocab(gen), m = multiple(gen);
    const int p = ByteTokenizer::padded_vocab(v, m);
    ASSERT_EQ(p % m, 0) << v << " " << m;
    ASSERT_GE(p, v);
    ASSERT_LT(p - v, m);
  }
  EXPECT_ERROR_HAS(ByteTokenizer::padded_vocab(0, 4), "vocab=0");
  EXPECT_ERROR_HAS(ByteTokenizer::padded_vocab(256, 0), "multiple=0");
  EXPECT_ERROR_HAS(ByteTokenizer::padded_vocab(-3, 2), "vocab=-3");
  EXPECT_ERROR_HAS(ByteTokenizer::padded_vocab(std::numeric_limits<int>::max(), 2), "overflows");
}

// ---------------------------------------------------------------- token files

TEST(TokenFile, WriteReadRoundTripOfRandomIds) {
  const auto seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  ScratchDir dir(seed);
  auto ids = random_ids(10007, 65536, gen);
  // Values > 255 and the largest id, whatever the draw.
  ids.insert(ids.end(), {0, 255, 256, 257, 4096, 65534, 65535});
  const fs::path file = dir.path() / "tokens.bin";
  summa::io::write_token_file(file, ids);
  EXPECT_EQ(summa::io::read_token_file(file), ids);
  EXPECT_EQ(summa::io::load_tokens(file), ids);
  EXPECT_EQ(fs::file_size(file), 2 * ids.size());
  // Overwriting replaces the file; no temporary files are left behind.
  const auto fewer = random_ids(33, 65536, gen);
  summa::io::write_token_file(file, fewer);
  EXPECT_EQ(summa::io::read_token_file(file), fewer);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);
}

TEST(TokenFile, LittleEndianByteLayout) {
  const auto seed = fresh_seed();
  ScratchDir dir(seed);
  // Written by hand: 0x1234, 0x00ff, 0xff00, 0xfffe.
  const std::string bytes("\x34\x12\xff\x00\x00\xff\xfe\xff", 8);
  const std::vector<std::uint16_t> ids{0x1234, 0x00ff, 0xff00, 0xfffe};
  const fs::path by_hand = dir.path() / "by_hand.bin";
  write_raw(by_hand, bytes);
  EXPECT_EQ(summa::io::read_token_file(by_hand), ids);
  // And write_token_file produces exactly those bytes.
  const fs::path written = dir.path() / "written.bin";
  summa::io::write_token_file(written, ids);
  EXPECT_EQ(read_raw(written), bytes);
}

TEST(TokenFile, Errors) {
  const auto seed = fresh_seed();
  ScratchDir dir(seed);
  const fs::path missing = dir.path() / "missing.bin";
  EXPECT_ERROR_HAS(summa::io::read_token_file(missing), missing.string(), "no such file");
  const fs::path empty = dir.path() / "empty.bin";
  write_raw(empty, "");
  EXPECT_ERROR_HAS(summa::io::read_token_file(empty), empty.string(), "empty");
  const fs::path odd = dir.path() / "odd.bin";
  write_raw(odd, std::string("\x01\x02\x03", 3));
  EXPECT_ERROR_HAS(summa::io::read_token_file(odd), odd.string(), "3 bytes",
                   "not a whole number of uint16 tokens");
  EXPECT_ERROR_HAS(summa::io::read_token_file(dir.path()), "not a regular file");
  EXPECT_ERROR_HAS(summa::io::write_token_file(dir.path() / "none.bin", {}), "none.bin", "empty");
  const fs::path no_dir = dir.path() / "no_such_dir" / "x.bin";
  const std::vector<std::uint16_t> one{1};
  EXPECT_ERROR_HAS(summa::io::write_token_file(no_dir, one), no_dir.string());
  // load_tokens: a .bin goes through the token-file checks, text files too.
  EXPECT_ERROR_HAS(summa::io::load_tokens(odd), "not a whole number of uint16 tokens");
  const fs::path missing_text = dir.path() / "missing.txt";
  EXPECT_ERROR_HAS(summa::io::load_tokens(missing_text), missing_text.string(), "no such file");
  const fs::path empty_text = dir.path() / "empty.txt";
  write_raw(empty_text, "");
  EXPECT_ERROR_HAS(summa::io::load_tokens(empty_text), empty_text.string(), "empty");
}

TEST(TokenFile, LoadTextEncodesBytes) {
  const auto seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  ScratchDir dir(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::string text(999, '\0');
  for (auto& ch : text) ch = static_cast<char>(static_cast<unsigned char>(byte(gen)));
  for (const char* name : {"text.txt", "text.md", "noextension"}) {
    const fs::path file = dir.path() / name;
    write_raw(file, text);
    EXPECT_EQ(summa::io::load_tokens(file), ByteTokenizer().encode(text)) << name;
  }
}

// The format follows the extension in any case (.bin, .BIN, .Bin), checked
// against the content: text named .bin is refused naming the file.
TEST(TokenFile, FormatByExtensionCheckedByContent) {
  const auto seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  ScratchDir dir(seed);
  std::uniform_int_distribution<int> id(0, 50256);
  std::vector<std::uint16_t> ids(777);
  for (auto& t : ids) t = static_cast<std::uint16_t>(id(gen));
  for (const char* name : {"a.bin", "b.BIN", "c.Bin"}) {
    const fs::path file = dir.path() / name;
    summa::io::write_token_file(file, ids);
    EXPECT_EQ(summa::io::load_tokens(file), ids) << name;
  }
  write_raw(dir.path() / "text.BIN", "plain text, 2 bytes a token would be nonsense\n");
  try {
    (void)summa::io::load_tokens(dir.path() / "text.BIN");
    ADD_FAILURE() << "text named .BIN was accepted";
  } catch (const summa::Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds text"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------- loader

TEST(TokenLoader, ValidatesItsInput) {
  const auto seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  auto ids = random_ids(1000, 256, gen);
  const LoaderOptions ok{.batch = 4, .seq = 16};
  EXPECT_NO_THROW(TokenLoader(ids, 256, ok));
  // An id outside the vocabulary: the message names position, id, vocabulary.
  auto bad = ids;
  bad[617] = 300;
  bad[800] = 999;  // only the first is reported
  EXPECT_ERROR_HAS(TokenLoader(bad, 256, ok), "token id 300", "position 617", "vocab_size=256");
  bad[617] = 256;
  EXPECT_ERROR_HAS(TokenLoader(bad, 256, ok), "token id 256", "position 617");
  EXPECT_NO_THROW(TokenLoader(bad, 1000, ok));
  EXPECT_ERROR_HAS(TokenLoader(ids, 0, ok), "vocab_size=0");
  EXPECT_ERROR_HAS(TokenLoader(ids, 256, {.batch = 0, .seq = 16}), "batch=0");
  EXPECT_ERROR_HAS(TokenLoader(ids, 256, {.batch = 4, .seq = 0}), "seq=0");
  EXPECT_ERROR_HAS(TokenLoader(ids, 256, {.batch = -1, .seq = 8}), "batch=-1");
  for (double f : {-0.1, 1.0, 1.5, std::nan("")})
    EXPECT_ERROR_HAS(TokenLoader(ids, 256, {.batch = 4, .seq = 16, .val_fraction = f}),
                     "val_fraction", "[0, 1)");
  // Too short: 1000 tokens, val_fraction 0.1 -> train 900, val 100.
  EXPECT_NO_THROW(TokenLoader(ids, 256, {.batch = 4, .seq = 99}));
  EXPECT_ERROR_HAS(TokenLoader(ids, 256, {.batch = 4, .seq = 100}), "too short", "val split",
                   "100 tokens", "seq+1 = 101");
  EXPECT_NO_THROW(TokenLoader(ids, 256, {.batch = 4, .seq = 999, .val_fraction = 0}));
  EXPECT_ERROR_HAS(TokenLoader(ids, 256, {.batch = 4, .seq = 1000, .val_fraction = 0}), "too short",
                   "train split", "1000 tokens", "seq+1 = 1001");
  EXPECT_ERROR_HAS(TokenLoader(ids, 256, {.batch = 4, .seq = 100, .val_fraction = 0.95}),
                   "too short", "train split", "50 tokens");
  EXPECT_ERROR_HAS(TokenLoader(ids, 256, {.batch = 4, .seq = 16, .val_fraction = 0.0001}),
                   "too short", "val split", "0 tokens");
  EXPECT_ERROR_HAS(TokenLoader({}, 256, ok), "too short");
}

TEST(TokenLoader, SplitsAndShapes) {
  const auto seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  const auto ids = random_ids(1003, 65536, gen);
  TokenLoader loader(ids, 65536, {.batch = 3, .seq = 7, .seed = seed, .val_fraction = 0.25});
  // val = round(1003 * 0.25) = 251, train the first 752.
  EXPECT_EQ(loader.val_tokens(), 251u);
  EXPECT_EQ(loader.train_tokens(), 752u);
  EXPECT_TRUE(
      std::equal(ids.begin(), ids.begin() + 752, loader.split_tokens(Split::train).begin()));
  EXPECT_TRUE(std::equal(ids.begin() + 752, ids.end(), loader.split_tokens(Split::val).begin()));
  const Batch b = loader.batch(5);
  EXPECT_EQ(b.tokens.size(), 21u);
  EXPECT_EQ(b.targets.size(), 21u);
  std::vector<std::int32_t> small(20), right(21);
  EXPECT_ERROR_HAS(loader.fill(0, Split::train, small, right), "20", "batch*seq = 3*7 = 21");
  EXPECT_ERROR_HAS(loader.fill(-1, Split::train, right, right), "step=-1");
  // No validation split.
  TokenLoader no_val(ids, 65536, {.batch = 3, .seq = 7, .val_fraction = 0});
  EXPECT_EQ(no_val.train_tokens(), ids.size());
  EXPECT_EQ(no_val.val_tokens(), 0u);
  EXPECT_FALSE(no_val.has_val());
  EXPECT_ERROR_HAS(no_val.batch(0, Split::val), "no val split");
}

TEST(TokenLoader, RowsAreWindowsOfTheStreamWithShiftedTargets) {
  const auto seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  // Ids over the whole uint16 range, so a window of a few tokens is unique.
  const auto ids = random_ids(5000, 65536, gen);
  const index_t batch = 6, seq = 9;
  TokenLoader loader(ids, 65536, {.batch = batch, .seq = seq, .seed = seed, .val_fraction = 0.2});
  for (Split split : {Split::train, Split::val}) {
    const auto stream = loader.split_tokens(split);
    for (std::int64_t step : {0, 1, 2, 1000, 123456789}) {
      const Batch b = loader.batch(step, split);
      const auto found = windows_in(b, stream, batch, seq);
      for (index_t r = 0; r < batch; ++r) {
        const index_t o = loader.offset(step, r, split);
        EXPECT_EQ(found[static_cast<std::size_t>(r)], std::vector<index_t>{o});
        // The documented formula, restated independently.
        EXPECT_EQ(o, expected_offset(seed, step, r, split, stream.size(), seq));
      }
    }
  }
}

TEST(TokenLoader, DeterministicAndResumable) {
  const auto seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  const auto ids = random_ids(20000, 256, gen);
  const LoaderOptions options{.batch = 8, .seq = 32, .seed = seed};
  TokenLoader run(ids, 256, options);
  std::vector<Batch> uninterrupted;
  for (std::int64_t step = 0; step < 20; ++step) uninterrupted.push_back(run.batch(step));
  // Same (seed, step): same batch; different steps: different batches.
  for (std::int64_t step = 0; step < 20; ++step) {
    const Batch again = run.batch(step);
    EXPECT_EQ(again.tokens, uninterrupted[static_cast<std::size_t>(step)].tokens);
    EXPECT_EQ(again.targets, uninterrupted[static_cast<std::size_t>(step)].targets);
    for (std::int64_t other = 0; other < step; ++other)
      EXPECT_NE(uninterrupted[static_cast<std::size_t>(other)].tokens, again.tokens)
          << "steps " << other << " and " << step;
  }
  // A second loader (a resumed run) from step 10 on, queried in another
  // order, gives the batches of the uninterrupted run.
  TokenLoader resumed(ids, 256, options);
  for (std::int64_t step = 19; step >= 10; --step) {
    const Batch b = resumed.batch(step);
    EXPECT_EQ(b.tokens, uninterrupted[static_cast<std::size_t>(step)].tokens) << step;
    EXPECT_EQ(b.targets, uninterrupted[static_cast<std::size_t>(step)].targets) << step;
  }
  // fill() into caller buffers equals batch().
  std::vector<std::int32_t> tokens(8 * 32), targets(8 * 32);
  run.fill(7, Split::train, tokens, targets);
  EXPECT_EQ(tokens, uninterrupted[7].tokens);
  EXPECT_EQ(targets, uninterrupted[7].targets);
  // Another seed gives other batches.
  LoaderOptions other = options;
  other.seed = seed + 1;
  EXPECT_NE(TokenLoader(ids, 256, other).batch(0).tokens, uninterrupted[0].tokens);
}

TEST(TokenLoader, FillAllocatesNothing) {
  if (!summa::test::allocation_counting_available()) GTEST_SKIP() << "no allocation counting";
  const auto seed = fresh_seed();
  std::mt19937_64 gen(seed);
  const auto ids = random_ids(4000, 256, gen);
  TokenLoader loader(ids, 256, {.batch = 4, .seq = 16, .seed = seed});
  std::vector<std::int32_t> tokens(64), targets(64);
  loader.fill(0, Split::train, tokens, targets);
  summa::test::CountAllocations count;
  for (std::int64_t step = 0; step < 50; ++step) {
    loader.fill(step, Split::train, tokens, targets);
    loader.fill(step, Split::val, tokens, targets);
  }
  EXPECT_EQ(count.count(), 0u) << count.first_caller();
}

TEST(TokenLoader, OffsetsCoverTheSplit) {
  // The window starts spread over the whole split: each of 8 equal bins of
  // the 1000 possible starts gets a share within 50% of its expectation
  // over 8000 draws (expected 1000 per bin, sd ~30: a loose bound that still
  // fails for a stuck or truncated generator).
  const auto seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  const auto ids = random_ids(1010, 256, gen);
  TokenLoader loader(ids, 256, {.batch = 8, .seq = 10, .seed = seed, .val_fraction = 0});
  std::vector<int> bins(8, 0);
  index_t lo = 1 << 30, hi = -1;
  for (std::int64_t step = 0; step < 1000; ++step)
    for (index_t r = 0; r < 8; ++r) {
      const index_t o = loader.offset(step, r);
      ASSERT_GE(o, 0);
      ASSERT_LT(o, 1000);
      lo = std::min(lo, o);
      hi = std::max(hi, o);
      ++bins[static_cast<std::size_t>(o * 8 / 1000)];
    }
  for (int b : bins) {
    EXPECT_GT(b, 500);
    EXPECT_LT(b, 1500);
  }
  EXPECT_LT(lo, 10);
  EXPECT_GT(hi, 989);
}

TEST(TokenLoader, ValBatchesComeOnlyFromTheValSplit) {
  const auto seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  // Train ids in [0, 128), val ids in [128, 256): a batch's ids tell its split.
  const std::size_t n = 4000;
  const double fraction = 0.3;
  const auto val = static_cast<std::size_t>(std::llround(static_cast<double>(n) * fraction));
  std::vector<std::uint16_t> ids = random_ids(n, 128, gen);
  for (std::size_t i = n - val; i < n; ++i) ids[i] = static_cast<std::uint16_t>(ids[i] + 128);
  const index_t batch = 16, seq = 24;
  TokenLoader loader(ids, 256,
                     {.batch = batch, .seq = seq, .seed = seed, .val_fraction = fraction});
  ASSERT_EQ(loader.val_tokens(), val);
  for (std::int64_t step = 0; step < 50; ++step) {
    const Batch v = loader.batch(step, Split::val);
    const Batch t = loader.batch(step, Split::train);
    for (std::size_t k = 0; k < v.tokens.size(); ++k) {
      ASSERT_GE(v.tokens[k], 128) << "val step " << step;
      ASSERT_GE(v.targets[k], 128) << "val step " << step;
      ASSERT_LT(t.tokens[k], 128) << "train step " << step;
      ASSERT_LT(t.targets[k], 128) << "train step " << step;
    }
  }
}

TEST(TokenLoader, RowsForCoverTheBatchOnce) {
  for (int groups : {1, 2, 4}) {
    for (index_t batch : {4, 8, 12, 20}) {
      std::vector<int> hits(static_cast<std::size_t>(batch), 0);
      index_t expected_begin = 0;
      for (int g = 0; g < groups; ++g) {
        const auto [begin, end] = TokenLoader::rows_for(batch, g, groups);
        EXPECT_EQ(begin, expected_begin) << "contiguous, in group order";
        EXPECT_EQ(end - begin, batch / groups);
        // The rows GptBase::forward gives data group g: [g B/D, (g+1) B/D).
        EXPECT_EQ(begin, g * batch / groups);
        for (index_t r = begin; r < end; ++r) ++hits[static_cast<std::size_t>(r)];
        expected_begin = end;
      }
      for (int h : hits) EXPECT_EQ(h, 1) << "batch " << batch << " groups " << groups;
    }
  }
  EXPECT_ERROR_HAS(TokenLoader::rows_for(6, 0, 4), "batch=6", "divisible", "4");
  EXPECT_ERROR_HAS(TokenLoader::rows_for(3, 1, 2), "batch=3", "divisible");
  EXPECT_ERROR_HAS(TokenLoader::rows_for(8, 2, 2), "data_group=2");
  EXPECT_ERROR_HAS(TokenLoader::rows_for(8, -1, 2), "data_group=-1");
  EXPECT_ERROR_HAS(TokenLoader::rows_for(8, 0, 0), "data_groups=0");
  EXPECT_ERROR_HAS(TokenLoader::rows_for(0, 0, 1), "batch=0");
}

// ---------------------------------------------------------------- bundled corpus

TEST(Corpus, IsAsciiTextOfAtLeast50KB) {
  const fs::path file = fs::path(SUMMA_SOURCE_DIR) / "examples" / "data" / "corpus.txt";
  const auto ids = summa::io::load_tokens(file);
  EXPECT_GE(ids.size(), 50u * 1024u);
  EXPECT_LE(ids.size(), 120u * 1024u);
  std::set<int> distinct;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const int id = ids[i];
    // Printable ASCII plus newline: no tabs, carriage returns or other bytes.
    ASSERT_TRUE(id == '\n' || (id >= 32 && id < 127)) << "byte " << id << " at offset " << i;
    distinct.insert(id);
  }
  EXPECT_GE(distinct.size(), 60u) << "varied text: letters, digits, punctuation";
  // Loads for the demo's shapes with the default validation split.
  TokenLoader loader(ids, ByteTokenizer::padded_vocab(ByteTokenizer::base_vocab, 4),
                     {.batch = 8, .seq = 64});
  const Batch b = loader.batch(0, Split::val);
  EXPECT_EQ(b.tokens.size(), 8u * 64u);
}

}  // namespace

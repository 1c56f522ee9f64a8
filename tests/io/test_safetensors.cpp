// safetensors reading and writing (serial): round trips of random tensors in
// every dtype, the byte-exact layout of hand-written files (read) and of the
// writer's output, every malformed-file case the reader rejects, read_rows
// against slices of read, the 16-bit conversions against an independent
// nearest-value check, and the header's JSON text (escapes, strictness).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "summa/io/safetensors.hpp"
#include "test_util.hpp"

namespace summa::test {
namespace {

namespace fs = std::filesystem;
using io::TensorDType;

// Concatenation (GCC 12 warns falsely about `"literal" + std::string`).
std::string cat(std::initializer_list<std::string_view> parts) {
  std::string out;
  for (std::string_view p : parts) out.append(p);
  return out;
}

std::string le64(std::uint64_t v) {
  std::string s(8, '\0');
  for (int k = 0; k < 8; ++k)
    s[static_cast<std::size_t>(k)] = static_cast<char>((v >> (8 * k)) & 0xFF);
  return s;
}
template <class U>
std::string le_bytes(U v) {
  std::string s(sizeof(U), '\0');
  for (std::size_t k = 0; k < sizeof(U); ++k) s[k] = static_cast<char>((v >> (8 * k)) & 0xFF);
  return s;
}
std::string f32_bytes(float x) {
  return le_bytes(std::bit_cast<std::uint32_t>(x));
}
std::string f64_bytes(double x) {
  return le_bytes(std::bit_cast<std::uint64_t>(x));
}

void write_raw(const fs::path& file, const std::string& bytes) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}
/// header length + header (unpadded) + data.
std::string file_bytes(const std::string& header, const std::string& data) {
  return le64(header.size()) + header + data;
}
std::string read_raw(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

#define EXPECT_ERROR_WITH(statement, needle, file)                                           \
  do {                                                                                       \
    const std::string msg_ = error_of([&] { statement; });                                   \
    EXPECT_NE(msg_.find(needle), std::string::npos) << "message: '" << msg_ << "'";          \
    EXPECT_NE(msg_.find((file).string()), std::string::npos) << "message: '" << msg_ << "'"; \
  } while (0)

// ------------------------------------------------------------------ conversions

// Independent check of a 16-bit rounding: `bits` must decode to a value
// nearest to x among all finite values of the format (ties to the even
// pattern), infinity beyond the rounding boundary of the largest finite one.
void expect_nearest(float x, std::uint16_t bits, float (*decode)(std::uint16_t), float max_finite,
                    float overflow_at, const char* what) {
  const float got = decode(bits);
  if (std::abs(x) >= overflow_at) {
    EXPECT_TRUE(std::isinf(got) && std::signbit(got) == std::signbit(x)) << what << " " << x;
    return;
  }
  ASSERT_TRUE(std::isfinite(got)) << what << " " << x;
  EXPECT_LE(std::abs(got), max_finite);
  EXPECT_EQ(std::signbit(got), std::signbit(x)) << what << " " << x;
  // neighbours of the pattern (same sign) bracket x when rounding is right
  const double err = std::abs(static_cast<double>(got) - x);
  for (int step : {-1, 1}) {
    const auto nb = static_cast<std::uint16_t>(bits + step);
    if ((nb & 0x7FFF) == 0x7FFF || ((bits & 0x7FFF) == 0 && step < 0)) continue;
    const float other = decode(nb);
    if (!std::isfinite(other)) continue;
    const double other_err = std::abs(static_cast<double>(other) - x);
    EXPECT_LE(err, other_err) << what << " " << x;
    if (err == other_err) {
      EXPECT_EQ(bits & 1, 0) << what << " tie must go to even, x=" << x;
    }
  }
}

TEST(Safetensors, SixteenBitConversions) {
  // Known patterns.
  EXPECT_EQ(io::float_to_f16(1.0f), 0x3C00);
  EXPECT_EQ(io::float_to_f16(-2.0f), 0xC000);
  EXPECT_EQ(io::float_to_f16(65504.0f), 0x7BFF);
  EXPECT_EQ(io::float_to_f16(65520.0f), 0x7C00);
  EXPECT_EQ(io::float_to_f16(0x1p-24f), 0x0001);
  EXPECT_EQ(io::float_to_f16(0x1p-25f), 0x0000);
  EXPECT_EQ(io::float_to_f16(0x1.8p-25f), 0x0001);
  EXPECT_EQ(io::float_to_f16(0.1f), 0x2E66);
  EXPECT_EQ(io::float_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(io::float_to_bf16(-1.5f), 0xBFC0);
  EXPECT_EQ(io::bf16_to_float(0x4049), 3.140625f);
  EXPECT_TRUE(std::isnan(io::f16_to_float(io::float_to_f16(std::nanf("")))));
  EXPECT_TRUE(std::isnan(io::bf16_to_float(io::float_to_bf16(std::nanf("")))));
  // Every pattern decodes to the value its fields define and encodes back.
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const int e = (bits >> 10) & 0x1F, m = bits & 0x3FF;
    const double sign = (bits & 0x8000) ? -1.0 : 1.0;
    const float h = io::f16_to_float(bits);
    if (e == 31) {
      EXPECT_TRUE(m == 0 ? std::isinf(h) : std::isnan(h)) << b;
    } else {
      const double want = e == 0 ? sign * std::ldexp(m, -24) : sign * std::ldexp(1024 + m, e - 25);
      EXPECT_EQ(static_cast<double>(h), want) << b;
      EXPECT_EQ(io::float_to_f16(h), bits) << b;
    }
    const float bf = io::bf16_to_float(bits);
    EXPECT_EQ(std::bit_cast<std::uint32_t>(bf), b << 16);
    if (!std::isnan(bf)) {
      EXPECT_EQ(io::float_to_bf16(bf), bits) << b;
    }
  }
  // Random floats (every magnitude, halfway cases included) round to nearest, ties to even.
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<std::uint32_t> any;
  for (int i = 0; i < 200000; ++i) {
    std::uint32_t raw = any(gen);
    if (i % 4 == 0) raw = (raw & 0xFFFFE000u) | 0x1000u;  // exactly halfway for f16 normals
    if (i % 4 == 1) raw = (raw & 0xFFFF0000u) | 0x8000u;  // exactly halfway for bf16
    if (i % 8 == 2)
      raw = (raw & 0x807FFFFFu) | ((100u + (raw >> 27)) << 23);  // f16 subnormal range
    const float x = std::bit_cast<float>(raw);
    if (!std::isfinite(x)) continue;
    expect_nearest(x, io::float_to_f16(x), io::f16_to_float, 65504.0f, 65520.0f, "f16");
    expect_nearest(x, io::float_to_bf16(x), io::bf16_to_float, 0x1.FEp127f, 0x1.FFp127f, "bf16");
    if (::testing::Test::HasFailure()) break;
  }
}

// ------------------------------------------------------------------ round trip

template <class Src>
std::vector<Src> random_values(std::size_t n, std::mt19937_64& gen) {
  std::normal_distribution<double> dist(0.0, 3.0);
  std::vector<Src> v(n);
  for (auto& x : v) x = static_cast<Src>(dist(gen));
  return v;
}

template <class T>
T expected_after(TensorDType dtype, double x_in_src, bool src_is_float) {
  const double x = src_is_float ? static_cast<double>(static_cast<float>(x_in_src)) : x_in_src;
  switch (dtype) {
    case TensorDType::f32:
      return static_cast<T>(static_cast<float>(x));
    case TensorDType::f64:
      return static_cast<T>(x);
    case TensorDType::bf16:
      return static_cast<T>(io::bf16_to_float(io::float_to_bf16(static_cast<float>(x))));
    case TensorDType::f16:
      return static_cast<T>(io::f16_to_float(io::float_to_f16(static_cast<float>(x))));
    default:
      return T(0);
  }
}

TEST(Safetensors, RoundTripEveryDtype) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  TempDir dir;
  const fs::path file = dir / "round.safetensors";
  const std::vector<std::vector<index_t>> shapes = {{3, 5}, {7}, {}, {0, 4}, {2, 3, 4}, {1, 1}};
  const TensorDType dtypes[] = {TensorDType::f32, TensorDType::f64, TensorDType::bf16,
                                TensorDType::f16};
  std::vector<std::vector<float>> float_data;
  std::vector<std::vector<double>> double_data;
  std::vector<io::TensorEntry> entries;
  struct Expect {
    std::string name;
    TensorDType dtype;
    std::vector<index_t> shape;
    bool from_float;
    std::size_t index;
  };
  std::vector<Expect> expects;
  float_data.reserve(64);
  double_data.reserve(64);
  int k = 0;
  for (TensorDType dtype : dtypes)
    for (const auto& shape : shapes)
      for (bool from_float : {true, false}) {
        index_t n = 1;
        for (index_t d : shape) n *= d;
        const std::string name =
            cat({"t", std::to_string(100 - k++), ".", io::safetensors_name(dtype)});
        if (from_float) {
          float_data.push_back(random_values<float>(static_cast<std::size_t>(n), gen));
          entries.push_back({{name, shape, dtype}, std::span<const float>(float_data.back())});
          expects.push_back({name, dtype, shape, true, float_data.size() - 1});
        } else {
          double_data.push_back(random_values<double>(static_cast<std::size_t>(n), gen));
          entries.push_back({{name, shape, dtype}, std::span<const double>(double_data.back())});
          expects.push_back({name, dtype, shape, false, double_data.size() - 1});
        }
      }
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "a \"quoted\" \\ é"}};
  io::write_safetensors(file, entries, meta);
  // no temporary left behind
  int files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path())) ++files;
  EXPECT_EQ(files, 1);

  const std::string raw = read_raw(file);
  std::uint64_t header_len = 0;
  for (int b = 7; b >= 0; --b)
    header_len = (header_len << 8) | static_cast<unsigned char>(raw[static_cast<std::size_t>(b)]);
  EXPECT_EQ((8 + header_len) % 8, 0u) << "data buffer must start 8-byte aligned";

  io::SafetensorsFile in(file);
  EXPECT_EQ(in.metadata(), meta);
  ASSERT_EQ(in.tensors().size(), entries.size());
  for (std::size_t i = 1; i < in.tensors().size(); ++i)
    EXPECT_LT(in.tensors()[i - 1].name, in.tensors()[i].name);
  // data laid out in name order, back to back
  std::uint64_t offset = 0;
  for (const io::TensorInfo& t : in.tensors()) {
    EXPECT_EQ(t.data_begin, offset) << t.name;
    offset = t.data_end;
  }
  EXPECT_EQ(8 + header_len + offset, raw.size());
  for (const Expect& e : expects) {
    SCOPED_TRACE(e.name);
    ASSERT_TRUE(in.contains(e.name));
    const io::TensorInfo& info = in.info(e.name);
    EXPECT_EQ(info.dtype, e.dtype);
    EXPECT_EQ(info.shape, e.shape);
    const auto got_f = in.read<float>(e.name);
    const auto got_d = in.read<double>(e.name);
    ASSERT_EQ(got_f.size(), got_d.size());
    for (std::size_t i = 0; i < got_d.size(); ++i) {
      const double src =
          e.from_float ? static_cast<double>(float_data[e.index][i]) : double_data[e.index][i];
      EXPECT_EQ(got_d[i], expected_after<double>(e.dtype, src, e.from_float)) << i;
      EXPECT_EQ(got_f[i], expected_after<float>(e.dtype, src, e.from_float)) << i;
    }
  }
}

// ------------------------------------------------------------------ byte-exact layout

TEST(Safetensors, HandWrittenFileReadsBack) {
  TempDir dir;
  const fs::path file = dir / "hand.safetensors";
  // Tensors out of name order in the header, data not in header order,
  // metadata last, header padded with spaces.
  std::string header = R"({"b":{"dtype":"F64","shape":[1],"data_offsets":[8,16]},)"
                       R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                       R"("c":{"dtype":"BF16","shape":[2,1],"data_offsets":[16,20]},)"
                       R"("d":{"dtype":"F16","shape":[3],"data_offsets":[20,26]},)"
                       R"("e":{"dtype":"I64","shape":[1],"data_offsets":[26,34]},)"
                       R"("__metadata__":{"k":"v","format":"pt"}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  const std::string data = f32_bytes(1.5f) + f32_bytes(-2.0f) + f64_bytes(3.25) +
                           le_bytes<std::uint16_t>(0x3FC0) + le_bytes<std::uint16_t>(0xC0A0) +
                           le_bytes<std::uint16_t>(0x3C00) + le_bytes<std::uint16_t>(0x0001) +
                           le_bytes<std::uint16_t>(0xFC00) + le_bytes<std::uint64_t>(7);
  write_raw(file, file_bytes(header, data));

  io::SafetensorsFile in(file);
  EXPECT_EQ(in.data_start(), 8 + header.size());
  EXPECT_EQ(in.metadata().at("k"), "v");
  ASSERT_EQ(in.tensors().size(), 5u);
  EXPECT_EQ(in.tensors()[0].name, "a");
  EXPECT_EQ(in.info("c").rows(), 2);
  EXPECT_EQ(in.info("c").row_elements(), 1);
  EXPECT_EQ(in.read<double>("a"), (std::vector<double>{1.5, -2.0}));
  EXPECT_EQ(in.read<float>("b"), (std::vector<float>{3.25f}));
  EXPECT_EQ(in.read<double>("c"), (std::vector<double>{1.5, -5.0}));
  const auto d = in.read<double>("d");
  EXPECT_EQ(d[0], 1.0);
  EXPECT_EQ(d[1], std::ldexp(1.0, -24));
  EXPECT_TRUE(std::isinf(d[2]) && d[2] < 0);
  EXPECT_EQ(in.info("e").dtype, TensorDType::other);
  EXPECT_EQ(in.info("e").dtype_name, "I64");
  EXPECT_ERROR_WITH(in.read<double>("e"), "cannot convert", file);
}

TEST(Safetensors, WriterLayoutIsByteExact) {
  TempDir dir;
  const fs::path file = dir / "exact.safetensors";
  const std::vector<float> a = {1.5f, -2.0f};
  const std::vector<double> b = {3.25};
  const std::vector<double> c = {1.5, -5.0};
  io::write_safetensors(file,
                        {{{"b", {1}, TensorDType::f64}, std::span<const double>(b)},
                         {{"c", {2, 1}, TensorDType::bf16}, std::span<const double>(c)},
                         {{"a", {2}, TensorDType::f32}, std::span<const float>(a)}},
                        {{"k", "v"}});
  std::string header = R"({"__metadata__":{"k":"v"},)"
                       R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                       R"("b":{"dtype":"F64","shape":[1],"data_offsets":[8,16]},)"
                       R"("c":{"dtype":"BF16","shape":[2,1],"data_offsets":[16,20]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  const std::string want =
      file_bytes(header, f32_bytes(1.5f) + f32_bytes(-2.0f) + f64_bytes(3.25) +
                             le_bytes<std::uint16_t>(0x3FC0) + le_bytes<std::uint16_t>(0xC0A0));
  EXPECT_EQ(read_raw(file), want);
}

// ------------------------------------------------------------------ malformed files

TEST(Safetensors, MalformedFilesAreRejected) {
  TempDir dir;
  int n = 0;
  const auto bad = [&](const std::string& bytes) {
    const fs::path f = dir / ("bad" + std::to_string(n++) + ".safetensors");
    write_raw(f, bytes);
    return f;
  };
  const auto entry = [](const std::string& name, const std::string& dtype, const std::string& shape,
                        const std::string& offsets) {
    return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
           ",\"data_offsets\":" + offsets + "}";
  };
  const std::string eight(8, 'x'), sixteen(16, 'x');
  fs::path f;

  f = dir / "missing.safetensors";
  EXPECT_ERROR_WITH(io::SafetensorsFile{f}, "no such file", f);
  f = bad("");
  EXPECT_ERROR_WITH(io::SafetensorsFile{f}, "shorter than the 8-byte", f);
  f = bad("12345");
  EXPECT_ERROR_WITH(io::SafetensorsFile{f}, "shorter than the 8-byte", f);
  f = bad(le64(200'000'000) + "{}");
  EXPECT_ERROR_WITH(io::SafetensorsFile{f}, "larger than the limit", f);
  f = bad(le64(100) + "{}");
  EXPECT_ERROR_WITH(io::SafetensorsFile{f}, "larger than the file", f);
  f = bad(file_bytes("{\"a\":", ""));
  EXPECT_ERROR_WITH(io::SafetensorsFile{f}, "not valid JSON", f);
  f = bad(file_bytes("{\"a\":1,}", ""));
  EXPECT_ERROR_WITH(io::SafetensorsFile{f}, "not valid JSON", f);
  f = bad(file_bytes("{} x", ""));
  EXPECT_ERROR_WITH(io::SafetensorsFile{f}, "not valid JSON", f);
  f = bad(file_bytes("{\"\xff\":1}", ""));
  EXPECT_ERROR_WITH(io::SafetensorsFile{f}, "UTF-8", f);
  f = bad(file_bytes(std::string(200, '[') + std::string(200, ']'), ""));
  EXPECT_ERROR_WITH(io::SafetensorsFile{f}, "nesting", f);
  f = bad(file_bytes("[1,2]", ""));
  EXPECT_ERROR_WITH(io::SafetensorsFile{f}, "not a JSON object", f);
  f = bad(file_bytes("{" + entry("a", "F33", "[2]", "[0,8]") + "}", eight));
  EXPECT_ERROR_WITH(io::SafetensorsFile{f}, "unknown dtype \"F33\"", f);
  f = bad(file_bytes("{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", eight));
  EXPECT_ERROR_WITH(io::SafetensorsFile{f}, "dtype", f);
  f = bad(file_bytes("{" + entry("a", "F32", "[-2]", "[0,8]") + "}", eight));
  EXPECT_ERROR_WITH(io::SafetensorsFile{f}, "non-negative integer", f);
  f = bad(file_bytes("{" + entry("a", "F32", "[2.0]", "[0,8]") + "}", eight));
  EXPECT_ERROR_WITH(io::SafetensorsFile{f}, "non-negative integer", f);
  f = bad(file_bytes("{" + entry("a", "F32", "[\"2\"]", "[0,8]") + "}", eight));
  EXPECT_ERROR_WITH(io::SafetensorsFile{f}, "non-negative integer", f);
  f = bad(file_bytes("{" + entry("a", "F32", "2", "[0,8]") + "}", eight));
  EXPECT_ERROR_WITH(io::SafetensorsFile{f}, "shape", f);
  f = bad(file_bytes("{" + entry("a", "F32", "[99999999999,99999999999]", "[0,8]") + "}", eight));
  EXPECT_ERROR_WITH(io::SafetensorsFile{f}, "too large", f);
  f = bad(file_bytes("{" + entry("a", "F32", "[2]", "[0,16]") + "}", eight));
  EXPECT_ERROR_WITH(io::SafetensorsFile{f}, "outside the data buffer", f);
  f = bad(file_bytes("{" + entry("a", "F32", "[2]", "[8,0]") + "}", eight));
  EXPECT_ERROR_WITH(io::SafetensorsFile{f}, "end < begin", f);
  f = bad(file_bytes("{" + entry("a", "F32", "[2]", "[0,-8]") + "}", eight));
  EXPECT_ERROR_WITH(io::SafetensorsFile{f}, "non-negative integers", f);
  f = bad(file_bytes("{" + entry("a", "F32", "[2]", "[0]") + "}", eight));
  EXPECT_ERROR_WITH(io::SafetensorsFile{f}, "data_offsets", f);
  f = bad(file_bytes("{" + entry("a", "F32", "[3]", "[0,8]") + "}", sixteen));
  EXPECT_ERROR_WITH(io::SafetensorsFile{f}, "needs 12 bytes", f);
  f = bad(file_bytes(
      "{" + entry("a", "F32", "[2]", "[0,8]") + "," + entry("b", "F32", "[2]", "[4,12]") + "}",
      sixteen));
  EXPECT_ERROR_WITH(io::SafetensorsFile{f}, "overlap", f);
  f = bad(file_bytes(
      "{" + entry("a", "F32", "[2]", "[0,8]") + "," + entry("a", "F32", "[2]", "[8,16]") + "}",
      sixteen));
  EXPECT_ERROR_WITH(io::SafetensorsFile{f}, "duplicate key \"a\" at the top level", f);
  f = bad(file_bytes("{\"__metadata__\":{\"k\":1}}", ""));
  EXPECT_ERROR_WITH(io::SafetensorsFile{f}, "must be a string", f);
  f = bad(file_bytes("{\"__metadata__\":[]}", ""));
  EXPECT_ERROR_WITH(io::SafetensorsFile{f}, "__metadata__", f);
  f = bad(file_bytes("{\"a\":[]}", ""));
  EXPECT_ERROR_WITH(io::SafetensorsFile{f}, "must be an object", f);

  // A good file, then errors on reading it.
  f = bad(file_bytes("{" + entry("a", "F32", "[2,2]", "[0,16]") + "}", sixteen));
  io::SafetensorsFile ok(f);
  std::vector<double> three(3), two(2);
  EXPECT_ERROR_WITH(ok.read<double>("nope", std::span<double>(three)), "no tensor named \"nope\"",
                    f);
  EXPECT_ERROR_WITH(ok.read<double>("a", std::span<double>(three)), "into 3 elements", f);
  EXPECT_ERROR_WITH(ok.read_rows<double>("a", 1, 2, std::span<double>(three)), "outside", f);
  EXPECT_ERROR_WITH(ok.read_rows<double>("a", -1, 1, std::span<double>(two)), "outside", f);
  EXPECT_ERROR_WITH(ok.read_rows<double>("a", 0, 1, std::span<double>(three)), "into 3 elements",
                    f);
  // The file changed under the reader: a truncated buffer is reported, not read past.
  write_raw(f, file_bytes("{" + entry("a", "F32", "[2,2]", "[0,16]") + "}", eight));
  std::vector<double> four(4);
  EXPECT_ERROR_WITH(ok.read<double>("a", std::span<double>(four)), "failed", f);
}

TEST(Safetensors, WriterRejectsBadInputAndLeavesOldFile) {
  TempDir dir;
  const fs::path file = dir / "w.safetensors";
  const std::vector<float> two = {1, 2};
  io::write_safetensors(file, {{{"x", {2}, TensorDType::f32}, std::span<const float>(two)}});
  const std::string before = read_raw(file);
  EXPECT_ERROR_WITH(
      io::write_safetensors(file, {{{"x", {3}, TensorDType::f32}, std::span<const float>(two)}}),
      "3 elements", file);
  EXPECT_ERROR_WITH(
      io::write_safetensors(file, {{{"x", {2}, TensorDType::f32}, std::span<const float>(two)},
                                   {{"x", {2}, TensorDType::f32}, std::span<const float>(two)}}),
      "duplicate", file);
  EXPECT_ERROR_WITH(io::write_safetensors(file, {{{"__metadata__", {2}, TensorDType::f32},
                                                  std::span<const float>(two)}}),
                    "reserved", file);
  EXPECT_ERROR_WITH(
      io::write_safetensors(file, {{{"x", {-2}, TensorDType::f32}, std::span<const float>(two)}}),
      "negative", file);
  EXPECT_ERROR_WITH(
      io::write_safetensors(file, {{{"x", {2}, TensorDType::other}, std::span<const float>(two)}}),
      "unsupported dtype", file);
  {
    io::SafetensorsWriter w(file, {{"x", {2}, TensorDType::f32}, {"y", {1}, TensorDType::f64}});
    w.write<float>("x", two);
    EXPECT_ERROR_WITH(w.write<float>("x", two), "twice", file);
    EXPECT_ERROR_WITH(w.write<float>("z", two), "not declared", file);
    EXPECT_ERROR_WITH(w.commit(), "\"y\" was never written", file);
  }  // abandoned: the temporary file goes away
  EXPECT_EQ(read_raw(file), before);
  int files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path())) ++files;
  EXPECT_EQ(files, 1);
  const fs::path nodir = dir / "no_such_dir" / "f.safetensors";
  EXPECT_ERROR_WITH(io::write_safetensors(nodir, {}), "cannot create", nodir);
}

// ------------------------------------------------------------------ read_rows

TEST(Safetensors, ReadRowsEqualsSliceOfRead) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  TempDir dir;
  const fs::path file = dir / "rows.safetensors";
  const std::vector<std::vector<index_t>> shapes = {{7, 5}, {4, 3, 2}, {6}, {1, 9}, {0, 3}};
  const TensorDType dtypes[] = {TensorDType::f32, TensorDType::bf16, TensorDType::f64,
                                TensorDType::f16, TensorDType::f32};
  std::vector<std::vector<double>> data;
  data.reserve(shapes.size());
  std::vector<io::TensorEntry> entries;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    index_t n = 1;
    for (index_t d : shapes[i]) n *= d;
    data.push_back(random_values<double>(static_cast<std::size_t>(n), gen));
    entries.push_back({{cat({"t", std::to_string(i)}), shapes[i], dtypes[i]},
                       std::span<const double>(data.back())});
  }
  io::write_safetensors(file, entries);
  io::SafetensorsFile in(file);
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const std::string name = cat({"t", std::to_string(i)});
    SCOPED_TRACE(name);
    const io::TensorInfo& t = in.info(name);
    const auto whole = in.read<double>(name);
    const auto whole_f = in.read<float>(name);
    const index_t rows = t.rows(), width = t.row_elements();
    EXPECT_EQ(rows, shapes[i].size() >= 2 ? shapes[i][0] : 1);
    for (index_t begin = 0; begin <= rows; ++begin)
      for (index_t count = 0; begin + count <= rows; ++count) {
        std::vector<double> got(static_cast<std::size_t>(count * width));
        std::vector<float> got_f(got.size());
        in.read_rows<double>(name, begin, count, got);
        in.read_rows<float>(name, begin, count, got_f);
        for (std::size_t k = 0; k < got.size(); ++k) {
          EXPECT_EQ(got[k], whole[static_cast<std::size_t>(begin * width) + k]);
          EXPECT_EQ(got_f[k], whole_f[static_cast<std::size_t>(begin * width) + k]);
        }
      }
  }
}

// ------------------------------------------------------------------ JSON text

// The header's JSON (nlohmann_json underneath): escapes of every kind in
// names and metadata read back decoded; the writer escapes what it must and
// reads back; what the format forbids is refused.
TEST(Safetensors, HeaderJsonTextAndStrictness) {
  TempDir dir;
  const std::string eight(8, 'x');
  const fs::path hand = dir / "escapes.safetensors";
  write_raw(hand, file_bytes(R"({"a\"b\\c\/\n\u00e9\ud83d\ude00":)"
                             R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"( "__metadata__" : {"k\t" : "v\u0001"} } )",
                             eight));
  const io::SafetensorsFile in(hand);
  ASSERT_EQ(in.tensors().size(), 1u);
  EXPECT_EQ(in.tensors()[0].name, "a\"b\\c/\n\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_EQ(in.metadata().at("k\t"), "v\x01");

  // The writer's escaping reads back; its header is valid JSON text.
  const fs::path written = dir / "tricky.safetensors";
  const std::string tricky = "q\"b\\s\n\t\x01 \xc3\xa9\x7f";
  const std::vector<float> two = {1, 2};
  io::write_safetensors(written, {{{tricky, {2}, TensorDType::f32}, std::span<const float>(two)}},
                        {{tricky, tricky}});
  const io::SafetensorsFile back(written);
  EXPECT_EQ(back.tensors()[0].name, tricky);
  EXPECT_EQ(back.metadata().at(tricky), tricky);
  EXPECT_EQ(back.read<float>(tricky), two);
  EXPECT_ERROR_WITH(io::write_safetensors(written, {{{"bad\xff", {2}, TensorDType::f32},
                                                     std::span<const float>(two)}}),
                    "UTF-8", written);
  EXPECT_EQ(io::SafetensorsFile(written).tensors()[0].name, tricky);  // the old file stays

  int n = 0;
  const auto bad = [&](const std::string& header) {
    const fs::path f = dir / ("bad" + std::to_string(n++) + ".safetensors");
    write_raw(f, file_bytes(header, eight));
    return f;
  };
  fs::path f = bad(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                   R"("__metadata__":{"k":"1","k":"2"}})");
  EXPECT_ERROR_WITH(io::SafetensorsFile{f}, "duplicate key \"k\" in \"__metadata__\"", f);
  f = bad(R"({"a":{"dtype":"F32","dtype":"F64","shape":[2],"data_offsets":[0,8]}})");
  EXPECT_ERROR_WITH(io::SafetensorsFile{f}, "duplicate key \"dtype\" in \"a\"", f);
  f = bad(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,123456789012345678901]}})");
  EXPECT_ERROR_WITH(io::SafetensorsFile{f}, "non-negative integers", f);
  f = bad(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8.0]}})");
  EXPECT_ERROR_WITH(io::SafetensorsFile{f}, "non-negative integers", f);
  f = bad(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8e0]}})");
  EXPECT_ERROR_WITH(io::SafetensorsFile{f}, "non-negative integers", f);
  for (const char* text :
       {"", "{", "{\"a\":[1,]}", "{\"a\":01}", "{\"a\":1.}", "{\"a\":-}", "{\"abc", "{\"\\x\":1}",
        "{\"a\":tru}", "{1:2}", "{\"\\ud800\":1}", "{\"a\nb\":1}", "{\"a\":nul}", "{} {}"}) {
    SCOPED_TRACE(text);
    f = bad(text);
    EXPECT_ERROR_WITH(io::SafetensorsFile{f}, "not valid JSON", f);
  }
}

}  // namespace
}  // namespace summa::test

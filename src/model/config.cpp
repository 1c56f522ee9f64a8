#include "summa/model/config.hpp"

#include <fmt/format.h>

#include <array>
#include <cmath>
#include <numbers>
#include <optional>
#include <utility>

#include "summa/core/error.hpp"
#include "summa/model/init.hpp"

namespace summa {

namespace {

// ---------------------------------------------------------------- names and shapes

enum class InitKind : std::uint8_t { normal, residual_normal, zeros, ones };

// One per-layer tensor: its suffix after "h.{i}.", its shape in multiples of
// n_embd (rows = 0: a 1-D tensor of `cols` elements) and its initialisation.
struct Slot {
  std::string_view suffix;
  int rows;
  int cols;
  InitKind kind;
};
constexpr std::array<Slot, 12> kSlots{{
    {"ln_1.weight", 0, 1, InitKind::ones},
    {"ln_1.bias", 0, 1, InitKind::zeros},
    {"attn.c_attn.weight", 1, 3, InitKind::normal},
    {"attn.c_attn.bias", 0, 3, InitKind::zeros},
    {"attn.c_proj.weight", 1, 1, InitKind::residual_normal},
    {"attn.c_proj.bias", 0, 1, InitKind::zeros},
    {"ln_2.weight", 0, 1, InitKind::ones},
    {"ln_2.bias", 0, 1, InitKind::zeros},
    {"mlp.c_fc.weight", 1, 4, InitKind::normal},
    {"mlp.c_fc.bias", 0, 4, InitKind::zeros},
    {"mlp.c_proj.weight", 4, 1, InitKind::residual_normal},
    {"mlp.c_proj.bias", 0, 1, InitKind::zeros},
}};
constexpr std::size_t kPerLayer = kSlots.size();
static_assert(kPerLayer == kParamsPerBlock);
constexpr double kInitStd = 0.02;

// A parameter found by name: its position in parameter_list(), 2-D shape
// (rows = 1 for 1-D tensors), dimensionality and initialisation.
struct Spec {
  std::size_t index = 0;
  index_t rows = 1;
  index_t cols = 0;
  bool two_d = false;
  InitKind kind = InitKind::zeros;
};

// Parses a parameter name without allocating; nullopt when the config has no
// such tensor. The config must be valid.
std::optional<Spec> find_spec(std::string_view name, const GptConfig& c) {
  const index_t h = c.n_embd;
  const auto n_layer = static_cast<std::size_t>(c.n_layer);
  if (name == "wte.weight") return Spec{0, c.vocab_size, h, true, InitKind::normal};
  if (name == "wpe.weight") return Spec{1, c.n_positions, h, true, InitKind::normal};
  const std::size_t last = 2 + kPerLayer * n_layer;
  if (name == "ln_f.weight") return Spec{last, 1, h, false, InitKind::ones};
  if (name == "ln_f.bias") return Spec{last + 1, 1, h, false, InitKind::zeros};
  if (!name.starts_with("h.")) return std::nullopt;
  name.remove_prefix(2);
  std::size_t layer = 0, digits = 0;
  while (digits < name.size() && name[digits] >= '0' && name[digits] <= '9') {
    if (digits == 1 && name[0] == '0') return std::nullopt;  // no leading zeros
    layer = layer * 10 + static_cast<std::size_t>(name[digits] - '0');
    if (layer >= n_layer) return std::nullopt;
    ++digits;
  }
  if (digits == 0 || digits >= name.size() || name[digits] != '.') return std::nullopt;
  name.remove_prefix(digits + 1);
  for (std::size_t k = 0; k < kPerLayer; ++k)
    if (kSlots[k].suffix == name) {
      const Slot& s = kSlots[k];
      return Spec{2 + kPerLayer * layer + k, s.rows == 0 ? 1 : s.rows * h, s.cols * h, s.rows != 0,
                  s.kind};
    }
  return std::nullopt;
}

Spec require_spec(std::string_view name, const GptConfig& c, const char* what) {
  auto spec = find_spec(name, c);
  require(spec.has_value(), [&] {
    return fmt::format("{}: no parameter named '{}' (n_layer={})", what, name, c.n_layer);
  });
  return *spec;
}

double init_std(InitKind kind, const GptConfig& c) {
  return kind == InitKind::residual_normal ? kInitStd / std::sqrt(2.0 * c.n_layer) : kInitStd;
}

// ---------------------------------------------------------------- counter-based generator

constexpr std::uint64_t kGamma = 0x9E3779B97F4A7C15ULL;

constexpr std::uint64_t mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

constexpr std::uint64_t fnv1a64(std::string_view s) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (char ch : s) {
    h ^= static_cast<unsigned char>(ch);
    h *= 0x100000001b3ULL;
  }
  return h;
}

std::uint64_t stream_key(std::uint64_t seed, std::string_view name) {
  return mix(mix(seed + kGamma) ^ fnv1a64(name));
}

double normal_at(std::uint64_t key, std::uint64_t index) {
  constexpr double kTwoPow53 = 1.0 / 9007199254740992.0;  // 2^-53
  const std::uint64_t c = 2 * index + 1;
  const double u0 = static_cast<double>((mix(key + c * kGamma) >> 11) + 1) * kTwoPow53;
  const double u1 = static_cast<double>((mix(key + (c + 1) * kGamma) >> 11) + 1) * kTwoPow53;
  return std::sqrt(-2.0 * std::log(u0)) * std::cos(2.0 * std::numbers::pi * u1);
}

// Fills element values for flat indices first .. first + n - 1 through
// `put(i, value)`.
template <class Put>
void generate(std::uint64_t seed, std::string_view name, const Spec& spec, const GptConfig& c,
              index_t first, index_t n, Put&& put) {
  switch (spec.kind) {
    case InitKind::zeros:
      for (index_t i = 0; i < n; ++i) put(i, 0.0);
      return;
    case InitKind::ones:
      for (index_t i = 0; i < n; ++i) put(i, 1.0);
      return;
    case InitKind::normal:
    case InitKind::residual_normal: {
      const double sd = init_std(spec.kind, c);
      const std::uint64_t key = stream_key(seed, name);
      for (index_t i = 0; i < n; ++i)
        put(i, sd * normal_at(key, static_cast<std::uint64_t>(first + i)));
      return;
    }
  }
}

}  // namespace

// ---------------------------------------------------------------- config and parameters

void GptConfig::validate() const {
  const std::pair<const char*, int> fields[] = {{"n_layer", n_layer},
                                                {"n_head", n_head},
                                                {"n_embd", n_embd},
                                                {"n_positions", n_positions},
                                                {"vocab_size", vocab_size}};
  for (const auto& [field, value] : fields)
    require(value > 0,
            [&] { return fmt::format("GptConfig: {}={} must be positive", field, value); });
  require(n_embd % n_head == 0, [&] {
    return fmt::format("GptConfig: n_embd={} not divisible by n_head={}", n_embd, n_head);
  });
  require(std::isfinite(layer_norm_epsilon) && layer_norm_epsilon > 0, [&] {
    return fmt::format("GptConfig: layer_norm_epsilon={} must be positive and finite",
                       layer_norm_epsilon);
  });
}

index_t ParamInfo::size() const {
  index_t n = 1;
  for (index_t d : shape) n *= d;
  return n;
}

std::vector<ParamInfo> parameter_list(const GptConfig& config) {
  config.validate();
  const index_t h = config.n_embd;
  std::vector<ParamInfo> list;
  list.reserve(4 + kPerLayer * static_cast<std::size_t>(config.n_layer));
  list.push_back({"wte.weight", {config.vocab_size, h}});
  list.push_back({"wpe.weight", {config.n_positions, h}});
  for (int i = 0; i < config.n_layer; ++i)
    for (const Slot& s : kSlots) {
      std::vector<index_t> shape;
      if (s.rows != 0) shape.push_back(s.rows * h);
      shape.push_back(s.cols * h);
      list.push_back({fmt::format("h.{}.{}", i, s.suffix), std::move(shape)});
    }
  list.push_back({"ln_f.weight", {h}});
  list.push_back({"ln_f.bias", {h}});
  return list;
}

index_t parameter_count(const GptConfig& config) {
  index_t n = 0;
  for (const ParamInfo& p : parameter_list(config)) n += p.size();
  return n;
}

// ---------------------------------------------------------------- initialisation

double init_normal(std::uint64_t seed, std::string_view name, std::uint64_t index) {
  return normal_at(stream_key(seed, name), index);
}

double init_value(std::uint64_t seed, std::string_view name, index_t index,
                  const GptConfig& config) {
  config.validate();
  const Spec spec = require_spec(name, config, "init_value");
  const index_t size = spec.rows * spec.cols;
  require(index >= 0 && index < size, [&] {
    return fmt::format("init_value: index {} outside {} ({} elements)", index, name, size);
  });
  double value = 0;
  generate(seed, name, spec, config, index, 1, [&](index_t, double v) { value = v; });
  return value;
}

template <class T>
void init_fill(std::uint64_t seed, std::string_view name, index_t first, std::span<T> out,
               const GptConfig& config) {
  config.validate();
  const Spec spec = require_spec(name, config, "init_fill");
  const index_t size = spec.rows * spec.cols;
  const auto n = static_cast<index_t>(out.size());
  require(first >= 0 && first <= size && n <= size - first, [&] {
    return fmt::format("init_fill: range [{}, {}) outside {} ({} elements)", first, first + n, name,
                       size);
  });
  generate(seed, name, spec, config, first, n,
           [&](index_t i, double v) { out[static_cast<std::size_t>(i)] = static_cast<T>(v); });
}

template <class T>
void init_fill_block(std::uint64_t seed, std::string_view name, index_t row0, index_t col0,
                     MatrixView<T> block, const GptConfig& config) {
  config.validate();
  const Spec spec = require_spec(name, config, "init_fill_block");
  block.check_layout("init_fill_block");
  require(
      row0 >= 0 && col0 >= 0 && row0 <= spec.rows - block.rows && col0 <= spec.cols - block.cols,
      [&] {
        return fmt::format("init_fill_block: block {}x{} at ({}, {}) outside {} seen as {}x{}",
                           block.rows, block.cols, row0, col0, name, spec.rows, spec.cols);
      });
  for (index_t i = 0; i < block.rows; ++i)
    generate(seed, name, spec, config, (row0 + i) * spec.cols + col0, block.cols,
             [&](index_t j, double v) { block(i, j) = static_cast<T>(v); });
}

std::size_t parameter_index(std::string_view name, const GptConfig& config, const char* what) {
  return require_spec(name, config, what).index;
}

template void init_fill<float>(std::uint64_t, std::string_view, index_t, std::span<float>,
                               const GptConfig&);
template void init_fill<double>(std::uint64_t, std::string_view, index_t, std::span<double>,
                                const GptConfig&);
template void init_fill_block<float>(std::uint64_t, std::string_view, index_t, index_t,
                                     MatrixView<float>, const GptConfig&);
template void init_fill_block<double>(std::uint64_t, std::string_view, index_t, index_t,
                                      MatrixView<double>, const GptConfig&);

}  // namespace summa

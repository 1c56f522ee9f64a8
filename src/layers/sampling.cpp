#include "summa/layers/sampling.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <string>

#include "summa/core/bf16.hpp"
#include "summa/core/error.hpp"

namespace summa {

namespace {

constexpr double kFixedOne = 1099511627776.0;  // 2^40
// Largest vocabulary whose fixed-point mass fits in 64 bits (2^64 / 2^40).
constexpr index_t kMaxVocab = index_t{1} << 23;

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

template <class T>
double as_double(T v) {
  if constexpr (std::is_same_v<T, bf16>)
    return static_cast<double>(static_cast<float>(v));
  else
    return static_cast<double>(v);
}

// A token of a row: its (scaled) logit and id, ordered logit descending, id
// ascending (the canonical order every rank sorts by).
struct Scored {
  double value;
  double id;  // exact below 2^53; -1 pads
};
bool before(const Scored& a, const Scored& b) {
  return a.value > b.value || (a.value == b.value && a.id < b.id);
}

// The best of `n` pairs (value, id) laid out [rank][row][pair] for `row`.
Scored best_of(const std::vector<double>& gathered, int ranks, index_t rows, index_t row) {
  Scored best{-std::numeric_limits<double>::infinity(), -1};
  for (int r = 0; r < ranks; ++r) {
    const std::size_t at = (static_cast<std::size_t>(r) * static_cast<std::size_t>(rows) +
                            static_cast<std::size_t>(row)) *
                           2;
    const Scored s{gathered[at], gathered[at + 1]};
    if (s.id >= 0 && (best.id < 0 || before(s, best))) best = s;
  }
  return best;
}

}  // namespace

std::string check_sampling(const SamplingOptions& o) {
  if (!(std::isfinite(o.temperature) && o.temperature >= 0))
    return fmt::format("sampling: temperature={} must be finite and >= 0", o.temperature);
  if (o.top_k < 0) return fmt::format("sampling: top_k={} must be >= 0 (0: all)", o.top_k);
  if (!(o.top_p > 0 && o.top_p <= 1))
    return fmt::format("sampling: top_p={} must be in (0, 1] (1: all)", o.top_p);
  return {};
}

double gumbel_noise(std::uint64_t seed, std::uint64_t step, std::uint64_t key, std::int64_t id) {
  const std::uint64_t h = splitmix64(
      seed ^ splitmix64(step ^ splitmix64(key ^ splitmix64(static_cast<std::uint64_t>(id)))));
  const double u = (static_cast<double>(h >> 11) + 0.5) * 0x1.0p-53;  // in (0, 1)
  return -std::log(-std::log(u));
}

std::uint64_t fixed_point_exp(double x) {
  if (!(x <= 0)) return static_cast<std::uint64_t>(kFixedOne);  // the row's largest (or NaN)
  return static_cast<std::uint64_t>(std::llround(std::exp(x) * kFixedOne));
}

template <class T>
std::vector<std::int32_t> choose_tokens(std::span<const LogitsRow<T>> slices, index_t vocab,
                                        Communicator& axis, const SamplingOptions& options,
                                        std::span<const std::uint64_t> row_steps,
                                        std::span<const std::uint64_t> row_keys,
                                        bool exchange_shapes) {
  if (const std::string e = check_sampling(options); !e.empty()) throw Error(e);
  const int ranks = axis.size();
  const std::size_t P = static_cast<std::size_t>(ranks);
  const std::size_t R = slices.size();
  const auto rows = static_cast<index_t>(R);
  require(vocab >= 1 && vocab <= kMaxVocab && row_keys.size() >= R && row_steps.size() >= R, [&] {
    return fmt::format(
        "choose_tokens: vocab={} (1 to 2^23) and {} keys, {} steps for {} "
        "rows",
        vocab, row_keys.size(), row_steps.size(), R);
  });
  // Every rank's shape, so that every rank finds the same error: (rows,
  // vocab, keys) then (begin, count) of each row, from every rank.
  if (exchange_shapes) {
    std::vector<double> header{static_cast<double>(R), static_cast<double>(vocab),
                               static_cast<double>(std::min(row_keys.size(), row_steps.size()))},
        all_headers(3 * P);
    axis.all_gather(header.data(), all_headers.data(), 3);
    std::string error;
    for (std::size_t r = 0; r < P && error.empty(); ++r) {
      const double* h = &all_headers[3 * r];
      if (h[0] != all_headers[0] || h[1] != all_headers[1])
        error = fmt::format(
            "rank {} of the vocabulary axis has rows={} vocab={}, rank 0 rows={} "
            "vocab={}",
            r, h[0], h[1], all_headers[0], all_headers[1]);
      else if (h[2] != h[0])
        error = fmt::format("rank {} passes {} row keys and steps for {} rows", r, h[2], h[0]);
    }
    if (error.empty() && vocab > kMaxVocab)
      error = fmt::format("vocab={} exceeds 2^23, the most the fixed-point sums hold", vocab);
    if (error.empty() && vocab < 1) error = fmt::format("vocab={} must be positive", vocab);
    if (!error.empty()) throw Error("choose_tokens: " + error);
    std::vector<double> mine(2 * R), all(2 * R * P);
    for (std::size_t r = 0; r < R; ++r) {
      mine[2 * r] = static_cast<double>(slices[r].begin);
      mine[2 * r + 1] = static_cast<double>(slices[r].count);
    }
    axis.all_gather(mine.data(), all.data(), 2 * R);
    std::vector<std::pair<double, double>> ranges;
    for (std::size_t row = 0; row < R && error.empty(); ++row) {
      ranges.clear();
      for (std::size_t k = 0; k < P; ++k) {
        const double lo = all[2 * (k * R + row)], n = all[2 * (k * R + row) + 1];
        if (n < 0 || lo < 0 || lo + n > static_cast<double>(vocab)) {
          error = fmt::format("rank {} holds columns [{}, {}) of row {}, outside [0, vocab={})", k,
                              lo, lo + n, row, vocab);
          break;
        }
        if (n > 0) ranges.emplace_back(lo, lo + n);
      }
      if (!error.empty()) break;
      std::sort(ranges.begin(), ranges.end());
      double covered = 0;
      for (const auto& [lo, hi] : ranges) {
        if (lo != covered) break;
        covered = hi;
      }
      if (covered != static_cast<double>(vocab))
        error = fmt::format("the ranks' column ranges of row {} do not tile [0, vocab={}) exactly",
                            row, vocab);
    }
    if (!error.empty()) throw Error("choose_tokens: " + error);
  }
  std::vector<std::int32_t> chosen(R, -1);
  if (R == 0) return chosen;
  const bool greedy = options.greedy || options.temperature == 0;
  const double inv_t = greedy ? 1.0 : 1.0 / options.temperature;
  const auto value = [&](std::size_t row, index_t j) {
    return as_double(slices[row].data[j]) * inv_t;
  };

  // One (value, id) pair per row and rank, all-gathered; the best wins.
  const auto best_pairs = [&](auto&& score) {
    std::vector<double> mine(2 * R), all(2 * R * P);
    for (std::size_t row = 0; row < R; ++row) {
      Scored best{-std::numeric_limits<double>::infinity(), -1};
      for (index_t j = 0; j < slices[row].count; ++j) {
        const Scored s{score(row, j), static_cast<double>(slices[row].begin + j)};
        if (best.id < 0 || before(s, best)) best = s;
      }
      mine[2 * row] = best.value;
      mine[2 * row + 1] = best.id;
    }
    axis.all_gather(mine.data(), all.data(), mine.size());
    for (std::size_t row = 0; row < R; ++row)
      chosen[row] =
          static_cast<std::int32_t>(best_of(all, ranks, rows, static_cast<index_t>(row)).id);
  };
  if (greedy) {
    best_pairs([&](std::size_t row, index_t j) { return value(row, j); });
    return chosen;
  }
  const bool top_k = options.top_k > 0 && options.top_k < vocab;
  const bool top_p = options.top_p < 1;
  if (!top_k && !top_p) {  // Gumbel-max over the whole vocabulary
    best_pairs([&](std::size_t row, index_t j) {
      return value(row, j) +
             gumbel_noise(options.seed, row_steps[row], row_keys[row], slices[row].begin + j);
    });
    return chosen;
  }

  // The candidates: each rank's tokens sorted canonically, then the k best
  // (top-k) or those that can still be in the nucleus (top-p alone).
  std::vector<std::vector<Scored>> local(R);
  for (std::size_t row = 0; row < R; ++row) {
    auto& v = local[row];
    v.reserve(static_cast<std::size_t>(slices[row].count));
    for (index_t j = 0; j < slices[row].count; ++j)
      v.push_back({value(row, j), static_cast<double>(slices[row].begin + j)});
    std::sort(v.begin(), v.end(), before);
  }
  // The row maxima (what the fixed-point weights are relative to).
  std::vector<double> row_max(R, -std::numeric_limits<double>::infinity());
  {
    std::vector<double> mine(R), all(R * P);
    for (std::size_t r = 0; r < R; ++r)
      mine[r] = local[r].empty() ? -std::numeric_limits<double>::infinity() : local[r][0].value;
    axis.all_gather(mine.data(), all.data(), R);
    for (std::size_t k = 0; k < P; ++k)
      for (std::size_t r = 0; r < R; ++r) row_max[r] = std::max(row_max[r], all[k * R + r]);
  }
  const auto weight = [&](std::size_t row, double v) { return fixed_point_exp(v - row_max[row]); };
  std::vector<std::size_t> send(R);
  std::vector<std::uint64_t> total(R, 0);  // top-p alone: the whole vocabulary's mass
  if (top_k) {
    for (std::size_t r = 0; r < R; ++r)
      send[r] = std::min(local[r].size(), static_cast<std::size_t>(options.top_k));
  } else {
    // each rank's exact integer mass as two 32-bit halves (exact in a
    // double), summed as integers: the same total in any order
    std::vector<double> mine(2 * R), all(2 * R * P);
    for (std::size_t r = 0; r < R; ++r) {
      std::uint64_t s = 0;
      for (const Scored& x : local[r]) s += weight(r, x.value);
      mine[2 * r] = static_cast<double>(s >> 32);
      mine[2 * r + 1] = static_cast<double>(s & 0xFFFFFFFFull);
    }
    axis.all_gather(mine.data(), all.data(), 2 * R);
    for (std::size_t k = 0; k < P; ++k)
      for (std::size_t r = 0; r < R; ++r)
        total[r] += (static_cast<std::uint64_t>(all[2 * (k * R + r)]) << 32) +
                    static_cast<std::uint64_t>(all[2 * (k * R + r) + 1]);
    for (std::size_t r = 0; r < R; ++r) {  // while the exclusive local prefix is below p Z
      const long double bound = static_cast<long double>(options.top_p) * total[r];
      std::uint64_t prefix = 0;
      std::size_t n = 0;
      while (n < local[r].size() && static_cast<long double>(prefix) < bound)
        prefix += weight(r, local[r][n++].value);
      send[r] = n;
    }
  }
  // Pad every rank's list of a row to the longest; all-gather them.
  std::size_t width = 0;
  {
    std::vector<double> mine(R), all(R * P);
    for (std::size_t r = 0; r < R; ++r) mine[r] = static_cast<double>(send[r]);
    axis.all_gather(mine.data(), all.data(), R);
    for (const double n : all) width = std::max(width, static_cast<std::size_t>(n));
  }
  std::vector<double> mine(R * width * 2, -1.0), all(R * width * 2 * P);
  for (std::size_t r = 0; r < R; ++r)
    for (std::size_t n = 0; n < send[r]; ++n) {
      mine[(r * width + n) * 2] = local[r][n].value;
      mine[(r * width + n) * 2 + 1] = local[r][n].id;
    }
  axis.all_gather(mine.data(), all.data(), mine.size());
  std::vector<Scored> merged;
  for (index_t row = 0; row < rows; ++row) {
    const auto r = static_cast<std::size_t>(row);
    merged.clear();
    for (std::size_t k = 0; k < P; ++k)
      for (std::size_t n = 0; n < width; ++n) {
        const std::size_t at = ((k * R + r) * width + n) * 2;
        if (all[at + 1] >= 0) merged.push_back({all[at], all[at + 1]});
      }
    std::sort(merged.begin(), merged.end(), before);
    if (top_k && merged.size() > static_cast<std::size_t>(options.top_k))
      merged.resize(static_cast<std::size_t>(options.top_k));
    std::size_t keep = merged.size();
    if (top_p) {
      std::uint64_t mass = total[r];
      if (top_k) {  // the nucleus of the top-k set (renormalised over it)
        mass = 0;
        for (const Scored& x : merged) mass += weight(r, x.value);
      }
      const long double bound = static_cast<long double>(options.top_p) * mass;
      std::uint64_t prefix = 0;
      keep = 0;
      while (keep < merged.size() && static_cast<long double>(prefix) < bound)
        prefix += weight(r, merged[keep++].value);
    }
    Scored best{-std::numeric_limits<double>::infinity(), -1};
    for (std::size_t n = 0; n < keep; ++n) {
      const auto id = static_cast<std::int64_t>(merged[n].id);
      const Scored s{merged[n].value + gumbel_noise(options.seed, row_steps[r], row_keys[r], id),
                     merged[n].id};
      if (best.id < 0 || before(s, best)) best = s;
    }
    chosen[r] = static_cast<std::int32_t>(best.id);
  }
  return chosen;
}

template <class T>
std::vector<std::int32_t> choose_tokens(const T* logits, index_t rows, index_t count, index_t ld,
                                        index_t begin, index_t vocab, Communicator& axis,
                                        const SamplingOptions& options, std::uint64_t step,
                                        std::span<const std::uint64_t> row_keys) {
  if (const std::string e = check_sampling(options); !e.empty()) throw Error(e);
  std::optional<std::string> error;
  if (rows < 0 || count < 0 || (count > 0 && ld < count))
    error = fmt::format("choose_tokens: rows={} count={} ld={}", rows, count, ld);
  // a local shape error reaches every rank through the shape exchange:
  // this rank then claims no columns and the tiling check names it
  std::vector<LogitsRow<T>> slices(static_cast<std::size_t>(std::max<index_t>(rows, 0)));
  for (index_t r = 0; r < rows; ++r)
    slices[static_cast<std::size_t>(r)] = {logits + r * ld, begin, error ? 0 : count};
  const std::vector<std::uint64_t> steps(slices.size(), step);
  return choose_tokens<T>(slices, vocab, axis, options, steps, row_keys);
}

template std::vector<std::int32_t> choose_tokens<float>(std::span<const LogitsRow<float>>, index_t,
                                                        Communicator&, const SamplingOptions&,
                                                        std::span<const std::uint64_t>,
                                                        std::span<const std::uint64_t>, bool);
template std::vector<std::int32_t> choose_tokens<float>(const float*, index_t, index_t, index_t,
                                                        index_t, index_t, Communicator&,
                                                        const SamplingOptions&, std::uint64_t,
                                                        std::span<const std::uint64_t>);
template std::vector<std::int32_t> choose_tokens<double>(std::span<const LogitsRow<double>>,
                                                         index_t, Communicator&,
                                                         const SamplingOptions&,
                                                         std::span<const std::uint64_t>,
                                                         std::span<const std::uint64_t>, bool);
template std::vector<std::int32_t> choose_tokens<double>(const double*, index_t, index_t, index_t,
                                                         index_t, index_t, Communicator&,
                                                         const SamplingOptions&, std::uint64_t,
                                                         std::span<const std::uint64_t>);
template std::vector<std::int32_t> choose_tokens<bf16>(std::span<const LogitsRow<bf16>>, index_t,
                                                       Communicator&, const SamplingOptions&,
                                                       std::span<const std::uint64_t>,
                                                       std::span<const std::uint64_t>, bool);
template std::vector<std::int32_t> choose_tokens<bf16>(const bf16*, index_t, index_t, index_t,
                                                       index_t, index_t, Communicator&,
                                                       const SamplingOptions&, std::uint64_t,
                                                       std::span<const std::uint64_t>);

}  // namespace summa

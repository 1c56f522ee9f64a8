// The next token from vocabulary-parallel logits (summa/layers/sampling.hpp),
// at 1, 2, 4, 8 and 9 ranks in one launch (sub-communicators).
//
// Against a serial oracle that sees the whole vocabulary (sort every token,
// keep the top k, keep the nucleus by fixed-point mass, Gumbel-max over
// what is left): fresh random logits with ties, split over the ranks evenly
// and unevenly (some ranks holding no column), padded leading dimension,
// float / double / bf16; greedy, plain sampling, top-k, top-p and both, at
// several temperatures, steps and seeds. Every rank must return the
// oracle's ids. The sampler's statistics (one rank): token frequencies
// match softmax(logits / T) within 5 sigma; top-k and top-p never leave
// their set. Bad options and bad splits give the same error on every rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "summa/comm/mpi_communicator.hpp"
#include "summa/core/bf16.hpp"
#include "summa/core/error.hpp"
#include "summa/layers/sampling.hpp"
#include "test_util.hpp"

namespace summa::test {
namespace {

const std::vector<int> kRankCounts = {1, 2, 4, 8, 9};

// The serial oracle on one row of global logits.
std::int32_t oracle(const std::vector<double>& logits, const SamplingOptions& o, std::uint64_t step,
                    std::uint64_t key) {
  const auto V = static_cast<std::int64_t>(logits.size());
  std::vector<std::int64_t> order(static_cast<std::size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  const bool greedy = o.greedy || o.temperature == 0;
  const double inv_t = greedy ? 1.0 : 1.0 / o.temperature;
  std::vector<double> s(logits.size());
  for (std::size_t i = 0; i < s.size(); ++i) s[i] = logits[i] * inv_t;
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
    return s[static_cast<std::size_t>(a)] > s[static_cast<std::size_t>(b)];
  });  // ties keep id order
  if (greedy) return static_cast<std::int32_t>(order.front());
  if (o.top_k > 0 && o.top_k < V) order.resize(static_cast<std::size_t>(o.top_k));
  if (o.top_p < 1) {
    const double top = s[static_cast<std::size_t>(order.front())];
    std::uint64_t mass = 0;
    for (std::int64_t id : order) mass += fixed_point_exp(s[static_cast<std::size_t>(id)] - top);
    std::size_t keep = 0;
    std::uint64_t prefix = 0;
    while (keep < order.size() &&
           static_cast<long double>(prefix) < static_cast<long double>(o.top_p) * mass)
      prefix += fixed_point_exp(s[static_cast<std::size_t>(order[keep++])] - top);
    order.resize(keep);
  }
  std::int64_t best = -1;
  double best_v = 0;
  for (std::int64_t id : order) {
    const double v = s[static_cast<std::size_t>(id)] + gumbel_noise(o.seed, step, key, id);
    if (best < 0 || v > best_v || (v == best_v && id < best)) {
      best = id;
      best_v = v;
    }
  }
  return static_cast<std::int32_t>(best);
}

// Column ranges of `vocab` over `ranks`: even, or random cuts (empty ranges
// allowed), the same on every rank for the same rng.
std::vector<index_t> cuts(index_t vocab, int ranks, bool even, std::mt19937_64& rng) {
  std::vector<index_t> c(static_cast<std::size_t>(ranks) + 1, 0);
  for (int r = 0; r <= ranks; ++r)
    c[static_cast<std::size_t>(r)] =
        even ? vocab * r / ranks
             : static_cast<index_t>(rng() % static_cast<std::uint64_t>(vocab + 1));
  std::sort(c.begin() + 1, c.end() - 1);
  c.front() = 0;
  c.back() = vocab;
  return c;
}

template <class T>
void matches_the_oracle(MPI_Comm comm, int ranks) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  TrafficCounter counter;
  MpiCommunicator axis(comm, false, CommAxis::tensor, &counter);
  std::mt19937_64 rng(fresh_seed());
  const std::vector<SamplingOptions> settings = {
      {.greedy = true},
      {.greedy = false, .temperature = 0},  // 0: greedy
      {.greedy = false, .temperature = 0.7},
      {.greedy = false, .temperature = 1.0, .top_k = 5},
      {.greedy = false, .temperature = 1.3, .top_p = 0.8},
      {.greedy = false, .temperature = 0.9, .top_k = 10, .top_p = 0.5},
      {.greedy = false, .temperature = 2.0, .top_k = 1000, .top_p = 1.0},
      {.greedy = false, .temperature = 0.5, .top_p = 0.05},
  };
  for (const index_t vocab : {index_t{1}, index_t{37}, index_t{64}}) {
    const index_t rows = 5;
    for (int trial = 0; trial < 6; ++trial) {
      // logits rounded to quarters: ties in every row
      std::normal_distribution<double> normal(0.0, 2.0);
      std::vector<double> global(static_cast<std::size_t>(rows * vocab));
      for (double& x : global) x = std::round(normal(rng) * 4) / 4;
      const std::vector<index_t> c = cuts(vocab, ranks, trial % 2 == 0, rng);
      const index_t begin = c[static_cast<std::size_t>(rank)],
                    count = c[static_cast<std::size_t>(rank) + 1] - begin, ld = count + 3;
      std::vector<T> local(static_cast<std::size_t>(rows * ld), T(-100.0F));
      for (index_t r = 0; r < rows; ++r)
        for (index_t j = 0; j < count; ++j)
          local[static_cast<std::size_t>(r * ld + j)] =
              T(static_cast<float>(global[static_cast<std::size_t>(r * vocab + begin + j)]));
      std::vector<std::uint64_t> keys(static_cast<std::size_t>(rows));
      for (auto& k : keys) k = rng() % 1000;
      for (SamplingOptions o : settings) {
        o.seed = rng();
        const std::uint64_t step = rng() % 100;
        SCOPED_TRACE(fmt::format("vocab {} trial {} greedy {} T {} top_k {} top_p {}", vocab, trial,
                                 o.greedy, o.temperature, o.top_k, o.top_p));
        const std::vector<std::int32_t> got =
            choose_tokens<T>(local.data(), rows, count, ld, begin, vocab, axis, o, step, keys);
        ASSERT_EQ(got.size(), static_cast<std::size_t>(rows));
        for (index_t r = 0; r < rows; ++r) {
          std::vector<double> row(static_cast<std::size_t>(vocab));
          for (index_t j = 0; j < vocab; ++j)  // the oracle sees what the ranks hold
            row[static_cast<std::size_t>(j)] = static_cast<double>(static_cast<float>(
                T(static_cast<float>(global[static_cast<std::size_t>(r * vocab + j)]))));
          EXPECT_EQ(got[static_cast<std::size_t>(r)],
                    oracle(row, o, step, keys[static_cast<std::size_t>(r)]))
              << "row " << r;
        }
        EXPECT_TRUE(same_on_all_ranks(fmt::format("{}", fmt::join(got, ","))));
      }
    }
  }
}

TEST(Sampling, MatchesTheOracleFloat) {
  for_each_group(kRankCounts, matches_the_oracle<float>);
}
TEST(Sampling, MatchesTheOracleDouble) {
  for_each_group(kRankCounts, matches_the_oracle<double>);
}
TEST(Sampling, MatchesTheOracleBf16) {
  for_each_group(kRankCounts, matches_the_oracle<bf16>);
}

// Frequencies over many steps (each step draws fresh noise) against the
// distribution each setting samples from.
TEST(Sampling, SamplesTheRightDistribution) {
  for_each_group({1}, [](MPI_Comm comm, int) {
    TrafficCounter counter;
    MpiCommunicator axis(comm, false, CommAxis::tensor, &counter);
    const std::vector<double> logits = {2.0, 1.0, 0.5, 0.0, -1.0, -3.0};
    const auto V = static_cast<index_t>(logits.size());
    const std::uint64_t key = 7;
    const int n = 40000;
    const auto frequencies = [&](const SamplingOptions& o) {
      std::vector<int> seen(logits.size(), 0);
      for (int step = 0; step < n; ++step) {
        const auto id = choose_tokens<double>(logits.data(), 1, V, V, 0, V, axis, o,
                                              static_cast<std::uint64_t>(step),
                                              std::span<const std::uint64_t>(&key, 1));
        ++seen[static_cast<std::size_t>(id[0])];
      }
      return seen;
    };
    // the target: softmax(logits / T) over the first `keep` tokens
    const auto check = [&](const std::vector<int>& seen, double t, std::size_t keep) {
      double z = 0;
      for (std::size_t i = 0; i < keep; ++i) z += std::exp(logits[i] / t);
      for (std::size_t i = 0; i < logits.size(); ++i) {
        const double p = i < keep ? std::exp(logits[i] / t) / z : 0.0;
        const double sigma = std::sqrt(n * p * (1 - p));
        EXPECT_NEAR(seen[i], n * p, 5 * sigma + 1) << "token " << i << " at T=" << t;
      }
    };
    check(frequencies({.greedy = false, .temperature = 1.0, .seed = 11}), 1.0, logits.size());
    check(frequencies({.greedy = false, .temperature = 0.5, .seed = 12}), 0.5, logits.size());
    check(frequencies({.greedy = false, .temperature = 1.0, .top_k = 2, .seed = 13}), 1.0, 2);
    // softmax(logits) = 0.561, 0.206, 0.125, ... (cumulative 0.561, 0.767,
    // 0.892): the nucleus of 0.7 is 2 tokens, of 0.85 three
    check(frequencies({.greedy = false, .temperature = 1.0, .top_p = 0.7, .seed = 14}), 1.0, 2);
    check(frequencies({.greedy = false, .temperature = 1.0, .top_p = 0.85, .seed = 15}), 1.0, 3);
    // Gumbel noise itself: mean Euler-Mascheroni, variance pi^2 / 6
    double sum = 0, sq = 0;
    for (int i = 0; i < n; ++i) {
      const double g = gumbel_noise(1, 2, 3, i);
      sum += g;
      sq += g * g;
    }
    const double mean = sum / n, var = sq / n - mean * mean;
    EXPECT_NEAR(mean, 0.5772156649, 5 * std::sqrt(1.6449 / n));
    EXPECT_NEAR(var, 1.6449340668, 0.1);
  });
}

TEST(Sampling, ErrorsAreTheSameOnEveryRank) {
  for_each_group(kRankCounts, [](MPI_Comm comm, int ranks) {
    int rank = 0;
    MPI_Comm_rank(comm, &rank);
    TrafficCounter counter;
    MpiCommunicator axis(comm, false, CommAxis::tensor, &counter);
    const index_t vocab = 4 * ranks;
    std::vector<float> local(8, 0.5F);
    const std::uint64_t keys[2] = {0, 1};
    const auto message = [&](auto&& call) {
      try {
        call();
      } catch (const Error& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    };
    const auto run = [&](const SamplingOptions& o, index_t begin, index_t count) {
      return message(
          [&] { choose_tokens<float>(local.data(), 2, count, 4, begin, vocab, axis, o, 0, keys); });
    };
    const SamplingOptions sample{.greedy = false};
    std::string m = run({.greedy = false, .temperature = -1}, 4 * rank, 4);
    EXPECT_NE(m.find("temperature=-1"), std::string::npos) << m;
    m = run({.greedy = false, .top_k = -2}, 4 * rank, 4);
    EXPECT_NE(m.find("top_k=-2"), std::string::npos) << m;
    m = run({.greedy = false, .top_p = 1.5}, 4 * rank, 4);
    EXPECT_NE(m.find("top_p=1.5"), std::string::npos) << m;
    EXPECT_TRUE(same_on_all_ranks(m));
    // the last rank's range overlaps: every rank names it
    m = run(sample, rank == ranks - 1 && ranks > 1 ? 0 : 4 * rank, 4);
    if (ranks > 1) {
      EXPECT_NE(m.find("do not tile"), std::string::npos) << m;
    } else {
      EXPECT_EQ(m, "no error");
    }
    EXPECT_TRUE(same_on_all_ranks(m));
    m = run(sample, 4 * rank, rank == 0 ? 5 : 4);  // past the vocabulary on the last rank (1 rank)
    EXPECT_NE(m, "no error");
    EXPECT_TRUE(same_on_all_ranks(m));
  });
}

}  // namespace
}  // namespace summa::test

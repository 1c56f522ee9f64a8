#pragma once
/// \file sampling.hpp
/// The next token from vocabulary-parallel logits, without gathering the
/// vocabulary on one rank (issue 15): greedy, or a sample at a temperature,
/// optionally restricted to the top k logits and to the nucleus of
/// probability top_p (applied in that order, as Hugging Face's generate
/// does).
///
/// Each rank holds the logits of the same rows for a contiguous range of
/// the vocabulary; the ranks holding one row's ranges form `axis` (1D: the
/// tensor group; 2D: a mesh row). Greedy takes the largest logit, the
/// lowest id on ties, with one all-gather of a (value, id) pair per row and
/// rank. A sample is the Gumbel-max trick: the argmax of logit / T + g_id,
/// where g_id is Gumbel noise drawn from a counter-based generator keyed by
/// (seed, step, row, id) — so no rank needs another's logits, and the
/// choice depends only on each token's own logit. Top-k and top-p gather a
/// small candidate set (each rank's k best; each rank's tokens that can
/// still be in the nucleus), and decide membership with probabilities
/// summed in 2^-40 fixed point, in a canonical order (logit descending,
/// id ascending) — exact integer sums, so the same candidates whatever
/// the sharding.
///
/// Guarantee: for the same global logits, the same choice on every rank
/// and under every split of the vocabulary over any number of ranks
/// (tests/layers/test_sampling.cpp against a serial oracle at 1-9 ranks).
/// Logits that differ in their last bits (another scheme's GEMM order) give
/// the same greedy token unless two logits are that close.

#include <cstdint>
#include <span>
#include <vector>

#include "summa/comm/communicator.hpp"
#include "summa/core/types.hpp"

namespace summa {

struct SamplingOptions {
  /// Greedy (argmax); temperature, top_k and top_p are then ignored.
  bool greedy = true;
  /// Softmax temperature (> 0); 0 means greedy.
  double temperature = 1.0;
  /// Keep the k largest logits (0: all).
  std::int64_t top_k = 0;
  /// Keep the smallest set of the largest probabilities whose mass reaches
  /// top_p, in (0, 1] (1: all).
  double top_p = 1.0;
  /// The generator's key: the same seed, step and row always draw the same
  /// noise.
  std::uint64_t seed = 0;
};

/// The options' error, or an empty string: temperature negative or not
/// finite, top_k negative, top_p outside (0, 1].
std::string check_sampling(const SamplingOptions& options);

/// The chosen token id of each of `rows` rows. `logits`: this rank's
/// [rows, count] block (row-major, leading dimension `ld` >= count, host
/// memory) of the global [rows, vocab] logits, columns [begin, begin +
/// count); the ranks of `axis` hold disjoint ranges covering [0, vocab)
/// (count may be 0 on some). `row_keys[r]` keys row r's noise with `step`
/// (e.g. the sequence's index in the global batch, so a row draws the same
/// noise wherever it sits). Collective over `axis`; every rank returns the
/// same ids. Throws summa::Error (the same on every rank, before any
/// collective) when the options are invalid (check_sampling) or the shapes
/// do not fit.
template <class T>
std::vector<std::int32_t> choose_tokens(const T* logits, index_t rows, index_t count, index_t ld,
                                        index_t begin, index_t vocab, Communicator& axis,
                                        const SamplingOptions& options, std::uint64_t step,
                                        std::span<const std::uint64_t> row_keys);

/// One row's part on this rank: logits of columns [begin, begin + count)
/// of the global vocabulary at `data` (host memory, contiguous); count 0
/// where the rank holds nothing of the row.
template <class T>
struct LogitsRow {
  const T* data = nullptr;
  index_t begin = 0;
  index_t count = 0;
};

/// The same for rows that sit on different ranks with different column
/// ranges (a scheme's logits: each row's ranges over the ranks of `axis`
/// tile [0, vocab), ranks that hold a row twice pass count 0 for one
/// copy). `rows.size()` is the same on every rank.
/// Each row draws its noise with its own step (row_steps[r]): a row's
/// k-th generated token is keyed by k wherever the row is in its prompt.
/// `exchange_shapes` false skips the two all-gathers that let every rank
/// name another rank's bad shape, for callers that build the slices from a
/// layout they know tiles (Gpt::next_tokens, once per decoding step).
template <class T>
std::vector<std::int32_t> choose_tokens(std::span<const LogitsRow<T>> rows, index_t vocab,
                                        Communicator& axis, const SamplingOptions& options,
                                        std::span<const std::uint64_t> row_steps,
                                        std::span<const std::uint64_t> row_keys,
                                        bool exchange_shapes = true);

/// Gumbel noise of token `id` for (seed, step, key): -log(-log(u)), u
/// uniform in (0, 1) from a counter-based generator (SplitMix64 of the
/// four). Exposed for tests and for serial oracles.
double gumbel_noise(std::uint64_t seed, std::uint64_t step, std::uint64_t key, std::int64_t id);

/// 2^-40 fixed point of exp(x) for x <= 0 (probabilities relative to the
/// row's largest logit): what top-p sums.
std::uint64_t fixed_point_exp(double x);

extern template std::vector<std::int32_t> choose_tokens<float>(
    std::span<const LogitsRow<float>>, index_t, Communicator&, const SamplingOptions&,
    std::span<const std::uint64_t>, std::span<const std::uint64_t>, bool);
extern template std::vector<std::int32_t> choose_tokens<float>(
    const float*, index_t, index_t, index_t, index_t, index_t, Communicator&,
    const SamplingOptions&, std::uint64_t, std::span<const std::uint64_t>);
extern template std::vector<std::int32_t> choose_tokens<double>(
    std::span<const LogitsRow<double>>, index_t, Communicator&, const SamplingOptions&,
    std::span<const std::uint64_t>, std::span<const std::uint64_t>, bool);
extern template std::vector<std::int32_t> choose_tokens<double>(
    const double*, index_t, index_t, index_t, index_t, index_t, Communicator&,
    const SamplingOptions&, std::uint64_t, std::span<const std::uint64_t>);
extern template std::vector<std::int32_t> choose_tokens<bf16>(std::span<const LogitsRow<bf16>>,
                                                              index_t, Communicator&,
                                                              const SamplingOptions&,
                                                              std::span<const std::uint64_t>,
                                                              std::span<const std::uint64_t>, bool);
extern template std::vector<std::int32_t> choose_tokens<bf16>(const bf16*, index_t, index_t,
                                                              index_t, index_t, index_t,
                                                              Communicator&, const SamplingOptions&,
                                                              std::uint64_t,
                                                              std::span<const std::uint64_t>);

}  // namespace summa

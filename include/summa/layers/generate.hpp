#pragma once
/// \file generate.hpp
/// Text generation with a distributed GPT under any scheme (issue 15):
/// prompts of different lengths in one batch, one new token per sequence
/// and step chosen from the vocabulary-parallel logits (Gpt::next_tokens,
/// summa::choose_tokens: greedy, temperature, top-k, top-p; deterministic
/// from the seed, the same under every scheme), stopping a sequence at the
/// end token or after max_new_tokens.
///
/// Two ways, by the model:
///  - with a key / value cache (GptOptions::kv_cache, model seq = 1): one
///    position per step for every sequence in lockstep (Gpt::forward_cached
///    at position t): a sequence takes its prompt's token t while it has
///    one, its own last token after; from its prompt's last position on,
///    each step's logits give its next token. Every token's keys and values
///    are computed once.
///  - without: each step runs the forward over the whole [batch, seq]
///    window (prompt and generated ids, the rest padded with id 0; the
///    causal mask makes the logits at a sequence's last real position
///    independent of the padding after it), recomputing every position:
///    the reference the cached decoder must equal (tests/layers/
///    test_generate.cpp).
/// A sequence's k-th new token draws its sampling noise with step k and key
/// = its prompt's index, so both give the same tokens.

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "summa/layers/gpt.hpp"
#include "summa/layers/sampling.hpp"

namespace summa {

struct GenerateOptions {
  /// New tokens per prompt at most.
  index_t max_new_tokens = 32;
  /// A sequence stops after emitting this id (kept in its output); -1: none.
  std::int32_t eos = -1;
  SamplingOptions sampling = {};
  /// Only ids below this (0: the model's vocabulary), e.g. a tokenizer's
  /// vocabulary below a padded model's.
  index_t vocab_limit = 0;
  /// Called on every rank after each step that produced tokens, with each
  /// prompt's new id (-1 where the prompt had finished or, with a cache, is
  /// still taking its prompt): streaming output.
  std::function<void(std::span<const std::int32_t>)> on_step = {};
};

struct Generation {
  /// The generated ids of each prompt (the end token included when hit).
  std::vector<std::vector<std::int32_t>> tokens;
  /// Forwards run; the wall time of those that took prompt tokens (without
  /// a cache: the first) and of the rest, and the tokens each handled (the
  /// prompts' tokens; the generated ones).
  index_t steps = 0;
  double prefill_s = 0, decode_s = 0;
  index_t prompt_tokens = 0, new_tokens = 0;
};

/// Generates from `prompts` (token ids; at most model.batch() prompts, each
/// non-empty, ids in the model's vocabulary, its length plus
/// max_new_tokens at most the cache length with a cache, model.seq()
/// without; both at most n_positions).
/// Rows beyond the prompts run a one-token dummy prompt. Collective over
/// the model's grid; every rank passes the same prompts and options and
/// gets the same result. Throws summa::Error on every rank, naming the
/// prompt and its length, before any step when a prompt does not fit.
template <class T>
Generation generate(Gpt<T>& model, std::span<const std::vector<std::int32_t>> prompts,
                    const GenerateOptions& options);

extern template Generation generate<float>(Gpt<float>&, std::span<const std::vector<std::int32_t>>,
                                           const GenerateOptions&);
extern template Generation generate<double>(Gpt<double>&,
                                            std::span<const std::vector<std::int32_t>>,
                                            const GenerateOptions&);
extern template Generation generate<bf16>(Gpt<bf16>&, std::span<const std::vector<std::int32_t>>,
                                          const GenerateOptions&);

}  // namespace summa

#pragma once
/// \file generate.hpp
/// Text generation with a distributed GPT under any scheme (issue 15):
/// prompts of different lengths in one batch, one new token per sequence
/// and step chosen from the vocabulary-parallel logits (Gpt::next_tokens,
/// summa::choose_tokens: greedy, temperature, top-k, top-p; deterministic
/// from the seed, the same under every scheme), stopping a sequence at the
/// end token or after max_new_tokens.
///
/// Each step runs the model's forward over the whole [batch, seq] window
/// (prompt and generated ids, the rest padded with id 0): the causal mask
/// makes the logits at a sequence's last real position independent of the
/// padding after it. That recomputes every position each step (no key /
/// value cache yet); it is the reference the cached decoder must equal.

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
  /// Called on every rank after each step with each prompt's new id (-1
  /// where the prompt had finished): streaming output.
  std::function<void(std::span<const std::int32_t>)> on_step = {};
};

struct Generation {
  /// The generated ids of each prompt (the end token included when hit).
  std::vector<std::vector<std::int32_t>> tokens;
  /// Steps run, and the wall time of the first (the prompts' forward) and
  /// of the rest.
  index_t steps = 0;
  double first_step_s = 0, rest_s = 0;
};

/// Generates from `prompts` (token ids; at most model.batch() prompts, each
/// non-empty, ids in the model's vocabulary, its length plus
/// max_new_tokens at most model.seq(), which is at most n_positions).
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

#include "summa/layers/generate.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>

#include "summa/core/error.hpp"

namespace summa {

namespace {

// The cached path (see the header): checked by generate().
template <class T>
Generation generate_cached(Gpt<T>& model, std::span<const std::vector<std::int32_t>> prompts,
                           const GenerateOptions& options) {
  const auto B = static_cast<std::size_t>(model.batch());
  const std::size_t P = prompts.size();
  std::size_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, p.size());
  Generation out;
  out.tokens.resize(P);
  std::vector<bool> done(P, false);
  std::vector<std::int32_t> window(B, 0), step_ids(P);
  const std::vector<index_t> positions(B, 0);  // each sequence's one row
  std::vector<std::uint64_t> steps(B, 0);
  for (index_t t = 0;; ++t) {
    bool any = false, sampling = false;
    for (std::size_t p = 0; p < P; ++p) {
      if (done[p]) continue;
      any = true;
      const auto n = static_cast<index_t>(prompts[p].size());
      window[p] = t < n ? prompts[p][static_cast<std::size_t>(t)]
                        : out.tokens[p][static_cast<std::size_t>(t - n)];
      sampling = sampling || t >= n - 1;
      steps[p] = static_cast<std::uint64_t>(out.tokens[p].size());
    }
    if (!any) break;
    const auto t0 = std::chrono::steady_clock::now();
    model.forward_cached(window, t);
    std::vector<std::int32_t> ids;
    if (sampling) ids = model.next_tokens(positions, options.sampling, steps, options.vocab_limit);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    (static_cast<std::size_t>(t) + 1 < longest ? out.prefill_s : out.decode_s) += dt;
    ++out.steps;
    for (std::size_t p = 0; p < P; ++p) {
      step_ids[p] = -1;
      if (done[p] || t < static_cast<index_t>(prompts[p].size()) - 1) continue;
      const std::int32_t id = ids[p];
      step_ids[p] = id;
      out.tokens[p].push_back(id);
      if (id == options.eos || static_cast<index_t>(out.tokens[p].size()) >= options.max_new_tokens)
        done[p] = true;
    }
    if (sampling && options.on_step) options.on_step(step_ids);
  }
  for (std::size_t p = 0; p < P; ++p) {
    out.prompt_tokens += static_cast<index_t>(prompts[p].size());
    out.new_tokens += static_cast<index_t>(out.tokens[p].size());
  }
  return out;
}

}  // namespace

template <class T>
Generation generate(Gpt<T>& model, std::span<const std::vector<std::int32_t>> prompts,
                    const GenerateOptions& options) {
  const index_t batch = model.batch(), seq = model.seq();
  const GptConfig& config = model.config();
  const index_t cache = model.options().kv_cache;
  const index_t room = cache > 0 ? cache : seq;  // positions a sequence may fill
  {
    std::optional<std::string> error;
    if (prompts.empty() || static_cast<index_t>(prompts.size()) > batch)
      error = fmt::format("generate: {} prompts for a model of batch {} (1 to {} prompts)",
                          prompts.size(), batch, batch);
    else if (options.max_new_tokens < 1)
      error = fmt::format("generate: max_new_tokens={} must be >= 1", options.max_new_tokens);
    else if (const std::string e = check_sampling(options.sampling); !e.empty())
      error = "generate: " + e;
    else if (cache > 0 && seq != 1)
      error = fmt::format(
          "generate: a model with a key/value cache decodes one position a step "
          "(seq=1), this one has seq={}",
          seq);
    for (std::size_t p = 0; !error && p < prompts.size(); ++p) {
      const auto n = static_cast<index_t>(prompts[p].size());
      if (n == 0) {
        error = fmt::format("generate: prompt {} is empty", p);
      } else if (options.max_new_tokens > room - n) {  // no overflow for any max_new_tokens
        error = fmt::format(
            "generate: prompt {} has {} tokens; with max_new_tokens={} it would reach {} "
            "positions, more than the model's {} ({}; n_positions={}): {}",
            p, n, options.max_new_tokens,
            static_cast<long double>(n) + static_cast<long double>(options.max_new_tokens), room,
            cache > 0 ? "kv_cache" : "seq", config.n_positions,
            n < room ? fmt::format("max_new_tokens={} fits", room - n)
                     : std::string("the prompt leaves no room"));
      } else {
        const auto bad = std::find_if(prompts[p].begin(), prompts[p].end(), [&](std::int32_t id) {
          return id < 0 || id >= config.vocab_size;
        });
        if (bad != prompts[p].end())
          error = fmt::format("generate: prompt {} has id {} at {}, outside [0, vocab={})", p, *bad,
                              bad - prompts[p].begin(), config.vocab_size);
      }
    }
    model.grid().agree(CommAxis::world, error);
  }
  if (cache > 0) return generate_cached(model, prompts, options);
  const std::size_t P = prompts.size();
  const auto B = static_cast<std::size_t>(batch);
  std::vector<std::int32_t> window(B * static_cast<std::size_t>(seq), 0);
  std::vector<index_t> length(B, 1);
  std::vector<bool> done(B, true);
  for (std::size_t p = 0; p < P; ++p) {
    std::copy(prompts[p].begin(), prompts[p].end(),
              window.begin() + static_cast<std::ptrdiff_t>(p * static_cast<std::size_t>(seq)));
    length[p] = static_cast<index_t>(prompts[p].size());
    done[p] = false;
  }
  Generation out;
  out.tokens.resize(P);
  std::vector<index_t> positions(B);
  std::vector<std::int32_t> step_ids(P);
  for (index_t step = 0; step < options.max_new_tokens; ++step) {
    if (std::none_of(done.begin(), done.begin() + static_cast<std::ptrdiff_t>(P),
                     [](bool d) { return !d; }))
      break;
    const auto t0 = std::chrono::steady_clock::now();
    model.forward_logits(window);
    for (std::size_t b = 0; b < B; ++b) positions[b] = length[b] - 1;
    const std::vector<std::int32_t> ids = model.next_tokens(
        positions, options.sampling, static_cast<std::uint64_t>(step), options.vocab_limit);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    (step == 0 ? out.prefill_s : out.decode_s) += dt;
    ++out.steps;
    for (std::size_t p = 0; p < P; ++p) {
      step_ids[p] = -1;
      if (done[p]) continue;
      const std::int32_t id = ids[p];
      step_ids[p] = id;
      out.tokens[p].push_back(id);
      if (length[p] < seq)
        window[p * static_cast<std::size_t>(seq) + static_cast<std::size_t>(length[p])] = id;
      ++length[p];
      if (id == options.eos || static_cast<index_t>(out.tokens[p].size()) >= options.max_new_tokens)
        done[p] = true;
    }
    if (options.on_step) options.on_step(step_ids);
  }
  for (std::size_t p = 0; p < P; ++p) {
    out.prompt_tokens += static_cast<index_t>(prompts[p].size());
    out.new_tokens += static_cast<index_t>(out.tokens[p].size());
  }
  return out;
}

template Generation generate<float>(Gpt<float>&, std::span<const std::vector<std::int32_t>>,
                                    const GenerateOptions&);
template Generation generate<double>(Gpt<double>&, std::span<const std::vector<std::int32_t>>,
                                     const GenerateOptions&);
template Generation generate<bf16>(Gpt<bf16>&, std::span<const std::vector<std::int32_t>>,
                                   const GenerateOptions&);

}  // namespace summa

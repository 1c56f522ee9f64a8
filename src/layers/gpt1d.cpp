#include "summa/layers/gpt1d.hpp"

#include <fmt/format.h>

#include <optional>
#include <string>

namespace summa {

namespace {

// The 1D constraints (GptBase checks the rest), the same error on every rank.
void check_1d(ProcessGrid& grid, const reference::GptConfig& c) {
  const int p = grid.tensor().size();
  std::optional<std::string> error;
  const auto bad = [&](const char* what, index_t v) {
    if (!error && v % p != 0)
      error = fmt::format("GPT1D: {}={} must be divisible by p={}", what, v, p);
  };
  bad("n_embd (hidden)", c.n_embd);
  bad("n_head", c.n_head);
  bad("vocab_size", c.vocab_size);
  grid.agree(CommAxis::world, error);
}

}  // namespace

template <class T>
GPT1D<T>::GPT1D(ProcessGrid& grid, Backend& backend, const reference::GptConfig& config,
                index_t batch, index_t seq, GptOptions options)
    : GptBase<T>("GPT1D", grid, backend, config, batch, seq, options) {
  check_1d(grid, config);
  const index_t h = config.n_embd, b = this->local_batch_, tokens = b * seq;
  this->embedding_ = std::make_unique<Embedding1D<T>>(grid, backend, b, seq, config.vocab_size, h,
                                                      config.n_positions);
  for (int i = 0; i < config.n_layer; ++i)
    this->blocks_.push_back(
        std::make_unique<TransformerBlock1D<T>>(grid, backend, fmt::format("h.{}", i), b, seq, h,
                                                config.n_head, config.layer_norm_epsilon));
  this->ln_f_ =
      std::make_unique<LayerNorm1D<T>>(grid, backend, "ln_f", tokens, h, config.layer_norm_epsilon);
  // The loss is normalised by the global token count (see GptBase).
  this->head_ = std::make_unique<LMHead1D<T>>(grid, backend, embedding().wte(), tokens, h,
                                              config.vocab_size, batch * seq);
  this->finish_construction(tokens, h);
}

template class GPT1D<float>;
template class GPT1D<double>;
template class GPT1D<bf16>;

}  // namespace summa

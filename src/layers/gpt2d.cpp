#include "summa/layers/gpt2d.hpp"

#include <fmt/format.h>

#include <optional>
#include <string>

namespace summa {

namespace {

// The 2D constraints (GptBase checks the rest), the same error on every rank.
void check_2d(SummaEngine& engine, const reference::GptConfig& c, index_t batch) {
  const int q = engine.q(), data = engine.grid().shape().data;
  std::optional<std::string> error;
  const auto bad = [&](const char* what, index_t v) {
    if (!error && v % q != 0)
      error = fmt::format("GPT2D: {}={} must be divisible by q={}", what, v, q);
  };
  if (batch % (static_cast<index_t>(data) * q) != 0)
    error = fmt::format(
        "GPT2D: batch={} must be divisible by data*q = {}*{} (whole sequences per mesh row of "
        "every data group)",
        batch, data, q);
  bad("n_embd (hidden)", c.n_embd);
  bad("n_head", c.n_head);
  bad("vocab_size", c.vocab_size);
  engine.grid().agree(CommAxis::world, error);
}

}  // namespace

template <class T>
GPT2D<T>::GPT2D(SummaEngine& engine, const reference::GptConfig& config, index_t batch, index_t seq,
                GptOptions options)
    : GptBase<T>("GPT2D", engine.grid(), engine.backend(), config, batch, seq, options),
      engine_(&engine) {
  check_2d(engine, config, batch);
  const index_t h = config.n_embd, b = this->local_batch_, tokens = b * seq;
  const int q = engine.q();
  this->embedding_ =
      std::make_unique<Embedding2D<T>>(engine, b, seq, config.vocab_size, h, config.n_positions);
  for (int i = 0; i < config.n_layer; ++i)
    this->blocks_.push_back(std::make_unique<TransformerBlock2D<T>>(
        engine, fmt::format("h.{}", i), b, seq, h, config.n_head, config.layer_norm_epsilon));
  this->ln_f_ =
      std::make_unique<LayerNorm2DLayer<T>>(engine, "ln_f", tokens, h, config.layer_norm_epsilon);
  // The loss is normalised by the global token count (see GptBase).
  this->head_ = std::make_unique<LMHead2D<T>>(engine, embedding().wte(), tokens, h,
                                              config.vocab_size, batch * seq);
  this->finish_construction(tokens / q, h / q);
}

template class GPT2D<float>;
template class GPT2D<double>;
template class GPT2D<bf16>;

}  // namespace summa

#include "summa/schemes/summa2d/context.hpp"

#include <fmt/format.h>

namespace summa {

template <class T>
Summa2DContext<T>::Summa2DContext(SummaEngine& engine)
    : SchemeContext<T>(engine.grid(), engine.backend()), engine_(&engine), q_(engine.q()) {}

template <class T>
Summa2DContext<T>::Summa2DContext(ProcessGrid& grid, Backend& backend, SummaOptions options)
    : SchemeContext<T>(grid, backend),
      owned_(std::make_unique<SummaEngine>(grid, backend, options)),
      engine_(owned_.get()),
      q_(engine_->q()) {}

template <class T>
Summa2DContext<T>::~Summa2DContext() = default;

template <class T>
std::unique_ptr<Layer<T>> Summa2DContext<T>::linear(std::string name, index_t tokens, index_t in,
                                                    index_t out, LinearRole, bool has_bias,
                                                    ColumnGroups groups) {
  return std::make_unique<Linear2DLayer<T>>(*engine_, std::move(name), tokens, in, out, has_bias,
                                            groups);
}

template <class T>
std::unique_ptr<EmbeddingModule<T>> Summa2DContext<T>::embedding(index_t batch, index_t seq,
                                                                 index_t vocab, index_t hidden,
                                                                 index_t n_positions) {
  return std::make_unique<Embedding2D<T>>(*engine_, batch, seq, vocab, hidden, n_positions);
}

template <class T>
std::unique_ptr<LossHead<T>> Summa2DContext<T>::lm_head(Param<T>& wte, index_t tokens,
                                                        index_t hidden, index_t vocab,
                                                        index_t normalizer) {
  return std::make_unique<LMHead2D<T>>(*engine_, wte, tokens, hidden, vocab, normalizer);
}

template <class T>
ActivationBlock Summa2DContext<T>::activation_block(index_t tokens, index_t width,
                                                    ActivationLayout) const {
  const GridCoords& c = this->grid().coords();
  const index_t rows = tokens / q_, cols = width / q_;
  return {.row0 = c.row * rows, .rows = rows, .col0 = c.col * cols, .cols = cols, .owner = true};
}

template <class T>
std::unique_ptr<Loss<T>> Summa2DContext<T>::cross_entropy(index_t tokens, index_t classes,
                                                          index_t normalizer) {
  return std::make_unique<LossOf<T, CrossEntropy2D<T>>>(engine_->grid(), engine_->backend(), tokens,
                                                        classes, normalizer);
}

template <class T>
std::optional<std::string> Summa2DContext<T>::check_gpt(const GptConfig& c, index_t batch) const {
  const int data = this->grid().shape().data;
  if (batch % (static_cast<index_t>(data) * q_) != 0)
    return fmt::format(
        "GPT (2D): batch={} must be divisible by data*q = {}*{} (whole sequences per mesh row of "
        "every data group)",
        batch, data, q_);
  for (auto [what, v] : {std::pair{"n_embd (hidden)", c.n_embd}, std::pair{"n_head", c.n_head},
                         std::pair{"vocab_size", c.vocab_size}})
    if (v % q_ != 0) return fmt::format("GPT (2D): {}={} must be divisible by q={}", what, v, q_);
  return std::nullopt;
}

template class Summa2DContext<float>;
template class Summa2DContext<double>;
template class Summa2DContext<bf16>;

}  // namespace summa

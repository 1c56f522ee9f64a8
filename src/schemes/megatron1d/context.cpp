#include "summa/schemes/megatron1d/context.hpp"

#include <fmt/format.h>

namespace summa {

template <class T>
Megatron1DContext<T>::Megatron1DContext(ProcessGrid& grid, Backend& backend, bool sequence_parallel,
                                        bool distribute_checkpoints)
    : SchemeContext<T>(grid, backend),
      p_(grid.tensor().size()),
      sp_(sequence_parallel && p_ > 1),
      dc_(distribute_checkpoints && p_ > 1) {
  require(!(sequence_parallel && distribute_checkpoints),
          "1D: sequence parallelism and distributed checkpoints exclude each other (sp splits the "
          "checkpoints over p already)");
}

template <class T>
std::unique_ptr<Layer<T>> Megatron1DContext<T>::linear(std::string name, index_t tokens, index_t in,
                                                       index_t out, LinearRole role, bool has_bias,
                                                       ColumnGroups groups) {
  if (role == LinearRole::expand)
    return std::make_unique<ColumnParallelLinear1D<T>>(
        this->grid(), this->backend(), std::move(name), tokens, in, out, has_bias, groups, sp_);
  require(groups.out == 1, [&] {
    return fmt::format("1D linear '{}': groups.out={} (only an expanding linear has output groups)",
                       name, groups.out);
  });
  return std::make_unique<RowParallelLinear1D<T>>(this->grid(), this->backend(), std::move(name),
                                                  tokens, in, out, has_bias, groups, sp_);
}

template <class T>
std::unique_ptr<EmbeddingModule<T>> Megatron1DContext<T>::embedding(index_t batch, index_t seq,
                                                                    index_t vocab, index_t hidden,
                                                                    index_t n_positions) {
  return std::make_unique<Embedding1D<T>>(this->grid(), this->backend(), batch, seq, vocab, hidden,
                                          n_positions, sp_);
}

template <class T>
std::unique_ptr<LossHead<T>> Megatron1DContext<T>::lm_head(Param<T>& wte, index_t tokens,
                                                           index_t hidden, index_t vocab,
                                                           index_t normalizer) {
  return std::make_unique<LMHead1D<T>>(this->grid(), this->backend(), wte, tokens, hidden, vocab,
                                       normalizer, sp_);
}

template <class T>
ActivationBlock Megatron1DContext<T>::activation_block(index_t tokens, index_t width,
                                                       ActivationLayout layout) const {
  const int r = this->grid().tensor().rank();
  if (layout == ActivationLayout::outer && sp_) {  // rows split (sequence parallelism)
    const index_t rows = tokens / p_;
    return {.row0 = r * rows, .rows = rows, .col0 = 0, .cols = width, .owner = true};
  }
  if (layout == ActivationLayout::outer)  // replicated; rank 0 owns it
    return {.row0 = 0, .rows = tokens, .col0 = 0, .cols = width, .owner = r == 0};
  const index_t w = width / p_;
  return {.row0 = 0, .rows = tokens, .col0 = r * w, .cols = w, .owner = true};
}

template <class T>
std::unique_ptr<Loss<T>> Megatron1DContext<T>::cross_entropy(index_t tokens, index_t classes,
                                                             index_t normalizer) {
  return std::make_unique<LossOf<T, CrossEntropy1D<T>>>(this->grid(), this->backend(), tokens,
                                                        classes, normalizer);
}

template <class T>
std::optional<std::string> Megatron1DContext<T>::check_gpt(const GptConfig& c, index_t) const {
  for (auto [what, v] : {std::pair{"n_embd (hidden)", c.n_embd}, std::pair{"n_head", c.n_head},
                         std::pair{"vocab_size", c.vocab_size}})
    if (v % p_ != 0) return fmt::format("GPT (1D): {}={} must be divisible by p={}", what, v, p_);
  return std::nullopt;
}

template class Megatron1DContext<float>;
template class Megatron1DContext<double>;
template class Megatron1DContext<bf16>;

}  // namespace summa

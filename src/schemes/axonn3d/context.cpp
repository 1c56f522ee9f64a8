#include "summa/schemes/axonn3d/context.hpp"

#include <fmt/format.h>

namespace summa {

template <class T>
Axonn3DContext<T>::Axonn3DContext(ProcessGrid& grid, Backend& backend, Axonn3DOptions options)
    : SchemeContext<T>(grid, backend),
      options_(options),
      gx_(grid.shape().rows),
      gy_(grid.shape().cols),
      gz_(grid.shape().depth),
      overlap_(std::make_unique<Overlap3D<T>>(grid, backend, options)) {}

template <class T>
Axonn3DContext<T>::~Axonn3DContext() = default;

template <class T>
std::unique_ptr<Layer<T>> Axonn3DContext<T>::linear(std::string name, index_t tokens, index_t in,
                                                    index_t out, LinearRole role, bool has_bias,
                                                    ColumnGroups groups) {
  const Orientation3D o =
      role == LinearRole::expand ? Orientation3D::normal : Orientation3D::transposed;
  return std::make_unique<Linear3D<T>>(this->grid(), this->backend(), std::move(name), tokens, in,
                                       out, o, has_bias, groups, options_, overlap_.get());
}

template <class T>
std::unique_ptr<EmbeddingModule<T>> Axonn3DContext<T>::embedding(index_t batch, index_t seq,
                                                                 index_t vocab, index_t hidden,
                                                                 index_t n_positions) {
  return std::make_unique<Embedding3D<T>>(this->grid(), this->backend(), batch, seq, vocab, hidden,
                                          n_positions);
}

template <class T>
std::unique_ptr<LossHead<T>> Axonn3DContext<T>::lm_head(Param<T>& wte, index_t tokens,
                                                        index_t hidden, index_t vocab,
                                                        index_t normalizer) {
  return std::make_unique<LMHead3D<T>>(this->grid(), this->backend(), wte, tokens, hidden, vocab,
                                       normalizer, options_);
}

template <class T>
ActivationBlock Axonn3DContext<T>::activation_block(index_t tokens, index_t width,
                                                    ActivationLayout layout) const {
  // Rank (x, y, z) = (row, col, depth): rows over Z; outer (Y-layout) columns
  // over Y, replicated over X; inner (X-layout) columns over X, replicated over Y.
  const GridCoords& c = this->grid().coords();
  const index_t rows = tokens / gz_;
  const bool outer = layout == ActivationLayout::outer;
  const index_t cols = width / (outer ? gy_ : gx_);
  return {.row0 = c.depth * rows,
          .rows = rows,
          .col0 = (outer ? c.col : c.row) * cols,
          .cols = cols,
          .owner = (outer ? c.row : c.col) == 0};
}

template <class T>
std::unique_ptr<Loss<T>> Axonn3DContext<T>::cross_entropy(index_t tokens, index_t classes,
                                                          index_t normalizer) {
  return std::make_unique<LossOf<T, CrossEntropy3D<T>>>(this->grid(), this->backend(), tokens,
                                                        classes, normalizer);
}

template <class T>
std::optional<std::string> Axonn3DContext<T>::check_gpt(const GptConfig& c, index_t batch) const {
  const auto data = static_cast<index_t>(this->grid().shape().data);
  const auto x = static_cast<index_t>(gx_), y = static_cast<index_t>(gy_),
             z = static_cast<index_t>(gz_);
  struct Need {
    const char* what;
    index_t value, divisor;
    const char* by;
  };
  for (const Need& n :
       {Need{"n_head", c.n_head, x, "Gx"}, Need{"batch", batch, data * z, "data*Gz"},
        Need{"n_embd (hidden)", c.n_embd, y * z, "Gy*Gz"},
        Need{"n_embd (hidden)", c.n_embd, x * z, "Gx*Gz"},
        Need{"vocab_size", c.vocab_size, x * z, "Gx*Gz"}})
    if (n.value % n.divisor != 0)
      return fmt::format("GPT (3D): {}={} must be divisible by {}={}", n.what, n.value, n.by,
                         n.divisor);
  return std::nullopt;
}

template <class T>
void Axonn3DContext<T>::append_buffers(std::vector<BufferUsage>& out) const {
  for (BufferUsage& u : overlap_->usage()) out.push_back(std::move(u));
}

template class Axonn3DContext<float>;
template class Axonn3DContext<double>;
template class Axonn3DContext<bf16>;

}  // namespace summa

#include "summa/layers/gpt3d.hpp"

#include <fmt/format.h>

#include <optional>
#include <string>

namespace summa {

namespace {

// The 3D constraints (GptBase checks the rest), the same error on every rank.
void check_3d(ProcessGrid& grid, const reference::GptConfig& c, index_t batch) {
  const GridShape& s = grid.shape();
  const int gx = s.rows, gy = s.cols, gz = s.depth;
  std::optional<std::string> error;
  const auto need = [&](const char* what, index_t v, index_t d, const char* by) {
    if (!error && v % d != 0)
      error = fmt::format("GPT3D: {}={} must be divisible by {}={}", what, v, by, d);
  };
  need("n_head", c.n_head, gx, "Gx");
  need("batch", batch, static_cast<index_t>(s.data) * gz, "data*Gz");
  need("n_embd (hidden)", c.n_embd, static_cast<index_t>(gy) * gz, "Gy*Gz");
  need("n_embd (hidden)", c.n_embd, static_cast<index_t>(gx) * gz, "Gx*Gz");
  need("vocab_size", c.vocab_size, static_cast<index_t>(gx) * gz, "Gx*Gz");
  grid.agree(CommAxis::world, error);
}

}  // namespace

template <class T>
GPT3D<T>::GPT3D(ProcessGrid& grid, Backend& backend, const reference::GptConfig& config,
                index_t batch, index_t seq, GptOptions options, Axonn3DOptions axonn)
    : GptBase<T>("GPT3D", grid, backend, config, batch, seq, options),
      axonn_(axonn),
      overlap_(std::make_unique<Overlap3D<T>>(grid, backend, axonn)) {
  check_3d(grid, config, batch);
  const index_t h = config.n_embd, b = this->local_batch_, tokens = b * seq;
  this->embedding_ = std::make_unique<Embedding3D<T>>(grid, backend, b, seq, config.vocab_size, h,
                                                      config.n_positions);
  for (int i = 0; i < config.n_layer; ++i)
    this->blocks_.push_back(std::make_unique<TransformerBlock3D<T>>(
        grid, backend, fmt::format("h.{}", i), b, seq, h, config.n_head, config.layer_norm_epsilon,
        axonn, overlap_.get()));
  this->ln_f_ =
      std::make_unique<LayerNorm3D<T>>(grid, backend, "ln_f", tokens, h, config.layer_norm_epsilon);
  // The loss is normalised by the global token count (see GptBase).
  this->head_ = std::make_unique<LMHead3D<T>>(grid, backend, embedding().wte(), tokens, h,
                                              config.vocab_size, batch * seq, axonn);
  overlap_->allocate(options.plan_only);
  this->finish_construction(tokens / grid.shape().depth, h / grid.shape().cols);
}

template <class T>
void GPT3D<T>::begin_forward() {
  overlap_->begin_step();
}

template <class T>
bool GPT3D<T>::defers_gradients() const {
  return overlap_->deferring();
}

template <class T>
void GPT3D<T>::complete_deferred() {
  overlap_->complete();
}

template <class T>
void GPT3D<T>::append_buffers(std::vector<BufferUsage>& out) const {
  for (BufferUsage& u : overlap_->usage()) out.push_back(std::move(u));
}

template class GPT3D<float>;
template class GPT3D<double>;
template class GPT3D<bf16>;

}  // namespace summa

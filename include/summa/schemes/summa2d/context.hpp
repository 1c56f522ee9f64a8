#pragma once
/// \file context.hpp
/// The 2D (Optimus, SUMMA) scheme context: the layers of
/// schemes/summa2d/layers.hpp behind SchemeContext, on a q x q mesh through one SummaEngine.
/// Activations (outer and inner alike) are [T/q, w/q] blocks: mesh row i
/// holds the sequences [i*b/q, (i+1)*b/q), mesh column j the columns (and
/// heads) of slice j; every linear is one SUMMA call in forward and two in
/// backward.

#include <memory>

#include "summa/layers/scheme_context.hpp"
#include "summa/schemes/summa2d/layers.hpp"
#include "summa/schemes/summa2d/spec.hpp"

namespace summa {

template <class T>
class Summa2DContext final : public SchemeContext<T> {
 public:
  /// `engine` (and its grid) must outlive the context and its layers.
  explicit Summa2DContext(SummaEngine& engine);
  /// With an engine of its own on `grid` (a q x q mesh).
  Summa2DContext(ProcessGrid& grid, Backend& backend, SummaOptions options = {});
  /// With the options of a "2d" scheme item.
  Summa2DContext(ProcessGrid& grid, Backend& backend, const Summa2DSpec& spec)
      : Summa2DContext(grid, backend, spec.summa) {}
  ~Summa2DContext() override;

  std::string_view label() const override { return "2D"; }
  SummaEngine& engine() const { return *engine_; }
  index_t local_rows(index_t tokens, ActivationLayout) const override { return tokens / q_; }
  index_t local_cols(index_t width, ActivationLayout) const override { return width / q_; }
  int sequence_split() const override { return q_; }
  const char* sequence_split_name() const override { return "q"; }
  int head_split() const override { return q_; }
  const char* head_split_name() const override { return "q"; }

  std::unique_ptr<Layer<T>> linear(std::string name, index_t tokens, index_t in, index_t out,
                                   LinearRole role, bool has_bias = true,
                                   ColumnGroups groups = {}) override;
  NormLayout norm_layout() const override { return summa2d_norm_layout(this->grid()); }
  std::unique_ptr<EmbeddingModule<T>> embedding(index_t batch, index_t seq, index_t vocab,
                                                index_t hidden, index_t n_positions) override;
  std::unique_ptr<LossHead<T>> lm_head(Param<T>& wte, index_t tokens, index_t hidden, index_t vocab,
                                       index_t normalizer = 0) override;
  ActivationBlock activation_block(index_t tokens, index_t width,
                                   ActivationLayout layout) const override;
  std::unique_ptr<Loss<T>> cross_entropy(index_t tokens, index_t classes,
                                         index_t normalizer = 0) override;
  std::optional<std::string> check_gpt(const GptConfig& config, index_t batch) const override;

 private:
  std::unique_ptr<SummaEngine> owned_;
  SummaEngine* engine_;
  int q_;
};

extern template class Summa2DContext<float>;
extern template class Summa2DContext<double>;
extern template class Summa2DContext<bf16>;

}  // namespace summa

#pragma once
/// \file context.hpp
/// The 3D (AxoNN) scheme context: the layers of schemes/axonn3d/layers.hpp behind
/// SchemeContext, on a Gx x Gy x Gz grid (ProcessGrid::grid3d). Outer
/// activations are Y-layout [T/Gz, w/Gy], inner ones X-layout [T/Gz, w/Gx];
/// an expanding linear has the normal orientation, a contracting one the
/// transposed one; heads are split over Gx, sequences over Gz. The context
/// owns the ORS / OAG overlap state its linears share (Overlap3D).

#include <memory>

#include "summa/layers/scheme_context.hpp"
#include "summa/schemes/axonn3d/layers.hpp"
#include "summa/schemes/axonn3d/spec.hpp"

namespace summa {

template <class T>
class Axonn3DContext final : public SchemeContext<T> {
 public:
  Axonn3DContext(ProcessGrid& grid, Backend& backend, Axonn3DOptions options = {});
  /// With the overlap switches of a "3d" scheme item.
  Axonn3DContext(ProcessGrid& grid, Backend& backend, const Axonn3DSpec& spec)
      : Axonn3DContext(grid, backend,
                       Axonn3DOptions{.overlap_all_reduce = spec.oar,
                                      .overlap_reduce_scatter = spec.ors,
                                      .overlap_all_gather = spec.oag}) {}
  ~Axonn3DContext() override;

  std::string_view label() const override { return "3D"; }
  const Axonn3DOptions& options() const { return options_; }
  /// The ORS / OAG state shared by the linears.
  Overlap3D<T>& overlap() { return *overlap_; }

  index_t local_rows(index_t tokens, ActivationLayout) const override { return tokens / gz_; }
  index_t local_cols(index_t width, ActivationLayout layout) const override {
    return width / (layout == ActivationLayout::outer ? gy_ : gx_);
  }
  int sequence_split() const override { return gz_; }
  const char* sequence_split_name() const override { return "Gz"; }
  int head_split() const override { return gx_; }
  const char* head_split_name() const override { return "Gx"; }

  std::unique_ptr<Layer<T>> linear(std::string name, index_t tokens, index_t in, index_t out,
                                   LinearRole role, bool has_bias = true,
                                   ColumnGroups groups = {}) override;
  NormLayout norm_layout() const override { return axonn3d_norm_layout(this->grid()); }
  std::unique_ptr<EmbeddingModule<T>> embedding(index_t batch, index_t seq, index_t vocab,
                                                index_t hidden, index_t n_positions) override;
  std::unique_ptr<LossHead<T>> lm_head(Param<T>& wte, index_t tokens, index_t hidden, index_t vocab,
                                       index_t normalizer = 0) override;
  ActivationBlock activation_block(index_t tokens, index_t width,
                                   ActivationLayout layout) const override;
  std::unique_ptr<Loss<T>> cross_entropy(index_t tokens, index_t classes,
                                         index_t normalizer = 0) override;
  std::optional<std::string> check_gpt(const GptConfig& config, index_t batch) const override;

  void finish_layers(bool plan_only) override { overlap_->allocate(plan_only); }
  void begin_forward() override { overlap_->begin_step(); }
  bool defers_gradients() const override { return overlap_->deferring(); }
  void complete_deferred() override { overlap_->complete(); }
  bool prefetches_weights() const override { return overlap_->prefetching(); }
  void append_buffers(std::vector<BufferUsage>& out) const override;

 private:
  Axonn3DOptions options_;
  int gx_, gy_, gz_;
  std::unique_ptr<Overlap3D<T>> overlap_;
};

extern template class Axonn3DContext<float>;
extern template class Axonn3DContext<double>;
extern template class Axonn3DContext<bf16>;

}  // namespace summa

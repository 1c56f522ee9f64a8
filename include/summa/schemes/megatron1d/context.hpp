#pragma once
/// \file context.hpp
/// The 1D (Megatron-LM) scheme context: the layers of
/// schemes/megatron1d/layers.hpp behind SchemeContext, on the p ranks of the
/// grid's tensor group (ProcessGrid::linear1d). Outer activations are replicated [T, w]; inner
/// ones [T, w/p] (columns split); an expanding linear is column-parallel, a
/// contracting one row-parallel; heads are split over p, sequences not.
///
/// With sequence parallelism (Megatron1DSpec::sequence_parallel,
/// "1d:p=P,sp=on"; Korthikanti et al. 2022) the outer activations are split
/// by tokens instead: rank r holds rows [r*T/p, (r+1)*T/p) of the residual
/// stream, the LayerNorms, the block boundaries and so every activation
/// checkpoint. A column-parallel linear all-gathers its input's rows (again
/// in backward, where it reduce-scatters dX); a row-parallel one
/// reduce-scatters its output (backward all-gathers dY): the bytes of the
/// all-reduces they replace. The embedding reduce-scatters its output, the
/// LM head all-gathers its input. The tokens of a data group must be a
/// multiple of p.
///
/// With distributed checkpoints (Megatron1DSpec::distribute_checkpoints,
/// "1d:p=P,dc=on") the outer activations stay replicated, but the Gpt keeps
/// only rank r's 1/p of each block's checkpointed input and all-gathers it
/// over the tensor group before the block's recompute (checkpoint_group()).

#include "summa/layers/scheme_context.hpp"
#include "summa/schemes/megatron1d/layers.hpp"
#include "summa/schemes/megatron1d/spec.hpp"

namespace summa {

template <class T>
class Megatron1DContext final : public SchemeContext<T> {
 public:
  /// `sequence_parallel`: see the file comment (no effect when p = 1).
  /// `distribute_checkpoints`: likewise.
  Megatron1DContext(ProcessGrid& grid, Backend& backend, bool sequence_parallel = false,
                    bool distribute_checkpoints = false);
  /// For a "1d" scheme item (p is the grid's tensor group).
  Megatron1DContext(ProcessGrid& grid, Backend& backend, const Megatron1DSpec& spec)
      : Megatron1DContext(grid, backend, spec.sequence_parallel, spec.distribute_checkpoints) {}

  std::string_view label() const override { return "1D"; }
  /// Whether the outer activations are split by tokens (sequence parallelism).
  bool sequence_parallel() const { return sp_; }
  index_t local_rows(index_t tokens, ActivationLayout layout) const override {
    return sp_ && layout == ActivationLayout::outer ? tokens / p_ : tokens;
  }
  index_t local_cols(index_t width, ActivationLayout layout) const override {
    return layout == ActivationLayout::outer ? width : width / p_;
  }
  /// The tensor group with distributed checkpoints (and p > 1), else none.
  Communicator* checkpoint_group() const override { return dc_ ? &this->grid().tensor() : nullptr; }
  int sequence_split() const override { return 1; }
  const char* sequence_split_name() const override { return "1"; }
  int head_split() const override { return p_; }
  const char* head_split_name() const override { return "p"; }

  std::unique_ptr<Layer<T>> linear(std::string name, index_t tokens, index_t in, index_t out,
                                   LinearRole role, bool has_bias = true,
                                   ColumnGroups groups = {}) override;
  NormLayout norm_layout() const override { return megatron1d_norm_layout(this->grid(), sp_); }
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
  int p_;
  bool sp_;
  bool dc_;
};

extern template class Megatron1DContext<float>;
extern template class Megatron1DContext<double>;
extern template class Megatron1DContext<bf16>;

}  // namespace summa

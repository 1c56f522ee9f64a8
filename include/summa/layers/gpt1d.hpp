#pragma once
/// \file gpt1d.hpp
/// GPT-2 with the 1D tensor parallelism of Megatron-LM (Shoeybi et al. 2019)
/// over the p ranks of a tensor group (ProcessGrid::linear1d): the same
/// model as GPT2D and summa::reference::Gpt (names, shapes,
/// initialisation, loss) behind the same GptModel interface.
///
///   x_0 = wte[tokens] + wpe[positions]                      Embedding1D
///   x_{i+1} = Block_i(x_i), i < n_layer                    TransformerBlock1D
///   loss = CE(LN_f(x_N) · wteᵀ, targets)                   LayerNorm1D, LMHead1D
///
/// Activations [batch*seq, h] are replicated on every rank; attention heads,
/// MLP columns and the vocabulary are split over the ranks (see
/// megatron1d.hpp). The training step (checkpointing, buffers, the data
/// axis on ProcessGrid::linear1d(comm, p, data)) is GptBase's.
///
/// Communication of one step (all over grid.tensor(), all-reduce unless
/// said; T = batch*seq, h = n_embd, L = n_layer):
///   forward   embedding T*h; per block 2 x T*h (attention and MLP c_proj);
///             loss T (max) and 2T (sum)
///   backward  head T*h; per block 2 x T*h (c_attn and c_fc input
///             gradients), plus the 2 x T*h of the recomputed forward with
///             checkpointing
/// i.e. (4L + 2 (+2L)) all-reduces of T*h elements and two small ones.
///
/// Requirements (checked at construction, the same error on every rank):
/// n_embd divisible by n_head, n_embd, n_head and vocab_size divisible by p,
/// seq <= n_positions, batch divisible by the data groups. Token and
/// target ids are checked every step.
///
/// Instantiated for float, double and summa::bf16 (bf16 parameters,
/// activations and gradients with fp32 statistics; the optimizer keeps fp32
/// master weights: docs/gpu.md, "Mixed precision (bf16)").

#include "summa/layers/gpt_base.hpp"
#include "summa/layers/megatron1d.hpp"

namespace summa {

template <class T>
class GPT1D final : public GptBase<T> {
 public:
  /// Builds the layers on `grid` (ProcessGrid::linear1d), sizes every
  /// buffer and allocates parameters (zero; call init()). batch (global) and
  /// seq are fixed: buffers are sized for them.
  GPT1D(ProcessGrid& grid, Backend& backend, const reference::GptConfig& config, index_t batch,
        index_t seq, GptOptions options = {});

  Embedding1D<T>& embedding() { return static_cast<Embedding1D<T>&>(*this->embedding_); }
  TransformerBlock1D<T>& block(int i) {
    return static_cast<TransformerBlock1D<T>&>(*this->blocks_.at(static_cast<std::size_t>(i)));
  }
  LayerNorm1D<T>& ln_f() { return static_cast<LayerNorm1D<T>&>(*this->ln_f_); }
  LMHead1D<T>& head() { return static_cast<LMHead1D<T>&>(*this->head_); }
};

extern template class GPT1D<float>;
extern template class GPT1D<double>;
extern template class GPT1D<bf16>;

}  // namespace summa

#pragma once
/// \file gpt2d.hpp
/// GPT-2 on a q x q mesh (Optimus): weights and activations partitioned over
/// the mesh, memory in pre-sized buffers, optional per-block activation
/// checkpointing. The same model as summa::reference::Gpt (names, shapes,
/// initialisation, loss), so the two can be compared element by element.
///
///   x_0 = wte[tokens] + wpe[positions]                      Embedding2D
///   x_{i+1} = Block_i(x_i), i < n_layer                    TransformerBlock2D
///   loss = CE(LN_f(x_N) · wteᵀ, targets)                   LayerNorm2D, LMHead2D
///
/// Activations are [batch*seq, h] in q x q blocks (mesh row i: sequences
/// [i*b/q, (i+1)*b/q), mesh column j: hidden columns and heads of slice j);
/// the training step (checkpointing, buffers, the data axis) is GptBase's.
/// No dropout (GPT-2 pretraining uses 0.1; summa's layers are
/// deterministic so the distributed model matches the serial one exactly).
///
/// Data-parallel axis: on ProcessGrid::mesh2d(comm, q, data) every data
/// group runs the model on its own q x q mesh (see GptBase).
///
/// Requirements (checked at construction, the same error on every rank):
/// batch divisible by data*q, n_embd, n_head and vocab_size divisible by q,
/// n_embd divisible by n_head, seq <= n_positions. Token and target ids are
/// checked every step.

#include "summa/layers/block2d.hpp"
#include "summa/layers/embedding2d.hpp"
#include "summa/layers/gpt_base.hpp"
#include "summa/layers/lm_head2d.hpp"

namespace summa {

template <class T>
class GPT2D final : public GptBase<T> {
 public:
  /// Builds the layers, sizes every buffer and allocates parameters (zero;
  /// call init()). batch (global) and seq are fixed: buffers are sized for
  /// them.
  GPT2D(SummaEngine& engine, const reference::GptConfig& config, index_t batch, index_t seq,
        GptOptions options = {});

  Embedding2D<T>& embedding() { return static_cast<Embedding2D<T>&>(*this->embedding_); }
  TransformerBlock2D<T>& block(int i) {
    return static_cast<TransformerBlock2D<T>&>(*this->blocks_.at(static_cast<std::size_t>(i)));
  }
  LayerNorm2DLayer<T>& ln_f() { return static_cast<LayerNorm2DLayer<T>&>(*this->ln_f_); }
  LMHead2D<T>& head() { return static_cast<LMHead2D<T>&>(*this->head_); }

 private:
  SummaEngine* engine_;
};

extern template class GPT2D<float>;
extern template class GPT2D<double>;
extern template class GPT2D<bf16>;

}  // namespace summa

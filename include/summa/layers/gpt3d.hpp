#pragma once
/// \file gpt3d.hpp
/// GPT-2 with the 3D parallel matrix multiply of AxoNN (Singh et al., §V-A)
/// on a Gx x Gy x Gz grid (ProcessGrid::grid3d): the same model as GPT1D,
/// GPT2D and summa::reference::Gpt (names, shapes, initialisation, loss)
/// behind the same GptModel interface.
///
///   x_0 = wte[tokens] + wpe[positions]                      Embedding3D
///   x_{i+1} = Block_i(x_i), i < n_layer                    TransformerBlock3D
///   loss = CE(LN_f(x_N) · wteᵀ, targets)                   LayerNorm3D, LMHead3D
///
/// Block boundaries are Y-layout [T/Gz, h/Gy] blocks (token rows over Z,
/// hidden columns over Y, replicated over X); see axonn3d.hpp for every
/// layer's distribution and collectives. The training step (checkpointing,
/// buffers, the data axis on ProcessGrid::grid3d(comm, gx, gy, gz, data)) is
/// GptBase's.
///
/// Communication of one step (T = batch*seq, h = n_embd, V = vocab, L =
/// n_layer, m = T/Gz; "AG_Z(s)" an all-gather over Z of s elements per rank,
/// "RS_Z(s)" a reduce-scatter over Z keeping s, "AR_A(s)" an all-reduce
/// over A of s; groups of one are skipped):
///   Linear3D in->out (A = input column axis, B = output column axis)
///     forward   AG_Z(in*out/(A*B*Gz)), AR_A(m*out/B)
///     backward  AG_Z(in*out/(A*B*Gz)), AR_B(m*in/A), RS_Z(in*out/(A*B*Gz)),
///               AR_Z(out/B) for the bias
///     per block: c_attn (h->3h, normal: A=Y, B=X), attn c_proj (h->h,
///     transposed), c_fc (h->4h, normal), mlp c_proj (4h->h, transposed)
///   LayerNorm3D   forward AR_Y(m) twice; backward AR_Y(2m), AR_Z(2h/Gy)
///                 (2 per block + ln_f)
///   Embedding3D   forward AG_Z(V*h/(Gx*Gy*Gz)), AR_X(m*h/Gy); backward
///                 AR_Z(n_positions*h/Gy), RS_Z(V*h/(Gx*Gy*Gz))
///   LMHead3D      forward AG_Z(V*h/(Gx*Gy*Gz)), AR_Y(m*V/Gx), then the loss
///                 AR_X(m) (max), AR_X(2m), AR_Z(1 double); backward
///                 AG_Z(V*h/(Gx*Gy*Gz)), AR_X(m*h/Gy), RS_Z(V*h/(Gx*Gy*Gz))
/// With checkpointing every block's forward collectives run twice.
///
/// Requirements (checked at construction, the same error on every rank):
/// n_embd divisible by n_head, n_head by Gx, batch by Gz, n_embd by Gy*Gz
/// and by Gx*Gz, vocab_size by Gx*Gz, seq <= n_positions, batch by
/// data*Gz. Token and target ids are checked every step.
///
/// Instantiated for float, double and summa::bf16 (bf16 parameters and
/// activations with fp32 statistics; the optimizer's fp32 master weights
/// live in ParameterStore / Optimizer; see axonn3d.hpp).

#include "summa/layers/axonn3d.hpp"
#include "summa/layers/gpt_base.hpp"

namespace summa {

template <class T>
class GPT3D final : public GptBase<T> {
 public:
  /// Builds the layers on `grid` (ProcessGrid::grid3d), sizes every buffer
  /// and allocates parameters (zero; call init()). batch (global) and seq
  /// are fixed: buffers are sized for them.
  GPT3D(ProcessGrid& grid, Backend& backend, const reference::GptConfig& config, index_t batch,
        index_t seq, GptOptions options = {}, Axonn3DOptions axonn = {});

  const Axonn3DOptions& axonn_options() const { return axonn_; }
  Embedding3D<T>& embedding() { return static_cast<Embedding3D<T>&>(*this->embedding_); }
  TransformerBlock3D<T>& block(int i) {
    return static_cast<TransformerBlock3D<T>&>(*this->blocks_.at(static_cast<std::size_t>(i)));
  }
  LayerNorm3D<T>& ln_f() { return static_cast<LayerNorm3D<T>&>(*this->ln_f_); }
  LMHead3D<T>& head() { return static_cast<LMHead3D<T>&>(*this->head_); }
  /// The ORS / OAG state shared by the linears.
  Overlap3D<T>& overlap() { return *overlap_; }

 protected:
  void begin_forward() override;
  bool defers_gradients() const override;
  void complete_deferred() override;
  void append_buffers(std::vector<BufferUsage>& out) const override;

 private:
  Axonn3DOptions axonn_;
  std::unique_ptr<Overlap3D<T>> overlap_;
};

extern template class GPT3D<float>;
extern template class GPT3D<double>;
extern template class GPT3D<bf16>;

}  // namespace summa

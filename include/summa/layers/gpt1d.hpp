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
/// megatron1d.hpp). The block boundaries x_0..x_N live in the checkpoint
/// buffer; with checkpointing, forward releases each block's saved
/// activations and backward recomputes block i before differentiating it;
/// without it every block's activations stay in the forward buffer.
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
/// seq <= n_positions, a grid without data-parallel axis (data = 1; the
/// data-axis gradient reduction of GPT2D is not implemented here). Any
/// batch. Token and target ids are checked every step.

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "summa/layers/gpt_model.hpp"
#include "summa/layers/megatron1d.hpp"
#include "summa/layers/parameters.hpp"
#include "summa/memory/buffers.hpp"
#include "summa/reference/gpt.hpp"

namespace summa {

template <class T>
class GPT1D final : public GptModel<T> {
 public:
  /// Builds the layers, sizes every buffer and allocates parameters (zero;
  /// call init()). batch and seq are fixed: buffers are sized for them.
  /// Collective over grid.tensor().
  GPT1D(ProcessGrid& grid, Backend& backend, const reference::GptConfig& config, index_t batch,
        index_t seq, GptOptions options = {});
  ~GPT1D() override;
  GPT1D(const GPT1D&) = delete;
  GPT1D& operator=(const GPT1D&) = delete;

  std::string_view name() const override { return ""; }
  void collect_parameters(std::vector<Param<T>*>& out) override;
  BufferNeeds buffer_needs() const override;

  void init(std::uint64_t seed) override;
  double forward(std::span<const std::int32_t> tokens,
                 std::span<const std::int32_t> targets) override;
  void backward(bool accumulate = false) override;

  const reference::GptConfig& config() const override { return config_; }
  const GptOptions& options() const override { return options_; }
  index_t batch() const override { return batch_; }
  index_t seq() const override { return seq_; }
  ProcessGrid& grid() const override { return *grid_; }
  ParameterStore<T>& parameters_store() override { return *store_; }
  ModelBuffers& buffers() { return *buffers_; }
  MemoryReport memory_report() const override;

  Embedding1D<T>& embedding() { return *embedding_; }
  TransformerBlock1D<T>& block(int i) { return *blocks_.at(static_cast<std::size_t>(i)); }
  LayerNorm1D<T>& ln_f() { return *ln_f_; }
  LMHead1D<T>& head() { return *head_; }

  /// Replicated views [b*s, h], valid until the next forward: x_i (i = 0:
  /// the embeddings, i = n_layer: the last block's output) and LN_f's
  /// output; the local logits [b*s, V/p] (vocabulary columns [r*V/p,
  /// (r+1)*V/p)) until backward.
  ConstMatrixView<T> boundary(int i) const;
  ConstMatrixView<T> final_norm() const { return lnf_; }
  ConstMatrixView<T> logits() const { return head_->logits(); }
  /// dL/dx_0 (the embeddings, replicated) after backward.
  ConstMatrixView<T> input_grad() const { return input_grad_; }

 private:
  ProcessGrid* grid_;
  Backend* backend_;
  reference::GptConfig config_;
  GptOptions options_;
  index_t batch_, seq_;
  std::unique_ptr<Embedding1D<T>> embedding_;
  std::vector<std::unique_ptr<TransformerBlock1D<T>>> blocks_;
  std::unique_ptr<LayerNorm1D<T>> ln_f_;
  std::unique_ptr<LMHead1D<T>> head_;
  std::unique_ptr<ParameterStore<T>> store_;
  std::unique_ptr<ModelBuffers> buffers_;
  std::vector<MatrixView<T>> boundaries_;  // x_0..x_N in the checkpoint buffer
  MatrixView<T> conj_[2]{};
  MatrixView<T> lnf_{};
  MatrixView<T> input_grad_{};
  std::vector<std::int32_t> tokens_, targets_;
  bool have_forward_ = false;
};

extern template class GPT1D<float>;
extern template class GPT1D<double>;

}  // namespace summa

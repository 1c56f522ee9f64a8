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
/// [i*b/q, (i+1)*b/q), mesh column j: hidden columns and heads of slice j).
/// The block boundaries x_0..x_N live in the checkpoint buffer. With
/// checkpointing, forward releases each block's saved activations and
/// backward recomputes block i before differentiating it (forward buffer:
/// one block); without it every block's activations stay in the forward
/// buffer. No dropout (GPT-2 pretraining uses 0.1; summa's layers are
/// deterministic so the distributed model matches the serial one exactly).
///
/// Data-parallel axis: on a grid with data > 1 (ProcessGrid::mesh2d(comm, q,
/// data)) every data group holds a full copy of the model on its own q x q
/// mesh and takes batch/data consecutive sequences of the global batch
/// (group d: sequences [d*batch/data, (d+1)*batch/data)). The loss is
/// normalised by the global token count, so group losses and gradients add
/// up: backward all-reduces the gradients over the data axis in buckets
/// (LN_f, then each block as soon as its backward is done, then the
/// embedding), non-blocking, overlapped with the backward of the blocks
/// below, and waits for all of them at its end (the one completion point).
///
/// Requirements (checked at construction, the same error on every rank):
/// batch divisible by data*q, n_embd, n_head and vocab_size divisible by q,
/// n_embd divisible by n_head, seq <= n_positions. Token and target ids are
/// checked every step.

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "summa/layers/block2d.hpp"
#include "summa/layers/embedding2d.hpp"
#include "summa/layers/gpt_model.hpp"
#include "summa/layers/lm_head2d.hpp"
#include "summa/layers/parameters.hpp"
#include "summa/memory/buffers.hpp"
#include "summa/reference/gpt.hpp"

namespace summa {

template <class T>
class GPT2D final : public GptModel<T> {
 public:
  /// Builds the layers, sizes every buffer and allocates parameters (zero;
  /// call init()). batch and seq are fixed: buffers are sized for them.
  GPT2D(SummaEngine& engine, const reference::GptConfig& config, index_t batch, index_t seq,
        GptOptions options = {});
  ~GPT2D() override;
  GPT2D(const GPT2D&) = delete;
  GPT2D& operator=(const GPT2D&) = delete;

  std::string_view name() const override { return ""; }
  void collect_parameters(std::vector<Param<T>*>& out) override;
  BufferNeeds buffer_needs() const override;

  /// Layout-invariant initialisation: the same global weights as
  /// reference::Gpt<T>(config, seed), whatever q.
  void init(std::uint64_t seed) override;

  /// Mean cross-entropy over all batch*seq tokens (the same on every rank).
  /// tokens and targets are the global [batch, seq] ids (row-major, targets
  /// already shifted), the same on every rank.
  double forward(std::span<const std::int32_t> tokens,
                 std::span<const std::int32_t> targets) override;
  /// Parameter gradients of the last forward's loss: overwritten, or added
  /// to with `accumulate`.
  void backward(bool accumulate = false) override;

  const reference::GptConfig& config() const override { return config_; }
  const GptOptions& options() const override { return options_; }
  index_t batch() const override { return batch_; }
  index_t seq() const override { return seq_; }
  ProcessGrid& grid() const override { return engine_->grid(); }
  ParameterStore<T>& parameters_store() override { return *store_; }
  ModelBuffers& buffers() { return *buffers_; }
  MemoryReport memory_report() const override;

  Embedding2D<T>& embedding() { return *embedding_; }
  TransformerBlock2D<T>& block(int i) { return *blocks_.at(static_cast<std::size_t>(i)); }
  LayerNorm2DLayer<T>& ln_f() { return *ln_f_; }
  LMHead2D<T>& head() { return *head_; }

  /// Local block views, valid until the next forward: x_i (i = 0: the
  /// embeddings, i = n_layer: the last block's output), LN_f's output and
  /// (until backward) the logits [b*s/q, V/q].
  ConstMatrixView<T> boundary(int i) const;
  ConstMatrixView<T> final_norm() const { return lnf_; }
  ConstMatrixView<T> logits() const { return head_->logits(); }
  /// dL/dx_0 (the embeddings) after backward.
  ConstMatrixView<T> input_grad() const { return input_grad_; }

 private:
  struct Bucket {
    T* begin = nullptr;
    index_t count = 0;
    Request request;
  };
  void reduce_bucket(std::size_t k);
  void finish_gradients();

  SummaEngine* engine_;
  reference::GptConfig config_;
  GptOptions options_;
  index_t batch_, seq_;
  int q_;
  int data_;             // data-parallel groups
  index_t local_batch_;  // sequences per data group
  std::unique_ptr<Embedding2D<T>> embedding_;
  std::vector<std::unique_ptr<TransformerBlock2D<T>>> blocks_;
  std::unique_ptr<LayerNorm2DLayer<T>> ln_f_;
  std::unique_ptr<LMHead2D<T>> head_;
  std::unique_ptr<ParameterStore<T>> store_;
  std::unique_ptr<ModelBuffers> buffers_;
  std::vector<MatrixView<T>> boundaries_;  // x_0..x_N in the checkpoint buffer
  MatrixView<T> conj_[2]{};
  MatrixView<T> lnf_{};
  MatrixView<T> input_grad_{};
  std::vector<std::int32_t> tokens_, targets_;  // this data group's ids
  std::vector<Bucket> buckets_;                 // gradient buckets of the data axis
  bool have_forward_ = false;
};

extern template class GPT2D<float>;
extern template class GPT2D<double>;

}  // namespace summa

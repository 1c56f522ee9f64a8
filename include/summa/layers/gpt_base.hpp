#pragma once
/// \file gpt_base.hpp
/// The training step of a distributed GPT-2, shared by every scheme: the
/// schemes (GPT2D, GPT1D, ...) only build their layers; GptBase runs them.
///
///   x_0 = Embedding(tokens); x_{i+1} = Block_i(x_i); loss = Head(LN_f(x_N))
///
/// The block boundaries x_0..x_N live in the checkpoint buffer. With
/// checkpointing, forward releases each block's forward-buffer allocations
/// and backward recomputes block i from x_i (its output goes to the free
/// conjunction slot) before differentiating it; without, every block's
/// activations stay in the forward buffer. Gradients of block i flow to
/// block i-1 through the two conjunction slots.
///
/// Data-parallel axis (grid.shape().data = D > 1): every data group holds a
/// full model copy on its tensor ranks and takes batch/D consecutive
/// sequences of the global batch (group d: sequences [d*batch/D,
/// (d+1)*batch/D)). The head normalises the loss by the *global* token
/// count, so group losses and gradients add up: the loss is all-reduced
/// over the data axis, and backward all-reduces the gradients in buckets —
/// LN_f, then each block as soon as its backward is done, then the
/// embedding — non-blocking, in flight while the blocks below run, and
/// waits for all of them at its end (the one completion point). A scheme
/// that defers gradient work (GPT3D with ORS) completes it at the same point,
/// before the buckets are all-reduced.

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "summa/comm/communicator.hpp"
#include "summa/layers/gpt_model.hpp"

namespace summa {

/// Token ids in, activations out (Embedding2D, Embedding1D, ...).
template <class T>
class EmbeddingModule : public Module<T> {
 public:
  /// Throws summa::Error on every rank of the tensor group unless `ids`
  /// holds the layer's batch*seq ids, each in [0, vocab).
  virtual void check_ids(std::span<const std::int32_t> ids, const char* what) const = 0;
  virtual void forward(std::span<const std::int32_t> tokens, MatrixView<T> Y,
                       StepBuffers& buffers) = 0;
  virtual void backward(ConstMatrixView<T> dY, StepBuffers& buffers, bool accumulate = false) = 0;
};

/// Activations and targets in, loss out (LMHead2D, LMHead1D, ...).
template <class T>
class LossHead : public Module<T> {
 public:
  virtual double forward(ConstMatrixView<T> X, std::span<const std::int32_t> targets,
                         StepBuffers& buffers) = 0;
  virtual void backward(MatrixView<T> dX, StepBuffers& buffers, bool accumulate = false) = 0;
  /// Local logits of the last forward (backward overwrites them with dL/dlogits).
  virtual ConstMatrixView<T> logits() const = 0;
};

template <class T>
class GptBase : public GptModel<T> {
 public:
  ~GptBase() override;
  GptBase(const GptBase&) = delete;
  GptBase& operator=(const GptBase&) = delete;

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
  ParameterStore<T>& parameters_store() override;
  MemoryReport memory_report() const override;
  ModelBuffers& buffers();

  /// Data-parallel groups and the sequences each one takes.
  int data_groups() const { return data_; }
  index_t local_batch() const { return local_batch_; }

  /// Local views, valid until the next forward: x_i (i = 0: the embeddings,
  /// i = n_layer: the last block's output), LN_f's output, and (until
  /// backward) the local logits.
  ConstMatrixView<T> boundary(int i) const;
  ConstMatrixView<T> final_norm() const { return lnf_; }
  ConstMatrixView<T> logits() const { return head_->logits(); }
  /// dL/dx_0 (local block of the embeddings' gradient) after backward.
  ConstMatrixView<T> input_grad() const { return input_grad_; }

 protected:
  /// `what` names the scheme in messages. Checks what every scheme needs
  /// (a valid config, positive sizes, seq <= n_positions, batch divisible by
  /// the data groups) with the same error on every rank.
  GptBase(const char* what, ProcessGrid& grid, Backend& backend, const reference::GptConfig& config,
          index_t batch, index_t seq, GptOptions options);
  /// Called by the scheme's constructor once embedding_, blocks_, ln_f_ and
  /// head_ exist: allocates parameters and buffers. Local activation blocks
  /// are rows x cols.
  void finish_construction(index_t rows, index_t cols);

  /// Hooks for a scheme whose layers share overlap state across calls
  /// (GPT3D's ORS / OAG). begin_forward() runs first in every forward.
  virtual void begin_forward() {}
  /// True when some parameter gradients are complete only after
  /// complete_deferred(); the data-axis buckets are then all-reduced after it
  /// rather than block by block.
  virtual bool defers_gradients() const { return false; }
  /// Completes deferred gradient work; part of backward()'s completion point.
  virtual void complete_deferred() {}
  /// The scheme's own buffers, for memory_report() (planned or allocated).
  virtual void append_buffers(std::vector<BufferUsage>& /*out*/) const {}

  ProcessGrid* grid_;
  Backend* backend_;
  reference::GptConfig config_;
  GptOptions options_;
  index_t batch_, seq_;
  int data_;
  index_t local_batch_;
  std::unique_ptr<EmbeddingModule<T>> embedding_;
  std::vector<std::unique_ptr<Layer<T>>> blocks_;
  std::unique_ptr<Layer<T>> ln_f_;
  std::unique_ptr<LossHead<T>> head_;

 private:
  struct Bucket {
    T* begin = nullptr;
    index_t count = 0;
    Request request;
  };
  void reduce_bucket(std::size_t k);

  void require_allocated(const char* what) const;

  index_t rows_ = 0, cols_ = 0;  // local activation block
  ModelBuffers::Sizes sizes_{};  // of every step buffer
  std::size_t parameter_bytes_ = 0;
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

extern template class GptBase<float>;
extern template class GptBase<double>;
extern template class GptBase<bf16>;

}  // namespace summa

#pragma once
/// \file gpt.hpp
/// A distributed GPT-2, written once for every scheme: the scheme context
/// (layers/scheme_context.hpp) supplies the embedding, LayerNorm and LM head
/// and the linears inside the TransformerBlocks (layers/transformer.hpp);
/// Gpt builds the model from them and runs the training step. The same
/// model as summa::reference::Gpt (names, shapes, initialisation, loss), so
/// the two can be compared element by element.
///
///   x_0 = Embedding(tokens); x_{i+1} = Block_i(x_i); loss = Head(LN_f(x_N))
///
/// Activations are `outer` blocks of the scheme (see SchemeContext). No
/// dropout (summa's layers are deterministic, so the distributed model
/// matches the serial one exactly).
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
/// that defers gradient work (3D with ORS) completes it at the same point,
/// before the buckets are all-reduced.

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "summa/comm/communicator.hpp"
#include "summa/layers/gpt_model.hpp"
#include "summa/layers/sampling.hpp"
#include "summa/layers/scheme_context.hpp"
#include "summa/layers/transformer.hpp"

namespace summa {

/// The GPT's own ops as the profiler and the step-time model name them
/// (the block's are block_op, layers/transformer.hpp).
namespace gpt_op {
inline constexpr std::string_view embedding = "embedding", ln_f = "ln_f", lm_head = "lm_head",
                                  data_axis = "data_axis";
/// Distributed checkpoints: a block's input all-gathered before its
/// recompute (Phase::recompute, count n_layer). Named as a block op: it is
/// part of each block's cost (stem-only studies, the data axis's bucket
/// timing) and is timed inside the profile's "blocks" recompute part.
inline constexpr std::string_view checkpoint_gather = "block.checkpoint_gather";
}  // namespace gpt_op

template <class T>
class Gpt final : public GptModel<T> {
 public:
  /// Builds the layers with `scheme` (which must outlive the model), sizes
  /// every buffer and allocates parameters (zero; call init()). batch
  /// (global) and seq are fixed: buffers are sized for them. Checks what
  /// every scheme needs (a valid config, positive sizes, seq <=
  /// n_positions, batch divisible by the data groups) and the scheme's own
  /// constraints (SchemeContext::check_gpt), with the same error on every
  /// rank. Token and target ids are checked every step.
  Gpt(SchemeContext<T>& scheme, const GptConfig& config, index_t batch, index_t seq,
      GptOptions options = {});
  ~Gpt() override;
  Gpt(const Gpt&) = delete;
  Gpt& operator=(const Gpt&) = delete;

  std::string_view name() const override { return ""; }
  void collect_parameters(std::vector<Param<T>*>& out) override;
  BufferNeeds buffer_needs() const override;
  /// A training step's forward (Phase::forward: the embedding, the blocks,
  /// ln_f, the LM head and its loss) or its backward (Phase::backward: the
  /// head down to the embedding, each block recomputed first when
  /// checkpointing), on this rank; the blocks' ops are recorded once, with
  /// count n_layer. The data axis is not included (data_bucket_elements).
  void price(cost::Tally& t, model::Phase phase) const override;
  /// The local gradient elements of each data-axis bucket, in the order
  /// backward all-reduces them: ln_f, the blocks from the last to the
  /// first, the embedding.
  std::vector<std::uint64_t> data_bucket_elements();

  void init(std::uint64_t seed) override;
  double forward(std::span<const std::int32_t> tokens,
                 std::span<const std::int32_t> targets) override;
  void backward(bool accumulate = false) override;

  const GptConfig& config() const override { return config_; }
  const GptOptions& options() const override { return options_; }
  index_t batch() const override { return batch_; }
  index_t seq() const override { return seq_; }
  ProcessGrid& grid() const override { return *grid_; }
  ParameterStore<T>& parameters_store() override;
  MemoryReport memory_report() const override;
  std::span<const StepPart> profile() const override;
  void reset_profile() override;
  ModelBuffers& buffers();

  /// Forward without targets (inference): the logits of every position,
  /// vocabulary-parallel in the scheme's layout (logits(), logits_block()),
  /// and no loss (the head is called with no targets). Checks the ids as
  /// forward() does; backward() cannot follow it.
  void forward_logits(std::span<const std::int32_t> tokens);
  /// With a key / value cache (GptOptions::kv_cache): the window's tokens
  /// (global [batch, seq]) sit at positions [start, start + seq) of every
  /// sequence; their keys and values go to the cache there and attention
  /// reads the cache up to each token's position (the earlier positions
  /// from the forwards before). Then the logits, as forward_logits. Throws
  /// summa::Error on every rank when the window passes the cache.
  void forward_cached(std::span<const std::int32_t> tokens, index_t start);
  /// Where this rank's logits() sit in its data group's [local_batch * seq,
  /// vocab] logits (rows: sequence-major positions; one owner per copy).
  ActivationBlock logits_block() const;
  /// The next token of every sequence b of the global batch from the last
  /// forward's logits at position positions[b] (summa::choose_tokens over the
  /// tensor group, row key b: no rank gathers the vocabulary), among ids
  /// below `vocab_limit` (0: the model's vocabulary, e.g. a tokenizer's
  /// smaller one); then shared over the data axis. The same ids on every
  /// rank. Collective; throws summa::Error on every rank for positions
  /// outside [0, seq), a wrong count, bad options or no forward.
  std::vector<std::int32_t> next_tokens(std::span<const index_t> positions,
                                        const SamplingOptions& options, std::uint64_t step,
                                        index_t vocab_limit = 0);
  /// The same with each sequence's own noise step (steps[b]: e.g. how many
  /// tokens sequence b has generated so far).
  std::vector<std::int32_t> next_tokens(std::span<const index_t> positions,
                                        const SamplingOptions& options,
                                        std::span<const std::uint64_t> steps,
                                        index_t vocab_limit = 0);

  // ---- a pipeline stage (GptOptions::pipeline active) ----------------------
  // The model is one stage of PipelineGpt: `batch` is one microbatch's global
  // sequences and every call names the activation slot (0 .. slots - 1) the
  // microbatch occupies from its forward until its backward.
  /// The microbatch's forward on this stage: the embedding of `tokens` (the
  /// first stage; global [batch, seq] ids of the microbatch) or the input in
  /// stage_input(slot), the stage's blocks (each block's input kept in the
  /// slot), and on the last stage LN_f, the head's loss against `targets`
  /// and at once the head's and LN_f's backward into stage_output_grad(slot)
  /// (their state is not kept across microbatches). Returns the last stage's
  /// loss share of this data group (normalised by loss_tokens, not reduced
  /// over the data axis); 0 elsewhere. The ids a stage does not use may be
  /// empty. `differentiate` false (evaluation): no head backward, no
  /// gradient touched.
  double stage_forward(int slot, std::span<const std::int32_t> tokens,
                       std::span<const std::int32_t> targets, bool differentiate = true);
  /// The microbatch's backward on this stage from stage_output_grad(slot):
  /// each block recomputed from its kept input (Recompute::full) or its
  /// activations put back from the slot (none, selective), and
  /// differentiated, then the
  /// embedding's backward (first stage) or dL/d input in stage_input_grad().
  /// Gradients are always added to (zero them at the start of a batch).
  /// `final` (the batch's last microbatch): the data-axis buckets are
  /// issued as each block finishes and completed before it returns, as
  /// backward() does.
  void stage_backward(int slot, bool final);
  /// Where the previous stage's output lands (not on the first stage).
  MatrixView<T> stage_input(int slot);
  /// The stage's output after stage_forward (not on the last stage); kept
  /// until the slot's backward.
  ConstMatrixView<T> stage_output(int slot) const;
  /// dL/d stage output: where the next stage's gradient lands (the last
  /// stage's head writes it).
  MatrixView<T> stage_output_grad(int slot);
  /// The embedding's gradients (wte, then wpe: contiguous) on a pipeline's
  /// first or last stage (P > 1), and as many elements of room ("pipeline"
  /// buffer) for the other copy's: PipelineGpt exchanges and adds them.
  /// Empty elsewhere.
  std::span<T> stage_embedding_grads();
  std::span<T> stage_exchange();
  /// Elements of one stage message on this rank (known to a plan_only
  /// model too): a microbatch's activations (stage_input, stage_output) or
  /// their gradient; and of the tied embedding's gradients the end stages
  /// exchange once per batch (0 elsewhere).
  index_t stage_message_elements() const { return rows_ * cols_; }
  std::size_t stage_exchange_elements() const { return exchange_elements_; }
  /// dL/d stage input after stage_backward (not on the first stage); valid
  /// until the next stage_backward.
  ConstMatrixView<T> stage_input_grad() const { return input_grad_; }
  /// The blocks [first, last) this model holds (the whole model: 0, n_layer).
  int first_block() const { return first_block_; }
  int last_block() const { return first_block_ + static_cast<int>(blocks_.size()); }
  bool has_embedding() const { return embedding_ != nullptr; }
  bool has_head() const { return head_ != nullptr; }

  /// Data-parallel groups and the sequences each one takes.
  int data_groups() const { return data_; }
  index_t local_batch() const { return local_batch_; }

  /// Local views, valid until the next forward: x_i (i = 0: the embeddings,
  /// i = n_layer: the last block's output), LN_f's output, and (until
  /// backward) the local logits. With distributed checkpoints
  /// (distributes_checkpoints()) this rank keeps only its chunk of x_i for
  /// i < n_layer: boundary(i) throws summa::Error for those (use
  /// gather_boundary), and x_n_layer's slot serves backward's gathers (valid
  /// until backward).
  ConstMatrixView<T> boundary(int i) const;
  /// Writes this rank's whole local x_i (as boundary(i) would be) to `out`
  /// (dense row-major, boundary-shaped), after a forward: with distributed
  /// checkpoints an all-gather over SchemeContext::checkpoint_group
  /// (collective over it for i < n_layer), else a copy.
  void gather_boundary(int i, MatrixView<T> out);
  /// Whether this model keeps 1/g of each checkpointed block input
  /// (SchemeContext::checkpoint_group of g ranks, with Recompute::full;
  /// never for inference, which keeps no checkpoints).
  bool distributes_checkpoints() const { return ckpt_group_ != nullptr; }
  ConstMatrixView<T> final_norm() const { return lnf_; }
  ConstMatrixView<T> logits() const { return head_->logits(); }
  /// dL/dx_0 (local block of the embeddings' gradient) after backward.
  ConstMatrixView<T> input_grad() const { return input_grad_; }

  SchemeContext<T>& scheme() const { return *scheme_; }
  EmbeddingModule<T>& embedding() { return *embedding_; }
  TransformerBlock<T>& block(int i) { return *blocks_.at(static_cast<std::size_t>(i)); }
  Layer<T>& ln_f() { return *ln_f_; }
  LossHead<T>& head() { return *head_; }

 private:
  void finish_construction(index_t rows, index_t cols);

  SchemeContext<T>* scheme_;
  ProcessGrid* grid_;
  Backend* backend_;
  GptConfig config_;
  GptOptions options_;
  index_t batch_, seq_;
  int data_;
  index_t local_batch_;
  std::unique_ptr<EmbeddingModule<T>> embedding_;
  std::vector<std::unique_ptr<TransformerBlock<T>>> blocks_;
  std::unique_ptr<Layer<T>> ln_f_;
  std::unique_ptr<LossHead<T>> head_;

  // A bucket's gradients and their data-axis all-reduce (zero=0, 1;
  // sharded gradients go through the store's units: unit_grads_).
  struct Bucket {
    T* begin = nullptr;
    index_t count = 0;
    Request request;
  };
  void reduce_bucket(std::size_t k);
  void issue_bucket(Bucket& b);
  void wait_bucket(Bucket& b);

  // ZeRO-2 or 3 (unit_grads_): the store's units are the embedding (0),
  // block i (1 + i) and LN_f (n_layer + 1).
  std::vector<ParameterUnit> parameter_units() const;
  std::size_t block_unit(index_t i) const { return static_cast<std::size_t>(1 + i); }
  std::size_t ln_f_unit() const { return static_cast<std::size_t>(config_.n_layer) + 1; }
  // Before block i runs (i = -1: the embedding; n_layer: the head in
  // backward), in the direction `step` (+1 forward, -1 backward): the
  // gathers of the blocks i .. i + (slots - 1) step issued, the first
  // slots - 1 of them completed.
  void stage_blocks(index_t i, index_t step);
  bool sharded_values_ = false;  // ZeRO-3: the units' values gathered ahead of use
  // ZeRO-2 or 3: each unit's gradients formed in a gradient slot of the
  // store and reduce-scattered onto the groups' chunks (a scheme that
  // defers its gradients, 3D's ORS, gives every block a slot: every
  // block's are in flight at once)
  bool unit_grads_ = false;
  index_t block_value_slots_ = 2;

  void require_allocated(const char* what) const;
  bool staged() const { return options_.pipeline.active(); }
  void require_stage(const char* what, int slot) const;
  void require_whole(const char* what) const;
  void take_ids(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets,
                bool check_tokens, bool check_targets, std::size_t slot = 0);
  int first_block_ = 0;
  std::size_t exchange_elements_ = 0, exchange_bytes_ = 0;
  std::unique_ptr<Arena> exchange_;          // pipeline: the other embedding copy's gradients
  std::vector<MatrixView<T>> output_grads_;  // pipeline: dL/d stage output, per slot
  /// Per-block checkpoints (Recompute::full).
  bool checkpointed() const { return options_.recompute == Recompute::full; }
  // A pipeline stage without per-block checkpoints (recompute none or
  // selective) keeps each block's buffers.forward region per slot: copied
  // out of the region after the block's forward, back before its backward
  // (the block's views point into the region; only LN_1's view of the
  // block's input lies outside it, restored with TransformerBlock::
  // restore_input). kept_block_bytes_: a block's region (its
  // buffer_needs().forward); kept_mark_ and kept_used_: where the blocks'
  // forwards took it and how much (the same for every block and slot).
  bool keeps_activations() const { return staged() && !checkpointed() && !options_.inference; }
  std::size_t kept_block_bytes_ = 0, kept_mark_ = 0, kept_used_ = 0;
  bool kept_known_ = false;
  std::byte* kept_ = nullptr;  // slots x stage blocks regions, in the checkpoint buffer
  std::byte* kept_region(std::size_t slot, std::size_t block) const;
  void keep_block(std::size_t slot, std::size_t block, std::size_t mark);
  void restore_block(std::size_t slot, std::size_t block);

  // GptOptions::profile: the parts, in step order, and their timing.
  enum Part : std::uint8_t {
    fwd_embedding,
    fwd_blocks,
    fwd_ln_f,
    fwd_lm_head,
    bwd_lm_head,
    bwd_ln_f,
    rec_blocks,
    bwd_blocks,
    bwd_embedding,
    bwd_data_axis,
    part_count
  };
  // ... then each block op (the step-time model's "block.*" names) per
  // phase, nested in the blocks parts: timed by the layers through
  // StepBuffers::clock.
  static constexpr std::array<std::string_view, 8> block_ops = {
      block_op::ln_1, block_op::c_attn, block_op::core, block_op::attn_c_proj,
      block_op::ln_2, block_op::c_fc,   block_op::gelu, block_op::mlp_c_proj};
  static constexpr std::size_t block_phases = 3;  // forward, recompute, backward
  std::array<StepPart, part_count + block_phases * block_ops.size()> parts_{};
  template <class F>
  void timed(Part part, F&& work);
  class Clock final : public OpClock {
   public:
    explicit Clock(Gpt& owner) : owner_(&owner) {}
    void begin(std::string_view op) override;
    void end(std::string_view op, bool counted) override;
    std::size_t phase = 0;  // into block_phases

   private:
    Gpt* owner_;
    std::chrono::steady_clock::time_point start_{};
  };
  Clock clock_{*this};
  StepBuffers step_buffers();
  StepBuffers begin_forward_step();

  index_t rows_ = 0, cols_ = 0;  // local activation block
  ModelBuffers::Sizes sizes_{};  // of every step buffer
  std::size_t parameter_bytes_ = 0, gradient_bytes_ = 0;
  index_t parameter_elements_ = 0;  // padded, as the store's
  std::unique_ptr<ParameterStore<T>> store_;
  std::unique_ptr<ModelBuffers> buffers_;
  std::vector<MatrixView<T>> boundaries_;  // x_0..x_N in the checkpoint buffer
  // Distributed checkpoints: the group, each chunk's elements, and this
  // rank's chunk of x_0..x_{N-1} (boundaries_[i < N] are then the
  // conjunction slots forward runs through, boundaries_[N] the gather slot).
  Communicator* ckpt_group_ = nullptr;
  index_t ckpt_chunk_ = 0;
  std::vector<MatrixView<T>> chunks_;
  void keep_chunk(const MatrixView<T>& x, MatrixView<T> chunk);
  void save_chunk(int i);
  // A pipeline stage's chunks: per slot, of its inner boundaries x[1..n-1].
  MatrixView<T> stage_chunk(std::size_t slot, std::size_t i) const;
  MatrixView<T> conj_[2]{};
  MatrixView<T> lnf_{};
  MatrixView<T> input_grad_{};
  std::vector<std::int32_t> tokens_, targets_;  // this data group's ids
  std::vector<std::int32_t> no_targets_;        // the targets forward_logits passes
  std::vector<T> host_logits_;                  // next_tokens: the chosen rows on the host
  std::vector<std::int32_t> cache_positions_;   // forward_cached: the window's positions
  std::size_t kv_bytes_ = 0;                    // the key / value cache (GptOptions::kv_cache)
  std::unique_ptr<Arena> kv_;
  std::vector<Bucket> buckets_;  // gradient buckets of the data axis
  bool have_forward_ = false;    // a forward with its loss: backward may follow
  bool have_logits_ = false;     // a forward's logits (with or without the loss)
  bool logits_only_ = false;     // set by forward_logits while it runs
};

extern template class Gpt<float>;
extern template class Gpt<double>;
extern template class Gpt<bf16>;

}  // namespace summa

#pragma once
/// \file scheme_context.hpp
/// What a tensor-parallel scheme supplies to the layers written once
/// (Attention, MLP, TransformerBlock, Gpt; layers/transformer.hpp, gpt.hpp):
/// its linear, LayerNorm, vocabulary-parallel embedding and loss head, the
/// local block of an activation, and how attention's sequences and heads
/// are split. One object per model, made for a grid (and, for 2D, a SUMMA
/// engine): summa::Megatron1DContext, summa::Summa2DContext and
/// summa::Axonn3DContext (include/summa/schemes/), or make_context() from a
/// SchemeSpec.
///
/// Activation layouts. A global activation [tokens, width] sits on a rank as
/// a local block local_rows(tokens, layout) x local_cols(width, layout). Block inputs
/// and outputs (the residual stream, LayerNorm) are `outer`; the activations
/// between an expanding and a contracting linear (attention's qkv and
/// context, the MLP's 4h) are `inner`:
///
///   scheme   outer                    inner
///   1D       [T, w] (replicated)      [T, w/p] (columns split)
///   1D, sp   [T/p, w] (rows split)    [T, w/p] (columns split)
///   2D       [T/q, w/q]               [T/q, w/q]
///   3D       [T/Gz, w/Gy] (Y-layout)  [T/Gz, w/Gx] (X-layout)
///
/// A linear made with LinearRole::expand reads `outer` and writes `inner`
/// (1D: column-parallel; 3D: normal orientation), one made with
/// LinearRole::contract reads `inner` and writes `outer` (1D: row-parallel;
/// 3D: transposed), so a pair never redistributes an activation (1D with
/// sequence parallelism: the expanding linear gathers its input's rows and
/// the contracting one reduce-scatters its output, in place of 1D's
/// all-reduces).
///
/// Attention is local once qkv is `inner`: whole sequences are split over
/// sequence_split() ranks and whole heads over head_split() ranks.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "summa/grid/process_grid.hpp"
#include "summa/layers/layer.hpp"
#include "summa/layers/split_layer_norm.hpp"
#include "summa/memory/buffers.hpp"
#include "summa/model/config.hpp"

namespace summa {

/// Where an activation sits (see the file comment).
enum class ActivationLayout : std::uint8_t { outer, inner };

/// A linear's place in an expand / contract pair (see the file comment).
enum class LinearRole : std::uint8_t { expand, contract };

/// What a rank holds of a global [tokens, width] activation of its data
/// group: global rows [row0, row0 + rows) and columns [col0, col0 + cols),
/// stored as its local row-major block. Where a layout replicates a block
/// over ranks (1D outer, 3D outer over X and inner over Y), exactly one of
/// the copies is the owner, so summing the owners' blocks covers every
/// element once (the activation counterpart of ParamShard).
struct ActivationBlock {
  index_t row0 = 0, rows = 0, col0 = 0, cols = 0;
  bool owner = true;
};

/// A loss on logits in the `inner` layout of an expanding linear (the
/// vocabulary- or class-parallel cross-entropy of the scheme): forward
/// returns the summed loss of the data group's tokens / normalizer, the
/// same on every rank of the tensor group (nothing replicated is counted
/// twice); backward turns the logits into dL/dlogits in place.
template <class T>
class Loss {
 public:
  virtual ~Loss() = default;
  virtual BufferNeeds buffer_needs() const = 0;
  /// targets: the data group's [tokens] ids in [0, classes), the same on
  /// every rank of the group.
  virtual double forward(ConstMatrixView<T> Z, std::span<const std::int32_t> targets,
                         StepBuffers& buffers) = 0;
  virtual void backward(MatrixView<T> Z, StepBuffers& buffers) = 0;
};

template <class T>
class SchemeContext {
 public:
  SchemeContext(ProcessGrid& grid, Backend& backend) : grid_(&grid), backend_(&backend) {}
  virtual ~SchemeContext() = default;
  SchemeContext(const SchemeContext&) = delete;
  SchemeContext& operator=(const SchemeContext&) = delete;

  /// "1D", "2D", "3D": names the scheme in messages.
  virtual std::string_view label() const = 0;
  ProcessGrid& grid() const { return *grid_; }
  Backend& backend() const { return *backend_; }

  /// Local rows of a [tokens, ...] activation in `layout` on this rank
  /// (the layouts differ under 1D sequence parallelism only).
  virtual index_t local_rows(index_t tokens, ActivationLayout layout) const = 0;
  /// Local columns of a [..., width] activation in `layout`.
  virtual index_t local_cols(index_t width, ActivationLayout layout) const = 0;
  /// Ranks whole sequences are split over, and the name of that factor in
  /// messages ("q", "Gz"); 1 when every rank holds every sequence.
  virtual int sequence_split() const = 0;
  virtual const char* sequence_split_name() const = 0;
  /// Ranks whole attention heads are split over ("p", "q", "Gx").
  virtual int head_split() const = 0;
  virtual const char* head_split_name() const = 0;

  /// Y = X W + b, W [in, out] (HF Conv1D layout `<name>.weight`,
  /// `<name>.bias`). `groups` (ColumnGroups): `out` > 1 (expand only) makes
  /// the output columns that many equal groups, each split like a whole
  /// output (c_attn: 3, so a rank's inner qkv block is [Q | K | V] of its
  /// heads); `in` > 1 reads an input grouped so (a concatenation of
  /// branches), the weight's rows split to match.
  virtual std::unique_ptr<Layer<T>> linear(std::string name, index_t tokens, index_t in,
                                           index_t out, LinearRole role, bool has_bias = true,
                                           ColumnGroups groups = {}) = 0;
  /// Where the scheme runs its LayerNorm: the axes that split an `outer`
  /// activation's tokens and columns, and where the parameters live
  /// (summa/layers/split_layer_norm.hpp).
  virtual NormLayout norm_layout() const = 0;
  /// LayerNorm over the hidden dimension of an `outer` activation:
  /// SplitLayerNorm over norm_layout(), one algorithm for every scheme.
  std::unique_ptr<SplitLayerNorm<T>> layer_norm(std::string name, index_t tokens, index_t hidden,
                                                double eps = 1e-5) {
    return std::make_unique<SplitLayerNorm<T>>(grid(), backend(), norm_layout(), std::move(name),
                                               tokens, hidden, eps);
  }
  /// Token + position embeddings (wte vocabulary-parallel), `outer` output.
  virtual std::unique_ptr<EmbeddingModule<T>> embedding(index_t batch, index_t seq, index_t vocab,
                                                        index_t hidden, index_t n_positions) = 0;
  /// The tied LM head and vocabulary-parallel cross-entropy on `wte` (the
  /// embedding's parameter); the summed loss is divided by `normalizer`
  /// (0: tokens).
  virtual std::unique_ptr<LossHead<T>> lm_head(Param<T>& wte, index_t tokens, index_t hidden,
                                               index_t vocab, index_t normalizer = 0) = 0;

  /// The block of a [tokens, width] activation in `layout` this rank holds.
  virtual ActivationBlock activation_block(index_t tokens, index_t width,
                                           ActivationLayout layout) const = 0;
  /// Softmax cross-entropy over `classes` on logits in the inner layout
  /// ([tokens, classes] from a LinearRole::expand linear), divided by
  /// `normalizer` (0: tokens; pass the global token count with a data axis).
  virtual std::unique_ptr<Loss<T>> cross_entropy(index_t tokens, index_t classes,
                                                 index_t normalizer = 0) = 0;

  /// The scheme's constraints on a GPT of `config` and global `batch` (the
  /// data axis included), or nullopt. Gpt agrees on it across ranks.
  virtual std::optional<std::string> check_gpt(const GptConfig& config, index_t batch) const = 0;

  /// Every rank of the tensor group throws the same summa::Error if any
  /// rank has one.
  void agree(const std::optional<std::string>& error) const {
    grid_->agree(CommAxis::tensor, error);
  }

  /// Hooks for state shared by a model's layers (3D: the ORS / OAG overlap).
  /// After every layer is made: allocate (or, planning, only size) it.
  virtual void finish_layers(bool /*plan_only*/) {}
  /// First thing of every forward.
  virtual void begin_forward() {}
  /// True when some parameter gradients are complete only after
  /// complete_deferred() (the data-axis buckets then wait for it).
  virtual bool defers_gradients() const { return false; }
  /// Completes deferred gradient work (part of backward's completion point).
  virtual void complete_deferred() {}
  /// True when a layer may read the next layer's weights before that
  /// layer runs (3D's OAG prefetch, across block boundaries too): ZeRO-3
  /// then gathers two blocks ahead, not one.
  virtual bool prefetches_weights() const { return false; }
  /// Distributed activation checkpoints (1D "dc=on"): a group of the tensor
  /// axis whose ranks all hold the same whole outer activations. The Gpt
  /// then keeps rank r's 1/size of each checkpointed block input and
  /// all-gathers it over this group before the block's recompute. Null
  /// (the default): checkpoints whole.
  virtual Communicator* checkpoint_group() const { return nullptr; }
  /// The scheme's own buffers, for memory reports.
  virtual void append_buffers(std::vector<BufferUsage>& /*out*/) const {}

 private:
  ProcessGrid* grid_;
  Backend* backend_;
};

/// A scheme's cross-entropy class (CrossEntropy1D, 2D, 3D) behind Loss.
template <class T, class CrossEntropy>
class LossOf final : public Loss<T> {
 public:
  template <class... Args>
  explicit LossOf(Args&&... args) : ce_(std::forward<Args>(args)...) {}
  BufferNeeds buffer_needs() const override { return ce_.buffer_needs(); }
  double forward(ConstMatrixView<T> Z, std::span<const std::int32_t> targets,
                 StepBuffers& buffers) override {
    return ce_.forward(Z, targets, buffers);
  }
  void backward(MatrixView<T> Z, StepBuffers& buffers) override { ce_.backward(Z, buffers); }

 private:
  CrossEntropy ce_;
};

}  // namespace summa

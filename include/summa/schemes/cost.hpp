#pragma once
/// \file cost.hpp
/// The closed-form communication cost of a scheme's ops, in the
/// direct-exchange model of the traffic counters (docs/communication.md).
/// Each scheme implements OpCost (its registry row's op_cost makes one for
/// a rank); each op's cost is defined in the op's own source file, beside
/// its forward and backward (src/schemes/<scheme>/). parallel/traffic.cpp
/// composes a training step from the ops once for every scheme and adds
/// the data axis.

#include <cstdint>
#include <vector>

#include "summa/layers/scheme_context.hpp"
#include "summa/layers/vocab_parallel.hpp"
#include "summa/model/cost.hpp"
#include "summa/model/machine.hpp"
#include "summa/summa/engine.hpp"

namespace summa::cost {

/// One scheme's collectives per op on one rank: each call adds what the
/// op's forward or backward sends and receives there. Sizes are global:
/// `tokens` of the data group, widths as in the model; the scheme derives
/// its local blocks. A linear's role is as in SchemeContext::linear.
class OpCost {
 public:
  virtual ~OpCost() = default;

  virtual void linear_forward(Tally& t, u64 tokens, u64 in, u64 out, LinearRole role,
                              bool bias) const = 0;
  virtual void linear_backward(Tally& t, u64 tokens, u64 in, u64 out, LinearRole role,
                               bool bias) const = 0;
  virtual void layer_norm_forward(Tally& t, u64 tokens, u64 hidden) const = 0;
  virtual void layer_norm_backward(Tally& t, u64 tokens, u64 hidden) const = 0;
  /// Token + position embedding (SchemeContext::embedding).
  virtual void embedding_forward(Tally& t, u64 tokens, u64 vocab, u64 hidden,
                                 u64 positions) const = 0;
  virtual void embedding_backward(Tally& t, u64 tokens, u64 vocab, u64 hidden,
                                  u64 positions) const = 0;
  /// The tied LM head and its cross-entropy, the loss included
  /// (SchemeContext::lm_head).
  virtual void lm_head_forward(Tally& t, u64 tokens, u64 vocab, u64 hidden) const = 0;
  virtual void lm_head_backward(Tally& t, u64 tokens, u64 vocab, u64 hidden) const = 0;

  /// Local parameter elements on this rank (replicas included): what the
  /// rank's data-axis gradient buckets hold.
  virtual u64 linear_params(u64 in, u64 out, LinearRole role, bool bias) const = 0;
  virtual u64 layer_norm_params(u64 hidden) const = 0;
  virtual u64 embedding_params(u64 vocab, u64 hidden, u64 positions) const = 0;

  /// This rank's block of activations, as SchemeContext::local_rows,
  /// local_cols and head_split (for the work the layers do themselves:
  /// attention, GeLU, residual adds).
  virtual u64 local_rows(u64 tokens) const = 0;
  virtual u64 local_cols(u64 width, ActivationLayout layout) const = 0;
  virtual u64 head_split() const = 0;
  /// True when some gradients are complete only at the end of backward
  /// (SchemeContext::defers_gradients: the data-axis buckets wait for it).
  virtual bool defers_gradients() const { return false; }
};

/// The LayerNorm, embedding and LM head of a scheme that runs them as
/// layers/ writes them once (SplitLayerNorm, the vocabulary-parallel ops):
/// priced by the ops' own cost (norm_cost, vocab_cost) over the scheme's
/// layouts at this rank. The scheme prices its linears.
class LayoutCost : public OpCost {
 public:
  /// The layouts the ops run on at this rank.
  virtual NormLayout norm_layout() const = 0;
  virtual VocabLayout vocab_layout() const = 0;
  /// Element sizes of the model.
  virtual Elements elements() const = 0;

  void layer_norm_forward(Tally& t, u64 tokens, u64 hidden) const final {
    norm_cost::forward(t, norm_layout(), elements(), tokens, hidden);
  }
  void layer_norm_backward(Tally& t, u64 tokens, u64 hidden) const final {
    norm_cost::backward(t, norm_layout(), elements(), tokens, hidden);
  }
  u64 layer_norm_params(u64 hidden) const final { return norm_cost::params(norm_layout(), hidden); }
  void embedding_forward(Tally& t, u64 tokens, u64 vocab, u64 hidden, u64) const final {
    vocab_cost::embedding_forward(t, vocab_layout(), elements(), tokens, vocab, hidden);
  }
  void embedding_backward(Tally& t, u64 tokens, u64 vocab, u64 hidden, u64 positions) const final {
    vocab_cost::embedding_backward(t, vocab_layout(), elements(), tokens, vocab, hidden, positions);
  }
  void lm_head_forward(Tally& t, u64 tokens, u64 vocab, u64 hidden) const final {
    vocab_cost::lm_head_forward(t, vocab_layout(), elements(), tokens, vocab, hidden);
  }
  void lm_head_backward(Tally& t, u64 tokens, u64 vocab, u64 hidden) const final {
    vocab_cost::lm_head_backward(t, vocab_layout(), elements(), tokens, vocab, hidden);
  }
  u64 embedding_params(u64 vocab, u64 hidden, u64 positions) const final {
    return vocab_cost::embedding_params(vocab_layout(), vocab, hidden, positions);
  }
};

}  // namespace summa::cost

/// Declares the cost::OpCost overrides of a scheme's linear (inside the
/// class, with `using u64 = cost::u64;` before it).
#define SUMMA_OP_COST_LINEAR_OVERRIDES                                                          \
  void linear_forward(cost::Tally& t, u64 tokens, u64 in, u64 out, LinearRole role, bool bias)  \
      const override;                                                                           \
  void linear_backward(cost::Tally& t, u64 tokens, u64 in, u64 out, LinearRole role, bool bias) \
      const override;                                                                           \
  u64 linear_params(u64 in, u64 out, LinearRole role, bool bias) const override;

/// Declares every cost::OpCost override in a scheme's class (inside the
/// class, with `using u64 = cost::u64;` before it).
#define SUMMA_OP_COST_OVERRIDES                                                             \
  SUMMA_OP_COST_LINEAR_OVERRIDES                                                            \
  void layer_norm_forward(cost::Tally& t, u64 tokens, u64 hidden) const override;           \
  void layer_norm_backward(cost::Tally& t, u64 tokens, u64 hidden) const override;          \
  u64 layer_norm_params(u64 hidden) const override;                                         \
  void embedding_forward(cost::Tally& t, u64 tokens, u64 vocab, u64 hidden, u64 positions)  \
      const override;                                                                       \
  void embedding_backward(cost::Tally& t, u64 tokens, u64 vocab, u64 hidden, u64 positions) \
      const override;                                                                       \
  void lm_head_forward(cost::Tally& t, u64 tokens, u64 vocab, u64 hidden) const override;   \
  void lm_head_backward(cost::Tally& t, u64 tokens, u64 vocab, u64 hidden) const override;  \
  u64 embedding_params(u64 vocab, u64 hidden, u64 positions) const override;

#pragma once
/// \file cost.hpp
/// The closed-form communication cost of a scheme's ops, in the
/// direct-exchange model of the traffic counters (docs/communication.md).
/// Each scheme implements OpCost (its registry row's op_cost makes one for
/// a rank); each op's cost is defined in the op's own source file, beside
/// its forward and backward (src/schemes/<scheme>/). model/traffic.cpp
/// composes a training step from the ops once for every scheme and adds
/// the data axis.

#include <cstdint>

#include "summa/comm/counters.hpp"
#include "summa/layers/scheme_context.hpp"
#include "summa/summa/engine.hpp"

namespace summa::cost {

using u64 = std::uint64_t;

// Adds collectives to per-axis counters with the formulas of
// docs/communication.md; g = group size, r = this rank's group rank, e =
// element size, counts in elements. Per-row statistics (LayerNorm sums and
// a | b partials, cross-entropy row max, sum exp and target logit) travel in
// acc_t (fp32 for bf16 models), everything else in the element type.
class Tally {
 public:
  TrafficCounters t;

  void both(CommAxis a, u64 bytes) {
    t[a].bytes_sent += bytes;
    t[a].bytes_received += bytes;
  }
  void all_reduce(CommAxis a, u64 count, u64 g, u64 r, u64 e) {
    const u64 c = count / g + (r < count % g ? 1 : 0);
    both(a, (count - c + (g - 1) * c) * e);
  }
  void broadcast(CommAxis a, u64 count, u64 g, bool root, u64 e) {
    if (root)
      t[a].bytes_sent += (g - 1) * count * e;
    else
      t[a].bytes_received += count * e;
  }
  void reduce(CommAxis a, u64 count, u64 g, bool root, u64 e) {
    if (root)
      t[a].bytes_received += (g - 1) * count * e;
    else
      t[a].bytes_sent += count * e;
  }
  void gather_or_scatter(CommAxis a, u64 per_rank, u64 g, u64 e) {
    both(a, (g - 1) * per_rank * e);
  }
  // SUMMA (docs/communication.md, "SUMMA per call"), global m x n x k.
  void summa(Form f, u64 m, u64 n, u64 k, u64 q, u64 e) {
    const u64 mb = m / q, nb = n / q, kb = k / q;
    switch (f) {
      case Form::AB:
        both(CommAxis::mesh_row, (q - 1) * mb * kb * e);
        both(CommAxis::mesh_col, (q - 1) * kb * nb * e);
        break;
      case Form::ABt:
        both(CommAxis::mesh_row, (q - 1) * mb * nb * e);
        both(CommAxis::mesh_col, (q - 1) * nb * kb * e);
        break;
      case Form::AtB:
        both(CommAxis::mesh_row, (q - 1) * kb * mb * e);
        both(CommAxis::mesh_col, (q - 1) * mb * nb * e);
        break;
    }
  }
};

/// Element sizes of a model: e for activations and parameters, a for the
/// per-row statistics (acc_t: fp32 for bf16 models, e otherwise).
struct Elements {
  u64 e, a;
};

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
};

}  // namespace summa::cost

/// Declares every cost::OpCost override in a scheme's class (inside the
/// class, with `using u64 = cost::u64;` before it).
#define SUMMA_OP_COST_OVERRIDES                                                                 \
  void linear_forward(cost::Tally& t, u64 tokens, u64 in, u64 out, LinearRole role, bool bias)  \
      const override;                                                                           \
  void linear_backward(cost::Tally& t, u64 tokens, u64 in, u64 out, LinearRole role, bool bias) \
      const override;                                                                           \
  void layer_norm_forward(cost::Tally& t, u64 tokens, u64 hidden) const override;               \
  void layer_norm_backward(cost::Tally& t, u64 tokens, u64 hidden) const override;              \
  void embedding_forward(cost::Tally& t, u64 tokens, u64 vocab, u64 hidden, u64 positions)      \
      const override;                                                                           \
  void embedding_backward(cost::Tally& t, u64 tokens, u64 vocab, u64 hidden, u64 positions)     \
      const override;                                                                           \
  void lm_head_forward(cost::Tally& t, u64 tokens, u64 vocab, u64 hidden) const override;       \
  void lm_head_backward(cost::Tally& t, u64 tokens, u64 vocab, u64 hidden) const override;      \
  u64 linear_params(u64 in, u64 out, LinearRole role, bool bias) const override;                \
  u64 layer_norm_params(u64 hidden) const override;                                             \
  u64 embedding_params(u64 vocab, u64 hidden, u64 positions) const override;

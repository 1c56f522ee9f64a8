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

#include "summa/comm/counters.hpp"
#include "summa/layers/scheme_context.hpp"
#include "summa/layers/vocab_parallel.hpp"
#include "summa/model/machine.hpp"
#include "summa/summa/engine.hpp"

namespace summa::cost {

using u64 = std::uint64_t;

/// One piece of an op's work as the step-time model sees it (recorded by a
/// Tally whose `log` is set; model/step_time.hpp prices it on a machine).
struct Work {
  enum class Kind : std::uint8_t {
    collective,  ///< one collective on `axis` over `group` ranks
    summa,       ///< one SUMMA call (form, global m x n x k, q = group): the
                 ///< model expands it into panel steps with the engine's options
    gemm,        ///< `calls` calls of `batch` local products m x n x k each
    memory,      ///< element-wise work moving `bytes` to and from memory
    pointwise,   ///< a Pointwise kernel over `elements` moving `bytes`
  };
  Kind kind = Kind::memory;
  model::Collective collective = model::Collective::all_reduce;
  model::Pointwise function = model::Pointwise::gelu;
  CommAxis axis = CommAxis::other;
  Form form = Form::AB;
  /// A collective the op issues non-blocking and completes after compute it
  /// overlaps (2D bias broadcasts, 3D OAR / ORS / OAG).
  bool overlapped = false;
  u64 group = 1;
  /// This rank's bytes in the counters' model (collective, summa).
  u64 sent = 0, received = 0;
  /// collective: the buffer each rank holds (all-gather, reduce-scatter: the
  /// whole gathered one); memory: bytes read plus written.
  u64 bytes = 0;
  u64 m = 0, n = 0, k = 0, batch = 1, calls = 1;
  u64 elements = 0;  ///< pointwise: the kernel's elements
  u64 element = 0;   ///< element size of a gemm or summa
  /// summa: the options of the engine that runs the call (its panels,
  /// overlap, progress slices, shape agreement).
  SummaOptions summa{};
};

// Adds collectives to per-axis counters with the formulas of
// docs/communication.md; g = group size, r = this rank's group rank, e =
// element size, counts in elements. Per-row statistics (LayerNorm sums and
// a | b partials, cross-entropy row max, sum exp and target logit) travel in
// acc_t (fp32 for bf16 models), everything else in the element type. With
// `log` set, every collective and the ops' compute (gemm, memory) are also
// recorded as Work for the step-time model. Every collective also counts
// one call on its axis (a group of one included, as the counters count it);
// a SUMMA call counts its panel collectives on the mesh row and column, cut
// by the panel width of the engine that runs it.
class Tally {
 public:
  TrafficCounters t;
  std::vector<Work>* log = nullptr;
  /// Marks the collectives recorded while set as overlapped (Work::overlapped).
  bool overlapped = false;

  void all_reduce(CommAxis a, u64 count, u64 g, u64 r, u64 e) {
    const u64 c = count / g + (r < count % g ? 1 : 0);
    const u64 bytes = (count - c + (g - 1) * c) * e;
    add(a, bytes, bytes);
    collective(model::Collective::all_reduce, a, g, count * e, bytes, bytes);
  }
  void broadcast(CommAxis a, u64 count, u64 g, bool root, u64 e) {
    const u64 sent = root ? (g - 1) * count * e : 0, received = root ? 0 : count * e;
    add(a, sent, received);
    collective(model::Collective::broadcast, a, g, count * e, sent, received);
  }
  void reduce(CommAxis a, u64 count, u64 g, bool root, u64 e) {
    const u64 sent = root ? 0 : count * e, received = root ? (g - 1) * count * e : 0;
    add(a, sent, received);
    collective(model::Collective::reduce, a, g, count * e, sent, received);
  }
  /// All-gather or reduce-scatter of `per_rank` elements from or to each rank.
  void all_gather(CommAxis a, u64 per_rank, u64 g, u64 e) {
    gather_or_scatter(model::Collective::all_gather, a, per_rank, g, e);
  }
  void reduce_scatter(CommAxis a, u64 per_rank, u64 g, u64 e) {
    gather_or_scatter(model::Collective::reduce_scatter, a, per_rank, g, e);
  }
  // SUMMA (docs/communication.md, "SUMMA per call"), global m x n x k, on
  // an engine with options `o`.
  void summa(Form f, u64 m, u64 n, u64 k, u64 q, u64 e, const SummaOptions& o) {
    const u64 mb = m / q, nb = n / q, kb = k / q;
    u64 row = 0, col = 0;  // bytes per rank on the mesh row / column
    switch (f) {
      case Form::AB:
        row = (q - 1) * mb * kb * e;
        col = (q - 1) * kb * nb * e;
        break;
      case Form::ABt:
        row = (q - 1) * mb * nb * e;
        col = (q - 1) * nb * kb * e;
        break;
      case Form::AtB:
        row = (q - 1) * kb * mb * e;
        col = (q - 1) * mb * nb * e;
        break;
    }
    // q steps of ceil(block / panel) panels, each one collective on the row
    // and one on the column (none at q = 1: a local product)
    const u64 block = f == Form::AB ? kb : f == Form::ABt ? nb : mb;
    const u64 panel = o.panel <= 0 ? 0 : static_cast<u64>(o.panel);
    const u64 width = panel == 0 || panel > block ? block : panel;
    const u64 calls = q > 1 && width > 0 ? q * ((block + width - 1) / width) : 0;
    add(CommAxis::mesh_row, row, row, calls);
    add(CommAxis::mesh_col, col, col, calls);
    if (log != nullptr)
      log->push_back({.kind = Work::Kind::summa,
                      .form = f,
                      .group = q,
                      .sent = row + col,
                      .received = row + col,
                      .m = m,
                      .n = n,
                      .k = k,
                      .element = e,
                      .summa = o});
  }
  /// `calls` strided-batched calls of `batch` local products m x n x k of
  /// elements of e bytes (compute only).
  void gemm(u64 m, u64 n, u64 k, u64 e, u64 batch = 1, u64 calls = 1) {
    if (log != nullptr)
      log->push_back({.kind = Work::Kind::gemm,
                      .m = m,
                      .n = n,
                      .k = k,
                      .batch = batch,
                      .calls = calls,
                      .element = e});
  }
  /// Element-wise work reading and writing `bytes` in all (compute only).
  void memory(u64 bytes) {
    if (log != nullptr) log->push_back({.kind = Work::Kind::memory, .bytes = bytes});
  }
  /// A Pointwise kernel (GeLU, softmax, exp) over `elements`, reading and
  /// writing `bytes` in all (compute only).
  void pointwise(model::Pointwise f, u64 elements, u64 bytes) {
    if (log != nullptr)
      log->push_back(
          {.kind = Work::Kind::pointwise, .function = f, .bytes = bytes, .elements = elements});
  }

 private:
  void add(CommAxis a, u64 sent, u64 received, u64 calls = 1) {
    t[a].bytes_sent += sent;
    t[a].bytes_received += received;
    t[a].calls += calls;
  }
  void gather_or_scatter(model::Collective c, CommAxis a, u64 per_rank, u64 g, u64 e) {
    const u64 bytes = (g - 1) * per_rank * e;
    add(a, bytes, bytes);
    collective(c, a, g, g * per_rank * e, bytes, bytes);
  }
  void collective(model::Collective c, CommAxis a, u64 g, u64 buffer, u64 sent, u64 received) {
    if (log != nullptr && g > 1)
      log->push_back({.kind = Work::Kind::collective,
                      .collective = c,
                      .axis = a,
                      .overlapped = overlapped,
                      .group = g,
                      .sent = sent,
                      .received = received,
                      .bytes = buffer});
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

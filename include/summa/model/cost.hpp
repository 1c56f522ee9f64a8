#pragma once
/// \file cost.hpp
/// What an op costs on one rank, in the direct-exchange model of the traffic
/// counters (docs/communication.md): the bytes and calls it moves per axis,
/// and, for the step-time model, its work (collectives, SUMMA calls, local
/// products, memory traffic). Every module prices itself (Module::price,
/// layers/layer.hpp) into a Tally; a model's step is the walk of its
/// modules in the order they run.

#include <cstdint>
#include <string_view>
#include <vector>

#include "summa/comm/counters.hpp"
#include "summa/model/machine.hpp"
#include "summa/summa/engine.hpp"

namespace summa::model {
/// The phases of a training step.
enum class Phase : std::uint8_t { forward, backward, recompute, optimizer };
inline constexpr std::size_t phase_count = 4;
}  // namespace summa::model

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
  model::GemmMode mode = model::GemmMode::nn;  ///< gemm: how it takes its operands
  u64 elements = 0;                            ///< pointwise: the kernel's elements
  u64 element = 0;                             ///< element size of a gemm or summa
  /// summa: the options of the engine that runs the call (its panels,
  /// overlap, progress slices, shape agreement).
  SummaOptions summa{};
};

/// One op of a step as the step-time model sees it: its name (a static
/// string: "embedding", "block.attn.c_attn", ...), phase, how often a step
/// runs it and the work of one run.
struct StepOp {
  std::string_view name;
  model::Phase phase = model::Phase::forward;
  u64 count = 1;
  std::vector<Work> work;
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
  /// The step's ops (begin() starts one; `log` then records into it); null:
  /// counters only.
  std::vector<StepOp>* ops = nullptr;
  /// While false, begin() records nothing (the counters still count): the
  /// later runs of a block recorded once with count = `repeat`.
  bool record = true;
  u64 repeat = 1;

  /// Starts op `name` (static storage) of `phase`: what follows is its work.
  void begin(std::string_view name, model::Phase phase) {
    if (ops == nullptr) return;
    if (!record) {
      log = nullptr;
      return;
    }
    ops->push_back({.name = name, .phase = phase, .count = repeat, .work = {}});
    log = &ops->back().work;
  }

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
  /// elements of e bytes in `mode` (compute only).
  void gemm(model::GemmMode mode, u64 m, u64 n, u64 k, u64 e, u64 batch = 1, u64 calls = 1) {
    if (log != nullptr)
      log->push_back({.kind = Work::Kind::gemm,
                      .m = m,
                      .n = n,
                      .k = k,
                      .batch = batch,
                      .calls = calls,
                      .mode = mode,
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
/// The element sizes of a model of T.
template <class T>
constexpr Elements elements_of() {
  return {.e = sizeof(T), .a = sizeof(acc_t<T>)};
}

}  // namespace summa::cost

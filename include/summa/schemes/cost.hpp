#pragma once
/// \file cost.hpp
/// The closed-form communication cost of a scheme's ops, in the
/// direct-exchange model of the traffic counters (docs/communication.md):
/// each scheme's registry row adds the collectives of one training step to
/// a Tally (src/schemes/<scheme>/cost.cpp), and model/traffic.hpp adds the
/// data axis and returns the step total.

#include <cstdint>

#include "summa/comm/counters.hpp"
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

/// The model as the cost formulas see it.
struct Shape {
  u64 L, h, V, P, T;  // layers, hidden, vocabulary, positions, tokens per data group
  u64 e;              // element size
  u64 a;              // statistics element size: acc_t (fp32 for bf16), e otherwise
  bool checkpoint;
};

/// Local parameter elements of the data-axis gradient buckets on a rank.
struct BucketSizes {
  u64 ln_f, block, embedding;
};

}  // namespace summa::cost

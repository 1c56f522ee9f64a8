#pragma once
// One GPT training step on one rank, priced by walking the built model: a
// plan-only GPT (no memory, no communication) for the rank, its forward and
// backward priced by its modules (Module::price, summa/model/cost.hpp) in
// the order they run. The traffic model sums its bytes (traffic.cpp); the
// step-time model prices its ops (step_time.cpp). Not installed.

#include <algorithm>
#include <utility>
#include <vector>

#include "summa/grid/process_grid.hpp"
#include "summa/layers/gpt_model.hpp"
#include "summa/model/config.hpp"
#include "summa/model/cost.hpp"
#include "summa/schemes/spec.hpp"

namespace summa::model::detail {

using cost::u64;

/// One op of the step: what it does once, and how often a step does it.
using StepOp = cost::StepOp;

/// The data-axis gradient buckets of a rank: the local parameter elements
/// of ln_f, of one block, of the embedding.
struct Buckets {
  u64 ln_f, block, embedding;
  /// The packed local parameter elements, padded to a multiple of the data
  /// groups for a sharded data axis (ParameterStore::padded_elements with
  /// that multiple; zero=1's all-gather moves them; zero=2 and 3 pad each
  /// unit instead, Buckets::piece).
  u64 parameters = 0;
  /// SchemeContext::defers_gradients: the buckets wait for the end of backward.
  bool defers_gradients = false;
  /// zero=3: the blocks' value slots (Gpt: 3 when the scheme prefetches
  /// weights, else 2); the last this many blocks of forward are still
  /// gathered when backward starts.
  u64 block_value_slots = 2;
  /// zero=3: the blocks whose values backward gathers again.
  u64 regathered_blocks(u64 n_layer) const {
    return n_layer > block_value_slots ? n_layer - block_value_slots : 0;
  }

  /// A bucket's local elements [offset, offset + count) in the packed
  /// parameters (the embedding, block 0 .. N-1, ln_f), in the order
  /// backward reduces them: ln_f, the blocks from the last to the first,
  /// the embedding (Gpt::data_bucket_elements).
  struct Span {
    u64 offset, count;
  };
  std::vector<Span> spans(u64 n_layer) const {
    std::vector<Span> out{{embedding + n_layer * block, ln_f}};
    for (u64 l = n_layer; l-- > 0;) out.push_back({embedding + l * block, block});
    out.push_back({0, embedding});
    return out;
  }
  /// ZeRO-2 and 3: each group's piece of bucket (unit) `s`, padded to
  /// `data` equal pieces (ParameterStore's sharded layout).
  static u64 piece(Span s, u64 data) { return (s.count + data - 1) / data; }
};

/// Adds every collective of one training step (the data axis excepted) of
/// a GPT of `dtype` on the rank at `coords` to `t` and, when `ops` is
/// given, appends the step's ops with their work (each block op once, with
/// count = n_layer). Throws summa::Error as the model's constructor does
/// (sizes the scheme cannot split).
Buckets walk_step(const SchemeSpec& spec, const GptConfig& config, index_t batch, index_t seq,
                  GptOptions options, DType dtype, const GridCoords& coords, cost::Tally& t,
                  std::vector<StepOp>* ops);

}  // namespace summa::model::detail

#pragma once
// One GPT training step on one rank as a sequence of ops, composed once for
// every scheme from the scheme's op costs (schemes/cost.hpp) in the order
// Gpt runs its layers (layers/gpt.hpp, transformer.hpp). The traffic model
// sums its bytes (traffic.cpp); the step-time model prices its work
// (step_time.cpp). Not installed.

#include <string_view>
#include <vector>

#include "summa/grid/process_grid.hpp"
#include "summa/layers/gpt_model.hpp"
#include "summa/model/config.hpp"
#include "summa/model/step_time.hpp"
#include "summa/schemes/cost.hpp"

namespace summa::model::detail {

using cost::u64;

/// One op of the step: what it does once, and how often a step does it.
using StepOp = cost::StepOp;

/// A GPT step's sizes: tokens of the data group, global widths, the
/// element size of activations and parameters.
struct StepDims {
  u64 layers, tokens, seq, hidden, heads, vocab, positions, element;
  bool checkpoint;
};

/// The dims of a GPT of `config`, global `batch` over `data` groups.
StepDims step_dims(const GptConfig& config, index_t batch, index_t seq, int data, DType dtype,
                   bool checkpoint);

/// Adds every collective of one step (the data axis excepted) to `t` and,
/// when `ops` is given, appends the ops with their work (each block op once,
/// with count = layers). Returns the local parameter elements of the
/// data-axis buckets: ln_f, one block, the embedding.
struct Buckets {
  u64 ln_f, block, embedding;
  /// SchemeContext::defers_gradients: the buckets wait for the end of backward.
  bool defers_gradients = false;
};
Buckets compose_step(const cost::OpCost& op, cost::Tally& t, const StepDims& d,
                     std::vector<StepOp>* ops);

/// The same from the model itself: a plan-only GPT of `dtype` built for the
/// rank at `coords` (no memory, no communication), its training step priced
/// by walking its modules (Module::price): forward, then backward.
Buckets walk_step(const SchemeSpec& spec, const GptConfig& config, index_t batch, index_t seq,
                  GptOptions options, DType dtype, const GridCoords& coords, cost::Tally& t,
                  std::vector<StepOp>* ops);

}  // namespace summa::model::detail

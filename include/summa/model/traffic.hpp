#pragma once
/// \file traffic.hpp
/// Closed-form communication volume of one training step (forward +
/// backward) of a distributed GPT, per rank and per grid axis, in the
/// direct-exchange model the traffic counters use (docs/communication.md).
/// tests/parallel/test_traffic.cpp checks every prediction against the counters of
/// a real step, exactly. The derivation, per layer, is in
/// docs/communication.md ("A training step").

#include "summa/comm/counters.hpp"
#include "summa/grid/placement.hpp"
#include "summa/layers/gpt_model.hpp"
#include "summa/parallel/scheme.hpp"

namespace summa::model {

/// Bytes sent and received on every axis by the rank at `coords` in one
/// forward + backward of a GPT with this configuration (calls are left 0),
/// and with a sharded data axis (SchemeSpec::zero) and `optimizer_step` the
/// all-gather of the updated parameter chunks that follows the optimizer's
/// step (Trainer; compare_schemes times no optimizer and passes false),
/// with zero=2 after the gradient norm's sum over the data groups
/// (clip_grad_norm). A pipelined scheme (spec.pipeline): the rank at
/// `coords` of pipeline stage `stage` in one PipelineGpt::step of the
/// global `batch` (its M microbatches through the stage's model, the data
/// axis once, and CommAxis::pipe: the stage messages, the tied embedding's
/// gradients between the end stages, the loss's broadcast from the last).
TrafficCounters predict_step_traffic(const SchemeSpec& spec, const GptConfig& config, index_t batch,
                                     index_t seq, const GptOptions& options, DType dtype,
                                     const GridCoords& coords, bool optimizer_step = true,
                                     int stage = 0);

}  // namespace summa::model

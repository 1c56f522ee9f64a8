#pragma once
/// \file implementation.hpp
/// Implementation profiles (docs/scaling.md, "Implementation profiles"):
/// which code a step-time prediction prices. By default the model prices
/// this library's algorithms (SUMMA's pipelined panels, the overlapped
/// bias broadcasts, the data-axis buckets behind backward). A published
/// system made other choices, and a prediction of a paper's table should
/// price the system the paper measured:
///
///   summa           this library as built (the default)
///   optimus-2021    Xu et al.'s 2021 PyTorch Optimus (2D): each SUMMA step
///                   broadcasts and reduces whole blocks (panel 0), nothing
///                   overlapped (the SUMMA steps, the bias broadcasts, the
///                   data axis after backward), NCCL rings, the attention's
///                   products one batched call over the local batch
///                   (PyTorch's bmm)
///   megatron-2021   Megatron-LM as Narayanan et al. 2021 ran it (1D): ring
///                   all-reduces, its distributed activation checkpoints
///                   (dc=on with per-block recompute), no overlap of the
///                   tensor-parallel collectives, the data-parallel
///                   all-reduce after backward (its local DDP), the
///                   attention's products one batched call (baddbmm over
///                   the local batch and heads); no sequence parallelism
///                   (2022)
///   axonn           AxoNN (Singh et al. 2024; 3D): OAR, ORS and OAG all
///                   overlapped, the data axis behind backward
///
/// implement() turns a scheme, machine and options into the ones that price
/// the profile; each profile prices only its own system's scheme (a
/// 2D profile refuses a 1D scheme, naming both).

#include <string>
#include <string_view>
#include <vector>

#include "summa/layers/gpt_model.hpp"
#include "summa/model/machine.hpp"
#include "summa/model/step_time.hpp"
#include "summa/schemes/spec.hpp"

namespace summa::model {

enum class Implementation : std::uint8_t { summa, optimus_2021, megatron_2021, axonn };

/// "summa", "optimus-2021", "megatron-2021", "axonn".
std::string_view to_string(Implementation i);
/// Every profile, in declaration order.
std::vector<Implementation> all_implementations();
/// The inverse of to_string; anything else throws summa::Error naming
/// `text`, `what` and the profiles.
Implementation parse_implementation(std::string_view text, std::string_view what);
/// The scheme family a profile prices ("2d" for optimus-2021, "1d" for
/// megatron-2021, "3d" for axonn; empty for summa: any).
std::string_view scheme_of(Implementation i);

/// A prediction's inputs as the profile runs them.
struct Implemented {
  SchemeSpec spec;
  Machine machine;
  StepTimeOptions time;
};

/// The scheme, machine and step-time options that price `spec` as
/// implementation `i` runs it (summa: unchanged). Throws summa::Error when
/// `i` does not run `spec`'s scheme (naming both) or when the text asks for
/// something the system did not have (megatron-2021 with sp=on).
Implemented implement(Implementation i, const SchemeSpec& spec, const GptOptions& options,
                      const Machine& machine, const StepTimeOptions& time = {});

}  // namespace summa::model

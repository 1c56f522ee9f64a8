// Implementation profiles (model/implementation.hpp): a published system's
// choices as the scheme, machine and step-time options that price them.
#include "summa/model/implementation.hpp"

#include <fmt/format.h>

#include "summa/core/error.hpp"
#include "summa/schemes/axonn3d/spec.hpp"
#include "summa/schemes/megatron1d/spec.hpp"
#include "summa/schemes/summa2d/spec.hpp"

namespace summa::model {

std::string_view to_string(Implementation i) {
  switch (i) {
    case Implementation::summa:
      return "summa";
    case Implementation::optimus_2021:
      return "optimus-2021";
    case Implementation::megatron_2021:
      return "megatron-2021";
    case Implementation::axonn:
      return "axonn";
  }
  return "?";
}

std::vector<Implementation> all_implementations() {
  return {Implementation::summa, Implementation::optimus_2021, Implementation::megatron_2021,
          Implementation::axonn};
}

Implementation parse_implementation(std::string_view text, std::string_view what) {
  for (Implementation i : all_implementations())
    if (text == to_string(i)) return i;
  throw Error(fmt::format(
      "{}: implementation '{}' is not summa, optimus-2021, megatron-2021 or axonn", what, text));
}

std::string_view scheme_of(Implementation i) {
  switch (i) {
    case Implementation::summa:
      return "";
    case Implementation::optimus_2021:
      return "2d";
    case Implementation::megatron_2021:
      return "1d";
    case Implementation::axonn:
      return "3d";
  }
  return "";
}

Implemented implement(Implementation i, const SchemeSpec& spec, const GptOptions& options,
                      const Machine& machine, const StepTimeOptions& time) {
  Implemented out{.spec = spec, .machine = machine, .time = time};
  if (i == Implementation::summa) return out;
  const std::string_view family = scheme_of(i);
  require(spec.scheme == family, [&] {
    return fmt::format(
        "implementation '{}' prices {} schemes (the system it profiles runs no other); the "
        "scheme is '{}' (use implementation summa, this library's, for it)",
        to_string(i), family, spec.str());
  });
  // What the 2021 PyTorch systems share: nothing overlapped, the data axis
  // after backward, the attention one bmm over the local batch, NCCL 2.x's
  // rings for every collective
  const auto pytorch_2021 = [&] {
    out.time.overlap_collectives = false;
    out.time.overlap_data_axis = false;
    out.time.batch_calls = true;
    for (LinkLevel* level : {&out.machine.intra_node, &out.machine.inter_node})
      for (CollectiveCost& c : level->collectives) c.algorithm = Algorithm::ring;
  };
  switch (i) {
    case Implementation::summa:
      break;
    case Implementation::optimus_2021: {
      // Algorithms 1-3 of the paper: whole blocks broadcast and reduced per
      // step, then the local product; nothing in flight beside compute
      auto& o = out.spec.as<Summa2DSpec>().summa;
      o.panel = 0;
      o.overlap = false;
      pytorch_2021();
      break;
    }
    case Implementation::megatron_2021: {
      auto& o = out.spec.as<Megatron1DSpec>();
      require(!o.sequence_parallel, [&] {
        return fmt::format(
            "implementation 'megatron-2021' has no sequence parallelism (Korthikanti et al. "
            "2022); the scheme is '{}' (drop sp=on, or use implementation summa)",
            spec.str());
      });
      // --distribute-checkpointed-activations with per-layer checkpoints
      if (options.recompute == Recompute::full) o.distribute_checkpoints = true;
      pytorch_2021();
      break;
    }
    case Implementation::axonn: {
      auto& o = out.spec.as<Axonn3DSpec>();
      o.oar = o.ors = o.oag = true;
      out.time.overlap_collectives = true;
      out.time.overlap_data_axis = true;
      break;
    }
  }
  return out;
}

}  // namespace summa::model

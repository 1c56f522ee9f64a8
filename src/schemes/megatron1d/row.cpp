// The 1D (Megatron-LM) row of the scheme registry.
#include <fmt/format.h>

#include "detail.hpp"
#include "summa/schemes/megatron1d/context.hpp"
#include "summa/schemes/megatron1d/spec.hpp"
#include "summa/schemes/registry.hpp"

namespace summa {

namespace {

int p_of(const SchemeSpec& s) {
  return s.as<Megatron1DSpec>().p;
}

// sp=on|off (sequence parallelism), dc=on|off (distributed checkpoints);
// the two exclude each other (sp's checkpoints are split already).
bool option(std::string_view key, std::string_view value, std::string_view item, SchemeSpec& s) {
  if (key != "sp" && key != "dc") return false;
  const bool sp = key == "sp";
  require(value == "on" || value == "off", [&] {
    return fmt::format("scheme item '{}': the 1d {} is 'on' or 'off', not '{}'", item,
                       sp ? "sequence parallelism" : "distributed checkpoints", value);
  });
  Megatron1DSpec& o = s.as<Megatron1DSpec>();
  (sp ? o.sequence_parallel : o.distribute_checkpoints) = value == "on";
  require(!(o.sequence_parallel && o.distribute_checkpoints), [&] {
    return fmt::format(
        "scheme item '{}': 1d sp=on and dc=on exclude each other (sequence parallelism splits "
        "the checkpoints over p already; give one of them)",
        item);
  });
  return true;
}

}  // namespace

extern constinit const SchemeRow megatron1d_row{
    // external: registry.cpp lists it
    .tag = "1d",
    .grammar = "'1d:p=P' (options 'sp=on|off', 'dc=on|off')",
    .parse = &parse_keyed<Megatron1DSpec, 'p'>,
    .option = &option,
    .text =
        [](const SchemeSpec& s) {
          const Megatron1DSpec& o = s.as<Megatron1DSpec>();
          return fmt::format("1d:p={}{}{}", p_of(s), o.sequence_parallel ? ",sp=on" : "",
                             o.distribute_checkpoints ? ",dc=on" : "");
        },
    .tensor_ranks = [](const SchemeSpec& s) { return static_cast<std::int64_t>(p_of(s)); },
    // sequence parallelism splits a data group's token rows over p: a batch
    // of a multiple of p sequences divides for every sequence length
    .sequence_split =
        [](const SchemeSpec& s) { return s.as<Megatron1DSpec>().sequence_parallel ? p_of(s) : 1; },
    .enumerate =
        [](int tensor, int data, std::vector<SchemeSpec>& out) {
          out.emplace_back("1d", Megatron1DSpec(tensor), data);
          // sequence parallelism changes nothing on one rank
          if (tensor > 1) out.emplace_back("1d", Megatron1DSpec(tensor, true), data);
        },
    .grid_shape =
        [](const SchemeSpec& s) {
          return GridShape{s.data, 1, 1, p_of(s)};
        },
    .make_grid = [](MPI_Comm comm, const SchemeSpec& s,
                    GridOptions o) { return ProcessGrid::linear1d(comm, p_of(s), s.data, o); },
    .axis_role = [](const SchemeSpec& s, CommAxis axis) -> std::string_view {
      return axis == CommAxis::tensor && p_of(s) > 1 ? "tensor" : "";
    },
    .context_f32 = &scheme_context<Megatron1DContext, Megatron1DSpec, float>,
    .context_f64 = &scheme_context<Megatron1DContext, Megatron1DSpec, double>,
    .context_bf16 = &scheme_context<Megatron1DContext, Megatron1DSpec, bf16>,
};

}  // namespace summa

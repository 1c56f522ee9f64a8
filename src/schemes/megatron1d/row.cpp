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

}  // namespace

extern constinit const SchemeRow megatron1d_row{
    // external: registry.cpp lists it
    .tag = "1d",
    .grammar = "'1d:p=P'",
    .parse = &parse_keyed<Megatron1DSpec, 'p'>,
    .text = [](const SchemeSpec& s) { return fmt::format("1d:p={}", p_of(s)); },
    .tensor_ranks = [](const SchemeSpec& s) { return static_cast<std::int64_t>(p_of(s)); },
    .enumerate =
        [](int tensor, int data, std::vector<SchemeSpec>& out) {
          out.emplace_back("1d", Megatron1DSpec(tensor), data);
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

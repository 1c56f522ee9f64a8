// The 1D (Megatron-LM) row of the scheme registry.
#include <fmt/format.h>

#include "detail.hpp"
#include "summa/schemes/megatron1d/context.hpp"
#include "summa/schemes/megatron1d/spec.hpp"
#include "summa/schemes/registry.hpp"

namespace summa {

namespace {

template <class T>
std::unique_ptr<SchemeContext<T>> context(const SchemeSpec&, ProcessGrid& grid, Backend& backend) {
  return std::make_unique<Megatron1DContext<T>>(grid, backend);
}

int p_of(const SchemeSpec& s) {
  return s.as<Megatron1DSpec>().p;
}

}  // namespace

extern const SchemeRow megatron1d_row;
constinit const SchemeRow megatron1d_row{
    .tag = "1d",
    .grammar = "'1d:p=P'",
    .parse =
        [](std::string_view body, std::string_view item, SchemeSpec& s) {
          s.set_options(Megatron1DSpec(parse_keyed_positive(body, "p=", item)));
        },
    .option = [](std::string_view, std::string_view, std::string_view,
                 SchemeSpec&) { return false; },
    .text = [](const SchemeSpec& s) { return fmt::format("1d:p={}", p_of(s)); },
    .tensor_ranks = [](const SchemeSpec& s) { return static_cast<std::int64_t>(p_of(s)); },
    .sequence_split = [](const SchemeSpec&) { return 1; },
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
    .context_f32 = &context<float>,
    .context_f64 = &context<double>,
    .context_bf16 = &context<bf16>,
};

}  // namespace summa

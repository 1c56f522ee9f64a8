// The 2D (Optimus, SUMMA) row of the scheme registry, with the engine's
// options: panel=N and overlap=on|off.
#include <fmt/format.h>

#include <charconv>

#include "detail.hpp"
#include "summa/schemes/registry.hpp"
#include "summa/schemes/summa2d/context.hpp"
#include "summa/schemes/summa2d/spec.hpp"

namespace summa {

namespace {

const Summa2DSpec& of(const SchemeSpec& s) {
  return s.as<Summa2DSpec>();
}

bool option(std::string_view key, std::string_view value, std::string_view item, SchemeSpec& s) {
  if (key == "panel") {
    index_t v = -1;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    require(ec == std::errc() && end == value.data() + value.size() && v >= 0, [&] {
      return fmt::format("scheme item '{}': panel '{}' is not an integer >= 0 (0: a whole block)",
                         item, value);
    });
    s.as<Summa2DSpec>().summa.panel = v;
    return true;
  }
  if (key == "overlap") {
    require(value == "on" || value == "off", [&] {
      return fmt::format("scheme item '{}': the 2d overlap is 'on' or 'off', not '{}'", item,
                         value);
    });
    s.as<Summa2DSpec>().summa.overlap = value == "on";
    return true;
  }
  return false;
}

std::string text(const SchemeSpec& spec) {
  const Summa2DSpec& s = of(spec);
  std::string t = fmt::format("2d:q={}", s.q);
  const SummaOptions d;
  if (s.summa.panel != d.panel) t += fmt::format(",panel={}", s.summa.panel);
  if (s.summa.overlap != d.overlap) t += s.summa.overlap ? ",overlap=on" : ",overlap=off";
  return t;
}

}  // namespace

extern constinit const SchemeRow summa2d_row{
    // external: registry.cpp lists it
    .tag = "2d",
    .grammar = "'2d:q=Q' (options 'panel=N', 'overlap=on|off')",
    .parse = &parse_keyed<Summa2DSpec, 'q'>,
    .option = &option,
    .text = &text,
    .tensor_ranks =
        [](const SchemeSpec& s) { return static_cast<std::int64_t>(of(s).q) * of(s).q; },
    .sequence_split = [](const SchemeSpec& s) { return of(s).q; },
    .enumerate =
        [](int tensor, int data, std::vector<SchemeSpec>& out) {
          for (int q = 1; q * q <= tensor; ++q)
            if (q * q == tensor) out.emplace_back("2d", Summa2DSpec(q), data);
        },
    .grid_shape =
        [](const SchemeSpec& s) {
          return GridShape{s.data, 1, of(s).q, of(s).q};
        },
    .make_grid = [](MPI_Comm comm, const SchemeSpec& s,
                    GridOptions o) { return ProcessGrid::mesh2d(comm, of(s).q, s.data, o); },
    .axis_role = [](const SchemeSpec& s, CommAxis axis) -> std::string_view {
      if (of(s).q == 1) return "";
      return axis == CommAxis::mesh_row ? "row" : axis == CommAxis::mesh_col ? "col" : "";
    },
    .context_f32 = &scheme_context<Summa2DContext, Summa2DSpec, float>,
    .context_f64 = &scheme_context<Summa2DContext, Summa2DSpec, double>,
    .context_bf16 = &scheme_context<Summa2DContext, Summa2DSpec, bf16>,
};

}  // namespace summa

// The 3D (AxoNN) row of the scheme registry, with its overlap option
// (overlap=oar+ors+oag or none).
#include <fmt/format.h>

#include <limits>

#include "detail.hpp"
#include "summa/schemes/axonn3d/context.hpp"
#include "summa/schemes/axonn3d/spec.hpp"
#include "summa/schemes/registry.hpp"

namespace summa {

namespace {

const Axonn3DSpec& of(const SchemeSpec& s) {
  return s.as<Axonn3DSpec>();
}

void parse(std::string_view dims, std::string_view item, SchemeSpec& spec) {
  Axonn3DSpec s;
  int* out[3] = {&s.gx, &s.gy, &s.gz};
  for (int k = 0; k < 3; ++k) {
    const std::size_t x = dims.find('x');
    require((k < 2) == (x != std::string_view::npos),
            [&] { return fmt::format("scheme item '{}': a 3d grid is XxYxZ", item); });
    *out[k] = parse_positive(dims.substr(0, x), item);
    dims = k < 2 ? dims.substr(x + 1) : std::string_view();
  }
  spec.set_options(s);
}

bool option(std::string_view key, std::string_view list, std::string_view item, SchemeSpec& spec) {
  if (key != "overlap") return false;
  Axonn3DSpec& s = spec.as<Axonn3DSpec>();
  s.oar = s.ors = s.oag = false;
  if (list == "none") return true;
  for (bool again = true; again;) {
    const std::size_t plus = list.find('+');
    const std::string_view name = list.substr(0, plus);
    again = plus != std::string_view::npos;
    list = again ? list.substr(plus + 1) : std::string_view();
    bool* flag = name == "oar" ? &s.oar : name == "ors" ? &s.ors : name == "oag" ? &s.oag : nullptr;
    require(flag != nullptr && !*flag, [&] {
      return fmt::format("scheme item '{}': '{}' is not one of oar, ors, oag (each once)", item,
                         name);
    });
    *flag = true;
  }
  return true;
}

std::string text(const SchemeSpec& spec) {
  const Axonn3DSpec& s = of(spec);
  std::string t = fmt::format("3d:{}x{}x{}", s.gx, s.gy, s.gz);
  const Axonn3DSpec d;
  if (s.oar == d.oar && s.ors == d.ors && s.oag == d.oag) return t;
  std::string list;
  for (auto [on, name] :
       {std::pair{s.oar, "oar"}, std::pair{s.ors, "ors"}, std::pair{s.oag, "oag"}})
    if (on) {
      if (!list.empty()) list.push_back('+');
      list.append(name);
    }
  return fmt::format("{},overlap={}", t, list.empty() ? std::string_view("none") : list);
}

std::string_view axis_role(const SchemeSpec& spec, CommAxis axis) {
  const Axonn3DSpec& s = of(spec);
  // grid3d: rows = X, cols = Y, depth = Z; the mesh_col communicator spans
  // the rows (X varies), the mesh_row one the columns (Y varies).
  if (axis == CommAxis::mesh_col) return s.gx > 1 ? "X" : "";
  if (axis == CommAxis::mesh_row) return s.gy > 1 ? "Y" : "";
  if (axis == CommAxis::depth) return s.gz > 1 ? "Z" : "";
  return "";
}

}  // namespace

extern constinit const SchemeRow axonn3d_row{
    // external: registry.cpp lists it
    .tag = "3d",
    .grammar = "'3d:XxYxZ' (option 'overlap=' with '+'-separated oar, ors, oag or 'none')",
    .parse = &parse,
    .option = &option,
    .text = &text,
    .tensor_ranks =
        [](const SchemeSpec& spec) {
          const Axonn3DSpec& s = of(spec);
          // saturated: 3d:111620x429509837x384773 wrapped to 4 ranks and
          // passed parse's "fits a communicator" check
          std::int64_t xy = 0, xyz = 0;
          if (__builtin_mul_overflow(static_cast<std::int64_t>(s.gx), s.gy, &xy) ||
              __builtin_mul_overflow(xy, static_cast<std::int64_t>(s.gz), &xyz))
            return std::numeric_limits<std::int64_t>::max();
          return xyz;
        },
    .sequence_split = [](const SchemeSpec& s) { return of(s).gz; },
    .enumerate =
        [](int t, int data, std::vector<SchemeSpec>& out) {
          for (int x = 1; x <= t; ++x)
            for (int y = 1; x * y <= t; ++y)
              if (t % (x * y) == 0) out.emplace_back("3d", Axonn3DSpec(x, y, t / (x * y)), data);
        },
    .grid_shape =
        [](const SchemeSpec& s) {
          const Axonn3DSpec& g = of(s);
          return GridShape{s.data, g.gz, g.gx, g.gy};
        },
    .make_grid =
        [](MPI_Comm comm, const SchemeSpec& s, GridOptions o) {
          const Axonn3DSpec& g = of(s);
          return ProcessGrid::grid3d(comm, g.gx, g.gy, g.gz, s.data, o);
        },
    .axis_role = &axis_role,
    .context_f32 = &scheme_context<Axonn3DContext, Axonn3DSpec, float>,
    .context_f64 = &scheme_context<Axonn3DContext, Axonn3DSpec, double>,
    .context_bf16 = &scheme_context<Axonn3DContext, Axonn3DSpec, bf16>,
};

}  // namespace summa

#include "summa/parallel/scheme.hpp"

#include <fmt/format.h>

#include <charconv>
#include <cstdint>
#include <limits>
#include <optional>

#include "summa/schemes/axonn3d/context.hpp"
#include "summa/schemes/megatron1d/context.hpp"
#include "summa/schemes/summa2d/context.hpp"

namespace summa {

namespace {

constexpr const char* kGrammar =
    "expected comma-separated items: one of '1d:p=P', '2d:q=Q', '3d:XxYxZ', and optionally "
    "'data=D' and (3d only) 'overlap=' with '+'-separated oar, ors, oag or 'none' (e.g. "
    "'data=2,2d:q=2', '3d:2x1x2,overlap=oar+ors')";

int positive(std::string_view digits, std::string_view item) {
  int v = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  require(ec == std::errc() && end == digits.data() + digits.size() && v > 0, [&] {
    return fmt::format("scheme item '{}': '{}' is not a positive integer; {}", item, digits,
                       kGrammar);
  });
  return v;
}

}  // namespace

std::int64_t SchemeSpec::tensor_ranks() const {
  const auto w = [](int v) { return static_cast<std::int64_t>(v); };
  switch (scheme) {
    case Scheme::megatron1d:
      return w(p);
    case Scheme::summa2d:
      return w(q) * w(q);
    case Scheme::axonn3d:
      return w(gx) * w(gy) * w(gz);
  }
  return 0;
}

std::string SchemeSpec::str() const {
  std::string s = data > 1 ? fmt::format("data={},", data) : std::string();
  switch (scheme) {
    case Scheme::megatron1d:
      return s + fmt::format("1d:p={}", p);
    case Scheme::summa2d:
      return s + fmt::format("2d:q={}", q);
    case Scheme::axonn3d: {
      s += fmt::format("3d:{}x{}x{}", gx, gy, gz);
      if (oar != SchemeSpec{}.oar || ors != SchemeSpec{}.ors || oag != SchemeSpec{}.oag) {
        std::string list;
        for (auto [on, name] :
             {std::pair{oar, "oar"}, std::pair{ors, "ors"}, std::pair{oag, "oag"}})
          if (on) {
            if (!list.empty()) list += '+';
            list += name;
          }
        s += ",overlap=";
        s += list.empty() ? std::string_view("none") : std::string_view(list);
      }
      return s;
    }
  }
  return s;
}

SchemeSpec SchemeSpec::parse(std::string_view text) {
  SchemeSpec spec;
  bool have_scheme = false, have_data = false, have_overlap = false;
  require(!text.empty(), [&] { return fmt::format("empty scheme; {}", kGrammar); });
  for (bool more = true; more;) {
    const std::size_t comma = text.find(',');
    const std::string_view item = text.substr(0, comma);
    more = comma != std::string_view::npos;
    text = more ? text.substr(comma + 1) : std::string_view();
    require(!item.empty(), [&] { return fmt::format("scheme: an empty item; {}", kGrammar); });
    const auto starts = [&](std::string_view prefix) { return item.starts_with(prefix); };
    if (starts("data=")) {
      require(!have_data, [&] { return fmt::format("scheme: 'data=' given twice; {}", kGrammar); });
      spec.data = positive(item.substr(5), item);
      have_data = true;
      continue;
    }
    if (starts("overlap=")) {
      require(!have_overlap,
              [&] { return fmt::format("scheme: 'overlap=' given twice; {}", kGrammar); });
      have_overlap = true;
      spec.oar = spec.ors = spec.oag = false;
      std::string_view list = item.substr(8);
      if (list == "none") continue;
      for (bool again = true; again;) {
        const std::size_t plus = list.find('+');
        const std::string_view name = list.substr(0, plus);
        again = plus != std::string_view::npos;
        list = again ? list.substr(plus + 1) : std::string_view();
        bool* flag = name == "oar"   ? &spec.oar
                     : name == "ors" ? &spec.ors
                     : name == "oag" ? &spec.oag
                                     : nullptr;
        require(flag != nullptr && !*flag, [&] {
          return fmt::format("scheme item '{}': '{}' is not one of oar, ors, oag (each once); {}",
                             item, name, kGrammar);
        });
        *flag = true;
      }
      continue;
    }
    require(!have_scheme, [&] {
      return fmt::format("scheme item '{}': a second scheme (or an unknown item); {}", item,
                         kGrammar);
    });
    have_scheme = true;
    if (starts("1d:p=")) {
      spec.scheme = Scheme::megatron1d;
      spec.p = positive(item.substr(5), item);
    } else if (starts("2d:q=")) {
      spec.scheme = Scheme::summa2d;
      spec.q = positive(item.substr(5), item);
    } else if (starts("3d:")) {
      spec.scheme = Scheme::axonn3d;
      std::string_view dims = item.substr(3);
      int* out[3] = {&spec.gx, &spec.gy, &spec.gz};
      for (int k = 0; k < 3; ++k) {
        const std::size_t x = dims.find('x');
        require((k < 2) == (x != std::string_view::npos), [&] {
          return fmt::format("scheme item '{}': a 3d grid is XxYxZ; {}", item, kGrammar);
        });
        *out[k] = positive(dims.substr(0, x), item);
        dims = k < 2 ? dims.substr(x + 1) : std::string_view();
      }
    } else {
      throw Error(fmt::format("scheme item '{}' is not understood; {}", item, kGrammar));
    }
  }
  require(have_scheme, [&] { return fmt::format("scheme: no tensor scheme given; {}", kGrammar); });
  require(!have_overlap || spec.scheme == Scheme::axonn3d, [&] {
    return fmt::format("scheme: 'overlap=' applies to the 3d scheme only; {}", kGrammar);
  });
  // Every axis is below 2^31, so each product below fits in 64 bits; the
  // whole job must fit an MPI communicator (int ranks).
  const double total = static_cast<double>(spec.data) * static_cast<double>(spec.gx) *
                       static_cast<double>(spec.gy) * static_cast<double>(spec.gz) *
                       static_cast<double>(spec.q) * static_cast<double>(spec.q) *
                       static_cast<double>(spec.p);
  require(total <= static_cast<double>(std::numeric_limits<int>::max()), [&] {
    return fmt::format("scheme '{}': {:.4g} ranks, more than an MPI communicator holds ({})", text,
                       total, std::numeric_limits<int>::max());
  });
  return spec;
}

std::vector<SchemeSpec> schemes_for(int ranks) {
  std::vector<SchemeSpec> list;
  for (int data = 1; data <= ranks; ++data) {
    if (ranks % data != 0) continue;
    const int t = ranks / data;
    list.push_back({.scheme = Scheme::megatron1d, .p = t, .data = data});
    for (int q = 1; q * q <= t; ++q)
      if (q * q == t) list.push_back({.scheme = Scheme::summa2d, .q = q, .data = data});
    for (int x = 1; x <= t; ++x)
      for (int y = 1; x * y <= t; ++y)
        if (t % (x * y) == 0)
          list.push_back(
              {.scheme = Scheme::axonn3d, .gx = x, .gy = y, .gz = t / (x * y), .data = data});
  }
  return list;
}

ProcessGrid make_grid(MPI_Comm comm, const SchemeSpec& spec, GridOptions options) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  agree_on(comm, size == spec.ranks() ? std::nullopt
                                      : std::optional<std::string>(fmt::format(
                                            "scheme '{}' needs {} ranks, the communicator has {}",
                                            spec.str(), spec.ranks(), size)));
  switch (spec.scheme) {
    case Scheme::megatron1d:
      return ProcessGrid::linear1d(comm, spec.p, spec.data, options);
    case Scheme::summa2d:
      return ProcessGrid::mesh2d(comm, spec.q, spec.data, options);
    case Scheme::axonn3d:
      return ProcessGrid::grid3d(comm, spec.gx, spec.gy, spec.gz, spec.data, options);
  }
  throw Error("make_grid: unknown scheme");
}

template <class T>
ParallelGpt<T>::ParallelGpt(MPI_Comm comm, const SchemeSpec& spec, Backend& backend,
                            const reference::GptConfig& config, index_t batch, index_t seq,
                            GptOptions options, SummaOptions summa, GridOptions grid)
    : spec_(spec), grid_(make_grid(comm, spec, grid)) {
  switch (spec.scheme) {
    case Scheme::summa2d:
      engine_ = std::make_unique<SummaEngine>(grid_, backend, summa);
      scheme_ = std::make_unique<Summa2DContext<T>>(*engine_);
      break;
    case Scheme::megatron1d:
      scheme_ = std::make_unique<Megatron1DContext<T>>(grid_, backend);
      break;
    case Scheme::axonn3d:
      scheme_ =
          std::make_unique<Axonn3DContext<T>>(grid_, backend,
                                              Axonn3DOptions{.overlap_all_reduce = spec.oar,
                                                             .overlap_reduce_scatter = spec.ors,
                                                             .overlap_all_gather = spec.oag});
      break;
  }
  model_ = std::make_unique<Gpt<T>>(*scheme_, config, batch, seq, options);
}

template <class T>
ParallelGpt<T>::~ParallelGpt() = default;

index_t batch_granularity(const SchemeSpec& spec) {
  switch (spec.scheme) {
    case Scheme::megatron1d:
      return spec.data;
    case Scheme::summa2d:
      return static_cast<index_t>(spec.data) * spec.q;
    case Scheme::axonn3d:
      return static_cast<index_t>(spec.data) * spec.gz;
  }
  return spec.data;
}

template <class T>
MemoryReport plan_memory(MPI_Comm comm, const SchemeSpec& spec, Backend& backend,
                         const reference::GptConfig& config, index_t batch, index_t seq,
                         GptOptions options, GridOptions grid) {
  options.plan_only = true;
  ParallelGpt<T> run(comm, spec, backend, config, batch, seq, options, {}, grid);
  return run.model().memory_report();
}

template <class T>
index_t largest_batch(MPI_Comm comm, const SchemeSpec& spec, Backend& backend,
                      const reference::GptConfig& config, index_t seq, GptOptions options,
                      std::size_t budget_bytes, index_t max_batch, GridOptions grid) {
  const index_t step = batch_granularity(spec);
  const auto fits = [&](index_t units) {
    const MemoryReport r =
        plan_memory<T>(comm, spec, backend, config, units * step, seq, options, grid);
    unsigned long long total = r.total();
    MPI_Allreduce(MPI_IN_PLACE, &total, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, comm);
    return total <= budget_bytes;
  };
  const index_t max_units = max_batch / step;
  if (max_units < 1 || !fits(1)) return 0;
  index_t good = 1, bad = 2;
  while (bad <= max_units && fits(bad)) {
    good = bad;
    bad *= 2;
  }
  if (bad > max_units) {
    if (fits(max_units)) return max_units * step;
    bad = max_units;
  }
  while (bad - good > 1) {
    const index_t mid = good + (bad - good) / 2;
    (fits(mid) ? good : bad) = mid;
  }
  return good * step;
}

template class ParallelGpt<float>;
template class ParallelGpt<double>;
template class ParallelGpt<bf16>;
template MemoryReport plan_memory<float>(MPI_Comm, const SchemeSpec&, Backend&,
                                         const reference::GptConfig&, index_t, index_t, GptOptions,
                                         GridOptions);
template MemoryReport plan_memory<double>(MPI_Comm, const SchemeSpec&, Backend&,
                                          const reference::GptConfig&, index_t, index_t, GptOptions,
                                          GridOptions);
template index_t largest_batch<float>(MPI_Comm, const SchemeSpec&, Backend&,
                                      const reference::GptConfig&, index_t, GptOptions, std::size_t,
                                      index_t, GridOptions);
template index_t largest_batch<double>(MPI_Comm, const SchemeSpec&, Backend&,
                                       const reference::GptConfig&, index_t, GptOptions,
                                       std::size_t, index_t, GridOptions);
template MemoryReport plan_memory<bf16>(MPI_Comm, const SchemeSpec&, Backend&,
                                        const reference::GptConfig&, index_t, index_t, GptOptions,
                                        GridOptions);
template index_t largest_batch<bf16>(MPI_Comm, const SchemeSpec&, Backend&,
                                     const reference::GptConfig&, index_t, GptOptions, std::size_t,
                                     index_t, GridOptions);

}  // namespace summa

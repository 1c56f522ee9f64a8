// The scheme registry table and SchemeSpec's text, written once over it.
#include "summa/schemes/registry.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <limits>
#include <vector>

namespace summa {

// The built-in schemes: one line each, naming the row its folder defines
// (src/schemes/<scheme>/row.cpp), in the registry's order.
#define SUMMA_BUILT_IN_SCHEMES(X) \
  X(megatron1d_row)               \
  X(summa2d_row)                  \
  X(axonn3d_row)

#define SUMMA_DECLARE_ROW(row) extern const SchemeRow row;
SUMMA_BUILT_IN_SCHEMES(SUMMA_DECLARE_ROW)
#undef SUMMA_DECLARE_ROW

namespace {

// The built-in rows, then those register_scheme adds.
std::vector<const SchemeRow*>& rows() {
#define SUMMA_ROW_ADDRESS(row) &row,
  static std::vector<const SchemeRow*> all = {SUMMA_BUILT_IN_SCHEMES(SUMMA_ROW_ADDRESS)};
#undef SUMMA_ROW_ADDRESS
  return all;
}

std::string grammar() {
  std::string schemes;
  for (const SchemeRow* r : rows()) {
    if (!schemes.empty()) schemes.append(", ");
    schemes.append(r->grammar);
  }
  return fmt::format(
      "expected comma-separated items: one scheme of {}, optionally 'data=D' (or 'data=D:zero=1', "
      "the optimizer state sharded over the D groups, 'data=D:zero=2', the gradients too, or "
      "'data=D:zero=3', the parameters too), optionally "
      "'pipe=P[:micro=M][:limit=L][:schedule=axonn|gpipe|1f1b][:split=B1+B2+...]' (a pipeline "
      "of P stages) and "
      "that scheme's options (e.g. "
      "'data=2,2d:q=2', '2d:q=2,panel=128,overlap=off', '3d:2x1x2,overlap=oar+ors')",
      schemes);
}

}  // namespace

std::span<const SchemeRow* const> scheme_registry() {
  return rows();
}

void register_scheme(const SchemeRow& row) {
  require(!row.tag.empty() && row.tag.find_first_of(":,=") == std::string_view::npos, [&] {
    return fmt::format("register_scheme: the tag '{}' must be non-empty, without ':', ',' or '='",
                       row.tag);
  });
  require(row.parse && row.option && row.text && row.tensor_ranks && row.sequence_split &&
              row.enumerate && row.grid_shape && row.make_grid && row.axis_role &&
              row.context_f32 && row.context_f64 && row.context_bf16,
          [&] { return fmt::format("register_scheme: the row '{}' lacks a function", row.tag); });
  for (const SchemeRow* r : rows())
    require(r->tag != row.tag,
            [&] { return fmt::format("register_scheme: a scheme '{}' exists already", row.tag); });
  rows().push_back(&row);
}

const SchemeRow& scheme_row(std::string_view tag) {
  std::string tags;
  for (const SchemeRow* r : rows()) {
    if (r->tag == tag) return *r;
    tags += fmt::format("{}'{}'", tags.empty() ? "" : ", ", r->tag);
  }
  throw Error(fmt::format("unknown scheme '{}' (the registered schemes are {})", tag, tags));
}

int parse_positive(std::string_view digits, std::string_view item) {
  int v = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  require(ec == std::errc() && end == digits.data() + digits.size() && v > 0, [&] {
    return fmt::format("scheme item '{}': '{}' is not a positive integer; {}", item, digits,
                       grammar());
  });
  return v;
}

int parse_keyed_positive(std::string_view body, std::string_view key, std::string_view item) {
  require(body.starts_with(key), [&] {
    return fmt::format(
        "scheme item '{}' is not understood (expected '{}' after the scheme's "
        "tag); {}",
        item, key, grammar());
  });
  return parse_positive(body.substr(key.size()), item);
}

std::int64_t SchemeSpec::tensor_ranks() const {
  return scheme_row(scheme).tensor_ranks(*this);
}

std::string_view to_string(PipeSchedule s) {
  switch (s) {
    case PipeSchedule::axonn:
      return "axonn";
    case PipeSchedule::gpipe:
      return "gpipe";
    case PipeSchedule::one_f_one_b:
      return "1f1b";
  }
  return "?";
}

PipeSchedule parse_pipe_schedule(std::string_view text, std::string_view what) {
  for (const PipeSchedule s : {PipeSchedule::axonn, PipeSchedule::gpipe, PipeSchedule::one_f_one_b})
    if (text == to_string(s)) return s;
  throw Error(fmt::format("{} '{}': expected axonn, gpipe or 1f1b", what, text));
}

namespace {

// pipe=P[:micro=M][:limit=L][:schedule=S][:split=B1+B2+...]
PipelineSpec parse_pipeline(std::string_view item) {
  PipelineSpec p;
  std::string_view body = item.substr(5);
  std::size_t colon = body.find(':');
  p.stages = parse_positive(body.substr(0, colon), item);
  std::vector<std::string_view> seen;
  while (colon != std::string_view::npos) {
    body = body.substr(colon + 1);
    colon = body.find(':');
    const std::string_view option = body.substr(0, colon);
    const std::string_view key = option.substr(0, option.find('='));
    require(option.find('=') != std::string_view::npos &&
                std::find(seen.begin(), seen.end(), key) == seen.end(),
            [&] {
              return fmt::format(
                  "scheme item '{}': '{}' is not an option of the pipeline (micro=M, limit=L, "
                  "schedule=axonn|gpipe|1f1b, split=B1+B2+..., each once); {}",
                  item, option, grammar());
            });
    seen.push_back(key);
    const std::string_view value = option.substr(key.size() + 1);
    if (key == "micro") {
      p.micro = parse_positive(value, item);
    } else if (key == "limit") {
      p.limit = parse_positive(value, item);
    } else if (key == "schedule") {
      p.schedule = parse_pipe_schedule(value, fmt::format("scheme item '{}': schedule", item));
    } else if (key == "split") {
      for (std::string_view rest = value;;) {
        const std::size_t plus = rest.find('+');
        p.split.push_back(parse_positive(rest.substr(0, plus), item));
        if (plus == std::string_view::npos) break;
        rest = rest.substr(plus + 1);
      }
      require(static_cast<int>(p.split.size()) == p.stages, [&] {
        return fmt::format("scheme item '{}': split gives {} stages their blocks, pipe={}", item,
                           p.split.size(), p.stages);
      });
    } else {
      throw Error(
          fmt::format("scheme item '{}': '{}' is not an option of the pipeline (micro=M, limit=L, "
                      "schedule=axonn|gpipe|1f1b, split=B1+B2+...); {}",
                      item, key, grammar()));
    }
  }
  return p;
}

std::string pipeline_text(const PipelineSpec& p) {
  if (!p.active() && p.limit == 0 && p.schedule == PipeSchedule::axonn && p.split.empty())
    return {};
  std::string out = fmt::format("pipe={}", p.stages);
  if (p.micro > 1) out += fmt::format(":micro={}", p.micro);
  if (p.limit > 0) out += fmt::format(":limit={}", p.limit);
  if (p.schedule != PipeSchedule::axonn) out += fmt::format(":schedule={}", to_string(p.schedule));
  if (!p.split.empty()) out += fmt::format(":split={}", fmt::join(p.split, "+"));
  return out + ",";
}

}  // namespace

std::string SchemeSpec::str() const {
  return (data > 1 ? fmt::format("data={}{},", data, zero > 0 ? fmt::format(":zero={}", zero) : "")
                   : std::string()) +
         pipeline_text(pipeline) + scheme_row(scheme).text(*this);
}

SchemeSpec SchemeSpec::parse(std::string_view text) {
  SchemeSpec spec;
  const SchemeRow* row = nullptr;
  bool have_data = false, have_pipe = false;
  std::vector<std::string_view> options;
  require(!text.empty(), [&] { return fmt::format("empty scheme; {}", grammar()); });
  std::string_view rest = text;
  for (bool more = true; more;) {
    const std::size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    more = comma != std::string_view::npos;
    rest = more ? rest.substr(comma + 1) : std::string_view();
    require(!item.empty(), [&] { return fmt::format("scheme: an empty item; {}", grammar()); });
    const std::size_t colon = item.find(':');
    if (item.starts_with("pipe=")) {
      require(!have_pipe,
              [&] { return fmt::format("scheme: 'pipe=' given twice; {}", grammar()); });
      spec.pipeline = parse_pipeline(item);
      have_pipe = true;
    } else if (colon != std::string_view::npos && !item.starts_with("data=")) {
      const auto it = std::find_if(rows().begin(), rows().end(), [&](const SchemeRow* r) {
        return r->tag == item.substr(0, colon);
      });
      require(it != rows().end(), [&] {
        return fmt::format("scheme item '{}' is not understood; {}", item, grammar());
      });
      require(row == nullptr, [&] {
        return fmt::format("scheme item '{}': a second scheme; {}", item, grammar());
      });
      row = *it;
      spec.scheme = row->tag;
      row->parse(item.substr(colon + 1), item, spec);
    } else if (item.starts_with("data=")) {
      require(!have_data,
              [&] { return fmt::format("scheme: 'data=' given twice; {}", grammar()); });
      // data=D or data=D:zero=Z
      const std::string_view body = item.substr(5);
      const std::size_t colon = body.find(':');
      spec.data = parse_positive(body.substr(0, colon), item);
      if (colon != std::string_view::npos) {
        const std::string_view z = body.substr(colon + 1);
        require(z.starts_with("zero="), [&] {
          return fmt::format(
              "scheme item '{}': '{}' is not an option of the data axis (zero=Z); {}", item, z,
              grammar());
        });
        const std::string_view level = z.substr(5);
        int v = -1;
        const auto [end, ec] = std::from_chars(level.data(), level.data() + level.size(), v);
        require(ec == std::errc() && end == level.data() + level.size() && v >= 0 && v <= 3, [&] {
          return fmt::format("scheme item '{}': zero={} is not a sharding level (0, 1, 2 or 3); {}",
                             item, level, grammar());
        });
        require(v == 0 || spec.data > 1, [&] {
          return fmt::format(
              "scheme item '{}': zero={} shards over the data groups, and data=1 has one (give "
              "data=D with D > 1, or drop ':zero={}')",
              item, v, v);
        });
        spec.zero = v;
      }
      have_data = true;
    } else {
      require(item.find('=') != std::string_view::npos, [&] {
        return fmt::format("scheme item '{}' is not understood; {}", item, grammar());
      });
      options.push_back(item);  // applied once the scheme is known
    }
  }
  require(row != nullptr,
          [&] { return fmt::format("scheme: no tensor scheme given; {}", grammar()); });
  std::vector<std::string_view> keys;
  for (std::string_view item : options) {
    const std::string_view key = item.substr(0, item.find('='));
    require(std::find(keys.begin(), keys.end(), key) == keys.end(),
            [&] { return fmt::format("scheme: '{}=' given twice; {}", key, grammar()); });
    keys.push_back(key);
    require(row->option(key, item.substr(key.size() + 1), item, spec), [&] {
      return fmt::format("scheme item '{}': '{}' is not an option of the {} scheme; {}", item, key,
                         row->tag, grammar());
    });
  }
  // The whole job must fit an MPI communicator (int ranks).
  const double total = static_cast<double>(spec.pipeline.stages) * static_cast<double>(spec.data) *
                       static_cast<double>(spec.tensor_ranks());
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
    for (const SchemeRow* r : rows()) r->enumerate(ranks / data, data, list);
  }
  return list;
}

}  // namespace summa

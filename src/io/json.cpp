#include "json.hpp"

#include <fmt/format.h>

#include <limits>
#include <set>
#include <vector>

#include "summa/core/error.hpp"

namespace summa::io::detail {

Json parse_json(std::string_view text, int max_depth) {
  // The objects and arrays open at this point of the parse: for each, the
  // keys seen so far (objects) and the key it is the value of.
  struct Open {
    std::set<std::string, std::less<>> keys;
    std::string last_key;
  };
  std::vector<Open> open;
  const auto where = [&] {
    if (open.size() < 2) return std::string("at the top level");
    const std::string& parent = open[open.size() - 2].last_key;
    return parent.empty() ? std::string("in an array") : "in " + json_quote(parent);
  };
  const Json::parser_callback_t check = [&](int, nlohmann::json::parse_event_t event,
                                            Json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    switch (event) {
      case Event::object_start:
      case Event::array_start:
        if (static_cast<int>(open.size()) >= max_depth)
          throw Error(fmt::format("nesting deeper than {} levels", max_depth));
        open.emplace_back();
        break;
      case Event::object_end:
      case Event::array_end:
        open.pop_back();
        break;
      case Event::key: {
        Open& top = open.back();
        top.last_key = parsed.get_ref<const std::string&>();
        if (!top.keys.insert(top.last_key).second)
          throw Error(fmt::format("duplicate key {} {}", json_quote(top.last_key), where()));
        break;
      }
      case Event::value:
        break;
    }
    return true;
  };
  try {
    return Json::parse(text, check);
  } catch (const Json::exception& e) {
    // "[json.exception.parse_error.101] parse error at ...", or
    // "[json.exception.out_of_range.406] number overflow parsing '1e400'"
    // (a number beyond a double): the text after the tag
    const std::string_view what = e.what();
    const auto tag_end = what.find("] ");
    throw Error(fmt::format("not valid JSON: {}",
                            tag_end == std::string_view::npos ? what : what.substr(tag_end + 2)));
  }
}

std::string json_quote(std::string_view text) {
  return Json(std::string(text)).dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string describe(const Json& value) {
  switch (value.type()) {
    case Json::value_t::object:
      return "object";
    case Json::value_t::array:
      return fmt::format("array of {} elements", value.size());
    case Json::value_t::string:
      return "string " + value.dump(-1, ' ', false, Json::error_handler_t::replace);
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
    case Json::value_t::number_float:
      return "number " + value.dump();
    default:
      return value.dump();  // null, true, false
  }
}

std::optional<std::int64_t> as_int64(const Json& value) {
  if (value.is_number_unsigned()) {
    const auto v = value.get<std::uint64_t>();
    if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      return std::nullopt;
    return static_cast<std::int64_t>(v);
  }
  if (value.is_number_integer()) return value.get<std::int64_t>();
  return std::nullopt;
}

std::optional<std::uint64_t> as_uint64(const Json& value) {
  if (value.is_number_unsigned()) return value.get<std::uint64_t>();
  if (value.is_number_integer() && value.get<std::int64_t>() >= 0)
    return static_cast<std::uint64_t>(value.get<std::int64_t>());
  return std::nullopt;
}

}  // namespace summa::io::detail

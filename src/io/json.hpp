#pragma once
// JSON for summa's file formats (the safetensors header, config.json):
// nlohmann::json with the checks those formats need on top; not installed.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace summa::io::detail {

/// Objects sorted by key (what a parse gives: lookups in O(log n)).
using Json = nlohmann::json;
/// Objects in insertion order (what a writer lays out).
using OrderedJson = nlohmann::ordered_json;

/// Parses `text`: one JSON value (RFC 8259), whitespace around it allowed.
/// Stricter than nlohmann::json::parse, which keeps the last of equal keys:
/// a key given twice in one object is an error, as is nesting deeper than
/// `max_depth` arrays and objects. Throws summa::Error naming the problem
/// ("not valid JSON: ... at line 1, column 7: ...", "duplicate key \"a\" in
/// \"b\"", "nesting deeper than 128 levels").
Json parse_json(std::string_view text, int max_depth = 128);

/// `text` as a JSON string literal, for messages (bytes that are not UTF-8
/// become U+FFFD).
std::string json_quote(std::string_view text);

/// A short description of `value` for messages: "object", "array of 2
/// elements", "string \"F32\"", "number 2.5", "true", "null".
std::string describe(const Json& value);

/// The value of an integer that fits in int64 (nullopt for anything else:
/// not a number, a fraction or exponent, out of range).
std::optional<std::int64_t> as_int64(const Json& value);
/// The value of a non-negative integer that fits in uint64.
std::optional<std::uint64_t> as_uint64(const Json& value);

}  // namespace summa::io::detail

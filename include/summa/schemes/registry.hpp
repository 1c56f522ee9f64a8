#pragma once
/// \file registry.hpp
/// The scheme registry: one row per tensor-parallel scheme, holding
/// everything the rest of the library asks of a scheme — its text (scheme
/// item and options), rank count, batch granularity, the factorisations of a
/// rank count, its grid, its layer context for each element type and the
/// role of each grid axis, the communication cost of its ops. Code that
/// handles "any scheme" looks the row up by the scheme's tag instead of
/// switching on the scheme. A new scheme is a folder (schemes/<name>/: its
/// options type (spec.hpp), its ops with their costs, its SchemeContext and
/// its row) plus one line in the table (src/schemes/registry.cpp), or, from
/// outside the library, a row given to register_scheme
/// (tests/support/fourth_scheme.hpp adds one).

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "summa/grid/process_grid.hpp"
#include "summa/layers/scheme_context.hpp"
#include "summa/schemes/spec.hpp"

namespace summa {

template <class T>
using ContextFactory = std::unique_ptr<SchemeContext<T>> (*)(const SchemeSpec& spec,
                                                             ProcessGrid& grid, Backend& backend);

/// The ContextFactory of a scheme whose context Context<T> is built from
/// (grid, backend, the scheme's options): a row's context_f32 is
/// &scheme_context<Summa2DContext, Summa2DSpec, float>.
template <template <class> class Context, class Options, class T>
std::unique_ptr<SchemeContext<T>> scheme_context(const SchemeSpec& spec, ProcessGrid& grid,
                                                 Backend& backend) {
  return std::make_unique<Context<T>>(grid, backend, spec.as<Options>());
}

/// SchemeRow::option of a scheme that has no options: every key is unknown.
inline bool no_options(std::string_view, std::string_view, std::string_view, SchemeSpec&) {
  return false;
}

/// SchemeRow::sequence_split of a scheme that keeps sequences whole.
inline int no_sequence_split(const SchemeSpec&) {
  return 1;
}

struct SchemeRow {
  /// The scheme item's tag ("1d" in "1d:p=4"), which names the scheme
  /// (SchemeSpec::scheme), and its grammar, with the scheme's options, for
  /// messages.
  std::string_view tag;
  std::string_view grammar;
  /// Reads the scheme item's body (after "<tag>:") into spec; throws
  /// summa::Error naming `item` unless it is well formed.
  void (*parse)(std::string_view body, std::string_view item, SchemeSpec& spec);
  /// Reads an option item `key=value` of this scheme into spec; false when
  /// `key` is not one of its options (throws on a bad value). Default: a
  /// scheme without options.
  bool (*option)(std::string_view key, std::string_view value, std::string_view item,
                 SchemeSpec& spec) = &no_options;
  /// The scheme item and the options that differ from their defaults
  /// ("2d:q=2,panel=128"), parseable back.
  std::string (*text)(const SchemeSpec& spec);
  /// Ranks of one tensor group.
  std::int64_t (*tensor_ranks)(const SchemeSpec& spec);
  /// Ranks whole sequences are split over in a data group (1, q, Z): the
  /// batch of a data group must be a multiple of it (batch_granularity; 1D
  /// with sp=on: p, its token rows split within sequences). Default: 1
  /// (sequences whole on every rank).
  int (*sequence_split)(const SchemeSpec& spec) = &no_sequence_split;
  /// Appends every spec of this scheme with `tensor` ranks per group and
  /// `data` groups.
  void (*enumerate)(int tensor, int data, std::vector<SchemeSpec>& out);
  /// The shape of the scheme's grid (what make_grid builds), without MPI.
  GridShape (*grid_shape)(const SchemeSpec& spec);
  /// The grid of the scheme on `comm` (whose size is spec.ranks()).
  ProcessGrid (*make_grid)(MPI_Comm comm, const SchemeSpec& spec, GridOptions options);
  /// What a grid axis is for under this scheme ("row", "X", "tensor"), or
  /// empty when the scheme does not communicate on it (the data axis is
  /// not the scheme's).
  std::string_view (*axis_role)(const SchemeSpec& spec, CommAxis axis);
  /// The layer context on a grid from make_grid, for each element type.
  ContextFactory<float> context_f32;
  ContextFactory<double> context_f64;
  ContextFactory<bf16> context_bf16;
};

/// Every registered scheme, in a fixed order: 1D, 2D, 3D, then those
/// register_scheme added, in the order added.
std::span<const SchemeRow* const> scheme_registry();

/// Adds a scheme (a row that outlives its use, e.g. a `static const
/// SchemeRow`): its spec text parses, scheme_row finds it, schemes_for and
/// the auto search enumerate it, and every program and test that walks the
/// registry runs it. Throws summa::Error for an empty tag, a tag with ':',
/// ',' or '=', a tag already registered, or a row without every function.
/// Not thread-safe: register before any other thread reads the registry.
void register_scheme(const SchemeRow& row);
/// The row of the scheme with tag `tag` (throws summa::Error naming it and
/// the registered tags when there is none).
const SchemeRow& scheme_row(std::string_view tag);

/// The scheme's layer context on `grid` (made by the row's make_grid).
template <class T>
std::unique_ptr<SchemeContext<T>> make_context(const SchemeSpec& spec, ProcessGrid& grid,
                                               Backend& backend) {
  const SchemeRow& row = scheme_row(spec.scheme);
  if constexpr (std::is_same_v<T, float>)
    return row.context_f32(spec, grid, backend);
  else if constexpr (std::is_same_v<T, double>)
    return row.context_f64(spec, grid, backend);
  else
    return row.context_bf16(spec, grid, backend);
}

/// Helpers for rows: a positive decimal int (throws naming `item`), and one
/// after `key` ("p=" in the body "p=4" of "1d:p=4").
int parse_positive(std::string_view digits, std::string_view item);
int parse_keyed_positive(std::string_view body, std::string_view key, std::string_view item);
/// The parse function of a scheme item "<tag>:<key>=N" whose options are
/// Options(N), N positive: a row's parse is &parse_keyed<Megatron1DSpec, 'p'>.
template <class Options, char key>
void parse_keyed(std::string_view body, std::string_view item, SchemeSpec& s) {
  static constexpr char prefix[] = {key, '=', '\0'};
  s.set_options(Options(parse_keyed_positive(body, prefix, item)));
}

}  // namespace summa

#pragma once
/// \file spec.hpp
/// A tensor-parallel scheme, its grid and its options as one runtime value,
/// parsed from a short text (the schemes themselves are rows of the registry,
/// schemes/registry.hpp).
///
/// Grammar (items separated by commas, in any order, exactly one scheme):
///   1d:p=P          Megatron-LM 1D over P ranks
///   2d:q=Q          Optimus 2D SUMMA on a Q x Q mesh
///   3d:XxYxZ        AxoNN 3D parallel matrix multiply on an X x Y x Z grid
///   data=D          D data-parallel groups on top (default 1)
/// and the options of the chosen scheme:
///   2d  panel=N        SUMMA panel width (0: a whole block per step; default 256)
///       overlap=on|off SUMMA's double-buffered collectives (default on)
///   3d  overlap=LIST   the AxoNN overlaps on, '+'-separated from oar, ors,
///                      oag, or 'none' (default: oar; see Axonn3DOptions)
/// e.g. "2d:q=3", "1d:p=4", "3d:2x2x2", "data=2,2d:q=2",
/// "2d:q=2,panel=128,overlap=off", "3d:1x1x4,overlap=oar+ors+oag".

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "summa/summa/engine.hpp"

namespace summa {

struct SchemeSpec {
  /// The scheme: its registry row's tag ("1d", "2d", "3d"; schemes/registry.hpp).
  std::string scheme = "2d";
  int p = 1;                   ///< 1D: ranks of the tensor group
  int q = 1;                   ///< 2D: mesh side
  int gx = 1, gy = 1, gz = 1;  ///< 3D: grid
  int data = 1;                ///< data-parallel groups
  /// 3D overlap switches (Axonn3DOptions: OAR, ORS, OAG).
  bool oar = true, ors = false, oag = false;
  /// 2D: the SUMMA engine's options (panel and overlap settable in the text).
  SummaOptions summa{};

  /// Ranks of one tensor group (P, Q², X·Y·Z).
  std::int64_t tensor_ranks() const;
  /// All ranks: data · tensor_ranks() (64-bit; parse() refuses a spec whose
  /// product exceeds what an MPI communicator holds).
  std::int64_t ranks() const { return static_cast<std::int64_t>(data) * tensor_ranks(); }
  /// Canonical text, parseable back ("data=2,2d:q=2"; "data=1" omitted).
  std::string str() const;
  /// Throws summa::Error naming the offending item and the grammar.
  static SchemeSpec parse(std::string_view text);
  friend bool operator==(const SchemeSpec&, const SchemeSpec&) = default;
};

/// Every scheme (without a data axis and with every data factor) whose rank
/// count is exactly `ranks`: 1D at p = ranks / data, 2D when ranks / data is
/// a square, 3D for every factorisation X·Y·Z.
std::vector<SchemeSpec> schemes_for(int ranks);

}  // namespace summa

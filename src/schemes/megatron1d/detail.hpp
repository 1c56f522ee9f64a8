#pragma once
// Helpers shared by the sources of the 1D (Megatron) layers; not installed.

#include <fmt/format.h>

#include <cstddef>
#include <optional>
#include <string>

#include "../../layers/check_view.hpp"
#include "summa/grid/process_grid.hpp"
#include "summa/layers/layer.hpp"
#include "summa/layers/vocab_parallel.hpp"
#include "summa/model/cost.hpp"

namespace summa::detail1d {

/// Ranks of the tensor group and this rank's place in it.
inline int group_size(ProcessGrid& grid) {
  return grid.tensor().size();
}
inline int group_rank(ProcessGrid& grid) {
  return grid.tensor().rank();
}

/// Construction-time agreement: every rank of the tensor group throws the
/// same summa::Error if any has one.
inline void agree(ProcessGrid& grid, const std::optional<std::string>& error) {
  grid.agree(CommAxis::tensor, error);
}

/// `bytes` of GEMM scratch from the workspace (released by the caller's scope).
inline Scratch take_scratch(Arena& ws, std::size_t bytes) {
  return Scratch{ws.take_bytes(bytes), bytes};
}

using detail::check_view;

}  // namespace summa::detail1d

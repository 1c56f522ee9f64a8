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
#include "summa/schemes/cost.hpp"

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

/// The 1D ops' communication (cost::OpCost) on tensor-group rank r of p:
/// every collective is an all-reduce over the group. Each op's part is
/// defined beside the op (layers.cpp: linear, LayerNorm; vocab.cpp:
/// embedding, LM head).
class Cost1D final : public cost::LayoutCost {
 public:
  using u64 = cost::u64;
  Cost1D(u64 p, u64 r, cost::Elements el) : p_(p), r_(r), el_(el) {}

  SUMMA_OP_COST_LINEAR_OVERRIDES
  NormLayout norm_layout() const override;    // layers.cpp
  VocabLayout vocab_layout() const override;  // vocab.cpp
  cost::Elements elements() const override { return el_; }
  u64 local_rows(u64 tokens) const override { return tokens; }
  u64 local_cols(u64 width, ActivationLayout layout) const override {
    return layout == ActivationLayout::inner ? width / p_ : width;
  }
  u64 head_split() const override { return p_; }

 private:
  void all_reduce(cost::Tally& t, u64 count, u64 e) const {
    t.all_reduce(CommAxis::tensor, count, p_, r_, e);
  }
  u64 p_, r_;
  cost::Elements el_;
};

}  // namespace summa::detail1d

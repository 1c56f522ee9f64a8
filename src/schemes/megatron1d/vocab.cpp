// The 1D (Megatron) vocabulary-parallel layout: the embedding, tied LM head
// and cross-entropy are summa/layers/vocab_parallel.hpp's over it.
#include "detail.hpp"
#include "summa/schemes/megatron1d/layers.hpp"

namespace summa {

namespace {

VocabLayout layout_1d(int p, int r, bool sequence_parallel) {
  VocabLayout l;
  l.sequence_parallel = sequence_parallel && p > 1;
  l.scheme = "1D";
  l.vocab = {.axis = CommAxis::tensor, .size = p, .rank = r, .name = "p"};
  l.overlap_dx = true;         // LMHead backward: dX's all-reduce overlapped with dwte
  l.price_overlap_dx = false;  // priced exposed, as 1D's linears (layers.cpp)
  l.agree_axis = CommAxis::tensor;
  return l;
}

}  // namespace

VocabLayout megatron1d_vocab_layout(ProcessGrid& grid, bool sequence_parallel) {
  return layout_1d(detail1d::group_size(grid), detail1d::group_rank(grid), sequence_parallel);
}

// The embedding and LM head price themselves over the same layout
// (VocabEmbedding::price, VocabLMHead::price: vocab_cost).
}  // namespace summa

// The 3D (AxoNN) vocabulary-parallel layout: the embedding, tied LM head and
// cross-entropy are summa/layers/vocab_parallel.hpp's over it.
#include "detail.hpp"
#include "summa/schemes/axonn3d/layers.hpp"

namespace summa {

namespace {

VocabLayout layout_3d(int gx, int gy, int gz, int x, int y, int z, bool overlap_dx) {
  VocabLayout l;
  l.scheme = "3D";
  l.vocab = {.axis = CommAxis::mesh_col, .size = gx, .rank = x, .name = "Gx"};   // X
  l.hidden = {.axis = CommAxis::mesh_row, .size = gy, .rank = y, .name = "Gy"};  // Y
  l.tokens = {.axis = CommAxis::depth, .size = gz, .rank = z, .name = "Gz"};     // Z
  l.overlap_dx = overlap_dx;
  l.agree_axis = CommAxis::tensor;
  return l;
}

}  // namespace

VocabLayout axonn3d_vocab_layout(const ProcessGrid& grid, bool overlap_dx) {
  return layout_3d(detail3d::gx(grid), detail3d::gy(grid), detail3d::gz(grid), detail3d::x_of(grid),
                   detail3d::y_of(grid), detail3d::z_of(grid), overlap_dx);
}

// The embedding and LM head price themselves over the same layout
// (VocabEmbedding::price, VocabLMHead::price: vocab_cost).
}  // namespace summa

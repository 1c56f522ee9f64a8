#include "summa/backend/backend.hpp"

#include <fmt/format.h>

namespace summa {

void check_gemm_shapes(Op ta, Op tb, index_t a_rows, index_t a_cols, index_t b_rows, index_t b_cols,
                       index_t c_rows, index_t c_cols) {
  const index_t m = ta == Op::N ? a_rows : a_cols;
  const index_t ka = ta == Op::N ? a_cols : a_rows;
  const index_t kb = tb == Op::N ? b_rows : b_cols;
  const index_t n = tb == Op::N ? b_cols : b_rows;
  const char* na = ta == Op::N ? "A" : "A'";
  const char* nb = tb == Op::N ? "B" : "B'";
  if (m != c_rows || n != c_cols || ka != kb)
    throw Error(fmt::format("gemm: {} is {}x{} and {} is {}x{}; cannot produce C {}x{}", na, m, ka,
                            nb, kb, n, c_rows, c_cols));
}

}  // namespace summa

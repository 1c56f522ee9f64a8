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

void check_gemm_batch(Op ta, Op tb, index_t a_rows, index_t a_cols, index_t b_rows, index_t b_cols,
                      index_t c_rows, index_t c_cols, index_t c_ld, Order c_order, index_t stride_a,
                      index_t stride_b, index_t stride_c, index_t batch) {
  check_gemm_shapes(ta, tb, a_rows, a_cols, b_rows, b_cols, c_rows, c_cols);
  if (batch < 0) throw Error(fmt::format("gemm_strided_batched: negative batch {}", batch));
  if (stride_a < 0 || stride_b < 0 || stride_c < 0)
    throw Error(
        fmt::format("gemm_strided_batched: negative stride (stride_a {}, stride_b {}, "
                    "stride_c {})",
                    stride_a, stride_b, stride_c));
  if (batch <= 1 || c_rows == 0 || c_cols == 0) return;
  const bool row = c_order == Order::row_major;
  const index_t inner = row ? c_cols : c_rows, outer = row ? c_rows : c_cols;
  const index_t span = (outer - 1) * c_ld + inner;
  const bool after = stride_c >= span;
  const bool beside = stride_c >= inner && (batch - 1) * stride_c + inner <= c_ld;
  if (!after && !beside)
    throw Error(fmt::format(
        "gemm_strided_batched: stride_c {} makes the {} C blocks ({}x{}, ld {}) overlap: it "
        "must be at least {} (one after another) or fit them side by side within ld",
        stride_c, batch, c_rows, c_cols, c_ld, span));
}

}  // namespace summa

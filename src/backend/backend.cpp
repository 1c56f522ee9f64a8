// Backend's non-virtual entry points: each op checks its arguments here, once
// for every implementation (backend.hpp, class comment), then calls its hook.
#include "summa/backend/backend.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <initializer_list>

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

namespace {

// ---- The checks, once per kind of argument. Every message is built only on
// failure (lazy require), so a passing check allocates nothing.

// The argument's name in a check_layout label ("gemm A" -> "A").
const char* name_in(const char* what) {
  const char* space = std::strrchr(what, ' ');
  return space != nullptr ? space + 1 : what;
}

// Views that must have one shape, named by their check_layout labels:
// "layernorm_apply: shapes differ (X 4x5 vs Y 4x3)".
template <class A, class B>
void same_shape(const char* op, const char* a_what, const MatrixView<A>& a, const char* b_what,
                const MatrixView<B>& b) {
  require(a.rows == b.rows && a.cols == b.cols, [&] {
    return fmt::format("{}: shapes differ ({} {}x{} vs {} {}x{})", op, name_in(a_what), a.rows,
                       a.cols, name_in(b_what), b.rows, b.cols);
  });
}

// An array the op reads or writes `count` elements of must not be null.
void require_array(const void* p, index_t count, const char* op, const char* name) {
  require(count == 0 || p != nullptr,
          [&] { return fmt::format("{}: null {} for {} elements", op, name, count); });
}

void require_count(index_t n, const char* op) {
  require(n >= 0, [&] { return fmt::format("{}: negative n {}", op, n); });
}

// layernorm_mean / layernorm_rstd: n statistics over a hidden size h.
void check_layernorm_stats(const char* op, index_t n, index_t h, const void* in,
                           const char* in_name, const void* out, const char* out_name) {
  require(n >= 0 && h > 0,
          [&] { return fmt::format("{}: needs n >= 0 and h > 0 (n {}, h {})", op, n, h); });
  require_array(in, n, op, in_name);
  require_array(out, n, op, out_name);
}

// The per-row (X.rows) and per-column (X.cols) inputs of a LayerNorm kernel,
// read per element: needed only when the block has elements.
struct Named {
  const void* p;
  const char* name;
};
void check_rows_cols(const char* op, index_t rows, index_t cols,
                     std::initializer_list<Named> per_row, std::initializer_list<Named> per_col) {
  if (rows == 0 || cols == 0) return;
  for (const Named& a : per_row) require_array(a.p, rows, op, a.name);
  for (const Named& a : per_col) require_array(a.p, cols, op, a.name);
}

template <class T>
void check_gemm(Op ta, Op tb, ConstMatrixView<T> A, ConstMatrixView<T> B, MatrixView<T> C) {
  A.check_layout("gemm A");
  B.check_layout("gemm B");
  C.check_layout("gemm C");
  check_gemm_shapes(ta, tb, A.rows, A.cols, B.rows, B.cols, C.rows, C.cols);
}

template <class T>
void check_gemm_strided_batched(Op ta, Op tb, ConstMatrixView<T> A, index_t stride_a,
                                ConstMatrixView<T> B, index_t stride_b, MatrixView<T> C,
                                index_t stride_c, index_t batch) {
  A.check_layout("gemm_strided_batched A");
  B.check_layout("gemm_strided_batched B");
  C.check_layout("gemm_strided_batched C");
  check_gemm_batch(ta, tb, A.rows, A.cols, B.rows, B.cols, C.rows, C.cols, C.ld, C.order, stride_a,
                   stride_b, stride_c, batch);
}

// copy and convert: "copy: shapes differ (4x5 -> 4x3)" (src -> dst).
template <class S, class D>
void check_copy(const char* op, const char* src_what, ConstMatrixView<S> src, const char* dst_what,
                MatrixView<D> dst) {
  src.check_layout(src_what);
  dst.check_layout(dst_what);
  require(src.rows == dst.rows && src.cols == dst.cols, [&] {
    return fmt::format("{}: shapes differ ({}x{} -> {}x{})", op, src.rows, src.cols, dst.rows,
                       dst.cols);
  });
}

template <class T>
void check_axpby(ConstMatrixView<T> X, MatrixView<T> C) {
  X.check_layout("axpby X");
  C.check_layout("axpby C");
  same_shape("axpby", "axpby X", X, "axpby C", C);
}

template <class T>
void check_add_bias(MatrixView<T> Y, const T* bias) {
  Y.check_layout("add_bias Y");
  require_array(bias, Y.rows > 0 ? Y.cols : 0, "add_bias", "bias");
}

template <class T>
void check_column_sums(ConstMatrixView<T> X, const T* out) {
  X.check_layout("column_sums X");
  require_array(out, X.cols, "column_sums", "out");
}

template <class T>
void check_layernorm_partial_sums(ConstMatrixView<T> X, const acc_t<T>* out) {
  X.check_layout("layernorm_partial_sums X");
  require_array(out, X.rows, "layernorm_partial_sums", "out");  // center: optional
}

template <class T>
void check_layernorm_apply(ConstMatrixView<T> X, const acc_t<T>* mean, const acc_t<T>* rstd,
                           const T* gamma, const T* beta, MatrixView<T> Y) {
  X.check_layout("layernorm_apply X");
  Y.check_layout("layernorm_apply Y");
  same_shape("layernorm_apply", "layernorm_apply X", X, "layernorm_apply Y", Y);
  check_rows_cols("layernorm_apply", X.rows, X.cols, {{mean, "mean"}, {rstd, "rstd"}},
                  {{gamma, "gamma"}, {beta, "beta"}});
}

template <class T>
void check_layernorm_backward_partials(ConstMatrixView<T> X, ConstMatrixView<T> dY,
                                       const acc_t<T>* mean, const acc_t<T>* rstd, const T* gamma,
                                       const acc_t<T>* a, const acc_t<T>* b) {
  const char* op = "layernorm_backward_partials";
  X.check_layout("layernorm_backward_partials X");
  dY.check_layout("layernorm_backward_partials dY");
  same_shape(op, "dY", dY, "X", X);
  check_rows_cols(op, X.rows, X.cols, {{mean, "mean"}, {rstd, "rstd"}}, {{gamma, "gamma"}});
  require_array(a, X.rows, op, "a");
  require_array(b, X.rows, op, "b");
}

template <class T>
void check_layernorm_backward_apply(ConstMatrixView<T> X, ConstMatrixView<T> dY,
                                    const acc_t<T>* mean, const acc_t<T>* rstd, const T* gamma,
                                    const acc_t<T>* a, const acc_t<T>* b, index_t h,
                                    MatrixView<T> dX) {
  const char* op = "layernorm_backward_apply";
  X.check_layout("layernorm_backward_apply X");
  dY.check_layout("layernorm_backward_apply dY");
  dX.check_layout("layernorm_backward_apply dX");
  same_shape(op, "dY", dY, "X", X);
  same_shape(op, "X", X, "dX", dX);
  require(h > 0 || X.empty(),
          [&] { return fmt::format("{}: hidden size h {} must be positive", op, h); });
  check_rows_cols(op, X.rows, X.cols, {{mean, "mean"}, {rstd, "rstd"}, {a, "a"}, {b, "b"}},
                  {{gamma, "gamma"}});
}

template <class T>
void check_layernorm_param_partials(ConstMatrixView<T> X, ConstMatrixView<T> dY,
                                    const acc_t<T>* mean, const acc_t<T>* rstd, const T* dgamma,
                                    const T* dbeta) {
  const char* op = "layernorm_param_partials";
  X.check_layout("layernorm_param_partials X");
  dY.check_layout("layernorm_param_partials dY");
  same_shape(op, "dY", dY, "X", X);
  check_rows_cols(op, X.rows, X.cols, {{mean, "mean"}, {rstd, "rstd"}}, {});
  require_array(dgamma, X.cols, op, "dgamma");
  require_array(dbeta, X.cols, op, "dbeta");
}

// gelu_forward (X -> Y) and softmax_causal (S -> P): an input and an output
// of one shape.
template <class T>
void check_unary(const char* op, const char* in_what, ConstMatrixView<T> in, const char* out_what,
                 MatrixView<T> out) {
  in.check_layout(in_what);
  out.check_layout(out_what);
  same_shape(op, in_what, in, out_what, out);
}

// gelu_backward (X, dY -> dX) and softmax_causal_backward (P, dP -> dS).
template <class T>
void check_binary(const char* op, const char* a_what, ConstMatrixView<T> a, const char* b_what,
                  ConstMatrixView<T> b, const char* out_what, MatrixView<T> out) {
  a.check_layout(a_what);
  b.check_layout(b_what);
  out.check_layout(out_what);
  same_shape(op, a_what, a, out_what, out);
  same_shape(op, b_what, b, out_what, out);
}

template <class T>
void check_row_max(ConstMatrixView<T> Z, const acc_t<T>* out) {
  Z.check_layout("row_max Z");
  require_array(out, Z.rows, "row_max", "out");
}

template <class T>
void check_row_sum_exp(ConstMatrixView<T> Z, const acc_t<T>* max, const acc_t<T>* out) {
  Z.check_layout("row_sum_exp Z");
  require_array(max, Z.cols > 0 ? Z.rows : 0, "row_sum_exp", "max");
  require_array(out, Z.rows, "row_sum_exp", "out");
}

template <class T>
void check_pick_targets(ConstMatrixView<T> Z, const std::int32_t* targets, const acc_t<T>* out) {
  Z.check_layout("pick_targets Z");
  require_array(targets, Z.rows, "pick_targets", "targets");
  require_array(out, Z.rows, "pick_targets", "out");
}

template <class T>
void check_cross_entropy_sum(index_t n, const T* max, const T* sum, const T* picked) {
  require_count(n, "cross_entropy_sum");
  require_array(max, n, "cross_entropy_sum", "max");
  require_array(sum, n, "cross_entropy_sum", "sum");
  require_array(picked, n, "cross_entropy_sum", "picked");
}

template <class T>
void check_cross_entropy_grad(MatrixView<T> Z, const acc_t<T>* max, const acc_t<T>* sum,
                              const std::int32_t* targets) {
  Z.check_layout("cross_entropy_grad Z");
  const index_t rows = Z.cols > 0 ? Z.rows : 0;  // read per element of Z
  require_array(max, rows, "cross_entropy_grad", "max");
  require_array(sum, rows, "cross_entropy_grad", "sum");
  require_array(targets, rows, "cross_entropy_grad", "targets");
}

template <class T>
void check_gather_rows(const std::int32_t* ids, ConstMatrixView<T> table, MatrixView<T> out) {
  table.check_layout("gather_rows table");
  out.check_layout("gather_rows out");
  require(out.cols == table.cols, [&] {
    return fmt::format("gather_rows: out has {} columns, table {}", out.cols, table.cols);
  });
  require_array(ids, out.cols > 0 ? out.rows : 0, "gather_rows", "ids");
}

template <class T>
void check_scatter_add_rows(const std::int32_t* ids, ConstMatrixView<T> src, MatrixView<T> table) {
  src.check_layout("scatter_add_rows src");
  table.check_layout("scatter_add_rows table");
  require(src.cols == table.cols, [&] {
    return fmt::format("scatter_add_rows: src has {} columns, table {}", src.cols, table.cols);
  });
  require_array(ids, src.cols > 0 ? src.rows : 0, "scatter_add_rows", "ids");
}

void check_transfer(const char* op, const void* dst, const char* dst_name, const void* src,
                    const char* src_name, std::size_t bytes) {
  require(bytes == 0 || (dst != nullptr && src != nullptr), [&] {
    return fmt::format("{}: null {} for {} bytes", op, dst == nullptr ? dst_name : src_name, bytes);
  });
}

// The optimizer ops: n >= 0 and every array of n elements non-null.
void check_update(const char* op, index_t n, std::initializer_list<Named> arrays) {
  require_count(n, op);
  for (const Named& a : arrays) require_array(a.p, n, op, a.name);
}

void check_sum_of_squares(const void* x, index_t rows, index_t cols, index_t ld) {
  require(rows >= 0 && cols >= 0 && ld >= cols, [&] {
    return fmt::format("sum_of_squares: need rows, cols >= 0 and ld >= cols (got {}x{}, ld {})",
                       rows, cols, ld);
  });
  require_array(x, rows * cols, "sum_of_squares", "x");
}

}  // namespace

// ---- GEMM

void Backend::gemm(Op ta, Op tb, float alpha, ConstMatrixView<float> A, ConstMatrixView<float> B,
                   float beta, MatrixView<float> C, Scratch scratch) {
  check_gemm(ta, tb, A, B, C);
  do_gemm(ta, tb, alpha, A, B, beta, C, scratch);
}
void Backend::gemm(Op ta, Op tb, double alpha, ConstMatrixView<double> A, ConstMatrixView<double> B,
                   double beta, MatrixView<double> C, Scratch scratch) {
  check_gemm(ta, tb, A, B, C);
  do_gemm(ta, tb, alpha, A, B, beta, C, scratch);
}
void Backend::gemm(Op ta, Op tb, float alpha, ConstMatrixView<bf16> A, ConstMatrixView<bf16> B,
                   float beta, MatrixView<bf16> C, Scratch scratch) {
  check_gemm(ta, tb, A, B, C);
  do_gemm(ta, tb, alpha, A, B, beta, C, scratch);
}

void Backend::gemm_strided_batched(Op ta, Op tb, float alpha, ConstMatrixView<float> A,
                                   index_t stride_a, ConstMatrixView<float> B, index_t stride_b,
                                   float beta, MatrixView<float> C, index_t stride_c, index_t batch,
                                   Scratch scratch) {
  check_gemm_strided_batched(ta, tb, A, stride_a, B, stride_b, C, stride_c, batch);
  do_gemm_strided_batched(ta, tb, alpha, A, stride_a, B, stride_b, beta, C, stride_c, batch,
                          scratch);
}
void Backend::gemm_strided_batched(Op ta, Op tb, double alpha, ConstMatrixView<double> A,
                                   index_t stride_a, ConstMatrixView<double> B, index_t stride_b,
                                   double beta, MatrixView<double> C, index_t stride_c,
                                   index_t batch, Scratch scratch) {
  check_gemm_strided_batched(ta, tb, A, stride_a, B, stride_b, C, stride_c, batch);
  do_gemm_strided_batched(ta, tb, alpha, A, stride_a, B, stride_b, beta, C, stride_c, batch,
                          scratch);
}
void Backend::gemm_strided_batched(Op ta, Op tb, float alpha, ConstMatrixView<bf16> A,
                                   index_t stride_a, ConstMatrixView<bf16> B, index_t stride_b,
                                   float beta, MatrixView<bf16> C, index_t stride_c, index_t batch,
                                   Scratch scratch) {
  check_gemm_strided_batched(ta, tb, A, stride_a, B, stride_b, C, stride_c, batch);
  do_gemm_strided_batched(ta, tb, alpha, A, stride_a, B, stride_b, beta, C, stride_c, batch,
                          scratch);
}

// ---- Copies and elementwise linear algebra

void Backend::copy(ConstMatrixView<float> src, MatrixView<float> dst) {
  check_copy("copy", "copy src", src, "copy dst", dst);
  do_copy(src, dst);
}
void Backend::copy(ConstMatrixView<double> src, MatrixView<double> dst) {
  check_copy("copy", "copy src", src, "copy dst", dst);
  do_copy(src, dst);
}
void Backend::copy(ConstMatrixView<bf16> src, MatrixView<bf16> dst) {
  check_copy("copy", "copy src", src, "copy dst", dst);
  do_copy(src, dst);
}
void Backend::convert(ConstMatrixView<float> src, MatrixView<bf16> dst) {
  check_copy("convert", "convert src", src, "convert dst", dst);
  do_convert(src, dst);
}
void Backend::convert(ConstMatrixView<bf16> src, MatrixView<float> dst) {
  check_copy("convert", "convert src", src, "convert dst", dst);
  do_convert(src, dst);
}

void Backend::axpby(float alpha, ConstMatrixView<float> X, float beta, MatrixView<float> C) {
  check_axpby(X, C);
  do_axpby(alpha, X, beta, C);
}
void Backend::axpby(double alpha, ConstMatrixView<double> X, double beta, MatrixView<double> C) {
  check_axpby(X, C);
  do_axpby(alpha, X, beta, C);
}
void Backend::axpby(float alpha, ConstMatrixView<bf16> X, float beta, MatrixView<bf16> C) {
  check_axpby(X, C);
  do_axpby(alpha, X, beta, C);
}

void Backend::scale(float beta, MatrixView<float> C) {
  C.check_layout("scale C");
  do_scale(beta, C);
}
void Backend::scale(double beta, MatrixView<double> C) {
  C.check_layout("scale C");
  do_scale(beta, C);
}
void Backend::scale(float beta, MatrixView<bf16> C) {
  C.check_layout("scale C");
  do_scale(beta, C);
}

void Backend::add_bias(MatrixView<float> Y, const float* bias) {
  check_add_bias(Y, bias);
  do_add_bias(Y, bias);
}
void Backend::add_bias(MatrixView<double> Y, const double* bias) {
  check_add_bias(Y, bias);
  do_add_bias(Y, bias);
}
void Backend::add_bias(MatrixView<bf16> Y, const bf16* bias) {
  check_add_bias(Y, bias);
  do_add_bias(Y, bias);
}

void Backend::column_sums(ConstMatrixView<float> X, float beta, float* out) {
  check_column_sums(X, out);
  do_column_sums(X, beta, out);
}
void Backend::column_sums(ConstMatrixView<double> X, double beta, double* out) {
  check_column_sums(X, out);
  do_column_sums(X, beta, out);
}
void Backend::column_sums(ConstMatrixView<bf16> X, float beta, bf16* out) {
  check_column_sums(X, out);
  do_column_sums(X, beta, out);
}

// ---- LayerNorm

void Backend::layernorm_partial_sums(ConstMatrixView<float> X, const float* center, float* out) {
  check_layernorm_partial_sums(X, out);
  do_layernorm_partial_sums(X, center, out);
}
void Backend::layernorm_partial_sums(ConstMatrixView<double> X, const double* center, double* out) {
  check_layernorm_partial_sums(X, out);
  do_layernorm_partial_sums(X, center, out);
}
void Backend::layernorm_partial_sums(ConstMatrixView<bf16> X, const float* center, float* out) {
  check_layernorm_partial_sums(X, out);
  do_layernorm_partial_sums(X, center, out);
}

void Backend::layernorm_mean(index_t n, index_t h, const float* sums, float* mean) {
  check_layernorm_stats("layernorm_mean", n, h, sums, "sums", mean, "mean");
  do_layernorm_mean(n, h, sums, mean);
}
void Backend::layernorm_mean(index_t n, index_t h, const double* sums, double* mean) {
  check_layernorm_stats("layernorm_mean", n, h, sums, "sums", mean, "mean");
  do_layernorm_mean(n, h, sums, mean);
}
void Backend::layernorm_rstd(index_t n, index_t h, double eps, const float* squares, float* rstd) {
  check_layernorm_stats("layernorm_rstd", n, h, squares, "squares", rstd, "rstd");
  do_layernorm_rstd(n, h, eps, squares, rstd);
}
void Backend::layernorm_rstd(index_t n, index_t h, double eps, const double* squares,
                             double* rstd) {
  check_layernorm_stats("layernorm_rstd", n, h, squares, "squares", rstd, "rstd");
  do_layernorm_rstd(n, h, eps, squares, rstd);
}

void Backend::layernorm_apply(ConstMatrixView<float> X, const float* mean, const float* rstd,
                              const float* gamma, const float* beta, MatrixView<float> Y) {
  check_layernorm_apply(X, mean, rstd, gamma, beta, Y);
  do_layernorm_apply(X, mean, rstd, gamma, beta, Y);
}
void Backend::layernorm_apply(ConstMatrixView<double> X, const double* mean, const double* rstd,
                              const double* gamma, const double* beta, MatrixView<double> Y) {
  check_layernorm_apply(X, mean, rstd, gamma, beta, Y);
  do_layernorm_apply(X, mean, rstd, gamma, beta, Y);
}
void Backend::layernorm_apply(ConstMatrixView<bf16> X, const float* mean, const float* rstd,
                              const bf16* gamma, const bf16* beta, MatrixView<bf16> Y) {
  check_layernorm_apply(X, mean, rstd, gamma, beta, Y);
  do_layernorm_apply(X, mean, rstd, gamma, beta, Y);
}

void Backend::layernorm_backward_partials(ConstMatrixView<float> X, ConstMatrixView<float> dY,
                                          const float* mean, const float* rstd, const float* gamma,
                                          float* a, float* b) {
  check_layernorm_backward_partials(X, dY, mean, rstd, gamma, a, b);
  do_layernorm_backward_partials(X, dY, mean, rstd, gamma, a, b);
}
void Backend::layernorm_backward_partials(ConstMatrixView<double> X, ConstMatrixView<double> dY,
                                          const double* mean, const double* rstd,
                                          const double* gamma, double* a, double* b) {
  check_layernorm_backward_partials(X, dY, mean, rstd, gamma, a, b);
  do_layernorm_backward_partials(X, dY, mean, rstd, gamma, a, b);
}
void Backend::layernorm_backward_partials(ConstMatrixView<bf16> X, ConstMatrixView<bf16> dY,
                                          const float* mean, const float* rstd, const bf16* gamma,
                                          float* a, float* b) {
  check_layernorm_backward_partials(X, dY, mean, rstd, gamma, a, b);
  do_layernorm_backward_partials(X, dY, mean, rstd, gamma, a, b);
}

void Backend::layernorm_backward_apply(ConstMatrixView<float> X, ConstMatrixView<float> dY,
                                       const float* mean, const float* rstd, const float* gamma,
                                       const float* a, const float* b, index_t h,
                                       MatrixView<float> dX) {
  check_layernorm_backward_apply(X, dY, mean, rstd, gamma, a, b, h, dX);
  do_layernorm_backward_apply(X, dY, mean, rstd, gamma, a, b, h, dX);
}
void Backend::layernorm_backward_apply(ConstMatrixView<double> X, ConstMatrixView<double> dY,
                                       const double* mean, const double* rstd, const double* gamma,
                                       const double* a, const double* b, index_t h,
                                       MatrixView<double> dX) {
  check_layernorm_backward_apply(X, dY, mean, rstd, gamma, a, b, h, dX);
  do_layernorm_backward_apply(X, dY, mean, rstd, gamma, a, b, h, dX);
}
void Backend::layernorm_backward_apply(ConstMatrixView<bf16> X, ConstMatrixView<bf16> dY,
                                       const float* mean, const float* rstd, const bf16* gamma,
                                       const float* a, const float* b, index_t h,
                                       MatrixView<bf16> dX) {
  check_layernorm_backward_apply(X, dY, mean, rstd, gamma, a, b, h, dX);
  do_layernorm_backward_apply(X, dY, mean, rstd, gamma, a, b, h, dX);
}

void Backend::layernorm_param_partials(ConstMatrixView<float> X, ConstMatrixView<float> dY,
                                       const float* mean, const float* rstd, float* dgamma,
                                       float* dbeta) {
  check_layernorm_param_partials(X, dY, mean, rstd, dgamma, dbeta);
  do_layernorm_param_partials(X, dY, mean, rstd, dgamma, dbeta);
}
void Backend::layernorm_param_partials(ConstMatrixView<double> X, ConstMatrixView<double> dY,
                                       const double* mean, const double* rstd, double* dgamma,
                                       double* dbeta) {
  check_layernorm_param_partials(X, dY, mean, rstd, dgamma, dbeta);
  do_layernorm_param_partials(X, dY, mean, rstd, dgamma, dbeta);
}
void Backend::layernorm_param_partials(ConstMatrixView<bf16> X, ConstMatrixView<bf16> dY,
                                       const float* mean, const float* rstd, bf16* dgamma,
                                       bf16* dbeta) {
  check_layernorm_param_partials(X, dY, mean, rstd, dgamma, dbeta);
  do_layernorm_param_partials(X, dY, mean, rstd, dgamma, dbeta);
}

// ---- GeLU and the causal softmax

void Backend::gelu_forward(ConstMatrixView<float> X, MatrixView<float> Y) {
  check_unary("gelu_forward", "gelu_forward X", X, "gelu_forward Y", Y);
  do_gelu_forward(X, Y);
}
void Backend::gelu_forward(ConstMatrixView<double> X, MatrixView<double> Y) {
  check_unary("gelu_forward", "gelu_forward X", X, "gelu_forward Y", Y);
  do_gelu_forward(X, Y);
}
void Backend::gelu_forward(ConstMatrixView<bf16> X, MatrixView<bf16> Y) {
  check_unary("gelu_forward", "gelu_forward X", X, "gelu_forward Y", Y);
  do_gelu_forward(X, Y);
}
void Backend::gelu_backward(ConstMatrixView<float> X, ConstMatrixView<float> dY,
                            MatrixView<float> dX) {
  check_binary("gelu_backward", "gelu_backward X", X, "gelu_backward dY", dY, "gelu_backward dX",
               dX);
  do_gelu_backward(X, dY, dX);
}
void Backend::gelu_backward(ConstMatrixView<double> X, ConstMatrixView<double> dY,
                            MatrixView<double> dX) {
  check_binary("gelu_backward", "gelu_backward X", X, "gelu_backward dY", dY, "gelu_backward dX",
               dX);
  do_gelu_backward(X, dY, dX);
}
void Backend::gelu_backward(ConstMatrixView<bf16> X, ConstMatrixView<bf16> dY,
                            MatrixView<bf16> dX) {
  check_binary("gelu_backward", "gelu_backward X", X, "gelu_backward dY", dY, "gelu_backward dX",
               dX);
  do_gelu_backward(X, dY, dX);
}

void Backend::softmax_causal(ConstMatrixView<float> S, double scale, MatrixView<float> P) {
  check_unary("softmax_causal", "softmax_causal S", S, "softmax_causal P", P);
  do_softmax_causal(S, scale, P);
}
void Backend::softmax_causal(ConstMatrixView<double> S, double scale, MatrixView<double> P) {
  check_unary("softmax_causal", "softmax_causal S", S, "softmax_causal P", P);
  do_softmax_causal(S, scale, P);
}
void Backend::softmax_causal(ConstMatrixView<bf16> S, double scale, MatrixView<bf16> P) {
  check_unary("softmax_causal", "softmax_causal S", S, "softmax_causal P", P);
  do_softmax_causal(S, scale, P);
}
void Backend::softmax_causal_backward(ConstMatrixView<float> P, ConstMatrixView<float> dP,
                                      double scale, MatrixView<float> dS) {
  check_binary("softmax_causal_backward", "softmax_causal_backward P", P,
               "softmax_causal_backward dP", dP, "softmax_causal_backward dS", dS);
  do_softmax_causal_backward(P, dP, scale, dS);
}
void Backend::softmax_causal_backward(ConstMatrixView<double> P, ConstMatrixView<double> dP,
                                      double scale, MatrixView<double> dS) {
  check_binary("softmax_causal_backward", "softmax_causal_backward P", P,
               "softmax_causal_backward dP", dP, "softmax_causal_backward dS", dS);
  do_softmax_causal_backward(P, dP, scale, dS);
}
void Backend::softmax_causal_backward(ConstMatrixView<bf16> P, ConstMatrixView<bf16> dP,
                                      double scale, MatrixView<bf16> dS) {
  check_binary("softmax_causal_backward", "softmax_causal_backward P", P,
               "softmax_causal_backward dP", dP, "softmax_causal_backward dS", dS);
  do_softmax_causal_backward(P, dP, scale, dS);
}

// ---- Cross-entropy

void Backend::row_max(ConstMatrixView<float> Z, float* out) {
  check_row_max(Z, out);
  do_row_max(Z, out);
}
void Backend::row_max(ConstMatrixView<double> Z, double* out) {
  check_row_max(Z, out);
  do_row_max(Z, out);
}
void Backend::row_max(ConstMatrixView<bf16> Z, float* out) {
  check_row_max(Z, out);
  do_row_max(Z, out);
}
void Backend::row_sum_exp(ConstMatrixView<float> Z, const float* max, float* out) {
  check_row_sum_exp(Z, max, out);
  do_row_sum_exp(Z, max, out);
}
void Backend::row_sum_exp(ConstMatrixView<double> Z, const double* max, double* out) {
  check_row_sum_exp(Z, max, out);
  do_row_sum_exp(Z, max, out);
}
void Backend::row_sum_exp(ConstMatrixView<bf16> Z, const float* max, float* out) {
  check_row_sum_exp(Z, max, out);
  do_row_sum_exp(Z, max, out);
}
void Backend::pick_targets(ConstMatrixView<float> Z, const std::int32_t* targets, index_t col0,
                           float* out) {
  check_pick_targets(Z, targets, out);
  do_pick_targets(Z, targets, col0, out);
}
void Backend::pick_targets(ConstMatrixView<double> Z, const std::int32_t* targets, index_t col0,
                           double* out) {
  check_pick_targets(Z, targets, out);
  do_pick_targets(Z, targets, col0, out);
}
void Backend::pick_targets(ConstMatrixView<bf16> Z, const std::int32_t* targets, index_t col0,
                           float* out) {
  check_pick_targets(Z, targets, out);
  do_pick_targets(Z, targets, col0, out);
}
double Backend::cross_entropy_sum(index_t n, const float* max, const float* sum,
                                  const float* picked) {
  check_cross_entropy_sum(n, max, sum, picked);
  return do_cross_entropy_sum(n, max, sum, picked);
}
double Backend::cross_entropy_sum(index_t n, const double* max, const double* sum,
                                  const double* picked) {
  check_cross_entropy_sum(n, max, sum, picked);
  return do_cross_entropy_sum(n, max, sum, picked);
}
void Backend::cross_entropy_grad(MatrixView<float> Z, const float* max, const float* sum,
                                 const std::int32_t* targets, index_t col0, double scale) {
  check_cross_entropy_grad(Z, max, sum, targets);
  do_cross_entropy_grad(Z, max, sum, targets, col0, scale);
}
void Backend::cross_entropy_grad(MatrixView<double> Z, const double* max, const double* sum,
                                 const std::int32_t* targets, index_t col0, double scale) {
  check_cross_entropy_grad(Z, max, sum, targets);
  do_cross_entropy_grad(Z, max, sum, targets, col0, scale);
}
void Backend::cross_entropy_grad(MatrixView<bf16> Z, const float* max, const float* sum,
                                 const std::int32_t* targets, index_t col0, double scale) {
  check_cross_entropy_grad(Z, max, sum, targets);
  do_cross_entropy_grad(Z, max, sum, targets, col0, scale);
}

// ---- Embedding rows

void Backend::gather_rows(const std::int32_t* ids, index_t row0, ConstMatrixView<float> table,
                          bool accumulate, MatrixView<float> out) {
  check_gather_rows(ids, table, out);
  do_gather_rows(ids, row0, table, accumulate, out);
}
void Backend::gather_rows(const std::int32_t* ids, index_t row0, ConstMatrixView<double> table,
                          bool accumulate, MatrixView<double> out) {
  check_gather_rows(ids, table, out);
  do_gather_rows(ids, row0, table, accumulate, out);
}
void Backend::gather_rows(const std::int32_t* ids, index_t row0, ConstMatrixView<bf16> table,
                          bool accumulate, MatrixView<bf16> out) {
  check_gather_rows(ids, table, out);
  do_gather_rows(ids, row0, table, accumulate, out);
}
void Backend::scatter_add_rows(const std::int32_t* ids, index_t row0, ConstMatrixView<float> src,
                               MatrixView<float> table) {
  check_scatter_add_rows(ids, src, table);
  do_scatter_add_rows(ids, row0, src, table);
}
void Backend::scatter_add_rows(const std::int32_t* ids, index_t row0, ConstMatrixView<double> src,
                               MatrixView<double> table) {
  check_scatter_add_rows(ids, src, table);
  do_scatter_add_rows(ids, row0, src, table);
}
void Backend::scatter_add_rows(const std::int32_t* ids, index_t row0, ConstMatrixView<bf16> src,
                               MatrixView<bf16> table) {
  check_scatter_add_rows(ids, src, table);
  do_scatter_add_rows(ids, row0, src, table);
}

// ---- Host <-> backend memory

void Backend::upload(void* dst, const void* host_src, std::size_t bytes) {
  check_transfer("upload", dst, "dst", host_src, "host_src", bytes);
  do_upload(dst, host_src, bytes);
}
void* Backend::allocate_host(std::size_t bytes) {
  const std::size_t size = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, size == 0 ? 64 : size);
  if (p == nullptr)
    throw OutOfMemory("Backend::allocate_host: " + std::to_string(bytes) +
                      " bytes of host memory: out of memory");
  note_host_allocated(bytes);
  return p;
}
void Backend::deallocate_host(void* p, std::size_t bytes) noexcept {
  if (p != nullptr) note_host_deallocated(bytes);
  std::free(p);
}
void Backend::stage_in(void* dst, const void* host_src, std::size_t bytes) {
  upload(dst, host_src, bytes);
}
void Backend::stage_out(void* host_dst, const void* src, std::size_t bytes) {
  download(host_dst, src, bytes);
}
void Backend::download(void* host_dst, const void* src, std::size_t bytes) {
  check_transfer("download", host_dst, "host_dst", src, "src", bytes);
  do_download(host_dst, src, bytes);
}

// ---- Optimizer arithmetic

void Backend::adamw_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                           index_t n, const optim::AdamWCoefficients& c) {
  check_update(
      "adamw_update", n,
      {{param, "param"}, {grad, "grad"}, {exp_avg, "exp_avg"}, {exp_avg_sq, "exp_avg_sq"}});
  do_adamw_update(param, grad, exp_avg, exp_avg_sq, n, c);
}
void Backend::adamw_update(double* param, const double* grad, double* exp_avg, double* exp_avg_sq,
                           index_t n, const optim::AdamWCoefficients& c) {
  check_update(
      "adamw_update", n,
      {{param, "param"}, {grad, "grad"}, {exp_avg, "exp_avg"}, {exp_avg_sq, "exp_avg_sq"}});
  do_adamw_update(param, grad, exp_avg, exp_avg_sq, n, c);
}
void Backend::adamw_update(bf16* param, const bf16* grad, float* exp_avg, float* exp_avg_sq,
                           float* master, index_t n, const optim::AdamWCoefficients& c) {
  check_update("adamw_update", n,
               {{param, "param"},
                {grad, "grad"},
                {exp_avg, "exp_avg"},
                {exp_avg_sq, "exp_avg_sq"},
                {master, "master"}});
  do_adamw_update(param, grad, exp_avg, exp_avg_sq, master, n, c);
}
void Backend::sgd_update(float* param, const float* grad, float* momentum_buffer, index_t n,
                         const optim::SgdCoefficients& c) {
  check_update("sgd_update", n,
               {{param, "param"}, {grad, "grad"}, {momentum_buffer, "momentum_buffer"}});
  do_sgd_update(param, grad, momentum_buffer, n, c);
}
void Backend::sgd_update(double* param, const double* grad, double* momentum_buffer, index_t n,
                         const optim::SgdCoefficients& c) {
  check_update("sgd_update", n,
               {{param, "param"}, {grad, "grad"}, {momentum_buffer, "momentum_buffer"}});
  do_sgd_update(param, grad, momentum_buffer, n, c);
}
void Backend::sgd_update(bf16* param, const bf16* grad, float* momentum_buffer, float* master,
                         index_t n, const optim::SgdCoefficients& c) {
  check_update(
      "sgd_update", n,
      {{param, "param"}, {grad, "grad"}, {momentum_buffer, "momentum_buffer"}, {master, "master"}});
  do_sgd_update(param, grad, momentum_buffer, master, n, c);
}

double Backend::sum_of_squares(const float* x, index_t n) {
  check_update("sum_of_squares", n, {{x, "x"}});
  return do_sum_of_squares(x, n);
}
double Backend::sum_of_squares(const double* x, index_t n) {
  check_update("sum_of_squares", n, {{x, "x"}});
  return do_sum_of_squares(x, n);
}
double Backend::sum_of_squares(const bf16* x, index_t n) {
  check_update("sum_of_squares", n, {{x, "x"}});
  return do_sum_of_squares(x, n);
}
double Backend::sum_of_squares(const float* x, index_t rows, index_t cols, index_t ld) {
  check_sum_of_squares(x, rows, cols, ld);
  return do_sum_of_squares(x, rows, cols, ld);
}
double Backend::sum_of_squares(const double* x, index_t rows, index_t cols, index_t ld) {
  check_sum_of_squares(x, rows, cols, ld);
  return do_sum_of_squares(x, rows, cols, ld);
}
double Backend::sum_of_squares(const bf16* x, index_t rows, index_t cols, index_t ld) {
  check_sum_of_squares(x, rows, cols, ld);
  return do_sum_of_squares(x, rows, cols, ld);
}

void Backend::scale_in_place(float* x, index_t n, double factor) {
  check_update("scale_in_place", n, {{x, "x"}});
  do_scale_in_place(x, n, factor);
}
void Backend::scale_in_place(double* x, index_t n, double factor) {
  check_update("scale_in_place", n, {{x, "x"}});
  do_scale_in_place(x, n, factor);
}
void Backend::scale_in_place(bf16* x, index_t n, double factor) {
  check_update("scale_in_place", n, {{x, "x"}});
  do_scale_in_place(x, n, factor);
}

}  // namespace summa

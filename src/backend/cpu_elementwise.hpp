#pragma once
// Vectorised element-wise kernels of CpuBackend (internal).
//
// The GeLU (tanh form) runs on segments of at most kSegment elements, gathered
// into aligned stack buffers, with Eigen's packet math: its tanh is vectorised for float (a
// rational approximation within a few ulp), so a float GeLU costs a few
// instructions per element instead of a scalar double tanh (about 20 ns per
// element before, most of a CPU block's forward at GPT-2 shapes). double keeps
// double precision; bf16 widens a segment to float in a stack buffer. No heap:
// every buffer is on the stack.

// GCC 12's AVX-512 intrinsics (avx512fintrin.h's _mm512_undefined_ps, used by
// _mm512_min_ps/_mm512_max_ps in Eigen's vectorised tanh) draw false
// "(maybe-)uninitialized" warnings under -march=native on an AVX-512 CPU,
// located in that header (GCC bug 105593, fixed in GCC 13). The warnings are
// silenced for the locations of the intrinsics headers only: they must be
// first included here, through Eigen, in this header's includers (it comes
// before any other Eigen or intrinsics include in cpu_backend*.cpp).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <Eigen/Core>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include <algorithm>
#include <cstddef>

#include "summa/core/matrix_view.hpp"

namespace summa::cpu_detail {

inline constexpr double kGeluC = 0.79788456080286535588;  // sqrt(2 / pi)
inline constexpr double kGeluA = 0.044715;
inline constexpr index_t kSegment = 256;

// Calls fn(r, c) for every element, the inner loop along the contiguous axis
// of a view of order `o`.
template <class Fn>
void for_each_element(index_t rows, index_t cols, Order o, Fn&& fn) {
  if (o == Order::col_major) {
    for (index_t c = 0; c < cols; ++c)
      for (index_t r = 0; r < rows; ++r) fn(r, c);
  } else {
    for (index_t r = 0; r < rows; ++r)
      for (index_t c = 0; c < cols; ++c) fn(r, c);
  }
}

// Calls fn(r, c, n) for runs of n <= kSegment elements that are contiguous in
// every view when all of them share `o`: along rows for row-major, along
// columns for column-major.
template <class Fn>
void for_each_segment(index_t rows, index_t cols, Order o, Fn&& fn) {
  const index_t outer = o == Order::row_major ? rows : cols;
  const index_t inner = o == Order::row_major ? cols : rows;
  for (index_t i = 0; i < outer; ++i)
    for (index_t j = 0; j < inner; j += kSegment) {
      const index_t n = std::min(kSegment, inner - j);
      if (o == Order::row_major)
        fn(i, j, n);
      else
        fn(j, i, n);
    }
}

// y = 0.5 x (1 + tanh(c (x + a x^3))) on n contiguous elements (y may be x).
template <class S>
void gelu_segment(const S* x, S* y, index_t n) {
  using A = Eigen::Array<S, Eigen::Dynamic, 1>;
  const Eigen::Map<const A> xa(x, n);
  Eigen::Map<A> ya(y, n);
  ya = S(0.5) * xa * (S(1) + (S(kGeluC) * (xa + S(kGeluA) * xa.cube())).tanh());
}

// dx = dy * gelu'(x) on n contiguous elements (dx may be dy).
template <class S>
void gelu_grad_segment(const S* x, const S* dy, S* dx, index_t n) {
  using A = Eigen::Array<S, Eigen::Dynamic, 1>;
  alignas(64) S tb[kSegment];
  const Eigen::Map<const A> xa(x, n), dya(dy, n);
  Eigen::Map<A> t(tb, n), dxa(dx, n);
  t = (S(kGeluC) * (xa + S(kGeluA) * xa.cube())).tanh();
  // The second term vanishes where tanh has saturated (|x| > 10 in float);
  // x clamped there keeps x * (1 + 3a x^2) finite for any finite x (a huge
  // x would make it inf, and inf * 0 NaN).
  const auto xc = xa.max(S(-16)).min(S(16));
  dxa = dya * (S(0.5) * (S(1) + t) +
               S(0.5 * kGeluC) * xc * (S(1) - t.square()) * (S(1) + S(3 * kGeluA) * xc.square()));
}

// The GeLU of a view of T (float, double or bf16), computed in S (float for
// float and bf16, double for double): every segment is gathered into an
// aligned stack buffer, so each element takes the same arithmetic path
// whatever the views' orders, strides and alignment, and a bf16 output is the
// float op's output rounded once.
template <class T, class S>
void gelu_forward_view(ConstMatrixView<T> X, MatrixView<T> Y) {
  for_each_segment(Y.rows, Y.cols, Y.order, [&](index_t r, index_t c, index_t n) {
    alignas(64) S x[kSegment] = {};
    const bool along_row = Y.order == Order::row_major;
    for (index_t i = 0; i < n; ++i) x[i] = static_cast<S>(along_row ? X(r, c + i) : X(r + i, c));
    gelu_segment(x, x, n);
    for (index_t i = 0; i < n; ++i) (along_row ? Y(r, c + i) : Y(r + i, c)) = T(x[i]);
  });
}

template <class T, class S>
void gelu_backward_view(ConstMatrixView<T> X, ConstMatrixView<T> dY, MatrixView<T> dX) {
  for_each_segment(dX.rows, dX.cols, dX.order, [&](index_t r, index_t c, index_t n) {
    alignas(64) S x[kSegment] = {}, g[kSegment] = {};
    const bool along_row = dX.order == Order::row_major;
    for (index_t i = 0; i < n; ++i) {  // read before dX (may be dY) is written
      x[i] = static_cast<S>(along_row ? X(r, c + i) : X(r + i, c));
      g[i] = static_cast<S>(along_row ? dY(r, c + i) : dY(r + i, c));
    }
    gelu_grad_segment(x, g, g, n);
    for (index_t i = 0; i < n; ++i) (along_row ? dX(r, c + i) : dX(r + i, c)) = T(g[i]);
  });
}

}  // namespace summa::cpu_detail

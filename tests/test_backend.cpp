// The CPU backend (local-math seam) and arenas, on one rank, against Eigen.
// GEMM tolerance: max error / (k * eps * max|A| * max|B| * |alpha| + 2 eps |beta| max|C0|) < 1.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "test_util.hpp"

namespace summa::test {
namespace {

template <class T>
Mat<T> apply(Op op, const Mat<T>& x) {
  return op == Op::N ? x : Mat<T>(x.transpose());
}

template <class T>
void gemm_sweep() {
  CpuBackend backend;
  std::mt19937_64 gen(fresh_seed());
  const index_t m = 13, n = 9, k = 17;
  const double eps = std::numeric_limits<T>::epsilon();
  for (Op ta : {Op::N, Op::T})
    for (Op tb : {Op::N, Op::T})
      for (Order oa : {Order::col_major, Order::row_major})
        for (Order ob : {Order::col_major, Order::row_major})
          for (Order oc : {Order::col_major, Order::row_major}) {
            const Mat<T> A = random_matrix<T>(ta == Op::N ? m : k, ta == Op::N ? k : m, gen);
            const Mat<T> B = random_matrix<T>(tb == Op::N ? k : n, tb == Op::N ? n : k, gen);
            const Mat<T> C0 = random_matrix<T>(m, n, gen);
            Block<T> a(A.rows(), A.cols(), oa, 2), b(B.rows(), B.cols(), ob, 1), c(m, n, oc, 3);
            a.fill(A);
            b.fill(B);
            c.fill(C0);
            const T alpha = T(0.75), beta = T(-1.5);
            std::vector<char> scratch(backend.gemm_scratch_bytes(m, n, k, dtype_v<T>));
            backend.gemm(ta, tb, alpha, a.view(), b.view(), beta, c.view(),
                         {scratch.data(), scratch.size()});
            const Mat<T> want = alpha * apply(ta, A) * apply(tb, B) + beta * C0;
            const double scale =
                k * eps * A.cwiseAbs().maxCoeff() * B.cwiseAbs().maxCoeff() * std::abs(alpha) +
                2 * eps * std::abs(beta) * C0.cwiseAbs().maxCoeff();
            const double err = (c.read() - want).cwiseAbs().maxCoeff() / scale;
            EXPECT_LT(err, 1.0) << "ta=" << int(ta) << " tb=" << int(tb) << " orders " << int(oa)
                                << int(ob) << int(oc);
          }
}

TEST(CpuBackend, GemmAllTransposesAndOrdersFloat) {
  gemm_sweep<float>();
}
TEST(CpuBackend, GemmAllTransposesAndOrdersDouble) {
  gemm_sweep<double>();
}

TEST(CpuBackend, GemmBlasSemanticsForZeros) {
  CpuBackend backend;
  std::mt19937_64 gen(fresh_seed());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Mat<double> A = random_matrix<double>(6, 4, gen), B = random_matrix<double>(4, 5, gen);
  Mat<double> C = Mat<double>::Constant(6, 5, nan);
  auto V = [](Mat<double>& x) { return MatrixView<double>::dense(x.data(), x.rows(), x.cols()); };
  backend.gemm(Op::N, Op::N, 1.0, V(A), V(B), 0.0, V(C));  // beta = 0: C never read
  EXPECT_LT((C - A * B).cwiseAbs().maxCoeff(), 1e-14);

  Mat<double> An = Mat<double>::Constant(6, 4, nan), Bn = Mat<double>::Constant(4, 5, nan);
  Mat<double> C0 = random_matrix<double>(6, 5, gen), C1 = C0;
  backend.gemm(Op::N, Op::N, 0.0, V(An), V(Bn), 2.0, V(C1));  // alpha = 0: A, B never read
  EXPECT_EQ(C1, Mat<double>(2.0 * C0));

  Mat<double> Ak(6, 0), Bk(0, 5), C2 = C0;
  backend.gemm(Op::N, Op::N, 1.0, V(Ak), V(Bk), -1.0, V(C2));  // k = 0
  EXPECT_EQ(C2, Mat<double>(-C0));
}

TEST(CpuBackend, GemmWithScratchAllocatesNothing) {
  if (!allocation_counting_available()) GTEST_SKIP() << "allocation counting is off under ASan";
  CpuBackend backend;
  std::mt19937_64 gen(fresh_seed());
  for (auto [m, n, k] : {std::tuple<index_t, index_t, index_t>{300, 280, 260},
                         {1, 500, 700},
                         {512, 3, 64},
                         {640, 640, 640}}) {
    Mat<float> A = random_matrix<float>(m, k, gen), B = random_matrix<float>(n, k, gen);
    Mat<float> C(m, n), D(m, n);
    std::vector<char> scratch(backend.gemm_scratch_bytes(m, n, k, DType::f32));
    std::uint64_t count = 0;
    std::string first;
    {
      CountAllocations counter;
      backend.gemm(Op::N, Op::T, 1.0f, MatrixView<float>::dense(A.data(), m, k),
                   MatrixView<float>::dense(B.data(), n, k), 0.0f,
                   MatrixView<float>::dense(C.data(), m, n), {scratch.data(), scratch.size()});
      count = counter.count();
      first = counter.first_caller();
    }
    EXPECT_EQ(count, 0u) << m << "x" << n << "x" << k << ", first from " << first;
    // Same result as without scratch (Eigen then allocates its own buffers).
    backend.gemm(Op::N, Op::T, 1.0f, MatrixView<float>::dense(A.data(), m, k),
                 MatrixView<float>::dense(B.data(), n, k), 0.0f,
                 MatrixView<float>::dense(D.data(), m, n));
    EXPECT_EQ(C, D);
  }
}

TEST(CpuBackend, CopyAxpbyScale) {
  CpuBackend backend;
  std::mt19937_64 gen(fresh_seed());
  const Mat<double> X = random_matrix<double>(7, 5, gen), Y = random_matrix<double>(7, 5, gen);
  Block<double> x(7, 5, Order::row_major, 2), y(7, 5, Order::col_major, 1);
  x.fill(X);
  y.fill(Y);
  backend.axpby(2.0, x.view(), -0.5, y.view());
  EXPECT_LT((y.read() - (2.0 * X - 0.5 * Y)).cwiseAbs().maxCoeff(), 1e-15);
  y.fill_value(std::numeric_limits<double>::quiet_NaN());
  backend.axpby(3.0, x.view(), 0.0, y.view());  // beta = 0 never reads y
  EXPECT_LT((y.read() - 3.0 * X).cwiseAbs().maxCoeff(), 1e-15);
  backend.copy(x.view(), y.view());
  EXPECT_EQ(y.read(), X);
  backend.scale(-2.0, y.view());
  EXPECT_EQ(y.read(), Mat<double>(-2.0 * X));
  y.fill_value(std::numeric_limits<double>::quiet_NaN());
  backend.scale(0.0, y.view());
  EXPECT_EQ(y.read(), Mat<double>::Zero(7, 5));
}

TEST(CpuBackend, BiasAndColumnSums) {
  CpuBackend backend;
  std::mt19937_64 gen(fresh_seed());
  const Mat<double> X = random_matrix<double>(6, 4, gen), b = random_matrix<double>(1, 4, gen);
  for (Order o : {Order::col_major, Order::row_major}) {
    Block<double> x(6, 4, o, 2);
    x.fill(X);
    backend.add_bias(x.view(), b.data());
    Mat<double> want = X;
    want.rowwise() += b.row(0);
    EXPECT_LT((x.read() - want).cwiseAbs().maxCoeff(), 1e-15);
    std::vector<double> sums(4, std::numeric_limits<double>::quiet_NaN());
    backend.column_sums(x.view(), 0.0, sums.data());  // beta = 0 never reads out
    for (index_t c = 0; c < 4; ++c) EXPECT_NEAR(sums[c], want.col(c).sum(), 1e-14);
    backend.column_sums(x.view(), 2.0, sums.data());
    for (index_t c = 0; c < 4; ++c) EXPECT_NEAR(sums[c], 3 * want.col(c).sum(), 1e-13);
  }
}

TEST(CpuBackend, ShapeErrorsNameTheOperands) {
  CpuBackend backend;
  Mat<float> A(4, 3), B(5, 2), C(4, 2);
  try {
    backend.gemm(Op::N, Op::N, 1.0f, MatrixView<float>::dense(A.data(), 4, 3),
                 MatrixView<float>::dense(B.data(), 5, 2), 0.0f,
                 MatrixView<float>::dense(C.data(), 4, 2));
    ADD_FAILURE() << "no exception";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("A is 4x3 and B is 5x2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(backend.gemm(Op::N, Op::N, 1.0f, MatrixView<float>(A.data(), 4, 3, 2),
                            MatrixView<float>::dense(B.data(), 3, 2), 0.0f,
                            MatrixView<float>::dense(C.data(), 4, 2)),
               Error);  // ld 2 < rows 4
  EXPECT_THROW(backend.copy(MatrixView<float>::dense(A.data(), 4, 3),
                            MatrixView<float>::dense(C.data(), 4, 2)),
               Error);
}

TEST(Arena, BumpAllocationAlignmentAndOverflow) {
  CpuBackend backend;
  Arena arena("forward", backend, 1000);
  EXPECT_EQ(arena.capacity(), 1024u);  // rounded up to the 64-byte alignment
  float* a = arena.take<float>(3);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a) % Arena::alignment, 0u);
  const std::size_t mark = arena.mark();
  double* b = arena.take<double>(10);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b) % Arena::alignment, 0u);
  EXPECT_EQ(arena.used(), 64u + 128u);
  arena.release(mark);
  EXPECT_EQ(arena.used(), 64u);
  EXPECT_EQ(arena.high_water(), 192u);
  {
    ArenaScope scope(arena);
    arena.take_bytes(500);
  }
  EXPECT_EQ(arena.used(), 64u);
  try {
    arena.take_bytes(2000);
    ADD_FAILURE() << "no exception";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "arena 'forward' overflow: request of 2000 bytes with 64 of 1024 bytes in use");
  }
  EXPECT_THROW(arena.release(4096), Error);
}

// ---- GeLU, causal softmax, cross-entropy and embedding kernels ---------------
// Each kernel runs on fresh random data in every combination of storage orders
// (with ld > the minimum) and is compared with a plain loop below, evaluated in
// long double from the same T inputs. Tolerances, with eps = eps of T:
//  - GeLU forward/backward: 32 eps (1 + x^2)(1 + |dy|) absolute (values are O(x^2)).
//  - causal softmax (values in [0, 1]) and row sums: (s + 4) eps absolute, s
//    the row length, plus 4 |scale| max|S| eps_double for the rounding of the
//    logits scale * S (large |S| checks the max subtraction: exp would
//    overflow or underflow without it); its backward: 2 (s + 4) eps |scale|
//    (|dS| <= 2 |scale|).
//  - row_sum_exp: relative 4 eps + 4 (cols + 2) eps_double (sums in double).
//  - cross_entropy_sum (returns double): 8 (n + 1) eps_double sum_r |terms|.
//  - cross_entropy_grad: 8 eps |scale| absolute (|grad| <= 2 |scale|).
//  - row_max, pick_targets, gather: exact (they only copy elements); exact
//    zeros where the contract says 0; scatter_add: (k + 1) eps max|value| for
//    k repeated ids.
// Finite-difference checks (double, central differences, h = 1e-5) compare
// directional derivatives with relative tolerance 1e-6.

using Real = long double;
constexpr Real kRefGeluC = 0.797884560802865355879892119868763737L;  // sqrt(2 / pi)

constexpr std::array<Order, 2> kOrders{Order::col_major, Order::row_major};

template <class T>
double eps_of() {
  return std::numeric_limits<T>::epsilon();
}

template <class T>
Mat<T> scaled(const Mat<T>& m, double s) {
  return Mat<T>((m.template cast<double>() * s).template cast<T>());
}

Real ref_gelu(Real x) {
  return 0.5L * x * (1 + std::tanh(kRefGeluC * (x + 0.044715L * x * x * x)));
}
// d/dx [x/2 (1 + tanh u)] = (1 + tanh u)/2 + x/2 sech^2(u) u'.
Real ref_gelu_grad(Real x) {
  const Real u = kRefGeluC * (x + 0.044715L * x * x * x);
  const Real du = kRefGeluC * (1 + 3 * 0.044715L * x * x);
  const Real ch = std::cosh(u);
  return 0.5L * (1 + std::tanh(u)) + 0.5L * x * du / (ch * ch);
}

template <class T>
void check_gelu() {
  CpuBackend backend;
  std::mt19937_64 gen(fresh_seed());
  const index_t n = 11, h = 7;
  const double eps = eps_of<T>();
  for (Order ox : kOrders)
    for (Order oy : kOrders)
      for (bool in_place : {false, true}) {
        if (in_place && ox != oy) continue;
        const Mat<T> X = scaled(random_matrix<T>(n, h, gen), 4.0);  // into tanh saturation
        const Mat<T> dY = random_matrix<T>(n, h, gen);
        Block<T> x(n, h, ox, 2), y(n, h, oy, 3), dy(n, h, oy, 1);
        x.fill(X);
        dy.fill(dY);
        y.fill_value(std::numeric_limits<T>::quiet_NaN());  // never read
        Block<T>& yout = in_place ? x : y;
        backend.gelu_forward(x.view(), yout.view());
        const Mat<T> Y = yout.read();
        // Backward reads the original X; in place, dX overwrites dY.
        x.fill(X);
        Block<T> dx(n, h, ox, 2);
        dx.fill_value(std::numeric_limits<T>::quiet_NaN());
        Block<T>& dxout = in_place ? dy : dx;
        backend.gelu_backward(x.view(), dy.view(), dxout.view());
        const Mat<T> dX = dxout.read();
        double worst_y = 0, worst_dx = 0;
        for (index_t j = 0; j < h; ++j)
          for (index_t i = 0; i < n; ++i) {
            const Real xi = X(i, j), dyi = dY(i, j);
            const double scale = (1 + double(xi * xi)) * (1 + std::abs(double(dyi)));
            worst_y = std::max(worst_y, double(std::abs(Y(i, j) - ref_gelu(xi))) / scale);
            worst_dx =
                std::max(worst_dx, double(std::abs(dX(i, j) - dyi * ref_gelu_grad(xi))) / scale);
          }
        EXPECT_LT(worst_y, 32 * eps) << "orders " << int(ox) << int(oy) << " in place " << in_place;
        EXPECT_LT(worst_dx, 32 * eps)
            << "orders " << int(ox) << int(oy) << " in place " << in_place;
      }
}

TEST(CpuBackend, GeluMatchesReferenceFloat) {
  check_gelu<float>();
}
TEST(CpuBackend, GeluMatchesReferenceDouble) {
  check_gelu<double>();
}

// P of the causal softmax of scale * S in long double (zeros above the diagonal).
template <class T>
Mat<Real> ref_softmax_causal(const Mat<T>& S, double scale) {
  Mat<Real> P = Mat<Real>::Zero(S.rows(), S.cols());
  for (index_t r = 0; r < S.rows(); ++r) {
    Real m = -std::numeric_limits<Real>::infinity();
    for (index_t c = 0; c <= r && c < S.cols(); ++c) m = std::max(m, Real(scale) * S(r, c));
    Real sum = 0;
    for (index_t c = 0; c <= r && c < S.cols(); ++c) sum += std::exp(Real(scale) * S(r, c) - m);
    for (index_t c = 0; c <= r && c < S.cols(); ++c)
      P(r, c) = std::exp(Real(scale) * S(r, c) - m) / sum;
  }
  return P;
}

template <class T>
void check_softmax_causal() {
  CpuBackend backend;
  std::mt19937_64 gen(fresh_seed());
  const double eps = eps_of<T>();
  for (index_t s : {1, 13})
    for (double scale : {0.35, -1.75})
      for (double offset : {0.0, 3000.0})
        for (Order os : kOrders)
          for (Order op : kOrders)
            for (bool in_place : {false, true}) {
              if (in_place && os != op) continue;
              const std::string where =
                  "s=" + std::to_string(s) + " scale=" + std::to_string(scale) +
                  " offset=" + std::to_string(offset) + " orders " + std::to_string(int(os)) +
                  std::to_string(int(op)) + (in_place ? " in place" : "");
              const Mat<T> S =
                  (scaled(random_matrix<T>(s, s, gen), 3.0).array() + T(offset)).matrix();
              Block<T> sb(s, s, os, 2), pb(s, s, op, 3);
              sb.fill(S);  // in place: random values above the diagonal must become 0
              pb.fill_value(std::numeric_limits<T>::quiet_NaN());  // never read
              Block<T>& out = in_place ? sb : pb;
              backend.softmax_causal(sb.view(), scale, out.view());
              const Mat<T> P = out.read();
              const Mat<Real> want = ref_softmax_causal(S, scale);
              const double tol = double(s + 4) * eps;
              const double tol_p =
                  tol + 4 * std::abs(scale) * (offset + 3) * std::numeric_limits<double>::epsilon();
              double worst = 0;
              for (index_t r = 0; r < s; ++r) {
                Real row_sum = 0;
                for (index_t c = 0; c < s; ++c) {
                  if (c > r) {
                    EXPECT_EQ(P(r, c), T(0)) << where << " at " << r << "," << c;
                    continue;
                  }
                  EXPECT_GE(P(r, c), T(0)) << where;
                  row_sum += P(r, c);
                  worst = std::max(worst, double(std::abs(P(r, c) - want(r, c))));
                }
                EXPECT_NEAR(double(row_sum), 1.0, tol_p) << where << " row " << r;
              }
              EXPECT_LT(worst, tol_p) << where;

              // Backward from the reference P (rounded to T): dS = scale P (dP - <dP, P>_row).
              Mat<T> Pt(s, s);
              for (index_t r = 0; r < s; ++r)
                for (index_t c = 0; c < s; ++c) Pt(r, c) = static_cast<T>(want(r, c));
              const Mat<T> dP = random_matrix<T>(s, s, gen);
              Block<T> pin(s, s, os, 1), dpb(s, s, op, 2), dsb(s, s, os, 3);
              pin.fill(Pt);
              dpb.fill(dP);
              dsb.fill_value(std::numeric_limits<T>::quiet_NaN());  // never read
              Block<T>& dsout = in_place ? dpb : dsb;
              backend.softmax_causal_backward(pin.view(), dpb.view(), scale, dsout.view());
              const Mat<T> dS = dsout.read();
              double worst_ds = 0;
              for (index_t r = 0; r < s; ++r) {
                Real dot = 0;
                for (index_t c = 0; c < s; ++c) dot += Real(dP(r, c)) * Pt(r, c);
                for (index_t c = 0; c < s; ++c) {
                  if (c > r) {
                    EXPECT_EQ(dS(r, c), T(0)) << where << " at " << r << "," << c;
                    continue;
                  }
                  const Real ref = Real(scale) * Pt(r, c) * (dP(r, c) - dot);
                  worst_ds = std::max(worst_ds, double(std::abs(dS(r, c) - ref)));
                }
              }
              EXPECT_LT(worst_ds, 2 * tol * std::abs(scale)) << where;
            }
}

TEST(CpuBackend, SoftmaxCausalMatchesReferenceFloat) {
  check_softmax_causal<float>();
}
TEST(CpuBackend, SoftmaxCausalMatchesReferenceDouble) {
  check_softmax_causal<double>();
}

// Central difference of f along a direction, h = 1e-5.
template <class F>
double directional_fd(F&& f, double h = 1e-5) {
  return (f(h) - f(-h)) / (2 * h);
}

TEST(CpuBackend, GeluBackwardMatchesFiniteDifferences) {
  CpuBackend backend;
  std::mt19937_64 gen(fresh_seed());
  const index_t n = 9, h = 6;
  const Mat<double> X = scaled(random_matrix<double>(n, h, gen), 3.0);
  const Mat<double> dY = random_matrix<double>(n, h, gen);
  Mat<double> dX(n, h);
  auto V = [](Mat<double>& m) { return MatrixView<double>::dense(m.data(), m.rows(), m.cols()); };
  Mat<double> x = X, dy = dY;
  backend.gelu_backward(V(x), V(dy), V(dX));
  for (int trial = 0; trial < 3; ++trial) {
    const Mat<double> D = random_matrix<double>(n, h, gen);
    // L(X) = sum dY .* gelu(X); dL/dX . D = sum dX .* D.
    auto loss = [&](double t) {
      Mat<double> xt = X + t * D, yt(n, h);
      backend.gelu_forward(V(xt), V(yt));
      return dY.cwiseProduct(yt).sum();
    };
    const double fd = directional_fd(loss), analytic = dX.cwiseProduct(D).sum();
    EXPECT_NEAR(fd, analytic, 1e-6 * (1 + std::abs(analytic))) << "trial " << trial;
  }
}

TEST(CpuBackend, SoftmaxCausalBackwardMatchesFiniteDifferences) {
  CpuBackend backend;
  std::mt19937_64 gen(fresh_seed());
  const index_t s = 10;
  const double scale = 0.6;
  const Mat<double> S = scaled(random_matrix<double>(s, s, gen), 2.0);
  const Mat<double> dP = random_matrix<double>(s, s, gen);
  auto V = [](Mat<double>& m) {
    return MatrixView<double>::dense(m.data(), m.rows(), m.cols(), Order::col_major);
  };
  Mat<double> st = S, P(s, s), dp = dP, dS(s, s);
  backend.softmax_causal(V(st), scale, V(P));
  backend.softmax_causal_backward(V(P), V(dp), scale, V(dS));
  for (int trial = 0; trial < 3; ++trial) {
    const Mat<double> D = random_matrix<double>(s, s, gen);  // also above the diagonal
    // L(S) = sum dP .* softmax_causal(S); dL/dS . D = sum dS .* D.
    auto loss = [&](double t) {
      Mat<double> sd = S + t * D, pd(s, s);
      backend.softmax_causal(V(sd), scale, V(pd));
      return dP.cwiseProduct(pd).sum();
    };
    const double fd = directional_fd(loss), analytic = dS.cwiseProduct(D).sum();
    EXPECT_NEAR(fd, analytic, 1e-6 * (1 + std::abs(analytic))) << "trial " << trial;
  }
}

// Targets for n rows around a block of columns [col0, col0 + cols): the first
// four hit its first and last column and just miss it on either side.
std::vector<std::int32_t> make_targets(index_t n, index_t col0, index_t cols,
                                       std::mt19937_64& gen) {
  std::uniform_int_distribution<index_t> dist(std::max<index_t>(col0 - 4, 0), col0 + cols + 3);
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  for (auto& v : t) v = static_cast<std::int32_t>(dist(gen));
  const index_t fixed[] = {col0, col0 + cols - 1, col0 - 1, col0 + cols};
  for (index_t i = 0; i < 4 && i < n; ++i)
    if (fixed[i] >= 0) t[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(fixed[i]);
  return t;
}

template <class T>
void check_cross_entropy() {
  CpuBackend backend;
  std::mt19937_64 gen(fresh_seed());
  const index_t n = 9, cols = 11, col0 = 20;
  const double eps = eps_of<T>(), eps_d = eps_of<double>();
  for (Order o : kOrders) {
    const std::string where = "order " + std::to_string(int(o));
    const Mat<T> Z = scaled(random_matrix<T>(n, cols, gen), 5.0);
    const std::vector<std::int32_t> targets = make_targets(n, col0, cols, gen);
    Block<T> z(n, cols, o, 3);
    z.fill(Z);
    const T nan = std::numeric_limits<T>::quiet_NaN();
    std::vector<T> mx(n, nan), sum(n, nan), picked(n, nan);  // outputs never read
    backend.row_max(z.view(), mx.data());
    backend.row_sum_exp(z.view(), mx.data(), sum.data());
    backend.pick_targets(z.view(), targets.data(), col0, picked.data());
    for (index_t r = 0; r < n; ++r) {
      EXPECT_EQ(mx[r], Z.row(r).maxCoeff()) << where << " row " << r;
      Real want_sum = 0;
      for (index_t c = 0; c < cols; ++c) want_sum += std::exp(Real(Z(r, c)) - Real(mx[r]));
      EXPECT_LT(double(std::abs(sum[r] - want_sum) / want_sum),
                4 * eps + 4 * double(cols + 2) * eps_d)
          << where << " row " << r;
      const index_t t = targets[r] - col0;
      EXPECT_EQ(picked[r], t >= 0 && t < cols ? Z(r, t) : T(0))
          << where << " row " << r << " target " << targets[r];
    }

    // The loss of the rows from (here local-only) statistics.
    Real want_loss = 0, magnitude = 0;
    for (index_t r = 0; r < n; ++r) {
      want_loss += std::log(Real(sum[r])) + Real(mx[r]) - Real(picked[r]);
      magnitude +=
          std::abs(std::log(Real(sum[r]))) + std::abs(Real(mx[r])) + std::abs(Real(picked[r]));
    }
    const double loss = backend.cross_entropy_sum(n, mx.data(), sum.data(), picked.data());
    EXPECT_LT(std::abs(double(loss - want_loss)), 8 * double(n + 1) * eps_d * double(magnitude))
        << where;

    // Gradient, in place, from statistics as another rank would see them.
    for (double scale : {1.0, -0.125}) {
      z.fill(Z);
      std::vector<T> gmax(n), gsum(n);
      for (index_t r = 0; r < n; ++r) {
        gmax[r] = static_cast<T>(Z.row(r).maxCoeff() + T(0.5));  // a global max >= local
        gsum[r] = static_cast<T>(sum[r] * T(1.5));
      }
      backend.cross_entropy_grad(z.view(), gmax.data(), gsum.data(), targets.data(), col0, scale);
      const Mat<T> G = z.read();
      double worst = 0;
      for (index_t r = 0; r < n; ++r)
        for (index_t c = 0; c < cols; ++c) {
          const Real p = std::exp(Real(Z(r, c)) - Real(gmax[r])) / Real(gsum[r]);
          const Real hit = c + col0 == targets[r] ? 1 : 0;
          worst = std::max(worst, double(std::abs(G(r, c) - Real(scale) * (p - hit))));
        }
      EXPECT_LT(worst, 8 * eps * std::abs(scale)) << where << " scale " << scale;
    }
  }
}

TEST(CpuBackend, CrossEntropyKernelsMatchReferenceFloat) {
  check_cross_entropy<float>();
}
TEST(CpuBackend, CrossEntropyKernelsMatchReferenceDouble) {
  check_cross_entropy<double>();
}

// With the whole vocabulary local, the loss assembled from row_max,
// row_sum_exp, pick_targets and cross_entropy_sum has cross_entropy_grad
// (scale 1) as its gradient.
TEST(CpuBackend, CrossEntropyGradMatchesFiniteDifferences) {
  CpuBackend backend;
  std::mt19937_64 gen(fresh_seed());
  const index_t n = 7, vocab = 12;
  const Mat<double> Z = scaled(random_matrix<double>(n, vocab, gen), 3.0);
  std::uniform_int_distribution<std::int32_t> pick(0, vocab - 1);
  std::vector<std::int32_t> targets(n);
  for (auto& t : targets) t = pick(gen);
  auto V = [](Mat<double>& m) {
    return MatrixView<double>::dense(m.data(), m.rows(), m.cols(), Order::col_major);
  };
  std::vector<double> mx(n), sum(n), picked(n);
  auto loss_of = [&](Mat<double> z) {
    backend.row_max(V(z), mx.data());
    backend.row_sum_exp(V(z), mx.data(), sum.data());
    backend.pick_targets(V(z), targets.data(), 0, picked.data());
    return backend.cross_entropy_sum(n, mx.data(), sum.data(), picked.data());
  };
  loss_of(Z);  // statistics at Z
  Mat<double> G = Z;
  backend.cross_entropy_grad(V(G), mx.data(), sum.data(), targets.data(), 0, 1.0);
  for (index_t r = 0; r < n; ++r) EXPECT_NEAR(G.row(r).sum(), 0.0, 1e-14) << "row " << r;
  for (int trial = 0; trial < 3; ++trial) {
    const Mat<double> D = random_matrix<double>(n, vocab, gen);
    const double fd = directional_fd([&](double t) { return loss_of(Z + t * D); });
    const double analytic = G.cwiseProduct(D).sum();
    EXPECT_NEAR(fd, analytic, 1e-6 * (1 + std::abs(analytic))) << "trial " << trial;
  }
}

template <class T>
void check_embedding_rows() {
  CpuBackend backend;
  std::mt19937_64 gen(fresh_seed());
  const index_t vrows = 9, row0 = 30, h = 6, n = 14;
  const double eps = eps_of<T>();
  // Ids below, inside (with repeats) and above the block [row0, row0 + vrows).
  std::uniform_int_distribution<std::int32_t> dist(row0 - 3, row0 + vrows + 2);
  std::vector<std::int32_t> ids(n);
  for (auto& id : ids) id = dist(gen);
  ids[0] = row0 - 1;
  ids[1] = row0 + vrows;
  ids[2] = 0;
  ids[3] = row0;
  ids[4] = row0 + vrows - 1;
  ids[5] = row0 + 4;
  ids[6] = row0 + 4;
  ids[7] = row0 + 4;
  auto local = [&](index_t r) { return ids[r] >= row0 && ids[r] < row0 + vrows; };
  for (Order ot : kOrders)
    for (Order oo : kOrders) {
      const std::string where = "orders " + std::to_string(int(ot)) + std::to_string(int(oo));
      const Mat<T> Tab = random_matrix<T>(vrows, h, gen);
      Block<T> table(vrows, h, ot, 2), out(n, h, oo, 3);
      table.fill(Tab);
      out.fill_value(std::numeric_limits<T>::quiet_NaN());  // never read without accumulate
      backend.gather_rows(ids.data(), row0, table.view(), false, out.view());
      const Mat<T> G = out.read();
      for (index_t r = 0; r < n; ++r)
        for (index_t c = 0; c < h; ++c)
          EXPECT_EQ(G(r, c), local(r) ? Tab(ids[r] - row0, c) : T(0))
              << where << " row " << r << " id " << ids[r];

      const Mat<T> O = random_matrix<T>(n, h, gen);
      out.fill(O);
      backend.gather_rows(ids.data(), row0, table.view(), true, out.view());
      const Mat<T> A = out.read();
      for (index_t r = 0; r < n; ++r)
        for (index_t c = 0; c < h; ++c)
          EXPECT_EQ(A(r, c), local(r) ? T(O(r, c) + Tab(ids[r] - row0, c)) : O(r, c))
              << where << " accumulate, row " << r << " id " << ids[r];

      // Scatter: repeated ids accumulate, ids outside the block are dropped.
      const Mat<T> Src = random_matrix<T>(n, h, gen);
      Block<T> src(n, h, oo, 1);
      src.fill(Src);
      backend.scatter_add_rows(ids.data(), row0, src.view(), table.view());
      const Mat<T> Got = table.read();
      Mat<Real> want = Tab.template cast<Real>();
      std::vector<int> hits(vrows, 0);
      for (index_t r = 0; r < n; ++r) {
        if (!local(r)) continue;
        ++hits[ids[r] - row0];
        for (index_t c = 0; c < h; ++c) want(ids[r] - row0, c) += Src(r, c);
      }
      for (index_t t = 0; t < vrows; ++t)
        for (index_t c = 0; c < h; ++c) {
          // Values are |x| <= 1 + hits: error at most hits roundings of that size.
          const double tol = (hits[t] + 1) * eps * (hits[t] + 1);
          EXPECT_LE(std::abs(double(Got(t, c) - want(t, c))), tol)
              << where << " scatter, table row " << t << " hits " << hits[t];
          if (hits[t] == 0) {
            EXPECT_EQ(Got(t, c), Tab(t, c)) << where << " untouched row " << t;
          }
        }
      EXPECT_EQ(hits[4], 3 + std::count(ids.begin() + 8, ids.end(), row0 + 4)) << where;
    }
}

TEST(CpuBackend, GatherScatterRowsMatchReferenceFloat) {
  check_embedding_rows<float>();
}
TEST(CpuBackend, GatherScatterRowsMatchReferenceDouble) {
  check_embedding_rows<double>();
}

// Kernels run inside a training step where malloc is interposed: none allocates.
TEST(CpuBackend, NewKernelsAllocateNothing) {
  if (!allocation_counting_available()) GTEST_SKIP() << "allocation counting is off under ASan";
  CpuBackend backend;
  std::mt19937_64 gen(fresh_seed());
  const index_t s = 64, h = 48;
  Block<float> a(s, s, Order::row_major, 3), b(s, s, Order::col_major, 1),
      c(s, s, Order::row_major, 0);
  a.fill(random_matrix<float>(s, s, gen));
  b.fill(random_matrix<float>(s, s, gen));
  std::vector<float> mx(s), sum(s), picked(s);
  std::vector<std::int32_t> ids(s);
  for (index_t i = 0; i < s; ++i) ids[i] = static_cast<std::int32_t>((i * 7) % (2 * h));
  Block<float> table(h, s, Order::col_major, 2);
  table.fill(random_matrix<float>(h, s, gen));
  std::uint64_t count = 0;
  std::string first;
  {
    CountAllocations counter;
    backend.gelu_forward(a.view(), c.view());
    backend.gelu_backward(a.view(), b.view(), c.view());
    backend.gelu_forward(c.view(), c.view());
    backend.softmax_causal(a.view(), 0.125, c.view());
    backend.softmax_causal(b.view(), 0.125, b.view());
    backend.softmax_causal_backward(b.view(), a.view(), 0.125, c.view());
    backend.softmax_causal_backward(b.view(), a.view(), 0.125, a.view());
    backend.row_max(c.view(), mx.data());
    backend.row_sum_exp(c.view(), mx.data(), sum.data());
    backend.pick_targets(c.view(), ids.data(), 10, picked.data());
    volatile double loss = backend.cross_entropy_sum(s, mx.data(), sum.data(), picked.data());
    (void)loss;
    backend.cross_entropy_grad(c.view(), mx.data(), sum.data(), ids.data(), 10, 0.5);
    backend.gather_rows(ids.data(), 5, table.view(), false, b.view());
    backend.gather_rows(ids.data(), 5, table.view(), true, b.view());
    backend.scatter_add_rows(ids.data(), 5, a.view(), table.view());
    count = counter.count();
    first = counter.first_caller();
  }
  EXPECT_EQ(count, 0u) << "first from " << first;
}

}  // namespace
}  // namespace summa::test

// The CPU backend (local-math seam) and arenas, on one rank, against Eigen.
// GEMM tolerance: max error / (k * eps * max|A| * max|B| * |alpha| + 2 eps |beta| max|C0|) < 1.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

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

}  // namespace
}  // namespace summa::test

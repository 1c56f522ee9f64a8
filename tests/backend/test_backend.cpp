// The CPU backend (local-math seam) and arenas, on one rank, against Eigen.
// GEMM tolerance: max error / (k * eps * max|A| * max|B| * |alpha| + 2 eps |beta| max|C0|) < 1,
// the error against a reference computed in double from the same inputs (a
// reference in T added its own rounding: float errors of 0.5-0.7 of the bound
// at 301x77x530 against a float Eigen product, 1.02 once under ASan; against
// double 0.26-0.36 for OpenBLAS and BLIS, 0.53-0.65 for Eigen, measured over
// 5 runs of every library).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "test_util.hpp"

namespace summa::test {
namespace {

template <class T>
Mat<T> apply(Op op, const Mat<T>& x) {
  return op == Op::N ? x : Mat<T>(x.transpose());
}

template <class T>
void gemm_sweep(const std::string& library = "", index_t m = 13, index_t n = 9, index_t k = 17) {
  SCOPED_TRACE("CPU GEMM library " + (library.empty() ? CpuBackend::default_gemm() : library));
  CpuBackend backend(CpuOptions{.gemm = library});
  std::mt19937_64 gen(fresh_seed());
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
            const Mat<double> want = double(alpha) *
                                         apply(ta, Mat<double>(A.template cast<double>())) *
                                         apply(tb, Mat<double>(B.template cast<double>())) +
                                     double(beta) * C0.template cast<double>();
            const double scale =
                k * eps * A.cwiseAbs().maxCoeff() * B.cwiseAbs().maxCoeff() * std::abs(alpha) +
                2 * eps * std::abs(beta) * C0.cwiseAbs().maxCoeff();
            const double err =
                (c.read().template cast<double>() - want).cwiseAbs().maxCoeff() / scale;
            EXPECT_LT(err, 1.0) << "ta=" << int(ta) << " tb=" << int(tb) << " orders " << int(oa)
                                << int(ob) << int(oc);
          }
}

// The device factory (backend/device.hpp): the cpu backends with MPI
// communicators, and every combination that cannot work refused with a
// message naming it (before any collective, so the same on every rank).
TEST(Device, FactoryMakesCpuBackendsAndRefusesBadCombinations) {
  Device cpu = make_device(MPI_COMM_WORLD, {.backend = "cpu"});
  ASSERT_NE(cpu.backend, nullptr);
  EXPECT_TRUE(cpu.backend->host_accessible());
  EXPECT_EQ(cpu.grid.comm, CommBackend::mpi);
  EXPECT_EQ(cpu.name, "cpu");
  Device emulated = make_device(MPI_COMM_WORLD, {.backend = "cpu_device"});
  EXPECT_FALSE(emulated.backend->host_accessible());
  // the program's own grid options come back with the device's communicators
  // (gpt_train's --watchdog was once replaced by the device's defaults here)
  GridOptions mine;
  mine.placement = Placement::bunched;
  mine.ranks_per_node = 3;
  mine.staging_bytes = 12345;
  mine.watchdog.timeout_s = 7.5;
  mine.watchdog.report_s = 0.25;
  for (const char* name : {"cpu", "cpu_device"}) {
    const Device d = make_device(MPI_COMM_WORLD, {.backend = name, .grid = mine});
    EXPECT_EQ(d.grid.placement, Placement::bunched) << name;
    EXPECT_EQ(d.grid.ranks_per_node, 3) << name;
    EXPECT_EQ(d.grid.staging_bytes, 12345u) << name;
    EXPECT_EQ(d.grid.watchdog.timeout_s, 7.5) << name;
    EXPECT_EQ(d.grid.watchdog.report_s, 0.25) << name;
    EXPECT_EQ(d.grid.comm, CommBackend::mpi) << name;
  }
  const auto message = [](DeviceOptions o) {
    try {
      make_device(MPI_COMM_WORLD, o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message({.backend = "tpu"}).find("'tpu'"), std::string::npos);
  EXPECT_NE(message({.backend = "cpu", .comm = "nccl"}).find("need the cuda backend"),
            std::string::npos);
  EXPECT_NE(message({.backend = "cpu", .comm = "carrier"}).find("'carrier'"), std::string::npos);
  EXPECT_NE(message({.backend = "cpu", .comm = "", .tf32 = true}).find("TF32"), std::string::npos);
  EXPECT_NE(message({.backend = "cuda", .comm = "mpi"}).find("cannot take device memory"),
            std::string::npos);
  if (!SUMMA_HAVE_CUDA) {
    EXPECT_NE(message({.backend = "cuda"}).find("built without CUDA"), std::string::npos);
    EXPECT_EQ(cuda_device_count(), 0);
  } else if (cuda_device_count() == 0) {
    // this binary does not link the CUDA component: make_device loads it on
    // first use and gets as far as the device check
    EXPECT_NE(message({.backend = "cuda"}).find("no CUDA device"), std::string::npos);
  }
}

TEST(CpuBackend, GemmAllTransposesAndOrdersFloat) {
  gemm_sweep<float>();
}
TEST(CpuBackend, GemmAllTransposesAndOrdersDouble) {
  gemm_sweep<double>();
}

// Every CPU GEMM library this machine loads (docs/design.md, "CPU GEMM"),
// every transpose and storage order, padded leading dimensions, sizes past
// the libraries' blocking (BLAS kernels switch code paths at their block
// sizes) and odd shapes, against Eigen in the working precision.
TEST(CpuBackend, GemmEveryLibraryAllTransposesAndOrders) {
  const std::vector<std::string> libraries = CpuBackend::gemm_libraries();
  ASSERT_EQ(libraries.front(), "eigen");
  for (const std::string& lib : libraries) {
    gemm_sweep<float>(lib);
    gemm_sweep<double>(lib);
    gemm_sweep<float>(lib, 301, 77, 530);
    gemm_sweep<double>(lib, 1, 257, 3);
  }
}

// The library comes from CpuOptions::gemm, else $SUMMA_CPU_GEMM (CTest runs
// this binary once per library with it set: backend_<library>), else the
// configured default; each reports itself, and bad choices are errors.
TEST(CpuBackend, GemmLibraryFollowsOptionsAndEnvironment) {
  const char* env = std::getenv("SUMMA_CPU_GEMM");
  const std::string expected = env != nullptr && *env != '\0' ? env : SUMMA_CPU_GEMM_DEFAULT;
  EXPECT_EQ(CpuBackend::default_gemm(), expected);
  const CpuBackend dflt;
  EXPECT_EQ(dflt.gemm_library(), expected);
  EXPECT_EQ(dflt.name(), "cpu-" + expected);
  EXPECT_FALSE(dflt.gemm_detail().empty());
  const std::string found = SUMMA_CPU_GEMM_FOUND;  // what the configure found loads here
  for (const std::string& lib : CpuBackend::gemm_libraries()) {
    const CpuBackend b(CpuOptions{.gemm = lib});
    EXPECT_EQ(b.gemm_library(), lib);
    EXPECT_EQ(b.name(), "cpu-" + lib);
    EXPECT_NE(found.find(lib), std::string::npos) << lib << " loads but was not configured";
  }
  for (std::size_t at = 0; at < found.size();) {
    const std::size_t end = std::min(found.find(';', at), found.size());
    const std::string lib = found.substr(at, end - at);
    const auto libs = CpuBackend::gemm_libraries();
    EXPECT_NE(std::find(libs.begin(), libs.end(), lib), libs.end())
        << lib << " was found at configure time but does not load";
    at = end + 1;
  }
  const auto error = [](CpuOptions o) {
    try {
      CpuBackend b(o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error({.gemm = "atlas"}).find("'atlas' is not one of"), std::string::npos);
  EXPECT_NE(error({.gemm = "eigen", .threads = 2}).find("one thread"), std::string::npos);
  EXPECT_NE(error({.gemm = "eigen", .threads = 0}).find("threads 0"), std::string::npos);
}

// Threads change how a BLAS splits the product, not what it computes.
TEST(CpuBackend, GemmWithSeveralThreadsMatches) {
  std::mt19937_64 gen(fresh_seed());
  const index_t m = 200, n = 300, k = 250;
  const Mat<double> A = random_matrix<double>(m, k, gen), B = random_matrix<double>(k, n, gen);
  const Mat<double> want = A * B;
  for (const std::string& lib : CpuBackend::gemm_libraries()) {
    if (lib == "eigen") continue;
    CpuBackend backend(CpuOptions{.gemm = lib, .threads = 2});
    Mat<double> C(m, n);
    backend.gemm(Op::N, Op::N, 1.0, MatrixView<const double>::dense(A.data(), m, k),
                 MatrixView<const double>::dense(B.data(), k, n), 0.0,
                 MatrixView<double>::dense(C.data(), m, n));
    EXPECT_LT((C - want).cwiseAbs().maxCoeff(), 1e-12 * k) << lib;
    CpuBackend one(CpuOptions{.gemm = lib, .threads = 1});  // back to one for the rest
  }
}

TEST(CpuBackend, GemmBlasSemanticsForZeros) {
  for (const std::string& lib : CpuBackend::gemm_libraries()) {
    SCOPED_TRACE(lib);
    CpuBackend backend(CpuOptions{.gemm = lib});
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
}

// Memory that runs out is a summa::OutOfMemory (a std::bad_alloc) naming the
// bytes asked for, not a bare std::bad_alloc (under ASan too:
// allocator_may_return_null=1, cmake/SummaMpiTest.cmake).
TEST(CpuBackend, OutOfMemoryNamesTheBytes) {
  summa::CpuBackend backend;
  const std::size_t huge = std::size_t{1} << 60;
  std::string message;
  try {
    void* p = backend.allocate(huge);
    backend.deallocate(p, huge);
  } catch (const summa::OutOfMemory& e) {
    message = e.what();
  }
  EXPECT_NE(message.find(std::to_string(huge) + " bytes of host memory"), std::string::npos)
      << message;
  EXPECT_THROW((void)backend.allocate(huge), std::bad_alloc);
}

// A BLAS packs into buffers of its own, allocated on its first call and
// reused after (docs/design.md, "CPU GEMM"): after one call of a shape, no
// call allocates, whichever library runs it.
TEST(CpuBackend, GemmWithScratchAllocatesNothing) {
  if (!allocation_counting_available()) GTEST_SKIP() << "allocation counting is off under ASan";
  for (const std::string& lib : CpuBackend::gemm_libraries()) {
    SCOPED_TRACE(lib);
    CpuBackend backend(CpuOptions{.gemm = lib});
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
      backend.gemm(Op::N, Op::T, 1.0f, MatrixView<float>::dense(A.data(), m, k),
                   MatrixView<float>::dense(B.data(), n, k), 0.0f,
                   MatrixView<float>::dense(C.data(), m, n), {scratch.data(), scratch.size()});
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

// ---- gemm_strided_batched: against a loop of gemm() on the same backend.
// CpuBackend's batched op is documented as that loop (same products, same
// order, same scratch), so the whole operand buffer, gaps included, must be
// bit identical (memcmp); gemm() itself is checked against Eigen above.

// A strided batch of `batch` rows x cols views in one buffer of random
// values: ld = minimum + pad, consecutive views `stride` elements apart.
template <class T>
struct Strided {
  std::vector<T> buf;
  index_t rows, cols, ld, stride;
  Order order;
  Strided(index_t r, index_t c, Order o, index_t pad, index_t stride_, index_t batch,
          std::mt19937_64& gen)
      : rows(r), cols(c), ld((o == Order::col_major ? r : c) + pad), stride(stride_), order(o) {
    const index_t outer = o == Order::col_major ? c : r;
    const index_t span = std::max<index_t>(outer, 1) * ld;
    buf.resize(static_cast<std::size_t>(span + std::max<index_t>(batch - 1, 0) * stride + 1));
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    for (T& x : buf) x = T(u(gen));
  }
  index_t span() const { return (order == Order::col_major ? cols : rows) * ld; }
  MatrixView<T> view() { return MatrixView<T>(buf.data(), rows, cols, ld, order); }
};

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <class T>
void batched_sweep() {
  CpuBackend backend;
  const std::uint64_t seed = fresh_seed();
  std::mt19937_64 gen(seed);
  using S = acc_t<T>;
  const index_t m = 7, n = 5, k = 6;
  const Order orders[] = {Order::col_major, Order::row_major};
  int runs = 0;
  for (index_t batch : {index_t(0), index_t(1), index_t(3)})
    for (Op ta : {Op::N, Op::T})
      for (Op tb : {Op::N, Op::T})
        for (Order oa : orders)
          for (Order ob : orders)
            for (Order oc : orders)
              for (int layout = 0; layout < 2; ++layout) {
                // layout 0: dense views one after another; layout 1: padded
                // ld, A and C side by side within ld (stride = inner extent
                // + 1), B shared by every product (stride 0).
                const index_t ar = ta == Op::N ? m : k, ac = ta == Op::N ? k : m;
                const index_t br = tb == Op::N ? k : n, bc = tb == Op::N ? n : k;
                const index_t a_in = oa == Order::col_major ? ar : ac;
                const index_t c_in = oc == Order::col_major ? m : n;
                const index_t pad_a = layout == 0 ? 0 : 3 * (a_in + 1);
                const index_t pad_c = layout == 0 ? 0 : 3 * (c_in + 1);
                const index_t sa = layout == 0 ? ar * ac + 2 : a_in + 1;
                const index_t sb = layout == 0 ? br * bc : 0;
                const index_t sc = layout == 0 ? m * n + 1 : c_in + 1;
                Strided<T> A(ar, ac, oa, pad_a, sa, batch, gen);
                Strided<T> B(br, bc, ob, layout == 0 ? 0 : 2, sb, batch, gen);
                Strided<T> C(m, n, oc, pad_c, sc, batch, gen);
                Strided<T> want = C;
                const std::string where =
                    "batch " + std::to_string(batch) + " ops " + std::to_string(int(ta)) +
                    std::to_string(int(tb)) + " orders " + std::to_string(int(oa)) +
                    std::to_string(int(ob)) + std::to_string(int(oc)) + " layout " +
                    std::to_string(layout) + ", " + seed_note(seed);
                for (S beta : {S(-1.5), S(0)}) {
                  const S alpha = S(0.75);
                  std::vector<char> scratch(backend.gemm_scratch_bytes(m, n, k, dtype_v<T>));
                  const Scratch s{scratch.data(), scratch.size()};
                  for (index_t b = 0; b < batch; ++b)
                    backend.gemm(ta, tb, alpha,
                                 MatrixView<const T>(A.buf.data() + b * sa, ar, ac, A.ld, oa),
                                 MatrixView<const T>(B.buf.data() + b * sb, br, bc, B.ld, ob), beta,
                                 MatrixView<T>(want.buf.data() + b * sc, m, n, C.ld, oc), s);
                  backend.gemm_strided_batched(ta, tb, alpha, A.view(), sa, B.view(), sb, beta,
                                               C.view(), sc, batch, s);
                  EXPECT_TRUE(same_bits(C.buf, want.buf)) << where << " beta " << double(beta);
                  ++runs;
                }
                // Independent spot check: the last product against plain loops.
                if (batch == 3 && layout == 1) {
                  const index_t b = 2;
                  MatrixView<const T> Ab(A.buf.data() + b * sa, ar, ac, A.ld, oa);
                  MatrixView<const T> Bb(B.buf.data() + b * sb, br, bc, B.ld, ob);
                  MatrixView<T> Cb(C.buf.data() + b * sc, m, n, C.ld, oc);
                  backend.gemm_strided_batched(ta, tb, S(1), Ab, 0, Bb, 0, S(0), Cb, 0, 1);
                  // |a|, |b| <= 1 so |C| <= k: accumulation error <= k * k * eps(acc),
                  // plus bf16's one rounding of C (half an ulp, 2^-9 relative).
                  const double acc_eps = std::is_same_v<T, double> ? 2.3e-16 : 1.2e-7;
                  const double tol = double(k * k) * acc_eps +
                                     (std::is_same_v<T, bf16> ? double(k) * 0x1p-9 : 0.0);
                  for (index_t i = 0; i < m; ++i)
                    for (index_t j = 0; j < n; ++j) {
                      double ref = 0;
                      for (index_t l = 0; l < k; ++l)
                        ref += double(ta == Op::N ? Ab(i, l) : Ab(l, i)) *
                               double(tb == Op::N ? Bb(l, j) : Bb(j, l));
                      EXPECT_NEAR(double(Cb(i, j)), ref, tol)
                          << where << " element " << i << "," << j;
                    }
                }
              }
  EXPECT_EQ(runs, 3 * 64 * 2);
}

TEST(CpuBackend, GemmStridedBatchedMatchesGemmLoopFloat) {
  batched_sweep<float>();
}
TEST(CpuBackend, GemmStridedBatchedMatchesGemmLoopDouble) {
  batched_sweep<double>();
}
TEST(CpuBackend, GemmStridedBatchedMatchesGemmLoopBf16) {
  batched_sweep<bf16>();
}

template <class T>
void batched_errors() {
  CpuBackend backend;
  using S = acc_t<T>;
  std::vector<T> a(64, T(1)), b(64, T(1)), c(64, T(7));
  const std::vector<T> c0 = c;
  auto V = [](std::vector<T>& x, index_t r, index_t cc) {
    return MatrixView<T>::dense(x.data(), r, cc, Order::row_major);
  };
  auto message = [&](index_t sa, index_t sb, index_t sc, index_t batch, index_t ak = 3) {
    try {
      backend.gemm_strided_batched(Op::N, Op::N, S(1), V(a, 2, ak), sa, V(b, 3, 2), sb, S(0),
                                   V(c, 2, 2), sc, batch);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto has = [](const std::string& text, const char* part) {
    return text.find(part) != std::string::npos;
  };
  std::string e = message(6, 6, 4, -2);
  EXPECT_TRUE(has(e, "negative batch -2")) << e;
  e = message(-1, 6, 4, 2);
  EXPECT_TRUE(has(e, "stride_a -1")) << e;
  e = message(6, -6, 4, 2);
  EXPECT_TRUE(has(e, "stride_b -6")) << e;
  e = message(6, 6, -4, 2);
  EXPECT_TRUE(has(e, "stride_c -4")) << e;
  e = message(6, 6, 4, 3, 4);  // A 2x4 with B 3x2
  EXPECT_TRUE(has(e, "gemm: A is 2x4 and B is 3x2")) << e;
  e = message(6, 6, 2, 3);  // C blocks 2x2 (span 4) two elements apart, ld 2: overlap
  EXPECT_TRUE(has(e, "stride_c 2")) << e;
  EXPECT_TRUE(has(e, "overlap")) << e;
  EXPECT_EQ(message(6, 6, 2, 1), "no error");  // one product: any stride_c
  c = c0;
  EXPECT_EQ(message(6, 6, 4, 0), "no error");  // batch 0: nothing written
  EXPECT_TRUE(same_bits(c, c0));
  // Every error is raised before anything is computed: C untouched.
  message(6, 6, 2, 3);
  EXPECT_TRUE(same_bits(c, c0));
  // Bad layouts are caught like gemm's.
  EXPECT_THROW(backend.gemm_strided_batched(Op::N, Op::N, S(1), MatrixView<T>(a.data(), 2, 3, 1), 6,
                                            V(b, 3, 2), 6, S(0), V(c, 2, 2), 4, 2),
               Error);
}

TEST(CpuBackend, GemmStridedBatchedBadArgumentsThrow) {
  batched_errors<float>();
  batched_errors<double>();
  batched_errors<bf16>();
}

TEST(CpuBackend, GemmStridedBatchedWithScratchAllocatesNothing) {
  if (!allocation_counting_available()) GTEST_SKIP() << "allocation counting is off under ASan";
  CpuBackend backend;
  std::mt19937_64 gen(fresh_seed());
  const index_t m = 64, n = 64, k = 32, batch = 4;  // attention-like: s x s from s x d
  Strided<float> A(m, k, Order::row_major, 0, m * k, batch, gen);
  Strided<float> B(n, k, Order::row_major, 0, n * k, batch, gen);
  Strided<float> C(m, n, Order::row_major, 0, m * n, batch, gen);
  Strided<bf16> Ah(m, k, Order::row_major, 0, m * k, batch, gen);
  Strided<bf16> Bh(n, k, Order::row_major, 0, n * k, batch, gen);
  Strided<bf16> Ch(m, n, Order::row_major, 0, m * n, batch, gen);
  std::vector<char> s32(backend.gemm_scratch_bytes(m, n, k, DType::f32));
  std::vector<char> s16(backend.gemm_scratch_bytes(m, n, k, DType::bf16));
  std::uint64_t count = 0;
  std::string first;
  {
    CountAllocations counter;
    backend.gemm_strided_batched(Op::N, Op::T, 1.0f, A.view(), m * k, B.view(), n * k, 0.0f,
                                 C.view(), m * n, batch, {s32.data(), s32.size()});
    backend.gemm_strided_batched(Op::N, Op::T, 1.0f, Ah.view(), m * k, Bh.view(), n * k, 0.5f,
                                 Ch.view(), m * n, batch, {s16.data(), s16.size()});
    count = counter.count();
    first = counter.first_caller();
  }
  EXPECT_EQ(count, 0u) << "first from " << first;
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

// The last column row r of a causal softmax sees: r, shifted right by
// cols - rows when there are fewer rows than columns (bottom-right window).
index_t causal_last(index_t r, index_t rows, index_t cols) {
  return r + (cols > rows ? cols - rows : 0);
}

// P of the causal softmax of scale * S in long double (zeros outside the
// window).
template <class T>
Mat<Real> ref_softmax_causal(const Mat<T>& S, double scale) {
  Mat<Real> P = Mat<Real>::Zero(S.rows(), S.cols());
  for (index_t r = 0; r < S.rows(); ++r) {
    const index_t last = causal_last(r, S.rows(), S.cols());
    Real m = -std::numeric_limits<Real>::infinity();
    for (index_t c = 0; c <= last && c < S.cols(); ++c) m = std::max(m, Real(scale) * S(r, c));
    Real sum = 0;
    for (index_t c = 0; c <= last && c < S.cols(); ++c) sum += std::exp(Real(scale) * S(r, c) - m);
    for (index_t c = 0; c <= last && c < S.cols(); ++c)
      P(r, c) = std::exp(Real(scale) * S(r, c) - m) / sum;
  }
  return P;
}

template <class T>
void check_softmax_causal() {
  CpuBackend backend;
  std::mt19937_64 gen(fresh_seed());
  const double eps = eps_of<T>();
  // square, and fewer rows than columns (a decoding step's queries)
  for (const auto& [s, n] : {std::pair<index_t, index_t>{1, 1}, {13, 13}, {1, 9}, {4, 11}})
    for (double scale : {0.35, -1.75})
      for (double offset : {0.0, 3000.0})
        for (Order os : kOrders)
          for (Order op : kOrders)
            for (bool in_place : {false, true}) {
              if (in_place && os != op) continue;
              const std::string where = "s=" + std::to_string(s) + "x" + std::to_string(n) +
                                        " scale=" + std::to_string(scale) +
                                        " offset=" + std::to_string(offset) + " orders " +
                                        std::to_string(int(os)) + std::to_string(int(op)) +
                                        (in_place ? " in place" : "");
              const Mat<T> S =
                  (scaled(random_matrix<T>(s, n, gen), 3.0).array() + T(offset)).matrix();
              Block<T> sb(s, n, os, 2), pb(s, n, op, 3);
              sb.fill(S);  // in place: random values above the diagonal must become 0
              pb.fill_value(std::numeric_limits<T>::quiet_NaN());  // never read
              Block<T>& out = in_place ? sb : pb;
              backend.softmax_causal(sb.view(), scale, out.view());
              const Mat<T> P = out.read();
              const Mat<Real> want = ref_softmax_causal(S, scale);
              const double tol = double(n + 4) * eps;
              const double tol_p =
                  tol + 4 * std::abs(scale) * (offset + 3) * std::numeric_limits<double>::epsilon();
              double worst = 0;
              for (index_t r = 0; r < s; ++r) {
                Real row_sum = 0;
                for (index_t c = 0; c < n; ++c) {
                  if (c > causal_last(r, s, n)) {
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
              Mat<T> Pt(s, n);
              for (index_t r = 0; r < s; ++r)
                for (index_t c = 0; c < n; ++c) Pt(r, c) = static_cast<T>(want(r, c));
              const Mat<T> dP = random_matrix<T>(s, n, gen);
              Block<T> pin(s, n, os, 1), dpb(s, n, op, 2), dsb(s, n, os, 3);
              pin.fill(Pt);
              dpb.fill(dP);
              dsb.fill_value(std::numeric_limits<T>::quiet_NaN());  // never read
              Block<T>& dsout = in_place ? dpb : dsb;
              backend.softmax_causal_backward(pin.view(), dpb.view(), scale, dsout.view());
              const Mat<T> dS = dsout.read();
              double worst_ds = 0;
              for (index_t r = 0; r < s; ++r) {
                Real dot = 0;
                for (index_t c = 0; c < n; ++c) dot += Real(dP(r, c)) * Pt(r, c);
                for (index_t c = 0; c < n; ++c) {
                  if (c > causal_last(r, s, n)) {
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

// ---- bf16 (mixed precision) -------------------------------------------------
// Every bf16 op of CpuBackend against the float op of CpuBackend on the same
// inputs (random values rounded to bf16, so both ops see identical numbers).
// Tolerance of a bf16 output x (rounded once, to nearest even, from its fp32
// value): |x - ref| <= 2^-8 |ref| + slack, where 2^-8 |ref| bounds half a unit
// in the last of bf16's 8 significant bits and slack covers the fp32 values
// of the two ops differing by summation order: k terms of magnitude M differ
// by at most about 2 k 2^-24 M, so slack = k 2^-22 M. fp32 outputs (per-row
// statistics) get the slack only; ops that copy (row_max, pick_targets,
// gather, copy, convert) are exact.

constexpr double kBf16Rel = 1.0 / 256;      // 2^-8
constexpr double kF32Eps = 1.0 / 16777216;  // 2^-24

float round_bf16(double x) {
  return static_cast<float>(bf16(x));
}

// The same matrix as float and as bf16 blocks of one geometry.
struct Twin {
  Block<float> f;
  Block<bf16> b;
  Mat<float> value;
  Twin(index_t rows, index_t cols, Order o, index_t pad, std::mt19937_64& gen, double scale = 1.0)
      : f(rows, cols, o, pad), b(rows, cols, o, pad) {
    value = random_matrix<float>(rows, cols, gen);
    for (index_t j = 0; j < cols; ++j)
      for (index_t i = 0; i < rows; ++i) value(i, j) = round_bf16(value(i, j) * scale);
    reset();
  }
  void reset() {
    f.fill(value);
    const auto v = b.view();
    for (index_t j = 0; j < v.cols; ++j)
      for (index_t i = 0; i < v.rows; ++i) v(i, j) = bf16(value(i, j));
  }
  void fill_nan() {
    f.fill_value(std::numeric_limits<float>::quiet_NaN());
    b.fill_value(bf16(std::numeric_limits<float>::quiet_NaN()));
  }
  MatrixView<float> fv() { return f.view(); }
  MatrixView<bf16> bv() { return b.view(); }
};

// Rounded bf16 vector and its float copy.
struct TwinVec {
  std::vector<float> f;
  std::vector<bf16> b;
  TwinVec(index_t n, std::mt19937_64& gen, double lo = -1, double hi = 1) {
    std::uniform_real_distribution<double> dist(lo, hi);
    for (index_t i = 0; i < n; ++i) {
      f.push_back(round_bf16(dist(gen)));
      b.push_back(bf16(f.back()));
    }
  }
};

void expect_bf16_near(MatrixView<bf16> got, MatrixView<float> ref, double slack,
                      const std::string& where) {
  ASSERT_EQ(got.rows, ref.rows);
  ASSERT_EQ(got.cols, ref.cols);
  double worst = 0;
  index_t wr = 0, wc = 0;
  for (index_t j = 0; j < got.cols; ++j)
    for (index_t i = 0; i < got.rows; ++i) {
      const double r = ref(i, j), g = static_cast<float>(got(i, j));
      const double diff = std::abs(g - r);  // NaN when either is NaN
      const double excess = diff == 0 ? 0.0 : diff / (kBf16Rel * std::abs(r) + slack);
      if (!(excess <= worst)) {  // NaN counts as a failure
        worst = std::isnan(excess) ? std::numeric_limits<double>::infinity() : excess;
        wr = i;
        wc = j;
      }
    }
  EXPECT_LE(worst, 1.0) << where << ": worst at (" << wr << ", " << wc << "): bf16 "
                        << static_cast<float>(got(wr, wc)) << " vs float " << ref(wr, wc);
}

void expect_bf16_near(const std::vector<bf16>& got, const std::vector<float>& ref, double slack,
                      const std::string& where) {
  expect_bf16_near(
      MatrixView<bf16>::dense(const_cast<bf16*>(got.data()), 1, static_cast<index_t>(got.size())),
      MatrixView<float>::dense(const_cast<float*>(ref.data()), 1, static_cast<index_t>(ref.size())),
      slack, where);
}

void expect_f32_near(const std::vector<float>& got, const std::vector<float>& ref, double slack,
                     const std::string& where) {
  ASSERT_EQ(got.size(), ref.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    EXPECT_LE(std::abs(double(got[i]) - double(ref[i])), slack) << where << " element " << i;
}

TEST(Bf16, RoundTripAndRounding) {
  // Every bf16 bit pattern survives bf16 -> float -> bf16 (NaNs stay NaN).
  for (std::uint32_t u = 0; u < 65536; ++u) {
    const bf16 x = bf16::from_bits(static_cast<std::uint16_t>(u));
    const float f = static_cast<float>(x);
    const bf16 y(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(static_cast<float>(y))) << u;
      EXPECT_EQ(y.bits & 0x8000u, x.bits & 0x8000u) << "NaN sign, bits " << u;
    } else {
      EXPECT_EQ(y.bits, x.bits) << u;
    }
  }
  // Round to nearest even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7.
  EXPECT_EQ(static_cast<float>(bf16(1.0f + 0x1p-8f)), 1.0f);
  EXPECT_EQ(static_cast<float>(bf16(1.0f + 3 * 0x1p-8f)), 1.0f + 0x1p-6f);
  EXPECT_EQ(static_cast<float>(bf16(1.0f + 0x1p-8f + 0x1p-20f)), 1.0f + 0x1p-7f);
  EXPECT_EQ(static_cast<float>(bf16(-1.0f - 0x1p-8f)), -1.0f);
  EXPECT_EQ(bf16(-0.0f).bits, 0x8000u);
  EXPECT_EQ(bf16(0.0f), bf16(-0.0f));
  EXPECT_EQ(static_cast<float>(bf16(std::numeric_limits<float>::infinity())),
            std::numeric_limits<float>::infinity());
  EXPECT_EQ(static_cast<float>(bf16(std::numeric_limits<float>::max())),
            std::numeric_limits<float>::infinity());              // beyond bf16's max + half an ulp
  EXPECT_EQ(static_cast<float>(bf16(0x1.fep127f)), 0x1.fep127f);  // bf16's largest finite
  EXPECT_EQ(static_cast<float>(bf16(std::numeric_limits<float>::denorm_min())), 0.0f);
  // Signalling NaN in, quiet NaN out.
  const bf16 q(std::numeric_limits<float>::signaling_NaN());
  EXPECT_TRUE(std::isnan(static_cast<float>(q)));
  EXPECT_NE(q.bits & 0x0040u, 0u);
  // Templated layer code: T(0), T(1), static_cast<T>(double).
  EXPECT_EQ(bf16(0).bits, 0u);
  EXPECT_EQ(static_cast<float>(bf16(1)), 1.0f);
  EXPECT_EQ(static_cast<double>(bf16(0.5)), 0.5);
  static_assert(std::is_same_v<acc_t<bf16>, float> && std::is_same_v<acc_t<float>, float> &&
                std::is_same_v<acc_t<double>, double>);
  static_assert(dtype_v<bf16> == DType::bf16 && size_of(DType::bf16) == 2);
  EXPECT_EQ(name_of(DType::bf16), "bf16");

  // Random floats: the result is the nearer of the two bf16 neighbours (the
  // even one on a tie), checked in double.
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> mant(-2.0, 2.0);
  std::uniform_int_distribution<int> expo(-130, 127);
  for (int i = 0; i < 20000; ++i) {
    const float x = static_cast<float>(std::ldexp(mant(gen), expo(gen)));
    if (!std::isfinite(x) || std::abs(x) > 0x1.fep127f) continue;
    std::uint32_t u;
    std::memcpy(&u, &x, 4);
    const bf16 lo = bf16::from_bits(static_cast<std::uint16_t>(u >> 16));
    const bf16 hi = bf16::from_bits(static_cast<std::uint16_t>((u >> 16) + 1));
    const double dl = std::abs(double(x) - double(static_cast<float>(lo)));
    const double dh = std::abs(double(static_cast<float>(hi)) - double(x));
    const bf16 want = dl < dh ? lo : dh < dl ? hi : ((lo.bits & 1u) == 0 ? lo : hi);
    EXPECT_EQ(bf16(x).bits, want.bits) << "x = " << x;
  }
}

TEST(CpuBackend, Bf16GemmMatchesFloatGemm) {
  CpuBackend backend;
  std::mt19937_64 gen(fresh_seed());
  // k = 300 > the 256-deep fp32 panels: the accumulation crosses panels.
  for (index_t k : {index_t(17), index_t(300)}) {
    const index_t m = 13, n = 9;
    for (Op ta : {Op::N, Op::T})
      for (Op tb : {Op::N, Op::T})
        for (Order oa : kOrders)
          for (Order ob : kOrders)
            for (Order oc : kOrders) {
              const std::string where =
                  "k=" + std::to_string(k) + " ta=" + std::to_string(int(ta)) +
                  " tb=" + std::to_string(int(tb)) + " orders " + std::to_string(int(oa)) +
                  std::to_string(int(ob)) + std::to_string(int(oc));
              Twin a(ta == Op::N ? m : k, ta == Op::N ? k : m, oa, 2, gen);
              Twin b(tb == Op::N ? k : n, tb == Op::N ? n : k, ob, 1, gen);
              Twin c(m, n, oc, 3, gen);
              for (float beta : {-1.5f, 0.0f}) {
                c.reset();
                if (beta == 0.0f) c.fill_nan();  // beta = 0 never reads C
                const float alpha = 0.75f;
                std::vector<char> s32(backend.gemm_scratch_bytes(m, n, k, DType::f32));
                std::vector<char> s16(backend.gemm_scratch_bytes(m, n, k, DType::bf16));
                backend.gemm(ta, tb, alpha, a.fv(), b.fv(), beta, c.fv(), {s32.data(), s32.size()});
                backend.gemm(ta, tb, alpha, a.bv(), b.bv(), beta, c.bv(), {s16.data(), s16.size()});
                const double slack = double(k) * 4 * kF32Eps * std::abs(alpha) + 4 * kF32Eps * 1.5;
                expect_bf16_near(c.bv(), c.fv(), slack, where + " beta " + std::to_string(beta));
              }
            }
  }
}

TEST(CpuBackend, Bf16GemmBlasSemanticsAndNoAllocation) {
  CpuBackend backend;
  std::mt19937_64 gen(fresh_seed());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Twin a(6, 4, Order::col_major, 0, gen), c(6, 5, Order::row_major, 1, gen);
  Block<bf16> an(6, 4, Order::col_major, 0), bn(4, 5, Order::col_major, 0);
  an.fill_value(bf16(nan));
  bn.fill_value(bf16(nan));
  backend.gemm(Op::N, Op::N, 0.0f, an.view(), bn.view(), 2.0f, c.bv());  // alpha = 0: no A, B
  backend.scale(2.0f, c.fv());
  expect_bf16_near(c.bv(), c.fv(), 0, "alpha = 0");
  c.reset();
  backend.gemm(Op::N, Op::N, 1.0f, MatrixView<bf16>(an.view().data, 6, 0, 6),
               MatrixView<bf16>(bn.view().data, 0, 5, 1), -1.0f, c.bv());  // k = 0
  backend.scale(-1.0f, c.fv());
  expect_bf16_near(c.bv(), c.fv(), 0, "k = 0");
  // Shape errors name the operands, as for float.
  EXPECT_THROW(backend.gemm(Op::N, Op::N, 1.0f, a.bv(), an.view(), 0.0f, c.bv()), Error);

  if (!allocation_counting_available()) GTEST_SKIP() << "allocation counting is off under ASan";
  // k = 600 and 257: full 256-deep panels and a short last one (Eigen's
  // blocking differs with the depth; both must fit the scratch).
  for (auto [m, n, k] :
       {std::tuple<index_t, index_t, index_t>{300, 280, 600}, {512, 384, 257}, {1, 500, 70}}) {
    Twin A(m, k, Order::row_major, 0, gen), B(n, k, Order::col_major, 0, gen),
        C(m, n, Order::row_major, 0, gen);
    std::vector<char> scratch(backend.gemm_scratch_bytes(m, n, k, DType::bf16));
    std::uint64_t count = 0;
    std::string first;
    {
      CountAllocations counter;
      backend.gemm(Op::N, Op::T, 1.0f, A.bv(), B.bv(), 0.5f, C.bv(),
                   {scratch.data(), scratch.size()});
      count = counter.count();
      first = counter.first_caller();
    }
    EXPECT_EQ(count, 0u) << m << "x" << n << "x" << k << ", first from " << first;
    backend.gemm(Op::N, Op::T, 1.0f, A.fv(), B.fv(), 0.5f, C.fv());
    expect_bf16_near(C.bv(), C.fv(), double(k) * 4 * kF32Eps + kF32Eps, "no-allocation gemm");
  }
}

TEST(CpuBackend, Bf16CopyConvertAxpbyScaleBiasColumnSums) {
  CpuBackend backend;
  std::mt19937_64 gen(fresh_seed());
  const index_t r = 7, c = 5;
  for (Order ox : kOrders)
    for (Order oy : kOrders) {
      const std::string where = "orders " + std::to_string(int(ox)) + std::to_string(int(oy));
      Twin x(r, c, ox, 2, gen), y(r, c, oy, 1, gen);
      backend.copy(x.bv(), y.bv());
      expect_bf16_near(y.bv(), x.fv(), 0, where + " copy");
      // convert: float -> bf16 rounds each element once; bf16 -> float is exact.
      Block<float> wide(r, c, oy, 3), full(r, c, ox, 0);
      const Mat<float> F = random_matrix<float>(r, c, gen);
      full.fill(F);
      backend.convert(full.view(), y.bv());
      for (index_t j = 0; j < c; ++j)
        for (index_t i = 0; i < r; ++i)
          EXPECT_EQ(y.bv()(i, j).bits, bf16(F(i, j)).bits) << where << " convert";
      backend.convert(ConstMatrixView<bf16>(y.bv()), wide.view());
      for (index_t j = 0; j < c; ++j)
        for (index_t i = 0; i < r; ++i)
          EXPECT_EQ(wide.view()(i, j), static_cast<float>(y.bv()(i, j))) << where << " widen";

      y.reset();
      backend.axpby(2.0f, x.fv(), -0.5f, y.fv());
      backend.axpby(2.0f, x.bv(), -0.5f, y.bv());
      expect_bf16_near(y.bv(), y.fv(), 0, where + " axpby");
      y.fill_nan();
      backend.axpby(3.0f, x.fv(), 0.0f, y.fv());
      backend.axpby(3.0f, x.bv(), 0.0f, y.bv());  // beta = 0 never reads C
      expect_bf16_near(y.bv(), y.fv(), 0, where + " axpby beta 0");
      y.reset();
      backend.scale(-0.3f, y.fv());
      backend.scale(-0.3f, y.bv());
      expect_bf16_near(y.bv(), y.fv(), 0, where + " scale");
      y.fill_nan();
      backend.scale(0.0f, y.bv());
      for (index_t j = 0; j < c; ++j)
        for (index_t i = 0; i < r; ++i)
          EXPECT_EQ(static_cast<float>(y.bv()(i, j)), 0.0f) << where << " scale 0";

      TwinVec bias(c, gen);
      y.reset();
      backend.add_bias(y.fv(), bias.f.data());
      backend.add_bias(y.bv(), bias.b.data());
      expect_bf16_near(y.bv(), y.fv(), 0, where + " add_bias");
      TwinVec sums(c, gen);
      backend.column_sums(x.fv(), 0.5f, sums.f.data());
      backend.column_sums(x.bv(), 0.5f, sums.b.data());
      expect_bf16_near(sums.b, sums.f, double(r + 1) * 4 * kF32Eps, where + " column_sums");
      std::fill(sums.b.begin(), sums.b.end(), bf16(std::numeric_limits<float>::quiet_NaN()));
      backend.column_sums(x.fv(), 0.0f, sums.f.data());
      backend.column_sums(x.bv(), 0.0f, sums.b.data());  // beta = 0 never reads out
      expect_bf16_near(sums.b, sums.f, double(r + 1) * 4 * kF32Eps, where + " column_sums 0");
    }
  EXPECT_THROW(backend.copy(MatrixView<bf16>(nullptr, 0, 2, 1), MatrixView<bf16>(nullptr, 0, 3, 1)),
               Error);
}

TEST(CpuBackend, Bf16LayerNormKernelsMatchFloat) {
  CpuBackend backend;
  std::mt19937_64 gen(fresh_seed());
  const index_t n = 6, h = 40;
  for (Order o : kOrders) {
    const std::string where = "order " + std::to_string(int(o));
    Twin x(n, h, o, 2, gen, 3.0), dy(n, h, o == Order::col_major ? Order::row_major : o, 1, gen);
    TwinVec gamma(h, gen, 0.5, 1.5), beta(h, gen);
    const double slack = double(h) * 4 * kF32Eps * 16;  // |x| <= 3, squares <= 9 (+ margin)
    std::vector<float> sums_f(n), sums_b(n), sq_f(n), sq_b(n), mean(n), rstd(n);
    backend.layernorm_partial_sums(x.fv(), nullptr, sums_f.data());
    backend.layernorm_partial_sums(x.bv(), nullptr, sums_b.data());
    expect_f32_near(sums_b, sums_f, slack, where + " sums");
    backend.layernorm_mean(n, h, sums_f.data(), mean.data());
    backend.layernorm_partial_sums(x.fv(), mean.data(), sq_f.data());
    backend.layernorm_partial_sums(x.bv(), mean.data(), sq_b.data());
    expect_f32_near(sq_b, sq_f, slack * 8, where + " squares");
    backend.layernorm_rstd(n, h, 1e-5, sq_f.data(), rstd.data());

    Twin y(n, h, o, 0, gen);
    y.fill_nan();
    backend.layernorm_apply(x.fv(), mean.data(), rstd.data(), gamma.f.data(), beta.f.data(),
                            y.fv());
    backend.layernorm_apply(x.bv(), mean.data(), rstd.data(), gamma.b.data(), beta.b.data(),
                            y.bv());
    expect_bf16_near(y.bv(), y.fv(), 16 * kF32Eps * 8, where + " apply");

    std::vector<float> a_f(n), b_f(n), a_b(n), b_b(n);
    backend.layernorm_backward_partials(x.fv(), dy.fv(), mean.data(), rstd.data(), gamma.f.data(),
                                        a_f.data(), b_f.data());
    backend.layernorm_backward_partials(x.bv(), dy.bv(), mean.data(), rstd.data(), gamma.b.data(),
                                        a_b.data(), b_b.data());
    expect_f32_near(a_b, a_f, slack, where + " partial a");
    expect_f32_near(b_b, b_f, slack * 4, where + " partial b");

    Twin dx(n, h, o, 1, gen);
    dx.fill_nan();
    backend.layernorm_backward_apply(x.fv(), dy.fv(), mean.data(), rstd.data(), gamma.f.data(),
                                     a_f.data(), b_f.data(), h, dx.fv());
    backend.layernorm_backward_apply(x.bv(), dy.bv(), mean.data(), rstd.data(), gamma.b.data(),
                                     a_f.data(), b_f.data(), h, dx.bv());
    // dX = rstd/h (h g - a - xhat b): cancellation between O(h) terms.
    expect_bf16_near(dx.bv(), dx.fv(), 64 * kF32Eps * double(h) * 4, where + " backward apply");

    TwinVec dg(h, gen), db(h, gen);
    std::fill(dg.b.begin(), dg.b.end(), bf16(std::numeric_limits<float>::quiet_NaN()));
    backend.layernorm_param_partials(x.fv(), dy.fv(), mean.data(), rstd.data(), dg.f.data(),
                                     db.f.data());
    backend.layernorm_param_partials(x.bv(), dy.bv(), mean.data(), rstd.data(), dg.b.data(),
                                     db.b.data());
    expect_bf16_near(dg.b, dg.f, double(n) * 4 * kF32Eps * 8, where + " dgamma");
    expect_bf16_near(db.b, db.f, double(n) * 4 * kF32Eps, where + " dbeta");
  }
}

// GeLU where tanh saturates, up to the largest finite values: the output is x
// or 0 and the derivative 1 or 0, never NaN (x * (1 + 3a x^2) overflows past
// |x| ~ 1.8e19 in float); NaN stays NaN.
template <class T>
void check_gelu_extremes() {
  CpuBackend backend;
  const T big = std::numeric_limits<T>::max();
  std::vector<T> x = {T(12), T(-12), T(1e20), T(-1e20), big, -big, T(50), T(-50)};
  const auto n = static_cast<index_t>(x.size());
  std::vector<T> y(x.size()), dy(x.size(), T(2)), dx(x.size());
  const auto X = ConstMatrixView<T>::dense(x.data(), 1, n, Order::row_major);
  backend.gelu_forward(X, MatrixView<T>::dense(y.data(), 1, n, Order::row_major));
  backend.gelu_backward(X, ConstMatrixView<T>::dense(dy.data(), 1, n, Order::row_major),
                        MatrixView<T>::dense(dx.data(), 1, n, Order::row_major));
  for (std::size_t i = 0; i < x.size(); ++i) {
    const bool positive = x[i] > 0;
    EXPECT_EQ(y[i], positive ? x[i] : T(0)) << "gelu(" << x[i] << ")";
    EXPECT_EQ(dx[i], positive ? T(2) : T(0)) << "gelu'(" << x[i] << ") * 2";
  }
  std::vector<T> nan = {std::numeric_limits<T>::quiet_NaN()}, out(1), d(1, T(1));
  const auto N = ConstMatrixView<T>::dense(nan.data(), 1, 1, Order::row_major);
  backend.gelu_forward(N, MatrixView<T>::dense(out.data(), 1, 1, Order::row_major));
  EXPECT_TRUE(std::isnan(out[0]));
  backend.gelu_backward(N, ConstMatrixView<T>::dense(d.data(), 1, 1, Order::row_major),
                        MatrixView<T>::dense(out.data(), 1, 1, Order::row_major));
  EXPECT_TRUE(std::isnan(out[0]));
}

TEST(CpuBackend, GeluSaturatesWithoutNaN) {
  check_gelu_extremes<float>();
  check_gelu_extremes<double>();
}

TEST(CpuBackend, Bf16GeluSoftmaxMatchFloat) {
  CpuBackend backend;
  std::mt19937_64 gen(fresh_seed());
  const index_t s = 23;
  for (Order o : kOrders) {
    const std::string where = "order " + std::to_string(int(o));
    Twin x(s, s, o, 2, gen, 4.0), dy(s, s, o == Order::col_major ? Order::row_major : o, 1, gen);
    Twin y(s, s, o, 0, gen);
    y.fill_nan();
    backend.gelu_forward(x.fv(), y.fv());
    backend.gelu_forward(x.bv(), y.bv());
    expect_bf16_near(y.bv(), y.fv(), 4 * kF32Eps, where + " gelu");
    y.fill_nan();
    backend.gelu_backward(x.fv(), dy.fv(), y.fv());
    backend.gelu_backward(x.bv(), dy.bv(), y.bv());
    expect_bf16_near(y.bv(), y.fv(), 4 * kF32Eps, where + " gelu backward");

    y.fill_nan();
    backend.softmax_causal(x.fv(), 0.7, y.fv());
    backend.softmax_causal(x.bv(), 0.7, y.bv());
    expect_bf16_near(y.bv(), y.fv(), 4 * kF32Eps, where + " softmax");
    Twin p(s, s, o, 0, gen);  // a bf16-rounded probability matrix for the backward
    backend.softmax_causal(x.fv(), 0.7, p.fv());
    backend.convert(ConstMatrixView<float>(p.fv()), p.bv());
    backend.convert(ConstMatrixView<bf16>(p.bv()), p.fv());
    y.fill_nan();
    backend.softmax_causal_backward(p.fv(), dy.fv(), 0.7, y.fv());
    backend.softmax_causal_backward(p.bv(), dy.bv(), 0.7, y.bv());
    expect_bf16_near(y.bv(), y.fv(), double(s) * 4 * kF32Eps, where + " softmax backward");
    // In place (P = S) like the float op.
    backend.softmax_causal(x.bv(), 0.7, x.bv());
    backend.softmax_causal(x.fv(), 0.7, x.fv());
    expect_bf16_near(x.bv(), x.fv(), 4 * kF32Eps, where + " softmax in place");
  }
}

TEST(CpuBackend, Bf16CrossEntropyAndEmbeddingMatchFloat) {
  CpuBackend backend;
  std::mt19937_64 gen(fresh_seed());
  const index_t n = 9, cols = 11, col0 = 20;
  for (Order o : kOrders) {
    const std::string where = "order " + std::to_string(int(o));
    Twin z(n, cols, o, 3, gen, 5.0);
    const std::vector<std::int32_t> targets = make_targets(n, col0, cols, gen);
    std::vector<float> mx_f(n), mx_b(n), sum_f(n), sum_b(n), pk_f(n), pk_b(n);
    backend.row_max(z.fv(), mx_f.data());
    backend.row_max(z.bv(), mx_b.data());
    EXPECT_EQ(mx_b, mx_f) << where;
    backend.row_sum_exp(z.fv(), mx_f.data(), sum_f.data());
    backend.row_sum_exp(z.bv(), mx_f.data(), sum_b.data());
    expect_f32_near(sum_b, sum_f, 4 * kF32Eps * double(cols), where + " row_sum_exp");
    backend.pick_targets(z.fv(), targets.data(), col0, pk_f.data());
    backend.pick_targets(z.bv(), targets.data(), col0, pk_b.data());
    EXPECT_EQ(pk_b, pk_f) << where;
    for (double scale : {1.0, -0.125}) {
      z.reset();
      backend.cross_entropy_grad(z.fv(), mx_f.data(), sum_f.data(), targets.data(), col0, scale);
      backend.cross_entropy_grad(z.bv(), mx_f.data(), sum_f.data(), targets.data(), col0, scale);
      expect_bf16_near(z.bv(), z.fv(), 4 * kF32Eps, where + " cross_entropy_grad");
    }
  }

  const index_t vrows = 9, row0 = 30, h = 6, rows = 14;
  std::vector<std::int32_t> ids(rows);
  std::uniform_int_distribution<std::int32_t> dist(row0 - 3, row0 + vrows + 2);
  for (auto& id : ids) id = dist(gen);
  ids[5] = ids[6] = ids[7] = row0 + 4;  // repeats
  for (Order ot : kOrders)
    for (Order oo : kOrders) {
      const std::string where = "orders " + std::to_string(int(ot)) + std::to_string(int(oo));
      Twin table(vrows, h, ot, 2, gen), out(rows, h, oo, 3, gen), src(rows, h, oo, 1, gen);
      out.fill_nan();  // never read without accumulate
      backend.gather_rows(ids.data(), row0, table.fv(), false, out.fv());
      backend.gather_rows(ids.data(), row0, table.bv(), false, out.bv());
      expect_bf16_near(out.bv(), out.fv(), 0, where + " gather");
      out.reset();
      backend.gather_rows(ids.data(), row0, table.fv(), true, out.fv());
      backend.gather_rows(ids.data(), row0, table.bv(), true, out.bv());
      expect_bf16_near(out.bv(), out.fv(), 0, where + " gather accumulate");
      // Scatter rounds once per hit: up to 4 hits of values <= 1 here.
      backend.scatter_add_rows(ids.data(), row0, src.fv(), table.fv());
      backend.scatter_add_rows(ids.data(), row0, src.bv(), table.bv());
      const auto tb = table.bv();
      const auto tf = table.fv();
      for (index_t t = 0; t < vrows; ++t) {
        int hits = 0;
        for (auto id : ids) hits += id == row0 + t ? 1 : 0;
        for (index_t c = 0; c < h; ++c)
          EXPECT_LE(std::abs(double(static_cast<float>(tb(t, c))) - double(tf(t, c))),
                    hits == 0 ? 0.0 : kBf16Rel * hits * (hits + 1))
              << where << " scatter row " << t << " hits " << hits;
      }
    }
}

TEST(CpuBackend, Bf16OptimizerOpsKeepFp32MasterWeights) {
  CpuBackend backend;
  std::mt19937_64 gen(fresh_seed());
  const index_t n = 257;
  TwinVec param(n, gen), grad(n, gen);
  std::vector<float> master = param.f;  // master initialised from the parameters
  std::vector<float> m_f(n, 0), v_f(n, 0), m_b(n, 0), v_b(n, 0);
  optim::AdamWCoefficients ac;
  ac.lr = 1e-2;
  ac.weight_decay = 0.1;
  ac.beta1 = 0.9;
  ac.beta2 = 0.999;
  ac.eps = 1e-8;
  for (int step = 1; step <= 3; ++step) {
    ac.step_size = ac.lr / (1 - std::pow(ac.beta1, step));
    ac.bias_correction2_sqrt = std::sqrt(1 - std::pow(ac.beta2, step));
    // float reference: the fp32 update of the master with the widened gradient.
    backend.adamw_update(param.f.data(), grad.f.data(), m_f.data(), v_f.data(), n, ac);
    backend.adamw_update(param.b.data(), grad.b.data(), m_b.data(), v_b.data(), master.data(), n,
                         ac);
    for (index_t i = 0; i < n; ++i) {
      // The same fp32 arithmetic: equal up to contraction into fused multiply-adds.
      EXPECT_NEAR(master[i], param.f[i], 4 * kF32Eps * std::abs(param.f[i]) + 1e-12) << i;
      EXPECT_NEAR(m_b[i], m_f[i], 4 * kF32Eps * std::abs(m_f[i]) + 1e-12) << i;
      EXPECT_NEAR(v_b[i], v_f[i], 4 * kF32Eps * std::abs(v_f[i]) + 1e-12) << i;
      EXPECT_EQ(param.b[i].bits, bf16(master[i]).bits) << i;  // param = bf16(master)
    }
  }
  for (bool nesterov : {false, true}) {
    TwinVec p(n, gen), g(n, gen);
    std::vector<float> mst = p.f, buf_f(n, 0), buf_b(n, 0);
    optim::SgdCoefficients sc;
    sc.lr = 0.05;
    sc.weight_decay = 0.01;
    sc.momentum = 0.9;
    sc.nesterov = nesterov;
    for (int step = 0; step < 3; ++step) {
      backend.sgd_update(p.f.data(), g.f.data(), buf_f.data(), n, sc);
      backend.sgd_update(p.b.data(), g.b.data(), buf_b.data(), mst.data(), n, sc);
    }
    for (index_t i = 0; i < n; ++i) {
      EXPECT_NEAR(mst[i], p.f[i], 8 * kF32Eps * (std::abs(p.f[i]) + 1)) << i;
      EXPECT_EQ(p.b[i].bits, bf16(mst[i]).bits) << i;
    }
  }
  const double ss_f = backend.sum_of_squares(grad.f.data(), n);
  EXPECT_EQ(backend.sum_of_squares(grad.b.data(), n), ss_f);  // exact widening, same double sum
  backend.scale_in_place(grad.f.data(), n, 0.37);
  backend.scale_in_place(grad.b.data(), n, 0.37);
  expect_bf16_near(grad.b, grad.f, 0, "scale_in_place");
}

TEST(CpuBackend, Bf16KernelsAllocateNothing) {
  if (!allocation_counting_available()) GTEST_SKIP() << "allocation counting is off under ASan";
  CpuBackend backend;
  std::mt19937_64 gen(fresh_seed());
  const index_t s = 64;
  Twin a(s, s, Order::row_major, 3, gen), b(s, s, Order::col_major, 1, gen),
      c(s, s, Order::row_major, 0, gen), table(s, s, Order::col_major, 2, gen);
  TwinVec gamma(s, gen), beta(s, gen), v(s, gen);
  std::vector<float> mx(s), sum(s), picked(s), mean(s), rstd(s), pa(s), pb(s), f32s(s * s),
      master(s, 0.5f), m(s, 0), w(s, 0);
  std::vector<std::int32_t> ids(s);
  for (index_t i = 0; i < s; ++i) ids[i] = static_cast<std::int32_t>((i * 7) % (2 * s));
  optim::AdamWCoefficients ac;
  ac.lr = 1e-3;
  ac.beta1 = 0.9;
  ac.beta2 = 0.99;
  ac.eps = 1e-8;
  ac.step_size = 1e-3;
  optim::SgdCoefficients sc;
  sc.lr = 0.1;
  std::uint64_t count = 0;
  std::string first;
  {
    CountAllocations counter;
    backend.copy(a.bv(), c.bv());
    backend.convert(ConstMatrixView<bf16>(a.bv()), MatrixView<float>::dense(f32s.data(), s, s));
    backend.convert(ConstMatrixView<float>(MatrixView<float>::dense(f32s.data(), s, s)), c.bv());
    backend.axpby(1.0f, a.bv(), 0.5f, c.bv());
    backend.scale(0.5f, c.bv());
    backend.add_bias(c.bv(), v.b.data());
    backend.column_sums(c.bv(), 0.0f, v.b.data());
    backend.layernorm_partial_sums(a.bv(), nullptr, mean.data());
    backend.layernorm_mean(s, s, mean.data(), mean.data());
    backend.layernorm_partial_sums(a.bv(), mean.data(), rstd.data());
    backend.layernorm_rstd(s, s, 1e-5, rstd.data(), rstd.data());
    backend.layernorm_apply(a.bv(), mean.data(), rstd.data(), gamma.b.data(), beta.b.data(),
                            c.bv());
    backend.layernorm_backward_partials(a.bv(), b.bv(), mean.data(), rstd.data(), gamma.b.data(),
                                        pa.data(), pb.data());
    backend.layernorm_backward_apply(a.bv(), b.bv(), mean.data(), rstd.data(), gamma.b.data(),
                                     pa.data(), pb.data(), s, c.bv());
    backend.layernorm_param_partials(a.bv(), b.bv(), mean.data(), rstd.data(), gamma.b.data(),
                                     beta.b.data());
    backend.gelu_forward(a.bv(), c.bv());
    backend.gelu_backward(a.bv(), b.bv(), c.bv());
    backend.softmax_causal(a.bv(), 0.125, c.bv());
    backend.softmax_causal_backward(c.bv(), a.bv(), 0.125, b.bv());
    backend.row_max(c.bv(), mx.data());
    backend.row_sum_exp(c.bv(), mx.data(), sum.data());
    backend.pick_targets(c.bv(), ids.data(), 10, picked.data());
    backend.cross_entropy_grad(c.bv(), mx.data(), sum.data(), ids.data(), 10, 0.5);
    backend.gather_rows(ids.data(), 5, table.bv(), true, b.bv());
    backend.scatter_add_rows(ids.data(), 5, a.bv(), table.bv());
    backend.adamw_update(v.b.data(), gamma.b.data(), m.data(), w.data(), master.data(), s, ac);
    backend.sgd_update(v.b.data(), gamma.b.data(), m.data(), master.data(), s, sc);
    volatile double norm = backend.sum_of_squares(v.b.data(), s);
    (void)norm;
    backend.scale_in_place(v.b.data(), s, 0.5);
    count = counter.count();
    first = counter.first_caller();
  }
  EXPECT_EQ(count, 0u) << "first from " << first;
}

// sum_of_squares over a row-major block with a leading dimension: the sum of
// exactly the block's elements (the gaps between rows hold 1e6, so summing
// one of them is visible), equal to the row-by-row sums of the contiguous op
// up to summation order; bad shapes throw.
template <class T>
void strided_sum_of_squares_case() {
  CpuBackend backend;
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  const index_t rows = 7, cols = 5;
  for (index_t ld : {cols, cols + 3}) {
    std::vector<T> x(static_cast<std::size_t>(rows * ld), T(1e6));
    double want = 0, rowwise = 0;
    for (index_t r = 0; r < rows; ++r) {
      for (index_t c = 0; c < cols; ++c) {
        const T v = static_cast<T>(u(gen));
        x[static_cast<std::size_t>(r * ld + c)] = v;
        want += static_cast<double>(v) * static_cast<double>(v);
      }
      rowwise += backend.sum_of_squares(x.data() + r * ld, cols);
    }
    const double got = backend.sum_of_squares(x.data(), rows, cols, ld);
    EXPECT_NEAR(got, want, 1e-13 * want) << "ld " << ld;
    EXPECT_NEAR(got, rowwise, 1e-13 * want) << "ld " << ld;  // summation order may differ
    EXPECT_EQ(backend.sum_of_squares(x.data(), 0, cols, ld), 0.0);
    EXPECT_EQ(backend.sum_of_squares(static_cast<const T*>(nullptr), rows, 0, ld), 0.0);
  }
  std::vector<T> x(64, T(1));
  EXPECT_THROW(backend.sum_of_squares(x.data(), 2, 5, 4), Error);   // ld < cols
  EXPECT_THROW(backend.sum_of_squares(x.data(), -1, 5, 5), Error);  // negative rows
  EXPECT_THROW(backend.sum_of_squares(static_cast<const T*>(nullptr), 2, 5, 5), Error);
}

TEST(CpuBackend, StridedSumOfSquaresFloat) {
  strided_sum_of_squares_case<float>();
}
TEST(CpuBackend, StridedSumOfSquaresDouble) {
  strided_sum_of_squares_case<double>();
}
TEST(CpuBackend, StridedSumOfSquaresBf16) {
  strided_sum_of_squares_case<bf16>();
}

}  // namespace
}  // namespace summa::test

// SUMMA engine against a serial Eigen product, at whatever q the rank count
// gives (CTest runs 1, 4 and 9 ranks: q = 1, 2, 3).
//
// Tolerance: for C = alpha op(A) op(B) + beta C0 every entry is a sum of k
// products, so the rounding error of any summation order is bounded by about
// k * eps * max|A| * max|B| * |alpha| (plus eps * |beta| * max|C0| for the
// update). The tests require the max error divided by
//   k * eps * max|A| * max|B| * |alpha| + 2 * eps * |beta| * max|C0|
// to stay below 1. Observed values are around 0.01-0.1; a wrong panel, root or
// offset gives errors of order 1 / eps. The bound holds for any summation
// order and fp32 accumulation, so it is the same on the CUDA backend (cuBLAS
// accumulates float products in fp32; TF32 is off in the tests).
//
// Backend: test_backend() (SUMMA_TEST_BACKEND=cpu|cuda). Operands are built
// on the host (padding sentinels included), uploaded to the backend's memory,
// and the results and the padding downloaded before they are checked.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "test_util.hpp"

namespace summa::test {
namespace {

struct Env {
  Backend& backend = test_backend();  // first: selects the rank's device
  ProcessGrid grid = ProcessGrid::mesh2d(MPI_COMM_WORLD, 0, 1, test_grid_options());
  int q() const { return grid.shape().rows; }
  int row() const { return grid.coords().row; }
  int col() const { return grid.coords().col; }
};

Env& env() {
  static Env e;
  return e;
}

struct Case {
  Form form;
  index_t m, n, k;
  index_t panel;
  bool overlap;
  Order order;
  index_t pad;
  int slices = SummaOptions{}.progress_slices;
  std::string str() const {
    std::ostringstream s;
    s << name_of(form) << " m=" << m << " n=" << n << " k=" << k << " panel=" << panel
      << " overlap=" << overlap << " order=" << (order == Order::col_major ? "col" : "row")
      << " pad=" << pad << " slices=" << slices;
    return s.str();
  }
};

// Global shapes of A and B for a form.
std::pair<index_t, index_t> a_shape(const Case& c) {
  return c.form == Form::AtB ? std::pair{c.k, c.m} : std::pair{c.m, c.k};
}
std::pair<index_t, index_t> b_shape(const Case& c) {
  return c.form == Form::ABt ? std::pair{c.n, c.k} : std::pair{c.k, c.n};
}

template <class T>
Mat<T> serial(Form f, const Mat<T>& A, const Mat<T>& B) {
  switch (f) {
    case Form::AB:
      return A * B;
    case Form::ABt:
      return A * B.transpose();
    case Form::AtB:
      return A.transpose() * B;
  }
  return {};
}

template <class T>
struct Outcome {
  double normalized_error;
  bool padding_intact;
};

// Runs one case on fresh random data and returns the normalised error of this
// rank's block.
template <class T>
Outcome<T> run_case(const Case& c, T alpha, T beta, bool nan_c = false) {
  Env& e = env();
  const int q = e.q();
  std::mt19937_64 gen(fresh_seed());
  auto [ar, ac] = a_shape(c);
  auto [br, bc] = b_shape(c);
  const Mat<T> A = random_matrix<T>(ar, ac, gen);
  const Mat<T> B = random_matrix<T>(br, bc, gen);
  const Mat<T> C0 = random_matrix<T>(c.m, c.n, gen);

  Block<T> a(ar / q, ac / q, c.order, c.pad), b(br / q, bc / q, c.order, c.pad),
      cc(c.m / q, c.n / q, c.order, c.pad);
  a.fill(block_of(A, q, e.row(), e.col()));
  b.fill(block_of(B, q, e.row(), e.col()));
  if (nan_c)
    cc.fill_value(std::numeric_limits<T>::quiet_NaN());
  else
    cc.fill(block_of(C0, q, e.row(), e.col()));
  const T sentinel = T(12345);
  for (auto* blk : {&a, &b, &cc}) {  // padding must never be written
    auto v = blk->view();
    auto& s = blk->storage();
    for (std::size_t i = 0; i < s.size(); ++i) {
      const index_t outer = static_cast<index_t>(i) / v.ld, inner = static_cast<index_t>(i) % v.ld;
      const index_t lim = c.order == Order::col_major ? v.rows : v.cols;
      if (inner >= lim || outer >= (c.order == Order::col_major ? v.cols : v.rows)) s[i] = sentinel;
    }
  }

  DeviceBlock<T> da(a), db(b), dc(cc);
  SummaEngine engine(e.grid, e.backend,
                     {.panel = c.panel, .overlap = c.overlap, .progress_slices = c.slices});
  Workspace ws("workspace", e.backend, engine.workspace_bytes(c.form, c.m, c.n, c.k, dtype_v<T>));
  engine.multiply(c.form, c.m, c.n, c.k, alpha, da.view(), db.view(), beta, dc.view(), ws);
  da.download();
  db.download();
  dc.download();

  const Mat<T> ref =
      alpha * serial(c.form, A, B) + (nan_c ? Mat<T>::Zero(c.m, c.n) : Mat<T>(beta * C0));
  const Mat<T> mine = cc.read();
  const Mat<T> want = block_of(ref, q, e.row(), e.col());
  const double eps = std::numeric_limits<T>::epsilon();
  const double scale = static_cast<double>(std::max<index_t>(c.k, 1)) * eps *
                           A.cwiseAbs().maxCoeff() * B.cwiseAbs().maxCoeff() * std::abs(alpha) +
                       2 * eps * std::abs(beta) * C0.cwiseAbs().maxCoeff() +
                       std::numeric_limits<double>::min();
  double err = 0;
  for (index_t j = 0; j < mine.cols(); ++j)
    for (index_t i = 0; i < mine.rows(); ++i) {
      const double d = std::abs(static_cast<double>(mine(i, j)) - want(i, j));
      err = std::isfinite(d) ? std::max(err, d / scale) : std::numeric_limits<double>::infinity();
    }
  bool intact = true;
  for (auto* blk : {&a, &b, &cc}) {
    auto v = blk->view();
    auto& s = blk->storage();
    for (std::size_t i = 0; i < s.size(); ++i) {
      const index_t outer = static_cast<index_t>(i) / v.ld, inner = static_cast<index_t>(i) % v.ld;
      const index_t lim = c.order == Order::col_major ? v.rows : v.cols;
      if ((inner >= lim || outer >= (c.order == Order::col_major ? v.cols : v.rows)) &&
          s[i] != sentinel)
        intact = false;
    }
  }
  double worst = err;
  MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return {worst, intact};
}

const Form kForms[] = {Form::AB, Form::ABt, Form::AtB};

// The odd shapes: m = 3*q*5, n = 2*q*7, k = q*11.
template <class T>
void sweep_odd_shapes() {
  const int q = env().q();
  const index_t m = 15 * q, n = 14 * q, k = 11 * q;
  for (Form f : kForms)
    for (index_t panel : {index_t{0}, index_t{1}, index_t{4}, index_t{7}, index_t{64}})
      for (bool overlap : {true, false}) {
        Case c{f, m, n, k, panel, overlap, Order::col_major, 0};
        auto out = run_case<T>(c, T(1.25), T(-0.5));
        EXPECT_LT(out.normalized_error, 1.0) << c.str();
        EXPECT_TRUE(out.padding_intact) << c.str();
      }
}

TEST(Summa, OddShapesFloat) {
  sweep_odd_shapes<float>();
}
TEST(Summa, OddShapesDouble) {
  sweep_odd_shapes<double>();
}

TEST(Summa, StorageOrdersAndPaddedLeadingDimensions) {
  const int q = env().q();
  for (Form f : kForms)
    for (Order o : {Order::col_major, Order::row_major})
      for (bool overlap : {true, false}) {
        Case c{f, 6 * q, 10 * q, 9 * q, 4, overlap, o, 3};
        auto out = run_case<double>(c, 0.75, 2.0);
        EXPECT_LT(out.normalized_error, 1.0) << c.str();
        EXPECT_TRUE(out.padding_intact) << c.str();
      }
}

TEST(Summa, SquareLargerBlocks) {
  const int q = env().q();
  for (Form f : kForms) {
    Case c{f, 48 * q, 48 * q, 48 * q, 20, true, Order::col_major, 0};
    auto out = run_case<float>(c, 1.0f, 0.0f);
    EXPECT_LT(out.normalized_error, 1.0) << c.str();
  }
}

// Blocks large enough that each panel's GEMM is cut into progress slices
// (slices are at least 128 wide), including a remainder slice.
TEST(Summa, ProgressSlicesKeepResults) {
  const int q = env().q();
  for (Form f : kForms)
    for (int slices : {1, 3, 4}) {
      Case c{f, 300 * q, 280 * q, 40 * q, 64, true, Order::col_major, 0, slices};
      auto out = run_case<float>(c, 1.0f, 0.5f);
      EXPECT_LT(out.normalized_error, 1.0) << c.str();
    }
}

TEST(Summa, BetaZeroNeverReadsC) {
  const int q = env().q();
  for (Form f : kForms)
    for (bool overlap : {true, false}) {
      Case c{f, 5 * q, 3 * q, 7 * q, 2, overlap, Order::col_major, 1};
      auto out = run_case<double>(c, -1.5, 0.0, /*nan_c=*/true);
      EXPECT_LT(out.normalized_error, 1.0) << c.str() << " (C was NaN, beta = 0)";
    }
}

// alpha = 0 or k = 0: C = beta C without touching A or B (NaN there), no traffic.
TEST(Summa, AlphaZeroAndEmptyDimensions) {
  Env& e = env();
  const int q = e.q();
  for (Form f : kForms) {
    for (index_t k : {index_t{0}, index_t{4} * q}) {
      const bool k_zero = k == 0;
      SummaEngine engine(e.grid, e.backend);
      BlockShapes s = SummaEngine::block_shapes(f, 3 * q, 2 * q, k, q);
      std::vector<double> a(static_cast<std::size_t>(std::max<index_t>(s.a_rows * s.a_cols, 1)),
                            std::nan("")),
          b(static_cast<std::size_t>(std::max<index_t>(s.b_rows * s.b_cols, 1)), std::nan("")),
          cbuf(static_cast<std::size_t>(s.c_rows * s.c_cols));
      std::mt19937_64 gen(fresh_seed());
      for (auto& x : cbuf) x = std::uniform_real_distribution<double>(-1, 1)(gen);
      const std::vector<double> c0 = cbuf;
      const DeviceArray<double> da(a), db(b);
      DeviceArray<double> dc(cbuf);
      Workspace ws("workspace", e.backend, engine.workspace_bytes(f, 3 * q, 2 * q, k, DType::f64));
      e.grid.reset_traffic();
      engine.multiply(f, 3 * q, 2 * q, k, k_zero ? 1.0 : 0.0,
                      MatrixView<double>::dense(da.data(), s.a_rows, s.a_cols),
                      MatrixView<double>::dense(db.data(), s.b_rows, s.b_cols), 0.5,
                      MatrixView<double>::dense(dc.data(), s.c_rows, s.c_cols), ws);
      cbuf = dc.download();
      for (std::size_t i = 0; i < cbuf.size(); ++i)
        EXPECT_EQ(cbuf[i], 0.5 * c0[i]) << name_of(f) << " k=" << k;
      EXPECT_EQ(e.grid.traffic().total().bytes_sent, 0u);
      // beta = 0 with k = 0 zeroes a NaN C.
      std::fill(cbuf.begin(), cbuf.end(), std::nan(""));
      dc.upload(cbuf);
      engine.multiply(f, 3 * q, 2 * q, k, k_zero ? 1.0 : 0.0,
                      MatrixView<double>::dense(da.data(), s.a_rows, s.a_cols),
                      MatrixView<double>::dense(db.data(), s.b_rows, s.b_cols), 0.0,
                      MatrixView<double>::dense(dc.data(), s.c_rows, s.c_cols), ws);
      cbuf = dc.download();
      for (double x : cbuf) EXPECT_EQ(x, 0.0);
    }
    // m = 0 or n = 0: nothing to do, nothing read or written.
    for (auto [m, n] : {std::pair<index_t, index_t>{0, 2 * q}, {3 * q, 0}}) {
      SummaEngine engine(e.grid, e.backend);
      const BlockShapes s = SummaEngine::block_shapes(f, m, n, q, q);
      const DeviceArray<double> nan_storage(std::vector<double>(16, std::nan("")));
      Workspace ws("workspace", e.backend, engine.workspace_bytes(f, m, n, q, DType::f64));
      e.grid.reset_traffic();
      EXPECT_NO_THROW(engine.multiply(
          f, m, n, q, 1.0, MatrixView<double>::dense(nan_storage.data(), s.a_rows, s.a_cols),
          MatrixView<double>::dense(nan_storage.data(), s.b_rows, s.b_cols), 0.0,
          MatrixView<double>::dense(nan_storage.data(), s.c_rows, s.c_cols), ws))
          << name_of(f) << " m=" << m << " n=" << n;
      EXPECT_EQ(e.grid.traffic().total().bytes_sent, 0u);
      for (double x : nan_storage.download()) EXPECT_TRUE(std::isnan(x));
    }
  }
}

// Per-rank traffic of one call equals the closed form (direct-exchange model,
// include/summa/comm/counters.hpp), whatever the panel width and overlap.
TEST(Summa, ByteCountersMatchClosedForm) {
  Env& e = env();
  const int q = e.q();
  const std::uint64_t g = static_cast<std::uint64_t>(q);
  const index_t m = 6 * q, n = 4 * q, k = 5 * q;
  const std::uint64_t mb = 6, nb = 4, kb = 5, el = sizeof(float);
  for (Form f : kForms)
    for (index_t panel : {index_t{0}, index_t{3}})
      for (bool overlap : {true, false}) {
        SummaEngine engine(e.grid, e.backend, {.panel = panel, .overlap = overlap});
        BlockShapes s = SummaEngine::block_shapes(f, m, n, k, q);
        std::mt19937_64 gen(fresh_seed());
        const DeviceMat<float> a(random_matrix<float>(s.a_rows, s.a_cols, gen));
        const DeviceMat<float> b(random_matrix<float>(s.b_rows, s.b_cols, gen));
        const DeviceMat<float> c(s.c_rows, s.c_cols);
        Workspace ws("workspace", e.backend, engine.workspace_bytes(f, m, n, k, DType::f32));
        e.grid.reset_traffic();
        engine.multiply(f, m, n, k, 1.0f, a.view(), b.view(), 0.0f, c.view(), ws);
        const TrafficCounters& t = e.grid.traffic();
        std::uint64_t row_bytes = 0, col_bytes = 0;
        switch (f) {
          case Form::AB:  // A along rows, B along columns
            row_bytes = (g - 1) * mb * kb * el;
            col_bytes = (g - 1) * kb * nb * el;
            break;
          case Form::ABt:  // B along columns, partial C reduced along rows
            col_bytes = (g - 1) * nb * kb * el;
            row_bytes = (g - 1) * mb * nb * el;
            break;
          case Form::AtB:  // A along rows, partial C reduced along columns
            row_bytes = (g - 1) * kb * mb * el;
            col_bytes = (g - 1) * mb * nb * el;
            break;
        }
        const std::string what = std::string(name_of(f)) + " panel=" + std::to_string(panel) +
                                 " overlap=" + std::to_string(overlap);
        EXPECT_EQ(t[CommAxis::mesh_row].bytes_sent, row_bytes) << what;
        EXPECT_EQ(t[CommAxis::mesh_row].bytes_received, row_bytes) << what;
        EXPECT_EQ(t[CommAxis::mesh_col].bytes_sent, col_bytes) << what;
        EXPECT_EQ(t[CommAxis::mesh_col].bytes_received, col_bytes) << what;
        EXPECT_EQ(t.total().bytes_sent, row_bytes + col_bytes) << what;
      }
}

// Optimus eqs. 1-3: the backward of each form is made of the other forms.
// With loss L = <G, C> (G = dL/dC), L is linear in A and in B, so
// <dA, A> = <dB, B> = L: checked with distributed inner products, and every
// gradient block is also compared with the serial formula.
TEST(Summa, BackwardIdentities) {
  Env& e = env();
  const int q = e.q();
  const index_t m = 8 * q, n = 6 * q, k = 7 * q;
  std::mt19937_64 gen(fresh_seed());
  SummaEngine engine(e.grid, e.backend, {.panel = 3, .overlap = true});
  Workspace ws("workspace", e.backend, 1 << 22);
  const double eps = std::numeric_limits<double>::epsilon();
  auto blk = [&](const Mat<double>& g) { return Mat<double>(block_of(g, q, e.row(), e.col())); };
  auto view = [](const DeviceMat<double>& x) { return x.view(); };
  auto dot = [&](const Mat<double>& x, const Mat<double>& y) {
    double d = x.cwiseProduct(y).sum();
    MPI_Allreduce(MPI_IN_PLACE, &d, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return d;
  };
  for (Form f : kForms) {
    Case c{f, m, n, k, 0, true, Order::col_major, 0};
    auto [ar, ac] = a_shape(c);
    auto [br, bc] = b_shape(c);
    Mat<double> A = random_matrix<double>(ar, ac, gen), B = random_matrix<double>(br, bc, gen),
                G = random_matrix<double>(m, n, gen);
    const Mat<double> a_host = blk(A), b_host = blk(B), g_host = blk(G);
    const DeviceMat<double> a(a_host), b(b_host), g(g_host), cl(m / q, n / q),
        da(a_host.rows(), a_host.cols()), db(b_host.rows(), b_host.cols());
    engine.multiply(f, m, n, k, 1.0, view(a), view(b), 0.0, view(cl), ws);
    Mat<double> dA_ref, dB_ref;
    switch (f) {
      case Form::AB:  // dA = G B' (ABt), dB = A' G (AtB)
        engine.abt(m, k, n, 1.0, view(g), view(b), 0.0, view(da), ws);
        engine.atb(k, n, m, 1.0, view(a), view(g), 0.0, view(db), ws);
        dA_ref = G * B.transpose();
        dB_ref = A.transpose() * G;
        break;
      case Form::AtB:  // dA = B G' (ABt), dB = A G (AB)
        engine.abt(k, m, n, 1.0, view(b), view(g), 0.0, view(da), ws);
        engine.ab(k, n, m, 1.0, view(a), view(g), 0.0, view(db), ws);
        dA_ref = B * G.transpose();
        dB_ref = A * G;
        break;
      case Form::ABt:  // dA = G B (AB), dB = G' A (AtB)
        engine.ab(m, k, n, 1.0, view(g), view(b), 0.0, view(da), ws);
        engine.atb(n, k, m, 1.0, view(g), view(a), 0.0, view(db), ws);
        dA_ref = G * B;
        dB_ref = G.transpose() * A;
        break;
    }
    const Mat<double> c_got = cl.read(), da_got = da.read(), db_got = db.read();
    const double L = dot(g_host, c_got), la = dot(da_got, a_host), lb = dot(db_got, b_host);
    const double tol = 10 * eps * static_cast<double>(m * n * k);
    EXPECT_NEAR(la, L, tol) << name_of(f) << ": <dA, A> != <G, C>";
    EXPECT_NEAR(lb, L, tol) << name_of(f) << ": <dB, B> != <G, C>";
    const double scale = static_cast<double>(std::max({m, n, k})) * eps;
    EXPECT_LT((da_got - blk(dA_ref)).cwiseAbs().maxCoeff(), scale) << name_of(f) << " dA";
    EXPECT_LT((db_got - blk(dB_ref)).cwiseAbs().maxCoeff(), scale) << name_of(f) << " dB";
  }
}

// Bad input: the same summa::Error on every rank, before any collective (no
// hang), and the engine keeps working afterwards. consensus_checks (the
// debug mode) agrees what one rank alone gets wrong; without it a mistake
// every rank makes is still the same error everywhere.
TEST(Summa, BadInputThrowsSameErrorEverywhere) {
  Env& e = env();
  const int q = e.q();
  int world_rank = 0, world_size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  SummaEngine engine(e.grid, e.backend, {.panel = 2, .overlap = true, .consensus_checks = true});
  SummaEngine unchecked(e.grid, e.backend, {.panel = 2, .overlap = true});
  ASSERT_FALSE(unchecked.agrees_calls());  // the default
  const index_t m = 4 * q, n = 2 * q, k = 3 * q;
  const DeviceMat<double> a(Mat<double>(Mat<double>::Ones(4, 3))),
      b(Mat<double>(Mat<double>::Ones(3, 2))), c(4, 2);
  auto V = [](const DeviceMat<double>& x) { return x.view(); };
  Workspace ws("workspace", e.backend, engine.workspace_bytes(Form::AB, m, n, k, DType::f64));
  Workspace tiny("tiny", e.backend, 64);

  auto expect_error = [&](auto&& call, const std::string& fragment, const char* what) {
    std::string message;
    try {
      call();
    } catch (const Error& err) {
      message = err.what();
    }
    EXPECT_NE(message.find(fragment), std::string::npos) << what << ": got '" << message << "'";
    EXPECT_TRUE(same_on_all_ranks(message)) << what << ": message differs between ranks";
  };
  if (q > 1) {
    expect_error([&] { engine.ab(m + 1, n, k, 1.0, V(a), V(b), 0.0, V(c), ws); },
                 "m=" + std::to_string(m + 1) + " not divisible by q=" + std::to_string(q),
                 "m % q");
    expect_error([&] { engine.ab(m, n, k + 1, 1.0, V(a), V(b), 0.0, V(c), ws); },
                 "not divisible by q", "k % q");
  }
  // Only the last rank passes a wrongly shaped C block.
  const DeviceMat<double> wrong(5, 2);
  expect_error(
      [&] {
        engine.ab(m, n, k, 1.0, V(a), V(b), 0.0, world_rank == world_size - 1 ? V(wrong) : V(c),
                  ws);
      },
      "local C block is 5x2, expected 4x2", "mismatched C block on one rank");
  const DeviceMat<double> wrong_b(2, 3);
  expect_error([&] { engine.ab(m, n, k, 1.0, V(a), V(wrong_b), 0.0, V(c), ws); },
               "local B block is 2x3, expected 3x2", "mismatched B block");
  expect_error([&] { unchecked.ab(m, n, k, 1.0, V(a), V(wrong_b), 0.0, V(c), ws); },
               "local B block is 2x3, expected 3x2", "mismatched B block, no agreement");
  if (q > 1)
    expect_error([&] { engine.ab(m, n, k, 1.0, V(a), V(b), 0.0, V(c), tiny); },
                 "workspace 'tiny' has 64 bytes free, needs", "workspace too small");
  expect_error([&] { engine.ab(-q, n, k, 1.0, V(a), V(b), 0.0, V(c), ws); }, "is negative",
               "negative m");
  // Still usable afterwards.
  engine.ab(m, n, k, 1.0, V(a), V(b), 0.0, V(c), ws);
  EXPECT_EQ(c.read()(0, 0), static_cast<double>(k));

  // Only the last rank passes another k, with blocks that fit its own k, so
  // no rank finds a local error: the size agreement must catch it (a hang
  // in the panel broadcasts before).
  if (world_size > 1) {
    const bool odd = world_rank == world_size - 1;
    const index_t k2 = odd ? k + q : k;
    const DeviceMat<double> a2(Mat<double>(Mat<double>::Ones(4, k2 / q))),
        b2(Mat<double>(Mat<double>::Ones(k2 / q, 2)));
    Workspace ws2("workspace", e.backend,
                  std::max(engine.workspace_bytes(Form::AB, m, n, k + q, DType::f64),
                           engine.workspace_bytes(Form::ABt, m, n, k, DType::f64)));
    expect_error([&] { engine.ab(m, n, k2, 1.0, V(a2), V(b2), 0.0, V(c), ws2); },
                 "SUMMA multiply: ranks disagree on k: it ranges over [" + std::to_string(k) +
                     ", " + std::to_string(k + q) + "]",
                 "k differs on one rank");
    // ... and the form: the last rank calls ABt (B n x k) while the others call AB.
    const DeviceMat<double> bt(Mat<double>(Mat<double>::Ones(2, 3)));
    expect_error(
        [&] {
          if (odd)
            engine.abt(m, n, k, 1.0, V(a), V(bt), 0.0, V(c), ws2);
          else
            engine.ab(m, n, k, 1.0, V(a), V(b), 0.0, V(c), ws2);
        },
        "ranks disagree on the form", "form differs on one rank");
  }
}

// After a warm-up call, a call allocates nothing: panels and Eigen's packing
// buffers all come from the workspace. MPI's own internal allocations (its
// non-blocking collective schedules) are outside summa's control and are
// counted apart (reported, not asserted).
TEST(Summa, NoHeapAllocationInsideTheLoop) {
  if (!allocation_counting_available()) GTEST_SKIP() << "allocation counting is off under ASan";
  if (test_backend().asynchronous())
    GTEST_SKIP() << "CPU only: counts host allocations of Eigen's packing, and the CUDA runtime "
                    "allocates on its own";
  Env& e = env();
  const int q = e.q();
  const index_t m = 300 * q, n = 280 * q, k = 40 * q;  // large enough to slice
  for (Form f : kForms)
    for (bool overlap : {true, false}) {
      SummaEngine engine(e.grid, e.backend, {.panel = 16, .overlap = overlap});
      BlockShapes s = SummaEngine::block_shapes(f, m, n, k, q);
      std::mt19937_64 gen(fresh_seed());
      Mat<float> a = random_matrix<float>(s.a_rows, s.a_cols, gen);
      Mat<float> b = random_matrix<float>(s.b_rows, s.b_cols, gen);
      Mat<float> c(s.c_rows, s.c_cols);
      Workspace ws("workspace", e.backend, engine.workspace_bytes(f, m, n, k, DType::f32));
      auto call = [&] {
        engine.multiply(f, m, n, k, 1.0f, MatrixView<float>::dense(a.data(), a.rows(), a.cols()),
                        MatrixView<float>::dense(b.data(), b.rows(), b.cols()), 0.0f,
                        MatrixView<float>::dense(c.data(), c.rows(), c.cols()), ws);
      };
      call();  // warm-up: MPI sets up its collective machinery on first use
      std::uint64_t allocations = 0, in_mpi = 0;
      std::string first;
      {
        CountAllocations counter;
        call();
        allocations = counter.count();
        in_mpi = counter.mpi_count();
        first = counter.first_caller();
      }
      if (f == Form::AB && overlap && e.grid.rank() == 0)
        std::printf("[info] allocations in one SUMMA call: %llu by summa/Eigen, %llu inside MPI\n",
                    static_cast<unsigned long long>(allocations),
                    static_cast<unsigned long long>(in_mpi));
      EXPECT_EQ(allocations, 0u) << name_of(f) << " overlap=" << overlap
                                 << "; first allocation from " << first;
    }
}

}  // namespace
}  // namespace summa::test

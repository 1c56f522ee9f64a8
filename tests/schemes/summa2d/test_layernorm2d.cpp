// The 2D LayerNorm (Optimus §3.2.1 layer norm on a q x q mesh: SplitLayerNorm
// over summa2d_norm_layout, its parameters on mesh row 0) against a serial Eigen
// reference in double, at whatever q the rank count gives (CTest: 1, 4, 9
// ranks). Forward output and every gradient (dX, dgamma, dbeta), float and
// double, row- and column-major blocks with padded leading dimensions, with
// and without accumulation, NaN-filled outputs.
//
// Tolerance: with inputs offset + U(-1, 1) (std ~ 0.58), float rounding of the
// row sum over h = H values of size <= 1 + |offset| moves the mean by at most
// ~ H * eps * (1 + |offset|) and xhat, Y, dX by a small multiple of that
// (|gamma|, |dY| <= 1, rstd ~ 1.7), so Y and dX are compared with
// tol = 16 * H * eps * (1 + |offset|) and the column sums dgamma, dbeta with
// M * tol (M tokens). At offset 1000 in float tol is 1.5e-2 (H = 8, q = 1) to
// 4.6e-2 (H = 24, q = 3) while the observed Y / dX errors of the two-pass
// statistics are ~1e-4; the one-pass E[x^2] - E[x]^2 (E[x^2] ~ 1e6, float
// ulp 0.06 against var ~ 0.33) fails these bounds (checked by swapping it
// in: Y, dX and dgamma all fail at offset 1000, at q = 1, 2, 3; the saved
// mean and rstd are internal to the layer and checked through them).
// The CUDA backend also accumulates the sums in T with the same two-pass
// statistics, so the same bounds apply to it.
//
// Backend: test_backend(). Blocks (padding sentinels included) are built on
// the host, uploaded, and every output and the padding downloaded before they
// are checked.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "test_util.hpp"

namespace summa::test {
namespace {

struct Reference {
  Mat<double> Y, dX, mean, rstd, dgamma, dbeta;  // mean, rstd: M x 1; dgamma, dbeta: 1 x H
};

// Serial two-pass layer norm and its gradient, in double.
Reference reference(const Mat<double>& X, const Mat<double>& gamma, const Mat<double>& beta,
                    const Mat<double>& dY, double eps) {
  const index_t H = X.cols();
  Reference r;
  r.mean = X.rowwise().mean();
  const Mat<double> centered = X.colwise() - r.mean.col(0);
  r.rstd =
      ((centered.array().square().rowwise().sum() / static_cast<double>(H)) + eps).rsqrt().matrix();
  const Mat<double> xhat = centered.array().colwise() * r.rstd.col(0).array();
  r.Y = (xhat.array().rowwise() * gamma.row(0).array()).rowwise() + beta.row(0).array();
  const Mat<double> g = dY.array().rowwise() * gamma.row(0).array();
  const Eigen::ArrayXd a = g.rowwise().sum().array() / static_cast<double>(H);
  const Eigen::ArrayXd b = (g.array() * xhat.array()).rowwise().sum() / static_cast<double>(H);
  r.dX = ((g.array().colwise() - a) - xhat.array().colwise() * b).colwise() * r.rstd.col(0).array();
  r.dgamma = (dY.array() * xhat.array()).colwise().sum();
  r.dbeta = dY.colwise().sum();
  return r;
}

template <class T>
Mat<double> to_double(const Mat<T>& m) {
  return m.template cast<double>();
}

template <class T>
void check_layernorm(Order in_order, Order out_order, bool accumulate, double offset) {
  MeshEnv& e = mesh_env();
  const int q = e.engine.q(), i = e.grid.coords().row, j = e.grid.coords().col;
  const index_t M = 6 * q, H = 8 * q, mt = M / q, nh = H / q;
  const double eps_ln = 1e-5;
  std::mt19937_64 gen(fresh_seed());
  Mat<T> X = random_matrix<T>(M, H, gen);
  X.array() += static_cast<T>(offset);
  const Mat<T> dY = random_matrix<T>(M, H, gen), gamma = random_matrix<T>(1, H, gen),
               beta = random_matrix<T>(1, H, gen), dgamma0 = random_matrix<T>(1, H, gen),
               dbeta0 = random_matrix<T>(1, H, gen);

  SplitLayerNorm<T> layer(e.grid, e.backend, summa2d_norm_layout(e.grid), "ln", M, H, eps_ln);
  ASSERT_EQ(layer.local_tokens(), mt);
  ASSERT_EQ(layer.local_hidden(), nh);
  // the parameters on mesh row 0 alone, slice j of [H]
  EXPECT_EQ(layer.weight().held(), i == 0);
  EXPECT_EQ(layer.bias().held(), i == 0);
  if (i == 0) {
    EXPECT_EQ(layer.weight().shard.pieces.at(0).global_col, j * nh);
  }
  Arenas buffers(e.backend, layer.buffer_needs());
  Block<T> x(mt, nh, in_order, 3), dy(mt, nh, in_order, 1);
  Block<T> y(mt, nh, out_order, 2), dx(mt, nh, out_order, 0);
  x.fill(block_of(X, q, i, j));
  dy.fill(block_of(dY, q, i, j));
  const T nan = std::numeric_limits<T>::quiet_NaN();
  y.fill_value(nan);
  dx.fill_value(nan);
  std::vector<T> g, b, dg, db;
  if (i == 0) {
    for (index_t c = 0; c < nh; ++c) {
      g.push_back(gamma(0, j * nh + c));
      b.push_back(beta(0, j * nh + c));
      dg.push_back(accumulate ? dgamma0(0, j * nh + c) : nan);
      db.push_back(accumulate ? dbeta0(0, j * nh + c) : nan);
    }
  }
  {  // on the backend: inputs uploaded, outputs (NaN) and padding downloaded
    DeviceBlock<T> x_d(x), dy_d(dy), y_d(y), dx_d(dx);
    DeviceArray<T> g_d(g), b_d(b), dg_d(dg), db_d(db);
    auto ptr = [](DeviceArray<T>& v) { return v.size() == 0 ? nullptr : v.data(); };
    layer.weight().value = ptr(g_d);
    layer.bias().value = ptr(b_d);
    layer.weight().grad = ptr(dg_d);
    layer.bias().grad = ptr(db_d);
    layer.forward(x_d.view(), y_d.view(), buffers.step);
    layer.backward(dy_d.view(), dx_d.view(), buffers.step, accumulate);
    y_d.download();
    dx_d.download();
    dg = dg_d.download();
    db = db_d.download();
  }

  Reference r = reference(to_double(X), to_double(gamma), to_double(beta), to_double(dY), eps_ln);
  if (accumulate) {
    r.dgamma += to_double(dgamma0);
    r.dbeta += to_double(dbeta0);
  }
  const double tol =
      16.0 * static_cast<double>(H) * std::numeric_limits<T>::epsilon() * (1.0 + std::abs(offset));
  auto err = [&](Block<T>& got, const Mat<double>& want) {
    return max_over_ranks((to_double(got.read()) - block_of(want, q, i, j)).cwiseAbs().maxCoeff() /
                          tol);
  };
  EXPECT_LT(err(y, r.Y), 1.0) << "Y, offset " << offset;
  EXPECT_LT(err(dx, r.dX), 1.0) << "dX, offset " << offset;
  double param_err = 0;
  for (std::size_t c = 0; c < dg.size(); ++c) {
    const index_t col = j * nh + static_cast<index_t>(c);
    param_err = std::max({param_err, std::abs(dg[c] - r.dgamma(0, col)) / (M * tol),
                          std::abs(db[c] - r.dbeta(0, col)) / (M * tol)});
  }
  EXPECT_LT(max_over_ranks(param_err), 1.0) << "dgamma / dbeta";
  // Padding sentinels (zeros) outside the output views stay untouched.
  double padding = 0;
  for (Block<T>* out : {&y, &dx}) {
    out->fill_value(T(0));
    for (T v : out->storage()) padding = std::max(padding, std::abs(static_cast<double>(v)));
  }
  EXPECT_EQ(max_over_ranks(padding), 0.0) << "padding written";
}

TEST(LayerNorm2D, ForwardBackwardFloatRowMajor) {
  check_layernorm<float>(Order::row_major, Order::row_major, false, 0.0);
}
TEST(LayerNorm2D, ForwardBackwardDoubleColMajor) {
  check_layernorm<double>(Order::col_major, Order::col_major, false, 0.0);
}
TEST(LayerNorm2D, MixedOrders) {
  check_layernorm<float>(Order::row_major, Order::col_major, false, 0.0);
  check_layernorm<double>(Order::col_major, Order::row_major, false, 0.0);
}
TEST(LayerNorm2D, LargeOffsetIsStableInFloat) {
  check_layernorm<float>(Order::row_major, Order::row_major, false, 1000.0);
  check_layernorm<float>(Order::col_major, Order::row_major, false, 1000.0);
  check_layernorm<double>(Order::col_major, Order::col_major, false, 1000.0);
}
TEST(LayerNorm2D, GradientAccumulation) {
  check_layernorm<double>(Order::row_major, Order::col_major, true, 0.0);
  check_layernorm<float>(Order::col_major, Order::row_major, true, 0.0);
}

TEST(LayerNorm2D, NoHeapAllocation) {
  if (!allocation_counting_available()) GTEST_SKIP() << "allocation counting is off under ASan";
  if (test_backend().asynchronous())
    GTEST_SKIP() << "CPU only: counts host allocations, and the CUDA runtime allocates on its own";
  MeshEnv& e = mesh_env();
  const int q = e.engine.q();
  const index_t mt = 4, nh = 5;
  SplitLayerNorm<float> layer(e.grid, e.backend, summa2d_norm_layout(e.grid), "ln", mt * q, nh * q);
  Arenas buffers(e.backend, layer.buffer_needs());
  std::mt19937_64 gen(fresh_seed());
  Block<float> x(mt, nh, Order::row_major, 0), dy(mt, nh, Order::col_major, 0);
  Block<float> y(mt, nh, Order::row_major, 0), dx(mt, nh, Order::row_major, 0);
  x.fill(random_matrix<float>(mt, nh, gen));
  dy.fill(random_matrix<float>(mt, nh, gen));
  std::vector<float> g(static_cast<std::size_t>(nh), 1.0f), b(g), dg(g), db(g);
  if (layer.weight().held()) {
    layer.weight().value = g.data();
    layer.bias().value = b.data();
    layer.weight().grad = dg.data();
    layer.bias().grad = db.data();
  }
  auto call = [&] {
    buffers.forward.reset();
    layer.forward(x.view(), y.view(), buffers.step);
    layer.backward(dy.view(), dx.view(), buffers.step, true);
  };
  call();  // warm-up
  std::uint64_t allocations = 0;
  std::string first;
  {
    CountAllocations counter;
    call();
    allocations = counter.count();
    first = counter.first_caller();
  }
  EXPECT_EQ(allocations, 0u) << "first from " << first;
}

TEST(LayerNorm2D, ShapeErrorsOnEveryRank) {
  MeshEnv& e = mesh_env();
  const int q = e.engine.q();
  const index_t hidden = q == 1 ? 0 : 8 * q + 1;
  std::string message;
  try {
    SplitLayerNorm<double> layer(e.grid, e.backend, summa2d_norm_layout(e.grid), "h.0.ln_1", 6 * q,
                                 hidden);
  } catch (const Error& err) {
    message = err.what();
  }
  const std::string want = q == 1 ? "LayerNorm2D 'h.0.ln_1': tokens=6 and hidden=0 must be positive"
                                  : "LayerNorm2D 'h.0.ln_1': hidden=" + std::to_string(hidden) +
                                        " must be divisible by q=" + std::to_string(q);
  EXPECT_NE(message.find(want), std::string::npos) << message;
  EXPECT_TRUE(same_on_all_ranks(message));
}

}  // namespace
}  // namespace summa::test

// Linear2D (Y = X W + b on a q x q mesh) against a serial Eigen reference, at
// whatever q the rank count gives (CTest: 1, 4, 9 ranks). Forward output and
// every gradient (dX, dW, db), with and without accumulation and bias.
// Tolerance: the products' k * eps * max|A| * max|B| scale (see test_summa.cpp;
// it holds for any summation order with fp32 accumulation, so on CUDA too).
// Backend: test_backend(); blocks are built on the host, uploaded, and the
// results downloaded before they are compared.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "test_util.hpp"

namespace summa::test {
namespace {

template <class T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Block (i, j) of a q x q split, as a row-major copy.
template <class T>
RowMat<T> block(const Mat<T>& g, int q, int i, int j) {
  return block_of(g, q, i, j);
}
template <class T>
MatrixView<T> view(const DeviceMat<T>& m) {
  return m.view();
}

template <class T>
void check_linear(bool has_bias, bool accumulate) {
  MeshEnv& e = mesh_env();
  const int q = e.engine.q(), i = e.grid.coords().row, j = e.grid.coords().col;
  const index_t M = 10 * q, K = 6 * q, N = 8 * q;
  std::mt19937_64 gen(fresh_seed());
  const Mat<T> X = random_matrix<T>(M, K, gen), W = random_matrix<T>(K, N, gen),
               dY = random_matrix<T>(M, N, gen), W0 = random_matrix<T>(K, N, gen);
  const Mat<T> b = random_matrix<T>(1, N, gen), b0 = random_matrix<T>(1, N, gen);

  Linear2D layer(e.engine, M, K, N, has_bias);
  Workspace ws("workspace", e.backend, layer.workspace_bytes(dtype_v<T>));
  RowMat<T> x = block(X, q, i, j), w = block(W, q, i, j), dy = block(dY, q, i, j);
  RowMat<T> y(M / q, N / q), dx(M / q, K / q), dw = block(W0, q, i, j);
  y.setConstant(std::numeric_limits<T>::quiet_NaN());
  dx.setConstant(std::numeric_limits<T>::quiet_NaN());
  if (!accumulate) dw.setConstant(std::numeric_limits<T>::quiet_NaN());
  std::vector<T> bias, dbias;
  if (layer.owns_bias()) {
    for (index_t c = 0; c < N / q; ++c) {
      bias.push_back(b(0, j * N / q + c));
      dbias.push_back(accumulate ? b0(0, j * N / q + c) : std::numeric_limits<T>::quiet_NaN());
    }
  }
  {  // on the backend: inputs uploaded, outputs (NaN where they must be written) downloaded
    const DeviceMat<T> x_d(x), w_d(w), dy_d(dy), y_d(y), dx_d(dx), dw_d(dw);
    DeviceArray<T> bias_d(bias), dbias_d(dbias);
    layer.forward<T>(view(x_d), view(w_d), bias.empty() ? nullptr : bias_d.data(), view(y_d), ws);
    layer.backward<T>(view(x_d), view(w_d), view(dy_d), view(dx_d), view(dw_d),
                      dbias.empty() ? nullptr : dbias_d.data(), ws, accumulate);
    y = y_d.template read<RowMat<T>>();
    dx = dx_d.template read<RowMat<T>>();
    dw = dw_d.template read<RowMat<T>>();
    dbias = dbias_d.download();
  }

  Mat<T> Y = X * W, dX = dY * W.transpose(), dW = X.transpose() * dY;
  Mat<T> db = dY.colwise().sum();
  if (has_bias) Y.rowwise() += b.row(0);
  if (accumulate) {
    dW += W0;
    db += b0;
  }
  const double eps = std::numeric_limits<T>::epsilon();
  auto err = [&](const RowMat<T>& got, const Mat<T>& want, index_t k) {
    const double scale = static_cast<double>(k) * eps * 4;  // |entries| <= 1, +bias/accumulate
    return max_over_ranks((got - block(want, q, i, j)).cwiseAbs().maxCoeff() / scale);
  };
  EXPECT_LT(err(y, Y, K), 1.0) << "Y";
  EXPECT_LT(err(dx, dX, N), 1.0) << "dX";
  EXPECT_LT(err(dw, dW, M), 1.0) << "dW";
  double bias_err = 0;
  for (std::size_t c = 0; c < dbias.size(); ++c)
    bias_err = std::max(bias_err, std::abs(static_cast<double>(dbias[c]) -
                                           db(0, j * N / q + static_cast<index_t>(c))) /
                                      (M * eps * 4));
  EXPECT_LT(max_over_ranks(bias_err), 1.0) << "db";
  EXPECT_EQ(layer.owns_bias(), has_bias && i == 0);
}

TEST(Linear2D, ForwardBackwardFloat) {
  check_linear<float>(true, false);
}
TEST(Linear2D, ForwardBackwardDouble) {
  check_linear<double>(true, false);
}
TEST(Linear2D, GradientAccumulation) {
  check_linear<double>(true, true);
}
TEST(Linear2D, NoBias) {
  check_linear<float>(false, false);
}

TEST(Linear2D, ShapeErrorsOnEveryRank) {
  MeshEnv& e = mesh_env();
  const int q = e.engine.q();
  if (q == 1) GTEST_SKIP() << "every size is divisible by q = 1";
  std::string message;
  try {
    Linear2D layer(e.engine, 10 * q, 6 * q + 1, 8 * q);
  } catch (const Error& err) {
    message = err.what();
  }
  EXPECT_NE(
      message.find("in=" + std::to_string(6 * q + 1) + " must be positive and divisible by q="),
      std::string::npos)
      << message;
  EXPECT_TRUE(same_on_all_ranks(message));
}

}  // namespace
}  // namespace summa::test

// CudaBackend against CpuBackend: every op on fresh random data, copied to the
// device, run, copied back and compared, for float and double, both storage
// orders of every operand and padded (strided) leading dimensions. Padding
// holds a sentinel that must come back untouched; outputs documented as
// "never read" start as NaN.
//
// Tolerances (max |gpu - cpu| / max |cpu| over a tensor): fp64 1e-12, fp32
// 1e-5 (both backends accumulate in T or double, in different orders;
// CpuBackend evaluates GeLU / softmax / cross-entropy gradients per element in
// double, the GPU in T), TF32 GEMM 1e-2 (10-bit mantissa products).
//
// Without a CUDA device every test but the constructor's error prints "no
// CUDA device: skipped" and is skipped (CTest reports the test as skipped).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "summa/backend/cuda_backend.hpp"
#include "summa/optim/optimizer.hpp"
#include "test_util.hpp"

namespace summa::test {
namespace {

constexpr Order kOrders[] = {Order::col_major, Order::row_major};

template <class T>
double tolerance() {
  return std::is_same_v<T, float> ? 1e-5 : 1e-12;
}

template <class T>
T sentinel() {
  return T(-12345.5);
}

template <class... Parts>
std::string cat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

std::string layout_name(Order o, index_t pad) {
  return std::string(o == Order::col_major ? "col" : "row") + "+" + std::to_string(pad);
}

bool have_device() {
  return CudaBackend::device_count() > 0;
}

// One backend per process (construction allocates workspaces).
CudaBackend& gpu() {
  static CudaBackend backend;
  return backend;
}

class Cuda : public testing::Test {
 protected:
  void SetUp() override {
    if (!have_device()) {
      std::printf("no CUDA device: skipped\n");
      GTEST_SKIP() << "no CUDA device";
    }
  }
};

template <class T>
class CudaTyped : public Cuda {};
using Types = testing::Types<float, double>;
TYPED_TEST_SUITE(CudaTyped, Types);

// ---- Host/device twins ------------------------------------------------------------

// Element-wise comparison of a tensor; NaN / inf must match exactly.
template <class T>
void expect_close(const std::vector<T>& got, const std::vector<T>& want, double tol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double g = got[i], w = want[i];
    if (!std::isfinite(w) || !std::isfinite(g)) {
      EXPECT_TRUE(std::isnan(w) ? std::isnan(g) : g == w)
          << what << ": element " << i << " is " << g << ", want " << w;
      continue;
    }
    diff = std::max(diff, std::abs(g - w));
    scale = std::max(scale, std::abs(w));
  }
  EXPECT_LE(scale > 0 ? diff / scale : diff, tol) << what << " (max abs diff " << diff << ")";
}

// A matrix in a host Block (the CPU backend's operand) and a device copy of
// the Block's whole storage (the GPU backend's), padding included.
template <class T>
class Twin {
 public:
  Twin(index_t rows, index_t cols, Order order, index_t pad, std::mt19937_64& gen)
      : host_(rows, cols, order, pad) {
    std::fill(host_.storage().begin(), host_.storage().end(), sentinel<T>());
    host_.fill(random_matrix<T>(rows, cols, gen));
    upload();
  }
  Twin(const Twin&) = delete;
  Twin& operator=(const Twin&) = delete;
  ~Twin() { gpu().deallocate(device_, bytes()); }

  /// Every element of the view set to x on both sides (e.g. NaN for outputs).
  void fill_value(T x) {
    host_.fill_value(x);
    upload();
  }
  MatrixView<T> h() { return host_.view(); }
  MatrixView<T> d() {
    const MatrixView<T> v = host_.view();
    return MatrixView<T>(device_, v.rows, v.cols, v.ld, v.order);
  }
  /// The device result matches the host one: the view to `tol`, the padding exactly.
  void check(double tol, const std::string& what) {
    std::vector<T> got(host_.storage().size());
    gpu().download(got.data(), device_, bytes());
    const MatrixView<T> v = host_.view();
    const index_t inner = v.order == Order::col_major ? v.rows : v.cols;
    const index_t outer = v.order == Order::col_major ? v.cols : v.rows;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const auto in = static_cast<index_t>(i) % v.ld, out = static_cast<index_t>(i) / v.ld;
      if (in >= inner || out >= outer) {
        ASSERT_EQ(std::memcmp(&got[i], &host_.storage()[i], sizeof(T)), 0)
            << what << ": padding element " << i << " changed";
      }
    }
    expect_close(read<T>(MatrixView<const T>(got.data(), v.rows, v.cols, v.ld, v.order)),
                 read<T>(MatrixView<const T>(host_.view())), tol, what);
  }

 private:
  void upload() {
    if (device_ == nullptr) device_ = static_cast<T*>(gpu().allocate(bytes()));
    gpu().upload(device_, host_.storage().data(), bytes());
  }
  std::size_t bytes() { return host_.storage().size() * sizeof(T); }
  Block<T> host_;
  T* device_ = nullptr;
};

// A host vector and its device copy.
template <class T>
class TwinVec {
 public:
  explicit TwinVec(std::vector<T> values) : host_(std::move(values)) {
    device_ = static_cast<T*>(gpu().allocate(std::max<std::size_t>(bytes(), 1)));
    gpu().upload(device_, host_.data(), bytes());
  }
  TwinVec(const TwinVec&) = delete;
  TwinVec& operator=(const TwinVec&) = delete;
  ~TwinVec() { gpu().deallocate(device_, bytes()); }
  T* h() { return host_.data(); }
  T* d() { return device_; }
  std::vector<T> download() {
    std::vector<T> got(host_.size());
    gpu().download(got.data(), device_, bytes());
    return got;
  }
  void check(double tol, const std::string& what) { expect_close(download(), host_, tol, what); }

 private:
  std::size_t bytes() const { return host_.size() * sizeof(T); }
  std::vector<T> host_;
  T* device_ = nullptr;
};

template <class T>
std::vector<T> random_vector(index_t n, std::mt19937_64& gen, double lo = -1, double hi = 1) {
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<T> v(static_cast<std::size_t>(n));
  for (T& x : v) x = static_cast<T>(dist(gen));
  return v;
}

template <class T>
std::vector<T> nan_vector(index_t n) {
  return std::vector<T>(static_cast<std::size_t>(n), std::numeric_limits<T>::quiet_NaN());
}

// Shapes: odd (scalar path, partial transpose tiles) and multiples of 4 with
// even padding (the 16-byte vector path).
struct Shape {
  index_t rows, cols, pad;
};
constexpr Shape kShapes[] = {{37, 29, 0}, {37, 29, 3}, {24, 64, 0}, {20, 48, 4}};

// ---- GEMM ------------------------------------------------------------------------

template <class T>
Mat<T> op_shape(Op op, index_t rows, index_t cols, std::mt19937_64& gen) {
  return op == Op::N ? random_matrix<T>(rows, cols, gen) : random_matrix<T>(cols, rows, gen);
}

// Every transpose and storage order, padded, beta 0 (C NaN) and beta != 0,
// on `backend`, against CpuBackend.
template <class T>
void gemm_sweep(CudaBackend& backend, index_t m, index_t n, index_t k, double tol,
                const std::string& tag, bool beta_zero_first = true) {
  CpuBackend cpu;
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  for (Op ta : {Op::N, Op::T})
    for (Op tb : {Op::N, Op::T})
      for (Order oa : kOrders)
        for (Order ob : kOrders)
          for (Order oc : kOrders)
            for (T beta : beta_zero_first ? std::vector<T>{T(0), T(-1.25)}
                                          : std::vector<T>{T(-1.25), T(0)}) {
              const index_t ar = ta == Op::N ? m : k, ac = ta == Op::N ? k : m;
              const index_t br = tb == Op::N ? k : n, bc = tb == Op::N ? n : k;
              Twin<T> A(ar, ac, oa, 2, gen), B(br, bc, ob, 1, gen), C(m, n, oc, 3, gen);
              if (beta == T(0)) C.fill_value(std::numeric_limits<T>::quiet_NaN());
              const T alpha = T(0.75);
              cpu.gemm(ta, tb, alpha, A.h(), B.h(), beta, C.h());
              backend.gemm(ta, tb, alpha, A.d(), B.d(), beta, C.d());
              backend.synchronize();  // the twins move data on gpu()'s stream
              C.check(tol, tag + " gemm op " + (ta == Op::N ? "N" : "T") +
                               (tb == Op::N ? "N" : "T") + " A " + layout_name(oa, 2) + " B " +
                               layout_name(ob, 1) + " C " + layout_name(oc, 3) + " beta " +
                               std::to_string(double(beta)));
            }
}

TYPED_TEST(CudaTyped, GemmEveryTransposeAndOrder) {
  using T = TypeParam;
  // With tuning on (the default), the first call of a shape tunes: with
  // beta != 0 the timing runs go to a scratch C, with beta = 0 into C itself.
  gemm_sweep<T>(gpu(), 37, 29, 23, tolerance<T>(), "small", false);
  gemm_sweep<T>(gpu(), 130, 67, 257, tolerance<T>(), "larger");
}

// Tuning on, off and every forced variant: each agrees with the CPU; a tuned
// shape runs its cached choice (repeat calls are bitwise identical) and is
// listed once in the report.
TYPED_TEST(CudaTyped, GemmTuningOnOffAndEveryVariant) {
  using T = TypeParam;
  CudaBackend untuned({.tune_gemm = false});
  gemm_sweep<T>(untuned, 45, 38, 51, tolerance<T>(), "tuning off");
  EXPECT_TRUE(untuned.gemm_tunings().empty());
  CudaBackend tuned({.tune_gemm = true});
  gemm_sweep<T>(tuned, 45, 38, 51, tolerance<T>(), "tuning on");
  // 4 transposes x 8 orders; beta 0 and beta != 0 share an entry.
  EXPECT_EQ(tuned.gemm_tunings().size(), 32u) << tuned.gemm_tuning_report();
  for (const GemmTuning& t : tuned.gemm_tunings()) {
    EXPECT_GE(t.milliseconds[static_cast<int>(GemmVariant::native)], 0.0);
    EXPECT_GE(t.milliseconds[static_cast<int>(t.chosen)], 0.0);
  }
  EXPECT_NE(tuned.gemm_tuning_report().find("native"), std::string::npos);
  for (GemmVariant v : {GemmVariant::native, GemmVariant::transpose_a, GemmVariant::transpose_b,
                        GemmVariant::transpose_both}) {
    CudaOptions options;
    options.force_variant = v;
    CudaBackend forced(options);
    gemm_sweep<T>(forced, 21, 34, 19, tolerance<T>(), std::string("forced ") + to_string(v));
  }

  // Repeat calls of a tuned shape are bitwise identical.
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  Twin<T> A(64, 96, Order::row_major, 0, gen), B(96, 80, Order::col_major, 0, gen);
  Twin<T> C1(64, 80, Order::row_major, 0, gen), C2(64, 80, Order::row_major, 0, gen);
  tuned.gemm(Op::N, Op::N, T(1), A.d(), B.d(), T(0), C1.d());
  tuned.gemm(Op::N, Op::N, T(1), A.d(), B.d(), T(0), C2.d());
  std::vector<T> r1(64 * 80), r2(64 * 80);
  tuned.synchronize();
  gpu().download(r1.data(), C1.d().data, r1.size() * sizeof(T));
  gpu().download(r2.data(), C2.d().data, r2.size() * sizeof(T));
  EXPECT_EQ(std::memcmp(r1.data(), r2.data(), r1.size() * sizeof(T)), 0);
  tuned.set_gemm_tuning(false);
  EXPECT_EQ(tuned.gemm_tunings().size(), 33u);  // kept while off
}

TEST_F(Cuda, GemmTf32) {
  CudaBackend tf32({.allow_tf32 = true});
  gemm_sweep<float>(tf32, 70, 45, 129, 1e-2, "tf32");
}

TYPED_TEST(CudaTyped, GemmDegenerate) {
  using T = TypeParam;
  CpuBackend cpu;
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  for (Order oc : kOrders) {
    // k = 0: C = beta C; beta = 0 writes zeros over NaN.
    Twin<T> A(9, 0, Order::col_major, 0, gen), B(0, 7, Order::row_major, 0, gen);
    Twin<T> C(9, 7, oc, 2, gen);
    cpu.gemm(Op::N, Op::N, T(1), A.h(), B.h(), T(0.5), C.h());
    gpu().gemm(Op::N, Op::N, T(1), A.d(), B.d(), T(0.5), C.d());
    C.check(tolerance<T>(), "k = 0");
    C.fill_value(std::numeric_limits<T>::quiet_NaN());
    cpu.gemm(Op::N, Op::N, T(1), A.h(), B.h(), T(0), C.h());
    gpu().gemm(Op::N, Op::N, T(1), A.d(), B.d(), T(0), C.d());
    C.check(0, "k = 0, beta = 0");
    // alpha = 0 never reads A or B (NaN there).
    Twin<T> A2(9, 5, Order::col_major, 0, gen), B2(5, 7, Order::col_major, 0, gen);
    A2.fill_value(std::numeric_limits<T>::quiet_NaN());
    cpu.gemm(Op::N, Op::N, T(0), A2.h(), B2.h(), T(2), C.h());
    gpu().gemm(Op::N, Op::N, T(0), A2.d(), B2.d(), T(2), C.d());
    C.check(0, "alpha = 0");
  }
}

// ---- copy / axpby / scale / bias / column sums ------------------------------------

TYPED_TEST(CudaTyped, CopyAxpbyScale) {
  using T = TypeParam;
  CpuBackend cpu;
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  const T nan = std::numeric_limits<T>::quiet_NaN();
  for (const Shape& s : kShapes)
    for (Order ox : kOrders)
      for (Order oy : kOrders) {
        const std::string tag = cat(" X ", layout_name(ox, s.pad), " Y ",
                                    layout_name(oy, s.pad + 1), " ", s.rows, "x", s.cols);
        Twin<T> X(s.rows, s.cols, ox, s.pad, gen), Y(s.rows, s.cols, oy, s.pad + 1, gen);
        Twin<T> Z(s.rows, s.cols, oy, s.pad, gen);
        Z.fill_value(nan);
        cpu.copy(X.h(), Z.h());
        gpu().copy(X.d(), Z.d());
        Z.check(0, "copy" + tag);
        cpu.axpby(T(0.5), X.h(), T(-2), Y.h());
        gpu().axpby(T(0.5), X.d(), T(-2), Y.d());
        Y.check(tolerance<T>(), "axpby" + tag);
        Y.fill_value(nan);
        cpu.axpby(T(1.5), X.h(), T(0), Y.h());
        gpu().axpby(T(1.5), X.d(), T(0), Y.d());
        Y.check(tolerance<T>(), "axpby beta 0" + tag);
      }
  for (const Shape& s : kShapes)
    for (Order o : kOrders)
      for (T beta : {T(2.5), T(1), T(0)}) {
        Twin<T> C(s.rows, s.cols, o, s.pad, gen);
        if (beta == T(0)) C.fill_value(nan);
        cpu.scale(beta, C.h());
        gpu().scale(beta, C.d());
        C.check(tolerance<T>(),
                "scale " + std::to_string(double(beta)) + " " + layout_name(o, s.pad));
      }
}

TYPED_TEST(CudaTyped, BiasAndColumnSums) {
  using T = TypeParam;
  CpuBackend cpu;
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  for (const Shape& s : kShapes)
    for (Order o : kOrders) {
      const std::string tag = cat(" ", layout_name(o, s.pad), " ", s.rows, "x", s.cols);
      Twin<T> Y(s.rows, s.cols, o, s.pad, gen);
      TwinVec<T> bias(random_vector<T>(s.cols, gen));
      cpu.add_bias(Y.h(), bias.h());
      gpu().add_bias(Y.d(), bias.d());
      Y.check(tolerance<T>(), "add_bias" + tag);
      TwinVec<T> out(nan_vector<T>(s.cols));
      cpu.column_sums(Y.h(), T(0), out.h());
      gpu().column_sums(Y.d(), T(0), out.d());
      out.check(tolerance<T>(), "column_sums beta 0" + tag);
      TwinVec<T> acc(random_vector<T>(s.cols, gen));
      cpu.column_sums(Y.h(), T(0.5), acc.h());
      gpu().column_sums(Y.d(), T(0.5), acc.d());
      acc.check(tolerance<T>(), "column_sums beta 0.5" + tag);
    }
  // Many rows, few columns (the tiled reduction's long loop), and zero rows.
  for (Order o : kOrders) {
    Twin<T> X(3000, 5, o, 1, gen);
    TwinVec<T> out(nan_vector<T>(5));
    cpu.column_sums(X.h(), T(0), out.h());
    gpu().column_sums(X.d(), T(0), out.d());
    out.check(tolerance<T>() * 10, "column_sums 3000 rows " + layout_name(o, 1));
    Twin<T> E(0, 6, o, 0, gen);
    TwinVec<T> e(random_vector<T>(6, gen));
    cpu.column_sums(E.h(), T(2), e.h());
    gpu().column_sums(E.d(), T(2), e.d());
    e.check(tolerance<T>(), "column_sums 0 rows");
  }
}

// ---- LayerNorm -------------------------------------------------------------------

TYPED_TEST(CudaTyped, LayerNorm) {
  using T = TypeParam;
  CpuBackend cpu;
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  const double tol = tolerance<T>();
  for (const Shape& s : kShapes)
    for (Order ox : kOrders)
      for (Order oy : kOrders) {
        const index_t n = s.rows, c = s.cols, h = 3 * c;  // h: the global hidden size
        const std::string tag =
            cat(" X ", layout_name(ox, s.pad), " Y ", layout_name(oy, 1), " ", n, "x", c);
        Twin<T> X(n, c, ox, s.pad, gen), dY(n, c, oy, 1, gen);
        TwinVec<T> sums(nan_vector<T>(n)), squares(nan_vector<T>(n));
        cpu.layernorm_partial_sums(X.h(), nullptr, sums.h());
        gpu().layernorm_partial_sums(X.d(), nullptr, sums.d());
        sums.check(tol, "layernorm_partial_sums" + tag);
        TwinVec<T> mean(nan_vector<T>(n));
        cpu.layernorm_mean(n, c, sums.h(), mean.h());
        gpu().layernorm_mean(n, c, sums.d(), mean.d());
        mean.check(tol, "layernorm_mean" + tag);
        cpu.layernorm_partial_sums(X.h(), mean.h(), squares.h());
        gpu().layernorm_partial_sums(X.d(), mean.d(), squares.d());
        squares.check(tol, "layernorm_partial_sums centred" + tag);
        TwinVec<T> rstd(nan_vector<T>(n));
        cpu.layernorm_rstd(n, c, 1e-5, squares.h(), rstd.h());
        gpu().layernorm_rstd(n, c, 1e-5, squares.d(), rstd.d());
        rstd.check(tol, "layernorm_rstd" + tag);
        // In place, as LayerNorm2D may call it.
        TwinVec<T> inplace(random_vector<T>(n, gen, 0.5, 2));
        cpu.layernorm_rstd(n, h, 1e-5, inplace.h(), inplace.h());
        gpu().layernorm_rstd(n, h, 1e-5, inplace.d(), inplace.d());
        inplace.check(tol, "layernorm_rstd in place" + tag);

        TwinVec<T> gamma(random_vector<T>(c, gen)), beta(random_vector<T>(c, gen));
        Twin<T> Y(n, c, oy, s.pad, gen);
        Y.fill_value(std::numeric_limits<T>::quiet_NaN());
        cpu.layernorm_apply(X.h(), mean.h(), rstd.h(), gamma.h(), beta.h(), Y.h());
        gpu().layernorm_apply(X.d(), mean.d(), rstd.d(), gamma.d(), beta.d(), Y.d());
        Y.check(tol, "layernorm_apply" + tag);

        TwinVec<T> a(nan_vector<T>(n)), b(nan_vector<T>(n));
        cpu.layernorm_backward_partials(X.h(), dY.h(), mean.h(), rstd.h(), gamma.h(), a.h(), b.h());
        gpu().layernorm_backward_partials(X.d(), dY.d(), mean.d(), rstd.d(), gamma.d(), a.d(),
                                          b.d());
        a.check(tol, "layernorm_backward_partials a" + tag);
        b.check(tol, "layernorm_backward_partials b" + tag);

        Twin<T> dX(n, c, ox, 2, gen);
        dX.fill_value(std::numeric_limits<T>::quiet_NaN());
        cpu.layernorm_backward_apply(X.h(), dY.h(), mean.h(), rstd.h(), gamma.h(), a.h(), b.h(), h,
                                     dX.h());
        gpu().layernorm_backward_apply(X.d(), dY.d(), mean.d(), rstd.d(), gamma.d(), a.d(), b.d(),
                                       h, dX.d());
        dX.check(tol * 10, "layernorm_backward_apply" + tag);  // cancellation in g h - a - xhat b

        TwinVec<T> dgamma(nan_vector<T>(c)), dbeta(nan_vector<T>(c));
        cpu.layernorm_param_partials(X.h(), dY.h(), mean.h(), rstd.h(), dgamma.h(), dbeta.h());
        gpu().layernorm_param_partials(X.d(), dY.d(), mean.d(), rstd.d(), dgamma.d(), dbeta.d());
        dgamma.check(tol, "layernorm_param_partials dgamma" + tag);
        dbeta.check(tol, "layernorm_param_partials dbeta" + tag);
      }
}

// ---- GeLU and softmax ------------------------------------------------------------

TYPED_TEST(CudaTyped, Gelu) {
  using T = TypeParam;
  CpuBackend cpu;
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  for (const Shape& s : kShapes)
    for (Order ox : kOrders)
      for (Order oy : kOrders) {
        const std::string tag =
            cat(" X ", layout_name(ox, s.pad), " Y ", layout_name(oy, 0), " ", s.rows, "x", s.cols);
        Twin<T> X(s.rows, s.cols, ox, s.pad, gen), dY(s.rows, s.cols, oy, 0, gen);
        Twin<T> Y(s.rows, s.cols, oy, 0, gen);
        Y.fill_value(std::numeric_limits<T>::quiet_NaN());
        cpu.gelu_forward(X.h(), Y.h());
        gpu().gelu_forward(X.d(), Y.d());
        Y.check(tolerance<T>(), "gelu_forward" + tag);
        Twin<T> dX(s.rows, s.cols, ox, 1, gen);
        dX.fill_value(std::numeric_limits<T>::quiet_NaN());
        cpu.gelu_backward(X.h(), dY.h(), dX.h());
        gpu().gelu_backward(X.d(), dY.d(), dX.d());
        dX.check(tolerance<T>(), "gelu_backward" + tag);
        // In place: dX = dY, Y = X.
        cpu.gelu_backward(X.h(), dY.h(), dY.h());
        gpu().gelu_backward(X.d(), dY.d(), dY.d());
        dY.check(tolerance<T>(), "gelu_backward in place" + tag);
        cpu.gelu_forward(X.h(), X.h());
        gpu().gelu_forward(X.d(), X.d());
        X.check(tolerance<T>(), "gelu_forward in place" + tag);
      }
}

TYPED_TEST(CudaTyped, SoftmaxCausal) {
  using T = TypeParam;
  CpuBackend cpu;
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  for (index_t s : {index_t(1), index_t(33), index_t(64), index_t(200)})
    for (Order os : kOrders)
      for (Order op : kOrders)
        for (index_t pad : {index_t(0), index_t(3)}) {
          const std::string tag =
              cat(" S ", layout_name(os, pad), " P ", layout_name(op, 1), " s=", s);
          const double scale = 1.7;
          Twin<T> S(s, s, os, pad, gen), P(s, s, op, 1, gen), dP(s, s, op, pad, gen);
          P.fill_value(std::numeric_limits<T>::quiet_NaN());
          cpu.softmax_causal(S.h(), scale, P.h());
          gpu().softmax_causal(S.d(), scale, P.d());
          P.check(tolerance<T>(), "softmax_causal" + tag);
          Twin<T> dS(s, s, os, 2, gen);
          dS.fill_value(std::numeric_limits<T>::quiet_NaN());
          cpu.softmax_causal_backward(P.h(), dP.h(), scale, dS.h());
          gpu().softmax_causal_backward(P.d(), dP.d(), scale, dS.d());
          dS.check(tolerance<T>(), "softmax_causal_backward" + tag);
          // In place: dS = dP, P = S.
          cpu.softmax_causal_backward(P.h(), dP.h(), scale, dP.h());
          gpu().softmax_causal_backward(P.d(), dP.d(), scale, dP.d());
          dP.check(tolerance<T>(), "softmax_causal_backward in place" + tag);
          cpu.softmax_causal(S.h(), scale, S.h());
          gpu().softmax_causal(S.d(), scale, S.d());
          S.check(tolerance<T>(), "softmax_causal in place" + tag);
        }
}

// ---- Cross-entropy ------------------------------------------------------------------

TYPED_TEST(CudaTyped, CrossEntropy) {
  using T = TypeParam;
  CpuBackend cpu;
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  const index_t col0 = 100;
  for (const Shape& s : {Shape{37, 29, 3}, Shape{24, 64, 0}, Shape{16, 5000, 4}})
    for (Order o : kOrders) {
      const index_t n = s.rows, v = s.cols;
      const std::string tag = cat(" Z ", layout_name(o, s.pad), " ", n, "x", v);
      Twin<T> Z(n, v, o, s.pad, gen);
      // Targets: local ones, and global ids left and right of the block.
      std::uniform_int_distribution<int> pick(0, static_cast<int>(col0 + v + 50));
      std::vector<std::int32_t> targets(static_cast<std::size_t>(n));
      for (auto& t : targets) t = pick(gen);
      targets[0] = static_cast<std::int32_t>(col0);
      TwinVec<std::int32_t> tgt(targets);
      TwinVec<T> mx(nan_vector<T>(n)), sum(nan_vector<T>(n)), picked(nan_vector<T>(n));
      cpu.row_max(Z.h(), mx.h());
      gpu().row_max(Z.d(), mx.d());
      mx.check(0, "row_max" + tag);
      cpu.row_sum_exp(Z.h(), mx.h(), sum.h());
      gpu().row_sum_exp(Z.d(), mx.d(), sum.d());
      sum.check(tolerance<T>(), "row_sum_exp" + tag);
      cpu.pick_targets(Z.h(), tgt.h(), col0, picked.h());
      gpu().pick_targets(Z.d(), tgt.d(), col0, picked.d());
      picked.check(0, "pick_targets" + tag);
      const double want = cpu.cross_entropy_sum(n, mx.h(), sum.h(), picked.h());
      const double got = gpu().cross_entropy_sum(n, mx.d(), sum.d(), picked.d());
      EXPECT_NEAR(got, want, 1e-12 * std::abs(want) + 1e-12) << "cross_entropy_sum" << tag;
      cpu.cross_entropy_grad(Z.h(), mx.h(), sum.h(), tgt.h(), col0, 0.25);
      gpu().cross_entropy_grad(Z.d(), mx.d(), sum.d(), tgt.d(), col0, 0.25);
      Z.check(tolerance<T>(), "cross_entropy_grad" + tag);
    }
  // An empty local block: max -inf; the sum of no rows is 0.
  Twin<T> E(4, 0, Order::row_major, 0, gen);
  TwinVec<T> mx(nan_vector<T>(4));
  cpu.row_max(E.h(), mx.h());
  gpu().row_max(E.d(), mx.d());
  mx.check(0, "row_max of no columns");
  EXPECT_EQ(gpu().cross_entropy_sum(0, mx.d(), mx.d(), mx.d()), 0.0);
}

// ---- Embedding rows ----------------------------------------------------------------

TYPED_TEST(CudaTyped, GatherScatterRows) {
  using T = TypeParam;
  CpuBackend cpu;
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  const index_t row0 = 40, table_rows = 30;
  // n = 4500 rows spans three of the kernel's id chunks (2048 ids each).
  for (index_t n : {index_t(57), index_t(4500)})
    for (index_t cols : {index_t(29), index_t(64)})
      for (Order ot : kOrders)
        for (Order oo : kOrders) {
          const std::string tag = cat(" table ", layout_name(ot, 0), " out ", layout_name(oo, 4),
                                      " cols ", cols, " rows ", n);
          std::uniform_int_distribution<int> pick(0, static_cast<int>(row0 + table_rows + 20));
          std::vector<std::int32_t> ids(static_cast<std::size_t>(n));
          for (auto& id : ids) id = pick(gen);  // repeats, and ids outside the block
          ids[1] = ids[0] = static_cast<std::int32_t>(row0 + 3);
          TwinVec<std::int32_t> idv(ids);
          Twin<T> table(table_rows, cols, ot, 0, gen), out(n, cols, oo, 4, gen);
          out.fill_value(std::numeric_limits<T>::quiet_NaN());
          cpu.gather_rows(idv.h(), row0, table.h(), false, out.h());
          gpu().gather_rows(idv.d(), row0, table.d(), false, out.d());
          out.check(0, "gather_rows" + tag);
          cpu.gather_rows(idv.h(), row0, table.h(), true, out.h());
          gpu().gather_rows(idv.d(), row0, table.d(), true, out.d());
          out.check(tolerance<T>(), "gather_rows accumulate" + tag);
          // Repeated ids accumulate in row order, like the CPU: the same bits.
          cpu.scatter_add_rows(idv.h(), row0, out.h(), table.h());
          gpu().scatter_add_rows(idv.d(), row0, out.d(), table.d());
          table.check(0, "scatter_add_rows" + tag);
        }
}

// ---- Optimizer kernels and helpers ----------------------------------------------------

TYPED_TEST(CudaTyped, OptimizerKernels) {
  using T = TypeParam;
  using M = master_t<T>;
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  const index_t n = 10007;
  TwinVec<T> param(random_vector<T>(n, gen)), grad(random_vector<T>(n, gen));
  TwinVec<M> m(random_vector<M>(n, gen)), v(random_vector<M>(n, gen, 0, 1));
  const optim::AdamWCoefficients c{.lr = 1e-2,
                                   .weight_decay = 0.1,
                                   .beta1 = 0.9,
                                   .beta2 = 0.95,
                                   .eps = 1e-8,
                                   .step_size = 1e-2 / (1 - 0.9 * 0.9),
                                   .bias_correction2_sqrt = std::sqrt(1 - 0.95 * 0.95)};
  optim::adamw_update(param.h(), grad.h(), m.h(), v.h(), n, c);
  cuda::adamw_update(param.d(), grad.d(), m.d(), v.d(), n, c, gpu().stream());
  gpu().synchronize();
  param.check(tolerance<T>(), "adamw param");
  m.check(tolerance<T>(), "adamw exp_avg");
  v.check(tolerance<T>(), "adamw exp_avg_sq");
  for (bool nesterov : {false, true}) {
    TwinVec<M> buf(random_vector<M>(n, gen));
    const optim::SgdCoefficients s{
        .lr = 0.05, .weight_decay = 0.01, .momentum = 0.9, .nesterov = nesterov};
    optim::sgd_update(param.h(), grad.h(), buf.h(), n, s);
    cuda::sgd_update(param.d(), grad.d(), buf.d(), n, s, gpu().stream());
    gpu().synchronize();
    param.check(tolerance<T>(), nesterov ? "sgd nesterov param" : "sgd param");
    buf.check(tolerance<T>(), "sgd momentum buffer");
  }
  // Σx² of what the device holds, summed on the host in order (double
  // accumulation either way: only the order differs).
  const std::vector<T> now = param.download();
  const double want = optim::sum_of_squares(now.data(), n);
  EXPECT_NEAR(gpu().sum_of_squares(param.d(), n), want, 1e-12 * want);
  // A row-major 97 x 100 block with leading dimension 103 (clipping's shard
  // pieces): only the block's elements, in one call.
  const index_t rows = 97, cols = 100, ld = 103;
  double want_block = 0;
  for (index_t r = 0; r < rows; ++r) want_block += optim::sum_of_squares(now.data() + r * ld, cols);
  EXPECT_NEAR(gpu().sum_of_squares(param.d(), rows, cols, ld), want_block, 1e-12 * want_block);
  EXPECT_THROW(gpu().sum_of_squares(param.d(), rows, cols, cols - 1), Error);
  optim::scale_in_place(param.h(), n, 0.37);
  gpu().scale_in_place(param.d(), n, 0.37);
  param.check(tolerance<T>(), "scale_in_place");
  EXPECT_EQ(gpu().sum_of_squares(param.d(), 0), 0.0);
}

// ---- Errors -------------------------------------------------------------------------------

// ---- bf16 (mixed precision) ------------------------------------------------------------
// Every bf16 op of CudaBackend against CpuBackend's bf16 op on the same
// inputs (random values rounded to bf16). Both compute in fp32 and round each
// stored element once, but their fp32 values differ by summation order (and
// the GPU evaluates GeLU / softmax / exp in fp32 where the CPU uses double),
// so a bf16 output may land one bf16 unit apart: |gpu - cpu| <= 2^-7 |cpu| +
// 1e-5 max|cpu| per element (one unit in the last of 8 bits plus the fp32
// slack). fp32 outputs (statistics): 1e-5 relative to max|cpu| as for float;
// copies, conversions, row_max, pick_targets and gather: exact.

float bf16_value(bf16 x) {
  return static_cast<float>(x);
}

void expect_bf16_close(const std::vector<bf16>& got, const std::vector<bf16>& want,
                       const std::string& what, bool exact = false) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0;
  for (bf16 w : want)
    if (std::isfinite(bf16_value(w))) scale = std::max(scale, double(std::abs(bf16_value(w))));
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double g = bf16_value(got[i]), w = bf16_value(want[i]);
    if (!std::isfinite(w) || !std::isfinite(g)) {
      EXPECT_TRUE(std::isnan(w) ? std::isnan(g) : g == w)
          << what << ": element " << i << " is " << g << ", want " << w;
      continue;
    }
    const double tol = exact ? 0.0 : std::abs(w) / 128 + 1e-5 * scale;
    EXPECT_LE(std::abs(g - w), tol) << what << ": element " << i << " is " << g << ", want " << w;
  }
}

// A bf16 matrix in a host Block and a device copy of its whole storage.
class Bf16Twin {
 public:
  Bf16Twin(index_t rows, index_t cols, Order order, index_t pad, std::mt19937_64& gen,
           double scale = 1.0)
      : host_(rows, cols, order, pad) {
    std::fill(host_.storage().begin(), host_.storage().end(), bf16(-12345.5f));
    std::uniform_real_distribution<double> dist(-scale, scale);
    const MatrixView<bf16> v = host_.view();
    for (index_t j = 0; j < cols; ++j)
      for (index_t i = 0; i < rows; ++i) v(i, j) = bf16(dist(gen));
    device_ = static_cast<bf16*>(gpu().allocate(bytes()));
    upload();
  }
  Bf16Twin(const Bf16Twin&) = delete;
  Bf16Twin& operator=(const Bf16Twin&) = delete;
  ~Bf16Twin() { gpu().deallocate(device_, bytes()); }
  void fill_value(bf16 x) {
    host_.fill_value(x);
    upload();
  }
  MatrixView<bf16> h() { return host_.view(); }
  MatrixView<bf16> d() {
    const MatrixView<bf16> v = host_.view();
    return MatrixView<bf16>(device_, v.rows, v.cols, v.ld, v.order);
  }
  /// The device view matches the host one (see expect_bf16_close); padding exactly.
  void check(const std::string& what, bool exact = false) {
    std::vector<bf16> got(host_.storage().size());
    gpu().download(got.data(), device_, bytes());
    for (std::size_t i = 0; i < got.size(); ++i)
      if (!in_view(i)) {
        ASSERT_EQ(got[i].bits, host_.storage()[i].bits) << what << ": padding " << i << " changed";
      }
    std::vector<bf16> g, w;
    for (std::size_t i = 0; i < got.size(); ++i)
      if (in_view(i)) {
        g.push_back(got[i]);
        w.push_back(host_.storage()[i]);
      }
    expect_bf16_close(g, w, what, exact);
  }

 private:
  bool in_view(std::size_t i) {
    const MatrixView<bf16> v = host_.view();
    const index_t inner = v.order == Order::col_major ? v.rows : v.cols;
    const index_t outer = v.order == Order::col_major ? v.cols : v.rows;
    const auto in = static_cast<index_t>(i) % v.ld, out = static_cast<index_t>(i) / v.ld;
    return in < inner && out < outer;
  }
  void upload() { gpu().upload(device_, host_.storage().data(), bytes()); }
  std::size_t bytes() { return host_.storage().size() * sizeof(bf16); }
  Block<bf16> host_;
  bf16* device_ = nullptr;
};

std::vector<bf16> random_bf16(index_t n, std::mt19937_64& gen, double lo = -1, double hi = 1) {
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<bf16> v(static_cast<std::size_t>(n));
  for (bf16& x : v) x = bf16(dist(gen));
  return v;
}

void expect_bf16_vec(TwinVec<bf16>& v, const std::string& what, bool exact = false) {
  expect_bf16_close(v.download(), std::vector<bf16>(v.h(), v.h() + v.download().size()), what,
                    exact);
}

// Shapes: odd (scalar path) and multiples of 8 with padding 0 or 8 (the
// 16-byte = 8-element vector path).
constexpr Shape kBf16Shapes[] = {{37, 29, 0}, {37, 29, 3}, {24, 64, 0}, {16, 48, 8}};

TEST_F(Cuda, Bf16GemmEveryTransposeAndOrder) {
  CpuBackend cpu;
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  for (auto [m, n, k] : {std::tuple<index_t, index_t, index_t>{37, 29, 23}, {64, 40, 300}})
    for (Op ta : {Op::N, Op::T})
      for (Op tb : {Op::N, Op::T})
        for (Order oa : kOrders)
          for (Order ob : kOrders)
            for (Order oc : kOrders)
              for (float beta : {0.0f, -1.25f}) {
                Bf16Twin A(ta == Op::N ? m : k, ta == Op::N ? k : m, oa, 2, gen);
                Bf16Twin B(tb == Op::N ? k : n, tb == Op::N ? n : k, ob, 1, gen);
                Bf16Twin C(m, n, oc, 3, gen);
                if (beta == 0.0f) C.fill_value(bf16(std::numeric_limits<float>::quiet_NaN()));
                cpu.gemm(ta, tb, 0.75f, A.h(), B.h(), beta, C.h());
                gpu().gemm(ta, tb, 0.75f, A.d(), B.d(), beta, C.d());
                C.check(cat("bf16 gemm k ", k, " op ", int(ta), int(tb), " orders ", int(oa),
                            int(ob), int(oc), " beta ", beta));
              }
  // Tuning keys on DType::bf16.
  bool seen = false;
  for (const GemmTuning& t : gpu().gemm_tunings()) seen = seen || t.dtype == DType::bf16;
  EXPECT_TRUE(seen) << gpu().gemm_tuning_report();
}

TEST_F(Cuda, Bf16ElementwiseAndReductions) {
  CpuBackend cpu;
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  const bf16 nan(std::numeric_limits<float>::quiet_NaN());
  for (const Shape& sh : kBf16Shapes)
    for (Order ox : kOrders)
      for (Order oy : kOrders) {
        const std::string tag = cat(" ", sh.rows, "x", sh.cols, " ", layout_name(ox, sh.pad), "/",
                                    layout_name(oy, sh.pad));
        const index_t r = sh.rows, c = sh.cols;
        Bf16Twin X(r, c, ox, sh.pad, gen, 3.0), Y(r, c, oy, sh.pad, gen), D(r, c, oy, sh.pad, gen);
        cpu.copy(X.h(), Y.h());
        gpu().copy(X.d(), Y.d());
        Y.check("copy" + tag, true);
        cpu.axpby(0.5f, X.h(), -2.0f, Y.h());
        gpu().axpby(0.5f, X.d(), -2.0f, Y.d());
        Y.check("axpby" + tag);
        Y.fill_value(nan);
        cpu.axpby(1.5f, X.h(), 0.0f, Y.h());
        gpu().axpby(1.5f, X.d(), 0.0f, Y.d());
        Y.check("axpby beta 0" + tag);
        cpu.scale(-0.3f, Y.h());
        gpu().scale(-0.3f, Y.d());
        Y.check("scale" + tag);
        // convert both ways through an fp32 twin.
        Twin<float> F(r, c, ox, sh.pad, gen);
        cpu.convert(ConstMatrixView<float>(F.h()), Y.h());
        gpu().convert(ConstMatrixView<float>(F.d()), Y.d());
        Y.check("convert to bf16" + tag, true);
        cpu.convert(ConstMatrixView<bf16>(X.h()), F.h());
        gpu().convert(ConstMatrixView<bf16>(X.d()), F.d());
        F.check(0, "convert to float" + tag);

        TwinVec<bf16> bias(random_bf16(c, gen)), sums(random_bf16(c, gen));
        cpu.add_bias(Y.h(), bias.h());
        gpu().add_bias(Y.d(), bias.d());
        Y.check("add_bias" + tag);
        cpu.column_sums(X.h(), 0.5f, sums.h());
        gpu().column_sums(X.d(), 0.5f, sums.d());
        expect_bf16_vec(sums, "column_sums" + tag);

        // LayerNorm with fp32 statistics.
        TwinVec<float> s1(nan_vector<float>(r)), s2(nan_vector<float>(r)),
            mean(nan_vector<float>(r)), rstd(nan_vector<float>(r)), pa(nan_vector<float>(r)),
            pb(nan_vector<float>(r));
        TwinVec<bf16> gamma(random_bf16(c, gen, 0.5, 1.5)), beta(random_bf16(c, gen));
        TwinVec<bf16> dgamma(std::vector<bf16>(static_cast<std::size_t>(c), nan)),
            dbeta(std::vector<bf16>(static_cast<std::size_t>(c), nan));
        cpu.layernorm_partial_sums(X.h(), nullptr, s1.h());
        gpu().layernorm_partial_sums(X.d(), nullptr, s1.d());
        s1.check(1e-5, "layernorm sums" + tag);
        cpu.layernorm_mean(r, c, s1.h(), mean.h());
        gpu().upload(mean.d(), mean.h(), static_cast<std::size_t>(r) * sizeof(float));
        cpu.layernorm_partial_sums(X.h(), mean.h(), s2.h());
        gpu().layernorm_partial_sums(X.d(), mean.d(), s2.d());
        s2.check(1e-5, "layernorm squares" + tag);
        cpu.layernorm_rstd(r, c, 1e-5, s2.h(), rstd.h());
        gpu().upload(rstd.d(), rstd.h(), static_cast<std::size_t>(r) * sizeof(float));
        cpu.layernorm_apply(X.h(), mean.h(), rstd.h(), gamma.h(), beta.h(), Y.h());
        gpu().layernorm_apply(X.d(), mean.d(), rstd.d(), gamma.d(), beta.d(), Y.d());
        Y.check("layernorm_apply" + tag);
        cpu.layernorm_backward_partials(X.h(), D.h(), mean.h(), rstd.h(), gamma.h(), pa.h(),
                                        pb.h());
        gpu().layernorm_backward_partials(X.d(), D.d(), mean.d(), rstd.d(), gamma.d(), pa.d(),
                                          pb.d());
        pa.check(1e-5, "layernorm partial a" + tag);
        pb.check(1e-5, "layernorm partial b" + tag);
        gpu().upload(pa.d(), pa.h(), static_cast<std::size_t>(r) * sizeof(float));
        gpu().upload(pb.d(), pb.h(), static_cast<std::size_t>(r) * sizeof(float));
        cpu.layernorm_backward_apply(X.h(), D.h(), mean.h(), rstd.h(), gamma.h(), pa.h(), pb.h(), c,
                                     Y.h());
        gpu().layernorm_backward_apply(X.d(), D.d(), mean.d(), rstd.d(), gamma.d(), pa.d(), pb.d(),
                                       c, Y.d());
        Y.check("layernorm_backward_apply" + tag);
        cpu.layernorm_param_partials(X.h(), D.h(), mean.h(), rstd.h(), dgamma.h(), dbeta.h());
        gpu().layernorm_param_partials(X.d(), D.d(), mean.d(), rstd.d(), dgamma.d(), dbeta.d());
        expect_bf16_vec(dgamma, "dgamma" + tag);
        expect_bf16_vec(dbeta, "dbeta" + tag);

        // GeLU and the causal softmax (square blocks use the first min(r, c) columns).
        cpu.gelu_forward(X.h(), Y.h());
        gpu().gelu_forward(X.d(), Y.d());
        Y.check("gelu_forward" + tag);
        cpu.gelu_backward(X.h(), D.h(), Y.h());
        gpu().gelu_backward(X.d(), D.d(), Y.d());
        Y.check("gelu_backward" + tag);
        cpu.softmax_causal(X.h(), 0.7, Y.h());
        gpu().softmax_causal(X.d(), 0.7, Y.d());
        Y.check("softmax_causal" + tag);
        cpu.softmax_causal_backward(Y.h(), D.h(), 0.7, D.h());
        gpu().softmax_causal_backward(Y.d(), D.d(), 0.7, D.d());
        D.check("softmax_causal_backward (in place)" + tag);
      }
}

TEST_F(Cuda, Bf16CrossEntropyEmbeddingOptimizer) {
  CpuBackend cpu;
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  for (const Shape& sh : kBf16Shapes)
    for (Order o : kOrders) {
      const std::string tag = cat(" ", sh.rows, "x", sh.cols, " ", layout_name(o, sh.pad));
      const index_t n = sh.rows, cols = sh.cols, col0 = 10;
      Bf16Twin Z(n, cols, o, sh.pad, gen, 5.0);
      std::vector<std::int32_t> targets(static_cast<std::size_t>(n));
      std::uniform_int_distribution<std::int32_t> td(5, static_cast<std::int32_t>(col0 + cols + 4));
      for (auto& t : targets) t = td(gen);
      TwinVec<std::int32_t> tv(targets);
      TwinVec<float> mx(nan_vector<float>(n)), sum(nan_vector<float>(n)), pk(nan_vector<float>(n));
      cpu.row_max(Z.h(), mx.h());
      gpu().row_max(Z.d(), mx.d());
      mx.check(0, "row_max" + tag);
      cpu.row_sum_exp(Z.h(), mx.h(), sum.h());
      gpu().row_sum_exp(Z.d(), mx.d(), sum.d());
      sum.check(1e-5, "row_sum_exp" + tag);
      gpu().upload(sum.d(), sum.h(), static_cast<std::size_t>(n) * sizeof(float));
      cpu.pick_targets(Z.h(), tv.h(), col0, pk.h());
      gpu().pick_targets(Z.d(), tv.d(), col0, pk.d());
      pk.check(0, "pick_targets" + tag);
      cpu.cross_entropy_grad(Z.h(), mx.h(), sum.h(), tv.h(), col0, 0.25);
      gpu().cross_entropy_grad(Z.d(), mx.d(), sum.d(), tv.d(), col0, 0.25);
      Z.check("cross_entropy_grad" + tag);

      // Embedding rows: ids below, inside (repeated) and above the block.
      const index_t vrows = 9, row0 = 30;
      std::vector<std::int32_t> ids(static_cast<std::size_t>(n));
      std::uniform_int_distribution<std::int32_t> idd(row0 - 3, row0 + vrows + 2);
      for (auto& id : ids) id = idd(gen);
      TwinVec<std::int32_t> idv(ids);
      Bf16Twin table(vrows, cols, o, sh.pad, gen), out(n, cols, o, sh.pad, gen);
      cpu.gather_rows(idv.h(), row0, table.h(), false, out.h());
      gpu().gather_rows(idv.d(), row0, table.d(), false, out.d());
      out.check("gather_rows" + tag, true);
      cpu.gather_rows(idv.h(), row0, table.h(), true, out.h());
      gpu().gather_rows(idv.d(), row0, table.d(), true, out.d());
      out.check("gather_rows accumulate" + tag, true);
      // Repeated ids add in row order, each addition rounded once, like the
      // CPU: the same bits (replicated embedding gradients stay identical).
      Bf16Twin src(n, cols, o, sh.pad, gen);
      cpu.scatter_add_rows(idv.h(), row0, src.h(), table.h());
      gpu().scatter_add_rows(idv.d(), row0, src.d(), table.d());
      std::vector<bf16> got(static_cast<std::size_t>(table.h().ld) *
                            static_cast<std::size_t>(o == Order::col_major ? cols : vrows));
      gpu().download(got.data(), table.d().data, got.size() * sizeof(bf16));
      const MatrixView<bf16> gv(got.data(), vrows, cols, table.h().ld, o);
      for (index_t t = 0; t < vrows; ++t)
        for (index_t c = 0; c < cols; ++c)
          EXPECT_EQ(bf16_value(gv(t, c)), bf16_value(table.h()(t, c)))
              << "scatter_add_rows" << tag << " row " << t;
    }

  // Optimizer ops with fp32 master weights (fp32 arithmetic on both sides:
  // master and state to 1e-5, parameters one bf16 unit).
  const index_t n = 1001;
  TwinVec<bf16> param(random_bf16(n, gen)), grad(random_bf16(n, gen));
  std::vector<float> master0;
  for (index_t i = 0; i < n; ++i) master0.push_back(bf16_value(param.h()[i]));
  const std::vector<float> zeros(static_cast<std::size_t>(n), 0.0f);
  TwinVec<float> master(master0), m(zeros), v(zeros);
  optim::AdamWCoefficients ac;
  ac.lr = 1e-2;
  ac.weight_decay = 0.1;
  ac.beta1 = 0.9;
  ac.beta2 = 0.999;
  ac.eps = 1e-8;
  ac.step_size = 1e-2;
  ac.bias_correction2_sqrt = 0.05;
  cpu.adamw_update(param.h(), grad.h(), m.h(), v.h(), master.h(), n, ac);
  gpu().adamw_update(param.d(), grad.d(), m.d(), v.d(), master.d(), n, ac);
  master.check(1e-5, "adamw master");
  m.check(1e-5, "adamw exp_avg");
  v.check(1e-5, "adamw exp_avg_sq");
  expect_bf16_vec(param, "adamw param");
  optim::SgdCoefficients sc;
  sc.lr = 0.05;
  sc.momentum = 0.9;
  sc.nesterov = true;
  sc.weight_decay = 0.01;
  cpu.sgd_update(param.h(), grad.h(), m.h(), master.h(), n, sc);
  gpu().sgd_update(param.d(), grad.d(), m.d(), master.d(), n, sc);
  master.check(1e-5, "sgd master");
  expect_bf16_vec(param, "sgd param");
  EXPECT_NEAR(gpu().sum_of_squares(grad.d(), n), cpu.sum_of_squares(grad.h(), n),
              1e-12 * cpu.sum_of_squares(grad.h(), n));
  cpu.scale_in_place(grad.h(), n, 0.37);
  gpu().scale_in_place(grad.d(), n, 0.37);
  expect_bf16_vec(grad, "scale_in_place", true);
}

template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// ---- gemm_strided_batched ------------------------------------------------------
// Against CpuBackend's batched op (itself checked against a gemm() loop in
// test_backend): every transpose and order, batch 0/1/3, dense views one after
// another and padded views side by side within ld with a shared B (stride 0).
// The whole C buffer comes back: elements outside every C_b exactly, the rest
// to max |gpu - cpu| / max |cpu| <= tol (fp32 1e-5, fp64 1e-12, bf16 1e-2:
// fp32 accumulation in another order, then one bf16 rounding, 2^-8 relative).
template <class T>
void batched_sweep_gpu(double tol) {
  CpuBackend cpu;
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  using S = acc_t<T>;
  const index_t m = 19, n = 13, k = 11;
  for (index_t batch : {index_t(0), index_t(1), index_t(3)})
    for (Op ta : {Op::N, Op::T})
      for (Op tb : {Op::N, Op::T})
        for (Order oa : kOrders)
          for (Order ob : kOrders)
            for (Order oc : kOrders)
              for (int layout = 0; layout < 2; ++layout)
                for (S beta : {S(0), S(-1.25)}) {
                  const index_t ar = ta == Op::N ? m : k, ac = ta == Op::N ? k : m;
                  const index_t br = tb == Op::N ? k : n, bc = tb == Op::N ? n : k;
                  const index_t a_in = oa == Order::col_major ? ar : ac;
                  const index_t b_in = ob == Order::col_major ? br : bc;
                  const index_t c_in = oc == Order::col_major ? m : n;
                  const index_t lda = layout == 0 ? a_in : a_in + 3 * (a_in + 1);
                  const index_t ldb = layout == 0 ? b_in : b_in + 2;
                  const index_t ldc = layout == 0 ? c_in : c_in + 3 * (c_in + 1);
                  const index_t sa = layout == 0 ? ar * ac + 2 : a_in + 1;
                  const index_t sb = layout == 0 ? br * bc : 0;
                  const index_t sc = layout == 0 ? m * n + 1 : c_in + 1;
                  auto size = [&](index_t r, index_t c, Order o, index_t ld, index_t s) {
                    return (o == Order::col_major ? c : r) * ld + 2 * s + 1;
                  };
                  TwinVec<T> A(random_vector<T>(size(ar, ac, oa, lda, sa), gen));
                  TwinVec<T> B(random_vector<T>(size(br, bc, ob, ldb, sb), gen));
                  TwinVec<T> C(random_vector<T>(size(m, n, oc, ldc, sc), gen));
                  auto view = [](T* p, index_t r, index_t c, index_t ld, Order o) {
                    return MatrixView<T>(p, r, c, ld, o);
                  };
                  cpu.gemm_strided_batched(ta, tb, S(0.75), view(A.h(), ar, ac, lda, oa), sa,
                                           view(B.h(), br, bc, ldb, ob), sb, beta,
                                           view(C.h(), m, n, ldc, oc), sc, batch);
                  gpu().gemm_strided_batched(ta, tb, S(0.75), view(A.d(), ar, ac, lda, oa), sa,
                                             view(B.d(), br, bc, ldb, ob), sb, beta,
                                             view(C.d(), m, n, ldc, oc), sc, batch);
                  const std::vector<T> got = C.download();
                  const std::string what =
                      cat("batched batch ", batch, " op ", int(ta), int(tb), " orders ", int(oa),
                          int(ob), int(oc), " layout ", layout, " beta ", double(beta));
                  std::vector<char> in_view(got.size(), 0);
                  for (index_t b = 0; b < batch; ++b)
                    for (index_t i = 0; i < m; ++i)
                      for (index_t j = 0; j < n; ++j)
                        in_view[static_cast<std::size_t>(
                            b * sc + (oc == Order::col_major ? i + j * ldc : i * ldc + j))] = 1;
                  double diff = 0, scale = 0;
                  for (std::size_t i = 0; i < got.size(); ++i) {
                    if (!in_view[i]) {
                      ASSERT_EQ(std::memcmp(&got[i], C.h() + i, sizeof(T)), 0)
                          << what << ": element " << i << " outside every C_b changed";
                      continue;
                    }
                    diff = std::max(diff, std::abs(double(got[i]) - double(C.h()[i])));
                    scale = std::max(scale, std::abs(double(C.h()[i])));
                  }
                  EXPECT_LE(scale > 0 ? diff / scale : diff, tol) << what;
                }
}

TEST_F(Cuda, GemmStridedBatchedFloat) {
  batched_sweep_gpu<float>(1e-5);
}
TEST_F(Cuda, GemmStridedBatchedDouble) {
  batched_sweep_gpu<double>(1e-12);
}
TEST_F(Cuda, GemmStridedBatchedBf16) {
  batched_sweep_gpu<bf16>(1e-2);
}

TEST_F(Cuda, GemmStridedBatchedBadInputThrows) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  TwinVec<float> A(random_vector<float>(64, gen)), B(random_vector<float>(64, gen));
  TwinVec<float> C(random_vector<float>(64, gen));
  const std::vector<float> c0 = C.download();
  auto V = [](float* p, index_t r, index_t c) {
    return MatrixView<float>::dense(p, r, c, Order::row_major);
  };
  auto run = [&](CudaBackend& be, index_t sc, index_t batch, index_t ak) {
    return error_of([&] {
      be.gemm_strided_batched(Op::N, Op::N, 1.f, V(A.d(), 2, ak), 6, V(B.d(), 3, 2), 6, 0.f,
                              V(C.d(), 2, 2), sc, batch);
    });
  };
  EXPECT_NE(run(gpu(), 4, -1, 3).find("negative batch -1"), std::string::npos);
  EXPECT_NE(run(gpu(), -4, 2, 3).find("stride_c -4"), std::string::npos);
  EXPECT_NE(run(gpu(), 4, 2, 4).find("gemm: A is 2x4 and B is 3x2"), std::string::npos);
  EXPECT_NE(run(gpu(), 2, 3, 3).find("overlap"), std::string::npos);
  gpu().synchronize();
  EXPECT_EQ(C.download(), c0);  // nothing was enqueued
  // The pointer contract, when asked to check it.
  CudaBackend checked({.check_pointers = true});
  std::vector<float> host(64, 1.f);
  EXPECT_NE(error_of([&] {
              checked.gemm_strided_batched(Op::N, Op::N, 1.f, V(host.data(), 2, 3), 6,
                                           V(B.d(), 3, 2), 6, 0.f, V(C.d(), 2, 2), 4, 2);
            }).find("gemm_strided_batched: A is not device memory"),
            std::string::npos);
}

// The memory budget's device query (memory_check.hpp): the free bytes of this
// backend's GPU, and its UUID as the memory domain, so that ranks on one GPU
// share its budget whichever ordinal they see.
TEST_F(Cuda, MemoryQueryNamesTheDeviceByUuid) {
  const double free_bytes = gpu().memory_free_bytes();
  EXPECT_GT(free_bytes, 64.0 * 1024 * 1024) << "free bytes of an idle GPU";
  EXPECT_LT(free_bytes, 1e13) << "more than 10 TB free";
  const std::string domain = gpu().memory_domain();
  ASSERT_EQ(domain.size(), 5u + 32u) << domain;  // "cuda:" + 16 UUID bytes in hex
  EXPECT_EQ(domain.rfind("cuda:", 0), 0u) << domain;
  EXPECT_EQ(domain.find_first_not_of("0123456789abcdef", 5), std::string::npos) << domain;
  // A second backend on the same device names the same memory.
  CudaBackend same({.device = gpu().device()});
  EXPECT_EQ(same.memory_domain(), domain);
  EXPECT_GT(same.memory_free_bytes(), 0.0);
}

TEST(CudaBackendErrors, NoDeviceIsAClearError) {
  if (have_device()) GTEST_SKIP() << "a device is present";
  const std::string what = error_of([] { CudaBackend backend; });
  EXPECT_NE(what.find("CudaBackend: no CUDA device (cudaGetDeviceCount: "), std::string::npos)
      << what;
  EXPECT_EQ(CudaBackend::device_count(), 0);
}

TEST_F(Cuda, BadInputThrows) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  Twin<float> A(4, 5, Order::col_major, 0, gen), B(6, 3, Order::col_major, 0, gen);
  Twin<float> C(4, 3, Order::col_major, 0, gen), B2(5, 3, Order::row_major, 0, gen);
  EXPECT_NE(error_of([&] {
              gpu().gemm(Op::N, Op::N, 1.f, A.d(), B.d(), 0.f, C.d());
            }).find("gemm: A is 4x5 and B is 6x3"),
            std::string::npos);
  EXPECT_NE(error_of([&] { gpu().copy(A.d(), C.d()); }).find("copy: shapes differ (4x5 -> 4x3)"),
            std::string::npos);
  MatrixView<float> bad(C.d().data, 4, 3, 2, Order::col_major);  // ld < rows
  EXPECT_NE(error_of([&] { gpu().gelu_forward(bad, C.d()); }).find("leading dimension 2 < rows 4"),
            std::string::npos);
  EXPECT_NE(error_of([&] { gpu().add_bias(C.d(), nullptr); }).find("add_bias: null bias"),
            std::string::npos);
  const int count = CudaBackend::device_count();
  EXPECT_NE(error_of([&] { CudaBackend b({.device = count}); }).find("CudaOptions::device"),
            std::string::npos);
  CudaOptions small;
  small.force_variant = GemmVariant::transpose_both;
  small.tune_workspace_bytes = 64;
  CudaBackend forced(small);
  EXPECT_NE(
      error_of([&] { forced.gemm(Op::N, Op::N, 1.f, A.d(), B2.d(), 0.f, C.d()); }).find("needs"),
      std::string::npos);
  // The pointer contract, when asked to check it.
  CudaBackend checked({.check_pointers = true});
  std::vector<float> host_bias(3, 1.f);
  EXPECT_NE(error_of([&] {
              checked.add_bias(C.d(), host_bias.data());
            }).find("add_bias: bias is not device memory"),
            std::string::npos);
}

}  // namespace
}  // namespace summa::test

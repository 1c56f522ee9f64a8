#include "summa/backend/cpu_backend.hpp"

#include "cpu_blas.hpp"
#include "cpu_elementwise.hpp"
#include "summa/backend/optimizer_math.hpp"
#include "summa/build_info.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <new>
#include <string>
#include <type_traits>

namespace summa {

namespace {

using Eigen::Index;
constexpr std::size_t kAlign = 64;

// Eigen's sequential GEMM packs panels of A and B into blockA / blockB and
// allocates them itself unless the blocking object already points at memory.
// This blocking points them into caller scratch, so a GEMM allocates nothing.
template <class T>
class ScratchBlocking : public Eigen::internal::level3_blocking<T, T> {
 public:
  // rows x cols x depth of the column-major problem Eigen runs.
  ScratchBlocking(Index rows, Index cols, Index depth) {
    this->m_mc = rows;
    this->m_nc = cols;
    this->m_kc = depth;
    Eigen::internal::computeProductBlockingSizes<T, T, 1>(this->m_kc, this->m_mc, this->m_nc,
                                                          Index(1));
  }
  std::size_t bytes_needed() const {
    const auto a = static_cast<std::size_t>(this->m_mc * this->m_kc) * sizeof(T);
    const auto b = static_cast<std::size_t>(this->m_kc * this->m_nc) * sizeof(T);
    return round(a) + round(b) + kAlign;  // + alignment of the scratch start
  }
  bool attach(Scratch s) {
    if (s.data == nullptr || s.bytes < bytes_needed()) return false;
    auto p = reinterpret_cast<std::uintptr_t>(s.data);
    p = (p + kAlign - 1) / kAlign * kAlign;
    this->m_blockA = reinterpret_cast<T*>(p);
    p += round(static_cast<std::size_t>(this->m_mc * this->m_kc) * sizeof(T));
    this->m_blockB = reinterpret_cast<T*>(p);
    return true;
  }

 private:
  static std::size_t round(std::size_t b) { return (b + kAlign - 1) / kAlign * kAlign; }
};

template <class T, int O>
using MapOf =
    Eigen::Map<std::conditional_t<
                   std::is_const_v<T>,
                   const Eigen::Matrix<std::remove_const_t<T>, Eigen::Dynamic, Eigen::Dynamic, O>,
                   Eigen::Matrix<std::remove_const_t<T>, Eigen::Dynamic, Eigen::Dynamic, O>>,
               Eigen::Unaligned, Eigen::OuterStride<>>;

// Calls fn with an Eigen map of the view in its storage order.
template <class T, class Fn>
decltype(auto) with_map(MatrixView<T> v, Fn&& fn) {
  if (v.order == Order::col_major)
    return fn(MapOf<T, Eigen::ColMajor>(v.data, v.rows, v.cols, Eigen::OuterStride<>(v.ld)));
  return fn(MapOf<T, Eigen::RowMajor>(v.data, v.rows, v.cols, Eigen::OuterStride<>(v.ld)));
}

template <class T, int LhsOrder, int RhsOrder, int ResOrder>
void eigen_gemm(Index m, Index n, Index k, T alpha, const T* lhs, Index lhs_ld, const T* rhs,
                Index rhs_ld, T* res, Index res_ld, Scratch scratch) {
  // A row-major result runs as the transposed column-major problem n x m.
  ScratchBlocking<T> blocking(ResOrder == Eigen::ColMajor ? m : n,
                              ResOrder == Eigen::ColMajor ? n : m, k);
  blocking.attach(scratch);  // when it does not fit, Eigen allocates (documented)
  Eigen::internal::general_matrix_matrix_product<Index, T, LhsOrder, false, T, RhsOrder, false,
                                                 ResOrder, 1>::run(m, n, k, lhs, lhs_ld, rhs,
                                                                   rhs_ld, res, 1, res_ld, alpha,
                                                                   blocking, nullptr);
}

// Storage order of op(X) seen as a plain matrix.
int op_order(Order o, Op t) {
  const bool col = (o == Order::col_major) != (t == Op::T);
  return col ? Eigen::ColMajor : Eigen::RowMajor;
}

template <class T>
void scale_impl(T beta, MatrixView<T> C) {
  if (C.empty()) return;
  if (beta == T(0))
    with_map(C, [](auto c) { c.setZero(); });
  else if (beta != T(1))
    with_map(C, [beta](auto c) { c *= beta; });
}

template <class T>
void gemm_impl(Op ta, Op tb, T alpha, ConstMatrixView<T> A, ConstMatrixView<T> B, T beta,
               MatrixView<T> C, Scratch scratch) {
  const Index m = C.rows, n = C.cols, k = ta == Op::N ? A.cols : A.rows;
  if (m == 0 || n == 0) return;
  scale_impl(beta, C);  // beta == 0 never reads C
  if (alpha == T(0) || k == 0) return;
  const int lo = op_order(A.order, ta), ro = op_order(B.order, tb);
  const bool res_col = C.order == Order::col_major;
  auto go = [&](auto lhs_order, auto rhs_order) {
    constexpr int L = decltype(lhs_order)::value, R = decltype(rhs_order)::value;
    if (res_col)
      eigen_gemm<T, L, R, Eigen::ColMajor>(m, n, k, alpha, A.data, A.ld, B.data, B.ld, C.data, C.ld,
                                           scratch);
    else
      eigen_gemm<T, L, R, Eigen::RowMajor>(m, n, k, alpha, A.data, A.ld, B.data, B.ld, C.data, C.ld,
                                           scratch);
  };
  using ColT = std::integral_constant<int, Eigen::ColMajor>;
  using RowT = std::integral_constant<int, Eigen::RowMajor>;
  if (lo == Eigen::ColMajor) {
    if (ro == Eigen::ColMajor)
      go(ColT{}, ColT{});
    else
      go(ColT{}, RowT{});
  } else {
    if (ro == Eigen::ColMajor)
      go(RowT{}, ColT{});
    else
      go(RowT{}, RowT{});
  }
}

bool fits_int(index_t x) {
  return x >= 0 && x <= std::numeric_limits<int>::max();
}

// A view's leading dimension as CBLAS requires it: at least its inner extent
// (rows when column-major) and at least 1.
template <class T>
bool cblas_ld_ok(const T& v) {
  const index_t inner = v.order == Order::col_major ? v.rows : v.cols;
  return fits_int(v.ld) && v.ld >= std::max<index_t>(1, inner);
}

// C = alpha op(A) op(B) + beta C on the BLAS, in C's storage order (an
// operand stored in the other order is its own transpose there). False when
// CBLAS cannot take the call (a size past int, a leading dimension CBLAS
// rejects, nothing to multiply): the caller runs Eigen's.
template <class T, class Fn>
bool blas_gemm(Fn gemm, Op ta, Op tb, T alpha, ConstMatrixView<T> A, ConstMatrixView<T> B, T beta,
               MatrixView<T> C) {
  const index_t m = C.rows, n = C.cols, k = ta == Op::N ? A.cols : A.rows;
  if (gemm == nullptr || k == 0 || alpha == T(0) || !fits_int(m) || !fits_int(n) || !fits_int(k) ||
      !cblas_ld_ok(A) || !cblas_ld_ok(B) || !cblas_ld_ok(C))
    return false;
  const Order layout = C.order;
  const auto trans = [layout](Order o, Op t) {
    return (t == Op::T) != (o != layout) ? cpu_detail::kCblasTrans : cpu_detail::kCblasNoTrans;
  };
  gemm(layout == Order::col_major ? cpu_detail::kCblasColMajor : cpu_detail::kCblasRowMajor,
       trans(A.order, ta), trans(B.order, tb), static_cast<int>(m), static_cast<int>(n),
       static_cast<int>(k), alpha, A.data, static_cast<int>(A.ld), B.data, static_cast<int>(B.ld),
       beta, C.data, static_cast<int>(C.ld));
  return true;
}

template <class T>
std::size_t scratch_bytes(index_t m, index_t n, index_t k) {
  if (m <= 0 || n <= 0 || k <= 0) return 0;
  // The larger of the two orientations, so either result order fits.
  return std::max(ScratchBlocking<T>(m, n, k).bytes_needed(),
                  ScratchBlocking<T>(n, m, k).bytes_needed());
}

template <class T>
void copy_impl(ConstMatrixView<T> src, MatrixView<T> dst) {
  if (src.empty()) return;
  with_map(dst, [&](auto d) { with_map(src, [&](auto s) { d = s; }); });
}

template <class T>
void axpby_impl(T alpha, ConstMatrixView<T> X, T beta, MatrixView<T> C) {
  if (X.empty()) return;
  with_map(C, [&](auto c) {
    with_map(X, [&](auto x) {
      if (beta == T(0))
        c = alpha * x;
      else
        c = alpha * x + beta * c;
    });
  });
}

template <class T>
void add_bias_impl(MatrixView<T> Y, const T* bias) {
  if (Y.empty()) return;
  const Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>> b(bias, Y.cols);
  with_map(Y, [&](auto y) { y.rowwise() += b; });
}

template <class T>
void column_sums_impl(ConstMatrixView<T> X, T beta, T* out) {
  if (X.cols == 0) return;
  Eigen::Map<Eigen::Matrix<T, 1, Eigen::Dynamic>> o(out, X.cols);
  if (X.rows == 0) {
    if (beta == T(0))
      o.setZero();
    else
      o *= beta;
    return;
  }
  if (X.order == Order::row_major) {  // row by row: contiguous, vectorised passes
    if (beta == T(0))
      o.setZero();
    else
      o *= beta;
    for (index_t i = 0; i < X.rows; ++i)
      o += Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>>(&X(i, 0), X.cols);
    return;
  }
  with_map(X, [&](auto x) {
    if (beta == T(0))
      o = x.colwise().sum();
    else
      o = beta * o + x.colwise().sum();
  });
}

// ---- LayerNorm kernels ------------------------------------------------------

template <class T>
using ColVec = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;  // one value per row
template <class T>
using RowVec = Eigen::Map<const Eigen::Array<T, 1, Eigen::Dynamic>>;  // one value per column

template <class T>
void ln_partial_sums_impl(ConstMatrixView<T> X, const T* center, T* out) {
  if (X.rows == 0) return;
  Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>> o(out, X.rows);
  if (X.cols == 0) {
    o.setZero();
    return;
  }
  with_map(X, [&](auto x) {
    if (center == nullptr)
      o = x.array().rowwise().sum();
    else
      o = (x.array().colwise() - ColVec<T>(center, X.rows)).square().rowwise().sum();
  });
}

template <class T>
void ln_mean_impl(index_t n, index_t h, const T* sums, T* mean) {
  for (index_t r = 0; r < n; ++r) mean[r] = sums[r] / static_cast<T>(h);
}

template <class T>
void ln_rstd_impl(index_t n, index_t h, double eps, const T* squares, T* rstd) {
  for (index_t r = 0; r < n; ++r)
    rstd[r] = T(1) / std::sqrt(squares[r] / static_cast<T>(h) + static_cast<T>(eps));
}

template <class T>
void ln_apply_impl(ConstMatrixView<T> X, const T* mean, const T* rstd, const T* gamma,
                   const T* beta, MatrixView<T> Y) {
  if (X.empty()) return;
  const ColVec<T> m(mean, X.rows), r(rstd, X.rows);
  const RowVec<T> g(gamma, X.cols), b(beta, X.cols);
  with_map(Y, [&](auto y) {
    with_map(X, [&](auto x) {
      y.array() = (((x.array().colwise() - m).colwise() * r).rowwise() * g).rowwise() + b;
    });
  });
}

template <class T>
void ln_backward_partials_impl(ConstMatrixView<T> X, ConstMatrixView<T> dY, const T* mean,
                               const T* rstd, const T* gamma, T* a, T* b) {
  if (X.rows == 0) return;
  Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>> ao(a, X.rows), bo(b, X.rows);
  if (X.cols == 0) {
    ao.setZero();
    bo.setZero();
    return;
  }
  const RowVec<T> gm(gamma, X.cols);
  if (X.order == Order::row_major && dY.order == Order::row_major) {
    for (index_t i = 0; i < X.rows; ++i) {  // contiguous, vectorised row sums
      const RowVec<T> x(&X(i, 0), X.cols), dy(&dY(i, 0), X.cols);
      a[i] = (dy * gm).sum();
      b[i] = (dy * gm * ((x - mean[i]) * rstd[i])).sum();
    }
    return;
  }
  const ColVec<T> m(mean, X.rows), r(rstd, X.rows);
  with_map(dY, [&](auto dy) {
    with_map(X, [&](auto x) {
      const auto g = dy.array().rowwise() * gm;
      const auto xhat = (x.array().colwise() - m).colwise() * r;
      ao = g.rowwise().sum();
      bo = (g * xhat).rowwise().sum();
    });
  });
}

template <class T>
void ln_backward_apply_impl(ConstMatrixView<T> X, ConstMatrixView<T> dY, const T* mean,
                            const T* rstd, const T* gamma, const T* a, const T* b, index_t h,
                            MatrixView<T> dX) {
  if (X.empty()) return;
  const RowVec<T> gm(gamma, X.cols);
  const T hh = static_cast<T>(h), inv_h = T(1) / hh;
  if (X.order == Order::row_major && dY.order == Order::row_major && dX.order == Order::row_major) {
    for (index_t i = 0; i < X.rows; ++i) {  // dX may be dY: each element read before written
      const RowVec<T> x(&X(i, 0), X.cols), dy(&dY(i, 0), X.cols);
      Eigen::Map<Eigen::Array<T, 1, Eigen::Dynamic>> dx(&dX(i, 0), X.cols);
      const T ri = rstd[i];
      dx = ((dy * gm * hh - a[i]) - ((x - mean[i]) * ri) * b[i]) * (ri * inv_h);
    }
    return;
  }
  const ColVec<T> m(mean, X.rows), r(rstd, X.rows), av(a, X.rows), bv(b, X.rows);
  with_map(dX, [&](auto dx) {
    with_map(dY, [&](auto dy) {
      with_map(X, [&](auto x) {
        const auto g = dy.array().rowwise() * gm;
        const auto xhat = (x.array().colwise() - m).colwise() * r;
        // rstd/h * (h*g - a - xhat*b): broadcasting only plain maps keeps Eigen
        // from evaluating a scaled a or b into a heap temporary.
        dx.array() = (((g * hh).colwise() - av) - xhat.colwise() * bv).colwise() * r * inv_h;
      });
    });
  });
}

template <class T>
void ln_param_partials_impl(ConstMatrixView<T> X, ConstMatrixView<T> dY, const T* mean,
                            const T* rstd, T* dgamma, T* dbeta) {
  if (X.cols == 0) return;
  Eigen::Map<Eigen::Array<T, 1, Eigen::Dynamic>> go(dgamma, X.cols), bo(dbeta, X.cols);
  if (X.rows == 0) {
    go.setZero();
    bo.setZero();
    return;
  }
  if (X.order == Order::row_major && dY.order == Order::row_major) {
    // Row by row, each a contiguous vectorised pass (Eigen's column sums of a
    // row-major expression would walk memory with the row stride).
    go.setZero();
    bo.setZero();
    for (index_t i = 0; i < X.rows; ++i) {
      const RowVec<T> x(&X(i, 0), X.cols), dy(&dY(i, 0), X.cols);
      go += dy * ((x - mean[i]) * rstd[i]);
      bo += dy;
    }
    return;
  }
  const ColVec<T> m(mean, X.rows), r(rstd, X.rows);
  with_map(dY, [&](auto dy) {
    with_map(X, [&](auto x) {
      const auto xhat = (x.array().colwise() - m).colwise() * r;
      go = (dy.array() * xhat).colwise().sum();
      bo = dy.array().colwise().sum();
    });
  });
}

// ---- Elementwise and row-wise kernels (GeLU, softmax, cross-entropy, embedding)
// Plain loops over view elements: no Eigen temporaries, no heap. Elementwise
// kernels walk the output in its storage order; row-wise kernels walk rows.

using cpu_detail::for_each_element;

// GeLU: vectorised on segments (cpu_elementwise.hpp).
template <class T>
void gelu_forward_impl(ConstMatrixView<T> X, MatrixView<T> Y) {
  cpu_detail::gelu_forward_view<T, T>(X, Y);
}

template <class T>
void gelu_backward_impl(ConstMatrixView<T> X, ConstMatrixView<T> dY, MatrixView<T> dX) {
  cpu_detail::gelu_backward_view<T, T>(X, dY, dX);
}

// Row r of a causal softmax uses columns [0, causal_end(r, rows, cols)).
inline index_t causal_end(index_t r, index_t rows, index_t cols) {
  // aligned at the bottom right: with fewer rows than columns (the queries
  // of a decoding step against all cached keys) row r is query cols-rows+r
  const index_t end = r + 1 + (cols > rows ? cols - rows : 0);
  return end < cols ? end : cols;
}

template <class T>
void softmax_causal_impl(ConstMatrixView<T> S, double scale, MatrixView<T> P) {
  for (index_t r = 0; r < P.rows; ++r) {
    const index_t end = causal_end(r, P.rows, P.cols);
    // Both reading passes over the row finish before the row is written, so
    // P may be S.
    double m = -std::numeric_limits<double>::infinity();
    for (index_t c = 0; c < end; ++c) m = std::max(m, scale * static_cast<double>(S(r, c)));
    double sum = 0;
    for (index_t c = 0; c < end; ++c) sum += std::exp(scale * static_cast<double>(S(r, c)) - m);
    const double inv = 1.0 / sum;
    for (index_t c = 0; c < end; ++c)
      P(r, c) = static_cast<T>(std::exp(scale * static_cast<double>(S(r, c)) - m) * inv);
    for (index_t c = end; c < P.cols; ++c) P(r, c) = T(0);
  }
}

template <class T>
void softmax_causal_backward_impl(ConstMatrixView<T> P, ConstMatrixView<T> dP, double scale,
                                  MatrixView<T> dS) {
  for (index_t r = 0; r < dS.rows; ++r) {
    // P is zero above the diagonal, so the row dot product and dS only involve
    // the causal window; dS is exactly 0 above it (whatever dP holds there).
    const index_t end = causal_end(r, dS.rows, dS.cols);
    double dot = 0;
    for (index_t c = 0; c < end; ++c)
      dot += static_cast<double>(dP(r, c)) * static_cast<double>(P(r, c));
    for (index_t c = 0; c < end; ++c) {
      const double p = P(r, c), dp = dP(r, c);  // read before dS (may be dP) is written
      dS(r, c) = static_cast<T>(scale * p * (dp - dot));
    }
    for (index_t c = end; c < dS.cols; ++c) dS(r, c) = T(0);
  }
}

template <class T>
void row_max_impl(ConstMatrixView<T> Z, T* out) {
  for (index_t r = 0; r < Z.rows; ++r) {
    T m = -std::numeric_limits<T>::infinity();  // an empty local block
    for (index_t c = 0; c < Z.cols; ++c) m = std::max(m, Z(r, c));
    out[r] = m;
  }
}

template <class T>
void row_sum_exp_impl(ConstMatrixView<T> Z, const T* max, T* out) {
  for (index_t r = 0; r < Z.rows; ++r) {
    const double m = Z.cols > 0 ? static_cast<double>(max[r]) : 0.0;  // max: null if no columns
    double sum = 0;
    for (index_t c = 0; c < Z.cols; ++c) sum += std::exp(static_cast<double>(Z(r, c)) - m);
    out[r] = static_cast<T>(sum);
  }
}

// Local column of global id `target` in a block of `cols` columns starting at
// `col0`, or -1 when it is not local.
inline index_t local_index(std::int32_t target, index_t col0, index_t cols) {
  const index_t c = static_cast<index_t>(target) - col0;
  return c >= 0 && c < cols ? c : index_t(-1);
}

template <class T>
void pick_targets_impl(ConstMatrixView<T> Z, const std::int32_t* targets, index_t col0, T* out) {
  for (index_t r = 0; r < Z.rows; ++r) {
    const index_t c = local_index(targets[r], col0, Z.cols);
    out[r] = c >= 0 ? Z(r, c) : T(0);
  }
}

template <class T>
double cross_entropy_sum_impl(index_t n, const T* max, const T* sum, const T* picked) {
  double total = 0;
  for (index_t r = 0; r < n; ++r)
    total += std::log(static_cast<double>(sum[r])) + static_cast<double>(max[r]) -
             static_cast<double>(picked[r]);
  return total;
}

template <class T>
void cross_entropy_grad_impl(MatrixView<T> Z, const T* max, const T* sum,
                             const std::int32_t* targets, index_t col0, double scale) {
  for_each_element(Z.rows, Z.cols, Z.order, [&](index_t r, index_t c) {
    const double p = std::exp(static_cast<double>(Z(r, c)) - static_cast<double>(max[r])) /
                     static_cast<double>(sum[r]);
    const double hit = c + col0 == static_cast<index_t>(targets[r]) ? 1.0 : 0.0;
    Z(r, c) = static_cast<T>(scale * (p - hit));
  });
}

template <class T>
void gather_rows_impl(const std::int32_t* ids, index_t row0, ConstMatrixView<T> table,
                      bool accumulate, MatrixView<T> out) {
  for_each_element(out.rows, out.cols, out.order, [&](index_t r, index_t c) {
    const index_t t = local_index(ids[r], row0, table.rows);
    if (t >= 0) {
      if (accumulate)
        out(r, c) += table(t, c);
      else
        out(r, c) = table(t, c);
    } else if (!accumulate) {
      out(r, c) = T(0);
    }
  });
}

template <class T>
void scatter_add_rows_impl(const std::int32_t* ids, index_t row0, ConstMatrixView<T> src,
                           MatrixView<T> table) {
  if (src.cols == 0) return;  // ids are read only for rows with elements
  // Rows in order, so repeated ids accumulate deterministically.
  for (index_t r = 0; r < src.rows; ++r) {
    const index_t t = local_index(ids[r], row0, table.rows);
    if (t < 0) continue;
    for (index_t c = 0; c < src.cols; ++c) table(t, c) += src(r, c);
  }
}

}  // namespace

CpuBackend::CpuBackend(const CpuOptions& o) : emulate_device_(o.emulate_device) {
  gemm_ = o.gemm.empty() ? default_gemm() : o.gemm;
  if (o.threads < 1)
    throw Error("CpuBackend: threads " + std::to_string(o.threads) + " (at least 1)");
  threads_ = o.threads;
  if (gemm_ == "eigen") {
    if (threads_ != 1)
      throw Error("CpuBackend: threads " + std::to_string(threads_) +
                  " with the eigen GEMM, which runs one thread in this build; choose a BLAS "
                  "(openblas, blis, mkl) for more");
    detail_ = "Eigen " + std::to_string(EIGEN_WORLD_VERSION) + "." +
              std::to_string(EIGEN_MAJOR_VERSION) + "." + std::to_string(EIGEN_MINOR_VERSION);
  } else {
    blas_ = &cpu_detail::load_blas(gemm_, threads_);
    blas_->set_threads(threads_);
    detail_ = blas_->path + (blas_->detail.empty() ? "" : ": " + blas_->detail);
  }
  name_ = "cpu-" + gemm_;
}

std::string CpuBackend::default_gemm() {
  const char* env = std::getenv("SUMMA_CPU_GEMM");
  if (env != nullptr && *env != '\0') return env;
  return SUMMA_CPU_GEMM_DEFAULT;
}

std::vector<std::string> CpuBackend::gemm_libraries() {
  std::vector<std::string> out = {"eigen"};
  for (const std::string& name : cpu_detail::blas_names())
    if (cpu_detail::blas_loads(name)) out.push_back(name);
  return out;
}

void* CpuBackend::allocate(std::size_t bytes) {
  const std::size_t size = (bytes + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, size == 0 ? kAlign : size);
  if (p == nullptr)
    throw OutOfMemory("CpuBackend::allocate: " + std::to_string(bytes) +
                      " bytes of host memory: out of memory");
  note_allocated(bytes);
  return p;
}
void CpuBackend::deallocate(void* p, std::size_t bytes) noexcept {
  if (p != nullptr) note_deallocated(bytes);
  std::free(p);
}

namespace cpu_detail {
std::size_t bf16_gemm_scratch_bytes(const CpuBackend& backend, index_t m, index_t n,
                                    index_t k);  // cpu_backend_bf16.cpp
}  // namespace cpu_detail

double CpuBackend::host_available_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  while (meminfo >> key) {
    if (key == "MemAvailable:") {
      double kib = -1;
      meminfo >> kib;
      return meminfo && kib >= 0 ? kib * 1024.0 : -1.0;
    }
    meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return -1;
}

std::size_t CpuBackend::gemm_scratch_bytes(index_t m, index_t n, index_t k, DType t) const {
  // A BLAS packs into its own buffers; past CBLAS's int sizes Eigen runs.
  if (blas_ != nullptr && t != DType::bf16 && fits_int(m) && fits_int(n) && fits_int(k)) return 0;
  switch (t) {
    case DType::f32:
      return scratch_bytes<float>(m, n, k);
    case DType::f64:
      return scratch_bytes<double>(m, n, k);
    case DType::bf16:
      return cpu_detail::bf16_gemm_scratch_bytes(*this, m, n, k);
  }
  throw Error("CpuBackend::gemm_scratch_bytes: unknown DType " +
              std::to_string(static_cast<int>(t)));
}

void CpuBackend::do_gemm(Op ta, Op tb, float alpha, ConstMatrixView<float> A,
                         ConstMatrixView<float> B, float beta, MatrixView<float> C, Scratch s) {
  if (C.rows == 0 || C.cols == 0) return;
  if (blas_ != nullptr && blas_gemm(blas_->sgemm, ta, tb, alpha, A, B, beta, C)) return;
  gemm_impl(ta, tb, alpha, A, B, beta, C, s);
}
void CpuBackend::do_gemm(Op ta, Op tb, double alpha, ConstMatrixView<double> A,
                         ConstMatrixView<double> B, double beta, MatrixView<double> C, Scratch s) {
  if (C.rows == 0 || C.cols == 0) return;
  if (blas_ != nullptr && blas_gemm(blas_->dgemm, ta, tb, alpha, A, B, beta, C)) return;
  gemm_impl(ta, tb, alpha, A, B, beta, C, s);
}

namespace {
// The products of a strided batch, in order: gemm(Ab, Bb, Cb) for b = 0, 1, ...
// (Backend::gemm_strided_batched checked the batch, so each product fits).
template <class T, class Gemm>
void batched_loop(ConstMatrixView<T> A, index_t stride_a, ConstMatrixView<T> B, index_t stride_b,
                  MatrixView<T> C, index_t stride_c, index_t batch, Gemm&& gemm) {
  for (index_t b = 0; b < batch; ++b) {
    ConstMatrixView<T> Ab = A, Bb = B;
    MatrixView<T> Cb = C;
    Ab.data += b * stride_a;
    Bb.data += b * stride_b;
    Cb.data += b * stride_c;
    gemm(Ab, Bb, Cb);
  }
}
}  // namespace

void CpuBackend::do_gemm_strided_batched(Op ta, Op tb, float alpha, ConstMatrixView<float> A,
                                         index_t stride_a, ConstMatrixView<float> B,
                                         index_t stride_b, float beta, MatrixView<float> C,
                                         index_t stride_c, index_t batch, Scratch s) {
  batched_loop(A, stride_a, B, stride_b, C, stride_c, batch,
               [&](auto Ab, auto Bb, auto Cb) { do_gemm(ta, tb, alpha, Ab, Bb, beta, Cb, s); });
}
void CpuBackend::do_gemm_strided_batched(Op ta, Op tb, double alpha, ConstMatrixView<double> A,
                                         index_t stride_a, ConstMatrixView<double> B,
                                         index_t stride_b, double beta, MatrixView<double> C,
                                         index_t stride_c, index_t batch, Scratch s) {
  batched_loop(A, stride_a, B, stride_b, C, stride_c, batch,
               [&](auto Ab, auto Bb, auto Cb) { do_gemm(ta, tb, alpha, Ab, Bb, beta, Cb, s); });
}
void CpuBackend::do_gemm_strided_batched(Op ta, Op tb, float alpha, ConstMatrixView<bf16> A,
                                         index_t stride_a, ConstMatrixView<bf16> B,
                                         index_t stride_b, float beta, MatrixView<bf16> C,
                                         index_t stride_c, index_t batch, Scratch s) {
  batched_loop(A, stride_a, B, stride_b, C, stride_c, batch,
               [&](auto Ab, auto Bb, auto Cb) { do_gemm(ta, tb, alpha, Ab, Bb, beta, Cb, s); });
}
void CpuBackend::do_copy(ConstMatrixView<float> src, MatrixView<float> dst) {
  copy_impl(src, dst);
}
void CpuBackend::do_copy(ConstMatrixView<double> src, MatrixView<double> dst) {
  copy_impl(src, dst);
}
void CpuBackend::do_axpby(float alpha, ConstMatrixView<float> X, float beta, MatrixView<float> C) {
  axpby_impl(alpha, X, beta, C);
}
void CpuBackend::do_axpby(double alpha, ConstMatrixView<double> X, double beta,
                          MatrixView<double> C) {
  axpby_impl(alpha, X, beta, C);
}

void CpuBackend::do_scale(float beta, MatrixView<float> C) {
  scale_impl(beta, C);
}
void CpuBackend::do_scale(double beta, MatrixView<double> C) {
  scale_impl(beta, C);
}

void CpuBackend::do_add_bias(MatrixView<float> Y, const float* bias) {
  add_bias_impl(Y, bias);
}
void CpuBackend::do_add_bias(MatrixView<double> Y, const double* bias) {
  add_bias_impl(Y, bias);
}
void CpuBackend::do_column_sums(ConstMatrixView<float> X, float beta, float* out) {
  column_sums_impl(X, beta, out);
}
void CpuBackend::do_column_sums(ConstMatrixView<double> X, double beta, double* out) {
  column_sums_impl(X, beta, out);
}

void CpuBackend::do_layernorm_partial_sums(ConstMatrixView<float> X, const float* center,
                                           float* out) {
  ln_partial_sums_impl(X, center, out);
}
void CpuBackend::do_layernorm_partial_sums(ConstMatrixView<double> X, const double* center,
                                           double* out) {
  ln_partial_sums_impl(X, center, out);
}
void CpuBackend::do_layernorm_mean(index_t n, index_t h, const float* sums, float* mean) {
  ln_mean_impl(n, h, sums, mean);
}
void CpuBackend::do_layernorm_mean(index_t n, index_t h, const double* sums, double* mean) {
  ln_mean_impl(n, h, sums, mean);
}
void CpuBackend::do_layernorm_rstd(index_t n, index_t h, double eps, const float* squares,
                                   float* rstd) {
  ln_rstd_impl(n, h, eps, squares, rstd);
}
void CpuBackend::do_layernorm_rstd(index_t n, index_t h, double eps, const double* squares,
                                   double* rstd) {
  ln_rstd_impl(n, h, eps, squares, rstd);
}
void CpuBackend::do_layernorm_apply(ConstMatrixView<float> X, const float* mean, const float* rstd,
                                    const float* gamma, const float* beta, MatrixView<float> Y) {
  ln_apply_impl(X, mean, rstd, gamma, beta, Y);
}
void CpuBackend::do_layernorm_apply(ConstMatrixView<double> X, const double* mean,
                                    const double* rstd, const double* gamma, const double* beta,
                                    MatrixView<double> Y) {
  ln_apply_impl(X, mean, rstd, gamma, beta, Y);
}
void CpuBackend::do_layernorm_backward_partials(ConstMatrixView<float> X, ConstMatrixView<float> dY,
                                                const float* mean, const float* rstd,
                                                const float* gamma, float* a, float* b) {
  ln_backward_partials_impl(X, dY, mean, rstd, gamma, a, b);
}
void CpuBackend::do_layernorm_backward_partials(ConstMatrixView<double> X,
                                                ConstMatrixView<double> dY, const double* mean,
                                                const double* rstd, const double* gamma, double* a,
                                                double* b) {
  ln_backward_partials_impl(X, dY, mean, rstd, gamma, a, b);
}
void CpuBackend::do_layernorm_backward_apply(ConstMatrixView<float> X, ConstMatrixView<float> dY,
                                             const float* mean, const float* rstd,
                                             const float* gamma, const float* a, const float* b,
                                             index_t h, MatrixView<float> dX) {
  ln_backward_apply_impl(X, dY, mean, rstd, gamma, a, b, h, dX);
}
void CpuBackend::do_layernorm_backward_apply(ConstMatrixView<double> X, ConstMatrixView<double> dY,
                                             const double* mean, const double* rstd,
                                             const double* gamma, const double* a, const double* b,
                                             index_t h, MatrixView<double> dX) {
  ln_backward_apply_impl(X, dY, mean, rstd, gamma, a, b, h, dX);
}
void CpuBackend::do_layernorm_param_partials(ConstMatrixView<float> X, ConstMatrixView<float> dY,
                                             const float* mean, const float* rstd, float* dgamma,
                                             float* dbeta) {
  ln_param_partials_impl(X, dY, mean, rstd, dgamma, dbeta);
}
void CpuBackend::do_layernorm_param_partials(ConstMatrixView<double> X, ConstMatrixView<double> dY,
                                             const double* mean, const double* rstd, double* dgamma,
                                             double* dbeta) {
  ln_param_partials_impl(X, dY, mean, rstd, dgamma, dbeta);
}

void CpuBackend::do_gelu_forward(ConstMatrixView<float> X, MatrixView<float> Y) {
  gelu_forward_impl(X, Y);
}
void CpuBackend::do_gelu_forward(ConstMatrixView<double> X, MatrixView<double> Y) {
  gelu_forward_impl(X, Y);
}
void CpuBackend::do_gelu_backward(ConstMatrixView<float> X, ConstMatrixView<float> dY,
                                  MatrixView<float> dX) {
  gelu_backward_impl(X, dY, dX);
}
void CpuBackend::do_gelu_backward(ConstMatrixView<double> X, ConstMatrixView<double> dY,
                                  MatrixView<double> dX) {
  gelu_backward_impl(X, dY, dX);
}

void CpuBackend::do_softmax_causal(ConstMatrixView<float> S, double scale, MatrixView<float> P) {
  softmax_causal_impl(S, scale, P);
}
void CpuBackend::do_softmax_causal(ConstMatrixView<double> S, double scale, MatrixView<double> P) {
  softmax_causal_impl(S, scale, P);
}
void CpuBackend::do_softmax_causal_backward(ConstMatrixView<float> P, ConstMatrixView<float> dP,
                                            double scale, MatrixView<float> dS) {
  softmax_causal_backward_impl(P, dP, scale, dS);
}
void CpuBackend::do_softmax_causal_backward(ConstMatrixView<double> P, ConstMatrixView<double> dP,
                                            double scale, MatrixView<double> dS) {
  softmax_causal_backward_impl(P, dP, scale, dS);
}

void CpuBackend::do_row_max(ConstMatrixView<float> Z, float* out) {
  row_max_impl(Z, out);
}
void CpuBackend::do_row_max(ConstMatrixView<double> Z, double* out) {
  row_max_impl(Z, out);
}
void CpuBackend::do_row_sum_exp(ConstMatrixView<float> Z, const float* max, float* out) {
  row_sum_exp_impl(Z, max, out);
}
void CpuBackend::do_row_sum_exp(ConstMatrixView<double> Z, const double* max, double* out) {
  row_sum_exp_impl(Z, max, out);
}
void CpuBackend::do_pick_targets(ConstMatrixView<float> Z, const std::int32_t* targets,
                                 index_t col0, float* out) {
  pick_targets_impl(Z, targets, col0, out);
}
void CpuBackend::do_pick_targets(ConstMatrixView<double> Z, const std::int32_t* targets,
                                 index_t col0, double* out) {
  pick_targets_impl(Z, targets, col0, out);
}
double CpuBackend::do_cross_entropy_sum(index_t n, const float* max, const float* sum,
                                        const float* picked) {
  return cross_entropy_sum_impl(n, max, sum, picked);
}
double CpuBackend::do_cross_entropy_sum(index_t n, const double* max, const double* sum,
                                        const double* picked) {
  return cross_entropy_sum_impl(n, max, sum, picked);
}
void CpuBackend::do_cross_entropy_grad(MatrixView<float> Z, const float* max, const float* sum,
                                       const std::int32_t* targets, index_t col0, double scale) {
  cross_entropy_grad_impl(Z, max, sum, targets, col0, scale);
}
void CpuBackend::do_cross_entropy_grad(MatrixView<double> Z, const double* max, const double* sum,
                                       const std::int32_t* targets, index_t col0, double scale) {
  cross_entropy_grad_impl(Z, max, sum, targets, col0, scale);
}

void CpuBackend::do_gather_rows(const std::int32_t* ids, index_t row0, ConstMatrixView<float> table,
                                bool accumulate, MatrixView<float> out) {
  gather_rows_impl(ids, row0, table, accumulate, out);
}
void CpuBackend::do_gather_rows(const std::int32_t* ids, index_t row0,
                                ConstMatrixView<double> table, bool accumulate,
                                MatrixView<double> out) {
  gather_rows_impl(ids, row0, table, accumulate, out);
}
void CpuBackend::do_scatter_add_rows(const std::int32_t* ids, index_t row0,
                                     ConstMatrixView<float> src, MatrixView<float> table) {
  scatter_add_rows_impl(ids, row0, src, table);
}
void CpuBackend::do_scatter_add_rows(const std::int32_t* ids, index_t row0,
                                     ConstMatrixView<double> src, MatrixView<double> table) {
  scatter_add_rows_impl(ids, row0, src, table);
}

void CpuBackend::do_upload(void* dst, const void* host_src, std::size_t bytes) {
  if (bytes > 0) std::memcpy(dst, host_src, bytes);
}
void CpuBackend::do_download(void* host_dst, const void* src, std::size_t bytes) {
  if (bytes > 0) std::memcpy(host_dst, src, bytes);
}

void CpuBackend::do_adamw_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                                 index_t n, const optim::AdamWCoefficients& c) {
  optim::adamw_update(param, grad, exp_avg, exp_avg_sq, n, c);
}
void CpuBackend::do_adamw_update(double* param, const double* grad, double* exp_avg,
                                 double* exp_avg_sq, index_t n, const optim::AdamWCoefficients& c) {
  optim::adamw_update(param, grad, exp_avg, exp_avg_sq, n, c);
}
void CpuBackend::do_sgd_update(float* param, const float* grad, float* momentum_buffer, index_t n,
                               const optim::SgdCoefficients& c) {
  optim::sgd_update(param, grad, momentum_buffer, n, c);
}
void CpuBackend::do_sgd_update(double* param, const double* grad, double* momentum_buffer,
                               index_t n, const optim::SgdCoefficients& c) {
  optim::sgd_update(param, grad, momentum_buffer, n, c);
}
double CpuBackend::do_sum_of_squares(const float* x, index_t n) {
  return optim::sum_of_squares(x, n);
}
double CpuBackend::do_sum_of_squares(const double* x, index_t n) {
  return optim::sum_of_squares(x, n);
}

namespace {
// Σ x² of a row-major rows x cols block (leading dimension ld), row by row
// through the contiguous sum(x, n).
template <class T, class Sum>
double strided_sum_of_squares(const T* x, index_t rows, index_t cols, index_t ld, Sum&& sum) {
  if (rows == 0 || cols == 0) return 0;
  if (ld == cols) return sum(x, rows * cols);
  double total = 0;
  for (index_t r = 0; r < rows; ++r) total += sum(x + r * ld, cols);
  return total;
}
}  // namespace

double CpuBackend::do_sum_of_squares(const float* x, index_t rows, index_t cols, index_t ld) {
  return strided_sum_of_squares(
      x, rows, cols, ld, [this](const auto* p, index_t n) { return do_sum_of_squares(p, n); });
}
double CpuBackend::do_sum_of_squares(const double* x, index_t rows, index_t cols, index_t ld) {
  return strided_sum_of_squares(
      x, rows, cols, ld, [this](const auto* p, index_t n) { return do_sum_of_squares(p, n); });
}
double CpuBackend::do_sum_of_squares(const bf16* x, index_t rows, index_t cols, index_t ld) {
  return strided_sum_of_squares(
      x, rows, cols, ld, [this](const auto* p, index_t n) { return do_sum_of_squares(p, n); });
}
void CpuBackend::do_scale_in_place(float* x, index_t n, double factor) {
  optim::scale_in_place(x, n, factor);
}
void CpuBackend::do_scale_in_place(double* x, index_t n, double factor) {
  optim::scale_in_place(x, n, factor);
}

}  // namespace summa

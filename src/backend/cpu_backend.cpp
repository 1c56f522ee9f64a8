#include "summa/backend/cpu_backend.hpp"

#include <Eigen/Core>
#include <cstdint>
#include <cstdlib>
#include <new>
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
  A.check_layout("gemm A");
  B.check_layout("gemm B");
  C.check_layout("gemm C");
  check_gemm_shapes(ta, tb, A.rows, A.cols, B.rows, B.cols, C.rows, C.cols);
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

template <class T>
std::size_t scratch_bytes(index_t m, index_t n, index_t k) {
  if (m <= 0 || n <= 0 || k <= 0) return 0;
  // The larger of the two orientations, so either result order fits.
  return std::max(ScratchBlocking<T>(m, n, k).bytes_needed(),
                  ScratchBlocking<T>(n, m, k).bytes_needed());
}

template <class T>
void copy_impl(ConstMatrixView<T> src, MatrixView<T> dst) {
  require(src.rows == dst.rows && src.cols == dst.cols, [&] {
    return std::string("copy: shapes differ (") + std::to_string(src.rows) + "x" +
           std::to_string(src.cols) + " -> " + std::to_string(dst.rows) + "x" +
           std::to_string(dst.cols) + ")";
  });
  if (src.empty()) return;
  with_map(dst, [&](auto d) { with_map(src, [&](auto s) { d = s; }); });
}

template <class T>
void axpby_impl(T alpha, ConstMatrixView<T> X, T beta, MatrixView<T> C) {
  require(X.rows == C.rows && X.cols == C.cols, [&] {
    return std::string("axpby: shapes differ (") + std::to_string(X.rows) + "x" +
           std::to_string(X.cols) + " vs " + std::to_string(C.rows) + "x" + std::to_string(C.cols) +
           ")";
  });
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
  with_map(X, [&](auto x) {
    if (beta == T(0))
      o = x.colwise().sum();
    else
      o = beta * o + x.colwise().sum();
  });
}

}  // namespace

void* CpuBackend::allocate(std::size_t bytes) {
  const std::size_t size = (bytes + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, size == 0 ? kAlign : size);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void CpuBackend::deallocate(void* p, std::size_t) noexcept {
  std::free(p);
}

std::size_t CpuBackend::gemm_scratch_bytes(index_t m, index_t n, index_t k, DType t) const {
  return t == DType::f32 ? scratch_bytes<float>(m, n, k) : scratch_bytes<double>(m, n, k);
}

void CpuBackend::gemm(Op ta, Op tb, float alpha, ConstMatrixView<float> A, ConstMatrixView<float> B,
                      float beta, MatrixView<float> C, Scratch s) {
  gemm_impl(ta, tb, alpha, A, B, beta, C, s);
}
void CpuBackend::gemm(Op ta, Op tb, double alpha, ConstMatrixView<double> A,
                      ConstMatrixView<double> B, double beta, MatrixView<double> C, Scratch s) {
  gemm_impl(ta, tb, alpha, A, B, beta, C, s);
}
void CpuBackend::copy(ConstMatrixView<float> src, MatrixView<float> dst) {
  copy_impl(src, dst);
}
void CpuBackend::copy(ConstMatrixView<double> src, MatrixView<double> dst) {
  copy_impl(src, dst);
}
void CpuBackend::axpby(float alpha, ConstMatrixView<float> X, float beta, MatrixView<float> C) {
  axpby_impl(alpha, X, beta, C);
}
void CpuBackend::axpby(double alpha, ConstMatrixView<double> X, double beta, MatrixView<double> C) {
  axpby_impl(alpha, X, beta, C);
}

void CpuBackend::scale(float beta, MatrixView<float> C) {
  scale_impl(beta, C);
}
void CpuBackend::scale(double beta, MatrixView<double> C) {
  scale_impl(beta, C);
}

void CpuBackend::add_bias(MatrixView<float> Y, const float* bias) {
  add_bias_impl(Y, bias);
}
void CpuBackend::add_bias(MatrixView<double> Y, const double* bias) {
  add_bias_impl(Y, bias);
}
void CpuBackend::column_sums(ConstMatrixView<float> X, float beta, float* out) {
  column_sums_impl(X, beta, out);
}
void CpuBackend::column_sums(ConstMatrixView<double> X, double beta, double* out) {
  column_sums_impl(X, beta, out);
}

}  // namespace summa

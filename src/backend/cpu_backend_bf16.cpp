// CpuBackend's bf16 overloads (Backend, "Mixed precision"): bf16 storage,
// fp32 arithmetic, one rounding to bf16 per stored element. GEMM converts
// k-panels of op(A) and op(B) to fp32 in the caller's scratch and runs the
// float GEMM into an fp32 copy of C; the elementwise kernels are plain loops
// that widen each element (GeLU widens segments to float and runs the float
// kernel; softmax and cross-entropy keep the float op's per-element formulas),
// so those outputs are the float op's outputs rounded to bf16.

#include "summa/backend/cpu_backend.hpp"

#include "summa/backend/optimizer_math.hpp"

#include "cpu_elementwise.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace summa {

namespace {

constexpr std::size_t kAlign = 64;
// Inner-dimension panel of the bf16 GEMM: op(A) is widened m x kPanel and
// op(B) kPanel x n at a time, so the scratch grows with m*n, not with k.
constexpr index_t kPanel = 256;

inline float f32(bf16 x) {
  return static_cast<float>(x);
}
inline std::size_t round_up(std::size_t b) {
  return (b + kAlign - 1) / kAlign * kAlign;
}
inline std::size_t fbytes(index_t r, index_t c) {
  return round_up(static_cast<std::size_t>(r * c) * sizeof(float));
}

using cpu_detail::for_each_element;

inline index_t local_index(std::int32_t target, index_t base, index_t count) {
  const index_t c = static_cast<index_t>(target) - base;
  return c >= 0 && c < count ? c : index_t(-1);
}

inline index_t causal_end(index_t r, index_t rows, index_t cols) {
  // aligned at the bottom right: with fewer rows than columns (the queries
  // of a decoding step against all cached keys) row r is query cols-rows+r
  const index_t end = r + 1 + (cols > rows ? cols - rows : 0);
  return end < cols ? end : cols;
}

}  // namespace

namespace cpu_detail {

// Scratch of the bf16 GEMM: C in fp32 (m x n), one fp32 panel of op(A)
// (m x kc) and of op(B) (kc x n), and the float GEMM's own scratch.
std::size_t bf16_gemm_scratch_bytes(const CpuBackend& backend, index_t m, index_t n, index_t k) {
  if (m <= 0 || n <= 0) return 0;
  if (k <= 0) return 0;
  const index_t kc = std::min(k, kPanel), last = k % kc;
  // The float GEMM runs on full panels of depth kc and on the last, shorter
  // one; Eigen's blocking differs with the depth, so size for both.
  const std::size_t inner =
      std::max(backend.gemm_scratch_bytes(m, n, kc, DType::f32),
               last > 0 ? backend.gemm_scratch_bytes(m, n, last, DType::f32) : std::size_t{0});
  return kAlign + fbytes(m, n) + fbytes(m, kc) + fbytes(kc, n) + inner;
}

}  // namespace cpu_detail

void CpuBackend::do_gemm(Op ta, Op tb, float alpha, ConstMatrixView<bf16> A,
                         ConstMatrixView<bf16> B, float beta, MatrixView<bf16> C, Scratch scratch) {
  const index_t m = C.rows, n = C.cols, k = ta == Op::N ? A.cols : A.rows;
  if (m == 0 || n == 0) return;
  if (alpha == 0.0f || k == 0) {
    do_scale(beta, C);
    return;
  }
  const std::size_t need = cpu_detail::bf16_gemm_scratch_bytes(*this, m, n, k);
  std::vector<unsigned char> own;  // only when the caller's scratch is too small (documented)
  if (scratch.data == nullptr || scratch.bytes < need) {
    own.resize(need);
    scratch = Scratch{own.data(), need};
  }
  const index_t kc = std::min(k, kPanel);
  auto p = reinterpret_cast<std::uintptr_t>(scratch.data);
  p = (p + kAlign - 1) / kAlign * kAlign;
  float* cf = reinterpret_cast<float*>(p);
  p += fbytes(m, n);
  float* af = reinterpret_cast<float*>(p);
  p += fbytes(m, kc);
  float* bfp = reinterpret_cast<float*>(p);
  p += fbytes(kc, n);
  const std::size_t used = p - reinterpret_cast<std::uintptr_t>(scratch.data);
  const Scratch rest{reinterpret_cast<void*>(p), scratch.bytes - used};

  // fp32 C (col-major m x n): beta * C, or zeros without reading C.
  const MatrixView<float> Cf = MatrixView<float>::dense(cf, m, n);
  for (index_t c = 0; c < n; ++c)
    for (index_t r = 0; r < m; ++r) Cf(r, c) = beta == 0.0f ? 0.0f : beta * f32(C(r, c));
  for (index_t k0 = 0; k0 < k; k0 += kc) {
    const index_t kk = std::min(kc, k - k0);
    const MatrixView<float> Ap = MatrixView<float>::dense(af, m, kk);
    const MatrixView<float> Bp = MatrixView<float>::dense(bfp, kk, n);
    for (index_t j = 0; j < kk; ++j)
      for (index_t i = 0; i < m; ++i) Ap(i, j) = f32(ta == Op::N ? A(i, k0 + j) : A(k0 + j, i));
    for (index_t c = 0; c < n; ++c)
      for (index_t j = 0; j < kk; ++j) Bp(j, c) = f32(tb == Op::N ? B(k0 + j, c) : B(c, k0 + j));
    do_gemm(Op::N, Op::N, alpha, ConstMatrixView<float>(Ap), ConstMatrixView<float>(Bp), 1.0f, Cf,
            rest);
  }
  for_each_element(m, n, C.order, [&](index_t r, index_t c) { C(r, c) = bf16(Cf(r, c)); });
}

void CpuBackend::do_copy(ConstMatrixView<bf16> src, MatrixView<bf16> dst) {
  for_each_element(dst.rows, dst.cols, dst.order,
                   [&](index_t r, index_t c) { dst(r, c) = src(r, c); });
}
void CpuBackend::do_convert(ConstMatrixView<float> src, MatrixView<bf16> dst) {
  for_each_element(dst.rows, dst.cols, dst.order,
                   [&](index_t r, index_t c) { dst(r, c) = bf16(src(r, c)); });
}
void CpuBackend::do_convert(ConstMatrixView<bf16> src, MatrixView<float> dst) {
  for_each_element(dst.rows, dst.cols, dst.order,
                   [&](index_t r, index_t c) { dst(r, c) = f32(src(r, c)); });
}
void CpuBackend::do_axpby(float alpha, ConstMatrixView<bf16> X, float beta, MatrixView<bf16> C) {
  for_each_element(C.rows, C.cols, C.order, [&](index_t r, index_t c) {
    const float x = alpha * f32(X(r, c));
    C(r, c) = bf16(beta == 0.0f ? x : x + beta * f32(C(r, c)));
  });
}
void CpuBackend::do_scale(float beta, MatrixView<bf16> C) {
  if (beta == 1.0f) return;
  for_each_element(C.rows, C.cols, C.order, [&](index_t r, index_t c) {
    C(r, c) = beta == 0.0f ? bf16(0.0f) : bf16(beta * f32(C(r, c)));
  });
}
void CpuBackend::do_add_bias(MatrixView<bf16> Y, const bf16* bias) {
  for_each_element(Y.rows, Y.cols, Y.order,
                   [&](index_t r, index_t c) { Y(r, c) = bf16(f32(Y(r, c)) + f32(bias[c])); });
}
void CpuBackend::do_column_sums(ConstMatrixView<bf16> X, float beta, bf16* out) {
  for (index_t c = 0; c < X.cols; ++c) {
    float s = 0;
    for (index_t r = 0; r < X.rows; ++r) s += f32(X(r, c));
    out[c] = bf16(beta == 0.0f ? s : beta * f32(out[c]) + s);
  }
}

void CpuBackend::do_layernorm_partial_sums(ConstMatrixView<bf16> X, const float* center,
                                           float* out) {
  for (index_t r = 0; r < X.rows; ++r) {
    float s = 0;
    if (center == nullptr) {
      for (index_t c = 0; c < X.cols; ++c) s += f32(X(r, c));
    } else {
      for (index_t c = 0; c < X.cols; ++c) {
        const float d = f32(X(r, c)) - center[r];
        s += d * d;
      }
    }
    out[r] = s;
  }
}
void CpuBackend::do_layernorm_apply(ConstMatrixView<bf16> X, const float* mean, const float* rstd,
                                    const bf16* gamma, const bf16* beta, MatrixView<bf16> Y) {
  for_each_element(Y.rows, Y.cols, Y.order, [&](index_t r, index_t c) {
    Y(r, c) = bf16((f32(X(r, c)) - mean[r]) * rstd[r] * f32(gamma[c]) + f32(beta[c]));
  });
}
void CpuBackend::do_layernorm_backward_partials(ConstMatrixView<bf16> X, ConstMatrixView<bf16> dY,
                                                const float* mean, const float* rstd,
                                                const bf16* gamma, float* a, float* b) {
  for (index_t r = 0; r < X.rows; ++r) {
    float sa = 0, sb = 0;
    for (index_t c = 0; c < X.cols; ++c) {
      const float g = f32(dY(r, c)) * f32(gamma[c]);
      const float xhat = (f32(X(r, c)) - mean[r]) * rstd[r];
      sa += g;
      sb += g * xhat;
    }
    a[r] = sa;
    b[r] = sb;
  }
}
void CpuBackend::do_layernorm_backward_apply(ConstMatrixView<bf16> X, ConstMatrixView<bf16> dY,
                                             const float* mean, const float* rstd,
                                             const bf16* gamma, const float* a, const float* b,
                                             index_t h, MatrixView<bf16> dX) {
  const float hh = static_cast<float>(h), inv_h = 1.0f / hh;
  for_each_element(dX.rows, dX.cols, dX.order, [&](index_t r, index_t c) {
    const float g = f32(dY(r, c)) * f32(gamma[c]);
    const float xhat = (f32(X(r, c)) - mean[r]) * rstd[r];
    dX(r, c) = bf16((g * hh - a[r] - xhat * b[r]) * rstd[r] * inv_h);
  });
}
void CpuBackend::do_layernorm_param_partials(ConstMatrixView<bf16> X, ConstMatrixView<bf16> dY,
                                             const float* mean, const float* rstd, bf16* dgamma,
                                             bf16* dbeta) {
  for (index_t c = 0; c < X.cols; ++c) {
    float sg = 0, sb = 0;
    for (index_t r = 0; r < X.rows; ++r) {
      const float dy = f32(dY(r, c));
      sg += dy * (f32(X(r, c)) - mean[r]) * rstd[r];
      sb += dy;
    }
    dgamma[c] = bf16(sg);
    dbeta[c] = bf16(sb);
  }
}

// GeLU: each segment widened to float on the stack, the float kernel, one
// rounding per element (the float op's output rounded to bf16).
void CpuBackend::do_gelu_forward(ConstMatrixView<bf16> X, MatrixView<bf16> Y) {
  cpu_detail::gelu_forward_view<bf16, float>(X, Y);
}
void CpuBackend::do_gelu_backward(ConstMatrixView<bf16> X, ConstMatrixView<bf16> dY,
                                  MatrixView<bf16> dX) {
  cpu_detail::gelu_backward_view<bf16, float>(X, dY, dX);
}

void CpuBackend::do_softmax_causal(ConstMatrixView<bf16> S, double scale, MatrixView<bf16> P) {
  for (index_t r = 0; r < P.rows; ++r) {
    const index_t end = causal_end(r, P.rows, P.cols);
    double m = -std::numeric_limits<double>::infinity();
    for (index_t c = 0; c < end; ++c) m = std::max(m, scale * static_cast<double>(f32(S(r, c))));
    double sum = 0;
    for (index_t c = 0; c < end; ++c)
      sum += std::exp(scale * static_cast<double>(f32(S(r, c))) - m);
    const double inv = 1.0 / sum;
    // Both reading passes finish before the row is written, so P may be S.
    for (index_t c = 0; c < end; ++c)
      P(r, c) =
          bf16(static_cast<float>(std::exp(scale * static_cast<double>(f32(S(r, c))) - m) * inv));
    for (index_t c = end; c < P.cols; ++c) P(r, c) = bf16(0.0f);
  }
}
void CpuBackend::do_softmax_causal_backward(ConstMatrixView<bf16> P, ConstMatrixView<bf16> dP,
                                            double scale, MatrixView<bf16> dS) {
  for (index_t r = 0; r < dS.rows; ++r) {
    const index_t end = causal_end(r, dS.rows, dS.cols);
    double dot = 0;
    for (index_t c = 0; c < end; ++c)
      dot += static_cast<double>(f32(dP(r, c))) * static_cast<double>(f32(P(r, c)));
    for (index_t c = 0; c < end; ++c) {
      const double p = f32(P(r, c)), dp = f32(dP(r, c));
      dS(r, c) = bf16(scale * p * (dp - dot));
    }
    for (index_t c = end; c < dS.cols; ++c) dS(r, c) = bf16(0.0f);
  }
}

void CpuBackend::do_row_max(ConstMatrixView<bf16> Z, float* out) {
  for (index_t r = 0; r < Z.rows; ++r) {
    float m = -std::numeric_limits<float>::infinity();
    for (index_t c = 0; c < Z.cols; ++c) m = std::max(m, f32(Z(r, c)));
    out[r] = m;
  }
}
void CpuBackend::do_row_sum_exp(ConstMatrixView<bf16> Z, const float* max, float* out) {
  for (index_t r = 0; r < Z.rows; ++r) {
    const double m = Z.cols > 0 ? static_cast<double>(max[r]) : 0.0;  // max: null if no columns
    double sum = 0;
    for (index_t c = 0; c < Z.cols; ++c) sum += std::exp(static_cast<double>(f32(Z(r, c))) - m);
    out[r] = static_cast<float>(sum);
  }
}
void CpuBackend::do_pick_targets(ConstMatrixView<bf16> Z, const std::int32_t* targets, index_t col0,
                                 float* out) {
  for (index_t r = 0; r < Z.rows; ++r) {
    const index_t c = local_index(targets[r], col0, Z.cols);
    out[r] = c >= 0 ? f32(Z(r, c)) : 0.0f;
  }
}
void CpuBackend::do_cross_entropy_grad(MatrixView<bf16> Z, const float* max, const float* sum,
                                       const std::int32_t* targets, index_t col0, double scale) {
  for_each_element(Z.rows, Z.cols, Z.order, [&](index_t r, index_t c) {
    const double p = std::exp(static_cast<double>(f32(Z(r, c))) - static_cast<double>(max[r])) /
                     static_cast<double>(sum[r]);
    const double hit = c + col0 == static_cast<index_t>(targets[r]) ? 1.0 : 0.0;
    Z(r, c) = bf16(static_cast<float>(scale * (p - hit)));
  });
}

void CpuBackend::do_gather_rows(const std::int32_t* ids, index_t row0, ConstMatrixView<bf16> table,
                                bool accumulate, MatrixView<bf16> out) {
  for_each_element(out.rows, out.cols, out.order, [&](index_t r, index_t c) {
    const index_t t = local_index(ids[r], row0, table.rows);
    if (t >= 0)
      out(r, c) = accumulate ? bf16(f32(out(r, c)) + f32(table(t, c))) : table(t, c);
    else if (!accumulate)
      out(r, c) = bf16(0.0f);
  });
}
void CpuBackend::do_scatter_add_rows(const std::int32_t* ids, index_t row0,
                                     ConstMatrixView<bf16> src, MatrixView<bf16> table) {
  if (src.cols == 0) return;  // ids are read only for rows with elements
  for (index_t r = 0; r < src.rows; ++r) {
    const index_t t = local_index(ids[r], row0, table.rows);
    if (t < 0) continue;
    for (index_t c = 0; c < src.cols; ++c) table(t, c) = bf16(f32(table(t, c)) + f32(src(r, c)));
  }
}

// The arithmetic of optim::adamw_update / sgd_update with M = float, on the
// fp32 master copy; the bf16 parameter is the master rounded once.
void CpuBackend::do_adamw_update(bf16* param, const bf16* grad, float* exp_avg, float* exp_avg_sq,
                                 float* master, index_t n, const optim::AdamWCoefficients& c) {
  const float decay = static_cast<float>(1.0 - c.lr * c.weight_decay);
  const float beta1 = static_cast<float>(c.beta1),
              one_minus_beta1 = static_cast<float>(1.0 - c.beta1);
  const float beta2 = static_cast<float>(c.beta2),
              one_minus_beta2 = static_cast<float>(1.0 - c.beta2);
  const float eps = static_cast<float>(c.eps), step_size = static_cast<float>(c.step_size);
  const float bias_correction2_sqrt = static_cast<float>(c.bias_correction2_sqrt);
  for (index_t i = 0; i < n; ++i) {
    const float g = f32(grad[i]);
    const float m = beta1 * exp_avg[i] + one_minus_beta1 * g;
    const float v = beta2 * exp_avg_sq[i] + one_minus_beta2 * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const float denom = std::sqrt(v) / bias_correction2_sqrt + eps;
    const float p = master[i] * decay;
    master[i] = p - step_size * m / denom;
    param[i] = bf16(master[i]);
  }
}
void CpuBackend::do_sgd_update(bf16* param, const bf16* grad, float* momentum_buffer, float* master,
                               index_t n, const optim::SgdCoefficients& c) {
  const float lr = static_cast<float>(c.lr), weight_decay = static_cast<float>(c.weight_decay);
  const float momentum = static_cast<float>(c.momentum);
  for (index_t i = 0; i < n; ++i) {
    const float p = master[i];
    const float d = f32(grad[i]) + weight_decay * p;
    const float b = momentum * momentum_buffer[i] + d;
    momentum_buffer[i] = b;
    master[i] = p - lr * (c.nesterov ? d + momentum * b : b);
    param[i] = bf16(master[i]);
  }
}
double CpuBackend::do_sum_of_squares(const bf16* x, index_t n) {
  double s = 0;
  for (index_t i = 0; i < n; ++i) {
    const double v = f32(x[i]);
    s += v * v;
  }
  return s;
}
void CpuBackend::do_scale_in_place(bf16* x, index_t n, double factor) {
  const float f = static_cast<float>(factor);
  for (index_t i = 0; i < n; ++i) x[i] = bf16(f32(x[i]) * f);
}

}  // namespace summa

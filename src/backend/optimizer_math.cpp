#include "summa/backend/optimizer_math.hpp"

#include <cmath>

namespace summa {

// ---------------------------------------------------------------- element kernels

namespace optim {

template <class T, class M>
void adamw_update(T* __restrict param, const T* __restrict grad, M* __restrict exp_avg,
                  M* __restrict exp_avg_sq, index_t n, const AdamWCoefficients& c) {
  const M decay = static_cast<M>(1.0 - c.lr * c.weight_decay);
  const M beta1 = static_cast<M>(c.beta1), one_minus_beta1 = static_cast<M>(1.0 - c.beta1);
  const M beta2 = static_cast<M>(c.beta2), one_minus_beta2 = static_cast<M>(1.0 - c.beta2);
  const M eps = static_cast<M>(c.eps), step_size = static_cast<M>(c.step_size);
  const M bias_correction2_sqrt = static_cast<M>(c.bias_correction2_sqrt);
  for (index_t i = 0; i < n; ++i) {
    const M g = static_cast<M>(grad[i]);
    const M m = beta1 * exp_avg[i] + one_minus_beta1 * g;
    const M v = beta2 * exp_avg_sq[i] + one_minus_beta2 * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const M denom = std::sqrt(v) / bias_correction2_sqrt + eps;
    const M p = static_cast<M>(param[i]) * decay;
    param[i] = static_cast<T>(p - step_size * m / denom);
  }
}

template <class T, class M>
void sgd_update(T* __restrict param, const T* __restrict grad, M* __restrict momentum_buffer,
                index_t n, const SgdCoefficients& c) {
  const M lr = static_cast<M>(c.lr), weight_decay = static_cast<M>(c.weight_decay);
  const M momentum = static_cast<M>(c.momentum);
  // Two loops rather than a branch per element, so each vectorises.
  if (c.nesterov) {
    for (index_t i = 0; i < n; ++i) {
      const M p = static_cast<M>(param[i]);
      const M d = static_cast<M>(grad[i]) + weight_decay * p;
      const M b = momentum * momentum_buffer[i] + d;
      momentum_buffer[i] = b;
      param[i] = static_cast<T>(p - lr * (d + momentum * b));
    }
  } else {
    for (index_t i = 0; i < n; ++i) {
      const M p = static_cast<M>(param[i]);
      const M d = static_cast<M>(grad[i]) + weight_decay * p;
      const M b = momentum * momentum_buffer[i] + d;
      momentum_buffer[i] = b;
      param[i] = static_cast<T>(p - lr * b);
    }
  }
}

template <class T>
double sum_of_squares(const T* x, index_t n) {
  double sum = 0;
  for (index_t i = 0; i < n; ++i) {
    const auto v = static_cast<double>(x[i]);
    sum += v * v;
  }
  return sum;
}

template <class T>
void scale_in_place(T* x, index_t n, double factor) {
  const auto f = static_cast<T>(factor);
  for (index_t i = 0; i < n; ++i) x[i] *= f;
}

template void adamw_update(float*, const float*, float*, float*, index_t, const AdamWCoefficients&);
template void adamw_update(double*, const double*, double*, double*, index_t,
                           const AdamWCoefficients&);
template void sgd_update(float*, const float*, float*, index_t, const SgdCoefficients&);
template void sgd_update(double*, const double*, double*, index_t, const SgdCoefficients&);
template double sum_of_squares(const float*, index_t);
template double sum_of_squares(const double*, index_t);
template void scale_in_place(float*, index_t, double);
template void scale_in_place(double*, index_t, double);

}  // namespace optim

}  // namespace summa

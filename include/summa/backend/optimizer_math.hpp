#pragma once
/// \file optimizer_math.hpp
/// The optimizer's per-element update arithmetic (AdamW, SGD, the squared
/// norm, scaling) on raw host pointers: the backend side of summa/optim
/// (Optimizer, optimizer.hpp, steps through the Backend's optimizer ops;
/// CpuBackend runs these, a device backend implements them as kernels with
/// the same coefficients).

#include "summa/core/types.hpp"

namespace summa {

/// Per-element update arithmetic on raw host pointers: the reference
/// formulas behind CpuBackend's optimizer ops, which a device backend
/// implements as kernels (Optimizer calls the backend, never these directly).
namespace optim {

/// Scalars of one AdamW update (PyTorch's _single_tensor_adamw):
/// step_size = lr / (1 − beta1^t), bias_correction2_sqrt = sqrt(1 − beta2^t).
struct AdamWCoefficients {
  double lr = 0, weight_decay = 0, beta1 = 0, beta2 = 0, eps = 0;
  double step_size = 0, bias_correction2_sqrt = 1;
};

/// For i in [0, n), in M arithmetic:
///   p ← p · (1 − lr·weight_decay)
///   m ← beta1·m + (1 − beta1)·g;  v ← beta2·v + (1 − beta2)·g²
///   p ← p − step_size · m / (sqrt(v) / bias_correction2_sqrt + eps)
template <class T, class M>
void adamw_update(T* param, const T* grad, M* exp_avg, M* exp_avg_sq, index_t n,
                  const AdamWCoefficients& c);

/// Scalars of one SGD update (PyTorch's _single_tensor_sgd, dampening 0).
struct SgdCoefficients {
  double lr = 0, weight_decay = 0, momentum = 0;
  bool nesterov = false;
};

/// For i in [0, n), in M arithmetic:
///   d ← g + weight_decay·p;  buf ← momentum·buf + d
///   p ← p − lr · (nesterov ? d + momentum·buf : buf)
/// (A zero buffer makes the first step buf = d, as PyTorch's clone.)
template <class T, class M>
void sgd_update(T* param, const T* grad, M* momentum_buffer, index_t n, const SgdCoefficients& c);

/// Σ x[i]² in double.
template <class T>
double sum_of_squares(const T* x, index_t n);

/// x[i] ← x[i] · factor (factor rounded to T).
template <class T>
void scale_in_place(T* x, index_t n, double factor);

}  // namespace optim

}  // namespace summa

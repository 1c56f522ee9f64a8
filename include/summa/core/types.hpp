#pragma once
/// \file types.hpp
/// Index type, element types and their runtime tags.

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "summa/core/bf16.hpp"

namespace summa {

/// Signed index used for every matrix dimension (BLAS/Eigen convention).
using index_t = std::int64_t;

/// Runtime tag of an element type; the communicators move bytes, so they only
/// need the tag (and its size) to count traffic and to pick a reduction.
/// bf16 is summa::bf16 (summa/core/bf16.hpp); reductions over it compute in
/// fp32 (docs/communication.md).
enum class DType : std::uint8_t { f32, f64, bf16 };

/// Bytes per element: 4, 8 or 2.
constexpr std::size_t size_of(DType t) {
  switch (t) {
    case DType::f32:
      return 4;
    case DType::f64:
      return 8;
    case DType::bf16:
      return 2;
  }
  return 0;
}

/// The runtime tag of acc_t<T> for a storage tag: f32 for bf16 (per-row
/// statistics and accumulations of bf16 data are fp32), t otherwise.
constexpr DType acc_dtype(DType t) {
  return t == DType::bf16 ? DType::f32 : t;
}

/// "f32", "f64" or "bf16".
constexpr std::string_view name_of(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::f64:
      return "f64";
    case DType::bf16:
      return "bf16";
  }
  return "unknown";
}

template <class T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::f64;
};
template <>
struct dtype_of<bf16> {
  static constexpr DType value = DType::bf16;
};
template <class T>
inline constexpr DType dtype_v = dtype_of<T>::value;

/// Reduction applied by reduce, all-reduce and reduce-scatter.
enum class ReduceOp : std::uint8_t { sum, max, min };

}  // namespace summa

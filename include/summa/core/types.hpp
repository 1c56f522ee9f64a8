#pragma once
/// \file types.hpp
/// Index type, element types and their runtime tags.

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace summa {

/// Signed index used for every matrix dimension (BLAS/Eigen convention).
using index_t = std::int64_t;

/// Runtime tag of an element type; the communicators move bytes, so they only
/// need the tag (and its size) to count traffic and to pick a reduction.
enum class DType : std::uint8_t { f32, f64 };

constexpr std::size_t size_of(DType t) {
  return t == DType::f32 ? 4 : 8;
}

constexpr std::string_view name_of(DType t) {
  return t == DType::f32 ? "f32" : "f64";
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
template <class T>
inline constexpr DType dtype_v = dtype_of<T>::value;

/// Reduction applied by reduce, all-reduce and reduce-scatter.
enum class ReduceOp : std::uint8_t { sum, max, min };

}  // namespace summa

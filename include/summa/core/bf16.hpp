#pragma once
/// \file bf16.hpp
/// bfloat16 storage type for mixed-precision training (issue 6): bf16
/// parameters, activations and gradients, with every arithmetic operation
/// done in fp32 and one rounding per stored element (docs/gpu.md, "Mixed
/// precision").
///
/// Host-only: summa::bf16 has the bit layout of CUDA's __nv_bfloat16 (the
/// upper 16 bits of an IEEE-754 binary32), so device code reinterprets the
/// same memory as __nv_bfloat16 and converts with its intrinsics.

#include <bit>
#include <cstdint>
#include <type_traits>

namespace summa {

/// bfloat16: 1 sign bit, 8 exponent bits (fp32's range), 7 mantissa bits
/// (relative rounding error at most 2^-9 with round-to-nearest-even, one
/// unit in the last place 2^-7 relative to the leading bit).
///
/// A plain value type: trivially copyable, 2 bytes, no arithmetic operators
/// (convert to float, compute, convert back — that is the convention of the
/// whole library). Conversions from float/double/int are explicit so that
/// templated layer code can write `T(0)`, `T(1)` or `static_cast<T>(x)`.
struct bf16 {
  /// The raw bits (the upper half of the binary32 with the same sign and
  /// exponent).
  std::uint16_t bits;

  /// Zero-initialised by value-initialisation (`bf16{}`), uninitialised by
  /// default-initialisation, like float.
  bf16() = default;

  /// Rounds to nearest, ties to even; NaN stays NaN (made quiet, sign kept);
  /// infinities and overflow to infinity as in IEEE rounding.
  constexpr explicit bf16(float f) : bits(round_bits(f)) {}
  /// Rounds the double to float first, then to bf16 (the double rounding can
  /// differ from direct rounding only on exact float ties: irrelevant here).
  constexpr explicit bf16(double d) : bf16(static_cast<float>(d)) {}
  /// Exact for |i| <= 256, rounded beyond.
  constexpr explicit bf16(int i) : bf16(static_cast<float>(i)) {}

  /// The bf16 with these raw bits.
  static constexpr bf16 from_bits(std::uint16_t b) {
    bf16 r{};
    r.bits = b;
    return r;
  }

  /// Exact widening.
  constexpr explicit operator float() const {
    return bit_cast_float(static_cast<std::uint32_t>(bits) << 16);
  }
  constexpr explicit operator double() const { return static_cast<double>(float(*this)); }

  /// Bitwise equality would make +0 != -0 and NaN == NaN; compare as float.
  friend constexpr bool operator==(bf16 a, bf16 b) { return float(a) == float(b); }

 private:
  static constexpr float bit_cast_float(std::uint32_t u) { return std::bit_cast<float>(u); }
  static constexpr std::uint32_t bit_cast_u32(float f) { return std::bit_cast<std::uint32_t>(f); }
  static constexpr std::uint16_t round_bits(float f) {
    const std::uint32_t u = bit_cast_u32(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)  // NaN: keep sign and top payload, force quiet
      return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
    // Round to nearest even: add 0x7fff plus the lowest kept bit; a carry
    // into the exponent is the correct rounding (up to infinity at the top).
    const std::uint32_t lsb = (u >> 16) & 1u;
    return static_cast<std::uint16_t>((u + 0x7fffu + lsb) >> 16);
  }
};

static_assert(sizeof(bf16) == 2 && alignof(bf16) == 2);
static_assert(std::is_trivially_copyable_v<bf16> && std::is_standard_layout_v<bf16>);

/// Accumulation / statistics type of element type T: float for bf16, T
/// otherwise. Per-row statistics (LayerNorm mean, rstd and partial sums,
/// softmax / cross-entropy row max and sum, picked logits) are held in
/// acc_t<T>.
template <class T>
using acc_t = std::conditional_t<std::is_same_v<std::remove_cv_t<T>, bf16>, float, T>;

}  // namespace summa

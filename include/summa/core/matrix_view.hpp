#pragma once
/// \file matrix_view.hpp
/// Non-owning strided matrix views: the currency of the local-math seam and of
/// the SUMMA engine. Ownership always lives elsewhere (an arena, a std::vector,
/// a device allocation); a view never allocates or frees.

#include <string>

#include "summa/core/error.hpp"
#include "summa/core/types.hpp"

namespace summa {

/// Storage order of a view. Column-major is the BLAS convention; row-major is
/// what activations [tokens, hidden] usually use. Both are first-class.
enum class Order : std::uint8_t { col_major, row_major };

/// Transposition flag for GEMM operands.
enum class Op : std::uint8_t { N, T };

/// A rows x cols matrix at `data` with leading dimension `ld`:
///   col_major: element (i, j) at data[i + j * ld], ld >= rows
///   row_major: element (i, j) at data[i * ld + j], ld >= cols
template <class T>
struct MatrixView {
  T* data = nullptr;
  index_t rows = 0;
  index_t cols = 0;
  index_t ld = 0;
  Order order = Order::col_major;

  constexpr MatrixView() = default;
  constexpr MatrixView(T* d, index_t r, index_t c, index_t leading, Order o = Order::col_major)
      : data(d), rows(r), cols(c), ld(leading), order(o) {}

  /// A dense (ld = rows or cols) view.
  static constexpr MatrixView dense(T* d, index_t r, index_t c, Order o = Order::col_major) {
    index_t leading = o == Order::col_major ? r : c;
    return MatrixView(d, r, c, leading < 1 ? 1 : leading, o);
  }

  /// Implicit conversion to a view of const elements.
  constexpr operator MatrixView<const T>() const  // NOLINT(google-explicit-constructor)
  {
    return MatrixView<const T>(data, rows, cols, ld, order);
  }

  constexpr index_t row_stride() const { return order == Order::col_major ? 1 : ld; }
  constexpr index_t col_stride() const { return order == Order::col_major ? ld : 1; }
  constexpr T& operator()(index_t i, index_t j) const {
    return data[i * row_stride() + j * col_stride()];
  }

  /// Sub-block of `nr` x `nc` elements starting at (r0, c0); same ld and order.
  constexpr MatrixView block(index_t r0, index_t c0, index_t nr, index_t nc) const {
    return MatrixView(nr > 0 && nc > 0 ? data + r0 * row_stride() + c0 * col_stride() : data, nr,
                      nc, ld, order);
  }

  /// True when the elements occupy one contiguous range (no gaps).
  constexpr bool contiguous() const {
    return order == Order::col_major ? (ld == rows || cols <= 1) : (ld == cols || rows <= 1);
  }

  constexpr bool empty() const { return rows == 0 || cols == 0; }

  /// Validates shape, leading dimension and data; throws summa::Error naming
  /// `what`. Allocates nothing unless it throws.
  void check_layout(const char* what) const {
    const index_t minimum = order == Order::col_major ? rows : cols;
    require(rows >= 0 && cols >= 0, [&] {
      return std::string(what) + ": negative shape " + std::to_string(rows) + "x" +
             std::to_string(cols);
    });
    require(ld >= (minimum < 1 ? 1 : minimum), [&] {
      return std::string(what) + ": leading dimension " + std::to_string(ld) + " < " +
             (order == Order::col_major ? "rows " : "cols ") + std::to_string(minimum);
    });
    require(empty() || data != nullptr,
            [&] { return std::string(what) + ": null data for a non-empty view"; });
  }
};

template <class T>
using ConstMatrixView = MatrixView<const T>;

}  // namespace summa

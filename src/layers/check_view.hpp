#pragma once
/// \file check_view.hpp
/// An op's local check of a view's shape and layout, shared by layers/ and
/// the scheme folders (not installed). Local shapes are the same on every rank of
/// a scheme whose ops call it with consistent arguments, so a wrong argument
/// fails on every rank alike. Allocates nothing unless it throws.

#include <fmt/format.h>

#include "summa/core/error.hpp"
#include "summa/core/matrix_view.hpp"

namespace summa::detail {

template <class V>
void check_view(const char* where, const char* what, const V& v, index_t rows, index_t cols,
                bool contiguous = false) {
  require(v.rows == rows && v.cols == cols, [&] {
    return fmt::format("{}: {} is {}x{}, expected {}x{}", where, what, v.rows, v.cols, rows, cols);
  });
  v.check_layout(what);
  if (contiguous)
    require(v.contiguous(), [&] {
      return fmt::format("{}: {} must be contiguous (it takes part in a collective)", where, what);
    });
}

}  // namespace summa::detail

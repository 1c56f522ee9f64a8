#pragma once
/// \file error.hpp
/// The one exception type of the library and the check helper that raises it.

#include <stdexcept>
#include <string>

namespace summa {

/// Every error summa reports is a summa::Error. The message names the violated
/// constraint and the values involved, e.g. "m=10 not divisible by q=3".
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Throws summa::Error(message) when `condition` is false.
inline void require(bool condition, const std::string& message) {
  if (!condition) throw Error(message);
}

}  // namespace summa

#pragma once
/// \file error.hpp
/// The library's exception types and the check helper that raises them.

#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace summa {

/// Every error summa reports is a summa::Error. The message names the violated
/// constraint and the values involved, e.g. "m=10 not divisible by q=3".
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// An Error that every rank of a communicator throws together, with the same
/// message (agree_on, ProcessGrid::agree and every collective check built on
/// them). A program may print it once (rank 0) and exit normally on every
/// rank; any other exception was seen by one rank alone, whose peers may be
/// waiting in a collective, so the program should abort the job instead
/// (docs/reliability.md).
class CollectiveError : public Error {
 public:
  using Error::Error;
};

/// What a backend's allocate() throws when memory runs out: a std::bad_alloc
/// (code that catches that still does) whose what() names the bytes asked
/// for and the memory, e.g. "CpuBackend::allocate: 68719476736 bytes of host
/// memory: out of memory".
class OutOfMemory : public std::bad_alloc {
 public:
  explicit OutOfMemory(std::string what) : what_(std::move(what)) {}
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  std::string what_;
};

/// Throws summa::Error(message) when `condition` is false.
inline void require(bool condition, const char* message) {
  if (!condition) throw Error(message);
}
inline void require(bool condition, const std::string& message) {
  if (!condition) throw Error(message);
}
/// Lazy form for hot paths: the message is only built when the check fails,
/// so a passing check never allocates.
template <class MakeMessage>
requires std::is_invocable_r_v<std::string, MakeMessage>
inline void require(bool condition, MakeMessage&& make_message) {
  if (!condition) throw Error(std::forward<MakeMessage>(make_message)());
}

}  // namespace summa

#pragma once
// Helpers shared by the test binaries: fresh random data agreed across ranks,
// local blocks with any storage order and padding, message agreement checks.

#include <mpi.h>

#include <Eigen/Core>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "summa/summa.hpp"

namespace summa::test {

template <class T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;

/// A seed drawn fresh on rank 0 for every call and shared with all ranks, so
/// each run uses new data while every rank sees the same global matrices.
inline std::uint64_t fresh_seed() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  unsigned long long seed = 0;
  if (rank == 0)
    seed = (static_cast<unsigned long long>(std::random_device{}()) << 32) ^ std::random_device{}();
  MPI_Bcast(&seed, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
  return seed;
}

template <class T>
Mat<T> random_matrix(index_t rows, index_t cols, std::mt19937_64& gen) {
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  Mat<T> m(rows, cols);
  for (index_t j = 0; j < cols; ++j)
    for (index_t i = 0; i < rows; ++i) m(i, j) = static_cast<T>(dist(gen));
  return m;
}

/// A local matrix stored in its own buffer with the given order and `pad`
/// extra elements on the leading dimension (so ld > the minimum).
template <class T>
class Block {
 public:
  Block(index_t rows, index_t cols, Order order, index_t pad)
      : rows_(rows), cols_(cols), order_(order) {
    ld_ = (order == Order::col_major ? rows : cols) + pad;
    if (ld_ < 1) ld_ = 1;
    const index_t outer = order == Order::col_major ? cols : rows;
    storage_.assign(static_cast<std::size_t>(ld_ * (outer > 0 ? outer : 1)), T(0));
  }
  MatrixView<T> view() { return MatrixView<T>(storage_.data(), rows_, cols_, ld_, order_); }
  void fill(const Mat<T>& m) {
    auto v = view();
    for (index_t j = 0; j < cols_; ++j)
      for (index_t i = 0; i < rows_; ++i) v(i, j) = m(i, j);
  }
  void fill_value(T x) {
    auto v = view();
    for (index_t j = 0; j < cols_; ++j)
      for (index_t i = 0; i < rows_; ++i) v(i, j) = x;
  }
  Mat<T> read() {
    Mat<T> m(rows_, cols_);
    auto v = view();
    for (index_t j = 0; j < cols_; ++j)
      for (index_t i = 0; i < rows_; ++i) m(i, j) = v(i, j);
    return m;
  }
  /// Padding elements (outside the view) are untouched sentinels.
  std::vector<T>& storage() { return storage_; }

 private:
  index_t rows_, cols_, ld_;
  Order order_;
  std::vector<T> storage_;
};

/// True when `message` is identical on every rank of MPI_COMM_WORLD.
inline bool same_on_all_ranks(const std::string& message) {
  int length = static_cast<int>(message.size());
  MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::string root(static_cast<std::size_t>(length), '\0');
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) root = message;
  MPI_Bcast(root.data(), length, MPI_CHAR, 0, MPI_COMM_WORLD);
  int same = root == message ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return same == 1;
}

/// Counts heap allocations (malloc family and operator new) made by this
/// process while a CountAllocations object is alive: count() those made by
/// anything but the MPI library (summa, Eigen, the C++ runtime), mpi_count()
/// those whose caller is inside MPI. Not available under AddressSanitizer,
/// which owns malloc.
bool allocation_counting_available();
class CountAllocations {
 public:
  CountAllocations();
  ~CountAllocations();
  std::uint64_t count() const;
  std::uint64_t mpi_count() const;
  /// Library and symbol of the first counted allocation's caller.
  std::string first_caller() const;
};

}  // namespace summa::test

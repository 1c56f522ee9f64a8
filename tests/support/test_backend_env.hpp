#pragma once
// The backend a test binary runs on, chosen by the environment, and device
// arrays that move test data between the host and that backend's memory.
//
//   SUMMA_TEST_BACKEND=cpu (or unset)  CpuBackend, MPI communicators
//   SUMMA_TEST_BACKEND=cpu_device      CpuBackend(emulate_device): runs on the
//                                      host but reports host_accessible() ==
//                                      false, so every staging path a GPU
//                                      needs (upload/download instead of
//                                      direct access) runs in CI; MPI
//                                      communicators
//   SUMMA_TEST_BACKEND=cuda            CudaBackend on the device of the
//                                      node-local rank (several ranks share a
//                                      GPU when there are more ranks than
//                                      GPUs), communicators SUMMA_TEST_COMM
//                                      (mpi_staged by default, or nccl)
//
// A binary run with SUMMA_TEST_BACKEND=cuda where summa was built without
// CUDA, or where no device is visible, prints "no CUDA device: skipped" and
// exits 0 from skip_unless_backend_available() (CTest's
// SKIP_REGULAR_EXPRESSION turns that into "Skipped"). Tests written against
// these helpers run unchanged on both backends: they create their inputs on
// the host, upload() them, run, and download() the results.

#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "summa/summa.hpp"

namespace summa::test {

/// "cuda", "cpu_device" or "cpu" (SUMMA_TEST_BACKEND).
inline std::string test_backend_name() {
  const char* env = std::getenv("SUMMA_TEST_BACKEND");
  const std::string name = env != nullptr ? env : "";
  return name == "cuda" || name == "cpu_device" ? name : "cpu";
}

/// Call first in main() (after MPI_Init): with SUMMA_TEST_BACKEND=cuda and no
/// usable device (or no CUDA in this build) prints the skip message on rank
/// 0, finalises MPI and exits 0. Collective.
inline void skip_unless_backend_available() {
  if (test_backend_name() != "cuda") return;
  int devices = cuda_device_count();  // loads the CUDA component (none on the CPU tests)
  MPI_Allreduce(MPI_IN_PLACE, &devices, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (devices > 0) return;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0)
    std::printf("no CUDA device: skipped (SUMMA_TEST_BACKEND=cuda, %s)\n",
                SUMMA_HAVE_CUDA ? "no device visible" : "summa built without CUDA");
  MPI_Finalize();
  std::exit(0);
}

/// The process-wide backend of the tests (constructed on first use).
/// The test binary's backend and communicators (SUMMA_TEST_BACKEND; on
/// cuda SUMMA_TEST_COMM=nccl or mpi_staged, the default: several ranks may
/// share a GPU), made once by the library's device factory.
inline Device& test_device() {
  static Device device = [] {
    const std::string name = test_backend_name();
    const char* env = std::getenv("SUMMA_TEST_COMM");
    DeviceOptions o;
    o.backend = name;
    if (name == "cuda")
      o.comm = env != nullptr && std::string(env) == "nccl" ? "nccl" : "mpi_staged";
    o.check_pointers = true;  // a host pointer in an op is a test failure, not a crash
    return make_device(MPI_COMM_WORLD, o);
  }();
  return device;
}

inline Backend& test_backend() {
  return *test_device().backend;
}

inline GridOptions test_grid_options() {
  return test_device().grid;
}

template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(std::size_t n, Backend& backend = test_backend())
      : backend_(&backend), n_(n) {
    if (n_ > 0) data_ = static_cast<T*>(backend_->allocate(n_ * sizeof(T)));
  }
  explicit DeviceArray(const std::vector<T>& host, Backend& backend = test_backend())
      : DeviceArray(host.size(), backend) {
    upload(host);
  }
  ~DeviceArray() {
    if (data_ != nullptr) backend_->deallocate(data_, n_ * sizeof(T));
  }
  DeviceArray(DeviceArray&& o) noexcept { swap(o); }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    swap(o);
    return *this;
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* data() const { return data_; }
  std::size_t size() const { return n_; }
  /// Copies host.size() (<= size()) elements in.
  void upload(const std::vector<T>& host) {
    if (host.size() > n_) throw Error("DeviceArray::upload: more elements than the array holds");
    if (!host.empty()) backend_->upload(data_, host.data(), host.size() * sizeof(T));
  }
  /// All elements, on the host.
  std::vector<T> download() const {
    std::vector<T> host(n_);
    if (n_ > 0) backend_->download(host.data(), data_, n_ * sizeof(T));
    return host;
  }
  /// A rows x cols view of the first rows * cols elements (ld = the minimum).
  MatrixView<T> view(index_t rows, index_t cols, Order order = Order::row_major) const {
    return MatrixView<T>::dense(data_, rows, cols, order);
  }

 private:
  void swap(DeviceArray& o) noexcept {
    std::swap(backend_, o.backend_);
    std::swap(data_, o.data_);
    std::swap(n_, o.n_);
  }
  Backend* backend_ = nullptr;
  T* data_ = nullptr;
  std::size_t n_ = 0;
};

/// The elements of a view in test_backend()'s memory, row by row, on the host.
template <class T>
std::vector<T> download_view(ConstMatrixView<T> v, Backend& backend = test_backend()) {
  const index_t outer = v.order == Order::col_major ? v.cols : v.rows;
  const index_t inner = v.order == Order::col_major ? v.rows : v.cols;
  std::vector<T> storage(static_cast<std::size_t>(outer > 0 ? (outer - 1) * v.ld + inner : 0));
  if (!storage.empty()) backend.download(storage.data(), v.data, storage.size() * sizeof(T));
  const MatrixView<const T> host(storage.data(), v.rows, v.cols, v.ld, v.order);
  std::vector<T> out;
  out.reserve(static_cast<std::size_t>(v.rows * v.cols));
  for (index_t r = 0; r < v.rows; ++r)
    for (index_t c = 0; c < v.cols; ++c) out.push_back(host(r, c));
  return out;
}

}  // namespace summa::test

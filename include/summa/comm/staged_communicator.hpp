#pragma once
/// \file staged_communicator.hpp
/// Communicator on MPI for device buffers, staged through pinned host memory:
/// the fallback when NCCL cannot be used, above all when several ranks share
/// one GPU (NCCL needs one GPU per rank), e.g. a 2x2 mesh tested on one GPU.
/// Defined in the CUDA component (libsumma_cuda, summa::cuda); the header
/// needs no CUDA headers.
///
/// Each collective copies its input device -> host on the caller's compute
/// stream and synchronises that stream (so the input the compute stream
/// produced is complete), runs the MPI collective on the host copy, and on
/// completion copies the result host -> device on the compute stream
/// (asynchronously: work queued on the compute stream afterwards sees it; host
/// code that reads it synchronises the compute stream first). Buffers may be
/// device or host memory (cudaMemcpyDefault, unified addressing).
///
/// Staging memory is one pinned buffer allocated at construction (or by
/// reserve(), outside a training step); each request in flight holds a piece
/// of it, placed at the lowest free aligned offset (so pieces given back in
/// any order are used again), so the sum of their payloads must fit. Byte counters are
/// exactly MpiCommunicator's (same axis and counter convention). Not
/// thread-safe.

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "summa/comm/communicator.hpp"

namespace summa {

class StagedCommunicator final : public Communicator {
 public:
  /// Default size of the pinned staging buffer (bytes).
  static constexpr std::size_t default_staging_bytes = std::size_t{64} << 20;
  /// Requests that can be in flight at once, by default.
  static constexpr int max_in_flight = 64;

  /// Wraps `comm` (MPI_Comm_free on destruction when `owned`, also when the
  /// constructor throws). `compute_stream` is the cudaStream_t the caller's
  /// kernels run on (nullptr: the legacy default stream). `staging_bytes` of
  /// pinned host memory are allocated now; one collective needs
  ///   broadcast, reduce, all_reduce: count * element size;
  ///   all_gather, reduce_scatter: size() * count * element size;
  ///   send, recv: count * element size.
  /// `requests` (>= 1) requests can be in flight at once.
  /// Collective over `comm`: throws summa::Error on every rank when any
  /// rank's pinned allocation fails.
  StagedCommunicator(MPI_Comm comm, bool owned, CommAxis axis, TrafficCounter* counter,
                     void* compute_stream, std::size_t staging_bytes = default_staging_bytes,
                     int requests = max_in_flight);
  /// Synchronises the compute stream (pending copies read the staging
  /// buffer), then frees it.
  ~StagedCommunicator() override;

  int rank() const override;
  int size() const override;
  bool stream_ordered() const override { return true; }
  /// The wrapped MPI communicator.
  MPI_Comm native() const;
  /// The caller's compute stream (a cudaStream_t).
  void* compute_stream() const;
  /// Size of the pinned staging buffer (bytes).
  std::size_t staging_bytes() const;
  /// Requests issued and not yet completed.
  int in_flight() const;
  /// The most requests that can be in flight at once.
  int max_requests() const;
  /// Grows the staging buffer to at least `bytes` (never shrinks). Allocates:
  /// call it outside a step. Local (not collective); throws summa::Error when
  /// requests are in flight or the allocation fails.
  void reserve(std::size_t bytes);

 protected:
  std::uintptr_t start(Kind kind, const void* send, void* recv, std::size_t count, DType t,
                       ReduceOp op, int root) override;
  void run(Kind kind, const void* send, void* recv, std::size_t count, DType t, ReduceOp op,
           int root) override;
  void finish(std::uintptr_t token) override;
  bool poll(std::uintptr_t token) override;
  /// Synchronises the compute stream, then MPI_Barrier.
  void do_barrier() override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace summa

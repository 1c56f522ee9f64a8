#pragma once
/// \file nccl_communicator.hpp
/// Communicator on NCCL for device buffers, stream-ordered. Defined in summa's
/// CUDA component (libsumma_cuda, CMake target summa::cuda);
/// this header itself needs neither the CUDA nor the NCCL headers: streams,
/// events and the NCCL communicator are opaque handles.
///
/// Ordering model. Every collective is issued on the communicator's own
/// communication stream, after that stream has been made to wait on an event
/// recorded on the caller's compute stream (so the inputs the compute stream
/// produced are ready). Completing a request (wait(), or a blocking call)
/// makes the compute stream wait on an event recorded after the NCCL call:
/// the host never blocks, and work queued on the compute stream afterwards
/// sees the result. Host code that reads a result must synchronise the
/// compute stream first, as for any other device work.
///
/// Host buffers. A call whose buffers are host memory (pageable or pinned, as
/// cudaPointerGetAttributes reports) runs as a blocking MPI collective on the
/// underlying communicator instead, so host values (a loss, a gradient norm)
/// can be reduced through the same communicator; its request is complete on
/// return, and the host data must be ready when it is issued (nothing waits
/// for the compute stream). One call cannot mix host and device buffers, and
/// every rank must pass the same kind of memory. The byte counters are the
/// same either way.
///
/// NCCL's ordering rule applies: collectives on the different communicators
/// of a rank must be issued in the same order on every rank.
///
/// Element types: f32 and f64 (DType). bf16 (ncclBfloat16) is future work:
/// it needs a DType tag first.
///
/// Not thread-safe: one thread issues and completes the requests of a
/// communicator, as with MpiCommunicator.

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "summa/comm/communicator.hpp"

namespace summa {

class NcclCommunicator final : public Communicator {
 public:
  /// Default number of requests a communicator can have in flight.
  static constexpr int default_event_pool = 64;

  /// Builds an NCCL communicator over the ranks of `comm`, in its order
  /// (group rank r of this communicator is rank r of `comm`): rank 0 calls
  /// ncclGetUniqueId, MPI_Bcast shares it, every rank calls ncclCommInitRank
  /// on the CUDA device that is current when the constructor runs (choose it
  /// first, e.g. with select_device_for_rank()). Collective over `comm`.
  ///
  /// `compute_stream` is the cudaStream_t the caller's kernels run on
  /// (CudaBackend::stream()); nullptr is the legacy default stream.
  /// `event_pool` events are created here and recycled: at most that many
  /// requests can be in flight, and no call allocates afterwards.
  /// When `owned`, MPI_Comm_free is called on `comm` on destruction (also
  /// when the constructor throws).
  ///
  /// Throws summa::Error on every rank of `comm` (validated and agreed before
  /// NCCL is initialised) when: event_pool < 1; no CUDA device is usable; or
  /// two ranks of the group would use the same GPU (NCCL needs one GPU per
  /// rank: share a GPU with StagedCommunicator instead). A failure inside
  /// ncclCommInitRank itself is reported on every rank that returns from it.
  NcclCommunicator(MPI_Comm comm, bool owned, CommAxis axis, TrafficCounter* counter,
                   void* compute_stream, int event_pool = default_event_pool);
  /// Waits for the communication stream, then destroys the NCCL communicator
  /// (ncclCommAbort instead while an exception is propagating, so that a
  /// failing rank never waits for peers that are not coming).
  ~NcclCommunicator() override;

  int rank() const override;
  int size() const override;
  bool stream_ordered() const override { return true; }
  /// The MPI communicator the group was built from (for MPI control traffic).
  MPI_Comm native() const;
  /// The CUDA device the NCCL communicator is bound to.
  int device() const;
  /// The caller's compute stream (a cudaStream_t).
  void* compute_stream() const;
  /// The internal communication stream (a cudaStream_t).
  void* comm_stream() const;
  /// Requests issued and not yet completed (each holds one pooled event).
  int in_flight() const;
  /// Size of the event pool: the most requests that can be in flight.
  int event_pool() const;

 protected:
  std::uintptr_t start(Kind kind, const void* send, void* recv, std::size_t count, DType t,
                       ReduceOp op, int root) override;
  void finish(std::uintptr_t token) override;
  bool poll(std::uintptr_t token) override;
  /// Drains the communication and compute streams, then MPI_Barrier on the
  /// underlying communicator: afterwards every rank's GPU work issued before
  /// the barrier has completed.
  void do_barrier() override;
  /// Stream-ordered: wait() does not block the host, so no watchdog guards it.
  bool host_blocking_wait() const override { return false; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Chooses this rank's GPU from its node-local rank: the local rank among the
/// ranks of `comm` that share its node (MPI_Comm_split_type with
/// MPI_COMM_TYPE_SHARED) modulo cudaGetDeviceCount(); calls cudaSetDevice and
/// writes one line to stderr naming the world rank, host, local rank and
/// device (and how many local ranks share it when there are more ranks than
/// devices). Returns the device index. Collective over `comm`; throws
/// summa::Error on every rank when any rank sees no CUDA device or cannot
/// select it. Defined in the CUDA component (summa::cuda).
int select_device_for_rank(MPI_Comm comm);

}  // namespace summa

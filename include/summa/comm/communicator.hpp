#pragma once
/// \file communicator.hpp
/// The collective-communication seam. summa's algorithms talk only to this
/// interface; the MPI implementation lives in mpi_communicator.hpp and an NCCL
/// one (stream-ordered, the same calls) drops in behind it unchanged.
///
/// Rules every implementation follows:
///  - roots are ranks *within the group* (0 .. size()-1), never world ranks;
///  - buffers are raw pointers plus element count and DType; a send and a
///    receive pointer that are equal mean "in place";
///  - every call, blocking or not, adds its exact payload to the counter of
///    the communicator's axis at the moment it is issued (see counters.hpp);
///  - a non-blocking call returns a Request that must be completed with wait()
///    (or test() until true) before its buffers are touched. Requests are
///    small values: issuing and completing them does not allocate.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "summa/comm/counters.hpp"
#include "summa/core/types.hpp"

namespace summa {

class Communicator;
class Watchdog;

/// "broadcast", "reduce", "all_reduce", "all_gather", "reduce_scatter",
/// "send", "recv" or "barrier" for a request's kind code (reports and error
/// messages).
const char* collective_name(int kind);

/// Handle of an in-flight collective. Cheap to copy; completed exactly once.
class Request {
 public:
  Request() = default;
  bool active() const { return owner_ != nullptr; }

 private:
  friend class Communicator;
  Communicator* owner_ = nullptr;
  std::uintptr_t token_ = 0;    ///< implementation-defined (an MPI_Request, an event slot, ...)
  std::uint64_t sequence_ = 0;  ///< the call's number on its communicator (watchdog reports)
  std::uint64_t bytes_ = 0;     ///< its payload on this rank
  std::uint8_t kind_ = 0;
};

class Communicator {
 public:
  Communicator(CommAxis axis, TrafficCounter* counter) : axis_(axis), counter_(counter) {}
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  CommAxis axis() const { return axis_; }
  /// The counter this communicator adds to (shared by all communicators of an axis).
  const TrafficCounter& counter() const { return *counter_; }
  /// True when the communicator orders its collectives with the backend's
  /// compute stream itself (NcclCommunicator, StagedCommunicator): device
  /// buffers produced by work issued before a call may be passed without
  /// Backend::synchronize(). False (MpiCommunicator) means the buffers are
  /// read by the host when the call is issued: the caller synchronises first.
  virtual bool stream_ordered() const { return false; }

  // ---- non-blocking ------------------------------------------------------
  /// buf (count elements) from group rank `root` to all.
  Request ibroadcast(void* buf, std::size_t count, DType t, int root);
  /// Reduce `send` of all ranks into `recv` on `root` (recv ignored elsewhere;
  /// send == recv on the root means in place). A null `recv` on the root is
  /// detected only there: the other ranks cannot know, so they would enter the
  /// collective; callers must pass the same, valid arguments everywhere.
  Request ireduce(const void* send, void* recv, std::size_t count, DType t, ReduceOp op, int root);
  /// All ranks get the reduction of `send` in `recv` (send == recv: in place).
  Request iall_reduce(const void* send, void* recv, std::size_t count, DType t, ReduceOp op);
  /// Rank r's `send_count` elements land at recv + r*send_count on all ranks.
  /// send == recv + rank()*send_count means in place.
  Request iall_gather(const void* send, void* recv, std::size_t send_count, DType t);
  /// send holds size()*recv_count elements; rank r gets the reduction of
  /// block r. send == recv means in place (result in the first recv_count).
  Request ireduce_scatter(const void* send, void* recv, std::size_t recv_count, DType t,
                          ReduceOp op);
  /// Point to point (pipeline stage messages): `count` elements of `buf` to
  /// group rank `peer`, which posts the matching irecv. Messages between two
  /// ranks arrive in the order they were sent. Counted as sent here and
  /// received there (count elements each). NCCL issues each call on its own
  /// (no group): two ranks that both send to each other before receiving
  /// can deadlock there; MPI buffers or progresses them.
  Request isend(const void* buf, std::size_t count, DType t, int peer);
  Request irecv(void* buf, std::size_t count, DType t, int peer);

  /// Blocks until `r` completes; resets it. Waiting on an inactive request is a no-op.
  void wait(Request& r);
  /// True (and resets `r`) when `r` has completed; also drives progress.
  bool test(Request& r);
  /// Blocks until `a` or `b` (both active, both this communicator's)
  /// completes, `a` tested first; resets that one and returns 0 for `a`, 1
  /// for `b`. Guarded by the watchdog as wait() is (its report names `a`;
  /// the waiting rank answers the watchdog's probes meanwhile): a pipeline
  /// stage waiting for whichever neighbour's message arrives first.
  int wait_any(Request& a, Request& b);

  // ---- blocking ------------------------------------------------------------
  void broadcast(void* buf, std::size_t count, DType t, int root);
  void reduce(const void* send, void* recv, std::size_t count, DType t, ReduceOp op, int root);
  void all_reduce(const void* send, void* recv, std::size_t count, DType t, ReduceOp op);
  void all_gather(const void* send, void* recv, std::size_t send_count, DType t);
  void reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType t, ReduceOp op);
  void barrier();

  /// Calls issued on this communicator so far (blocking and non-blocking);
  /// the watchdog names a call by this number, which is the same on every
  /// rank of the group while their calls are in step.
  std::uint64_t sequence() const { return sequence_; }
  /// The watchdog guarding this communicator's waits (Watchdog::attach), or null.
  const Watchdog* watchdog() const { return watchdog_; }

  // typed conveniences
  template <class T>
  void broadcast(T* buf, std::size_t count, int root) {
    broadcast(static_cast<void*>(buf), count, dtype_v<T>, root);
  }
  template <class T>
  void all_reduce(const T* send, T* recv, std::size_t count, ReduceOp op = ReduceOp::sum) {
    all_reduce(send, recv, count, dtype_v<T>, op);
  }
  template <class T>
  void all_gather(const T* send, T* recv, std::size_t send_count) {
    all_gather(send, recv, send_count, dtype_v<T>);
  }

 protected:
  /// send and recv are point to point: `root` is the peer, and send's
  /// buffer is `send`, recv's is `recv`.
  enum class Kind : std::uint8_t {
    broadcast,
    reduce,
    all_reduce,
    all_gather,
    reduce_scatter,
    send,
    recv
  };
  /// Request kind code of a barrier (after the Kind values; watchdog reports).
  static constexpr std::uint8_t barrier_code = 7;
  /// Issue the operation; return an implementation token for the request.
  virtual std::uintptr_t start(Kind kind, const void* send, void* recv, std::size_t count, DType t,
                               ReduceOp op, int root) = 0;
  /// Blocking variant; the default starts and waits.
  virtual void run(Kind kind, const void* send, void* recv, std::size_t count, DType t, ReduceOp op,
                   int root);
  virtual void finish(std::uintptr_t token) = 0;
  virtual bool poll(std::uintptr_t token) = 0;
  virtual void do_barrier() = 0;
  /// Starts a non-blocking barrier for the watchdog; false when the
  /// implementation has none (barrier() then blocks unguarded).
  virtual bool start_barrier(std::uintptr_t& /*token*/) { return false; }
  /// False when wait() does not block the host (stream-ordered completion,
  /// NCCL): the watchdog then leaves the waits alone.
  virtual bool host_blocking_wait() const { return true; }

 private:
  friend class Watchdog;
  void validate(Kind kind, const void* send, void* recv, std::size_t count, int root) const;
  void account(Kind kind, std::size_t count, DType t, int root);
  Request make_request(std::uintptr_t token, std::uint8_t kind, std::uint64_t bytes);
  Request issue(Kind kind, const void* send, void* recv, std::size_t count, DType t, ReduceOp op,
                int root);
  void execute(Kind kind, const void* send, void* recv, std::size_t count, DType t, ReduceOp op,
               int root);

  void guarded_wait(Request& r);
  int guarded_wait_any(Request& a, Request& b);

  CommAxis axis_;
  TrafficCounter* counter_;
  std::uint64_t sequence_ = 0;
  Watchdog* watchdog_ = nullptr;
  std::vector<int> watch_members_;  ///< watchdog ranks of this group (Watchdog::attach)
};

}  // namespace summa

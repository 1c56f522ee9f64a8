#include "summa/comm/communicator.hpp"

#include <fmt/format.h>

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "fault_stop.hpp"
#include "summa/core/error.hpp"

namespace summa {

namespace {

// SUMMA_FAULT_STOP (fault_stop.hpp): before every collective a Communicator
// starts (blocking and non-blocking calls and barriers alike).
detail::FaultStop fault_stop("SUMMA_FAULT_STOP");

inline void count_collective() {
  fault_stop.reached();
}

}  // namespace

namespace detail {

FaultStop::FaultStop(const char* variable) noexcept {
  const char* spec = std::getenv(variable);
  unsigned long long n = 0;
  if (spec != nullptr && std::sscanf(spec, "%d:%llu", &rank_, &n) == 2) at_ = n;
}

[[gnu::noinline, gnu::cold]] void FaultStop::count() noexcept {
  if (calls_.fetch_add(1, std::memory_order_relaxed) + 1 != at_) return;
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);  // MPI is initialised: a communicator exists
  if (rank != rank_) return;
  std::fflush(nullptr);
  std::raise(SIGSTOP);
}

}  // namespace detail

std::string_view name_of(CommAxis axis) {
  switch (axis) {
    case CommAxis::world:
      return "world";
    case CommAxis::data:
      return "data";
    case CommAxis::depth:
      return "depth";
    case CommAxis::mesh_row:
      return "mesh_row";
    case CommAxis::mesh_col:
      return "mesh_col";
    case CommAxis::mesh:
      return "mesh";
    case CommAxis::tensor:
      return "tensor";
    case CommAxis::pipe:
      return "pipe";
    case CommAxis::other:
      return "other";
  }
  return "?";
}

const char* collective_name(int k) {
  static const char* names[] = {"broadcast",      "reduce", "all_reduce", "all_gather",
                                "reduce_scatter", "send",   "recv",       "barrier"};
  return k >= 0 && k <= 7 ? names[k] : "collective";
}

void Communicator::validate(Kind kind, const void* send, void* recv, std::size_t count,
                            int root) const {
  const char* what = collective_name(static_cast<int>(kind));
  if (kind == Kind::broadcast || kind == Kind::reduce) {
    if (root < 0 || root >= size())
      throw Error(fmt::format("{} on axis {}: root {} outside the group [0, {})", what,
                              name_of(axis_), root, size()));
  }
  if (kind == Kind::send || kind == Kind::recv) {
    if (root < 0 || root >= size() || root == rank())
      throw Error(fmt::format("{} on axis {}: peer {} is not another rank of the group [0, {})",
                              what, name_of(axis_), root, size()));
  }
  if (count == 0) return;
  bool need_recv = (kind != Kind::reduce || rank() == root) && kind != Kind::send;
  if ((kind != Kind::broadcast && kind != Kind::recv && send == nullptr) ||
      (need_recv && recv == nullptr))
    throw Error(
        fmt::format("{} on axis {}: null buffer for {} elements", what, name_of(axis_), count));
}

void Communicator::account(Kind kind, std::size_t count, DType t, int root) {
  const std::uint64_t g = static_cast<std::uint64_t>(size());
  const std::uint64_t e = size_of(t);
  const std::uint64_t n = static_cast<std::uint64_t>(count);
  TrafficCounter& c = *counter_;
  c.calls += 1;
  if (g <= 1) return;
  const bool is_root = rank() == root;
  switch (kind) {
    case Kind::broadcast:
      if (is_root)
        c.bytes_sent += (g - 1) * n * e;
      else
        c.bytes_received += n * e;
      break;
    case Kind::reduce:
      if (is_root)
        c.bytes_received += (g - 1) * n * e;
      else
        c.bytes_sent += n * e;
      break;
    case Kind::all_gather:
    case Kind::reduce_scatter:  // count = elements per rank
      c.bytes_sent += (g - 1) * n * e;
      c.bytes_received += (g - 1) * n * e;
      break;
    case Kind::send:
      c.bytes_sent += n * e;
      break;
    case Kind::recv:
      c.bytes_received += n * e;
      break;
    case Kind::all_reduce: {
      const std::uint64_t r = static_cast<std::uint64_t>(rank());
      const std::uint64_t chunk = n / g + (r < n % g ? 1 : 0);
      const std::uint64_t v = ((n - chunk) + (g - 1) * chunk) * e;
      c.bytes_sent += v;
      c.bytes_received += v;
      break;
    }
  }
}

Request Communicator::make_request(std::uintptr_t token, std::uint8_t kind, std::uint64_t bytes) {
  Request r;
  r.owner_ = this;
  r.token_ = token;
  r.sequence_ = sequence_;
  r.bytes_ = bytes;
  r.kind_ = kind;
  return r;
}

Request Communicator::issue(Kind kind, const void* send, void* recv, std::size_t count, DType t,
                            ReduceOp op, int root) {
  validate(kind, send, recv, count, root);
  account(kind, count, t, root);
  count_collective();
  ++sequence_;
  return make_request(start(kind, send, recv, count, t, op, root), static_cast<std::uint8_t>(kind),
                      count * size_of(t));
}

namespace {

// Adds the wall time of its scope to a counter's wait_seconds.
class WaitTimer {
 public:
  explicit WaitTimer(TrafficCounter& c) : c_(c), start_(std::chrono::steady_clock::now()) {}
  ~WaitTimer() {
    c_.wait_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  WaitTimer(const WaitTimer&) = delete;
  WaitTimer& operator=(const WaitTimer&) = delete;

 private:
  TrafficCounter& c_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

void Communicator::execute(Kind kind, const void* send, void* recv, std::size_t count, DType t,
                           ReduceOp op, int root) {
  validate(kind, send, recv, count, root);
  account(kind, count, t, root);
  count_collective();
  ++sequence_;
  const WaitTimer timer(*counter_);
  if (watchdog_ != nullptr) {  // started, then polled under the time limit
    Request r = make_request(start(kind, send, recv, count, t, op, root),
                             static_cast<std::uint8_t>(kind), count * size_of(t));
    guarded_wait(r);
    return;
  }
  run(kind, send, recv, count, t, op, root);
}

void Communicator::barrier() {
  count_collective();
  ++sequence_;
  const WaitTimer timer(*counter_);
  std::uintptr_t token = 0;
  if (watchdog_ != nullptr && start_barrier(token)) {
    Request r = make_request(token, barrier_code, 0);
    guarded_wait(r);
    return;
  }
  do_barrier();
}

Request Communicator::ibroadcast(void* buf, std::size_t count, DType t, int root) {
  return issue(Kind::broadcast, buf, buf, count, t, ReduceOp::sum, root);
}
Request Communicator::ireduce(const void* send, void* recv, std::size_t count, DType t, ReduceOp op,
                              int root) {
  return issue(Kind::reduce, send, recv, count, t, op, root);
}
Request Communicator::iall_reduce(const void* send, void* recv, std::size_t count, DType t,
                                  ReduceOp op) {
  return issue(Kind::all_reduce, send, recv, count, t, op, 0);
}
Request Communicator::iall_gather(const void* send, void* recv, std::size_t send_count, DType t) {
  return issue(Kind::all_gather, send, recv, send_count, t, ReduceOp::sum, 0);
}
Request Communicator::ireduce_scatter(const void* send, void* recv, std::size_t recv_count, DType t,
                                      ReduceOp op) {
  return issue(Kind::reduce_scatter, send, recv, recv_count, t, op, 0);
}

Request Communicator::isend(const void* buf, std::size_t count, DType t, int peer) {
  return issue(Kind::send, buf, nullptr, count, t, ReduceOp::sum, peer);
}
Request Communicator::irecv(void* buf, std::size_t count, DType t, int peer) {
  return issue(Kind::recv, nullptr, buf, count, t, ReduceOp::sum, peer);
}

void Communicator::broadcast(void* buf, std::size_t count, DType t, int root) {
  execute(Kind::broadcast, buf, buf, count, t, ReduceOp::sum, root);
}
void Communicator::reduce(const void* send, void* recv, std::size_t count, DType t, ReduceOp op,
                          int root) {
  execute(Kind::reduce, send, recv, count, t, op, root);
}
void Communicator::all_reduce(const void* send, void* recv, std::size_t count, DType t,
                              ReduceOp op) {
  execute(Kind::all_reduce, send, recv, count, t, op, 0);
}
void Communicator::all_gather(const void* send, void* recv, std::size_t send_count, DType t) {
  execute(Kind::all_gather, send, recv, send_count, t, ReduceOp::sum, 0);
}
void Communicator::reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType t,
                                  ReduceOp op) {
  execute(Kind::reduce_scatter, send, recv, recv_count, t, op, 0);
}

void Communicator::run(Kind kind, const void* send, void* recv, std::size_t count, DType t,
                       ReduceOp op, int root) {
  finish(start(kind, send, recv, count, t, op, root));
}

void Communicator::wait(Request& r) {
  if (!r.active()) return;
  if (r.owner_ != this) throw Error("wait: request belongs to another communicator");
  const WaitTimer timer(*counter_);
  if (watchdog_ != nullptr) {
    guarded_wait(r);
    return;
  }
  finish(r.token_);
  r = Request{};
}

int Communicator::wait_any(Request& a, Request& b) {
  if (!a.active() || !b.active()) throw Error("wait_any: both requests must be in flight");
  if (a.owner_ != this || b.owner_ != this)
    throw Error("wait_any: a request belongs to another communicator");
  const WaitTimer timer(*counter_);
  if (watchdog_ != nullptr) return guarded_wait_any(a, b);
  for (;;) {
    if (poll(a.token_)) {
      a = Request{};
      return 0;
    }
    if (poll(b.token_)) {
      b = Request{};
      return 1;
    }
    std::this_thread::yield();
  }
}

bool Communicator::test(Request& r) {
  if (!r.active()) return true;
  if (r.owner_ != this) throw Error("test: request belongs to another communicator");
  if (!poll(r.token_)) return false;
  r = Request{};
  return true;
}

}  // namespace summa

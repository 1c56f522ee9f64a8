// StagedCommunicator: MPI collectives on pinned host copies of device buffers
// (host C++ over the CUDA runtime C API).
#include "summa/comm/staged_communicator.hpp"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "../../comm/staging_fit.hpp"
#include "summa/comm/consensus.hpp"
#include "summa/comm/mpi_communicator.hpp"
#include "summa/core/error.hpp"

namespace summa {

namespace {

constexpr std::size_t alignment = 256;

std::string where_of(CommAxis axis) {
  return fmt::format("StagedCommunicator on axis {}", name_of(axis));
}

}  // namespace

struct StagedCommunicator::Impl {
  // What one collective copies: `in_bytes` from `in` to staging + in_offset
  // before MPI, `out_bytes` from the staging start to `out` after.
  struct Plan {
    std::size_t stage_bytes = 0;
    const void* in = nullptr;
    std::size_t in_offset = 0;
    std::size_t in_bytes = 0;
    void* out = nullptr;
    std::size_t out_bytes = 0;
  };
  struct Slot {
    MPI_Request request = MPI_REQUEST_NULL;
    std::size_t begin = 0;  ///< staging range [begin, end) held by the request
    std::size_t end = 0;
    void* out = nullptr;
    std::size_t out_bytes = 0;
    bool busy = false;
  };

  MPI_Comm mpi = MPI_COMM_NULL;
  bool owned = false;
  CommAxis axis = CommAxis::other;
  int rank = 0;
  int size = 1;
  cudaStream_t compute = nullptr;
  char* host = nullptr;  ///< pinned staging buffer
  std::size_t capacity = 0;
  int in_flight = 0;
  std::vector<Slot> slots;
  /// The staging ranges of the slots (empty when free): the first-fit's input.
  std::vector<detail::StagingRange> held;

  ~Impl() {
    if (host != nullptr) {
      cudaStreamSynchronize(compute);  // copies out of the staging buffer may be pending
      cudaFreeHost(host);
    }
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owned && !finalized && mpi != MPI_COMM_NULL) MPI_Comm_free(&mpi);
  }

  void cuda(cudaError_t code, const char* what) const {
    if (code == cudaSuccess) return;
    throw Error(fmt::format("{}: {} failed: {} ({})", where_of(axis), what,
                            cudaGetErrorString(code), cudaGetErrorName(code)));
  }

  std::optional<std::string> allocate(std::size_t bytes) {
    if (bytes == 0) return std::nullopt;
    int count = 0;
    const cudaError_t counted = cudaGetDeviceCount(&count);
    if (counted != cudaSuccess || count == 0)
      return fmt::format(
          "{}: no CUDA device ({})", where_of(axis),
          counted != cudaSuccess ? cudaGetErrorString(counted) : "cudaGetDeviceCount found 0");
    void* p = nullptr;
    const cudaError_t e = cudaMallocHost(&p, bytes);
    if (e != cudaSuccess)
      return fmt::format("{}: cudaMallocHost of {} staging bytes failed: {}", where_of(axis), bytes,
                         cudaGetErrorString(e));
    host = static_cast<char*>(p);
    capacity = bytes;
    return std::nullopt;
  }

  Plan plan(Kind kind, const void* send, void* recv, std::size_t count, DType t, int root) const {
    const std::size_t bytes = count * size_of(t);
    const std::size_t all = static_cast<std::size_t>(size) * bytes;
    Plan p;
    switch (kind) {
      case Kind::broadcast:
        p.stage_bytes = bytes;
        if (rank == root) {
          p.in = recv;
          p.in_bytes = bytes;
        } else {
          p.out = recv;
          p.out_bytes = bytes;
        }
        break;
      case Kind::reduce:
        p.stage_bytes = bytes;
        p.in = send;
        p.in_bytes = bytes;
        if (rank == root) {
          p.out = recv;
          p.out_bytes = bytes;
        }
        break;
      case Kind::all_reduce:
        p = {bytes, send, 0, bytes, recv, bytes};
        break;
      case Kind::all_gather:
        p = {all, send, static_cast<std::size_t>(rank) * bytes, bytes, recv, all};
        break;
      case Kind::reduce_scatter:
        p = {all, send, 0, all, recv, bytes};
        break;
      case Kind::send:
        p = {bytes, send, 0, bytes, nullptr, 0};
        break;
      case Kind::recv:
        p = {bytes, nullptr, 0, 0, recv, bytes};
        break;
    }
    if (count == 0) p = Plan{};
    return p;
  }

  // Staging offset for a new collective of `p`: the lowest aligned offset
  // clear of the ranges requests in flight hold (detail::staging_first_fit),
  // or an error naming the kind.
  std::size_t reserve_stage(const Plan& p, Kind kind) const {
    if (p.stage_bytes == 0) return 0;
    const std::optional<std::size_t> begin =
        detail::staging_first_fit(held, p.stage_bytes, capacity, alignment);
    require(begin.has_value(), [&] {
      static const char* names[] = {"broadcast",      "reduce", "all_reduce", "all_gather",
                                    "reduce_scatter", "send",   "recv"};
      return fmt::format(
          "{}: {} needs {} staging bytes but {} of the {}-byte pinned buffer are free ({} "
          "requests in flight); construct with a larger staging_bytes "
          "(GridOptions::staging_bytes) or call reserve() outside the step",
          where_of(axis), names[static_cast<int>(kind)], p.stage_bytes,
          detail::staging_largest_free(held, capacity, alignment), capacity, in_flight);
    });
    return *begin;
  }

  // Input device -> staging; then the host waits for the compute stream, so
  // the input is there and every earlier copy out of staging has finished.
  void stage_in(const Plan& p, std::size_t begin) {
    if (p.in_bytes > 0)
      cuda(
          cudaMemcpyAsync(host + begin + p.in_offset, p.in, p.in_bytes, cudaMemcpyDefault, compute),
          "cudaMemcpyAsync (to staging)");
    if (p.stage_bytes > 0) cuda(cudaStreamSynchronize(compute), "cudaStreamSynchronize");
  }

  void stage_out(void* out, std::size_t bytes, std::size_t begin) {
    if (bytes > 0)
      cuda(cudaMemcpyAsync(out, host + begin, bytes, cudaMemcpyDefault, compute),
           "cudaMemcpyAsync (from staging)");
  }

  // A group of one rank: the result is the input, so no staging and no MPI
  // (the host staging would cost a device -> host -> device round trip and a
  // stream synchronisation for nothing). A device-to-device copy on the
  // compute stream when the call is not in place.
  void local(Kind kind, const void* send, void* recv, std::size_t count, DType t) const {
    const std::size_t bytes = count * size_of(t);
    if (kind == Kind::broadcast || bytes == 0 || send == recv) return;
    cuda(cudaMemcpyAsync(recv, send, bytes, cudaMemcpyDefault, compute),
         "cudaMemcpyAsync (one-rank group)");
  }

  // The MPI collective in place on the staging buffer; blocking when
  // `request` is null.
  void collective(Kind kind, char* buf, std::size_t count, DType t, ReduceOp op, int root,
                  MPI_Request* request) const {
    require(count <= static_cast<std::size_t>(std::numeric_limits<int>::max()), [&] {
      return fmt::format("{}: MPI message of {} elements exceeds INT_MAX", where_of(axis), count);
    });
    const int n = static_cast<int>(count);
    // bf16: the shared 2-byte datatype and fp32-computing user ops
    // (mpi_communicator.hpp).
    const MPI_Datatype type = mpi_datatype(t);
    const MPI_Op o = mpi_reduce_op(op, t);
    const bool is_root = rank == root;
    switch (kind) {
      case Kind::broadcast:
        if (request)
          check_mpi(MPI_Ibcast(buf, n, type, root, mpi, request), "MPI_Ibcast");
        else
          check_mpi(MPI_Bcast(buf, n, type, root, mpi), "MPI_Bcast");
        break;
      case Kind::reduce:
        if (request)
          check_mpi(MPI_Ireduce(is_root ? MPI_IN_PLACE : buf, is_root ? buf : nullptr, n, type, o,
                                root, mpi, request),
                    "MPI_Ireduce");
        else
          check_mpi(MPI_Reduce(is_root ? MPI_IN_PLACE : buf, is_root ? buf : nullptr, n, type, o,
                               root, mpi),
                    "MPI_Reduce");
        break;
      case Kind::all_reduce:
        if (request)
          check_mpi(MPI_Iallreduce(MPI_IN_PLACE, buf, n, type, o, mpi, request), "MPI_Iallreduce");
        else
          check_mpi(MPI_Allreduce(MPI_IN_PLACE, buf, n, type, o, mpi), "MPI_Allreduce");
        break;
      case Kind::all_gather:
        if (request)
          check_mpi(MPI_Iallgather(MPI_IN_PLACE, n, type, buf, n, type, mpi, request),
                    "MPI_Iallgather");
        else
          check_mpi(MPI_Allgather(MPI_IN_PLACE, n, type, buf, n, type, mpi), "MPI_Allgather");
        break;
      case Kind::reduce_scatter:
        if (request)
          check_mpi(MPI_Ireduce_scatter_block(MPI_IN_PLACE, buf, n, type, o, mpi, request),
                    "MPI_Ireduce_scatter_block");
        else
          check_mpi(MPI_Reduce_scatter_block(MPI_IN_PLACE, buf, n, type, o, mpi),
                    "MPI_Reduce_scatter_block");
        break;
      case Kind::send:
        if (request)
          check_mpi(MPI_Isend(buf, n, type, root, 0, mpi, request), "MPI_Isend");
        else
          check_mpi(MPI_Send(buf, n, type, root, 0, mpi), "MPI_Send");
        break;
      case Kind::recv:
        if (request)
          check_mpi(MPI_Irecv(buf, n, type, root, 0, mpi, request), "MPI_Irecv");
        else
          check_mpi(MPI_Recv(buf, n, type, root, 0, mpi, MPI_STATUS_IGNORE), "MPI_Recv");
        break;
    }
  }

  int slot_of(std::uintptr_t token) const {
    const bool valid = token >= 1 && token <= slots.size() && slots[token - 1].busy;
    require(valid, [&] {
      return fmt::format("{}: request token {} is not in flight", where_of(axis), token);
    });
    return static_cast<int>(token - 1);
  }

  // The MPI part is done: copy the result out and give the staging back.
  void complete(int index) {
    Slot& s = slots[static_cast<std::size_t>(index)];
    s.busy = false;
    held[static_cast<std::size_t>(index)] = {};
    --in_flight;
    // A later request may take this range at once: its copy in (or, for a
    // receive, its start) first synchronises the compute stream, after this
    // copy out.
    stage_out(s.out, s.out_bytes, s.begin);
  }
};

StagedCommunicator::StagedCommunicator(MPI_Comm comm, bool owned, CommAxis axis,
                                       TrafficCounter* counter, void* compute_stream,
                                       std::size_t staging_bytes, int requests)
    : Communicator(axis, counter), impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.mpi = comm;
  m.owned = owned;
  require(requests >= 1, [&] {
    return fmt::format("{}: requests in flight must be >= 1 (got {})", where_of(axis), requests);
  });
  m.slots.resize(static_cast<std::size_t>(requests));
  m.held.resize(static_cast<std::size_t>(requests));
  m.axis = axis;
  m.compute = static_cast<cudaStream_t>(compute_stream);
  check_mpi(MPI_Comm_rank(comm, &m.rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm, &m.size), "MPI_Comm_size");
  if (owned) MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  agree_on(comm, m.allocate(staging_bytes));
}

StagedCommunicator::~StagedCommunicator() = default;

int StagedCommunicator::rank() const {
  return impl_->rank;
}
int StagedCommunicator::size() const {
  return impl_->size;
}
MPI_Comm StagedCommunicator::native() const {
  return impl_->mpi;
}
void* StagedCommunicator::compute_stream() const {
  return impl_->compute;
}
std::size_t StagedCommunicator::staging_bytes() const {
  return impl_->capacity;
}
int StagedCommunicator::in_flight() const {
  return impl_->in_flight;
}
int StagedCommunicator::max_requests() const {
  return static_cast<int>(impl_->slots.size());
}

void StagedCommunicator::reserve(std::size_t bytes) {
  Impl& m = *impl_;
  require(m.in_flight == 0, [&] {
    return fmt::format("{}: reserve({}) with {} requests in flight", where_of(m.axis), bytes,
                       m.in_flight);
  });
  if (bytes <= m.capacity) return;
  if (m.host != nullptr) {
    m.cuda(cudaStreamSynchronize(m.compute), "cudaStreamSynchronize");
    m.cuda(cudaFreeHost(m.host), "cudaFreeHost");
    m.host = nullptr;
    m.capacity = 0;
  }
  if (auto error = m.allocate(bytes)) throw Error(*error);
}

std::uintptr_t StagedCommunicator::start(Kind kind, const void* send, void* recv, std::size_t count,
                                         DType t, ReduceOp op, int root) {
  Impl& m = *impl_;
  std::size_t index = 0;
  while (index < m.slots.size() && m.slots[index].busy) ++index;
  require(index < m.slots.size(), [&] {
    return fmt::format(
        "{}: {} requests in flight, the most it can track; complete some (wait/test) first",
        where_of(m.axis), m.slots.size());
  });
  const Impl::Plan p = m.plan(kind, send, recv, count, t, root);
  // The staging is reserved even for a group of one, which does not use it,
  // so that a buffer too small for the model fails at one rank as it would at many.
  const std::size_t begin = m.reserve_stage(p, kind);
  Impl::Slot& s = m.slots[index];
  if (m.size == 1) {  // done at once: MPI_Wait/MPI_Test on a null request return
    m.local(kind, send, recv, count, t);
    s.request = MPI_REQUEST_NULL;
  } else {
    m.stage_in(p, begin);
    m.collective(kind, m.host + begin, count, t, op, root, &s.request);
  }
  s.begin = begin;
  s.end = begin + p.stage_bytes;
  s.out = m.size == 1 ? nullptr : p.out;
  s.out_bytes = m.size == 1 ? 0 : p.out_bytes;
  s.busy = true;
  m.held[index] = {s.begin, s.end};
  ++m.in_flight;
  return static_cast<std::uintptr_t>(index) + 1;
}

void StagedCommunicator::run(Kind kind, const void* send, void* recv, std::size_t count, DType t,
                             ReduceOp op, int root) {
  Impl& m = *impl_;
  const Impl::Plan p = m.plan(kind, send, recv, count, t, root);
  const std::size_t begin = m.reserve_stage(p, kind);
  if (m.size == 1) {
    m.local(kind, send, recv, count, t);
    return;
  }
  m.stage_in(p, begin);
  m.collective(kind, m.host + begin, count, t, op, root, nullptr);
  m.stage_out(p.out, p.out_bytes, begin);
}

void StagedCommunicator::finish(std::uintptr_t token) {
  Impl& m = *impl_;
  const int index = m.slot_of(token);
  MPI_Request& r = m.slots[static_cast<std::size_t>(index)].request;
  check_mpi(MPI_Wait(&r, MPI_STATUS_IGNORE), "MPI_Wait");
  m.complete(index);
}

bool StagedCommunicator::poll(std::uintptr_t token) {
  Impl& m = *impl_;
  const int index = m.slot_of(token);
  int done = 0;
  MPI_Request& r = m.slots[static_cast<std::size_t>(index)].request;
  check_mpi(MPI_Test(&r, &done, MPI_STATUS_IGNORE), "MPI_Test");
  if (done == 0) return false;
  m.complete(index);
  return true;
}

void StagedCommunicator::do_barrier() {
  Impl& m = *impl_;
  m.cuda(cudaStreamSynchronize(m.compute), "cudaStreamSynchronize");
  check_mpi(MPI_Barrier(m.mpi), "MPI_Barrier");
}

}  // namespace summa

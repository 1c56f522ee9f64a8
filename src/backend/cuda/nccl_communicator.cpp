// NcclCommunicator and select_device_for_rank: host C++ over the CUDA runtime
// and NCCL C APIs (compiled as CXX with the CUDA include directories).
#include "summa/comm/nccl_communicator.hpp"

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "summa/comm/consensus.hpp"
#include "summa/comm/mpi_communicator.hpp"
#include "summa/core/error.hpp"

namespace summa {

namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::bf16:
      return ncclBfloat16;  // NCCL reduces bf16 in fp32 per combine, rounding like the MPI ops
  }
  throw Error(fmt::format("NcclCommunicator: unknown DType {}", static_cast<int>(t)));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::min:
      return ncclMin;
  }
  return ncclSum;
}

std::string where_of(CommAxis axis) {
  return fmt::format("NcclCommunicator on axis {}", name_of(axis));
}

// Where a buffer lives. Pageable or pinned host memory goes through MPI;
// device (and managed) memory through NCCL.
enum class Memory : std::uint8_t { none, device, host };
Memory memory_of(const void* p) {
  if (p == nullptr) return Memory::none;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // clear it: an unknown pointer is plain host memory
    return Memory::host;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged ? Memory::device
                                                                           : Memory::host;
}

// The token of a host-buffer collective: already complete when start() returns.
constexpr std::uintptr_t host_token = std::numeric_limits<std::uintptr_t>::max();

// What this rank's GPU is, to find two ranks of one group on the same GPU
// before NCCL does (it would fail with a less helpful message, or hang).
struct GpuIdentity {
  char host[MPI_MAX_PROCESSOR_NAME + 1];
  char pci[32];
  int device;
};

}  // namespace

struct NcclCommunicator::Impl {
  MPI_Comm mpi = MPI_COMM_NULL;
  bool owned = false;
  CommAxis axis = CommAxis::other;
  int rank = 0;
  int size = 1;
  int device = -1;
  cudaStream_t compute = nullptr;
  cudaStream_t comm_stream = nullptr;
  cudaEvent_t ready = nullptr;      ///< recorded on the compute stream before each call
  std::vector<cudaEvent_t> events;  ///< the pool; slot i's event marks request i's end
  std::vector<int> free_slots;      ///< stack of unused slots (capacity = pool size)
  std::vector<unsigned char> busy;  ///< slot i held by a request in flight
  ncclComm_t nccl = nullptr;
  /// Host buffers: MPI on the same group. Its own counter is discarded (the
  /// Communicator base has already counted the call on this axis).
  TrafficCounter host_counter;
  std::unique_ptr<MpiCommunicator> host_path;

  ~Impl() {
    if (nccl != nullptr) {
      if (std::uncaught_exceptions() > 0) {
        ncclCommAbort(nccl);  // local: peers may never reach a finalize
      } else {
        if (comm_stream != nullptr) cudaStreamSynchronize(comm_stream);
        ncclCommFinalize(nccl);
        ncclCommDestroy(nccl);
      }
    }
    for (cudaEvent_t e : events)
      if (e != nullptr) cudaEventDestroy(e);
    if (ready != nullptr) cudaEventDestroy(ready);
    if (comm_stream != nullptr) cudaStreamDestroy(comm_stream);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owned && !finalized && mpi != MPI_COMM_NULL) MPI_Comm_free(&mpi);
  }

  void cuda(cudaError_t code, const char* what) const {
    if (code == cudaSuccess) return;
    throw Error(fmt::format("{}: {} failed: {} ({})", where_of(axis), what,
                            cudaGetErrorString(code), cudaGetErrorName(code)));
  }
  void check(ncclResult_t code, const char* what) const {
    if (code == ncclSuccess) return;
    throw Error(fmt::format("{}: {} failed: {}", where_of(axis), what, ncclGetErrorString(code)));
  }
  void check_async() const {
    ncclResult_t async = ncclSuccess;
    check(ncclCommGetAsyncError(nccl, &async), "ncclCommGetAsyncError");
    check(async, "an earlier NCCL operation (asynchronous error)");
  }

  int slot_of(std::uintptr_t token) const {
    const bool valid = token >= 1 && token <= events.size() && busy[token - 1] != 0;
    require(valid, [&] {
      return fmt::format("{}: request token {} is not in flight", where_of(axis), token);
    });
    return static_cast<int>(token - 1);
  }
  void release(int slot) {
    busy[static_cast<std::size_t>(slot)] = 0;
    free_slots.push_back(slot);  // capacity reserved at construction: no allocation
  }

  // Creates the streams and the event pool; a message instead of an
  // exception, so that every rank can agree on it before NCCL starts.
  std::optional<std::string> create_local(int pool, GpuIdentity& me) {
    if (pool < 1)
      return fmt::format("{}: event_pool must be at least 1, got {}", where_of(axis), pool);
    int count = 0;
    const cudaError_t counted = cudaGetDeviceCount(&count);
    if (counted != cudaSuccess || count == 0)
      return fmt::format(
          "{}: no CUDA device ({})", where_of(axis),
          counted != cudaSuccess ? cudaGetErrorString(counted) : "cudaGetDeviceCount found 0");
    try {
      cuda(cudaGetDevice(&device), "cudaGetDevice");
      cuda(cudaDeviceGetPCIBusId(me.pci, static_cast<int>(sizeof me.pci), device),
           "cudaDeviceGetPCIBusId");
      me.device = device;
      int least = 0, greatest = 0;
      cuda(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
      // Highest priority: communication kernels should not queue behind GEMMs.
      cuda(cudaStreamCreateWithPriority(&comm_stream, cudaStreamNonBlocking, greatest),
           "cudaStreamCreateWithPriority");
      cuda(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreateWithFlags");
      const auto n = static_cast<std::size_t>(pool);
      events.assign(n, nullptr);
      busy.assign(n, 0);
      free_slots.reserve(n);
      for (int i = pool - 1; i >= 0; --i) {
        cuda(cudaEventCreateWithFlags(&events[static_cast<std::size_t>(i)], cudaEventDisableTiming),
             "cudaEventCreateWithFlags");
        free_slots.push_back(i);
      }
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::nullopt;
  }
};

NcclCommunicator::NcclCommunicator(MPI_Comm comm, bool owned, CommAxis axis,
                                   TrafficCounter* counter, void* compute_stream, int event_pool)
    : Communicator(axis, counter), impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.mpi = comm;
  m.owned = owned;
  m.axis = axis;
  m.compute = static_cast<cudaStream_t>(compute_stream);
  check_mpi(MPI_Comm_rank(comm, &m.rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm, &m.size), "MPI_Comm_size");
  if (owned) MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  m.host_path = std::make_unique<MpiCommunicator>(comm, false, axis, &m.host_counter);

  GpuIdentity me{};
  int host_length = 0;
  check_mpi(MPI_Get_processor_name(me.host, &host_length), "MPI_Get_processor_name");
  agree_on(comm, m.create_local(event_pool, me));

  // One GPU per rank: the same host and PCI bus id twice in a group is an
  // error NCCL would report late (or not at all); every rank sees the same
  // table, so every rank throws the same message without another collective.
  std::vector<GpuIdentity> all(static_cast<std::size_t>(m.size));
  check_mpi(MPI_Allgather(&me, static_cast<int>(sizeof me), MPI_BYTE, all.data(),
                          static_cast<int>(sizeof me), MPI_BYTE, comm),
            "MPI_Allgather");
  for (std::size_t i = 0; i < all.size(); ++i)
    for (std::size_t j = i + 1; j < all.size(); ++j)
      if (std::strcmp(all[i].host, all[j].host) == 0 && std::strcmp(all[i].pci, all[j].pci) == 0)
        throw Error(fmt::format(
            "{}: group ranks {} and {} both use CUDA device {} (PCI {}) on host {}; NCCL needs "
            "one GPU per rank (choose devices with select_device_for_rank(), or share a GPU "
            "through StagedCommunicator / GridOptions::comm = CommBackend::mpi_staged)",
            where_of(axis), i, j, all[i].device, all[i].pci, all[i].host));

  ncclUniqueId id{};
  std::optional<std::string> id_error;
  if (m.rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess)
      id_error =
          fmt::format("{}: ncclGetUniqueId failed: {}", where_of(axis), ncclGetErrorString(r));
  }
  agree_on(comm, id_error);
  check_mpi(MPI_Bcast(&id, static_cast<int>(sizeof id), MPI_BYTE, 0, comm), "MPI_Bcast");
  const ncclResult_t init = ncclCommInitRank(&m.nccl, m.size, id, m.rank);
  std::optional<std::string> init_error;
  if (init != ncclSuccess) {
    m.nccl = nullptr;
    init_error = fmt::format("{}: ncclCommInitRank (rank {} of {}, device {}) failed: {}",
                             where_of(axis), m.rank, m.size, m.device, ncclGetErrorString(init));
  }
  agree_on(comm, init_error);
}

NcclCommunicator::~NcclCommunicator() = default;

int NcclCommunicator::rank() const {
  return impl_->rank;
}
int NcclCommunicator::size() const {
  return impl_->size;
}
MPI_Comm NcclCommunicator::native() const {
  return impl_->mpi;
}
int NcclCommunicator::device() const {
  return impl_->device;
}
void* NcclCommunicator::compute_stream() const {
  return impl_->compute;
}
void* NcclCommunicator::comm_stream() const {
  return impl_->comm_stream;
}
int NcclCommunicator::in_flight() const {
  return static_cast<int>(impl_->events.size() - impl_->free_slots.size());
}
int NcclCommunicator::event_pool() const {
  return static_cast<int>(impl_->events.size());
}

std::uintptr_t NcclCommunicator::start(Kind kind, const void* send, void* recv, std::size_t count,
                                       DType t, ReduceOp op, int root) {
  Impl& m = *impl_;
  if (count > 0) {
    const Memory in = kind == Kind::broadcast ? Memory::none : memory_of(send);
    const Memory out = memory_of(recv);
    if (in == Memory::host || out == Memory::host) {
      require(in != Memory::device && out != Memory::device, [&] {
        return fmt::format("{}: one call mixes host and device buffers (send {}, recv {})",
                           where_of(m.axis), in == Memory::host ? "host" : "device",
                           out == Memory::host ? "host" : "device");
      });
      MpiCommunicator& h = *m.host_path;
      switch (kind) {
        case Kind::broadcast:
          h.broadcast(recv, count, t, root);
          break;
        case Kind::reduce:
          h.reduce(send, recv, count, t, op, root);
          break;
        case Kind::all_reduce:
          h.all_reduce(send, recv, count, t, op);
          break;
        case Kind::all_gather:
          h.all_gather(send, recv, count, t);
          break;
        case Kind::reduce_scatter:
          h.reduce_scatter(send, recv, count, t, op);
          break;
        case Kind::send:
        case Kind::recv:  // a blocking host send could wait on its own peer's send
          throw Error(fmt::format(
              "{}: point-to-point messages of host buffers are not supported here; pass "
              "device buffers",
              where_of(m.axis)));
      }
      return host_token;
    }
  }
  require(!m.free_slots.empty(), [&] {
    return fmt::format(
        "{}: all {} pooled events are held by requests in flight; complete some (wait/test) "
        "before issuing more, or construct with a larger event_pool",
        where_of(m.axis), m.events.size());
  });
  int current = -1;
  m.cuda(cudaGetDevice(&current), "cudaGetDevice");
  require(current == m.device, [&] {
    return fmt::format("{}: current CUDA device {} is not the communicator's device {}",
                       where_of(m.axis), current, m.device);
  });
  const int slot = m.free_slots.back();
  m.free_slots.pop_back();
  m.busy[static_cast<std::size_t>(slot)] = 1;
  try {
    // The inputs are produced on the compute stream: order after them.
    m.cuda(cudaEventRecord(m.ready, m.compute), "cudaEventRecord");
    m.cuda(cudaStreamWaitEvent(m.comm_stream, m.ready, 0), "cudaStreamWaitEvent");
    if (count > 0) {  // an empty collective moves nothing and needs no peer
      const ncclDataType_t type = nccl_type(t);
      const ncclRedOp_t rop = nccl_op(op);
      cudaStream_t s = m.comm_stream;
      switch (kind) {
        case Kind::broadcast:
          m.check(ncclBroadcast(recv, recv, count, type, root, m.nccl, s), "ncclBroadcast");
          break;
        case Kind::reduce:  // send == recv on the root is NCCL's in-place form too
          m.check(ncclReduce(send, recv, count, type, rop, root, m.nccl, s), "ncclReduce");
          break;
        case Kind::all_reduce:
          m.check(ncclAllReduce(send, recv, count, type, rop, m.nccl, s), "ncclAllReduce");
          break;
        case Kind::all_gather:  // in place is send == recv + rank*count in both conventions
          m.check(ncclAllGather(send, recv, count, type, m.nccl, s), "ncclAllGather");
          break;
        case Kind::reduce_scatter: {
          // summa's in place is send == recv with the result first; NCCL's is
          // recv == send + rank*count. Reduce into NCCL's place, then move.
          const std::size_t bytes = count * size_of(t);
          if (send == recv && m.rank > 0) {
            char* own = static_cast<char*>(recv) + static_cast<std::size_t>(m.rank) * bytes;
            m.check(ncclReduceScatter(send, own, count, type, rop, m.nccl, s), "ncclReduceScatter");
            m.cuda(cudaMemcpyAsync(recv, own, bytes, cudaMemcpyDeviceToDevice, s),
                   "cudaMemcpyAsync");
          } else {
            m.check(ncclReduceScatter(send, recv, count, type, rop, m.nccl, s),
                    "ncclReduceScatter");
          }
          break;
        }
        case Kind::send:
          m.check(ncclSend(send, count, type, root, m.nccl, s), "ncclSend");
          break;
        case Kind::recv:
          m.check(ncclRecv(recv, count, type, root, m.nccl, s), "ncclRecv");
          break;
      }
    }
    m.cuda(cudaEventRecord(m.events[static_cast<std::size_t>(slot)], m.comm_stream),
           "cudaEventRecord");
  } catch (...) {
    m.release(slot);
    throw;
  }
  return static_cast<std::uintptr_t>(slot) + 1;
}

void NcclCommunicator::finish(std::uintptr_t token) {
  Impl& m = *impl_;
  if (token == host_token) return;
  const int slot = m.slot_of(token);
  // Stream-ordered completion: the compute stream waits, the host does not.
  const cudaError_t e = cudaStreamWaitEvent(m.compute, m.events[static_cast<std::size_t>(slot)], 0);
  m.release(slot);  // the wait captured the event's state; the slot may be reused
  m.cuda(e, "cudaStreamWaitEvent");
}

bool NcclCommunicator::poll(std::uintptr_t token) {
  Impl& m = *impl_;
  if (token == host_token) return true;
  const int slot = m.slot_of(token);
  const cudaError_t e = cudaEventQuery(m.events[static_cast<std::size_t>(slot)]);
  if (e == cudaSuccess) {
    m.release(slot);  // done on the device: later compute-stream work sees it
    return true;
  }
  if (e != cudaErrorNotReady) {
    m.release(slot);
    m.cuda(e, "cudaEventQuery");
  }
  m.check_async();  // a failed peer would otherwise leave us polling forever
  return false;
}

void NcclCommunicator::do_barrier() {
  Impl& m = *impl_;
  m.cuda(cudaStreamSynchronize(m.comm_stream), "cudaStreamSynchronize(communication stream)");
  m.cuda(cudaStreamSynchronize(m.compute), "cudaStreamSynchronize(compute stream)");
  m.check_async();
  check_mpi(MPI_Barrier(m.mpi), "MPI_Barrier");
}

int select_device_for_rank(MPI_Comm comm) {
  int rank = 0, world_rank = 0;
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank), "MPI_Comm_rank");
  MPI_Comm node;
  check_mpi(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node),
            "MPI_Comm_split_type");
  int local = 0, local_size = 1;
  check_mpi(MPI_Comm_rank(node, &local), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(node, &local_size), "MPI_Comm_size");
  check_mpi(MPI_Comm_free(&node), "MPI_Comm_free");
  char host[MPI_MAX_PROCESSOR_NAME + 1] = {};
  int host_length = 0;
  check_mpi(MPI_Get_processor_name(host, &host_length), "MPI_Get_processor_name");

  int count = 0;
  int device = -1;
  std::optional<std::string> error;
  const cudaError_t counted = cudaGetDeviceCount(&count);
  if (counted != cudaSuccess || count == 0) {
    error = fmt::format(
        "select_device_for_rank: no CUDA device on host {} (world rank {}): {}", host, world_rank,
        counted != cudaSuccess ? cudaGetErrorString(counted) : "cudaGetDeviceCount found 0");
  } else {
    device = local % count;
    const cudaError_t set = cudaSetDevice(device);
    if (set != cudaSuccess)
      error = fmt::format(
          "select_device_for_rank: cudaSetDevice({}) on host {} (world rank {}) "
          "failed: {}",
          device, host, world_rank, cudaGetErrorString(set));
  }
  agree_on(comm, error);
  const int sharing = local_size / count + (local % count < local_size % count ? 1 : 0);
  std::fprintf(stderr,
               "summa: world rank %d on %s: local rank %d of %d -> CUDA device %d of %d%s\n",
               world_rank, host, local, local_size, device, count,
               sharing > 1 ? fmt::format(" (shared by {} local ranks)", sharing).c_str() : "");
  return device;
}

}  // namespace summa

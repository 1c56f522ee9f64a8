#include "summa/comm/mpi_communicator.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "summa/core/error.hpp"

namespace summa {

static_assert(sizeof(MPI_Request) <= sizeof(std::uintptr_t),
              "MPI_Request must fit in a Request token");

void check_mpi(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw Error(fmt::format("{} failed: {}", what, std::string_view(text, length)));
}

namespace {

// inout[i] = bf16(combine(float(in[i]), float(inout[i]))): one rounding per
// pairwise combine. Max and min of bf16 values are exact.
template <ReduceOp Op>
void bf16_combine(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const bf16*>(in);
  auto* b = static_cast<bf16*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = static_cast<float>(a[i]), y = static_cast<float>(b[i]);
    if constexpr (Op == ReduceOp::sum)
      b[i] = bf16(x + y);
    else if constexpr (Op == ReduceOp::max)
      b[i] = x > y || std::isnan(x) ? a[i] : b[i];  // a NaN operand propagates
    else
      b[i] = x < y || std::isnan(x) ? a[i] : b[i];
  }
}

// MPI handles for bf16, created once (thread-safe static initialisation) on
// first use, after MPI_Init; never freed (MPI releases them at finalize).
struct Bf16Mpi {
  MPI_Datatype type = MPI_DATATYPE_NULL;
  MPI_Op sum = MPI_OP_NULL, max = MPI_OP_NULL, min = MPI_OP_NULL;
  Bf16Mpi() {
    check_mpi(MPI_Type_contiguous(2, MPI_BYTE, &type), "MPI_Type_contiguous (bf16)");
    check_mpi(MPI_Type_commit(&type), "MPI_Type_commit (bf16)");
    check_mpi(MPI_Op_create(&bf16_combine<ReduceOp::sum>, 1, &sum), "MPI_Op_create (bf16 sum)");
    check_mpi(MPI_Op_create(&bf16_combine<ReduceOp::max>, 1, &max), "MPI_Op_create (bf16 max)");
    check_mpi(MPI_Op_create(&bf16_combine<ReduceOp::min>, 1, &min), "MPI_Op_create (bf16 min)");
  }
};
const Bf16Mpi& bf16_mpi() {
  static const Bf16Mpi handles;
  return handles;
}

MPI_Datatype mpi_type(DType t) {
  return mpi_datatype(t);
}
std::uintptr_t to_token(MPI_Request r) {
  std::uintptr_t token = 0;
  std::memcpy(&token, &r, sizeof r);
  return token;
}
MPI_Request from_token(std::uintptr_t token) {
  MPI_Request r;
  std::memcpy(&r, &token, sizeof r);
  return r;
}
int as_int(std::size_t count) {
  if (count > static_cast<std::size_t>(std::numeric_limits<int>::max()))
    throw Error(fmt::format("MPI message of {} elements exceeds INT_MAX", count));
  return static_cast<int>(count);
}
}  // namespace

MPI_Datatype mpi_datatype(DType t) {
  switch (t) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::f64:
      return MPI_DOUBLE;
    case DType::bf16:
      return bf16_mpi().type;
  }
  throw Error(fmt::format("mpi_datatype: unknown DType {}", static_cast<int>(t)));
}

MPI_Op mpi_reduce_op(ReduceOp op, DType t) {
  if (t == DType::bf16) {
    const Bf16Mpi& h = bf16_mpi();
    switch (op) {
      case ReduceOp::sum:
        return h.sum;
      case ReduceOp::max:
        return h.max;
      case ReduceOp::min:
        return h.min;
    }
  } else {
    switch (op) {
      case ReduceOp::sum:
        return MPI_SUM;
      case ReduceOp::max:
        return MPI_MAX;
      case ReduceOp::min:
        return MPI_MIN;
    }
  }
  throw Error(fmt::format("mpi_reduce_op: unknown ReduceOp {}", static_cast<int>(op)));
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, bool owned, CommAxis axis, TrafficCounter* counter)
    : Communicator(axis, counter), comm_(comm), owned_(owned) {
  check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  if (owned_) MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owned_ && !finalized) MPI_Comm_free(&comm_);
}

std::uintptr_t MpiCommunicator::start(Kind kind, const void* send, void* recv, std::size_t count,
                                      DType t, ReduceOp op, int root) {
  MPI_Request r = MPI_REQUEST_NULL;
  const MPI_Datatype type = mpi_type(t);
  const int n = as_int(count);
  switch (kind) {
    case Kind::broadcast:
      check_mpi(MPI_Ibcast(recv, n, type, root, comm_, &r), "MPI_Ibcast");
      break;
    case Kind::reduce: {
      const bool in_place = rank_ == root && send == recv;
      check_mpi(MPI_Ireduce(in_place ? MPI_IN_PLACE : send, recv, n, type, mpi_reduce_op(op, t),
                            root, comm_, &r),
                "MPI_Ireduce");
      break;
    }
    case Kind::all_reduce:
      check_mpi(MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, n, type,
                               mpi_reduce_op(op, t), comm_, &r),
                "MPI_Iallreduce");
      break;
    case Kind::all_gather: {
      const void* own = static_cast<const char*>(recv) + rank_ * count * size_of(t);
      check_mpi(
          MPI_Iallgather(send == own ? MPI_IN_PLACE : send, n, type, recv, n, type, comm_, &r),
          "MPI_Iallgather");
      break;
    }
    case Kind::reduce_scatter:
      check_mpi(MPI_Ireduce_scatter_block(send == recv ? MPI_IN_PLACE : send, recv, n, type,
                                          mpi_reduce_op(op, t), comm_, &r),
                "MPI_Ireduce_scatter_block");
      break;
    case Kind::send:
      check_mpi(MPI_Isend(send, n, type, root, 0, comm_, &r), "MPI_Isend");
      break;
    case Kind::recv:
      check_mpi(MPI_Irecv(recv, n, type, root, 0, comm_, &r), "MPI_Irecv");
      break;
  }
  return to_token(r);
}

void MpiCommunicator::run(Kind kind, const void* send, void* recv, std::size_t count, DType t,
                          ReduceOp op, int root) {
  const MPI_Datatype type = mpi_type(t);
  const int n = as_int(count);
  switch (kind) {
    case Kind::broadcast:
      check_mpi(MPI_Bcast(recv, n, type, root, comm_), "MPI_Bcast");
      break;
    case Kind::reduce: {
      const bool in_place = rank_ == root && send == recv;
      check_mpi(MPI_Reduce(in_place ? MPI_IN_PLACE : send, recv, n, type, mpi_reduce_op(op, t),
                           root, comm_),
                "MPI_Reduce");
      break;
    }
    case Kind::all_reduce:
      check_mpi(MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, n, type,
                              mpi_reduce_op(op, t), comm_),
                "MPI_Allreduce");
      break;
    case Kind::all_gather: {
      const void* own = static_cast<const char*>(recv) + rank_ * count * size_of(t);
      check_mpi(MPI_Allgather(send == own ? MPI_IN_PLACE : send, n, type, recv, n, type, comm_),
                "MPI_Allgather");
      break;
    }
    case Kind::reduce_scatter:
      check_mpi(MPI_Reduce_scatter_block(send == recv ? MPI_IN_PLACE : send, recv, n, type,
                                         mpi_reduce_op(op, t), comm_),
                "MPI_Reduce_scatter_block");
      break;
    case Kind::send:
      check_mpi(MPI_Send(send, n, type, root, 0, comm_), "MPI_Send");
      break;
    case Kind::recv:
      check_mpi(MPI_Recv(recv, n, type, root, 0, comm_, MPI_STATUS_IGNORE), "MPI_Recv");
      break;
  }
}

void MpiCommunicator::finish(std::uintptr_t token) {
  MPI_Request r = from_token(token);
  check_mpi(MPI_Wait(&r, MPI_STATUS_IGNORE), "MPI_Wait");
}

bool MpiCommunicator::poll(std::uintptr_t token) {
  MPI_Request r = from_token(token);
  int done = 0;
  check_mpi(MPI_Test(&r, &done, MPI_STATUS_IGNORE), "MPI_Test");
  return done != 0;
}

bool MpiCommunicator::start_barrier(std::uintptr_t& token) {
  MPI_Request r = MPI_REQUEST_NULL;
  check_mpi(MPI_Ibarrier(comm_, &r), "MPI_Ibarrier");
  token = to_token(r);
  return true;
}

void MpiCommunicator::do_barrier() {
  check_mpi(MPI_Barrier(comm_), "MPI_Barrier");
}

}  // namespace summa

#include "summa/comm/mpi_communicator.hpp"

#include <fmt/format.h>

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
MPI_Datatype mpi_type(DType t) {
  return t == DType::f32 ? MPI_FLOAT : MPI_DOUBLE;
}
MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return MPI_SUM;
    case ReduceOp::max:
      return MPI_MAX;
    case ReduceOp::min:
      return MPI_MIN;
  }
  return MPI_SUM;
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
      check_mpi(
          MPI_Ireduce(in_place ? MPI_IN_PLACE : send, recv, n, type, mpi_op(op), root, comm_, &r),
          "MPI_Ireduce");
      break;
    }
    case Kind::all_reduce:
      check_mpi(
          MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, n, type, mpi_op(op), comm_, &r),
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
                                          mpi_op(op), comm_, &r),
                "MPI_Ireduce_scatter_block");
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
      check_mpi(MPI_Reduce(in_place ? MPI_IN_PLACE : send, recv, n, type, mpi_op(op), root, comm_),
                "MPI_Reduce");
      break;
    }
    case Kind::all_reduce:
      check_mpi(MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, n, type, mpi_op(op), comm_),
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
                                         mpi_op(op), comm_),
                "MPI_Reduce_scatter_block");
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

void MpiCommunicator::do_barrier() {
  check_mpi(MPI_Barrier(comm_), "MPI_Barrier");
}

}  // namespace summa

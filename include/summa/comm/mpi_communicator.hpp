#pragma once
/// \file mpi_communicator.hpp
/// Communicator on an MPI communicator (OpenMPI, MPICH, ...). Non-blocking
/// calls map to MPI-3 non-blocking collectives (MPI_Ibcast, MPI_Ireduce, ...).

#include <mpi.h>

#include "summa/comm/communicator.hpp"

namespace summa {

class MpiCommunicator final : public Communicator {
 public:
  /// Wraps `comm`. When `owned`, MPI_Comm_free is called on destruction.
  MpiCommunicator(MPI_Comm comm, bool owned, CommAxis axis, TrafficCounter* counter);
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  MPI_Comm native() const { return comm_; }

 protected:
  std::uintptr_t start(Kind kind, const void* send, void* recv, std::size_t count, DType t,
                       ReduceOp op, int root) override;
  void run(Kind kind, const void* send, void* recv, std::size_t count, DType t, ReduceOp op,
           int root) override;
  void finish(std::uintptr_t token) override;
  bool poll(std::uintptr_t token) override;
  void do_barrier() override;
  bool start_barrier(std::uintptr_t& token) override;

 private:
  MPI_Comm comm_;
  bool owned_;
  int rank_ = 0;
  int size_ = 1;
};

/// Throws summa::Error when an MPI call fails (errors are set to return).
void check_mpi(int code, const char* what);

/// The MPI datatype of an element type: MPI_FLOAT, MPI_DOUBLE, or for
/// DType::bf16 a committed 2-byte contiguous type created on first use and
/// kept until MPI_Finalize (shared by every communicator of the process).
MPI_Datatype mpi_datatype(DType t);

/// The MPI reduction of `op` over element type `t`: MPI_SUM / MPI_MAX /
/// MPI_MIN for f32 and f64; for bf16 a commutative user MPI_Op (created on
/// first use, kept until MPI_Finalize) that widens both operands to fp32,
/// combines them and rounds the result to bf16 (nearest even) — a reduction
/// over p ranks rounds once per pairwise combine, p - 1 times along any
/// path of the reduction tree (docs/communication.md).
MPI_Op mpi_reduce_op(ReduceOp op, DType t);

}  // namespace summa

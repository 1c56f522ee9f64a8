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

 private:
  MPI_Comm comm_;
  bool owned_;
  int rank_ = 0;
  int size_ = 1;
};

/// Throws summa::Error when an MPI call fails (errors are set to return).
void check_mpi(int code, const char* what);

}  // namespace summa

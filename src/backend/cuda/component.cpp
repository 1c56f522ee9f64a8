// libsumma_cuda's registration with libsumma (../cuda_component.hpp,
// ../../grid/device_communicators.hpp): the CUDA device and the
// device-memory communicators, reachable from make_device and the
// ProcessGrid once the dynamic loader has loaded this library (a program
// links summa::cuda, or libsumma loads it on first use).
#include <cuda_runtime_api.h>

#include <memory>
#include <utility>

#include "../cuda_component.hpp"
#include "summa/backend/cuda_backend.hpp"
#include "summa/comm/nccl_communicator.hpp"
#include "summa/comm/staged_communicator.hpp"

namespace summa::detail {
namespace {

void make_cuda_device(MPI_Comm comm, const DeviceOptions& o, CommBackend comm_kind, Device& d) {
  CudaOptions co;
  co.device = select_device_for_rank(comm);  // collective; throws on every rank without a GPU
  co.allow_tf32 = o.tf32;
  co.check_pointers = o.check_pointers;
  auto backend = std::make_unique<CudaBackend>(co);
  d.grid.comm = comm_kind;
  d.grid.compute_stream = backend->stream();
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, co.device) == cudaSuccess) d.name = prop.name;
  d.backend = std::move(backend);
}

std::unique_ptr<Communicator> make_device_communicator(MPI_Comm comm, CommAxis axis,
                                                       TrafficCounter* counter,
                                                       const GridOptions& o) {
  if (o.comm == CommBackend::nccl)
    return std::make_unique<NcclCommunicator>(comm, true, axis, counter, o.compute_stream);
  return std::make_unique<StagedCommunicator>(comm, true, axis, counter, o.compute_stream,
                                              o.staging_bytes, o.staging_requests);
}

[[maybe_unused]] const bool registered =
    (register_cuda_device(&make_cuda_device, &CudaBackend::device_count),
     register_device_communicators(&make_device_communicator), true);

}  // namespace
}  // namespace summa::detail

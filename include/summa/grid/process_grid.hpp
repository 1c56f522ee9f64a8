#pragma once
/// \file process_grid.hpp
/// The process grid: data x depth x rows x cols, built from any MPI
/// communicator, with one Communicator per axis and per-axis traffic counters.

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "summa/comm/consensus.hpp"
#include "summa/comm/mpi_communicator.hpp"
#include "summa/comm/watchdog.hpp"
#include "summa/grid/placement.hpp"

namespace summa {

/// Which Communicator a ProcessGrid builds for each axis.
enum class CommBackend : std::uint8_t {
  mpi,         ///< MpiCommunicator: host buffers (the CPU backend)
  nccl,        ///< NcclCommunicator: device buffers, one GPU per rank (needs CUDA)
  mpi_staged,  ///< StagedCommunicator: device buffers over MPI via pinned host
               ///< copies; several ranks may share a GPU (needs CUDA)
};

struct GridOptions {
  Placement placement = Placement::natural;
  /// Ranks per node for bunched placement; 0 detects it with
  /// MPI_Comm_split_type(MPI_COMM_TYPE_SHARED). Setting it lets a single node
  /// emulate several (tests), or override what detection finds.
  int ranks_per_node = 0;
  /// Communicator of every axis. nccl and mpi_staged need a libsumma built
  /// with CUDA (otherwise every rank throws "... built without CUDA") and the
  /// rank's device chosen before the grid is built (select_device_for_rank()
  /// or CudaBackend); nccl also needs a different GPU for each rank.
  CommBackend comm = CommBackend::mpi;
  /// The compute stream (a cudaStream_t, e.g. CudaBackend::stream()) the
  /// nccl / mpi_staged communicators order their work with; null is the
  /// legacy default stream. Ignored by mpi.
  void* compute_stream = nullptr;
  /// Pinned staging bytes of each mpi_staged communicator (one per axis).
  std::size_t staging_bytes = std::size_t{64} << 20;
  /// Requests each mpi_staged communicator can have in flight at once.
  int staging_requests = 64;
  /// A time limit on every blocking wait of the grid's communicators, with
  /// a report naming the ranks that have not arrived (comm/watchdog.hpp).
  /// Off (timeout_s = 0) by default; gpt_train sets 600 s.
  WatchdogOptions watchdog;
  /// Debug mode: every call of a layer, of the model and of the SUMMA engine
  /// agrees its argument checks (shapes, token ids, positions, the global
  /// sizes of a product) over its group before it communicates: one small
  /// all-reduce per call, so that an argument one rank alone gets wrong is
  /// the same summa::Error on every rank instead of a hang. Off (the
  /// default), those checks still run on every rank and throw there (the
  /// same error on every rank when every rank passes the same arguments, as
  /// gpt_train and the Trainer do), and what is static for a built model
  /// (its shapes, layouts and options) is agreed once, when the model, layer
  /// or engine is built: a steady-state step makes only the collectives its
  /// scheme needs. Must be the same on every rank (the constructor agrees).
  bool check_calls = false;
};

/// "mpi", "nccl" or "mpi_staged".
const char* to_string(CommBackend backend);

class ProcessGrid {
 public:
  /// Builds the grid on `comm` (duplicated; the caller keeps ownership of
  /// `comm`). Collective over `comm`. Throws summa::Error on every rank when
  /// the shape is non-positive or its size differs from the communicator's.
  ProcessGrid(MPI_Comm comm, GridShape shape, GridOptions options = {});
  ~ProcessGrid();
  ProcessGrid(const ProcessGrid&) = delete;
  ProcessGrid& operator=(const ProcessGrid&) = delete;
  ProcessGrid(ProcessGrid&&) noexcept;
  ProcessGrid& operator=(ProcessGrid&&) noexcept;

  /// q x q mesh (Optimus). q = 0 infers q from the size: size / data must be
  /// a perfect square.
  static ProcessGrid mesh2d(MPI_Comm comm, int q = 0, int data = 1, GridOptions options = {});
  /// Gx x Gy x Gz grid (AxoNN 3D PMM): rows = Gx, cols = Gy, depth = Gz.
  static ProcessGrid grid3d(MPI_Comm comm, int gx, int gy, int gz, int data = 1,
                            GridOptions options = {});
  /// p ranks in a line (Megatron 1D): rows = 1, cols = p.
  static ProcessGrid linear1d(MPI_Comm comm, int p = 0, int data = 1, GridOptions options = {});
  /// A plan-only grid: the rank at `coords` of a grid of `shape`, built
  /// without MPI and without any other rank (MPI need not be initialised).
  /// The memory planner builds a model on it to size that rank's buffers
  /// without launching the ranks (plan_memory without a communicator). Its
  /// communicators know their rank and size; any collective on them throws
  /// summa::Error, and agree() throws the local error alone. Throws
  /// summa::Error when an axis is non-positive or `coords` lie outside.
  static ProcessGrid plan(GridShape shape, GridCoords coords);
  /// True for a grid from plan(): it cannot communicate.
  bool plan_only() const { return plan_only_; }

  const GridShape& shape() const { return shape_; }
  const GridCoords& coords() const { return coords_; }
  int rank() const;  ///< rank in world()
  int size() const { return shape_.size(); }
  /// True when rows == cols (the SUMMA engine needs a square mesh).
  bool square_mesh() const { return shape_.rows == shape_.cols; }
  /// Ranks per node the placement used (detected or given).
  int ranks_per_node() const { return ranks_per_node_; }
  /// The placement actually applied (bunched falls back to natural when the
  /// node size does not tile the mesh; placement_note() says why).
  Placement placement() const { return placement_; }
  const std::string& placement_note() const { return placement_note_; }

  Communicator& world() { return comm(CommAxis::world); }
  Communicator& data() { return comm(CommAxis::data); }
  Communicator& depth() { return comm(CommAxis::depth); }
  Communicator& mesh_row() { return comm(CommAxis::mesh_row); }
  Communicator& mesh_col() { return comm(CommAxis::mesh_col); }
  Communicator& mesh() { return comm(CommAxis::mesh); }
  Communicator& tensor() { return comm(CommAxis::tensor); }
  Communicator& comm(CommAxis axis);
  /// The MPI communicator of an axis (for MPI-level control traffic; under
  /// every CommBackend, the MPI group the axis communicator was built from).
  /// A plan-only grid has none: it throws summa::Error.
  MPI_Comm native(CommAxis axis) const;
  /// The watchdog guarding the axes' waits, or null when it is off.
  Watchdog* watchdog() const;
  /// The communicator backend the axes use (GridOptions::comm).
  CommBackend comm_backend() const { return comm_backend_; }
  /// GridOptions::check_calls: per-call agreement (debug mode) on.
  bool check_calls() const { return check_calls_; }

  /// Bytes and calls per axis since construction or the last reset.
  const TrafficCounters& traffic() const { return *traffic_; }
  void reset_traffic() { traffic_->reset(); }

  /// Collective over `axis`: every rank passes its local error (or nothing).
  /// If any rank has one, every rank throws the same summa::Error carrying
  /// the message of the lowest-ranked failing member. Uses uncounted MPI
  /// control traffic (a 4-byte all-reduce; a broadcast only on failure), so
  /// that errors found by some ranks never leave the others in a collective.
  /// On a plan-only grid: throws the local error, if any.
  void agree(CommAxis axis, const std::optional<std::string>& local_error) const;
  /// The end of a per-call argument check (a layer's or the model's forward,
  /// backward or decode step): agree() over `axis` in debug mode
  /// (GridOptions::check_calls); otherwise no collective, and a local error
  /// throws summa::Error on this rank. Counted by agreements_made() only
  /// when it agrees.
  void agree_call(CommAxis axis, const std::optional<std::string>& local_error) const;

 private:
  struct Impl;
  ProcessGrid(GridShape shape, GridCoords coords);  // plan()
  GridShape shape_;
  GridCoords coords_;
  int ranks_per_node_ = 1;
  Placement placement_ = Placement::natural;
  std::string placement_note_;
  CommBackend comm_backend_ = CommBackend::mpi;
  bool plan_only_ = false;
  bool check_calls_ = false;
  std::unique_ptr<TrafficCounters> traffic_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace summa

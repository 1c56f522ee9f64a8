#include "summa/grid/process_grid.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "../comm/fault_stop.hpp"
#include "../comm/running_limit.hpp"
#include "../comm/setup_limit.hpp"
#include "device_communicators.hpp"
#include "summa/build_info.hpp"
#include "summa/core/error.hpp"

namespace summa {

namespace detail {
namespace {
constinit DeviceCommunicatorFactory registered_device_communicators = nullptr;
}  // namespace

void register_device_communicators(DeviceCommunicatorFactory factory) noexcept {
  registered_device_communicators = factory;
}

DeviceCommunicatorFactory device_communicators() noexcept {
  return registered_device_communicators;
}

std::string cuda_component_missing(std::string_view what) {
  return fmt::format(
      "{}: this summa was built without CUDA (summa/build_info.hpp SUMMA_HAVE_CUDA=0; "
      "configure with -DSUMMA_CUDA=ON where the CUDA toolkit, cuBLAS and NCCL are installed)",
      what);
}

std::optional<std::string> load_cuda_component(std::string_view what) {
  if (!SUMMA_HAVE_CUDA) return cuda_component_missing(what);
  // One attempt per process (dlopen is not repeated after a failure; the
  // reason is kept for every later caller).
  static std::mutex mutex;
  static std::string failure;
  static bool tried = false;
  const std::lock_guard lock(mutex);
  if (registered_device_communicators != nullptr) return std::nullopt;  // linked or loaded
  if (!tried) {
    tried = true;
    // Beside libsumma first (the build tree, an install's libdir), then the
    // loader's search path (LD_LIBRARY_PATH, the program's RUNPATH).
    std::vector<std::string> candidates;
    static const int anchor = 0;
    Dl_info self{};
    if (dladdr(&anchor, &self) != 0 && self.dli_fname != nullptr) {
      const std::string path = self.dli_fname;
      const std::size_t slash = path.rfind('/');
      if (slash != std::string::npos)
        candidates.push_back(path.substr(0, slash + 1) + SUMMA_CUDA_COMPONENT_FILE);
    }
    candidates.emplace_back(SUMMA_CUDA_COMPONENT_FILE);
    for (const std::string& file : candidates) {
      // RTLD_GLOBAL: its CUDA libraries serve later loads too; its static
      // initialiser registers the device and the communicators.
      if (dlopen(file.c_str(), RTLD_NOW | RTLD_GLOBAL) != nullptr &&
          registered_device_communicators != nullptr) {
        failure.clear();
        break;
      }
      const char* why = dlerror();  // names the file
      failure += fmt::format("{}{}", failure.empty() ? "" : "; ",
                             why != nullptr ? std::string(why) : file + ": registered nothing");
    }
  }
  if (registered_device_communicators != nullptr) return std::nullopt;
  return fmt::format(
      "{}: summa's CUDA component ({}) could not be loaded: {} (it is built and installed "
      "beside libsumma; its CUDA runtime, cuBLAS and NCCL must be on the loader's path)",
      what, SUMMA_CUDA_COMPONENT_FILE, failure);
}
}  // namespace detail

namespace {

std::string describe(const GridShape& s) {
  return fmt::format("data={} x depth={} x rows={} x cols={}", s.data, s.depth, s.rows, s.cols);
}

int world_size(MPI_Comm comm) {
  int size = 0;
  check_mpi(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  return size;
}

// (node index, local rank, ranks per node) of this process; ranks per node is
// 0 when nodes hold different numbers of ranks.
struct NodeInfo {
  int node = 0;
  int local = 0;
  int per_node = 0;
};

NodeInfo detect_nodes(MPI_Comm comm, int override_per_node) {
  int rank = 0;
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  if (override_per_node > 0) {
    const int o = override_per_node;
    return {rank / o, rank % o, world_size(comm) % o == 0 ? o : 0};  // 0: uneven nodes
  }
  MPI_Comm node_comm;
  check_mpi(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node_comm),
            "MPI_Comm_split_type");
  int local = 0, local_size = 0, leader = rank;
  check_mpi(MPI_Comm_rank(node_comm, &local), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(node_comm, &local_size), "MPI_Comm_size");
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, node_comm), "MPI_Allreduce");
  check_mpi(MPI_Comm_free(&node_comm), "MPI_Comm_free");
  std::array<int, 2> sizes{local_size, -local_size};
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, sizes.data(), 2, MPI_INT, MPI_MAX, comm), "MPI_Allreduce");
  std::vector<int> leaders(static_cast<std::size_t>(world_size(comm)));
  check_mpi(MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, comm), "MPI_Allgather");
  std::sort(leaders.begin(), leaders.end());
  leaders.erase(std::unique(leaders.begin(), leaders.end()), leaders.end());
  const int node =
      static_cast<int>(std::lower_bound(leaders.begin(), leaders.end(), leader) - leaders.begin());
  const bool uniform = sizes[0] == -sizes[1];
  return {node, local, uniform ? local_size : 0};
}

int linear_index(const GridShape& s, const GridCoords& c) {
  return ((c.data * s.depth + c.depth) * s.rows + c.row) * s.cols + c.col;
}

std::optional<std::string> check_comm_backend(const GridOptions& o) {
  switch (o.comm) {
    case CommBackend::mpi:
      return std::nullopt;
    case CommBackend::nccl:
    case CommBackend::mpi_staged:
      return detail::load_cuda_component(
          fmt::format("ProcessGrid: GridOptions::comm = {}", to_string(o.comm)));
  }
  return fmt::format("ProcessGrid: unknown GridOptions::comm value {}", static_cast<int>(o.comm));
}

// Takes ownership of `comm` (freed with the communicator, also on a throw).
std::unique_ptr<Communicator> make_communicator(MPI_Comm comm, CommAxis axis,
                                                TrafficCounter* counter, const GridOptions& o) {
  if (o.comm != CommBackend::mpi)  // checked by check_comm_backend: the component is loaded
    return detail::device_communicators()(comm, axis, counter, o);
  return std::make_unique<MpiCommunicator>(comm, true, axis, counter);
}

// The communicator of a plan-only grid (ProcessGrid::plan): a rank and a
// size, no peers. The planner only asks for shapes; a collective is a bug.
class PlanCommunicator final : public Communicator {
 public:
  PlanCommunicator(CommAxis axis, TrafficCounter* counter, int rank, int size)
      : Communicator(axis, counter), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }

 protected:
  std::uintptr_t start(Kind, const void*, void*, std::size_t, DType, ReduceOp, int) override {
    refuse();
  }
  void finish(std::uintptr_t) override { refuse(); }
  bool poll(std::uintptr_t) override { refuse(); }
  void do_barrier() override { refuse(); }

 private:
  [[noreturn]] void refuse() const {
    throw Error(fmt::format(
        "a plan-only grid (ProcessGrid::plan) cannot communicate: a collective on axis {} was "
        "issued while planning",
        name_of(axis())));
  }
  int rank_;
  int size_;
};

}  // namespace

const char* to_string(CommBackend backend) {
  switch (backend) {
    case CommBackend::mpi:
      return "mpi";
    case CommBackend::nccl:
      return "nccl";
    case CommBackend::mpi_staged:
      return "mpi_staged";
  }
  return "unknown";
}

namespace {
// SUMMA_FAULT_STOP_GRID (fault_stop.hpp): in each grid's set-up, before its
// communicators are split.
detail::FaultStop grid_stop("SUMMA_FAULT_STOP_GRID");
}  // namespace

struct ProcessGrid::Impl {
  std::unique_ptr<Watchdog> watchdog;  ///< destroyed after the communicators it guards
  std::array<std::unique_ptr<Communicator>, comm_axis_count> comms;
  std::array<MPI_Comm, comm_axis_count> natives{};  ///< owned by comms[i]
};

ProcessGrid::ProcessGrid(MPI_Comm comm, GridShape shape, GridOptions options)
    : shape_(shape),
      traffic_(std::make_unique<TrafficCounters>()),
      impl_(std::make_unique<Impl>()) {
  const int size = world_size(comm);
  std::optional<std::string> error;
  if (shape.data <= 0 || shape.depth <= 0 || shape.rows <= 0 || shape.cols <= 0)
    error = fmt::format("ProcessGrid: every axis must be positive, got {}", describe(shape));
  else if (shape.size() != size)
    error = fmt::format("ProcessGrid: communicator has {} ranks but the grid {} needs {}", size,
                        describe(shape), shape.size());
  else if (options.ranks_per_node < 0)
    error = fmt::format("ProcessGrid: ranks_per_node must be >= 0, got {}", options.ranks_per_node);
  else
    error = check_comm_backend(options);
  {
    static constexpr const char* names[] = {"GridOptions::check_calls"};
    const std::array<std::int64_t, 1> values{options.check_calls ? 1 : 0};
    agree_on(comm, error, values, names, "ProcessGrid");
  }
  comm_backend_ = options.comm;
  check_calls_ = options.check_calls;

  // From here until the grid's watchdog exists, the set-up makes blocking
  // calls no watchdog can poll (MPI_Comm_split_type, MPI_Comm_split,
  // MPI_Comm_dup, the node and placement reductions): under a running-time
  // limit, the grid's own watchdog limit (or the thread's SetupLimit), so a
  // rank stopped or lost here ends the job instead of hanging it.
  std::atomic<const char*> step{"the node detection (MPI_Comm_split_type)"};
  const double own = options.watchdog.limit_s();
  const double limit = own > 0 ? own : detail::SetupLimit::current();
  int me = 0;
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &me), "MPI_Comm_rank");
  const detail::RunningLimit set_up(limit, [&step, size, me](double seconds) {
    detail::exit_blocked(
        me, fmt::format("the process grid's set-up, in {} over {} ranks", step.load(), size),
        seconds);
  });
  grid_stop.reached();

  const NodeInfo node = detect_nodes(comm, options.ranks_per_node);
  ranks_per_node_ = node.per_node;
  placement_ = options.placement;
  int slot = 0;
  check_mpi(MPI_Comm_rank(comm, &slot), "MPI_Comm_rank");
  if (placement_ == Placement::bunched) {
    const int plane = shape.rows * shape.cols;
    if (node.per_node == 0) {
      placement_note_ = "bunched placement needs the same number of ranks on every node";
    } else if (node.per_node < plane &&
               bunched_tile(shape.rows, shape.cols, node.per_node).rows == 0) {
      placement_note_ = fmt::format("{} ranks per node do not tile a {}x{} mesh", node.per_node,
                                    shape.rows, shape.cols);
    } else if (node.per_node >= plane && node.per_node % plane != 0) {
      placement_note_ = fmt::format("{} ranks per node is not a whole number of {}x{} meshes",
                                    node.per_node, shape.rows, shape.cols);
    } else {
      slot = node.node * node.per_node + node.local;
      placement_note_ = fmt::format("bunched: {} ranks per node", node.per_node);
    }
    if (slot < 0 || slot >= size) {
      placement_note_ = "node numbering does not cover the grid";
      check_mpi(MPI_Comm_rank(comm, &slot), "MPI_Comm_rank");
    }
    int all_bunched = placement_note_.rfind("bunched:", 0) == 0 ? 1 : 0;
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, &all_bunched, 1, MPI_INT, MPI_MIN, comm),
              "MPI_Allreduce");
    if (!all_bunched) {
      placement_ = Placement::natural;
      check_mpi(MPI_Comm_rank(comm, &slot), "MPI_Comm_rank");
    }
  }
  coords_ = place(shape, placement_, std::max(node.per_node, 1))[static_cast<std::size_t>(slot)];

  step = "the grid's MPI_Comm_split (axis world)";
  MPI_Comm world;
  check_mpi(MPI_Comm_split(comm, 0, linear_index(shape, coords_), &world), "MPI_Comm_split");
  auto wrap = [&](CommAxis axis, MPI_Comm c) {
    impl_->natives[static_cast<std::size_t>(axis)] = c;
    impl_->comms[static_cast<std::size_t>(axis)] =
        make_communicator(c, axis, &(*traffic_)[axis], options);
  };
  wrap(CommAxis::world, world);
  const GridShape& s = shape_;
  const GridCoords& c = coords_;
  static constexpr std::array<const char*, comm_axis_count> kSplitSteps = [] {
    std::array<const char*, comm_axis_count> a{};
    a[static_cast<std::size_t>(CommAxis::data)] = "the grid's MPI_Comm_split (axis data)";
    a[static_cast<std::size_t>(CommAxis::depth)] = "the grid's MPI_Comm_split (axis depth)";
    a[static_cast<std::size_t>(CommAxis::mesh_row)] = "the grid's MPI_Comm_split (axis mesh_row)";
    a[static_cast<std::size_t>(CommAxis::mesh_col)] = "the grid's MPI_Comm_split (axis mesh_col)";
    a[static_cast<std::size_t>(CommAxis::mesh)] = "the grid's MPI_Comm_split (axis mesh)";
    a[static_cast<std::size_t>(CommAxis::tensor)] = "the grid's MPI_Comm_split (axis tensor)";
    return a;
  }();
  auto split = [&](CommAxis axis, int color, int key) {
    step = kSplitSteps[static_cast<std::size_t>(axis)];
    MPI_Comm sub;
    check_mpi(MPI_Comm_split(world, color, key, &sub), "MPI_Comm_split");
    wrap(axis, sub);
  };
  split(CommAxis::data, (c.depth * s.rows + c.row) * s.cols + c.col, c.data);
  split(CommAxis::depth, (c.data * s.rows + c.row) * s.cols + c.col, c.depth);
  split(CommAxis::mesh_row, (c.data * s.depth + c.depth) * s.rows + c.row, c.col);
  split(CommAxis::mesh_col, (c.data * s.depth + c.depth) * s.cols + c.col, c.row);
  split(CommAxis::mesh, c.data * s.depth + c.depth, c.row * s.cols + c.col);
  split(CommAxis::tensor, c.data, (c.depth * s.rows + c.row) * s.cols + c.col);
  // Collective (checks that every rank has the same limit); always built, so
  // that ranks with the watchdog off do not skip a collective others make.
  step = "the watchdog's set-up (MPI_Comm_dup)";
  impl_->watchdog = std::make_unique<Watchdog>(world, options.watchdog);
  for (std::size_t a = 0; a < comm_axis_count; ++a)
    if (impl_->comms[a]) impl_->watchdog->attach(*impl_->comms[a], impl_->natives[a]);
}

ProcessGrid ProcessGrid::plan(GridShape shape, GridCoords coords) {
  return ProcessGrid(shape, coords);
}

ProcessGrid::ProcessGrid(GridShape shape, GridCoords coords)
    : shape_(shape),
      coords_(coords),
      plan_only_(true),
      traffic_(std::make_unique<TrafficCounters>()),
      impl_(std::make_unique<Impl>()) {
  const GridShape& s = shape;
  const GridCoords& c = coords;
  require(s.data > 0 && s.depth > 0 && s.rows > 0 && s.cols > 0, [&] {
    return fmt::format("ProcessGrid::plan: every axis must be positive, got {}", describe(s));
  });
  require(c.data >= 0 && c.data < s.data && c.depth >= 0 && c.depth < s.depth && c.row >= 0 &&
              c.row < s.rows && c.col >= 0 && c.col < s.cols,
          [&] {
            return fmt::format(
                "ProcessGrid::plan: coordinates data={} depth={} row={} col={} lie outside the "
                "grid {}",
                c.data, c.depth, c.row, c.col, describe(s));
          });
  auto make = [&](CommAxis axis, int rank, int size) {
    impl_->natives[static_cast<std::size_t>(axis)] = MPI_COMM_NULL;
    impl_->comms[static_cast<std::size_t>(axis)] =
        std::make_unique<PlanCommunicator>(axis, &(*traffic_)[axis], rank, size);
  };
  make(CommAxis::world, linear_index(s, c), s.size());
  make(CommAxis::data, c.data, s.data);
  make(CommAxis::depth, c.depth, s.depth);
  make(CommAxis::mesh_row, c.col, s.cols);
  make(CommAxis::mesh_col, c.row, s.rows);
  make(CommAxis::mesh, c.row * s.cols + c.col, s.rows * s.cols);
  make(CommAxis::tensor, (c.depth * s.rows + c.row) * s.cols + c.col, s.depth * s.rows * s.cols);
}

Watchdog* ProcessGrid::watchdog() const {
  return impl_->watchdog && impl_->watchdog->enabled() ? impl_->watchdog.get() : nullptr;
}

ProcessGrid::~ProcessGrid() = default;
ProcessGrid::ProcessGrid(ProcessGrid&&) noexcept = default;
ProcessGrid& ProcessGrid::operator=(ProcessGrid&&) noexcept = default;

int ProcessGrid::rank() const {
  return impl_->comms[0]->rank();
}

Communicator& ProcessGrid::comm(CommAxis axis) {
  auto& c = impl_->comms[static_cast<std::size_t>(axis)];
  require(c != nullptr, [&] {
    return fmt::format("ProcessGrid has no communicator for axis {}", name_of(axis));
  });
  return *c;
}

MPI_Comm ProcessGrid::native(CommAxis axis) const {
  auto& c = impl_->comms[static_cast<std::size_t>(axis)];
  require(c != nullptr, [&] {
    return fmt::format("ProcessGrid has no communicator for axis {}", name_of(axis));
  });
  require(!plan_only_, [&] {
    return fmt::format("a plan-only grid (ProcessGrid::plan) has no MPI communicator (axis {})",
                       name_of(axis));
  });
  return impl_->natives[static_cast<std::size_t>(axis)];
}

void ProcessGrid::agree(CommAxis axis, const std::optional<std::string>& local_error) const {
  if (plan_only_) {
    if (local_error) throw CollectiveError(*local_error);
    return;
  }
  agree_on(native(axis), local_error);
}

void ProcessGrid::agree_call(CommAxis axis, const std::optional<std::string>& local_error) const {
  if (check_calls_)
    agree(axis, local_error);
  else if (local_error)
    throw Error(*local_error);
}

ProcessGrid ProcessGrid::mesh2d(MPI_Comm comm, int q, int data, GridOptions options) {
  const int size = world_size(comm);
  std::optional<std::string> error;
  if (data <= 0)
    error = fmt::format("mesh2d: data axis must be positive, got {}", data);
  else if (q < 0)
    error = fmt::format("mesh2d: q must be positive, got {}", q);
  else if (q == 0) {
    if (size % data != 0) {
      error = fmt::format("mesh2d: {} ranks not divisible by data={}", size, data);
    } else {
      const int per_mesh = size / data;
      q = static_cast<int>(std::lround(std::sqrt(static_cast<double>(per_mesh))));
      if (q * q != per_mesh)
        error = fmt::format("mesh2d: {} ranks per mesh (of {} ranks, data={}) is not a square q*q",
                            per_mesh, size, data);
    }
  }
  agree_on(comm, error);
  return ProcessGrid(comm, GridShape{data, 1, q, q}, options);
}

ProcessGrid ProcessGrid::grid3d(MPI_Comm comm, int gx, int gy, int gz, int data,
                                GridOptions options) {
  return ProcessGrid(comm, GridShape{data, gz, gx, gy}, options);
}

ProcessGrid ProcessGrid::linear1d(MPI_Comm comm, int p, int data, GridOptions options) {
  const int size = world_size(comm);
  std::optional<std::string> error;
  if (data <= 0)
    error = fmt::format("linear1d: data axis must be positive, got {}", data);
  else if (p < 0)
    error = fmt::format("linear1d: p must be positive, got {}", p);
  else if (p == 0 && size % data != 0)
    error = fmt::format("linear1d: {} ranks not divisible by data={}", size, data);
  agree_on(comm, error);
  if (p == 0) p = size / data;
  return ProcessGrid(comm, GridShape{data, 1, 1, p}, options);
}

}  // namespace summa

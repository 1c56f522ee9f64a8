// Tests of the GPU communicators (NcclCommunicator, StagedCommunicator) and
// of ProcessGrid's GridOptions::comm.
//
// Suites, each registered as its own CTest entry (tests/CMakeLists.txt):
//  - NcclCpu: runs on any machine. Requesting nccl / mpi_staged from a
//    ProcessGrid in a build without CUDA, or in a CUDA build on a machine
//    without a GPU, throws the same clear summa::Error on every rank (and the
//    world stays usable); bad communicator arguments likewise.
//  - Nccl, Staged: need a GPU (print "no CUDA device: skipped" and skip
//    otherwise; Nccl also needs one GPU per node-local rank). Every
//    collective (f32/f64, sum/max/min, every root, in place or not,
//    blocking / wait / test) on device buffers against MpiCommunicator on
//    host copies of the same data, on a rank-reversed world and on split
//    groups; byte counters equal MPI's; requests in flight together and out of
//    order; event pool / staging buffer exhaustion; every ProcessGrid axis.
//  - NcclShared: ranks sharing a GPU are refused by NCCL's communicator with a
//    clear error (skipped when every rank has its own GPU).
//
// Inputs are random multiples of 1/8 in [-512, 512]: sums over up to a few
// thousand of them are exact in float, so device results are compared with
// MPI's bit for bit, independent of reduction order. Uploads are queued on
// the compute stream behind a host function that sleeps, so a communicator
// that does not order itself after the compute stream reads stale inputs,
// and results are read back on the compute stream without a device-wide
// sync, so one that does not make the compute stream wait reads NaN.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "summa/build_info.hpp"
#include "summa/comm/communicator.hpp"
#include "summa/comm/mpi_communicator.hpp"
#include "summa/comm/nccl_communicator.hpp"
#include "summa/comm/staged_communicator.hpp"
#include "summa/core/error.hpp"
#include "summa/grid/process_grid.hpp"
#include "summa/parallel/auto_scheme.hpp"
#include "test_util.hpp"

#if SUMMA_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "summa/backend/cuda_backend.hpp"
#endif

namespace {

using summa::CommAxis;
using summa::CommBackend;
using summa::Communicator;
using summa::DType;
using summa::dtype_v;
using summa::GridOptions;
using summa::GridShape;
using summa::MpiCommunicator;
using summa::ProcessGrid;
using summa::ReduceOp;
using summa::Request;
using summa::TrafficCounter;
using summa::test::fresh_seed;
using summa::test::mix;
using summa::test::same_on_all_ranks;
using summa::test::seed_note;

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int s = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

/// Rank 0 prints `line` (CTest's SKIP_REGULAR_EXPRESSION looks for it).
void note(const std::string& line) {
  if (world_rank() == 0) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
}

#if SUMMA_HAVE_CUDA
/// Smallest number of CUDA devices any rank sees. Collective.
int visible_devices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  MPI_Allreduce(MPI_IN_PLACE, &n, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return n;
}

/// Largest number of ranks on one node. Collective.
int ranks_per_node() {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank(), MPI_INFO_NULL, &node);
  int n = 0;
  MPI_Comm_size(node, &n);
  MPI_Comm_free(&node);
  MPI_Allreduce(MPI_IN_PLACE, &n, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return n;
}
#endif

/// Runs `make` and returns the summa::Error it throws ("" when none).
template <class F>
std::string error_of(F&& make) {
  try {
    make();
  } catch (const summa::Error& e) {
    return e.what();
  }
  return {};
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// ------------------------------------------------------------------ NcclCpu

TEST(NcclCpu, BackendNamesAndDefault) {
  EXPECT_STREQ(summa::to_string(CommBackend::mpi), "mpi");
  EXPECT_STREQ(summa::to_string(CommBackend::nccl), "nccl");
  EXPECT_STREQ(summa::to_string(CommBackend::mpi_staged), "mpi_staged");
  EXPECT_EQ(GridOptions{}.comm, CommBackend::mpi);
  ProcessGrid g = ProcessGrid::linear1d(MPI_COMM_WORLD);
  EXPECT_EQ(g.comm_backend(), CommBackend::mpi);
}

// Without CUDA (build) or without a GPU (machine), asking a grid for GPU
// communicators fails on every rank with one message that says why; the
// ranks are not left in a collective, and the world stays usable.
TEST(NcclCpu, GridRequestWithoutCudaThrowsEverywhere) {
#if SUMMA_HAVE_CUDA
  if (visible_devices() > 0)
    GTEST_SKIP() << "a CUDA device is present: the Nccl and Staged suites cover this build";
#endif
  for (CommBackend backend : {CommBackend::nccl, CommBackend::mpi_staged}) {
    GridOptions options;
    options.comm = backend;
    const std::string message =
        error_of([&] { ProcessGrid g = ProcessGrid::linear1d(MPI_COMM_WORLD, 0, 1, options); });
#if SUMMA_HAVE_CUDA
    EXPECT_TRUE(contains(message, "no CUDA device")) << message;
    EXPECT_TRUE(
        contains(message, backend == CommBackend::nccl ? "NcclCommunicator" : "StagedCommunicator"))
        << message;
#else
    EXPECT_TRUE(contains(message, "built without CUDA")) << message;
    EXPECT_TRUE(contains(message, std::string("GridOptions::comm = ") + summa::to_string(backend)))
        << message;
#endif
    EXPECT_TRUE(same_on_all_ranks(message)) << message;
  }
  ProcessGrid g = ProcessGrid::linear1d(MPI_COMM_WORLD);
  double x = 1.5;
  g.world().all_reduce(&x, &x, 1);
  EXPECT_EQ(x, 1.5 * world_size());
}

#if SUMMA_HAVE_CUDA
TEST(NcclCpu, CommunicatorsWithoutDeviceThrowEverywhere) {
  if (visible_devices() > 0)
    GTEST_SKIP() << "a CUDA device is present: the Nccl and Staged suites cover this build";
  TrafficCounter counter;
  auto dup = [] {
    MPI_Comm c;
    MPI_Comm_dup(MPI_COMM_WORLD, &c);
    return c;  // owned by the communicator, freed also when it throws
  };
  const std::string nccl =
      error_of([&] { summa::NcclCommunicator c(dup(), true, CommAxis::other, &counter, nullptr); });
  EXPECT_TRUE(contains(nccl, "NcclCommunicator on axis other: no CUDA device")) << nccl;
  EXPECT_TRUE(same_on_all_ranks(nccl)) << nccl;
  const std::string pool = error_of(
      [&] { summa::NcclCommunicator c(dup(), true, CommAxis::other, &counter, nullptr, 0); });
  EXPECT_TRUE(contains(pool, "event_pool must be at least 1, got 0")) << pool;
  EXPECT_TRUE(same_on_all_ranks(pool)) << pool;
  const std::string staged = error_of(
      [&] { summa::StagedCommunicator c(dup(), true, CommAxis::mesh, &counter, nullptr, 4096); });
  EXPECT_TRUE(contains(staged, "StagedCommunicator on axis mesh: no CUDA device")) << staged;
  EXPECT_TRUE(same_on_all_ranks(staged)) << staged;
  const std::string select = error_of([] { summa::select_device_for_rank(MPI_COMM_WORLD); });
  EXPECT_TRUE(contains(select, "select_device_for_rank: no CUDA device")) << select;
  EXPECT_TRUE(same_on_all_ranks(select)) << select;
  EXPECT_EQ(counter, TrafficCounter{});
}
#endif

// ------------------------------------------------------------------ GPU suites

/// Why the GPU suites cannot run here, or nothing. Collective.
std::optional<std::string> no_gpu_reason() {
#if SUMMA_HAVE_CUDA
  if (visible_devices() == 0) return std::string("no CUDA device: skipped");
  return std::nullopt;
#else
  return std::string("built without CUDA: no CUDA device: skipped");
#endif
}

#define SKIP_WITHOUT_GPU()             \
  do {                                 \
    if (auto why_ = no_gpu_reason()) { \
      note(*why_);                     \
      GTEST_SKIP() << *why_;           \
    }                                  \
  } while (0)

#if SUMMA_HAVE_CUDA

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorString(e));
}

/// This process's device (chosen once, from the node-local rank) and a
/// non-blocking compute stream. Collective on first use.
struct Gpu {
  int device = -1;
  cudaStream_t stream = nullptr;
};
Gpu& gpu() {
  static Gpu g = [] {
    Gpu made;
    made.device = summa::select_device_for_rank(MPI_COMM_WORLD);
    cuda_check(cudaStreamCreateWithFlags(&made.stream, cudaStreamNonBlocking),
               "cudaStreamCreateWithFlags");
    return made;  // the stream lives until the process ends
  }();
  return g;
}

/// One GPU per rank for NCCL, or a reason to skip. Collective.
std::optional<std::string> shared_gpu_reason() {
  const int devices = visible_devices();
  const int local = ranks_per_node();
  if (local > devices)
    return "fewer CUDA devices than ranks: skipped (" + std::to_string(local) +
           " ranks per node, " + std::to_string(devices) + " devices)";
  return std::nullopt;
}

class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) : bytes_(std::max<std::size_t>(bytes, 1)) {
    cuda_check(cudaMalloc(&p_, bytes_), "cudaMalloc");
  }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
  std::size_t bytes_;
};

class PinnedBuffer {
 public:
  explicit PinnedBuffer(std::size_t bytes) : bytes_(std::max<std::size_t>(bytes, 1)) {
    cuda_check(cudaMallocHost(&p_, bytes_), "cudaMallocHost");
  }
  ~PinnedBuffer() { cudaFreeHost(p_); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
  std::size_t bytes_;
};

/// Pageable host memory (malloc), for the host-buffer paths.
class HostBuffer {
 public:
  explicit HostBuffer(std::size_t bytes) : p_(std::malloc(std::max<std::size_t>(bytes, 1))) {
    if (p_ == nullptr) throw std::bad_alloc();
  }
  ~HostBuffer() { std::free(p_); }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_;
};

/// Where the buffers handed to the communicator under test live.
enum class Memory { device, host };

/// Queues on `stream`: a host function that sleeps, then host -> device
/// copies of `images` (pinned) into `targets`. Nothing waits on the host.
void delayed_upload(cudaStream_t stream,
                    std::initializer_list<std::pair<void*, const void*>> copies,
                    std::initializer_list<std::size_t> bytes) {
  cuda_check(cudaLaunchHostFunc(
                 stream, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(4)); },
                 nullptr),
             "cudaLaunchHostFunc");
  auto b = bytes.begin();
  for (const auto& [dst, src] : copies) {
    if (*b > 0)
      cuda_check(cudaMemcpyAsync(dst, src, *b, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
    ++b;
  }
}

enum class Kind { broadcast, reduce, all_reduce, all_gather, reduce_scatter };
enum class Mode { blocking, wait, test };

const char* name_of(Kind k) {
  static const char* names[] = {"broadcast", "reduce", "all_reduce", "all_gather",
                                "reduce_scatter"};
  return names[static_cast<int>(k)];
}
const char* name_of(Mode m) {
  static const char* names[] = {"blocking", "wait", "test"};
  return names[static_cast<int>(m)];
}
const char* name_of(ReduceOp op) {
  static const char* names[] = {"sum", "max", "min"};
  return names[static_cast<int>(op)];
}

/// Where send and recv lie in the two buffer images a (input) and b (NaN).
struct Layout {
  std::size_t a_len = 0, b_len = 0;
  bool recv_in_a = false;
  std::size_t recv_offset = 0, recv_len = 0;
  std::size_t send_offset = 0, send_len = 0;
  bool check_recv = true;
  bool check_send = false;  ///< out of place: the send buffer must be unchanged
};

Layout layout_of(Kind k, std::size_t n, int g, int r, int root, bool in_place) {
  const std::size_t gn = static_cast<std::size_t>(g) * n;
  const std::size_t own = static_cast<std::size_t>(r) * n;
  Layout l;
  switch (k) {
    case Kind::broadcast:
      l = {n, 0, true, 0, n, 0, n, true, false};
      break;
    case Kind::reduce:
      l = {n, in_place ? 0 : n, in_place, 0, n, 0, n, r == root, !in_place};
      break;
    case Kind::all_reduce:
      l = {n, in_place ? 0 : n, in_place, 0, n, 0, n, true, !in_place};
      break;
    case Kind::all_gather:
      if (in_place)
        l = {gn, 0, true, 0, gn, own, n, true, false};
      else
        l = {n, gn, false, 0, gn, 0, n, true, true};
      break;
    case Kind::reduce_scatter:
      l = {gn, in_place ? 0 : n, in_place, 0, n, 0, gn, true, !in_place};
      break;
  }
  return l;
}

/// Issues one collective on `c` and completes it as `mode` says.
template <class T>
void issue(Communicator& c, Kind k, Mode mode, const T* send, T* recv, std::size_t n, ReduceOp op,
           int root) {
  const DType t = dtype_v<T>;
  if (mode == Mode::blocking) {
    switch (k) {
      case Kind::broadcast:
        c.broadcast(recv, n, t, root);
        break;
      case Kind::reduce:
        c.reduce(send, recv, n, t, op, root);
        break;
      case Kind::all_reduce:
        c.all_reduce(send, recv, n, t, op);
        break;
      case Kind::all_gather:
        c.all_gather(send, recv, n, t);
        break;
      case Kind::reduce_scatter:
        c.reduce_scatter(send, recv, n, t, op);
        break;
    }
    return;
  }
  Request q;
  switch (k) {
    case Kind::broadcast:
      q = c.ibroadcast(recv, n, t, root);
      break;
    case Kind::reduce:
      q = c.ireduce(send, recv, n, t, op, root);
      break;
    case Kind::all_reduce:
      q = c.iall_reduce(send, recv, n, t, op);
      break;
    case Kind::all_gather:
      q = c.iall_gather(send, recv, n, t);
      break;
    case Kind::reduce_scatter:
      q = c.ireduce_scatter(send, recv, n, t, op);
      break;
  }
  if (mode == Mode::wait)
    c.wait(q);
  else
    while (!c.test(q)) {
    }
}

/// Random multiples of 1/8 in [-512, 512].
template <class T>
std::vector<T> random_values(std::size_t n, std::mt19937_64& gen) {
  std::uniform_int_distribution<int> d(-4096, 4096);
  std::vector<T> v(n);
  for (T& x : v) x = static_cast<T>(d(gen)) / T(8);
  return v;
}

/// First index where two arrays differ bit for bit, or -1.
template <class T>
long first_difference(const T* a, const T* b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    if (std::memcmp(a + i, b + i, sizeof(T)) != 0) return static_cast<long>(i);
  return -1;
}

/// Runs every collective on `dev` (device buffers, or pageable host buffers
/// with Memory::host) and `ref` (host buffers, MPI) over the same group and
/// compares. Collective over the group.
class CollectiveCheck {
 public:
  static constexpr std::size_t max_n = 333;

  CollectiveCheck(Communicator& dev, Communicator& ref, std::uint64_t seed, Memory memory)
      : memory_(memory),
        dev_(dev),
        ref_(ref),
        g_(dev.size()),
        r_(dev.rank()),
        shared_(seed),
        own_(mix(seed + static_cast<std::uint64_t>(r_) + 1)),
        bytes_(static_cast<std::size_t>(g_) * max_n * sizeof(double)),
        da_(bytes_),
        db_(bytes_),
        ha_(bytes_),
        hb_(bytes_),
        pa_(bytes_),
        pb_(bytes_) {}

  template <class T>
  void all_cases() {
    const std::vector<ReduceOp> ops{ReduceOp::sum, ReduceOp::max, ReduceOp::min};
    int index = 0;
    for (Kind k : {Kind::broadcast, Kind::reduce, Kind::all_reduce, Kind::all_gather,
                   Kind::reduce_scatter}) {
      const bool reduces = k == Kind::reduce || k == Kind::all_reduce || k == Kind::reduce_scatter;
      const bool rooted = k == Kind::broadcast || k == Kind::reduce;
      for (ReduceOp op : reduces ? ops : std::vector<ReduceOp>{ReduceOp::sum})
        for (int root = 0; root < (rooted ? g_ : 1); ++root)
          for (bool in_place : {false, true}) {
            if (k == Kind::broadcast && in_place) continue;  // always in place
            for (Mode m : {Mode::blocking, Mode::wait, Mode::test})
              one_case<T>(k, op, root, in_place, m, index++ % 11 == 0);
          }
    }
  }

  template <class T>
  void one_case(Kind k, ReduceOp op, int root, bool in_place, Mode mode, bool empty) {
    std::uniform_int_distribution<std::size_t> size(1, max_n);
    const std::size_t n = empty ? 0 : size(shared_);
    const Layout l = layout_of(k, n, g_, r_, root, in_place);
    const std::vector<T> a = random_values<T>(l.a_len, own_);
    const std::vector<T> b(l.b_len, std::numeric_limits<T>::quiet_NaN());
    const std::string what = std::string(name_of(k)) + " " +
                             std::string(summa::name_of(dtype_v<T>)) + " n=" + std::to_string(n) +
                             " op=" + name_of(op) + " root=" + std::to_string(root) +
                             (in_place ? " in place" : "") + " " + name_of(mode) + " (group rank " +
                             std::to_string(r_) + " of " + std::to_string(g_) + ")";

    // Reference: MPI on host copies.
    std::vector<T> am = a, bm = b;
    {
      T* recv = (l.recv_in_a ? am.data() : bm.data()) + l.recv_offset;
      issue<T>(ref_, k, mode, am.data() + l.send_offset, recv, n, op, root);
    }

    if (memory_ == Memory::host) {
      // Pageable host buffers: no stream involved; results read in place.
      std::copy(a.begin(), a.end(), pa_.as<T>());
      std::copy(b.begin(), b.end(), pb_.as<T>());
      T* recv = (l.recv_in_a ? pa_.as<T>() : pb_.as<T>()) + l.recv_offset;
      issue<T>(dev_, k, mode, pa_.as<T>() + l.send_offset, recv, n, op, root);
      std::copy(pa_.as<T>(), pa_.as<T>() + l.a_len, ha_.as<T>());
      std::copy(pb_.as<T>(), pb_.as<T>() + l.b_len, hb_.as<T>());
      compare<T>(l, a, am, bm, what);
      return;
    }

    // Device: delayed upload on the compute stream, the collective, download
    // on the compute stream.
    cudaStream_t s = gpu().stream;
    std::copy(a.begin(), a.end(), ha_.as<T>());
    std::copy(b.begin(), b.end(), hb_.as<T>());
    delayed_upload(s, {{da_.as<T>(), ha_.as<T>()}, {db_.as<T>(), hb_.as<T>()}},
                   {l.a_len * sizeof(T), l.b_len * sizeof(T)});
    T* recv = (l.recv_in_a ? da_.as<T>() : db_.as<T>()) + l.recv_offset;
    issue<T>(dev_, k, mode, da_.as<T>() + l.send_offset, recv, n, op, root);
    if (l.a_len > 0)
      cuda_check(
          cudaMemcpyAsync(ha_.as<T>(), da_.as<T>(), l.a_len * sizeof(T), cudaMemcpyDeviceToHost, s),
          "cudaMemcpyAsync");
    if (l.b_len > 0)
      cuda_check(
          cudaMemcpyAsync(hb_.as<T>(), db_.as<T>(), l.b_len * sizeof(T), cudaMemcpyDeviceToHost, s),
          "cudaMemcpyAsync");
    cuda_check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    compare<T>(l, a, am, bm, what);
  }

  int cases() const { return cases_; }

 private:
  // The images read back (ha_, hb_) against MPI's (am, bm) and the input a.
  template <class T>
  void compare(const Layout& l, const std::vector<T>& a, const std::vector<T>& am,
               const std::vector<T>& bm, const std::string& what) {
    ++cases_;
    if (l.check_recv) {
      const T* got = (l.recv_in_a ? ha_.as<T>() : hb_.as<T>()) + l.recv_offset;
      const T* want = (l.recv_in_a ? am.data() : bm.data()) + l.recv_offset;
      const long at = first_difference(got, want, l.recv_len);
      EXPECT_EQ(at, -1) << what << ": result element " << at << " is " << (at >= 0 ? got[at] : T(0))
                        << ", MPI gives " << (at >= 0 ? want[at] : T(0));
    }
    if (l.check_send) {
      const long at =
          first_difference(ha_.as<T>() + l.send_offset, a.data() + l.send_offset, l.send_len);
      EXPECT_EQ(at, -1) << what << ": send buffer changed at element " << at;
    }
  }

  Memory memory_;
  Communicator& dev_;
  Communicator& ref_;
  int g_, r_;
  std::mt19937_64 shared_;  ///< same on every rank: sizes
  std::mt19937_64 own_;     ///< this rank's data
  std::size_t bytes_;
  DeviceBuffer da_, db_;
  PinnedBuffer ha_, hb_;
  HostBuffer pa_, pb_;
  int cases_ = 0;
};

/// The groups the collectives are checked on: the world with its ranks
/// reversed (group rank != world rank), and, with 2+ ranks, the world split
/// into even and odd ranks (several groups at once). `make` builds the
/// communicator under test on an MPI communicator it then owns.
template <class Make>
void check_every_collective(Make&& make, Memory memory = Memory::device) {
  const int rank = world_rank(), size = world_size();
  struct Split {
    int color, key;
    const char* name;
  };
  std::vector<Split> splits{{0, size - 1 - rank, "reversed world"}};
  if (size >= 2) splits.push_back({rank % 2, rank, "even/odd halves"});
  for (const Split& split : splits) {
    const std::uint64_t seed = fresh_seed();
    SCOPED_TRACE(std::string(split.name) + ", " + seed_note(seed));
    MPI_Comm dev_comm, ref_comm;
    MPI_Comm_split(MPI_COMM_WORLD, split.color, split.key, &dev_comm);
    MPI_Comm_split(MPI_COMM_WORLD, split.color, split.key, &ref_comm);
    TrafficCounter dev_counter, ref_counter;
    {
      auto dev = make(dev_comm, &dev_counter);
      MpiCommunicator ref(ref_comm, true, CommAxis::other, &ref_counter);
      EXPECT_EQ(dev->rank(), ref.rank());
      EXPECT_EQ(dev->size(), ref.size());
      CollectiveCheck check(*dev, ref, seed, memory);
      check.all_cases<float>();
      check.all_cases<double>();
      EXPECT_GT(check.cases(), 0);
      dev->barrier();
      ref.barrier();
    }
    EXPECT_EQ(dev_counter, ref_counter);
    EXPECT_GT(dev_counter.calls, 0u);
  }
}

/// `count` all-reduces in flight on one communicator, completed out of order
/// (last first, by wait and by test alternately); each against MPI.
template <class T>
void check_in_flight(Communicator& dev, Communicator& ref, int count, std::uint64_t seed) {
  const std::size_t n = 257;
  std::mt19937_64 gen(mix(seed + static_cast<std::uint64_t>(dev.rank())));
  std::vector<std::vector<T>> inputs, wanted;
  for (int i = 0; i < count; ++i) {
    inputs.push_back(random_values<T>(n, gen));
    wanted.push_back(std::vector<T>(n));
    ref.all_reduce(inputs.back().data(), wanted.back().data(), n, dtype_v<T>, ReduceOp::sum);
  }
  const std::size_t bytes = static_cast<std::size_t>(count) * n * sizeof(T);
  DeviceBuffer din(bytes), dout(bytes);
  PinnedBuffer host(bytes);
  for (int i = 0; i < count; ++i)
    std::copy(inputs[static_cast<std::size_t>(i)].begin(),
              inputs[static_cast<std::size_t>(i)].end(), host.as<T>() + i * n);
  cudaStream_t s = gpu().stream;
  delayed_upload(s, {{din.as<T>(), host.as<T>()}}, {bytes});
  cuda_check(cudaMemsetAsync(dout.as<T>(), 0xff, bytes, s), "cudaMemsetAsync");  // NaN
  std::vector<Request> requests;
  for (int i = 0; i < count; ++i)
    requests.push_back(
        dev.iall_reduce(din.as<T>() + i * n, dout.as<T>() + i * n, n, dtype_v<T>, ReduceOp::sum));
  for (int i = count - 1; i >= 0; --i) {
    Request& q = requests[static_cast<std::size_t>(i)];
    if (i % 2 == 0)
      dev.wait(q);
    else
      while (!dev.test(q)) {
      }
    EXPECT_FALSE(q.active());
  }
  cuda_check(cudaMemcpyAsync(host.as<T>(), dout.as<T>(), bytes, cudaMemcpyDeviceToHost, s),
             "cudaMemcpyAsync");
  cuda_check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  for (int i = 0; i < count; ++i) {
    const long at =
        first_difference(host.as<T>() + i * n, wanted[static_cast<std::size_t>(i)].data(), n);
    EXPECT_EQ(at, -1) << "request " << i << " of " << count << ": element " << at;
  }
}

MPI_Comm dup_world() {
  MPI_Comm c;
  MPI_Comm_dup(MPI_COMM_WORLD, &c);
  return c;
}

/// Point to point on `dev` (the pipeline's stage messages): ranks in pairs
/// (r, r ^ 1; an odd last rank sits out) exchange `sizes` messages of random
/// values, all in flight at once, completed out of order (receives from the
/// last, sends after), then a second round through the same (now freed)
/// staging; each receive bit for bit what the peer sent, in order, and the
/// counters those of the messages. The inputs are uploaded behind a delay
/// and read back on the compute stream, as check_in_flight does.
template <class T>
void check_point_to_point(Communicator& dev, const TrafficCounter& counter,
                          const std::vector<std::size_t>& sizes, std::uint64_t seed) {
  const int rank = dev.rank(), peer = rank ^ 1;
  if (peer >= dev.size()) return;  // no partner (one rank, or an odd last one)
  std::size_t total = 0;
  for (const std::size_t n : sizes) total += n;
  const std::size_t bytes = total * sizeof(T);
  const auto values = [&](int from, int round) {
    std::mt19937_64 gen(
        mix(seed + static_cast<std::uint64_t>(from) * 7919 + static_cast<std::uint64_t>(round)));
    return random_values<T>(total, gen);
  };
  cudaStream_t s = gpu().stream;
  DeviceBuffer din(bytes), dout(bytes);
  PinnedBuffer host(bytes);
  for (int round = 0; round < 2; ++round) {
    const std::vector<T> mine = values(rank, round), theirs = values(peer, round);
    std::copy(mine.begin(), mine.end(), host.as<T>());
    delayed_upload(s, {{din.as<T>(), host.as<T>()}}, {bytes});
    cuda_check(cudaMemsetAsync(dout.as<T>(), 0xff, bytes, s), "cudaMemsetAsync");  // NaN
    const TrafficCounter before = counter;
    std::vector<Request> sent, got;
    std::size_t at = 0;
    for (const std::size_t n : sizes) {  // the lower rank receives first
      if (rank < peer) got.push_back(dev.irecv(dout.as<T>() + at, n, dtype_v<T>, peer));
      sent.push_back(dev.isend(din.as<T>() + at, n, dtype_v<T>, peer));
      if (rank > peer) got.push_back(dev.irecv(dout.as<T>() + at, n, dtype_v<T>, peer));
      at += n;
    }
    for (std::size_t i = got.size(); i-- > 0;) {
      dev.wait(got[i]);
      EXPECT_FALSE(got[i].active());
    }
    for (Request& q : sent) dev.wait(q);
    cuda_check(cudaMemcpyAsync(host.as<T>(), dout.as<T>(), bytes, cudaMemcpyDeviceToHost, s),
               "cudaMemcpyAsync");
    cuda_check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    const long first = first_difference(host.as<T>(), theirs.data(), total);
    EXPECT_EQ(first, -1) << "round " << round << ": element " << first << " of " << total;
    EXPECT_EQ(counter.bytes_sent - before.bytes_sent, bytes) << "round " << round;
    EXPECT_EQ(counter.bytes_received - before.bytes_received, bytes) << "round " << round;
    EXPECT_EQ(counter.calls - before.calls, 2 * sizes.size()) << "round " << round;
  }
}

/// Shape of a grid with every axis non-trivial where the rank count allows.
GridShape grid_shape_for(int size) {
  switch (size) {
    case 1:
      return {1, 1, 1, 1};
    case 2:
      return {2, 1, 1, 1};
    case 4:
      return {1, 1, 2, 2};
    case 8:
      return {2, 1, 2, 2};
    default:
      return {1, 1, 1, size};
  }
}

/// A grid with `backend` against an MPI grid of the same shape: an
/// all-reduce and an all-gather on every axis, results and per-axis traffic.
void check_grid(CommBackend backend) {
  const GridShape shape = grid_shape_for(world_size());
  GridOptions options;
  options.comm = backend;
  options.compute_stream = gpu().stream;
  options.staging_bytes = std::size_t{1} << 20;
  ProcessGrid dev(MPI_COMM_WORLD, shape, options);
  ProcessGrid ref(MPI_COMM_WORLD, shape);
  EXPECT_EQ(dev.comm_backend(), backend);
  EXPECT_EQ(dev.coords().row, ref.coords().row);
  EXPECT_EQ(dev.coords().col, ref.coords().col);
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(mix(seed + static_cast<std::uint64_t>(world_rank())));
  const std::size_t n = 77;
  const std::size_t most = static_cast<std::size_t>(world_size()) * n * sizeof(double);
  DeviceBuffer din(most), dout(most);
  PinnedBuffer host(most);
  cudaStream_t s = gpu().stream;
  for (CommAxis axis : {CommAxis::world, CommAxis::data, CommAxis::depth, CommAxis::mesh_row,
                        CommAxis::mesh_col, CommAxis::mesh, CommAxis::tensor}) {
    const std::string what = std::string(summa::name_of(axis));
    const std::size_t g = static_cast<std::size_t>(dev.comm(axis).size());
    const std::vector<double> in = random_values<double>(n, gen);
    std::vector<double> sum(n), gathered(g * n);
    ref.comm(axis).all_reduce(in.data(), sum.data(), n);
    ref.comm(axis).all_gather(in.data(), gathered.data(), n);

    std::copy(in.begin(), in.end(), host.as<double>());
    delayed_upload(s, {{din.as<double>(), host.as<double>()}}, {n * sizeof(double)});
    dev.comm(axis).all_reduce(din.as<double>(), dout.as<double>(), n);
    cuda_check(cudaMemcpyAsync(host.as<double>(), dout.as<double>(), n * sizeof(double),
                               cudaMemcpyDeviceToHost, s),
               "cudaMemcpyAsync");
    cuda_check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    EXPECT_EQ(first_difference(host.as<double>(), sum.data(), n), -1) << what << " all_reduce";

    dev.comm(axis).all_gather(din.as<double>(), dout.as<double>(), n);
    cuda_check(cudaMemcpyAsync(host.as<double>(), dout.as<double>(), g * n * sizeof(double),
                               cudaMemcpyDeviceToHost, s),
               "cudaMemcpyAsync");
    cuda_check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    EXPECT_EQ(first_difference(host.as<double>(), gathered.data(), g * n), -1)
        << what << " all_gather";
    EXPECT_EQ(dev.traffic()[axis], ref.traffic()[axis]) << what;
  }
  dev.world().barrier();
  // agree() keeps working on the MPI groups underneath.
  const std::string message = error_of([&] {
    dev.agree(CommAxis::world, world_rank() == world_size() - 1
                                   ? std::optional<std::string>("last rank objects")
                                   : std::nullopt);
  });
  EXPECT_EQ(message, "last rank objects");
}

#endif  // SUMMA_HAVE_CUDA

// ------------------------------------------------------------------ Staged

TEST(Staged, EveryCollectiveMatchesMpi) {
  SKIP_WITHOUT_GPU();
#if SUMMA_HAVE_CUDA
  check_every_collective([](MPI_Comm c, TrafficCounter* counter) {
    return std::make_unique<summa::StagedCommunicator>(c, true, CommAxis::other, counter,
                                                       gpu().stream, std::size_t{1} << 16);
  });
#endif
}

// Host buffers work too (copied through the staging buffer).
TEST(Staged, HostBuffersMatchMpi) {
  SKIP_WITHOUT_GPU();
#if SUMMA_HAVE_CUDA
  check_every_collective(
      [](MPI_Comm c, TrafficCounter* counter) {
        return std::make_unique<summa::StagedCommunicator>(c, true, CommAxis::other, counter,
                                                           gpu().stream, std::size_t{1} << 16);
      },
      Memory::host);
#endif
}

TEST(Staged, RequestsInFlightOutOfOrder) {
  SKIP_WITHOUT_GPU();
#if SUMMA_HAVE_CUDA
  TrafficCounter dev_counter, ref_counter;
  summa::StagedCommunicator dev(dup_world(), true, CommAxis::other, &dev_counter, gpu().stream);
  MpiCommunicator ref(dup_world(), true, CommAxis::other, &ref_counter);
  check_in_flight<float>(dev, ref, 6, fresh_seed());
  check_in_flight<double>(dev, ref, 5, fresh_seed());
  EXPECT_EQ(dev.in_flight(), 0);
  EXPECT_EQ(dev_counter, ref_counter);
#endif
}

// The staged pipe's point to point (PipelineGpt's stage messages, on
// the GPU only through pipeline_cuda_np4 before): messages in flight
// together in a staging buffer they nearly fill, completed out of order,
// then the freed ranges taken again first fit.
TEST(Staged, PointToPointInFlightOutOfOrder) {
  SKIP_WITHOUT_GPU();
#if SUMMA_HAVE_CUDA
  TrafficCounter counter;
  const std::vector<std::size_t> sizes = {1000, 3000, 17, 4096, 2500};  // 10613 elements
  summa::StagedCommunicator dev(
      dup_world(), true, CommAxis::other, &counter, gpu().stream,
      std::size_t{1} << 18);  // 256 KiB: both ways in double (166 KiB) fit
  check_point_to_point<float>(dev, counter, sizes, fresh_seed());
  check_point_to_point<double>(dev, counter, sizes, fresh_seed());
  EXPECT_EQ(dev.in_flight(), 0);
#endif
}

TEST(Staged, StagingBufferTooSmallThrowsEverywhere) {
  SKIP_WITHOUT_GPU();
#if SUMMA_HAVE_CUDA
  TrafficCounter counter;
  summa::StagedCommunicator dev(dup_world(), true, CommAxis::mesh_row, &counter, gpu().stream,
                                1024);
  EXPECT_EQ(dev.staging_bytes(), 1024u);
  DeviceBuffer buf(8192);
  const std::string big = error_of(
      [&] { dev.all_reduce(buf.as<double>(), buf.as<double>(), 512, DType::f64, ReduceOp::sum); });
  EXPECT_TRUE(contains(big,
                       "StagedCommunicator on axis mesh_row: all_reduce needs 4096 staging "
                       "bytes but 1024 of the 1024-byte pinned buffer are free"))
      << big;
  EXPECT_TRUE(same_on_all_ranks(big)) << big;
  // Two requests of 600 bytes: the second does not fit beside the first.
  Request first = dev.iall_reduce(buf.as<float>(), buf.as<float>(), 150, DType::f32, ReduceOp::max);
  const std::string second = error_of([&] {
    dev.iall_reduce(buf.as<float>() + 512, buf.as<float>() + 512, 150, DType::f32, ReduceOp::max);
  });
  EXPECT_TRUE(contains(second,
                       "needs 600 staging bytes but 256 of the 1024-byte pinned buffer "
                       "are free (1 requests in flight)"))
      << second;
  EXPECT_TRUE(same_on_all_ranks(second)) << second;
  EXPECT_EQ(dev.in_flight(), 1);
  const std::string busy = error_of([&] { dev.reserve(1 << 16); });
  EXPECT_TRUE(contains(busy, "reserve(65536) with 1 requests in flight")) << busy;
  dev.wait(first);
  EXPECT_EQ(dev.in_flight(), 0);
  dev.reserve(1 << 16);
  EXPECT_EQ(dev.staging_bytes(), std::size_t{1} << 16);
  TrafficCounter ref_counter;
  MpiCommunicator ref(dup_world(), true, CommAxis::other, &ref_counter);
  check_in_flight<double>(dev, ref, 3, fresh_seed());
  cuda_check(cudaStreamSynchronize(gpu().stream), "cudaStreamSynchronize");
#endif
}

// The step-time model's device sharing (summa::ranks_per_device, the
// predictions of compare_schemes and `--scheme auto`): a CudaBackend's ranks
// on this node with the same GPU (its UUID), the most on any GPU; on one
// GPU every rank of the node.
TEST(Staged, RanksPerDeviceCountsTheRanksOnEachGpu) {
  SKIP_WITHOUT_GPU();
#if SUMMA_HAVE_CUDA
  summa::CudaBackend backend({.device = gpu().device});
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank(), MPI_INFO_NULL, &node);
  int local = 0;
  MPI_Comm_size(node, &local);
  std::vector<int> devices(static_cast<std::size_t>(local));
  MPI_Allgather(&gpu().device, 1, MPI_INT, devices.data(), 1, MPI_INT, node);
  MPI_Comm_free(&node);
  int want = static_cast<int>(std::count(devices.begin(), devices.end(), gpu().device));
  MPI_Allreduce(MPI_IN_PLACE, &want, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(summa::ranks_per_device(MPI_COMM_WORLD, backend), want);
  if (visible_devices() == 1) {
    EXPECT_EQ(want, ranks_per_node());
  }
#endif
}

TEST(Staged, GridAxesMatchMpi) {
  SKIP_WITHOUT_GPU();
#if SUMMA_HAVE_CUDA
  check_grid(CommBackend::mpi_staged);
#endif
}

// ------------------------------------------------------------------ Nccl

#define SKIP_WITHOUT_GPU_PER_RANK()        \
  do {                                     \
    SKIP_WITHOUT_GPU();                    \
    if (auto why_ = shared_gpu_reason()) { \
      note(*why_);                         \
      GTEST_SKIP() << *why_;               \
    }                                      \
  } while (0)

TEST(Nccl, EveryCollectiveMatchesMpi) {
#if SUMMA_HAVE_CUDA
  SKIP_WITHOUT_GPU_PER_RANK();
  check_every_collective([](MPI_Comm c, TrafficCounter* counter) {
    auto made =
        std::make_unique<summa::NcclCommunicator>(c, true, CommAxis::other, counter, gpu().stream);
    EXPECT_EQ(made->device(), gpu().device);
    EXPECT_EQ(made->compute_stream(), static_cast<void*>(gpu().stream));
    EXPECT_NE(made->comm_stream(), made->compute_stream());
    return made;
  });
#else
  SKIP_WITHOUT_GPU();
#endif
}

// Host buffers (a loss, a gradient norm) take MPI on the same group; one
// call cannot mix host and device buffers.
TEST(Nccl, HostBuffersTakeMpi) {
#if SUMMA_HAVE_CUDA
  SKIP_WITHOUT_GPU_PER_RANK();
  check_every_collective(
      [](MPI_Comm c, TrafficCounter* counter) {
        return std::make_unique<summa::NcclCommunicator>(c, true, CommAxis::other, counter,
                                                         gpu().stream);
      },
      Memory::host);
  TrafficCounter counter;
  summa::NcclCommunicator dev(dup_world(), true, CommAxis::tensor, &counter, gpu().stream);
  DeviceBuffer device(64 * sizeof(double));
  std::vector<double> host(64, 1.0);
  const std::string mixed = error_of(
      [&] { dev.all_reduce(device.as<double>(), host.data(), 64, DType::f64, ReduceOp::sum); });
  EXPECT_TRUE(contains(mixed,
                       "NcclCommunicator on axis tensor: one call mixes host and device "
                       "buffers (send device, recv host)"))
      << mixed;
  EXPECT_TRUE(same_on_all_ranks(mixed)) << mixed;
  EXPECT_EQ(dev.in_flight(), 0);
#else
  SKIP_WITHOUT_GPU();
#endif
}

TEST(Nccl, RequestsInFlightAndEventPool) {
#if SUMMA_HAVE_CUDA
  SKIP_WITHOUT_GPU_PER_RANK();
  TrafficCounter dev_counter, ref_counter;
  {
    summa::NcclCommunicator dev(dup_world(), true, CommAxis::other, &dev_counter, gpu().stream, 4);
    MpiCommunicator ref(dup_world(), true, CommAxis::other, &ref_counter);
    EXPECT_EQ(dev.event_pool(), 4);
    check_in_flight<float>(dev, ref, 4, fresh_seed());
    check_in_flight<double>(dev, ref, 3, fresh_seed());
    EXPECT_EQ(dev.in_flight(), 0);

    // A fifth request while four are in flight: the same error everywhere,
    // nothing issued, and the four complete normally.
    DeviceBuffer buf(5 * 64 * sizeof(float));
    std::vector<Request> held;
    for (int i = 0; i < 4; ++i)
      held.push_back(dev.iall_reduce(buf.as<float>() + i * 64, buf.as<float>() + i * 64, 64,
                                     DType::f32, ReduceOp::sum));
    const std::string full = error_of([&] {
      dev.iall_reduce(buf.as<float>() + 256, buf.as<float>() + 256, 64, DType::f32, ReduceOp::sum);
    });
    EXPECT_TRUE(contains(full,
                         "NcclCommunicator on axis other: all 4 pooled events are held by "
                         "requests in flight"))
        << full;
    EXPECT_TRUE(same_on_all_ranks(full)) << full;
    EXPECT_EQ(dev.in_flight(), 4);
    for (Request& q : held) dev.wait(q);
    EXPECT_EQ(dev.in_flight(), 0);
    dev.barrier();
  }
  // The refused call was counted by the Communicator base before start();
  // everything else matches MPI call for call.
  TrafficCounter expected = ref_counter;
  EXPECT_EQ(dev_counter.calls, expected.calls + 5);
#else
  SKIP_WITHOUT_GPU();
#endif
}

TEST(Nccl, GridAxesMatchMpi) {
#if SUMMA_HAVE_CUDA
  SKIP_WITHOUT_GPU_PER_RANK();
  check_grid(CommBackend::nccl);
#else
  SKIP_WITHOUT_GPU();
#endif
}

// Ranks that share a GPU: NCCL's communicator refuses them with a message
// that points at the staged communicator; the grid option likewise.
TEST(NcclShared, SharedGpuRefusedEverywhere) {
  SKIP_WITHOUT_GPU();
#if SUMMA_HAVE_CUDA
  if (!shared_gpu_reason()) {
    note("one CUDA device per rank: skipped");
    GTEST_SKIP() << "every rank has its own GPU";
  }
  gpu();
  TrafficCounter counter;
  const std::string direct = error_of([&] {
    summa::NcclCommunicator c(dup_world(), true, CommAxis::world, &counter, gpu().stream);
  });
  EXPECT_TRUE(contains(direct, "NCCL needs one GPU per rank")) << direct;
  EXPECT_TRUE(contains(direct, "StagedCommunicator")) << direct;
  EXPECT_TRUE(same_on_all_ranks(direct)) << direct;
  GridOptions options;
  options.comm = CommBackend::nccl;
  options.compute_stream = gpu().stream;
  const std::string grid =
      error_of([&] { ProcessGrid g = ProcessGrid::linear1d(MPI_COMM_WORLD, 0, 1, options); });
  EXPECT_TRUE(contains(grid, "NCCL needs one GPU per rank")) << grid;
  EXPECT_TRUE(same_on_all_ranks(grid)) << grid;
  EXPECT_EQ(counter, TrafficCounter{});
#endif
}

}  // namespace

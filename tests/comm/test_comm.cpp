// Tests of the Communicator seam on MPI: every collective (blocking and
// non-blocking, float and double, sum/max/min, every root, in place or not)
// on every axis communicator of process grids that fit the world size, the
// exact byte counters of counters.hpp, requests in flight together, and bad
// input rejected identically on every rank.
//
// Inputs are random multiples of 1/8 in [-512, 512]: sums of up to a few
// thousand of them are exact in float, so results are compared exactly and do
// not depend on the reduction order. Member m of a group in call k uses data
// seeded from (test seed, k, group, m), so every rank regenerates every other
// member's input and computes the expected result locally. Every rank enters
// every collective (EXPECT_*, never ASSERT_*).
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "../../src/comm/staging_fit.hpp"
#include "summa/backend/cpu_backend.hpp"
#include "summa/comm/communicator.hpp"
#include "summa/comm/counters.hpp"
#include "summa/comm/mpi_communicator.hpp"
#include "summa/comm/mpi_init.hpp"
#include "summa/comm/watchdog.hpp"
#include "summa/core/error.hpp"
#include "summa/core/types.hpp"
#include "summa/grid/process_grid.hpp"
#include "summa/parallel/memory_check.hpp"
#include "test_util.hpp"

namespace summa {
void PrintTo(const TrafficCounter& t, std::ostream* os) {
  *os << "{sent=" << t.bytes_sent << ", received=" << t.bytes_received << ", calls=" << t.calls
      << "}";
}
void PrintTo(const GridShape& s, std::ostream* os) {
  *os << "{data=" << s.data << ", depth=" << s.depth << ", rows=" << s.rows << ", cols=" << s.cols
      << "}";
}
}  // namespace summa

namespace {

using summa::test::mix;
using summa::test::same_on_all_ranks;
using summa::test::seed_note;
using summa::test::test_seed;

using summa::CommAxis;
using summa::Communicator;
using summa::DType;
using summa::dtype_v;
using summa::GridShape;
using summa::MpiCommunicator;
using summa::ProcessGrid;
using summa::ReduceOp;
using summa::Request;
using summa::TrafficCounter;
using summa::TrafficCounters;

constexpr std::array<CommAxis, 7> kGridAxes{CommAxis::world,    CommAxis::data,     CommAxis::depth,
                                            CommAxis::mesh_row, CommAxis::mesh_col, CommAxis::mesh,
                                            CommAxis::tensor};
constexpr std::array<CommAxis, 8> kAllAxes{CommAxis::world,    CommAxis::data,     CommAxis::depth,
                                           CommAxis::mesh_row, CommAxis::mesh_col, CommAxis::mesh,
                                           CommAxis::tensor,   CommAxis::other};
constexpr std::array<ReduceOp, 3> kOps{ReduceOp::sum, ReduceOp::max, ReduceOp::min};

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

bool all_ranks(bool local, MPI_Comm comm = MPI_COMM_WORLD) {
  int v = local ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_MIN, comm);
  return v == 1;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

/// Runs `f`; expects summa::Error on every rank of MPI_COMM_WORLD with one
/// and the same message, which it returns. Collective (after `f`).
template <class F>
std::string expect_error_everywhere(F&& f) {
  std::string message;
  int outcome = 0;  // 0 no throw, 1 summa::Error, 2 another exception
  try {
    f();
  } catch (const summa::Error& e) {
    message = e.what();
    outcome = 1;
  } catch (const std::exception& e) {
    message = e.what();
    outcome = 2;
  }
  EXPECT_EQ(outcome, 1) << (outcome == 0 ? "nothing thrown" : "not a summa::Error: " + message);
  EXPECT_TRUE(all_ranks(outcome == 1)) << "some rank did not throw summa::Error";
  EXPECT_TRUE(same_on_all_ranks(message)) << "message differs between ranks: " << message;
  return message;
}

const char* name_of(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::max:
      return "max";
    case ReduceOp::min:
      return "min";
  }
  return "?";
}

template <class T>
T apply(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::sum:
      return a + b;
    case ReduceOp::max:
      return std::max(a, b);
    case ReduceOp::min:
      return std::min(a, b);
  }
  return a;
}

// ---------------------------------------------------------------- closed forms

enum class Kind { broadcast, reduce, all_reduce, all_gather, reduce_scatter };

const char* name_of(Kind k) {
  switch (k) {
    case Kind::broadcast:
      return "broadcast";
    case Kind::reduce:
      return "reduce";
    case Kind::all_reduce:
      return "all_reduce";
    case Kind::all_gather:
      return "all_gather";
    case Kind::reduce_scatter:
      return "reduce_scatter";
  }
  return "?";
}

/// The traffic of one call at group rank r of g ranks, as counters.hpp
/// documents it (direct-exchange model). `count` is the argument of the call
/// (elements per rank for all-gather and reduce-scatter), `elem` its size.
TrafficCounter closed_form(Kind kind, int g_, int r_, std::size_t count, std::size_t elem,
                           int root) {
  TrafficCounter t;
  t.calls = 1;
  if (g_ <= 1) return t;
  const auto g = static_cast<std::uint64_t>(g_);
  const auto r = static_cast<std::uint64_t>(r_);
  const auto n = static_cast<std::uint64_t>(count);
  const auto e = static_cast<std::uint64_t>(elem);
  switch (kind) {
    case Kind::broadcast:
      if (r_ == root)
        t.bytes_sent = (g - 1) * n * e;
      else
        t.bytes_received = n * e;
      break;
    case Kind::reduce:
      if (r_ == root)
        t.bytes_received = (g - 1) * n * e;
      else
        t.bytes_sent = n * e;
      break;
    case Kind::all_gather:
    case Kind::reduce_scatter:
      t.bytes_sent = t.bytes_received = (g - 1) * n * e;
      break;
    case Kind::all_reduce: {
      const std::uint64_t c = n / g + (r < n % g ? 1 : 0);
      t.bytes_sent = t.bytes_received = ((n - c) + (g - 1) * c) * e;
      break;
    }
  }
  return t;
}

// ---------------------------------------------------------------- the battery

enum class Mode { blocking, wait, test };
constexpr std::array<Mode, 3> kModes{Mode::blocking, Mode::wait, Mode::test};

const char* name_of(Mode m) {
  switch (m) {
    case Mode::blocking:
      return "blocking";
    case Mode::wait:
      return "non-blocking+wait";
    case Mode::test:
      return "non-blocking+test";
  }
  return "?";
}

enum class Place { out_of_place, in_place, null_recv_off_root };

const char* name_of(Place p) {
  switch (p) {
    case Place::out_of_place:
      return "out-of-place";
    case Place::in_place:
      return "in-place";
    case Place::null_recv_off_root:
      return "null recv off root";
  }
  return "?";
}

/// One prepared collective: its buffers, how to issue it (blocking or not),
/// the traffic it must add, and the checks of its results.
struct Prepared {
  std::string what;
  TrafficCounter delta;
  std::function<void()> blocking;
  std::function<Request()> start;
  std::function<void()> check;
};

template <class T>
struct Buffers {
  std::vector<T> a, b, mine, garbage, want;
};

template <class T>
void expect_equal(const T* got, const std::vector<T>& want, std::size_t n,
                  const std::string& what) {
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < n; ++i)
    if (!(got[i] == want[i])) {
      if (bad++ == 0) first = i;
    }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << n << " elements wrong, first at " << first
                     << ": got " << (bad ? got[first] : T{}) << ", want "
                     << (bad ? want[first] : T{});
}

/// Runs collectives on one communicator against locally computed results and
/// the closed-form counters. `traffic` (the grid's counters, or null) is
/// checked too: the communicator's axis holds what was counted, every other
/// axis stays zero.
class Battery {
 public:
  Battery(Communicator& c, std::uint64_t seed, std::uint64_t group_key,
          const TrafficCounters* traffic)
      : c_(c), seed_(seed), key_(group_key), traffic_(traffic), expected_(c.counter()) {}

  Communicator& comm() { return c_; }
  int size() const { return c_.size(); }
  int rank() const { return c_.rank(); }

  /// Input of `member` (or garbage, for members >= 1000) in the current call.
  template <class T>
  std::vector<T> input(int member, std::size_t n) const {
    const std::uint64_t s =
        mix(mix(mix(seed_ ^ mix(call_)) ^ key_) ^ static_cast<std::uint64_t>(member + 1));
    std::seed_seq seq{static_cast<std::uint32_t>(s), static_cast<std::uint32_t>(s >> 32)};
    std::mt19937 gen(seq);
    std::uniform_int_distribution<int> d(-4096, 4096);
    std::vector<T> v(n);
    for (auto& x : v) x = static_cast<T>(d(gen)) / T(8);
    return v;
  }

  template <class T>
  std::vector<T> reduced(ReduceOp op, std::size_t n, std::size_t offset, std::size_t total) const {
    std::vector<T> want;
    for (int m = 0; m < size(); ++m) {
      const std::vector<T> in = input<T>(m, total);
      if (m == 0)
        want.assign(in.begin() + static_cast<std::ptrdiff_t>(offset),
                    in.begin() + static_cast<std::ptrdiff_t>(offset + n));
      else
        for (std::size_t i = 0; i < n; ++i) want[i] = apply(op, want[i], in[offset + i]);
    }
    return want;
  }

  std::string label(Kind k, DType t, std::size_t count) const {
    return std::string(summa::name_of(c_.axis())) + " (g=" + std::to_string(size()) +
           ", r=" + std::to_string(rank()) + ") " + name_of(k) + " " +
           std::string(summa::name_of(t)) + " count=" + std::to_string(count);
  }

  template <class T>
  Prepared broadcast(std::size_t count, int root) {
    ++call_;
    auto st = std::make_shared<Buffers<T>>();
    st->want = input<T>(root, count);
    st->a = rank() == root ? st->want : input<T>(1000 + rank(), count);
    Communicator* c = &c_;
    Prepared p;
    p.what = label(Kind::broadcast, dtype_v<T>, count) + " root=" + std::to_string(root);
    p.delta = closed_form(Kind::broadcast, size(), rank(), count, sizeof(T), root);
    p.blocking = [=] { c->broadcast(st->a.data(), count, dtype_v<T>, root); };
    p.start = [=] { return c->ibroadcast(st->a.data(), count, dtype_v<T>, root); };
    p.check = [=, what = p.what] { expect_equal(st->a.data(), st->want, count, what); };
    return p;
  }

  template <class T>
  Prepared reduce(std::size_t count, int root, ReduceOp op, Place place) {
    ++call_;
    auto st = std::make_shared<Buffers<T>>();
    const bool is_root = rank() == root;
    st->mine = input<T>(rank(), count);
    st->garbage = input<T>(1000 + rank(), count);
    if (is_root) st->want = reduced<T>(op, count, 0, count);
    st->a = st->mine;
    st->b = st->garbage;
    const T* send = st->a.data();
    T* recv = place == Place::in_place ? st->a.data() : st->b.data();
    if (place == Place::null_recv_off_root && !is_root) recv = nullptr;
    Communicator* c = &c_;
    Prepared p;
    p.what = label(Kind::reduce, dtype_v<T>, count) + " root=" + std::to_string(root) + " " +
             name_of(op) + " " + name_of(place);
    p.delta = closed_form(Kind::reduce, size(), rank(), count, sizeof(T), root);
    p.blocking = [=] { c->reduce(send, recv, count, dtype_v<T>, op, root); };
    p.start = [=] { return c->ireduce(send, recv, count, dtype_v<T>, op, root); };
    p.check = [=, what = p.what] {
      if (is_root) {
        expect_equal(place == Place::in_place ? st->a.data() : st->b.data(), st->want, count,
                     what + " result");
        if (place != Place::in_place) expect_equal(st->a.data(), st->mine, count, what + " send");
      } else {
        // Off the root nothing is written: the send buffer (in place or
        // not) and an unused receive buffer keep their contents.
        expect_equal(st->a.data(), st->mine, count, what + " send off root");
        expect_equal(st->b.data(), st->garbage, count, what + " recv off root");
      }
    };
    return p;
  }

  template <class T>
  Prepared all_reduce(std::size_t count, ReduceOp op, Place place) {
    ++call_;
    auto st = std::make_shared<Buffers<T>>();
    st->mine = input<T>(rank(), count);
    st->want = reduced<T>(op, count, 0, count);
    st->a = st->mine;
    st->b = input<T>(1000 + rank(), count);
    const T* send = st->a.data();
    T* recv = place == Place::in_place ? st->a.data() : st->b.data();
    Communicator* c = &c_;
    Prepared p;
    p.what = label(Kind::all_reduce, dtype_v<T>, count) + " " + name_of(op) + " " + name_of(place);
    p.delta = closed_form(Kind::all_reduce, size(), rank(), count, sizeof(T), 0);
    p.blocking = [=] { c->all_reduce(send, recv, count, dtype_v<T>, op); };
    p.start = [=] { return c->iall_reduce(send, recv, count, dtype_v<T>, op); };
    p.check = [=, what = p.what] {
      expect_equal(recv, st->want, count, what + " result");
      if (place != Place::in_place) expect_equal(st->a.data(), st->mine, count, what + " send");
    };
    return p;
  }

  template <class T>
  Prepared all_gather(std::size_t count, Place place) {
    ++call_;
    auto st = std::make_shared<Buffers<T>>();
    const std::size_t g = static_cast<std::size_t>(size());
    const std::size_t off = static_cast<std::size_t>(rank()) * count;
    st->mine = input<T>(rank(), count);
    for (int m = 0; m < size(); ++m) {
      const std::vector<T> in = input<T>(m, count);
      st->want.insert(st->want.end(), in.begin(), in.end());
    }
    st->b = input<T>(1000 + rank(), g * count);
    const T* send = nullptr;
    if (place == Place::in_place) {
      std::copy(st->mine.begin(), st->mine.end(), st->b.begin() + static_cast<std::ptrdiff_t>(off));
      send = st->b.data() + off;
    } else {
      st->a = st->mine;
      send = st->a.data();
    }
    T* recv = st->b.data();
    Communicator* c = &c_;
    Prepared p;
    p.what = label(Kind::all_gather, dtype_v<T>, count) + " " + name_of(place);
    p.delta = closed_form(Kind::all_gather, size(), rank(), count, sizeof(T), 0);
    p.blocking = [=] { c->all_gather(send, recv, count, dtype_v<T>); };
    p.start = [=] { return c->iall_gather(send, recv, count, dtype_v<T>); };
    p.check = [=, what = p.what] {
      expect_equal(st->b.data(), st->want, g * count, what + " result");
      if (place != Place::in_place) expect_equal(st->a.data(), st->mine, count, what + " send");
    };
    return p;
  }

  template <class T>
  Prepared reduce_scatter(std::size_t count, ReduceOp op, Place place) {
    ++call_;
    auto st = std::make_shared<Buffers<T>>();
    const std::size_t g = static_cast<std::size_t>(size());
    const std::size_t off = static_cast<std::size_t>(rank()) * count;
    st->mine = input<T>(rank(), g * count);
    st->want = reduced<T>(op, count, off, g * count);
    st->a = st->mine;
    st->b = input<T>(1000 + rank(), count);
    const T* send = st->a.data();
    T* recv = place == Place::in_place ? st->a.data() : st->b.data();
    Communicator* c = &c_;
    Prepared p;
    p.what =
        label(Kind::reduce_scatter, dtype_v<T>, count) + " " + name_of(op) + " " + name_of(place);
    p.delta = closed_form(Kind::reduce_scatter, size(), rank(), count, sizeof(T), 0);
    p.blocking = [=] { c->reduce_scatter(send, recv, count, dtype_v<T>, op); };
    p.start = [=] { return c->ireduce_scatter(send, recv, count, dtype_v<T>, op); };
    p.check = [=, what = p.what] {
      expect_equal(recv, st->want, count, what + " result");
      if (place != Place::in_place) expect_equal(st->a.data(), st->mine, g * count, what + " send");
    };
    return p;
  }

  /// Adds `delta` to what this communicator must have counted and checks it.
  void counted(const TrafficCounter& delta, const std::string& what) {
    expected_ += delta;
    EXPECT_EQ(c_.counter(), expected_) << what;
    if (!traffic_) return;
    for (CommAxis a : kAllAxes)
      EXPECT_EQ((*traffic_)[a], a == c_.axis() ? expected_ : TrafficCounter{})
          << what << ": counter of axis " << summa::name_of(a);
  }

  /// Completes `r` by wait() or by polling test(); inactive afterwards.
  void complete(Request& r, Mode m) {
    EXPECT_TRUE(r.active());
    if (m == Mode::wait) {
      c_.wait(r);
    } else {
      // Poll; a test() that never reports completion fails instead of hanging.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      bool done = false;
      while (!(done = c_.test(r)) && std::chrono::steady_clock::now() < deadline) {
      }
      if (!done) {
        ADD_FAILURE() << "test() did not report completion within 60 s";
        c_.wait(r);
      }
    }
    EXPECT_FALSE(r.active());
    EXPECT_TRUE(c_.test(r));  // an inactive request is complete
    c_.wait(r);               // and waiting on it is a no-op
    EXPECT_FALSE(r.active());
  }

  void run(const Prepared& p, Mode m) {
    SCOPED_TRACE(p.what + " " + name_of(m));
    if (m == Mode::blocking) {
      p.blocking();
      counted(p.delta, p.what);
    } else {
      Request r = p.start();
      counted(p.delta, p.what + " (counted at issue)");
      complete(r, m);
    }
    p.check();
  }

  const TrafficCounter& expected() const { return expected_; }

 private:
  Communicator& c_;
  std::uint64_t seed_;
  std::uint64_t key_;
  const TrafficCounters* traffic_;
  TrafficCounter expected_;
  std::uint64_t call_ = 0;
};

/// Every collective of the interface, for element type T, on `b`'s
/// communicator. `shared` draws the same counts on every rank.
template <class T>
void run_all_collectives(Battery& b, std::mt19937& shared) {
  const int g = b.size();
  std::uniform_int_distribution<int> pick(2, 40);
  auto draw = [&] { return static_cast<std::size_t>(pick(shared)); };
  const std::size_t uneven = 3 * static_cast<std::size_t>(g) + 1;  // not divisible when g > 1
  int turn = 0;
  auto next_mode = [&] { return kModes[static_cast<std::size_t>(turn++ % 3)]; };

  for (int root = 0; root < g; ++root)
    for (Mode m : kModes) b.run(b.broadcast<T>(draw(), root), m);
  b.run(b.broadcast<T>(0, g - 1), next_mode());

  for (int root = 0; root < g; ++root)
    for (ReduceOp op : kOps)
      for (Place pl : {Place::out_of_place, Place::in_place, Place::null_recv_off_root})
        b.run(b.reduce<T>(draw(), root, op, pl), next_mode());
  b.run(b.reduce<T>(0, 0, ReduceOp::sum, Place::out_of_place), next_mode());

  for (std::size_t count : {std::size_t{1}, uneven, draw(), std::size_t{0}})
    for (ReduceOp op : kOps)
      for (Place pl : {Place::out_of_place, Place::in_place})
        for (Mode m : kModes) b.run(b.all_reduce<T>(count, op, pl), m);

  for (std::size_t count : {std::size_t{1}, draw()})
    for (Place pl : {Place::out_of_place, Place::in_place})
      for (Mode m : kModes) b.run(b.all_gather<T>(count, pl), m);

  for (std::size_t count : {std::size_t{1}, draw()})
    for (ReduceOp op : kOps)
      for (Place pl : {Place::out_of_place, Place::in_place})
        for (Mode m : kModes) b.run(b.reduce_scatter<T>(count, op, pl), m);
}

/// Lowest world rank in the axis group: the same on all members, different
/// between groups. Uncounted MPI control traffic.
std::uint64_t group_key(const ProcessGrid& g, CommAxis axis) {
  int key = g.rank();
  MPI_Allreduce(MPI_IN_PLACE, &key, 1, MPI_INT, MPI_MIN, g.native(axis));
  return static_cast<std::uint64_t>(key);
}

/// The factorisation of the world size with the most non-trivial axes.
GridShape multi_axis_shape(int n) {
  GridShape best{1, 1, 1, n};
  auto nontrivial = [](const GridShape& s) {
    return (s.data > 1) + (s.depth > 1) + (s.rows > 1) + (s.cols > 1);
  };
  for (int a = 1; a <= n; ++a)
    for (int b = 1; a * b <= n; ++b)
      for (int r = 1; a * b * r <= n; ++r) {
        if (n % (a * b * r)) continue;
        const GridShape s{a, b, r, n / (a * b * r)};
        if (nontrivial(s) > nontrivial(best)) best = s;
      }
  return best;
}

int smallest_prime_factor(int n) {
  for (int p = 2; p * p <= n; ++p)
    if (n % p == 0) return p;
  return n;
}

void run_every_axis(ProcessGrid& grid, std::uint64_t seed) {
  std::mt19937 shared(static_cast<std::uint32_t>(seed));
  for (CommAxis axis : kGridAxes) {
    SCOPED_TRACE(testing::Message() << "axis " << summa::name_of(axis));
    grid.reset_traffic();
    EXPECT_EQ(grid.traffic().total(), TrafficCounter{});
    Battery b(grid.comm(axis), seed ^ static_cast<std::uint64_t>(axis), group_key(grid, axis),
              &grid.traffic());
    run_all_collectives<float>(b, shared);
    run_all_collectives<double>(b, shared);
    EXPECT_EQ(grid.traffic().total(), b.expected());
    EXPECT_GT(b.expected().calls, 0u);
    if (b.size() > 1) {
      EXPECT_GT(b.expected().bytes_sent, 0u);
    }
  }
}

// ---------------------------------------------------------------- collectives

TEST(Collectives, EveryAxisOfAMultiAxisGrid) {
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  const GridShape shape = multi_axis_shape(world_size());
  SCOPED_TRACE(testing::PrintToString(shape));
  ProcessGrid grid(MPI_COMM_WORLD, shape);
  run_every_axis(grid, seed);
}

TEST(Collectives, EveryAxisOfADataParallelLine) {
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  const int n = world_size();
  const int data = smallest_prime_factor(n);
  ProcessGrid grid = ProcessGrid::linear1d(MPI_COMM_WORLD, n / data, data);
  SCOPED_TRACE(testing::PrintToString(grid.shape()));
  run_every_axis(grid, seed);
}

TEST(Collectives, EveryAxisOfASquareMesh) {
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  const int n = world_size();
  int data = 0, q = 0;
  for (int d = 1; d <= n && q == 0; ++d) {
    if (n % d) continue;
    for (int k = 2; k * k <= n / d; ++k)
      if (k * k == n / d) {
        data = d;
        q = k;
      }
  }
  if (q == 0) GTEST_SKIP() << "no q x q mesh with q > 1 in " << n << " ranks";
  ProcessGrid grid = ProcessGrid::mesh2d(MPI_COMM_WORLD, q, data);
  SCOPED_TRACE(testing::PrintToString(grid.shape()));
  run_every_axis(grid, seed);
}

TEST(Collectives, StandaloneCommunicators) {
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937 shared(static_cast<std::uint32_t>(seed));
  {
    // Borrowed MPI_COMM_WORLD, the user axis, a counter of its own.
    TrafficCounter counter;
    MpiCommunicator c(MPI_COMM_WORLD, false, CommAxis::other, &counter);
    EXPECT_EQ(c.rank(), world_rank());
    EXPECT_EQ(c.size(), world_size());
    EXPECT_EQ(c.native(), MPI_COMM_WORLD);
    EXPECT_EQ(c.axis(), CommAxis::other);
    EXPECT_EQ(&c.counter(), &counter);
    Battery b(c, seed, 0, nullptr);
    run_all_collectives<double>(b, shared);
    EXPECT_EQ(counter, b.expected());
  }
  {
    // An owned duplicate in reversed rank order (freed by the destructor).
    MPI_Comm reversed;
    MPI_Comm_split(MPI_COMM_WORLD, 0, world_size() - 1 - world_rank(), &reversed);
    TrafficCounter counter;
    MpiCommunicator c(reversed, true, CommAxis::other, &counter);
    EXPECT_EQ(c.rank(), world_size() - 1 - world_rank());
    Battery b(c, seed + 1, 7, nullptr);
    run_all_collectives<float>(b, shared);
    EXPECT_EQ(counter, b.expected());
  }
}

// The wait timer: a collective that cannot finish before every rank arrives
// waits at least as long as the last rank is late; counters still compare
// by traffic only. The last rank sleeps `late` after a barrier that rank 0
// entered at t0, so it reaches the collective no sooner than t0 + late; rank
// 0's call, entered at t1, waits at least t0 + late - t1 (less what rank 0
// itself lost between the two, on a loaded machine: that is not the
// timer's to count).
TEST(Counters, WaitSecondsTimeBlockingCallsAndWaits) {
  using Clock = std::chrono::steady_clock;
  TrafficCounter counter;
  MpiCommunicator c(MPI_COMM_WORLD, false, CommAxis::other, &counter);
  const double late = 0.05;
  const bool sleeper = world_size() > 1 && world_rank() == world_size() - 1;
  const bool checker = world_size() > 1 && world_rank() == 0;
  const auto late_collective = [&](auto&& collective) {
    const Clock::time_point t0 = Clock::now();
    MPI_Barrier(MPI_COMM_WORLD);
    if (sleeper) std::this_thread::sleep_for(std::chrono::duration<double>(late));
    const Clock::time_point t1 = Clock::now();
    const double before = counter.wait_seconds;
    collective();
    // the least the last rank's lateness leaves rank 0 to wait
    const double owed = late - std::chrono::duration<double>(t1 - t0).count();
    if (checker) {
      EXPECT_GE(counter.wait_seconds - before, 0.8 * owed);
    }
    return owed;
  };
  double x = 1;
  const double owed_blocking =
      late_collective([&] { c.all_reduce(&x, &x, 1, DType::f64, ReduceOp::sum); });
  EXPECT_GE(counter.wait_seconds, 0);
  const double owed_waited = late_collective([&] {
    Request r = c.iall_reduce(&x, &x, 1, DType::f64, ReduceOp::sum);
    c.wait(r);
  });
  if (checker && std::getenv("SUMMA_TEST_PRINT_ERRORS") != nullptr)
    std::printf("[wait] owed %.4f and %.4f s of %.2f\n", owed_blocking, owed_waited, late);
  TrafficCounter same = counter;
  same.wait_seconds = 0;
  EXPECT_EQ(same, counter);
}

TEST(Collectives, TypedConveniencesAndBarrier) {
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  ProcessGrid grid = ProcessGrid::linear1d(MPI_COMM_WORLD);
  Communicator& c = grid.world();
  const int g = c.size(), r = c.rank();
  auto data_of = [&](int member, std::size_t n) {
    std::mt19937 gen(static_cast<std::uint32_t>(mix(seed + static_cast<std::uint64_t>(member))));
    std::uniform_int_distribution<int> d(-4096, 4096);
    std::vector<double> v(n);
    for (auto& x : v) x = d(gen) / 8.0;
    return v;
  };
  TrafficCounter want;
  // broadcast<T>
  std::vector<double> buf = r == g - 1 ? data_of(g - 1, 9) : data_of(100 + r, 9);
  c.broadcast(buf.data(), 9, g - 1);
  EXPECT_EQ(buf, data_of(g - 1, 9));
  want += closed_form(Kind::broadcast, g, r, 9, sizeof(double), g - 1);
  EXPECT_EQ(c.counter(), want);
  // all_reduce<T> with the default op (sum) and with max
  const std::vector<double> mine = data_of(r, 5);
  std::vector<double> sum(5), mx(5);
  c.all_reduce(mine.data(), sum.data(), 5);
  c.all_reduce(mine.data(), mx.data(), 5, ReduceOp::max);
  std::vector<double> want_sum = data_of(0, 5), want_max = data_of(0, 5);
  for (int m = 1; m < g; ++m) {
    const std::vector<double> v = data_of(m, 5);
    for (std::size_t i = 0; i < 5; ++i) {
      want_sum[i] += v[i];
      want_max[i] = std::max(want_max[i], v[i]);
    }
  }
  EXPECT_EQ(sum, want_sum);
  EXPECT_EQ(mx, want_max);
  want += closed_form(Kind::all_reduce, g, r, 5, sizeof(double), 0);
  want += closed_form(Kind::all_reduce, g, r, 5, sizeof(double), 0);
  EXPECT_EQ(c.counter(), want);
  // all_gather<T> (float)
  std::vector<float> part(3), all(3 * static_cast<std::size_t>(g));
  const std::vector<double> pd = data_of(r, 3);
  std::transform(pd.begin(), pd.end(), part.begin(),
                 [](double x) { return static_cast<float>(x); });
  c.all_gather(part.data(), all.data(), 3);
  for (int m = 0; m < g; ++m) {
    const std::vector<double> v = data_of(m, 3);
    for (std::size_t i = 0; i < 3; ++i)
      EXPECT_EQ(all[static_cast<std::size_t>(m) * 3 + i], static_cast<float>(v[i])) << m;
  }
  want += closed_form(Kind::all_gather, g, r, 3, sizeof(float), 0);
  EXPECT_EQ(c.counter(), want);
  // A barrier moves no payload and is not counted.
  c.barrier();
  grid.mesh_row().barrier();
  EXPECT_EQ(c.counter(), want);
  EXPECT_EQ(grid.traffic().total(), want);
}

// ---------------------------------------------------------------- bf16

// bf16 collectives against a float reference. Inputs are random values in
// [-1, 1] rounded to bf16. Movement (broadcast, all_gather) and max/min are
// exact. A sum over g members rounds once per pairwise combine (MPI user op:
// widen, add in fp32, round to nearest even), so every partial sum on any
// reduction tree is within 2^-8 of its magnitude: |got - float sum| <=
// (g - 1) 2^-8 sum_m |x_m| (exact for g = 1). Counters count 2 bytes per
// element (closed forms of counters.hpp with elem = 2).
TEST(Collectives, Bf16AgainstFloatReference) {
  using summa::bf16;
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  MPI_Comm reversed;
  MPI_Comm_split(MPI_COMM_WORLD, 0, world_size() - 1 - world_rank(), &reversed);
  for (MPI_Comm comm : {MPI_COMM_WORLD, reversed}) {
    TrafficCounter counter, want;
    MpiCommunicator c(comm, false, CommAxis::other, &counter);
    const int g = c.size(), r = c.rank();
    const std::size_t n = 37;
    auto data_of = [&](int member, std::size_t count, std::uint64_t call) {
      std::mt19937 gen(static_cast<std::uint32_t>(
          mix(seed ^ mix(call * 1000 + static_cast<std::uint64_t>(member)))));
      std::uniform_real_distribution<float> d(-1.0f, 1.0f);
      std::vector<bf16> v(count);
      for (auto& x : v) x = bf16(d(gen));
      return v;
    };
    auto bits = [](const std::vector<bf16>& v) {
      std::vector<std::uint16_t> b;
      for (bf16 x : v) b.push_back(x.bits);
      return b;
    };
    std::uint64_t call = 0;
    // Sum, max and min of every member's data, from the float reference.
    auto check_reduction = [&](const std::vector<bf16>& got, std::size_t offset, ReduceOp op,
                               std::uint64_t k, const char* what) {
      for (std::size_t i = 0; i < got.size(); ++i) {
        float sum = 0, mag = 0, mx = -2, mn = 2;
        for (int m = 0; m < g; ++m) {
          const float x = static_cast<float>(data_of(m, offset + got.size(), k)[offset + i]);
          sum += x;
          mag += std::abs(x);
          mx = std::max(mx, x);
          mn = std::min(mn, x);
        }
        const float v = static_cast<float>(got[i]);
        if (op == ReduceOp::sum)
          EXPECT_LE(std::abs(v - sum), (g - 1) * mag / 256.0f) << what << " element " << i;
        else
          EXPECT_EQ(v, op == ReduceOp::max ? mx : mn) << what << " element " << i;
      }
    };
    for (ReduceOp op : kOps) {
      ++call;
      const std::vector<bf16> mine = data_of(r, n, call);
      std::vector<bf16> out(n, bf16(7.0f));
      c.all_reduce(mine.data(), out.data(), n, DType::bf16, op);
      check_reduction(out, 0, op, call, "all_reduce");
      want += closed_form(Kind::all_reduce, g, r, n, 2, 0);
      std::vector<bf16> in_place = mine;  // in place, non-blocking
      Request req = c.iall_reduce(in_place.data(), in_place.data(), n, DType::bf16, op);
      c.wait(req);
      // MPI may reduce in another order than the blocking call (Open MPI's
      // non-blocking collectives use other algorithms), so the roundings may
      // differ: checked against the reference, and identical on every member.
      check_reduction(in_place, 0, op, call, "in-place iall_reduce");
      auto text = [&](const std::vector<bf16>& v) {
        std::string t;
        for (std::uint16_t x : bits(v)) t += std::to_string(x) + " ";
        return t;
      };
      EXPECT_TRUE(same_on_all_ranks(text(out), comm)) << "all_reduce differs between members";
      EXPECT_TRUE(same_on_all_ranks(text(in_place), comm)) << "iall_reduce differs between members";
      want += closed_form(Kind::all_reduce, g, r, n, 2, 0);
      // reduce_scatter: member r gets block r of the reduction.
      ++call;
      const std::vector<bf16> full = data_of(r, n * static_cast<std::size_t>(g), call);
      std::vector<bf16> block(n);
      c.reduce_scatter(full.data(), block.data(), n, DType::bf16, op);
      check_reduction(block, n * static_cast<std::size_t>(r), op, call, "reduce_scatter");
      want += closed_form(Kind::reduce_scatter, g, r, n, 2, 0);
      // reduce to the last member.
      std::vector<bf16> at_root(n);
      c.reduce(mine.data(), at_root.data(), n, DType::bf16, op, g - 1);
      if (r == g - 1) check_reduction(at_root, 0, op, call - 1, "reduce");
      want += closed_form(Kind::reduce, g, r, n, 2, g - 1);
    }
    // Movement is exact.
    ++call;
    std::vector<bf16> buf = data_of(r == 0 ? 0 : 100 + r, n, call);
    c.broadcast(buf.data(), n, DType::bf16, 0);
    EXPECT_EQ(bits(buf), bits(data_of(0, n, call))) << "broadcast";
    want += closed_form(Kind::broadcast, g, r, n, 2, 0);
    std::vector<bf16> all(n * static_cast<std::size_t>(g));
    const std::vector<bf16> part = data_of(r, n, call);
    c.all_gather(part.data(), all.data(), n, DType::bf16);
    for (int m = 0; m < g; ++m) {
      const std::vector<std::uint16_t> want_bits = bits(data_of(m, n, call));
      for (std::size_t i = 0; i < n; ++i)
        EXPECT_EQ(all[static_cast<std::size_t>(m) * n + i].bits, want_bits[i])
            << "all_gather " << m;
    }
    want += closed_form(Kind::all_gather, g, r, n, 2, 0);
    EXPECT_EQ(counter, want);
  }
  MPI_Comm_free(&reversed);
}

// ---------------------------------------------------------------- counters

TEST(Counters, ClosedFormsByHand) {
  // The documented numbers, written out for each supported world size.
  const int g = world_size(), r = world_rank();
  ProcessGrid grid = ProcessGrid::linear1d(MPI_COMM_WORLD);
  Communicator& c = grid.world();
  EXPECT_EQ(c.rank(), r);
  std::vector<float> f(64, 0.5f);
  std::vector<double> d(64, 0.25);
  auto world = [&] { return grid.traffic()[CommAxis::world]; };
  auto expect_delta = [&](const TrafficCounter& before, std::uint64_t sent, std::uint64_t received,
                          const char* what) {
    const TrafficCounter now = world();
    EXPECT_EQ(now.bytes_sent - before.bytes_sent, sent) << what;
    EXPECT_EQ(now.bytes_received - before.bytes_received, received) << what;
    EXPECT_EQ(now.calls - before.calls, 1u) << what;
    EXPECT_EQ(&c.counter(), &grid.traffic()[CommAxis::world]);
  };
  const std::uint64_t G = static_cast<std::uint64_t>(g);

  // all-reduce of 10 floats: (10 - c_r) + (g-1)*c_r elements each way.
  TrafficCounter before = world();
  c.all_reduce(f.data(), f.data() + 32, 10, DType::f32, ReduceOp::sum);
  std::uint64_t elems = 0;
  switch (g) {
    case 1:
      elems = 0;
      break;
    case 2:
      elems = 10;  // c_r = 5, 5
      break;
    case 4:
      elems = r < 2 ? 16 : 14;  // c_r = 3, 3, 2, 2
      break;
    case 8:
      elems = r < 2 ? 22 : 16;  // c_r = 2, 2, 1, ...
      break;
    case 9:
      elems = r < 1 ? 24 : 17;  // c_r = 2, 1, ...
      break;
    default: {
      const std::uint64_t cr = 10 / G + (static_cast<std::uint64_t>(r) < 10 % G ? 1 : 0);
      elems = G == 1 ? 0 : (10 - cr) + (G - 1) * cr;
    }
  }
  expect_delta(before, 4 * elems, 4 * elems, "all_reduce 10 floats");

  // all-reduce of 3 doubles with g > 3: ranks >= 3 own an empty chunk and
  // still receive the whole result (3 elements) and send their 3 inputs.
  before = world();
  c.all_reduce(d.data(), d.data() + 32, 3, DType::f64, ReduceOp::max);
  std::uint64_t e3 = 0;
  if (g > 1) {
    const std::uint64_t cr = 3 / G + (static_cast<std::uint64_t>(r) < 3 % G ? 1 : 0);
    e3 = (3 - cr) + (G - 1) * cr;
  }
  if (g >= 4) {
    EXPECT_EQ(e3, r < 3 ? 2 + (G - 1) : 3u);
  }
  expect_delta(before, 8 * e3, 8 * e3, "all_reduce 3 doubles");

  // broadcast of 10 doubles from the last rank.
  before = world();
  c.broadcast(d.data(), 10, DType::f64, g - 1);
  if (g == 1)
    expect_delta(before, 0, 0, "broadcast");
  else if (r == g - 1)
    expect_delta(before, (G - 1) * 80, 0, "broadcast root");
  else
    expect_delta(before, 0, 80, "broadcast non-root");

  // reduce of 7 floats to rank 0.
  before = world();
  c.reduce(f.data(), f.data() + 32, 7, DType::f32, ReduceOp::min, 0);
  if (g == 1)
    expect_delta(before, 0, 0, "reduce");
  else if (r == 0)
    expect_delta(before, 0, (G - 1) * 28, "reduce root");
  else
    expect_delta(before, 28, 0, "reduce non-root");

  // all-gather and reduce-scatter of 3 doubles per rank.
  before = world();
  std::vector<double> gathered(3 * G);
  c.all_gather(d.data(), gathered.data(), 3, DType::f64);
  expect_delta(before, (G - 1) * 24, (G - 1) * 24, "all_gather");
  before = world();
  std::vector<double> scatter_in(3 * G, 1.0), scatter_out(3);
  c.reduce_scatter(scatter_in.data(), scatter_out.data(), 3, DType::f64, ReduceOp::sum);
  expect_delta(before, (G - 1) * 24, (G - 1) * 24, "reduce_scatter");
  EXPECT_EQ(scatter_out, std::vector<double>(3, static_cast<double>(g)));

  // Only the world axis moved anything; reset clears every axis.
  for (CommAxis a : kAllAxes)
    if (a != CommAxis::world) {
      EXPECT_EQ(grid.traffic()[a], TrafficCounter{}) << summa::name_of(a);
    }
  EXPECT_EQ(grid.traffic().total(), world());
  EXPECT_EQ(world().calls, 6u);
  grid.reset_traffic();
  EXPECT_EQ(grid.traffic().total(), TrafficCounter{});
  EXPECT_EQ(c.counter(), TrafficCounter{});
}

TEST(Counters, GroupOfOneMovesNothing) {
  // The data axis of a data=1 grid has one rank: calls count, bytes do not.
  ProcessGrid grid = ProcessGrid::linear1d(MPI_COMM_WORLD);
  Communicator& one = grid.data();
  EXPECT_EQ(one.size(), 1);
  std::vector<double> v(16, 1.5), w(16, 0.0);
  one.broadcast(v.data(), 16, DType::f64, 0);
  one.reduce(v.data(), w.data(), 16, DType::f64, ReduceOp::sum, 0);
  one.all_reduce(v.data(), w.data(), 16, DType::f64, ReduceOp::max);
  one.all_gather(v.data(), w.data(), 16, DType::f64);
  one.reduce_scatter(v.data(), w.data(), 16, DType::f64, ReduceOp::min);
  Request r = one.iall_reduce(v.data(), v.data(), 16, DType::f64, ReduceOp::sum);
  one.wait(r);
  EXPECT_EQ(w, v);
  EXPECT_EQ(grid.traffic()[CommAxis::data], (TrafficCounter{0, 0, 6}));
  EXPECT_EQ(grid.traffic().total(), (TrafficCounter{0, 0, 6}));
}

TEST(Counters, EachAxisCountsOnlyItsOwnCalls) {
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  ProcessGrid grid(MPI_COMM_WORLD, multi_axis_shape(world_size()));
  std::mt19937 gen(static_cast<std::uint32_t>(seed));
  std::uniform_int_distribution<int> pick(1, 50);
  TrafficCounters want;
  std::size_t k = 0;
  for (int round = 0; round < 2; ++round)
    for (CommAxis axis : kGridAxes) {
      Communicator& c = grid.comm(axis);
      const std::size_t count = static_cast<std::size_t>(pick(gen));
      std::vector<double> in(count * static_cast<std::size_t>(c.size()),
                             0.5 + static_cast<double>(k));
      std::vector<double> out(in.size());
      switch (k++ % 3) {
        case 0:
          c.all_reduce(in.data(), out.data(), count, DType::f64, ReduceOp::sum);
          want[axis] += closed_form(Kind::all_reduce, c.size(), c.rank(), count, 8, 0);
          break;
        case 1:
          c.all_gather(in.data(), out.data(), count, DType::f64);
          want[axis] += closed_form(Kind::all_gather, c.size(), c.rank(), count, 8, 0);
          break;
        default:
          c.broadcast(in.data(), count, DType::f64, c.size() - 1);
          want[axis] += closed_form(Kind::broadcast, c.size(), c.rank(), count, 8, c.size() - 1);
      }
      for (CommAxis a : kAllAxes)
        EXPECT_EQ(grid.traffic()[a], want[a])
            << "after a call on " << summa::name_of(axis) << ", counter of " << summa::name_of(a);
      EXPECT_EQ(grid.traffic().total(), want.total());
    }
  grid.reset_traffic();
  for (CommAxis a : kAllAxes) EXPECT_EQ(grid.traffic()[a], TrafficCounter{});
}

// ---------------------------------------------------------------- requests

TEST(Requests, ManyInFlightOnDifferentCommunicators) {
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  ProcessGrid grid(MPI_COMM_WORLD, multi_axis_shape(world_size()));
  std::vector<std::unique_ptr<Battery>> batteries;
  for (CommAxis axis : kGridAxes)
    batteries.push_back(std::make_unique<Battery>(
        grid.comm(axis), seed ^ static_cast<std::uint64_t>(axis), group_key(grid, axis), nullptr));
  auto bat = [&](CommAxis axis) -> Battery& {
    return *batteries[static_cast<std::size_t>(std::find(kGridAxes.begin(), kGridAxes.end(), axis) -
                                               kGridAxes.begin())];
  };
  struct InFlight {
    Battery* b;
    Prepared p;
    Request r;
  };
  for (int round = 0; round < 3; ++round) {
    grid.reset_traffic();
    TrafficCounters want;
    std::vector<InFlight> flights;
    auto add = [&](CommAxis axis, Prepared p) {
      want[axis] += p.delta;
      flights.push_back(InFlight{&bat(axis), std::move(p), Request{}});
    };
    Battery& w = bat(CommAxis::world);
    add(CommAxis::world, w.broadcast<double>(17, w.size() - 1 - round % w.size()));
    add(CommAxis::world, w.all_reduce<float>(w.size() * 3 + 2, ReduceOp::min, Place::out_of_place));
    add(CommAxis::mesh_row,
        bat(CommAxis::mesh_row).all_reduce<double>(33, ReduceOp::sum, Place::in_place));
    add(CommAxis::mesh_col, bat(CommAxis::mesh_col).all_gather<float>(11, Place::in_place));
    add(CommAxis::tensor,
        bat(CommAxis::tensor).reduce_scatter<double>(5, ReduceOp::max, Place::out_of_place));
    add(CommAxis::depth,
        bat(CommAxis::depth).reduce<float>(9, 0, ReduceOp::min, Place::out_of_place));
    add(CommAxis::mesh, bat(CommAxis::mesh).all_reduce<double>(21, ReduceOp::max, Place::in_place));
    Battery& d = bat(CommAxis::data);
    add(CommAxis::data, d.broadcast<float>(13, d.size() - 1));
    // Issue in one order (the same on all ranks, as MPI requires per communicator).
    for (InFlight& f : flights) f.r = f.p.start();
    for (CommAxis a : kAllAxes)
      EXPECT_EQ(grid.traffic()[a], want[a]) << "at issue, axis " << summa::name_of(a);
    // Complete in an order that differs between ranks and rounds, by wait()
    // or by polling test().
    std::vector<std::size_t> order(flights.size());
    std::iota(order.begin(), order.end(), 0);
    std::mt19937 shuffle(static_cast<std::uint32_t>(mix(seed + 31 * world_rank() + round)));
    std::shuffle(order.begin(), order.end(), shuffle);
    if (round == 1) std::reverse(order.begin(), order.end());
    for (std::size_t i = 0; i < order.size(); ++i) {
      InFlight& f = flights[order[i]];
      SCOPED_TRACE(f.p.what);
      f.b->complete(f.r,
                    (i + static_cast<std::size_t>(world_rank())) % 2 ? Mode::test : Mode::wait);
    }
    for (InFlight& f : flights) f.p.check();
    for (CommAxis a : kAllAxes)
      EXPECT_EQ(grid.traffic()[a], want[a]) << "after completion, axis " << summa::name_of(a);
  }
}

TEST(Requests, ManyInFlightOnOneCommunicator) {
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  ProcessGrid grid = ProcessGrid::linear1d(MPI_COMM_WORLD);
  Battery b(grid.world(), seed, 0, &grid.traffic());
  const int g = b.size();
  std::vector<Prepared> ps;
  ps.push_back(b.all_reduce<double>(40, ReduceOp::sum, Place::out_of_place));
  ps.push_back(b.broadcast<float>(12, g / 2));
  ps.push_back(b.reduce_scatter<double>(6, ReduceOp::min, Place::in_place));
  ps.push_back(b.all_gather<double>(4, Place::out_of_place));
  ps.push_back(b.reduce<double>(8, g - 1, ReduceOp::max, Place::in_place));
  ps.push_back(b.all_reduce<float>(3, ReduceOp::max, Place::in_place));
  std::vector<Request> rs;
  TrafficCounter want;
  for (const Prepared& p : ps) {
    rs.push_back(p.start());
    want += p.delta;
  }
  EXPECT_EQ(grid.world().counter(), want);
  // Reverse order, alternating wait and test.
  for (std::size_t i = rs.size(); i-- > 0;) b.complete(rs[i], i % 2 ? Mode::wait : Mode::test);
  for (const Prepared& p : ps) p.check();
  EXPECT_EQ(grid.traffic()[CommAxis::world], want);
}

TEST(Requests, BelongToTheirCommunicator) {
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  ProcessGrid grid = ProcessGrid::linear1d(MPI_COMM_WORLD);
  Battery b(grid.world(), seed, 0, nullptr);
  Prepared p = b.all_reduce<double>(10, ReduceOp::sum, Place::out_of_place);
  Request r = p.start();
  // mesh_row has the same members as world here but is another communicator.
  EXPECT_THROW(grid.mesh_row().wait(r), summa::Error);
  EXPECT_THROW((void)grid.mesh_row().test(r), summa::Error);
  EXPECT_THROW(grid.tensor().wait(r), summa::Error);
  EXPECT_TRUE(r.active());
  grid.world().wait(r);
  EXPECT_FALSE(r.active());
  p.check();
  Request none;
  EXPECT_FALSE(none.active());
  EXPECT_TRUE(grid.mesh_row().test(none));
  EXPECT_NO_THROW(grid.tensor().wait(none));
}

// ---------------------------------------------------------------- bad input

TEST(BadInput, RootOutsideTheGroup) {
  ProcessGrid grid(MPI_COMM_WORLD, multi_axis_shape(world_size()));
  std::vector<double> buf(8, 1.25), out(8, 0.0);
  for (CommAxis axis : kGridAxes) {
    Communicator& c = grid.comm(axis);
    const int g = c.size();
    SCOPED_TRACE(testing::Message() << "axis " << summa::name_of(axis) << " g=" << g);
    const TrafficCounter before = grid.traffic().total();
    for (int root : {-1, g, g + 3, INT_MIN, INT_MAX}) {
      for (std::size_t count : {std::size_t{8}, std::size_t{0}}) {
        SCOPED_TRACE(testing::Message() << "root=" << root << " count=" << count);
        std::vector<std::string> msgs;
        msgs.push_back(
            expect_error_everywhere([&] { c.broadcast(buf.data(), count, DType::f64, root); }));
        msgs.push_back(expect_error_everywhere(
            [&] { (void)c.ibroadcast(buf.data(), count, DType::f64, root); }));
        msgs.push_back(expect_error_everywhere(
            [&] { c.reduce(buf.data(), out.data(), count, DType::f64, ReduceOp::sum, root); }));
        msgs.push_back(expect_error_everywhere([&] {
          (void)c.ireduce(buf.data(), out.data(), count, DType::f64, ReduceOp::max, root);
        }));
        for (const std::string& m : msgs) {
          EXPECT_TRUE(contains(m, "root " + std::to_string(root))) << m;
          EXPECT_TRUE(contains(m, "[0, " + std::to_string(g) + ")")) << m;
          EXPECT_TRUE(contains(m, std::string(summa::name_of(axis)))) << m;
        }
      }
    }
    // Rejected before anything was counted or sent; the group still works.
    EXPECT_EQ(grid.traffic().total(), before);
    double one = 1.0, total = 0.0;
    c.all_reduce(&one, &total, 1);
    EXPECT_EQ(total, static_cast<double>(g));
  }
  EXPECT_EQ(buf, std::vector<double>(8, 1.25));
}

TEST(BadInput, NullBuffers) {
  ProcessGrid grid(MPI_COMM_WORLD, multi_axis_shape(world_size()));
  for (CommAxis axis : kGridAxes) {
    Communicator& c = grid.comm(axis);
    const int g = c.size();
    SCOPED_TRACE(testing::Message() << "axis " << summa::name_of(axis) << " g=" << g);
    std::vector<float> a(3 * static_cast<std::size_t>(g), 2.5f), b(a.size(), -1.0f);
    float* const nul = nullptr;
    const TrafficCounter before = grid.traffic().total();
    std::vector<std::string> msgs;
    auto expect = [&](auto&& f) { msgs.push_back(expect_error_everywhere(f)); };
    expect([&] { c.broadcast(nul, 3, DType::f32, 0); });
    expect([&] { (void)c.ibroadcast(nul, 3, DType::f32, g - 1); });
    expect([&] { c.reduce(nul, b.data(), 3, DType::f32, ReduceOp::sum, 0); });
    expect([&] { (void)c.ireduce(nul, b.data(), 3, DType::f32, ReduceOp::sum, g - 1); });
    expect([&] { c.all_reduce(nul, b.data(), 3, DType::f32, ReduceOp::sum); });
    expect([&] { c.all_reduce(a.data(), nul, 3, DType::f32, ReduceOp::min); });
    expect([&] { (void)c.iall_reduce(nul, nul, 3, DType::f32, ReduceOp::max); });
    expect([&] { c.all_gather(nul, b.data(), 3, DType::f32); });
    expect([&] { c.all_gather(a.data(), nul, 3, DType::f32); });
    expect([&] { (void)c.iall_gather(nul, b.data(), 3, DType::f32); });
    expect([&] { c.reduce_scatter(nul, b.data(), 3, DType::f32, ReduceOp::sum); });
    expect([&] { c.reduce_scatter(a.data(), nul, 3, DType::f32, ReduceOp::sum); });
    expect([&] { (void)c.ireduce_scatter(a.data(), nul, 3, DType::f32, ReduceOp::max); });
    for (const std::string& m : msgs) {
      EXPECT_TRUE(contains(m, "null")) << m;
      EXPECT_TRUE(contains(m, "3 elements")) << m;
      EXPECT_TRUE(contains(m, std::string(summa::name_of(axis)))) << m;
    }
    EXPECT_EQ(grid.traffic().total(), before);
    EXPECT_EQ(b, std::vector<float>(b.size(), -1.0f));
    // A root whose receive buffer is null is caught before anything moves
    // when the root is the only member (elsewhere only the root would know).
    if (g == 1) expect([&] { c.reduce(a.data(), nul, 3, DType::f32, ReduceOp::sum, 0); });
  }
}

TEST(BadInput, ZeroCountAcceptsNullBuffers) {
  ProcessGrid grid(MPI_COMM_WORLD, multi_axis_shape(world_size()));
  for (CommAxis axis : kGridAxes) {
    Communicator& c = grid.comm(axis);
    SCOPED_TRACE(testing::Message() << "axis " << summa::name_of(axis));
    grid.reset_traffic();
    double* const nul = nullptr;
    int outcome = 1;
    try {
      c.broadcast(nul, 0, DType::f64, 0);
      c.reduce(nul, nul, 0, DType::f64, ReduceOp::sum, c.size() - 1);
      c.all_reduce(nul, nul, 0, DType::f64, ReduceOp::sum);
      c.all_gather(nul, nul, 0, DType::f64);
      c.reduce_scatter(nul, nul, 0, DType::f64, ReduceOp::sum);
      std::array<Request, 5> rs{c.ibroadcast(nul, 0, DType::f64, c.size() - 1),
                                c.ireduce(nul, nul, 0, DType::f64, ReduceOp::min, 0),
                                c.iall_reduce(nul, nul, 0, DType::f64, ReduceOp::max),
                                c.iall_gather(nul, nul, 0, DType::f64),
                                c.ireduce_scatter(nul, nul, 0, DType::f64, ReduceOp::min)};
      for (Request& r : rs) c.wait(r);
    } catch (const std::exception& e) {
      ADD_FAILURE() << e.what();
      outcome = 0;
    }
    EXPECT_TRUE(all_ranks(outcome == 1));
    EXPECT_EQ(grid.traffic()[axis], (TrafficCounter{0, 0, 10}));
    EXPECT_EQ(grid.traffic().total(), (TrafficCounter{0, 0, 10}));
  }
}

// ---------------------------------------------------------------- staging
// The placement of StagedCommunicator's requests in its pinned buffer
// (src/comm/staging_fit.hpp; the communicator itself runs only on a GPU):
// requests of random sizes taken and given back in random order, each
// placement against a scan of every aligned offset, the largest free run
// against the same scan, and a request placed exactly when it fits.
TEST(StagingFit, LowestClearAlignedOffsetWhateverTheOrder) {
  using summa::detail::StagingRange;
  const std::uint64_t seed = summa::test::fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  constexpr std::size_t align = 256, capacity = 32 * align;
  for (int round = 0; round < 60; ++round) {
    std::vector<StagingRange> held(16);  // the slots; empty ranges are free
    for (int op = 0; op < 60; ++op) {
      const std::size_t slot = gen() % held.size();
      if (held[slot].begin < held[slot].end && gen() % 3 != 0) {
        held[slot] = {};  // given back, wherever it lies
        continue;
      }
      if (held[slot].begin < held[slot].end) continue;
      const std::size_t bytes = 1 + gen() % (8 * align);
      // run[i]: the free bytes from byte i on (a byte map of what is held)
      std::vector<std::size_t> run(capacity + 1, 0);
      std::vector<bool> taken(capacity, false);
      for (const StagingRange& r : held)
        for (std::size_t i = r.begin; i < r.end; ++i) taken[i] = true;
      for (std::size_t i = capacity; i-- > 0;) run[i] = taken[i] ? 0 : run[i + 1] + 1;
      std::optional<std::size_t> want;  // every aligned offset, lowest first
      std::size_t largest = 0;
      for (std::size_t at = 0; at < capacity; at += align) {
        if (!want && run[at] >= bytes) want = at;
        largest = std::max(largest, run[at]);
      }
      const std::optional<std::size_t> got =
          summa::detail::staging_first_fit(held, bytes, capacity, align);
      EXPECT_EQ(got, want) << bytes << " bytes, round " << round << ", op " << op;
      EXPECT_EQ(summa::detail::staging_largest_free(held, capacity, align), largest);
      EXPECT_EQ(got.has_value(), bytes <= largest) << bytes << " bytes";
      if (got) held[slot] = {*got, *got + bytes};
    }
  }
  // Given back below the others, a range is used again (the buffer never
  // runs out while what is held fits): two ranges, the first freed.
  std::vector<StagingRange> held = {{0, 600}, {768, 1000}};
  EXPECT_EQ(summa::detail::staging_first_fit(held, 600, 1024, align), std::nullopt);
  EXPECT_EQ(summa::detail::staging_largest_free(held, 1024, align), 0u);
  held[0] = {};
  EXPECT_EQ(summa::detail::staging_first_fit(held, 600, 1024, align),
            std::optional<std::size_t>(0));
  EXPECT_EQ(summa::detail::staging_largest_free(held, 1024, align), 768u);
}

}  // namespace

// ---------------------------------------------------------------- watchdog

// Every collective, blocking and not, on every axis, under a watchdog (waits
// polled under a limit that is never reached): the same results and counters
// as unguarded, and every axis is guarded.
TEST(Watchdog, GuardedCollectivesAreUnchanged) {
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  summa::GridOptions options;
  options.watchdog.timeout_s = 600;
  ProcessGrid grid(MPI_COMM_WORLD, multi_axis_shape(world_size()), options);
  ASSERT_NE(grid.watchdog(), nullptr);
  for (CommAxis axis : kGridAxes) EXPECT_EQ(grid.comm(axis).watchdog(), grid.watchdog());
  run_every_axis(grid, seed);
  const std::uint64_t before = grid.world().sequence();
  grid.world().barrier();  // MPI_Ibarrier, polled
  EXPECT_EQ(grid.world().sequence(), before + 1);
  // Off by default: no watchdog, waits block in MPI.
  ProcessGrid plain = ProcessGrid::linear1d(MPI_COMM_WORLD);
  EXPECT_EQ(plain.watchdog(), nullptr);
  EXPECT_EQ(plain.world().watchdog(), nullptr);
}

// The last rank is late (computing) while the others wait in an all-reduce:
// their watchdogs report it as not arrived and the other waiting ranks as
// arrived. Report-only handler, so the collective then completes normally.
// On a 1D grid whose watchdog (0.3 s) reports into `report`, the last rank
// arrives 3 s late at `wait(grid)`; then `after(grid)`.
template <class Wait, class After>
void with_late_rank(std::string& report, Wait&& wait, After&& after) {
  summa::GridOptions options;
  options.watchdog.timeout_s = 0.3;
  options.watchdog.report_s = 1.5;
  options.watchdog.on_expiry = [&](const std::string& r) { report = r; };
  ProcessGrid grid = ProcessGrid::linear1d(MPI_COMM_WORLD, 0, 1, options);
  // Every rank has left the grid's construction (whose last agreement serves
  // the new watchdog's probes) before the late rank goes silent.
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == world_size() - 1)
    std::this_thread::sleep_for(std::chrono::milliseconds(3000));
  wait(grid);
  after(grid);
}

TEST(Watchdog, ReportNamesTheRankThatHasNotArrived) {
  const int n = world_size(), me = world_rank();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  std::string report;
  const int late = n - 1;
  std::uint64_t seq = 0;
  double sum = 0;
  with_late_rank(
      report,
      [&](ProcessGrid& grid) {
        seq = grid.world().sequence() + 1;
        const double x = 1;
        grid.world().all_reduce(&x, &sum, 1);
      },
      [](ProcessGrid&) {});
  EXPECT_EQ(sum, static_cast<double>(n));
  if (me == late) {
    EXPECT_EQ(report, "") << "the late rank waited for nobody";
  } else {
    EXPECT_NE(report.find(fmt::format("all_reduce #{} on axis world (8 bytes)", seq)),
              std::string::npos)
        << report;
    EXPECT_NE(report.find(fmt::format("rank {}: NOT ARRIVED, no answer", late)), std::string::npos)
        << report;
    EXPECT_NE(report.find(fmt::format("lagging ranks: {}\n", late)), std::string::npos) << report;
    for (int r = 0; r < late; ++r) {
      if (r != me) {
        EXPECT_NE(report.find(fmt::format("rank {}: arrived", r)), std::string::npos) << report;
      }
    }
  }
}

// On a mesh the rank that waits is often not the one waited on: rank 0 waits
// on its row for rank q - 1, which waits on its column for the late rank
// (the last). The report names rank q - 1 as lagging in the group and the
// late rank, outside the group, as the likely cause (every rank of the job is
// probed; before, only the group's members were, and the report blamed
// rank q - 1 alone).
TEST(Watchdog, ReportNamesTheSilentRankOutsideTheGroup) {
  const int n = world_size(), me = world_rank();
  int q = 0;
  for (int k = 2; k * k <= n; ++k)
    if (k * k == n) q = k;
  if (q == 0) GTEST_SKIP() << "needs a q x q mesh with q > 1";
  summa::GridOptions options;
  options.watchdog.timeout_s = 0.3;
  options.watchdog.report_s = 1.5;
  std::string report;
  options.watchdog.on_expiry = [&](const std::string& r) {
    if (report.empty()) report = r;
  };
  ProcessGrid grid = ProcessGrid::mesh2d(MPI_COMM_WORLD, q, 1, options);
  const int late = n - 1;
  // Every rank has left the construction before the late rank goes silent: a
  // late rank still polling the grid's last agreement answers probes (seen
  // once in CI on 4 oversubscribed ranks, and the report then had no silent
  // rank to name).
  MPI_Barrier(MPI_COMM_WORLD);
  if (me == late) std::this_thread::sleep_for(std::chrono::milliseconds(3000));
  const double x = 1;
  double col = 0, row = 0;
  grid.mesh_col().all_reduce(&x, &col, 1);
  grid.mesh_row().all_reduce(&x, &row, 1);
  EXPECT_EQ(col, static_cast<double>(q));
  EXPECT_EQ(row, static_cast<double>(q));
  if (me == 0) {
    EXPECT_NE(report.find(fmt::format("rank {}: NOT ARRIVED, waiting in another call", q - 1)),
              std::string::npos)
        << report;
    EXPECT_NE(report.find(fmt::format("lagging ranks: {}\n", q - 1)), std::string::npos) << report;
    EXPECT_NE(report.find(fmt::format("outside the group, no answer from rank(s) {}\n", late)),
              std::string::npos)
        << report;
    EXPECT_NE(report.find(fmt::format("likely cause: rank(s) {}: they answer no probe", late)),
              std::string::npos)
        << report;
  }
}

// Communicator::wait_any, as a pipeline's middle stage waits for whichever
// neighbour's message comes first: on three ranks in a line, rank 1 posts a
// receive from rank 0 (`a`) and one from rank 2 (`b`); rank 0 sends only
// after rank 1 has taken `b`, so `b` must be the one. Without a watchdog,
// then under one (report-only, 0.3 s) with rank 2 silent for 2 s: rank 1's
// report names rank 2 alone as lagging, rank 0 as waiting on a message
// (point to point, not out of step), and the wait then completes.
TEST(Watchdog, WaitAnyTakesWhicheverArrivesAndIsGuarded) {
  if (world_size() < 3) GTEST_SKIP() << "needs 3 ranks";
  const int me = world_rank();
  MPI_Comm line = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, me < 3 ? 0 : MPI_UNDEFINED, me, &line);
  if (line == MPI_COMM_NULL) return;
  for (const bool guarded : {false, true}) {
    SCOPED_TRACE(guarded ? "under a watchdog" : "no watchdog");
    summa::WatchdogOptions wo;
    std::string report;
    if (guarded) {
      wo.timeout_s = 0.3;
      wo.report_s = 1.5;
      wo.on_expiry = [&](const std::string& r) {
        if (report.empty()) report = r;
      };
    }
    summa::Watchdog watchdog(line, wo);
    MPI_Comm dup = MPI_COMM_NULL;
    MPI_Comm_dup(line, &dup);
    TrafficCounter counter;
    MpiCommunicator c(dup, true, CommAxis::pipe, &counter);
    watchdog.attach(c, dup);
    MPI_Barrier(line);  // every rank past the set-up before rank 2 goes silent
    const auto send = [&](const double* v, int peer) {
      Request r = c.isend(v, 1, DType::f64, peer);
      c.wait(r);
    };
    const auto recv = [&](double* v, int peer) {
      Request r = c.irecv(v, 1, DType::f64, peer);
      c.wait(r);
    };
    double a_value = 0, b_value = 0, go = 0;
    if (me == 1) {
      Request a = c.irecv(&a_value, 1, DType::f64, 0);
      Request b = c.irecv(&b_value, 1, DType::f64, 2);
      const int first = c.wait_any(a, b);
      EXPECT_EQ(first, 1);
      EXPECT_FALSE(b.active());
      EXPECT_TRUE(a.active());
      EXPECT_EQ(b_value, 2.0);
      go = 1;
      send(&go, 0);
      c.wait(a);
      EXPECT_EQ(a_value, 1.0);
      Request x = c.irecv(&a_value, 1, DType::f64, 0), y;
      EXPECT_THROW(c.wait_any(x, y), summa::Error);  // both must be in flight
      c.wait(x);
      if (guarded) {
        EXPECT_NE(report.find("  rank 0: waiting for"), std::string::npos) << report;
        EXPECT_NE(report.find("(point to point: it waits on a message too)"), std::string::npos)
            << report;
        EXPECT_NE(report.find("lagging ranks: 2\n"), std::string::npos) << report;
        EXPECT_NE(report.find("likely cause: rank(s) 2:"), std::string::npos) << report;
      }
    } else if (me == 0) {
      recv(&go, 1);
      EXPECT_EQ(go, 1.0);
      a_value = 1;
      send(&a_value, 1);
      send(&a_value, 1);
    } else {
      if (guarded) std::this_thread::sleep_for(std::chrono::milliseconds(2000));
      b_value = 2;
      send(&b_value, 1);
    }
    MPI_Barrier(line);
  }
  MPI_Comm_free(&line);
}

// agree_on (the layers' and programs' shape and error agreements, on a raw
// MPI communicator) waits under the live watchdog too: a late rank is
// reported there (before, such a wait hung with the flag on).
TEST(Watchdog, AgreeOnIsGuarded) {
  const int n = world_size(), me = world_rank();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  std::string report, message;
  const int late = n - 1;
  with_late_rank(
      report,
      [](ProcessGrid& grid) {
        ASSERT_NE(summa::Watchdog::active(), nullptr);
        grid.agree(summa::CommAxis::world, std::nullopt);
      },
      [&](ProcessGrid& grid) {  // an error still reaches every rank through the guarded waits
        try {
          grid.agree(summa::CommAxis::world,
                     me == 0 ? std::optional<std::string>("rank 0 says no") : std::nullopt);
        } catch (const summa::CollectiveError& e) {
          message = e.what();
        }
      });
  if (me == late) {
    EXPECT_EQ(report, "") << "the late rank waited for nobody";
  } else {
    EXPECT_NE(report.find("in agree_on"), std::string::npos) << report;
    EXPECT_NE(report.find(fmt::format("rank {}: NOT ARRIVED", late)), std::string::npos) << report;
  }
  EXPECT_EQ(message, "rank 0 says no");
}

TEST(Watchdog, BadOptionsAreRefusedEverywhere) {
  for (const double t : {-1.0, std::numeric_limits<double>::infinity()}) {
    summa::GridOptions options;
    options.watchdog.timeout_s = t;
    std::string message;
    try {
      ProcessGrid grid = ProcessGrid::linear1d(MPI_COMM_WORLD, 0, 1, options);
    } catch (const summa::CollectiveError& e) {
      message = e.what();
    }
    EXPECT_NE(message.find("timeout_s="), std::string::npos) << message;
    EXPECT_TRUE(same_on_all_ranks(message));
  }
  if (world_size() > 1) {  // one rank with another limit
    summa::GridOptions options;
    options.watchdog.timeout_s = world_rank() == 1 ? 5 : 10;
    std::string message;
    try {
      ProcessGrid grid = ProcessGrid::linear1d(MPI_COMM_WORLD, 0, 1, options);
    } catch (const summa::CollectiveError& e) {
      message = e.what();
    }
    EXPECT_NE(message.find("ranks disagree on the watchdog timeout (ms): it ranges over [5000, "
                           "10000]"),
              std::string::npos)
        << message;
    EXPECT_TRUE(same_on_all_ranks(message));
  }
}

// init_mpi's limit on MPI_Init (comm/mpi_init.hpp): SUMMA_INIT_TIMEOUT wins,
// else the last --watchdog of the command line (at least 30 s; 0: off), else
// the program's default; a malformed value is left to the program's parser.
TEST(InitMpi, TimeoutComesFromTheEnvironmentTheFlagOrTheDefault) {
  const auto limit = [](std::vector<const char*> args, double fallback) {
    args.insert(args.begin(), "prog");
    return summa::init_timeout_s(static_cast<int>(args.size()), args.data(), fallback);
  };
  ASSERT_EQ(::unsetenv("SUMMA_INIT_TIMEOUT"), 0);
  EXPECT_EQ(limit({}, 600), 600);
  EXPECT_EQ(limit({"--steps", "3"}, 0), 0);
  EXPECT_EQ(limit({"--watchdog", "120"}, 600), 120);
  EXPECT_EQ(limit({"--watchdog", "3"}, 600), 30);
  EXPECT_EQ(limit({"--watchdog=45", "--x"}, 0), 45);
  EXPECT_EQ(limit({"--watchdog", "0"}, 600), 0);
  EXPECT_EQ(limit({"--watchdog", "100", "--watchdog", "200"}, 600), 200);
  EXPECT_EQ(limit({"--watchdog", "abc"}, 600), 600);
  EXPECT_EQ(limit({"--watchdog", "-5"}, 600), 600);
  EXPECT_EQ(limit({"--watchdog"}, 600), 600);
  EXPECT_EQ(limit({"--watchdog", "1e10"}, 600),
            600);  // beyond the flag's range: the parser says so
  EXPECT_EQ(limit({"--watchdog", "1e7"}, 600), 1e7);
  ASSERT_EQ(::setenv("SUMMA_INIT_TIMEOUT", "7", 1), 0);
  EXPECT_EQ(limit({"--watchdog", "120"}, 600), 7);
  ASSERT_EQ(::setenv("SUMMA_INIT_TIMEOUT", "1e300", 1), 0);  // was: overflowed to no wait at all
  EXPECT_EQ(limit({"--watchdog", "120"}, 600), 120);
  ASSERT_EQ(::setenv("SUMMA_INIT_TIMEOUT", "nan", 1), 0);
  EXPECT_EQ(limit({"--watchdog", "120"}, 600), 120);
  ASSERT_EQ(::unsetenv("SUMMA_INIT_TIMEOUT"), 0);
}

// The memory budget the programs check sizes against
// (summa/parallel/memory_check.hpp): the backend's free memory, shared by the
// ranks of a node on the same memory domain.
// make_device is collective on the CPU GEMM library: ranks that would run
// different libraries (different rounding: replicas would drift) or a library
// that loads on some ranks only get the same error on every rank.
TEST(Device, CpuGemmLibraryIsAgreedByEveryRank) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const auto message = [](const summa::DeviceOptions& o) {
    try {
      summa::make_device(MPI_COMM_WORLD, o);
    } catch (const summa::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::vector<std::string> libs = summa::CpuBackend::gemm_libraries();
  EXPECT_EQ(message({.backend = "cpu", .cpu_gemm = "eigen"}), "");
  if (size > 1 && libs.size() > 1) {
    // rank 0 on eigen, the others on a BLAS
    const std::string m = message({.backend = "cpu", .cpu_gemm = rank == 0 ? "eigen" : libs[1]});
    EXPECT_NE(m.find("ranks disagree on the CPU GEMM library"), std::string::npos) << m;
  }
  if (size > 1) {
    // the last rank asks for a library that is not there: every rank fails, naming it
    const std::string m =
        message({.backend = "cpu", .cpu_gemm = rank == size - 1 ? "atlas" : "eigen"});
    EXPECT_NE(m.find("'atlas'"), std::string::npos) << m;
  }
}

TEST(MemoryBudget, BackendMemoryIsSharedByTheRanksOfANode) {
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int local = 1;
  MPI_Comm_size(node, &local);
  MPI_Comm_free(&node);
  for (const bool emulate : {false, true}) {
    SCOPED_TRACE(emulate ? "emulated device" : "host");
    const summa::CpuBackend backend(emulate);
    EXPECT_EQ(backend.memory_domain(), "host");
    const double host = summa::CpuBackend::host_available_bytes();
    ASSERT_GT(host, 0) << "/proc/meminfo has no MemAvailable";
    const double per_rank = summa::available_memory_per_rank(MPI_COMM_WORLD, backend);
    // MemAvailable moves while the ranks read it: within 10 %
    EXPECT_NEAR(per_rank, host / local, 0.1 * host / local);
    // an emulated device allocates host memory: the node's, named so
    EXPECT_STREQ(summa::available_memory_source(backend), "available on this node");
  }
}

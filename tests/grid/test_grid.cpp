// Tests of the process grid (coordinates, axis communicators, collective
// errors, agreement) and of the pure placement functions. Every test runs on
// every rank of MPI_COMM_WORLD and adapts to its size (1, 2, 4, 8, 9, ...).
//
// Rules: every rank enters every collective (EXPECT_*, never ASSERT_*, before
// one); random inputs come from a seed drawn per run on rank 0 (or taken from
// SUMMA_TEST_SEED) mixed with the test name, so every rank can regenerate what
// any other rank used.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "summa/comm/communicator.hpp"
#include "summa/comm/counters.hpp"
#include "summa/core/error.hpp"
#include "summa/grid/placement.hpp"
#include "summa/grid/process_grid.hpp"
#include "test_util.hpp"

namespace summa {
// Readable gtest output for the grid value types.
void PrintTo(const GridShape& s, std::ostream* os) {
  *os << "{data=" << s.data << ", depth=" << s.depth << ", rows=" << s.rows << ", cols=" << s.cols
      << "}";
}
void PrintTo(const GridCoords& c, std::ostream* os) {
  *os << "(data=" << c.data << ", depth=" << c.depth << ", row=" << c.row << ", col=" << c.col
      << ")";
}
void PrintTo(const Tile& t, std::ostream* os) {
  *os << t.rows << "x" << t.cols;
}
void PrintTo(CommAxis a, std::ostream* os) {
  *os << name_of(a);
}
void PrintTo(const TrafficCounter& t, std::ostream* os) {
  *os << "{sent=" << t.bytes_sent << ", received=" << t.bytes_received << ", calls=" << t.calls
      << "}";
}
}  // namespace summa

namespace {

// Bunched placement with `ranks_per_node` ranks per node (0: detected).
summa::GridOptions bunched_options(int ranks_per_node) {
  summa::GridOptions o;
  o.placement = summa::Placement::bunched;
  o.ranks_per_node = ranks_per_node;
  return o;
}

using summa::test::mix;
using summa::test::same_on_all_ranks;
using summa::test::seed_note;
using summa::test::test_seed;

using summa::agree_on;
using summa::bunched_tile;
using summa::CommAxis;
using summa::GridCoords;
using summa::GridOptions;
using summa::GridShape;
using summa::place;
using summa::Placement;
using summa::ProcessGrid;
using summa::Tile;

constexpr std::array<CommAxis, 7> kGridAxes{CommAxis::world,    CommAxis::data,     CommAxis::depth,
                                            CommAxis::mesh_row, CommAxis::mesh_col, CommAxis::mesh,
                                            CommAxis::tensor};

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

int comm_size(MPI_Comm comm) {
  int s = 0;
  MPI_Comm_size(comm, &s);
  return s;
}

int comm_rank(MPI_Comm comm) {
  int r = 0;
  MPI_Comm_rank(comm, &r);
  return r;
}

int linear(const GridShape& s, const GridCoords& c) {
  return ((c.data * s.depth + c.depth) * s.rows + c.row) * s.cols + c.col;
}

GridCoords decode(const GridShape& s, int index) {
  GridCoords c;
  c.col = index % s.cols;
  index /= s.cols;
  c.row = index % s.rows;
  index /= s.rows;
  c.depth = index % s.depth;
  c.data = index / s.depth;
  return c;
}

bool in_range(const GridShape& s, const GridCoords& c) {
  return c.data >= 0 && c.data < s.data && c.depth >= 0 && c.depth < s.depth && c.row >= 0 &&
         c.row < s.rows && c.col >= 0 && c.col < s.cols;
}

/// Size of the axis group and this rank's position in it, from the coordinates.
struct AxisPosition {
  int size = 1;
  int rank = 0;
};

AxisPosition axis_position(CommAxis axis, const GridShape& s, const GridCoords& c) {
  switch (axis) {
    case CommAxis::world:
      return {s.size(), linear(s, c)};
    case CommAxis::data:
      return {s.data, c.data};
    case CommAxis::depth:
      return {s.depth, c.depth};
    case CommAxis::mesh_row:
      return {s.cols, c.col};
    case CommAxis::mesh_col:
      return {s.rows, c.row};
    case CommAxis::mesh:
      return {s.rows * s.cols, c.row * s.cols + c.col};
    case CommAxis::tensor:
      return {s.depth * s.rows * s.cols, (c.depth * s.rows + c.row) * s.cols + c.col};
    case CommAxis::pipe:
    case CommAxis::other:
      break;
  }
  return {};
}

/// Coordinates of the member with rank `i` in the axis group of a rank at `c`:
/// the fixed coordinates are `c`'s, the varying ones decode `i`.
GridCoords member_coords(CommAxis axis, const GridShape& s, GridCoords c, int i) {
  switch (axis) {
    case CommAxis::world:
      return decode(s, i);
    case CommAxis::data:
      c.data = i;
      break;
    case CommAxis::depth:
      c.depth = i;
      break;
    case CommAxis::mesh_row:
      c.col = i;
      break;
    case CommAxis::mesh_col:
      c.row = i;
      break;
    case CommAxis::mesh:
      c.row = i / s.cols;
      c.col = i % s.cols;
      break;
    case CommAxis::tensor:
      c.depth = i / (s.rows * s.cols);
      c.row = (i / s.cols) % s.rows;
      c.col = i % s.cols;
      break;
    case CommAxis::pipe:
    case CommAxis::other:
      break;
  }
  return c;
}

/// Coordinates of every rank of `comm`, in rank order. Collective.
std::vector<GridCoords> gather_coords(MPI_Comm comm, const GridCoords& c) {
  const int n = comm_size(comm);
  const std::array<int, 4> mine{c.data, c.depth, c.row, c.col};
  std::vector<int> all(static_cast<std::size_t>(4 * n));
  MPI_Allgather(mine.data(), 4, MPI_INT, all.data(), 4, MPI_INT, comm);
  std::vector<GridCoords> out(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    const auto k = static_cast<std::size_t>(4 * i);
    out[static_cast<std::size_t>(i)] = GridCoords{all[k], all[k + 1], all[k + 2], all[k + 3]};
  }
  return out;
}

/// True on every rank when `local` is true on every rank of `comm`. Collective.
bool all_ranks(bool local, MPI_Comm comm = MPI_COMM_WORLD) {
  int v = local ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_MIN, comm);
  return v == 1;
}

/// Runs the collective `f`; expects it to throw summa::Error on every rank of
/// `comm` with one and the same message, which it returns. Collective.
template <class F>
std::string expect_collective_error(F&& f, MPI_Comm comm = MPI_COMM_WORLD) {
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
  EXPECT_TRUE(all_ranks(outcome == 1, comm)) << "some rank did not throw summa::Error";
  EXPECT_TRUE(same_on_all_ranks(message, comm)) << "message differs between ranks: " << message;
  return message;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

/// Every ordered factorisation of n into (data, depth, rows, cols).
std::vector<GridShape> all_shapes(int n) {
  std::vector<GridShape> out;
  for (int a = 1; a <= n; ++a) {
    if (n % a) continue;
    for (int b = 1; b <= n / a; ++b) {
      if ((n / a) % b) continue;
      for (int r = 1; r <= n / a / b; ++r) {
        if ((n / a / b) % r) continue;
        out.push_back(GridShape{a, b, r, n / a / b / r});
      }
    }
  }
  return out;
}

/// Checks one axis communicator: its size and rank follow from the
/// coordinates, and its members are exactly the ranks that share the fixed
/// coordinates, in the order of the varying ones. Collective over the axis.
void check_axis(ProcessGrid& g, CommAxis axis) {
  SCOPED_TRACE(testing::Message() << "axis " << summa::name_of(axis));
  const GridShape& s = g.shape();
  const GridCoords& c = g.coords();
  const AxisPosition want = axis_position(axis, s, c);
  summa::Communicator& comm = g.comm(axis);
  EXPECT_EQ(comm.axis(), axis);
  EXPECT_EQ(comm.size(), want.size);
  EXPECT_EQ(comm.rank(), want.rank);
  EXPECT_EQ(&comm.counter(), &g.traffic()[axis]);
  const MPI_Comm native = g.native(axis);
  EXPECT_EQ(comm_size(native), comm.size());
  EXPECT_EQ(comm_rank(native), comm.rank());
  const std::vector<GridCoords> members = gather_coords(native, c);
  EXPECT_EQ(static_cast<int>(members.size()), want.size);
  for (std::size_t i = 0; i < members.size(); ++i)
    EXPECT_EQ(members[i], member_coords(axis, s, c, static_cast<int>(i)))
        << "member " << i << " of my " << summa::name_of(axis) << " group";
}

/// Checks a grid built on `parent`: shape, coordinates (a bijection onto the
/// grid, world rank = row-major index) and every axis communicator. Collective.
void check_grid(ProcessGrid& g, MPI_Comm parent, const GridShape& want) {
  SCOPED_TRACE(testing::Message() << "grid " << testing::PrintToString(want));
  EXPECT_EQ(g.shape(), want);
  EXPECT_EQ(g.size(), want.size());
  EXPECT_EQ(g.size(), comm_size(parent));
  EXPECT_EQ(g.square_mesh(), want.rows == want.cols);
  const GridCoords& c = g.coords();
  EXPECT_TRUE(in_range(want, c)) << testing::PrintToString(c);
  EXPECT_EQ(g.rank(), linear(want, c));
  EXPECT_EQ(g.world().rank(), linear(want, c));
  EXPECT_EQ(g.world().size(), want.size());

  // Bijection: the coordinates of the parent's ranks cover the grid once.
  const std::vector<GridCoords> all = gather_coords(parent, c);
  std::vector<int> seen(static_cast<std::size_t>(want.size()), 0);
  for (const GridCoords& x : all) {
    EXPECT_TRUE(in_range(want, x)) << testing::PrintToString(x);
    if (in_range(want, x)) seen[static_cast<std::size_t>(linear(want, x))] += 1;
  }
  for (std::size_t i = 0; i < seen.size(); ++i)
    EXPECT_EQ(seen[i], 1) << "grid position " << i << " held by " << seen[i] << " ranks";

  for (CommAxis axis : kGridAxes) check_axis(g, axis);
  // A grid has no communicator for the user axis.
  EXPECT_THROW((void)g.comm(CommAxis::other), summa::Error);
  EXPECT_THROW((void)g.native(CommAxis::other), summa::Error);
  // Nothing has been sent yet.
  EXPECT_EQ(g.traffic().total(), summa::TrafficCounter{});
}

// ---------------------------------------------------------------- shapes

TEST(GridShapes, EveryFactorisationOfTheWorld) {
  const int n = world_size();
  for (const GridShape& s : all_shapes(n)) {
    ProcessGrid g(MPI_COMM_WORLD, s);
    check_grid(g, MPI_COMM_WORLD, s);
    EXPECT_EQ(g.placement(), Placement::natural);
    // Natural placement keeps the parent's rank order.
    EXPECT_EQ(g.world().rank(), world_rank());
  }
}

// A plan-only grid at a rank's coordinates gives every axis the rank and
// size the real grid gives that rank, without MPI; it refuses to
// communicate, and agree() throws the local error alone.
TEST(GridShapes, PlanOnlyGridMatchesTheRealOne) {
  const int n = world_size();
  for (const GridShape& s : all_shapes(n)) {
    ProcessGrid real(MPI_COMM_WORLD, s);
    ProcessGrid plan = ProcessGrid::plan(s, real.coords());
    EXPECT_TRUE(plan.plan_only());
    EXPECT_FALSE(real.plan_only());
    EXPECT_EQ(plan.shape(), s);
    EXPECT_EQ(plan.coords(), real.coords());
    EXPECT_EQ(plan.rank(), real.rank());
    for (CommAxis axis : {CommAxis::world, CommAxis::data, CommAxis::depth, CommAxis::mesh_row,
                          CommAxis::mesh_col, CommAxis::mesh, CommAxis::tensor}) {
      SCOPED_TRACE(std::string(name_of(axis)));
      EXPECT_EQ(plan.comm(axis).rank(), real.comm(axis).rank());
      EXPECT_EQ(plan.comm(axis).size(), real.comm(axis).size());
    }
    EXPECT_EQ(plan.traffic().total(), summa::TrafficCounter{});
    float x = 1.0F;
    EXPECT_THROW(plan.tensor().all_reduce(&x, &x, 1), summa::Error);
    EXPECT_THROW(plan.world().barrier(), summa::Error);
    EXPECT_THROW(static_cast<void>(plan.native(CommAxis::world)), summa::Error);
    EXPECT_NO_THROW(plan.agree(CommAxis::world, std::nullopt));
    try {
      plan.agree(CommAxis::tensor, std::string("hidden 100 not divisible by q=3"));
      ADD_FAILURE() << "agree on a plan-only grid did not throw";
    } catch (const summa::CollectiveError& e) {
      EXPECT_STREQ(e.what(), "hidden 100 not divisible by q=3");
    }
  }
  // Bad shapes and coordinates name what was given.
  try {
    static_cast<void>(ProcessGrid::plan(GridShape{1, 1, 2, 2}, GridCoords{0, 0, 2, 0}));
    ADD_FAILURE() << "coordinates outside the grid were accepted";
  } catch (const summa::Error& e) {
    EXPECT_NE(std::string(e.what()).find("row=2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(static_cast<void>(ProcessGrid::plan(GridShape{1, 0, 2, 2}, GridCoords{})),
               summa::Error);
}

TEST(GridShapes, Mesh2dExplicitAndInferred) {
  const int n = world_size();
  int tested = 0;
  for (int data = 1; data <= n; ++data) {
    if (n % data) continue;
    const int per_mesh = n / data;
    const int q = static_cast<int>(std::lround(std::sqrt(per_mesh)));
    if (q * q != per_mesh) continue;
    const GridShape want{data, 1, q, q};
    {
      ProcessGrid g = ProcessGrid::mesh2d(MPI_COMM_WORLD, q, data);
      check_grid(g, MPI_COMM_WORLD, want);
      EXPECT_TRUE(g.square_mesh());
    }
    {
      ProcessGrid g = ProcessGrid::mesh2d(MPI_COMM_WORLD, 0, data);  // q inferred
      check_grid(g, MPI_COMM_WORLD, want);
    }
    ++tested;
  }
  EXPECT_GE(tested, 1);  // data = size always gives a 1x1 mesh
  const int q = static_cast<int>(std::lround(std::sqrt(n)));
  if (q * q == n) {
    ProcessGrid g = ProcessGrid::mesh2d(MPI_COMM_WORLD);  // all defaults
    check_grid(g, MPI_COMM_WORLD, GridShape{1, 1, q, q});
  }
}

TEST(GridShapes, Grid3dMapsGxGyGzToRowsColsDepth) {
  const int n = world_size();
  for (const GridShape& f : all_shapes(n)) {
    // Interpret the factorisation as (data, gz, gx, gy) but pass gx, gy, gz
    // with distinct roles so that a swap of axes would be visible.
    const int data = f.data, gz = f.depth, gx = f.rows, gy = f.cols;
    ProcessGrid g = ProcessGrid::grid3d(MPI_COMM_WORLD, gx, gy, gz, data);
    check_grid(g, MPI_COMM_WORLD, GridShape{data, gz, gx, gy});
  }
  ProcessGrid g = ProcessGrid::grid3d(MPI_COMM_WORLD, 1, n, 1);  // data defaults to 1
  check_grid(g, MPI_COMM_WORLD, GridShape{1, 1, 1, n});
}

TEST(GridShapes, Linear1dExplicitAndInferred) {
  const int n = world_size();
  for (int data = 1; data <= n; ++data) {
    if (n % data) continue;
    const int p = n / data;
    {
      ProcessGrid g = ProcessGrid::linear1d(MPI_COMM_WORLD, p, data);
      check_grid(g, MPI_COMM_WORLD, GridShape{data, 1, 1, p});
    }
    {
      ProcessGrid g = ProcessGrid::linear1d(MPI_COMM_WORLD, 0, data);
      check_grid(g, MPI_COMM_WORLD, GridShape{data, 1, 1, p});
    }
  }
  ProcessGrid g = ProcessGrid::linear1d(MPI_COMM_WORLD);
  check_grid(g, MPI_COMM_WORLD, GridShape{1, 1, 1, n});
}

TEST(GridShapes, OnASubCommunicatorThatIsFreedAfterwards) {
  // Split the world into groups and build a grid in each; the grid must work
  // on its own duplicate after the caller frees the communicator it was given.
  const int n = world_size();
  const int groups = n % 2 == 0 ? 2 : (n % 3 == 0 ? 3 : 1);
  const int per_group = n / groups;
  const int group = world_rank() / per_group;
  MPI_Comm sub;
  MPI_Comm_split(MPI_COMM_WORLD, group, -world_rank(), &sub);  // reversed rank order
  EXPECT_EQ(comm_size(sub), per_group);
  {
    ProcessGrid g = ProcessGrid::linear1d(sub);
    check_grid(g, sub, GridShape{1, 1, 1, per_group});
    EXPECT_EQ(g.world().rank(), comm_rank(sub));
    MPI_Comm_free(&sub);
    // Sum of world ranks over the grid's world communicator.
    double mine = static_cast<double>(world_rank()), sum = 0;
    g.world().all_reduce(&mine, &sum, 1);
    double want = 0;
    for (int r = group * per_group; r < (group + 1) * per_group; ++r) want += r;
    EXPECT_EQ(sum, want);
  }
  if (sub != MPI_COMM_NULL) MPI_Comm_free(&sub);
}

TEST(GridShapes, MovedGridKeepsItsCommunicators) {
  const int n = world_size();
  ProcessGrid a = ProcessGrid::linear1d(MPI_COMM_WORLD);
  ProcessGrid b = std::move(a);
  check_grid(b, MPI_COMM_WORLD, GridShape{1, 1, 1, n});
  ProcessGrid c = ProcessGrid::grid3d(MPI_COMM_WORLD, 1, 1, 1, n);
  c = std::move(b);
  check_grid(c, MPI_COMM_WORLD, GridShape{1, 1, 1, n});
}

// ---------------------------------------------------------------- errors

TEST(GridErrors, SizeMismatch) {
  const int n = world_size();
  const std::string ranks = std::to_string(n) + " ranks";
  for (int extra : {1, n}) {
    const GridShape bad{1, 1, 1, n + extra};
    const std::string msg = expect_collective_error([&] { ProcessGrid g(MPI_COMM_WORLD, bad); });
    EXPECT_TRUE(contains(msg, ranks)) << msg;
    EXPECT_TRUE(contains(msg, std::to_string(n + extra))) << msg;
  }
  {
    const GridShape bad{n + 1, 1, 1, 1};
    const std::string msg = expect_collective_error([&] { ProcessGrid g(MPI_COMM_WORLD, bad); });
    EXPECT_TRUE(contains(msg, ranks)) << msg;
    EXPECT_TRUE(contains(msg, "data=" + std::to_string(n + 1))) << msg;
  }
  {
    const std::string msg = expect_collective_error(
        [&] { (void)ProcessGrid::grid3d(MPI_COMM_WORLD, 2, n, 1); });  // 2n ranks
    EXPECT_TRUE(contains(msg, ranks)) << msg;
    EXPECT_TRUE(contains(msg, std::to_string(2 * n))) << msg;
  }
  {
    const std::string msg =
        expect_collective_error([&] { (void)ProcessGrid::linear1d(MPI_COMM_WORLD, n + 1); });
    EXPECT_TRUE(contains(msg, ranks)) << msg;
    EXPECT_TRUE(contains(msg, std::to_string(n + 1))) << msg;
  }
  {
    const std::string msg = expect_collective_error(
        [&] { (void)ProcessGrid::mesh2d(MPI_COMM_WORLD, n + 1); });  // (n+1)^2 ranks
    EXPECT_TRUE(contains(msg, ranks)) << msg;
    EXPECT_TRUE(contains(msg, std::to_string((n + 1) * (n + 1)))) << msg;
  }
}

TEST(GridErrors, NonPositiveAxes) {
  const int n = world_size();
  const std::array<const char*, 4> names{"data=", "depth=", "rows=", "cols="};
  for (int axis = 0; axis < 4; ++axis) {
    for (int bad : {0, -1, -n}) {
      std::array<int, 4> v{1, 1, 1, 1};
      v[static_cast<std::size_t>((axis + 1) % 4)] = n;  // the rest still multiplies to n
      v[static_cast<std::size_t>(axis)] = bad;
      const GridShape shape{v[0], v[1], v[2], v[3]};
      SCOPED_TRACE(testing::PrintToString(shape));
      const std::string msg =
          expect_collective_error([&] { ProcessGrid g(MPI_COMM_WORLD, shape); });
      EXPECT_TRUE(contains(msg, "positive")) << msg;
      EXPECT_TRUE(contains(msg, names[static_cast<std::size_t>(axis)] + std::to_string(bad)))
          << msg;
    }
  }
  // Two negative axes multiply to a positive size equal to the world's.
  const GridShape sneaky{-1, -1, 1, n};
  const std::string msg = expect_collective_error([&] { ProcessGrid g(MPI_COMM_WORLD, sneaky); });
  EXPECT_TRUE(contains(msg, "data=-1")) << msg;
  // Helpers reject their own non-positive arguments.
  for (int bad : {0, -2}) {
    const std::string d =
        expect_collective_error([&] { (void)ProcessGrid::mesh2d(MPI_COMM_WORLD, 0, bad); });
    EXPECT_TRUE(contains(d, std::to_string(bad))) << d;
    const std::string l =
        expect_collective_error([&] { (void)ProcessGrid::linear1d(MPI_COMM_WORLD, 0, bad); });
    EXPECT_TRUE(contains(l, std::to_string(bad))) << l;
    const std::string g3 =
        expect_collective_error([&] { (void)ProcessGrid::grid3d(MPI_COMM_WORLD, bad, n, 1); });
    EXPECT_TRUE(contains(g3, "rows=" + std::to_string(bad))) << g3;
  }
  const std::string q =
      expect_collective_error([&] { (void)ProcessGrid::mesh2d(MPI_COMM_WORLD, -3); });
  EXPECT_TRUE(contains(q, "-3")) << q;
  const std::string p =
      expect_collective_error([&] { (void)ProcessGrid::linear1d(MPI_COMM_WORLD, -3); });
  EXPECT_TRUE(contains(p, "-3")) << p;
  const std::string rpn = expect_collective_error([&] {
    ProcessGrid g(MPI_COMM_WORLD, GridShape{1, 1, 1, n}, bunched_options(-2));
  });
  EXPECT_TRUE(contains(rpn, "-2")) << rpn;
}

TEST(GridErrors, Mesh2dNonSquareRankCount) {
  const int n = world_size();
  int tested = 0;
  for (int data = 1; data <= n; ++data) {
    if (n % data) continue;
    const int per_mesh = n / data;
    const int q = static_cast<int>(std::lround(std::sqrt(per_mesh)));
    if (q * q == per_mesh) continue;
    SCOPED_TRACE(testing::Message() << "data=" << data);
    const std::string msg =
        expect_collective_error([&] { (void)ProcessGrid::mesh2d(MPI_COMM_WORLD, 0, data); });
    EXPECT_TRUE(contains(msg, std::to_string(per_mesh) + " ranks")) << msg;
    EXPECT_TRUE(contains(msg, std::to_string(n) + " ranks")) << msg;
    EXPECT_TRUE(contains(msg, "data=" + std::to_string(data))) << msg;
    EXPECT_TRUE(contains(msg, "square")) << msg;
    ++tested;
  }
  // Sizes 2 and 8 are not squares; 4 (data=2, 2 per mesh) and 9 (data=3) have
  // non-square splits too. Only a single rank has none.
  EXPECT_EQ(tested > 0, n > 1);
}

TEST(GridErrors, DataNotDividingRanks) {
  const int n = world_size();
  for (int data = 2; data <= n + 1; ++data) {
    if (n % data == 0) continue;
    SCOPED_TRACE(testing::Message() << "data=" << data);
    const std::string m =
        expect_collective_error([&] { (void)ProcessGrid::mesh2d(MPI_COMM_WORLD, 0, data); });
    EXPECT_TRUE(contains(m, std::to_string(n) + " ranks")) << m;
    EXPECT_TRUE(contains(m, "data=" + std::to_string(data))) << m;
    EXPECT_TRUE(contains(m, "divisible")) << m;
    const std::string l =
        expect_collective_error([&] { (void)ProcessGrid::linear1d(MPI_COMM_WORLD, 0, data); });
    EXPECT_TRUE(contains(l, std::to_string(n) + " ranks")) << l;
    EXPECT_TRUE(contains(l, "data=" + std::to_string(data))) << l;
  }
}

TEST(GridErrors, WorldStillUsableAfterErrors) {
  // After a string of rejected grids every rank is back in step.
  const int n = world_size();
  for (int i = 0; i < 3; ++i)
    (void)expect_collective_error([&] { ProcessGrid g(MPI_COMM_WORLD, GridShape{1, 1, 1, 0}); });
  ProcessGrid g = ProcessGrid::linear1d(MPI_COMM_WORLD);
  check_grid(g, MPI_COMM_WORLD, GridShape{1, 1, 1, n});
}

// ---------------------------------------------------------------- agreement

TEST(Agree, NoErrorNothingThrows) {
  EXPECT_NO_THROW(agree_on(MPI_COMM_WORLD, std::nullopt));
  ProcessGrid g = ProcessGrid::linear1d(MPI_COMM_WORLD);
  for (CommAxis axis : kGridAxes) EXPECT_NO_THROW(g.agree(axis, std::nullopt));
}

TEST(Agree, OnlyLastRankFails) {
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  const int n = world_size();
  const int last = n - 1;
  std::mt19937 gen(static_cast<std::uint32_t>(seed));
  const std::string expected =
      "rank " + std::to_string(last) + " found problem #" + std::to_string(gen());
  std::optional<std::string> local;
  if (world_rank() == last) local = expected;
  const std::string msg = expect_collective_error([&] { agree_on(MPI_COMM_WORLD, local); });
  EXPECT_EQ(msg, expected);
}

TEST(Agree, LowestFailingRankWins) {
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  const int n = world_size();
  const int r = world_rank();
  auto message_of = [&](int rank) {
    std::mt19937 gen(static_cast<std::uint32_t>(mix(seed + static_cast<std::uint64_t>(rank))));
    return "problem " + std::to_string(gen()) + " on rank " + std::to_string(rank);
  };
  // Ranks in the upper half (and the last) fail; the lowest of them is n/2.
  std::optional<std::string> local;
  if (r >= n / 2) local = message_of(r);
  std::string msg = expect_collective_error([&] { agree_on(MPI_COMM_WORLD, local); });
  EXPECT_EQ(msg, message_of(n / 2));
  // Every rank fails with its own message: rank 0's wins.
  msg = expect_collective_error([&] { agree_on(MPI_COMM_WORLD, message_of(r)); });
  EXPECT_EQ(msg, message_of(0));
  // An empty message is still an error.
  local.reset();
  if (r == n - 1) local = std::string();
  msg = expect_collective_error([&] { agree_on(MPI_COMM_WORLD, local); });
  EXPECT_EQ(msg, "");
}

TEST(Agree, PerAxisOfAGrid) {
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  const int n = world_size();
  // The factorisation with the most non-trivial axes, so that groups differ.
  GridShape shape{1, 1, 1, n};
  auto nontrivial = [](const GridShape& s) {
    return (s.data > 1) + (s.depth > 1) + (s.rows > 1) + (s.cols > 1);
  };
  for (const GridShape& s : all_shapes(n))
    if (nontrivial(s) > nontrivial(shape)) shape = s;
  ProcessGrid g(MPI_COMM_WORLD, shape);
  const GridCoords me = g.coords();
  auto message_of = [&](CommAxis axis, int world) {
    std::mt19937 gen(static_cast<std::uint32_t>(
        mix(seed ^ (static_cast<std::uint64_t>(world) << 8) ^ static_cast<std::uint64_t>(axis))));
    return std::string(summa::name_of(axis)) + " failure " + std::to_string(gen()) +
           " at world rank " + std::to_string(world);
  };
  for (CommAxis axis : kGridAxes) {
    SCOPED_TRACE(testing::Message() << "axis " << summa::name_of(axis));
    const int ga = g.comm(axis).size();
    const int ra = g.comm(axis).rank();
    // Only the last member of each group fails.
    std::optional<std::string> local;
    if (ra == ga - 1) local = message_of(axis, g.rank());
    const GridCoords last = member_coords(axis, shape, me, ga - 1);
    std::string msg = expect_collective_error([&] { g.agree(axis, local); }, g.native(axis));
    EXPECT_EQ(msg, message_of(axis, linear(shape, last)));
    // The upper half fails: member ga/2 wins.
    local.reset();
    if (ra >= ga / 2) local = message_of(axis, g.rank());
    const GridCoords mid = member_coords(axis, shape, me, ga / 2);
    msg = expect_collective_error([&] { g.agree(axis, local); }, g.native(axis));
    EXPECT_EQ(msg, message_of(axis, linear(shape, mid)));
    EXPECT_NO_THROW(g.agree(axis, std::nullopt));
  }
  EXPECT_EQ(g.traffic().total(), summa::TrafficCounter{});  // control traffic is not counted
}

// ---------------------------------------------------------------- placement (pure)

bool tile_fits(int rows, int cols, int rpn, const Tile& t) {
  return t.rows > 0 && t.cols > 0 && t.rows * t.cols == rpn && rows % t.rows == 0 &&
         cols % t.cols == 0;
}

TEST(Placement, BunchedTileExamples) {
  auto is = [](const Tile& t, int r, int c) { return t.rows == r && t.cols == c; };
  EXPECT_PRED3(is, bunched_tile(4, 4, 4), 2, 2);
  const Tile t448 = bunched_tile(4, 4, 8);
  EXPECT_TRUE(is(t448, 2, 4) || is(t448, 4, 2)) << testing::PrintToString(t448);
  EXPECT_PRED3(is, bunched_tile(3, 3, 4), 0, 0);
  const Tile t222 = bunched_tile(2, 2, 2);
  EXPECT_TRUE(is(t222, 1, 2) || is(t222, 2, 1)) << testing::PrintToString(t222);
  EXPECT_PRED3(is, bunched_tile(4, 4, 16), 4, 4);
  EXPECT_PRED3(is, bunched_tile(4, 4, 1), 1, 1);
  EXPECT_PRED3(is, bunched_tile(6, 4, 6), 3, 2);
  EXPECT_PRED3(is, bunched_tile(2, 8, 4), 2, 2);
  EXPECT_PRED3(is, bunched_tile(1, 8, 4), 1, 4);
  EXPECT_PRED3(is, bunched_tile(8, 1, 4), 4, 1);
  EXPECT_PRED3(is, bunched_tile(3, 3, 3), 1, 3);  // or 3x1: both tie; 1x3 comes first
  EXPECT_PRED3(is, bunched_tile(4, 4, 32), 0, 0);
  EXPECT_PRED3(is, bunched_tile(3, 3, 2), 0, 0);
  EXPECT_PRED3(is, bunched_tile(0, 4, 4), 0, 0);
  EXPECT_PRED3(is, bunched_tile(4, -4, 4), 0, 0);
  EXPECT_PRED3(is, bunched_tile(4, 4, 0), 0, 0);
  EXPECT_PRED3(is, bunched_tile(4, 4, -2), 0, 0);
}

TEST(Placement, BunchedTileIsTheMostSquareThatFits) {
  for (int rows = 1; rows <= 12; ++rows)
    for (int cols = 1; cols <= 12; ++cols)
      for (int rpn = 1; rpn <= 40; ++rpn) {
        int best = -1;  // smallest |tr - tc| of any tile that fits
        for (int tr = 1; tr <= rpn; ++tr)
          if (rpn % tr == 0 && rows % tr == 0 && cols % (rpn / tr) == 0) {
            const int d = std::abs(tr - rpn / tr);
            if (best < 0 || d < best) best = d;
          }
        const Tile t = bunched_tile(rows, cols, rpn);
        SCOPED_TRACE(testing::Message() << rows << "x" << cols << " rpn=" << rpn);
        if (best < 0) {
          EXPECT_EQ(t.rows, 0);
          EXPECT_EQ(t.cols, 0);
        } else {
          EXPECT_TRUE(tile_fits(rows, cols, rpn, t)) << testing::PrintToString(t);
          EXPECT_EQ(std::abs(t.rows - t.cols), best) << testing::PrintToString(t);
        }
      }
}

TEST(Placement, NaturalIsRowMajorForAnyNodeSize) {
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937 gen(static_cast<std::uint32_t>(seed));
  std::uniform_int_distribution<int> axis(1, 5);
  for (int trial = 0; trial < 50; ++trial) {
    const GridShape s{axis(gen), axis(gen), axis(gen), axis(gen)};
    SCOPED_TRACE(testing::PrintToString(s));
    const std::vector<GridCoords> p = place(s, Placement::natural, 1);
    EXPECT_EQ(static_cast<int>(p.size()), s.size());
    for (int slot = 0; slot < static_cast<int>(p.size()); ++slot) {
      const GridCoords& c = p[static_cast<std::size_t>(slot)];
      EXPECT_EQ(c, decode(s, slot)) << "slot " << slot;
      EXPECT_EQ(linear(s, c), slot);
    }
    for (int rpn : {2, 3, 4, s.rows * s.cols, s.size() + 1})
      EXPECT_EQ(place(s, Placement::natural, rpn), p) << "rpn=" << rpn;
  }
}

/// Checks place(s, bunched, rpn): a bijection onto the grid; when a tile fits
/// and a node is smaller than a plane, each node's slots form one aligned
/// tr x tc rectangle in one mesh plane; otherwise the natural order.
void check_bunched(const GridShape& s, int rpn) {
  SCOPED_TRACE(testing::Message() << testing::PrintToString(s) << " rpn=" << rpn);
  const std::vector<GridCoords> p = place(s, Placement::bunched, rpn);
  EXPECT_EQ(static_cast<int>(p.size()), s.size());
  std::vector<int> seen(static_cast<std::size_t>(s.size()), 0);
  for (const GridCoords& c : p) {
    EXPECT_TRUE(in_range(s, c)) << testing::PrintToString(c);
    if (in_range(s, c)) seen[static_cast<std::size_t>(linear(s, c))] += 1;
  }
  for (int v : seen) EXPECT_EQ(v, 1);
  const int plane = s.rows * s.cols;
  const Tile t = bunched_tile(s.rows, s.cols, rpn);
  if (rpn >= plane || t.rows == 0) {
    EXPECT_EQ(p, place(s, Placement::natural, rpn));
    return;
  }
  EXPECT_EQ(s.size() % rpn, 0);
  for (int node = 0; node < s.size() / rpn; ++node) {
    const GridCoords& first = p[static_cast<std::size_t>(node * rpn)];
    int r0 = first.row, c0 = first.col;
    for (int k = 0; k < rpn; ++k) {
      const GridCoords& c = p[static_cast<std::size_t>(node * rpn + k)];
      EXPECT_EQ(c.data, first.data) << "node " << node;
      EXPECT_EQ(c.depth, first.depth) << "node " << node;
      r0 = std::min(r0, c.row);
      c0 = std::min(c0, c.col);
    }
    EXPECT_EQ(r0 % t.rows, 0) << "node " << node;
    EXPECT_EQ(c0 % t.cols, 0) << "node " << node;
    for (int k = 0; k < rpn; ++k) {
      const GridCoords& c = p[static_cast<std::size_t>(node * rpn + k)];
      // rpn distinct positions inside a tr x tc box: exactly the box.
      EXPECT_TRUE(c.row >= r0 && c.row < r0 + t.rows && c.col >= c0 && c.col < c0 + t.cols)
          << "node " << node << " slot " << node * rpn + k << " at " << testing::PrintToString(c)
          << " outside its " << t.rows << "x" << t.cols << " tile";
    }
  }
}

TEST(Placement, BunchedNodesAreTiles) {
  // The Optimus example: a 4x4 mesh with 4 ranks per node is four 2x2 tiles.
  const GridShape s44{1, 1, 4, 4};
  const std::vector<GridCoords> p = place(s44, Placement::bunched, 4);
  const std::array<GridCoords, 4> node1{GridCoords{0, 0, 0, 2}, GridCoords{0, 0, 0, 3},
                                        GridCoords{0, 0, 1, 2}, GridCoords{0, 0, 1, 3}};
  for (std::size_t k = 0; k < 4; ++k) EXPECT_EQ(p[4 + k], node1[k]);
  EXPECT_EQ(p[15], (GridCoords{0, 0, 3, 3}));

  for (int data = 1; data <= 3; ++data)
    for (int depth = 1; depth <= 2; ++depth)
      for (int rows = 1; rows <= 6; ++rows)
        for (int cols = 1; cols <= 6; ++cols)
          for (int rpn = 1; rpn <= rows * cols + 1; ++rpn)
            check_bunched(GridShape{data, depth, rows, cols}, rpn);
}

TEST(Placement, RejectsNonPositiveShapes) {
  EXPECT_THROW((void)place(GridShape{0, 1, 1, 1}, Placement::natural, 1), summa::Error);
  EXPECT_THROW((void)place(GridShape{1, -1, 2, 2}, Placement::bunched, 2), summa::Error);
  EXPECT_THROW((void)place(GridShape{-1, -1, 2, 2}, Placement::bunched, 2), summa::Error);
  EXPECT_THROW((void)place(GridShape{1, 1, 2, 0}, Placement::natural, 2), summa::Error);
}

// ---------------------------------------------------------------- placement (MPI)

TEST(GridPlacement, EmulatedNodesEveryShapeAndNodeSize) {
  const int n = world_size();
  const int me = world_rank();
  for (const GridShape& s : all_shapes(n)) {
    for (int rpn = 1; rpn <= n + 1; ++rpn) {
      SCOPED_TRACE(testing::Message() << testing::PrintToString(s) << " rpn=" << rpn);
      ProcessGrid g(MPI_COMM_WORLD, s, bunched_options(rpn));
      check_grid(g, MPI_COMM_WORLD, s);
      // A node size that does not divide the ranks describes uneven nodes;
      // only what holds either way is checked for it.
      const bool even = n % rpn == 0;
      if (even) {
        EXPECT_EQ(g.ranks_per_node(), rpn);
      }
      // Slot = world rank (node = rank / rpn, local = rank % rpn).
      EXPECT_EQ(g.coords(), place(s, Placement::bunched, rpn)[static_cast<std::size_t>(me)]);
      const int plane = s.rows * s.cols;
      const Tile t = bunched_tile(s.rows, s.cols, rpn);
      const std::string& note = g.placement_note();
      if (rpn < plane && t.rows == 0) {
        // Falls back to natural, and says why.
        EXPECT_EQ(g.placement(), Placement::natural);
        EXPECT_EQ(g.coords(), decode(s, me));
        EXPECT_FALSE(note.empty());
        if (even) {
          EXPECT_TRUE(contains(note, std::to_string(rpn) + " ranks per node")) << note;
          EXPECT_TRUE(contains(note, std::to_string(s.rows) + "x" + std::to_string(s.cols)))
              << note;
          EXPECT_TRUE(contains(note, "tile")) << note;
        }
      } else if (rpn < plane) {
        EXPECT_EQ(g.placement(), Placement::bunched);
        EXPECT_TRUE(contains(note, "bunched")) << note;
        EXPECT_TRUE(contains(note, std::to_string(rpn))) << note;
      } else {
        // Whole planes per node: bunched is the natural order.
        EXPECT_EQ(g.coords(), decode(s, me));
        EXPECT_FALSE(note.empty());
      }
      EXPECT_TRUE(same_on_all_ranks(note)) << note;
      int placement = static_cast<int>(g.placement());
      EXPECT_TRUE(same_on_all_ranks(std::to_string(placement)));
    }
  }
}

TEST(GridPlacement, BunchedReallyReordersRanks) {
  // Every (shape, node size) at this world size where bunched differs from
  // row-major: the grid must use the bunched coordinates, not the natural ones.
  const int n = world_size();
  const int me = world_rank();
  int tested = 0;
  for (const GridShape& s : all_shapes(n))
    for (int rpn = 1; rpn <= n; ++rpn) {
      const std::vector<GridCoords> bunched = place(s, Placement::bunched, rpn);
      if (bunched == place(s, Placement::natural, rpn)) continue;
      SCOPED_TRACE(testing::Message() << testing::PrintToString(s) << " rpn=" << rpn);
      ProcessGrid g(MPI_COMM_WORLD, s, bunched_options(rpn));
      check_grid(g, MPI_COMM_WORLD, s);
      EXPECT_EQ(g.placement(), Placement::bunched);
      EXPECT_EQ(g.coords(), bunched[static_cast<std::size_t>(me)]);
      // Some rank sits elsewhere than in row-major order.
      EXPECT_FALSE(all_ranks(g.coords() == decode(s, me)));
      ++tested;
    }
  if (n == 8) {
    // A 2x4 mesh with 4 ranks per node is two 2x2 tiles.
    ProcessGrid g(MPI_COMM_WORLD, GridShape{1, 1, 2, 4}, bunched_options(4));
    const std::array<GridCoords, 8> want{GridCoords{0, 0, 0, 0}, GridCoords{0, 0, 0, 1},
                                         GridCoords{0, 0, 1, 0}, GridCoords{0, 0, 1, 1},
                                         GridCoords{0, 0, 0, 2}, GridCoords{0, 0, 0, 3},
                                         GridCoords{0, 0, 1, 2}, GridCoords{0, 0, 1, 3}};
    EXPECT_EQ(g.placement(), Placement::bunched);
    EXPECT_EQ(g.coords(), want[static_cast<std::size_t>(me)]);
    EXPECT_EQ(g.world().rank(), linear(g.shape(), want[static_cast<std::size_t>(me)]));
    EXPECT_GE(tested, 1);
  }
  if (n % 2 == 0 && n >= 4) {
    // Data-parallel 2 x mesh with nodes of 2 (at 8: 2 x 2x2; at 4: 2 x 1x2).
    const int q = n / 2 == 4 ? 2 : 1;
    const GridShape s{2, 1, q, n / 2 / q};
    ProcessGrid d(MPI_COMM_WORLD, s, bunched_options(2));
    check_grid(d, MPI_COMM_WORLD, s);
    EXPECT_EQ(d.placement(), Placement::bunched);
    EXPECT_EQ(d.coords(), place(s, Placement::bunched, 2)[static_cast<std::size_t>(me)]);
    ++tested;
  }
  if (n == 4) {
    // A 2x2 mesh with nodes of 2: one node per mesh row.
    ProcessGrid m = ProcessGrid::mesh2d(MPI_COMM_WORLD, 2, 1, bunched_options(2));
    EXPECT_EQ(m.placement(), Placement::bunched);
    EXPECT_EQ(m.coords(), place(m.shape(), Placement::bunched, 2)[static_cast<std::size_t>(me)]);
    EXPECT_EQ(m.coords().row, me / 2);
    ++tested;
  }
  if (tested == 0) GTEST_SKIP() << "no bunched layout to check at " << n << " ranks";
}

TEST(GridPlacement, FallbackWhenNodesDoNotTile) {
  // Every plane of this world size that some node size (smaller than the
  // plane) fails to tile, e.g. 3x3 with nodes of 2 or 4 at 9 ranks.
  const int n = world_size();
  const int me = world_rank();
  int tested = 0;
  for (const GridShape& s : all_shapes(n)) {
    const int plane = s.rows * s.cols;
    for (int rpn = 2; rpn < plane; ++rpn) {
      if (bunched_tile(s.rows, s.cols, rpn).rows != 0) continue;
      SCOPED_TRACE(testing::Message() << testing::PrintToString(s) << " rpn=" << rpn);
      ProcessGrid g(MPI_COMM_WORLD, s, bunched_options(rpn));
      EXPECT_EQ(g.placement(), Placement::natural);
      EXPECT_EQ(g.coords(), decode(s, me));
      EXPECT_EQ(g.world().rank(), me);
      EXPECT_FALSE(g.placement_note().empty());
      check_grid(g, MPI_COMM_WORLD, s);
      ++tested;
    }
  }
  if (n == 9) {
    // 3x3 with nodes of 2 (which do not even divide 9): natural, with a note.
    ProcessGrid g = ProcessGrid::mesh2d(MPI_COMM_WORLD, 3, 1, bunched_options(2));
    EXPECT_EQ(g.placement(), Placement::natural);
    EXPECT_EQ(g.coords(), decode(g.shape(), me));
    EXPECT_FALSE(g.placement_note().empty());
    check_grid(g, MPI_COMM_WORLD, g.shape());
    // Nodes of 3 are 1x3 tiles, i.e. mesh rows: bunched, and the row-major order.
    ProcessGrid h = ProcessGrid::mesh2d(MPI_COMM_WORLD, 3, 1, bunched_options(3));
    EXPECT_EQ(h.placement(), Placement::bunched);
    EXPECT_EQ(h.coords(), decode(h.shape(), me));  // a 1x3 tile is a mesh row
    EXPECT_TRUE(contains(h.placement_note(), "3 ranks per node")) << h.placement_note();
  }
  if (tested == 0) GTEST_SKIP() << "no plane of " << n << " ranks that a node size fails to tile";
}

TEST(GridPlacement, DetectedNodeSize) {
  // ranks_per_node = 0 detects nodes with MPI_Comm_split_type.
  const int n = world_size();
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank(), MPI_INFO_NULL, &node);
  int local = comm_size(node);
  MPI_Comm_free(&node);
  int lo = local, hi = local;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  const int expected = lo == hi ? lo : 0;
  ProcessGrid g = ProcessGrid::linear1d(MPI_COMM_WORLD, 0, 1, bunched_options(0));
  check_grid(g, MPI_COMM_WORLD, GridShape{1, 1, 1, n});
  EXPECT_EQ(g.ranks_per_node(), expected);
  EXPECT_FALSE(g.placement_note().empty());
  ProcessGrid natural = ProcessGrid::linear1d(MPI_COMM_WORLD);
  EXPECT_EQ(natural.placement(), Placement::natural);
  EXPECT_EQ(natural.ranks_per_node(), expected);
}

}  // namespace

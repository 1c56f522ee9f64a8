#pragma once
// Helpers shared by the test binaries: fresh random data agreed across ranks,
// local blocks with any storage order and padding (and their copies in the
// test backend's memory), message agreement checks.

#include <gtest/gtest.h>
#include <mpi.h>

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "summa/summa.hpp"
#include "test_backend_env.hpp"

namespace summa::test {

template <class T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;

/// splitmix64 finaliser.
inline std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

inline std::uint64_t hash_string(const std::string& s) {
  std::uint64_t h = 1469598103934665603ULL;  // FNV-1a
  for (char ch : s) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ULL;
  return h;
}

/// The ranks the current case runs on: MPI_COMM_WORLD, or the group's
/// communicator inside for_each_group. The helpers below that agree across
/// ranks (test_seed, fresh_seed, max_over_ranks, norm_error_over_ranks,
/// same_on_all_ranks) are collective over it.
inline MPI_Comm& test_comm() {
  static MPI_Comm comm = MPI_COMM_WORLD;
  return comm;
}

/// The base each seed below came from (SUMMA_TEST_SEED or a random draw),
/// by seed: seed_note names the base that reproduces a seed.
inline std::map<std::uint64_t, unsigned long long>& seed_bases() {
  static std::map<std::uint64_t, unsigned long long> bases;
  return bases;
}

inline std::string current_test_name() {
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  return info ? std::string(info->test_suite_name()) + "." + info->name() : std::string();
}

/// Seed of the current test, identical on every rank: from SUMMA_TEST_SEED if
/// set (to reproduce a failure), otherwise from a fresh base drawn on rank 0
/// for every call; mixed with the test's name. Collective over test_comm().
inline std::uint64_t test_seed() {
  int rank = 0;
  MPI_Comm_rank(test_comm(), &rank);
  unsigned long long base = 0;
  if (rank == 0) {
    if (const char* env = std::getenv("SUMMA_TEST_SEED"))
      base = std::strtoull(env, nullptr, 0);
    else
      base =
          (static_cast<unsigned long long>(std::random_device{}()) << 32) ^ std::random_device{}();
  }
  MPI_Bcast(&base, 1, MPI_UNSIGNED_LONG_LONG, 0, test_comm());
  const std::uint64_t seed = mix(base ^ hash_string(current_test_name()));
  seed_bases()[seed] = base;
  return seed;
}

/// A new seed for each call (fresh data every time), the same on every rank:
/// the k-th call of a test mixes k into test_seed(), so SUMMA_TEST_SEED set to
/// the base seed_note prints gives that call the same seed again (whatever
/// other tests ran before it). Collective.
inline std::uint64_t fresh_seed() {
  // The call count is per process and per test, and ranks that sat out a
  // for_each_group phase have counted fewer calls: rank 0's seed is
  // everyone's (rank 0 takes part in every phase).
  static std::string test;
  static std::uint64_t calls = 0;
  if (const std::string name = current_test_name(); name != test) {
    test = name;
    calls = 0;
  }
  const std::uint64_t from = test_seed();
  unsigned long long seed = mix(from + ++calls);
  unsigned long long base = seed_bases()[from];
  MPI_Bcast(&seed, 1, MPI_UNSIGNED_LONG_LONG, 0, test_comm());
  MPI_Bcast(&base, 1, MPI_UNSIGNED_LONG_LONG, 0, test_comm());
  seed_bases()[seed] = base;
  return seed;
}

/// "test seed S (rerun with SUMMA_TEST_SEED=B to reproduce)": B is the base
/// S came from (test_seed or fresh_seed).
inline std::string seed_note(std::uint64_t seed) {
  const auto it = seed_bases().find(seed);
  return "test seed " + std::to_string(seed) + " (rerun with SUMMA_TEST_SEED=" +
         (it == seed_bases().end() ? std::string("?") : std::to_string(it->second)) +
         " to reproduce)";
}

template <class T>
Mat<T> random_matrix(index_t rows, index_t cols, std::mt19937_64& gen) {
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  Mat<T> m(rows, cols);
  for (index_t j = 0; j < cols; ++j)
    for (index_t i = 0; i < rows; ++i) m(i, j) = static_cast<T>(dist(gen));
  return m;
}

/// A local matrix stored in its own buffer with the given order and `pad`
/// extra elements on the leading dimension (so ld > the minimum).
template <class T>
class Block {
 public:
  Block(index_t rows, index_t cols, Order order, index_t pad)
      : rows_(rows), cols_(cols), order_(order) {
    ld_ = (order == Order::col_major ? rows : cols) + pad;
    if (ld_ < 1) ld_ = 1;
    const index_t outer = order == Order::col_major ? cols : rows;
    storage_.assign(static_cast<std::size_t>(ld_ * (outer > 0 ? outer : 1)), T(0));
  }
  MatrixView<T> view() { return MatrixView<T>(storage_.data(), rows_, cols_, ld_, order_); }
  void fill(const Mat<T>& m) {
    auto v = view();
    for (index_t j = 0; j < cols_; ++j)
      for (index_t i = 0; i < rows_; ++i) v(i, j) = m(i, j);
  }
  void fill_value(T x) {
    auto v = view();
    for (index_t j = 0; j < cols_; ++j)
      for (index_t i = 0; i < rows_; ++i) v(i, j) = x;
  }
  Mat<T> read() {
    Mat<T> m(rows_, cols_);
    auto v = view();
    for (index_t j = 0; j < cols_; ++j)
      for (index_t i = 0; i < rows_; ++i) m(i, j) = v(i, j);
    return m;
  }
  /// Padding elements (outside the view) are untouched sentinels.
  std::vector<T>& storage() { return storage_; }

 private:
  index_t rows_, cols_, ld_;
  Order order_;
  std::vector<T> storage_;
};

/// A Block's storage (padding included) in test_backend()'s memory: the
/// host block's contents are uploaded at construction, view() is the same
/// shape, order and leading dimension in backend memory, and download()
/// copies the whole storage back into the host block (so padding sentinels
/// set on the host can be checked there).
template <class T>
class DeviceBlock {
 public:
  explicit DeviceBlock(Block<T>& host) : host_(&host), array_(host.storage()) {}
  MatrixView<T> view() const {
    const MatrixView<T> h = host_->view();
    return MatrixView<T>(array_.data(), h.rows, h.cols, h.ld, h.order);
  }
  /// Backend storage -> the host block; returns it.
  Block<T>& download() {
    host_->storage() = array_.download();
    return *host_;
  }

 private:
  Block<T>* host_;
  DeviceArray<T> array_;
};

/// A dense rows x cols matrix in test_backend()'s memory, stored in `order`.
template <class T>
class DeviceMat {
 public:
  /// Storage filled with `fill` (NaN by default: outputs that
  /// must be written).
  DeviceMat(index_t rows, index_t cols, Order order = Order::col_major,
            T fill = std::numeric_limits<T>::quiet_NaN())
      : rows_(rows), cols_(cols), order_(order), array_(static_cast<std::size_t>(rows * cols)) {
    if (array_.size() > 0) array_.upload(std::vector<T>(array_.size(), fill));
  }
  /// A copy of an Eigen matrix (its own storage order).
  template <class Derived>
  explicit DeviceMat(const Eigen::PlainObjectBase<Derived>& m)
      : rows_(m.rows()),
        cols_(m.cols()),
        order_(Derived::IsRowMajor ? Order::row_major : Order::col_major),
        array_(std::vector<T>(m.data(), m.data() + m.size())) {}
  MatrixView<T> view() const { return MatrixView<T>::dense(array_.data(), rows_, cols_, order_); }
  T* data() const { return array_.data(); }
  /// The contents on the host as an Eigen matrix M (M's storage order must
  /// be this matrix's order).
  template <class M = Mat<T>>
  M read() const {
    if ((M::IsRowMajor ? Order::row_major : Order::col_major) != order_ && rows_ > 1 && cols_ > 1)
      throw Error("DeviceMat::read: storage order differs from the matrix type's");
    const std::vector<T> host = array_.download();
    return Eigen::Map<const M>(host.data(), rows_, cols_);
  }

 private:
  index_t rows_, cols_;
  Order order_;
  DeviceArray<T> array_;
};

/// True on a backend whose memory the host cannot read (CUDA, or the CPU
/// emulating a device): tests read results through download().
/// Allocation-counting tests skip on asynchronous backends only (the CUDA
/// runtime allocates on its own); the emulation counts like the CPU.
inline bool device_backend() {
  return !test_backend().host_accessible();
}

/// A q x q mesh on MPI_COMM_WORLD with test_backend() (SUMMA_TEST_BACKEND),
/// its communicators (test_grid_options()) and a SUMMA engine, built once per
/// test binary (q from the rank count).
struct MeshEnv {
  Backend& backend = test_backend();  // first: selects the rank's device
  ProcessGrid grid = ProcessGrid::mesh2d(MPI_COMM_WORLD, 0, 1, test_grid_options());
  SummaEngine engine{grid, backend, {.panel = 5, .overlap = true}};
};
inline MeshEnv& mesh_env() {
  static MeshEnv e;
  return e;
}

/// The step arenas of a layer (or model) sized from its declared needs.
struct Arenas {
  Arena workspace, forward, backward;
  StepBuffers step{workspace, forward, backward};
  Arenas(Backend& b, const BufferNeeds& n)
      : workspace("workspace", b, n.workspace),
        forward("forward", b, n.forward),
        backward("backward", b, n.backward) {}
};

/// Block (i, j) of a global matrix split into q x q equal blocks.
template <class T>
Mat<T> block_of(const Mat<T>& g, int q, int i, int j) {
  return g.block(i * g.rows() / q, j * g.cols() / q, g.rows() / q, g.cols() / q);
}

/// Maximum of `local` over test_comm(). Collective.
inline double max_over_ranks(double local) {
  MPI_Allreduce(MPI_IN_PLACE, &local, 1, MPI_DOUBLE, MPI_MAX, test_comm());
  return local;
}

/// max |a - b| / max |b| over two equally long sequences (max |a - b| when b
/// is all zero): the relative error of a whole tensor.
template <class A, class B>
double rel_error(const A& a, const B& b) {
  double diff = 0, scale = 0;
  for (std::size_t k = 0; k < b.size(); ++k) {
    diff = std::max(diff, std::abs(static_cast<double>(a[k]) - static_cast<double>(b[k])));
    scale = std::max(scale, std::abs(static_cast<double>(b[k])));
  }
  return scale > 0 ? diff / scale : diff;
}

/// The elements of a view, row by row.
template <class T>
std::vector<T> read(ConstMatrixView<T> v) {
  std::vector<T> out;
  for (index_t r = 0; r < v.rows; ++r)
    for (index_t c = 0; c < v.cols; ++c) out.push_back(v(r, c));
  return out;
}

/// Tolerance of the layer and model tests (max relative error of a tensor
/// against the serial reference): 1e-9 in double, 2e-3 in float; see
/// tests/layers/test_scheme_layers.cpp for the reasoning.
template <class T>
double model_tolerance() {
  return std::is_same_v<T, float> ? 2e-3 : 1e-9;
}

// ---- bf16 (mixed precision) tests: errors norm-wise, in units of bf16's unit
// roundoff, against the double reference run on bf16-rounded weights.

/// bf16's unit roundoff u = 2^-8.
inline constexpr double kBf16Unit = 0x1p-8;

/// Rounds every value to the nearest bf16 (through float, as bf16(double)).
template <class T>
void round_to_bf16(std::span<T> values) {
  for (T& v : values) v = static_cast<T>(bf16(v));
}

inline std::vector<bf16> to_bf16(const std::vector<double>& v) {
  std::vector<bf16> out(v.size());
  std::transform(v.begin(), v.end(), out.begin(), [](double x) { return bf16(x); });
  return out;
}

/// ||a - b||_2 / ||b||_2 (||a - b||_2 when b is zero) of two equally long
/// sequences: the norm-wise relative error of a whole tensor.
template <class A, class B>
double norm_error(const A& a, const B& b) {
  double diff = 0, ref = 0;
  for (std::size_t k = 0; k < b.size(); ++k) {
    const double d = static_cast<double>(a[k]) - static_cast<double>(b[k]);
    diff += d * d;
    ref += static_cast<double>(b[k]) * static_cast<double>(b[k]);
  }
  return ref > 0 ? std::sqrt(diff / ref) : std::sqrt(diff);
}

/// The same for a tensor spread over the ranks of test_comm(): each rank
/// passes its local elements and the reference's for the same global
/// elements. Every global element must be held by equally many ranks, so that
/// the sums of squares over the ranks give the global tensor's ratio.
/// Collective.
template <class A, class B>
double norm_error_over_ranks(const A& a, const B& b) {
  double s[2] = {0, 0};
  for (std::size_t k = 0; k < b.size(); ++k) {
    const double d = static_cast<double>(a[k]) - static_cast<double>(b[k]);
    s[0] += d * d;
    s[1] += static_cast<double>(b[k]) * static_cast<double>(b[k]);
  }
  MPI_Allreduce(MPI_IN_PLACE, s, 2, MPI_DOUBLE, MPI_SUM, test_comm());
  return s[1] > 0 ? std::sqrt(s[0] / s[1]) : std::sqrt(s[0]);
}

/// Twice the smallest batch every scheme in `specs` can split (the lcm of
/// their batch_granularity): every split of the batch holds at least two
/// sequences, at the least compute (a fixed batch of 72, divisible under
/// every rank count, costs 4 to 9 times more at 4, 8 and 9 ranks).
inline index_t common_batch(const std::vector<SchemeSpec>& specs) {
  index_t b = 1;
  for (const SchemeSpec& s : specs) b = std::lcm(b, batch_granularity(s));
  return 2 * b;
}

/// A covering subset of schemes_for(ranks), for the tests whose subject is
/// not the schemes' algebra (generation, the optimizer, checkpoints, the
/// Hugging Face bridge, a user's own model): without a data axis, every
/// family the rank count has (1D; 2D where it is a square; the 3D grid with
/// the most axes above 1, the first such in schemes_for's order); with a
/// data axis, one scheme per data factor D > 1 (3D, 2D and 1D taken in turn,
/// the next one the tensor group allows; a 3D grid again with the most axes
/// above 1), and the first data × 2D with q > 1 where there is one. So
/// q = 1, 2 and 3, every family and every data factor are kept: 29 schemes
/// of 8 ranks become 6, 17 of 9 become 5 (1D in its plain form: sp=on is added by
/// with_sequence_parallel where a test wants it). Every scheme of every rank count is checked
/// against the serial reference by schemes_np9 and scheme_layers_np* (schemes_for itself), and its
/// bytes by traffic_np9.
inline std::vector<SchemeSpec> representative_schemes(int ranks) {
  const std::vector<SchemeSpec> all = schemes_for(ranks);
  const auto axes = [](const SchemeSpec& s) {
    if (!s.holds<Axonn3DSpec>()) return 0;
    const Axonn3DSpec& g = s.as<Axonn3DSpec>();
    return (g.gx > 1) + (g.gy > 1) + (g.gz > 1);
  };
  // the first scheme of `family` and `data` (3D: the most axes above 1)
  const auto pick = [&](std::string_view family, int data) -> const SchemeSpec* {
    const SchemeSpec* best = nullptr;
    for (const SchemeSpec& s : all)
      if (s.scheme == family && s.data == data && (!best || axes(s) > axes(*best))) best = &s;
    return best;
  };
  std::vector<SchemeSpec> out;
  const auto add = [&](const SchemeSpec* s) {
    if (s && std::find(out.begin(), out.end(), *s) == out.end()) out.push_back(*s);
  };
  for (const std::string_view family : {"1d", "2d", "3d"}) add(pick(family, 1));
  static constexpr std::string_view turn[] = {"3d", "2d", "1d"};
  int k = 0;
  for (int data = 2; data <= ranks; ++data) {
    if (ranks % data != 0) continue;
    for (int t = 0; t < 3; ++t)
      if (const SchemeSpec* s = pick(turn[(k + t) % 3], data)) {
        add(s);
        break;
      }
    ++k;
  }
  for (const SchemeSpec& s : all)
    if (s.scheme == "2d" && s.data > 1 && s.as<Summa2DSpec>().q > 1) {
      add(&s);
      break;
    }
  return out;
}

/// `specs` and, after each 1D scheme of p > 1 (`first_only`: the first
/// one), the same with sequence parallelism ("sp=on": the outer and inner
/// blocks then differ in rows), for the tests that take
/// representative_schemes, which keeps 1D's plain form.
inline std::vector<SchemeSpec> with_sequence_parallel(const std::vector<SchemeSpec>& specs,
                                                      bool first_only = false) {
  std::vector<SchemeSpec> out;
  bool added = false;
  for (const SchemeSpec& s : specs) {
    out.push_back(s);
    if (s.holds<Megatron1DSpec>() && s.as<Megatron1DSpec>().p > 1 &&
        !s.as<Megatron1DSpec>().sequence_parallel && !(first_only && added)) {
      out.push_back(s);
      out.back().as<Megatron1DSpec>().sequence_parallel = true;
      added = true;
    }
  }
  return out;
}

/// Several rank counts in one MPI launch: runs `body(comm, size)` on
/// disjoint sub-communicators of MPI_COMM_WORLD of every size in `sizes`
/// (those larger than the world are left out). The sizes are packed into
/// phases, largest first, each into the first phase with room (first-fit
/// decreasing); in a phase every rank runs `body` on its group's
/// communicator or sits the phase out, and a world barrier (waited for
/// asleep) ends it. Nine
/// ranks cover 1, 2, 4, 8 and 9 in three phases: [9], [8, 1], [4, 2].
/// Returns the sizes run. Collective over MPI_COMM_WORLD.
template <class Body>
std::vector<int> for_each_group(std::vector<int> sizes, Body&& body) {
  int world = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::erase_if(sizes, [&](int s) { return s < 1 || s > world; });
  std::sort(sizes.begin(), sizes.end(), std::greater<>());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  std::vector<std::vector<int>> phases;
  for (int s : sizes) {
    auto room = std::find_if(phases.begin(), phases.end(), [&](const std::vector<int>& p) {
      return std::accumulate(p.begin(), p.end(), 0) + s <= world;
    });
    if (room == phases.end()) {
      phases.push_back({s});
    } else {
      room->push_back(s);
    }
  }
  for (const std::vector<int>& phase : phases) {
    int color = MPI_UNDEFINED, first = 0, size = 0;
    for (std::size_t g = 0; g < phase.size(); first += phase[g], ++g)
      if (rank >= first && rank < first + phase[g]) {
        color = static_cast<int>(g);
        size = phase[g];
      }
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, color, rank, &comm);
    if (comm != MPI_COMM_NULL) {
      SCOPED_TRACE("group of " + std::to_string(size) + " ranks");
      struct Group {  // the helpers agree over the group while it runs
        MPI_Comm comm;
        explicit Group(MPI_Comm c) : comm(c) { test_comm() = c; }
        ~Group() {
          test_comm() = MPI_COMM_WORLD;
          MPI_Comm_free(&comm);
        }
        Group(const Group&) = delete;
        Group& operator=(const Group&) = delete;
      } group(comm);
      body(comm, size);
    }
    // The phase ends for everyone: a rank done early (or sitting the phase
    // out) sleeps rather than spins in MPI, so the cores it shares with the
    // ranks still computing stay theirs (ranks oversubscribe the cores here).
    MPI_Request phase_done = MPI_REQUEST_NULL;
    MPI_Ibarrier(MPI_COMM_WORLD, &phase_done);
    wait_sleeping(phase_done, "for_each_group: the end of a phase", 0);
  }
  return sizes;
}

/// True when `text` is identical on every rank of `comm`. Collective.
inline bool same_on_all_ranks(const std::string& text, MPI_Comm comm = test_comm()) {
  int length = static_cast<int>(text.size());
  MPI_Bcast(&length, 1, MPI_INT, 0, comm);
  std::string root(static_cast<std::size_t>(length), '\0');
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  if (rank == 0) root = text;
  MPI_Bcast(root.data(), length, MPI_CHAR, 0, comm);
  int same = root == text ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, comm);
  return same == 1;
}

/// Counts heap allocations (malloc family and operator new) made by this
/// process while a CountAllocations object is alive: count() those made by
/// anything but the MPI library and BLIS (summa, Eigen, OpenBLAS, the C++
/// runtime), mpi_count() those whose caller is inside MPI, blas_count() those
/// inside BLIS. Not available under AddressSanitizer,
/// which owns malloc.
bool allocation_counting_available();
class CountAllocations {
 public:
  CountAllocations();
  ~CountAllocations();
  std::uint64_t count() const;
  std::uint64_t mpi_count() const;
  /// Allocations inside BLIS (its per-call control tree), not in count().
  std::uint64_t blas_count() const;
  /// Library and symbol of the first counted allocation's caller.
  std::string first_caller() const;
};

/// Every local element of every piece of `params` (owners and replicas) set
/// from the global row-major tensors `global` (one host vector per
/// parameter, in params order; converted to S): the values, or the gradients
/// with `grad`. Local elements outside the pieces get 0. Uploaded into
/// test_backend() memory.
template <class S>
void set_from_global(std::span<const Param<S>> params,
                     const std::vector<std::vector<float>>& global, bool grad) {
  for (std::size_t k = 0; k < params.size(); ++k) {
    const Param<S>& p = params[k];
    if (!p.held()) continue;
    const ParamShard& s = p.shard;
    std::vector<S> local(static_cast<std::size_t>(s.local_size()), S(0));
    for (const ShardPiece& piece : s.pieces)
      for (index_t r = 0; r < piece.rows; ++r)
        for (index_t c = 0; c < piece.cols; ++c)
          local[static_cast<std::size_t>((piece.local_row + r) * s.local_cols + piece.local_col +
                                         c)] =
              S(global[k][static_cast<std::size_t>((piece.global_row + r) * s.global_cols() +
                                                   piece.global_col + c)]);
    test_backend().upload(grad ? p.grad : p.value, local.data(), local.size() * sizeof(S));
  }
}

/// The message of the summa::Error `f` throws ("" when it throws none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

/// A fresh directory under the system's temporary directory, removed with
/// its contents at the end: for a test that one process runs (each process
/// makes its own).
class TempDir {
 public:
  explicit TempDir(std::string_view prefix = "summa_test_") {
    std::string name(prefix);  // (append: GCC 12 warns falsely on "literal" + std::string)
    name +=
        std::to_string(mix(std::random_device{}() ^ (std::uint64_t{std::random_device{}()} << 32)));
    path_ = std::filesystem::temp_directory_path() / name;
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

}  // namespace summa::test

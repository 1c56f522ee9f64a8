#pragma once
/// \file machine.hpp
/// A machine as the step-time model sees it (docs/scaling.md, "Machine
/// files"): devices per node; per device a GEMM throughput model per element
/// type, the memory bandwidth of element-wise work and the memory capacity;
/// per link level (within a node, across nodes) latency α and bandwidth β of
/// each collective with the algorithm assumed. Read and written as JSON by
/// summa/io/machine_file.hpp; measured by the `calibrate` tool.

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "summa/core/types.hpp"

namespace summa::model {

/// The collectives the time model prices.
enum class Collective : std::uint8_t {
  broadcast,
  reduce,
  all_reduce,
  all_gather,
  reduce_scatter,
};
inline constexpr std::size_t collective_count = 5;
inline constexpr std::array<Collective, collective_count> all_collectives = {
    Collective::broadcast, Collective::reduce, Collective::all_reduce, Collective::all_gather,
    Collective::reduce_scatter};
std::string_view name_of(Collective c);

/// The element-wise kernels whose cost is more than moving their bytes
/// (transcendental functions: on a CPU they are compute-bound): GeLU
/// forward and backward, the attention's masked softmax (counted over the
/// whole s x s score block), the cross-entropy's exp passes over the
/// logits (row_sum_exp, cross_entropy_grad), and LayerNorm forward (both
/// statistics passes and apply) and backward (the partials and apply), per
/// element of the normalised block.
enum class Pointwise : std::uint8_t { gelu, gelu_grad, softmax, exp, layernorm, layernorm_grad };
inline constexpr std::size_t pointwise_count = 6;
inline constexpr std::array<Pointwise, pointwise_count> all_pointwise = {
    Pointwise::gelu, Pointwise::gelu_grad, Pointwise::softmax,
    Pointwise::exp,  Pointwise::layernorm, Pointwise::layernorm_grad};
std::string_view name_of(Pointwise f);

/// How a collective over g ranks moves n bytes; the time model's formula
/// per algorithm (docs/scaling.md, "Collectives"):
///   ring      all-reduce 2(g-1)·α + 2(g-1)/g·n/β; all-gather and
///             reduce-scatter (g-1)·α + (g-1)/g·n/β (n: the whole result);
///             broadcast and reduce pipelined: (g-1)·α + n/β
///   tree      ⌈log2 g⌉·(α + n/β) (all-reduce: twice)
///   direct    the traffic counters' direct-exchange volumes: (g-1)·α +
///             (sent + received) / (2β) with this rank's bytes
///             (direct_seconds); for a symmetric collective that is its
///             bytes/β, so with α = 0 the time is the traffic model's
///             bytes over β
enum class Algorithm : std::uint8_t { ring, tree, direct };
std::string_view name_of(Algorithm a);

/// Latency and bandwidth of one collective on one link level.
struct CollectiveCost {
  double alpha_s = 0;         ///< seconds per message step
  double beta_bytes_s = 1e9;  ///< bytes per second per rank
  Algorithm algorithm = Algorithm::ring;
  /// α and β by message size where they were measured so (calibrate: a
  /// line per size range where one line over every size fits badly, e.g.
  /// an MPI's eager and rendezvous protocols), ascending in up_to_bytes: a
  /// message of n bytes (collective_seconds' `bytes`) takes the first range
  /// with n <= up_to_bytes, one beyond the last range the last. Empty: α
  /// and β above for every size.
  struct Range {
    double up_to_bytes = 0;
    double alpha_s = 0;
    double beta_bytes_s = 1e9;
    friend bool operator==(const Range&, const Range&) = default;
  };
  std::vector<Range> ranges;
  /// The cost for a message of `bytes`: α and β of its range, if any.
  CollectiveCost at(double bytes) const;
  /// Every β (the ranges' too) divided by `f`: a link shared by f flows.
  void share_bandwidth(double f);
  friend bool operator==(const CollectiveCost&, const CollectiveCost&) = default;
};

/// Seconds for collective `c` over `g` ranks of a message of `bytes` (for
/// all-gather and reduce-scatter: the whole gathered or scattered buffer;
/// for the others: the buffer each rank holds) under `cost`'s algorithm; 0
/// for g <= 1.
/// Under Algorithm::direct: the volume averaged over the group's ranks.
double collective_seconds(const CollectiveCost& cost, Collective c, std::int64_t g, double bytes);
/// Algorithm::direct for one rank that sends and receives these bytes (the
/// size range of their mean).
double direct_seconds(const CollectiveCost& cost, std::int64_t g, double sent, double received);

/// One level of the network (within a node, across nodes).
struct LinkLevel {
  std::array<CollectiveCost, collective_count> collectives{};
  const CollectiveCost& operator[](Collective c) const {
    return collectives[static_cast<std::size_t>(c)];
  }
  CollectiveCost& operator[](Collective c) { return collectives[static_cast<std::size_t>(c)]; }
  friend bool operator==(const LinkLevel&, const LinkLevel&) = default;
};

/// How a GEMM C = op(A) op(B) takes its operands: nn (C = A B: a forward
/// product), nt (C = A Bᵀ: dX = dY Wᵀ, attention's Q Kᵀ) or tn (C = Aᵀ B:
/// dW = Xᵀ dY). Libraries pack and stream the three differently, so their
/// rates at one shape can differ.
enum class GemmMode : std::uint8_t { nn, nt, tn };
inline constexpr std::array<GemmMode, 3> all_gemm_modes = {GemmMode::nn, GemmMode::nt,
                                                           GemmMode::tn};
std::string_view name_of(GemmMode m);

/// A GEMM m x n x k (2mnk flops) of one element type: peak rate times an
/// efficiency. Where `table` has entries (a calibration's measurements) the
/// efficiency is that of the entry nearest in log(m), log(n), log(k) among
/// the entries of the product's mode (GemmMode; all entries where the table
/// has none of that mode: a table measured in nn only prices every mode);
/// otherwise the saturation curve max_efficiency · f / (f + half_flops),
/// f = 2mnk · batch, which reaches half of max_efficiency at f =
/// half_flops. A strided-batched call of `batch` products fills the device
/// like one product of its whole work, hence the call's flops in the
/// curve; a table entry is per product of the call it was measured in
/// (calibrate times batched shapes as one call).
struct GemmModel {
  double peak_flops = 0;  ///< per second; 0: the element type is not supported
  double max_efficiency = 1;
  double half_flops = 0;
  struct Point {
    index_t m = 0, n = 0, k = 0;
    double efficiency = 0;
    GemmMode mode = GemmMode::nn;
    friend bool operator==(const Point&, const Point&) = default;
  };
  std::vector<Point> table;
  /// Seconds for one call of `batch` m x n x k products (0 when any size is 0).
  double seconds(index_t m, index_t n, index_t k, index_t batch = 1,
                 GemmMode mode = GemmMode::nn) const;
  double efficiency(index_t m, index_t n, index_t k, index_t batch = 1,
                    GemmMode mode = GemmMode::nn) const;
  friend bool operator==(const GemmModel&, const GemmModel&) = default;
};

struct DeviceModel {
  std::string name;
  /// The library the GEMM figures were measured with ("cpu-openblas",
  /// "cpu-eigen", ...: the backend's name; empty where not recorded).
  std::string gemm_library;
  std::uint64_t memory_bytes = 0;
  /// Bytes per second read plus written by element-wise work.
  double memory_bandwidth = 0;
  /// Bytes per second each way between the device and its host's memory
  /// (PCIe, NVLink-C2C): what an offloaded optimizer's state streams over
  /// (OptimizerOptions::offload_bucket). 0: the device's memory is the
  /// host's (a CPU), priced at memory_bandwidth.
  double host_bandwidth = 0;
  /// Seconds each kernel call costs beyond its work (a GPU's launch
  /// overhead, ~3-5 us for CUDA; a CPU's call overhead): every GEMM call,
  /// element-wise pass and pointwise kernel of a step pays it. 0: free.
  double launch_s = 0;
  /// Per element type (DType order: f32, f64, bf16).
  std::array<GemmModel, 3> gemm{};
  /// Per element type (DType order) and Pointwise kernel: elements per
  /// second. A kernel takes max(its bytes / memory_bandwidth, elements /
  /// rate); 0: bound by the bandwidth alone (the usual case on a GPU).
  std::array<std::array<double, pointwise_count>, 3> pointwise{};
  const GemmModel& gemm_of(DType t) const;
  GemmModel& gemm_of(DType t);
  double pointwise_rate(DType t, Pointwise f) const {
    return pointwise[static_cast<std::size_t>(t)][static_cast<std::size_t>(f)];
  }
  friend bool operator==(const DeviceModel&, const DeviceModel&) = default;
};

/// How far a calibration's figures moved over its repetitions, each
/// relative to its value (calibrate: the interquartile range over the
/// median of its timed repetitions; a GEMM the median over the shapes, the
/// kernels the worst, a link level the worst of its collectives' timing
/// spread and α-β fit residual). 0: not recorded (a machine file from data
/// sheets). A prediction's interval (at_spread) prices the machine at both
/// ends.
struct Spread {
  std::array<double, 3> gemm{};       ///< per element type (DType order)
  std::array<double, 3> pointwise{};  ///< the Pointwise kernels, per element type
  double memory_bandwidth = 0;
  double intra_node = 0, inter_node = 0;  ///< the level's collectives (α and β)
  /// Overlap's contention factors (Contention), absolute: the interquartile
  /// range of calibrate's paired repetitions; the slow end adds it to both
  /// factors, the fast end takes it off (not below 0).
  double contention = 0;
  bool any() const;
  friend bool operator==(const Spread&, const Spread&) = default;
};

/// What running a collective beside compute costs (calibrate measures it
/// where it runs: a sliced GEMM polling a non-blocking all-reduce, as the
/// library overlaps them): while the two overlap, the compute runs
/// 1 + `compute` times slower and the collective 1 + `comm` times slower
/// (a CPU's cores copy the messages; a GPU's kernels share memory
/// bandwidth and SMs with NCCL's). 0, 0: overlap is free (the default).
struct Contention {
  double compute = 0;
  double comm = 0;
  bool any() const { return compute > 0 || comm > 0; }
  friend bool operator==(const Contention&, const Contention&) = default;
};

struct Machine {
  std::string name;
  std::string source;  ///< where the figures come from (a calibration, published specs)
  int devices_per_node = 1;
  DeviceModel device;
  LinkLevel intra_node, inter_node;
  Spread spread;
  Contention contention;
  friend bool operator==(const Machine&, const Machine&) = default;
};

/// Seconds for `compute_s` of compute and `comm_s` of a collective run
/// side by side under `c`: the collective takes comm_s (1 + c.comm), the
/// compute compute_s plus c.compute times the time they overlap:
///   max(compute_s + c.compute · min(compute_s, comm'), comm'),
///   comm' = comm_s (1 + c.comm).
/// With no contention: max(compute_s, comm_s).
double overlapped_seconds(const Contention& c, double compute_s, double comm_s);

/// The machine at one end of its spread: `end` > 0 the slow end (every
/// rate and bandwidth divided by 1 + its spread, every α multiplied by it),
/// `end` < 0 the fast end (the inverse), 0 the machine itself. A figure
/// without a spread is unchanged.
Machine at_spread(const Machine& m, int end);

}  // namespace summa::model

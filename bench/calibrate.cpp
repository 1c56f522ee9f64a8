// calibrate: measures the machine it runs on and writes a machine file for
// the step-time model (summa/model/machine.hpp, docs/scaling.md):
//
//   mpirun -np N calibrate --out my-machine.json [--backend cpu|cuda]
//
// - GEMM: every rank multiplies at once (as in training), per element type,
//   on a sweep of shapes (square, and the skinny ones of panels and small
//   local blocks); the peak is the best rate seen and the table holds each
//   shape's fraction of it (the model reads it nearest-neighbour).
// - Element-wise bandwidth: axpby over arrays far larger than the caches.
// - Collectives: broadcast, reduce, all-reduce, all-gather, reduce-scatter
//   over the ranks of a node (intra_node) and over one rank per node
//   (inter_node), at 11 message sizes from 8 bytes to 4 MiB; α and β fitted
//   to all of them by least squares on the relative error under the ring
//   algorithm's formulas. With one node the inter-node level copies the
//   intra-node one; with one rank no collective can be measured and the
//   links keep placeholder figures (the file's "source" says which).
// Every figure is the median over ranks of each rank's median of --reps
// repetitions (default 5); its spread (the interquartile range over the
// median, the worst rank's) goes to the file's "spread", is printed, and
// above 10 % (or --max-spread, which then refuses to write) is reported as
// a loaded or noisy machine, as is a load average beyond these ranks. A
// prediction's interval prices the file at both ends of its spreads
// (model::at_spread). About three minutes on a 2-core machine; --passes N
// makes N whole calibrations and keeps each figure's median over them
// (median_of_passes), N times as long.
#include <mpi.h>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

#include "../examples/flag_checks.hpp"
#include "bench_device.hpp"
#include "summa/comm/consensus.hpp"
#include "summa/io/atomic_file.hpp"
#include "summa/io/files.hpp"
#include "summa/io/machine_file.hpp"
#include "summa/model/step_time.hpp"
#include "summa/schemes/registry.hpp"

namespace {

using summa::DType;
using summa::model::Algorithm;
using summa::model::Collective;

// How a machine file calibrate writes starts its "source": --out replaces
// only a file that starts so (an earlier calibration).
constexpr std::string_view kCalibrateSource = "calibrate (bench/calibrate.cpp)";

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// The median over the ranks of `comm` of a per-rank value.
double median_over(MPI_Comm comm, double v) {
  int n = 0;
  MPI_Comm_size(comm, &n);
  std::vector<double> all(static_cast<std::size_t>(n));
  MPI_Allgather(&v, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, comm);
  std::sort(all.begin(), all.end());
  return all[all.size() / 2];
}

// The largest over the ranks of `comm` of a per-rank value.
double max_over(MPI_Comm comm, double v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, comm);
  return v;
}

// How each measurement is timed: batches of calls lasting at least min_s,
// `reps` batches (--min-seconds, --reps).
struct Timer {
  double min_s = 0.06;
  int reps = 7;
};

// A measurement on every rank: the median over the ranks of each rank's
// median seconds per call over the batches, and the largest over the
// ranks of each rank's spread (the interquartile range of its batches over
// their median): how much the figure moved from one repetition to the next.
struct Timing {
  double seconds = 0, spread = 0;
};

// f timed in `timer.reps` batches of calls lasting at least timer.min_s
// each (after one timed warm-up call). The ranks of `comm` agree on the
// number of calls (f may be a collective) and start each batch together.
template <class F>
Timing timed(MPI_Comm comm, F&& f, const Timer& timer, double scale = 1) {
  const double min_s = timer.min_s * scale;
  MPI_Barrier(comm);
  auto t0 = std::chrono::steady_clock::now();
  f();
  double once = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MPI_Allreduce(MPI_IN_PLACE, &once, 1, MPI_DOUBLE, MPI_MAX, comm);
  const int calls = static_cast<int>(std::clamp(std::ceil(min_s / std::max(once, 1e-9)), 1.0, 1e6));
  std::vector<double> batches;
  for (int b = 0; b < timer.reps; ++b) {
    MPI_Barrier(comm);
    t0 = std::chrono::steady_clock::now();
    for (int c = 0; c < calls; ++c) f();
    batches.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                      calls);
  }
  std::sort(batches.begin(), batches.end());
  const std::size_t n = batches.size();
  const double median = n % 2 ? batches[n / 2] : 0.5 * (batches[n / 2 - 1] + batches[n / 2]);
  const double iqr = batches[(3 * n) / 4 < n ? (3 * n) / 4 : n - 1] - batches[n / 4];
  return {.seconds = median_over(comm, median),
          .spread = max_over(comm, median > 0 ? iqr / median : 0)};
}

// When and where a calibration ran, for the machine file's source: the UTC
// time and the host's CPU model (/proc/cpuinfo's "model name", as lscpu
// prints it) and online cores; figures from one CPU mean little on another.
std::string when_and_where() {
  const std::time_t now = std::time(nullptr);
  char when[32] = "unknown time";
  if (const std::tm* t = std::gmtime(&now); t != nullptr)
    std::strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", t);
  std::string cpu = "unknown CPU";
  std::ifstream info("/proc/cpuinfo");
  for (std::string line; std::getline(info, line);)
    if (line.starts_with("model name")) {
      if (const auto colon = line.find(':'); colon != std::string::npos) {
        cpu = line.substr(colon + 1);
        cpu.erase(0, cpu.find_first_not_of(" \t"));
      }
      break;
    }
  return fmt::format("measured {} on {} ({} cores online)", when, cpu,
                     std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
}

// The median of a list (the spreads of a sweep's shapes).
double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

// The interquartile range of a list (0 for fewer than two), and over its
// median.
double iqr_of(std::vector<double> v) {
  if (v.size() < 2) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return v[(3 * n) / 4 < n ? (3 * n) / 4 : n - 1] - v[n / 4];
}
double relative_iqr(const std::vector<double>& v) {
  const double m = median_of(v);
  return m > 0 ? iqr_of(v) / m : 0;
}

// Several functions timed round robin: each repetition times every one of
// `fs` in turn, in an order that alternates between repetitions, each a
// batch of calls lasting at least timer.min_s; so a drift of the machine
// (another tenant's load, the clock) over the seconds they take moves them
// all alike, which timing one after the other in blocks (timed) does not.
// Returns, per repetition, each function's seconds per call: the slowest
// rank's (the ranks agree on the calls and start each batch together).
std::vector<std::vector<double>> round_robin(MPI_Comm comm,
                                             const std::vector<std::function<void()>>& fs,
                                             const Timer& timer, int reps) {
  const std::size_t n = fs.size();
  std::vector<int> calls(n);
  for (std::size_t i = 0; i < n; ++i) {  // one warm-up call each sets its batch
    MPI_Barrier(comm);
    const auto t0 = std::chrono::steady_clock::now();
    fs[i]();
    double once = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    MPI_Allreduce(MPI_IN_PLACE, &once, 1, MPI_DOUBLE, MPI_MAX, comm);
    calls[i] =
        static_cast<int>(std::clamp(std::ceil(timer.min_s / std::max(once, 1e-9)), 1.0, 1e6));
  }
  std::vector<std::vector<double>> out(static_cast<std::size_t>(reps), std::vector<double>(n));
  for (int r = 0; r < reps; ++r)
    for (std::size_t j = 0; j < n; ++j) {
      const std::size_t i = r % 2 ? n - 1 - j : j;
      MPI_Barrier(comm);
      const auto t0 = std::chrono::steady_clock::now();
      for (int c = 0; c < calls[i]; ++c) fs[i]();
      double t =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / calls[i];
      MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, comm);
      out[static_cast<std::size_t>(r)][i] = t;
    }
  return out;
}

// round_robin's figures: each function's median over the repetitions and
// its spread (relative interquartile range).
std::vector<Timing> round_robin_timings(MPI_Comm comm, const std::vector<std::function<void()>>& fs,
                                        const Timer& timer) {
  const auto t = round_robin(comm, fs, timer, timer.reps);
  std::vector<Timing> out(fs.size());
  for (std::size_t i = 0; i < fs.size(); ++i) {
    std::vector<double> v;
    for (const auto& rep : t) v.push_back(rep[i]);
    out[i] = {.seconds = median_of(v), .spread = relative_iqr(v)};
  }
  return out;
}

struct Buffer {
  summa::Backend& backend;
  void* data;
  std::size_t bytes;
  Buffer(summa::Backend& b, std::size_t n) : backend(b), data(b.allocate(n)), bytes(n) {
    // Every byte 0x3f: a normal number in every element type (f32 0.747,
    // f64 4.8e-4, bf16 0.746). Arbitrary bytes can be subnormal, which the
    // CPU multiplies tens of times slower.
    const std::vector<unsigned char> host(n, 0x3f);
    b.upload(data, host.data(), n);
  }
  ~Buffer() { backend.deallocate(data, bytes); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

// The GEMM table: a sweep of square sizes and the skinny shapes of panels
// and small local blocks in each mode (nn, nt, tn), plus `extra` (the shapes of --gpt
// configurations, a batched product timed as one strided-batched call, as the layers make it, and
// its rate per product).
template <class T>
summa::model::GemmModel measure_gemm(summa::Backend& be, const Timer& timer,
                                     summa::index_t max_size,
                                     const std::vector<summa::model::GemmShape>& extra,
                                     double& spread) {
  using A = summa::acc_t<T>;
  using summa::model::GemmMode;
  using summa::model::GemmShape;
  std::vector<GemmShape> shapes;
  for (GemmMode mode : summa::model::all_gemm_modes) {  // the sweep in each mode
    for (summa::index_t s : {32, 64, 128, 256, 512, 768})
      if (s <= max_size) shapes.push_back({s, s, s, 1, mode});
    for (auto [a, b] :
         {std::pair<summa::index_t, summa::index_t>{512, 64}, {512, 128}, {256, 32}, {768, 96}})
      if (a <= max_size)
        for (GemmShape sh : {GemmShape{a, a, b, 1, mode}, GemmShape{a, b, a, 1, mode},
                             GemmShape{b, a, a, 1, mode}})
          shapes.push_back(sh);
  }
  for (const GemmShape& sh : extra)
    if (std::find_if(shapes.begin(), shapes.end(), [&](const GemmShape& o) {
          return o.m == sh.m && o.n == sh.n && o.k == sh.k && o.mode == sh.mode;
        }) == shapes.end())
      shapes.push_back(sh);
  summa::model::GemmModel g{.peak_flops = 0, .max_efficiency = 1, .half_flops = 0, .table = {}};
  std::vector<double> rates, spreads;
  const std::size_t e = sizeof(T);
  for (const auto& [m, n, k, batch, mode] : shapes) {
    const auto count = [&](summa::index_t r, summa::index_t c) {
      return static_cast<std::size_t>(r * c * batch) * e;
    };
    Buffer a(be, count(m, k)), b(be, count(k, n)), c(be, count(m, n));
    const auto view = [](void* p, summa::index_t r, summa::index_t cc) {
      return summa::MatrixView<T>::dense(static_cast<T*>(p), r, cc, summa::Order::row_major);
    };
    const std::size_t scratch_bytes = be.gemm_scratch_bytes(m, n, k, summa::dtype_v<T>);
    Buffer scratch(be, std::max<std::size_t>(scratch_bytes, 64));
    const summa::Scratch sc{scratch.data, scratch_bytes};
    // op(A) is m x k and op(B) k x n: A stored k x m in tn, B n x k in nt
    const summa::Op ta = mode == GemmMode::tn ? summa::Op::T : summa::Op::N,
                    tb = mode == GemmMode::nt ? summa::Op::T : summa::Op::N;
    const auto A_ =
        summa::ConstMatrixView<T>(ta == summa::Op::T ? view(a.data, k, m) : view(a.data, m, k));
    const auto B_ =
        summa::ConstMatrixView<T>(tb == summa::Op::T ? view(b.data, n, k) : view(b.data, k, n));
    const auto C_ = view(c.data, m, n);
    const Timing s = timed(
        MPI_COMM_WORLD,
        [&, batch = batch] {
          if (batch == 1)
            be.gemm(ta, tb, A(1), A_, B_, A(0), C_, sc);
          else
            be.gemm_strided_batched(ta, tb, A(1), A_, m * k, B_, k * n, A(0), C_, m * n, batch, sc);
          be.synchronize();
        },
        timer);
    const double rate =
        2.0 * static_cast<double>(m * n * k) * static_cast<double>(batch) / s.seconds;
    rates.push_back(rate);
    spreads.push_back(s.spread);
    g.peak_flops = std::max(g.peak_flops, rate);
  }
  for (std::size_t i = 0; i < shapes.size(); ++i)
    g.table.push_back({.m = shapes[i].m,
                       .n = shapes[i].n,
                       .k = shapes[i].k,
                       .efficiency = std::max(1e-6, rates[i] / g.peak_flops),
                       .mode = shapes[i].mode});
  spread = median_of(spreads);
  return g;
}

// "layers=2,hidden=192,heads=24,seq=32,batch=24,vocab=1536" (any subset;
// the rest as here).
struct GptPoint {
  summa::GptConfig config;
  summa::index_t seq = 32, batch = 24;
  std::string text;  // as given
};
GptPoint parse_gpt(const std::string& text) {
  GptPoint p;
  p.text = text;
  p.config.n_layer = 2;
  p.config.n_embd = 192;
  p.config.n_head = 24;
  p.config.vocab_size = 1536;
  std::size_t at = 0;
  for (bool more = true; more;) {  // every item, the one after a trailing comma too
    const std::size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    more = comma < text.size();
    at = comma + 1;
    const std::size_t eq = item.find('=');
    long long v = 0;
    try {
      if (eq == std::string::npos) throw std::invalid_argument("no '='");
      // plain decimal digits (was: stoll, which took "+2" and " 64")
      const std::string digits = item.substr(eq + 1);
      const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
      if (ec != std::errc() || end != digits.data() + digits.size() || v <= 0)
        throw std::invalid_argument("not positive");
      if (v > std::numeric_limits<int>::max()) throw std::invalid_argument("too large");
    } catch (const std::exception&) {
      throw UsageError(
          "--gpt '" + text + "': '" + item +
          "' is not key=positive integer below 2^31 (keys layers, hidden, heads, seq, batch, "
          "vocab)");
    }
    const std::string key = item.substr(0, eq);
    if (key == "layers")
      p.config.n_layer = static_cast<int>(v);
    else if (key == "hidden")
      p.config.n_embd = static_cast<int>(v);
    else if (key == "heads")
      p.config.n_head = static_cast<int>(v);
    else if (key == "vocab")
      p.config.vocab_size = static_cast<int>(v);
    else if (key == "seq")
      p.seq = v;
    else if (key == "batch")
      p.batch = v;
    else
      throw UsageError("--gpt '" + text + "': unknown key '" + key +
                       "' (keys layers, hidden, heads, seq, batch, vocab)");
  }
  p.config.n_positions = static_cast<int>(p.seq);
  return p;
}

// Refuses (the same UsageError on every rank) a --gpt shape whose three
// operands would not fit `available` bytes per rank (0: not checked).
void require_gemms_fit(const std::vector<summa::model::GemmShape>& shapes, std::size_t element,
                       double available, const char* source, const std::string& dtype) {
  if (available <= 0) return;
  for (const summa::model::GemmShape& g : shapes) {
    const double m = static_cast<double>(g.m), n = static_cast<double>(g.n),
                 k = static_cast<double>(g.k);
    const double bytes =
        (m * k + k * n + m * n) * static_cast<double>(g.batch) * static_cast<double>(element);
    if (bytes > available)
      throw UsageError(fmt::format(
          "--gpt: its {} GEMM {}x{}x{} (batch {}) needs {} per rank for its operands, more than "
          "the {} per rank {}; use smaller --gpt sizes",
          dtype, g.m, g.n, g.k, g.batch, summa::human_bytes(bytes), summa::human_bytes(available),
          source));
  }
}

// Every local GEMM shape the step-time model prices for these GPTs under
// every scheme of these rank counts that accepts them.
std::vector<summa::model::GemmShape> gpt_shapes(const std::vector<GptPoint>& gpts,
                                                const std::vector<int>& ranks, DType dtype) {
  std::set<summa::model::GemmShape> all;
  for (const GptPoint& p : gpts) {
    // the shapes come from the built (plan-only) model: a scheme that cannot
    // split it is skipped; a point no scheme takes is refused, with the
    // first reason (was: silently left out)
    std::optional<std::string> first_error;
    bool taken = false;
    for (int r : ranks)
      for (const summa::SchemeSpec& spec : summa::schemes_for(r)) {
        try {
          const auto shapes =
              summa::model::step_gemm_shapes(spec, p.config, p.batch, p.seq, {}, dtype);
          all.insert(shapes.begin(), shapes.end());
          taken = true;
        } catch (const summa::Error& e) {  // e.g. the batch does not split over this data axis
          if (!first_error) first_error = spec.str() + ": " + e.what();
        }
      }
    if (!taken)
      throw UsageError(fmt::format("--gpt '{}': no scheme of the rank counts builds it ({})",
                                   p.text, first_error.value_or("none")));
  }
  return {all.begin(), all.end()};
}

// Elements per second of the kernels the model prices as Pointwise (their
// cost on a CPU is the arithmetic, transcendental functions above all, not
// the bytes), on a 1024 x 1024 block of standard normal values: GeLU
// forward and backward, the causal softmax of 64 x 64 score blocks (one
// call per block, as Attention makes them), the cross-entropy's exp passes
// (row_sum_exp, then cross_entropy_grad), LayerNorm forward (both
// statistics passes and apply) and backward (the three partial and apply
// kernels).
template <class T>
std::array<double, summa::model::pointwise_count> measure_pointwise(summa::Backend& be,
                                                                    const Timer& timer,
                                                                    double& spread) {
  using A = summa::acc_t<T>;
  using summa::model::Pointwise;
  std::array<double, summa::model::pointwise_count> rate{};
  const auto view = [](void* p, summa::index_t r, summa::index_t c) {
    return summa::MatrixView<T>::dense(static_cast<T*>(p), r, c, summa::Order::row_major);
  };
  const auto cview = [&](void* p, summa::index_t r, summa::index_t c) {
    return summa::ConstMatrixView<T>(view(p, r, c));
  };
  spread = 0;
  // The kernels are timed round robin (one batch of each per repetition):
  // each `per_second` registers a kernel and the slot its rate goes to,
  // filled in after round_robin_timings below.
  std::vector<std::function<void()>> kernels;
  std::vector<std::pair<double*, double>> slots;  // rate, elements per call
  const auto per_second = [&](double* slot, double elements, auto kernel) {
    kernels.emplace_back([&be, kernel] {
      kernel();
      be.synchronize();
    });
    slots.emplace_back(slot, elements);
  };
  const summa::index_t rows = 1024, cols = 1024, n = rows * cols, s = 64;
  Buffer x(be, static_cast<std::size_t>(n) * sizeof(T)),
      y(be, static_cast<std::size_t>(n) * sizeof(T)),
      dy(be, static_cast<std::size_t>(n) * sizeof(T));
  // Each kernel has its own inputs, which no other kernel writes: timed
  // round robin, a kernel reading another's output would see arguments
  // that change with the order (exp's speed depends on them).
  Buffer logits(be, static_cast<std::size_t>(n) * sizeof(T));  // cross_entropy_grad's, in place
  Buffer max(be, static_cast<std::size_t>(rows) * sizeof(A)),
      sum(be, static_cast<std::size_t>(rows) * sizeof(A)),
      ln_mean(be, static_cast<std::size_t>(rows) * sizeof(A)),
      ln_rstd(be, static_cast<std::size_t>(rows) * sizeof(A)),
      ln_scratch(be, static_cast<std::size_t>(rows) * sizeof(A)),
      gamma(be, static_cast<std::size_t>(2 * cols) * sizeof(T)),
      partial(be, static_cast<std::size_t>(2 * cols) * sizeof(T)),
      ab(be, static_cast<std::size_t>(2 * rows) * sizeof(A));
  {  // standard normal activations (the transcendental functions' speed
     // depends on the argument's range)
    std::mt19937_64 rng(7);
    std::normal_distribution<float> normal;
    std::vector<T> host(static_cast<std::size_t>(n));
    for (T& v : host) v = T(normal(rng));
    be.upload(x.data, host.data(), host.size() * sizeof(T));
    be.upload(dy.data, host.data(), host.size() * sizeof(T));
    be.upload(logits.data, host.data(), host.size() * sizeof(T));
    // the exp passes' row maxima and sums of x (a softmax's)
    std::vector<A> row_max(static_cast<std::size_t>(rows)), row_sum(row_max.size());
    for (summa::index_t r = 0; r < rows; ++r) {
      const T* row = host.data() + r * cols;
      A mx = static_cast<A>(static_cast<float>(row[0])), sm = 0;
      for (summa::index_t c = 1; c < cols; ++c)
        mx = std::max(mx, static_cast<A>(static_cast<float>(row[c])));
      for (summa::index_t c = 0; c < cols; ++c)
        sm += std::exp(static_cast<A>(static_cast<float>(row[c])) - mx);
      row_max[static_cast<std::size_t>(r)] = mx;
      row_sum[static_cast<std::size_t>(r)] = sm;
    }
    be.upload(max.data, row_max.data(), row_max.size() * sizeof(A));
    be.upload(sum.data, row_sum.data(), row_sum.size() * sizeof(A));
  }
  auto& at = rate;
  per_second(&at[static_cast<std::size_t>(Pointwise::gelu)], static_cast<double>(n),
             [&] { be.gelu_forward(cview(x.data, rows, cols), view(y.data, rows, cols)); });
  per_second(&at[static_cast<std::size_t>(Pointwise::gelu_grad)], static_cast<double>(n), [&] {
    be.gelu_backward(cview(x.data, rows, cols), cview(dy.data, rows, cols),
                     view(y.data, rows, cols));
  });
  per_second(&at[static_cast<std::size_t>(Pointwise::softmax)], static_cast<double>(n), [&] {
    for (summa::index_t b = 0; b < n / (s * s); ++b) {
      T* const block = static_cast<T*>(x.data) + b * s * s;
      T* const out = static_cast<T*>(y.data) + b * s * s;
      be.softmax_causal(summa::ConstMatrixView<T>(view(block, s, s)), 0.125, view(out, s, s));
    }
  });
  std::vector<std::int32_t> host_targets(static_cast<std::size_t>(rows), 3);
  Buffer targets(be, host_targets.size() * sizeof(std::int32_t));
  be.upload(targets.data, host_targets.data(), host_targets.size() * sizeof(std::int32_t));
  // One exp pass each: row_sum_exp (into its own row sums), and
  // cross_entropy_grad (on its own copy of the logits, in place).
  double sum_exp = 0, grad = 0;  // rates of the two exp passes
  per_second(&sum_exp, static_cast<double>(n), [&] {
    be.row_sum_exp(cview(x.data, rows, cols), static_cast<const A*>(max.data),
                   static_cast<A*>(ln_scratch.data));
  });
  per_second(&grad, static_cast<double>(n), [&] {
    be.cross_entropy_grad(view(logits.data, rows, cols), static_cast<const A*>(max.data),
                          static_cast<const A*>(sum.data),
                          static_cast<const std::int32_t*>(targets.data), 0, 1.0);
  });
  const A* mean = static_cast<const A*>(ln_mean.data);
  const A* rstd = static_cast<const A*>(ln_rstd.data);
  const T* g = static_cast<const T*>(gamma.data);
  per_second(&at[static_cast<std::size_t>(Pointwise::layernorm)], static_cast<double>(n), [&] {
    A* const mean_out = static_cast<A*>(ln_mean.data);
    A* const rstd_out = static_cast<A*>(ln_rstd.data);
    be.layernorm_partial_sums(cview(x.data, rows, cols), nullptr, mean_out);
    be.layernorm_mean(rows, cols, mean_out, mean_out);
    be.layernorm_partial_sums(cview(x.data, rows, cols), mean, rstd_out);
    be.layernorm_rstd(rows, cols, 1e-5, rstd_out, rstd_out);
    be.layernorm_apply(cview(x.data, rows, cols), mean, rstd, g, g + cols,
                       view(y.data, rows, cols));
  });
  per_second(&at[static_cast<std::size_t>(Pointwise::layernorm_grad)], static_cast<double>(n), [&] {
    T* const p = static_cast<T*>(partial.data);
    A* const a = static_cast<A*>(ab.data);
    be.layernorm_param_partials(cview(x.data, rows, cols), cview(dy.data, rows, cols), mean, rstd,
                                p, p + cols);
    be.layernorm_backward_partials(cview(x.data, rows, cols), cview(dy.data, rows, cols), mean,
                                   rstd, g, a, a + rows);
    be.layernorm_backward_apply(cview(x.data, rows, cols), cview(dy.data, rows, cols), mean, rstd,
                                g, a, a + rows, cols, view(y.data, rows, cols));
  });
  const std::vector<Timing> t = round_robin_timings(MPI_COMM_WORLD, kernels, timer);
  for (std::size_t i = 0; i < t.size(); ++i) {
    *slots[i].first = slots[i].second / t[i].seconds;
    spread = std::max(spread, t[i].spread);  // the worst kernel's
  }
  at[static_cast<std::size_t>(Pointwise::exp)] = 2.0 / (1.0 / sum_exp + 1.0 / grad);
  return rate;
}

double measure_bandwidth(summa::Backend& be, const Timer& timer, double& spread) {
  const summa::index_t n = summa::index_t{1} << 22;  // 16 MiB of floats per array
  Buffer x(be, static_cast<std::size_t>(n) * 4), y(be, static_cast<std::size_t>(n) * 4);
  const auto view = [&](void* p) {
    return summa::MatrixView<float>::dense(static_cast<float*>(p), 1, n, summa::Order::row_major);
  };
  const Timing s = timed(
      MPI_COMM_WORLD,
      [&] {
        be.axpby(1.0f, summa::ConstMatrixView<float>(view(x.data)), 0.5f, view(y.data));
        be.synchronize();
      },
      timer);
  spread = s.spread;
  return 3.0 * 4.0 * static_cast<double>(n) / s.seconds;
}

// The machine's drift over a calibration: a probe (the element-wise
// bandwidth and GeLU's rate, the figures that move most on a shared
// machine) timed at the start and again at the end; its relative change,
// the larger of the two, is how far the machine itself moved while the
// figures were taken (a noisy neighbour's memory traffic, the host's clock).
struct Probe {
  double bandwidth = 0, gelu = 0;
};
Probe probe(summa::Backend& be, const Timer& timer) {
  Probe out;
  double ignored = 0;
  out.bandwidth = measure_bandwidth(be, timer, ignored);
  const summa::index_t n = 1024;
  Buffer x(be, static_cast<std::size_t>(n * n) * 4), y(be, static_cast<std::size_t>(n * n) * 4);
  {
    std::mt19937_64 rng(11);
    std::normal_distribution<float> normal;
    std::vector<float> host(static_cast<std::size_t>(n * n));
    for (float& v : host) v = normal(rng);
    be.upload(x.data, host.data(), host.size() * sizeof(float));
  }
  const auto view = [&](void* p) {
    return summa::MatrixView<float>::dense(static_cast<float*>(p), n, n, summa::Order::row_major);
  };
  const auto gelu = [&] {
    be.gelu_forward(summa::ConstMatrixView<float>(view(x.data)), view(y.data));
    be.synchronize();
  };
  out.gelu = static_cast<double>(n * n) / timed(MPI_COMM_WORLD, gelu, timer).seconds;
  return out;
}
double drift_between(const Probe& a, const Probe& b) {
  const auto rel = [](double x, double y) { return x > 0 ? std::abs(y / x - 1) : 0.0; };
  return std::max(rel(a.bandwidth, b.bandwidth), rel(a.gelu, b.gelu));
}

// Several whole calibrations of one run (--passes) made one, figure by
// figure: each rate, bandwidth, overhead, α and β and contention factor the
// median over the passes; a GEMM table's entries by their rates (efficiency
// times the pass's peak), the peak the best of those medians; a
// collective's size ranges where every pass split the sizes alike, else
// the ranges of the pass whose β is the median. Each spread is the larger
// of the passes' median spread and the passes' own movement (the relative
// interquartile range of the figure over them): a figure that held still
// within each pass but moved between them is as uncertain as that.
summa::model::Machine median_of_passes(const std::vector<summa::model::Machine>& ms) {
  using summa::model::CollectiveCost;
  using summa::model::Machine;
  summa::model::Machine out = ms.front();
  if (ms.size() == 1) return out;
  const auto values = [&](auto&& get) {
    std::vector<double> v;
    for (const Machine& m : ms) v.push_back(get(m));
    return v;
  };
  const auto median = [&](auto&& get) { return median_of(values(get)); };
  const auto movement = [&](auto&& get) { return relative_iqr(values(get)); };
  for (std::size_t t = 0; t < 3; ++t) {
    summa::model::GemmModel& g = out.device.gemm[t];
    if (g.peak_flops <= 0) continue;
    std::vector<double> rates(g.table.size()), moved;
    for (std::size_t i = 0; i < g.table.size(); ++i) {
      const auto rate = [&](const Machine& m) {
        return m.device.gemm[t].table[i].efficiency * m.device.gemm[t].peak_flops;
      };
      rates[i] = median(rate);
      moved.push_back(movement(rate));
    }
    g.peak_flops = *std::max_element(rates.begin(), rates.end());
    for (std::size_t i = 0; i < g.table.size(); ++i)
      g.table[i].efficiency = std::max(1e-6, rates[i] / g.peak_flops);
    out.spread.gemm[t] =
        std::max(median([&](const Machine& m) { return m.spread.gemm[t]; }), median_of(moved));
    double worst_moved = 0;
    for (std::size_t f = 0; f < summa::model::pointwise_count; ++f) {
      const auto rate = [&](const Machine& m) { return m.device.pointwise[t][f]; };
      out.device.pointwise[t][f] = median(rate);
      worst_moved = std::max(worst_moved, movement(rate));
    }
    out.spread.pointwise[t] =
        std::max(median([&](const Machine& m) { return m.spread.pointwise[t]; }), worst_moved);
  }
  const auto bandwidth = [](const Machine& m) { return m.device.memory_bandwidth; };
  out.device.memory_bandwidth = median(bandwidth);
  out.spread.memory_bandwidth = std::max(
      median([](const Machine& m) { return m.spread.memory_bandwidth; }), movement(bandwidth));
  out.device.launch_s = median([](const Machine& m) { return m.device.launch_s; });
  // the contention factors and their spread (absolute, as Spread::contention)
  const auto compute = [](const Machine& m) { return m.contention.compute; };
  const auto comm = [](const Machine& m) { return m.contention.comm; };
  out.contention = {.compute = median(compute), .comm = median(comm)};
  out.spread.contention = std::max({median([](const Machine& m) { return m.spread.contention; }),
                                    iqr_of(values(compute)), iqr_of(values(comm))});
  using summa::model::Spread;
  for (const auto& [level, level_spread] : {std::pair{&Machine::intra_node, &Spread::intra_node},
                                            std::pair{&Machine::inter_node, &Spread::inter_node}}) {
    double worst_moved = 0;
    for (Collective c : summa::model::all_collectives) {
      const auto cost = [&](const Machine& m) -> const CollectiveCost& { return (m.*level)[c]; };
      CollectiveCost& o = (out.*level)[c];
      const auto alpha = [&](const Machine& m) { return cost(m).alpha_s; };
      const auto beta = [&](const Machine& m) { return cost(m).beta_bytes_s; };
      o.alpha_s = median(alpha);
      o.beta_bytes_s = median(beta);
      worst_moved = std::max({worst_moved, movement(alpha), movement(beta)});
      bool alike = true;
      for (const Machine& m : ms) {
        const auto& r = cost(m).ranges;
        alike = alike && r.size() == o.ranges.size();
        for (std::size_t i = 0; alike && i < r.size(); ++i)
          alike = r[i].up_to_bytes == o.ranges[i].up_to_bytes;
      }
      if (alike) {
        for (std::size_t i = 0; i < o.ranges.size(); ++i) {
          o.ranges[i].alpha_s = median([&](const Machine& m) { return cost(m).ranges[i].alpha_s; });
          o.ranges[i].beta_bytes_s =
              median([&](const Machine& m) { return cost(m).ranges[i].beta_bytes_s; });
        }
      } else {  // the pass whose whole-line β is the median (the lower middle of an even count)
        std::vector<std::pair<double, std::size_t>> by_beta;
        for (std::size_t i = 0; i < ms.size(); ++i) by_beta.emplace_back(beta(ms[i]), i);
        std::sort(by_beta.begin(), by_beta.end());
        o.ranges = cost(ms[by_beta[(by_beta.size() - 1) / 2].second]).ranges;
      }
    }
    out.spread.*level_spread = std::max(median([&, level_spread = level_spread](const Machine& m) {
                                          return m.spread.*level_spread;
                                        }),
                                        worst_moved);
  }
  return out;
}

// Seconds one kernel call costs beyond its work (DeviceModel::launch_s):
// 64 one-element axpby calls issued back to back, then one synchronize,
// per call (a GPU's launch overhead; a CPU's call overhead).
double measure_launch(summa::Backend& be, const Timer& timer) {
  constexpr int calls = 64;
  Buffer x(be, 64), y(be, 64);
  const auto view = [&](void* p) {
    return summa::MatrixView<float>::dense(static_cast<float*>(p), 1, 1, summa::Order::row_major);
  };
  const Timing s = timed(
      MPI_COMM_WORLD,
      [&] {
        for (int i = 0; i < calls; ++i)
          be.axpby(1.0f, summa::ConstMatrixView<float>(view(x.data)), 0.5f, view(y.data));
        be.synchronize();
      },
      timer);
  return s.seconds / calls;
}

// t = a + b n fitted to the measured (n, t) by least squares on the
// relative error (weights 1 / t²: the small messages fix a, the large
// ones b), a >= 0 and b > 0; and the fit's relative RMS residual.
struct LineFit {
  double a = 0, b = 0, residual = 0;
};
LineFit fit_line(const std::vector<double>& n, const std::vector<double>& t) {
  double sw = 0, sn = 0, st = 0, snn = 0, snt = 0;
  for (std::size_t i = 0; i < n.size(); ++i) {
    const double w = 1 / (t[i] * t[i]);
    sw += w;
    sn += w * n[i];
    st += w * t[i];
    snn += w * n[i] * n[i];
    snt += w * n[i] * t[i];
  }
  LineFit f;
  const double det = sw * snn - sn * sn;
  f.b = det > 0 ? (sw * snt - sn * st) / det : 0;
  f.a = det > 0 ? (st - f.b * sn) / sw : 0;
  if (f.a < 0) {  // through the origin
    f.a = 0;
    f.b = snt / snn;
  }
  if (f.b <= 0) {  // no slope measured: the largest message's rate
    f.b = t.back() / n.back();
    f.a = 0;
  }
  double r2 = 0;
  for (std::size_t i = 0; i < n.size(); ++i) {
    const double e = (f.a + f.b * n[i] - t[i]) / t[i];
    r2 += e * e;
  }
  f.residual = std::sqrt(r2 / static_cast<double>(n.size()));
  return f;
}

// The best split of the sizes into two lines (each over at least three
// sizes, fit_line each): the first line's sizes are n[0 .. split), and the
// residual is the RMS over every size. split = 0 when none beats `whole`
// by at least half its residual (one line then fits well enough, or the
// second adds nothing the noise does not).
struct SplitFit {
  std::size_t split = 0;
  LineFit low, high;
  double residual = 0;
};
SplitFit fit_two_lines(const std::vector<double>& n, const std::vector<double>& t,
                       const LineFit& whole) {
  SplitFit best;
  best.residual = whole.residual;
  for (std::size_t k = 3; k + 3 <= n.size(); ++k) {
    const auto part = [&](std::size_t lo, std::size_t hi) {
      return fit_line(std::vector<double>(n.begin() + static_cast<std::ptrdiff_t>(lo),
                                          n.begin() + static_cast<std::ptrdiff_t>(hi)),
                      std::vector<double>(t.begin() + static_cast<std::ptrdiff_t>(lo),
                                          t.begin() + static_cast<std::ptrdiff_t>(hi)));
    };
    const LineFit low = part(0, k), high = part(k, n.size());
    const double r = std::sqrt((low.residual * low.residual * static_cast<double>(k) +
                                high.residual * high.residual * static_cast<double>(n.size() - k)) /
                               static_cast<double>(n.size()));
    if (r < best.residual) best = {k, low, high, r};
  }
  if (best.split == 0 || best.residual > 0.5 * whole.residual) return {0, {}, {}, whole.residual};
  return best;
}

// α and β of each collective on `comm` (its own counter): timed at message
// sizes from 8 B to 4 MiB (the median of the repetitions), and the ring
// formula t = steps α + factor n / β fitted over all of them by least
// squares (fit_line); where two lines over two size ranges fit much better
// (fit_two_lines: an MPI's eager and rendezvous protocols), those too, as
// the collective's size ranges (CollectiveCost::ranges; the whole line
// stays its α and β). `spread`: the worst over the collectives of the
// sizes' median timing spread and the residual of the fit kept.
summa::model::LinkLevel measure_links(summa::Communicator& comm, MPI_Comm mpi, summa::Backend& be,
                                      const Timer& timer, double& spread) {
  summa::model::LinkLevel level;
  const auto g = static_cast<double>(comm.size());
  std::vector<std::size_t> sizes;  // bytes per buffer: 8 B to 4 MiB by factors of 4
  for (std::size_t b = 8; b <= (std::size_t{1} << 22); b *= 4) sizes.push_back(b);
  if (sizes.back() != (std::size_t{1} << 22)) sizes.push_back(std::size_t{1} << 22);
  Buffer send(be, sizes.back() * static_cast<std::size_t>(comm.size())),
      recv(be, sizes.back() * static_cast<std::size_t>(comm.size()));
  spread = 0;
  for (Collective c : summa::model::all_collectives) {
    std::vector<double> t, n, spreads;
    for (std::size_t bytes : sizes) {
      const std::size_t count = std::max<std::size_t>(bytes / 4, 1);
      // all-gather / reduce-scatter: `bytes` is the whole buffer (the model's n)
      const std::size_t per_rank =
          std::max<std::size_t>(count / static_cast<std::size_t>(comm.size()), 1);
      const Timing s = timed(
          mpi,
          [&] {
            switch (c) {
              case Collective::broadcast:
                comm.broadcast(send.data, count, DType::f32, 0);
                break;
              case Collective::reduce:
                comm.reduce(send.data, recv.data, count, DType::f32, summa::ReduceOp::sum, 0);
                break;
              case Collective::all_reduce:
                comm.all_reduce(send.data, recv.data, count, DType::f32, summa::ReduceOp::sum);
                break;
              case Collective::all_gather:
                comm.all_gather(send.data, recv.data, per_rank, DType::f32);
                break;
              case Collective::reduce_scatter:
                comm.reduce_scatter(send.data, recv.data, per_rank, DType::f32,
                                    summa::ReduceOp::sum);
                break;
            }
            be.synchronize();
          },
          timer, 0.25);
      t.push_back(s.seconds);
      n.push_back(static_cast<double>(bytes));
      spreads.push_back(s.spread);
    }
    // ring: t = steps α + factor n / β
    const double steps = c == Collective::all_reduce ? 2 * (g - 1) : g - 1;
    const double factor = c == Collective::all_reduce                             ? 2 * (g - 1) / g
                          : c == Collective::broadcast || c == Collective::reduce ? 1.0
                                                                                  : (g - 1) / g;
    const LineFit f = fit_line(n, t);
    summa::model::CollectiveCost& cost = level[c];
    cost.algorithm = Algorithm::ring;
    cost.alpha_s = f.a / steps;
    cost.beta_bytes_s = factor / f.b;
    const SplitFit two = fit_two_lines(n, t, f);
    if (two.split > 0) {
      // the first range up to the geometric middle of the sizes either side
      const double edge = std::sqrt(n[two.split - 1] * n[two.split]);
      cost.ranges = {{edge, two.low.a / steps, factor / two.low.b},
                     {n.back(), two.high.a / steps, factor / two.high.b}};
    }
    spread = std::max({spread, median_of(spreads), two.residual});
  }
  return level;
}

// The contention of overlap (Machine::contention), as the library overlaps:
// a GEMM cut into 8 column slices, the all-reduce polled (test) between
// them. Compute-bound pairs (all-reduces of about a quarter and half of the
// GEMM): their extra time over the GEMM alone is the compute's slowdown
// times the all-reduce (compute = (both - gemm) / all-reduce); a comm-bound
// pair (about three GEMMs): its time over the all-reduce alone is the
// collective's (comm = both / all-reduce - 1, when the pair is still bound
// by the collective). The figures are small differences of noisy times, so
// each repetition times the GEMM, the all-reduce and the pair back to back
// (round_robin) and the figure is the median over the repetitions' ratios (2 x
// --reps of them), each at least 0; `spread` is their interquartile range
// (absolute, in the factor's units).
struct ContentionTiming {
  summa::model::Contention factors;
  double spread = 0;
};

ContentionTiming measure_contention(summa::Communicator& comm, MPI_Comm mpi, summa::Backend& be,
                                    const Timer& timer) {
  const summa::index_t s = 512;  // a few milliseconds: the differences below stand out of the noise
  const auto e = sizeof(float);
  Buffer a(be, static_cast<std::size_t>(s * s) * e), b(be, static_cast<std::size_t>(s * s) * e),
      c(be, static_cast<std::size_t>(s * s) * e);
  const auto view = [&](void* p) {
    return summa::MatrixView<float>::dense(static_cast<float*>(p), s, s, summa::Order::row_major);
  };
  const std::size_t scratch_bytes = be.gemm_scratch_bytes(s, s / 8, s, DType::f32);
  Buffer scratch(be, std::max<std::size_t>(scratch_bytes, 64));
  const summa::Scratch sc{scratch.data, scratch_bytes};
  const auto A_ = summa::ConstMatrixView<float>(view(a.data));
  const auto B_ = summa::ConstMatrixView<float>(view(b.data));
  const auto C_ = view(c.data);
  summa::Request pending;
  bool in_flight = false;
  const auto sliced_gemm = [&] {
    for (summa::index_t x = 0; x < s; x += s / 8) {
      be.gemm(summa::Op::N, summa::Op::N, 1.0f, A_, B_.block(0, x, s, s / 8), 0.0f,
              C_.block(0, x, s, s / 8), sc);
      if (in_flight) static_cast<void>(comm.test(pending));
    }
    be.synchronize();
  };
  const double gemm = timed(mpi, sliced_gemm, timer).seconds;
  Buffer send(be, std::size_t{64} << 20), recv(be, std::size_t{64} << 20);
  const auto all_reduce = [&](std::size_t bytes) {
    return [&, bytes] {
      comm.all_reduce(send.data, recv.data, bytes / 4, DType::f32, summa::ReduceOp::sum);
      be.synchronize();
    };
  };
  const auto all_reduce_s = [&](std::size_t bytes) {
    return timed(mpi, all_reduce(bytes), timer).seconds;
  };
  // message sizes whose all-reduce takes about gemm / 4, gemm / 2 and 3 gemm
  const auto size_for = [&](std::size_t from, double target, std::size_t cap) {
    std::size_t bytes = from;
    while (all_reduce_s(bytes) < target && bytes < cap) bytes *= 2;
    return bytes;
  };
  const std::size_t quarter = size_for(256, gemm / 4, std::size_t{8} << 20);
  const std::size_t half = size_for(quarter, gemm / 2, std::size_t{16} << 20);
  const std::size_t large = size_for(half, 3 * gemm, std::size_t{64} << 20);
  const auto both = [&](std::size_t bytes) {
    return [&, bytes] {
      pending = comm.iall_reduce(send.data, recv.data, bytes / 4, DType::f32, summa::ReduceOp::sum);
      in_flight = true;
      sliced_gemm();
      comm.wait(pending);
      in_flight = false;
      be.synchronize();
    };
  };
  const int reps = 2 * timer.reps;
  std::vector<double> compute, comm_bound;
  for (const std::size_t bytes : {quarter, half}) {
    const auto t = round_robin(mpi, {sliced_gemm, all_reduce(bytes), both(bytes)}, timer, reps);
    for (const auto& r : t) compute.push_back(std::max(0.0, (r[2] - r[0]) / std::max(r[1], 1e-12)));
  }
  ContentionTiming out;
  out.factors.compute = median_of(compute);
  const auto t = round_robin(mpi, {sliced_gemm, all_reduce(large), both(large)}, timer, reps);
  for (const auto& r : t)
    if (r[2] >= r[0] * (1 + out.factors.compute))  // still bound by the collective
      comm_bound.push_back(std::max(0.0, r[2] / std::max(r[1], 1e-12) - 1));
  out.factors.comm = median_of(comm_bound);
  out.spread = std::max(iqr_of(compute), iqr_of(comm_bound));
  // the same figures on every rank (round_robin took the slowest rank's times)
  MPI_Bcast(&out.factors.compute, 1, MPI_DOUBLE, 0, mpi);
  MPI_Bcast(&out.factors.comm, 1, MPI_DOUBLE, 0, mpi);
  MPI_Bcast(&out.spread, 1, MPI_DOUBLE, 0, mpi);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int code = 0;
  {
    CLI::App app{"Measures this machine for summa's step-time model and writes a machine file"};
    std::string out, name = "this machine", backend = "cpu", comm = "nccl", dtypes = "f32,f64,bf16";
    bool tf32 = false;
    // longer batches than the 0.02 s x 5 of before: two calibrations in a
    // row agree about five times better here (docs/scaling.md)
    double min_s = 0.06, max_spread = 0;
    int reps = 7, passes = 1;
    summa::index_t max_size = 768;
    app.add_option("--out", out, "Machine file to write (JSON)")->required();
    app.add_option("--name", name, "The machine's name in the file")->capture_default_str();
    app.add_option("--dtype", dtypes,
                   "Element types whose GEMM rates to measure (a comma list of f32, f64, bf16)")
        ->check(CLI::Validator(
            [](std::string& text) -> std::string {
              std::size_t at = 0;
              while (at <= text.size()) {
                const std::size_t comma = std::min(text.find(',', at), text.size());
                const std::string item = text.substr(at, comma - at);
                if (item != "f32" && item != "f64" && item != "bf16")
                  return "'" + item + "' in '" + text + "' is not f32, f64 or bf16";
                at = comma + 1;
              }
              return {};
            },
            "LIST", "dtype list"))
        ->capture_default_str();
    app.add_option("--max-size", max_size,
                   "Largest GEMM dimension of the sweep (at least 32, its smallest size)")
        ->check(summa::flags::integer_in(32, 1 << 15))
        ->capture_default_str();
    app.add_option("--min-seconds", min_s, "Shortest timed batch per measurement")
        ->check(summa::flags::real_in(1e-4, 60))
        ->capture_default_str();
    app.add_option("--reps", reps,
                   "Timed batches per measurement: each figure is their median, its spread "
                   "their interquartile range over it")
        ->check(summa::flags::integer_in(3, 1000))
        ->capture_default_str();
    app.add_option("--passes", passes,
                   "Whole calibrations made one after the other, each figure the median over "
                   "them (a machine whose speed drifts over minutes: its spread then includes "
                   "their movement); the run takes this many times as long")
        ->check(summa::flags::integer_in(1, 100))
        ->capture_default_str();
    app.add_option("--max-spread", max_spread,
                   "Refuse to write the file when a figure's spread exceeds this fraction (a "
                   "loaded or noisy machine; 0: warn above 0.1 and write)")
        ->check(summa::flags::real_in(0, 1))
        ->capture_default_str();
    std::vector<std::string> gpt_texts;
    std::vector<int> gpt_ranks;
    app.add_option("--gpt", gpt_texts,
                   "Also measure every local GEMM shape of this GPT (\"layers=2,hidden=192,"
                   "heads=24,seq=32,batch=24,vocab=1536\") under every scheme of --ranks; "
                   "repeatable");
    app.add_option("--ranks", gpt_ranks,
                   "Rank counts whose schemes --gpt covers (default: the world size; at most "
                   "65536: every scheme of each is priced)")
        ->delimiter(',')
        ->check(CLI::Range(1, 1 << 16));
    summa::bench::add_device_options(app, backend, comm, tf32, "", "cuda: TF32 in float GEMMs");
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      code = summa::flags::parse_exit(app, e, "calibrate");
      MPI_Finalize();
      return code;
    }
    try {
      // --out is checked before the measurement: its folder must take a new
      // file, and what is there already must be a regular file (a device or
      // a FIFO is refused, not replaced); agreed, so every rank stops alike
      // a link is written through; a dangling or looping one would be
      // replaced by the file, which is not what its maker meant: refused
      if (out.empty())  // (was: measured, then "renaming … over '' failed")
        throw UsageError("--out must name a file (it is empty)");
      summa::on_root_agreed(MPI_COMM_WORLD, [&] {
        summa::io::require_not_broken_link(out, "--out:");
        const summa::io::AtomicFile probe(out, "--out");
        // a file already there is replaced only when it is an earlier
        // calibration (a machine file whose "source" says calibrate wrote
        // it): never a file of something else (was: `--out notes.txt`
        // replaced the notes) nor a machine file written by hand (was: a
        // copy of perlmutter.json, published figures, replaced)
        namespace fs = std::filesystem;
        std::error_code ec;
        if (fs::is_regular_file(out, ec) && fs::file_size(out, ec) > 0) {
          constexpr std::uint64_t kMaxMachineFile = 16 << 20;
          const bool small = fs::file_size(out, ec) <= kMaxMachineFile;
          const auto j = small ? nlohmann::json::parse(
                                     summa::io::read_small_file(out, kMaxMachineFile, "--out"),
                                     nullptr, /*allow_exceptions=*/false)
                               : nlohmann::json();
          if (!j.is_object() || !j.contains("device"))
            throw UsageError("--out: '" + out +
                             "' holds something other than a machine file (not a JSON object "
                             "with a \"device\"): refusing to replace it; choose another --out, "
                             "or remove the file");
          if (!j.contains("source") || !j["source"].is_string() ||
              !j["source"].get<std::string>().starts_with(kCalibrateSource))
            throw UsageError("--out: '" + out +
                             "' is a machine file calibrate did not write (its \"source\" does "
                             "not start \"" +
                             std::string(kCalibrateSource) +
                             "\"): refusing to replace it; choose another --out, or remove the "
                             "file");
        }
      });
      const auto t0 = std::chrono::steady_clock::now();
      const Timer timer{.min_s = min_s, .reps = reps};
      auto dev = summa::bench::make_backend<UsageError>(backend, comm, tf32,
                                                        app.count("--comm") > 0, "calibrate");
      summa::Backend& be = *dev.backend;
      const Probe probe_start = probe(be, timer);
      MPI_Comm node;
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank(), MPI_INFO_NULL, &node);
      int per_node = 1, local = 0, ranks = 1;
      MPI_Comm_size(node, &per_node);
      MPI_Comm_rank(node, &local);
      MPI_Comm_size(MPI_COMM_WORLD, &ranks);
      MPI_Comm across;
      MPI_Comm_split(MPI_COMM_WORLD, local, world_rank(), &across);
      int nodes = 1;
      MPI_Comm_size(across, &nodes);
      std::vector<GptPoint> gpts;
      for (const std::string& t : gpt_texts) gpts.push_back(parse_gpt(t));
      // the backend's memory per rank for the --gpt shapes' operands (the
      // node's on the CPU, the device's free memory on a GPU)
      const double available = summa::available_memory_per_rank(MPI_COMM_WORLD, be);
      if (gpt_ranks.empty()) gpt_ranks.push_back(ranks);
      std::size_t gpt_shape_count = 0;
      // One whole calibration; --passes makes several, one after the
      // other, and keeps each figure's median over them.
      const auto measure_pass = [&] {
        summa::model::Machine m;
        m.name = name;
        m.devices_per_node = per_node;
        m.device.name = dev.device;
        m.device.gemm_library = std::string(be.name());
        if (const auto* cpu = dynamic_cast<const summa::CpuBackend*>(&be))
          m.device.gemm_library += " (" + cpu->gemm_detail() + ")";
        m.device.memory_bytes = 0;
        for (const std::string& t : {std::string("f32"), std::string("f64"), std::string("bf16")}) {
          if (dtypes.find(t) == std::string::npos) continue;
          const DType dt = t == "f32" ? DType::f32 : t == "f64" ? DType::f64 : DType::bf16;
          const auto extra = gpt_shapes(gpts, gpt_ranks, dt);
          gpt_shape_count = std::max(gpt_shape_count, extra.size());
          require_gemms_fit(extra, summa::size_of(dt), available,
                            summa::available_memory_source(be), t);
          auto& pw = m.device.pointwise[static_cast<std::size_t>(dt)];
          double& gemm_spread = m.spread.gemm[static_cast<std::size_t>(dt)];
          double& pointwise_spread = m.spread.pointwise[static_cast<std::size_t>(dt)];
          if (dt == DType::f32) {
            m.device.gemm_of(dt) = measure_gemm<float>(be, timer, max_size, extra, gemm_spread);
            pw = measure_pointwise<float>(be, timer, pointwise_spread);
          } else if (dt == DType::f64) {
            m.device.gemm_of(dt) = measure_gemm<double>(be, timer, max_size, extra, gemm_spread);
            pw = measure_pointwise<double>(be, timer, pointwise_spread);
          } else {
            m.device.gemm_of(dt) =
                measure_gemm<summa::bf16>(be, timer, max_size, extra, gemm_spread);
            pw = measure_pointwise<summa::bf16>(be, timer, pointwise_spread);
          }
        }
        m.device.memory_bandwidth = measure_bandwidth(be, timer, m.spread.memory_bandwidth);
        m.device.launch_s = measure_launch(be, timer);
        // memory: the host's (cpu) or the device's, as the backend reports it
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
        m.device.memory_bytes = static_cast<std::uint64_t>(pages) *
                                static_cast<std::uint64_t>(page) /
                                static_cast<std::uint64_t>(per_node);
        summa::TrafficCounter c_intra, c_inter;
        if (per_node > 1) {
          summa::MpiCommunicator intra(node, false, summa::CommAxis::other, &c_intra);
          m.intra_node = measure_links(intra, node, be, timer, m.spread.intra_node);
        }
        if (nodes > 1) {
          summa::MpiCommunicator inter(across, false, summa::CommAxis::other, &c_inter);
          m.inter_node = measure_links(inter, across, be, timer, m.spread.inter_node);
        }
        // overlap's contention: on the node's links where there are some
        ContentionTiming contention;
        if (per_node > 1) {
          summa::TrafficCounter c_overlap;
          summa::MpiCommunicator intra(node, false, summa::CommAxis::other, &c_overlap);
          contention = measure_contention(intra, node, be, timer);
        } else if (nodes > 1) {
          summa::TrafficCounter c_overlap;
          summa::MpiCommunicator inter(across, false, summa::CommAxis::other, &c_overlap);
          contention = measure_contention(inter, across, be, timer);
        }
        m.contention = contention.factors;
        m.spread.contention = contention.spread;
        return m;
      };
      std::vector<summa::model::Machine> pass_machines;
      for (int pass = 0; pass < passes; ++pass) {
        if (passes > 1 && world_rank() == 0)
          std::printf("calibrate: pass %d of %d\n", pass + 1, passes);
        pass_machines.push_back(measure_pass());
      }
      summa::model::Machine m = median_of_passes(pass_machines);
      std::string links_note;
      if (per_node == 1 && nodes == 1) {
        for (Collective c : summa::model::all_collectives)
          m.intra_node[c] = {1e-6, 1e10, Algorithm::ring, {}};
        m.inter_node = m.intra_node;
        links_note = "links NOT measured (one rank): placeholder alpha 1 us, beta 10 GB/s";
      } else if (nodes == 1) {
        m.inter_node = m.intra_node;
        m.spread.inter_node = m.spread.intra_node;
        links_note = "one node: inter_node copies intra_node";
      } else if (per_node == 1) {
        m.intra_node = m.inter_node;
        m.spread.intra_node = m.spread.inter_node;
        links_note = "one rank per node: intra_node copies inter_node";
      } else {
        links_note = "intra_node and inter_node measured";
      }
      MPI_Comm_free(&across);
      MPI_Comm_free(&node);
      const double drift = drift_between(probe_start, probe(be, timer));
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      // The spreads: each figure's movement over its repetitions. A loaded
      // machine (another job on the cores, a noisy neighbour) shows here;
      // so does the node's load beyond these ranks.
      std::vector<std::pair<std::string, double>> spreads;
      for (DType t : {DType::f32, DType::f64, DType::bf16})
        if (m.device.gemm_of(t).peak_flops > 0) {
          const auto k = static_cast<std::size_t>(t);
          spreads.emplace_back(fmt::format("gemm {}", summa::name_of(t)), m.spread.gemm[k]);
          spreads.emplace_back(fmt::format("kernels {}", summa::name_of(t)), m.spread.pointwise[k]);
        }
      spreads.emplace_back("element-wise bandwidth", m.spread.memory_bandwidth);
      if (per_node > 1) spreads.emplace_back("intra-node collectives", m.spread.intra_node);
      if (nodes > 1) spreads.emplace_back("inter-node collectives", m.spread.inter_node);
      // absolute (the factors' own units): 0.1 is 10 percentage points of slowdown
      if (per_node > 1 || nodes > 1)
        spreads.emplace_back("overlap contention", m.spread.contention);
      // the probe's change from the start to the end: two calibrations can
      // agree no better than the machine holds still
      spreads.emplace_back("drift (start to end)", drift);
      double load = 0;  // the node's 1-minute load average beyond these ranks, per core
      if (double avg[1]; getloadavg(avg, 1) == 1) {
        const double cores = static_cast<double>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
        load = std::max(0.0, avg[0] - per_node) / cores;
      }
      const double limit = max_spread > 0 ? max_spread : 0.1;
      std::string noisy;
      for (const auto& [what, v] : spreads)
        if (v > limit)
          noisy += fmt::format("{}{} {:.1f} %", noisy.empty() ? "" : ", ", what, 100 * v);
      const std::string spread_note =
          noisy.empty() ? fmt::format("every figure's spread within {:.0f} %", 100 * limit)
                        : fmt::format("spreads above {:.0f} %: {}", 100 * limit, noisy);
      m.source = fmt::format(
          "{} on {} rank(s), {} per node, backend {}: GEMM tables "
          "measured with every rank multiplying at once ({} shapes of {} --gpt "
          "configuration(s) included), element-wise bandwidth from axpby, the per-call overhead "
          "from 64 one-element axpby calls, GeLU / softmax / exp / LayerNorm "
          "kernel rates (timed round robin), collectives from 8 B to 4 MiB (ring formulas fitted "
          "by least squares over 11 sizes, by two size ranges where one line fits badly), "
          "overlap's contention from a sliced GEMM beside an all-reduce (paired repetitions); "
          "each figure the median of "
          "{} repetitions{}, {} (\"spread\"); {}; {:.1f} s, {}",
          kCalibrateSource, ranks, per_node, backend, gpt_shape_count, gpts.size(), reps,
          passes > 1 ? fmt::format(" and then of {} whole passes (--passes)", passes)
                     : std::string(),
          spread_note, links_note, seconds, when_and_where());
      if (!noisy.empty() || load > 0.25) {
        const std::string why = fmt::format(
            "the figures moved between repetitions ({}){}: the machine looks loaded or noisy",
            noisy.empty() ? spread_note : noisy,
            load > 0.25 ? fmt::format("; load average {:.1f} per core beyond these ranks", load)
                        : std::string());
        if (max_spread > 0 && !noisy.empty())
          throw UsageError(fmt::format(
              "{}; not written (--max-spread {}): rerun on an idle machine, with more --reps "
              "or --min-seconds, or raise --max-spread",
              why, max_spread));
        if (world_rank() == 0)
          std::fprintf(stderr,
                       "calibrate: warning: %s; predictions from this file are as "
                       "uncertain (their interval: predicted_step_s_low/high)\n",
                       why.c_str());
      }
      if (world_rank() == 0) {
        summa::io::save_machine(out, m);
        std::printf("calibrate: wrote %s in %.1f s\n", out.c_str(), seconds);
        for (DType t : {DType::f32, DType::f64, DType::bf16})
          if (m.device.gemm_of(t).peak_flops > 0)
            std::printf("  gemm %-4s peak %.2f GFLOP/s per rank\n",
                        std::string(summa::name_of(t)).c_str(),
                        m.device.gemm_of(t).peak_flops / 1e9);
        if (m.contention.any() || ranks > 1)
          std::printf(
              "  overlap: compute %.0f %% slower beside a collective, the collective "
              "%.0f %% slower beside compute\n",
              100 * m.contention.compute, 100 * m.contention.comm);
        std::printf("  element-wise %.2f GB/s per rank, %.2f us per kernel call\n",
                    m.device.memory_bandwidth / 1e9, m.device.launch_s * 1e6);
        std::printf("  all_reduce alpha %.2f us beta %.2f GB/s (%s)\n",
                    m.intra_node[Collective::all_reduce].alpha_s * 1e6,
                    m.intra_node[Collective::all_reduce].beta_bytes_s / 1e9, links_note.c_str());
        for (Collective c : summa::model::all_collectives)
          for (const summa::model::CollectiveCost::Range& r : m.intra_node[c].ranges)
            std::printf("  %-14s up to %9.0f bytes: alpha %.2f us beta %.2f GB/s\n",
                        std::string(summa::model::name_of(c)).c_str(), r.up_to_bytes,
                        r.alpha_s * 1e6, r.beta_bytes_s / 1e9);
        for (const auto& [what, v] : spreads)
          std::printf("  spread %-24s %5.1f %%\n", what.c_str(), 100 * v);
      }
    } catch (const std::exception& e) {
      summa::flags::print_once("calibrate", e);
      code = 2;
    }
  }
  MPI_Finalize();
  return code;
}

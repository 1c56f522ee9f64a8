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
//   (inter_node), at message sizes from 8 bytes to 4 MiB; α from the
//   smallest message, β from the slope between the two largest, under the
//   ring algorithm's formulas. With one node the inter-node level copies
//   the intra-node one; with one rank no collective can be measured and the
//   links keep placeholder figures (the file's "source" says which).
// Every figure is the median over ranks of each rank's best of a few
// repetitions. Under a minute on a 2-core machine.
#include <mpi.h>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
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

// Best seconds per call of f over `batches` batches of calls lasting at
// least `min_s` each (after one timed warm-up call). The ranks of `comm`
// agree on the number of calls (f may be a collective) and start each
// batch together.
template <class F>
double best_seconds(MPI_Comm comm, F&& f, double min_s, int batches = 3) {
  MPI_Barrier(comm);
  auto t0 = std::chrono::steady_clock::now();
  f();
  double once = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MPI_Allreduce(MPI_IN_PLACE, &once, 1, MPI_DOUBLE, MPI_MAX, comm);
  const int calls = static_cast<int>(std::clamp(std::ceil(min_s / std::max(once, 1e-9)), 1.0, 1e6));
  double best = 1e300;
  for (int b = 0; b < batches; ++b) {
    MPI_Barrier(comm);
    t0 = std::chrono::steady_clock::now();
    for (int c = 0; c < calls; ++c) f();
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / calls);
  }
  return best;
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
// and small local blocks, plus `extra` (the shapes of --gpt configurations,
// a batched product timed as one strided-batched call, as the layers make
// it, and its rate per product).
template <class T>
summa::model::GemmModel measure_gemm(summa::Backend& be, double min_s, summa::index_t max_size,
                                     const std::vector<summa::model::GemmShape>& extra) {
  using A = summa::acc_t<T>;
  using summa::model::GemmShape;
  std::vector<GemmShape> shapes;
  for (summa::index_t s : {32, 64, 128, 256, 512, 768})
    if (s <= max_size) shapes.push_back({s, s, s, 1});
  for (auto [a, b] :
       {std::pair<summa::index_t, summa::index_t>{512, 64}, {512, 128}, {256, 32}, {768, 96}})
    if (a <= max_size)
      for (GemmShape sh : {GemmShape{a, a, b, 1}, GemmShape{a, b, a, 1}, GemmShape{b, a, a, 1}})
        shapes.push_back(sh);
  for (const GemmShape& sh : extra)
    if (std::find_if(shapes.begin(), shapes.end(), [&](const GemmShape& o) {
          return o.m == sh.m && o.n == sh.n && o.k == sh.k;
        }) == shapes.end())
      shapes.push_back(sh);
  summa::model::GemmModel g{.peak_flops = 0, .max_efficiency = 1, .half_flops = 0, .table = {}};
  std::vector<double> rates;
  const std::size_t e = sizeof(T);
  for (const auto& [m, n, k, batch] : shapes) {
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
    const auto A_ = summa::ConstMatrixView<T>(view(a.data, m, k));
    const auto B_ = summa::ConstMatrixView<T>(view(b.data, k, n));
    const auto C_ = view(c.data, m, n);
    const double s = best_seconds(
        MPI_COMM_WORLD,
        [&, batch = batch] {
          if (batch == 1)
            be.gemm(summa::Op::N, summa::Op::N, A(1), A_, B_, A(0), C_, sc);
          else
            be.gemm_strided_batched(summa::Op::N, summa::Op::N, A(1), A_, m * k, B_, k * n, A(0),
                                    C_, m * n, batch, sc);
          be.synchronize();
        },
        min_s);
    const double rate = median_over(
        MPI_COMM_WORLD, 2.0 * static_cast<double>(m * n * k) * static_cast<double>(batch) / s);
    rates.push_back(rate);
    g.peak_flops = std::max(g.peak_flops, rate);
  }
  for (std::size_t i = 0; i < shapes.size(); ++i)
    g.table.push_back({.m = shapes[i].m,
                       .n = shapes[i].n,
                       .k = shapes[i].k,
                       .efficiency = std::max(1e-6, rates[i] / g.peak_flops)});
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
                                                                    double min_s) {
  using A = summa::acc_t<T>;
  using summa::model::Pointwise;
  std::array<double, summa::model::pointwise_count> rate{};
  const auto view = [](void* p, summa::index_t r, summa::index_t c) {
    return summa::MatrixView<T>::dense(static_cast<T*>(p), r, c, summa::Order::row_major);
  };
  const auto cview = [&](void* p, summa::index_t r, summa::index_t c) {
    return summa::ConstMatrixView<T>(view(p, r, c));
  };
  const auto per_second = [&](double elements, auto&& kernel) {
    const double sec = best_seconds(
        MPI_COMM_WORLD,
        [&] {
          kernel();
          be.synchronize();
        },
        min_s);
    return median_over(MPI_COMM_WORLD, elements / sec);
  };
  const summa::index_t rows = 1024, cols = 1024, n = rows * cols, s = 64;
  Buffer x(be, static_cast<std::size_t>(n) * sizeof(T)),
      y(be, static_cast<std::size_t>(n) * sizeof(T)),
      dy(be, static_cast<std::size_t>(n) * sizeof(T));
  Buffer max(be, static_cast<std::size_t>(rows) * sizeof(A)),
      sum(be, static_cast<std::size_t>(rows) * sizeof(A)),
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
  }
  auto& at = rate;
  at[static_cast<std::size_t>(Pointwise::gelu)] = per_second(static_cast<double>(n), [&] {
    be.gelu_forward(cview(x.data, rows, cols), view(y.data, rows, cols));
  });
  at[static_cast<std::size_t>(Pointwise::gelu_grad)] = per_second(static_cast<double>(n), [&] {
    be.gelu_backward(cview(x.data, rows, cols), cview(dy.data, rows, cols),
                     view(y.data, rows, cols));
  });
  at[static_cast<std::size_t>(Pointwise::softmax)] = per_second(static_cast<double>(n), [&] {
    for (summa::index_t b = 0; b < n / (s * s); ++b) {
      T* const block = static_cast<T*>(x.data) + b * s * s;
      T* const out = static_cast<T*>(y.data) + b * s * s;
      be.softmax_causal(summa::ConstMatrixView<T>(view(block, s, s)), 0.125, view(out, s, s));
    }
  });
  std::vector<std::int32_t> host_targets(static_cast<std::size_t>(rows), 3);
  Buffer targets(be, host_targets.size() * sizeof(std::int32_t));
  be.upload(targets.data, host_targets.data(), host_targets.size() * sizeof(std::int32_t));
  // One exp pass each: row_sum_exp, and cross_entropy_grad (on a copy of
  // the logits, in place).
  const double sum_exp =
      1.0 / per_second(static_cast<double>(n), [&] {
        be.row_sum_exp(cview(x.data, rows, cols), static_cast<const A*>(max.data),
                       static_cast<A*>(sum.data));
      });
  const double grad =
      1.0 / per_second(static_cast<double>(n), [&] {
        be.cross_entropy_grad(view(y.data, rows, cols), static_cast<const A*>(max.data),
                              static_cast<const A*>(sum.data),
                              static_cast<const std::int32_t*>(targets.data), 0, 1.0);
      });
  at[static_cast<std::size_t>(Pointwise::exp)] = 2.0 / (sum_exp + grad);
  const A* mean = static_cast<const A*>(max.data);
  const A* rstd = static_cast<const A*>(sum.data);
  const T* g = static_cast<const T*>(gamma.data);
  at[static_cast<std::size_t>(Pointwise::layernorm)] = per_second(static_cast<double>(n), [&] {
    be.layernorm_partial_sums(cview(x.data, rows, cols), nullptr, static_cast<A*>(max.data));
    be.layernorm_mean(rows, cols, mean, static_cast<A*>(max.data));
    be.layernorm_partial_sums(cview(x.data, rows, cols), mean, static_cast<A*>(sum.data));
    be.layernorm_rstd(rows, cols, 1e-5, rstd, static_cast<A*>(sum.data));
    be.layernorm_apply(cview(x.data, rows, cols), mean, rstd, g, g + cols,
                       view(y.data, rows, cols));
  });
  at[static_cast<std::size_t>(Pointwise::layernorm_grad)] = per_second(static_cast<double>(n), [&] {
    T* const p = static_cast<T*>(partial.data);
    A* const a = static_cast<A*>(ab.data);
    be.layernorm_param_partials(cview(x.data, rows, cols), cview(dy.data, rows, cols), mean, rstd,
                                p, p + cols);
    be.layernorm_backward_partials(cview(x.data, rows, cols), cview(dy.data, rows, cols), mean,
                                   rstd, g, a, a + rows);
    be.layernorm_backward_apply(cview(x.data, rows, cols), cview(dy.data, rows, cols), mean, rstd,
                                g, a, a + rows, cols, view(y.data, rows, cols));
  });
  return rate;
}

double measure_bandwidth(summa::Backend& be, double min_s) {
  const summa::index_t n = summa::index_t{1} << 22;  // 16 MiB of floats per array
  Buffer x(be, static_cast<std::size_t>(n) * 4), y(be, static_cast<std::size_t>(n) * 4);
  const auto view = [&](void* p) {
    return summa::MatrixView<float>::dense(static_cast<float*>(p), 1, n, summa::Order::row_major);
  };
  const double s = best_seconds(
      MPI_COMM_WORLD,
      [&] {
        be.axpby(1.0f, summa::ConstMatrixView<float>(view(x.data)), 0.5f, view(y.data));
        be.synchronize();
      },
      min_s);
  return median_over(MPI_COMM_WORLD, 3.0 * 4.0 * static_cast<double>(n) / s);
}

// α and β of each collective on `comm` (its own counter), ring formulas.
summa::model::LinkLevel measure_links(summa::Communicator& comm, MPI_Comm mpi, summa::Backend& be,
                                      double min_s) {
  summa::model::LinkLevel level;
  const auto g = static_cast<double>(comm.size());
  const std::vector<std::size_t> sizes = {8, 1 << 16, 1 << 20, 1 << 22};  // bytes per buffer
  Buffer send(be, sizes.back() * static_cast<std::size_t>(comm.size())),
      recv(be, sizes.back() * static_cast<std::size_t>(comm.size()));
  for (Collective c : summa::model::all_collectives) {
    std::vector<double> t;
    for (std::size_t bytes : sizes) {
      const std::size_t count = std::max<std::size_t>(bytes / 4, 1);
      // all-gather / reduce-scatter: `bytes` is the whole buffer (the model's n)
      const std::size_t per_rank =
          std::max<std::size_t>(count / static_cast<std::size_t>(comm.size()), 1);
      const double s = best_seconds(
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
          min_s / 4);
      t.push_back(median_over(mpi, s));
    }
    // ring: t = steps α + factor n / β
    const double steps = c == Collective::all_reduce ? 2 * (g - 1) : g - 1;
    const double factor = c == Collective::all_reduce                             ? 2 * (g - 1) / g
                          : c == Collective::broadcast || c == Collective::reduce ? 1.0
                                                                                  : (g - 1) / g;
    const double n1 = static_cast<double>(sizes[sizes.size() - 2]),
                 n2 = static_cast<double>(sizes.back());
    const double slope = (t.back() - t[t.size() - 2]) / (n2 - n1);
    summa::model::CollectiveCost& cost = level[c];
    cost.algorithm = Algorithm::ring;
    cost.alpha_s = std::max(0.0, t.front() / steps);
    cost.beta_bytes_s = slope > 0 ? factor / slope : factor * n2 / t.back();
  }
  return level;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int code = 0;
  {
    CLI::App app{"Measures this machine for summa's step-time model and writes a machine file"};
    std::string out, name = "this machine", backend = "cpu", comm = "nccl", dtypes = "f32,f64,bf16";
    bool tf32 = false;
    double min_s = 0.02;
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
      auto dev = summa::bench::make_backend<UsageError>(backend, comm, tf32,
                                                        app.count("--comm") > 0, "calibrate");
      summa::Backend& be = *dev.backend;
      summa::model::Machine m;
      m.name = name;
      MPI_Comm node;
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank(), MPI_INFO_NULL, &node);
      int per_node = 1, local = 0, ranks = 1;
      MPI_Comm_size(node, &per_node);
      MPI_Comm_rank(node, &local);
      MPI_Comm_size(MPI_COMM_WORLD, &ranks);
      m.devices_per_node = per_node;
      m.device.name = dev.device;
      m.device.gemm_library = std::string(be.name());
      if (const auto* cpu = dynamic_cast<const summa::CpuBackend*>(&be))
        m.device.gemm_library += " (" + cpu->gemm_detail() + ")";
      m.device.memory_bytes = 0;
      std::vector<GptPoint> gpts;
      for (const std::string& t : gpt_texts) gpts.push_back(parse_gpt(t));
      // the backend's memory per rank for the --gpt shapes' operands (the
      // node's on the CPU, the device's free memory on a GPU)
      const double available = summa::available_memory_per_rank(MPI_COMM_WORLD, be);
      if (gpt_ranks.empty()) gpt_ranks.push_back(ranks);
      std::size_t gpt_shape_count = 0;
      for (const std::string& t : {std::string("f32"), std::string("f64"), std::string("bf16")}) {
        if (dtypes.find(t) == std::string::npos) continue;
        const DType dt = t == "f32" ? DType::f32 : t == "f64" ? DType::f64 : DType::bf16;
        const auto extra = gpt_shapes(gpts, gpt_ranks, dt);
        gpt_shape_count = std::max(gpt_shape_count, extra.size());
        require_gemms_fit(extra, summa::size_of(dt), available, summa::available_memory_source(be),
                          t);
        auto& pw = m.device.pointwise[static_cast<std::size_t>(dt)];
        if (dt == DType::f32) {
          m.device.gemm_of(dt) = measure_gemm<float>(be, min_s, max_size, extra);
          pw = measure_pointwise<float>(be, min_s);
        } else if (dt == DType::f64) {
          m.device.gemm_of(dt) = measure_gemm<double>(be, min_s, max_size, extra);
          pw = measure_pointwise<double>(be, min_s);
        } else {
          m.device.gemm_of(dt) = measure_gemm<summa::bf16>(be, min_s, max_size, extra);
          pw = measure_pointwise<summa::bf16>(be, min_s);
        }
      }
      m.device.memory_bandwidth = measure_bandwidth(be, min_s);
      // memory: the host's (cpu) or the device's, as the backend reports it
      long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
      m.device.memory_bytes = static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) /
                              static_cast<std::uint64_t>(per_node);
      std::string links_note;
      summa::TrafficCounter c_intra, c_inter;
      if (per_node > 1) {
        summa::MpiCommunicator intra(node, false, summa::CommAxis::other, &c_intra);
        m.intra_node = measure_links(intra, node, be, min_s);
      }
      MPI_Comm across;
      MPI_Comm_split(MPI_COMM_WORLD, local, world_rank(), &across);
      int nodes = 1;
      MPI_Comm_size(across, &nodes);
      if (nodes > 1) {
        summa::MpiCommunicator inter(across, false, summa::CommAxis::other, &c_inter);
        m.inter_node = measure_links(inter, across, be, min_s);
      }
      if (per_node == 1 && nodes == 1) {
        for (Collective c : summa::model::all_collectives)
          m.intra_node[c] = {1e-6, 1e10, Algorithm::ring};
        m.inter_node = m.intra_node;
        links_note = "links NOT measured (one rank): placeholder alpha 1 us, beta 10 GB/s";
      } else if (nodes == 1) {
        m.inter_node = m.intra_node;
        links_note = "one node: inter_node copies intra_node";
      } else if (per_node == 1) {
        m.intra_node = m.inter_node;
        links_note = "one rank per node: intra_node copies inter_node";
      } else {
        links_note = "intra_node and inter_node measured";
      }
      MPI_Comm_free(&across);
      MPI_Comm_free(&node);
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      m.source = fmt::format(
          "{} on {} rank(s), {} per node, backend {}: GEMM tables "
          "measured with every rank multiplying at once ({} shapes of {} --gpt "
          "configuration(s) included), element-wise bandwidth from axpby, GeLU / softmax / exp "
          "kernel rates, collectives from 8 B to 4 MiB (ring formulas fitted); {}; {:.1f} s",
          kCalibrateSource, ranks, per_node, backend, gpt_shape_count, gpts.size(), links_note,
          seconds);
      if (world_rank() == 0) {
        summa::io::save_machine(out, m);
        std::printf("calibrate: wrote %s in %.1f s\n", out.c_str(), seconds);
        for (DType t : {DType::f32, DType::f64, DType::bf16})
          if (m.device.gemm_of(t).peak_flops > 0)
            std::printf("  gemm %-4s peak %.2f GFLOP/s per rank\n",
                        std::string(summa::name_of(t)).c_str(),
                        m.device.gemm_of(t).peak_flops / 1e9);
        std::printf("  element-wise %.2f GB/s per rank\n", m.device.memory_bandwidth / 1e9);
        std::printf("  all_reduce alpha %.2f us beta %.2f GB/s (%s)\n",
                    m.intra_node[Collective::all_reduce].alpha_s * 1e6,
                    m.intra_node[Collective::all_reduce].beta_bytes_s / 1e9, links_note.c_str());
      }
    } catch (const std::exception& e) {
      summa::flags::print_once("calibrate", e);
      code = 2;
    }
  }
  MPI_Finalize();
  return code;
}

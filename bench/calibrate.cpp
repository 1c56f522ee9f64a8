// calibrate: measures the machine it runs on and writes a machine file for
// the step-time model (summa/model/machine.hpp, docs/scaling.md):
//
//   mpirun -np N calibrate --out machines/this-machine.json [--backend cpu|cuda]
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
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <unistd.h>

#include "bench_device.hpp"
#include "summa/io/machine_file.hpp"

namespace {

using summa::DType;
using summa::model::Algorithm;
using summa::model::Collective;

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

template <class T>
summa::model::GemmModel measure_gemm(summa::Backend& be, double min_s, summa::index_t max_size) {
  using A = summa::acc_t<T>;
  // square sizes, then the skinny shapes of panels and local blocks
  std::vector<std::array<summa::index_t, 3>> shapes;
  for (summa::index_t s : {32, 64, 128, 256, 512, 768})
    if (s <= max_size) shapes.push_back({s, s, s});
  for (auto [a, b] :
       {std::pair<summa::index_t, summa::index_t>{512, 64}, {512, 128}, {256, 32}, {768, 96}})
    for (auto sh : {std::array{a, a, b}, std::array{a, b, a}, std::array{b, a, a}})
      if (a <= max_size) shapes.push_back(sh);
  summa::model::GemmModel g{.peak_flops = 0, .max_efficiency = 1, .half_flops = 0, .table = {}};
  std::vector<double> rates;
  const std::size_t e = sizeof(T);
  for (const auto& [m, n, k] : shapes) {
    Buffer a(be, static_cast<std::size_t>(m * k) * e), b(be, static_cast<std::size_t>(k * n) * e),
        c(be, static_cast<std::size_t>(m * n) * e);
    const auto view = [](void* p, summa::index_t r, summa::index_t cc) {
      return summa::MatrixView<T>::dense(static_cast<T*>(p), r, cc, summa::Order::row_major);
    };
    const std::size_t scratch_bytes = be.gemm_scratch_bytes(m, n, k, summa::dtype_v<T>);
    Buffer scratch(be, std::max<std::size_t>(scratch_bytes, 64));
    const double s = best_seconds(
        MPI_COMM_WORLD,
        [&] {
          be.gemm(summa::Op::N, summa::Op::N, A(1), summa::ConstMatrixView<T>(view(a.data, m, k)),
                  summa::ConstMatrixView<T>(view(b.data, k, n)), A(0), view(c.data, m, n),
                  summa::Scratch{scratch.data, scratch_bytes});
          be.synchronize();
        },
        min_s);
    const double rate = median_over(MPI_COMM_WORLD, 2.0 * static_cast<double>(m * n * k) / s);
    rates.push_back(rate);
    g.peak_flops = std::max(g.peak_flops, rate);
  }
  for (std::size_t i = 0; i < shapes.size(); ++i)
    g.table.push_back({.m = shapes[i][0],
                       .n = shapes[i][1],
                       .k = shapes[i][2],
                       .efficiency = std::max(1e-6, rates[i] / g.peak_flops)});
  return g;
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
    app.add_option("--dtype", dtypes, "Element types whose GEMM rates to measure")
        ->capture_default_str();
    app.add_option("--max-size", max_size, "Largest GEMM dimension of the sweep")
        ->capture_default_str();
    app.add_option("--min-seconds", min_s, "Shortest timed batch per measurement")
        ->capture_default_str();
    summa::bench::add_device_options(app, backend, comm, tf32, "", "cuda: TF32 in float GEMMs");
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      code = world_rank() == 0 ? app.exit(e) : (e.get_exit_code() != 0 ? 1 : 0);
      MPI_Finalize();
      return code;
    }
    try {
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
      m.device.memory_bytes = 0;
      for (const std::string& t : {std::string("f32"), std::string("f64"), std::string("bf16")}) {
        if (dtypes.find(t) == std::string::npos) continue;
        if (t == "f32") m.device.gemm_of(DType::f32) = measure_gemm<float>(be, min_s, max_size);
        if (t == "f64") m.device.gemm_of(DType::f64) = measure_gemm<double>(be, min_s, max_size);
        if (t == "bf16")
          m.device.gemm_of(DType::bf16) = measure_gemm<summa::bf16>(be, min_s, max_size);
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
          "calibrate (bench/calibrate.cpp) on {} rank(s), {} per node, backend {}: GEMM tables "
          "measured with every rank multiplying at once, element-wise bandwidth from axpby, "
          "collectives from 8 B to 4 MiB (ring formulas fitted); {}; {:.1f} s",
          ranks, per_node, backend, links_note, seconds);
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
      if (world_rank() == 0) std::fprintf(stderr, "calibrate: %s\n", e.what());
      code = 1;
    }
  }
  MPI_Finalize();
  return code;
}

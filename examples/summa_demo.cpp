// The main demo: a distributed GEMM C = A B on a q x q mesh (q from the rank
// count), checked against a serial product on rank 0 and timed.
//
//   mpirun -np 4 ./summa_demo [n] [panel]
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string_view>
#include <vector>

#include "flag_checks.hpp"
#include "summa/summa.hpp"

namespace {

// Deterministic value of global element (i, j) of matrix `id`, so every rank
// can fill its block and rank 0 can rebuild the whole matrix.
double element(int id, summa::index_t i, summa::index_t j) {
  std::uint64_t x = static_cast<std::uint64_t>(id) * 0x9E3779B97F4A7C15ULL ^
                    static_cast<std::uint64_t>(i) * 0xBF58476D1CE4E5B9ULL ^
                    static_cast<std::uint64_t>(j) * 0x94D049BB133111EBULL;
  x ^= x >> 31;
  x *= 0xD6E8FEB86659FD39ULL;
  x ^= x >> 28;
  return static_cast<double>(x >> 11) / static_cast<double>(1ULL << 53) - 0.5;
}

int run(int argc, char** argv) {
  using summa::index_t;
  if (argc > 1 && (std::string_view(argv[1]) == "--help" || std::string_view(argv[1]) == "-h")) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0)
      std::printf(
          "usage: mpirun -np Q*Q %s [n] [panel]\n  C = A B of n x n matrices (default 1536) "
          "on a QxQ mesh, SUMMA panels of `panel` columns (default 256; 0: a whole block), "
          "checked against a serial product and timed\n",
          argv[0]);
    return 0;
  }
  // Whole integers in range (was: atol, "abc" read as 0 and run to a NaN
  // check); the same on every rank, so each error is printed once.
  const index_t n = argc > 1 ? summa::flags::positional_integer(argv[1], "n", 1, 1 << 20) : 1536;
  const index_t panel =
      argc > 2 ? summa::flags::positional_integer(argv[2], "panel", 0, 1 << 20) : 256;

  summa::ProcessGrid grid = summa::ProcessGrid::mesh2d(MPI_COMM_WORLD);
  summa::CpuBackend backend;
  summa::SummaEngine engine(grid, backend, {.panel = panel, .overlap = true});
  const int q = engine.q();
  const int i = grid.coords().row, j = grid.coords().col;
  if (n % q != 0)
    throw summa::CollectiveError("n=" + std::to_string(n) +
                                 " must be divisible by q=" + std::to_string(q));
  const index_t b = n / q;
  // A rank's blocks, its check's rows and columns of A and B and the
  // workspace: checked before anything is allocated.
  const double need = 8.0 * (4.0 * static_cast<double>(b) * static_cast<double>(b) +
                             2.0 * static_cast<double>(b) * static_cast<double>(n));
  if (const double available = summa::available_memory_per_rank(MPI_COMM_WORLD, backend);
      available > 0 && need > available)
    throw summa::CollectiveError(
        "n=" + std::to_string(n) + " on a " + std::to_string(q) + "x" + std::to_string(q) +
        " mesh needs about " + summa::human_bytes(need) + " per rank, more than the " +
        summa::human_bytes(available) + " per rank " + summa::available_memory_source(backend));

  // Local blocks (column-major), filled from the global formula.
  std::vector<double> a(b * b), bm(b * b), c(b * b);
  for (index_t cc = 0; cc < b; ++cc)
    for (index_t r = 0; r < b; ++r) {
      a[r + cc * b] = element(1, i * b + r, j * b + cc);
      bm[r + cc * b] = element(2, i * b + r, j * b + cc);
    }
  auto A = summa::MatrixView<double>::dense(a.data(), b, b);
  auto B = summa::MatrixView<double>::dense(bm.data(), b, b);
  auto C = summa::MatrixView<double>::dense(c.data(), b, b);
  summa::Workspace ws("workspace", backend,
                      engine.workspace_bytes(summa::Form::AB, n, n, n, summa::DType::f64));

  engine.ab(n, n, n, 1.0, A, B, 0.0, C, ws);  // warm-up
  std::vector<double> seconds;
  for (int rep = 0; rep < 5; ++rep) {
    grid.reset_traffic();  // after the loop: the traffic of one call
    grid.world().barrier();
    const auto t0 = std::chrono::steady_clock::now();
    engine.ab(n, n, n, 1.0, A, B, 0.0, C, ws);
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    seconds.push_back(dt);
  }
  std::sort(seconds.begin(), seconds.end());
  const double median = seconds[seconds.size() / 2];

  // Check: every rank compares its block with a serial product of the rows
  // and columns it needs, computed from the same formula.
  std::vector<double> arow(b * n), bcol(n * b), ref(b * b);
  for (index_t kk = 0; kk < n; ++kk)
    for (index_t r = 0; r < b; ++r) {
      arow[r + kk * b] = element(1, i * b + r, kk);
      bcol[kk + r * n] = element(2, kk, j * b + r);
    }
  backend.gemm(summa::Op::N, summa::Op::N, 1.0, summa::MatrixView<double>::dense(arow.data(), b, n),
               summa::MatrixView<double>::dense(bcol.data(), n, b), 0.0,
               summa::MatrixView<double>::dense(ref.data(), b, b));
  double err = 0, norm = 0;
  for (index_t x = 0; x < b * b; ++x) {
    err = std::max(err, std::abs(c[x] - ref[x]));
    norm = std::max(norm, std::abs(ref[x]));
  }
  MPI_Allreduce(MPI_IN_PLACE, &err, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &norm, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  const double rel = err / norm;
  const bool ok = rel < 1e-12 * static_cast<double>(n);

  const auto sent = grid.traffic()[summa::CommAxis::mesh_row].bytes_sent +
                    grid.traffic()[summa::CommAxis::mesh_col].bytes_sent;
  if (grid.rank() == 0) {
    std::printf("summa %s demo: C = A B, n=%lld, %dx%d mesh, panel %lld, double\n",
                summa::build_info().version, static_cast<long long>(n), q, q,
                static_cast<long long>(panel));
    std::printf("  median of 5: %.4f s, %.2f GFLOP/s in total, %.2f per rank\n", median,
                2.0 * n * n * n / median * 1e-9, 2.0 * n * n * n / median * 1e-9 / (q * q));
    std::printf("  bytes sent by rank 0 per call: %llu (mesh rows and columns)\n",
                static_cast<unsigned long long>(sent));
    std::printf("  check vs serial product: max relative error %.2e -> %s\n", rel,
                ok ? "PASS" : "FAIL");
  }
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 0;
  try {
    status = run(argc, argv);
  } catch (const summa::CollectiveError& e) {  // every rank has it
    summa::flags::print_once("summa_demo", e);
    status = 2;
  } catch (const std::exception& e) {  // this rank's alone: the others may wait for it
    std::fprintf(stderr, "summa_demo: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  MPI_Finalize();
  return status;
}

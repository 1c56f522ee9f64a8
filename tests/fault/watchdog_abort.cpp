// A deliberately hung job for the watchdog's fault tests
// (tests/fault/watchdog.cmake): every rank but the last waits in an
// all-reduce on the grid's world axis under a 2 s watchdog (default action:
// report, then MPI_Abort), while the last rank
//   late:      computes (sleeps) for 120 s, or
//   mismatch:  waits in an all-gather on another axis, a collective the
//              others never call.
// The job must end within seconds, non-zero, with a report naming the
// last rank. Exits 0 only if the collective completed (a test failure).
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "summa/grid/process_grid.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const std::string mode = argc > 1 ? argv[1] : "late";
  summa::GridOptions options;
  options.watchdog.timeout_s = 2;
  options.watchdog.report_s = 3;
  summa::ProcessGrid grid = summa::ProcessGrid::linear1d(MPI_COMM_WORLD, 0, 1, options);
  const int me = grid.rank(), last = grid.size() - 1;
  double x = 1, sum = 0;
  if (me == last && mode == "late") {
    std::this_thread::sleep_for(std::chrono::seconds(120));
  } else if (me == last && mode == "mismatch") {
    double all[64] = {};
    grid.mesh_row().all_gather(&x, all, 1);
  }
  grid.world().all_reduce(&x, &sum, 1);
  std::printf("rank %d: the collective completed (sum %g): no hang to report\n", me, sum);
  MPI_Finalize();
  return 0;
}

// main() for the MPI test binaries: initialise MPI, print only rank 0's
// results (other ranks report failures with their rank), and make every rank
// exit with the same status so mpirun and CTest see one verdict.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "test_backend_env.hpp"

namespace {

// Forwards only failures on ranks other than 0, prefixed with the rank.
class RankPrinter : public testing::EmptyTestEventListener {
 public:
  explicit RankPrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, r.file_name() ? r.file_name() : "?",
                   r.line_number(), r.summary());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  // SUMMA_TEST_BACKEND=cuda without a device: "no CUDA device: skipped", exit 0.
  summa::test::skip_unless_backend_available();
  testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankPrinter(rank));
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && failed) std::fprintf(stderr, "FAILED on at least one rank\n");
  MPI_Finalize();
  return failed;
}

// Memory report of the 2D GPT: builds a summa::Gpt (2D scheme) on a q x q mesh (q from the
// rank count), runs one training step (forward + backward) and prints, per
// rank, the bytes of parameters, gradients, activations (high water of the
// forward and checkpoint buffers) and of every buffer (capacity and high
// water). Rank 0 also prints the activations the serial reference keeps for
// the same batch (reference::Gpt stores every activation, no checkpointing),
// and the largest batch the mesh could train within each rank's available
// memory (the planner's figure).
//
//   mpirun -np 4 ./gpt_memory [layers hidden heads seq batch vocab [recompute=full|selective|none]]
//
// docs/memory.md uses it to show activation memory per rank falling as 1/q².
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "flag_checks.hpp"
#include "summa/summa.hpp"

namespace {

int run(int argc, char** argv) {
  using summa::index_t;
  if (argc != 1 && argc != 7 && argc != 8) {  // every rank sees the same argv: printed once
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0)
      std::fprintf(
          stderr,
          "usage: %s [layers hidden heads seq batch vocab [recompute=full|selective|none]]\n",
          argv[0]);
    return 2;
  }
  // Each argument a whole integer in its range (was: atol, "abc" read as 0
  // and 99999999999999999999 as -1).
  const auto arg = [&](int k, const char* name, long long fallback, long double hi) {
    return argc > k ? summa::flags::positional_integer(argv[k], name, k == 7 ? 0 : 1, hi)
                    : fallback;
  };
  summa::reference::GptConfig config;
  config.n_layer = static_cast<int>(arg(1, "layers", 4, 100000));
  config.n_embd = static_cast<int>(arg(2, "hidden", 192, 1 << 20));
  config.n_head = static_cast<int>(arg(3, "heads", 6, 1 << 16));
  const index_t seq = arg(4, "seq", 128, 1 << 24), batch = arg(5, "batch", 6, 1 << 30);
  config.vocab_size = static_cast<int>(arg(6, "vocab", 2304, 1 << 24));
  config.n_positions = static_cast<int>(seq);
  // full, selective or none (summa::Recompute); 1 and 0, the older
  // checkpointing on and off, read as full and none
  const std::string_view recompute_text = argc > 7 ? argv[7] : "full";
  const summa::Recompute recompute = recompute_text == "1" ? summa::Recompute::full
                                     : recompute_text == "0"
                                         ? summa::Recompute::none
                                         : summa::parse_recompute(recompute_text, "recompute");

  summa::ProcessGrid grid = summa::ProcessGrid::mesh2d(MPI_COMM_WORLD);
  summa::CpuBackend backend;
  summa::SummaEngine engine(grid, backend);
  const int q = engine.q();
  // Sizes checked before memory: the planner's message, not bad_alloc.
  const summa::SchemeSpec spec = summa::SchemeSpec::parse("2d:q=" + std::to_string(q));
  summa::require_memory_fits<float>(
      MPI_COMM_WORLD, spec, backend, config, batch, seq, {.recompute = recompute}, {},
      {.bytes = summa::available_memory_per_rank(MPI_COMM_WORLD, backend),
       .source = summa::available_memory_source(backend),
       .batch_option = "batch"},
      "");
  summa::Summa2DContext<float> scheme(engine);
  summa::Gpt<float> model(scheme, config, batch, seq, {.recompute = recompute});
  model.init(1234);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(batch * seq));
  std::vector<std::int32_t> targets(tokens.size());
  for (std::size_t k = 0; k < tokens.size(); ++k) {
    tokens[k] = static_cast<std::int32_t>((k * 7919) % static_cast<std::size_t>(config.vocab_size));
    targets[k] =
        static_cast<std::int32_t>((k * 104729 + 1) % static_cast<std::size_t>(config.vocab_size));
  }
  const double loss = model.forward(tokens, targets);
  model.backward();
  const summa::MemoryReport report = model.memory_report();

  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (rank == 0)
    std::printf(
        "GPT (2D) float: layers %d, hidden %d, heads %d, seq %ld, batch %ld, vocab %d, q %d, "
        "recompute %s, loss %.6f\n",
        config.n_layer, config.n_embd, config.n_head, static_cast<long>(seq),
        static_cast<long>(batch), config.vocab_size, q,
        std::string(summa::to_string(recompute)).c_str(), loss);
  // Ranks print in order (one at a time, rank 0 first).
  for (int r = 0; r < size; ++r) {
    if (r == rank) {
      std::printf("rank %d (mesh %d,%d): parameters %zu B, gradients %zu B, activations %zu B\n",
                  rank, grid.coords().row, grid.coords().col, report.parameters, report.gradients,
                  report.activations);
      std::printf("%s", report.to_string().c_str());
      std::fflush(stdout);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  // The largest activation footprint over ranks (the one that limits the model).
  unsigned long long mine = report.activations, worst = 0;
  MPI_Reduce(&mine, &worst, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    summa::reference::Gpt<float> serial(config, 1234);
    serial.forward(tokens, targets, batch, seq);
    std::size_t serial_bytes = 0;
    for (const auto& a : serial.activation_info()) {
      std::size_t n = sizeof(float);
      for (index_t d : a.shape) n *= static_cast<std::size_t>(d);
      serial_bytes += n;
    }
    std::printf("max activations per rank: %llu B; serial reference keeps %zu B of activations\n",
                worst, serial_bytes);
  }
  // The largest global batch this mesh could train at this shape within the
  // memory each rank has (the planner's figure, the check gpt_train makes;
  // Optimus Fig. 9's comparison; bench/scaling_study --largest-batch gives
  // it for a cluster's devices without a launch).
  const double budget = summa::available_memory_per_rank(MPI_COMM_WORLD, backend);
  const index_t largest = summa::largest_batch<float>(
      MPI_COMM_WORLD, spec, backend, config, seq, {.recompute = recompute},
      static_cast<std::size_t>(budget), index_t{1} << 24);
  if (rank == 0)
    std::printf("largest batch within %.2f GiB per rank (%s): %lld\n", budget / (1ull << 30),
                summa::available_memory_source(backend), static_cast<long long>(largest));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int code = 1;
  try {
    code = run(argc, argv);
  } catch (const summa::CollectiveError& e) {  // every rank has it
    summa::flags::print_once("gpt_memory", e);
    code = 2;
  } catch (const std::exception& e) {  // this rank's alone: the others may wait for it
    std::fprintf(stderr, "gpt_memory: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return code;
}

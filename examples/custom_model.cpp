// custom_model: trains a model that is not a GPT — an MLP classifier on
// generated data — under any scheme, through the layer API
// (summa/layers/sequential.hpp, docs/custom_models.md):
//
//   mpirun -np 4 build/examples/custom_model --scheme 2d:q=2
//   mpirun -np 4 build/examples/custom_model --scheme 1d:p=4
//   mpirun -np 8 build/examples/custom_model --scheme data=2,3d:2x1x2
//   mpirun -np 4 build/examples/custom_model --scheme 2d:q=2 --block
//
// The data: x ~ U(-1, 1)^in, its class the argmax of x·W* for a fixed random
// "teacher" W* [in, classes]; every step draws a fresh batch from the seed
// and the step, the same on every rank. Each data group takes its rows of
// the batch. The model: fc1 (expand, in -> hidden), GeLU, fc2 (contract,
// hidden -> in), GeLU, head (expand, in -> classes), the scheme's
// cross-entropy; AdamW on the local shards. With --block the model is a
// pre-LN transformer block written from the public parts instead (rows as
// sequences of --seq: x + Attn(LN1(x)), then x + MLP(LN2(x)), two residual
// connections), then the head. Prints the loss; exits 1 unless the last
// loss is below the first.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "summa/summa.hpp"

namespace {

struct Options {
  std::string scheme;
  int steps = 150;
  long batch = 144, in = 48, hidden = 96, classes = 8;
  bool block = false;        // a pre-LN transformer block instead of the MLP
  long seq = 4, heads = 24;  // --block: rows per sequence, attention heads
  double lr = 3e-3;
  double watchdog = 600;  // seconds a collective may wait (0: off)
  unsigned long long seed = 1;
};

// The batch of `step`: x [batch, in] and its classes (every rank alike).
void make_batch(const Options& o, int step, std::vector<float>& x, std::vector<std::int32_t>& y) {
  std::mt19937_64 teacher(o.seed);
  std::normal_distribution<double> n(0, 1);
  std::vector<double> w(static_cast<std::size_t>(o.in * o.classes));
  for (double& v : w) v = n(teacher);
  std::mt19937_64 gen(o.seed * 1000003ULL + static_cast<unsigned long long>(step));
  std::uniform_real_distribution<double> u(-1, 1);
  x.resize(static_cast<std::size_t>(o.batch * o.in));
  y.resize(static_cast<std::size_t>(o.batch));
  for (long t = 0; t < o.batch; ++t) {
    for (long i = 0; i < o.in; ++i) x[t * o.in + i] = static_cast<float>(u(gen));
    int best = 0;
    double best_score = -1e300;
    for (long c = 0; c < o.classes; ++c) {
      double s = 0;
      for (long i = 0; i < o.in; ++i) s += x[t * o.in + i] * w[i * o.classes + c];
      if (s > best_score) best_score = s, best = static_cast<int>(c);
    }
    y[t] = best;
  }
}

int run(const Options& o, int rank, int ranks) {
  using T = float;
  using summa::ActivationLayout;
  using summa::LinearRole;
  // The set-up (the memory check, the grid's agreements) waits under a
  // watchdog on the whole job: a rank stopped before the grid exists ends
  // the job with a report, not a hang. The grid's own watchdog guards the
  // training.
  summa::WatchdogOptions setup_limit;
  setup_limit.timeout_s = o.watchdog;
  const summa::Watchdog setup_watchdog(MPI_COMM_WORLD, setup_limit);
  const summa::SchemeSpec spec =
      summa::SchemeSpec::parse(o.scheme.empty() ? "1d:p=" + std::to_string(ranks) : o.scheme);
  if (spec.zero > 0)  // the same text everywhere: the same error on every rank
    throw summa::CollectiveError("--scheme " + spec.str() +
                                 ": this example keeps its optimizer whole (zero=1, 2 and "
                                 "3 shard summa::Trainer's GPT); drop ':zero=Z'");
  // Sizes checked before memory, in floating point (no overflow): the
  // weights with their gradients and AdamW state and the hidden layer's
  // activations, split over the tensor group, plus the whole batch each rank
  // draws. Past what the node has: one clear error on every rank.
  const double need =
      sizeof(T) *
          (4.0 * static_cast<double>((o.in + o.classes) * o.hidden) +
           3.0 * static_cast<double>(o.batch / spec.data) * static_cast<double>(o.hidden)) /
          static_cast<double>(spec.tensor_ranks()) +
      sizeof(float) * static_cast<double>(o.batch) * static_cast<double>(o.in);
  const double available = summa::available_memory_per_rank(MPI_COMM_WORLD);
  if (available > 0 && need > available)
    throw summa::CollectiveError(
        "--hidden " + std::to_string(o.hidden) + " --batch " + std::to_string(o.batch) + " under " +
        spec.str() + " needs about " + summa::human_bytes(need) + " per rank, more than the " +
        summa::human_bytes(available) + " per rank available on this node");
  summa::CpuBackend backend;
  summa::GridOptions grid_options;
  grid_options.watchdog.timeout_s = o.watchdog;
  summa::ProcessGrid grid = summa::make_grid(MPI_COMM_WORLD, spec, grid_options);
  const std::unique_ptr<summa::SchemeContext<T>> scheme =
      summa::make_context<T>(spec, grid, backend);
  if (o.batch % spec.data != 0)
    throw summa::CollectiveError("--batch " + std::to_string(o.batch) +
                                 " must be divisible by the scheme's data groups (" +
                                 std::to_string(spec.data) + ")");
  // each condition its own message (was: both named whichever failed)
  if (o.block && o.in % o.heads != 0)
    throw summa::CollectiveError("--block: --heads " + std::to_string(o.heads) +
                                 " must divide the block's width " + std::to_string(o.in) +
                                 " (the input's)");
  if (o.block && o.batch % (spec.data * o.seq) != 0)
    throw summa::CollectiveError("--block: --batch " + std::to_string(o.batch) +
                                 " must be whole sequences of --seq " + std::to_string(o.seq) +
                                 " in each of the " + std::to_string(spec.data) + " data group(s)");
  const long rows = o.batch / spec.data, first = grid.coords().data * rows;

  summa::Sequential<T> mlp(*scheme, rows, o.in);
  if (o.block) {  // residual connections around a Chain of the public parts
    mlp.residual([&](summa::Chain<T>& f) {  // x + Attn(LN1(x))
      f.layer_norm("h.0.ln_1");
      f.attention("h.0.attn", o.seq, o.heads);
    });
    mlp.residual([&](summa::Chain<T>& f) {  // x + MLP(LN2(x))
      f.layer_norm("h.0.ln_2");
      f.linear("h.0.mlp.c_fc", o.hidden, LinearRole::expand);
      f.gelu();
      f.linear("h.0.mlp.c_proj", o.in, LinearRole::contract);
    });
  } else {
    mlp.linear("fc1", o.hidden, LinearRole::expand);
    mlp.gelu();
    mlp.linear("fc2", o.in, LinearRole::contract);
    mlp.gelu();
  }
  mlp.linear("head", o.classes, LinearRole::expand);
  // the loss of this group's rows, divided by the global batch: the groups add up
  const std::unique_ptr<summa::Loss<T>> loss = scheme->cross_entropy(rows, o.classes, o.batch);
  {  // the step arenas the layers ask for, checked before finish() allocates
     // them (was: --block --seq 1048576 --batch 1048576 asked the backend for
     // 8 TB on every rank, each then aborting the job)
    summa::BufferNeeds needs = mlp.buffer_needs();
    needs.then(loss->buffer_needs());
    const double arenas = static_cast<double>(needs.workspace) +
                          static_cast<double>(needs.forward) + static_cast<double>(needs.backward);
    std::optional<std::string> error;
    if (available > 0 && arenas + need > available)
      error = "--batch " + std::to_string(o.batch) +
              (o.block ? " --seq " + std::to_string(o.seq) : "") + " --hidden " +
              std::to_string(o.hidden) + " under " + spec.str() + ": the step buffers need about " +
              summa::human_bytes(arenas) + " per rank besides the weights, more than the " +
              summa::human_bytes(available) + " per rank available on this node";
    summa::agree_on(MPI_COMM_WORLD, error);
  }
  mlp.finish(loss->buffer_needs());
  mlp.parameters_store().init_uniform(o.seed, 0.15);
  auto optimizer = summa::make_optimizer<T>({.kind = "adamw"}, mlp.parameters_store());

  std::vector<float> x;
  std::vector<std::int32_t> y;
  double first_loss = 0, last_loss = 0;
  for (int step = 0; step < o.steps; ++step) {
    make_batch(o, step, x, y);
    const std::span<const float> mine(x.data() + first * o.in,
                                      static_cast<std::size_t>(rows * o.in));
    std::vector<T> local =
        summa::scatter_activation<T>(*scheme, mine, rows, o.in, ActivationLayout::outer);
    const auto X = summa::MatrixView<T>::dense(
        local.data(), scheme->local_rows(rows, ActivationLayout::outer),
        scheme->local_cols(o.in, ActivationLayout::outer), summa::Order::row_major);
    summa::MatrixView<T> logits = mlp.forward(X);
    summa::StepBuffers buffers = mlp.buffers();
    double l =
        loss->forward(logits, std::span<const std::int32_t>(y).subspan(first, rows), buffers);
    if (spec.data > 1) grid.data().all_reduce(&l, &l, 1, summa::ReduceOp::sum);
    loss->backward(logits, buffers);  // logits -> dL/dlogits
    mlp.backward(logits);
    mlp.sync_data_gradients();
    optimizer->step(o.lr);
    if (step == 0) first_loss = l;
    last_loss = l;
    if (rank == 0 && (step % 25 == 0 || step + 1 == o.steps))
      std::printf("step %4d  loss %.4f\n", step, l);
  }
  const bool learned = last_loss < first_loss;
  const std::string block = o.block ? " (block: --seq " + std::to_string(o.seq) + ", --heads " +
                                          std::to_string(o.heads) + ")"
                                    : "";
  if (rank == 0)
    std::printf("custom_model: %s%s on %d ranks, %zu parameters per rank: loss %.4f -> %.4f (%s)\n",
                spec.str().c_str(), block.c_str(), ranks,
                static_cast<std::size_t>(mlp.parameters_store().local_elements()), first_loss,
                last_loss, learned ? "loss decreased" : "NOT LEARNING");
  return learned ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  summa::init_mpi(&argc, &argv, Options{}.watchdog);  // MPI_Init under --watchdog's limit
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  Options o;
  CLI::App app{"custom_model: an MLP classifier trained with summa's layer API under any scheme"};
  app.add_option("--scheme", o.scheme,
                 "scheme text (default 1d:p=<ranks>), e.g. 2d:q=2, data=2,3d:1x2x1");
  app.add_option("--steps", o.steps, "training steps")->check(CLI::Range(1, 1000000));
  app.add_option("--batch", o.batch, "samples per step (all data groups)")
      ->check(CLI::Range(1L, 1L << 24));
  app.add_option("--hidden", o.hidden, "hidden width")->check(CLI::Range(1L, 1L << 20));
  app.add_option("--lr", o.lr, "AdamW learning rate")
      ->check(  // (was: CLI::Range, which nan passes: every comparison with it is false)
          [](const std::string& t) {
            double v = 0;
            const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
            return ec == std::errc() && end == t.data() + t.size() && v >= 1e-8 && v <= 1.0
                       ? std::string()
                       : "'" + t + "' is not a number in [1e-08, 1]";
          });
  app.add_flag("--block", o.block,
               "a pre-LN transformer block (attention and MLP in residual connections) "
               "instead of the MLP");
  app.add_option("--seq", o.seq, "--block: rows per sequence")->check(CLI::Range(1L, 1L << 20));
  app.add_option("--heads", o.heads, "--block: attention heads")->check(CLI::Range(1L, 1L << 16));
  app.add_option("--seed", o.seed, "data and initialisation seed")
      ->check(  // plain decimal digits (was: -1 wrapped to 2^64 - 1)
          [](const std::string& t) {
            std::uint64_t v = 0;  // and no more than 2^64 - 1 (was: clamped to it)
            const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
            return !t.empty() && t.find_first_not_of("0123456789") == std::string::npos &&
                           ec == std::errc() && end == t.data() + t.size()
                       ? std::string()
                       : "'" + t + "' is not an integer in [0, 18446744073709551615]";
          });
  app.add_option("--watchdog", o.watchdog,
                 "seconds a collective may wait before the job is ended with a report naming "
                 "the ranks that did not arrive (0: off)")
      ->check(  // 0 (off) or at least 0.1 s (was: 1e-300 accepted, the job ended in set-up)
          [](const std::string& t) {
            double v = -1;
            const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
            return ec == std::errc() && end == t.data() + t.size() &&
                           (v == 0 || (v >= 0.1 && v <= 1e7))
                       ? std::string()
                       : "'" + t + "' is not 0 (off) or a number of seconds in [0.1, 1e+07]";
          })
      ->capture_default_str();
  int status = 0;
  try {
    app.parse(argc, argv);
    status = run(o, rank, ranks);
  } catch (const CLI::ParseError& e) {  // the same argv on every rank: printed once
    if (e.get_exit_code() == 0) {       // --help
      status = rank == 0 ? app.exit(e) : 0;
    } else {
      if (rank == 0) std::fprintf(stderr, "custom_model: error: %s (see --help)\n", e.what());
      status = 2;
    }
  } catch (const summa::Error& e) {  // summa's errors are raised on every rank alike
    if (rank == 0) std::fprintf(stderr, "custom_model: error: %s\n", e.what());
    status = 2;
  } catch (const std::exception& e) {  // this rank's alone (e.g. bad_alloc): end the job
    std::fprintf(stderr, "custom_model (rank %d): %s; aborting the job\n", rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  summa::finalize_mpi();
  return status;
}

// gpt_train: train a GPT-2 with summa from the command line, under any
// scheme (1D, 2D, 3D, data axis), stop, resume under another scheme, and
// export a Hugging Face checkpoint.
//
//   mpirun -np 4 ./gpt_train                      # small GPT, bundled corpus, 2x2 mesh
//   mpirun -np 4 ./gpt_train --scheme 1d:p=4 --resume
//   mpirun -np 4 ./gpt_train --backend cuda      # one GPU per rank (NCCL)
//   mpirun -np 4 ./gpt_train --backend cuda --comm mpi_staged   # ranks share GPUs
//   ./gpt_train --help
//
// Rank 0 prints a progress line per step (step, loss, learning rate,
// tokens/s, model FLOP/s, memory per rank, ETA), evaluations, and a final
// summary; it writes a JSON-lines log (one object per step and per
// evaluation) for scripts/plot_loss.py. Outputs go under --out:
// checkpoints/ (sharded, resumable under any scheme), export/
// (model.safetensors + config.json, Hugging Face GPT-2) and log.jsonl.
#include <mpi.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "summa/summa.hpp"
#if SUMMA_HAVE_CUDA
#include "summa/backend/cuda_backend.hpp"
#include "summa/comm/nccl_communicator.hpp"
#endif

#ifndef SUMMA_DEFAULT_CORPUS
#define SUMMA_DEFAULT_CORPUS "examples/data/corpus.txt"
#endif

namespace {

namespace fs = std::filesystem;
using summa::index_t;

struct Cli {
  int layers = 4, hidden = 128, heads = 4, seq = 64, vocab = 0, positions = 0;
  std::string scheme;  // default: from the rank count
  std::string dtype = "float";
  std::string backend = "cpu";
  std::string comm;  // default: mpi on cpu, nccl on cuda
  bool tf32 = false;
  bool recompute = true;
  std::int64_t steps = 400;
  index_t batch = 16;
  std::string optimizer = "adamw";
  double lr = 2e-3, min_lr = -1, weight_decay = 0.1, beta2 = 0.95, momentum = 0.9, clip = 1.0;
  std::int64_t warmup = 20;
  std::uint64_t seed = 1234, data_seed = 1234;
  std::string data = SUMMA_DEFAULT_CORPUS;
  double val_fraction = 0.1;
  int eval_every = 100, eval_batches = 4, print_every = 10;
  std::string out = "gpt_train_out";
  int checkpoint_every = 100;
  bool resume = false;
  std::string resume_from, import_dir, export_dir = "<out>/export", log = "<out>/log.jsonl";
  std::string check_batch;
  std::set<std::string> given;  // options set on the command line
};

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int s = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

// 2D on a square rank count, 1D otherwise.
std::string default_scheme(int ranks) {
  const int q = static_cast<int>(std::lround(std::sqrt(static_cast<double>(ranks))));
  return q * q == ranks ? "2d:q=" + std::to_string(q) : "1d:p=" + std::to_string(ranks);
}

std::string human(double v, const char* unit) {
  const char* prefix[] = {"", "k", "M", "G", "T", "P"};
  int k = 0;
  while (std::abs(v) >= 1000 && k < 5) {
    v /= 1000;
    ++k;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3g %s%s", v, prefix[k], unit);
  return buf;
}

std::string duration(double s) {
  char buf[32];
  const long t = std::lround(std::max(0.0, s));
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t / 60) % 60);
  else
    std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  return buf;
}

std::string replace_out(std::string path, const std::string& out) {
  const std::string key = "<out>";
  if (path.rfind(key, 0) == 0) path = out + path.substr(key.size());
  return path;
}

// The backend of --backend, and the grid's communicators (--comm) to go with
// it. Throws summa::Error on every rank for a combination that cannot work
// (checked from the options alone, or collectively: select_device_for_rank
// throws on every rank when any rank sees no device).
std::unique_ptr<summa::Backend> make_backend(const Cli& cli, summa::GridOptions& grid) {
  const std::string comm = cli.comm.empty() ? (cli.backend == "cuda" ? "nccl" : "mpi") : cli.comm;
  if (cli.backend == "cpu") {
    if (comm != "mpi")
      throw summa::Error("gpt_train: --comm " + comm +
                         " carries device memory and needs --backend cuda (the cpu backend "
                         "uses --comm mpi)");
    if (cli.tf32) throw summa::Error("gpt_train: --tf32 applies to --backend cuda only");
    grid.comm = summa::CommBackend::mpi;
    return std::make_unique<summa::CpuBackend>();
  }
  if (comm == "mpi")
    throw summa::Error(
        "gpt_train: --backend cuda with --comm mpi: MPI communicators cannot take device "
        "memory; use --comm nccl (one GPU per rank) or --comm mpi_staged (ranks may share a "
        "GPU)");
#if SUMMA_HAVE_CUDA
  summa::CudaOptions o;
  o.device = summa::select_device_for_rank(MPI_COMM_WORLD);
  o.allow_tf32 = cli.tf32;
  auto backend = std::make_unique<summa::CudaBackend>(o);
  grid.comm = comm == "nccl" ? summa::CommBackend::nccl : summa::CommBackend::mpi_staged;
  grid.compute_stream = backend->stream();
  return backend;
#else
  throw summa::Error(
      "gpt_train: --backend cuda: this summa was built without CUDA (summa/build_info.hpp "
      "SUMMA_HAVE_CUDA=0; configure with -DSUMMA_CUDA=ON where the CUDA toolkit, cuBLAS and NCCL "
      "are installed)");
#endif
}

template <class T>
int train(const Cli& cli) {
  const int rank = world_rank(), ranks = world_size();
  const bool root = rank == 0;
  const fs::path out = cli.out;
  const fs::path ckpt_root = out / "checkpoints";
  const std::string log_path = replace_out(cli.log, cli.out);
  const std::string export_dir = replace_out(cli.export_dir, cli.out);

  summa::TrainerOptions o;
  o.scheme = cli.scheme.empty() ? default_scheme(ranks) : cli.scheme;
  const summa::SchemeSpec spec = summa::SchemeSpec::parse(o.scheme);
  o.config.n_layer = cli.layers;
  o.config.n_head = cli.heads;
  o.config.n_embd = cli.hidden;
  o.config.n_positions = cli.positions > 0 ? cli.positions : cli.seq;
  // Byte-level tokens (256), padded so every scheme's vocabulary split works.
  o.config.vocab_size = cli.vocab > 0
                            ? cli.vocab
                            : summa::io::ByteTokenizer::padded_vocab(
                                  summa::io::ByteTokenizer::base_vocab, spec.tensor_ranks());
  o.batch = cli.batch;
  o.seq = cli.seq;
  o.gpt.checkpoint = cli.recompute;
  o.optimizer.kind = cli.optimizer;
  o.optimizer.weight_decay = cli.weight_decay;
  o.optimizer.beta2 = cli.beta2;
  o.optimizer.momentum = cli.momentum;
  o.schedule = {.lr = cli.lr,
                .warmup = std::min(cli.warmup, cli.steps),
                .total = cli.steps,
                .min_lr = cli.min_lr >= 0 ? cli.min_lr : cli.lr / 10};
  o.clip = cli.clip;
  o.init_seed = cli.seed;
  o.data_seed = cli.data_seed;
  o.val_fraction = cli.val_fraction;

  std::int64_t steps = cli.steps;
  // Resuming: the checkpoint fixes the model shape and the data stream.
  std::optional<fs::path> resume;
  if (!cli.resume_from.empty()) {
    resume = cli.resume_from;
  } else if (cli.resume) {
    int found = 0;
    if (root) found = summa::latest_checkpoint(ckpt_root).has_value() ? 1 : 0;
    MPI_Bcast(&found, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (found)
      resume = ckpt_root;
    else if (root)
      std::printf("gpt_train: no checkpoint under %s, starting from scratch\n",
                  ckpt_root.string().c_str());
  }
  if (resume) {
    const summa::CheckpointInfo info = summa::read_checkpoint_info(*resume, MPI_COMM_WORLD);
    o.config = summa::config_from_meta(info.meta);
    if (const auto it = info.meta.find("data_seed"); it != info.meta.end())
      o.data_seed = std::stoull(it->second);
    // The run's settings continue unless given again on the command line.
    const auto keep = [&](const char* flag, const char* key, auto& field) {
      const auto it = info.meta.find(key);
      if (cli.given.count(flag) || it == info.meta.end()) return;
      if constexpr (std::is_same_v<std::decay_t<decltype(field)>, double>)
        field = std::stod(it->second);
      else
        field = static_cast<std::decay_t<decltype(field)>>(std::stoll(it->second));
    };
    keep("--batch", "batch", o.batch);
    keep("--seq", "seq", o.seq);
    keep("--lr", "lr", o.schedule.lr);
    keep("--min-lr", "min_lr", o.schedule.min_lr);
    keep("--warmup", "warmup", o.schedule.warmup);
    keep("--steps", "total", o.schedule.total);
    steps = o.schedule.total;
    keep("--weight-decay", "weight_decay", o.optimizer.weight_decay);
    keep("--clip", "clip", o.clip);
    if (root)
      std::printf("gpt_train: resuming from %s (step %lld, saved under %s)\n",
                  resume->string().c_str(), static_cast<long long>(info.step),
                  info.meta.count("scheme") ? info.meta.at("scheme").c_str() : "?");
  }

  std::vector<std::uint16_t> tokens;
  {
    std::optional<std::string> error;
    try {
      tokens = summa::io::load_tokens(cli.data);
    } catch (const summa::Error& e) {
      error = e.what();
    }
    summa::agree_on(MPI_COMM_WORLD, error);
  }
  const std::size_t n_tokens = tokens.size();
  const std::unique_ptr<summa::Backend> backend = make_backend(cli, o.grid);
  summa::Trainer<T> trainer(MPI_COMM_WORLD, o, *backend, std::move(tokens));
  if (!cli.import_dir.empty()) trainer.import_hf(cli.import_dir);
  if (resume) trainer.load(*resume);

  // Memory per rank: the model's buffers plus the optimizer state (fixed
  // after construction; the largest over ranks).
  const summa::MemoryReport report = trainer.model().memory_report();
  double mem = static_cast<double>(report.total()) +
               static_cast<double>(trainer.optimizer().state_names().size()) *
                   static_cast<double>(trainer.optimizer().state_elements()) *
                   sizeof(summa::master_t<T>);
  MPI_Allreduce(MPI_IN_PLACE, &mem, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  const double flops_per_step = summa::model_flops_per_step(o.config, o.batch, o.seq);
  const double tokens_per_step = static_cast<double>(o.batch * o.seq);

  std::ofstream log;
  log.precision(8);
  if (root) {
    fs::create_directories(out);
    if (const fs::path parent = fs::path(log_path).parent_path(); !parent.empty())
      fs::create_directories(parent);
    log.open(log_path, trainer.step() > 0 ? std::ios::app : std::ios::trunc);
    if (!log) std::fprintf(stderr, "gpt_train: cannot write the log %s\n", log_path.c_str());
    std::printf(
        "gpt_train: GPT-2 n_layer=%d n_head=%d n_embd=%d seq=%lld vocab=%d (%lld parameters) | "
        "%s on %d ranks | %s on %s (comm %s%s) | batch %lld x %lld tokens | %s lr %.3g (warm-up "
        "%lld, cosine to %.3g) | %zu tokens from %s\n",
        o.config.n_layer, o.config.n_head, o.config.n_embd, static_cast<long long>(o.seq),
        o.config.vocab_size, static_cast<long long>(summa::reference::parameter_count(o.config)),
        trainer.parallel().spec().str().c_str(), ranks, cli.dtype.c_str(),
        std::string(backend->name()).c_str(), summa::to_string(o.grid.comm),
        cli.tf32 ? ", tf32" : "", static_cast<long long>(o.batch), static_cast<long long>(o.seq),
        o.optimizer.kind.c_str(), o.schedule.lr, static_cast<long long>(o.schedule.warmup),
        o.schedule.min_lr, n_tokens, cli.data.c_str());
  }
  const bool tty = root && isatty(fileno(stdout));
  const auto eval = [&](const char* when) {
    const double v = trainer.evaluate(cli.eval_batches);
    if (root) {
      std::printf("%s%s step %lld: validation loss %.4f\n", tty ? "\n" : "", when,
                  static_cast<long long>(trainer.step()), v);
      if (log)
        log << "{\"step\": " << trainer.step() << ", \"val_loss\": " << v << "}\n" << std::flush;
    }
    return v;
  };

  const double val_before = eval("before training,");
  const std::int64_t first = trainer.step();
  std::vector<double> times, losses;
  const auto t_start = std::chrono::steady_clock::now();
  for (std::int64_t s = first; s < steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    const summa::StepStats st = trainer.train_step();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double dt_max = dt;  // the slowest rank sets the pace
    MPI_Allreduce(MPI_IN_PLACE, &dt_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    times.push_back(dt_max);
    losses.push_back(st.loss);
    if (root) {
      const double tok_s = tokens_per_step / dt_max, flop_s = flops_per_step / dt_max;
      // ETA from the median of the last 20 steps.
      std::vector<double> recent(times.end() - std::min<std::ptrdiff_t>(20, std::ssize(times)),
                                 times.end());
      std::nth_element(recent.begin(), recent.begin() + std::ssize(recent) / 2, recent.end());
      const double eta = recent[recent.size() / 2] * static_cast<double>(steps - s - 1);
      char line[256];
      std::snprintf(line, sizeof line,
                    "step %5lld/%lld | loss %.4f | lr %.2e | |g| %.3f | %s | %s | mem %s/rank | "
                    "ETA %s",
                    static_cast<long long>(s + 1), static_cast<long long>(steps), st.loss, st.lr,
                    st.grad_norm, human(tok_s, "tok/s").c_str(), human(flop_s, "FLOP/s").c_str(),
                    human(mem, "B").c_str(), duration(eta).c_str());
      if (tty)
        std::printf("\r%s\033[K", line);
      else if ((s + 1) % cli.print_every == 0 || s == first || s + 1 == steps)
        std::printf("%s\n", line);
      std::fflush(stdout);
      if (log)
        log << "{\"step\": " << s + 1 << ", \"loss\": " << st.loss << ", \"lr\": " << st.lr
            << ", \"grad_norm\": " << st.grad_norm << ", \"step_s\": " << dt_max
            << ", \"tokens_per_s\": " << tok_s << ", \"model_flops_per_s\": " << flop_s << "}\n";
    }
    if (cli.eval_every > 0 && (s + 1) % cli.eval_every == 0 && s + 1 < steps) eval("at");
    if (cli.checkpoint_every > 0 && (s + 1) % cli.checkpoint_every == 0 && s + 1 < steps)
      trainer.save(ckpt_root);
  }
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  const double val_after = eval("after training,");
  if (trainer.step() > first || !resume) trainer.save(ckpt_root);  // nothing new otherwise
  if (!export_dir.empty()) trainer.export_hf(export_dir);
  if (!cli.check_batch.empty()) {
    // One validation batch and summa's loss on it, for scripts/hf_check.py
    // (the same loss from the export, in PyTorch).
    const summa::io::TokenLoader& L = trainer.loader();
    const summa::io::Batch b =
        L.batch(0, L.has_val() ? summa::io::Split::val : summa::io::Split::train);
    const double loss = trainer.model().forward(b.tokens, b.targets);
    if (root) {
      std::ofstream f(cli.check_batch, std::ios::binary | std::ios::trunc);
      for (const auto* ids : {&b.tokens, &b.targets})
        for (const std::int32_t id : *ids) {
          const auto u = static_cast<std::uint32_t>(id);
          const char bytes[4] = {static_cast<char>(u & 0xff), static_cast<char>((u >> 8) & 0xff),
                                 static_cast<char>((u >> 16) & 0xff),
                                 static_cast<char>((u >> 24) & 0xff)};
          f.write(bytes, 4);
        }
      if (!f) std::fprintf(stderr, "gpt_train: cannot write %s\n", cli.check_batch.c_str());
      std::printf(
          "check batch: %s (%lld x %lld ids, then targets; int32 LE), summa loss=%.17g\n"
          "  compare: /usr/bin/python3 scripts/hf_check.py %s %s %lld %lld\n",
          cli.check_batch.c_str(), static_cast<long long>(o.batch), static_cast<long long>(o.seq),
          loss, export_dir.c_str(), cli.check_batch.c_str(), static_cast<long long>(o.batch),
          static_cast<long long>(o.seq));
    }
  }
  if (root) {
    log.flush();
    const std::size_t k = std::min<std::size_t>(10, losses.size());
    const double head =
        k ? std::accumulate(losses.begin(), losses.begin() + static_cast<std::ptrdiff_t>(k), 0.0) /
                static_cast<double>(k)
          : 0;
    const double tail =
        k ? std::accumulate(losses.end() - static_cast<std::ptrdiff_t>(k), losses.end(), 0.0) /
                static_cast<double>(k)
          : 0;
    std::vector<double> sorted = times;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted.empty() ? 0 : sorted[sorted.size() / 2];
    std::printf("\n== summary ==\n");
    if (times.empty())
      std::printf("nothing to train: at step %lld of %lld (--steps N to go further)\n",
                  static_cast<long long>(trainer.step()), static_cast<long long>(steps));
    else
      std::printf("steps %lld..%lld in %s (median step %.3f s, %s, %s)\n",
                  static_cast<long long>(first), static_cast<long long>(trainer.step()),
                  duration(elapsed).c_str(), median,
                  human(median > 0 ? tokens_per_step / median : 0, "tok/s").c_str(),
                  human(median > 0 ? flops_per_step / median : 0, "FLOP/s").c_str());
    if (k)
      std::printf("training loss: mean of the first %zu steps %.4f -> last %zu steps %.4f\n", k,
                  head, k, tail);
    std::printf("validation loss: %.4f -> %.4f (uniform over %d tokens would be %.4f)\n",
                val_before, val_after, o.config.vocab_size,
                std::log(static_cast<double>(o.config.vocab_size)));
    std::printf("memory per rank (largest): %s\n", human(mem, "B").c_str());
    std::printf("checkpoint: %s (resume with --resume, under any scheme)\n",
                summa::latest_checkpoint(ckpt_root).value_or(ckpt_root).string().c_str());
    if (!export_dir.empty())
      std::printf("export:     %s/model.safetensors + config.json (Hugging Face GPT-2)\n",
                  export_dir.c_str());
    std::printf("log:        %s (plot: python3 scripts/plot_loss.py %s)\n", log_path.c_str(),
                log_path.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Cli cli;
  CLI::App app{"gpt_train: train a GPT-2 with summa under any tensor-parallel scheme"};
  app.add_option("--layers", cli.layers, "transformer blocks")->capture_default_str();
  app.add_option("--hidden", cli.hidden, "hidden size n_embd")->capture_default_str();
  app.add_option("--heads", cli.heads, "attention heads")->capture_default_str();
  app.add_option("--seq", cli.seq, "tokens per sequence")->capture_default_str();
  app.add_option("--vocab", cli.vocab,
                 "vocabulary size (0: the byte tokenizer's 256, padded to a multiple of the "
                 "tensor ranks)")
      ->capture_default_str();
  app.add_option("--positions", cli.positions, "n_positions (0: seq)")->capture_default_str();
  app.add_option("--scheme", cli.scheme,
                 "scheme and grid: 2d:q=Q, 1d:p=P, 3d:XxYxZ[,overlap=oar+ors+oag], with "
                 "optional data=D (default: 2d on a square rank count, else 1d)");
  app.add_option("--dtype", cli.dtype,
                 "float, double or bf16 (bf16 parameters and activations, fp32 master weights, "
                 "optimizer state and statistics)")
      ->check(CLI::IsMember({"float", "double", "bf16"}))
      ->capture_default_str();
  app.add_option("--backend", cli.backend,
                 "cpu (Eigen) or cuda (one GPU per rank, chosen from the node-local rank; needs "
                 "summa built with CUDA)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--comm", cli.comm,
                 "communicators: mpi (cpu only), nccl (cuda, one GPU per rank) or mpi_staged "
                 "(cuda, through pinned host buffers; several ranks may share a GPU). Default: "
                 "mpi on cpu, nccl on cuda")
      ->check(CLI::IsMember({"mpi", "nccl", "mpi_staged"}));
  app.add_flag("--tf32", cli.tf32, "cuda: TF32 tensor cores in float GEMMs");
  app.add_flag("!--no-recompute", cli.recompute, "keep every activation (no checkpointing)");
  app.add_option("--steps", cli.steps, "total training steps")->capture_default_str();
  app.add_option("--batch", cli.batch, "global batch (sequences per step)")->capture_default_str();
  app.add_option("--optimizer", cli.optimizer, "adamw or sgd")
      ->check(CLI::IsMember({"adamw", "sgd"}))
      ->capture_default_str();
  app.add_option("--lr", cli.lr, "peak learning rate")->capture_default_str();
  app.add_option("--min-lr", cli.min_lr, "final learning rate of the cosine (default lr/10)");
  app.add_option("--warmup", cli.warmup, "linear warm-up steps")->capture_default_str();
  app.add_option("--weight-decay", cli.weight_decay, "decoupled weight decay (2-D parameters)")
      ->capture_default_str();
  app.add_option("--beta2", cli.beta2, "AdamW beta2")->capture_default_str();
  app.add_option("--momentum", cli.momentum, "SGD momentum")->capture_default_str();
  app.add_option("--clip", cli.clip, "gradient global-norm clip (0: off)")->capture_default_str();
  app.add_option("--seed", cli.seed, "weight initialisation seed")->capture_default_str();
  app.add_option("--data-seed", cli.data_seed, "batch sampling seed")->capture_default_str();
  app.add_option("--data", cli.data, "token file (.bin, nanoGPT uint16) or text file")
      ->capture_default_str();
  app.add_option("--val-fraction", cli.val_fraction, "held-out tail of the data")
      ->capture_default_str();
  app.add_option("--eval-every", cli.eval_every, "validation every N steps (0: start/end only)")
      ->capture_default_str();
  app.add_option("--eval-batches", cli.eval_batches, "validation batches")->capture_default_str();
  app.add_option("--print-every", cli.print_every,
                 "progress line every N steps when stdout is not a terminal")
      ->capture_default_str();
  app.add_option("--out", cli.out, "output directory")->capture_default_str();
  app.add_option("--checkpoint-every", cli.checkpoint_every,
                 "checkpoint every N steps (0: only at the end)")
      ->capture_default_str();
  app.add_flag("--resume", cli.resume, "resume from <out>/checkpoints if there is one");
  app.add_option("--resume-from", cli.resume_from, "resume from this checkpoint (dir or root)");
  app.add_option("--import", cli.import_dir, "start from a Hugging Face GPT-2 export (dir)");
  app.add_option("--export", cli.export_dir, "Hugging Face export directory ('' : none)")
      ->capture_default_str();
  app.add_option("--log", cli.log, "JSON-lines log")->capture_default_str();
  app.add_option("--check-batch", cli.check_batch,
                 "after training, write a validation batch here and print summa's loss on it "
                 "(for scripts/hf_check.py)");
  int code = 0;
  try {
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      code = world_rank() == 0 ? app.exit(e) : (e.get_exit_code() == 0 ? 0 : 2);
      MPI_Finalize();
      return code;
    }
    for (const CLI::Option* opt : app.get_options())
      if (opt->count() > 0) cli.given.insert(opt->get_name());
    code = cli.dtype == "double" ? train<double>(cli)
           : cli.dtype == "bf16" ? train<summa::bf16>(cli)
                                 : train<float>(cli);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt_train (rank %d): %s\n", world_rank(), e.what());
    code = 1;
  }
  MPI_Finalize();
  return code;
}

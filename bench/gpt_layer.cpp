// gpt_layer: times one TransformerBlock and the whole GPT (2D scheme) (forward, and
// forward + backward, with and without activation checkpointing) on a q x q
// mesh and, at q = 1, the serial reference::Gpt on the same configuration.
// With --backend cuda (a libsumma built with CUDA) everything runs on the
// node-local rank's GPU (CudaBackend, communicators --comm), timed with the
// backend synchronised at the end of every timed step; the block's numbers
// are what bench/torch_block.py measures for PyTorch eager (bench/README.md,
// "GPU"). Prints one JSON object per line per case; see bench/README.md.
//
//   mpirun -np 4 ./gpt_layer [--layers 2] [--hidden 192] [--heads 6] [--seq 64] [--batch 6]
//                            [--vocab 1536] [--dtype f32,f64,bf16] [--checkpoint on|off|both]
//   ./gpt_layer --backend cuda --what block --hidden 1024 --heads 16 --seq 1024 --batch 8
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "bench_device.hpp"
#include "bench_json.hpp"
#include "summa/summa.hpp"

#if SUMMA_HAVE_CUDA
#include <cuda_runtime.h>

#include "summa/backend/cuda_backend.hpp"
#include "summa/comm/nccl_communicator.hpp"
#endif

namespace {

using summa::index_t;
using summa::bench::Json;

/// A bad command line or configuration: detected identically on every rank.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

// One run of `call` on every rank, started after a barrier: its time, the
// maximum over ranks.
template <class F>
double time_collective(F&& call) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = std::chrono::steady_clock::now();
  call();
  double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return dt;
}

std::uint64_t max_over_ranks(std::uint64_t v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  return v;
}

bool all_ranks(bool v) {
  int x = v ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return x != 0;
}

// ---------------------------------------------------------------- FLOPs
// Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
// Clusters Using Megatron-LM" (SC '21), FLOPs per iteration: per transformer layer
// the forward pass takes 24·B·s·h² + 4·B·s²·h FLOPs, the logit layer 2·B·s·h·V;
// backward is twice the forward, and activation recomputation adds one more
// forward of every transformer layer (not of the logit layer). Hence, for B
// sequences of s tokens, l layers, hidden h, vocabulary V:
//   forward                       24·B·s·l·h²·(1 + s/(6h) + V/(12·l·h))
//   forward + backward            72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h))
//   forward + backward + recompute 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))
// One block alone: l = 1, no vocabulary term.
struct Flops {
  double value;
  const char* formula;
};

Flops gpt_flops(double B, double s, double l, double h, double V, bool backward, bool recompute) {
  const double base = B * s * l * h * h;
  if (!backward)
    return {24 * base * (1 + s / (6 * h) + V / (12 * l * h)), "24Bslh^2(1+s/6h+V/12lh)"};
  if (!recompute)
    return {72 * base * (1 + s / (6 * h) + V / (12 * l * h)), "72Bslh^2(1+s/6h+V/12lh)"};
  return {96 * base * (1 + s / (6 * h) + V / (16 * l * h)), "96Bslh^2(1+s/6h+V/16lh)"};
}

Flops block_flops(double B, double s, double h, bool backward) {
  const double base = B * s * h * h * (1 + s / (6 * h));
  return backward ? Flops{72 * base, "72Bsh^2(1+s/6h)"} : Flops{24 * base, "24Bsh^2(1+s/6h)"};
}

// ---------------------------------------------------------------- settings
struct Settings {
  summa::reference::GptConfig config;
  index_t batch = 6, seq = 64;
  int reps = 5, warmup = 1;
  std::vector<bool> checkpoints;
  std::vector<std::string> dtypes;
  bool run_block = true, run_gpt = true, run_optimizer = false;
  summa::index_t offload_bucket = 1 << 22;  // --what optimizer: elements per bucket
  std::uint64_t seed = 1234;
  std::string backend = "cpu";      // "cpu" or "cuda"
  std::string comm = "mpi_staged";  // cuda: "mpi_staged" or "nccl"
  bool tf32 = false;                // cuda: TF32 tensor cores in f32 GEMMs
};

struct Context {
  summa::ProcessGrid* grid;
  summa::Backend* backend;
  summa::SummaEngine* engine;
  int q, ranks, rank;
  const Settings* s;
  std::string device;  ///< "cpu" or the GPU's name
};

// n elements of T in the backend's memory (device memory on cuda), moved to
// and from the host with upload/download outside the timed region.
template <class T>
class BackendArray {
 public:
  BackendArray(summa::Backend& backend, std::size_t n) : backend_(&backend), n_(n) {
    if (n_ > 0) data_ = static_cast<T*>(backend_->allocate(n_ * sizeof(T)));
  }
  ~BackendArray() {
    if (data_ != nullptr) backend_->deallocate(data_, n_ * sizeof(T));
  }
  BackendArray(const BackendArray&) = delete;
  BackendArray& operator=(const BackendArray&) = delete;
  T* data() const { return data_; }
  void upload(const std::vector<T>& host) {
    backend_->upload(data_, host.data(), std::min(n_, host.size()) * sizeof(T));
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    if (n_ > 0) backend_->download(host.data(), data_, n_ * sizeof(T));
    return host;
  }

 private:
  summa::Backend* backend_;
  std::size_t n_;
  T* data_ = nullptr;
};

// Sum of the bytes sent over every axis since the last reset, max over ranks.
std::uint64_t bytes_sent(const summa::ProcessGrid& g) {
  return max_over_ranks(g.traffic().total().bytes_sent);
}
std::uint64_t bytes_received(const summa::ProcessGrid& g) {
  return max_over_ranks(g.traffic().total().bytes_received);
}

// The fields every line has.
Json header(const Context& ctx, std::string_view what, bool backward, std::string_view dtype) {
  const Settings& s = *ctx.s;
  const summa::SummaOptions& o = ctx.engine->options();
  Json j = {{"bench", "gpt_layer"}, {"what", what},       {"pass", backward ? "fwd_bwd" : "fwd"},
            {"q", ctx.q},           {"ranks", ctx.ranks}, {"dtype", dtype}};
  j.update(summa::bench::model_shape_fields(s.config, s.seq, s.batch));
  j["panel"] = o.panel;
  j["overlap"] = o.overlap;
  j["reps"] = s.reps;
  j["warmup"] = s.warmup;
  j["backend"] = s.backend;
  j["device"] = ctx.device;
  if (s.backend == "cuda") {
    j["comm"] = s.comm;
    j["tf32"] = s.tf32;
  }
  return j;
}

// Timing, throughput and FLOP/s fields.
void add_rates(Json& j, const Context& ctx, const std::vector<double>& times, Flops model,
               Flops hardware) {
  const double t = median(times);
  const double tokens = static_cast<double>(ctx.s->batch * ctx.s->seq);
  j["median_s"] = t;
  j["min_s"] = *std::min_element(times.begin(), times.end());
  j["tokens_per_s"] = tokens / t;
  j["flops_formula"] = model.formula;
  j["model_flops"] = model.value;
  j["model_flops_per_s"] = model.value / t;
  j["hardware_flops_formula"] = hardware.formula;
  j["hardware_flops"] = hardware.value;
  j["hardware_flops_per_s"] = hardware.value / t;
}

void emit(const Context& ctx, const Json& j) {
  if (ctx.rank != 0) return;
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

template <class T>
bool all_finite(const std::vector<T>& v) {
  return std::all_of(v.begin(), v.end(), [](T x) { return std::isfinite(static_cast<double>(x)); });
}

// ---------------------------------------------------------------- (a) one block
// TransformerBlock "h.0" (2D) with GPT-2 initialised parameters in a
// ParameterStore and arenas sized from buffer_needs(), on random local input
// activations (and random output gradients for backward). Returns false when
// an output is not finite.
template <class T>
bool run_block(Context& ctx) {
  const Settings& s = *ctx.s;
  const auto& c = s.config;
  const int q = ctx.q;
  const std::string_view dtype = summa::name_of(summa::dtype_v<T>);
  summa::Summa2DContext<T> scheme(*ctx.engine);
  summa::TransformerBlock<T> block(scheme, "h.0", s.batch, s.seq, c.n_embd, c.n_head,
                                   c.layer_norm_epsilon);
  summa::ParameterStore<T> store(*ctx.backend, block.parameters());
  store.init_gpt(s.seed, c);
  const summa::BufferNeeds needs = block.buffer_needs();

  const index_t nt = s.batch * s.seq / q, hq = c.n_embd / q;
  const auto n = static_cast<std::size_t>(nt * hq);
  std::vector<T> x_host(n), dy_host(n);
  std::mt19937_64 rng(s.seed + 7919 * static_cast<std::uint64_t>(ctx.rank + 1));
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  for (T& e : x_host) e = static_cast<T>(u(rng));
  for (T& e : dy_host) e = static_cast<T>(1e-3 * u(rng));
  // Activations in the backend's memory (device memory on cuda).
  BackendArray<T> x(*ctx.backend, n), y(*ctx.backend, n), dy(*ctx.backend, n), dx(*ctx.backend, n);
  x.upload(x_host);
  dy.upload(dy_host);
  const auto view = [&](BackendArray<T>& v) {
    return summa::MatrixView<T>::dense(v.data(), nt, hq, summa::Order::row_major);
  };

  bool ok = true;
  for (bool backward : {false, true}) {
    // Fresh arenas per pass, so the forward-only high-water marks are its own.
    summa::Arena workspace("workspace", *ctx.backend, needs.workspace);
    summa::Arena forward("forward", *ctx.backend, needs.forward);
    summa::Arena bwd("backward", *ctx.backend, needs.backward);
    summa::StepBuffers step{workspace, forward, bwd};
    const auto call = [&] {
      workspace.reset();
      forward.reset();
      bwd.reset();
      block.forward(view(x), view(y), step);
      if (backward) block.backward(view(dy), view(dx), step);
      ctx.backend->synchronize();  // the step is over when the device is (no-op on CPU)
    };
    for (int w = 0; w < s.warmup; ++w) call();
    std::vector<double> times;
    for (int r = 0; r < s.reps; ++r) times.push_back(time_collective(call));
    ctx.grid->reset_traffic();
    call();  // the measured step
    const std::uint64_t sent = bytes_sent(*ctx.grid), received = bytes_received(*ctx.grid);
    const bool finite =
        all_ranks(all_finite(y.download()) && (!backward || all_finite(dx.download())));
    ok = ok && finite;
    const std::uint64_t peak =
        max_over_ranks(workspace.high_water() + forward.high_water() + bwd.high_water());

    const Flops f = block_flops(static_cast<double>(s.batch), static_cast<double>(s.seq),
                                static_cast<double>(c.n_embd), backward);
    Json j = header(ctx, "block", backward, dtype);
    j["checkpoint"] = nullptr;
    add_rates(j, ctx, times, f, f);
    j["bytes_sent_per_rank"] = sent;
    j["bytes_received_per_rank"] = received;
    j["peak_buffer_bytes_per_rank"] = peak;
    j["param_bytes_per_rank"] = max_over_ranks(store.bytes());
    j["finite"] = finite;
    emit(ctx, j);
  }
  return ok;
}

// ---------------------------------------------------------------- (b), (c) the model
// The same tokens on every rank: ids uniform in [0, vocab), targets the next
// token (the last one of each sequence random).
struct Batch {
  std::vector<std::int32_t> tokens, targets;
};

Batch make_batch(const Settings& s) {
  const auto count = static_cast<std::size_t>(s.batch * s.seq);
  Batch b{std::vector<std::int32_t>(count), std::vector<std::int32_t>(count)};
  std::mt19937_64 rng(s.seed);
  const auto V = static_cast<std::uint64_t>(s.config.vocab_size);
  std::vector<std::int32_t> stream(count + static_cast<std::size_t>(s.batch));
  for (auto& t : stream) t = static_cast<std::int32_t>(rng() % V);
  for (index_t i = 0; i < s.batch; ++i)
    for (index_t t = 0; t < s.seq; ++t) {
      const auto k = static_cast<std::size_t>(i * s.seq + t);
      const auto src = static_cast<std::size_t>(i * (s.seq + 1) + t);
      b.tokens[k] = stream[src];
      b.targets[k] = stream[src + 1];
    }
  return b;
}

// The GPT (2D) with `checkpoint`; at q = 1 also the serial reference (`serial`, the
// same weights), its repetitions interleaved with the distributed ones so the
// ratio is paired. Returns false when a loss is not finite.
// The serial reference is host code in f32 / f64; a bf16 run has none.
template <class T>
using SerialT = std::conditional_t<std::is_same_v<T, summa::bf16>, float, T>;

template <class T>
bool run_gpt(Context& ctx, const Batch& data, bool checkpoint,
             summa::reference::Gpt<SerialT<T>>* serial) {
  const Settings& s = *ctx.s;
  const auto& c = s.config;
  const std::string_view dtype = summa::name_of(summa::dtype_v<T>);
  summa::Summa2DContext<T> scheme(*ctx.engine);
  summa::Gpt<T> model(
      scheme, c, s.batch, s.seq,
      summa::GptOptions{.recompute = checkpoint ? summa::Recompute::full : summa::Recompute::none});
  model.init(s.seed);

  bool ok = true;
  for (bool backward : {false, true}) {
    double loss = 0, serial_loss = 0;
    bool finite = true;
    const auto call = [&] {
      loss = model.forward(data.tokens, data.targets);
      finite = finite && std::isfinite(loss);
      if (backward) model.backward();
      ctx.backend->synchronize();  // no-op on CPU
    };
    const auto serial_call = [&] {
      serial_loss = static_cast<double>(serial->forward(data.tokens, data.targets, s.batch, s.seq));
      finite = finite && std::isfinite(serial_loss);
      if (backward) serial->backward();
    };
    for (int w = 0; w < s.warmup; ++w) {
      if (serial) serial_call();
      call();
    }
    std::vector<double> times, serial_times;
    for (int r = 0; r < s.reps; ++r) {
      if (serial) serial_times.push_back(time_collective(serial_call));
      times.push_back(time_collective(call));
    }
    ctx.grid->reset_traffic();
    call();  // the measured step
    const std::uint64_t sent = bytes_sent(*ctx.grid), received = bytes_received(*ctx.grid);
    finite = all_ranks(finite);
    ok = ok && finite;

    const summa::MemoryReport mem = model.memory_report();
    std::uint64_t peak = 0;
    for (const summa::BufferUsage& b : mem.buffers) peak += b.high_water;
    peak = max_over_ranks(peak);

    const auto B = static_cast<double>(s.batch), S = static_cast<double>(s.seq),
               L = static_cast<double>(c.n_layer), H = static_cast<double>(c.n_embd),
               V = static_cast<double>(c.vocab_size);
    const Flops model_f = gpt_flops(B, S, L, H, V, backward, false);
    const Flops hw_f = gpt_flops(B, S, L, H, V, backward, backward && checkpoint);
    Json j = header(ctx, "gpt", backward, dtype);
    j["checkpoint"] = checkpoint;
    add_rates(j, ctx, times, model_f, hw_f);
    j["bytes_sent_per_rank"] = sent;
    j["bytes_received_per_rank"] = received;
    j["peak_buffer_bytes_per_rank"] = peak;
    j["param_bytes_per_rank"] = max_over_ranks(mem.parameters);
    j["activation_bytes_per_rank"] = max_over_ranks(mem.activations);
    j["buffer_capacity_bytes_per_rank"] = max_over_ranks(mem.total());
    j["loss"] = loss;
    if (serial) {
      const double st = median(serial_times);
      j["serial_median_s"] = st;
      j["serial_tokens_per_s"] = B * S / st;
      j["serial_model_flops_per_s"] = model_f.value / st;
      j["vs_serial"] = median(times) / st;
      j["serial_loss"] = serial_loss;
    }
    j["finite"] = finite;
    emit(ctx, j);
  }
  return ok;
}

// ---------------------------------------------------------------- (c) the optimizer
// AdamW over the GPT's parameters (2D) with its state on the backend and
// offloaded (OptimizerOptions::offload_bucket = --offload-bucket: the state
// in the backend's host pool, streamed through two buckets), their steps
// interleaved so the ratio is paired; the gradients of one forward and
// backward. One line: the plain step, the offloaded one and their ratio.
template <class T>
bool run_optimizer(Context& ctx) {
  const Settings& s = *ctx.s;
  const std::string_view dtype = summa::name_of(summa::dtype_v<T>);
  summa::Summa2DContext<T> scheme(*ctx.engine);
  summa::Gpt<T> model(scheme, s.config, s.batch, s.seq, summa::GptOptions{});
  model.init(s.seed);
  const Batch data = make_batch(s);
  model.forward(data.tokens, data.targets);
  model.backward();
  summa::ParameterStore<T>& store = model.parameters_store();
  const std::size_t device0 = ctx.backend->allocated_bytes();
  auto plain = summa::make_optimizer<T>({}, store);
  const std::size_t state_bytes = ctx.backend->allocated_bytes() - device0;
  const std::size_t device1 = ctx.backend->allocated_bytes(),
                    host1 = ctx.backend->host_allocated_bytes();
  auto offloaded = summa::make_optimizer<T>({.offload_bucket = s.offload_bucket}, store);
  const std::size_t staging = ctx.backend->allocated_bytes() - device1,
                    host = ctx.backend->host_allocated_bytes() - host1;
  const auto step = [&](summa::Optimizer<T>& o) {
    return [&] {
      o.step(1e-6);
      ctx.backend->synchronize();  // no-op on CPU
    };
  };
  for (int w = 0; w < s.warmup; ++w) {
    step (*plain)();
    step (*offloaded)();
  }
  std::vector<double> times, offload_times;
  for (int r = 0; r < s.reps; ++r) {
    times.push_back(time_collective(step(*plain)));
    offload_times.push_back(time_collective(step(*offloaded)));
  }
  std::vector<T> values(static_cast<std::size_t>(store.local_elements()));
  if (!values.empty())
    ctx.backend->download(values.data(), store.values_base(), values.size() * sizeof(T));
  const bool finite = all_ranks(all_finite(values));
  Json j = header(ctx, "optimizer", false, dtype);
  j["pass"] = "step";
  j["optimizer"] = "adamw";
  j["elements_per_rank"] = max_over_ranks(static_cast<std::uint64_t>(store.local_elements()));
  j["median_s"] = median(times);
  j["min_s"] = *std::min_element(times.begin(), times.end());
  j["offload_bucket"] = s.offload_bucket;
  j["offload_median_s"] = median(offload_times);
  j["offload_min_s"] = *std::min_element(offload_times.begin(), offload_times.end());
  j["offload_vs_on_backend"] = median(offload_times) / median(times);
  j["state_bytes_per_rank"] = max_over_ranks(static_cast<std::uint64_t>(state_bytes));
  j["offload_staging_bytes_per_rank"] = max_over_ranks(static_cast<std::uint64_t>(staging));
  j["offload_host_bytes_per_rank"] = max_over_ranks(static_cast<std::uint64_t>(host));
  // the host link's traffic per offloaded step: the state in and out
  j["offload_copy_bytes_per_s"] = 2.0 * static_cast<double>(host) / median(offload_times);
  j["finite"] = finite;
  emit(ctx, j);
  return finite;
}

template <class T>
bool run_dtype(Context& ctx) {
  const Settings& s = *ctx.s;
  bool ok = true;
  if (s.run_block) ok = run_block<T>(ctx) && ok;
  if (s.run_optimizer) ok = run_optimizer<T>(ctx) && ok;
  if (s.run_gpt) {
    const Batch data = make_batch(s);
    std::optional<summa::reference::Gpt<SerialT<T>>> serial;  // CPU f32 / f64 runs only
    if (ctx.q == 1 && s.backend == "cpu" && std::is_same_v<T, SerialT<T>>)
      serial.emplace(s.config, s.seed);
    for (bool cp : s.checkpoints) ok = run_gpt<T>(ctx, data, cp, serial ? &*serial : nullptr) && ok;
  }
  return ok;
}

// The requirements of the 2D GPT and TransformerBlock, checked up front with
// the command-line names (identical on every rank).
void validate(const Settings& s, int q) {
  const auto& c = s.config;
  const auto need = [](bool ok, const std::string& msg) {
    if (!ok) throw UsageError(msg);
  };
  const auto div = [&](const char* what, long long v, long long by, const char* by_what) {
    need(v % by == 0, std::string(what) + "=" + std::to_string(v) + " must be divisible by " +
                          by_what + "=" + std::to_string(by));
  };
  div("--hidden", c.n_embd, c.n_head, "--heads");
  div("--batch", s.batch, q, "q");
  div("--heads", c.n_head, q, "q");
  div("--hidden", c.n_embd, q, "q");
  div("--vocab", c.vocab_size, q, "q");
  need(s.seq <= c.n_positions,
       "--seq=" + std::to_string(s.seq) + " exceeds --positions=" + std::to_string(c.n_positions));
  c.validate();  // summa::Error for anything else
}

int run(int argc, char** argv, int rank, int ranks) {
  CLI::App app{
      "gpt_layer: one TransformerBlock and the whole GPT (2D) (forward, forward+backward) on a\n"
      "q x q mesh, and at q = 1 the serial reference GPT. Run under mpirun with a square number\n"
      "of ranks; prints one JSON object per case."};
  Settings s;
  int layers = 2, hidden = 192, heads = 6, vocab = 1536, positions = 0;
  long long batch = 6, seq = 64;
  std::vector<std::string> checkpoint{"on"}, dtypes{"f32"}, what{"block", "gpt"};
  app.add_option("--layers", layers, "Transformer blocks of the GPT")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--hidden", hidden, "Hidden size h (divisible by --heads and q)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--heads", heads, "Attention heads (divisible by q)")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--seq", seq, "Tokens per sequence s")
      ->check(CLI::Range(1LL, 1LL << 24))
      ->capture_default_str();
  app.add_option("--batch", batch, "Sequences per step B, global (divisible by q)")
      ->check(CLI::Range(1LL, 1LL << 24))
      ->capture_default_str();
  app.add_option("--vocab", vocab, "Vocabulary size V (divisible by q)")
      ->check(CLI::Range(1, 1 << 26))
      ->capture_default_str();
  app.add_option("--positions", positions, "Position table size (default: --seq)")
      ->check(CLI::Range(1, 1 << 24));
  app.add_option("--dtype", dtypes,
                 "Element types (list of f32, f64, bf16; bf16 has no serial-reference ratio)")
      ->delimiter(',')
      ->check(CLI::IsMember({"f32", "f64", "bf16"}))
      ->capture_default_str();
  app.add_option("--reps", s.reps, "Timed runs per case (median reported)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--warmup", s.warmup, "Untimed runs before timing")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  app.add_option("--checkpoint", checkpoint,
                 "GPT activation checkpointing (list of on, off; both = on,off)")
      ->delimiter(',')
      ->check(CLI::IsMember({"on", "off", "both"}))
      ->capture_default_str();
  app.add_option("--what", what,
                 "What to time (list of block, gpt, optimizer: AdamW's step on the backend "
                 "and offloaded, side by side)")
      ->delimiter(',')
      ->check(CLI::IsMember({"block", "gpt", "optimizer"}))
      ->capture_default_str();
  app.add_option("--offload-bucket", s.offload_bucket,
                 "--what optimizer: elements per bucket of the offloaded optimizer")
      ->check(CLI::Range(summa::index_t{1}, summa::index_t{1} << 40))
      ->capture_default_str();
  app.add_option("--seed", s.seed, "Seed of weights, tokens and activations")
      ->capture_default_str();
  summa::bench::add_device_options(app, s.backend, s.comm, s.tf32, "; --what defaults to block",
                                   "cuda: TF32 tensor cores in f32 GEMMs");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (rank == 0) return app.exit(e);
    return e.get_exit_code();
  }
  s.config.n_layer = layers;
  s.config.n_embd = hidden;
  s.config.n_head = heads;
  s.config.vocab_size = vocab;
  s.config.n_positions = positions > 0 ? positions : static_cast<int>(seq);
  s.batch = batch;
  s.seq = seq;
  const auto has = [](const std::vector<std::string>& v, const char* x) {
    return std::find(v.begin(), v.end(), x) != v.end();
  };
  if (has(checkpoint, "on") || has(checkpoint, "both")) s.checkpoints.push_back(true);
  if (has(checkpoint, "off") || has(checkpoint, "both")) s.checkpoints.push_back(false);
  s.dtypes = dtypes;
  const bool cuda = s.backend == "cuda";
  // On cuda the target is one block (the PyTorch comparison); the whole
  // model only when asked for.
  if (cuda && app.count("--what") == 0) what = {"block"};
  s.run_block = has(what, "block");
  s.run_gpt = has(what, "gpt");
  s.run_optimizer = has(what, "optimizer");
  // The backend first: the communicators order their work with its stream.
  summa::bench::BenchBackend chosen = summa::bench::make_backend<UsageError>(
      s.backend, s.comm, s.tf32, app.count("--comm") > 0, "gpt_layer");
  std::unique_ptr<summa::Backend> backend = std::move(chosen.backend);
  const std::string device = chosen.device;
  summa::ProcessGrid grid = summa::ProcessGrid::mesh2d(MPI_COMM_WORLD, 0, 1, chosen.grid);
  summa::SummaEngine engine(grid, *backend);
  const int q = grid.shape().rows;
  validate(s, q);

  Context ctx{&grid, backend.get(), &engine, q, ranks, rank, &s, device};
  if (rank == 0)
    std::fprintf(stderr, "gpt_layer: %d ranks, %dx%d mesh, %lld parameters, backend %s on %s\n",
                 ranks, q, q, static_cast<long long>(summa::reference::parameter_count(s.config)),
                 std::string(backend->name()).c_str(), device.c_str());
  bool ok = true;
  for (const auto& dt : s.dtypes)
    ok = (dt == "f32"   ? run_dtype<float>(ctx)
          : dt == "f64" ? run_dtype<double>(ctx)
                        : run_dtype<summa::bf16>(ctx)) &&
         ok;
  if (!ok && rank == 0)
    std::fprintf(stderr, "gpt_layer: FAILED: a loss or an output was not finite\n");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  // One thread per rank (Eigen is built without OpenMP; these cover any BLAS).
  setenv("BLIS_NUM_THREADS", "1", 1);
  setenv("OMP_NUM_THREADS", "1", 1);
  setenv("OPENBLAS_NUM_THREADS", "1", 1);
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  int status = 0;
  try {
    status = run(argc, argv, rank, ranks);
  } catch (const UsageError& e) {  // the same on every rank
    if (rank == 0) std::fprintf(stderr, "gpt_layer: %s\n", e.what());
    status = 2;
  } catch (const summa::Error& e) {  // summa reports errors on every rank alike
    if (rank == 0) std::fprintf(stderr, "gpt_layer: %s\n", e.what());
    status = 2;
  } catch (const std::exception& e) {  // possibly on this rank only: do not hang
    std::fprintf(stderr, "gpt_layer (rank %d): %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  MPI_Finalize();
  return status;
}

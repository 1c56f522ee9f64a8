// compare_schemes: one GPT configuration under every tensor-parallel scheme
// (1D Megatron, 2D Optimus SUMMA, 3D AxoNN, each with every data axis) that
// fits the world size, or under a given list: step time, throughput, bytes
// per rank and axis against the closed-form prediction, memory per rank, and
// the largest global batch that fits a per-rank memory budget (found by the
// planner, then confirmed by a real step). With --backend cuda everything
// runs on the node-local rank's GPU (CudaBackend, communicators --comm), the
// budget then being device memory. See bench/README.md and docs/schemes.md.
//
//   mpirun -np 4 ./compare_schemes [--layers 2] [--hidden 192] [--heads 24] [--seq 32]
//                                  [--batch 24] [--vocab 1536] [--schemes "2d:q=2;1d:p=4"]
//                                  [--budget-mib 64] [--max-batch 4096] [--format both]
//                                  [--dtype f32|f64|bf16] [--backend cpu|cuda]
//                                  [--predict machines/dev-2core.json]
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "../examples/flag_checks.hpp"
#include "bench_device.hpp"
#include "bench_json.hpp"
#include "summa/comm/consensus.hpp"
#include "summa/comm/mpi_init.hpp"
#include "summa/io/machine_file.hpp"
#include "summa/model/step_time.hpp"
#include "summa/schemes/registry.hpp"
#include "summa/summa.hpp"

namespace {

using summa::CommAxis;
using summa::index_t;
using u64 = std::uint64_t;
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

// The benchmark's own collectives on the world wait under the grid's
// watchdog while one lives (--watchdog; summa::wait_guarded), so a rank that
// stops is reported instead of leaving the others blocked here.
template <class V>
V reduce_world(V v, MPI_Datatype type, MPI_Op op) {
  MPI_Request request;
  MPI_Iallreduce(MPI_IN_PLACE, &v, 1, type, op, MPI_COMM_WORLD, &request);
  summa::wait_guarded(request, MPI_COMM_WORLD, "compare_schemes' all-reduce", sizeof v);
  return v;
}

// One run of `call` on every rank, started after a barrier: its time, the
// maximum over ranks.
template <class F>
double time_collective(F&& call) {
  MPI_Request request;
  MPI_Ibarrier(MPI_COMM_WORLD, &request);
  summa::wait_guarded(request, MPI_COMM_WORLD, "compare_schemes' timing barrier", 0);
  const auto t0 = std::chrono::steady_clock::now();
  call();
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return reduce_world(dt, MPI_DOUBLE, MPI_MAX);
}

u64 max_over_ranks(u64 v) {
  return reduce_world(v, MPI_UINT64_T, MPI_MAX);
}

bool all_ranks(bool v) {
  return reduce_world(v ? 1 : 0, MPI_INT, MPI_MIN) != 0;
}

// ---------------------------------------------------------------- FLOPs
// Narayanan et al. 2021 (SC '21), as in bench/gpt_layer.cpp: forward +
// backward of B sequences of s tokens, l layers, hidden h, vocabulary V,
// 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)); with activation recomputation
// 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)).
double step_flops(double B, double s, double l, double h, double V, bool recompute) {
  const double base = B * s * l * h * h;
  return recompute ? 96 * base * (1 + s / (6 * h) + V / (16 * l * h))
                   : 72 * base * (1 + s / (6 * h) + V / (12 * l * h));
}

// ---------------------------------------------------------------- axes
// The axes a GPT step uses, in table order; the world, mesh and other
// communicators carry no step traffic (they are still compared with the
// prediction).
constexpr std::array<CommAxis, 5> kAxes = {CommAxis::data, CommAxis::depth, CommAxis::mesh_row,
                                           CommAxis::mesh_col, CommAxis::tensor};

// What an axis is for under a scheme; empty when the scheme does not use it
// (not part of the scheme, or a group of one rank).
std::string_view role(const summa::SchemeSpec& spec, CommAxis axis) {
  if (axis == CommAxis::data) return spec.data > 1 ? "data" : "";
  return summa::scheme_row(spec.scheme).axis_role(spec, axis);
}

// Table headers of kAxes: the axis and its roles.
constexpr std::array<const char*, 5> kAxisHeads = {"data", "depth:Z", "mesh_row:row,Y",
                                                   "mesh_col:col,X", "tensor:1D"};

// ---------------------------------------------------------------- settings
struct Settings {
  summa::reference::GptConfig config;
  index_t batch = 24, seq = 32;
  int reps = 3, warmup = 1;
  summa::Recompute recompute = summa::Recompute::full;
  std::string dtype = "f32";
  std::string backend = "cpu";      // "cpu" or "cuda"
  std::string comm = "mpi_staged";  // cuda: "mpi_staged" or "nccl"
  bool tf32 = false;                // cuda: TF32 tensor cores in f32 GEMMs
  std::string device = "cpu";       // the GPU's name on cuda
  summa::GridOptions grid;          // communicators for the backend
  double budget_mib = 64;
  double available_bytes = 0;  // the backend's memory per rank (0: not checked)
  const char* available_source = "available on this node";
  index_t max_batch = 4096;
  std::vector<summa::SchemeSpec> schemes;
  // --predict: the step-time model's prediction beside each measurement
  std::optional<summa::model::Machine> machine;
  std::string machine_path;
  int ranks_per_device = 1;
  bool breakdown = false;     // --breakdown: the step's parts, measured and predicted
  bool auto_schemes = false;  // --schemes auto: the --top best by predicted step
  int top = 3;
  std::string format = "both";
  std::uint64_t seed = 1234;
  std::string pass = "train";  // --pass: train (the step) or inference
  double watchdog = 0;         // --watchdog: seconds a collective may wait (0: off)
  std::string timeline;        // --timeline: a pipeline's operations per rank, as JSON lines
};

// The same tokens on every rank: ids uniform in [0, vocab), targets the next
// token (the last one of each sequence random).
struct Batch {
  std::vector<std::int32_t> tokens, targets;
};

Batch make_batch(const Settings& s, index_t batch) {
  const auto count = static_cast<std::size_t>(batch * s.seq);
  Batch b{std::vector<std::int32_t>(count), std::vector<std::int32_t>(count)};
  std::mt19937_64 rng(s.seed);
  const auto V = static_cast<std::uint64_t>(s.config.vocab_size);
  std::vector<std::int32_t> stream(count + static_cast<std::size_t>(batch));
  for (auto& t : stream) t = static_cast<std::int32_t>(rng() % V);
  for (index_t i = 0; i < batch; ++i)
    for (index_t t = 0; t < s.seq; ++t) {
      const auto k = static_cast<std::size_t>(i * s.seq + t);
      const auto src = static_cast<std::size_t>(i * (s.seq + 1) + t);
      b.tokens[k] = stream[src];
      b.targets[k] = stream[src + 1];
    }
  return b;
}

// ---------------------------------------------------------------- one scheme
struct Memory {
  u64 parameters = 0, gradients = 0, activations = 0, total = 0, high_water = 0;
  bool within_capacity = true;  // on every rank, every arena
};

Memory memory_of(const summa::MemoryReport& r) {
  Memory m;
  m.parameters = max_over_ranks(r.parameters);
  m.gradients = max_over_ranks(r.gradients);
  m.activations = max_over_ranks(r.activations);
  m.total = max_over_ranks(r.total());
  u64 hw = 0;
  bool within = true;
  for (const summa::BufferUsage& b : r.buffers) {
    hw += b.high_water;
    within = within && b.high_water <= b.capacity;
  }
  m.high_water = max_over_ranks(hw);
  m.within_capacity = all_ranks(within);
  return m;
}

struct Result {
  summa::SchemeSpec spec;
  std::string skipped;  // the reason, when the scheme did not run
  double step_s = NAN, tokens_per_s = NAN, loss = NAN;
  bool finite = true;
  // Time in blocking communication (TrafficCounter::wait_seconds over the
  // axes) in the counted step, max over ranks; and the step-time model's
  // step and its exposed communication (--predict).
  double wait_s = NAN, predicted_s = NAN, predicted_exposed_s = NAN;
  // the prediction at the fast and slow ends of the calibration's spreads
  // (model::at_spread; NAN where the machine file records none)
  double predicted_low_s = NAN, predicted_high_s = NAN;
  // the most the backend held during the run (max over ranks), and the
  // recompute mode the model was built with
  u64 measured_peak = 0;
  std::optional<summa::Recompute> recompute;
  // --breakdown: per part of the step (GptModel::profile), the measured
  // seconds per step (mean over the timed steps, largest over ranks) and
  // the predicted ones
  struct Part {
    std::string op, phase;
    double measured_s = 0, predicted_s = 0;
  };
  std::vector<Part> parts;
  std::array<u64, 5> sent{}, received{};  // kAxes, max over ranks
  std::array<u64, 5> calls{};             // collective calls of one step, kAxes, max over ranks
  // a pipeline: its stage messages' bytes (max over ranks), its schedule,
  // and this rank's operations with when they ran (--timeline)
  u64 pipe_sent = 0;
  std::string schedule;
  std::vector<std::pair<summa::PipeOp, summa::PipeTiming>> timeline;
  bool have_prediction = false, prediction_matches = false;
  std::array<u64, 5> predicted_sent{}, predicted_received{};
  std::string prediction_note;
  Memory mem;
  index_t largest = 0;
  std::string largest_note;  // why there is none
  bool capped = false;
  std::optional<bool> confirmed, maximal;
  Memory largest_mem;
  double largest_step_s = NAN;

  bool failed() const {
    return !skipped.empty() ? false
                            : !finite || (have_prediction && !prediction_matches) ||
                                  confirmed == false || maximal == false;
  }
};

// A scheme's model: one grid (ParallelGpt), or a pipeline of stages
// (PipelineGpt, a scheme text with pipe=).
template <class T>
class Runner {
 public:
  Runner(const summa::SchemeSpec& spec, summa::Backend& backend, const Settings& s, index_t batch,
         const summa::GptOptions& options)
      : backend_(backend) {
    if (spec.pipeline.active())
      pipe_.emplace(MPI_COMM_WORLD, spec, backend, s.config, batch, s.seq, options, s.grid);
    else
      plain_.emplace(MPI_COMM_WORLD, spec, backend, s.config, batch, s.seq, options, s.grid);
  }
  summa::Gpt<T>& model() { return pipe_ ? pipe_->model() : plain_->model(); }
  summa::ProcessGrid& grid() { return pipe_ ? pipe_->grid() : plain_->grid(); }
  summa::PipelineGpt<T>* pipeline() { return pipe_ ? &*pipe_ : nullptr; }
  int stage() const { return pipe_ ? pipe_->stage() : 0; }
  void init(std::uint64_t seed) {
    if (pipe_)
      pipe_->init(seed);
    else
      plain_->model().init(seed);
  }
  // One training step's forward and backward (a pipeline's whole flushed
  // batch); over when the backend is (a no-op on the CPU).
  double step(const Batch& b) {
    double loss = 0;
    if (pipe_) {
      loss = pipe_->step(b.tokens, b.targets);
    } else {
      loss = plain_->model().forward(b.tokens, b.targets);
      plain_->model().backward();
    }
    backend_.synchronize();
    return loss;
  }
  void reset_traffic() {
    grid().reset_traffic();
    if (pipe_) pipe_->reset_pipe_traffic();
  }
  // The grid's axes, and the stage messages on CommAxis::pipe.
  summa::TrafficCounters traffic() {
    summa::TrafficCounters t = grid().traffic();
    if (pipe_) t[CommAxis::pipe] = pipe_->pipe_traffic();
    return t;
  }
  summa::MemoryReport memory_report() {
    return pipe_ ? pipe_->memory_report() : plain_->model().memory_report();
  }

 private:
  summa::Backend& backend_;
  std::optional<summa::ParallelGpt<T>> plain_;
  std::optional<summa::PipelineGpt<T>> pipe_;
};

template <class T>
Result run_scheme(const Settings& s, const summa::SchemeSpec& spec, summa::Backend& backend,
                  const Batch& data) {
  Result r;
  r.spec = spec;
  const summa::GptOptions options{.recompute = s.recompute, .profile = s.breakdown};
  std::optional<Runner<T>> run;
  // the backend's peak over this scheme's run, above what it held before
  backend.reset_peak_allocated();
  const std::size_t held_before = backend.allocated_bytes();
  try {
    // sizes checked before anything is built (summa/parallel/memory_check.hpp)
    summa::require_memory_fits<T>(MPI_COMM_WORLD, spec, backend, s.config, s.batch, s.seq, options,
                                  s.grid,
                                  {.bytes = s.available_bytes, .source = s.available_source}, "");
    run.emplace(spec, backend, s, s.batch, options);
  } catch (const summa::Error& e) {  // identical on every rank
    r.skipped = e.what();
    return r;
  }
  summa::Gpt<T>& model = run->model();
  summa::ProcessGrid& grid = run->grid();
  run->init(s.seed);

  // Warm-up, then the measured step (traffic), then the timed steps.
  double loss = 0;
  bool finite = true;
  const auto step = [&] {
    loss = run->step(data);
    finite = finite && std::isfinite(loss);
  };
  for (int w = 0; w < s.warmup; ++w) step();
  run->reset_traffic();
  step();
  const summa::TrafficCounters measured = run->traffic();

  std::vector<double> times;
  model.reset_profile();
  for (int k = 0; k < s.reps; ++k) times.push_back(time_collective(step));
  // a pipeline: its messages, and when each stage ran what in the last
  // timed step (it began after a barrier on every rank)
  if (const summa::PipelineGpt<T>* p = run->pipeline()) {
    r.pipe_sent = max_over_ranks(measured[CommAxis::pipe].bytes_sent);
    r.schedule = std::string(summa::to_string(spec.pipeline.schedule));
    for (std::size_t k = 0; k < p->trace().size(); ++k)
      r.timeline.push_back({p->trace()[k], p->timings()[k]});
  }
  for (const summa::StepPart& p :
       run->pipeline() ? std::vector<summa::StepPart>() : model.profile()) {
    const double per_step = reduce_world(p.seconds / s.reps, MPI_DOUBLE, MPI_MAX);
    r.parts.push_back({std::string(p.op), std::string(p.phase), per_step, 0});
  }
  r.step_s = median(times);
  r.tokens_per_s = static_cast<double>(s.batch * s.seq) / r.step_s;
  r.loss = loss;
  r.finite = all_ranks(finite);
  for (std::size_t a = 0; a < kAxes.size(); ++a) {
    r.sent[a] = max_over_ranks(measured[kAxes[a]].bytes_sent);
    r.received[a] = max_over_ranks(measured[kAxes[a]].bytes_received);
    r.calls[a] = max_over_ranks(measured[kAxes[a]].calls);
  }
  double wait = 0;
  for (std::size_t a = 0; a < summa::comm_axis_count; ++a)
    wait += measured[static_cast<CommAxis>(a)].wait_seconds;
  r.wait_s = reduce_world(wait, MPI_DOUBLE, MPI_MAX);
  // the step on `machine`, as timed: forward + backward, no optimizer
  const auto predicted_step = [&](const summa::model::Machine& machine) {
    const summa::model::StepTimeOptions o{.optimizer = false,
                                          .ranks_per_device = s.ranks_per_device};
    if (spec.pipeline.active())  // the schedule's span and the batch's data axis
      return summa::model::predict_pipeline_step_time(spec, s.config, s.batch, s.seq, options,
                                                      summa::dtype_v<T>, machine, o)
          .step_s;
    return summa::model::predict_step_time(spec, s.config, s.batch, s.seq, options,
                                           summa::dtype_v<T>, machine, o)
        .step_s;
  };
  if (s.machine && s.machine->spread.any()) {
    r.predicted_low_s = predicted_step(summa::model::at_spread(*s.machine, -1));
    r.predicted_high_s = predicted_step(summa::model::at_spread(*s.machine, 1));
  }
  if (s.machine && spec.pipeline.active()) {
    r.predicted_s = predicted_step(*s.machine);
  } else if (s.machine) {
    const summa::model::StepTime t = summa::model::predict_step_time(
        spec, s.config, s.batch, s.seq, options, summa::dtype_v<T>, *s.machine,
        {.optimizer = false, .ranks_per_device = s.ranks_per_device});
    r.predicted_s = t.step_s;
    r.predicted_exposed_s = t.exposed_s;
    // each block op priced on its own and summed into "blocks"
    for (const summa::model::OpTime& op : t.ops) {
      const bool block = op.op.starts_with("block.");
      for (Result::Part& p : r.parts)
        if ((p.op == op.op || (block && p.op == "blocks")) &&
            p.phase == summa::model::name_of(op.phase))
          p.predicted_s += op.seconds() * static_cast<double>(op.count);
    }
  }

  // The closed form for this rank; a scheme without a model throws on every rank.
  try {
    const summa::TrafficCounters want = summa::model::predict_step_traffic(
        spec, s.config, s.batch, s.seq, options, summa::dtype_v<T>, grid.coords(), false,
        run->stage());  // forward + backward: no optimizer
    bool match = true;
    for (std::size_t a = 0; a < summa::comm_axis_count; ++a) {
      const auto axis = static_cast<CommAxis>(a);
      match = match && measured[axis].bytes_sent == want[axis].bytes_sent &&
              measured[axis].bytes_received == want[axis].bytes_received;
    }
    r.have_prediction = true;
    r.prediction_matches = all_ranks(match);
    for (std::size_t a = 0; a < kAxes.size(); ++a) {
      r.predicted_sent[a] = max_over_ranks(want[kAxes[a]].bytes_sent);
      r.predicted_received[a] = max_over_ranks(want[kAxes[a]].bytes_received);
    }
  } catch (const summa::Error& e) {
    r.prediction_note = e.what();
  }
  r.mem = memory_of(run->memory_report());
  r.measured_peak = max_over_ranks(static_cast<u64>(backend.peak_allocated_bytes() - held_before));
  r.recompute = model.options().recompute;  // as the model was built
  // free this model before the largest-batch one
  run.reset();

  // Largest global batch within the budget (planner), then a real step there.
  const auto budget = static_cast<std::size_t>(s.budget_mib * 1024 * 1024);
  try {
    r.largest = summa::largest_batch<T>(MPI_COMM_WORLD, spec, backend, s.config, s.seq, options,
                                        budget, s.max_batch, s.grid);
  } catch (const summa::Error& e) {
    r.largest_note = e.what();
    return r;
  }
  if (r.largest == 0) {
    r.largest_note = "even the smallest batch exceeds the budget";
    return r;
  }
  const index_t next = r.largest + summa::batch_granularity(spec);
  r.capped = next > s.max_batch;
  try {
    // A --budget-mib beyond what the node has: the confirmation step is
    // checked against the node too (was: an allocation failure, MPI_ABORT)
    summa::require_memory_fits<T>(MPI_COMM_WORLD, spec, backend, s.config, r.largest, s.seq,
                                  options, s.grid,
                                  {.bytes = s.available_bytes, .source = s.available_source}, "");
  } catch (const summa::Error& e) {  // identical on every rank
    r.largest_note = std::string(
                         "not confirmed by a step (the budget is more than the node "
                         "has): ") +
                     e.what();
    r.confirmed = false;
    return r;
  }
  try {
    Runner<T> big(spec, backend, s, r.largest, options);
    big.init(s.seed);
    const Batch big_data = make_batch(s, r.largest);
    double big_loss = 0;
    r.largest_step_s = time_collective([&] { big_loss = big.step(big_data); });
    r.largest_mem = memory_of(big.memory_report());
    const bool finite = all_ranks(std::isfinite(big_loss));
    r.confirmed = r.largest_mem.within_capacity && r.largest_mem.total <= budget && finite;
    // why not, said (was: "largest batch not confirmed", no reason)
    if (!r.largest_mem.within_capacity)
      r.largest_note = "not confirmed: the step used more of an arena than the planner gave it";
    else if (r.largest_mem.total > budget) {
      char text[200];
      std::snprintf(text, sizeof text,
                    "not confirmed: the built model takes %.1f MiB per rank, more than the "
                    "budget of %.1f MiB the planner's figure fitted",
                    static_cast<double>(r.largest_mem.total) / (1 << 20), s.budget_mib);
      r.largest_note = text;
    } else if (!finite)
      r.largest_note = "not confirmed: the step's loss is not finite";
  } catch (const summa::Error& e) {
    r.largest_note = std::string("confirmation step failed: ") + e.what();
    r.confirmed = false;
  }
  if (!r.capped) {
    // The next batch really exceeds the budget: built (allocated), not run.
    try {
      Runner<T> over(spec, backend, s, next, options);
      r.maximal = max_over_ranks(over.memory_report().total()) > budget;
    } catch (const summa::Error&) {
      r.maximal = true;  // cannot even be built at that batch
    }
  }
  return r;
}

// ---------------------------------------------------------------- output
std::string mib(u64 bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

std::string kib(u64 bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", static_cast<double>(bytes) / 1024.0);
  return buf;
}

// One JSON line (keys in this order; null for "not applicable").
Json json_of(const Settings& s, const Result& r, int ranks) {
  Json j = {{"bench", "compare_schemes"},
            {"scheme", r.spec.str()},
            {"ranks", ranks},
            {"tensor_ranks", r.spec.tensor_ranks()},
            {"data", r.spec.data},
            {"dtype", s.dtype},
            {"backend", s.backend},
            {"device", s.device},
            {"recompute", summa::to_string(r.recompute.value_or(s.recompute))}};
  j.update(summa::bench::model_shape_fields(s.config, s.seq, s.batch));
  j["reps"] = s.reps;
  j["warmup"] = s.warmup;
  if (!r.skipped.empty()) {
    j["ok"] = true;
    j["skipped"] = r.skipped;
    return j;
  }
  j["skipped"] = nullptr;
  j["median_s"] = r.step_s;
  j["tokens_per_s"] = r.tokens_per_s;
  const double flops =
      step_flops(static_cast<double>(s.batch), static_cast<double>(s.seq),
                 static_cast<double>(s.config.n_layer), static_cast<double>(s.config.n_embd),
                 static_cast<double>(s.config.vocab_size), false);
  j["model_flops_per_s"] = flops / r.step_s;
  j["loss"] = r.loss;
  j["finite"] = r.finite;
  j["comm_wait_s"] = r.wait_s;
  if (!r.parts.empty()) {
    Json parts = Json::array();
    for (const Result::Part& p : r.parts) {
      Json o = {{"op", p.op}, {"phase", p.phase}, {"measured_s", p.measured_s}};
      if (s.machine) o["predicted_s"] = p.predicted_s;
      parts.push_back(o);
    }
    j["breakdown"] = parts;
  }
  if (s.machine) {
    j["machine"] = s.machine->name;
    j["ranks_per_device"] = s.ranks_per_device;
    j["predicted_step_s"] = r.predicted_s;
    j["predicted_exposed_comm_s"] = r.predicted_exposed_s;
    j["prediction_error"] = (r.predicted_s - r.step_s) / r.step_s;
    if (!std::isnan(r.predicted_low_s)) {  // the calibration's interval, and the measurement in it
      j["predicted_step_s_low"] = r.predicted_low_s;
      j["predicted_step_s_high"] = r.predicted_high_s;
      j["measured_within_interval"] =
          r.step_s >= r.predicted_low_s && r.step_s <= r.predicted_high_s;
    }
  }
  Json roles, sent, received, calls, psent, preceived;
  for (std::size_t a = 0; a < kAxes.size(); ++a) {
    const std::string name(summa::name_of(kAxes[a]));
    const std::string_view what = role(r.spec, kAxes[a]);
    roles[name] = what.empty() ? Json() : Json(std::string(what));
    sent[name] = r.sent[a];
    received[name] = r.received[a];
    calls[name] = r.calls[a];
    psent[name] = r.predicted_sent[a];
    preceived[name] = r.predicted_received[a];
  }
  if (r.spec.pipeline.active()) {
    j["pipe_bytes_sent_per_rank"] = r.pipe_sent;
    j["stages"] = r.spec.pipeline.stages;
    j["micro"] = r.spec.pipeline.micro;
    j["schedule"] = r.schedule;
  }
  j["axis_roles"] = roles;
  j["bytes_sent_per_rank"] = sent;
  j["bytes_received_per_rank"] = received;
  j["calls_per_rank"] = calls;
  if (r.have_prediction) {
    j["predicted_bytes_sent_per_rank"] = psent;
    j["predicted_bytes_received_per_rank"] = preceived;
    j["prediction_matches"] = r.prediction_matches;
  } else {
    j["predicted_bytes_sent_per_rank"] = nullptr;
    j["predicted_bytes_received_per_rank"] = nullptr;
    j["prediction_matches"] = nullptr;
    j["prediction_note"] = r.prediction_note;
  }
  const auto mem = [](const Memory& m) {
    return Json{{"parameters", m.parameters},
                {"gradients", m.gradients},
                {"activations", m.activations},
                {"buffer_high_water", m.high_water},
                {"total_capacity", m.total}};
  };
  j["memory_bytes_per_rank"] = mem(r.mem);
  // the backend's peak (every buffer the library allocated) against the
  // capacities above: the planner's truth (docs/memory.md)
  j["measured_peak_bytes_per_rank"] = r.measured_peak;
  j["budget_mib"] = s.budget_mib;
  j["max_batch"] = s.max_batch;
  j["largest_batch"] = r.largest;
  j["largest_batch_capped"] = r.capped;
  j["confirmed"] = r.confirmed ? Json(*r.confirmed) : Json();
  j["next_batch_exceeds"] = r.maximal ? Json(*r.maximal) : Json();
  if (r.confirmed) {
    j["largest_batch_memory_bytes_per_rank"] = mem(r.largest_mem);
    j["largest_batch_step_s"] = r.largest_step_s;
  }
  if (!r.largest_note.empty()) j["largest_batch_note"] = r.largest_note;
  j["ok"] = !r.failed();
  return j;
}

// A plain-text table: columns padded to their widest cell.
class Table {
 public:
  void row(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }
  void print(std::FILE* out) const {
    std::vector<std::size_t> width;
    for (const auto& r : rows_)
      for (std::size_t c = 0; c < r.size(); ++c) {
        if (width.size() <= c) width.push_back(0);
        width[c] = std::max(width[c], r[c].size());
      }
    for (std::size_t i = 0; i < rows_.size(); ++i) {
      std::string line;
      for (std::size_t c = 0; c < rows_[i].size(); ++c) {
        const std::string& cell = rows_[i][c];
        const std::string pad(width[c] - cell.size(), ' ');
        line += c == 0 ? cell + pad : "  " + pad + cell;  // first column left, others right
      }
      while (!line.empty() && line.back() == ' ') line.pop_back();
      std::fprintf(out, "%s\n", line.c_str());
      if (i == 0) std::fprintf(out, "%s\n", std::string(line.size(), '-').c_str());
    }
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

// A scheme's place in the predicted order: 1 + the number of distinct
// predicted step times below its own (schemes that do the same computation,
// e.g. data=4 with 1d:p=1, 2d:q=1 or 3d:1x1x1, are predicted alike and
// share a place).
int predicted_place(const std::vector<Result>& results, const Result& r) {
  std::vector<double> below;
  for (const Result& o : results)
    if (o.skipped.empty() && o.predicted_s < r.predicted_s &&
        std::none_of(below.begin(), below.end(),
                     [&](double t) { return std::abs(t - o.predicted_s) <= 1e-9 * r.predicted_s; }))
      below.push_back(o.predicted_s);
  return 1 + static_cast<int>(below.size());
}

// --breakdown: per scheme, each part's measured seconds per step (and the
// prediction beside it with --predict).
void print_breakdown(std::FILE* out, const Settings& s, const std::vector<Result>& results) {
  std::fprintf(out, "\nbreakdown: seconds per step of each part, measured%s (largest over ranks)\n",
               s.machine ? " and predicted" : "");
  for (const Result& r : results) {
    if (!r.skipped.empty()) continue;
    std::fprintf(out, "  %s\n", r.spec.str().c_str());
    for (const Result::Part& p : r.parts) {
      // the block ops are nested in the blocks parts: indented
      const std::string name = (p.op.starts_with("block.") ? "  " : "") + p.op + "." + p.phase;
      if (s.machine)
        std::fprintf(out, "    %-32s %9.5f %9.5f %+7.1f%%\n", name.c_str(), p.measured_s,
                     p.predicted_s,
                     p.measured_s > 0 ? 100 * (p.predicted_s - p.measured_s) / p.measured_s : 0.0);
      else
        std::fprintf(out, "    %-32s %9.5f\n", name.c_str(), p.measured_s);
    }
  }
}

// How well the step-time model did: mean and worst |error| over the schemes
// that ran, and where the measured fastest scheme is in the predicted order.
void print_prediction_summary(std::FILE* out, const Settings& s,
                              const std::vector<Result>& results) {
  double sum = 0, worst = 0;
  int n = 0;
  const Result* fastest = nullptr;
  for (const Result& r : results) {
    if (!r.skipped.empty()) continue;
    const double err = std::abs(r.predicted_s - r.step_s) / r.step_s;
    sum += err;
    worst = std::max(worst, err);
    ++n;
    if (fastest == nullptr || r.step_s < fastest->step_s) fastest = &r;
  }
  if (n == 0) return;
  const int place = predicted_place(results, *fastest);
  std::fprintf(out,
               "\nprediction (%s, %d rank(s) per device, forward + backward): mean |error| "
               "%.1f %%, worst %.1f %% over %d scheme(s); measured fastest %s is predicted #%d\n",
               s.machine->name.c_str(), s.ranks_per_device, 100 * sum / n, 100 * worst, n,
               fastest->spec.str().c_str(), place);
}

void print_table(std::FILE* out, const Settings& s, const std::vector<Result>& results, int ranks) {
  std::fprintf(out,
               "\ncompare_schemes: %d ranks, layers %d, hidden %d, heads %d, seq %lld, batch %lld, "
               "vocab %d, positions %d, %s, recompute %s, budget %.6g MiB/rank, max batch "
               "%lld, backend %s%s%s\n",
               ranks, s.config.n_layer, s.config.n_embd, s.config.n_head,
               static_cast<long long>(s.seq), static_cast<long long>(s.batch), s.config.vocab_size,
               s.config.n_positions, s.dtype.c_str(),
               std::string(summa::to_string(s.recompute)).c_str(), s.budget_mib,
               static_cast<long long>(s.max_batch), s.backend.c_str(),
               s.backend == "cuda" ? " on " : "", s.backend == "cuda" ? s.device.c_str() : "");
  std::fprintf(
      out,
      "bytes: KiB sent per rank in one step (max over ranks) per axis:role ('-': axis unused); "
      "pred: '=' every rank and axis equals the closed form, '!=' not, '-' no model\n"
      "memory: MiB per rank (max over ranks); largest: global batch within the budget "
      "(+ confirmed by a real step, ! not confirmed, * = --max-batch cap)\n\n");
  Table t;
  std::vector<std::string> head = {"scheme", "step_s", "tokens/s", "wait_s"};
  if (s.machine)
    for (const char* h : {"pred_s", "err%", "rank"}) head.emplace_back(h);
  for (const char* a : kAxisHeads) head.emplace_back(a);
  const bool pipes = std::any_of(results.begin(), results.end(), [](const Result& r) {
    return r.skipped.empty() && r.spec.pipeline.active();
  });
  if (pipes) head.emplace_back("pipe:stages");
  for (const char* h : {"pred", "param", "grad", "act", "total", "largest"}) head.emplace_back(h);
  t.row(head);
  for (const Result& r : results) {
    if (!r.skipped.empty()) continue;
    char buf[32];
    std::vector<std::string> row = {r.spec.str()};
    std::snprintf(buf, sizeof buf, "%.4f", r.step_s);
    row.emplace_back(buf);
    std::snprintf(buf, sizeof buf, "%.0f", r.tokens_per_s);
    row.emplace_back(buf);
    std::snprintf(buf, sizeof buf, "%.4f", r.wait_s);
    row.emplace_back(buf);
    if (s.machine) {
      std::snprintf(buf, sizeof buf, "%.4f", r.predicted_s);
      row.emplace_back(buf);
      std::snprintf(buf, sizeof buf, "%+.1f", 100 * (r.predicted_s - r.step_s) / r.step_s);
      row.emplace_back(buf);
      row.push_back(std::to_string(predicted_place(results, r)));
    }
    for (std::size_t a = 0; a < kAxes.size(); ++a) {
      const std::string_view what = role(r.spec, kAxes[a]);
      row.push_back(r.sent[a] == 0 && what.empty() ? "-" : kib(r.sent[a]));
    }
    if (pipes) row.push_back(r.spec.pipeline.active() ? kib(r.pipe_sent) : "-");
    row.emplace_back(!r.have_prediction ? "-" : r.prediction_matches ? "=" : "!=");
    row.push_back(mib(r.mem.parameters));
    row.push_back(mib(r.mem.gradients));
    row.push_back(mib(r.mem.activations));
    row.push_back(mib(r.mem.total));
    std::string largest = std::to_string(r.largest);
    if (r.confirmed) largest += *r.confirmed && r.maximal != false ? " +" : " !";
    if (r.capped) largest += "*";
    row.push_back(largest);
    t.row(row);
  }
  t.print(out);
  if (s.machine) print_prediction_summary(out, s, results);
  if (s.breakdown) print_breakdown(out, s, results);
  bool any_skipped = false;
  for (const Result& r : results) {
    if (r.skipped.empty()) continue;
    if (!any_skipped) std::fprintf(out, "\nskipped:\n");
    any_skipped = true;
    std::fprintf(out, "  %s: %s\n", r.spec.str().c_str(), r.skipped.c_str());
  }
  for (const Result& r : results) {
    if (!r.failed()) continue;
    const std::string why =
        !r.finite                                    ? std::string("loss not finite")
        : r.have_prediction && !r.prediction_matches ? std::string("measured bytes != prediction")
        : r.confirmed == false
            ? "largest batch not confirmed" +
                  (r.largest_note.empty() ? std::string() : " (" + r.largest_note + ")")
            : std::string("the next batch also fits the budget");
    std::fprintf(out, "FAILED %s: %s\n", r.spec.str().c_str(), why.c_str());
  }
}

// --schemes auto: every scheme of the world size planned and priced
// (summa::rank_schemes), the table of candidates on rank 0, then the --top
// best within the budget are the ones run.
template <class T>
std::vector<summa::SchemeSpec> auto_schemes(const Settings& s, summa::Backend& backend, int rank,
                                            std::FILE* text) {
  const auto budget = static_cast<std::uint64_t>(s.budget_mib * 1024 * 1024);
  const std::vector<summa::SchemeCandidate> all = summa::rank_schemes<T>(
      MPI_COMM_WORLD, backend, s.config, s.batch, s.seq, {.recompute = s.recompute}, *s.machine,
      {.budget_bytes = budget,
       .time = {.optimizer = false, .ranks_per_device = s.ranks_per_device}},
      s.grid);
  std::vector<summa::SchemeSpec> chosen;
  if (rank == 0)
    std::fprintf(text,
                 "# --schemes auto on %s: predicted step (forward + backward), memory per rank\n",
                 s.machine->name.c_str());
  int place = 0;
  for (const summa::SchemeCandidate& c : all) {
    const bool run = c.rejected.empty() && static_cast<int>(chosen.size()) < s.top;
    if (run) chosen.push_back(c.spec);
    if (rank != 0) continue;
    if (c.rejected.empty())
      std::fprintf(text, "#   %2d. %-20s %9.4f s %9.2f MiB%s\n", ++place, c.spec.str().c_str(),
                   c.time.step_s, static_cast<double>(c.memory_bytes) / (1 << 20),
                   run ? "  (run)" : "");
    else
      std::fprintf(text, "#    -  %-20s %s\n", c.spec.str().c_str(), c.rejected.c_str());
  }
  if (chosen.empty())
    throw UsageError("--schemes auto: no scheme fits the configuration and budget");
  return chosen;
}

// --timeline: every rank's operations of a pipeline's timed step, gathered
// on rank 0 and written one JSON line each.
void write_timeline(std::FILE* out, const Result& r, const summa::SchemeSpec& spec, int rank,
                    int ranks) {
  std::vector<double> mine;  // forward, micro, start, end per operation
  for (const auto& [op, when] : r.timeline)
    mine.insert(mine.end(),
                {op.forward ? 1.0 : 0.0, static_cast<double>(op.micro), when.start_s, when.end_s});
  const int count = static_cast<int>(mine.size());
  std::vector<int> counts(static_cast<std::size_t>(ranks)), offsets(counts.size());
  MPI_Gather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  int total = 0;
  for (std::size_t k = 0; k < counts.size(); ++k) {
    offsets[k] = total;
    total += counts[k];
  }
  std::vector<double> all(rank == 0 ? static_cast<std::size_t>(total) : 0);
  MPI_Gatherv(mine.data(), count, MPI_DOUBLE, all.data(), counts.data(), offsets.data(), MPI_DOUBLE,
              0, MPI_COMM_WORLD);
  if (rank != 0) return;
  const int per_stage = spec.stage().ranks();
  for (int k = 0; k < ranks; ++k)
    for (int i = offsets[static_cast<std::size_t>(k)];
         i < offsets[static_cast<std::size_t>(k)] + counts[static_cast<std::size_t>(k)]; i += 4) {
      const Json j = {{"scheme", spec.str()},
                      {"schedule", r.schedule},
                      {"stages", spec.pipeline.stages},
                      {"micro", spec.pipeline.micro},
                      {"rank", k},
                      {"stage", k / per_stage},
                      {"forward", all[static_cast<std::size_t>(i)] == 1.0},
                      {"microbatch", static_cast<int>(all[static_cast<std::size_t>(i) + 1])},
                      {"start_s", all[static_cast<std::size_t>(i) + 2]},
                      {"end_s", all[static_cast<std::size_t>(i) + 3]}};
      std::fprintf(out, "%s\n", j.dump().c_str());
    }
  std::fflush(out);
}

template <class T>
int run_all(const Settings& given, summa::Backend& backend, int rank, int ranks) {
  Settings s = given;
  s.available_bytes = summa::available_memory_per_rank(MPI_COMM_WORLD, backend);
  s.available_source = summa::available_memory_source(backend);
  // the token and target ids of the batch (and the stream they come from)
  const double id_bytes = 3.0 * sizeof(std::int32_t) * static_cast<double>(s.batch * s.seq);
  if (s.available_bytes > 0 && id_bytes > s.available_bytes)  // the same on every rank
    throw summa::CollectiveError(
        "--batch " + std::to_string(s.batch) + " --seq " + std::to_string(s.seq) + " needs " +
        summa::human_bytes(id_bytes) + " per rank for its token ids alone, more than the " +
        summa::human_bytes(s.available_bytes) + " per rank " + s.available_source);
  const Batch data = make_batch(s, s.batch);
  // In "json" mode stdout carries only JSON lines; the rest goes to stderr.
  std::FILE* text = s.format == "json" ? stderr : stdout;
  if (s.auto_schemes) s.schemes = auto_schemes<T>(s, backend, rank, text);
  std::vector<Result> results;
  std::FILE* timeline = nullptr;
  if (!s.timeline.empty()) {  // opened (or not) on rank 0, agreed
    if (rank == 0) timeline = std::fopen(s.timeline.c_str(), "w");
    if (!all_ranks(rank != 0 || timeline != nullptr))
      throw summa::CollectiveError("--timeline " + s.timeline + ": cannot be written");
  }
  for (const summa::SchemeSpec& spec : s.schemes) {
    const auto t0 = std::chrono::steady_clock::now();
    results.push_back(run_scheme<T>(s, spec, backend, data));
    const Result& r = results.back();
    if (!s.timeline.empty() && r.skipped.empty() && spec.pipeline.active())
      write_timeline(timeline, r, spec, rank, ranks);
    if (rank != 0) continue;
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s.format != "json") {
      if (r.skipped.empty())
        std::fprintf(text, "# %-18s ran in %.1f s\n", spec.str().c_str(), dt);
      else
        std::fprintf(text, "# %-18s skipped: %s\n", spec.str().c_str(), r.skipped.c_str());
    }
    if (s.format != "table")
      std::fprintf(stdout, "%s%s\n", s.format == "both" ? "json: " : "",
                   json_of(s, r, ranks).dump().c_str());
    std::fflush(stdout);
    std::fflush(stderr);
  }
  if (timeline != nullptr) std::fclose(timeline);
  bool failed = false;
  int ran = 0;
  for (const Result& r : results) {
    failed = failed || r.failed();
    ran += r.skipped.empty() ? 1 : 0;
  }
  if (rank == 0) {
    print_table(text, s, results, ranks);
    if (ran == 0) std::fprintf(text, "compare_schemes: FAILED: no scheme accepted the config\n");
    std::fflush(text);
  }
  return failed || ran == 0 ? 1 : 0;
}

// --pass plan's Markdown: the header, one row per scheme, then the schemes
// the configuration does not fit. The exit status (every rank): 1 when no
// scheme accepted it.
int print_plan_table(int rank, const char* head, const std::vector<std::string>& rows,
                     const std::vector<std::string>& skipped, std::size_t schemes) {
  if (rank == 0) {
    std::printf("%s", head);
    for (const std::string& l : rows) std::printf("%s\n", l.c_str());
    if (!skipped.empty()) {
      std::printf("\nSkipped:\n\n");
      for (const std::string& l : skipped) std::printf("* %s\n", l.c_str());
    }
  }
  return skipped.size() == schemes ? 1 : 0;
}

// --pass plan: per scheme, only what is deterministic, planned without
// building a model or running a step: the bytes each rank sends per axis in
// one step (predict_step_traffic, which every measured step equals: the
// tests and --pass train check it), memory per rank (plan_memory, largest
// over ranks) and the largest batch within the budget (largest_batch,
// planned; --pass train confirms it with a real step). Seconds per scheme;
// --format table prints a Markdown table (docs/schemes.md is generated by it).
//
// --pass plan-inference: per scheme the memory per rank (largest over
// ranks) planned for training, for the model built for inference
// (forward only) and for the decoder (seq 1 and a key/value cache of --seq
// positions): the memory columns of --pass inference, without running.
template <class T>
int run_plan_inference(const Settings& s, summa::Backend& backend, int rank) {
  const auto planned = [&](const summa::SchemeSpec& spec, index_t seq, summa::GptOptions o) {
    const u64 t =
        summa::plan_memory<T>(MPI_COMM_WORLD, spec, backend, s.config, s.batch, seq, o, s.grid)
            .total();
    return mib(max_over_ranks(t));
  };
  std::vector<std::string> lines, skipped;
  for (const summa::SchemeSpec& spec : s.schemes) {
    std::string row = "| `" + spec.str() + "` |";
    try {
      row += " " + planned(spec, s.seq, {.recompute = s.recompute}) + " |";
      row += " " + planned(spec, s.seq, {.inference = true}) + " |";
      row += " " + planned(spec, 1, {.inference = true, .kv_cache = s.seq}) + " |";
    } catch (const summa::Error& e) {  // identical on every rank
      skipped.push_back("`" + spec.str() + "`: " + e.what());
      continue;
    }
    lines.push_back(row);
  }
  return print_plan_table(rank,
                          "| scheme | train MiB | forward MiB | decoder MiB |\n"
                          "|---|--:|--:|--:|\n",
                          lines, skipped, s.schemes.size());
}

template <class T>
int run_plan(const Settings& s, summa::Backend& backend, int rank, int ranks) {
  if (s.pass == "plan-inference") return run_plan_inference<T>(s, backend, rank);
  const summa::GptOptions options{.recompute = s.recompute};
  const auto budget = static_cast<std::size_t>(s.budget_mib * 1024 * 1024);
  std::vector<std::string> lines, skipped;
  for (const summa::SchemeSpec& spec : s.schemes) {
    Result r;
    r.spec = spec;
    try {
      summa::ProcessGrid grid = summa::make_grid(MPI_COMM_WORLD, spec, s.grid);
      const summa::TrafficCounters want = summa::model::predict_step_traffic(
          spec, s.config, s.batch, s.seq, options, summa::dtype_v<T>, grid.coords(), false);
      for (std::size_t a = 0; a < kAxes.size(); ++a)
        r.sent[a] = max_over_ranks(want[kAxes[a]].bytes_sent);
      r.mem = memory_of(summa::plan_memory<T>(MPI_COMM_WORLD, spec, backend, s.config, s.batch,
                                              s.seq, options, s.grid));
      r.largest = summa::largest_batch<T>(MPI_COMM_WORLD, spec, backend, s.config, s.seq, options,
                                          budget, s.max_batch, s.grid);
    } catch (const summa::Error& e) {  // identical on every rank
      skipped.push_back("`" + spec.str() + "`: " + e.what());
      continue;
    }
    if (rank != 0) continue;
    if (s.format == "json") {
      Json j;
      j["scheme"] = spec.str();
      j["ranks"] = ranks;
      for (std::size_t a = 0; a < kAxes.size(); ++a)
        j["sent_bytes_" + std::string(summa::name_of(kAxes[a]))] = r.sent[a];
      j["parameters_bytes"] = r.mem.parameters;
      j["gradients_bytes"] = r.mem.gradients;
      j["activations_bytes"] = r.mem.activations;
      j["total_bytes"] = r.mem.total;
      j["largest_batch"] = r.largest;
      std::printf("%s\n", j.dump().c_str());
      continue;
    }
    std::string row = "| `" + spec.str() + "` |";
    for (std::size_t a = 0; a < kAxes.size(); ++a)
      row += " " +
             (r.sent[a] == 0 && role(spec, kAxes[a]).empty() ? std::string("–") : kib(r.sent[a])) +
             " |";
    for (u64 b : {r.mem.parameters, r.mem.gradients, r.mem.activations, r.mem.total})
      row += " " + mib(b) + " |";
    row += " " + std::to_string(r.largest) +
           (r.largest + summa::batch_granularity(spec) > s.max_batch ? "* |" : " |");
    lines.push_back(row);
  }
  if (s.format == "json") return skipped.size() == s.schemes.size() ? 1 : 0;
  return print_plan_table(
      rank,
      "| scheme | data | depth (Z) | mesh_row (row, Y) | mesh_col (col, X) | tensor (1D) | "
      "params | grads | activations | total | largest batch |\n"
      "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n",
      lines, skipped, s.schemes.size());
}

// --pass inference (docs/inference.md): per scheme, the forward-only
// throughput of the whole [batch, seq] window (Optimus's inference: batch /
// forward time), then decoding with the key/value cache: the first seq/2
// positions of every sequence as the prompt (prefill, one position a step),
// the rest one greedy token a step (decode); medians of --reps after
// --warmup; memory per rank planned for training, for the forward-only
// model and for the decoder (the largest over ranks).
template <class T>
int run_inference(const Settings& s, summa::Backend& backend, int rank, int ranks) {
  std::FILE* text = s.format == "json" ? stderr : stdout;
  const Batch data = make_batch(s, s.batch);
  const index_t prompt = std::max<index_t>(1, s.seq / 2);
  const auto mib = [](double bytes) { return bytes / (1024.0 * 1024.0); };
  const auto planned = [&](const summa::SchemeSpec& spec, index_t seq, summa::GptOptions o) {
    u64 t = summa::plan_memory<T>(MPI_COMM_WORLD, spec, backend, s.config, s.batch, seq, o, s.grid)
                .total();
    return static_cast<double>(max_over_ranks(t));
  };
  if (rank == 0 && s.format != "json")
    std::fprintf(text,
                 "# inference: batch %lld, seq %lld (prompt %lld, then %lld decoded), %d ranks, "
                 "%s\n%-22s %10s %12s %12s %12s %10s %10s %10s\n",
                 static_cast<long long>(s.batch), static_cast<long long>(s.seq),
                 static_cast<long long>(prompt), static_cast<long long>(s.seq - prompt), ranks,
                 s.dtype.c_str(), "scheme", "fwd_s", "infer_seq/s", "prefill_t/s", "decode_t/s",
                 "train_MiB", "fwd_MiB", "dec_MiB");
  for (const summa::SchemeSpec& spec : s.schemes) {
    Json j{{"pass", "inference"}, {"scheme", spec.str()}, {"ranks", ranks}, {"dtype", s.dtype}};
    j.update(summa::bench::model_shape_fields(s.config, s.seq, s.batch));
    try {
      const double train_bytes = planned(spec, s.seq, {.recompute = s.recompute});
      summa::ParallelGpt<T> fwd(MPI_COMM_WORLD, spec, backend, s.config, s.batch, s.seq,
                                {.inference = true}, s.grid);
      fwd.model().init(s.seed);
      std::vector<double> forward;
      for (int k = 0; k < s.warmup + s.reps; ++k) {
        const double t = time_collective([&] {
          fwd.model().forward_logits(data.tokens);
          backend.synchronize();
        });
        if (k >= s.warmup) forward.push_back(t);
      }
      const double fwd_bytes =
          static_cast<double>(max_over_ranks(fwd.model().memory_report().total()));
      summa::ParallelGpt<T> dec(MPI_COMM_WORLD, spec, backend, s.config, s.batch, 1,
                                {.inference = true, .kv_cache = s.seq}, s.grid);
      dec.model().init(s.seed);
      const double dec_bytes =
          static_cast<double>(max_over_ranks(dec.model().memory_report().total()));
      std::vector<std::int32_t> step(static_cast<std::size_t>(s.batch));
      const std::vector<index_t> positions(static_cast<std::size_t>(s.batch), 0);
      std::vector<double> prefill, decode;
      for (int k = 0; k < s.warmup + s.reps; ++k) {
        double p = 0, d = 0;
        for (index_t t = 0; t < s.seq; ++t) {
          const double dt = time_collective([&] {
            for (index_t b = 0; b < s.batch; ++b)
              if (t < prompt)
                step[static_cast<std::size_t>(b)] =
                    data.tokens[static_cast<std::size_t>(b * s.seq + t)];
            dec.model().forward_cached(step, t);
            if (t >= prompt - 1) {
              const auto ids = dec.model().next_tokens(positions, {.greedy = true}, 0);
              std::copy(ids.begin(), ids.end(), step.begin());
            }
            backend.synchronize();
          });
          (t < prompt - 1 ? p : d) += dt;
        }
        if (k >= s.warmup) {
          prefill.push_back(p);
          decode.push_back(d);
        }
      }
      const double f = median(forward), p = median(prefill), d = median(decode);
      const double prefill_tokens = static_cast<double>(s.batch * std::max<index_t>(prompt - 1, 1)),
                   decode_tokens = static_cast<double>(s.batch * (s.seq - prompt + 1));
      j["forward_s"] = f;
      j["inference_sequences_per_s"] = static_cast<double>(s.batch) / f;
      j["prefill_tokens_per_s"] = prefill_tokens / p;
      j["decode_tokens_per_s"] = decode_tokens / d;
      j["memory_train_mib"] = mib(train_bytes);
      j["memory_forward_mib"] = mib(fwd_bytes);
      j["memory_decoder_mib"] = mib(dec_bytes);
      if (rank == 0 && s.format != "json")
        std::fprintf(text, "%-22s %10.4f %12.1f %12.1f %12.1f %10.2f %10.2f %10.2f\n",
                     spec.str().c_str(), f, static_cast<double>(s.batch) / f, prefill_tokens / p,
                     decode_tokens / d, mib(train_bytes), mib(fwd_bytes), mib(dec_bytes));
    } catch (const summa::CollectiveError& e) {  // the scheme refuses the model, on every rank
      j["skipped"] = e.what();
      if (rank == 0 && s.format != "json")
        std::fprintf(text, "%-22s skipped: %s\n", spec.str().c_str(), e.what());
    }
    if (rank == 0 && s.format != "table")
      std::fprintf(stdout, "%s%s\n", s.format == "both" ? "json: " : "", j.dump().c_str());
    std::fflush(stdout);
  }
  return 0;
}

std::vector<summa::SchemeSpec> parse_schemes(const std::string& list, int ranks) {
  if (list.empty() || list == "auto") return summa::schemes_for(ranks);
  std::vector<summa::SchemeSpec> out;
  std::string_view rest = list;
  while (!rest.empty()) {
    const std::size_t semi = rest.find(';');
    const std::string_view item = rest.substr(0, semi);
    rest = semi == std::string_view::npos ? std::string_view() : rest.substr(semi + 1);
    if (item.empty()) continue;
    const summa::SchemeSpec spec = summa::SchemeSpec::parse(item);  // summa::Error when bad
    if (spec.ranks() != ranks)
      throw UsageError("--schemes: '" + spec.str() + "' needs " + std::to_string(spec.ranks()) +
                       " ranks, running on " + std::to_string(ranks));
    out.push_back(spec);
  }
  if (out.empty()) throw UsageError("--schemes: no scheme given");
  return out;
}

int run(int argc, char** argv, int rank, int ranks) {
  CLI::App app{
      "compare_schemes: one GPT configuration under every tensor-parallel scheme that fits the\n"
      "world size (or --schemes): step time, bytes per rank and axis vs the closed form, memory\n"
      "per rank, and the largest batch within --budget-mib (planned, then confirmed by a real\n"
      "step). Exits 1 when a measured byte count differs from an existing prediction, a largest\n"
      "batch is not confirmed, or a loss is not finite."};
  Settings s;
  int layers = 2, hidden = 192, heads = 24, vocab = 1536, positions = 0;
  long long batch = 24, seq = 32, max_batch = 4096;
  std::string recompute = "full", schemes;
  app.add_option("--layers", layers, "Transformer blocks")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--hidden", hidden, "Hidden size h")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--heads", heads, "Attention heads")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--seq", seq, "Tokens per sequence")
      ->check(CLI::Range(1LL, 1LL << 24))
      ->capture_default_str();
  app.add_option("--batch", batch, "Global batch (sequences) of the timed steps")
      ->check(CLI::Range(1LL, 1LL << 24))
      ->capture_default_str();
  app.add_option("--vocab", vocab, "Vocabulary size")
      ->check(CLI::Range(1, 1 << 26))
      ->capture_default_str();
  app.add_option("--positions", positions, "Position table size (default: --seq)")
      ->check(CLI::Range(1, 1 << 24));
  app.add_option("--dtype", s.dtype,
                 "Element type (bf16: bf16 parameters and activations, fp32 statistics)")
      ->check(CLI::IsMember({"f32", "f64", "bf16"}))
      ->capture_default_str();
  app.add_option("--reps", s.reps, "Timed steps per scheme (median reported)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--warmup", s.warmup, "Untimed steps before the measured one")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  app.add_option("--recompute", recompute,
                 "What backward recomputes: full (per-block activation checkpoints), selective "
                 "(attention's probabilities only) or none")
      ->check(CLI::IsMember({"none", "full", "selective"}))
      ->capture_default_str();
  app.add_option("--budget-mib", s.budget_mib, "Memory budget per rank for the largest batch")
      ->check(summa::flags::real_in(1e-3, 1e9))
      ->capture_default_str();
  app.add_option("--max-batch", max_batch, "Largest global batch the search considers")
      ->check(CLI::Range(1LL, 1LL << 24))
      ->capture_default_str();
  app.add_option("--schemes", schemes,
                 "Schemes separated by ';' (e.g. \"2d:q=2;1d:p=4;data=2,3d:1x1x2\"), or auto: "
                 "the --top fastest by the step-time model (needs --predict) within "
                 "--budget-mib; default: every scheme for the world size");
  app.add_option("--top", s.top, "With --schemes auto: how many of the best to run")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--format", s.format,
                 "both: progress, table and 'json: '-prefixed JSON lines on stdout; json: only "
                 "bare JSON lines on stdout (the rest on stderr); table: no JSON")
      ->check(CLI::IsMember({"both", "json", "table"}))
      ->capture_default_str();
  app.add_option("--seed", s.seed, "Seed of weights and tokens")
      ->check(summa::flags::integer_in(0, 18446744073709551615.0L))  // (was: -1 wrapped)
      ->capture_default_str();
  app.add_option("--pass", s.pass,
                 "train: the training step (default); inference: forward-only throughput, "
                 "prefill and decode with the key/value cache, memory against training; plan: "
                 "no step, only the deterministic figures (bytes per axis, memory, largest batch) "
                 "from the traffic model and the planner; plan-inference: the memory of "
                 "--pass inference, planned")
      ->check(CLI::IsMember({"train", "inference", "plan", "plan-inference"}))
      ->capture_default_str();
  int ranks_per_device = 0;
  app.add_flag("--breakdown", s.breakdown,
               "Time the step's parts (embedding, blocks, ln_f, lm_head forward; lm_head, ln_f, "
               "blocks recompute and backward, embedding, data-axis wait; then each block op per "
               "phase, nested in blocks) and print them, beside the prediction with --predict");
  app.add_option("--predict", s.machine_path,
                 "Machine file (machines/*.json): the step-time model's prediction beside each "
                 "measured step (docs/scaling.md)");
  app.add_option("--ranks-per-device", ranks_per_device,
                 "With --predict: ranks sharing one core (cpu) or GPU; 0: ranks on this node / "
                 "cores (cpu), ranks on this rank's GPU (cuda)")
      ->check(CLI::Range(0, 1 << 16))
      ->capture_default_str();
  summa::bench::add_device_options(app, s.backend, s.comm, s.tf32,
                                   "; --budget-mib is then device memory per rank",
                                   "cuda: TF32 tensor cores in f32 GEMMs");
  app.add_option("--timeline", s.timeline,
                 "Write each pipelined scheme's timed step to this file, one JSON line per "
                 "operation of every rank: scheme, rank, stage, forward or backward, "
                 "microbatch, start and end in seconds since the step began "
                 "(scripts/plot_pipeline.py draws it)");
  app.add_option("--watchdog", s.watchdog,
                 "seconds a collective may wait before the job is ended with a report naming "
                 "the ranks that did not arrive (0: off)")
      ->check(summa::flags::watchdog_seconds())
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return summa::flags::parse_exit(app, e, "compare_schemes");
  }
  s.config.n_layer = layers;
  s.config.n_embd = hidden;
  s.config.n_head = heads;
  s.config.vocab_size = vocab;
  s.config.n_positions = positions > 0 ? positions : static_cast<int>(seq);
  s.batch = batch;
  s.seq = seq;
  s.max_batch = max_batch;
  s.recompute = summa::parse_recompute(recompute, "--recompute");
  if (s.seq > s.config.n_positions)
    throw UsageError("--seq=" + std::to_string(s.seq) +
                     " exceeds --positions=" + std::to_string(s.config.n_positions));
  s.config.validate();  // summa::Error
  s.schemes = parse_schemes(schemes, ranks);
  s.auto_schemes = schemes == "auto";
  if (!s.timeline.empty() && s.pass != "train")
    throw UsageError("--timeline records a training step: not with --pass " + s.pass);
  if (s.auto_schemes && s.machine_path.empty())
    throw UsageError("--schemes auto needs --predict MACHINE (the step-time model ranks them)");
  if (!s.machine_path.empty()) {
    s.machine = summa::io::load_machine(s.machine_path);  // summa::Error, alike on every rank
  }
  // The backend before any grid: the communicators order their work with its
  // stream. Its agreement (the CPU GEMM library) waits under --watchdog too.
  summa::WatchdogOptions setup_limit;
  setup_limit.timeout_s = s.watchdog;
  const summa::Watchdog setup_watchdog(MPI_COMM_WORLD, setup_limit);
  summa::bench::BenchBackend chosen = summa::bench::make_backend<UsageError>(
      s.backend, s.comm, s.tf32, app.count("--comm") > 0, "compare_schemes");
  s.grid = chosen.grid;
  s.grid.watchdog.timeout_s = s.watchdog;
  s.device = chosen.device;
  summa::Backend& backend = *chosen.backend;
  if (s.machine)  // the sharing of the device the backend runs on
    s.ranks_per_device =
        ranks_per_device > 0 ? ranks_per_device : summa::ranks_per_device(MPI_COMM_WORLD, backend);
  if (s.pass == "plan" || s.pass == "plan-inference") {
    if (s.dtype == "bf16") return run_plan<summa::bf16>(s, backend, rank, ranks);
    return s.dtype == "f32" ? run_plan<float>(s, backend, rank, ranks)
                            : run_plan<double>(s, backend, rank, ranks);
  }
  if (s.pass == "inference") {
    if (s.dtype == "bf16") return run_inference<summa::bf16>(s, backend, rank, ranks);
    return s.dtype == "f32" ? run_inference<float>(s, backend, rank, ranks)
                            : run_inference<double>(s, backend, rank, ranks);
  }
  if (s.dtype == "bf16") return run_all<summa::bf16>(s, backend, rank, ranks);
  return s.dtype == "f32" ? run_all<float>(s, backend, rank, ranks)
                          : run_all<double>(s, backend, rank, ranks);
}

}  // namespace

int main(int argc, char** argv) {
  // One thread per rank (Eigen is built without OpenMP; these cover any BLAS).
  setenv("BLIS_NUM_THREADS", "1", 1);
  setenv("OMP_NUM_THREADS", "1", 1);
  setenv("OPENBLAS_NUM_THREADS", "1", 1);
  summa::init_mpi(&argc, &argv, 0);  // MPI_Init under --watchdog's limit (default off)
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  int status = 0;
  try {
    status = run(argc, argv, rank, ranks);
  } catch (const UsageError& e) {  // the same on every rank
    summa::flags::print_once("compare_schemes", e);
    status = 2;
  } catch (const summa::Error& e) {  // summa reports errors on every rank alike
    summa::flags::print_once("compare_schemes", e);
    status = 2;
  } catch (const std::exception& e) {  // possibly on this rank only: do not hang
    std::fprintf(stderr, "compare_schemes (rank %d): %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  summa::finalize_mpi();
  return status;
}

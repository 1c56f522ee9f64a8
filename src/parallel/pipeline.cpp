#include "summa/parallel/pipeline.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <string>

#include "../grid/device_communicators.hpp"
#include "summa/comm/consensus.hpp"

namespace summa {

std::vector<int> pipeline_split(const GptConfig& config, const PipelineOptions& o,
                                Recompute recompute) {
  require(o.stages >= 1 && o.micro >= 1 && o.limit >= 0, [&] {
    return fmt::format(
        "pipeline: stages={}, micro={} and limit={} must be positive (limit 0: the stages)",
        o.stages, o.micro, o.limit);
  });
  const int stages = o.stages, n = config.n_layer;
  if (!o.split.empty()) {
    const bool positive = std::all_of(o.split.begin(), o.split.end(), [](int b) { return b >= 1; });
    const long long sum = std::accumulate(o.split.begin(), o.split.end(), 0LL);
    require(static_cast<int>(o.split.size()) == stages && positive && sum == n, [&] {
      return fmt::format(
          "pipeline: split {} must give each of the {} stages at least one block and add up to "
          "n_layer={}",
          fmt::join(o.split, "+"), stages, n);
    });
    return o.split;
  }
  require(n >= stages, [&] {
    return fmt::format("pipeline: {} stages need at least one block each; the model has n_layer={}",
                       stages, n);
  });
  // By block count: n_layer spread as evenly as it divides, the remainder
  // to the middle stages first (the first stage also embeds, the last also
  // runs LN_f, the LM head and the loss).
  std::vector<int> split(static_cast<std::size_t>(stages), n / stages);
  int extra = n % stages;
  std::vector<int> order;
  for (int s = 1; s + 1 < stages; ++s) order.push_back(s);
  order.push_back(0);
  if (stages > 1) order.push_back(stages - 1);
  for (const int s : order)
    if (extra > 0) {
      ++split[static_cast<std::size_t>(s)];
      --extra;
    }
  // By cost: the least cost any contiguous split's costliest stage can
  // have (dynamic programming over the blocks), taken where the count's
  // split exceeds it.
  const PipelineCosts c = pipeline_costs(config, recompute);
  if (stages == 1 || c.block <= 0) return split;
  const auto fixed = [&](int stage) {
    return (stage == 0 ? c.embedding : 0) + (stage == stages - 1 ? c.head : 0);
  };
  const auto S = static_cast<std::size_t>(stages), N = static_cast<std::size_t>(n);
  // best[s][i]: the least costliest stage of stages 0..s holding blocks [0, i)
  std::vector<std::vector<double>> best(S, std::vector<double>(N + 1, 0));
  for (std::size_t i = 1; i <= N; ++i) best[0][i] = static_cast<double>(i) * c.block + fixed(0);
  for (std::size_t s = 1; s < S; ++s)
    for (std::size_t i = s + 1; i <= N; ++i) {
      double v = std::numeric_limits<double>::infinity();
      for (std::size_t j = s; j < i; ++j)
        v = std::min(v, std::max(best[s - 1][j], static_cast<double>(i - j) * c.block +
                                                     fixed(static_cast<int>(s))));
      best[s][i] = v;
    }
  const double optimum = best[S - 1][N] * (1 + 1e-12);
  double count_worst = 0;
  for (int s = 0; s < stages; ++s)
    count_worst = std::max(count_worst, split[static_cast<std::size_t>(s)] * c.block + fixed(s));
  if (count_worst <= optimum) return split;
  // Each stage's most blocks within the optimum; the blocks then spread as
  // evenly as those caps allow (every stage up to a level, the rest one
  // each to the stages that take one more, the middle stages first).
  std::vector<int> cap(S);
  for (int s = 0; s < stages; ++s)
    cap[static_cast<std::size_t>(s)] =
        std::max(1, static_cast<int>(std::floor((optimum - fixed(s)) / c.block + 1e-9)));
  int level = 1;
  const auto held = [&](int l) {
    int sum = 0;
    for (const int k : cap) sum += std::min(k, l);
    return sum;
  };
  while (held(level) < n) ++level;
  for (int s = 0; s < stages; ++s)
    split[static_cast<std::size_t>(s)] = std::min(cap[static_cast<std::size_t>(s)], level - 1);
  int rest = n - std::accumulate(split.begin(), split.end(), 0);
  for (const int s : order)
    if (rest > 0 && cap[static_cast<std::size_t>(s)] >= level) {
      ++split[static_cast<std::size_t>(s)];
      --rest;
    }
  return split;
}

PipelineCosts pipeline_costs(const GptConfig& config, Recompute recompute) {
  const double h = config.n_embd, sq = config.n_positions, v = config.vocab_size;
  // per token: a block's forward 24 h^2 + 4 s h and its backward at twice,
  // plus what the recompute mode runs again; the embedding's lookup and
  // position add and its backward's scatter-add; LN_f and the head's
  // logits h V forward, twice that backward, and the loss over V
  const double forward = 24 * h * h + 4 * sq * h;
  double again = 0;
  switch (recompute) {
    case Recompute::full:
      again = forward;
      break;
    case Recompute::selective:
      again = 2 * sq * h;  // S = QK^T
      break;
    case Recompute::none:
      break;
  }
  return {.embedding = 3 * 2 * h,
          .block = 3 * forward + again,
          .head = 6 * h * v + 3 * 10 * h + 3 * 5 * v};
}

std::vector<PipeOp> pipeline_order(PipeSchedule schedule, int stage, int stages, int micro) {
  require(stage >= 0 && stage < stages && micro >= 1, [&] {
    return fmt::format("pipeline_order: stage {} of {} with {} microbatches", stage, stages, micro);
  });
  std::vector<PipeOp> ops;
  switch (schedule) {
    case PipeSchedule::gpipe:
      for (int m = 0; m < micro; ++m) ops.push_back({true, m});
      for (int m = 0; m < micro; ++m) ops.push_back({false, m});
      break;
    case PipeSchedule::one_f_one_b: {
      const int warm = std::min(stages - 1 - stage, micro);
      for (int m = 0; m < warm; ++m) ops.push_back({true, m});
      for (int i = 0; i < micro - warm; ++i) {
        ops.push_back({true, warm + i});
        ops.push_back({false, i});
      }
      for (int m = micro - warm; m < micro; ++m) ops.push_back({false, m});
      break;
    }
    case PipeSchedule::axonn:
      throw Error(
          "pipeline_order: the axonn schedule has no static order (it follows the messages)");
  }
  return ops;
}

int pipeline_slots(const PipelineOptions& o, int stage) {
  switch (o.schedule) {
    case PipeSchedule::gpipe:
      return o.micro;
    case PipeSchedule::one_f_one_b:
      return std::min(o.micro, o.stages - stage);
    case PipeSchedule::axonn:
      return std::min(o.micro, o.limit > 0 ? o.limit : o.stages);
  }
  return o.micro;
}

PipeStaging pipe_staging(std::size_t message_bytes, std::size_t exchange_bytes, int slots) {
  require(slots >= 1, [&] { return fmt::format("pipe_staging: slots={} (>= 1)", slots); });
  constexpr std::size_t align = 256;
  const auto piece = [](std::size_t bytes) { return (bytes + align - 1) / align * align + align; };
  const int messages = slots + 3;  // the forward sends, the input gradient's, two receives
  const std::size_t step = static_cast<std::size_t>(messages) * piece(message_bytes);
  const std::size_t flush = 2 * piece(exchange_bytes);
  const std::size_t scalars = 2 * piece(2 * sizeof(double));
  return {.bytes = std::max({step, flush, scalars}), .requests = std::max(messages, 2)};
}

PipelineStage pipeline_stage(const SchemeSpec& spec, const GptConfig& config, index_t batch,
                             index_t seq, int stage, Recompute recompute) {
  const PipelineSpec& p = spec.pipeline;
  const std::vector<int> split = pipeline_split(config, p, recompute);
  require(batch > 0 && batch % p.micro == 0, [&] {
    return fmt::format("pipeline: batch={} does not divide into micro={} microbatches", batch,
                       p.micro);
  });
  require(stage >= 0 && stage < p.stages,
          [&] { return fmt::format("pipeline: stage {} of {}", stage, p.stages); });
  const int first = std::accumulate(split.begin(), split.begin() + stage, 0);
  return {.stage = stage,
          .stages = p.stages,
          .first_block = first,
          .last_block = first + split[static_cast<std::size_t>(stage)],
          .slots = pipeline_slots(p, stage),
          .loss_tokens = batch * seq};
}

template <class T>
MemoryReport PipelineGpt<T>::memory_report() const {
  return model().memory_report();
}

template <class T>
PipelineGpt<T>::PipelineGpt(MPI_Comm comm, const SchemeSpec& spec, Backend& backend,
                            const GptConfig& config, index_t batch, index_t seq, GptOptions options,
                            GridOptions grid)
    : options_(spec.pipeline), batch_(batch), seq_(seq) {
  const PipelineOptions& pipeline = spec.pipeline;
  int size = 0, rank = 0;
  check_mpi(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  std::optional<std::string> error;
  try {
    (void)pipeline_stage(spec, config, batch, seq, 0, options.recompute);  // the split, the batch
  } catch (const Error& e) {
    error = e.what();
  }
  const SchemeSpec stage_spec = spec.stage();
  const std::int64_t per_stage = stage_spec.ranks();
  if (!error && per_stage * pipeline.stages != size)
    error = fmt::format(
        "pipeline: {} stages of scheme '{}' ({} ranks each) need {} ranks, the communicator has {}",
        pipeline.stages, stage_spec.str(), per_stage, per_stage * pipeline.stages, size);
  else if (!error && grid.comm != CommBackend::mpi && !options.plan_only)
    error = detail::load_cuda_component("a pipeline's stage messages in device memory");
  agree_on(comm, error);
  if (options_.limit == 0) options_.limit = options_.stages;
  stage_ = rank / static_cast<int>(per_stage);
  micro_batch_ = batch / pipeline.micro;
  MPI_Comm stage_comm = MPI_COMM_NULL, pipe_comm = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(comm, stage_, rank, &stage_comm), "MPI_Comm_split (pipeline stage)");
  check_mpi(MPI_Comm_split(comm, rank % static_cast<int>(per_stage), stage_, &pipe_comm),
            "MPI_Comm_split (pipe)");
  options.pipeline = pipeline_stage(spec, config, batch, seq, stage_, options.recompute);
  // A stage's refusal reaches every stage (the others would wait for its
  // messages).
  std::optional<std::string> stage_error;
  try {
    run_ = std::make_unique<ParallelGpt<T>>(stage_comm, stage_spec, backend, config, micro_batch_,
                                            seq, options, grid);
  } catch (const Error& e) {
    stage_error = e.what();
  }
  MPI_Comm_free(&stage_comm);
  try {
    agree_on(comm, stage_error);
  } catch (...) {
    MPI_Comm_free(&pipe_comm);
    throw;
  }
  // the pipe communicator owned first, so that nothing leaks if what
  // follows throws (it is destroyed before the watchdog, declared first)
  pipe_native_ = pipe_comm;
  if (grid.comm == CommBackend::mpi || options.plan_only) {
    pipe_ = std::make_unique<MpiCommunicator>(pipe_comm, true, CommAxis::pipe, &pipe_counter_);
  } else {  // device memory: MPI on pinned host copies, sized for the stage's messages
    const PipeStaging staging =
        pipe_staging(static_cast<std::size_t>(model().stage_message_elements()) * sizeof(T),
                     model().stage_exchange_elements() * sizeof(T), options.pipeline.slots);
    GridOptions o = grid;
    o.comm = CommBackend::mpi_staged;
    o.staging_bytes = staging.bytes;
    o.staging_requests = staging.requests;
    // collective over the pipe communicator (its pinned allocations agreed
    // there), then agreed over every stage: a pipe group that failed would
    // leave the others waiting in what follows
    std::optional<std::string> pipe_error;
    try {
      pipe_ = detail::device_communicators()(pipe_comm, CommAxis::pipe, &pipe_counter_, o);
    } catch (const Error& e) {
      pipe_error = e.what();
    }
    agree_on(comm, pipe_error);
  }
  grid_checks_calls_ = grid.check_calls;
  watchdog_ = std::make_unique<Watchdog>(comm, grid.watchdog);
  check_mpi(MPI_Comm_dup(comm, &world_), "MPI_Comm_dup (pipeline)");
  if (options_.schedule != PipeSchedule::axonn)
    order_ = pipeline_order(options_.schedule, stage_, options_.stages, options_.micro);
  trace_.reserve(static_cast<std::size_t>(2 * options_.micro));
  timings_.reserve(static_cast<std::size_t>(2 * options_.micro));
  if (!options.plan_only) {
    embedding_grads_ = model().stage_embedding_grads();
    exchange_ = model().stage_exchange();
  }
  watchdog_->attach(*pipe_, pipe_comm);
}

template <class T>
PipelineGpt<T>::~PipelineGpt() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && world_ != MPI_COMM_NULL) MPI_Comm_free(&world_);
}

template <class T>
void PipelineGpt<T>::init(std::uint64_t seed) {
  model().init(seed);
}

template <class T>
std::span<const std::int32_t> PipelineGpt<T>::micro_ids(std::span<const std::int32_t> ids,
                                                        int m) const {
  const auto n = static_cast<std::size_t>(micro_batch_ * seq_);
  return ids.subspan(static_cast<std::size_t>(m) * n, n);
}

template <class T>
double PipelineGpt<T>::since_start() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
}

template <class T>
void PipelineGpt<T>::forward_micro(int m, int slot) {
  Gpt<T>& g = model();
  slot_of_[static_cast<std::size_t>(m)] = slot;
  trace_.push_back({true, m});
  timings_.push_back({since_start(), 0});
  peak_in_flight_ = std::max(peak_in_flight_, ++in_flight_);
  loss_ += g.stage_forward(slot, micro_ids(tokens_, m), micro_ids(targets_, m));
  timings_.back().end_s = since_start();
  ++next_forward_;
  if (g.options().pipeline.last()) return;
  const ConstMatrixView<T> out = g.stage_output(slot);
  forward_sends_[static_cast<std::size_t>(slot)] =
      pipe_->isend(out.data, static_cast<std::size_t>(out.rows * out.cols), dtype_v<T>, stage_ + 1);
}

template <class T>
void PipelineGpt<T>::backward_micro(int m) {
  Gpt<T>& g = model();
  const int slot = slot_of_[static_cast<std::size_t>(m)];
  // The slot's output has left, and the previous input gradient too (the
  // backward below overwrites its buffer).
  pipe_->wait(forward_sends_[static_cast<std::size_t>(slot)]);
  pipe_->wait(input_grad_send_);
  trace_.push_back({false, m});
  timings_.push_back({since_start(), 0});
  g.stage_backward(slot, m == options_.micro - 1);
  timings_.back().end_s = since_start();
  ++next_backward_;
  if (!g.options().pipeline.first()) {
    const ConstMatrixView<T> dx = g.stage_input_grad();
    input_grad_send_ =
        pipe_->isend(dx.data, static_cast<std::size_t>(dx.rows * dx.cols), dtype_v<T>, stage_ - 1);
  }
  free_slots_.push_back(slot);
  --in_flight_;
}

// Keeps a receive posted from each neighbour while one is due: the next
// microbatch's input into a free slot, the next gradient into its
// microbatch's slot once its forward has run here.
template <class T>
void PipelineGpt<T>::post_receives() {
  Gpt<T>& g = model();
  const PipelineStage& ps = g.options().pipeline;
  if (!ps.first() && !forward_recv_.active() && next_recv_forward_ < options_.micro &&
      !free_slots_.empty()) {
    forward_recv_slot_ = free_slots_.back();
    free_slots_.pop_back();
    forward_recv_micro_ = next_recv_forward_++;
    const MatrixView<T> in = g.stage_input(forward_recv_slot_);
    forward_recv_ =
        pipe_->irecv(in.data, static_cast<std::size_t>(in.rows * in.cols), dtype_v<T>, stage_ - 1);
  }
  if (!ps.last() && !backward_recv_.active() && next_recv_backward_ < next_forward_) {
    backward_recv_micro_ = next_recv_backward_++;
    const MatrixView<T> dy =
        g.stage_output_grad(slot_of_[static_cast<std::size_t>(backward_recv_micro_)]);
    backward_recv_ =
        pipe_->irecv(dy.data, static_cast<std::size_t>(dy.rows * dy.cols), dtype_v<T>, stage_ + 1);
  }
}

template <class T>
void PipelineGpt<T>::run_static() {
  const PipelineStage& ps = model().options().pipeline;
  for (const PipeOp& op : order_) {
    post_receives();
    if (op.forward) {
      int slot = 0;
      if (ps.first()) {
        require(!free_slots_.empty(), "pipeline: no free activation slot (a schedule bug)");
        slot = free_slots_.back();
        free_slots_.pop_back();
      } else {
        require(forward_recv_micro_ == op.micro, "pipeline: the input posted is not the next");
        pipe_->wait(forward_recv_);
        slot = forward_recv_slot_;
      }
      forward_micro(op.micro, slot);
    } else {
      if (!ps.last()) {
        post_receives();
        require(backward_recv_micro_ == op.micro, "pipeline: the gradient posted is not the next");
        pipe_->wait(backward_recv_);
      }
      backward_micro(op.micro);
    }
  }
}

template <class T>
void PipelineGpt<T>::run_message_driven() {
  const PipelineStage& ps = model().options().pipeline;
  while (next_backward_ < options_.micro) {
    if (ps.first() && next_forward_ < options_.micro && in_flight_ < options_.limit &&
        !free_slots_.empty()) {  // inject a microbatch
      const int slot = free_slots_.back();
      free_slots_.pop_back();
      const int m = next_forward_;
      forward_micro(m, slot);
      if (ps.last()) backward_micro(m);
      continue;
    }
    post_receives();
    const bool forward_due = forward_recv_.active(), backward_due = backward_recv_.active();
    require(forward_due || backward_due, "pipeline: no message due (a schedule bug)");
    // Whichever message arrives first: as the stage's tensor group's first
    // rank sees it (each rank has its own pipe communicator and its own
    // arrival times; the group's collectives need one choice), broadcast to
    // the group, whose other ranks then wait for that message, which their
    // neighbours' same choices send.
    bool forward = forward_due;
    if (forward_due && backward_due) {
      Communicator& tensor = grid().tensor();
      int choice = 1;  // 1: the forward, 0: the backward
      // (under the watchdog, answering its probes: a stage that waits for
      // either neighbour is not taken for the stalled one)
      if (tensor.rank() == 0) choice = pipe_->wait_any(forward_recv_, backward_recv_) == 0 ? 1 : 0;
      if (tensor.size() > 1) {
        const MPI_Comm group = grid().native(CommAxis::tensor);
        MPI_Request r = MPI_REQUEST_NULL;
        check_mpi(MPI_Ibcast(&choice, 1, MPI_INT, 0, group, &r), "MPI_Ibcast (pipeline schedule)");
        watchdog_->wait(r, group, "the pipeline schedule's choice of message", sizeof(int));
      }
      forward = choice == 1;
      if (tensor.rank() != 0) pipe_->wait(forward ? forward_recv_ : backward_recv_);
    } else {
      pipe_->wait(forward_due ? forward_recv_ : backward_recv_);
    }
    if (forward) {
      const int m = forward_recv_micro_;
      forward_micro(m, forward_recv_slot_);
      if (ps.last()) backward_micro(m);
    } else {
      backward_micro(backward_recv_micro_);
    }
  }
}

template <class T>
void PipelineGpt<T>::exchange_embedding_grads() {
  const std::span<T> mine = embedding_grads_, theirs = exchange_;
  if (mine.empty()) return;
  const std::size_t n = mine.size();
  const int peer = stage_ == 0 ? options_.stages - 1 : 0;
  // The first stage receives first and the last sends first: on a pipe that
  // issues each call on its own (NCCL, Communicator::isend) two sends to
  // each other before either receive would wait for each other.
  Request sent, got;
  if (stage_ == 0) got = pipe_->irecv(theirs.data(), n, dtype_v<T>, peer);
  sent = pipe_->isend(mine.data(), n, dtype_v<T>, peer);
  if (stage_ != 0) got = pipe_->irecv(theirs.data(), n, dtype_v<T>, peer);
  pipe_->wait(got);
  pipe_->wait(sent);
  const auto shape = [&](T* p) {
    return MatrixView<T>::dense(p, 1, static_cast<index_t>(n), Order::row_major);
  };
  run_->scheme().backend().axpby(acc_t<T>(1), ConstMatrixView<T>(shape(theirs.data())), acc_t<T>(1),
                                 shape(mine.data()));
}

template <class T>
void PipelineGpt<T>::check_ids(std::span<const std::int32_t> tokens,
                               std::span<const std::int32_t> targets) const {
  const GptConfig& c = model().config();
  {
    // Every stage checks every id: a stage that refused alone would leave
    // the others waiting for its messages.
    std::optional<std::string> error;
    const auto expected = static_cast<std::size_t>(batch_ * seq_);
    for (const auto& [what, ids] : {std::pair{"token", tokens}, std::pair{"target", targets}}) {
      if (ids.size() != expected) {
        error = fmt::format("pipeline: {} ids has {} values, expected batch*seq = {}*{} = {}", what,
                            ids.size(), batch_, seq_, expected);
        break;
      }
      const auto bad = std::find_if(ids.begin(), ids.end(),
                                    [&](std::int32_t id) { return id < 0 || id >= c.vocab_size; });
      if (bad != ids.end()) {
        error = fmt::format("pipeline: {} id {} at position {} is outside [0, vocab={})", what,
                            *bad, bad - ids.begin(), c.vocab_size);
        break;
      }
    }
    // The same ids on every rank (as the Trainer passes them): the same
    // error everywhere, without a collective; agreed over every stage in the
    // debug mode (GridOptions::check_calls).
    if (grid_checks_calls_)
      agree_on(world_, error);
    else if (error)
      throw Error(*error);
  }
}

// The last stage's sum over the microbatches, over the data axis too, and
// then on every stage.
template <class T>
double PipelineGpt<T>::reduce_loss(double loss) {
  if (model().options().pipeline.last() && model().data_groups() > 1)
    grid().data().all_reduce(&loss, &loss, 1, DType::f64, ReduceOp::sum);
  if (options_.stages > 1) {
    pipe_->broadcast(&loss, 1, DType::f64, options_.stages - 1);
    // a stream-ordered pipe (device-memory grids) copies the result out on
    // the compute stream
    if (pipe_->stream_ordered()) run_->scheme().backend().synchronize();
  }
  return loss;
}

template <class T>
double PipelineGpt<T>::evaluate(std::span<const std::int32_t> tokens,
                                std::span<const std::int32_t> targets) {
  check_ids(tokens, targets);
  Gpt<T>& g = model();
  const PipelineStage& ps = g.options().pipeline;
  double loss = 0;
  for (int m = 0; m < options_.micro; ++m) {
    if (!ps.first()) {
      const MatrixView<T> in = g.stage_input(0);
      Request r = pipe_->irecv(in.data, static_cast<std::size_t>(in.rows * in.cols), dtype_v<T>,
                               stage_ - 1);
      pipe_->wait(r);
    }
    loss += g.stage_forward(0, micro_ids(tokens, m), micro_ids(targets, m), false);
    if (!ps.last()) {
      const ConstMatrixView<T> out = g.stage_output(0);
      Request r = pipe_->isend(out.data, static_cast<std::size_t>(out.rows * out.cols), dtype_v<T>,
                               stage_ + 1);
      pipe_->wait(r);
    }
  }
  return reduce_loss(loss);
}

template <class T>
double PipelineGpt<T>::step(std::span<const std::int32_t> tokens,
                            std::span<const std::int32_t> targets) {
  Gpt<T>& g = model();
  check_ids(tokens, targets);
  tokens_ = tokens;
  targets_ = targets;
  const int slots = g.options().pipeline.slots;
  free_slots_.clear();
  for (int s = slots; s-- > 0;) free_slots_.push_back(s);
  slot_of_.assign(static_cast<std::size_t>(options_.micro), -1);
  forward_sends_.assign(static_cast<std::size_t>(slots), Request{});
  next_forward_ = next_backward_ = next_recv_forward_ = next_recv_backward_ = 0;
  forward_recv_micro_ = backward_recv_micro_ = -1;
  trace_.clear();
  timings_.clear();
  started_ = std::chrono::steady_clock::now();
  in_flight_ = peak_in_flight_ = 0;
  loss_ = 0;
  g.parameters_store().zero_grads();
  if (options_.schedule == PipeSchedule::axonn)
    run_message_driven();
  else
    run_static();
  for (Request& r : forward_sends_) pipe_->wait(r);
  pipe_->wait(input_grad_send_);
  exchange_embedding_grads();
  return reduce_loss(loss_);
}

template class PipelineGpt<float>;
template class PipelineGpt<double>;
template class PipelineGpt<bf16>;

}  // namespace summa

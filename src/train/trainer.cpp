#include "summa/train/trainer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>
#include <utility>

#include "summa/io/hf_gpt2.hpp"

namespace summa {

namespace {

std::string config_text(const GptConfig& c) {
  return fmt::format("n_layer={} n_head={} n_embd={} n_positions={} vocab_size={} eps={}",
                     c.n_layer, c.n_head, c.n_embd, c.n_positions, c.vocab_size,
                     c.layer_norm_epsilon);
}

}  // namespace

bool is_run_id(std::string_view id) {
  return id.size() <= 64 && std::all_of(id.begin(), id.end(), [](char c) {
           return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '-' || c == '_';
         });
}

void TrainerOptions::validate() const {
  config.validate();
  (void)SchemeSpec::parse(scheme);
  require(batch > 0 && seq > 0,
          [&] { return fmt::format("trainer: batch={} and seq={} must be positive", batch, seq); });
  require(seq <= config.n_positions, [&] {
    return fmt::format("trainer: seq={} exceeds n_positions={}", seq, config.n_positions);
  });
  require(std::isfinite(clip) && clip >= 0,
          [&] { return fmt::format("trainer: clip={} must be finite and >= 0", clip); });
  require(val_fraction >= 0 && val_fraction < 1,
          [&] { return fmt::format("trainer: val_fraction={} must be in [0, 1)", val_fraction); });
  require(max_skipped_steps >= 0, [&] {
    return fmt::format("trainer: max_skipped_steps={} must be >= 0", max_skipped_steps);
  });
  require(is_run_id(run_id), [&] {
    return fmt::format("trainer: run_id '{}' must be at most 64 letters, digits, '-' or '_'",
                       run_id.substr(0, 80));
  });
  optimizer.validate();
  schedule.validate();
}

GptConfig config_from_meta(const std::map<std::string, std::string>& meta) {
  const auto get = [&](const char* key) -> const std::string& {
    const auto it = meta.find(key);
    require(it != meta.end(),
            [&] { return fmt::format("checkpoint metadata has no '{}' (not a Trainer's?)", key); });
    return it->second;
  };
  const auto integer = [&](const char* key) {
    const std::string& v = get(key);
    try {
      std::size_t used = 0;
      const int x = std::stoi(v, &used);
      if (used == v.size()) return x;
    } catch (const std::exception&) {
    }
    throw Error(fmt::format("checkpoint metadata '{}' = '{}' is not an integer", key, v));
  };
  GptConfig c;
  c.n_layer = integer("n_layer");
  c.n_head = integer("n_head");
  c.n_embd = integer("n_embd");
  c.n_positions = integer("n_positions");
  c.vocab_size = integer("vocab_size");
  const std::string& eps = get("layer_norm_epsilon");
  try {
    c.layer_norm_epsilon = std::stod(eps);
  } catch (const std::exception&) {
    throw Error(
        fmt::format("checkpoint metadata 'layer_norm_epsilon' = '{}' is not a number", eps));
  }
  c.validate();
  return c;
}

double model_flops_per_step(const GptConfig& c, index_t batch, index_t seq) {
  const double B = static_cast<double>(batch), s = static_cast<double>(seq),
               l = static_cast<double>(c.n_layer), h = static_cast<double>(c.n_embd),
               V = static_cast<double>(c.vocab_size);
  return 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
}

template <class T>
Trainer<T>::Trainer(MPI_Comm comm, const TrainerOptions& options, Backend& backend,
                    std::vector<std::uint16_t> tokens)
    : options_(options) {
  // Validate everywhere before any collective: the same options (and the
  // same error) on every rank.
  std::optional<std::string> error;
  try {
    options_.validate();
  } catch (const Error& e) {
    error = e.what();
  }
  agree_on(comm, error);
  // (validate() parsed the scheme; make_grid agrees on its rank count)
  const SchemeSpec spec = SchemeSpec::parse(options_.scheme);
  {
    std::optional<std::string> data_error;
    try {
      loader_ = std::make_unique<io::TokenLoader>(
          std::move(tokens), options_.config.vocab_size,
          io::LoaderOptions{.batch = options_.batch,
                            .seq = options_.seq,
                            .seed = options_.data_seed,
                            .val_fraction = options_.val_fraction});
    } catch (const Error& e) {
      data_error = e.what();
    }
    agree_on(comm, data_error);
  }
  if (spec.pipeline.active()) {
    pipeline_ =
        std::make_unique<PipelineGpt<T>>(comm, spec, backend, options_.config, options_.batch,
                                         options_.seq, options_.gpt, options_.grid);
    run_ = &pipeline_->stage_run();
  } else {
    own_run_ =
        std::make_unique<ParallelGpt<T>>(comm, spec, backend, options_.config, options_.batch,
                                         options_.seq, options_.gpt, options_.grid);
    run_ = own_run_.get();
  }
  run_->model().init(options_.init_seed);
  // A sharded data axis (zero=1, 2): this data group updates, and keeps the
  // optimizer state of, its chunk of the packed parameters (zero=2: the only
  // gradients backward reduced onto it); the chunks are all-gathered after
  // each step.
  ParameterStore<T>& store = run_->model().parameters_store();
  optimizer_ = make_optimizer(
      options_.optimizer, store,
      spec.zero > 0 ? data_chunk(store, run_->grid().data().rank(), spec.data) : ElementRange{});
  tokens_.resize(static_cast<std::size_t>(options_.batch * options_.seq));
  targets_.resize(tokens_.size());
}

template <class T>
Trainer<T>::~Trainer() = default;

template <class T>
StepStats Trainer<T>::train_step() {
  StepStats s;
  s.step = step_;
  loader_->fill(step_, io::Split::train, tokens_, targets_);
  GptModel<T>& m = run_->model();
  if (pipeline_) {
    s.loss = pipeline_->step(tokens_, targets_);
  } else {
    s.loss = m.forward(tokens_, targets_);
    m.backward();
  }
  // zero=2: the gradients are defined in this data group's chunk only; a
  // pipeline's norm is summed over its stages
  s.grad_norm = clip_grad_norm(m.parameters_store(), run_->grid(), options_.clip,
                               m.options().shard_gradients ? optimizer_->range() : ElementRange{},
                               pipeline_ ? &pipeline_->pipe() : nullptr);
  s.lr = options_.schedule.at(step_);
  // Every rank decides alike: the loss and the norm are global (all-reduced
  // over every rank), and a NaN or an infinity survives any summation order,
  // so the decision needs no agreement of its own: the error is a
  // CollectiveError on every rank at once (agreed all the same in the debug
  // mode, GridOptions::check_calls).
  const bool finite = std::isfinite(s.loss) && std::isfinite(s.grad_norm);
  const bool skip = options_.on_non_finite == TrainerOptions::NonFinite::skip;
  std::optional<std::string> error;
  if (!finite && (!skip || skipped_in_a_row_ >= options_.max_skipped_steps))
    error = fmt::format(
        "step {}: the loss is {} and the gradient norm {} (not finite): training stopped before "
        "this step's update{}; the weights and every saved checkpoint are those of before it "
        "(lower the learning rate, check the data and any imported weights{})",
        step_ + 1, s.loss, s.grad_norm,
        skip ? fmt::format(", after {} skipped steps in a row (the limit)", skipped_in_a_row_)
             : std::string(),
        skip ? std::string() : "; or skip such steps: " + options_.skip_hint);
  if (run_->grid().check_calls())
    run_->grid().agree(CommAxis::world, error);
  else if (error)
    throw CollectiveError(*error);
  if (finite) {
    optimizer_->step(s.lr);
    // zero=1: every chunk to every group; zero=2: one all-gather per unit
    all_gather_updates(*optimizer_, run_->grid());
    skipped_in_a_row_ = 0;
  } else {
    s.skipped = true;
    ++skipped_in_a_row_;
  }
  ++step_;
  return s;
}

template <class T>
double Trainer<T>::evaluate(int batches) {
  require(batches > 0,
          [&] { return fmt::format("evaluate: batches={} must be positive", batches); });
  const io::Split split = loader_->has_val() ? io::Split::val : io::Split::train;
  double sum = 0;
  for (int b = 0; b < batches; ++b) {
    loader_->fill(b, split, tokens_, targets_);
    sum += pipeline_ ? pipeline_->evaluate(tokens_, targets_)
                     : run_->model().forward(tokens_, targets_);
  }
  return sum / batches;
}

template <class T>
std::map<std::string, std::string> Trainer<T>::checkpoint_meta() const {
  const GptConfig& c = options_.config;
  std::map<std::string, std::string> meta{
      {"scheme", SchemeSpec::parse(options_.scheme).str()},
      {"config", config_text(c)},
      {"n_layer", std::to_string(c.n_layer)},
      {"n_head", std::to_string(c.n_head)},
      {"n_embd", std::to_string(c.n_embd)},
      {"n_positions", std::to_string(c.n_positions)},
      {"vocab_size", std::to_string(c.vocab_size)},
      {"layer_norm_epsilon", fmt::format("{}", c.layer_norm_epsilon)},
      {"optimizer", std::string(optimizer_->kind())},
      {"data_seed", std::to_string(options_.data_seed)},
      {"init_seed", std::to_string(options_.init_seed)},
      {"batch", std::to_string(options_.batch)},
      {"seq", std::to_string(options_.seq)},
      {"dtype", std::string(name_of(dtype_v<T>))},
      {"lr", fmt::format("{}", options_.schedule.lr)},
      {"min_lr", fmt::format("{}", options_.schedule.min_lr)},
      {"warmup", std::to_string(options_.schedule.warmup)},
      {"total", std::to_string(options_.schedule.total)},
      {"weight_decay", fmt::format("{}", options_.optimizer.weight_decay)},
      {"clip", fmt::format("{}", options_.clip)}};
  if (!options_.run_id.empty()) meta["run_id"] = options_.run_id;
  return meta;
}

template <class T>
std::optional<CheckpointStages> Trainer<T>::stages() const {
  if (!pipeline_) return std::nullopt;
  return CheckpointStages{.world = pipeline_->world(),
                          .pipe = pipeline_->pipe_native(),
                          .stage = pipeline_->stage(),
                          .stages = pipeline_->stages()};
}

template <class T>
MPI_Comm Trainer<T>::world() const {
  return pipeline_ ? pipeline_->world() : run_->grid().native(CommAxis::world);
}

template <class T>
void Trainer<T>::save(const std::filesystem::path& root) {
  const std::optional<CheckpointStages> st = stages();
  // Through the optimizer: its state slots, and for bf16 the fp32 master
  // weights as the parameter values.
  save_checkpoint<T>(root, *optimizer_, CheckpointInfo{.step = step_, .meta = checkpoint_meta()},
                     run_->grid(), st ? &*st : nullptr);
}

template <class T>
void Trainer<T>::load(const std::filesystem::path& path_or_root) {
  const std::optional<CheckpointStages> st = stages();
  MPI_Comm comm = world();
  const CheckpointInfo head = read_checkpoint_info(path_or_root, comm);
  // What must match before the tensors are read (the shapes are checked by
  // load_checkpoint as well, naming the tensor).
  std::optional<std::string> error;
  const auto want = [&](const char* key, const std::string& mine) {
    const auto it = head.meta.find(key);
    if (!error && (it == head.meta.end() || it->second != mine))
      error = fmt::format("resume from {}: checkpoint {} '{}' differs from this run's '{}'",
                          path_or_root.string(), key,
                          it == head.meta.end() ? std::string("(missing)") : it->second, mine);
  };
  want("config", config_text(options_.config));
  want("optimizer", std::string(optimizer_->kind()));
  // The batches are a function of (data seed, step): the same seed continues
  // the saved run's stream.
  want("data_seed", std::to_string(options_.data_seed));
  agree_on(comm, error);
  const CheckpointInfo info =
      load_checkpoint<T>(path_or_root, *optimizer_, run_->grid(), st ? &*st : nullptr);
  step_ = info.step;
  optimizer_->set_steps(info.step);
}

template <class T>
void Trainer<T>::export_hf(const std::filesystem::path& dir) {
  const std::optional<CheckpointStages> st = stages();
  io::export_hf_gpt2(run_->model(), dir, io::DTypeOut::f32, st ? &*st : nullptr);
}

template <class T>
void Trainer<T>::import_hf(const std::filesystem::path& dir) {
  const std::optional<CheckpointStages> st = stages();
  io::import_hf_gpt2(run_->model(), dir, st ? &*st : nullptr);
  optimizer_->refresh_master();  // bf16: the master follows the imported weights
}

template class Trainer<float>;
template class Trainer<double>;
template class Trainer<bf16>;

}  // namespace summa

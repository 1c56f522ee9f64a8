#pragma once
/// \file trainer.hpp
/// Training end to end under any scheme: a GPT (ParallelGpt), its optimizer
/// and learning-rate schedule, gradient clipping, the token loader, sharded
/// checkpoints that resume under any other scheme, and the Hugging Face
/// export. examples/gpt_train is a command line over this class; the
/// resharding and training-equivalence tests drive it directly.
///
/// One step: batch(step) from the loader (the same global batch on every
/// rank, a pure function of the data seed and the step), forward, backward,
/// clip the gradient's global norm, optimizer step at schedule.at(step).
///
/// Any backend: parameters, gradients, activations and optimizer state live
/// in the backend's memory (device memory on a CudaBackend). The host holds
/// the batch's token ids (uploaded by the model into pre-allocated backend
/// memory), the loss and the gradient norm (doubles); checkpoints and the
/// Hugging Face export/import stage through host copies outside the steps.
/// A checkpoint stores parameters, optimizer state, the step and the
/// options that fix the run (model shape, data seed, ...); resuming restores
/// them, so the losses continue as in an uninterrupted run, whatever the
/// scheme and mesh of either run.

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "summa/io/checkpoint.hpp"
#include "summa/io/data.hpp"
#include "summa/optim/optimizer.hpp"
#include "summa/parallel/pipeline.hpp"
#include "summa/parallel/scheme.hpp"

namespace summa {

struct TrainerOptions {
  GptConfig config;
  /// Scheme text (SchemeSpec::parse); its rank count must equal the
  /// communicator's size. With a pipeline axis (pipe=P:micro=M) the model
  /// trains through PipelineGpt; its checkpoints and Hugging Face files are
  /// the same as any other run's (every stage saves its part together).
  std::string scheme = "2d:q=1";
  index_t batch = 8;  ///< global sequences per step
  index_t seq = 32;   ///< tokens per sequence
  GptOptions gpt;     ///< activation checkpointing
  /// Communicators of the model's grid (ParallelGpt's `grid`): the default
  /// (MPI) for CpuBackend; for a device backend (CudaBackend) comm =
  /// CommBackend::nccl (one GPU per rank) or CommBackend::mpi_staged (ranks
  /// may share a GPU) with compute_stream = CudaBackend::stream(). A device
  /// backend with MPI communicators is refused on every rank.
  GridOptions grid;
  OptimizerOptions optimizer;
  LrSchedule schedule;
  /// Clip the gradient's global norm to this (0: no clipping, the norm is
  /// still computed and reported).
  double clip = 1.0;
  std::uint64_t init_seed = 1234;  ///< weights (init_value)
  std::uint64_t data_seed = 1234;  ///< batch windows (io::TokenLoader)
  double val_fraction = 0.1;       ///< held-out tail of the token stream
  /// The run's identity, saved in every checkpoint's meta as `run_id` (empty:
  /// none saved). gpt_train draws one at a fresh start, keeps the saved one
  /// on resume and writes it into every log record, so that a resume never
  /// cuts another run's log.
  std::string run_id;
  /// A step whose loss or gradient norm is NaN or infinite (divergence, or
  /// non-finite weights, e.g. imported) never updates the weights. `stop`
  /// (the default): train_step() throws summa::CollectiveError on every rank,
  /// so nothing non-finite is trained on or saved. `skip`: the step is
  /// consumed without an update (StepStats::skipped), and train_step() throws
  /// once more than max_skipped_steps steps in a row were skipped.
  enum class NonFinite { stop, skip };
  NonFinite on_non_finite = NonFinite::stop;
  int max_skipped_steps = 10;
  /// How this trainer's user asks for `skip`, named by the divergence error
  /// (a program gives its flag, e.g. gpt_train's "--on-nonfinite skip").
  std::string skip_hint = "TrainerOptions::on_non_finite = skip";

  /// Throws summa::Error naming the first bad value.
  void validate() const;
};

/// Whether `id` can be a TrainerOptions::run_id: at most 64 letters, digits,
/// '-' or '_'.
bool is_run_id(std::string_view id);

/// What one step did.
struct StepStats {
  std::int64_t step = 0;  ///< the step just taken (0-based)
  double loss = 0;        ///< mean cross-entropy of its batch (before the update)
  double grad_norm = 0;   ///< global gradient norm before clipping
  double lr = 0;          ///< learning rate applied
  bool skipped = false;   ///< non-finite loss or norm: no update (NonFinite::skip)
};

/// T = float, double or bf16. A bf16 trainer keeps bf16 parameters,
/// activations and gradients and the optimizer's fp32 master weights and
/// state (Optimizer<bf16>); losses and gradient norms are reported in double,
/// and checkpoints hold the fp32 master (docs/gpu.md, "Mixed precision").
template <class T>
class Trainer {
 public:
  /// Builds the model under options.scheme on `comm` (with options.grid's
  /// communicators) on `backend`, which must outlive the trainer, the
  /// optimizer (state on the same backend) and the loader over `tokens` (ids
  /// must be < config.vocab_size), and initialises the weights from
  /// init_seed. Collective over `comm`; invalid options throw the same
  /// summa::Error on every rank.
  Trainer(MPI_Comm comm, const TrainerOptions& options, Backend& backend,
          std::vector<std::uint16_t> tokens);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// One training step (see the file comment); then step() == s.step + 1.
  StepStats train_step();
  /// Mean loss over `batches` validation batches (training batches when
  /// the loader has no validation split); no gradient, no update.
  double evaluate(int batches = 4);

  /// Steps taken so far (the next step's index).
  std::int64_t step() const { return step_; }

  /// Sharded checkpoint of parameters and optimizer state at step() under
  /// `root` (io::save_checkpoint: atomic, checksummed).
  void save(const std::filesystem::path& root);
  /// Resumes from a checkpoint (a step directory, or a root's latest) saved
  /// under any scheme: parameters, optimizer state, step and data seed.
  /// Throws summa::Error on every rank when the checkpoint's model shape or
  /// optimizer differs from this trainer's.
  void load(const std::filesystem::path& path_or_root);
  /// Hugging Face GPT-2 export / import (io::export_hf_gpt2 / import_hf_gpt2).
  void export_hf(const std::filesystem::path& dir);
  void import_hf(const std::filesystem::path& dir);

  const TrainerOptions& options() const { return options_; }
  /// The model's ParallelGpt: with a pipeline, this rank's stage's.
  ParallelGpt<T>& parallel() { return *run_; }
  GptModel<T>& model() { return run_->model(); }
  /// The pipeline (a scheme with pipe=P:micro=M), or null.
  PipelineGpt<T>* pipeline() { return pipeline_.get(); }
  Optimizer<T>& optimizer() { return *optimizer_; }
  const io::TokenLoader& loader() const { return *loader_; }
  /// The metadata a checkpoint of this trainer carries.
  std::map<std::string, std::string> checkpoint_meta() const;

 private:
  std::optional<CheckpointStages> stages() const;  // a pipeline's, for checkpoints and exports
  MPI_Comm world() const;                          // every rank of the run

  TrainerOptions options_;
  std::unique_ptr<PipelineGpt<T>> pipeline_;  // a scheme with a pipeline axis
  std::unique_ptr<ParallelGpt<T>> own_run_;   // else
  ParallelGpt<T>* run_ = nullptr;             // the stage's, or own_run_
  std::unique_ptr<Optimizer<T>> optimizer_;
  std::unique_ptr<io::TokenLoader> loader_;
  std::vector<std::int32_t> tokens_, targets_;
  std::int64_t step_ = 0;
  int skipped_in_a_row_ = 0;
};

/// The model shape a checkpoint of a Trainer records (its metadata keys
/// n_layer, n_head, n_embd, n_positions, vocab_size, layer_norm_epsilon), so
/// a resuming program can build the same model before loading. Throws
/// summa::Error naming a missing or malformed key.
GptConfig config_from_meta(const std::map<std::string, std::string>& meta);

/// Model FLOPs of one training step (forward + backward, no recomputation)
/// of a GPT-2, Narayanan et al. (SC'21) eq. 3:
/// 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)).
double model_flops_per_step(const GptConfig& config, index_t batch, index_t seq);

extern template class Trainer<float>;
extern template class Trainer<double>;
extern template class Trainer<bf16>;

}  // namespace summa

// Gpt (2D) (the 2D GPT-2 of Optimus on a q x q mesh) against the serial
// reference summa::reference::Gpt at whatever q the rank count gives (CTest:
// 1, 4 and 9 ranks): loss, logits, every block boundary, the final norm,
// every parameter gradient (gathered to global tensors) and the input
// gradient, in float, double and bf16 (against the double reference, with
// bf16 tolerances: see check_bf16_against_reference), with activation
// checkpointing on and off;
// the no-allocation guarantee of a training step; buffer sizing and the
// memory report; and the configuration errors, which must be the same on
// every rank.
//
// Both models start from the same global weights (layout-invariant
// initialisation), so the only differences are rounding: the distributed
// model sums GEMM products in a different order (SUMMA panels, reductions
// over the mesh) and keeps LayerNorm / softmax statistics in T where the
// reference uses double. Every comparison is max |a - b| / max |b| over the
// whole tensor; tolerance 1e-9 in double (observed ~1e-14) and 2e-3 in float
// (observed ~1e-5; the sizes are small, so accumulated rounding is ~k * eps
// with k <= 4h = 96). Gradients with and without checkpointing are compared
// to each other with the same bounds (recomputation is deterministic, so
// they agree to rounding).
//
// The backend is test_backend() (SUMMA_TEST_BACKEND=cpu|cuda): inputs are
// built on the host, the model uploads its token ids, and activations and
// gradients are read back with download_view / gather_global. On CUDA the
// float model computes in fp32 (cuBLAS with fp32 accumulation, no TF32) and
// double in fp64, so the same tolerances apply; only the summation order of
// the GEMMs and reductions differs, which the bounds above already cover.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "test_util.hpp"

namespace summa::test {
namespace {

reference::GptConfig test_config(int q) {
  reference::GptConfig c;
  c.n_layer = 2;
  c.n_head = 2 * q;
  c.n_embd = 8 * q;   // head dim 4
  c.n_positions = 7;  // not a multiple of q = 2, 3: uneven wpe chunks
  c.vocab_size = 11 * q;
  return c;
}

std::vector<std::int32_t> random_ids(index_t n, int vocab, std::mt19937_64& gen) {
  std::uniform_int_distribution<int> dist(0, vocab - 1);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(n));
  for (auto& id : ids) id = dist(gen);
  return ids;
}

// The local block (i, j) of a global row-major [rows, cols] tensor.
template <class T>
std::vector<T> local_block(std::span<const T> global, index_t rows, index_t cols, int q, int i,
                           int j) {
  std::vector<T> out;
  for (index_t r = i * rows / q; r < (i + 1) * rows / q; ++r)
    for (index_t c = j * cols / q; c < (j + 1) * cols / q; ++c)
      out.push_back(global[static_cast<std::size_t>(r * cols + c)]);
  return out;
}

// Largest error of a local block against the reference (element type R:
// T, or double for a bf16 model), over all ranks.
template <class T, class R = T>
double block_error(ConstMatrixView<T> local, std::span<const R> global, index_t rows,
                   index_t cols) {
  MeshEnv& e = mesh_env();
  const auto want =
      local_block(global, rows, cols, e.engine.q(), e.grid.coords().row, e.grid.coords().col);
  return max_over_ranks(rel_error(download_view<T>(local), want));
}

template <class T>
struct StepResult {
  double loss = 0;
  std::vector<std::vector<T>> grads;  // gathered, in parameter order
  std::vector<T> input_grad;          // local block
};

template <class T>
StepResult<T> run_distributed(Gpt<T>& model, const std::vector<std::int32_t>& tokens,
                              const std::vector<std::int32_t>& targets) {
  StepResult<T> r;
  r.loss = model.forward(tokens, targets);
  model.backward();
  for (Param<T>* p : model.parameters_store().params())
    r.grads.push_back(gather_global(*p, mesh_env().grid, true));
  r.input_grad = download_view<T>(model.input_grad());
  return r;
}

template <class T>
void check_against_reference(bool checkpoint) {
  MeshEnv& e = mesh_env();
  const int q = e.engine.q();
  const reference::GptConfig config = test_config(q);
  const index_t batch = 2 * q, seq = 5, tokens_n = batch * seq, h = config.n_embd;
  const index_t V = config.vocab_size;
  const std::uint64_t seed = fresh_seed();
  std::mt19937_64 gen(seed);
  const auto tokens = random_ids(tokens_n, config.vocab_size, gen);
  const auto targets = random_ids(tokens_n, config.vocab_size, gen);
  SCOPED_TRACE(seed_note(seed));

  reference::Gpt<T> ref(config, seed);
  const double ref_loss = ref.forward(tokens, targets, batch, seq);
  Summa2DContext<T> model_scheme(e.engine);
  Gpt<T> model(model_scheme, config, batch, seq, {.checkpoint = checkpoint});
  model.init(seed);

  // identical global weights
  for (Param<T>* p : model.parameters_store().params()) {
    const auto global = gather_global(*p, e.grid);
    const auto want = ref.param(p->shard.name);
    ASSERT_EQ(global.size(), want.size()) << p->shard.name;
    EXPECT_TRUE(std::equal(global.begin(), global.end(), want.begin())) << p->shard.name;
  }

  const double loss = model.forward(tokens, targets);
  const double tol = model_tolerance<T>();
  EXPECT_NEAR(loss, ref_loss, tol * std::abs(ref_loss));
  EXPECT_LE(block_error<T>(model.boundary(0), ref.activation("embeddings"), tokens_n, h), tol);
  for (int i = 0; i < config.n_layer; ++i)
    EXPECT_LE(block_error<T>(model.boundary(i + 1),
                             ref.activation("h." + std::to_string(i) + ".output"), tokens_n, h),
              tol)
        << "block " << i;
  EXPECT_LE(block_error<T>(model.final_norm(), ref.activation("ln_f"), tokens_n, h), tol);
  EXPECT_LE(block_error<T>(model.logits(), ref.activation("logits"), tokens_n, V), tol);

  model.backward();
  ref.backward();
  EXPECT_LE(block_error<T>(model.input_grad(), ref.activation_grad("embeddings"), tokens_n, h),
            tol);
  const auto params = model.parameters_store().params();
  EXPECT_EQ(params.size(), reference::parameter_list(config).size());
  for (Param<T>* p : params) {
    const auto global = gather_global(*p, e.grid, true);
    EXPECT_LE(rel_error(global, ref.grad(p->shard.name)), tol) << p->shard.name;
  }
}

TEST(Gpt2D, MatchesReferenceDoubleCheckpointed) {
  check_against_reference<double>(true);
}
TEST(Gpt2D, MatchesReferenceDoubleNoCheckpoint) {
  check_against_reference<double>(false);
}
TEST(Gpt2D, MatchesReferenceFloatCheckpointed) {
  check_against_reference<float>(true);
}
TEST(Gpt2D, MatchesReferenceFloatNoCheckpoint) {
  check_against_reference<float>(false);
}

// bf16 parameters and activations (fp32 statistics and accumulation) against
// the double reference started from the same bf16-rounded weights: the only
// differences are the roundings to bf16 (unit roundoff u = 2^-8 = 3.9e-3) of
// every stored activation and gradient. Errors are max |a - b| / max |b| per
// tensor as above. Observed at q = 1, 2, 3 over 24 seeds: loss <= 1e-4
// relative, activations and logits <= 1.7e-2, parameter and input gradients
// <= 2.1e-2 (each passes through several rounded intermediates). The bounds
// below are 2.5x to 10x those; a wrong statistic, missing term or wrong scale
// (e.g. dropping the 1/sqrt(d) or one residual) gives errors of order 1.
void check_bf16_against_reference(bool checkpoint) {
  MeshEnv& e = mesh_env();
  const int q = e.engine.q();
  const reference::GptConfig config = test_config(q);
  const index_t batch = 2 * q, seq = 5, tokens_n = batch * seq, h = config.n_embd;
  const index_t V = config.vocab_size;
  const std::uint64_t seed = fresh_seed();
  std::mt19937_64 gen(seed);
  const auto tokens = random_ids(tokens_n, config.vocab_size, gen);
  const auto targets = random_ids(tokens_n, config.vocab_size, gen);
  SCOPED_TRACE(seed_note(seed));

  reference::Gpt<double> ref(config, seed);
  for (double& v : ref.params()) v = static_cast<double>(float(bf16(static_cast<float>(v))));
  const double ref_loss = ref.forward(tokens, targets, batch, seq);
  Summa2DContext<bf16> model_scheme(e.engine);
  Gpt<bf16> model(model_scheme, config, batch, seq, {.checkpoint = checkpoint});
  model.init(seed);
  for (Param<bf16>* p : model.parameters_store().params()) {  // bf16(reference init)
    const auto global = gather_global(*p, e.grid);
    const auto want = ref.param(p->shard.name);
    ASSERT_EQ(global.size(), want.size()) << p->shard.name;
    EXPECT_EQ(rel_error(global, want), 0.0) << p->shard.name;
  }

  const double act_tol = 4e-2, grad_tol = 6e-2, loss_tol = 1e-3;
  const auto err = [](ConstMatrixView<bf16> local, std::span<const double> want, index_t rows,
                      index_t cols) { return block_error<bf16, double>(local, want, rows, cols); };
  const double loss = model.forward(tokens, targets);
  EXPECT_NEAR(loss, ref_loss, loss_tol * std::abs(ref_loss));
  EXPECT_LE(err(model.boundary(0), ref.activation("embeddings"), tokens_n, h), act_tol);
  for (int i = 0; i < config.n_layer; ++i)
    EXPECT_LE(err(model.boundary(i + 1), ref.activation("h." + std::to_string(i) + ".output"),
                  tokens_n, h),
              act_tol)
        << "block " << i;
  EXPECT_LE(err(model.final_norm(), ref.activation("ln_f"), tokens_n, h), act_tol);
  EXPECT_LE(err(model.logits(), ref.activation("logits"), tokens_n, V), act_tol);

  model.backward();
  ref.backward();
  EXPECT_LE(err(model.input_grad(), ref.activation_grad("embeddings"), tokens_n, h), grad_tol);
  double worst = 0;
  for (Param<bf16>* p : model.parameters_store().params()) {
    const double err = rel_error(gather_global(*p, e.grid, true), ref.grad(p->shard.name));
    worst = std::max(worst, err);
    EXPECT_LE(err, grad_tol) << p->shard.name;
  }
  ::testing::Test::RecordProperty("worst_grad_error_x1e4", static_cast<int>(worst * 1e4));
}

TEST(Gpt2D, MatchesReferenceBf16Checkpointed) {
  check_bf16_against_reference(true);
}
TEST(Gpt2D, MatchesReferenceBf16NoCheckpoint) {
  check_bf16_against_reference(false);
}

// Checkpointing changes memory, not results: the same gradients to rounding,
// and a second step (gradient accumulation) doubles them.
TEST(Gpt2D, CheckpointingAgreesAndAccumulates) {
  MeshEnv& e = mesh_env();
  const int q = e.engine.q();
  const reference::GptConfig config = test_config(q);
  const index_t batch = q, seq = 6;
  const std::uint64_t seed = fresh_seed();
  std::mt19937_64 gen(seed);
  const auto tokens = random_ids(batch * seq, config.vocab_size, gen);
  const auto targets = random_ids(batch * seq, config.vocab_size, gen);
  Summa2DContext<double> with_scheme(e.engine);
  Gpt<double> with(with_scheme, config, batch, seq, {.checkpoint = true});
  Summa2DContext<double> without_scheme(e.engine);
  Gpt<double> without(without_scheme, config, batch, seq, {.checkpoint = false});
  with.init(seed);
  without.init(seed);
  const StepResult<double> a = run_distributed(with, tokens, targets);
  const StepResult<double> b = run_distributed(without, tokens, targets);
  EXPECT_NEAR(a.loss, b.loss, 1e-12 * std::abs(b.loss));
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (std::size_t k = 0; k < a.grads.size(); ++k)
    EXPECT_LE(rel_error(a.grads[k], b.grads[k]), 1e-12);
  EXPECT_LE(max_over_ranks(rel_error(a.input_grad, b.input_grad)), 1e-12);
  // checkpointing keeps less in the forward buffer
  if (config.n_layer > 1) {
    EXPECT_LT(with.buffers().forward.capacity(), without.buffers().forward.capacity());
  }

  with.forward(tokens, targets);
  with.backward(/*accumulate=*/true);
  const auto params = with.parameters_store().params();
  for (std::size_t k = 0; k < params.size(); ++k) {
    auto twice = a.grads[k];
    for (double& v : twice) v *= 2;
    EXPECT_LE(rel_error(gather_global(*params[k], e.grid, true), twice), 1e-12)
        << params[k]->shard.name;
  }
}

// After one warm-up step, a training step (forward + backward, checkpointing
// on) makes no heap allocation outside MPI's internals, in float and in bf16
// (whose CPU GEMMs widen their operands into the pre-sized scratch).
template <class T>
void expect_step_allocates_nothing() {
  if (!allocation_counting_available()) GTEST_SKIP() << "allocation counting unavailable (ASan)";
  if (test_backend().asynchronous())
    GTEST_SKIP() << "the CUDA runtime allocates host memory internally (pinned staging, "
                    "launch bookkeeping): allocation counting runs on the CPU backend";
  MeshEnv& e = mesh_env();
  const int q = e.engine.q();
  const reference::GptConfig config = test_config(q);
  const index_t batch = q, seq = 5;
  std::mt19937_64 gen(fresh_seed());
  const auto tokens = random_ids(batch * seq, config.vocab_size, gen);
  const auto targets = random_ids(batch * seq, config.vocab_size, gen);
  Summa2DContext<T> model_scheme(e.engine);
  Gpt<T> model(model_scheme, config, batch, seq, {.checkpoint = true});
  model.init(1);
  model.forward(tokens, targets);
  model.backward();
  std::uint64_t count = 0, mpi = 0;
  std::string caller;
  {
    CountAllocations counter;
    model.forward(tokens, targets);
    model.backward();
    count = counter.count();
    mpi = counter.mpi_count();
    caller = counter.first_caller();
  }
  EXPECT_EQ(count, 0u) << "first allocation from " << caller;
  ::testing::Test::RecordProperty("mpi_internal_allocations", static_cast<int>(mpi));
}

TEST(Gpt2D, TrainingStepAllocatesNothing) {
  expect_step_allocates_nothing<float>();
}
TEST(Gpt2D, TrainingStepAllocatesNothingBf16) {
  expect_step_allocates_nothing<bf16>();
}

// Buffers are sized analytically before the first step: after a step the
// high-water marks reach (and never pass) the capacities.
// In double and in bf16 (fp32 row statistics next to bf16 activations).
template <class T>
void expect_buffers_sized_exactly() {
  MeshEnv& e = mesh_env();
  const int q = e.engine.q();
  const reference::GptConfig config = test_config(q);
  const index_t batch = 2 * q, seq = 4;
  std::mt19937_64 gen(fresh_seed());
  const auto tokens = random_ids(batch * seq, config.vocab_size, gen);
  const auto targets = random_ids(batch * seq, config.vocab_size, gen);
  for (bool checkpoint : {true, false}) {
    Summa2DContext<T> model_scheme(e.engine);
    Gpt<T> model(model_scheme, config, batch, seq, {.checkpoint = checkpoint});
    model.init(3);
    model.forward(tokens, targets);
    model.backward();
    const MemoryReport r = model.memory_report();
    for (const BufferUsage& b : r.buffers) {
      EXPECT_LE(b.high_water, b.capacity) << b.name;
      if (b.name != "workspace") {
        EXPECT_EQ(b.high_water, b.capacity) << b.name;
      }
      EXPECT_GT(b.high_water, 0u) << b.name;
    }
    const index_t nt = batch * seq / q, hq = config.n_embd / q;
    EXPECT_EQ(model.buffers().checkpoint.capacity(),
              static_cast<std::size_t>(config.n_layer + 1) *
                  Arena::rounded(static_cast<std::size_t>(nt * hq) * sizeof(T)));
    EXPECT_EQ(r.activations,
              model.buffers().forward.high_water() + model.buffers().checkpoint.high_water());
    EXPECT_NE(r.to_string().find("conjunction"), std::string::npos);
  }
}

TEST(Gpt2D, BuffersSizedExactly) {
  expect_buffers_sized_exactly<double>();
}
TEST(Gpt2D, BuffersSizedExactlyBf16) {
  expect_buffers_sized_exactly<bf16>();
}

// The test grid's communicators are stream-ordered exactly when the backend
// is a device backend (test_grid_options: MPI on the CPU, mpi_staged or nccl
// on CUDA); a device backend on a grid of plain MPI communicators is refused
// with the same error on every rank (the layers hand device buffers to the
// communicators without waiting for the stream).
TEST(Gpt2D, DeviceBackendNeedsStreamOrderedCommunicators) {
  MeshEnv& e = mesh_env();
  for (CommAxis axis : {CommAxis::mesh_row, CommAxis::mesh_col, CommAxis::tensor, CommAxis::data})
    EXPECT_EQ(e.grid.comm(axis).stream_ordered(), e.backend.asynchronous());
  if (!e.backend.asynchronous()) GTEST_SKIP() << "the refusal needs an asynchronous backend";
  ProcessGrid mpi_grid = ProcessGrid::mesh2d(MPI_COMM_WORLD);
  SummaEngine engine(mpi_grid, e.backend);
  const reference::GptConfig config = test_config(engine.q());
  std::string msg;
  try {
    Summa2DContext<float> model_scheme(engine);
    Gpt<float> model(model_scheme, config, engine.q(), 4);
  } catch (const Error& err) {
    msg = err.what();
  }
  EXPECT_NE(msg.find("nccl or mpi_staged"), std::string::npos) << msg;
  EXPECT_TRUE(same_on_all_ranks(msg)) << msg;
  // a plan runs no step: allowed
  EXPECT_NO_THROW({
    Summa2DContext<float> plan_scheme(engine);
    Gpt<float>(plan_scheme, config, engine.q(), 4, {.plan_only = true});
  });
}

// An arena that is too small throws, naming the buffer, the request and the capacity.
TEST(Gpt2D, OverflowNamesTheBuffer) {
  MeshEnv& e = mesh_env();
  Arena small("forward", e.backend, 64);
  try {
    small.take<double>(100);
    FAIL() << "no exception";
  } catch (const Error& err) {
    const std::string msg = err.what();
    EXPECT_NE(msg.find("forward"), std::string::npos) << msg;
    EXPECT_NE(msg.find("800"), std::string::npos) << msg;
    EXPECT_NE(msg.find("64"), std::string::npos) << msg;
  }
}

// Each invalid configuration throws the same summa::Error on every rank.
void expect_config_error(const reference::GptConfig& c, index_t batch, index_t seq,
                         const std::string& needle) {
  MeshEnv& e = mesh_env();
  std::string msg;
  try {
    Summa2DContext<float> model_scheme(e.engine);
    Gpt<float> model(model_scheme, c, batch, seq);
  } catch (const Error& err) {
    msg = err.what();
  }
  EXPECT_NE(msg.find(needle), std::string::npos) << "'" << msg << "' lacks '" << needle << "'";
  EXPECT_TRUE(same_on_all_ranks(msg)) << msg;
}

TEST(Gpt2D, InvalidConfigurationsThrowEverywhere) {
  const int q = mesh_env().engine.q();
  const reference::GptConfig good = test_config(q);
  {
    auto c = good;
    c.n_embd = 8 * q + 1;
    expect_config_error(c, q, 4, "divisible by n_head");
  }
  expect_config_error(good, q, good.n_positions + 1, "longer than the position table");
  if (q > 1) {
    expect_config_error(good, q + 1, 4, "batch=");
    auto c = good;
    c.n_head = 1;
    c.n_embd = 8 * q + 1;  // a valid GPT-2 shape, not divisible by q
    expect_config_error(c, q, 4, "n_embd (hidden)");
    c = good;
    c.n_head = q + 1;
    c.n_embd = (q + 1) * q * 2;  // divisible by q and by n_head; n_head not by q
    expect_config_error(c, q, 4, "n_head");
    c = good;
    c.vocab_size = 11 * q + 1;
    expect_config_error(c, q, 4, "vocab_size");
  }
}

TEST(Gpt2D, BadIdsThrowEverywhere) {
  MeshEnv& e = mesh_env();
  const int q = e.engine.q();
  const reference::GptConfig config = test_config(q);
  const index_t batch = q, seq = 3;
  Summa2DContext<float> model_scheme(e.engine);
  Gpt<float> model(model_scheme, config, batch, seq);
  model.init(5);
  std::vector<std::int32_t> ok(static_cast<std::size_t>(batch * seq), 1);
  for (auto [where, value, needle] :
       {std::tuple{0, config.vocab_size, "token id"}, std::tuple{1, -1, "target id"}}) {
    auto tokens = ok, targets = ok;
    (where == 0 ? tokens : targets)[2] = value;
    std::string msg;
    try {
      model.forward(tokens, targets);
    } catch (const Error& err) {
      msg = err.what();
    }
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_TRUE(same_on_all_ranks(msg));
  }
  std::string msg;
  try {
    model.forward(std::vector<std::int32_t>(ok.size() + 1, 0), ok);
  } catch (const Error& err) {
    msg = err.what();
  }
  EXPECT_NE(msg.find("expected batch*seq"), std::string::npos) << msg;
  EXPECT_THROW(model.backward(), Error);  // failed forwards leave nothing to differentiate
}

}  // namespace
}  // namespace summa::test

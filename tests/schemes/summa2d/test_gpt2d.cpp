// What only the 2D (Optimus) GPT on a q x q mesh has, at whatever q the rank
// count gives (CTest: 1, 4 and 9 ranks). The 2D layers and Gpt against the
// serial reference (each layer alone, the whole model in double, float and
// bf16, checkpointing, accumulation, replicas, allocation, buffers, generic
// configuration and id errors) are checked with the other schemes' in one
// typed suite, tests/layers/test_scheme_layers.cpp; here: a device backend
// needs stream-ordered communicators (refused with the same error on every
// rank otherwise; on CUDA), an arena overflow names the buffer, and the 2D
// divisibility rules of a configuration (n_embd and vocab by q), the same
// error on every rank.
//
// The backend is test_backend() (SUMMA_TEST_BACKEND=cpu|cuda) with the mesh
// of mesh_env().
#include <gtest/gtest.h>

#include <string>

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

// The 2D rules (what every scheme checks, the attention splits included:
// test_scheme_layers.cpp).
TEST(Gpt2D, InvalidConfigurationsThrowEverywhere) {
  const int q = mesh_env().engine.q();
  const reference::GptConfig good = test_config(q);
  if (q == 1) GTEST_SKIP() << "every size is divisible by q = 1";
  auto c = good;
  c.n_head = 1;
  c.n_embd = 8 * q + 1;  // a valid GPT-2 shape, not divisible by q
  expect_config_error(c, q, 4, "n_embd (hidden)");
  c = good;
  c.vocab_size = 11 * q + 1;
  expect_config_error(c, q, 4, "vocab_size");
}

}  // namespace
}  // namespace summa::test

// Transitional oracle (issue 26, point 1): the training step priced by
// walking the built model (Module::price over a plan-only GPT, one rank at
// a time) equals the step composed from the schemes' op costs
// (compose_step): every counter on every axis, every op (name, phase,
// count) and every piece of its work, and the data-axis buckets. Every
// scheme of 1, 2, 3, 4, 6, 8 and 9 ranks, f32 / f64 / bf16, checkpointing on and off, every
// rank of the grid. Serial: nothing is launched.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "../../src/parallel/step.hpp"
#include "summa/schemes/registry.hpp"
#include "test_util.hpp"

namespace summa::test {
namespace {

using model::detail::StepOp;

std::string describe(const cost::Work& w) {
  return fmt::format(
      "kind {} coll {} fn {} axis {} form {} ov {} group {} sent {} recv {} bytes {} m {} n {} k "
      "{} "
      "batch {} calls {} elements {} element {} panel {}",
      static_cast<int>(w.kind), static_cast<int>(w.collective), static_cast<int>(w.function),
      static_cast<int>(w.axis), static_cast<int>(w.form), w.overlapped, w.group, w.sent, w.received,
      w.bytes, w.m, w.n, w.k, w.batch, w.calls, w.elements, w.element, w.summa.panel);
}

void expect_same(const std::vector<StepOp>& want, const std::vector<StepOp>& got) {
  ASSERT_EQ(want.size(), got.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(fmt::format("op {} {}", i, want[i].name));
    EXPECT_EQ(want[i].name, got[i].name);
    EXPECT_EQ(want[i].phase, got[i].phase);
    EXPECT_EQ(want[i].count, got[i].count);
    ASSERT_EQ(want[i].work.size(), got[i].work.size());
    for (std::size_t k = 0; k < want[i].work.size(); ++k)
      EXPECT_EQ(describe(want[i].work[k]), describe(got[i].work[k])) << "work " << k;
  }
}

TEST(StepWalk, EqualsTheComposedStep) {
  GptConfig config;
  config.n_layer = 3;
  config.n_head = 72;
  config.n_embd = 144;
  config.n_positions = 7;
  config.vocab_size = 72;
  const index_t seq = 3;
  int compared = 0;
  for (const int ranks : {1, 2, 3, 4, 6, 8, 9}) {  // the divisors of the widths below
    const std::vector<SchemeSpec> specs = schemes_for(ranks);
    const index_t batch = common_batch(specs);
    for (const SchemeSpec& spec : specs)
      for (const DType dtype : {DType::f32, DType::f64, DType::bf16})
        for (const bool checkpoint : {false, true}) {
          SCOPED_TRACE(fmt::format("{} dtype {} checkpoint {}", spec.str(), static_cast<int>(dtype),
                                   checkpoint));
          const SchemeRow& row = scheme_row(spec.scheme);
          const GridShape shape = row.grid_shape(spec);
          const GptOptions options{.checkpoint = checkpoint};
          const auto u = [](auto v) { return static_cast<cost::u64>(v); };
          const cost::Elements el{.e = u(size_of(dtype)), .a = u(size_of(acc_dtype(dtype)))};
          const model::detail::StepDims dims =
              model::detail::step_dims(config, batch, seq, spec.data, dtype, checkpoint);
          for (int d = 0; d < shape.data; ++d)
            for (int z = 0; z < shape.depth; ++z)
              for (int r = 0; r < shape.rows; ++r)
                for (int c = 0; c < shape.cols; ++c) {
                  const GridCoords at{d, z, r, c};
                  SCOPED_TRACE(fmt::format("rank ({}, {}, {}, {})", d, z, r, c));
                  cost::Tally want_t, got_t;
                  std::vector<StepOp> want_ops, got_ops;
                  const auto op = row.op_cost(spec, at, el);
                  const auto want = model::detail::compose_step(*op, want_t, dims, &want_ops);
                  const auto got = model::detail::walk_step(spec, config, batch, seq, options,
                                                            dtype, at, got_t, &got_ops);
                  for (std::size_t a = 0; a < comm_axis_count; ++a) {
                    const auto axis = static_cast<CommAxis>(a);
                    EXPECT_EQ(want_t.t[axis].bytes_sent, got_t.t[axis].bytes_sent) << a;
                    EXPECT_EQ(want_t.t[axis].bytes_received, got_t.t[axis].bytes_received) << a;
                    EXPECT_EQ(want_t.t[axis].calls, got_t.t[axis].calls) << a;
                  }
                  EXPECT_EQ(want.ln_f, got.ln_f);
                  EXPECT_EQ(want.block, got.block);
                  EXPECT_EQ(want.embedding, got.embedding);
                  expect_same(want_ops, got_ops);
                  if (HasFailure()) return;
                  ++compared;
                }
        }
  }
  EXPECT_GT(compared, 500);
}

}  // namespace
}  // namespace summa::test

// Backend's non-virtual interface: every op checks its arguments in the base
// class, once, before the per-type hook runs. A recording backend whose hooks
// only note that they ran shows it: a bad call throws summa::Error before any
// hook is reached, a good call reaches exactly one hook (the one of its
// element type), and CpuBackend refuses the same bad call with the same
// message (the check lives in one place for every backend).
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "summa/backend/backend.hpp"
#include "summa/backend/cpu_backend.hpp"
#include "summa/backend/optimizer_math.hpp"

namespace summa::test {
namespace {

// Every hook appends "op/type" (the element type of its matrices, or of its
// first array; the strided sum_of_squares is "sum_of_squares_strided") to
// `calls` and does nothing else: it never touches memory.
class RecordingBackend final : public Backend {
 public:
  std::vector<std::string> calls;

  std::string_view name() const override { return "recording"; }
  void* allocate(std::size_t) override { return nullptr; }
  void deallocate(void*, std::size_t) noexcept override {}
  std::size_t gemm_scratch_bytes(index_t, index_t, index_t, DType) const override { return 0; }
  bool host_accessible() const override { return true; }
  bool asynchronous() const override { return false; }

 private:
  template <class T>
  void hit(const char* op) {
    calls.push_back(std::string(op) + "/" + std::string(name_of(dtype_v<T>)));
  }

  void do_gemm(Op, Op, float, ConstMatrixView<float>, ConstMatrixView<float>, float,
               MatrixView<float>, Scratch) override {
    hit<float>("gemm");
  }
  void do_gemm(Op, Op, double, ConstMatrixView<double>, ConstMatrixView<double>, double,
               MatrixView<double>, Scratch) override {
    hit<double>("gemm");
  }
  void do_gemm(Op, Op, float, ConstMatrixView<bf16>, ConstMatrixView<bf16>, float, MatrixView<bf16>,
               Scratch) override {
    hit<bf16>("gemm");
  }
  void do_gemm_strided_batched(Op, Op, float, ConstMatrixView<float>, index_t,
                               ConstMatrixView<float>, index_t, float, MatrixView<float>, index_t,
                               index_t, Scratch) override {
    hit<float>("gemm_strided_batched");
  }
  void do_gemm_strided_batched(Op, Op, double, ConstMatrixView<double>, index_t,
                               ConstMatrixView<double>, index_t, double, MatrixView<double>,
                               index_t, index_t, Scratch) override {
    hit<double>("gemm_strided_batched");
  }
  void do_gemm_strided_batched(Op, Op, float, ConstMatrixView<bf16>, index_t, ConstMatrixView<bf16>,
                               index_t, float, MatrixView<bf16>, index_t, index_t,
                               Scratch) override {
    hit<bf16>("gemm_strided_batched");
  }
  void do_copy(ConstMatrixView<float>, MatrixView<float>) override { hit<float>("copy"); }
  void do_copy(ConstMatrixView<double>, MatrixView<double>) override { hit<double>("copy"); }
  void do_copy(ConstMatrixView<bf16>, MatrixView<bf16>) override { hit<bf16>("copy"); }
  void do_convert(ConstMatrixView<float>, MatrixView<bf16>) override { hit<float>("convert"); }
  void do_convert(ConstMatrixView<bf16>, MatrixView<float>) override { hit<bf16>("convert"); }
  void do_axpby(float, ConstMatrixView<float>, float, MatrixView<float>) override {
    hit<float>("axpby");
  }
  void do_axpby(double, ConstMatrixView<double>, double, MatrixView<double>) override {
    hit<double>("axpby");
  }
  void do_axpby(float, ConstMatrixView<bf16>, float, MatrixView<bf16>) override {
    hit<bf16>("axpby");
  }
  void do_scale(float, MatrixView<float>) override { hit<float>("scale"); }
  void do_scale(double, MatrixView<double>) override { hit<double>("scale"); }
  void do_scale(float, MatrixView<bf16>) override { hit<bf16>("scale"); }
  void do_add_bias(MatrixView<float>, const float*) override { hit<float>("add_bias"); }
  void do_add_bias(MatrixView<double>, const double*) override { hit<double>("add_bias"); }
  void do_add_bias(MatrixView<bf16>, const bf16*) override { hit<bf16>("add_bias"); }
  void do_column_sums(ConstMatrixView<float>, float, float*) override { hit<float>("column_sums"); }
  void do_column_sums(ConstMatrixView<double>, double, double*) override {
    hit<double>("column_sums");
  }
  void do_column_sums(ConstMatrixView<bf16>, float, bf16*) override { hit<bf16>("column_sums"); }
  void do_layernorm_partial_sums(ConstMatrixView<float>, const float*, float*) override {
    hit<float>("layernorm_partial_sums");
  }
  void do_layernorm_partial_sums(ConstMatrixView<double>, const double*, double*) override {
    hit<double>("layernorm_partial_sums");
  }
  void do_layernorm_partial_sums(ConstMatrixView<bf16>, const float*, float*) override {
    hit<bf16>("layernorm_partial_sums");
  }
  void do_layernorm_mean(index_t, index_t, const float*, float*) override {
    hit<float>("layernorm_mean");
  }
  void do_layernorm_mean(index_t, index_t, const double*, double*) override {
    hit<double>("layernorm_mean");
  }
  void do_layernorm_rstd(index_t, index_t, double, const float*, float*) override {
    hit<float>("layernorm_rstd");
  }
  void do_layernorm_rstd(index_t, index_t, double, const double*, double*) override {
    hit<double>("layernorm_rstd");
  }
  void do_layernorm_apply(ConstMatrixView<float>, const float*, const float*, const float*,
                          const float*, MatrixView<float>) override {
    hit<float>("layernorm_apply");
  }
  void do_layernorm_apply(ConstMatrixView<double>, const double*, const double*, const double*,
                          const double*, MatrixView<double>) override {
    hit<double>("layernorm_apply");
  }
  void do_layernorm_apply(ConstMatrixView<bf16>, const float*, const float*, const bf16*,
                          const bf16*, MatrixView<bf16>) override {
    hit<bf16>("layernorm_apply");
  }
  void do_layernorm_backward_partials(ConstMatrixView<float>, ConstMatrixView<float>, const float*,
                                      const float*, const float*, float*, float*) override {
    hit<float>("layernorm_backward_partials");
  }
  void do_layernorm_backward_partials(ConstMatrixView<double>, ConstMatrixView<double>,
                                      const double*, const double*, const double*, double*,
                                      double*) override {
    hit<double>("layernorm_backward_partials");
  }
  void do_layernorm_backward_partials(ConstMatrixView<bf16>, ConstMatrixView<bf16>, const float*,
                                      const float*, const bf16*, float*, float*) override {
    hit<bf16>("layernorm_backward_partials");
  }
  void do_layernorm_backward_apply(ConstMatrixView<float>, ConstMatrixView<float>, const float*,
                                   const float*, const float*, const float*, const float*, index_t,
                                   MatrixView<float>) override {
    hit<float>("layernorm_backward_apply");
  }
  void do_layernorm_backward_apply(ConstMatrixView<double>, ConstMatrixView<double>, const double*,
                                   const double*, const double*, const double*, const double*,
                                   index_t, MatrixView<double>) override {
    hit<double>("layernorm_backward_apply");
  }
  void do_layernorm_backward_apply(ConstMatrixView<bf16>, ConstMatrixView<bf16>, const float*,
                                   const float*, const bf16*, const float*, const float*, index_t,
                                   MatrixView<bf16>) override {
    hit<bf16>("layernorm_backward_apply");
  }
  void do_layernorm_param_partials(ConstMatrixView<float>, ConstMatrixView<float>, const float*,
                                   const float*, float*, float*) override {
    hit<float>("layernorm_param_partials");
  }
  void do_layernorm_param_partials(ConstMatrixView<double>, ConstMatrixView<double>, const double*,
                                   const double*, double*, double*) override {
    hit<double>("layernorm_param_partials");
  }
  void do_layernorm_param_partials(ConstMatrixView<bf16>, ConstMatrixView<bf16>, const float*,
                                   const float*, bf16*, bf16*) override {
    hit<bf16>("layernorm_param_partials");
  }
  void do_gelu_forward(ConstMatrixView<float>, MatrixView<float>) override {
    hit<float>("gelu_forward");
  }
  void do_gelu_forward(ConstMatrixView<double>, MatrixView<double>) override {
    hit<double>("gelu_forward");
  }
  void do_gelu_forward(ConstMatrixView<bf16>, MatrixView<bf16>) override {
    hit<bf16>("gelu_forward");
  }
  void do_gelu_backward(ConstMatrixView<float>, ConstMatrixView<float>,
                        MatrixView<float>) override {
    hit<float>("gelu_backward");
  }
  void do_gelu_backward(ConstMatrixView<double>, ConstMatrixView<double>,
                        MatrixView<double>) override {
    hit<double>("gelu_backward");
  }
  void do_gelu_backward(ConstMatrixView<bf16>, ConstMatrixView<bf16>, MatrixView<bf16>) override {
    hit<bf16>("gelu_backward");
  }
  void do_softmax_causal(ConstMatrixView<float>, double, MatrixView<float>) override {
    hit<float>("softmax_causal");
  }
  void do_softmax_causal(ConstMatrixView<double>, double, MatrixView<double>) override {
    hit<double>("softmax_causal");
  }
  void do_softmax_causal(ConstMatrixView<bf16>, double, MatrixView<bf16>) override {
    hit<bf16>("softmax_causal");
  }
  void do_softmax_causal_backward(ConstMatrixView<float>, ConstMatrixView<float>, double,
                                  MatrixView<float>) override {
    hit<float>("softmax_causal_backward");
  }
  void do_softmax_causal_backward(ConstMatrixView<double>, ConstMatrixView<double>, double,
                                  MatrixView<double>) override {
    hit<double>("softmax_causal_backward");
  }
  void do_softmax_causal_backward(ConstMatrixView<bf16>, ConstMatrixView<bf16>, double,
                                  MatrixView<bf16>) override {
    hit<bf16>("softmax_causal_backward");
  }
  void do_row_max(ConstMatrixView<float>, float*) override { hit<float>("row_max"); }
  void do_row_max(ConstMatrixView<double>, double*) override { hit<double>("row_max"); }
  void do_row_max(ConstMatrixView<bf16>, float*) override { hit<bf16>("row_max"); }
  void do_row_sum_exp(ConstMatrixView<float>, const float*, float*) override {
    hit<float>("row_sum_exp");
  }
  void do_row_sum_exp(ConstMatrixView<double>, const double*, double*) override {
    hit<double>("row_sum_exp");
  }
  void do_row_sum_exp(ConstMatrixView<bf16>, const float*, float*) override {
    hit<bf16>("row_sum_exp");
  }
  void do_pick_targets(ConstMatrixView<float>, const std::int32_t*, index_t, float*) override {
    hit<float>("pick_targets");
  }
  void do_pick_targets(ConstMatrixView<double>, const std::int32_t*, index_t, double*) override {
    hit<double>("pick_targets");
  }
  void do_pick_targets(ConstMatrixView<bf16>, const std::int32_t*, index_t, float*) override {
    hit<bf16>("pick_targets");
  }
  double do_cross_entropy_sum(index_t, const float*, const float*, const float*) override {
    hit<float>("cross_entropy_sum");
    return 0;
  }
  double do_cross_entropy_sum(index_t, const double*, const double*, const double*) override {
    hit<double>("cross_entropy_sum");
    return 0;
  }
  void do_cross_entropy_grad(MatrixView<float>, const float*, const float*, const std::int32_t*,
                             index_t, double) override {
    hit<float>("cross_entropy_grad");
  }
  void do_cross_entropy_grad(MatrixView<double>, const double*, const double*, const std::int32_t*,
                             index_t, double) override {
    hit<double>("cross_entropy_grad");
  }
  void do_cross_entropy_grad(MatrixView<bf16>, const float*, const float*, const std::int32_t*,
                             index_t, double) override {
    hit<bf16>("cross_entropy_grad");
  }
  void do_gather_rows(const std::int32_t*, index_t, ConstMatrixView<float>, bool,
                      MatrixView<float>) override {
    hit<float>("gather_rows");
  }
  void do_gather_rows(const std::int32_t*, index_t, ConstMatrixView<double>, bool,
                      MatrixView<double>) override {
    hit<double>("gather_rows");
  }
  void do_gather_rows(const std::int32_t*, index_t, ConstMatrixView<bf16>, bool,
                      MatrixView<bf16>) override {
    hit<bf16>("gather_rows");
  }
  void do_scatter_add_rows(const std::int32_t*, index_t, ConstMatrixView<float>,
                           MatrixView<float>) override {
    hit<float>("scatter_add_rows");
  }
  void do_scatter_add_rows(const std::int32_t*, index_t, ConstMatrixView<double>,
                           MatrixView<double>) override {
    hit<double>("scatter_add_rows");
  }
  void do_scatter_add_rows(const std::int32_t*, index_t, ConstMatrixView<bf16>,
                           MatrixView<bf16>) override {
    hit<bf16>("scatter_add_rows");
  }
  void do_upload(void*, const void*, std::size_t) override { calls.emplace_back("upload"); }
  void do_download(void*, const void*, std::size_t) override { calls.emplace_back("download"); }
  void do_adamw_update(float*, const float*, float*, float*, index_t,
                       const optim::AdamWCoefficients&) override {
    hit<float>("adamw_update");
  }
  void do_adamw_update(double*, const double*, double*, double*, index_t,
                       const optim::AdamWCoefficients&) override {
    hit<double>("adamw_update");
  }
  void do_adamw_update(bf16*, const bf16*, float*, float*, float*, index_t,
                       const optim::AdamWCoefficients&) override {
    hit<bf16>("adamw_update");
  }
  void do_sgd_update(float*, const float*, float*, index_t,
                     const optim::SgdCoefficients&) override {
    hit<float>("sgd_update");
  }
  void do_sgd_update(double*, const double*, double*, index_t,
                     const optim::SgdCoefficients&) override {
    hit<double>("sgd_update");
  }
  void do_sgd_update(bf16*, const bf16*, float*, float*, index_t,
                     const optim::SgdCoefficients&) override {
    hit<bf16>("sgd_update");
  }
  double do_sum_of_squares(const float*, index_t) override {
    hit<float>("sum_of_squares");
    return 0;
  }
  double do_sum_of_squares(const double*, index_t) override {
    hit<double>("sum_of_squares");
    return 0;
  }
  double do_sum_of_squares(const bf16*, index_t) override {
    hit<bf16>("sum_of_squares");
    return 0;
  }
  double do_sum_of_squares(const float*, index_t, index_t, index_t) override {
    hit<float>("sum_of_squares_strided");
    return 0;
  }
  double do_sum_of_squares(const double*, index_t, index_t, index_t) override {
    hit<double>("sum_of_squares_strided");
    return 0;
  }
  double do_sum_of_squares(const bf16*, index_t, index_t, index_t) override {
    hit<bf16>("sum_of_squares_strided");
    return 0;
  }
  void do_scale_in_place(float*, index_t, double) override { hit<float>("scale_in_place"); }
  void do_scale_in_place(double*, index_t, double) override { hit<double>("scale_in_place"); }
  void do_scale_in_place(bf16*, index_t, double) override { hit<bf16>("scale_in_place"); }
};

using Call = std::function<void(Backend&)>;

// One op of one element type: calls that pass the checks (each must reach
// `hook` and nothing else) and calls that must not, with a part of their
// message.
struct Case {
  std::string hook;
  std::vector<Call> good;
  std::vector<std::pair<std::string, Call>> bad;
};

// Host buffers the calls point into (never touched by RecordingBackend; the
// bad calls never reach CpuBackend's kernels either).
template <class T>
struct Buffers {
  std::vector<T> a = std::vector<T>(64), b = std::vector<T>(64), c = std::vector<T>(64);
  std::vector<acc_t<T>> s1 = std::vector<acc_t<T>>(16), s2 = std::vector<acc_t<T>>(16),
                        s3 = std::vector<acc_t<T>>(16), s4 = std::vector<acc_t<T>>(16);
  std::vector<std::int32_t> ids = std::vector<std::int32_t>(16);
};

// Every op with a T overload (T = float, double or bf16).
template <class T>
std::vector<Case> cases_of(Buffers<T>& m) {
  using S = acc_t<T>;  // scalars and per-row statistics
  const std::string t(name_of(dtype_v<T>));
  auto V = [](std::vector<T>& v, index_t rows, index_t cols) {
    return MatrixView<T>::dense(v.data(), rows, cols);
  };
  T* const null = nullptr;
  S* const snull = nullptr;
  const MatrixView<T> A = V(m.a, 4, 3), At = V(m.a, 3, 4), B = V(m.b, 3, 2), C = V(m.c, 4, 2);
  const MatrixView<T> X = V(m.a, 4, 3), Y = V(m.b, 4, 3), Z = V(m.c, 4, 3);
  const MatrixView<T> bad_ld(m.a.data(), 4, 3, 2);     // ld 2 < rows 4
  const MatrixView<T> negative(m.a.data(), -1, 3, 1);  // negative rows
  const MatrixView<T> no_data(nullptr, 4, 3, 4);       // non-empty, null
  const MatrixView<T> empty_cols(nullptr, 4, 0, 4);    // 4 rows, no columns
  const MatrixView<T> empty_rows(nullptr, 0, 3, 1);    // no rows, 3 columns
  S* r1 = m.s1.data();
  S* r2 = m.s2.data();
  S* r3 = m.s3.data();
  S* r4 = m.s4.data();
  T* col = m.c.data();  // per-column arrays of T
  std::int32_t* ids = m.ids.data();
  const optim::AdamWCoefficients adamw{};
  const optim::SgdCoefficients sgd{};

  std::vector<Case> out;
  out.push_back({"gemm/" + t,
                 {[=](Backend& b) { b.gemm(Op::N, Op::N, S(1), A, B, S(0), C); },
                  [=](Backend& b) { b.gemm(Op::T, Op::N, S(1), At, B, S(0), C); }},
                 {{"gemm: A is 4x3 and B' is 2x3",
                   [=](Backend& b) { b.gemm(Op::N, Op::T, S(1), A, B, S(0), C); }},
                  {"gemm A: leading dimension 2 < rows 4",
                   [=](Backend& b) { b.gemm(Op::N, Op::N, S(1), bad_ld, B, S(0), C); }},
                  {"gemm C: null data", [=](Backend& b) {
                     b.gemm(Op::N, Op::N, S(1), A, B, S(0), MatrixView<T>(nullptr, 4, 2, 4));
                   }}}});
  auto batched = [=](index_t sa, index_t sc, index_t batch, MatrixView<T> a) {
    return [=](Backend& b) {
      b.gemm_strided_batched(Op::N, Op::N, S(1), a, sa, B, 6, S(0), C, sc, batch);
    };
  };
  out.push_back({"gemm_strided_batched/" + t,
                 {batched(12, 8, 2, A), batched(12, 8, 0, A)},
                 {{"gemm_strided_batched: negative batch -1", batched(12, 8, -1, A)},
                  {"stride_a -12", batched(-12, 8, 2, A)},
                  {"stride_c 4 makes the 3 C blocks", batched(12, 4, 3, A)},
                  {"gemm_strided_batched A: negative shape -1x3", batched(12, 8, 2, negative)}}});
  out.push_back(
      {"copy/" + t,
       {[=](Backend& b) { b.copy(X, Y); }, [=](Backend& b) { b.copy(empty_rows, empty_rows); }},
       {{"copy: shapes differ (4x3 -> 4x2)", [=](Backend& b) { b.copy(X, C); }},
        {"copy src: null data for a non-empty view", [=](Backend& b) { b.copy(no_data, Y); }},
        {"copy dst: leading dimension 2 < rows 4", [=](Backend& b) { b.copy(X, bad_ld); }}}});
  out.push_back({"axpby/" + t,
                 {[=](Backend& b) { b.axpby(S(1), X, S(0), Y); }},
                 {{"axpby: shapes differ (X 4x3 vs C 4x2)",
                   [=](Backend& b) { b.axpby(S(1), X, S(0), C); }}}});
  out.push_back(
      {"scale/" + t,
       {[=](Backend& b) { b.scale(S(2), Y); }},
       {{"scale C: leading dimension 2 < rows 4", [=](Backend& b) { b.scale(S(2), bad_ld); }}}});
  out.push_back(
      {"add_bias/" + t,
       {[=](Backend& b) { b.add_bias(Y, col); }, [=](Backend& b) { b.add_bias(empty_rows, null); }},
       {{"add_bias: null bias for 3 elements", [=](Backend& b) { b.add_bias(Y, null); }},
        {"add_bias Y: negative shape", [=](Backend& b) { b.add_bias(negative, col); }}}});
  out.push_back({"column_sums/" + t,
                 {[=](Backend& b) { b.column_sums(X, S(0), col); }},
                 {{"column_sums: null out for 3 elements",
                   [=](Backend& b) { b.column_sums(X, S(0), null); }}}});
  out.push_back({"layernorm_partial_sums/" + t,
                 {[=](Backend& b) { b.layernorm_partial_sums(X, snull, r1); },  // center optional
                  [=](Backend& b) { b.layernorm_partial_sums(X, r1, r2); }},
                 {{"layernorm_partial_sums: null out for 4 elements",
                   [=](Backend& b) { b.layernorm_partial_sums(X, r1, snull); }}}});
  out.push_back(
      {"layernorm_apply/" + t,
       {[=](Backend& b) { b.layernorm_apply(X, r1, r2, col, col, Y); },
        [=](Backend& b) { b.layernorm_apply(empty_cols, snull, snull, null, null, empty_cols); }},
       {{"layernorm_apply: shapes differ (X 4x3 vs Y 4x2)",
         [=](Backend& b) { b.layernorm_apply(X, r1, r2, col, col, C); }},
        {"layernorm_apply: null rstd for 4 elements",
         [=](Backend& b) { b.layernorm_apply(X, r1, snull, col, col, Y); }},
        {"layernorm_apply: null beta for 3 elements",
         [=](Backend& b) { b.layernorm_apply(X, r1, r2, col, null, Y); }}}});
  out.push_back({"layernorm_backward_partials/" + t,
                 {[=](Backend& b) { b.layernorm_backward_partials(X, Y, r1, r2, col, r3, r4); }},
                 {{"layernorm_backward_partials: shapes differ (dY 4x2 vs X 4x3)",
                   [=](Backend& b) { b.layernorm_backward_partials(X, C, r1, r2, col, r3, r4); }},
                  {"layernorm_backward_partials: null b for 4 elements", [=](Backend& b) {
                     b.layernorm_backward_partials(X, Y, r1, r2, col, r3, snull);
                   }}}});
  out.push_back(
      {"layernorm_backward_apply/" + t,
       {[=](Backend& b) { b.layernorm_backward_apply(X, Y, r1, r2, col, r3, r4, 3, Z); }},
       {{"layernorm_backward_apply: hidden size h 0 must be positive",
         [=](Backend& b) { b.layernorm_backward_apply(X, Y, r1, r2, col, r3, r4, 0, Z); }},
        {"layernorm_backward_apply: shapes differ (X 4x3 vs dX 4x2)",
         [=](Backend& b) { b.layernorm_backward_apply(X, Y, r1, r2, col, r3, r4, 3, C); }},
        {"layernorm_backward_apply: null gamma for 3 elements",
         [=](Backend& b) { b.layernorm_backward_apply(X, Y, r1, r2, null, r3, r4, 3, Z); }}}});
  out.push_back({"layernorm_param_partials/" + t,
                 {[=](Backend& b) { b.layernorm_param_partials(X, Y, r1, r2, col, col + 3); }},
                 {{"layernorm_param_partials: null dbeta for 3 elements",
                   [=](Backend& b) { b.layernorm_param_partials(X, Y, r1, r2, col, null); }},
                  {"layernorm_param_partials dY: null data", [=](Backend& b) {
                     b.layernorm_param_partials(X, no_data, r1, r2, col, col);
                   }}}});
  out.push_back({"gelu_forward/" + t,
                 {[=](Backend& b) { b.gelu_forward(X, Y); }},
                 {{"gelu_forward: shapes differ (X 4x3 vs Y 4x2)",
                   [=](Backend& b) { b.gelu_forward(X, C); }}}});
  out.push_back({"gelu_backward/" + t,
                 {[=](Backend& b) { b.gelu_backward(X, Y, Z); }},
                 {{"gelu_backward: shapes differ (dY 4x2 vs dX 4x3)",
                   [=](Backend& b) { b.gelu_backward(X, C, Z); }},
                  {"gelu_backward dY: leading dimension 2 < rows 4",
                   [=](Backend& b) { b.gelu_backward(X, bad_ld, Z); }}}});
  out.push_back({"softmax_causal/" + t,
                 {[=](Backend& b) { b.softmax_causal(X, 0.5, Y); }},
                 {{"softmax_causal: shapes differ (S 4x3 vs P 4x2)",
                   [=](Backend& b) { b.softmax_causal(X, 0.5, C); }}}});
  out.push_back({"softmax_causal_backward/" + t,
                 {[=](Backend& b) { b.softmax_causal_backward(X, Y, 0.5, Z); }},
                 {{"softmax_causal_backward: shapes differ (P 4x3 vs dS 4x2)",
                   [=](Backend& b) { b.softmax_causal_backward(X, Y, 0.5, C); }}}});
  out.push_back({"row_max/" + t,
                 {[=](Backend& b) { b.row_max(X, r1); }},
                 {{"row_max: null out for 4 elements", [=](Backend& b) { b.row_max(X, snull); }}}});
  out.push_back({"row_sum_exp/" + t,
                 {[=](Backend& b) { b.row_sum_exp(X, r1, r2); },
                  // no columns: max is never read and may be null
                  [=](Backend& b) { b.row_sum_exp(empty_cols, snull, r2); }},
                 {{"row_sum_exp: null max for 4 elements",
                   [=](Backend& b) { b.row_sum_exp(X, snull, r2); }}}});
  out.push_back({"pick_targets/" + t,
                 {[=](Backend& b) { b.pick_targets(X, ids, 0, r1); }},
                 {{"pick_targets: null targets for 4 elements",
                   [=](Backend& b) { b.pick_targets(X, nullptr, 0, r1); }}}});
  out.push_back(
      {"cross_entropy_grad/" + t,
       {[=](Backend& b) { b.cross_entropy_grad(Y, r1, r2, ids, 0, 1.0); },
        [=](Backend& b) { b.cross_entropy_grad(empty_cols, snull, snull, nullptr, 0, 1.0); }},
       {{"cross_entropy_grad: null sum for 4 elements",
         [=](Backend& b) { b.cross_entropy_grad(Y, r1, snull, ids, 0, 1.0); }}}});
  out.push_back({"gather_rows/" + t,
                 {[=](Backend& b) { b.gather_rows(ids, 0, X, false, Y); }},
                 {{"gather_rows: out has 2 columns, table 3",
                   [=](Backend& b) { b.gather_rows(ids, 0, X, false, C); }},
                  {"gather_rows: null ids for 4 elements",
                   [=](Backend& b) { b.gather_rows(nullptr, 0, X, true, Y); }}}});
  out.push_back({"scatter_add_rows/" + t,
                 {[=](Backend& b) { b.scatter_add_rows(ids, 0, X, Y); },
                  [=](Backend& b) { b.scatter_add_rows(nullptr, 0, empty_cols, empty_cols); }},
                 {{"scatter_add_rows: src has 3 columns, table 2",
                   [=](Backend& b) { b.scatter_add_rows(ids, 0, X, C); }},
                  {"scatter_add_rows: null ids for 4 elements",
                   [=](Backend& b) { b.scatter_add_rows(nullptr, 0, X, Y); }}}});
  const T* const cnull = nullptr;
  out.push_back({"sum_of_squares/" + t,
                 {[=](Backend& b) { b.sum_of_squares(col, 8); },
                  [=](Backend& b) { b.sum_of_squares(cnull, 0); }},
                 {{"sum_of_squares: negative n -1", [=](Backend& b) { b.sum_of_squares(col, -1); }},
                  {"sum_of_squares: null x for 8 elements",
                   [=](Backend& b) { b.sum_of_squares(cnull, 8); }}}});
  out.push_back({"sum_of_squares_strided/" + t,
                 {[=](Backend& b) { b.sum_of_squares(col, 2, 3, 5); },
                  [=](Backend& b) { b.sum_of_squares(cnull, 2, 0, 5); }},
                 {{"sum_of_squares: need rows, cols >= 0 and ld >= cols (got 2x5, ld 4)",
                   [=](Backend& b) { b.sum_of_squares(col, 2, 5, 4); }},
                  {"sum_of_squares: need rows, cols >= 0 and ld >= cols (got -1x5, ld 5)",
                   [=](Backend& b) { b.sum_of_squares(col, -1, 5, 5); }},
                  {"sum_of_squares: null x for 10 elements",
                   [=](Backend& b) { b.sum_of_squares(cnull, 2, 5, 5); }}}});
  out.push_back(
      {"scale_in_place/" + t,
       {[=](Backend& b) { b.scale_in_place(col, 8, 0.5); }},
       {{"scale_in_place: null x for 8 elements",
         [=](Backend& b) { b.scale_in_place(null, 8, 0.5); }},
        {"scale_in_place: negative n -2", [=](Backend& b) { b.scale_in_place(col, -2, 0.5); }}}});
  if constexpr (std::is_same_v<T, bf16>) {
    out.push_back({"adamw_update/" + t,
                   {[=](Backend& b) { b.adamw_update(col, col, r1, r2, r3, 8, adamw); }},
                   {{"adamw_update: null master for 8 elements",
                     [=](Backend& b) { b.adamw_update(col, col, r1, r2, snull, 8, adamw); }},
                    {"adamw_update: negative n -1",
                     [=](Backend& b) { b.adamw_update(col, col, r1, r2, r3, -1, adamw); }}}});
    out.push_back({"sgd_update/" + t,
                   {[=](Backend& b) { b.sgd_update(col, col, r1, r2, 8, sgd); }},
                   {{"sgd_update: null momentum_buffer for 8 elements",
                     [=](Backend& b) { b.sgd_update(col, col, snull, r2, 8, sgd); }}}});
  } else {
    out.push_back({"adamw_update/" + t,
                   {[=](Backend& b) { b.adamw_update(col, col, r1, r2, 8, adamw); },
                    [=](Backend& b) { b.adamw_update(null, null, snull, snull, 0, adamw); }},
                   {{"adamw_update: null exp_avg_sq for 8 elements",
                     [=](Backend& b) { b.adamw_update(col, col, r1, snull, 8, adamw); }},
                    {"adamw_update: negative n -1",
                     [=](Backend& b) { b.adamw_update(col, col, r1, r2, -1, adamw); }}}});
    out.push_back({"sgd_update/" + t,
                   {[=](Backend& b) { b.sgd_update(col, col, r1, 8, sgd); }},
                   {{"sgd_update: null grad for 8 elements",
                     [=](Backend& b) { b.sgd_update(col, null, r1, 8, sgd); }}}});
    // The statistics ops take acc_t: float and double overloads only.
    out.push_back({"layernorm_mean/" + t,
                   {[=](Backend& b) { b.layernorm_mean(4, 3, r1, r1); }},  // in place
                   {{"layernorm_mean: needs n >= 0 and h > 0 (n 4, h 0)",
                     [=](Backend& b) { b.layernorm_mean(4, 0, r1, r2); }},
                    {"layernorm_mean: null sums for 4 elements",
                     [=](Backend& b) { b.layernorm_mean(4, 3, snull, r2); }}}});
    out.push_back({"layernorm_rstd/" + t,
                   {[=](Backend& b) { b.layernorm_rstd(4, 3, 1e-5, r1, r2); }},
                   {{"layernorm_rstd: needs n >= 0 and h > 0 (n -1, h 3)",
                     [=](Backend& b) { b.layernorm_rstd(-1, 3, 1e-5, r1, r2); }},
                    {"layernorm_rstd: null rstd for 4 elements",
                     [=](Backend& b) { b.layernorm_rstd(4, 3, 1e-5, r1, snull); }}}});
    out.push_back({"cross_entropy_sum/" + t,
                   {[=](Backend& b) { b.cross_entropy_sum(4, r1, r2, r3); }},
                   {{"cross_entropy_sum: negative n -3",
                     [=](Backend& b) { b.cross_entropy_sum(-3, r1, r2, r3); }},
                    {"cross_entropy_sum: null picked for 4 elements",
                     [=](Backend& b) { b.cross_entropy_sum(4, r1, r2, snull); }}}});
  }
  return out;
}

// convert (float <-> bf16) and the host <-> backend copies.
std::vector<Case> other_cases(Buffers<float>& f, Buffers<bf16>& h) {
  const MatrixView<float> F = MatrixView<float>::dense(f.a.data(), 4, 3);
  const MatrixView<bf16> H = MatrixView<bf16>::dense(h.a.data(), 4, 3);
  const MatrixView<bf16> H2 = MatrixView<bf16>::dense(h.b.data(), 3, 4);
  void* dst = f.b.data();
  const void* src = f.c.data();
  std::vector<Case> out;
  out.push_back({"convert/f32",
                 {[=](Backend& b) { b.convert(F, H); }},
                 {{"convert: shapes differ (4x3 -> 3x4)", [=](Backend& b) { b.convert(F, H2); }}}});
  out.push_back({"convert/bf16",
                 {[=](Backend& b) { b.convert(H, F); }},
                 {{"convert src: null data",
                   [=](Backend& b) { b.convert(MatrixView<bf16>(nullptr, 4, 3, 4), F); }}}});
  out.push_back(
      {"upload",
       {[=](Backend& b) { b.upload(dst, src, 16); },
        [=](Backend& b) { b.upload(nullptr, nullptr, 0); }},
       {{"upload: null dst for 16 bytes", [=](Backend& b) { b.upload(nullptr, src, 16); }},
        {"upload: null host_src for 16 bytes", [=](Backend& b) { b.upload(dst, nullptr, 16); }}}});
  out.push_back(
      {"download",
       {[=](Backend& b) { b.download(dst, src, 16); }},
       {{"download: null src for 16 bytes", [=](Backend& b) { b.download(dst, nullptr, 16); }}}});
  return out;
}

// Every case of every element type. The calls point into the buffers, so an
// AllCases stays where it was made.
struct AllCases {
  Buffers<float> f;
  Buffers<double> d;
  Buffers<bf16> h;
  std::vector<Case> cases;
  AllCases() {
    for (const std::vector<Case>& list : {cases_of(f), cases_of(d), cases_of(h), other_cases(f, h)})
      cases.insert(cases.end(), list.begin(), list.end());
  }
  AllCases(const AllCases&) = delete;
  AllCases& operator=(const AllCases&) = delete;
};

std::string error_of(const Call& call, Backend& backend) {
  try {
    call(backend);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(BackendEntry, BadCallsThrowBeforeAnyHook) {
  AllCases all;
  RecordingBackend recording;
  for (const Case& c : all.cases)
    for (const auto& [part, call] : c.bad) {
      recording.calls.clear();
      const std::string what = error_of(call, recording);
      EXPECT_NE(what.find(part), std::string::npos)
          << c.hook << ": want \"" << part << "\", got \"" << what << "\"";
      EXPECT_TRUE(recording.calls.empty()) << c.hook << " (" << part << "): a hook ran";
    }
}

TEST(BackendEntry, GoodCallsReachExactlyOneHook) {
  AllCases all;
  RecordingBackend recording;
  std::set<std::string> reached;
  for (const Case& c : all.cases)
    for (std::size_t i = 0; i < c.good.size(); ++i) {
      recording.calls.clear();
      EXPECT_EQ(error_of(c.good[i], recording), "(no error)") << c.hook << " good call " << i;
      EXPECT_EQ(recording.calls, std::vector<std::string>{c.hook}) << c.hook << " good call " << i;
      reached.insert(recording.calls.begin(), recording.calls.end());
    }
  // Every hook of backend.hpp (89 per-type op overloads, upload, download) is
  // reached by some good call; a new op needs its Case here.
  EXPECT_EQ(reached.size(), 91u);
}

// The checks are the base class's, so a real backend refuses a bad call with
// exactly the message the recording backend got (and touches nothing: every
// bad call's buffers would be misread by a kernel).
TEST(BackendEntry, CpuBackendRefusesWithTheSameMessages) {
  AllCases all;
  RecordingBackend recording;
  CpuBackend cpu;
  for (const Case& c : all.cases)
    for (const auto& [part, call] : c.bad)
      EXPECT_EQ(error_of(call, cpu), error_of(call, recording)) << c.hook << " (" << part << ")";
}

}  // namespace
}  // namespace summa::test

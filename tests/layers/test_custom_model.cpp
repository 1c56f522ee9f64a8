// A user's own model (not a GPT) through the layer API (layers/sequential.hpp):
// an MLP classifier X -> fc1 (expand) -> GeLU -> fc2 (contract) -> GeLU ->
// head (expand) -> the scheme's cross-entropy, built with a SchemeContext
// from make_context, under every family and data factor of the rank count
// (test_util.hpp's representative_schemes), against a serial double computation of the same model
// with the same global weights: the loss, every parameter gradient (gathered) and the input
// gradient (gather_activation).
//
// Residual connections and parallel branches (LayerStack::residual,
// ::parallel): a pre-LN transformer block written from the public parts
// (layer_norm, attention, linear, gelu in two residuals) against block 0 of
// the serial reference GPT (reference::Gpt, the same global weights from the
// same seed, fed random embeddings): the output, every parameter gradient
// and the input gradient; and two summed branches against each branch run
// alone as its own model (the output and input gradient are the sums, each
// parameter's gradient its branch's), under every scheme. Concatenated
// branches (Combine::concat) in both layouts, read by a contracting and an
// expanding linear (their weight rows grouped), against a serial double
// computation of the same model: the output, every parameter gradient and the
// input gradient.
//
// Sizes are multiples of 72 so that every factorisation of 1, 2, 4, 8 and 9
// ranks divides them. Tolerance: model_tolerance<T>() (1e-9 double, 2e-3
// float), the same as the GPT tests; the branches' sums 1e-12 (the same
// arithmetic but for the order of one addition).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "summa/layers/sequential.hpp"
#include "summa/model/cost.hpp"
#include "summa/reference/gpt.hpp"
#include "summa/schemes/registry.hpp"
#include "test_backend_env.hpp"
#include "test_util.hpp"

namespace summa {
namespace {

using namespace summa::test;

constexpr index_t kTokens = 72, kIn = 72, kHidden = 144, kClasses = 72;

int world_size() {
  int s = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

// ---- the serial model, in double, row-major
using Vec = std::vector<double>;

// C [m, n] = A [m, k] B [k, n] (+ bias), or with A transposed / B transposed.
Vec matmul(const Vec& a, const Vec& b, index_t m, index_t k, index_t n, bool ta, bool tb) {
  Vec c(static_cast<std::size_t>(m * n), 0.0);
  for (index_t i = 0; i < m; ++i)
    for (index_t p = 0; p < k; ++p) {
      const double x = ta ? a[p * m + i] : a[i * k + p];
      for (index_t j = 0; j < n; ++j) c[i * n + j] += x * (tb ? b[j * k + p] : b[p * n + j]);
    }
  return c;
}

constexpr double kC = 0.7978845608028654;  // sqrt(2/pi), GPT-2's tanh GeLU
double gelu(double x) {
  return 0.5 * x * (1 + std::tanh(kC * (x + 0.044715 * x * x * x)));
}
double gelu_grad(double x) {
  const double t = std::tanh(kC * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * kC * (1 + 3 * 0.044715 * x * x);
}

struct Serial {
  double loss = 0;
  std::map<std::string, Vec> grad;
  Vec dx;
};

// weights: name -> global values (HF layout: weight [in, out], bias [out]).
Serial serial_mlp(std::map<std::string, Vec> w, const Vec& x, const std::vector<std::int32_t>& y) {
  const index_t T = kTokens;
  auto linear = [&](const Vec& in, const std::string& name, index_t k, index_t n) {
    Vec out = matmul(in, w[name + ".weight"], T, k, n, false, false);
    for (index_t i = 0; i < T; ++i)
      for (index_t j = 0; j < n; ++j) out[i * n + j] += w[name + ".bias"][j];
    return out;
  };
  const Vec a1 = linear(x, "fc1", kIn, kHidden);
  Vec g1(a1.size());
  for (std::size_t i = 0; i < a1.size(); ++i) g1[i] = gelu(a1[i]);
  const Vec a2 = linear(g1, "fc2", kHidden, kIn);
  Vec g2(a2.size());
  for (std::size_t i = 0; i < a2.size(); ++i) g2[i] = gelu(a2[i]);
  Vec z = linear(g2, "head", kIn, kClasses);
  Serial s;
  for (index_t i = 0; i < T; ++i) {  // softmax cross-entropy, mean over tokens
    double mx = -1e300, sum = 0;
    for (index_t j = 0; j < kClasses; ++j) mx = std::max(mx, z[i * kClasses + j]);
    for (index_t j = 0; j < kClasses; ++j) sum += std::exp(z[i * kClasses + j] - mx);
    s.loss += (std::log(sum) + mx - z[i * kClasses + y[i]]) / T;
    for (index_t j = 0; j < kClasses; ++j)
      z[i * kClasses + j] = (std::exp(z[i * kClasses + j] - mx) / sum - (j == y[i] ? 1 : 0)) / T;
  }
  auto back = [&](const Vec& dout, const Vec& in, const std::string& name, index_t k, index_t n) {
    s.grad[name + ".weight"] = matmul(in, dout, k, T, n, true, false);
    Vec db(static_cast<std::size_t>(n), 0.0);
    for (index_t i = 0; i < T; ++i)
      for (index_t j = 0; j < n; ++j) db[j] += dout[i * n + j];
    s.grad[name + ".bias"] = db;
    return matmul(dout, w[name + ".weight"], T, n, k, false, true);
  };
  Vec d = back(z, g2, "head", kIn, kClasses);
  for (std::size_t i = 0; i < d.size(); ++i) d[i] *= gelu_grad(a2[i]);
  d = back(d, g1, "fc2", kHidden, kIn);
  for (std::size_t i = 0; i < d.size(); ++i) d[i] *= gelu_grad(a1[i]);
  s.dx = back(d, x, "fc1", kIn, kHidden);
  return s;
}

// ---- the distributed model

template <class T>
std::vector<T> download(Backend& be, ConstMatrixView<T> v) {
  std::vector<T> out(static_cast<std::size_t>(v.rows * v.cols));
  be.download(out.data(), v.data, out.size() * sizeof(T));
  return out;
}

template <class T>
void build(Sequential<T>& mlp) {
  mlp.linear("fc1", kHidden, LinearRole::expand);
  mlp.gelu();
  mlp.linear("fc2", kIn, LinearRole::contract);
  mlp.gelu();
  mlp.linear("head", kClasses, LinearRole::expand);
}

template <class T>
void custom_mlp_matches_serial() {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  std::uniform_int_distribution<int> cls(0, kClasses - 1);
  std::vector<T> x(static_cast<std::size_t>(kTokens * kIn));
  for (T& v : x) v = static_cast<T>(u(gen));
  std::vector<std::int32_t> y(static_cast<std::size_t>(kTokens));
  for (auto& v : y) v = cls(gen);
  const Vec xd(x.begin(), x.end());
  Backend& backend = test_backend();
  int tested = 0;
  std::vector<SchemeSpec> specs = with_sequence_parallel(representative_schemes(world_size()));
  for (const SchemeSpec& s : representative_schemes(world_size()))
    if (s.holds<Axonn3DSpec>() && s.as<Axonn3DSpec>().gz > 1) {  // the 3D overlaps: hooks
      SchemeSpec all = s;                                        // run by Sequential
      all.as<Axonn3DSpec>().ors = all.as<Axonn3DSpec>().oag = true;
      specs.push_back(all);
    }
  for (const SchemeSpec& spec : specs) {
    SCOPED_TRACE(spec.str());
    ProcessGrid grid = make_grid(MPI_COMM_WORLD, spec, test_grid_options());
    const std::unique_ptr<SchemeContext<T>> scheme = make_context<T>(spec, grid, backend);
    const index_t tg = kTokens / spec.data, first = grid.coords().data * tg;
    Sequential<T> mlp(*scheme, tg, kIn);
    build(mlp);
    const std::unique_ptr<Loss<T>> ce = scheme->cross_entropy(tg, kClasses, kTokens);
    mlp.finish(ce->buffer_needs());
    mlp.parameters_store().init_uniform(seed, 0.2);

    // This data group's rows, this rank's block of them, in backend memory.
    const std::vector<T> xg(x.begin() + first * kIn, x.begin() + (first + tg) * kIn);
    const std::vector<T> local =
        scatter_activation<T>(*scheme, xg, tg, kIn, ActivationLayout::outer);
    Arena input("input", backend, local.size() * sizeof(T));
    T* xl = input.take<T>(local.size());
    backend.upload(xl, local.data(), local.size() * sizeof(T));
    const index_t rows = scheme->local_rows(tg, ActivationLayout::outer),
                  cols = scheme->local_cols(kIn, ActivationLayout::outer);
    ASSERT_EQ(static_cast<std::size_t>(rows * cols), local.size());

    MatrixView<T> z = mlp.forward(MatrixView<T>::dense(xl, rows, cols, Order::row_major));
    StepBuffers step = mlp.buffers();
    double loss = ce->forward(z, std::span<const std::int32_t>(y).subspan(first, tg), step);
    if (spec.data > 1) grid.data().all_reduce(&loss, &loss, 1, ReduceOp::sum);
    ce->backward(z, step);
    const ConstMatrixView<T> dx = mlp.backward(z);
    mlp.sync_data_gradients();

    std::map<std::string, Vec> weights;
    for (Param<T>* p : mlp.parameters_store().params()) {
      const std::vector<T> g = gather_global(*p, grid);
      weights[p->shard.name] = Vec(g.begin(), g.end());
      // layout-invariant initialisation: the same global weights everywhere
      for (std::size_t k = 0; k < g.size(); k += 97)
        ASSERT_EQ(g[k], static_cast<T>(static_cast<float>(
                            uniform_init_value(seed, p->shard.name, static_cast<index_t>(k), 0.2))))
            << p->shard.name;
    }
    const Serial want = serial_mlp(weights, xd, y);
    EXPECT_NEAR(loss, want.loss, model_tolerance<T>() * std::abs(want.loss));
    for (Param<T>* p : mlp.parameters_store().params())
      EXPECT_LE(
          max_over_ranks(rel_error(gather_global(*p, grid, true), want.grad.at(p->shard.name))),
          model_tolerance<T>())
          << p->shard.name;
    const std::vector<T> dxg =
        gather_activation<T>(*scheme, download(backend, dx), tg, kIn, ActivationLayout::outer);
    const Vec want_dx(want.dx.begin() + first * kIn, want.dx.begin() + (first + tg) * kIn);
    EXPECT_LE(max_over_ranks(rel_error(dxg, want_dx)), model_tolerance<T>());
    ++tested;
  }
  EXPECT_GE(tested, 1);
}

TEST(CustomModel, MlpClassifierMatchesSerialUnderEveryScheme) {
  custom_mlp_matches_serial<double>();
}
TEST(CustomModel, MlpClassifierMatchesSerialUnderEverySchemeFloat) {
  custom_mlp_matches_serial<float>();
}

// ---- residual connections and parallel branches

// This data group's rows of a global [tokens, width] activation, as this
// rank's local block in backend memory (kept alive by `arena`).
template <class T>
MatrixView<T> local_block(const SchemeContext<T>& scheme, Backend& backend, Arena& arena,
                          std::span<const double> global, index_t first, index_t tokens,
                          index_t width) {
  const std::vector<T> rows(global.begin() + first * width,
                            global.begin() + (first + tokens) * width);
  const std::vector<T> local =
      scatter_activation<T>(scheme, rows, tokens, width, ActivationLayout::outer);
  T* data = arena.take<T>(local.size());
  backend.upload(data, local.data(), local.size() * sizeof(T));
  return MatrixView<T>::dense(data, scheme.local_rows(tokens, ActivationLayout::outer),
                              scheme.local_cols(width, ActivationLayout::outer), Order::row_major);
}

template <class T>
void pre_ln_block_matches_serial() {
  const int ranks = world_size();
  GptConfig config;
  config.n_layer = 1;
  config.n_head = 72;  // divisible by every p, q and X of the rank counts
  config.n_embd = 144;
  config.n_positions = 4;
  config.vocab_size = 72;
  const index_t h = config.n_embd, seq = 4, batch = common_batch(schemes_for(ranks));
  const index_t tokens = batch * seq;
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  std::uniform_int_distribution<int> id(0, config.vocab_size - 1);
  Vec embeddings(static_cast<std::size_t>(tokens * h));
  for (double& v : embeddings) v = u(gen);
  std::vector<std::int32_t> targets(static_cast<std::size_t>(tokens));
  for (auto& t : targets) t = id(gen);
  // The oracle: block 0 of the serial GPT, its output's gradient from the
  // rest of the model (ln_f, the head, the loss).
  reference::Gpt<double> ref(config, seed);
  ref.forward_embeddings(embeddings, targets, batch, seq);
  ref.backward();
  const std::span<const double> want_y = ref.activation("h.0.output"),
                                dy = ref.activation_grad("h.0.output"), want_dx = ref.input_grad();
  Backend& backend = test_backend();
  int tested = 0;
  for (const SchemeSpec& spec : with_sequence_parallel(representative_schemes(ranks))) {
    SCOPED_TRACE(spec.str());
    ProcessGrid grid = make_grid(MPI_COMM_WORLD, spec, test_grid_options());
    const std::unique_ptr<SchemeContext<T>> scheme = make_context<T>(spec, grid, backend);
    const index_t tg = tokens / spec.data, first = grid.coords().data * tg;
    Sequential<T> block(*scheme, tg, h);
    block.residual([&](Chain<T>& f) {  // x + Attn(LN1(x))
      f.layer_norm("h.0.ln_1", config.layer_norm_epsilon);
      f.attention("h.0.attn", seq, config.n_head);
    });
    block.residual([&](Chain<T>& f) {  // x + MLP(LN2(x))
      f.layer_norm("h.0.ln_2", config.layer_norm_epsilon);
      f.linear("h.0.mlp.c_fc", 4 * h, LinearRole::expand);
      f.gelu();
      f.linear("h.0.mlp.c_proj", h, LinearRole::contract);
    });
    block.finish();
    block.parameters_store().init_gpt(seed, config);
    Arena io("block io", backend, 4 * (Arena::rounded(static_cast<std::size_t>(tg * h) * 8)));
    const MatrixView<T> x = local_block<T>(*scheme, backend, io, embeddings, first, tg, h);
    const MatrixView<T> g = local_block<T>(*scheme, backend, io, dy, first, tg, h);
    const MatrixView<T> y = block.forward(x);
    const auto rows = [&](std::span<const double> v) {
      return Vec(v.begin() + first * h, v.begin() + (first + tg) * h);
    };
    EXPECT_LE(max_over_ranks(rel_error(gather_activation<T>(*scheme, download<T>(backend, y), tg, h,
                                                            ActivationLayout::outer),
                                       rows(want_y))),
              model_tolerance<T>())
        << "output";
    const ConstMatrixView<T> dx = block.backward(g);
    block.sync_data_gradients();
    for (Param<T>* p : block.parameters_store().params()) {
      const std::span<const double> want = ref.grad(p->shard.name);
      EXPECT_LE(
          max_over_ranks(rel_error(gather_global(*p, grid, true), Vec(want.begin(), want.end()))),
          model_tolerance<T>())
          << p->shard.name;
    }
    EXPECT_EQ(block.parameters_store().params().size(), 12u);  // every parameter of block 0
    EXPECT_LE(max_over_ranks(rel_error(gather_activation<T>(*scheme, download<T>(backend, dx), tg,
                                                            h, ActivationLayout::outer),
                                       rows(want_dx))),
              model_tolerance<T>())
        << "input gradient";
    ++tested;
  }
  EXPECT_GE(tested, 1);
}

TEST(CustomModel, PreLnBlockFromPublicPartsMatchesSerialUnderEveryScheme) {
  pre_ln_block_matches_serial<double>();
}
TEST(CustomModel, PreLnBlockFromPublicPartsMatchesSerialUnderEverySchemeFloat) {
  pre_ln_block_matches_serial<float>();
}

// The two branches of parallel(): a(x) = a.proj(gelu(a.fc(x))), b(x) =
// b.proj(b.fc(LN(x))); on a Chain (a branch) or a Sequential (alone).
template <class Stack>
void branch_a(Stack& f) {
  f.linear("a.fc", kHidden, LinearRole::expand);
  f.gelu();
  f.linear("a.proj", kIn, LinearRole::contract);
}
template <class Stack>
void branch_b(Stack& f) {
  f.layer_norm("b.ln");
  f.linear("b.fc", kHidden, LinearRole::expand);
  f.linear("b.proj", kIn, LinearRole::contract);
}

TEST(CustomModel, ParallelBranchesAreTheSumOfEachBranchAlone) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  Vec x(static_cast<std::size_t>(kTokens * kIn)), dy(x.size());
  for (double& v : x) v = u(gen);
  for (double& v : dy) v = u(gen);
  Backend& backend = test_backend();
  int tested = 0;
  for (const SchemeSpec& spec : representative_schemes(world_size())) {
    SCOPED_TRACE(spec.str());
    ProcessGrid grid = make_grid(MPI_COMM_WORLD, spec, test_grid_options());
    const auto scheme = make_context<double>(spec, grid, backend);
    const index_t tg = kTokens / spec.data, first = grid.coords().data * tg;
    struct Run {
      Vec y, dx;
      std::map<std::string, Vec> grads;
    };
    // `build` on a fresh model, one step on (x, dy): its output, input
    // gradient and parameter gradients, gathered.
    const auto run = [&](const std::function<void(Sequential<double>&)>& build) {
      Sequential<double> m(*scheme, tg, kIn);
      build(m);
      m.finish();
      m.parameters_store().init_uniform(seed, 0.2);
      Arena io("io", backend, 2 * Arena::rounded(static_cast<std::size_t>(tg * kIn) * 8));
      const MatrixView<double> xl = local_block<double>(*scheme, backend, io, x, first, tg, kIn);
      const MatrixView<double> gl = local_block<double>(*scheme, backend, io, dy, first, tg, kIn);
      Run r;
      r.y = gather_activation<double>(*scheme, download<double>(backend, m.forward(xl)), tg, kIn,
                                      ActivationLayout::outer);
      r.dx = gather_activation<double>(*scheme, download<double>(backend, m.backward(gl)), tg, kIn,
                                       ActivationLayout::outer);
      for (Param<double>* p : m.parameters_store().params())
        r.grads[p->shard.name] = gather_global(*p, grid, true);
      return r;
    };
    const Run both = run([](Sequential<double>& m) {
      m.parallel({branch_a<Chain<double>>, branch_b<Chain<double>>});
    });
    const Run a = run([](Sequential<double>& m) { branch_a(m); });
    const Run b = run([](Sequential<double>& m) { branch_b(m); });
    ASSERT_EQ(both.grads.size(), a.grads.size() + b.grads.size());
    Vec y = a.y, dx = a.dx;
    for (std::size_t k = 0; k < y.size(); ++k) {
      y[k] += b.y[k];
      dx[k] += b.dx[k];
    }
    constexpr double tol = 1e-12;
    EXPECT_LE(max_over_ranks(rel_error(both.y, y)), tol) << "output";
    EXPECT_LE(max_over_ranks(rel_error(both.dx, dx)), tol) << "input gradient";
    for (const auto& [name, g] : both.grads) {
      const Run& alone = a.grads.count(name) != 0 ? a : b;
      EXPECT_LE(max_over_ranks(rel_error(g, alone.grads.at(name))), tol) << name;
    }
    ++tested;
  }
  EXPECT_GE(tested, 1);
}

// ---- concatenated branches

// A serial linear layer and its backward, on row-major [T, k] inputs.
struct SerialLinear {
  std::map<std::string, Vec>& w;
  std::map<std::string, Vec>& grad;
  index_t T;
  Vec forward(const Vec& x, const std::string& name, index_t k, index_t n) const {
    Vec y = matmul(x, w.at(name + ".weight"), T, k, n, false, false);
    for (index_t i = 0; i < T; ++i)
      for (index_t j = 0; j < n; ++j) y[i * n + j] += w.at(name + ".bias")[j];
    return y;
  }
  // dL/dx from dL/dy; the weight's and bias's gradients recorded.
  Vec backward(const Vec& dy, const Vec& x, const std::string& name, index_t k, index_t n) const {
    grad[name + ".weight"] = matmul(x, dy, k, T, n, true, false);
    Vec db(static_cast<std::size_t>(n), 0.0);
    for (index_t i = 0; i < T; ++i)
      for (index_t j = 0; j < n; ++j) db[j] += dy[i * n + j];
    grad[name + ".bias"] = db;
    return matmul(dy, w.at(name + ".weight"), T, n, k, false, true);
  }
};

Vec gelu_of(Vec v) {
  for (double& x : v) x = gelu(x);
  return v;
}
// dL/d(pre) = dL/d(gelu(pre)) * gelu'(pre)
Vec gelu_back(Vec d, const Vec& pre) {
  for (std::size_t i = 0; i < d.size(); ++i) d[i] *= gelu_grad(pre[i]);
  return d;
}
// [a | b], a [T, wa], b [T, wb]; and columns [c0, c0 + n) of v [T, w].
Vec concat(const Vec& a, index_t wa, const Vec& b, index_t wb, index_t T) {
  Vec out(static_cast<std::size_t>(T * (wa + wb)));
  for (index_t i = 0; i < T; ++i) {
    std::copy_n(a.begin() + i * wa, wa, out.begin() + i * (wa + wb));
    std::copy_n(b.begin() + i * wb, wb, out.begin() + i * (wa + wb) + wa);
  }
  return out;
}
Vec columns(const Vec& v, index_t w, index_t c0, index_t n, index_t T) {
  Vec out(static_cast<std::size_t>(T * n));
  for (index_t i = 0; i < T; ++i) std::copy_n(v.begin() + i * w + c0, n, out.begin() + i * n);
  return out;
}

// The model: cat1 = [gelu(c.fc(x)) | d.fc(x)] (inner, two groups) -> p
// (contract) -> cat2 = [e.proj(e.fc(.)) | f.proj(gelu(f.fc(.)))] (outer, two
// groups) -> gelu -> q (expand) -> r (contract): [T, kIn].
template <class T>
void build_concat(Sequential<T>& m) {
  m.parallel({[](Chain<T>& f) {
                f.linear("c.fc", kHidden, LinearRole::expand);
                f.gelu();
              },
              [](Chain<T>& f) { f.linear("d.fc", kHidden, LinearRole::expand); }},
             Combine::concat);
  m.linear("p", kIn, LinearRole::contract);
  m.parallel({[](Chain<T>& f) {
                f.linear("e.fc", kHidden, LinearRole::expand);
                f.linear("e.proj", kIn, LinearRole::contract);
              },
              [](Chain<T>& f) {
                f.linear("f.fc", kHidden, LinearRole::expand);
                f.gelu();
                f.linear("f.proj", kIn, LinearRole::contract);
              }},
             Combine::concat);
  m.gelu();
  m.linear("q", kHidden, LinearRole::expand);
  m.linear("r", kIn, LinearRole::contract);
}

struct SerialRun {
  Vec y, dx;
  std::map<std::string, Vec> grad;
};

SerialRun serial_concat(std::map<std::string, Vec> w, const Vec& x, const Vec& dy, index_t T) {
  SerialRun s;
  const SerialLinear lin{w, s.grad, T};
  const index_t H = kHidden, I = kIn;
  const Vec ac = lin.forward(x, "c.fc", I, H), d = lin.forward(x, "d.fc", I, H);
  const Vec cat1 = concat(gelu_of(ac), H, d, H, T);
  const Vec p = lin.forward(cat1, "p", 2 * H, I);
  const Vec e1 = lin.forward(p, "e.fc", I, H), e = lin.forward(e1, "e.proj", H, I);
  const Vec af = lin.forward(p, "f.fc", I, H), f1 = gelu_of(af),
            f = lin.forward(f1, "f.proj", H, I);
  const Vec cat2 = concat(e, I, f, I, T), g = gelu_of(cat2);
  const Vec qv = lin.forward(g, "q", 2 * I, H);
  s.y = lin.forward(qv, "r", H, I);
  const Vec dcat2 =
      gelu_back(lin.backward(lin.backward(dy, qv, "r", H, I), g, "q", 2 * I, H), cat2);
  Vec dp = lin.backward(lin.backward(columns(dcat2, 2 * I, 0, I, T), e1, "e.proj", H, I), p, "e.fc",
                        I, H);
  const Vec df1 = gelu_back(lin.backward(columns(dcat2, 2 * I, I, I, T), f1, "f.proj", H, I), af);
  const Vec dpf = lin.backward(df1, p, "f.fc", I, H);
  for (std::size_t k = 0; k < dp.size(); ++k) dp[k] += dpf[k];
  const Vec dcat1 = lin.backward(dp, cat1, "p", 2 * H, I);
  s.dx = lin.backward(gelu_back(columns(dcat1, 2 * H, 0, H, T), ac), x, "c.fc", I, H);
  const Vec dxd = lin.backward(columns(dcat1, 2 * H, H, H, T), x, "d.fc", I, H);
  for (std::size_t k = 0; k < s.dx.size(); ++k) s.dx[k] += dxd[k];
  return s;
}

template <class T>
void concatenated_branches_match_serial() {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  Vec x(static_cast<std::size_t>(kTokens * kIn)), dy(x.size());
  for (double& v : x) v = static_cast<double>(static_cast<T>(u(gen)));
  for (double& v : dy) v = static_cast<double>(static_cast<T>(u(gen)));
  Backend& backend = test_backend();
  int tested = 0;
  for (const SchemeSpec& spec : representative_schemes(world_size())) {
    SCOPED_TRACE(spec.str());
    ProcessGrid grid = make_grid(MPI_COMM_WORLD, spec, test_grid_options());
    const auto scheme = make_context<T>(spec, grid, backend);
    const index_t tg = kTokens / spec.data, first = grid.coords().data * tg;
    Sequential<T> m(*scheme, tg, kIn);
    build_concat(m);
    m.finish();
    m.parameters_store().init_uniform(seed, 0.2);
    Arena io("io", backend, 2 * Arena::rounded(static_cast<std::size_t>(tg * kIn) * 8));
    const MatrixView<T> xl = local_block<T>(*scheme, backend, io, x, first, tg, kIn);
    const MatrixView<T> gl = local_block<T>(*scheme, backend, io, dy, first, tg, kIn);
    const std::vector<T> y = gather_activation<T>(*scheme, download<T>(backend, m.forward(xl)), tg,
                                                  kIn, ActivationLayout::outer);
    const std::vector<T> dx = gather_activation<T>(*scheme, download<T>(backend, m.backward(gl)),
                                                   tg, kIn, ActivationLayout::outer);
    m.sync_data_gradients();
    std::map<std::string, Vec> weights;
    for (Param<T>* p : m.parameters_store().params()) {
      const std::vector<T> g = gather_global(*p, grid);
      weights[p->shard.name] = Vec(g.begin(), g.end());
    }
    ASSERT_EQ(weights.size(), 18u);  // 9 linears
    // the serial model on the whole batch; this data group's rows compared
    const SerialRun want = serial_concat(weights, x, dy, kTokens);
    const auto rows = [&](const Vec& v) {
      return Vec(v.begin() + first * kIn, v.begin() + (first + tg) * kIn);
    };
    EXPECT_LE(max_over_ranks(rel_error(y, rows(want.y))), model_tolerance<T>()) << "output";
    EXPECT_LE(max_over_ranks(rel_error(dx, rows(want.dx))), model_tolerance<T>())
        << "input gradient";
    for (Param<T>* p : m.parameters_store().params())
      EXPECT_LE(
          max_over_ranks(rel_error(gather_global(*p, grid, true), want.grad.at(p->shard.name))),
          model_tolerance<T>())
          << p->shard.name;
    ++tested;
  }
  EXPECT_GE(tested, 1);
}

TEST(CustomModel, ConcatenatedBranchesMatchSerialUnderEveryScheme) {
  concatenated_branches_match_serial<double>();
}
TEST(CustomModel, ConcatenatedBranchesMatchSerialUnderEverySchemeFloat) {
  concatenated_branches_match_serial<float>();
}

// A user's model prices itself (Sequential, Chain, Parallel walk their
// layers): the traffic one forward and backward step measures on every axis
// (bytes sent and received, calls) equals the price, under every scheme.
TEST(CustomModel, PriceEqualsTheMeasuredTraffic) {
  constexpr index_t seq = 4, heads = 72;  // heads divide every p, q and X
  Backend& backend = test_backend();
  std::mt19937_64 gen(fresh_seed());
  std::uniform_real_distribution<double> u(-1, 1);
  Vec x(static_cast<std::size_t>(kTokens * kIn)), dy(x.size());
  for (double& v : x) v = u(gen);
  for (double& v : dy) v = u(gen);
  int tested = 0;
  for (const SchemeSpec& spec : representative_schemes(world_size())) {
    SCOPED_TRACE(spec.str());
    ProcessGrid grid = make_grid(MPI_COMM_WORLD, spec, test_grid_options());
    const auto scheme = make_context<double>(spec, grid, backend);
    const index_t tg = kTokens / spec.data, first = grid.coords().data * tg;
    if (tg % (seq * scheme->sequence_split()) != 0) continue;  // attention needs whole sequences
    Sequential<double> m(*scheme, tg, kIn);
    m.layer_norm("ln");
    m.residual([&](Chain<double>& f) { f.attention("attn", seq, heads); });
    m.parallel({branch_a<Chain<double>>, branch_b<Chain<double>>});
    m.gelu();
    m.parallel({[](Chain<double>& f) { f.linear("ca", kHidden, LinearRole::expand); },
                [](Chain<double>& f) {
                  f.linear("cb", kHidden, LinearRole::expand);
                  f.gelu();
                }},
               Combine::concat);
    m.linear("cat.proj", kIn, LinearRole::contract);
    m.finish();
    m.parameters_store().init_uniform(1, 0.2);
    Arena io("io", backend, 2 * Arena::rounded(static_cast<std::size_t>(tg * kIn) * 8));
    const MatrixView<double> xl = local_block<double>(*scheme, backend, io, x, first, tg, kIn);
    const MatrixView<double> gl = local_block<double>(*scheme, backend, io, dy, first, tg, kIn);
    grid.reset_traffic();
    m.forward(xl);
    m.backward(gl);
    cost::Tally want;
    m.price(want, model::Phase::forward);
    const std::uint64_t forward_calls = want.t.total().calls;
    m.price(want, model::Phase::backward);
    if (spec.ranks() / spec.data > 1) {  // a tensor group: collectives both ways
      EXPECT_GT(forward_calls, 0u);
      EXPECT_GT(want.t.total().calls, forward_calls);
    }
    for (std::size_t a = 0; a < comm_axis_count; ++a) {
      const auto axis = static_cast<CommAxis>(a);
      EXPECT_EQ(grid.traffic()[axis].bytes_sent, want.t[axis].bytes_sent) << name_of(axis);
      EXPECT_EQ(grid.traffic()[axis].bytes_received, want.t[axis].bytes_received) << name_of(axis);
      EXPECT_EQ(grid.traffic()[axis].calls, want.t[axis].calls) << name_of(axis) << " calls";
    }
    ++tested;
  }
  EXPECT_GE(tested, 1);
}

// A residual body must end as it starts, summed or concatenated branches
// alike, a concatenation is read only by a linear or gelu: refused with the
// same message on every rank.
TEST(CustomModel, ResidualAndBranchShapesAreChecked) {
  const SchemeSpec spec = schemes_for(world_size()).front();
  ProcessGrid grid = make_grid(MPI_COMM_WORLD, spec, test_grid_options());
  const auto scheme = make_context<double>(spec, grid, test_backend());
  Sequential<double> m(*scheme, kTokens / spec.data, kIn);
  const auto message = [](auto&& f) {
    std::string msg;
    try {
      f();
    } catch (const Error& e) {
      msg = e.what();
    }
    return msg;
  };
  const std::string residual = message(
      [&] { m.residual([](Chain<double>& f) { f.linear("r.fc", kHidden, LinearRole::expand); }); });
  EXPECT_NE(residual.find("a residual body must end as it starts"), std::string::npos) << residual;
  EXPECT_TRUE(same_on_all_ranks(residual)) << residual;
  const std::string branches = message([&] {
    m.parallel({branch_a<Chain<double>>,
                [](Chain<double>& f) { f.linear("c.fc", kHidden, LinearRole::expand); }});
  });
  EXPECT_NE(branches.find("summed branches end alike"), std::string::npos) << branches;
  EXPECT_TRUE(same_on_all_ranks(branches)) << branches;
  const std::string unequal = message([&] {
    m.parallel({branch_a<Chain<double>>,
                [](Chain<double>& f) { f.linear("c.fc", kHidden, LinearRole::expand); }},
               Combine::concat);
  });
  EXPECT_NE(unequal.find("concatenated branches end alike"), std::string::npos) << unequal;
  EXPECT_TRUE(same_on_all_ranks(unequal)) << unequal;
  EXPECT_EQ(m.size(), 0u);  // nothing refused was added

  // A concatenation (grouped columns) is read by a linear or gelu only, and
  // a model does not end in one.
  m.parallel({branch_a<Chain<double>>, branch_b<Chain<double>>}, Combine::concat);
  EXPECT_EQ(m.out_groups(), 2);
  EXPECT_EQ(m.out_width(), 2 * kIn);
  const std::string norm = message([&] { m.layer_norm("ln"); });
  EXPECT_NE(norm.find("layer_norm 'ln' reads a concatenation of 2 branches"), std::string::npos)
      << norm;
  EXPECT_TRUE(same_on_all_ranks(norm)) << norm;
  const std::string nested = message([&] { m.residual([](Chain<double>& f) { f.gelu(); }); });
  EXPECT_NE(nested.find("a residual reads a concatenation"), std::string::npos) << nested;
  const std::string grouped_body = message([&] {
    Sequential<double> other(*scheme, kTokens / spec.data, kIn);
    other.residual([](Chain<double>& f) {  // ends in a concatenation
      f.parallel({[](Chain<double>& b) { b.linear("h.fc", kHidden, LinearRole::expand); },
                  [](Chain<double>& b) { b.linear("g.fc", kHidden, LinearRole::expand); }},
                 Combine::concat);
    });
  });
  EXPECT_NE(grouped_body.find("residual body 0 ends in a concatenation of 2 branches (grouped "
                              "columns), expected ungrouped"),
            std::string::npos)
      << grouped_body;
  EXPECT_TRUE(same_on_all_ranks(grouped_body)) << grouped_body;
  m.gelu();  // element-wise: still grouped
  EXPECT_EQ(m.out_groups(), 2);
  const std::string end = message([&] { m.finish(); });
  EXPECT_NE(end.find("ends in a concatenation of 2 branches"), std::string::npos) << end;
  EXPECT_TRUE(same_on_all_ranks(end)) << end;
  m.linear("after", kHidden, LinearRole::expand);  // its rows follow the two groups
  EXPECT_EQ(m.out_groups(), 1);
}

// A contracting linear on an outer activation (or any layout mismatch) is
// refused with the same message on every rank, before anything is built.
TEST(CustomModel, LayoutMismatchIsRefusedEverywhere) {
  const int ranks = world_size();
  const SchemeSpec spec = schemes_for(ranks).front();
  ProcessGrid grid = make_grid(MPI_COMM_WORLD, spec, test_grid_options());
  const auto scheme = make_context<double>(spec, grid, test_backend());
  Sequential<double> mlp(*scheme, kTokens / spec.data, kIn);
  std::string msg;
  try {
    mlp.linear("fc", kIn, LinearRole::contract);
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("reads the inner layout"), std::string::npos) << msg;
  EXPECT_TRUE(same_on_all_ranks(msg)) << msg;
  std::string early;
  try {
    mlp.forward({});
  } catch (const Error& e) {
    early = e.what();
  }
  EXPECT_NE(early.find("before finish()"), std::string::npos) << early;
}

}  // namespace
}  // namespace summa

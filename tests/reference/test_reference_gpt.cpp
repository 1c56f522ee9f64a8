// The serial reference GPT (summa/reference/gpt.hpp), on one process:
//  - every gradient against central finite differences in double, on a tiny
//    model with random non-trivial weights (LayerNorm weights and all biases
//    perturbed too, so every path carries signal);
//  - forward sanity: loss at init ≈ log(vocab), causal mask, batch rows
//    independent, float against double, layer-by-layer composition;
//  - layout-invariant initialisation: each element a pure function of (seed,
//    name, flat index), shards generated separately assemble to the whole;
//  - every error case throws summa::Error naming the offending values.
//
// Finite differences cover every entry of every parameter tensor (about 2k
// entries, a fraction of a second). They use the fourth-order central stencil
//   fd = (8·(L(x+e) − L(x−e)) − (L(x+2e) − L(x−2e))) / (12·e),  e = 1e-4,
// whose truncation error e⁴/30·|L⁽⁵⁾| is ~1e-13 and rounding error ~ε·|L|/e ~
// 1e-11. (The plain 2-point stencil with e = 1e-5 has truncation error
// e²/6·|L'''| that reaches 1e-8 on a few embedding entries, where a row of
// small variance makes LayerNorm strongly curved: about one run in a hundred
// would then fail a 1e-6 relative bound.) Each entry must satisfy
//   |analytic − fd| <= 1e-6 · max(|analytic|, |fd|) + 1e-9;
// over 2000 random models the worst observed error was 1% of that bound, while
// typical gradient entries are 1e-4..1e-1, so a wrong factor anywhere (e.g. a
// GeLU derivative off by 2, or wte missing the tied head's contribution) fails
// by orders of magnitude. The test also shows that the check rejects wte's
// gradient without the tied-head part.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "summa/reference/gpt.hpp"
#include "test_util.hpp"

namespace summa::test {
namespace {

using reference::ActivationInfo;
using reference::Gpt;
using reference::GptConfig;
using reference::init_fill;
using reference::init_fill_block;
using reference::init_normal;
using reference::init_value;
using reference::parameter_count;
using reference::parameter_list;

GptConfig tiny_config() {
  return GptConfig{.n_layer = 2, .n_head = 2, .n_embd = 8, .n_positions = 8, .vocab_size = 11};
}

std::string fmt_layer(int i) {
  return "h." + std::to_string(i) + ".";
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Random non-trivial weights, in parameter_list() order: matrices U(-0.4, 0.4),
// biases U(-0.2, 0.2), LayerNorm weights 1 + U(-0.3, 0.3).
std::vector<double> random_weights(const GptConfig& config, std::mt19937_64& gen) {
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> w;
  for (const auto& p : parameter_list(config)) {
    const bool ln_weight = ends_with(p.name, "ln_1.weight") || ends_with(p.name, "ln_2.weight") ||
                           p.name == "ln_f.weight";
    for (index_t k = 0; k < p.size(); ++k) {
      if (ln_weight)
        w.push_back(1.0 + 0.3 * u(gen));
      else if (ends_with(p.name, ".bias"))
        w.push_back(0.2 * u(gen));
      else
        w.push_back(0.4 * u(gen));
    }
  }
  return w;
}

template <class T>
void set_weights(Gpt<T>& model, const std::vector<double>& w) {
  auto p = model.params();
  ASSERT_EQ(p.size(), w.size());
  for (std::size_t k = 0; k < w.size(); ++k) p[k] = static_cast<T>(w[k]);
}

std::vector<std::int32_t> random_ids(std::size_t n, int vocab, std::mt19937_64& gen) {
  std::uniform_int_distribution<std::int32_t> d(0, vocab - 1);
  std::vector<std::int32_t> ids(n);
  for (auto& id : ids) id = d(gen);
  return ids;
}

// Ratio of |a − f| to the bound rtol·max(|a|, |f|) + atol; < 1 passes.
constexpr double kFdStep = 1e-4, kFdRtol = 1e-6, kFdAtol = 1e-9;
double fd_ratio(double analytic, double fd) {
  return std::abs(analytic - fd) / (kFdRtol * std::max(std::abs(analytic), std::abs(fd)) + kFdAtol);
}

// Fourth-order central difference of `loss` with respect to *x.
double central_difference(double* x, const std::function<double()>& loss) {
  const double saved = *x;
  const auto at = [&](double v) {
    *x = v;
    return loss();
  };
  const double d1 = at(saved + kFdStep) - at(saved - kFdStep);
  const double d2 = at(saved + 2 * kFdStep) - at(saved - 2 * kFdStep);
  *x = saved;
  return (8 * d1 - d2) / (12 * kFdStep);
}

template <class Fn>
void expect_error(Fn&& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "no summa::Error thrown (expected one mentioning '" << *parts.begin() << "')";
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const auto& part : parts)
      EXPECT_NE(what.find(part), std::string::npos)
          << "message '" << what << "' lacks '" << part << "'";
  }
}

// ---------------------------------------------------------------- gradients

TEST(ReferenceGpt, EveryParameterGradientMatchesFiniteDifferences) {
  const auto start = std::chrono::steady_clock::now();
  const GptConfig config = tiny_config();
  const index_t batch = 2, seq = 5;
  std::mt19937_64 gen(fresh_seed());
  Gpt<double> model(config, 1);
  set_weights(model, random_weights(config, gen));
  auto tokens = random_ids(batch * seq, config.vocab_size, gen);
  const auto targets = random_ids(batch * seq, config.vocab_size, gen);
  tokens[7] = tokens[1];  // a repeated token: two gathered rows summed into one wte row

  model.forward(tokens, targets, batch, seq);
  model.backward();
  const std::vector<double> analytic(model.grads().begin(), model.grads().end());
  const auto loss = [&] { return model.forward(tokens, targets, batch, seq); };

  index_t checked = 0;
  double worst_overall = 0, worst_norm = 0;
  std::size_t offset = 0;
  for (const auto& p : model.parameter_info()) {
    auto values = model.param(p.name);
    double worst = 0, err2 = 0, ref2 = 0;
    index_t worst_k = -1;
    for (index_t k = 0; k < p.size(); ++k) {  // every entry of every tensor
      const double a = analytic[offset + static_cast<std::size_t>(k)];
      const double fd = central_difference(&values[static_cast<std::size_t>(k)], loss);
      err2 += (a - fd) * (a - fd);
      ref2 += fd * fd;
      if (fd_ratio(a, fd) > worst) {
        worst = fd_ratio(a, fd);
        worst_k = k;
      }
      ++checked;
    }
    EXPECT_LT(worst, 1.0) << p.name << " entry " << worst_k << ": analytic "
                          << analytic[offset + static_cast<std::size_t>(worst_k)];
    // The gradient is not trivially zero and matches as a whole.
    EXPECT_GT(ref2, 1e-12) << p.name;
    EXPECT_LT(std::sqrt(err2 / ref2), 1e-7) << p.name;
    worst_overall = std::max(worst_overall, worst);
    worst_norm = std::max(worst_norm, std::sqrt(err2 / ref2));
    offset += static_cast<std::size_t>(p.size());
  }
  EXPECT_EQ(checked, model.num_parameters());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "[          ] %lld entries by finite differences in %.2f s: worst error / bound %.3g, "
      "worst per-tensor relative norm error %.3g\n",
      static_cast<long long>(checked), seconds, worst_overall, worst_norm);
}

// wte's gradient = embedding gather + tied LM head. The FD check must reject
// the gather part alone (what a missing head contribution would give), and
// forward_embeddings isolates the head part (the gather is not in the graph).
TEST(ReferenceGpt, TiedHeadContributesToWteAndTheCheckSeesIt) {
  const GptConfig config = tiny_config();
  const index_t batch = 2, seq = 5;
  std::mt19937_64 gen(fresh_seed());
  Gpt<double> model(config, 2);
  set_weights(model, random_weights(config, gen));
  const auto tokens = random_ids(batch * seq, config.vocab_size, gen);
  const auto targets = random_ids(batch * seq, config.vocab_size, gen);

  const double loss = model.forward(tokens, targets, batch, seq);
  model.backward();
  const std::vector<double> full(model.grad("wte.weight").begin(), model.grad("wte.weight").end());
  const std::vector<double> emb(model.activation("embeddings").begin(),
                                model.activation("embeddings").end());
  const std::vector<double> d_emb(model.input_grad().begin(), model.input_grad().end());

  EXPECT_DOUBLE_EQ(model.forward_embeddings(emb, targets, batch, seq), loss);
  model.backward();
  const std::vector<double> head(model.grad("wte.weight").begin(), model.grad("wte.weight").end());
  for (double g : model.grad("wpe.weight")) EXPECT_EQ(g, 0.0);  // wpe is not in the graph
  // Same input embeddings, same input gradient.
  for (std::size_t k = 0; k < d_emb.size(); ++k)
    EXPECT_NEAR(model.input_grad()[k], d_emb[k], 1e-14);

  const auto fd_loss = [&] { return model.forward(tokens, targets, batch, seq); };
  auto wte = model.param("wte.weight");
  double worst_full = 0, worst_gather_only = 0, head_norm = 0;
  for (std::size_t k = 0; k < wte.size(); ++k) {
    const double fd = central_difference(&wte[k], fd_loss);
    worst_full = std::max(worst_full, fd_ratio(full[k], fd));
    worst_gather_only = std::max(worst_gather_only, fd_ratio(full[k] - head[k], fd));
    head_norm += head[k] * head[k];
  }
  EXPECT_LT(worst_full, 1.0);
  EXPECT_GT(worst_gather_only, 1e3) << "the check cannot see a missing tied-head gradient";
  EXPECT_GT(std::sqrt(head_norm), 1e-3);
}

TEST(ReferenceGpt, InputEmbeddingGradientMatchesFiniteDifferences) {
  const GptConfig config = tiny_config();
  const index_t batch = 2, seq = 5, h = config.n_embd;
  std::mt19937_64 gen(fresh_seed());
  Gpt<double> model(config, 3);
  set_weights(model, random_weights(config, gen));
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> emb(static_cast<std::size_t>(batch * seq * h));
  for (auto& e : emb) e = u(gen);
  const auto targets = random_ids(batch * seq, config.vocab_size, gen);

  model.forward_embeddings(emb, targets, batch, seq);
  model.backward();
  const std::vector<double> analytic(model.input_grad().begin(), model.input_grad().end());
  ASSERT_EQ(analytic.size(), emb.size());
  const auto loss = [&] { return model.forward_embeddings(emb, targets, batch, seq); };
  double worst = 0;
  for (std::size_t k = 0; k < emb.size(); ++k)
    worst = std::max(worst, fd_ratio(analytic[k], central_difference(&emb[k], loss)));
  EXPECT_LT(worst, 1.0);
}

// Block i of an n-layer model is block 0 of a one-layer model with the same
// weights: feeding it block i's input reproduces the loss tail, and its input
// gradient is the n-layer model's activation_grad of block i-1's output.
TEST(ReferenceGpt, LayersComposeAndActivationGradientsAgree) {
  const GptConfig config = tiny_config();
  const index_t batch = 2, seq = 5;
  std::mt19937_64 gen(fresh_seed());
  Gpt<double> model(config, 4);
  set_weights(model, random_weights(config, gen));
  const auto tokens = random_ids(batch * seq, config.vocab_size, gen);
  const auto targets = random_ids(batch * seq, config.vocab_size, gen);
  const double loss = model.forward(tokens, targets, batch, seq);
  model.backward();

  GptConfig one = config;
  one.n_layer = 1;
  Gpt<double> tail(one, 5);
  for (const auto& p : tail.parameter_info()) {
    std::string source = p.name;
    if (source.starts_with("h.0.")) source = "h.1." + source.substr(4);
    const auto from = model.param(source);
    std::copy(from.begin(), from.end(), tail.param(p.name).begin());
  }
  const auto h0 = model.activation("h.0.output");
  EXPECT_NEAR(tail.forward_embeddings(h0, targets, batch, seq), loss, 1e-13);
  tail.backward();
  const auto want = model.activation_grad("h.0.output");
  for (std::size_t k = 0; k < want.size(); ++k) EXPECT_NEAR(tail.input_grad()[k], want[k], 1e-15);
  const auto out = tail.activation("h.0.output"), ref = model.activation("h.1.output");
  for (std::size_t k = 0; k < out.size(); ++k) EXPECT_NEAR(out[k], ref[k], 1e-14);
  for (const char* name : {"h.0.attn.c_attn.weight", "h.0.mlp.c_fc.bias", "ln_f.weight"}) {
    std::string source = name;
    if (source.starts_with("h.0.")) source = "h.1." + source.substr(4);
    const auto g = tail.grad(name), ref_g = model.grad(source);
    for (std::size_t k = 0; k < g.size(); ++k) EXPECT_NEAR(g[k], ref_g[k], 1e-14) << name;
  }
  // d logits = (softmax - onehot) / (batch * seq)
  const auto logits = model.logits(), dlogits = model.activation_grad("logits");
  const index_t v = config.vocab_size;
  for (index_t r = 0; r < batch * seq; ++r) {
    double m = -1e300, s = 0;
    for (index_t c = 0; c < v; ++c) m = std::max(m, logits[static_cast<std::size_t>(r * v + c)]);
    for (index_t c = 0; c < v; ++c) s += std::exp(logits[static_cast<std::size_t>(r * v + c)] - m);
    for (index_t c = 0; c < v; ++c) {
      const double p = std::exp(logits[static_cast<std::size_t>(r * v + c)] - m) / s;
      const double want_d = (p - (c == targets[static_cast<std::size_t>(r)] ? 1.0 : 0.0)) /
                            static_cast<double>(batch * seq);
      EXPECT_NEAR(dlogits[static_cast<std::size_t>(r * v + c)], want_d, 1e-15);
    }
  }
}

// ---------------------------------------------------------------- activation gradients
//
// activation_grad() for the activations inside a block. An activation cannot
// be perturbed on its own, so every one is checked by the identity that ties
// it to its consumer's gradient, recomputed here with plain loops written
// independently of the implementation (LayerNorm through its explicit
// Jacobian, the attention backward from its definition):
//   d(mlp.c_proj) = d(output),  d(attn.c_proj) = d(mid)           (bitwise)
//   d(mlp.gelu) = d(mlp.c_proj)·W_c_projᵀ,  d(mlp.c_fc) = d(mlp.gelu)∘gelu'(c_fc),
//   d(ln_2) = d(mlp.c_fc)·W_c_fcᵀ,  d(mid) = d(output) + J_LN2(mid)ᵀ·d(ln_2),
//   d(attn.context) = d(attn.c_proj)·W_projᵀ,  d(attn.probs) = dC·Vᵀ,
//   d(attn.c_attn) = [dS·K | dSᵀ·Q | Pᵀ·dC] with dS the softmax backward,
//   d(ln_1) = d(attn.c_attn)·W_c_attnᵀ,  d(block input) = d(mid) + J_LN1(x)ᵀ·d(ln_1),
//   d(ln_f) = d(logits)·wte,  d(last output) = J_LNf(out)ᵀ·d(ln_f).
// Walking the chain from d(logits) (checked exactly in the test above) down
// to d(embeddings) (checked by finite differences) pins every link. Each
// identity must hold to max|a − b| <= 1e-12·max|b|: both sides are the same
// double arithmetic in another order (sums of <= 32 terms of magnitude <= 1,
// rounding ~1e-16 relative; observed <= 5e-16), so the margin is > 1000, while a wrong
// factor or a missing path (e.g. d(mid) without the ln_2 part, which the test
// shows is O(1) relative) fails by orders of magnitude.
// Finally, every bias and LayerNorm-weight gradient, by finite differences of
// the loss (same stencil and bound as above), must equal the column sums of
// the matching activation gradient (weighted by x̂ for LayerNorm weights):
// an end-to-end check of d(attn.c_attn), d(attn.c_proj), d(ln_1), d(ln_2),
// d(mlp.c_fc) and d(mlp.c_proj) against the loss itself.

using Vec = std::vector<double>;

Vec to_vec(std::span<const double> s) {
  return Vec(s.begin(), s.end());
}

// c[n, m] = a[n, k] · b, b stored [k, m] or (transpose_b) [m, k].
Vec matmul(const Vec& a, std::span<const double> b, index_t n, index_t k, index_t m,
           bool transpose_b) {
  Vec c(static_cast<std::size_t>(n * m), 0.0);
  for (index_t r = 0; r < n; ++r)
    for (index_t j = 0; j < m; ++j) {
      double s = 0;
      for (index_t l = 0; l < k; ++l)
        s += a[static_cast<std::size_t>(r * k + l)] *
             b[static_cast<std::size_t>(transpose_b ? j * k + l : l * m + j)];
      c[static_cast<std::size_t>(r * m + j)] = s;
    }
  return c;
}

// Row-wise J_LN(x)ᵀ·dy from the explicit Jacobian of y = x̂∘g + b:
//   ∂y_j/∂x_k = g_j·rstd·(δ_jk − 1/h − x̂_j·x̂_k/h).
Vec layernorm_vjp(const Vec& x, std::span<const double> g, const Vec& dy, index_t n, index_t h,
                  double eps) {
  Vec dx(x.size(), 0.0);
  Vec xhat(static_cast<std::size_t>(h));
  for (index_t r = 0; r < n; ++r) {
    const double* xr = x.data() + r * h;
    double mean = 0, var = 0;
    for (index_t k = 0; k < h; ++k) mean += xr[k] / static_cast<double>(h);
    for (index_t k = 0; k < h; ++k) var += (xr[k] - mean) * (xr[k] - mean) / static_cast<double>(h);
    const double rstd = 1.0 / std::sqrt(var + eps);
    for (index_t k = 0; k < h; ++k) xhat[static_cast<std::size_t>(k)] = (xr[k] - mean) * rstd;
    for (index_t k = 0; k < h; ++k) {
      double s = 0;
      for (index_t j = 0; j < h; ++j) {
        const double jac = g[static_cast<std::size_t>(j)] * rstd *
                           ((j == k ? 1.0 : 0.0) - 1.0 / static_cast<double>(h) -
                            xhat[static_cast<std::size_t>(j)] * xhat[static_cast<std::size_t>(k)] /
                                static_cast<double>(h));
        s += jac * dy[static_cast<std::size_t>(r * h + j)];
      }
      dx[static_cast<std::size_t>(r * h + k)] = s;
    }
  }
  return dx;
}

// d/dx of 0.5·x·(1 + tanh(c·(x + a·x³))), with sech² = 1 / cosh².
double gelu_derivative(double x) {
  const double c = std::sqrt(2.0 / 3.14159265358979323846), a = 0.044715;
  const double u = c * (x + a * x * x * x);
  const double sech = 1.0 / std::cosh(u);
  return 0.5 * (1.0 + std::tanh(u)) + 0.5 * x * sech * sech * c * (1.0 + 3.0 * a * x * x);
}

Vec plus(const Vec& a, const Vec& b) {
  Vec c(a.size());
  for (std::size_t k = 0; k < a.size(); ++k) c[k] = a[k] + b[k];
  return c;
}

// max|a − b| / max|b|; the bound for the identities below.
constexpr double kIdentityTol = 1e-12;
double rel_err(const Vec& a, const Vec& b) {
  EXPECT_EQ(a.size(), b.size());
  double err = 0, ref = 0;
  for (std::size_t k = 0; k < a.size() && k < b.size(); ++k) {
    err = std::max(err, std::abs(a[k] - b[k]));
    ref = std::max(ref, std::abs(b[k]));
  }
  EXPECT_GT(ref, 0.0);
  return err / ref;
}

TEST(ReferenceGpt, BlockActivationGradientsSatisfyTheChainRule) {
  const GptConfig config = tiny_config();
  const index_t batch = 2, seq = 4, n = batch * seq, h = config.n_embd, v = config.vocab_size;
  const index_t heads = config.n_head, d = config.n_embd / config.n_head;
  const double eps = config.layer_norm_epsilon, scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::mt19937_64 gen(fresh_seed());
  Gpt<double> model(config, 12);
  set_weights(model, random_weights(config, gen));
  const auto tokens = random_ids(static_cast<std::size_t>(n), v, gen);
  const auto targets = random_ids(static_cast<std::size_t>(n), v, gen);
  model.forward(tokens, targets, batch, seq);
  model.backward();
  const auto act = [&](const std::string& name) { return to_vec(model.activation(name)); };
  const auto grad = [&](const std::string& name) { return to_vec(model.activation_grad(name)); };

  // Every activation has a gradient of its shape.
  for (const auto& a : model.activation_info())
    EXPECT_EQ(model.activation_grad(a.name).size(), model.activation(a.name).size()) << a.name;

  // Top: d(ln_f) = d(logits)·wte, d(last output) through ln_f.
  const std::string last = fmt_layer(config.n_layer - 1);
  EXPECT_LT(
      rel_err(grad("ln_f"), matmul(grad("logits"), model.param("wte.weight"), n, v, h, false)),
      kIdentityTol);
  EXPECT_LT(
      rel_err(grad(last + "output"), layernorm_vjp(act(last + "output"), model.param("ln_f.weight"),
                                                   grad("ln_f"), n, h, eps)),
      kIdentityTol);

  for (int i = config.n_layer - 1; i >= 0; --i) {
    const std::string pre = fmt_layer(i);
    SCOPED_TRACE(pre);
    const auto W = [&](const char* suffix) { return model.param(pre + suffix); };
    const Vec d_out = grad(pre + "output"), d_mid = grad(pre + "mid");

    // Residual adds pass the gradient on unchanged.
    EXPECT_EQ(grad(pre + "mlp.c_proj"), d_out);
    EXPECT_EQ(grad(pre + "attn.c_proj"), d_mid);

    // MLP.
    const Vec d_gelu = grad(pre + "mlp.gelu"), d_fc = grad(pre + "mlp.c_fc");
    EXPECT_LT(rel_err(d_gelu, matmul(d_out, W("mlp.c_proj.weight"), n, h, 4 * h, true)),
              kIdentityTol);
    const Vec fc = act(pre + "mlp.c_fc");
    Vec want_fc(fc.size());
    for (std::size_t k = 0; k < fc.size(); ++k) want_fc[k] = d_gelu[k] * gelu_derivative(fc[k]);
    EXPECT_LT(rel_err(d_fc, want_fc), kIdentityTol);
    EXPECT_GT(rel_err(d_gelu, d_fc), 1e-2);  // GeLU' is far from 1: the check sees the step
    const Vec d_ln2 = grad(pre + "ln_2");
    EXPECT_LT(rel_err(d_ln2, matmul(d_fc, W("mlp.c_fc.weight"), n, 4 * h, h, true)), kIdentityTol);
    const Vec through_ln2 = layernorm_vjp(act(pre + "mid"), W("ln_2.weight"), d_ln2, n, h, eps);
    EXPECT_LT(rel_err(d_mid, plus(d_out, through_ln2)), kIdentityTol);
    EXPECT_GT(rel_err(d_out, d_mid), 1e-3) << "the ln_2 path carries no signal";

    // Attention.
    const Vec d_ctx = grad(pre + "attn.context");
    EXPECT_LT(rel_err(d_ctx, matmul(d_mid, W("attn.c_proj.weight"), n, h, h, true)), kIdentityTol);
    const Vec qkv = act(pre + "attn.c_attn"), probs = act(pre + "attn.probs");
    Vec want_dp(probs.size()), want_qkv(qkv.size(), 0.0);
    bool upper_nonzero = false;
    for (index_t b = 0; b < batch; ++b)
      for (index_t j = 0; j < heads; ++j) {
        // element (row t of sequence b, column e of head j) of Q (part 0), K, V
        const auto at = [&](index_t part, index_t t, index_t e) {
          return static_cast<std::size_t>((b * seq + t) * 3 * h + part * h + j * d + e);
        };
        const auto dc = [&](index_t t, index_t e) {
          return d_ctx[static_cast<std::size_t>((b * seq + t) * h + j * d + e)];
        };
        const auto p_at = [&](index_t r, index_t c) {
          return static_cast<std::size_t>(((b * heads + j) * seq + r) * seq + c);
        };
        for (index_t r = 0; r < seq; ++r)
          for (index_t c = 0; c < seq; ++c) {
            double s = 0;
            for (index_t e = 0; e < d; ++e) s += dc(r, e) * qkv[at(2, c, e)];
            want_dp[p_at(r, c)] = s;
          }
        for (index_t r = 0; r < seq; ++r) {
          double dot = 0;
          for (index_t c = 0; c <= r; ++c) dot += probs[p_at(r, c)] * want_dp[p_at(r, c)];
          for (index_t c = 0; c <= r; ++c) {
            const double ds = probs[p_at(r, c)] * (want_dp[p_at(r, c)] - dot) * scale;
            for (index_t e = 0; e < d; ++e) {
              want_qkv[at(0, r, e)] += ds * qkv[at(1, c, e)];         // dQ = dS·K
              want_qkv[at(1, c, e)] += ds * qkv[at(0, r, e)];         // dK = dSᵀ·Q
              want_qkv[at(2, c, e)] += probs[p_at(r, c)] * dc(r, e);  // dV = Pᵀ·dC
            }
          }
        }
        upper_nonzero = upper_nonzero || want_dp[p_at(0, 1)] != 0.0;
      }
    EXPECT_LT(rel_err(grad(pre + "attn.probs"), want_dp), kIdentityTol);
    EXPECT_TRUE(upper_nonzero);  // dL/dP is dC·Vᵀ above the diagonal too
    const Vec d_qkv = grad(pre + "attn.c_attn");
    EXPECT_LT(rel_err(d_qkv, want_qkv), kIdentityTol);
    const Vec d_ln1 = grad(pre + "ln_1");
    EXPECT_LT(rel_err(d_ln1, matmul(d_qkv, W("attn.c_attn.weight"), n, 3 * h, h, true)),
              kIdentityTol);
    const std::string input = i == 0 ? "embeddings" : fmt_layer(i - 1) + "output";
    const Vec through_ln1 = layernorm_vjp(act(input), W("ln_1.weight"), d_ln1, n, h, eps);
    EXPECT_LT(rel_err(grad(input), plus(d_mid, through_ln1)), kIdentityTol);
  }
}

// Σ_rows of an activation gradient (weighted by x̂ = (y − b)/g for a
// LayerNorm weight) is a parameter gradient; both must match finite
// differences of the loss.
TEST(ReferenceGpt, ActivationGradientColumnSumsMatchFiniteDifferences) {
  const GptConfig config = tiny_config();
  const index_t batch = 2, seq = 4, n = batch * seq, v = config.vocab_size;
  std::mt19937_64 gen(fresh_seed());
  Gpt<double> model(config, 13);
  set_weights(model, random_weights(config, gen));
  const auto tokens = random_ids(static_cast<std::size_t>(n), v, gen);
  const auto targets = random_ids(static_cast<std::size_t>(n), v, gen);
  model.forward(tokens, targets, batch, seq);
  model.backward();
  const auto loss = [&] { return model.forward(tokens, targets, batch, seq); };

  struct Case {
    std::string param, activation;
    bool ln_weight;
  };
  std::vector<Case> cases;
  for (int i = 0; i < config.n_layer; ++i) {
    const std::string pre = fmt_layer(i);
    cases.push_back({pre + "ln_1.weight", pre + "ln_1", true});
    cases.push_back({pre + "ln_1.bias", pre + "ln_1", false});
    cases.push_back({pre + "attn.c_attn.bias", pre + "attn.c_attn", false});
    cases.push_back({pre + "attn.c_proj.bias", pre + "attn.c_proj", false});
    cases.push_back({pre + "ln_2.weight", pre + "ln_2", true});
    cases.push_back({pre + "ln_2.bias", pre + "ln_2", false});
    cases.push_back({pre + "mlp.c_fc.bias", pre + "mlp.c_fc", false});
    cases.push_back({pre + "mlp.c_proj.bias", pre + "mlp.c_proj", false});
  }
  // Column sums first: the finite differences below run new forward passes.
  std::vector<Vec> sums;
  for (const Case& c : cases) {
    const Vec dy = to_vec(model.activation_grad(c.activation));
    const Vec y = to_vec(model.activation(c.activation));
    const index_t m = static_cast<index_t>(dy.size()) / n;
    Vec sum(static_cast<std::size_t>(m), 0.0);
    for (index_t r = 0; r < n; ++r)
      for (index_t k = 0; k < m; ++k) {
        const auto e = static_cast<std::size_t>(r * m + k);
        double weight = 1.0;
        if (c.ln_weight) {
          const std::string base = c.param.substr(0, c.param.size() - std::string("weight").size());
          weight = (y[e] - model.param(base + "bias")[static_cast<std::size_t>(k)]) /
                   model.param(c.param)[static_cast<std::size_t>(k)];
        }
        sum[static_cast<std::size_t>(k)] += dy[e] * weight;
      }
    sums.push_back(std::move(sum));
  }
  for (std::size_t q = 0; q < cases.size(); ++q) {
    auto values = model.param(cases[q].param);
    ASSERT_EQ(values.size(), sums[q].size()) << cases[q].param;
    double worst = 0, norm = 0;
    for (std::size_t k = 0; k < values.size(); ++k) {
      const double fd = central_difference(&values[k], loss);
      worst = std::max(worst, fd_ratio(sums[q][k], fd));
      norm += fd * fd;
    }
    EXPECT_LT(worst, 1.0) << cases[q].param << " vs column sums of " << cases[q].activation;
    EXPECT_GT(std::sqrt(norm), 1e-6) << cases[q].param;
  }
}

TEST(ReferenceGpt, ActivationGradientErrors) {
  const GptConfig config = tiny_config();
  std::mt19937_64 gen(fresh_seed());
  Gpt<float> model(config, 14);
  const auto tokens = random_ids(10, config.vocab_size, gen);
  const auto targets = random_ids(10, config.vocab_size, gen);
  expect_error([&] { (void)model.activation_grad("h.0.mid"); }, {"'h.0.mid'", "no backward"});
  model.forward(tokens, targets, 2, 5);
  expect_error([&] { (void)model.activation_grad("h.0.mid"); }, {"'h.0.mid'", "no backward"});
  model.backward();
  for (const auto& a : model.activation_info())
    EXPECT_EQ(model.activation_grad(a.name).size(), model.activation(a.name).size()) << a.name;
  for (const char* bad :
       {"h.2.mid", "h.0.attn", "h.00.ln_1", "h.0.ln_1.weight", "mid", "h.-1.mid", "wte.weight", ""})
    expect_error([&] { (void)model.activation_grad(bad); },
                 {std::string("'").append(bad).append("'"), "n_layer=2", "h.{i}.", "attn.probs",
                  "mlp.gelu"});
  // A new forward pass invalidates the gradients until the next backward.
  model.forward(tokens, targets, 2, 5);
  expect_error([&] { (void)model.activation_grad("logits"); }, {"no backward"});
}

// ---------------------------------------------------------------- forward

TEST(ReferenceGpt, LossAtInitIsLogVocab) {
  const GptConfig config{
      .n_layer = 2, .n_head = 4, .n_embd = 32, .n_positions = 16, .vocab_size = 50};
  const index_t batch = 4, seq = 16;
  std::mt19937_64 gen(fresh_seed());
  Gpt<double> model(config, gen());
  const auto tokens = random_ids(batch * seq, config.vocab_size, gen);
  const auto targets = random_ids(batch * seq, config.vocab_size, gen);
  const double loss = model.forward(tokens, targets, batch, seq);
  // logits ~ N(0, 0.02² · n_embd), sd ≈ 0.11: the expected excess over log V
  // is ~ var/2 ≈ 0.006. The mean target logit fluctuates with the random wte
  // rows (50 of them): sd ≈ 0.11/√50 ≈ 0.016, plus the token sampling; 0.1
  // is over 5 sd (0.05 failed about once in 700 fresh seeds).
  EXPECT_NEAR(loss, std::log(50.0), 0.1);
  double biggest = 0;
  for (double l : model.logits()) biggest = std::max(biggest, std::abs(l));
  EXPECT_LT(biggest, 1.0);
  EXPECT_EQ(model.logits().size(), static_cast<std::size_t>(batch * seq * config.vocab_size));
  EXPECT_EQ(model.loss(), loss);
}

TEST(ReferenceGpt, CausalMaskAndIndependentSequences) {
  const GptConfig config = tiny_config();
  const index_t batch = 2, seq = 7, v = config.vocab_size;
  std::mt19937_64 gen(fresh_seed());
  Gpt<double> model(config, 6);
  set_weights(model, random_weights(config, gen));
  auto tokens = random_ids(batch * seq, v, gen);
  auto targets = random_ids(batch * seq, v, gen);
  const double loss0 = model.forward(tokens, targets, batch, seq);
  const std::vector<double> before(model.logits().begin(), model.logits().end());

  // Attention probabilities: causal and normalised.
  const auto probs = model.activation("h.1.attn.probs");
  ASSERT_EQ(probs.size(), static_cast<std::size_t>(batch * config.n_head * seq * seq));
  for (index_t m = 0; m < batch * config.n_head; ++m)
    for (index_t r = 0; r < seq; ++r) {
      double sum = 0;
      for (index_t c = 0; c < seq; ++c) {
        const double p = probs[static_cast<std::size_t>((m * seq + r) * seq + c)];
        if (c > r) {
          EXPECT_EQ(p, 0.0);
        }
        sum += p;
      }
      EXPECT_NEAR(sum, 1.0, 1e-14);
    }

  const index_t t = 3;  // change the token at (sequence 0, position 3)
  tokens[static_cast<std::size_t>(t)] = (tokens[static_cast<std::size_t>(t)] + 1) % v;
  model.forward(tokens, targets, batch, seq);
  const auto after = model.logits();
  double earlier = 0, later = 0, other_sequence = 0;
  for (index_t pos = 0; pos < seq; ++pos)
    for (index_t c = 0; c < v; ++c) {
      const auto k0 = static_cast<std::size_t>(pos * v + c),
                 k1 = k0 + static_cast<std::size_t>(seq * v);
      double& worst = pos < t ? earlier : later;
      worst = std::max(worst, std::abs(after[k0] - before[k0]));
      other_sequence = std::max(other_sequence, std::abs(after[k1] - before[k1]));
    }
  EXPECT_LT(earlier, 1e-14) << "a later token changed logits at earlier positions";
  EXPECT_LT(other_sequence, 1e-14) << "sequences of the batch are not independent";
  EXPECT_GT(later, 1e-6);

  // Targets change the loss, not the logits.
  tokens[static_cast<std::size_t>(t)] = (tokens[static_cast<std::size_t>(t)] + v - 1) % v;
  targets[0] = (targets[0] + 1) % v;
  const double loss1 = model.forward(tokens, targets, batch, seq);
  for (std::size_t k = 0; k < before.size(); ++k) EXPECT_EQ(model.logits()[k], before[k]);
  EXPECT_NE(loss1, loss0);
}

TEST(ReferenceGpt, FloatAgreesWithDouble) {
  const GptConfig config{
      .n_layer = 2, .n_head = 4, .n_embd = 16, .n_positions = 12, .vocab_size = 29};
  const index_t batch = 3, seq = 12;
  std::mt19937_64 gen(fresh_seed());
  const auto w = random_weights(config, gen);
  Gpt<double> d(config, 0);
  Gpt<float> f(config, 0);
  set_weights(d, w);
  set_weights(f, w);
  const auto tokens = random_ids(batch * seq, config.vocab_size, gen);
  const auto targets = random_ids(batch * seq, config.vocab_size, gen);
  const double ld = d.forward(tokens, targets, batch, seq);
  const double lf = f.forward(tokens, targets, batch, seq);
  EXPECT_NEAR(lf, ld, 2e-5 * ld);
  double logit_err = 0, logit_max = 0;
  for (std::size_t k = 0; k < d.logits().size(); ++k) {
    logit_err = std::max(logit_err, std::abs(double(f.logits()[k]) - d.logits()[k]));
    logit_max = std::max(logit_max, std::abs(d.logits()[k]));
  }
  EXPECT_LT(logit_err, 1e-5 * std::max(1.0, logit_max));

  d.backward();
  f.backward();
  for (const auto& p : d.parameter_info()) {
    const auto gd = d.grad(p.name);
    const auto gf = f.grad(p.name);
    double err2 = 0, ref2 = 0;
    for (std::size_t k = 0; k < gd.size(); ++k) {
      err2 += (double(gf[k]) - gd[k]) * (double(gf[k]) - gd[k]);
      ref2 += gd[k] * gd[k];
    }
    EXPECT_LT(std::sqrt(err2 / ref2), 1e-4) << p.name;
  }
}

TEST(ReferenceGpt, BackwardOverwritesGradients) {
  const GptConfig config = tiny_config();
  std::mt19937_64 gen(fresh_seed());
  Gpt<double> model(config, 7);
  const auto tokens = random_ids(10, config.vocab_size, gen);
  const auto targets = random_ids(10, config.vocab_size, gen);
  model.forward(tokens, targets, 2, 5);
  model.backward();
  const std::vector<double> once(model.grads().begin(), model.grads().end());
  model.backward();
  for (std::size_t k = 0; k < once.size(); ++k) ASSERT_EQ(model.grads()[k], once[k]);
  // Copies are deep and independent.
  Gpt<double> copy = model;
  copy.param("wte.weight")[0] += 1.0;
  EXPECT_NE(copy.param("wte.weight")[0], model.param("wte.weight")[0]);
  EXPECT_EQ(copy.logits().size(), model.logits().size());
}

TEST(ReferenceGpt, ActivationsAreListedWithTheirShapes) {
  const GptConfig config = tiny_config();
  std::mt19937_64 gen(fresh_seed());
  Gpt<float> model(config, 8);
  model.forward(random_ids(10, config.vocab_size, gen), random_ids(10, config.vocab_size, gen), 2,
                5);
  const std::vector<ActivationInfo> list = model.activation_info();
  EXPECT_EQ(list.size(), static_cast<std::size_t>(3 + 11 * config.n_layer));
  for (const auto& a : list) {
    index_t size = 1;
    for (index_t dim : a.shape) size *= dim;
    EXPECT_EQ(model.activation(a.name).size(), static_cast<std::size_t>(size)) << a.name;
  }
  expect_error([&] { (void)model.activation("h.2.ln_1"); }, {"'h.2.ln_1'"});
  expect_error([&] { (void)model.activation_grad("h.0.output"); }, {"no backward"});
}

// ---------------------------------------------------------------- parameters and init

TEST(ReferenceGpt, ParameterListAndCount) {
  const GptConfig config = tiny_config();
  const auto list = parameter_list(config);
  ASSERT_EQ(list.size(), 4u + 12u * 2u);
  EXPECT_EQ(list[0].name, "wte.weight");
  EXPECT_EQ(list[0].shape, (std::vector<index_t>{11, 8}));
  EXPECT_EQ(list[1].name, "wpe.weight");
  EXPECT_EQ(list[2].name, "h.0.ln_1.weight");
  EXPECT_EQ(list[4].name, "h.0.attn.c_attn.weight");
  EXPECT_EQ(list[4].shape, (std::vector<index_t>{8, 24}));
  EXPECT_EQ(list[5].shape, (std::vector<index_t>{24}));
  EXPECT_EQ(list[12].name, "h.0.mlp.c_proj.weight");
  EXPECT_EQ(list[12].shape, (std::vector<index_t>{32, 8}));
  EXPECT_EQ(list[14].name, "h.1.ln_1.weight");
  EXPECT_EQ(list.back().name, "ln_f.bias");
  // GPT-2 small (124M, tied head) has 124,439,808 parameters.
  const GptConfig gpt2{
      .n_layer = 12, .n_head = 12, .n_embd = 768, .n_positions = 1024, .vocab_size = 50257};
  EXPECT_EQ(parameter_count(gpt2), 124439808);

  Gpt<double> model(config, 9);
  EXPECT_EQ(model.num_parameters(), parameter_count(config));
  const auto view = model.param_matrix("h.1.mlp.c_fc.weight");
  EXPECT_EQ(view.rows, 8);
  EXPECT_EQ(view.cols, 32);
  EXPECT_EQ(&view(1, 2), &model.param("h.1.mlp.c_fc.weight")[34]);
  EXPECT_EQ(model.grad_matrix("ln_f.bias").rows, 1);
}

TEST(ReferenceGpt, InitIsAPureFunctionOfSeedNameAndIndex) {
  const GptConfig config = tiny_config();
  std::mt19937_64 gen(fresh_seed());
  const std::uint64_t seed = gen();
  Gpt<double> d(config, seed);
  Gpt<float> f(config, seed);
  for (const auto& p : d.parameter_info()) {
    const auto vd = d.param(p.name);
    const auto vf = f.param(p.name);
    for (index_t k = 0; k < p.size(); ++k) {
      const double want = init_value(seed, p.name, k, config);
      ASSERT_EQ(vd[static_cast<std::size_t>(k)], want) << p.name << " " << k;
      ASSERT_EQ(vf[static_cast<std::size_t>(k)], static_cast<float>(want)) << p.name << " " << k;
    }
  }
  // GPT-2 kinds.
  for (float x : f.param("h.1.ln_2.weight")) EXPECT_EQ(x, 1.0f);
  for (float x : f.param("ln_f.bias")) EXPECT_EQ(x, 0.0f);
  for (float x : f.param("h.0.mlp.c_fc.bias")) EXPECT_EQ(x, 0.0f);
  EXPECT_EQ(init_value(seed, "h.1.attn.c_proj.weight", 5, config),
            0.02 / std::sqrt(4.0) * init_normal(seed, "h.1.attn.c_proj.weight", 5));
  EXPECT_EQ(init_value(seed, "wpe.weight", 5, config), 0.02 * init_normal(seed, "wpe.weight", 5));

  // A 2x2 mesh of shards, each generated on its own, is the global tensor.
  const std::string name = "h.1.attn.c_attn.weight";  // [8, 24]
  const auto full = d.param_matrix(name);
  for (index_t bi = 0; bi < 2; ++bi)
    for (index_t bj = 0; bj < 2; ++bj) {
      Block<double> shard(4, 12, bj == 0 ? Order::col_major : Order::row_major, 3);
      init_fill_block(seed, name, 4 * bi, 12 * bj, shard.view(), config);
      for (index_t i = 0; i < 4; ++i)
        for (index_t j = 0; j < 12; ++j)
          EXPECT_EQ(shard.view()(i, j), full(4 * bi + i, 12 * bj + j));
    }
  // A 1-D tensor seen as one row, and a flat range.
  std::vector<float> range(7);
  init_fill<float>(seed, "wte.weight", 40, range, config);
  for (std::size_t k = 0; k < range.size(); ++k) EXPECT_EQ(range[k], f.param("wte.weight")[40 + k]);

  // Different seeds, different names: different values.
  Gpt<double> other(config, seed + 1);
  const auto a = d.param("wte.weight"), b = other.param("wte.weight");
  const auto l0 = d.param("h.0.attn.c_attn.weight"), l1 = d.param("h.1.attn.c_attn.weight");
  for (std::size_t k = 0; k < a.size(); ++k) EXPECT_NE(a[k], b[k]);
  for (std::size_t k = 0; k < l0.size(); ++k) EXPECT_NE(l0[k], l1[k]);
  // Re-initialising reproduces the values.
  other.init(seed);
  for (std::size_t k = 0; k < a.size(); ++k) EXPECT_EQ(other.param("wte.weight")[k], a[k]);
}

TEST(ReferenceGpt, InitStatistics) {
  // The generator: moments and tails of N(0, 1) over 200k draws.
  const int n = 200000;
  double s1 = 0, s2 = 0, tail = 0;
  for (int k = 0; k < n; ++k) {
    const double z = init_normal(12345, "stats", static_cast<std::uint64_t>(k));
    s1 += z;
    s2 += z * z;
    tail += std::abs(z) > 2.0 ? 1.0 : 0.0;
  }
  EXPECT_NEAR(s1 / n, 0.0, 0.015);
  EXPECT_NEAR(s2 / n, 1.0, 0.015);
  EXPECT_NEAR(tail / n, 0.0455, 0.003);

  // Per-tensor standard deviations.
  const GptConfig config{
      .n_layer = 4, .n_head = 4, .n_embd = 64, .n_positions = 64, .vocab_size = 500};
  Gpt<double> model(config, 77);
  const auto sd = [&](const char* name) {
    double acc = 0;
    for (double x : model.param(name)) acc += x * x;
    return std::sqrt(acc / static_cast<double>(model.param(name).size()));
  };
  EXPECT_NEAR(sd("wte.weight"), 0.02, 0.02 * 0.03);
  EXPECT_NEAR(sd("h.2.mlp.c_fc.weight"), 0.02, 0.02 * 0.03);
  EXPECT_NEAR(sd("h.3.mlp.c_proj.weight"), 0.02 / std::sqrt(8.0), 0.02 / std::sqrt(8.0) * 0.03);
  EXPECT_NEAR(sd("h.0.attn.c_proj.weight"), 0.02 / std::sqrt(8.0), 0.02 / std::sqrt(8.0) * 0.05);

  // Pinned values: the generator is part of the checkpoint format.
  EXPECT_NEAR(init_normal(0, "wte", 0), -0.92824871141303988, 1e-14);
  EXPECT_NEAR(init_normal(0, "wte", 1), -0.36755066015238019, 1e-14);
  EXPECT_NEAR(init_normal(0, "wte", 2), 0.49396970766503479, 1e-14);
}

// ---------------------------------------------------------------- errors

TEST(ReferenceGpt, ConfigErrorsNameTheValues) {
  const GptConfig good = tiny_config();
  EXPECT_NO_THROW(good.validate());
  GptConfig c = good;
  c.n_layer = 0;
  expect_error([&] { c.validate(); }, {"n_layer=0"});
  c = good;
  c.n_head = -2;
  expect_error([&] { c.validate(); }, {"n_head=-2"});
  c = good;
  c.n_positions = 0;
  expect_error([&] { Gpt<double> m(c, 1); }, {"n_positions=0"});
  c = good;
  c.vocab_size = 0;
  expect_error([&] { (void)parameter_list(c); }, {"vocab_size=0"});
  c = good;
  c.n_embd = 100;
  c.n_head = 3;
  expect_error([&] { c.validate(); }, {"n_embd=100 not divisible by n_head=3"});
  c = good;
  c.layer_norm_epsilon = -1;
  expect_error([&] { c.validate(); }, {"layer_norm_epsilon=-1"});
  expect_error([] { GptConfig{}.validate(); }, {"=0"});
}

TEST(ReferenceGpt, ForwardErrorsNameTheValuesAndLeaveTheModelIntact) {
  const GptConfig config = tiny_config();
  std::mt19937_64 gen(fresh_seed());
  Gpt<double> model(config, 10);
  auto tokens = random_ids(10, config.vocab_size, gen);
  auto targets = random_ids(10, config.vocab_size, gen);
  const double loss = model.forward(tokens, targets, 2, 5);

  const auto long_ids = random_ids(18, config.vocab_size, gen);
  expect_error([&] { model.forward(long_ids, long_ids, 2, 9); }, {"seq=9", "n_positions=8"});
  expect_error([&] { model.forward(tokens, targets, 0, 5); }, {"empty batch", "batch=0"});
  expect_error([&] { model.forward({}, {}, 2, 0); }, {"empty batch", "seq=0"});
  const std::vector<std::int32_t> nine(tokens.begin(), tokens.begin() + 9);
  expect_error([&] { model.forward(tokens, nine, 2, 5); }, {"targets has 9", "tokens has 10"});
  expect_error([&] { model.forward(nine, nine, 2, 5); }, {"tokens has 9", "2*5 = 10"});
  auto bad = tokens;
  bad[8] = 11;  // sequence 1, position 3
  expect_error([&] { model.forward(bad, targets, 2, 5); },
               {"token id 11", "[1, 3]", "vocab_size=11"});
  bad[8] = -1;
  expect_error([&] { model.forward(bad, targets, 2, 5); }, {"token id -1", "[1, 3]"});
  expect_error([&] { model.forward(tokens, bad, 2, 5); }, {"target -1", "[1, 3]"});
  std::vector<double> emb(79);
  expect_error([&] { model.forward_embeddings(emb, targets, 2, 5); },
               {"embeddings has 79", "2*5*8 = 80"});

  // Nothing was modified by the failed calls.
  EXPECT_EQ(model.loss(), loss);
  EXPECT_EQ(model.forward(tokens, targets, 2, 5), loss);

  Gpt<double> fresh(config, 11);
  expect_error([&] { fresh.backward(); }, {"no forward"});
  expect_error([&] { (void)fresh.logits(); }, {"no forward"});
  expect_error([&] { (void)fresh.param("h.2.ln_1.weight"); }, {"'h.2.ln_1.weight'", "n_layer=2"});
  expect_error([&] { (void)fresh.grad("h.01.ln_1.weight"); }, {"'h.01.ln_1.weight'"});
  expect_error([&] { (void)init_value(1, "wte.weight", 88, config); },
               {"index 88", "wte.weight", "88 elements"});
  expect_error([&] { (void)init_value(1, "lm_head.weight", 0, config); }, {"'lm_head.weight'"});
  std::vector<double> out(5);
  expect_error([&] { init_fill<double>(1, "ln_f.bias", 4, out, config); }, {"[4, 9)", "ln_f.bias"});
  Block<double> block(3, 3, Order::col_major, 0);
  expect_error([&] { init_fill_block(1, "wte.weight", 9, 0, block.view(), config); },
               {"3x3 at (9, 0)", "11x8"});
}

}  // namespace
}  // namespace summa::test

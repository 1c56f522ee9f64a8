#include "summa/reference/gpt.hpp"

#include <fmt/format.h>

#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numbers>
#include <optional>
#include <tuple>
#include <utility>

#include "summa/core/error.hpp"

namespace summa::reference {

namespace {

// ---------------------------------------------------------------- parameter slots

// The per-block tensors in parameter_list() order (summa/model/config.hpp).
enum SlotIndex : std::size_t {
  kLn1W,
  kLn1B,
  kAttnW,
  kAttnB,
  kProjW,
  kProjB,
  kLn2W,
  kLn2B,
  kFcW,
  kFcB,
  kFc2W,
  kFc2B
};
constexpr std::size_t kPerLayer = kParamsPerBlock;
static_assert(kFc2B + 1 == kPerLayer);

// ---------------------------------------------------------------- Eigen helpers

template <class T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using RowVec = Eigen::Matrix<T, 1, Eigen::Dynamic>;
template <class T>
using MapM = Eigen::Map<RowMat<T>>;
template <class T>
using CMapM = Eigen::Map<const RowMat<T>>;
template <class T>
using MapV = Eigen::Map<RowVec<T>>;
template <class T>
using CMapV = Eigen::Map<const RowVec<T>>;

// y[n, h] = LayerNorm(x) * g + b; per-row mean and 1/sqrt(var + eps) kept in
// double (two-pass: mean, then mean of squared deviations).
template <class T>
void layernorm_forward(const T* x, const T* g, const T* b, T* y, double* mean, double* rstd,
                       index_t n, index_t h, double eps) {
  for (index_t r = 0; r < n; ++r) {
    const T* xr = x + r * h;
    T* yr = y + r * h;
    double mu = 0;
    for (index_t k = 0; k < h; ++k) mu += static_cast<double>(xr[k]);
    mu /= static_cast<double>(h);
    double var = 0;
    for (index_t k = 0; k < h; ++k) {
      const double dev = static_cast<double>(xr[k]) - mu;
      var += dev * dev;
    }
    var /= static_cast<double>(h);
    const double rs = 1.0 / std::sqrt(var + eps);
    mean[r] = mu;
    rstd[r] = rs;
    for (index_t k = 0; k < h; ++k)
      yr[k] = static_cast<T>((static_cast<double>(xr[k]) - mu) * rs * static_cast<double>(g[k]) +
                             static_cast<double>(b[k]));
  }
}

// dx += dLN/dx · dy, dg += Σ dy·x̂, db += Σ dy.
template <class T>
void layernorm_backward(const T* x, const T* g, const double* mean, const double* rstd, const T* dy,
                        T* dx, T* dg, T* db, index_t n, index_t h) {
  for (index_t r = 0; r < n; ++r) {
    const T* xr = x + r * h;
    const T* dyr = dy + r * h;
    T* dxr = dx + r * h;
    double sum_dxhat = 0, sum_dxhat_xhat = 0;
    for (index_t k = 0; k < h; ++k) {
      const double xhat = (static_cast<double>(xr[k]) - mean[r]) * rstd[r];
      const double dxhat = static_cast<double>(dyr[k]) * static_cast<double>(g[k]);
      sum_dxhat += dxhat;
      sum_dxhat_xhat += dxhat * xhat;
      dg[k] += static_cast<T>(static_cast<double>(dyr[k]) * xhat);
      db[k] += dyr[k];
    }
    const double a = sum_dxhat / static_cast<double>(h);
    const double c = sum_dxhat_xhat / static_cast<double>(h);
    for (index_t k = 0; k < h; ++k) {
      const double xhat = (static_cast<double>(xr[k]) - mean[r]) * rstd[r];
      const double dxhat = static_cast<double>(dyr[k]) * static_cast<double>(g[k]);
      dxr[k] += static_cast<T>(rstd[r] * (dxhat - a - xhat * c));
    }
  }
}

// y[n, out] = x[n, in] · W[in, out] + b.
template <class T>
void linear_forward(const T* x, const T* w, const T* b, T* y, index_t n, index_t in, index_t out) {
  MapM<T> Y(y, n, out);
  Y.noalias() = CMapM<T>(x, n, in) * CMapM<T>(w, in, out);
  Y.rowwise() += CMapV<T>(b, out);
}

// dx = dy · Wᵀ (overwritten), dW += xᵀ · dy, db += Σ_rows dy.
template <class T>
void linear_backward(const T* x, const T* w, const T* dy, T* dx, T* dw, T* db, index_t n,
                     index_t in, index_t out) {
  CMapM<T> X(x, n, in), W(w, in, out), dY(dy, n, out);
  MapM<T>(dx, n, in).noalias() = dY * W.transpose();
  MapM<T>(dw, in, out).noalias() += X.transpose() * dY;
  MapV<T>(db, out) += dY.colwise().sum();
}

constexpr double kGeluC = 0.7978845608028654;  // sqrt(2/pi)
constexpr double kGeluA = 0.044715;

inline double gelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(kGeluC * (x + kGeluA * x * x * x)));
}
inline double gelu_grad(double x) {
  const double t = std::tanh(kGeluC * (x + kGeluA * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * kGeluC * (1.0 + 3.0 * kGeluA * x * x);
}

}  // namespace

// ---------------------------------------------------------------- the model

template <class T>
struct Gpt<T>::State {
  struct Layer {
    std::vector<T> ln1, qkv, probs, ctx, attn_out, mid, ln2, fc, act, mlp_out, out;
    std::vector<double> mean1, rstd1, mean2, rstd2;
    // dL/d(activation) after backward, copied out of the backward's scratch.
    // attn.c_proj's gradient is d_mid and mlp.c_proj's is d_out (identical
    // tensors, so they are not stored twice).
    std::vector<T> d_ln1, d_qkv, d_probs, d_ctx, d_mid, d_ln2, d_fc, d_act, d_out;
  };
  bool have_forward = false;
  bool have_backward = false;
  bool from_tokens = false;
  index_t batch = 0, seq = 0;
  double loss = 0;
  std::vector<std::int32_t> tokens, targets;
  std::vector<T> embeddings, lnf, logits;
  std::vector<double> mean_f, rstd_f, lse;
  std::vector<Layer> layers;
  // gradients of activations and backward scratch
  std::vector<T> d_embeddings, d_lnf, d_logits;
  std::vector<T> d_x, d_mid, d_h, d_qkv, d_ctx, d_4h;

  // The activation (grad = false) or its gradient (grad = true) called
  // `name`; nullptr for an unknown name.
  const std::vector<T>* find(std::string_view name, int n_layer, bool grad) const;
};

template <class T>
Gpt<T>::Gpt(const GptConfig& config, std::uint64_t seed)
    : config_(config), info_(parameter_list(config)), state_(std::make_unique<State>()) {
  index_t total = 0;
  offsets_.reserve(info_.size());
  for (const ParamInfo& p : info_) {
    offsets_.push_back(total);
    total += p.size();
  }
  params_.assign(static_cast<std::size_t>(total), T(0));
  grads_.assign(static_cast<std::size_t>(total), T(0));
  state_->layers.resize(static_cast<std::size_t>(config_.n_layer));
  init(seed);
}

template <class T>
Gpt<T>::Gpt(const Gpt& other)
    : config_(other.config_),
      info_(other.info_),
      offsets_(other.offsets_),
      params_(other.params_),
      grads_(other.grads_),
      state_(std::make_unique<State>(*other.state_)) {}

template <class T>
Gpt<T>& Gpt<T>::operator=(const Gpt& other) {
  if (this != &other) {
    Gpt copy(other);
    *this = std::move(copy);
  }
  return *this;
}

template <class T>
Gpt<T>::Gpt(Gpt&&) noexcept = default;
template <class T>
Gpt<T>& Gpt<T>::operator=(Gpt&&) noexcept = default;
template <class T>
Gpt<T>::~Gpt() = default;

template <class T>
void Gpt<T>::init(std::uint64_t seed) {
  for (std::size_t k = 0; k < info_.size(); ++k)
    init_fill<T>(seed, info_[k].name, 0,
                 std::span<T>(params_).subspan(static_cast<std::size_t>(offsets_[k]),
                                               static_cast<std::size_t>(info_[k].size())),
                 config_);
}

template <class T>
std::size_t Gpt<T>::index_of(std::string_view name) const {
  return parameter_index(name, config_, "Gpt");
}

template <class T>
std::span<T> Gpt<T>::param(std::string_view name) {
  const std::size_t k = index_of(name);
  return std::span<T>(params_).subspan(static_cast<std::size_t>(offsets_[k]),
                                       static_cast<std::size_t>(info_[k].size()));
}
template <class T>
std::span<const T> Gpt<T>::param(std::string_view name) const {
  const std::size_t k = index_of(name);
  return std::span<const T>(params_).subspan(static_cast<std::size_t>(offsets_[k]),
                                             static_cast<std::size_t>(info_[k].size()));
}
template <class T>
std::span<T> Gpt<T>::grad(std::string_view name) {
  const std::size_t k = index_of(name);
  return std::span<T>(grads_).subspan(static_cast<std::size_t>(offsets_[k]),
                                      static_cast<std::size_t>(info_[k].size()));
}
template <class T>
std::span<const T> Gpt<T>::grad(std::string_view name) const {
  const std::size_t k = index_of(name);
  return std::span<const T>(grads_).subspan(static_cast<std::size_t>(offsets_[k]),
                                            static_cast<std::size_t>(info_[k].size()));
}
template <class T>
MatrixView<T> Gpt<T>::param_matrix(std::string_view name) {
  const std::size_t k = index_of(name);
  return MatrixView<T>::dense(params_.data() + offsets_[k], info_[k].rows(), info_[k].cols(),
                              Order::row_major);
}
template <class T>
MatrixView<T> Gpt<T>::grad_matrix(std::string_view name) {
  const std::size_t k = index_of(name);
  return MatrixView<T>::dense(grads_.data() + offsets_[k], info_[k].rows(), info_[k].cols(),
                              Order::row_major);
}

namespace {

// Shape checks shared by both forward entry points; nothing is modified.
void check_batch(const char* what, index_t batch, index_t seq, std::size_t targets) {
  require(batch > 0 && seq > 0, [&] {
    return fmt::format("{}: empty batch: batch={}, seq={} (both must be positive)", what, batch,
                       seq);
  });
  require(batch <= std::numeric_limits<std::int32_t>::max() / seq,
          [&] { return fmt::format("{}: batch*seq = {}*{} too large", what, batch, seq); });
  require(static_cast<index_t>(targets) == batch * seq, [&] {
    return fmt::format("{}: targets has {} ids, expected batch*seq = {}*{} = {}", what, targets,
                       batch, seq, batch * seq);
  });
}

void check_ids(const char* what, const char* kind, std::span<const std::int32_t> ids, index_t seq,
               int vocab) {
  for (std::size_t n = 0; n < ids.size(); ++n) {
    const std::int32_t id = ids[n];
    require(id >= 0 && id < vocab, [&] {
      return fmt::format("{}: {} {} at [{}, {}] outside [0, vocab_size={})", what, kind, id,
                         static_cast<index_t>(n) / seq, static_cast<index_t>(n) % seq, vocab);
    });
  }
}

}  // namespace

template <class T>
T Gpt<T>::forward(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets,
                  index_t batch, index_t seq) {
  constexpr const char* what = "Gpt forward";
  require(batch > 0 && seq > 0, [&] {
    return fmt::format("{}: empty batch: batch={}, seq={} (both must be positive)", what, batch,
                       seq);
  });
  require(seq <= config_.n_positions, [&] {
    return fmt::format("{}: seq={} exceeds n_positions={}", what, seq, config_.n_positions);
  });
  require(batch <= std::numeric_limits<std::int32_t>::max() / seq,
          [&] { return fmt::format("{}: batch*seq = {}*{} too large", what, batch, seq); });
  require(static_cast<index_t>(tokens.size()) == batch * seq, [&] {
    return fmt::format("{}: tokens has {} ids, expected batch*seq = {}*{} = {}", what,
                       tokens.size(), batch, seq, batch * seq);
  });
  require(targets.size() == tokens.size(), [&] {
    return fmt::format("{}: targets has {} ids but tokens has {} (batch*seq = {}*{})", what,
                       targets.size(), tokens.size(), batch, seq);
  });
  check_ids(what, "token id", tokens, seq, config_.vocab_size);
  check_ids(what, "target", targets, seq, config_.vocab_size);
  require(state_ != nullptr, "Gpt forward: moved-from model");

  State& st = *state_;
  const index_t h = config_.n_embd, n = batch * seq;
  st.tokens.assign(tokens.begin(), tokens.end());
  st.embeddings.resize(static_cast<std::size_t>(n * h));
  const T* wte = params_.data() + offsets_[0];
  const T* wpe = params_.data() + offsets_[1];
  for (index_t r = 0; r < n; ++r) {
    const T* te = wte + static_cast<index_t>(tokens[static_cast<std::size_t>(r)]) * h;
    const T* pe = wpe + (r % seq) * h;
    T* x = st.embeddings.data() + r * h;
    for (index_t k = 0; k < h; ++k) x[k] = te[k] + pe[k];
  }
  st.from_tokens = true;
  return run_forward(targets, batch, seq);
}

template <class T>
T Gpt<T>::forward_embeddings(std::span<const T> embeddings, std::span<const std::int32_t> targets,
                             index_t batch, index_t seq) {
  constexpr const char* what = "Gpt forward_embeddings";
  check_batch(what, batch, seq, targets.size());
  const index_t h = config_.n_embd;
  require(static_cast<index_t>(embeddings.size()) == batch * seq * h, [&] {
    return fmt::format("{}: embeddings has {} values, expected batch*seq*n_embd = {}*{}*{} = {}",
                       what, embeddings.size(), batch, seq, h, batch * seq * h);
  });
  check_ids(what, "target", targets, seq, config_.vocab_size);
  require(state_ != nullptr, "Gpt forward_embeddings: moved-from model");
  State& st = *state_;
  st.tokens.clear();
  st.embeddings.assign(embeddings.begin(), embeddings.end());
  st.from_tokens = false;
  return run_forward(targets, batch, seq);
}

template <class T>
T Gpt<T>::run_forward(std::span<const std::int32_t> targets, index_t batch, index_t seq) {
  State& st = *state_;
  st.have_forward = false;
  st.have_backward = false;
  st.batch = batch;
  st.seq = seq;
  st.targets.assign(targets.begin(), targets.end());

  const index_t h = config_.n_embd, n = batch * seq, heads = config_.n_head;
  const index_t d = config_.head_dim(), vocab = config_.vocab_size;
  const double eps = config_.layer_norm_epsilon;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const auto sz = [](index_t k) { return static_cast<std::size_t>(k); };
  RowMat<T> scores(seq, seq);

  const T* x = st.embeddings.data();
  for (std::size_t i = 0; i < st.layers.size(); ++i) {
    typename State::Layer& L = st.layers[i];
    const T* p = params_.data();
    const auto P = [&](std::size_t slot) { return p + offsets_[2 + kPerLayer * i + slot]; };
    L.ln1.resize(sz(n * h));
    L.qkv.resize(sz(n * 3 * h));
    L.probs.resize(sz(batch * heads * seq * seq));
    L.ctx.resize(sz(n * h));
    L.attn_out.resize(sz(n * h));
    L.mid.resize(sz(n * h));
    L.ln2.resize(sz(n * h));
    L.fc.resize(sz(n * 4 * h));
    L.act.resize(sz(n * 4 * h));
    L.mlp_out.resize(sz(n * h));
    L.out.resize(sz(n * h));
    for (auto* v : {&L.mean1, &L.rstd1, &L.mean2, &L.rstd2}) v->resize(sz(n));

    // attention
    layernorm_forward(x, P(kLn1W), P(kLn1B), L.ln1.data(), L.mean1.data(), L.rstd1.data(), n, h,
                      eps);
    linear_forward(L.ln1.data(), P(kAttnW), P(kAttnB), L.qkv.data(), n, h, 3 * h);
    CMapM<T> qkv(L.qkv.data(), n, 3 * h);
    MapM<T> ctx(L.ctx.data(), n, h);
    for (index_t b = 0; b < batch; ++b)
      for (index_t j = 0; j < heads; ++j) {
        const auto Q = qkv.block(b * seq, j * d, seq, d);
        const auto K = qkv.block(b * seq, h + j * d, seq, d);
        const auto V = qkv.block(b * seq, 2 * h + j * d, seq, d);
        scores.noalias() = Q * K.transpose();
        MapM<T> probs(L.probs.data() + (b * heads + j) * seq * seq, seq, seq);
        for (index_t r = 0; r < seq; ++r) {
          double m = -std::numeric_limits<double>::infinity();
          for (index_t c = 0; c <= r; ++c)
            m = std::max(m, scale * static_cast<double>(scores(r, c)));
          double sum = 0;
          for (index_t c = 0; c <= r; ++c)
            sum += std::exp(scale * static_cast<double>(scores(r, c)) - m);
          for (index_t c = 0; c <= r; ++c)
            probs(r, c) =
                static_cast<T>(std::exp(scale * static_cast<double>(scores(r, c)) - m) / sum);
          for (index_t c = r + 1; c < seq; ++c) probs(r, c) = T(0);
        }
        ctx.block(b * seq, j * d, seq, d).noalias() = probs * V;
      }
    linear_forward(L.ctx.data(), P(kProjW), P(kProjB), L.attn_out.data(), n, h, h);
    for (index_t k = 0; k < n * h; ++k) L.mid[sz(k)] = x[k] + L.attn_out[sz(k)];

    // MLP
    layernorm_forward(L.mid.data(), P(kLn2W), P(kLn2B), L.ln2.data(), L.mean2.data(),
                      L.rstd2.data(), n, h, eps);
    linear_forward(L.ln2.data(), P(kFcW), P(kFcB), L.fc.data(), n, h, 4 * h);
    for (std::size_t k = 0; k < L.fc.size(); ++k)
      L.act[k] = static_cast<T>(gelu(static_cast<double>(L.fc[k])));
    linear_forward(L.act.data(), P(kFc2W), P(kFc2B), L.mlp_out.data(), n, 4 * h, h);
    for (std::size_t k = 0; k < L.out.size(); ++k) L.out[k] = L.mid[k] + L.mlp_out[k];
    x = L.out.data();
  }

  // final LayerNorm, tied head, cross-entropy
  const std::size_t last = 2 + kPerLayer * st.layers.size();
  st.lnf.resize(sz(n * h));
  st.mean_f.resize(sz(n));
  st.rstd_f.resize(sz(n));
  layernorm_forward(x, params_.data() + offsets_[last], params_.data() + offsets_[last + 1],
                    st.lnf.data(), st.mean_f.data(), st.rstd_f.data(), n, h, eps);
  st.logits.resize(sz(n * vocab));
  MapM<T> logits(st.logits.data(), n, vocab);
  logits.noalias() =
      CMapM<T>(st.lnf.data(), n, h) * CMapM<T>(params_.data() + offsets_[0], vocab, h).transpose();
  st.lse.resize(sz(n));
  double total = 0;
  for (index_t r = 0; r < n; ++r) {
    double m = -std::numeric_limits<double>::infinity();
    for (index_t c = 0; c < vocab; ++c) m = std::max(m, static_cast<double>(logits(r, c)));
    double sum = 0;
    for (index_t c = 0; c < vocab; ++c) sum += std::exp(static_cast<double>(logits(r, c)) - m);
    st.lse[sz(r)] = m + std::log(sum);
    total += st.lse[sz(r)] - static_cast<double>(logits(r, st.targets[sz(r)]));
  }
  st.loss = total / static_cast<double>(n);
  st.have_forward = true;
  return static_cast<T>(st.loss);
}

template <class T>
void Gpt<T>::backward() {
  require(state_ != nullptr && state_->have_forward,
          "Gpt backward: no forward pass to differentiate");
  State& st = *state_;
  const index_t h = config_.n_embd, n = st.batch * st.seq, seq = st.seq, batch = st.batch;
  const index_t heads = config_.n_head, d = config_.head_dim(), vocab = config_.vocab_size;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(d)));
  const auto sz = [](index_t k) { return static_cast<std::size_t>(k); };
  std::fill(grads_.begin(), grads_.end(), T(0));
  const T* p = params_.data();
  T* g = grads_.data();

  // cross-entropy and tied head: dlogits = (softmax - onehot) / n
  st.d_logits.resize(sz(n * vocab));
  MapM<T> dlogits(st.d_logits.data(), n, vocab);
  CMapM<T> logits(st.logits.data(), n, vocab);
  const double inv_n = 1.0 / static_cast<double>(n);
  for (index_t r = 0; r < n; ++r) {
    for (index_t c = 0; c < vocab; ++c)
      dlogits(r, c) =
          static_cast<T>(std::exp(static_cast<double>(logits(r, c)) - st.lse[sz(r)]) * inv_n);
    dlogits(r, st.targets[sz(r)]) -= static_cast<T>(inv_n);
  }
  st.d_lnf.resize(sz(n * h));
  CMapM<T> wte(p + offsets_[0], vocab, h);
  MapM<T>(st.d_lnf.data(), n, h).noalias() = dlogits * wte;
  MapM<T>(g + offsets_[0], vocab, h).noalias() +=
      dlogits.transpose() * CMapM<T>(st.lnf.data(), n, h);

  // final LayerNorm
  const std::size_t last = 2 + kPerLayer * st.layers.size();
  st.d_x.assign(sz(n * h), T(0));
  layernorm_backward(st.layers.back().out.data(), p + offsets_[last], st.mean_f.data(),
                     st.rstd_f.data(), st.d_lnf.data(), st.d_x.data(), g + offsets_[last],
                     g + offsets_[last + 1], n, h);

  st.d_mid.resize(sz(n * h));
  st.d_h.resize(sz(n * h));
  st.d_ctx.resize(sz(n * h));
  st.d_qkv.resize(sz(n * 3 * h));
  st.d_4h.resize(sz(n * 4 * h));
  RowMat<T> dP(seq, seq), dS(seq, seq);
  for (std::size_t i = st.layers.size(); i-- > 0;) {
    typename State::Layer& L = st.layers[i];
    const auto P = [&](std::size_t slot) { return p + offsets_[2 + kPerLayer * i + slot]; };
    const auto G = [&](std::size_t slot) { return g + offsets_[2 + kPerLayer * i + slot]; };
    const T* x = i == 0 ? st.embeddings.data() : st.layers[i - 1].out.data();
    L.d_out = st.d_x;

    // MLP: out = mid + c_proj(gelu(c_fc(ln_2(mid))))
    st.d_mid = st.d_x;
    linear_backward(L.act.data(), P(kFc2W), st.d_x.data(), st.d_4h.data(), G(kFc2W), G(kFc2B), n,
                    4 * h, h);
    L.d_act = st.d_4h;
    for (std::size_t k = 0; k < st.d_4h.size(); ++k)
      st.d_4h[k] =
          static_cast<T>(static_cast<double>(st.d_4h[k]) * gelu_grad(static_cast<double>(L.fc[k])));
    L.d_fc = st.d_4h;
    linear_backward(L.ln2.data(), P(kFcW), st.d_4h.data(), st.d_h.data(), G(kFcW), G(kFcB), n, h,
                    4 * h);
    L.d_ln2 = st.d_h;
    layernorm_backward(L.mid.data(), P(kLn2W), L.mean2.data(), L.rstd2.data(), st.d_h.data(),
                       st.d_mid.data(), G(kLn2W), G(kLn2B), n, h);
    L.d_mid = st.d_mid;

    // attention: mid = x + c_proj(attn(c_attn(ln_1(x))))
    st.d_x = st.d_mid;
    linear_backward(L.ctx.data(), P(kProjW), st.d_mid.data(), st.d_ctx.data(), G(kProjW), G(kProjB),
                    n, h, h);
    L.d_ctx = st.d_ctx;
    L.d_probs.resize(sz(batch * heads * seq * seq));
    CMapM<T> qkv(L.qkv.data(), n, 3 * h), dctx(st.d_ctx.data(), n, h);
    MapM<T> dqkv(st.d_qkv.data(), n, 3 * h);
    for (index_t b = 0; b < batch; ++b)
      for (index_t j = 0; j < heads; ++j) {
        const auto Q = qkv.block(b * seq, j * d, seq, d);
        const auto K = qkv.block(b * seq, h + j * d, seq, d);
        const auto V = qkv.block(b * seq, 2 * h + j * d, seq, d);
        const auto dC = dctx.block(b * seq, j * d, seq, d);
        CMapM<T> probs(L.probs.data() + (b * heads + j) * seq * seq, seq, seq);
        dP.noalias() = dC * V.transpose();
        MapM<T>(L.d_probs.data() + (b * heads + j) * seq * seq, seq, seq) = dP;
        dqkv.block(b * seq, 2 * h + j * d, seq, d).noalias() = probs.transpose() * dC;
        for (index_t r = 0; r < seq; ++r) {
          double dot = 0;
          for (index_t c = 0; c <= r; ++c)
            dot += static_cast<double>(dP(r, c)) * static_cast<double>(probs(r, c));
          for (index_t c = 0; c <= r; ++c)
            dS(r, c) = static_cast<T>(static_cast<double>(probs(r, c)) *
                                      (static_cast<double>(dP(r, c)) - dot)) *
                       scale;
          for (index_t c = r + 1; c < seq; ++c) dS(r, c) = T(0);
        }
        dqkv.block(b * seq, j * d, seq, d).noalias() = dS * K;
        dqkv.block(b * seq, h + j * d, seq, d).noalias() = dS.transpose() * Q;
      }
    L.d_qkv = st.d_qkv;
    linear_backward(L.ln1.data(), P(kAttnW), st.d_qkv.data(), st.d_h.data(), G(kAttnW), G(kAttnB),
                    n, h, 3 * h);
    L.d_ln1 = st.d_h;
    layernorm_backward(x, P(kLn1W), L.mean1.data(), L.rstd1.data(), st.d_h.data(), st.d_x.data(),
                       G(kLn1W), G(kLn1B), n, h);
  }
  st.d_embeddings = st.d_x;

  // embedding gather: wte[token] and wpe[position] receive their rows' gradients
  if (st.from_tokens) {
    T* gwte = g + offsets_[0];
    T* gwpe = g + offsets_[1];
    for (index_t r = 0; r < n; ++r) {
      const T* dx = st.d_embeddings.data() + r * h;
      T* te = gwte + static_cast<index_t>(st.tokens[sz(r)]) * h;
      T* pe = gwpe + (r % seq) * h;
      for (index_t k = 0; k < h; ++k) {
        te[k] += dx[k];
        pe[k] += dx[k];
      }
    }
  }
  st.have_backward = true;
}

template <class T>
T Gpt<T>::loss() const {
  require(state_ != nullptr && state_->have_forward, "Gpt loss: no forward pass yet");
  return static_cast<T>(state_->loss);
}

template <class T>
std::span<const T> Gpt<T>::logits() const {
  return activation("logits");
}

template <class T>
std::span<const T> Gpt<T>::input_grad() const {
  return activation_grad("embeddings");
}

template <class T>
std::vector<ActivationInfo> Gpt<T>::activation_info() const {
  require(state_ != nullptr && state_->have_forward, "Gpt activation_info: no forward pass yet");
  const index_t B = state_->batch, S = state_->seq, h = config_.n_embd;
  const std::vector<index_t> bsh{B, S, h};
  std::vector<ActivationInfo> list;
  list.push_back({"embeddings", bsh});
  for (int i = 0; i < config_.n_layer; ++i) {
    const std::string pre = fmt::format("h.{}.", i);
    list.push_back({pre + "ln_1", bsh});
    list.push_back({pre + "attn.c_attn", {B, S, 3 * h}});
    list.push_back({pre + "attn.probs", {B, config_.n_head, S, S}});
    list.push_back({pre + "attn.context", bsh});
    list.push_back({pre + "attn.c_proj", bsh});
    list.push_back({pre + "mid", bsh});
    list.push_back({pre + "ln_2", bsh});
    list.push_back({pre + "mlp.c_fc", {B, S, 4 * h}});
    list.push_back({pre + "mlp.gelu", {B, S, 4 * h}});
    list.push_back({pre + "mlp.c_proj", bsh});
    list.push_back({pre + "output", bsh});
  }
  list.push_back({"ln_f", bsh});
  list.push_back({"logits", {B, S, config_.vocab_size}});
  return list;
}

namespace {

// Splits "h.{i}.rest" into (i, rest) for i < n_layer.
std::optional<std::pair<std::size_t, std::string_view>> split_layer(std::string_view name,
                                                                    int n_layer) {
  if (!name.starts_with("h.")) return std::nullopt;
  name.remove_prefix(2);
  const std::size_t dot = name.find('.');
  if (dot == 0 || dot == std::string_view::npos || dot > 9) return std::nullopt;
  std::size_t layer = 0;
  for (std::size_t k = 0; k < dot; ++k) {
    if (name[k] < '0' || name[k] > '9' || (k == 1 && name[0] == '0')) return std::nullopt;
    layer = layer * 10 + static_cast<std::size_t>(name[k] - '0');
  }
  if (layer >= static_cast<std::size_t>(n_layer)) return std::nullopt;
  return std::pair{layer, name.substr(dot + 1)};
}

}  // namespace

template <class T>
const std::vector<T>* Gpt<T>::State::find(std::string_view name, int n_layer, bool grad) const {
  if (name == "embeddings") return grad ? &d_embeddings : &embeddings;
  if (name == "ln_f") return grad ? &d_lnf : &lnf;
  if (name == "logits") return grad ? &d_logits : &logits;
  const auto split = split_layer(name, n_layer);
  if (!split) return nullptr;
  const Layer& L = layers[split->first];
  // suffix, activation, its gradient
  const std::tuple<std::string_view, const std::vector<T>*, const std::vector<T>*> table[] = {
      {"ln_1", &L.ln1, &L.d_ln1},
      {"attn.c_attn", &L.qkv, &L.d_qkv},
      {"attn.probs", &L.probs, &L.d_probs},
      {"attn.context", &L.ctx, &L.d_ctx},
      {"attn.c_proj", &L.attn_out, &L.d_mid},  // mid = x + attn.c_proj
      {"mid", &L.mid, &L.d_mid},
      {"ln_2", &L.ln2, &L.d_ln2},
      {"mlp.c_fc", &L.fc, &L.d_fc},
      {"mlp.gelu", &L.act, &L.d_act},
      {"mlp.c_proj", &L.mlp_out, &L.d_out},  // output = mid + mlp.c_proj
      {"output", &L.out, &L.d_out}};
  for (const auto& [suffix, value, gradient] : table)
    if (suffix == split->second) return grad ? gradient : value;
  return nullptr;
}

template <class T>
std::span<const T> Gpt<T>::activation(std::string_view name) const {
  require(state_ != nullptr && state_->have_forward,
          [&] { return fmt::format("Gpt activation '{}': no forward pass yet", name); });
  const std::vector<T>* found = state_->find(name, config_.n_layer, false);
  require(found != nullptr, [&] {
    return fmt::format("Gpt: no activation named '{}' (see activation_info())", name);
  });
  return *found;
}

template <class T>
std::span<const T> Gpt<T>::activation_grad(std::string_view name) const {
  require(state_ != nullptr && state_->have_backward,
          [&] { return fmt::format("Gpt activation_grad '{}': no backward pass yet", name); });
  const std::vector<T>* found = state_->find(name, config_.n_layer, true);
  require(found != nullptr, [&] {
    return fmt::format(
        "Gpt: no activation gradient named '{}' (n_layer={}; valid: embeddings, h.{{i}}.{{ln_1, "
        "attn.c_attn, attn.probs, attn.context, attn.c_proj, mid, ln_2, mlp.c_fc, mlp.gelu, "
        "mlp.c_proj, output}} for 0 <= i < n_layer, ln_f, logits; see activation_info())",
        name, config_.n_layer);
  });
  return *found;
}

template class Gpt<float>;
template class Gpt<double>;

}  // namespace summa::reference

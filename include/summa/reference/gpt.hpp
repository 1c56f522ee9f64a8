#pragma once
/// \file gpt.hpp
/// Serial reference GPT-2: one process, no MPI, plain loops and Eigen in the
/// implementation. It is the oracle the distributed model is compared against
/// (forward, loss and every gradient) and a way for users to check a
/// configuration on one core.
///
/// Architecture and names follow Hugging Face's GPT2LMHeadModel (transformer.*
/// prefix dropped), so checkpoints map one to one:
///   x = wte[tokens] + wpe[positions]
///   N pre-LN blocks: x = x + Attn(LN1(x)); x = x + MLP(LN2(x))
///   logits = LN_f(x) · wteᵀ (tied head), loss = mean cross-entropy.
/// Linear layers use the Conv1D layout: weight [in, out], y = x W + b, row-major.
/// The attention projection c_attn produces [q | k | v] (each n_embd wide);
/// head j of each is columns [j·d, (j+1)·d) with d = n_embd / n_head. The MLP
/// uses GeLU in its tanh form. No dropout.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "summa/core/matrix_view.hpp"
#include "summa/core/types.hpp"
#include "summa/model/config.hpp"
#include "summa/model/init.hpp"

namespace summa::reference {

// The model definition the reference shares with the distributed models
// (summa/model/config.hpp, init.hpp), under its historical names.
using summa::GptConfig;
using summa::init_fill;
using summa::init_fill_block;
using summa::init_normal;
using summa::init_value;
using summa::parameter_count;
using summa::parameter_list;
using summa::ParamInfo;

// ---------------------------------------------------------------- the model

/// Name and shape of an activation kept by the last forward pass.
struct ActivationInfo {
  std::string name;
  std::vector<index_t> shape;
};

/// The serial GPT-2, in float or double.
///
/// Parameters and gradients are each one contiguous buffer in parameter_list()
/// order; param(name) / grad(name) are spans into them (stable for the life of
/// the object). Gradients are *overwritten* by backward(): it zeroes every
/// gradient tensor first, then writes dL/dθ of the loss of the last forward.
///
/// Copies are deep; a moved-from Gpt may only be assigned to or destroyed.
///
/// Precision: LayerNorm statistics (two-pass mean and variance), softmax and
/// cross-entropy sums, and GeLU are evaluated in double for both element
/// types; GEMMs run in T.
template <class T>
class Gpt {
 public:
  /// Validates the config and initialises with init_value(seed, ...).
  Gpt(const GptConfig& config, std::uint64_t seed);
  Gpt(const Gpt& other);
  Gpt& operator=(const Gpt& other);
  Gpt(Gpt&&) noexcept;
  Gpt& operator=(Gpt&&) noexcept;
  ~Gpt();

  const GptConfig& config() const { return config_; }
  const std::vector<ParamInfo>& parameter_info() const { return info_; }
  index_t num_parameters() const { return static_cast<index_t>(params_.size()); }

  /// Re-initialises every parameter from `seed` (gradients and activations
  /// are left as they are).
  void init(std::uint64_t seed);

  /// Flat views of all parameters / gradients, in parameter_list() order.
  std::span<T> params() { return params_; }
  std::span<const T> params() const { return params_; }
  std::span<T> grads() { return grads_; }
  std::span<const T> grads() const { return grads_; }

  /// One tensor by name (row-major elements); throws summa::Error for an
  /// unknown name.
  std::span<T> param(std::string_view name);
  std::span<const T> param(std::string_view name) const;
  std::span<T> grad(std::string_view name);
  std::span<const T> grad(std::string_view name) const;
  /// The same tensor as a row-major ParamInfo::rows() x cols() view.
  MatrixView<T> param_matrix(std::string_view name);
  MatrixView<T> grad_matrix(std::string_view name);

  /// Forward pass on `batch` sequences of `seq` tokens (row-major [batch,
  /// seq] int32 ids) with `targets` of the same shape (targets[b, t] is the
  /// token to predict at position t, i.e. Hugging Face's labels already
  /// shifted; every position counts); returns the mean cross-entropy over all
  /// batch·seq positions and keeps the activations for backward(). Throws
  /// summa::Error (before touching any state) for an empty batch, sizes that do not match
  /// batch·seq, seq > n_positions, or an id outside [0, vocab_size).
  T forward(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets,
            index_t batch, index_t seq);

  /// Forward pass from given input embeddings ([batch, seq, n_embd], i.e.
  /// what wte[tokens] + wpe[positions] would be). backward() then gives
  /// input_grad() and leaves wpe's gradient zero; wte's gradient is the tied
  /// head's contribution only. seq is not limited by n_positions here.
  T forward_embeddings(std::span<const T> embeddings, std::span<const std::int32_t> targets,
                       index_t batch, index_t seq);

  /// Gradients of the last forward's loss w.r.t. every parameter (zeroed
  /// first, then written) and w.r.t. the input embeddings. Throws if there
  /// was no forward pass.
  void backward();

  /// Loss of the last forward pass.
  T loss() const;
  /// Logits of the last forward pass, row-major [batch, seq, vocab_size].
  std::span<const T> logits() const;
  /// dL/d(input embeddings) of the last backward, [batch, seq, n_embd].
  std::span<const T> input_grad() const;

  /// The activations of the last forward pass (row-major; B = batch, S = seq,
  /// h = n_embd, H = n_head, V = vocab_size):
  ///   embeddings                 [B, S, h]   input of block 0
  ///   h.{i}.ln_1                 [B, S, h]
  ///   h.{i}.attn.c_attn          [B, S, 3h]  q | k | v
  ///   h.{i}.attn.probs           [B, H, S, S] softmax probabilities (0 above
  ///                                          the diagonal)
  ///   h.{i}.attn.context         [B, S, h]   heads concatenated, before c_proj
  ///   h.{i}.attn.c_proj          [B, S, h]   attention output
  ///   h.{i}.mid                  [B, S, h]   x + Attn(LN1(x))
  ///   h.{i}.ln_2                 [B, S, h]
  ///   h.{i}.mlp.c_fc             [B, S, 4h]  before GeLU
  ///   h.{i}.mlp.gelu             [B, S, 4h]
  ///   h.{i}.mlp.c_proj           [B, S, h]   MLP output
  ///   h.{i}.output               [B, S, h]   block output
  ///   ln_f                       [B, S, h]
  ///   logits                     [B, S, V]
  /// (Hugging Face's hidden_states are embeddings, h.{i}.output for i <
  /// n_layer-1, and ln_f.)
  std::vector<ActivationInfo> activation_info() const;
  std::span<const T> activation(std::string_view name) const;
  /// dL/d(activation) of the last backward(), same shape as activation(name),
  /// for every name of activation_info(): the total derivative of the loss
  /// with respect to that tensor as its consumers use it (every path, residual
  /// ones included), exactly the values the backward pass propagated. In particular:
  ///   embeddings          = input_grad()
  ///   h.{i}.ln_1          dL/d LN1(x), i.e. d(attn.c_attn) · c_attn.weightᵀ
  ///   h.{i}.attn.c_attn   [dQ | dK | dV]
  ///   h.{i}.attn.probs    dL/dP = d(attn.context)_head · Vᵀ for every (r, c),
  ///                       above the diagonal too (what perturbing P there
  ///                       would give through context = P·V; the softmax
  ///                       backward only uses the causal part)
  ///   h.{i}.attn.context  d(attn.c_proj) · attn.c_proj.weightᵀ
  ///   h.{i}.attn.c_proj   = h.{i}.mid's gradient (mid = x + attn.c_proj)
  ///   h.{i}.mid           d(output) + the part through ln_2
  ///   h.{i}.ln_2          d(mlp.c_fc) · mlp.c_fc.weightᵀ
  ///   h.{i}.mlp.c_fc      w.r.t. the pre-GeLU values: d(mlp.gelu) ∘ gelu'(c_fc)
  ///   h.{i}.mlp.gelu      w.r.t. the GeLU output: d(mlp.c_proj) · mlp.c_proj.weightᵀ
  ///   h.{i}.mlp.c_proj    = h.{i}.output's gradient (output = mid + mlp.c_proj)
  ///   h.{i}.output        input gradient of block i+1 (of ln_f for the last)
  ///   ln_f                d(logits) · wte
  ///   logits              (softmax − onehot) / (batch·seq)
  /// Throws summa::Error (listing the valid names) for an unknown name, and if
  /// there was no backward() since the last forward.
  std::span<const T> activation_grad(std::string_view name) const;

 private:
  struct State;
  std::size_t index_of(std::string_view name) const;  // into info_ / offsets_
  T run_forward(std::span<const std::int32_t> targets, index_t batch, index_t seq);

  GptConfig config_;
  std::vector<ParamInfo> info_;
  std::vector<index_t> offsets_;  // element offset of each tensor in params_
  std::vector<T> params_;
  std::vector<T> grads_;
  std::unique_ptr<State> state_;
};

extern template class Gpt<float>;
extern template class Gpt<double>;

}  // namespace summa::reference

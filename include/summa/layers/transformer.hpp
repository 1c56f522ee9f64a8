#pragma once
/// \file transformer.hpp
/// The GPT-2 attention, MLP and transformer block, written once over a
/// SchemeContext (layers/scheme_context.hpp): the scheme supplies the
/// linears, LayerNorms and local shapes; these classes only compose them.
/// The same classes run under 1D (Megatron), 2D (SUMMA) and 3D (AxoNN).
///
/// Attention: qkv = c_attn(X) (expand, groups = 3: a rank's inner block is
/// [Q | K | V] of its heads), per local sequence and head softmax(Q Kᵀ /
/// sqrt(d)) V with a causal mask (local GEMMs), Y = c_proj(context)
/// (contract). Requires hidden % heads == 0, heads % head_split() == 0 and
/// batch % sequence_split() == 0. forward() keeps qkv, the probabilities
/// [b_local, n_local, s, s] and the context in buffers.forward; backward()
/// takes dcontext, dqkv and one sequence's n_local x s x s from
/// buffers.backward. With recompute_probabilities (Recompute::selective)
/// forward keeps qkv and the context only, forming each sequence's
/// probabilities in the workspace, and backward forms them again in a second
/// n_local x s x s of buffers.backward.
///
/// MLP: Y = c_proj(GeLU(c_fc(X))), c_fc expand (h -> 4h), c_proj contract.
/// forward() keeps the pre- and post-GeLU inner activations; backward()
/// takes one.
///
/// TransformerBlock (pre-LayerNorm): mid = X + Attn(LN1(X)); Y = mid +
/// MLP(LN2(mid)), residual adds local. Keeps ln_1, mid and ln_2 (outer
/// blocks) plus its sublayers' saved activations in buffers.forward; takes
/// dmid and one outer block from buffers.backward on top of its sublayers'.
///
/// Construction-time checks agree over the tensor group (the same
/// summa::Error on every rank).

#include <memory>
#include <string>
#include <string_view>

#include "summa/layers/gelu.hpp"
#include "summa/layers/scheme_context.hpp"

namespace summa {

namespace detail {
struct LocalAttention;  // src/layers/attention_core.hpp
}

/// The block's ops, as the profiler (GptOptions::profile) times them and
/// the step-time model prices them. A residual add counts with the op
/// before it (forward: the c_proj linears; backward: the LayerNorms).
namespace block_op {
inline constexpr std::string_view ln_1 = "block.ln_1", c_attn = "block.attn.c_attn",
                                  core = "block.attn.core", attn_c_proj = "block.attn.c_proj",
                                  ln_2 = "block.ln_2", c_fc = "block.mlp.c_fc",
                                  gelu = "block.mlp.gelu", mlp_c_proj = "block.mlp.c_proj";
}  // namespace block_op

template <class T>
class Attention final : public Layer<T> {
 public:
  /// `name` is the parameter prefix, e.g. "h.0.attn" (c_attn, c_proj below it).
  Attention(SchemeContext<T>& scheme, std::string name, index_t batch, index_t seq, index_t hidden,
            index_t heads);

  std::string_view name() const override { return name_; }
  void collect_parameters(std::vector<Param<T>*>& out) override;
  BufferNeeds buffer_needs() const override;
  void price(cost::Tally& t, model::Phase phase) const override;
  void forward(ConstMatrixView<T> X, MatrixView<T> Y, StepBuffers& buffers) override;
  void backward(ConstMatrixView<T> dY, MatrixView<T> dX, StepBuffers& buffers,
                bool accumulate = false) override;

  Layer<T>& c_attn() { return *c_attn_; }
  Layer<T>& c_proj() { return *c_proj_; }
  /// Local views of the last forward's qkv ([Q | K | V] of the local heads)
  /// and context.
  ConstMatrixView<T> qkv() const { return qkv_; }
  ConstMatrixView<T> context() const { return ctx_; }

  /// Decoding with a key / value cache (GptOptions::kv_cache), set before
  /// buffer_needs() is taken: room for `length` positions of this rank's
  /// sequences and heads. Each forward then writes its keys and values at
  /// positions [start, start + seq) of every local sequence (set_start) and
  /// attends from each query over the cache up to its own position.
  /// Inference only: backward throws.
  void use_cache(index_t length);
  index_t cache_length() const { return cache_length_; }
  /// Elements of the keys (and of the values) this rank caches: local
  /// sequences x local heads x length x head_dim, laid out in that order.
  index_t cache_elements() const;
  /// The cache memory (cache_elements() each), before the first forward.
  void attach_cache(T* keys, T* values);
  /// The position of this forward's first token in every sequence; start +
  /// seq must not pass the cache length.
  void set_start(index_t start);

  /// Recompute::selective, set before buffer_needs() is taken: forward
  /// keeps no probabilities, backward forms them again from Q and K (the
  /// same arithmetic, so the same results; one more S = Q Kᵀ and softmax).
  void recompute_probabilities(bool on) { recompute_ = on; }
  bool recomputes_probabilities() const { return recompute_; }

 private:
  void cached_forward(StepBuffers& buffers);
  detail::LocalAttention local() const;  // this rank's sequences and heads
  std::size_t gemm_scratch() const;

  Backend* backend_;
  std::string name_;
  index_t batch_, seq_, hidden_, heads_;
  int sequence_split_, head_split_;
  std::unique_ptr<Layer<T>> c_attn_, c_proj_;
  MatrixView<T> qkv_{}, ctx_{};
  T* probs_ = nullptr;
  bool recompute_ = false, forwarded_ = false;
  index_t cache_length_ = 0, start_ = 0;
  T* cache_k_ = nullptr;
  T* cache_v_ = nullptr;
};

template <class T>
class MLP final : public Layer<T> {
 public:
  /// `name` is the parameter prefix, e.g. "h.0.mlp" (c_fc, c_proj below it).
  MLP(SchemeContext<T>& scheme, std::string name, index_t tokens, index_t hidden);

  std::string_view name() const override { return name_; }
  void collect_parameters(std::vector<Param<T>*>& out) override;
  BufferNeeds buffer_needs() const override;
  void price(cost::Tally& t, model::Phase phase) const override;
  void forward(ConstMatrixView<T> X, MatrixView<T> Y, StepBuffers& buffers) override;
  void backward(ConstMatrixView<T> dY, MatrixView<T> dX, StepBuffers& buffers,
                bool accumulate = false) override;

  Layer<T>& c_fc() { return *c_fc_; }
  Layer<T>& c_proj() { return *c_proj_; }

 private:
  std::string name_;
  index_t rows_, cols_;  // the local inner [tokens, 4h] block
  std::unique_ptr<Layer<T>> c_fc_, c_proj_;
  GeLU<T> gelu_;
  MatrixView<T> fc_{}, act_{};
};

template <class T>
class TransformerBlock final : public Layer<T> {
 public:
  /// `name` is the parameter prefix, e.g. "h.3".
  TransformerBlock(SchemeContext<T>& scheme, std::string name, index_t batch, index_t seq,
                   index_t hidden, index_t heads, double eps = 1e-5);

  std::string_view name() const override { return name_; }
  void collect_parameters(std::vector<Param<T>*>& out) override;
  BufferNeeds buffer_needs() const override;
  void price(cost::Tally& t, model::Phase phase) const override;
  void forward(ConstMatrixView<T> X, MatrixView<T> Y, StepBuffers& buffers) override;
  void backward(ConstMatrixView<T> dY, MatrixView<T> dX, StepBuffers& buffers,
                bool accumulate = false) override;

  /// The block's input the next backward reads, as forward(X) keeps it:
  /// a pipeline stage keeping its blocks' activations per microbatch puts
  /// back the block's buffers.forward region, then this (Gpt::stage_backward).
  void restore_input(ConstMatrixView<T> X) { ln_1_->restore_input(X); }

  Layer<T>& ln_1() { return *ln_1_; }
  Attention<T>& attn() { return attn_; }
  Layer<T>& ln_2() { return *ln_2_; }
  MLP<T>& mlp() { return mlp_; }

 private:
  Backend* backend_;
  std::string name_;
  index_t rows_, cols_;  // the local outer [tokens, h] block
  std::unique_ptr<SplitLayerNorm<T>> ln_1_;
  Attention<T> attn_;
  std::unique_ptr<Layer<T>> ln_2_;
  MLP<T> mlp_;
  MatrixView<T> ln1_{}, mid_{}, ln2_{};
};

extern template class Attention<float>;
extern template class Attention<double>;
extern template class Attention<bf16>;
extern template class MLP<float>;
extern template class MLP<double>;
extern template class MLP<bf16>;
extern template class TransformerBlock<float>;
extern template class TransformerBlock<double>;
extern template class TransformerBlock<bf16>;

}  // namespace summa

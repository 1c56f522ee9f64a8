#pragma once
/// \file attention2d.hpp
/// GPT-2 causal self-attention on a q x q mesh (Optimus §3.2.2):
///   qkv = X c_attn + b (h -> 3h), per head softmax(Q Kᵀ / sqrt(d)) V with a
///   causal mask, context = heads concatenated, Y = context c_proj + b.
///
/// Distribution: X, context and Y [b*s, h] in q x q blocks; mesh row i holds
/// the b/q whole sequences [i*b/q, (i+1)*b/q) (batch over mesh rows, the
/// sequence is never split), mesh column j holds the hidden columns of heads
/// [j*n/q, (j+1)*n/q) (heads over mesh columns). c_attn's output columns are
/// distributed in three groups (Linear2DLayer groups = 3), so rank (i, j)'s
/// local qkv block [b*s/q, 3h/q] is [Q_j | K_j | V_j] for its heads: QKᵀ and
/// the product with V are local GEMMs, only the two projections communicate.
/// Requires batch % q == 0, hidden % heads == 0 and heads % q == 0.
///
/// forward() keeps in buffers.forward: qkv [b*s/q, 3h/q], the probabilities
/// [b/q, n/q, s, s] and the context [b*s/q, h/q]. backward() takes dcontext,
/// dqkv and one s x s matrix from buffers.backward.

#include <memory>
#include <string>

#include "summa/layers/linear2d.hpp"

namespace summa {

namespace detail {
struct LocalAttention;  // src/layers/attention_core.hpp
}

template <class T>
class Attention2D final : public Layer<T> {
 public:
  /// `name` is the parameter prefix, e.g. "h.0.attn" (c_attn, c_proj below it).
  Attention2D(SummaEngine& engine, std::string name, index_t batch, index_t seq, index_t hidden,
              index_t heads);

  std::string_view name() const override { return name_; }
  void collect_parameters(std::vector<Param<T>*>& out) override;
  BufferNeeds buffer_needs() const override;
  void forward(ConstMatrixView<T> X, MatrixView<T> Y, StepBuffers& buffers) override;
  void backward(ConstMatrixView<T> dY, MatrixView<T> dX, StepBuffers& buffers,
                bool accumulate = false) override;

  Linear2DLayer<T>& c_attn() { return c_attn_; }
  Linear2DLayer<T>& c_proj() { return c_proj_; }
  /// Local views of the last forward's qkv ([Q_j | K_j | V_j]) and context.
  ConstMatrixView<T> qkv() const { return qkv_; }
  ConstMatrixView<T> context() const { return ctx_; }

 private:
  detail::LocalAttention local() const;  // this rank's sequences and heads
  std::size_t gemm_scratch() const;

  SummaEngine* engine_;
  std::string name_;
  index_t batch_, seq_, hidden_, heads_;
  int q_;
  Linear2DLayer<T> c_attn_, c_proj_;
  MatrixView<T> qkv_{}, ctx_{};
  T* probs_ = nullptr;
};

extern template class Attention2D<float>;
extern template class Attention2D<double>;
extern template class Attention2D<bf16>;

}  // namespace summa

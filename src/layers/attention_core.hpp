#pragma once
// The per-rank core of causal multi-head self-attention, shared by the
// attention layer (summa::Attention, layers/transformer.hpp) of every scheme;
// not installed.
// Each scheme differs only in how many sequences and heads a rank holds; the
// local arithmetic is the same.

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "summa/backend/backend.hpp"
#include "summa/core/bf16.hpp"
#include "summa/core/matrix_view.hpp"
#include "summa/model/cost.hpp"

namespace summa::detail {

/// A rank's share of an attention layer: `seqs` whole sequences of `seq`
/// tokens (consecutive rows, sequence after sequence) and `heads` whole heads
/// of `head_dim` columns each. In the qkv matrix Q, K and V are side by side:
/// columns [0, w), [w, 2w), [2w, 3w) with w = heads * head_dim; head k of each
/// is columns [k * head_dim, (k + 1) * head_dim) of its part. The context has
/// the layout of Q.
struct LocalAttention {
  index_t seqs, seq, heads, head_dim;

  [[nodiscard]] index_t width() const { return heads * head_dim; }
  [[nodiscard]] index_t tokens() const { return seqs * seq; }
  /// Elements of the saved softmax probabilities: seqs * heads matrices s x s.
  [[nodiscard]] index_t probs_elems() const { return seqs * heads * seq * seq; }
  /// Elements of the backward's dP scratch: one sequence's heads at a time.
  [[nodiscard]] index_t dprobs_elems() const { return heads * seq * seq; }
  [[nodiscard]] double scale() const { return 1.0 / std::sqrt(static_cast<double>(head_dim)); }

  /// What forward() (or backward()) does, for the step-time model: one
  /// strided-batched call of `heads` products per sequence, the softmax,
  /// and the copies between token-major and head-major layouts; e: the
  /// element size. `recompute`: backward first forms the probabilities
  /// again (S = Q Kᵀ and the softmax; Recompute::selective).
  void price(cost::Tally& t, bool backward, cost::u64 e, bool recompute = false) const {
    const auto u = [](index_t v) { return static_cast<cost::u64>(v); };
    const cost::u64 s = u(seq), d = u(head_dim), sequences = u(seqs), h = u(heads);
    const cost::u64 scores = sequences * h * s * s * e, qkv = u(tokens()) * 3 * u(width()) * e;
    const auto probabilities = [&] {
      t.gemm(model::GemmMode::nt, s, s, d, e, h, sequences);           // S = Q Kᵀ
      t.pointwise(model::Pointwise::softmax, scores / e, 3 * scores);  // masked softmax
    };
    if (!backward) {
      t.memory(qkv);  // head-major q, k, v
      probabilities();
      t.gemm(model::GemmMode::nn, s, d, s, e, h, sequences);  // O = P V
      t.memory(2 * (qkv / 3));                                // context, token-major
    } else {
      t.memory(2 * (qkv / 3));
      if (recompute) probabilities();
      t.gemm(model::GemmMode::nt, s, s, d, e, h, sequences);  // dP = dO Vᵀ
      t.gemm(model::GemmMode::tn, s, d, s, e, h, sequences);  // dV = Pᵀ dO
      t.memory(4 * scores);                                   // softmax backward
      t.gemm(model::GemmMode::nn, s, d, s, e, h, sequences);  // dQ = dS K
      t.gemm(model::GemmMode::tn, s, d, s, e, h, sequences);  // dK = dSᵀ Q
      t.memory(qkv);
    }
  }

  /// GEMM scratch bytes forward() and backward() need.
  [[nodiscard]] std::size_t scratch_bytes(const Backend& be, DType t) const {
    return std::max(be.gemm_scratch_bytes(seq, seq, head_dim, t),
                    be.gemm_scratch_bytes(seq, head_dim, seq, t));
  }

  /// Sequence b's probabilities P = softmax_causal(scale * Q Kᵀ), its heads
  /// in one strided batch into `Pb` (heads matrices s x s, s * s apart).
  template <class T>
  void probabilities(Backend& be, ConstMatrixView<T> qkv, index_t b, T* Pb, Scratch scratch) const {
    using A = acc_t<T>;
    const index_t s = seq, d = head_dim, w = width(), ss = s * s;
    const auto Q = qkv.block(b * s, 0, s, d);
    const auto K = qkv.block(b * s, w, s, d);
    const auto P = MatrixView<T>::dense(Pb, s, s, Order::row_major);
    be.gemm_strided_batched(Op::N, Op::T, A(1), Q, d, K, d, A(0), P, ss, heads, scratch);
    for (index_t k = 0; k < heads; ++k) {
      const auto Pk = MatrixView<T>::dense(Pb + k * ss, s, s, Order::row_major);
      be.softmax_causal(Pk, scale(), Pk);
    }
  }

  /// ctx = softmax_causal(scale * Q Kᵀ) V per sequence and head. Per
  /// sequence, the heads go in one strided batch: Q/K/V/context blocks of
  /// consecutive heads are head_dim columns apart, probabilities seq * seq
  /// elements apart. `keep`: the probabilities stay in `probs` for backward
  /// (probs_elems() elements); otherwise `probs` holds one sequence's
  /// (dprobs_elems()), overwritten by the next.
  template <class T>
  void forward(Backend& be, ConstMatrixView<T> qkv, T* probs, bool keep, MatrixView<T> ctx,
               Scratch scratch) const {
    using A = acc_t<T>;
    const index_t s = seq, d = head_dim, w = width(), ss = s * s;
    for (index_t b = 0; b < seqs; ++b) {
      T* const Pb = keep ? probs + b * heads * ss : probs;
      probabilities(be, qkv, b, Pb, scratch);
      const auto V = qkv.block(b * s, 2 * w, s, d);
      const auto P = ConstMatrixView<T>::dense(Pb, s, s, Order::row_major);
      be.gemm_strided_batched(Op::N, Op::N, A(1), P, ss, V, d, A(0), ctx.block(b * s, 0, s, d), d,
                              heads, scratch);
    }
  }

  /// dqkv from dctx, given forward()'s qkv and probabilities; dP is
  /// dprobs_elems() elements of scratch. `recompute`: `probs` is one
  /// sequence's room (dprobs_elems()), each sequence's probabilities formed
  /// there again first (Recompute::selective); otherwise the probabilities
  /// forward() kept. Overwrites all of dqkv.
  template <class T>
  void backward(Backend& be, ConstMatrixView<T> qkv, T* probs, bool recompute,
                ConstMatrixView<T> dctx, MatrixView<T> dqkv, T* dP, Scratch scratch) const {
    using A = acc_t<T>;
    const index_t s = seq, d = head_dim, w = width(), ss = s * s;
    const auto dPm = MatrixView<T>::dense(dP, s, s, Order::row_major);
    for (index_t b = 0; b < seqs; ++b) {
      const auto Q = qkv.block(b * s, 0, s, d);
      const auto K = qkv.block(b * s, w, s, d);
      const auto V = qkv.block(b * s, 2 * w, s, d);
      const auto dC = dctx.block(b * s, 0, s, d);
      T* const Pb = recompute ? probs : probs + b * heads * ss;
      if (recompute) probabilities(be, qkv, b, Pb, scratch);
      const auto P = ConstMatrixView<T>::dense(Pb, s, s, Order::row_major);
      be.gemm_strided_batched(Op::N, Op::T, A(1), dC, d, V, d, A(0), dPm, ss, heads,
                              scratch);  // dP = dC Vᵀ
      be.gemm_strided_batched(Op::T, Op::N, A(1), P, ss, dC, d, A(0),
                              dqkv.block(b * s, 2 * w, s, d), d, heads, scratch);  // dV = Pᵀ dC
      for (index_t k = 0; k < heads; ++k) {
        const auto Pk = ConstMatrixView<T>::dense(Pb + k * ss, s, s, Order::row_major);
        const auto dPk = MatrixView<T>::dense(dP + k * ss, s, s, Order::row_major);
        be.softmax_causal_backward(Pk, dPk, scale(), dPk);  // dS
      }
      const ConstMatrixView<T> dS = dPm;
      be.gemm_strided_batched(Op::N, Op::N, A(1), dS, ss, K, d, A(0), dqkv.block(b * s, 0, s, d), d,
                              heads, scratch);  // dQ = dS K
      be.gemm_strided_batched(Op::T, Op::N, A(1), dS, ss, Q, d, A(0), dqkv.block(b * s, w, s, d), d,
                              heads, scratch);  // dK = dSᵀ Q
    }
  }
};

}  // namespace summa::detail

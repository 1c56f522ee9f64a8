#pragma once
/// \file linear2d.hpp
/// Y = X W + b on a q x q mesh (Optimus §3.2.1), the building block of every
/// projection of the 2D transformer.
///
/// Distribution, for X [tokens, in], W [in, out], Y [tokens, out] (HF Conv1D
/// layout, y = x W + b): every matrix is split into q x q blocks and rank
/// (i, j) holds block (i, j) — tokens over mesh rows, features over mesh
/// columns. The bias [out] is owned by mesh row 0: rank (0, j) holds
/// b[j*out/q, (j+1)*out/q), broadcasts it down mesh column j in forward, and
/// receives the column-reduced bias gradient in backward. Every bias element
/// thus has exactly one owner (the optimizer updates it once) and its gradient
/// sums every token's contribution; ranks of rows > 0 hold no bias.
///
/// forward:  Y = X W (SUMMA AB) + b
/// backward: dX = dY W' (SUMMA ABt), dW = X' dY (SUMMA AtB), db = column sums
///           of dY reduced along mesh columns to row 0.

#include "summa/summa/engine.hpp"

namespace summa {

class Linear2D {
 public:
  /// Global sizes; throws summa::Error (the same on every rank) when q does
  /// not divide them.
  Linear2D(SummaEngine& engine, index_t tokens, index_t in, index_t out, bool has_bias = true);

  index_t tokens() const { return tokens_; }
  index_t in() const { return in_; }
  index_t out() const { return out_; }
  bool has_bias() const { return has_bias_; }
  /// True on the ranks that own a bias slice (mesh row 0).
  bool owns_bias() const;
  /// Local block shapes: X and dX [tokens/q, in/q], W and dW [in/q, out/q],
  /// Y and dY [tokens/q, out/q], bias and its gradient out/q on owners.
  index_t local_tokens() const { return tokens_ / q_; }
  index_t local_in() const { return in_ / q_; }
  index_t local_out() const { return out_ / q_; }

  /// Workspace a forward or backward call needs.
  std::size_t workspace_bytes(DType t) const;

  /// Y = X W + b. `bias` is read on owners only (may be null elsewhere).
  template <class T>
  void forward(ConstMatrixView<T> X, ConstMatrixView<T> W, const T* bias, MatrixView<T> Y,
               Workspace& ws);

  /// dX = dY W', dW (+)= X' dY, dbias (+)= column sums of dY (on owners; may
  /// be null elsewhere). With `accumulate` the parameter gradients are added
  /// to (gradient accumulation), otherwise overwritten (never read). An empty
  /// dX view (0 x 0) skips the input gradient (first layer).
  template <class T>
  void backward(ConstMatrixView<T> X, ConstMatrixView<T> W, ConstMatrixView<T> dY, MatrixView<T> dX,
                MatrixView<T> dW, T* dbias, Workspace& ws, bool accumulate = false);

 private:
  SummaEngine* engine_;
  index_t tokens_, in_, out_;
  bool has_bias_;
  int q_;
};

}  // namespace summa

#pragma once
/// \file embedding.hpp
/// Token and position embeddings on a q x q mesh, vocabulary partitioned.
///
/// wte [vocab, h] is split into q x q blocks: rank (i, j) holds vocabulary
/// rows [i*V/q, (i+1)*V/q) and hidden columns [j*h/q, (j+1)*h/q) — the same
/// blocks the tied LM head multiplies with (logits = X wteᵀ, SUMMA ABᵀ).
/// wpe [n_positions, h] is split the same way in chunks of ceil(P/q)
/// positions (the last mesh rows may hold fewer or none).
///
/// forward: every rank (r, j) builds, for all b*s tokens, the sum of the
/// wte and wpe rows it holds ([b*s, h/q], zero elsewhere); a reduce-scatter
/// along mesh column j leaves token block i on rank (i, j). backward: an
/// all-gather of dY along the mesh column, then each rank scatter-adds into
/// the rows it holds. Token ids are the *global* batch ([batch*seq],
/// row-major [batch, seq]), the same on every rank of the mesh.

#include <cstdint>
#include <span>
#include <vector>

#include "summa/layers/layer.hpp"
#include "summa/summa/engine.hpp"

namespace summa {

template <class T>
class Embedding2D final : public EmbeddingModule<T> {
 public:
  Embedding2D(SummaEngine& engine, index_t batch, index_t seq, index_t vocab, index_t hidden,
              index_t n_positions);

  std::string_view name() const override { return ""; }
  void collect_parameters(std::vector<Param<T>*>& out) override;
  BufferNeeds buffer_needs() const override;
  void price(cost::Tally& t, model::Phase phase) const override;

  /// Throws summa::Error on every rank unless `ids` holds batch*seq ids in
  /// [0, vocab) (what = "token" or "target", for the message).
  void check_ids(std::span<const std::int32_t> ids, const char* what) const override;
  void set_positions(std::span<const std::int32_t> positions) override;

  /// Y [batch*seq/q, h/q] = wte[tokens] + wpe[positions] (local block).
  /// `tokens` are host memory; they are copied to backend memory the layer
  /// owns (kept for backward, so the caller need not keep them alive).
  void forward(std::span<const std::int32_t> tokens, MatrixView<T> Y,
               StepBuffers& buffers) override;
  /// wte / wpe gradients (+)= the rows' gradients from dY.
  void backward(ConstMatrixView<T> dY, StepBuffers& buffers, bool accumulate = false) override;

  Param<T>& wte() override { return wte_; }
  Param<T>& wpe() { return wpe_; }
  index_t position_chunk() const { return chunk_; }

 private:
  SummaEngine* engine_;
  index_t batch_, seq_, vocab_, hidden_, positions_;
  int q_;
  index_t chunk_;
  Param<T> wte_, wpe_;
  BackendIds position_ids_;  // r % seq for the global batch, uploaded once
  BackendIds tokens_;        // the last forward's token ids
};

extern template class Embedding2D<float>;
extern template class Embedding2D<double>;
extern template class Embedding2D<bf16>;

}  // namespace summa

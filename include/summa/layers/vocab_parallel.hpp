#pragma once
/// \file vocab_parallel.hpp
/// The vocabulary-parallel token embedding, tied LM head and cross-entropy
/// (Megatron's; AxoNN's 3D generalisation), written once over the axes a
/// scheme supplies (VocabLayout): the vocabulary split over one axis (Gv
/// ranks), the hidden columns over a second (Gh), the tokens over a third
/// (Gt), which also shards each rank's block of wte (all-gathered before use
/// and its gradient reduce-scattered after). The 1D scheme is Gv = p, Gh =
/// Gt = 1; the 3D scheme Gv = Gx, Gh = Gy, Gt = Gz. No collective runs over
/// an axis of one rank (nothing to move), in the code and in its cost.
///
/// Each op's communication is priced beside it (vocab_cost below, which the
/// ops' price() calls), so the traffic and step-time models cannot drift
/// from the code.

#include <cstddef>
#include <span>

// AxisSplit, and the forward declarations of cost::Tally and cost::Elements
#include "summa/layers/split_layer_norm.hpp"

namespace summa {

/// Where a scheme runs its vocabulary-parallel ops.
struct VocabLayout {
  const char* scheme = "";  // "1D", "3D": the classes' names in messages (Embedding1D)
  AxisSplit vocab;          // splits the vocabulary (wte rows, logits columns)
  AxisSplit hidden;         // splits the hidden columns (wte, wpe, X)
  AxisSplit tokens;         // splits the tokens; shards each wte vocabulary block
  /// LM head backward: dX's all-reduce over the vocabulary axis overlapped
  /// with the wte gradient's GEMM.
  bool overlap_dx = true;
  /// Whether the step-time model hides that all-reduce behind the GEMM
  /// (with overlap_dx). 1D: false, its dX all-reduces priced exposed (see
  /// src/schemes/megatron1d/layers.cpp).
  bool price_overlap_dx = true;
  /// Construction- and call-time agreements run over this axis.
  CommAxis agree_axis = CommAxis::tensor;
  /// The outer activations (the embedding's output, the LM head's input)
  /// split by tokens over the vocabulary axis (1D sequence parallelism;
  /// needs a tokens axis of one): the embedding reduce-scatters its output
  /// rows instead of all-reducing them and all-gathers dY in backward; the
  /// LM head all-gathers X's rows (again in backward) and reduce-scatters dX
  /// instead of all-reducing it.
  bool sequence_parallel = false;
};

/// Token and position embeddings. Rank (v, h, t) holds wte rows
/// [v*V/Gv + t*V/(Gv*Gt), +V/(Gv*Gt)), columns [h*H/Gh, +H/Gh); wpe
/// [n_positions, H/Gh] replicated over the vocabulary and token axes (the
/// rank with v = t = 0 owns it).
///
/// forward:  wte's block gathered over the tokens axis; Y [tokens/Gt, H/Gh]
///           = the wte rows of this rank's tokens in its vocabulary range
///           (zero elsewhere), all-reduced over the vocabulary axis, plus
///           wpe[positions] locally.
/// backward: scatter-add of dY into wte's block and wpe; over the tokens
///           axis wpe's gradient is all-reduced and wte's reduce-scattered.
/// Token ids are the global batch ([batch*seq], row-major [batch, seq]), the
/// same on every rank; a rank embeds its tokens axis block of them.
template <class T>
class VocabEmbedding : public EmbeddingModule<T> {
 public:
  VocabEmbedding(ProcessGrid& grid, Backend& backend, VocabLayout layout, index_t batch,
                 index_t seq, index_t vocab, index_t hidden, index_t n_positions);

  std::string_view name() const override { return ""; }
  void collect_parameters(std::vector<Param<T>*>& out) override;
  BufferNeeds buffer_needs() const override;
  void check_ids(std::span<const std::int32_t> ids, const char* what) const override;
  void price(cost::Tally& t, model::Phase phase) const override;
  void set_positions(std::span<const std::int32_t> positions) override;
  void restore_tokens(std::span<const std::int32_t> tokens) override;
  void forward(std::span<const std::int32_t> tokens, MatrixView<T> Y,
               StepBuffers& buffers) override;
  void backward(ConstMatrixView<T> dY, StepBuffers& buffers, bool accumulate = false) override;

  Param<T>& wte() override { return wte_; }
  Param<T>& wpe() { return wpe_; }
  /// First global vocabulary row of this rank's (gathered) wte block.
  index_t vocab_begin() const;

 private:
  ProcessGrid* grid_;
  Backend* backend_;
  VocabLayout layout_;
  index_t batch_, seq_, vocab_, hidden_, positions_;
  Param<T> wte_, wpe_;
  BackendIds position_ids_;      // this rank's tokens' positions, uploaded once
  BackendIds own_position_ids_;  // sequence parallelism: those of the rank's output rows
  BackendIds tokens_;            // the last forward's token ids (this rank's block)
};

/// Vocabulary-parallel cross-entropy: local logits Z [tokens/Gt, V/Gv] of
/// this rank's vocabulary range; the row max is all-reduced (max), then the
/// row sums of exp(z - max) and the target logits in one all-reduce (sum),
/// both over the vocabulary axis in acc_t<T> (fp32 for bf16 logits); the
/// summed loss over the tokens axis. backward turns Z into dL/dZ = (softmax
/// - onehot) / normalizer in place.
template <class T>
class VocabCrossEntropy {
 public:
  /// `normalizer`: the token count the summed loss is divided by (0:
  /// tokens, the mean). A data-parallel model passes the global token
  /// count, so that its data groups' losses and gradients add up.
  VocabCrossEntropy(ProcessGrid& grid, Backend& backend, VocabLayout layout, index_t tokens,
                    index_t vocab, index_t normalizer = 0);
  BufferNeeds buffer_needs() const;
  /// Z: local logits; targets: the global [tokens] ids, the same on every
  /// rank. Returns the summed loss / normalizer (the same on every rank);
  /// keeps the row statistics in buffers.forward and the targets for
  /// backward.
  double forward(ConstMatrixView<T> Z, std::span<const std::int32_t> targets, StepBuffers& buffers);
  /// In place: Z (the logits given to forward) becomes dL/dZ.
  void backward(MatrixView<T> Z, StepBuffers& buffers);

 private:
  ProcessGrid* grid_;
  Backend* backend_;
  VocabLayout layout_;
  index_t tokens_, vocab_, normalizer_;
  acc_t<T>* max_ = nullptr;    // row statistics in acc_t<T> (fp32 for bf16)
  acc_t<T>* stats_ = nullptr;  // sum | picked target logit
  BackendIds targets_;         // in backend memory
};

/// Tied LM head: logits [tokens/Gt, V/Gv] = X wteᵀ with the embedding's wte
/// block (gathered over the tokens axis), X [tokens/Gt, H/Gh], the partial
/// products all-reduced over the hidden axis; then VocabCrossEntropy.
/// backward: dX = dZ wte all-reduced over the vocabulary axis (overlapped
/// with dwte = dZᵀ X when the layout says so), dwte reduce-scattered over
/// the tokens axis.
template <class T>
class VocabLMHead : public LossHead<T> {
 public:
  /// `wte` is the embedding's parameter (tied; the head owns no parameter).
  VocabLMHead(ProcessGrid& grid, Backend& backend, VocabLayout layout, Param<T>& wte,
              index_t tokens, index_t hidden, index_t vocab, index_t normalizer = 0);

  std::string_view name() const override { return "lm_head"; }
  void collect_parameters(std::vector<Param<T>*>&) override {}
  BufferNeeds buffer_needs() const override;
  void price(cost::Tally& t, model::Phase phase) const override;
  double forward(ConstMatrixView<T> X, std::span<const std::int32_t> targets,
                 StepBuffers& buffers) override;
  void backward(MatrixView<T> dX, StepBuffers& buffers, bool accumulate = false) override;
  /// Local logits of the last forward (vocabulary columns [v*V/Gv,
  /// (v+1)*V/Gv)); backward overwrites them with dL/dlogits.
  ConstMatrixView<T> logits() const override { return logits_; }

 private:
  std::size_t scratch_bytes() const;
  MatrixView<T> gathered_wte(T* buffer);
  /// Rows of X and dX (tokens/Gv under sequence parallelism, else tokens/Gt).
  index_t x_rows() const;
  void sequence_parallel_backward(MatrixView<T> dX, StepBuffers& buffers, bool accumulate);

  ProcessGrid* grid_;
  Backend* backend_;
  VocabLayout layout_;
  Param<T>* wte_;
  index_t tokens_, hidden_, vocab_;
  VocabCrossEntropy<T> loss_;
  MatrixView<T> logits_{};
  ConstMatrixView<T> x_{};
};

/// The ops' cost (bytes and calls per axis, flops, memory traffic) on one
/// rank of `layout`, in the order the code runs them.
namespace vocab_cost {
using u64 = std::uint64_t;
void embedding_forward(cost::Tally& t, const VocabLayout& layout, const cost::Elements& el,
                       u64 tokens, u64 vocab, u64 hidden);
void embedding_backward(cost::Tally& t, const VocabLayout& layout, const cost::Elements& el,
                        u64 tokens, u64 vocab, u64 hidden, u64 positions);
/// Elements of wte and wpe a rank holds.
u64 embedding_params(const VocabLayout& layout, u64 vocab, u64 hidden, u64 positions);
/// The cross-entropy on local logits [tokens/Gt, V/Gv] (VocabCrossEntropy),
/// part of the LM head's cost; the 2D LM head prices its loss with it too.
void cross_entropy_forward(cost::Tally& t, const VocabLayout& layout, const cost::Elements& el,
                           u64 tokens, u64 vocab);
void cross_entropy_backward(cost::Tally& t, const VocabLayout& layout, const cost::Elements& el,
                            u64 tokens, u64 vocab);
void lm_head_forward(cost::Tally& t, const VocabLayout& layout, const cost::Elements& el,
                     u64 tokens, u64 vocab, u64 hidden);
void lm_head_backward(cost::Tally& t, const VocabLayout& layout, const cost::Elements& el,
                      u64 tokens, u64 vocab, u64 hidden);
}  // namespace vocab_cost

extern template class VocabEmbedding<float>;
extern template class VocabEmbedding<double>;
extern template class VocabEmbedding<bf16>;
extern template class VocabCrossEntropy<float>;
extern template class VocabCrossEntropy<double>;
extern template class VocabCrossEntropy<bf16>;
extern template class VocabLMHead<float>;
extern template class VocabLMHead<double>;
extern template class VocabLMHead<bf16>;

}  // namespace summa

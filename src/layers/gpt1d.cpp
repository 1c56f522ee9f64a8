#include "summa/layers/gpt1d.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <string>

namespace summa {

namespace {

ProcessGrid& checked(ProcessGrid& grid, const reference::GptConfig& c, index_t batch, index_t seq) {
  const int p = grid.tensor().size();
  std::optional<std::string> error;
  try {
    c.validate();
  } catch (const Error& e) {
    error = fmt::format("GPT1D: {}", e.what());
  }
  const auto bad = [&](const char* what, index_t v) {
    if (!error && v % p != 0)
      error = fmt::format("GPT1D: {}={} must be divisible by p={}", what, v, p);
  };
  if (!error && (batch <= 0 || seq <= 0))
    error = fmt::format("GPT1D: batch={} and seq={} must be positive", batch, seq);
  bad("n_embd (hidden)", c.n_embd);
  bad("n_head", c.n_head);
  bad("vocab_size", c.vocab_size);
  if (!error && seq > c.n_positions)
    error = fmt::format("GPT1D: seq={} is longer than the position table (n_positions={})", seq,
                        c.n_positions);
  if (!error && grid.shape().data != 1)
    error =
        fmt::format("GPT1D: data-parallel grids (data={}) are not supported; use one tensor group",
                    grid.shape().data);
  grid.agree(CommAxis::world, error);
  return grid;
}

}  // namespace

template <class T>
GPT1D<T>::GPT1D(ProcessGrid& grid, Backend& backend, const reference::GptConfig& config,
                index_t batch, index_t seq, GptOptions options)
    : grid_(&checked(grid, config, batch, seq)),
      backend_(&backend),
      config_(config),
      options_(options),
      batch_(batch),
      seq_(seq) {
  const index_t h = config.n_embd, tokens = batch * seq;
  embedding_ = std::make_unique<Embedding1D<T>>(grid, backend, batch, seq, config.vocab_size, h,
                                                config.n_positions);
  for (int i = 0; i < config.n_layer; ++i)
    blocks_.push_back(std::make_unique<TransformerBlock1D<T>>(grid, backend, fmt::format("h.{}", i),
                                                              batch, seq, h, config.n_head,
                                                              config.layer_norm_epsilon));
  ln_f_ =
      std::make_unique<LayerNorm1D<T>>(grid, backend, "ln_f", tokens, h, config.layer_norm_epsilon);
  head_ =
      std::make_unique<LMHead1D<T>>(grid, backend, embedding_->wte(), tokens, h, config.vocab_size);
  store_ = std::make_unique<ParameterStore<T>>(backend, this->parameters());

  const BufferNeeds needs = buffer_needs();
  ByteCount<T> slot;
  slot.add(tokens * h);
  ModelBuffers::Sizes sizes{.workspace = needs.workspace,
                            .forward = needs.forward,
                            .backward = needs.backward,
                            .conjunction = 2 * slot.bytes(),
                            .checkpoint = static_cast<std::size_t>(config.n_layer + 1) * slot};
  buffers_ = std::make_unique<ModelBuffers>(backend, sizes);
  const auto take = [&](Arena& a) {
    return MatrixView<T>::dense(a.take<T>(static_cast<std::size_t>(tokens * h)), tokens, h,
                                Order::row_major);
  };
  for (int i = 0; i <= config.n_layer; ++i) boundaries_.push_back(take(buffers_->checkpoint));
  conj_[0] = take(buffers_->conjunction);
  conj_[1] = take(buffers_->conjunction);
  tokens_.resize(static_cast<std::size_t>(tokens));
  targets_.resize(static_cast<std::size_t>(tokens));
}

template <class T>
GPT1D<T>::~GPT1D() = default;

template <class T>
void GPT1D<T>::collect_parameters(std::vector<Param<T>*>& out) {
  embedding_->collect_parameters(out);
  for (auto& b : blocks_) b->collect_parameters(out);
  ln_f_->collect_parameters(out);
  head_->collect_parameters(out);  // tied: nothing of its own
}

template <class T>
BufferNeeds GPT1D<T>::buffer_needs() const {
  ByteCount<T> slot;
  slot.add(batch_ * seq_ * config_.n_embd);
  const BufferNeeds block = blocks_.front()->buffer_needs();
  // the head: LN_f's output and statistics, the logits and loss statistics
  BufferNeeds head{.workspace = 0, .forward = slot, .backward = 0};
  head.then(ln_f_->buffer_needs()).then(head_->buffer_needs());
  const std::size_t head_backward = slot + head.backward;  // dL/d LN_f output
  BufferNeeds all;
  all.workspace = std::max({embedding_->buffer_needs().workspace, block.workspace, head.workspace});
  all.forward = options_.checkpoint
                    ? std::max(block.forward, head.forward)
                    : static_cast<std::size_t>(config_.n_layer) * block.forward + head.forward;
  all.backward = std::max(block.backward, head_backward);
  return all;
}

template <class T>
void GPT1D<T>::init(std::uint64_t seed) {
  store_->init_gpt(seed, config_);
}

template <class T>
ConstMatrixView<T> GPT1D<T>::boundary(int i) const {
  require(i >= 0 && i <= config_.n_layer,
          [&] { return fmt::format("GPT1D boundary {}: expected 0..{}", i, config_.n_layer); });
  return boundaries_[static_cast<std::size_t>(i)];
}

template <class T>
double GPT1D<T>::forward(std::span<const std::int32_t> tokens,
                         std::span<const std::int32_t> targets) {
  have_forward_ = false;
  embedding_->check_ids(tokens, "token");
  embedding_->check_ids(targets, "target");
  std::copy(tokens.begin(), tokens.end(), tokens_.begin());
  std::copy(targets.begin(), targets.end(), targets_.begin());
  ModelBuffers& B = *buffers_;
  B.forward.reset();
  B.backward.reset();
  B.workspace.reset();
  StepBuffers step = B.step();
  embedding_->forward(tokens_, boundaries_[0], step);
  for (std::size_t i = 0; i < blocks_.size(); ++i) {
    const std::size_t mark = B.forward.mark();
    blocks_[i]->forward(boundaries_[i], boundaries_[i + 1], step);
    if (options_.checkpoint) B.forward.release(mark);
  }
  const index_t tokens_n = batch_ * seq_, h = config_.n_embd;
  lnf_ = MatrixView<T>::dense(B.forward.take<T>(static_cast<std::size_t>(tokens_n * h)), tokens_n,
                              h, Order::row_major);
  ln_f_->forward(boundaries_.back(), lnf_, step);
  const double loss = head_->forward(lnf_, targets_, step);
  have_forward_ = true;
  return loss;
}

template <class T>
void GPT1D<T>::backward(bool accumulate) {
  require(have_forward_, "GPT1D backward: no forward pass to differentiate");
  have_forward_ = false;
  ModelBuffers& B = *buffers_;
  StepBuffers step = B.step();
  if (!accumulate) store_->zero_grads();
  const index_t tokens_n = batch_ * seq_, h = config_.n_embd;
  {
    ArenaScope scope(B.backward);
    const auto dlnf = MatrixView<T>::dense(
        B.backward.take<T>(static_cast<std::size_t>(tokens_n * h)), tokens_n, h, Order::row_major);
    head_->backward(dlnf, step, true);
    ln_f_->backward(dlnf, conj_[0], step, true);
  }
  int cur = 0;
  for (std::size_t i = blocks_.size(); i-- > 0;) {
    if (options_.checkpoint) {
      // Recompute block i from its checkpointed input; its output goes to the
      // free conjunction slot (backward does not read a block's output).
      B.forward.reset();
      blocks_[i]->forward(boundaries_[i], conj_[1 - cur], step);
    }
    blocks_[i]->backward(conj_[cur], conj_[1 - cur], step, true);
    cur = 1 - cur;
  }
  embedding_->backward(conj_[cur], step, true);
  input_grad_ = conj_[cur];
}

template <class T>
MemoryReport GPT1D<T>::memory_report() const {
  MemoryReport r;
  r.parameters = store_->values().capacity();
  r.gradients = store_->grads().capacity();
  r.activations = buffers_->forward.high_water() + buffers_->checkpoint.high_water();
  r.buffers.push_back({"parameters", store_->values().capacity(), store_->values().high_water()});
  r.buffers.push_back({"gradients", store_->grads().capacity(), store_->grads().high_water()});
  for (BufferUsage& u : buffers_->usage()) r.buffers.push_back(std::move(u));
  return r;
}

template class GPT1D<float>;
template class GPT1D<double>;

}  // namespace summa

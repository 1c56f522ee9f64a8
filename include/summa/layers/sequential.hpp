#pragma once
/// \file sequential.hpp
/// Users' own models under any scheme: a sequential container of layers
/// made by a SchemeContext, which owns the layers, their parameters, the
/// step arenas and every activation, and runs backward in reverse; the
/// scatter / gather of a global activation to and from its local blocks;
/// the data-axis gradient sum. See docs/custom_models.md.
///
///   Megatron1DContext<float> scheme(grid, backend);   // or 2D, 3D, make_context
///   Sequential<float> mlp(scheme, tokens, 64);         // input [tokens, 64], outer
///   mlp.linear("fc1", 256, LinearRole::expand);        // -> inner [tokens, 256]
///   mlp.gelu();
///   mlp.linear("fc2", 64, LinearRole::contract);       // -> outer [tokens, 64]
///   mlp.finish();                                      // allocates everything
///
/// Residual connections and parallel branches nest a Chain of layers:
///
///   Sequential<float> block(scheme, tokens, 64);       // a pre-LN transformer block
///   block.residual([&](Chain<float>& f) {              // x + Attn(LN1(x))
///     f.layer_norm("h.0.ln_1");
///     f.attention("h.0.attn", seq, heads);
///   });
///   block.residual([&](Chain<float>& f) {              // x + MLP(LN2(x))
///     f.layer_norm("h.0.ln_2");
///     f.linear("h.0.mlp.c_fc", 256, LinearRole::expand);
///     f.gelu();
///     f.linear("h.0.mlp.c_proj", 64, LinearRole::contract);
///   });
///   block.parallel({a, b});                            // a(x) + b(x), a and b built alike
///   block.parallel({a, b}, Combine::concat);           // [a(x) | b(x)], read by a linear
///
/// The container runs the scheme's hooks for state its layers share
/// (SchemeContext::finish_layers in finish(), begin_forward in forward(),
/// complete_deferred at the end of backward(): the 3D ORS / OAG overlaps),
/// so a context with such state serves one model.
///
/// `tokens` are the rows of this rank's data group; with a data axis each
/// group passes its own rows, divides its loss by the global token count and
/// calls sync_data_gradients() after backward.

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "summa/layers/gelu.hpp"
#include "summa/layers/parameters.hpp"
#include "summa/layers/scheme_context.hpp"
#include "summa/memory/arena.hpp"

namespace summa {

template <class T>
class Chain;
template <class T>
class Parallel;

/// How parallel branches combine: summed (every branch ends in the same
/// width and layout), or concatenated along the columns: n branches that
/// each end [tokens, w] in one layout give [tokens, n*w] in that layout,
/// *grouped* (each branch's w columns split over the ranks as a whole
/// activation, a rank's block its block of every branch side by side:
/// ColumnGroups). A grouped activation is read by a linear (its weight rows
/// follow the groups) or a gelu; layer_norm, attention, residual, parallel
/// and the end of a Sequential refuse it.
enum class Combine : std::uint8_t { sum, concat };

/// What Sequential, a residual's body and a parallel branch share: a list of
/// layers appended in order, each reading the previous one's output (the
/// first reads the stack's input, [tokens, in_width] in in_layout).
template <class T>
class LayerStack {
 public:
  virtual ~LayerStack();
  LayerStack(const LayerStack&) = delete;
  LayerStack& operator=(const LayerStack&) = delete;

  /// Appends `layer`, whose input is the previous output and whose output is
  /// [tokens, out_width] in `out_layout`. Before the stack is finished.
  Layer<T>& add(std::unique_ptr<Layer<T>> layer, index_t out_width, ActivationLayout out_layout);
  /// The scheme's linear (`<name>.weight` [in, out], `<name>.bias`): expand
  /// writes the inner layout, contract the outer one.
  Layer<T>& linear(std::string name, index_t width, LinearRole role, bool has_bias = true);
  Layer<T>& layer_norm(std::string name, double eps = 1e-5);
  Layer<T>& gelu();
  /// GPT-2's causal self-attention (Attention: `<name>.c_attn`, `<name>.c_proj`)
  /// over the tokens as sequences of `seq`: outer layout in and out, the
  /// same width (a multiple of `heads`).
  Layer<T>& attention(std::string name, index_t seq, index_t heads);
  /// A residual connection: Y = X + body(X), where `body` appends the body's
  /// layers to a Chain whose input is this stack's current output; the body
  /// must end in the width and layout it started from. (A Parallel of one
  /// branch that adds its input.)
  Parallel<T>& residual(const std::function<void(Chain<T>&)>& body);
  /// Parallel branches, each built on a Chain whose input is this stack's
  /// current output, every one ending in the same width and layout: summed,
  /// Y = Σ_k branch_k(X), or concatenated, Y = [branch_0(X) | branch_1(X) |
  /// ...] grouped (Combine). At least one branch.
  Parallel<T>& parallel(const std::vector<std::function<void(Chain<T>&)>>& branches,
                        Combine combine = Combine::sum);

  SchemeContext<T>& scheme() const { return *scheme_; }
  index_t tokens() const { return tokens_; }
  std::size_t size() const { return stages_.size(); }
  Layer<T>& layer(std::size_t i) { return *stages_.at(i).layer; }
  /// Width and layout of the output (the last layer's, or the input's), and
  /// its column groups (1, or the branches of a concatenation: Combine).
  index_t out_width() const;
  ActivationLayout out_layout() const;
  int out_groups() const;
  index_t in_width() const { return in_width_; }
  ActivationLayout in_layout() const { return in_layout_; }

 protected:
  /// `who` names the stack in errors ("Sequential", "residual body", ...).
  LayerStack(SchemeContext<T>& scheme, index_t tokens, index_t in_width, ActivationLayout in_layout,
             const char* who);
  struct Stage {
    std::unique_ptr<Layer<T>> layer;
    index_t width;
    ActivationLayout layout;
    MatrixView<T> out{};
    int groups = 1;
  };
  index_t local_rows(ActivationLayout layout) const { return scheme_->local_rows(tokens_, layout); }
  index_t local_cols(index_t width, ActivationLayout layout) const {
    return scheme_->local_cols(width, layout);
  }
  /// Elements of the local block of a [tokens, width] activation in `layout`.
  index_t local_elems(index_t width, ActivationLayout layout) const {
    return local_rows(layout) * local_cols(width, layout);
  }
  /// Local rows and columns of stage i's input (the stack's input for i = 0).
  index_t input_rows(std::size_t i) const;
  index_t input_cols(std::size_t i) const;
  /// Every stage's price in the order a pass runs them (backward: last
  /// first).
  void price_stages(cost::Tally& t, model::Phase phase) const;
  /// The largest local block (elements) among the input and every stage's output.
  index_t widest_elems() const;
  /// No layer may be added after this.
  void seal() { sealed_ = true; }
  /// residual() and parallel(): the branches built, checked and added.
  Parallel<T>& add_branches(const std::vector<std::function<void(Chain<T>&)>>& branches,
                            bool adds_input, Combine combine);
  /// Throws unless the current output is ungrouped (`what` names the layer).
  void require_ungrouped(const std::string& what) const;
  /// add() without the check of its input's groups: the output has `groups`.
  Layer<T>& add_stage(std::unique_ptr<Layer<T>> layer, index_t out_width,
                      ActivationLayout out_layout, int groups);

  SchemeContext<T>* scheme_;
  index_t tokens_, in_width_;
  ActivationLayout in_layout_;
  const char* who_;
  std::vector<Stage> stages_;
  bool sealed_ = false;
};

/// A LayerStack run as one Layer: a residual's body, a parallel branch, or
/// any chain of layers a user nests. forward() keeps every intermediate
/// output in buffers.forward (later layers keep views of them); backward()
/// holds two gradient blocks of the widest activation in buffers.backward.
template <class T>
class Chain final : public Layer<T>, public LayerStack<T> {
 public:
  Chain(SchemeContext<T>& scheme, index_t tokens, index_t in_width,
        ActivationLayout in_layout = ActivationLayout::outer, const char* who = "chain");

  std::string_view name() const override { return ""; }
  void collect_parameters(std::vector<Param<T>*>& out) override;
  BufferNeeds buffer_needs() const override;
  void price(cost::Tally& t, model::Phase phase) const override { this->price_stages(t, phase); }
  void forward(ConstMatrixView<T> X, MatrixView<T> Y, StepBuffers& buffers) override;
  void backward(ConstMatrixView<T> dY, MatrixView<T> dX, StepBuffers& buffers,
                bool accumulate = false) override;
  /// Ends the building: throws summa::Error when the chain is empty.
  void finish_building() {
    require(!this->stages_.empty(), [&] { return std::string(this->who_) + ": no layers"; });
    this->seal();
  }
};

/// Parallel branches summed, and residual connections: Y = [X +] Σ_k
/// branch_k(X) (LayerStack::parallel; LayerStack::residual is one branch with
/// the input added). Branch 0 writes Y, each other one a workspace block
/// added to it, then X is added in place; backward sums the branches' input
/// gradients the same way (a backward-arena block) and adds dY.
///
/// Concatenated branches (Combine::concat): each branch writes a workspace
/// block copied into its columns of Y (a rank's block of branch k is local
/// columns [k*c, (k+1)*c) of Y's block, c a branch's local width); backward
/// copies each branch's columns of dY into a backward-arena block, runs the
/// branch on it and sums the input gradients as above.
template <class T>
class Parallel final : public Layer<T> {
 public:
  /// `adds_input`: Y also adds X (a residual connection; the branches then
  /// end in X's width and layout). `combine`: sum or concatenate (not with
  /// adds_input).
  Parallel(std::vector<std::unique_ptr<Chain<T>>> branches, bool adds_input,
           Combine combine = Combine::sum);
  std::string_view name() const override { return ""; }
  void collect_parameters(std::vector<Param<T>*>& out) override;
  BufferNeeds buffer_needs() const override;
  /// The branches in order, and the sums (each a read of two blocks and a
  /// write of one) or the concatenation's copies (a read and a write of a
  /// branch's block each).
  void price(cost::Tally& t, model::Phase phase) const override;
  void forward(ConstMatrixView<T> X, MatrixView<T> Y, StepBuffers& buffers) override;
  void backward(ConstMatrixView<T> dY, MatrixView<T> dX, StepBuffers& buffers,
                bool accumulate = false) override;
  std::size_t size() const { return branches_.size(); }
  Chain<T>& branch(std::size_t k) { return *branches_.at(k); }
  bool adds_input() const { return adds_input_; }
  Combine combine() const { return combine_; }

 private:
  std::vector<std::unique_ptr<Chain<T>>> branches_;
  bool adds_input_;
  Combine combine_;
};

template <class T>
class Sequential final : public Module<T>, public LayerStack<T> {
 public:
  /// A model whose input is a [tokens, in_width] activation in `in_layout`.
  Sequential(SchemeContext<T>& scheme, index_t tokens, index_t in_width,
             ActivationLayout in_layout = ActivationLayout::outer);
  ~Sequential() override;

  /// Allocates the parameters (zero), the step arenas (sized from every
  /// layer's buffer_needs(), plus `extra`, e.g. a Loss's) and the
  /// activations. Collective (the scheme's layers agree on their shapes).
  void finish(BufferNeeds extra = {});

  std::string_view name() const override { return ""; }
  void collect_parameters(std::vector<Param<T>*>& out) override;
  BufferNeeds buffer_needs() const override;
  /// What forward() (Phase::forward) or backward() (Phase::backward) costs
  /// on this rank: every layer's price in the order it runs (a cost::Tally:
  /// bytes and calls per axis, equal to the traffic counters of a step,
  /// tested; with its ops log, the work the step-time model prices).
  void price(cost::Tally& t, model::Phase phase) const override { this->price_stages(t, phase); }

  /// Runs every layer on X (this rank's local input block, kept until
  /// backward); returns the local output block (valid until the next
  /// forward). Resets the arenas first.
  MatrixView<T> forward(ConstMatrixView<T> X);
  /// The arenas of the step, for a loss evaluated between forward and
  /// backward (it takes from `forward` what its backward needs).
  StepBuffers buffers();
  /// Gradients of every parameter from dY (the output's gradient; may be
  /// the block forward returned, overwritten in place by a Loss), set or
  /// added to with `accumulate`; returns dL/dX (local, valid until the next
  /// backward).
  ConstMatrixView<T> backward(ConstMatrixView<T> dY, bool accumulate = false);

  /// Sums the parameter gradients over the data axis (no-op without one).
  void sync_data_gradients();

  ParameterStore<T>& parameters_store();

 private:
  using typename LayerStack<T>::Stage;
  using LayerStack<T>::stages_;
  using LayerStack<T>::scheme_;
  using LayerStack<T>::in_width_;
  using LayerStack<T>::in_layout_;
  using LayerStack<T>::local_rows;
  using LayerStack<T>::local_cols;
  using LayerStack<T>::local_elems;
  void require_finished(const char* what) const;

  std::unique_ptr<ParameterStore<T>> store_;
  std::unique_ptr<Arena> workspace_, forward_, backward_, activations_, grads_;
  MatrixView<T> grad_slot_[2]{};
  bool have_forward_ = false;
};

/// This rank's local block of a global row-major [tokens, width] activation
/// (host memory) in `layout`.
template <class T>
std::vector<T> scatter_activation(const SchemeContext<T>& scheme, std::span<const T> global,
                                  index_t tokens, index_t width, ActivationLayout layout);
/// The global [tokens, width] activation (host, row-major) from every rank's
/// local block (host): each element is taken from its owner's block.
/// Collective over the tensor group (an all-reduce on the grid's tensor
/// communicator, so host memory needs the MPI communicators).
template <class T>
std::vector<T> gather_activation(const SchemeContext<T>& scheme, std::span<const T> local,
                                 index_t tokens, index_t width, ActivationLayout layout);

#define SUMMA_SEQUENTIAL_EXTERN(T)     \
  extern template class LayerStack<T>; \
  extern template class Chain<T>;      \
  extern template class Parallel<T>;   \
  extern template class Sequential<T>;
SUMMA_SEQUENTIAL_EXTERN(float)
SUMMA_SEQUENTIAL_EXTERN(double)
SUMMA_SEQUENTIAL_EXTERN(bf16)
#undef SUMMA_SEQUENTIAL_EXTERN

}  // namespace summa

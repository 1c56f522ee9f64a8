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
/// The container runs the scheme's hooks for state its layers share
/// (SchemeContext::finish_layers in finish(), begin_forward in forward(),
/// complete_deferred at the end of backward(): the 3D ORS / OAG overlaps),
/// so a context with such state serves one model.
///
/// `tokens` are the rows of this rank's data group; with a data axis each
/// group passes its own rows, divides its loss by the global token count and
/// calls sync_data_gradients() after backward.

#include <cstdint>
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
class Sequential final : public Module<T> {
 public:
  /// A model whose input is a [tokens, in_width] activation in `in_layout`.
  Sequential(SchemeContext<T>& scheme, index_t tokens, index_t in_width,
             ActivationLayout in_layout = ActivationLayout::outer);
  ~Sequential() override;
  Sequential(const Sequential&) = delete;
  Sequential& operator=(const Sequential&) = delete;

  /// Appends `layer`, whose input is the previous output and whose output is
  /// [tokens, out_width] in `out_layout`. Before finish().
  Layer<T>& add(std::unique_ptr<Layer<T>> layer, index_t out_width, ActivationLayout out_layout);
  /// The scheme's linear (`<name>.weight` [in, out], `<name>.bias`): expand
  /// writes the inner layout, contract the outer one.
  Layer<T>& linear(std::string name, index_t width, LinearRole role, bool has_bias = true);
  Layer<T>& layer_norm(std::string name, double eps = 1e-5);
  Layer<T>& gelu();

  /// Allocates the parameters (zero), the step arenas (sized from every
  /// layer's buffer_needs(), plus `extra`, e.g. a Loss's) and the
  /// activations. Collective (the scheme's layers agree on their shapes).
  void finish(BufferNeeds extra = {});

  std::string_view name() const override { return ""; }
  void collect_parameters(std::vector<Param<T>*>& out) override;
  BufferNeeds buffer_needs() const override;

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

  SchemeContext<T>& scheme() const { return *scheme_; }
  ParameterStore<T>& parameters_store();
  std::size_t size() const { return stages_.size(); }
  Layer<T>& layer(std::size_t i) { return *stages_.at(i).layer; }
  index_t tokens() const { return tokens_; }
  /// Width and layout of the output (the last layer's, or the input's).
  index_t out_width() const;
  ActivationLayout out_layout() const;

 private:
  struct Stage {
    std::unique_ptr<Layer<T>> layer;
    index_t width;
    ActivationLayout layout;
    MatrixView<T> out{};
  };
  index_t local_rows() const { return scheme_->local_rows(tokens_); }
  index_t local_cols(index_t width, ActivationLayout layout) const {
    return scheme_->local_cols(width, layout);
  }
  void require_finished(const char* what) const;

  SchemeContext<T>* scheme_;
  index_t tokens_, in_width_;
  ActivationLayout in_layout_;
  std::vector<Stage> stages_;
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

extern template class Sequential<float>;
extern template class Sequential<double>;
extern template class Sequential<bf16>;

}  // namespace summa

#pragma once
/// \file parameters.hpp
/// Storage for the local shards of a set of parameters: one "parameters"
/// arena for the values and one "gradients" arena (the parameter-gradient
/// buffer of Optimus §3.2.3) for their gradients, both sized exactly from the
/// shard descriptions and bound to the layers' Param pointers.
///
/// Gradients persist across the step (the optimizer reads them); Optimus's
/// trick of updating a layer's parameters right after its backward and
/// reusing one layer-sized gradient buffer is left to the optimizer.

#include <cstdint>
#include <string_view>
#include <vector>

#include "summa/grid/process_grid.hpp"
#include "summa/layers/layer.hpp"
#include "summa/model/config.hpp"
#include "summa/model/init.hpp"

namespace summa {

template <class T>
class ParameterStore {
 public:
  /// Allocates values and gradients for `params` (in that order) from
  /// `backend` and binds each Param's value / grad pointer (null where the
  /// rank holds nothing). Values and gradients start at zero. Without
  /// `gradients` (a model built for inference) the gradient arena is empty
  /// and every grad pointer null. `multiple`: the values and gradients hold
  /// a multiple of this many elements, the padding (zero, owned by no
  /// parameter) after the last parameter's, so D data groups can split them
  /// into equal chunks (ZeRO; padded_elements()).
  ParameterStore(Backend& backend, std::vector<Param<T>*> params, bool gradients = true,
                 index_t multiple = 1);
  /// False for a store built without gradients.
  bool has_gradients() const { return has_gradients_; }
  ParameterStore(const ParameterStore&) = delete;
  ParameterStore& operator=(const ParameterStore&) = delete;

  const std::vector<Param<T>*>& params() const { return params_; }
  /// The backend whose memory holds the values and gradients (pointers
  /// into it may be device memory: see Backend::host_accessible()).
  Backend& backend() const { return *backend_; }
  /// The parameter called `name`; throws summa::Error if there is none.
  Param<T>& find(std::string_view name) const;

  /// Layout-invariant GPT-2 initialisation (init_value):
  /// every local element gets the value the serial reference gives the same
  /// global element, whatever the mesh (for bf16: that value rounded to
  /// bf16, through a float host image). Allocates (host staging).
  void init_gpt(std::uint64_t seed, const GptConfig& config);
  /// Layout-invariant uniform initialisation for any model: every global
  /// element (index i = row * cols + col of the tensor `name`) gets
  /// uniform_init_value(seed, name, i, scale), whatever the scheme, so a
  /// model starts from the same global weights under every scheme.
  void init_uniform(std::uint64_t seed, double scale);
  /// Every gradient = 0 (nothing without gradients).
  void zero_grads();
  /// All local values / gradients, packed in the order of params() (each
  /// parameter's local elements follow the previous one's, no padding).
  T* values_base() const { return static_cast<T*>(values_.base()); }
  T* grads_base() const { return static_cast<T*>(grads_.base()); }

  /// Bytes of local values (equal to the bytes of gradients), rounded up to
  /// the arena alignment.
  std::size_t bytes() const { return values_.capacity(); }
  /// Local elements held.
  index_t local_elements() const;
  /// local_elements() rounded up to the constructor's `multiple`: the
  /// elements values_base() and grads_base() hold.
  index_t padded_elements() const { return padded_; }
  /// What padded_elements() would be for `params` and `multiple`.
  static index_t padded_elements(const std::vector<Param<T>*>& params, index_t multiple);
  const Arena& values() const { return values_; }
  const Arena& grads() const { return grads_; }

 private:
  static std::size_t bytes_for(const std::vector<Param<T>*>& params, index_t multiple);
  std::vector<Param<T>*> params_;
  Backend* backend_;
  bool has_gradients_;
  index_t padded_;
  Arena values_, grads_;
};

/// The global tensor (row-major, global_size() elements) of a parameter's
/// value, or of its gradient with `grad`, assembled on every rank of the
/// tensor group (grid.tensor(): the mesh, line or 3D grid of one data group)
/// from the owners' pieces. Collective over grid.tensor(); allocates (for
/// tests, checkpoints and reports, not for steps). Throws summa::Error on
/// every rank unless the owners' pieces cover each element exactly once.
/// scale * (2u - 1), u in [0, 1) a hash of (seed, name, index): the value
/// ParameterStore::init_uniform gives global element `index` of `name`.
double uniform_init_value(std::uint64_t seed, std::string_view name, index_t index, double scale);

template <class T>
std::vector<T> gather_global(const Param<T>& p, ProcessGrid& grid, bool grad = false);

extern template class ParameterStore<float>;
extern template class ParameterStore<double>;
extern template std::vector<float> gather_global(const Param<float>&, ProcessGrid&, bool);
extern template std::vector<double> gather_global(const Param<double>&, ProcessGrid&, bool);
extern template class ParameterStore<bf16>;
extern template std::vector<bf16> gather_global(const Param<bf16>&, ProcessGrid&, bool);

}  // namespace summa

#pragma once
/// \file init.hpp
/// Layout-invariant initialisation of the GPT parameters
/// (summa/model/config.hpp): every element's value is a function of the seed,
/// the parameter's name and the element's global index, so any shard under
/// any scheme is generated on its own.

#include <cstdint>
#include <span>
#include <string_view>

#include "summa/core/matrix_view.hpp"
#include "summa/core/types.hpp"
#include "summa/model/config.hpp"

namespace summa {

// ---------------------------------------------------------------- initialisation
//
// Layout-invariant: every element's initial value is a pure function of
// (seed, parameter name, flat row-major index in the global tensor), so any
// shard of any layout can be generated on its own and the global weights are
// identical. The generator is counter-based (no state):
//   mix(z)  = splitmix64's finaliser: z ^= z >> 30; z *= 0xBF58476D1CE4E5B9;
//             z ^= z >> 27; z *= 0x94D049BB133111EB; z ^= z >> 31
//   γ       = 0x9E3779B97F4A7C15, fnv1a64 = 64-bit FNV-1a of the name's bytes
//   key     = mix(mix(seed + γ) ^ fnv1a64(name))
//   u_k     = ((mix(key + (2·index + k + 1)·γ) >> 11) + 1) · 2⁻⁵³ in (0, 1], k = 0, 1
//   z       = sqrt(−2 ln u_0) · cos(2π u_1)                     (Box–Muller)
// with all integer arithmetic mod 2⁶⁴. The element's value is std · z,
// computed in double and then rounded to the element type. GPT-2 init: wte, wpe and every linear
// weight N(0, 0.02), except the residual projections attn.c_proj.weight and mlp.c_proj.weight,
// which get N(0, 0.02 / sqrt(2·n_layer)); biases 0; LayerNorm weight 1, bias 0.

/// The standard normal deviate z(seed, name, index) above (no scaling; any
/// name and index are accepted).
double init_normal(std::uint64_t seed, std::string_view name, std::uint64_t index);

/// Initial value of element `index` (flat, row-major) of parameter `name`.
/// Throws summa::Error for an unknown name or an index outside the tensor.
double init_value(std::uint64_t seed, std::string_view name, index_t index,
                  const GptConfig& config);

/// out[i] = init_value(seed, name, first + i, config) for every i; the range
/// must lie inside the tensor.
template <class T>
void init_fill(std::uint64_t seed, std::string_view name, index_t first, std::span<T> out,
               const GptConfig& config);

/// A block of the parameter seen as its 2-D matrix (ParamInfo::rows() x
/// cols(), 1-D tensors as one row): block(i, j) = value at global (row0 + i,
/// col0 + j), i.e. flat index (row0 + i)·cols + col0 + j. Any order and ld.
template <class T>
void init_fill_block(std::uint64_t seed, std::string_view name, index_t row0, index_t col0,
                     MatrixView<T> block, const GptConfig& config);

extern template void init_fill<float>(std::uint64_t, std::string_view, index_t, std::span<float>,
                                      const GptConfig&);
extern template void init_fill<double>(std::uint64_t, std::string_view, index_t, std::span<double>,
                                       const GptConfig&);
extern template void init_fill_block<float>(std::uint64_t, std::string_view, index_t, index_t,
                                            MatrixView<float>, const GptConfig&);
extern template void init_fill_block<double>(std::uint64_t, std::string_view, index_t, index_t,
                                             MatrixView<double>, const GptConfig&);

}  // namespace summa

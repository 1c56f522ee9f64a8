#pragma once
/// \file config.hpp
/// The GPT-2 model definition every model in summa shares (the distributed
/// Gpt under every scheme, the serial reference, checkpoints, Hugging Face
/// import and export): its shape, GptConfig, and its parameters, by Hugging
/// Face name and global shape, in one fixed order.

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "summa/core/types.hpp"

namespace summa {

/// Model shape (Hugging Face GPT2Config field names).
struct GptConfig {
  int n_layer = 0;
  int n_head = 0;
  int n_embd = 0;
  int n_positions = 0;
  int vocab_size = 0;
  double layer_norm_epsilon = 1e-5;

  /// Throws summa::Error naming the values: every integer field positive,
  /// n_embd divisible by n_head, epsilon positive and finite.
  void validate() const;
  /// d = n_embd / n_head.
  index_t head_dim() const { return n_head > 0 ? n_embd / n_head : 0; }
};

/// A parameter tensor: its name and logical (row-major) shape, 1-D or 2-D.
struct ParamInfo {
  std::string name;
  std::vector<index_t> shape;
  index_t size() const;
  /// The 2-D shape used by matrix views: [rows, cols] of a 2-D tensor, [1, n]
  /// of a 1-D one.
  index_t rows() const { return shape.size() == 2 ? shape[0] : 1; }
  index_t cols() const { return shape.back(); }
};

/// Every parameter in the fixed order: wte.weight, wpe.weight, then for i = 0..n_layer-1
/// h.{i}.ln_1.weight, h.{i}.ln_1.bias, h.{i}.attn.c_attn.weight,
/// h.{i}.attn.c_attn.bias, h.{i}.attn.c_proj.weight, h.{i}.attn.c_proj.bias,
/// h.{i}.ln_2.weight, h.{i}.ln_2.bias, h.{i}.mlp.c_fc.weight, h.{i}.mlp.c_fc.bias,
/// h.{i}.mlp.c_proj.weight, h.{i}.mlp.c_proj.bias; then ln_f.weight, ln_f.bias.
/// Validates the config.
std::vector<ParamInfo> parameter_list(const GptConfig& config);
/// Total number of parameter elements (the tied head counts once).
index_t parameter_count(const GptConfig& config);

/// Tensors per transformer block in parameter_list() (ln_1 .. mlp.c_proj).
inline constexpr std::size_t kParamsPerBlock = 12;

/// Position of parameter `name` in parameter_list(config); throws
/// summa::Error "<what>: no parameter named ..." for an unknown name.
std::size_t parameter_index(std::string_view name, const GptConfig& config, const char* what);

}  // namespace summa

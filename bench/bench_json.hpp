#pragma once
// The benchmarks' JSON lines (nlohmann_json): one object per case, keys in
// the order they are set, a value that is not finite written as null.

#include <nlohmann/json.hpp>

namespace summa::bench {

using Json = nlohmann::ordered_json;

/// The model's shape, as every line of gpt_layer and compare_schemes has it:
/// layers, hidden, heads, seq, batch, vocab, positions (`config` a GptConfig).
template <class Config>
Json model_shape_fields(const Config& config, long long seq, long long batch) {
  return Json{{"layers", config.n_layer},
              {"hidden", config.n_embd},
              {"heads", config.n_head},
              {"seq", seq},
              {"batch", batch},
              {"vocab", config.vocab_size},
              {"positions", config.n_positions}};
}

}  // namespace summa::bench

#include "summa/io/hf_gpt2.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <system_error>

#include "json.hpp"
#include "summa/core/error.hpp"
#include "summa/io/atomic_file.hpp"
#include "summa/io/files.hpp"
#include "summa/io/safetensors.hpp"
#include "summa/layers/parameters.hpp"

namespace summa::io {

namespace fs = std::filesystem;
using detail::describe;
using detail::Json;

namespace {

constexpr std::uintmax_t max_config_bytes = 16u << 20;
constexpr std::string_view prefix = "transformer.";

std::string quoted(const fs::path& p) {
  return fmt::format("'{}'", p.string());
}

std::string_view torch_dtype(DTypeOut d) {
  switch (d) {
    case DTypeOut::f32:
      return "float32";
    case DTypeOut::f64:
      return "float64";
    case DTypeOut::bf16:
      return "bfloat16";
  }
  return "float32";
}

TensorDType tensor_dtype(DTypeOut d) {
  switch (d) {
    case DTypeOut::f32:
      return TensorDType::f32;
    case DTypeOut::f64:
      return TensorDType::f64;
    case DTypeOut::bf16:
      return TensorDType::bf16;
  }
  return TensorDType::f32;
}

std::string shape_text(const std::vector<index_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

/// The model's parameters must be exactly parameter_list(config)
/// (names and shapes), each once: what the file format assumes.
template <class T>
void check_parameters(const ParameterStore<T>& store, const GptConfig& config,
                      bool one_stage = false) {
  std::map<std::string, std::vector<index_t>> want;
  for (const ParamInfo& info : parameter_list(config)) want.emplace(info.name, info.shape);
  std::set<std::string> seen;
  for (const Param<T>* p : store.params()) {
    const auto it = want.find(p->shard.name);
    if (it == want.end())
      throw Error(fmt::format("parameter '{}' is not a GPT-2 parameter", p->shard.name));
    if (it->second != p->shard.global_shape)
      throw Error(fmt::format("parameter '{}' has shape {}, GPT-2 needs {}", p->shard.name,
                              shape_text(p->shard.global_shape), shape_text(it->second)));
    if (!seen.insert(p->shard.name).second)
      throw Error(fmt::format("parameter '{}' appears twice", p->shard.name));
  }
  if (one_stage) return;  // a pipeline stage holds some of them
  for (const auto& [name, shape] : want)
    if (!seen.contains(name)) throw Error(fmt::format("the model has no parameter '{}'", name));
}

/// h.<digits>.attn.bias or h.<digits>.attn.masked_bias: causal-mask buffers
/// that old GPT-2 checkpoints carry.
bool is_attention_buffer(std::string_view name) {
  if (!name.starts_with("h.")) return false;
  std::size_t i = 2;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9') ++i;
  if (i == 2) return false;
  const std::string_view rest = name.substr(i);
  return rest == ".attn.bias" || rest == ".attn.masked_bias";
}

std::string read_config_text(const fs::path& file) {
  require_regular_file(file);  // names a link loop or dangling link
  std::error_code ec;
  const auto status = fs::status(file, ec);
  if (ec || !fs::exists(status)) throw Error("no such file");
  if (!fs::is_regular_file(status)) throw Error("not a regular file");
  const auto size = fs::file_size(file, ec);
  if (ec) throw Error("cannot get the file size: " + ec.message());
  if (size > max_config_bytes)
    throw Error(fmt::format("{} bytes is larger than the limit of {} bytes for a config", size,
                            max_config_bytes));
  std::ifstream in(file, std::ios::binary);
  if (!in) throw Error("cannot open for reading");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw Error("read error");
  return text;
}

}  // namespace

// ---------------------------------------------------------------- config.json

std::string hf_gpt2_config_json(const GptConfig& config, DTypeOut dtype) {
  config.validate();
  // Keys sorted (Json's objects are), two-space indent: the layout
  // transformers' save_pretrained uses.
  const Json json = {
      {"activation_function", "gelu_new"},
      {"architectures", Json::array({"GPT2LMHeadModel"})},
      {"attn_pdrop", 0.0},
      {"embd_pdrop", 0.0},
      {"initializer_range", 0.02},
      {"layer_norm_epsilon", config.layer_norm_epsilon},
      {"model_type", "gpt2"},
      {"n_ctx", config.n_positions},
      {"n_embd", config.n_embd},
      {"n_head", config.n_head},
      {"n_inner", nullptr},
      {"n_layer", config.n_layer},
      {"n_positions", config.n_positions},
      {"reorder_and_upcast_attn", false},
      {"resid_pdrop", 0.0},
      {"scale_attn_by_inverse_layer_idx", false},
      {"scale_attn_weights", true},
      {"tie_word_embeddings", true},
      {"torch_dtype", std::string(torch_dtype(dtype))},
      {"use_cache", true},
      {"vocab_size", config.vocab_size},
  };
  return json.dump(2) + "\n";
}

GptConfig read_hf_gpt2_config(const fs::path& path) {
  std::error_code ec;
  const fs::path file = fs::is_directory(path, ec) ? path / "config.json" : path;
  const std::string where = "config file " + quoted(file);
  std::string text;
  try {
    text = read_config_text(file);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", where, e.what()));
  }
  Json root;
  try {
    root = detail::parse_json(text);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", where, e.what()));
  }
  if (!root.is_object())
    throw Error(fmt::format("{}: not a JSON object (it is {})", where, describe(root)));
  const auto find = [&](const char* key) -> const Json* {
    const auto it = root.find(key);
    return it == root.end() ? nullptr : &*it;
  };

  if (const Json* type = find("model_type"); type && *type != "gpt2")
    throw Error(fmt::format("{}: \"model_type\" is {}, expected \"gpt2\"", where, describe(*type)));

  GptConfig config;
  const auto integer = [&](const char* key) {
    const Json* v = find(key);
    if (v == nullptr) throw Error(fmt::format("{}: missing \"{}\"", where, key));
    const auto n = detail::as_int64(*v);
    if (!n || *n <= 0 || *n > std::numeric_limits<int>::max())
      throw Error(
          fmt::format("{}: \"{}\" must be a positive integer, not {}", where, key, describe(*v)));
    return static_cast<int>(*n);
  };
  config.n_layer = integer("n_layer");
  config.n_head = integer("n_head");
  config.n_embd = integer("n_embd");
  config.n_positions = integer("n_positions");
  config.vocab_size = integer("vocab_size");
  if (const Json* eps = find("layer_norm_epsilon")) {
    if (!eps->is_number() || !std::isfinite(eps->get<double>()) || eps->get<double>() <= 0)
      throw Error(fmt::format("{}: \"layer_norm_epsilon\" must be a positive number, not {}", where,
                              describe(*eps)));
    config.layer_norm_epsilon = eps->get<double>();
  }
  if (const Json* act = find("activation_function")) {
    if (*act != "gelu_new" && *act != "gelu_pytorch_tanh" && *act != "gelu_fast")
      throw Error(
          fmt::format("{}: \"activation_function\" is {}; summa's GPT-2 computes the tanh "
                      "GeLU (\"gelu_new\")",
                      where, describe(*act)));
  }
  if (const Json* inner = find("n_inner"); inner && !inner->is_null()) {
    const auto v = detail::as_int64(*inner);
    if (!v || *v != 4 * static_cast<std::int64_t>(config.n_embd))
      throw Error(fmt::format("{}: \"n_inner\" is {}; summa's GPT-2 has an MLP of 4 * n_embd = {}",
                              where, describe(*inner),
                              4 * static_cast<std::int64_t>(config.n_embd)));
  }
  const auto flag_must_be = [&](const char* key, bool required) {
    const Json* v = find(key);
    if (v && v->is_boolean() && v->get<bool>() != required)
      throw Error(fmt::format("{}: \"{}\" is {}; summa's GPT-2 supports only {}", where, key,
                              describe(*v), required ? "true" : "false"));
  };
  flag_must_be("tie_word_embeddings", true);
  flag_must_be("scale_attn_weights", true);
  flag_must_be("scale_attn_by_inverse_layer_idx", false);
  try {
    config.validate();
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", where, e.what()));
  }
  return config;
}

// The element type a model of T moves through the safetensors reader and
// writer: bf16 widens to float (exactly; the file's own dtype is chosen
// separately and converted by them), float and double pass as they are.
template <class T>
using io_t = acc_t<T>;

// ---------------------------------------------------------------- export

// `bytes` from `data` in pieces an MPI count holds (1 GiB each).
template <class F>
void for_each_chunk(const void* data, std::size_t bytes, F&& f) {
  constexpr std::size_t chunk = std::size_t{1} << 30;
  char* at = static_cast<char*>(const_cast<void*>(data));
  for (std::size_t done = 0; done < bytes; done += chunk)
    f(at + done, static_cast<int>(std::min(chunk, bytes - done)));
}

// A pipeline's parameters on its rank 0: each stage's (its first rank's
// names and shapes), in stage order, the stage copies left out.
template <class T>
std::vector<TensorSpec> pipeline_specs(const ParameterStore<T>& store, ProcessGrid& grid,
                                       MPI_Comm pipe, DTypeOut dtype, std::vector<int>& stage_of) {
  std::vector<double> mine;  // per parameter: rank, the dimensions
  for (const Param<T>* p : store.params()) {
    if (p->shard.stage_copy) continue;
    mine.push_back(static_cast<double>(p->shard.global_shape.size()));
    for (index_t d : p->shard.global_shape) mine.push_back(static_cast<double>(d));
  }
  std::string names;
  for (const Param<T>* p : store.params())
    if (!p->shard.stage_copy) names += p->shard.name + '\n';
  std::vector<TensorSpec> specs;
  if (grid.rank() != 0) return specs;  // the stages' first ranks take part
  int size = 0, rank = 0;
  MPI_Comm_size(pipe, &size);
  MPI_Comm_rank(pipe, &rank);
  for (int s = 0; s < size; ++s) {
    std::vector<double> shapes = mine;
    std::string text = names;
    if (s > 0 && rank == s) {
      const int n = static_cast<int>(shapes.size()), k = static_cast<int>(text.size());
      check_mpi(MPI_Send(&n, 1, MPI_INT, 0, 1, pipe), "MPI_Send (export)");
      check_mpi(MPI_Send(shapes.data(), n, MPI_DOUBLE, 0, 2, pipe), "MPI_Send (export)");
      check_mpi(MPI_Send(&k, 1, MPI_INT, 0, 3, pipe), "MPI_Send (export)");
      check_mpi(MPI_Send(text.data(), k, MPI_CHAR, 0, 4, pipe), "MPI_Send (export)");
    }
    if (rank != 0) continue;
    if (s > 0) {
      int n = 0, k = 0;
      check_mpi(MPI_Recv(&n, 1, MPI_INT, s, 1, pipe, MPI_STATUS_IGNORE), "MPI_Recv (export)");
      shapes.resize(static_cast<std::size_t>(n));
      check_mpi(MPI_Recv(shapes.data(), n, MPI_DOUBLE, s, 2, pipe, MPI_STATUS_IGNORE),
                "MPI_Recv (export)");
      check_mpi(MPI_Recv(&k, 1, MPI_INT, s, 3, pipe, MPI_STATUS_IGNORE), "MPI_Recv (export)");
      text.resize(static_cast<std::size_t>(k));
      check_mpi(MPI_Recv(text.data(), k, MPI_CHAR, s, 4, pipe, MPI_STATUS_IGNORE),
                "MPI_Recv (export)");
    }
    std::size_t at = 0, line = 0;
    while (at < shapes.size()) {
      const auto dims = static_cast<std::size_t>(shapes[at++]);
      std::vector<index_t> shape;
      for (std::size_t d = 0; d < dims; ++d) shape.push_back(static_cast<index_t>(shapes[at++]));
      const std::size_t end = text.find('\n', line);
      specs.push_back({text.substr(line, end - line), std::move(shape), tensor_dtype(dtype)});
      stage_of.push_back(s);
      line = end + 1;
    }
  }
  return specs;
}

template <class T>
void export_hf_gpt2(GptModel<T>& model, const fs::path& dir, DTypeOut dtype,
                    const CheckpointStages* stages) {
  const std::string where = "export_hf_gpt2 " + quoted(dir);
  ProcessGrid& grid = model.grid();
  const auto agree = [&](const std::optional<std::string>& e) {
    if (stages != nullptr)
      agree_on(stages->world, e);
    else
      grid.agree(CommAxis::world, e);
  };
  std::optional<std::string> error;
  ParameterStore<T>* store = nullptr;
  try {
    store = &model.parameters_store();
    check_parameters(*store, model.config(), stages != nullptr);
  } catch (const Error& e) {
    error = fmt::format("{}: {}", where, e.what());
  }
  agree(error);
  // zero=3: the values whole for the export (each group's chunk gathered)
  const typename ParameterStore<T>::WholeValues whole(*store, /*write_back=*/false, &grid);

  // The world's rank 0 writes; data group 0's copy is as good as any other,
  // since every data group gathers the same global tensors. A pipeline: the
  // first stage's rank 0, which receives the other stages' tensors.
  const bool writes = grid.rank() == 0 && (stages == nullptr || stages->stage == 0);
  const bool sends = stages != nullptr && stages->stage > 0 && grid.rank() == 0;
  std::vector<int> stage_of;  // a pipeline: each tensor's stage
  const std::vector<TensorSpec> all =
      stages != nullptr ? pipeline_specs(*store, grid, stages->pipe, dtype, stage_of)
                        : std::vector<TensorSpec>();
  std::unique_ptr<SafetensorsWriter> writer;
  if (writes) {
    try {
      std::error_code ec;
      fs::create_directories(dir, ec);
      if (ec || !fs::is_directory(dir))
        throw Error(fmt::format("cannot create the directory: {}",
                                ec ? ec.message() : "a file of that name exists"));
      std::vector<TensorSpec> specs = all;
      if (stages == nullptr)
        for (const Param<T>* p : store->params())
          specs.push_back({p->shard.name, p->shard.global_shape, tensor_dtype(dtype)});
      writer = std::make_unique<SafetensorsWriter>(
          dir / "model.safetensors", std::move(specs),
          std::map<std::string, std::string>{{"format", "pt"}, {"producer", "summa"}});
    } catch (const std::exception& e) {
      error = fmt::format("{}: {}", where, e.what());
    }
  }
  agree(error);

  // One global tensor at a time; a failed write is remembered and reported
  // after the loop, so every rank still takes part in every gather.
  // gather_global downloads the local shard when the store's backend keeps
  // it in device memory (Param::backend).
  const auto write = [&](const std::string& name, const std::vector<T>& global) {
    if (!writes || error) return;
    try {
      if constexpr (std::is_same_v<T, io_t<T>>) {
        writer->write<T>(name, global);
      } else {
        std::vector<io_t<T>> wide(global.size());
        std::transform(global.begin(), global.end(), wide.begin(),
                       [](T v) { return static_cast<io_t<T>>(v); });
        writer->write<io_t<T>>(name, wide);
      }
    } catch (const std::exception& e) {
      error = fmt::format("{}: {}", where, e.what());
    }
  };
  for (const Param<T>* p : store->params()) {
    if (p->shard.stage_copy) continue;
    const std::vector<T> global = gather_global(*p, grid);
    if (sends)  // to the writer, in the order of its list
      for_each_chunk(global.data(), global.size() * sizeof(T), [&](char* at, int bytes) {
        check_mpi(MPI_Send(at, bytes, MPI_BYTE, 0, 5, stages->pipe), "MPI_Send (export)");
      });
    write(p->shard.name, global);
  }
  if (writes && stages != nullptr) {  // the later stages' tensors, in their order
    std::vector<T> global;
    for (std::size_t k = 0; k < all.size(); ++k) {
      if (stage_of[k] == 0) continue;  // written above
      index_t n = 1;
      for (index_t d : all[k].shape) n *= d;
      global.resize(static_cast<std::size_t>(n));
      for_each_chunk(global.data(), global.size() * sizeof(T), [&](char* at, int bytes) {
        check_mpi(MPI_Recv(at, bytes, MPI_BYTE, stage_of[k], 5, stages->pipe, MPI_STATUS_IGNORE),
                  "MPI_Recv (export)");
      });
      write(all[k].name, global);
    }
  }
  if (writes && !error) {
    try {
      writer->commit();
      write_file_atomic(dir / "config.json", hf_gpt2_config_json(model.config(), dtype));
    } catch (const std::exception& e) {
      error = fmt::format("{}: {}", where, e.what());
    }
  }
  writer.reset();  // removes the temporary file unless committed
  agree(error);
}

// ---------------------------------------------------------------- import

template <class T>
void import_hf_gpt2(GptModel<T>& model, const fs::path& dir, const CheckpointStages* stages) {
  const std::string where = "import_hf_gpt2 " + quoted(dir);
  ProcessGrid& grid = model.grid();
  const auto agree = [&](const std::optional<std::string>& e) {
    if (stages != nullptr)
      agree_on(stages->world, e);
    else
      grid.agree(CommAxis::world, e);
  };
  std::optional<std::string> error;
  ParameterStore<T>* store = nullptr;
  std::unique_ptr<SafetensorsFile> file;
  std::vector<std::string> sources;  // the file's tensor name of each parameter, in params() order

  try {
    store = &model.parameters_store();
    const GptConfig& have = model.config();
    check_parameters(*store, have, stages != nullptr);
    const GptConfig got = read_hf_gpt2_config(dir / "config.json");
    const auto same = [&](const char* key, int file_value, int model_value) {
      if (file_value != model_value)
        throw Error(fmt::format("config.json has {}={} but the model has {}={}", key, file_value,
                                key, model_value));
    };
    same("n_layer", got.n_layer, have.n_layer);
    same("n_head", got.n_head, have.n_head);
    same("n_embd", got.n_embd, have.n_embd);
    same("vocab_size", got.vocab_size, have.vocab_size);
    same("n_positions", got.n_positions, have.n_positions);
    if (std::abs(got.layer_norm_epsilon - have.layer_norm_epsilon) >
        1e-9 * std::abs(have.layer_norm_epsilon))
      throw Error(fmt::format("config.json has layer_norm_epsilon={} but the model has {}",
                              got.layer_norm_epsilon, have.layer_norm_epsilon));

    file = std::make_unique<SafetensorsFile>(dir / "model.safetensors");
    std::map<std::string, const TensorInfo*, std::less<>> by_name;  // without the prefix
    const TensorInfo* lm_head = nullptr;
    for (const TensorInfo& t : file->tensors()) {
      std::string_view name = t.name;
      if (name.starts_with(prefix)) name.remove_prefix(prefix.size());
      if (name == "lm_head.weight") {
        lm_head = &t;
        continue;
      }
      if (is_attention_buffer(name)) continue;
      const auto [it, fresh] = by_name.emplace(std::string(name), &t);
      if (!fresh)
        throw Error(fmt::format("{}: holds both '{}' and '{}'", quoted(file->path()),
                                it->second->name, t.name));
    }
    std::set<std::string, std::less<>> used;
    for (const Param<T>* p : store->params()) {
      const std::string& name = p->shard.name;
      const auto it = by_name.find(name);
      if (it == by_name.end())
        throw Error(fmt::format("{}: missing tensor '{}' (shape {})", quoted(file->path()), name,
                                shape_text(p->shard.global_shape)));
      const TensorInfo& t = *it->second;
      if (t.shape != p->shard.global_shape)
        throw Error(fmt::format("{}: tensor '{}' has shape {}, the model needs {}",
                                quoted(file->path()), t.name, shape_text(t.shape),
                                shape_text(p->shard.global_shape)));
      if (t.dtype == TensorDType::other)
        throw Error(fmt::format("{}: tensor '{}' has dtype {}; summa reads F32, F64, BF16, F16",
                                quoted(file->path()), t.name, t.dtype_name));
      used.insert(name);
      sources.push_back(t.name);
    }
    std::set<std::string, std::less<>> other_stages;  // a pipeline stage's: the rest of GPT-2
    if (stages != nullptr)
      for (const ParamInfo& info : parameter_list(have)) other_stages.insert(info.name);
    for (const auto& [name, t] : by_name)
      if (!used.contains(name) && !other_stages.contains(name))
        throw Error(fmt::format("{}: unexpected tensor '{}' (not a parameter of this GPT-2)",
                                quoted(file->path()), t->name));
    if (lm_head) {
      const std::vector<index_t> wte = {have.vocab_size, have.n_embd};
      if (lm_head->shape != wte)
        throw Error(fmt::format(
            "{}: '{}' has shape {}, not wte's {}: untied output heads are not "
            "supported",
            quoted(file->path()), lm_head->name, shape_text(lm_head->shape), shape_text(wte)));
    }
  } catch (const Error& e) {
    error = fmt::format("{}: {}", where, e.what());
  }
  agree(error);
  // zero=3: read into the whole values, this group's chunk kept at the end
  const typename ParameterStore<T>::WholeValues whole(*store, /*write_back=*/true, &grid);

  // Stage the local shards (starting from the current values, so anything
  // no piece covers keeps its value), then copy in only once every rank has
  // read everything: on failure the model is unchanged.
  // The staging buffer is packed like the store's values (values_base()),
  // so on a device backend one download fills it and one upload installs it.
  Backend& backend = store->backend();
  std::vector<T> staged;
  try {
    staged.resize(static_cast<std::size_t>(store->local_elements()));
    if (!backend.host_accessible() && !staged.empty())
      backend.download(staged.data(), store->values_base(), staged.size() * sizeof(T));
    std::vector<io_t<T>> rows;  // bf16 rounds each value once, from the file's value as float
    std::size_t k = 0;
    for (const Param<T>* p : store->params()) {
      const std::string& source = sources[k++];
      if (!p->held()) continue;
      const ParamShard& s = p->shard;
      T* local = staged.data() + (p->value - store->values_base());
      if (backend.host_accessible()) std::copy(p->value, p->value + s.local_size(), local);
      const index_t cols = s.global_cols();
      for (const ShardPiece& piece : s.pieces) {
        if (piece.rows < 0 || piece.cols < 0 || piece.global_col < 0 ||
            piece.global_col + piece.cols > cols || piece.local_row < 0 || piece.local_col < 0 ||
            piece.local_row + piece.rows > s.local_rows ||
            piece.local_col + piece.cols > s.local_cols)
          throw Error(fmt::format("a shard piece of '{}' lies outside the tensor", s.name));
        rows.resize(static_cast<std::size_t>(piece.rows * cols));
        file->read_rows<io_t<T>>(source, piece.global_row, piece.rows, rows);
        for (index_t r = 0; r < piece.rows; ++r) {
          const auto from = rows.begin() + r * cols + piece.global_col;
          std::transform(from, from + piece.cols,
                         local + (piece.local_row + r) * s.local_cols + piece.local_col,
                         [](io_t<T> v) { return static_cast<T>(v); });
        }
      }
    }
  } catch (const std::exception& e) {
    error = fmt::format("{}: {}", where, e.what());
  }
  agree(error);

  if (!backend.host_accessible()) {
    if (!staged.empty())
      backend.upload(store->values_base(), staged.data(), staged.size() * sizeof(T));
    return;
  }
  for (Param<T>* p : store->params()) {
    if (!p->held()) continue;
    std::copy_n(staged.begin() + (p->value - store->values_base()), p->shard.local_size(),
                p->value);
  }
}

template void export_hf_gpt2<float>(GptModel<float>&, const fs::path&, DTypeOut,
                                    const CheckpointStages*);
template void export_hf_gpt2<double>(GptModel<double>&, const fs::path&, DTypeOut,
                                     const CheckpointStages*);
template void import_hf_gpt2<float>(GptModel<float>&, const fs::path&, const CheckpointStages*);
template void import_hf_gpt2<double>(GptModel<double>&, const fs::path&, const CheckpointStages*);
template void export_hf_gpt2<bf16>(GptModel<bf16>&, const fs::path&, DTypeOut,
                                   const CheckpointStages*);
template void import_hf_gpt2<bf16>(GptModel<bf16>&, const fs::path&, const CheckpointStages*);

}  // namespace summa::io

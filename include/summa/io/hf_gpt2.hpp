#pragma once
/// \file hf_gpt2.hpp
/// Consolidated Hugging Face GPT-2 checkpoints: a distributed GptModel (any
/// scheme, any grid) written as, or loaded from, a directory holding
///   model.safetensors   the global tensors under Hugging Face GPT2Model
///                       state-dict names (wte.weight, wpe.weight,
///                       h.{i}.ln_1.weight, ..., ln_f.bias; the Conv1D
///                       layout [in, out]); lm_head is tied to wte and not
///                       stored, as Hugging Face does
///   config.json         a GPT2Config ("model_type": "gpt2", n_layer, ...)
/// so GPT2LMHeadModel.from_pretrained(dir) loads it, and a Hugging Face
/// GPT-2 checkpoint in safetensors form loads into any scheme.
/// docs/hf_export.md lists the tensors and the PyTorch check.
///
/// Any backend: the parameters are read and written through the store's
/// backend (gather_global downloads the local shards for the export; the
/// import stages the local shards in host memory and uploads them once at
/// the end), so a model on a CudaBackend exports and imports the same files.

#include <cstdint>
#include <filesystem>
#include <string>

#include "summa/io/checkpoint.hpp"
#include "summa/layers/gpt_model.hpp"
#include "summa/model/config.hpp"

namespace summa::io {

/// Element type of the exported tensors.
enum class DTypeOut : std::uint8_t { f32, f64, bf16 };

/// The config.json text of a model (Hugging Face GPT2Config fields;
/// "torch_dtype" names `dtype`).
std::string hf_gpt2_config_json(const GptConfig& config, DTypeOut dtype = DTypeOut::f32);

/// The model shape stored in a config.json (the file itself, or a directory
/// holding one). Throws summa::Error naming the file and the field when it
/// is missing or unreadable, not a JSON object, "model_type" is not "gpt2",
/// a required field (n_layer, n_head, n_embd, n_positions, vocab_size) is
/// missing or not a positive integer, or a field asks for something summa's
/// GPT-2 does not compute: an activation other than the tanh GeLU
/// ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"), n_inner other than null
/// or 4·n_embd, untied embeddings, scale_attn_weights false,
/// scale_attn_by_inverse_layer_idx or reorder_and_upcast_attn true.
/// layer_norm_epsilon defaults to 1e-5 as in GPT2Config.
GptConfig read_hf_gpt2_config(const std::filesystem::path& path);

/// Writes <dir>/model.safetensors (metadata {"format": "pt"}) and
/// <dir>/config.json, creating `dir` if needed; existing files are replaced
/// atomically. Collective over the model's whole grid (every rank of every
/// data group calls it): each parameter is assembled with gather_global
/// over the tensor group and streamed to the file by the world's rank 0, so
/// that rank holds one global tensor at a time. Every rank throws the same
/// summa::Error when anything fails (the directory cannot be created, the
/// model was built plan_only, a write fails). T = float, double or bf16; f64
/// is exact for all three, f32 for float and bf16, bf16 rounds to nearest
/// even (exact for a bf16 model). A bf16 model writes its bf16 parameters,
/// not the optimizer's fp32 master weights (checkpoints keep those).
///
/// `stages` (a pipeline, io/checkpoint.hpp's CheckpointStages): `model` is
/// one stage's; every stage's parameters go to the one file (the last
/// stage's copy of the embedding is skipped), each stage's gathered on its
/// first rank and sent to the pipeline's rank 0, which writes. Collective
/// over every rank of every stage.
template <class T>
void export_hf_gpt2(GptModel<T>& model, const std::filesystem::path& dir,
                    DTypeOut dtype = DTypeOut::f32, const CheckpointStages* stages = nullptr);

/// Loads <dir>/config.json and <dir>/model.safetensors into `model`, whatever
/// its scheme. The config must match model.config() exactly in n_layer,
/// n_head, n_embd, vocab_size and n_positions (n_positions too, although a
/// longer position table could be cut: the model's wpe must equal the
/// file's) and layer_norm_epsilon within 1e-9 relative; the error names both
/// values. Tensor names may carry the "transformer." prefix; lm_head.weight
/// (when shaped like wte.weight, i.e. tied) and the h.{i}.attn.bias /
/// h.{i}.attn.masked_bias buffers of old checkpoints are ignored. A missing,
/// mis-shaped, unconvertible or unexpected tensor is an error naming it.
/// Every rank reads the file itself, only the rows its local pieces need
/// (owners and replicas alike), converting F32/F64/BF16/F16 to T (bf16: the
/// file's value as float, rounded once). After importing into a bf16 model
/// that already has an optimizer, call Optimizer::refresh_master(). Collective
/// over the model's whole grid; every rank throws the same summa::Error on
/// failure, and the parameters are then left unchanged.
///
/// `stages` (a pipeline): `model` is one stage's and takes the file's
/// tensors of its own parameters (the embedding copy too); collective over
/// every rank of every stage.
template <class T>
void import_hf_gpt2(GptModel<T>& model, const std::filesystem::path& dir,
                    const CheckpointStages* stages = nullptr);

extern template void export_hf_gpt2<float>(GptModel<float>&, const std::filesystem::path&, DTypeOut,
                                           const CheckpointStages*);
extern template void export_hf_gpt2<double>(GptModel<double>&, const std::filesystem::path&,
                                            DTypeOut, const CheckpointStages*);
extern template void import_hf_gpt2<float>(GptModel<float>&, const std::filesystem::path&,
                                           const CheckpointStages*);
extern template void import_hf_gpt2<double>(GptModel<double>&, const std::filesystem::path&,
                                            const CheckpointStages*);
extern template void export_hf_gpt2<bf16>(GptModel<bf16>&, const std::filesystem::path&, DTypeOut,
                                          const CheckpointStages*);
extern template void import_hf_gpt2<bf16>(GptModel<bf16>&, const std::filesystem::path&,
                                          const CheckpointStages*);

}  // namespace summa::io

// Hugging Face-compatible model directories (docs/checkpoints.md, "Hugging Face format"):
//
//   <dir>/config.json          GPT2LMHeadModel or LlamaForCausalLM configuration
//   <dir>/model.safetensors    full tensors under Hugging Face's names, metadata {"format": "pt"}
//   (or model.safetensors.index.json + the shards its weight_map names, when reading)
//
// troupe's parameter names and layouts differ from Hugging Face's in three ways, all held in
// one table per model (hf_map.cpp):
//   * names:       h.0.attn.c_proj.weight -> transformer.h.0.attn.c_proj.weight (gpt),
//                  model.layers.0.self_attn.o_proj.weight (llama);
//   * row splits:  llama's fused h.L.attn.c_attn.weight ((NH+2NKV)*HS, D) is q_proj | k_proj |
//                  v_proj by rows, h.L.mlp.c_fc.weight (2F, D) is gate_proj | up_proj;
//   * transposes:  GPT-2's Conv1D stores weights as (in, out), troupe (and torch.nn.Linear)
//                  as (out, in).
// A reader of a Hugging Face directory reads, for each troupe tensor slice a rank holds, only
// the byte ranges of the Hugging Face tensors that hold it.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "core/safetensors.hpp"
#include "core/spec.hpp"

namespace troupe::checkpoint::hf {

// The architecture both sides describe, in troupe's terms.
struct ModelDims {
  std::string type;  // troupe's model.type: "gpt" | "llama"
  int vocab_size = 0, seq_len = 0, d_model = 0, n_layers = 0, n_heads = 0;
  int n_kv_heads = 0;            // gpt: n_heads
  int ffn_hidden = 0;            // gpt: 4 * d_model
  double norm_eps = 1e-5;        // gpt: LayerNorm's (kernels/cpu/layernorm.cpp), llama: RMSNorm's
  double rope_theta = 10000.0;   // llama only
  RopeScalingSpec rope_scaling;  // llama only: config.json's rope_scaling (type "" = null)
  bool tie_embeddings = true;    // gpt: always (the LM head is wte)
  // Rows of the Hugging Face position table (gpt's wpe): seq_len when exporting; a file may
  // hold more positions (n_positions >= seq_len), of which troupe reads the first seq_len.
  int max_positions = 0;

  int head_dim() const { return n_heads > 0 ? d_model / n_heads : 0; }
};

// The dims of a job's model. The one place that reads model.* spec keys for this format:
// a new model type or key is added here and in hf_map.cpp's tables.
// Throws CheckpointError for a model type without a Hugging Face layout (mlp).
ModelDims dims_of(const JobSpec& spec);

// One Hugging Face tensor is rows [row_begin, row_begin + rows) of one troupe tensor, maybe
// transposed. A troupe tensor without a row split maps whole (row_begin 0, rows = dim 0).
//   llama, NH=4, NKV=2, HS=8, D=32: h.0.attn.c_attn.weight (64, 32)
//     rows [0, 32)  -> model.layers.0.self_attn.q_proj.weight (32, 32)
//     rows [32, 48) -> model.layers.0.self_attn.k_proj.weight (16, 32)
//     rows [48, 64) -> model.layers.0.self_attn.v_proj.weight (16, 32)
struct TensorMap {
  std::string troupe_name;
  Shape troupe_shape;
  std::string hf_name;
  Shape hf_shape;  // transposed: troupe's part reversed; else the part's shape, except that
                   // dim 0 may be longer (the position table: troupe reads the first rows)
  int64_t row_begin = 0, rows = 0;
  bool transpose = false;
};
// Every tensor of the model in the order of a forward (embeddings, block 0, ..., final norm,
// head), a split tensor's parts in row order.
std::vector<TensorMap> tensor_map(const ModelDims& d);

// config.json for a model (architectures, model_type, sizes, eps, theta, rope scaling, tying,
// torch_dtype).
nlohmann::json config_json(const ModelDims& d, DType dtype);
// Checks a config.json against the job's model: every disagreement, one line each, naming the
// config key, its value and the spec's ("config.json: n_embd is 64, the job's model.d_model is
// 32"). Keys a config leaves out take Hugging Face's defaults. Throws CheckpointError listing
// them all. Returns the dims to read the files with (max_positions from the config).
ModelDims check_config(const nlohmann::json& config, const ModelDims& spec, const std::string& where);

// Full f32 tensors under one naming -> the other (export; tests). Throws CheckpointError
// naming a tensor that is missing or has another shape.
std::map<std::string, Tensor> to_hf(const ModelDims& d, const std::map<std::string, Tensor>& troupe);
std::map<std::string, Tensor> from_hf(const ModelDims& d, const std::map<std::string, Tensor>& hf);

// Whether path is a directory holding config.json and no manifest.json.
bool is_hf_dir(const std::string& path);

// A Hugging Face model directory, opened for a job's model: the config agrees with it
// (check_config) and every mapped tensor is present, floating-point, of its shape.
// Tensors the model does not use (GPT-2's attn.bias mask buffers) are ignored. A file saved
// from GPT2Model (names without "transformer.") is read too.
class HfSource {
 public:
  HfSource(const std::string& dir, const ModelDims& spec);  // throws CheckpointError / FormatError
  ~HfSource();
  const ModelDims& dims() const { return dims_; }
  // Fills dst (local_shape(want) floats) with the slice `want` of the troupe tensor `name`
  // (split_dim -1, 0 or 1), reading only what holds it. Throws CheckpointError when `name`
  // is not a tensor of the model or its global shape is not want's.
  void read_slice(const std::string& name, const SliceSpec& want, float* dst) const;
  uint64_t bytes_read() const { return bytes_read_; }  // bytes of the stored dtype

 private:
  struct Part {
    TensorMap map;
    const safetensors::Reader* reader = nullptr;
    std::string stored_name;  // hf_name, or without "transformer."
  };
  void read_part(const Part& p, const SliceSpec& want, float* dst) const;
  void read_run(const Part& p, int64_t elem, int64_t count, float* dst) const;

  std::string dir_;
  ModelDims dims_;
  std::vector<std::unique_ptr<safetensors::Reader>> readers_;
  std::map<std::string, std::vector<Part>> parts_;  // by troupe name
  mutable std::vector<char> staging_;
  mutable uint64_t bytes_read_ = 0;
};

// What model.init_from names, as a reader of parameter slices (name, the slice a rank holds,
// its destination): a Hugging Face directory (HfSource, checked against the job's model), a
// checkpoint directory or a root holding them, of any layout, or a safetensors file of full
// tensors under troupe's names (TensorSource). Throws what they throw on opening.
using SliceReader = std::function<void(const std::string& name, const SliceSpec& want, float* dst)>;
SliceReader init_source(const std::string& path, const JobSpec& spec);

// Writes out_dir/config.json and out_dir/model.safetensors (metadata {"format": "pt"}) of the
// checkpoint's model, tensors in `dtype` (f32, bf16 or f16, rounded to nearest even). Each
// file is written to a temporary name, fsynced and renamed, config.json last. Throws
// CheckpointError for a model type it cannot map (mlp). Returns the number of tensors written.
size_t export_hf(const std::string& checkpoint_dir, const std::string& out_dir, DType dtype = DType::f32);

}  // namespace troupe::checkpoint::hf

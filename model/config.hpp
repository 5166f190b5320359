// Model and pipeline-stage configuration.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/layer_range.hpp"

namespace troupe::model {

enum class ModelKind : uint8_t {
  gpt,    // byte-level GPT-2-style decoder
  mlp,    // per-position residual MLP over the embedding (predicts the next byte from the current one)
  llama,  // Llama-family decoder: RMSNorm, rotary embeddings, grouped-query attention, SwiGLU, no biases
};
const char* model_kind_name(ModelKind k);  // "gpt" / "mlp" / "llama"

// Llama 3.1's rotary scaling (Hugging Face's rope_type "llama3"): channel pairs whose wavelength
// exceeds original_max_positions / low_freq_factor turn `factor` times slower, those shorter than
// original_max_positions / high_freq_factor as before, and those between by a blend of the two.
struct RopeScaling {
  bool llama3 = false;  // false: unscaled
  double factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  int original_max_positions = 8192;
};

// The inverse frequency of each channel pair i in [0, HS/2): theta^(-2i/HS), then the scaling,
// formed in f32 operation by operation as Hugging Face's _compute_default_rope_parameters and
// _compute_llama3_parameters form them (so the tables agree bit for bit).
std::vector<float> rope_inv_freq(int head_dim, double theta, const RopeScaling& scaling);
ModelKind model_kind_from_name(const std::string& s);  // throws troupe::Error on other names

struct ModelConfig {
  ModelKind kind = ModelKind::gpt;
  int vocab_size = 256;  // byte-level
  int seq_len = 64;      // maximum T; rows of wpe
  int d_model = 64;      // D
  int n_layer = 2;       // L
  int n_head = 2;        // NH (gpt, llama); D % NH == 0
  // llama only:
  int n_kv_head = 0;            // NKV key/value heads (grouped-query attention); NH % NKV == 0; 0 = NH
  int ffn_hidden = 0;           // F: the SwiGLU hidden width (llama); gpt's MLP width (0 = 4D)
  float norm_eps = 1e-5f;       // RMSNorm epsilon
  double rope_theta = 10000.0;  // rotary base: channel pair i turns by position * theta^(-2i/HS)
  RopeScaling rope_scaling;     // llama3 scaling of those frequencies
  bool tie_embeddings = false;  // LM head reads wte (gpt: always tied)
  uint64_t seed = 0;            // parameter init: every element is a function of (seed, name, index)
  // Activation recomputation per block (train.recompute: full): a stage keeps only each
  // block's input per micro-batch; the blocks share one set of internal activations and
  // each block's forward is re-run right before its backward. Same numbers, less memory.
  bool recompute = false;
  // (train.recompute: selective recomputed the attention probabilities; the fused attention
  // keeps none, only each query's log-sum-exp, so selective now keeps what none keeps.)

  void validate() const;  // throws troupe::Error with the offending field
  int head_dim() const { return d_model / n_head; }
  int kv_heads() const { return kind == ModelKind::llama && n_kv_head > 0 ? n_kv_head : n_head; }
  // The MLP's hidden width: ffn_hidden (llama; gpt when given), else 4D (gpt, mlp).
  int64_t ffn() const {
    if (kind == ModelKind::llama || (kind == ModelKind::gpt && ffn_hidden > 0)) return ffn_hidden;
    return 4 * int64_t{d_model};
  }
  // The LM head reads the embedding's wte (gpt always, llama with tie_embeddings).
  bool tied_head() const { return kind != ModelKind::llama || tie_embeddings; }
  // Embedding and LM head split by vocabulary rows under tensor parallelism (llama).
  bool vocab_parallel() const { return kind == ModelKind::llama; }
};

// Tensor shard `rank` of a tensor-parallel group of `size` ranks (Megatron): shard t
// holds heads [t*NH/size, (t+1)*NH/size) and MLP hidden units [t*F/size, (t+1)*F/size)
// (F = cfg.ffn()); a llama shard also holds key/value heads [t*NKV/size, (t+1)*NKV/size)
// (never replicated: size must divide NKV) and vocabulary rows [t*V/size, (t+1)*V/size)
// of the embedding and the LM head. size = 1: the whole model, no communication.
struct TensorShard {
  int rank = 0;
  int size = 1;

  // Throws troupe::Error unless 0 <= rank < size, NH % size == 0 (gpt, llama), F % size == 0
  // and, for llama, NKV % size == 0 and V % size == 0.
  void validate(const ModelConfig& cfg) const;
  int n_head(const ModelConfig& cfg) const { return cfg.n_head / size; }         // local heads
  int n_kv_head(const ModelConfig& cfg) const { return cfg.kv_heads() / size; }  // local kv heads
  int64_t hidden(const ModelConfig& cfg) const { return cfg.ffn() / size; }      // local F
  // Local vocabulary rows of the embedding / LM head: V/size from vocab_begin (llama), else all V.
  int64_t vocab(const ModelConfig& cfg) const {
    return cfg.vocab_parallel() ? cfg.vocab_size / size : cfg.vocab_size;
  }
  int64_t vocab_begin(const ModelConfig& cfg) const { return cfg.vocab_parallel() ? rank * vocab(cfg) : 0; }
};

}  // namespace troupe::model

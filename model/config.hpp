// Model and pipeline-stage configuration.
#pragma once

#include <cstdint>
#include <string>

namespace troupe::model {

enum class ModelKind : uint8_t {
  gpt,  // byte-level GPT-2-style decoder
  mlp,  // per-position residual MLP over the embedding (predicts the next byte from the current one)
};
const char* model_kind_name(ModelKind k);              // "gpt" / "mlp"
ModelKind model_kind_from_name(const std::string& s);  // throws troupe::Error on other names

struct ModelConfig {
  ModelKind kind = ModelKind::gpt;
  int vocab_size = 256;  // byte-level
  int seq_len = 64;      // maximum T; rows of wpe
  int d_model = 64;      // D
  int n_layer = 2;       // L
  int n_head = 2;        // NH (gpt only); D % NH == 0
  uint64_t seed = 0;     // parameter init: every element is a function of (seed, name, index)
  // Activation recomputation per block (train.recompute: block): a stage keeps only each
  // block's input per micro-batch; the blocks share one set of internal activations and
  // each block's forward is re-run right before its backward. Same numbers, less memory.
  bool recompute = false;

  void validate() const;  // throws troupe::Error with the offending field
  int head_dim() const { return d_model / n_head; }
};

// A pipeline stage: blocks [first, last) plus the embedding (first stage) and/or the
// head = ln_f + LM head tied to wte + loss (last stage). The single-device model is
// full(cfg): every block, embedding and head.
struct StageRange {
  int first = 0;
  int last = 0;
  bool has_embedding = true;
  bool has_head = true;

  static StageRange full(const ModelConfig& cfg) { return {0, cfg.n_layer, true, true}; }
  int n_blocks() const { return last - first; }
};

// Tensor shard `rank` of a tensor-parallel group of `size` ranks (Megatron): shard t
// holds heads [t*NH/size, (t+1)*NH/size) and MLP hidden units [t*4D/size, (t+1)*4D/size).
// size = 1: the whole model, no communication.
struct TensorShard {
  int rank = 0;
  int size = 1;

  // Throws troupe::Error unless 0 <= rank < size, NH % size == 0 (gpt) and 4D % size == 0.
  void validate(const ModelConfig& cfg) const;
  int n_head(const ModelConfig& cfg) const { return cfg.n_head / size; }                    // local heads
  int64_t hidden(const ModelConfig& cfg) const { return 4 * int64_t{cfg.d_model} / size; }  // local 4D
};

}  // namespace troupe::model

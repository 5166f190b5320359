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

}  // namespace troupe::model

#include "model/config.hpp"

#include "core/error.hpp"

namespace troupe::model {

const char* model_kind_name(ModelKind k) {
  switch (k) {
    case ModelKind::gpt:
      return "gpt";
    case ModelKind::mlp:
      return "mlp";
    case ModelKind::llama:
      return "llama";
  }
  return "?";
}

ModelKind model_kind_from_name(const std::string& s) {
  if (s == "gpt") return ModelKind::gpt;
  if (s == "mlp") return ModelKind::mlp;
  if (s == "llama") return ModelKind::llama;
  TROUPE_CHECK(false, "unknown model kind \"", s, "\" (expected gpt, mlp or llama)");
  return ModelKind::gpt;
}

void ModelConfig::validate() const {
  TROUPE_CHECK(vocab_size > 0, "vocab_size must be positive, got ", vocab_size);
  TROUPE_CHECK(seq_len > 0, "seq_len must be positive, got ", seq_len);
  TROUPE_CHECK(d_model > 0, "d_model must be positive, got ", d_model);
  TROUPE_CHECK(n_layer >= 0, "n_layer must be >= 0, got ", n_layer);
  if (kind != ModelKind::mlp) {
    TROUPE_CHECK(n_head > 0 && d_model % n_head == 0, "d_model (", d_model,
                 ") must be a multiple of n_head (", n_head, ")");
  }
  if (kind == ModelKind::llama) {
    TROUPE_CHECK(kv_heads() > 0 && n_head % kv_heads() == 0, "n_head (", n_head,
                 ") must be a multiple of n_kv_head (", kv_heads(), ")");
    TROUPE_CHECK(head_dim() % 2 == 0, "rotary embeddings need an even head size, got ", head_dim());
    TROUPE_CHECK(ffn_hidden > 0, "ffn_hidden must be positive, got ", ffn_hidden);
    TROUPE_CHECK(norm_eps > 0.0f && rope_theta > 1.0, "norm_eps (", norm_eps,
                 ") must be > 0 and rope_theta (", rope_theta, ") > 1");
  }
}

void TensorShard::validate(const ModelConfig& cfg) const {
  TROUPE_CHECK(size >= 1 && rank >= 0 && rank < size, "tensor shard ", rank, " outside a group of ", size);
  if (cfg.kind != ModelKind::mlp)
    TROUPE_CHECK(cfg.n_head % size == 0, "tensor parallelism ", size, " must divide n_head (", cfg.n_head,
                 "): shards split attention by heads");
  TROUPE_CHECK(cfg.ffn() % size == 0, "tensor parallelism ", size, " must divide the MLP hidden width (",
               cfg.ffn(), ")");
  if (cfg.kind == ModelKind::llama) {
    TROUPE_CHECK(cfg.kv_heads() % size == 0, "tensor parallelism ", size, " must divide n_kv_head (",
                 cfg.kv_heads(), "): shards hold whole key/value heads");
    TROUPE_CHECK(cfg.vocab_size % size == 0, "tensor parallelism ", size, " must divide vocab_size (",
                 cfg.vocab_size, "): shards hold vocabulary rows");
  }
}

}  // namespace troupe::model

#include "model/config.hpp"

#include "core/error.hpp"

namespace troupe::model {

const char* model_kind_name(ModelKind k) { return k == ModelKind::gpt ? "gpt" : "mlp"; }

ModelKind model_kind_from_name(const std::string& s) {
  if (s == "gpt") return ModelKind::gpt;
  if (s == "mlp") return ModelKind::mlp;
  TROUPE_CHECK(false, "unknown model kind \"", s, "\" (expected gpt or mlp)");
  return ModelKind::gpt;
}

void ModelConfig::validate() const {
  TROUPE_CHECK(vocab_size > 0, "vocab_size must be positive, got ", vocab_size);
  TROUPE_CHECK(seq_len > 0, "seq_len must be positive, got ", seq_len);
  TROUPE_CHECK(d_model > 0, "d_model must be positive, got ", d_model);
  TROUPE_CHECK(n_layer >= 0, "n_layer must be >= 0, got ", n_layer);
  if (kind == ModelKind::gpt) {
    TROUPE_CHECK(n_head > 0 && d_model % n_head == 0, "d_model (", d_model,
                 ") must be a multiple of n_head (", n_head, ")");
  }
}

void TensorShard::validate(const ModelConfig& cfg) const {
  TROUPE_CHECK(size >= 1 && rank >= 0 && rank < size, "tensor shard ", rank, " outside a group of ", size);
  if (cfg.kind == ModelKind::gpt)
    TROUPE_CHECK(cfg.n_head % size == 0, "tensor parallelism ", size, " must divide n_head (", cfg.n_head,
                 "): shards split attention by heads");
  TROUPE_CHECK(4 * int64_t{cfg.d_model} % size == 0, "tensor parallelism ", size,
               " must divide the MLP hidden width 4*d_model (", 4 * int64_t{cfg.d_model}, ")");
}

}  // namespace troupe::model

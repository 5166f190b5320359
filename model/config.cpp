#include "model/config.hpp"

#include <cmath>

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

std::vector<float> rope_inv_freq(int HS, double theta, const RopeScaling& s) {
  TROUPE_CHECK(HS > 0 && HS % 2 == 0 && theta > 1.0, "rope: head size ", HS, ", theta ", theta);
  std::vector<float> inv(size_t(HS / 2));
  // torch: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), each step in f32.
  const float base = float(theta);
  for (int i = 0; i < HS / 2; ++i) {
    const float e = float(2 * i) / float(HS);
    inv[size_t(i)] = 1.0f / std::pow(base, e);
  }
  if (!s.llama3) return inv;
  // _compute_llama3_parameters, its Python scalars meeting f32 tensors as f32.
  const float factor = float(s.factor), low = float(s.low_freq_factor), high = float(s.high_freq_factor);
  const float old_len = float(s.original_max_positions);
  const float low_wavelen = float(double(s.original_max_positions) / s.low_freq_factor);
  const float high_wavelen = float(double(s.original_max_positions) / s.high_freq_factor);
  const float two_pi = float(2.0 * M_PI);
  const float span = float(s.high_freq_factor - s.low_freq_factor);
  for (float& f : inv) {
    const float wavelen = two_pi / f;
    float scaled = wavelen > low_wavelen ? f / factor : f;
    if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
      const float smooth = (old_len / wavelen - low) / span;
      const float a = (1.0f - smooth) * scaled;
      const float b = smooth * scaled;
      scaled = a / factor + b;
    }
    f = scaled;
    (void)high;
  }
  return inv;
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
    if (rope_scaling.llama3)
      TROUPE_CHECK(rope_scaling.factor >= 1.0 && rope_scaling.low_freq_factor > 0.0 &&
                       rope_scaling.high_freq_factor > rope_scaling.low_freq_factor &&
                       rope_scaling.original_max_positions > 0,
                   "llama3 rope scaling needs factor >= 1, 0 < low_freq_factor < high_freq_factor and "
                   "original_max_positions > 0");
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

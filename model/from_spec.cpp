#include "model/from_spec.hpp"

namespace troupe::model {

ModelConfig model_config(const JobSpec& spec) {
  ModelConfig c;
  c.kind = spec.model.type == ModelType::gpt   ? ModelKind::gpt
           : spec.model.type == ModelType::mlp ? ModelKind::mlp
                                               : ModelKind::llama;
  c.vocab_size = spec.model.vocab_size;
  c.seq_len = spec.model.seq_len;
  c.d_model = spec.model.d_model;
  c.n_layer = spec.model.n_layers;
  c.n_head = c.kind != ModelKind::mlp ? spec.model.n_heads : 1;
  if (c.kind == ModelKind::llama) {
    c.n_kv_head = spec.model.n_kv_heads;
    c.ffn_hidden = spec.model.ffn_hidden;
    c.norm_eps = static_cast<float>(spec.model.norm_eps);
    c.rope_theta = spec.model.rope_theta;
    const RopeScalingSpec& rs = spec.model.rope_scaling;
    if (rs.type == "llama3") {
      c.rope_scaling.llama3 = true;
      c.rope_scaling.factor = rs.factor;
      c.rope_scaling.low_freq_factor = rs.low_freq_factor;
      c.rope_scaling.high_freq_factor = rs.high_freq_factor;
      c.rope_scaling.original_max_positions = rs.original_max_position_embeddings;
    }
    c.tie_embeddings = spec.model.tie_embeddings;
  }
  if (c.kind == ModelKind::gpt) c.ffn_hidden = spec.model.ffn_hidden;  // 0: 4 d_model
  c.seed = spec.train.seed;
  c.recompute = spec.train.recompute == Recompute::full;
  c.validate();
  return c;
}

}  // namespace troupe::model

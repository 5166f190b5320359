#include "model/from_spec.hpp"

namespace troupe::model {

ModelConfig model_config(const JobSpec& spec) {
  ModelConfig c;
  c.kind = spec.model.type == ModelType::gpt ? ModelKind::gpt : ModelKind::mlp;
  c.vocab_size = spec.model.vocab_size;
  c.seq_len = spec.model.seq_len;
  c.d_model = spec.model.d_model;
  c.n_layer = spec.model.n_layers;
  c.n_head = c.kind == ModelKind::gpt ? spec.model.n_heads : 1;
  c.seed = spec.train.seed;
  c.recompute = spec.train.recompute == Recompute::block;
  c.validate();
  return c;
}

}  // namespace troupe::model

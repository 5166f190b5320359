// The model configuration a job spec asks for.
#pragma once

#include "core/spec.hpp"
#include "model/config.hpp"

namespace troupe::model {

// spec.model (type, vocab_size, seq_len, d_model, n_layers, n_heads) with the init seed
// spec.train.seed; validated.
ModelConfig model_config(const JobSpec& spec);

}  // namespace troupe::model

// The smallest valid spec the spec tests start from (data.path is not opened by parse_spec).
#pragma once

namespace troupe::testing {

inline constexpr const char* kMinimalSpec = R"(name: tiny
model:
  type: gpt
  seq_len: 32
  d_model: 64
  n_layers: 2
  n_heads: 4
data:
  path: corpus.txt
train:
  steps: 10
  global_batch: 8
)";

}  // namespace troupe::testing

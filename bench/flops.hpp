// FLOPs per trained token of the GPT of the benchmarks: 6 * N, with N the parameters without
// wpe (every weight is used in one forward and two backward products), plus 12 * L * D * T
// (attention scores and their use, forward and backward, at full T; the causal mask is not
// credited). `params` counts wpe, as the engine and PyTorch report it.
#pragma once

namespace troupe::bench {

inline double gpt_flops_per_token(long long params, int layers, int d_model, int seq_len) {
  const double no_wpe = double(params) - double(seq_len) * d_model;
  return 6.0 * no_wpe + 12.0 * layers * d_model * double(seq_len);
}

}  // namespace troupe::bench

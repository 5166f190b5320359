// A plain double-precision Llama forward and loss, written from the math (Hugging Face's
// LlamaForCausalLM: RMSNorm, rotate_half rotary embeddings, grouped-query causal
// attention, SwiGLU, untied or tied LM head), as the oracle for the float llama model
// and, through finite differences, its backward. Parameter names as model/params.hpp.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "reference.hpp"

namespace troupe::model::testing {

inline std::vector<double> ref_rmsnorm(const std::vector<double>& x, const std::vector<double>& w, int N,
                                       int C, double eps) {
  std::vector<double> y(x.size());
  for (int n = 0; n < N; ++n) {
    const double* r = &x[static_cast<size_t>(n) * C];
    double ms = 0;
    for (int c = 0; c < C; ++c) ms += r[c] * r[c];
    const double rs = 1.0 / std::sqrt(ms / C + eps);
    for (int c = 0; c < C; ++c) y[static_cast<size_t>(n) * C + c] = r[c] * rs * w[static_cast<size_t>(c)];
  }
  return y;
}

// Rotates heads [0, n_heads) at the start of each row (row stride ld) by position.
inline void ref_rope(std::vector<double>& x, int B, int T, int n_heads, int HS, int ld, double theta) {
  const int half = HS / 2;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < n_heads; ++h) {
        double* p = &x[(static_cast<size_t>(b) * T + t) * ld + static_cast<size_t>(h) * HS];
        for (int i = 0; i < half; ++i) {
          const double a = t * std::pow(theta, -2.0 * i / HS);
          const double x1 = p[i], x2 = p[i + half];
          p[i] = x1 * std::cos(a) - x2 * std::sin(a);
          p[i + half] = x2 * std::cos(a) + x1 * std::sin(a);
        }
      }
}

// (B*T, V) logits of the llama model.
inline std::vector<double> ref_llama_logits(const ModelConfig& cfg, const Params& p,
                                            const std::vector<int32_t>& tokens, int B, int T) {
  const int D = cfg.d_model, V = cfg.vocab_size, N = B * T, NH = cfg.n_head, NKV = cfg.kv_heads();
  const int HS = D / NH, Q = NH * HS, KV = NKV * HS, ld = Q + 2 * KV, F = cfg.ffn_hidden;
  const double eps = cfg.norm_eps;
  auto P = [&](const std::string& n) -> const std::vector<double>& { return p.at(n); };
  std::vector<double> x(static_cast<size_t>(N) * D);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < D; ++c)
      x[static_cast<size_t>(n) * D + c] =
          P("wte.weight")[static_cast<size_t>(tokens[static_cast<size_t>(n)]) * D + c];
  for (int l = 0; l < cfg.n_layer; ++l) {
    const std::string h = "h." + std::to_string(l);
    auto ln = ref_rmsnorm(x, P(h + ".ln_1.weight"), N, D, eps);
    auto qkv = ref_linear(ln, P(h + ".attn.c_attn.weight"), nullptr, N, D, ld);
    ref_rope(qkv, B, T, NH + NKV, HS, ld, cfg.rope_theta);
    const std::vector<double> y = ref_causal_attention(qkv, B, T, NH, NKV, HS);
    auto o = ref_linear(y, P(h + ".attn.c_proj.weight"), nullptr, N, Q, D);
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
    auto ln2 = ref_rmsnorm(x, P(h + ".ln_2.weight"), N, D, eps);
    auto gu = ref_linear(ln2, P(h + ".mlp.c_fc.weight"), nullptr, N, D, 2 * F);
    std::vector<double> a(static_cast<size_t>(N) * F);
    for (int n = 0; n < N; ++n)
      for (int f = 0; f < F; ++f) {
        const double g = gu[static_cast<size_t>(n) * 2 * F + f],
                     u = gu[static_cast<size_t>(n) * 2 * F + F + f];
        a[static_cast<size_t>(n) * F + f] = g / (1.0 + std::exp(-g)) * u;
      }
    auto down = ref_linear(a, P(h + ".mlp.c_proj.weight"), nullptr, N, F, D);
    for (size_t i = 0; i < x.size(); ++i) x[i] += down[i];
  }
  auto lnf = ref_rmsnorm(x, P("ln_f.weight"), N, D, eps);
  return ref_linear(lnf, P(cfg.tie_embeddings ? "wte.weight" : "lm_head.weight"), nullptr, N, D, V);
}

inline double ref_llama_loss(const ModelConfig& cfg, const Params& p, const std::vector<int32_t>& tokens,
                             const std::vector<int32_t>& targets, int B, int T) {
  return ref_mean_cross_entropy(ref_llama_logits(cfg, p, tokens, B, T), targets, B * T, cfg.vocab_size);
}

}  // namespace troupe::model::testing

// A plain double-precision re-implementation of the GPT and MLP models' loss, written
// from the math (not from the kernels), as the oracle for the float model's forward
// and, through central finite differences, its backward.
#pragma once

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "model/config.hpp"
#include "model/stage.hpp"

namespace troupe::model::testing {

using Params = std::map<std::string, std::vector<double>>;

inline Params to_double(const Stage& s) {
  Params p;
  for (const auto& q : s.params())
    p[q.name] = std::vector<double>(q.data.f32(), q.data.f32() + q.data.numel());
  return p;
}

// y(N,out) = x(N,in) W^T + b
inline std::vector<double> ref_linear(const std::vector<double>& x, const std::vector<double>& w,
                                      const std::vector<double>* b, int N, int in, int out) {
  std::vector<double> y(static_cast<size_t>(N) * out);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < out; ++o) {
      double acc = b ? (*b)[static_cast<size_t>(o)] : 0.0;
      for (int i = 0; i < in; ++i)
        acc += x[static_cast<size_t>(n) * in + i] * w[static_cast<size_t>(o) * in + i];
      y[static_cast<size_t>(n) * out + o] = acc;
    }
  return y;
}

inline std::vector<double> ref_layernorm(const std::vector<double>& x, const std::vector<double>& w,
                                         const std::vector<double>& b, int N, int C) {
  std::vector<double> y(x.size());
  for (int n = 0; n < N; ++n) {
    const double* r = &x[static_cast<size_t>(n) * C];
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += r[c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (r[c] - m) * (r[c] - m);
    v /= C;
    double rs = 1.0 / std::sqrt(v + 1e-5);
    for (int c = 0; c < C; ++c) y[static_cast<size_t>(n) * C + c] = (r[c] - m) * rs * w[c] + b[c];
  }
  return y;
}

inline double ref_gelu(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

// Causal softmax attention over qkv(B*T, (NH + 2*NKV)*HS), rows q heads | k heads | v heads;
// query head h reads key/value head h / (NH/NKV). Returns (B*T, NH*HS).
inline std::vector<double> ref_causal_attention(const std::vector<double>& qkv, int B, int T, int NH, int NKV,
                                                int HS) {
  const int Q = NH * HS, KV = NKV * HS, ld = Q + 2 * KV;
  std::vector<double> y(static_cast<size_t>(B) * T * Q, 0.0);
  auto at = [&](int b, int t, int col) { return &qkv[(static_cast<size_t>(b) * T + t) * ld + col]; };
  for (int b = 0; b < B; ++b)
    for (int hd = 0; hd < NH; ++hd) {
      const int g = hd / (NH / NKV);
      for (int t = 0; t < T; ++t) {
        const double* q = at(b, t, hd * HS);
        std::vector<double> s(static_cast<size_t>(t) + 1);
        double mx = -1e300;
        for (int u = 0; u <= t; ++u) {
          const double* k = at(b, u, Q + g * HS);
          double dot = 0;
          for (int e = 0; e < HS; ++e) dot += q[e] * k[e];
          s[static_cast<size_t>(u)] = dot / std::sqrt(static_cast<double>(HS));
          mx = std::max(mx, s[static_cast<size_t>(u)]);
        }
        double z = 0;
        for (auto& v : s) z += (v = std::exp(v - mx));
        for (int u = 0; u <= t; ++u) {
          const double* v = at(b, u, Q + KV + g * HS);
          for (int e = 0; e < HS; ++e)
            y[(static_cast<size_t>(b) * T + t) * Q + static_cast<size_t>(hd) * HS + e] +=
                s[static_cast<size_t>(u)] / z * v[e];
        }
      }
    }
  return y;
}

// Mean softmax cross-entropy of logits(N,V) against targets(N).
inline double ref_mean_cross_entropy(const std::vector<double>& logits, const std::vector<int32_t>& targets,
                                     int N, int V) {
  double loss = 0;
  for (int n = 0; n < N; ++n) {
    const double* r = &logits[static_cast<size_t>(n) * V];
    double mx = -1e300;
    for (int v = 0; v < V; ++v) mx = std::max(mx, r[v]);
    double z = 0;
    for (int v = 0; v < V; ++v) z += std::exp(r[v] - mx);
    loss += std::log(z) + mx - r[targets[static_cast<size_t>(n)]];
  }
  return loss / N;
}

// Mean cross-entropy over the B*T tokens.
inline double ref_loss(const ModelConfig& cfg, const Params& p, const std::vector<int32_t>& tokens,
                       const std::vector<int32_t>& targets, int B, int T) {
  const int D = cfg.d_model, V = cfg.vocab_size, N = B * T;
  auto P = [&](const std::string& n) -> const std::vector<double>& { return p.at(n); };
  std::vector<double> x(static_cast<size_t>(N) * D);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < D; ++c) {
        size_t i = (static_cast<size_t>(b) * T + t) * D + c;
        x[i] = P("wte.weight")[static_cast<size_t>(tokens[static_cast<size_t>(b * T + t)]) * D + c];
        if (cfg.kind == ModelKind::gpt) x[i] += P("wpe.weight")[static_cast<size_t>(t) * D + c];
      }
  for (int l = 0; l < cfg.n_layer; ++l) {
    const std::string h = "h." + std::to_string(l);
    if (cfg.kind == ModelKind::gpt) {
      const int NH = cfg.n_head, HS = D / NH;
      auto ln = ref_layernorm(x, P(h + ".ln_1.weight"), P(h + ".ln_1.bias"), N, D);
      auto qkv = ref_linear(ln, P(h + ".attn.c_attn.weight"), &P(h + ".attn.c_attn.bias"), N, D, 3 * D);
      const std::vector<double> y = ref_causal_attention(qkv, B, T, NH, NH, HS);
      auto proj = ref_linear(y, P(h + ".attn.c_proj.weight"), &P(h + ".attn.c_proj.bias"), N, D, D);
      for (size_t i = 0; i < x.size(); ++i) x[i] += proj[i];
    }
    auto ln = ref_layernorm(x, P(h + ".ln_2.weight"), P(h + ".ln_2.bias"), N, D);
    auto fc = ref_linear(ln, P(h + ".mlp.c_fc.weight"), &P(h + ".mlp.c_fc.bias"), N, D, 4 * D);
    for (auto& v : fc) v = ref_gelu(v);
    auto proj = ref_linear(fc, P(h + ".mlp.c_proj.weight"), &P(h + ".mlp.c_proj.bias"), N, 4 * D, D);
    for (size_t i = 0; i < x.size(); ++i) x[i] += proj[i];
  }
  auto lnf = ref_layernorm(x, P("ln_f.weight"), P("ln_f.bias"), N, D);
  return ref_mean_cross_entropy(ref_linear(lnf, P("wte.weight"), nullptr, N, D, V), targets, N, V);
}

}  // namespace troupe::model::testing

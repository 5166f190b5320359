#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/dataset.hpp"
#include "core/error.hpp"
#include "core/rng.hpp"
#include "kernels/cpu/kernels.hpp"
#include "model/from_spec.hpp"
#include "model/stage.hpp"
#include "reference.hpp"

using namespace troupe;
using namespace troupe::model;

namespace {

ModelConfig tiny_gpt() {
  ModelConfig c;
  c.kind = ModelKind::gpt;
  c.vocab_size = 256;
  c.seq_len = 4;
  c.d_model = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.seed = 1234;
  return c;
}

std::vector<int32_t> random_tokens(uint64_t seed, size_t n, int V = 256) {
  rng::Stream s(seed, 77);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(s.below(static_cast<uint64_t>(V)));
  return t;
}

// Moves parameters away from init (LN weights near 1, everything else O(0.3)) so that no
// gradient is trivially zero or tiny in the gradient check.
void perturb(Stage& s, uint64_t seed) {
  for (auto& p : s.params()) {
    bool ln_weight = p.name.find("ln_") != std::string::npos && p.name.find(".weight") != std::string::npos;
    rng::fill_normal(p.data.f32(), static_cast<size_t>(p.data.numel()), seed, rng::name_hash(p.name), 0,
                     ln_weight ? 1.0 : 0.0, 0.3);
  }
}

double stddev(const Tensor& t, double* mean_out = nullptr) {
  double s = 0, s2 = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s += t.f32()[i];
    s2 += double(t.f32()[i]) * t.f32()[i];
  }
  double m = s / t.numel();
  if (mean_out) *mean_out = m;
  return std::sqrt(s2 / t.numel() - m * m);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

}  // namespace

TEST_CASE("model: GPT parameter names, shapes and decay flags", "[model]") {
  ModelConfig c = tiny_gpt();
  c.d_model = 16;
  c.seq_len = 32;
  c.n_layer = 3;
  Stage s(c, LayerRange::full(c.n_layer));
  const int64_t V = 256, T = 32, D = 16;
  std::vector<std::pair<std::string, Shape>> want = {{"wte.weight", {V, D}}, {"wpe.weight", {T, D}}};
  for (int i = 0; i < 3; ++i) {
    std::string h = "h." + std::to_string(i);
    want.push_back({h + ".ln_1.weight", {D}});
    want.push_back({h + ".ln_1.bias", {D}});
    want.push_back({h + ".attn.c_attn.weight", {3 * D, D}});
    want.push_back({h + ".attn.c_attn.bias", {3 * D}});
    want.push_back({h + ".attn.c_proj.weight", {D, D}});
    want.push_back({h + ".attn.c_proj.bias", {D}});
    want.push_back({h + ".ln_2.weight", {D}});
    want.push_back({h + ".ln_2.bias", {D}});
    want.push_back({h + ".mlp.c_fc.weight", {4 * D, D}});
    want.push_back({h + ".mlp.c_fc.bias", {4 * D}});
    want.push_back({h + ".mlp.c_proj.weight", {D, 4 * D}});
    want.push_back({h + ".mlp.c_proj.bias", {D}});
  }
  want.push_back({"ln_f.weight", {D}});
  want.push_back({"ln_f.bias", {D}});
  REQUIRE(s.params().size() == want.size());
  int64_t total = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const Param& p = s.params()[i];
    INFO(p.name);
    REQUIRE(p.name == want[i].first);
    REQUIRE(p.global_shape == want[i].second);
    REQUIRE(p.data.shape() == want[i].second);
    REQUIRE(p.grad.shape() == want[i].second);
    REQUIRE(p.split_dim == -1);
    REQUIRE(p.decay == (want[i].second.size() == 2));
    REQUIRE(reinterpret_cast<uintptr_t>(p.data.data()) % 64 == 0);
    total += p.data.numel();
  }
  REQUIRE(s.num_params() == total);
  // GPT-2 small's formula without the untied head: 12*L*D^2 + 13*L*D + (V+T)*D + 2*D
  REQUIRE(total == 12 * 3 * D * D + 13 * 3 * D + (V + T) * D + 2 * D);
}

TEST_CASE("model: MLP parameter names and stage splits hold the right parameters", "[model]") {
  ModelConfig c = tiny_gpt();
  c.kind = ModelKind::mlp;
  Stage s(c, LayerRange::full(c.n_layer));
  std::vector<std::string> names;
  for (auto& p : s.params()) names.push_back(p.name);
  REQUIRE(names == std::vector<std::string>{
                       "wte.weight", "h.0.ln_2.weight", "h.0.ln_2.bias", "h.0.mlp.c_fc.weight",
                       "h.0.mlp.c_fc.bias", "h.0.mlp.c_proj.weight", "h.0.mlp.c_proj.bias", "h.1.ln_2.weight",
                       "h.1.ln_2.bias", "h.1.mlp.c_fc.weight", "h.1.mlp.c_fc.bias", "h.1.mlp.c_proj.weight",
                       "h.1.mlp.c_proj.bias", "ln_f.weight", "ln_f.bias"});
  ModelConfig g = tiny_gpt();
  auto first = param_specs(g, {0, 1, true, false});
  auto last = param_specs(g, {1, 2, false, true});
  REQUIRE(first.front().name == "wte.weight");
  REQUIRE(first[1].name == "wpe.weight");
  REQUIRE(first.back().name == "h.0.mlp.c_proj.bias");
  REQUIRE(last.front().name == "h.1.ln_1.weight");
  REQUIRE(last.back().name == "wte.weight");  // tied head
  REQUIRE(first.size() + last.size() == param_specs(g, LayerRange::full(g.n_layer)).size() + 1);
  REQUIRE_THROWS_AS(param_specs(g, {1, 3, false, true}), troupe::Error);
  ModelConfig bad = g;
  bad.n_head = 3;
  REQUIRE_THROWS_AS(bad.validate(), troupe::Error);
}

TEST_CASE("model: init statistics and layout-independent slices", "[model]") {
  ModelConfig c = tiny_gpt();
  c.d_model = 64;
  c.seq_len = 64;
  c.n_layer = 4;
  Stage s(c, LayerRange::full(c.n_layer));
  double m = 0;
  REQUIRE(std::abs(stddev(s.param("wte.weight").data, &m) - 0.02) < 0.001);
  REQUIRE(std::abs(m) < 0.001);
  REQUIRE(std::abs(stddev(s.param("wpe.weight").data) - 0.02) < 0.001);
  REQUIRE(std::abs(stddev(s.param("h.2.mlp.c_fc.weight").data) - 0.02) < 0.001);
  const double proj = 0.02 / std::sqrt(8.0);
  REQUIRE(std::abs(stddev(s.param("h.3.mlp.c_proj.weight").data) - proj) < 0.05 * proj);
  REQUIRE(std::abs(stddev(s.param("h.1.attn.c_proj.weight").data) - proj) < 0.1 * proj);
  for (auto& p : s.params()) {
    if (p.data.ndim() == 2) continue;
    float want =
        p.name.find("ln_") != std::string::npos && p.name.find("weight") != std::string::npos ? 1.0f : 0.0f;
    for (int64_t i = 0; i < p.data.numel(); ++i) REQUIRE(p.data.f32()[i] == want);
  }
  // Another stage of the same model holds the same values for the same names.
  Stage tail(c, {2, 4, false, true});
  for (auto& p : tail.params()) REQUIRE(same_bits(p.data, s.param(p.name).data));
  // Slices along either dim equal the corresponding part of the full tensor.
  auto specs = param_specs(c, LayerRange::full(c.n_layer));
  for (auto& spec : specs) {
    if (spec.name != "h.0.attn.c_attn.weight") continue;
    const Tensor& full = s.param(spec.name).data;  // (3D, D)
    ParamSpec rows = spec;
    rows.split_dim = 0;
    rows.offset = 70;
    rows.local = 50;
    std::vector<float> r(50 * 64);
    init_param(r.data(), rows, c.seed);
    REQUIRE(std::memcmp(r.data(), full.f32() + 70 * 64, r.size() * 4) == 0);
    ParamSpec cols = spec;
    cols.split_dim = 1;
    cols.offset = 16;
    cols.local = 32;
    std::vector<float> k(192 * 32);
    init_param(k.data(), cols, c.seed);
    for (int i = 0; i < 192; ++i)
      for (int j = 0; j < 32; ++j) REQUIRE(k[static_cast<size_t>(i * 32 + j)] == full.f32()[i * 64 + 16 + j]);
  }
  ModelConfig other = c;
  other.seed = c.seed + 1;
  Stage s2(other, LayerRange::full(other.n_layer));
  REQUIRE_FALSE(same_bits(s2.param("wte.weight").data, s.param("wte.weight").data));
}

TEST_CASE("model: initial loss on random tokens is about ln 256", "[model]") {
  for (ModelKind kind : {ModelKind::gpt, ModelKind::mlp}) {
    ModelConfig c = tiny_gpt();
    c.kind = kind;
    c.d_model = 32;
    c.seq_len = 16;
    c.n_head = 4;
    const int B = 8, T = 16;
    Stage s(c, LayerRange::full(c.n_layer), 1, B);
    auto tok = random_tokens(1, B * T), tgt = random_tokens(2, B * T);
    double loss = s.forward(0, tok.data(), nullptr, tgt.data(), B, T) / (B * T);
    INFO(model_kind_name(kind) << " loss " << loss);
    REQUIRE(std::abs(loss - std::log(256.0)) < 0.05);
  }
}

TEST_CASE("model: float forward matches the double reference, backward matches finite differences",
          "[model][gradcheck]") {
  for (ModelKind kind : {ModelKind::gpt, ModelKind::mlp}) {
    ModelConfig c = tiny_gpt();
    c.kind = kind;
    const int B = 2, T = 4, N = B * T;
    Stage s(c, LayerRange::full(c.n_layer), 1, B);
    perturb(s, 99);
    auto tok = random_tokens(3, N), tgt = random_tokens(4, N);
    double loss = s.forward(0, tok.data(), nullptr, tgt.data(), B, T) / N;
    s.zero_grads();
    s.backward(0, nullptr, 1.0f / N);

    testing::Params ref = testing::to_double(s);
    double ref_loss = testing::ref_loss(c, ref, tok, tgt, B, T);
    INFO(model_kind_name(kind) << ": float " << loss << " double " << ref_loss);
    REQUIRE(std::abs(loss - ref_loss) < 1e-5 * std::abs(ref_loss));

    rng::Stream pick(5, 6);
    int checked = 0;
    double worst = 0;
    for (auto& p : s.params()) {
      std::vector<int64_t> idx = {0, p.data.numel() - 1};
      for (int k = 0; k < 6; ++k)
        idx.push_back(static_cast<int64_t>(pick.below(static_cast<uint64_t>(p.data.numel()))));
      // For wte, include the rows of tokens seen (embedding path) as well as unseen ones (head only).
      if (p.name == "wte.weight") idx.push_back(int64_t{tok[0]} * c.d_model + 3);
      for (int64_t i : idx) {
        std::vector<double>& v = ref[p.name];
        const double h = 1e-5, orig = v[static_cast<size_t>(i)];
        v[static_cast<size_t>(i)] = orig + h;
        double lp = testing::ref_loss(c, ref, tok, tgt, B, T);
        v[static_cast<size_t>(i)] = orig - h;
        double lm = testing::ref_loss(c, ref, tok, tgt, B, T);
        v[static_cast<size_t>(i)] = orig;
        double fd = (lp - lm) / (2 * h);
        double g = p.grad.f32()[i];
        double err = std::abs(g - fd);
        worst = std::max(worst, err / (std::abs(fd) + 1e-4));
        INFO(p.name << "[" << i << "]: backward " << g << " finite difference " << fd);
        REQUIRE(err <= 1e-3 * std::abs(fd) + 2e-6);
        ++checked;
      }
    }
    REQUIRE(checked >= 8 * static_cast<int>(s.params().size()));
    WARN(model_kind_name(kind) << ": " << checked << " gradient elements, worst relative error " << worst);
  }
}

TEST_CASE("model: a two-stage split chained by hand equals the full model", "[model][stage]") {
  for (ModelKind kind : {ModelKind::gpt, ModelKind::mlp}) {
    ModelConfig c = tiny_gpt();
    c.kind = kind;
    c.d_model = 16;
    c.seq_len = 8;
    const int B = 3, T = 8, N = B * T;
    Stage full(c, LayerRange::full(c.n_layer), 2, B);
    Stage s0(c, {0, 1, true, false}, 2, B);
    Stage s1(c, {1, 2, false, true}, 2, B);
    auto tok = random_tokens(7, N), tgt = random_tokens(8, N);
    double lf = full.forward(1, tok.data(), nullptr, tgt.data(), B, T);
    s0.forward(1, tok.data(), nullptr, nullptr, B, T);
    REQUIRE(s0.output(1).shape() == Shape{B, T, 16});
    double ls = s1.forward(1, nullptr, s0.output(1).f32(), tgt.data(), B, T);
    REQUIRE(std::memcmp(&lf, &ls, sizeof lf) == 0);
    full.backward(1, nullptr, 1.0f / N);
    s1.backward(1, nullptr, 1.0f / N);
    s0.backward(1, s1.input_grad(1).f32(), 0.0f);
    for (auto& p : full.params()) {
      INFO(p.name);
      if (p.name == "wte.weight") {
        // The tied embedding's grad is split between the stages; their sum equals the
        // full model's up to float summation order.
        const Tensor& g0 = s0.param(p.name).grad;
        const Tensor& g1 = s1.param(p.name).grad;
        for (int64_t i = 0; i < p.grad.numel(); ++i)
          REQUIRE(std::abs(g0.f32()[i] + g1.f32()[i] - p.grad.f32()[i]) <=
                  1e-6f * (1 + std::abs(p.grad.f32()[i])));
        continue;
      }
      Stage& owner =
          s0.store().contains(p.name) && p.name.rfind("h.1", 0) != 0 && p.name.rfind("ln_f", 0) != 0 ? s0
                                                                                                     : s1;
      REQUIRE(same_bits(owner.param(p.name).grad, p.grad));
    }
  }
}

TEST_CASE("model: forward is deterministic and slots are independent", "[model][stage]") {
  ModelConfig c = tiny_gpt();
  c.d_model = 16;
  c.seq_len = 8;
  const int B = 2, T = 8, N = B * T;
  Stage s(c, LayerRange::full(c.n_layer), 3, B);
  auto tokA = random_tokens(10, N), tgtA = random_tokens(11, N);
  auto tokB = random_tokens(12, N), tgtB = random_tokens(13, N);
  double a1 = s.forward(0, tokA.data(), nullptr, tgtA.data(), B, T);
  Tensor logitsA = s.logits(0).clone();
  s.backward(0, nullptr, 1.0f / N);
  Tensor gradsA = s.store().flat_grads().clone();

  s.zero_grads();
  double a2 = s.forward(2, tokA.data(), nullptr, tgtA.data(), B, T);
  double b = s.forward(1, tokB.data(), nullptr, tgtB.data(), B, T);  // in flight meanwhile
  REQUIRE(std::memcmp(&a1, &a2, sizeof a1) == 0);
  REQUIRE(b != a1);
  REQUIRE(same_bits(s.logits(2), logitsA));
  s.backward(2, nullptr, 1.0f / N);
  REQUIRE(same_bits(s.store().flat_grads(), gradsA));
  // Slot 1 still holds batch B: its backward now adds B's gradient.
  s.backward(1, nullptr, 1.0f / N);
  REQUIRE_FALSE(same_bits(s.store().flat_grads(), gradsA));
  REQUIRE_THROWS_AS(s.forward(3, tokA.data(), nullptr, tgtA.data(), B, T), troupe::Error);
  REQUIRE_THROWS_AS(s.forward(0, tokA.data(), nullptr, tgtA.data(), B + 1, T), troupe::Error);
}

TEST_CASE("model: shorter sequences and last-position logits for sampling", "[model]") {
  ModelConfig c = tiny_gpt();
  c.d_model = 16;
  c.seq_len = 8;
  Stage s(c, LayerRange::full(c.n_layer), 1, 2);
  auto tok = random_tokens(20, 8);
  std::vector<float> last(256);
  for (int T = 1; T <= 8; ++T) {
    s.last_logits(tok.data(), T, last.data());
    // Causality: the prefix's logits do not depend on what follows it.
    s.forward(0, tok.data(), nullptr, nullptr, 1, 8);
    const float* row = s.logits(0).f32() + (T - 1) * 256;
    for (int v = 0; v < 256; ++v) REQUIRE(std::abs(last[static_cast<size_t>(v)] - row[v]) <= 1e-5f);
  }
  REQUIRE_THROWS_AS(s.last_logits(tok.data(), 9, last.data()), troupe::Error);
}

TEST_CASE("model: AdamW on synthetic data lowers the loss clearly", "[model][train]") {
  for (ModelKind kind : {ModelKind::gpt, ModelKind::mlp}) {
    ModelConfig c;
    c.kind = kind;
    c.d_model = 32;
    c.seq_len = 16;
    c.n_layer = 2;
    c.n_head = 2;
    c.seed = 5;
    const int B = 8, T = 16, N = B * T, steps = 300;
    Dataset data = Dataset::synthetic(9, 50000, 0.1);
    Stage s(c, LayerRange::full(c.n_layer), 1, B);
    std::vector<Tensor> m, v;
    for (auto& p : s.params()) {
      m.push_back(Tensor::zeros(p.data.shape()));
      v.push_back(Tensor::zeros(p.data.shape()));
    }
    std::vector<int32_t> in(N), tg(N);
    auto eval = [&]() {
      double tot = 0;
      for (int64_t k = 0; k < 4; ++k) {
        data.get_rows(Split::val, k, B, T, 0, B, in.data(), tg.data());
        tot += s.forward(0, in.data(), nullptr, tg.data(), B, T) / N;
      }
      return tot / 4;
    };
    double before = eval();
    for (int step = 0; step < steps; ++step) {
      data.get_rows(step, B, T, 0, B, in.data(), tg.data());
      s.zero_grads();
      s.forward(0, in.data(), nullptr, tg.data(), B, T);
      s.backward(0, nullptr, 1.0f / N);
      for (size_t i = 0; i < s.params().size(); ++i) {
        Param& p = s.params()[i];
        kernels::cpu::adamw_update(p.data.f32(), p.grad.f32(), m[i].f32(), v[i].f32(),
                                   static_cast<size_t>(p.data.numel()), 3e-3f, 0.9f, 0.95f, 1e-8f,
                                   p.decay ? 0.1f : 0.0f, step + 1);
      }
    }
    double after = eval();
    WARN(model_kind_name(kind) << ": val loss " << before << " -> " << after);
    REQUIRE(before > 5.0);
    REQUIRE(after < 2.0);
  }
}

TEST_CASE("model: configuration from a job spec", "[model]") {
  JobSpec spec;
  spec.model.type = ModelType::mlp;
  spec.model.seq_len = 32;
  spec.model.d_model = 48;
  spec.model.n_layers = 3;
  spec.model.n_heads = 0;
  spec.train.seed = 17;
  ModelConfig c = model_config(spec);
  REQUIRE(c.kind == ModelKind::mlp);
  REQUIRE(c.vocab_size == 256);
  REQUIRE(c.seq_len == 32);
  REQUIRE(c.d_model == 48);
  REQUIRE(c.n_layer == 3);
  REQUIRE(c.seed == 17);
  spec.model.type = ModelType::gpt;
  spec.model.n_heads = 5;  // 48 % 5 != 0
  REQUIRE_THROWS_AS(model_config(spec), troupe::Error);
  spec.model.n_heads = 4;
  REQUIRE(model_config(spec).head_dim() == 12);
}

// The llama model: parameter names and shapes (with grouped-query attention and the
// tensor-parallel pieces), the float forward against a double reference written from
// the math, backward against central finite differences of that reference, tied and
// untied heads, recomputation and mixed precision.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/rng.hpp"
#include "model/stage.hpp"
#include "reference_llama.hpp"

using namespace troupe;
using namespace troupe::model;

namespace {

ModelConfig tiny_llama(bool tied = false) {
  ModelConfig c;
  c.kind = ModelKind::llama;
  c.vocab_size = 48;
  c.seq_len = 5;
  c.d_model = 16;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;  // two query heads per key/value head
  c.ffn_hidden = 24;
  c.norm_eps = 1e-5f;
  c.rope_theta = 10000.0;
  c.tie_embeddings = tied;
  c.seed = 77;
  return c;
}

std::vector<int32_t> tokens_of(uint64_t seed, size_t n, int V) {
  rng::Stream s(seed, 3);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(s.below(static_cast<uint64_t>(V)));
  return t;
}

// Norm weights near 1, everything else O(0.3): no gradient is trivially small.
void perturb(Stage& s, uint64_t seed) {
  for (auto& p : s.params()) {
    const bool norm = p.name.find("ln_") != std::string::npos;
    rng::fill_normal(p.data.f32(), static_cast<size_t>(p.data.numel()), seed, rng::name_hash(p.name), 0,
                     norm ? 1.0 : 0.0, 0.3);
  }
  s.store().refresh_compute();
}

}  // namespace

TEST_CASE("llama: parameter names, shapes, no biases, and the shard pieces of q|k|v and gate|up",
          "[model][llama]") {
  const ModelConfig c = tiny_llama();
  const int64_t D = 16, HS = 4, Q = 16, KV = 8, F = 24, V = 48;
  Stage s(c, LayerRange::full(c.n_layer), 1, 1);
  std::vector<std::string> names;
  for (const auto& p : s.params()) names.push_back(p.name);
  const std::vector<std::string> want = {"wte.weight",
                                         "h.0.ln_1.weight",
                                         "h.0.attn.c_attn.weight",
                                         "h.0.attn.c_proj.weight",
                                         "h.0.ln_2.weight",
                                         "h.0.mlp.c_fc.weight",
                                         "h.0.mlp.c_proj.weight",
                                         "h.1.ln_1.weight",
                                         "h.1.attn.c_attn.weight",
                                         "h.1.attn.c_proj.weight",
                                         "h.1.ln_2.weight",
                                         "h.1.mlp.c_fc.weight",
                                         "h.1.mlp.c_proj.weight",
                                         "ln_f.weight",
                                         "lm_head.weight"};
  CHECK(names == want);
  CHECK(s.param("h.0.attn.c_attn.weight").global_shape == Shape{Q + 2 * KV, D});
  CHECK(s.param("h.0.attn.c_proj.weight").global_shape == Shape{D, Q});
  CHECK(s.param("h.0.mlp.c_fc.weight").global_shape == Shape{2 * F, D});
  CHECK(s.param("h.0.mlp.c_proj.weight").global_shape == Shape{D, F});
  CHECK(s.param("lm_head.weight").global_shape == Shape{V, D});
  for (const auto& p : s.params()) {
    INFO(p.name);
    CHECK(p.name.find("bias") == std::string::npos);
    CHECK(p.decay == (p.data.ndim() == 2));  // norms are not decayed
  }
  // Tied: no lm_head; a head-only stage holds the tied copy of wte.
  const ModelConfig t = tiny_llama(true);
  Stage tied(t, LayerRange::full(t.n_layer), 1, 1);
  CHECK_FALSE(tied.store().contains("lm_head.weight"));
  Stage last(t, {1, 2, false, true}, 1, 1);
  CHECK(last.param("wte.weight").tied_copy);
  Stage untied_last(c, {1, 2, false, true}, 1, 1);
  CHECK_FALSE(untied_last.store().contains("wte.weight"));

  // Shard 1 of 2: heads 2,3 (q rows [8,16)), kv head 1 (k rows 16+[4,8), v rows 24+[4,8)),
  // gate rows [12,24), up rows 24+[12,24), vocabulary rows [24,48).
  const std::vector<ParamSpec> sh = param_specs(c, LayerRange::full(c.n_layer), TensorShard{1, 2});
  auto spec = [&](const std::string& n) {
    for (const auto& p : sh)
      if (p.name == n) return p;
    FAIL("no " << n);
    return ParamSpec{};
  };
  const ParamSpec qkv = spec("h.0.attn.c_attn.weight");
  CHECK(qkv.local_shape() == Shape{Q / 2 + KV, D});
  CHECK(qkv.slice_pieces() == std::vector<SlicePiece>{{Q / 2, Q / 2, 0},
                                                      {Q + KV / 2, KV / 2, Q / 2},
                                                      {Q + KV + KV / 2, KV / 2, Q / 2 + KV / 2}});
  CHECK(spec("h.0.mlp.c_fc.weight").slice_pieces() ==
        std::vector<SlicePiece>{{F / 2, F / 2, 0}, {F + F / 2, F / 2, F / 2}});
  CHECK(spec("h.0.attn.c_proj.weight").local_shape() == Shape{D, Q / 2});
  CHECK(spec("h.0.mlp.c_proj.weight").local_shape() == Shape{D, F / 2});
  CHECK(spec("wte.weight").local_shape() == Shape{V / 2, D});
  CHECK(spec("wte.weight").offset == V / 2);
  CHECK(spec("lm_head.weight").offset == V / 2);
  CHECK(spec("ln_f.weight").split_dim == -1);
  (void)HS;
  // tp must divide the key/value heads (they are never replicated) and the vocabulary.
  CHECK_THROWS_WITH(param_specs(c, LayerRange::full(c.n_layer), TensorShard{0, 4}),
                    Catch::Contains("must divide n_kv_head"));
  ModelConfig odd_vocab = c;
  odd_vocab.vocab_size = 47;
  CHECK_THROWS_WITH(param_specs(odd_vocab, LayerRange::full(odd_vocab.n_layer), TensorShard{0, 2}),
                    Catch::Contains("must divide vocab_size"));
}

TEST_CASE("llama: float forward matches the double reference, backward matches finite differences",
          "[model][llama][gradcheck]") {
  for (bool tied : {false, true}) {
    const ModelConfig c = tiny_llama(tied);
    const int B = 2, T = 5, N = B * T;
    Stage s(c, LayerRange::full(c.n_layer), 1, B);
    perturb(s, 31);
    const auto tok = tokens_of(1, N, c.vocab_size), tgt = tokens_of(2, N, c.vocab_size);
    const double loss = s.forward(0, tok.data(), nullptr, tgt.data(), B, T) / N;
    s.zero_grads();
    s.backward(0, nullptr, 1.0f / N);

    testing::Params ref = testing::to_double(s);
    const double ref_loss = testing::ref_llama_loss(c, ref, tok, tgt, B, T);
    INFO((tied ? "tied" : "untied") << ": float " << loss << " double " << ref_loss);
    REQUIRE(std::abs(loss - ref_loss) < 1e-5 * std::abs(ref_loss));
    // The logits too, element by element.
    const auto ref_logits = testing::ref_llama_logits(c, ref, tok, B, T);
    double worst_logit = 0;
    for (size_t i = 0; i < ref_logits.size(); ++i)
      worst_logit = std::max(worst_logit, std::abs(double(s.logits(0).f32()[i]) - ref_logits[i]));
    CHECK(worst_logit < 1e-5);

    rng::Stream pick(5, 6);
    int checked = 0;
    for (auto& p : s.params()) {
      std::vector<int64_t> idx = {0, p.data.numel() - 1};
      for (int k = 0; k < 6; ++k)
        idx.push_back(static_cast<int64_t>(pick.below(static_cast<uint64_t>(p.data.numel()))));
      if (p.name == "wte.weight") idx.push_back(int64_t{tok[0]} * c.d_model + 3);  // a row that is looked up
      for (int64_t i : idx) {
        std::vector<double>& v = ref[p.name];
        const double h = 1e-5, orig = v[static_cast<size_t>(i)];
        v[static_cast<size_t>(i)] = orig + h;
        const double lp = testing::ref_llama_loss(c, ref, tok, tgt, B, T);
        v[static_cast<size_t>(i)] = orig - h;
        const double lm = testing::ref_llama_loss(c, ref, tok, tgt, B, T);
        v[static_cast<size_t>(i)] = orig;
        const double fd = (lp - lm) / (2 * h), g = p.grad.f32()[i];
        INFO(p.name << "[" << i << "]: backward " << g << " finite difference " << fd);
        REQUIRE(std::abs(g - fd) <= 1e-3 * std::abs(fd) + 2e-6);
        ++checked;
      }
    }
    REQUIRE(checked >= 8 * static_cast<int>(s.params().size()));
  }
}

TEST_CASE("llama: recomputation gives the same bits, and a bf16 stage follows the f32 loss",
          "[model][llama]") {
  ModelConfig c = tiny_llama();
  const int B = 2, T = 5, N = B * T;
  const auto tok = tokens_of(3, N, c.vocab_size), tgt = tokens_of(4, N, c.vocab_size);
  auto run = [&](const ModelConfig& cfg, DType dt, std::vector<float>* grads) {
    DeviceContext ctx = DeviceContext::cpu();
    ctx.compute_dtype = dt;
    Stage s(cfg, LayerRange::full(cfg.n_layer), 2, B, ctx);
    perturb(s, 9);
    const double l = s.forward(1, tok.data(), nullptr, tgt.data(), B, T);
    s.backward(1, nullptr, 1.0f / N);
    const Tensor& g = s.store().flat_grads();
    grads->assign(g.f32(), g.f32() + g.numel());
    return l;
  };
  std::vector<float> g_plain, g_recompute, g_bf16;
  const double plain = run(c, DType::f32, &g_plain);
  ModelConfig rc = c;
  rc.recompute = true;
  CHECK(run(rc, DType::f32, &g_recompute) == plain);
  CHECK(g_recompute == g_plain);
  const double half = run(c, DType::bf16, &g_bf16);
  INFO("f32 " << plain / N << " bf16 " << half / N);
  CHECK(std::abs(half - plain) <= 0.02 * std::abs(plain));
  double dot = 0, n1 = 0, n2 = 0;
  for (size_t i = 0; i < g_plain.size(); ++i) {
    dot += double(g_plain[i]) * g_bf16[i];
    n1 += double(g_plain[i]) * g_plain[i];
    n2 += double(g_bf16[i]) * g_bf16[i];
  }
  CHECK(dot / std::sqrt(n1 * n2) > 0.99);  // the bf16 gradient points the same way
}

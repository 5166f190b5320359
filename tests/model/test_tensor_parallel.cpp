// Tensor parallelism (Megatron): shards of a stage over the local comm backend (ranks
// as threads) against the tp = 1 model on the same batch: specs and init slices, the
// q|k|v layout of c_attn, loading a full file into shards, loss, gradients (sharded
// ones equal the slices of the full gradients, replicated ones equal on every shard)
// and parameters after AdamW steps.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <thread>

#include "comm/communicator.hpp"
#include "core/error.hpp"
#include "core/rng.hpp"
#include "kernels/cpu/kernels.hpp"
#include "model/param_io.hpp"
#include "model/stage.hpp"
#include "model/tensor_parallel.hpp"
#include "tests/model/tp_world.hpp"

using namespace troupe;
using namespace troupe::model;
using troupe::model::testing::TpWorld;
namespace fs = std::filesystem;

namespace {

ModelConfig tiny(ModelKind kind) {
  ModelConfig c;
  c.kind = kind;
  c.vocab_size = 256;
  c.seq_len = 8;
  c.d_model = 16;
  c.n_layer = 2;
  c.n_head = 4;
  c.seed = 2024;
  return c;
}

std::vector<int32_t> random_tokens(uint64_t seed, size_t n) {
  rng::Stream s(seed, 5);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(s.below(256));
  return t;
}

// Moves the full model away from init (LN weights near 1, the rest O(0.3)) so that every
// gradient is far from zero and biases matter.
void perturb(Stage& s, uint64_t seed) {
  for (auto& p : s.params()) {
    bool ln_weight = p.name.find("ln_") != std::string::npos && p.name.find(".weight") != std::string::npos;
    rng::fill_normal(p.data.f32(), static_cast<size_t>(p.data.numel()), seed, rng::name_hash(p.name), 0,
                     ln_weight ? 1.0 : 0.0, 0.3);
  }
}

// The part of the full tensor `full` (shard.global_shape) that `shard` holds, in the
// shard's local layout.
std::vector<float> slice_of(const Tensor& full, const Param& shard) {
  REQUIRE(full.shape() == shard.global_shape);
  if (shard.split_dim < 0) return std::vector<float>(full.f32(), full.f32() + full.numel());
  const size_t d = static_cast<size_t>(shard.split_dim);
  int64_t outer = 1, inner = 1;
  for (size_t i = 0; i < d; ++i) outer *= shard.global_shape[i];
  for (size_t i = d + 1; i < shard.global_shape.size(); ++i) inner *= shard.global_shape[i];
  const int64_t G = shard.global_shape[d], local = shard.data.shape()[d];
  std::vector<float> out(static_cast<size_t>(outer * local * inner));
  for (int64_t o = 0; o < outer; ++o)
    for (const SlicePiece& q : shard.slice_pieces())
      for (int64_t j = 0; j < q.length; ++j)
        std::memcpy(&out[static_cast<size_t>((o * local + q.local_offset + j) * inner)],
                    full.f32() + (o * G + q.offset + j) * inner, sizeof(float) * static_cast<size_t>(inner));
  return out;
}

// Worst |a - b| / (|b| + floor) over the elements, floor = floor_frac * max|b|: relative
// where b is not small compared with the tensor, absolute (floor_frac * 1e-5 of the
// tensor's largest element at a bound of 1e-5) where it is. The floor is there because
// an element that is a sum of large terms cancelling to near zero carries a rounding
// error of the terms' size, which a different summation order (the shards' partial
// sums) changes.
double worst_rel(const float* a, const std::vector<float>& b, double floor_frac = 0.1) {
  double scale = 0;
  for (float x : b) scale = std::max(scale, std::abs(double(x)));
  const double floor = std::max(floor_frac * scale, 1e-30);
  double worst = 0;
  for (size_t i = 0; i < b.size(); ++i)
    worst = std::max(worst, std::abs(double(a[i]) - b[i]) / (std::abs(double(b[i])) + floor));
  return worst;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// Gives every shard its slice of the full model's current values.
void copy_slices(Stage& full, TpWorld& w) {
  for (int r = 0; r < w.size(); ++r)
    for (Param& p : w[r].params()) {
      std::vector<float> v = slice_of(full.param(p.name).data, p);
      REQUIRE(static_cast<int64_t>(v.size()) == p.data.numel());
      std::memcpy(p.data.data(), v.data(), p.data.nbytes());
    }
}

bool replicated(const Param& p) { return p.split_dim < 0; }

// The k rows of an attn.c_attn.bias shard (local layout q|k|v): their gradient is zero in
// exact arithmetic (adding a constant to one query's scores leaves its softmax unchanged),
// so in float it is rounding noise, and AdamW, which divides by the gradient's own
// magnitude, turns that noise into steps of size lr in any layout.
bool is_k_bias(const Param& p) { return p.name.find("attn.c_attn.bias") != std::string::npos; }

// Every shard's value (or grad) equals the slice of the full one within 1e-5 relative,
// and replicated ones are the same bits on every shard. skip_k_bias: leave out the k
// rows of attn.c_attn.bias (see is_k_bias).
void check_against_full(Stage& full, TpWorld& w, bool grads, bool skip_k_bias = false) {
  for (int r = 0; r < w.size(); ++r)
    for (Param& p : w[r].params()) {
      const Param& f = full.param(p.name);
      const Tensor& mine = grads ? p.grad : p.data;
      std::vector<float> want = slice_of(grads ? f.grad : f.data, p);
      std::vector<float> got(mine.f32(), mine.f32() + mine.numel());
      if (skip_k_bias && is_k_bias(p)) {
        const size_t hd = got.size() / 3;
        got.erase(got.begin() + static_cast<std::ptrdiff_t>(hd),
                  got.begin() + static_cast<std::ptrdiff_t>(2 * hd));
        want.erase(want.begin() + static_cast<std::ptrdiff_t>(hd),
                   want.begin() + static_cast<std::ptrdiff_t>(2 * hd));
      }
      // Values after AdamW steps: AdamW divides each gradient by its own running
      // magnitude, so an element with a small gradient turns the gradients' rounding
      // differences into step differences of up to its relative size times lr; compared
      // normwise (floor = max|b|).
      double err = worst_rel(got.data(), want, grads ? 0.1 : 1.0);
      INFO((grads ? "grad of " : "value of ")
           << p.name << " on shard " << r << "/" << w.size() << ": worst relative error " << err);
      CHECK(err <= 1e-5);
      if (replicated(p) && r > 0)
        CHECK(same_bits(mine, grads ? w[0].param(p.name).grad : w[0].param(p.name).data));
    }
}

}  // namespace

TEST_CASE("tensor parallel: shard specs, init slices and the q|k|v layout of c_attn", "[model][tp]") {
  for (ModelKind kind : {ModelKind::gpt, ModelKind::mlp}) {
    const ModelConfig c = tiny(kind);
    const int64_t D = c.d_model;
    Stage full(c, LayerRange::full(c.n_layer));
    for (int tp : {2, 4}) {
      for (int t = 0; t < tp; ++t) {
        const auto specs = param_specs(c, LayerRange::full(c.n_layer), TensorShard{t, tp});
        REQUIRE(specs.size() == full.params().size());
        ParamStore store(specs, c.seed);
        for (const Param& p : store.params()) {
          INFO(model_kind_name(kind) << " tp " << tp << " shard " << t << " " << p.name);
          const bool col =
              p.name.find("c_attn") != std::string::npos || p.name.find("c_fc") != std::string::npos;
          const bool row_w = p.name.find("c_proj.weight") != std::string::npos;
          const int64_t n = p.name.find("attn") != std::string::npos ? D : 4 * D;  // rows of q, k, v or c_fc
          if (col) {
            REQUIRE(p.split_dim == 0);
            REQUIRE(p.data.size(0) == p.global_shape[0] / tp);
          } else if (row_w) {
            REQUIRE(p.split_dim == 1);
            REQUIRE(p.offset == t * n / tp);
            REQUIRE(p.data.shape() == Shape{D, n / tp});
          } else {
            REQUIRE(p.split_dim == -1);  // layernorms, row-parallel biases, embeddings, ln_f
            REQUIRE(p.data.shape() == p.global_shape);
          }
          if (p.name.find("c_fc") != std::string::npos)
            REQUIRE(p.slice_pieces() == std::vector<SlicePiece>{{t * n / tp, n / tp, 0}});
          // The shard's init is the slice of the full init, bit for bit.
          std::vector<float> want = slice_of(full.param(p.name).data, p);
          REQUIRE(std::memcmp(want.data(), p.data.data(), p.data.nbytes()) == 0);
        }
        if (kind != ModelKind::gpt) continue;
        // c_attn: local rows [i*D/tp, (i+1)*D/tp) are rows [i*D + t*D/tp, ...) of the full
        // tensor for i = q, k, v: the q, k and v of heads [t*NH/tp, (t+1)*NH/tp).
        const int64_t hd = D / tp;
        for (const char* which : {"h.1.attn.c_attn.weight", "h.1.attn.c_attn.bias"}) {
          const Param& p = store.get(which);
          const Tensor& f = full.param(which).data;
          const int64_t inner = p.data.ndim() == 2 ? D : 1;
          REQUIRE(p.data.size(0) == 3 * hd);
          REQUIRE(p.slice_pieces() == std::vector<SlicePiece>{{t * hd, hd, 0},
                                                              {D + t * hd, hd, hd},
                                                              {2 * D + t * hd, hd, 2 * hd}});
          for (int64_t part = 0; part < 3; ++part)
            for (int64_t j = 0; j < hd; ++j)
              for (int64_t k = 0; k < inner; ++k)
                REQUIRE(p.data.f32()[(part * hd + j) * inner + k] ==
                        f.f32()[(part * D + t * hd + j) * inner + k]);
        }
        // Each shard runs NH/tp whole heads of head_dim D/NH.
        REQUIRE(store.get("h.0.attn.c_attn.weight").data.size(0) == 3 * (c.n_head / tp) * (D / c.n_head));
        REQUIRE(store.get("h.0.attn.c_proj.weight").data.size(1) == (c.n_head / tp) * (D / c.n_head));
      }
    }
  }
  // Heads (and the MLP hidden) must divide evenly across shards.
  const ModelConfig g = tiny(ModelKind::gpt);
  REQUIRE_THROWS_AS(param_specs(g, LayerRange::full(g.n_layer), TensorShard{0, 3}), troupe::Error);
  REQUIRE_THROWS_AS(param_specs(g, LayerRange::full(g.n_layer), TensorShard{2, 2}), troupe::Error);
  REQUIRE_THROWS_AS(Stage(g, LayerRange::full(g.n_layer), 1, 1, TensorShard{0, 2}, nullptr), troupe::Error);
  // A multi-piece spec whose pieces do not tile the local extent is refused.
  ParamSpec bad = param_specs(g, LayerRange::full(g.n_layer), TensorShard{0, 2})[4];
  REQUIRE(bad.name == "h.0.attn.c_attn.weight");
  bad.pieces[1].local_offset += 1;
  REQUIRE_THROWS_AS(bad.local_shape(), troupe::Error);
}

TEST_CASE("tensor parallel: the region pairs sum exactly where Megatron's do", "[model][tp]") {
  const ModelConfig c = tiny(ModelKind::mlp);
  TpWorld w(c, 2, LayerRange{0, 1, true, false});
  std::vector<std::vector<float>> fwd_copy(2), bwd_copy(2), fwd_reduce(2), bwd_reduce(2);
  w.run([&](int r, Stage&) {
    const TensorGroup g(TensorShard{r, 2}, w.comms[static_cast<size_t>(r)].get());
    auto mine = [&] { return std::vector<float>{float(r + 1), 10.0f * float(r + 1), -1.0f}; };
    fwd_copy[r] = mine();
    copy_to_tensor_region_forward(g, Tensor::view_of(fwd_copy[r].data(), {3}));
    bwd_copy[r] = mine();
    copy_to_tensor_region_backward(g, bwd_copy[r].data(), 3);
    fwd_reduce[r] = mine();
    reduce_from_tensor_region_forward(g, fwd_reduce[r].data(), 3);
    bwd_reduce[r] = mine();
    reduce_from_tensor_region_backward(g, bwd_reduce[r].data(), 3);
  });
  for (int r = 0; r < 2; ++r) {
    const std::vector<float> mine{float(r + 1), 10.0f * float(r + 1), -1.0f}, sum{3.0f, 30.0f, -2.0f};
    REQUIRE(fwd_copy[r] == mine);
    REQUIRE(bwd_copy[r] == sum);
    REQUIRE(fwd_reduce[r] == sum);
    REQUIRE(bwd_reduce[r] == mine);
  }
  // A communicator of another rank or size than the shard is refused.
  REQUIRE_THROWS_AS(TensorGroup(TensorShard{1, 2}, w.comms[0].get()), troupe::Error);
  REQUIRE_THROWS_AS(TensorGroup(TensorShard{0, 4}, w.comms[0].get()), troupe::Error);
  // Without a group, tp = 1 communicates nothing.
  std::vector<float> x{1.0f, 2.0f};
  reduce_from_tensor_region_forward(TensorGroup{}, x.data(), 2);
  copy_to_tensor_region_backward(TensorGroup{}, x.data(), 2);
  REQUIRE(x == std::vector<float>{1.0f, 2.0f});
}

TEST_CASE("tensor parallel: loss and gradients of tp = 2 and 4 equal the tp = 1 model", "[model][tp]") {
  for (ModelKind kind : {ModelKind::gpt, ModelKind::mlp}) {
    for (int tp : {2, 4}) {
      INFO(model_kind_name(kind) << " tp " << tp);
      const ModelConfig c = tiny(kind);
      const int B = 3, T = 8;
      // Two micro-batches in flight, backward in reverse order (as a pipeline would).
      Stage full(c, LayerRange::full(c.n_layer), 2, B);
      perturb(full, 7);
      TpWorld w(c, tp, LayerRange::full(c.n_layer), 2, B);
      copy_slices(full, w);
      const auto tok0 = random_tokens(1, B * T), tgt0 = random_tokens(2, B * T);
      const auto tok1 = random_tokens(3, 2 * T), tgt1 = random_tokens(4, 2 * T);
      const float dloss = 1.0f / float(B * T + 2 * T);
      const double want0 = full.forward(0, tok0.data(), nullptr, tgt0.data(), B, T);
      const double want1 = full.forward(1, tok1.data(), nullptr, tgt1.data(), 2, T);
      full.backward(1, nullptr, dloss);
      full.backward(0, nullptr, dloss);
      std::vector<double> loss0(static_cast<size_t>(tp)), loss1(static_cast<size_t>(tp));
      w.run([&](int r, Stage& s) {
        loss0[r] = s.forward(0, tok0.data(), nullptr, tgt0.data(), B, T);
        loss1[r] = s.forward(1, tok1.data(), nullptr, tgt1.data(), 2, T);
        s.backward(1, nullptr, dloss);
        s.backward(0, nullptr, dloss);
      });
      for (int r = 0; r < tp; ++r) {
        CHECK(std::abs(loss0[r] - want0) <= 1e-5 * std::abs(want0));
        CHECK(std::abs(loss1[r] - want1) <= 1e-5 * std::abs(want1));
        CHECK(loss0[r] == loss0[0]);  // bit for bit on every shard
        const Tensor& lg = w[r].logits(0);
        CHECK(worst_rel(lg.f32(),
                        std::vector<float>(full.logits(0).f32(), full.logits(0).f32() + lg.numel())) <= 1e-5);
      }
      check_against_full(full, w, true);
      // The squared gradient norm for clipping counts every element of the model once.
      double want_ss = 0;
      for (const Param& p : full.params())
        want_ss += kernels::cpu::sum_squares(p.grad.f32(), static_cast<size_t>(p.grad.numel()));
      std::vector<double> ss(static_cast<size_t>(tp));
      w.run([&](int r, Stage& s) { ss[r] = tensor_parallel_grad_sum_squares(s.tensor_group(), s.params()); });
      for (int r = 0; r < tp; ++r) {
        CHECK(std::abs(ss[r] - want_ss) <= 1e-5 * want_ss);
        CHECK(ss[r] == ss[0]);
      }
      if (kind == ModelKind::gpt) {
        // Why the AdamW test leaves out the k bias: its gradient is rounding noise.
        const Tensor& g = full.param("h.1.attn.c_attn.bias").grad;  // (3D) q|k|v
        const int64_t D = c.d_model;
        double q_max = 0, k_max = 0;
        for (int64_t i = 0; i < D; ++i) {
          q_max = std::max(q_max, std::abs(double(g.f32()[i])));
          k_max = std::max(k_max, std::abs(double(g.f32()[D + i])));
        }
        CHECK(k_max <= 1e-5 * q_max);
      }
    }
  }
}

TEST_CASE("tensor parallel: a pipeline split of tensor-parallel stages equals the full model",
          "[model][tp]") {
  const ModelConfig c = tiny(ModelKind::gpt);
  const int B = 2, T = 8, tp = 2;
  Stage full(c, LayerRange::full(c.n_layer), 1, B);
  perturb(full, 11);
  TpWorld first(c, tp, {0, 1, true, false}, 1, B), last(c, tp, {1, 2, false, true}, 1, B);
  copy_slices(full, first);
  copy_slices(full, last);
  const auto tok = random_tokens(5, B * T), tgt = random_tokens(6, B * T);
  const double want = full.forward(0, tok.data(), nullptr, tgt.data(), B, T);
  full.backward(0, nullptr, 1.0f / (B * T));
  first.run([&](int, Stage& s) { s.forward(0, tok.data(), nullptr, nullptr, B, T); });
  // Every shard of the first stage hands on the same activations.
  for (int r = 1; r < tp; ++r) REQUIRE(same_bits(first[r].output(0), first[0].output(0)));
  std::vector<double> loss(tp);
  last.run([&](int r, Stage& s) {
    loss[r] = s.forward(0, nullptr, first[0].output(0).f32(), tgt.data(), B, T);
    s.backward(0, nullptr, 1.0f / (B * T));
  });
  for (int r = 1; r < tp; ++r) REQUIRE(same_bits(last[r].input_grad(0), last[0].input_grad(0)));
  first.run([&](int, Stage& s) { s.backward(0, last[0].input_grad(0).f32(), 0.0f); });
  for (int r = 0; r < tp; ++r) REQUIRE(std::abs(loss[r] - want) <= 1e-5 * std::abs(want));
  for (TpWorld* w : {&first, &last})
    for (int r = 0; r < tp; ++r)
      for (Param& p : (*w)[r].params()) {
        if (p.name == "wte.weight") continue;  // tied: the full grad is the sum of both stages'
        INFO(p.name << " shard " << r);
        CHECK(worst_rel(p.grad.f32(), slice_of(full.param(p.name).grad, p)) <= 1e-5);
      }
  std::vector<float> wte(first[0].param("wte.weight").grad.f32(),
                         first[0].param("wte.weight").grad.f32() + first[0].param("wte.weight").grad.numel());
  kernels::cpu::add_inplace(wte.data(), last[0].param("wte.weight").grad.f32(), wte.size());
  CHECK(worst_rel(wte.data(), slice_of(full.param("wte.weight").grad, full.param("wte.weight"))) <= 1e-5);
}

TEST_CASE("tensor parallel: parameters still match slices after AdamW steps", "[model][tp]") {
  for (ModelKind kind : {ModelKind::gpt, ModelKind::mlp}) {
    for (int tp : {2, 4}) {
      INFO(model_kind_name(kind) << " tp " << tp);
      const ModelConfig c = tiny(kind);
      const int B = 4, T = 8;
      Stage full(c, LayerRange::full(c.n_layer), 1, B);
      perturb(full, 17);
      TpWorld w(c, tp, LayerRange::full(c.n_layer), 1, B);
      copy_slices(full, w);
      // Moments per parameter, for the full model and for each shard.
      auto moments = [](Stage& s) {
        std::vector<Tensor> m;
        for (auto& p : s.params()) m.push_back(Tensor::zeros(p.data.shape()));
        return m;
      };
      auto adamw = [](Stage& s, std::vector<Tensor>& m, std::vector<Tensor>& v, int64_t t) {
        for (size_t i = 0; i < s.params().size(); ++i) {
          Param& p = s.params()[i];
          kernels::cpu::adamw_update(p.data.f32(), p.grad.f32(), m[i].f32(), v[i].f32(),
                                     static_cast<size_t>(p.data.numel()), 1e-3f, 0.9f, 0.95f, 1e-8f,
                                     p.decay ? 0.1f : 0.0f, t);
        }
      };
      std::vector<Tensor> fm = moments(full), fv = moments(full);
      std::vector<std::vector<Tensor>> sm, sv;
      for (int r = 0; r < tp; ++r) {
        sm.push_back(moments(w[r]));
        sv.push_back(moments(w[r]));
      }
      for (int64_t step = 1; step <= 4; ++step) {
        const auto tok = random_tokens(100 + step, B * T), tgt = random_tokens(200 + step, B * T);
        full.zero_grads();
        full.forward(0, tok.data(), nullptr, tgt.data(), B, T);
        full.backward(0, nullptr, 1.0f / (B * T));
        adamw(full, fm, fv, step);
        w.run([&](int r, Stage& s) {
          s.zero_grads();
          s.forward(0, tok.data(), nullptr, tgt.data(), B, T);
          s.backward(0, nullptr, 1.0f / (B * T));
          adamw(s, sm[r], sv[r], step);
        });
      }
      // Values equal the slices; replicated ones stayed the same bits on every shard.
      check_against_full(full, w, false, true);
    }
  }
}

TEST_CASE("tensor parallel: loading a full safetensors file into shards gives their slices",
          "[model][tp][io]") {
  const fs::path dir = fs::temp_directory_path() / ("troupe-tp-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "model.safetensors").string();
  const ModelConfig c = tiny(ModelKind::gpt);
  Stage full(c, LayerRange::full(c.n_layer));
  perturb(full, 13);
  save_params(path, full.params());
  ModelConfig other = c;
  other.seed = c.seed + 1;  // a different init, replaced by the load
  safetensors::Reader file(path);
  for (int tp : {2, 4}) {
    TpWorld w(other, tp, LayerRange::full(other.n_layer));
    for (int r = 0; r < tp; ++r) {
      load_params(file, w[r].params());
      for (Param& p : w[r].params()) {
        INFO(p.name << " shard " << r << "/" << tp);
        std::vector<float> want = slice_of(full.param(p.name).data, p);
        REQUIRE(std::memcmp(want.data(), p.data.data(), p.data.nbytes()) == 0);
      }
    }
  }
  fs::remove_all(dir);
}

TEST_CASE(
    "tensor parallel: llama shards (grouped kv heads, vocabulary-parallel embedding and loss) "
    "equal the tp = 1 model, alone and split into pipeline stages",
    "[model][tp][llama]") {
  for (bool tied : {false, true}) {
    ModelConfig c = tiny(ModelKind::llama);
    c.vocab_size = 64;
    c.n_head = 4;
    c.n_kv_head = 2;
    c.ffn_hidden = 24;
    c.tie_embeddings = tied;
    const int B = 2, T = 8, tp = 2;
    INFO((tied ? "tied" : "untied"));
    auto tokens = [&](uint64_t seed) {
      auto t = random_tokens(seed, B * T);
      for (auto& x : t) x %= c.vocab_size;
      return t;
    };
    const auto tok = tokens(21), tgt = tokens(22);
    Stage full(c, LayerRange::full(c.n_layer), 1, B);
    perturb(full, 13);
    const double want = full.forward(0, tok.data(), nullptr, tgt.data(), B, T);
    full.backward(0, nullptr, 1.0f / (B * T));

    // One stage, two shards: each holds V/2 logits columns; the loss is the same bits on both.
    TpWorld w(c, tp, LayerRange::full(c.n_layer), 1, B);
    copy_slices(full, w);
    std::vector<double> loss(tp);
    w.run([&](int r, Stage& s) {
      loss[r] = s.forward(0, tok.data(), nullptr, tgt.data(), B, T);
      s.backward(0, nullptr, 1.0f / (B * T));
    });
    for (int r = 0; r < tp; ++r) {
      CHECK(std::abs(loss[r] - want) <= 1e-5 * std::abs(want));
      CHECK(loss[r] == loss[0]);
      const Tensor& lg = w[r].logits(0);  // (B,T,V/2): columns [r*V/2, (r+1)*V/2)
      REQUIRE(lg.size(2) == c.vocab_size / tp);
      double worst = 0;
      for (int n = 0; n < B * T; ++n)
        for (int v = 0; v < c.vocab_size / tp; ++v)
          worst =
              std::max(worst, std::abs(double(lg.f32()[n * (c.vocab_size / tp) + v]) -
                                       full.logits(0).f32()[n * c.vocab_size + r * (c.vocab_size / tp) + v]));
      CHECK(worst <= 1e-5);
    }
    check_against_full(full, w, true);

    // Two pipeline stages of two shards each.
    TpWorld first(c, tp, {0, 1, true, false}, 1, B), last(c, tp, {1, 2, false, true}, 1, B);
    copy_slices(full, first);
    copy_slices(full, last);
    first.run([&](int, Stage& s) { s.forward(0, tok.data(), nullptr, nullptr, B, T); });
    for (int r = 1; r < tp; ++r) REQUIRE(same_bits(first[r].output(0), first[0].output(0)));
    last.run([&](int r, Stage& s) {
      loss[r] = s.forward(0, nullptr, first[0].output(0).f32(), tgt.data(), B, T);
      s.backward(0, nullptr, 1.0f / (B * T));
    });
    first.run([&](int, Stage& s) { s.backward(0, last[0].input_grad(0).f32(), 0.0f); });
    for (int r = 0; r < tp; ++r) CHECK(std::abs(loss[r] - want) <= 1e-5 * std::abs(want));
    for (TpWorld* st : {&first, &last})
      for (int r = 0; r < tp; ++r)
        for (Param& p : (*st)[r].params()) {
          if (tied && p.name == "wte.weight") continue;  // the full grad is the sum of both stages'
          INFO(p.name << " shard " << r);
          CHECK(worst_rel(p.grad.f32(), slice_of(full.param(p.name).grad, p)) <= 1e-5);
        }
    if (tied)
      for (int r = 0; r < tp; ++r) {
        const Tensor& g0 = first[r].param("wte.weight").grad;
        std::vector<float> sum(g0.f32(), g0.f32() + g0.numel());
        kernels::cpu::add_inplace(sum.data(), last[r].param("wte.weight").grad.f32(), sum.size());
        CHECK(worst_rel(sum.data(), slice_of(full.param("wte.weight").grad, first[r].param("wte.weight"))) <=
              1e-5);
      }
  }
}

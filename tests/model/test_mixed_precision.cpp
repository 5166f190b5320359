// Mixed precision in a stage (compute dtype bf16 or f16 on the CPU kernels): the
// loss and every gradient follow the f32 stage's; the same inputs give the same bits,
// with or without recomputation; the activations the products read back are kept in
// 16 bits, so a 16-bit stage holds less than an f32 one.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/rng.hpp"
#include "model/stage.hpp"
#include "tests/model/model_test_util.hpp"

using namespace troupe;
using namespace troupe::model;
using test::CountingAllocator;
using test::param_store_bytes;
using test::tokens;

namespace {

ModelConfig small() {
  ModelConfig c;
  c.kind = ModelKind::gpt;
  c.seq_len = 16;
  c.d_model = 32;
  c.n_layer = 2;
  c.n_head = 2;
  c.seed = 7;
  return c;
}

DeviceContext computing_in(DType dt) {
  DeviceContext c = DeviceContext::cpu();
  c.compute_dtype = dt;
  return c;
}

// ||a - b|| / ||b|| over n floats.
double relative_error(const float* a, const float* b, size_t n) {
  double d2 = 0, b2 = 0;
  for (size_t i = 0; i < n; ++i) {
    d2 += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    b2 += double(b[i]) * b[i];
  }
  return b2 > 0 ? std::sqrt(d2 / b2) : std::sqrt(d2);
}

}  // namespace

TEST_CASE("mixed precision: a bf16 or f16 stage follows the f32 loss and every gradient", "[model][half]") {
  const ModelConfig c = small();
  const int B = 2, T = 16;
  const auto tok = tokens(1, B * T), tgt = tokens(2, B * T);
  Stage ref(c, LayerRange::full(c.n_layer), 1, B);
  const double ref_loss = ref.forward(0, tok.data(), nullptr, tgt.data(), B, T);
  ref.backward(0, nullptr, 1.0f / (B * T));
  for (DType dt : {DType::bf16, DType::f16}) {
    INFO(dtype_name(dt));
    Stage st(c, LayerRange::full(c.n_layer), 1, B, computing_in(dt));
    CHECK(st.store().compute_dtype() == dt);
    const double loss = st.forward(0, tok.data(), nullptr, tgt.data(), B, T);
    CHECK(loss != ref_loss);  // it really computed in 16 bits
    CHECK(std::abs(loss - ref_loss) < 1e-2 * std::abs(ref_loss));
    st.backward(0, nullptr, 1.0f / (B * T));
    // bf16 keeps 8 significant bits, f16 11: each gradient within a few of its roundings.
    const double tol = dt == DType::bf16 ? 3e-2 : 5e-3;
    for (size_t i = 0; i < st.params().size(); ++i) {
      const Param& p = st.params()[i];
      const Param& q = ref.params()[i];
      INFO(p.name);
      REQUIRE(p.name == q.name);
      if (p.name.find("c_attn.bias") != std::string::npos) continue;  // its key third is exactly 0
      CHECK(relative_error(p.grad.f32(), q.grad.f32(), size_t(p.grad.numel())) < tol);
    }
  }
}

TEST_CASE("mixed precision: the same inputs give the same bits, and recomputation changes none",
          "[model][half]") {
  ModelConfig c = small();
  const int B = 2, T = 16;
  const auto tok = tokens(3, B * T), tgt = tokens(4, B * T);
  ModelConfig rc = c;
  rc.recompute = true;
  Stage a(c, LayerRange::full(c.n_layer), 2, B, computing_in(DType::bf16));
  Stage b(c, LayerRange::full(c.n_layer), 2, B, computing_in(DType::bf16));
  Stage r(rc, LayerRange::full(rc.n_layer), 2, B, computing_in(DType::bf16));
  const double la = a.forward(1, tok.data(), nullptr, tgt.data(), B, T);
  CHECK(b.forward(1, tok.data(), nullptr, tgt.data(), B, T) == la);
  CHECK(r.forward(1, tok.data(), nullptr, tgt.data(), B, T) == la);
  for (Stage* s : {&a, &b, &r}) s->backward(1, nullptr, 1.0f / (B * T));
  const Tensor& g = a.store().flat_grads();
  CHECK(std::memcmp(g.data(), b.store().flat_grads().data(), g.nbytes()) == 0);
  CHECK(std::memcmp(g.data(), r.store().flat_grads().data(), g.nbytes()) == 0);
}

TEST_CASE("mixed precision: the products' saved inputs are 16-bit, so a bf16 stage holds less",
          "[model][half]") {
  const ModelConfig c = small();
  const int B = 4, slots = 4;
  CountingAllocator f32_bytes, bf16_bytes;
  DeviceContext f32 = DeviceContext::cpu(), bf16 = computing_in(DType::bf16);
  f32.alloc = &f32_bytes;
  bf16.alloc = &bf16_bytes;
  // Activations only: the parameters' buffers (and the bf16 copy of the weights) left out.
  {
    Stage s(c, LayerRange::full(c.n_layer), slots, B, f32);
    f32_bytes.bytes -= param_store_bytes(s.store());
  }
  {
    Stage s(c, LayerRange::full(c.n_layer), slots, B, bf16);
    bf16_bytes.bytes -= param_store_bytes(s.store());
  }
  // Per block and slot, the inputs of c_attn, attn.c_proj, mlp.c_fc and mlp.c_proj
  // (N x (D + D + D + 4D) values) and ln_f's output once per slot halve; the scratch
  // the 16-bit path adds is per stage, not per slot.
  const size_t N = size_t(B) * c.seq_len, D = size_t(c.d_model);
  const size_t saved = slots * (size_t(c.n_layer) * N * 7 * D + N * D) * 2;
  INFO("f32 activations " << f32_bytes.bytes << " bytes, bf16 " << bf16_bytes.bytes);
  CHECK(bf16_bytes.bytes < f32_bytes.bytes);
  CHECK(f32_bytes.bytes - bf16_bytes.bytes > saved / 2);
}

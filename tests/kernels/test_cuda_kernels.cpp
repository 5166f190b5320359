// The CUDA kernel set (kernels/cuda/) against its CPU twin: every entry of the table on
// random inputs of odd shapes, f32 within 1e-5 relative (of the element, or of the largest
// element where a sum cancels), the 16-bit paths within their rounding; the bad-input
// checks; the device allocator. Tests tagged [gpu] need a CUDA device: without one they
// warn and ctest reports them skipped (the build compiles them; they run where a GPU is).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/allocator.hpp"
#include "core/dtype_convert.hpp"
#include "core/error.hpp"
#include "core/tensor.hpp"
#include "kernels/cpu/gemm_half.hpp"
#include "kernels/cpu/kernels.hpp"
#include "kernels/cuda/cuda.hpp"
#include "kernels/kernels.hpp"
#include "tests/kernels/kernel_test_util.hpp"
#include "tests/support/gpu.hpp"

namespace cpu = troupe::kernels::cpu;
namespace cu = troupe::kernels::cuda;
using troupe::DType;
using troupe::kernels::Kernels;
using troupe::kernels::Out;
using namespace troupe::kernels::test;

namespace {

const Kernels& gpu() { return troupe::kernels::cuda_kernels(); }

using troupe::testing::have_gpu;

// A device copy of a host vector, freed through the device allocator.
template <class T>
class Dev {
 public:
  explicit Dev(const std::vector<T>& host) : n_(host.size()) {
    p_ = static_cast<T*>(cu::allocator().allocate(bytes()));
    cu::to_device(p_, host.data(), bytes());
  }
  explicit Dev(size_t n, T fill = T{}) : Dev(std::vector<T>(n, fill)) {}
  ~Dev() { cu::allocator().deallocate(p_); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  T* get() const { return p_; }
  std::vector<T> host() const {
    std::vector<T> h(n_);
    cu::to_host(h.data(), p_, bytes());
    return h;
  }

 private:
  size_t bytes() const { return n_ * sizeof(T); }
  size_t n_;
  T* p_;
};

float max_abs(const std::vector<float>& v) {
  float m = 0.0f;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

// f32: within rtol of each element, or of the largest element (sums that cancel).
void require_f32(const std::vector<float>& got, const std::vector<float>& want, const char* what,
                 double rtol = 1e-5) {
  require_close(got, want, rtol, rtol * std::max(1e-6f, max_abs(want)), what);
}

}  // namespace

TEST_CASE("cuda kernels: the table is complete and names the device", "[kernels][cuda]") {
  const Kernels& t = gpu();
  CHECK(&t == &troupe::kernels::cuda_kernels());
  CHECK(std::string(t.name) == "cuda");
  CHECK(t.device == troupe::Device::cuda);
  // Every entry is set, and to a function other than the CPU's.
  const Kernels& c = troupe::kernels::cpu_kernels();
#define TROUPE_CHECK_ENTRY(entry) \
  CHECK(t.entry != nullptr);      \
  CHECK(reinterpret_cast<const void*>(t.entry) != reinterpret_cast<const void*>(c.entry));
  TROUPE_KERNEL_ENTRIES(TROUPE_CHECK_ENTRY)
#undef TROUPE_CHECK_ENTRY
}

TEST_CASE("cuda kernels: without a device the count is 0 with a reason, never an exception",
          "[kernels][cuda]") {
  std::string why;
  int n = -1;
  REQUIRE_NOTHROW(n = cu::device_count(&why));
  CHECK(n >= 0);
  if (n == 0) CHECK_FALSE(why.empty());
}

TEST_CASE("cuda kernels: element-wise, GELU, SwiGLU and rotary embeddings", "[kernels][cuda][gpu]") {
  if (!have_gpu()) return;
  for (size_t n : {size_t(1), size_t(1000), size_t(70001)}) {
    const auto x = random_vec(n, 1, -4.0f, 4.0f), y = random_vec(n, 2), d = random_vec(n, 3);
    Dev<float> dx(x), dy(y), dd(d), dout(n);
    std::vector<float> want(n);
    cpu::gelu_forward(want.data(), x.data(), n);
    gpu().gelu_forward(dout.get(), dx.get(), n);
    require_f32(dout.host(), want, "gelu_forward");
    std::vector<float> acc = y;
    cpu::gelu_backward(acc.data(), x.data(), d.data(), n);
    gpu().gelu_backward(dy.get(), dx.get(), dd.get(), n);
    require_f32(dy.host(), acc, "gelu_backward");
    std::vector<float> inplace = d;
    cpu::gelu_backward_inplace(inplace.data(), x.data(), n);
    gpu().gelu_backward_inplace(dd.get(), dx.get(), n);
    require_f32(dd.host(), inplace, "gelu_backward_inplace");
    std::vector<float> r(n);
    cpu::residual_forward(r.data(), x.data(), y.data(), n);
    Dev<float> da(x), db(y), dr(n);
    gpu().residual_forward(dr.get(), da.get(), db.get(), n);
    CHECK(dr.host() == r);  // one rounding: the same bits
    cpu::add_inplace(r.data(), y.data(), n);
    gpu().add_inplace(dr.get(), db.get(), n);
    cpu::scale_inplace(r.data(), 0.37f, n);
    gpu().scale_inplace(dr.get(), 0.37f, n);
    CHECK(dr.host() == r);
  }
  {
    const int N = 5, F = 37;
    const auto gu = random_vec(size_t(N) * 2 * F, 4, -3.0f, 3.0f), d = random_vec(size_t(N) * F, 5);
    std::vector<float> out(size_t(N) * F), dgu(gu.size());
    cpu::swiglu_forward(out.data(), gu.data(), N, F);
    cpu::swiglu_backward(dgu.data(), d.data(), gu.data(), N, F);
    Dev<float> g(gu), dd(d), o(out.size()), dg(gu.size());
    gpu().swiglu_forward(o.get(), g.get(), N, F);
    gpu().swiglu_backward(dg.get(), dd.get(), g.get(), N, F);
    require_f32(o.host(), out, "swiglu_forward");
    require_f32(dg.host(), dgu, "swiglu_backward");
  }
  {
    const int B = 2, T = 9, H = 3, HS = 10, ld = 4 * HS + 6;  // heads at the start of wider rows
    auto x = random_vec(size_t(B) * T * ld, 6);
    Dev<float> dx(x);
    // Any table of inverse frequencies (model::rope_inv_freq makes the real ones): theta 10000's,
    // and one scaled unevenly per pair as llama3 scaling does.
    std::vector<float> plain(HS / 2), scaled(HS / 2);
    for (int i = 0; i < HS / 2; ++i) {
      plain[size_t(i)] = float(std::pow(10000.0, -2.0 * i / HS));
      scaled[size_t(i)] = float(std::pow(500000.0, -2.0 * i / HS) / (1.0 + 7.0 * i / HS));
    }
    cpu::rope_forward(x.data(), B, T, H, HS, ld, plain.data());
    gpu().rope_forward(dx.get(), B, T, H, HS, ld, plain.data());
    require_f32(dx.host(), x, "rope_forward");
    cpu::rope_backward(x.data(), B, T, H, HS, ld, scaled.data());
    gpu().rope_backward(dx.get(), B, T, H, HS, ld, scaled.data());
    require_f32(dx.host(), x, "rope_backward");
  }
}

TEST_CASE("cuda kernels: to_half rounds as the CPU does, bit for bit", "[kernels][cuda][gpu]") {
  if (!have_gpu()) return;
  std::vector<float> x = random_vec(4099, 7, -70000.0f, 70000.0f);
  const std::vector<float> special = {0.0f,  -0.0f,    1e-8f,     -3e-6f, 65504.0f,    65520.0f,
                                      1e38f, INFINITY, -INFINITY, NAN,    1.00390625f, 1.01171875f};
  x.insert(x.end(), special.begin(), special.end());
  for (DType dt : {DType::bf16, DType::f16}) {
    std::vector<uint16_t> want(x.size());
    cpu::to_half(dt, want.data(), x.data(), x.size());
    Dev<float> dx(x);
    Dev<uint16_t> dh(x.size());
    gpu().to_half(dt, dh.get(), dx.get(), x.size());
    CHECK(dh.host() == want);
  }
  Dev<float> dx(x);
  Dev<uint16_t> dh(x.size());
  CHECK_THROWS_WITH(gpu().to_half(DType::f32, dh.get(), dx.get(), x.size()), Catch::Contains("16-bit"));
}

TEST_CASE("cuda kernels: linear in f32 and 16-bit, forward and backward", "[kernels][cuda][gpu]") {
  if (!have_gpu()) return;
  struct Shape {
    int N, IC, OC;
  };
  for (const Shape s : {Shape{1, 1, 1}, Shape{7, 13, 5}, Shape{64, 96, 130}, Shape{33, 257, 65}}) {
    INFO("N=" << s.N << " IC=" << s.IC << " OC=" << s.OC);
    const auto inp = random_vec(size_t(s.N) * s.IC, 11), w = random_vec(size_t(s.OC) * s.IC, 12);
    const auto bias = random_vec(size_t(s.OC), 13), dout = random_vec(size_t(s.N) * s.OC, 14);
    const auto dinp0 = random_vec(inp.size(), 15), dw0 = random_vec(w.size(), 16),
               db0 = random_vec(bias.size(), 17);
    Dev<float> di(inp), dw(w), dbias(bias), ddout(dout);
    for (bool with_bias : {true, false}) {
      std::vector<float> out(size_t(s.N) * s.OC);
      cpu::linear_forward(out.data(), inp.data(), w.data(), with_bias ? bias.data() : nullptr, s.N, s.IC,
                          s.OC);
      Dev<float> o(out.size());
      gpu().linear_forward(o.get(), di.get(), dw.get(), with_bias ? dbias.get() : nullptr, s.N, s.IC, s.OC);
      require_f32(o.host(), out, "linear_forward");
    }
    for (Out mode : {Out::accumulate, Out::overwrite}) {
      std::vector<float> gi = dinp0, gw = dw0, gb = db0;
      cpu::linear_backward(gi.data(), gw.data(), gb.data(), dout.data(), inp.data(), w.data(), s.N, s.IC,
                           s.OC, mode);
      Dev<float> ggi(dinp0), ggw(dw0), ggb(db0);
      gpu().linear_backward(ggi.get(), ggw.get(), ggb.get(), ddout.get(), di.get(), dw.get(), s.N, s.IC, s.OC,
                            mode);
      require_f32(ggi.host(), gi, "linear_backward dinp");
      require_f32(ggw.host(), gw, "linear_backward dweight");
      CHECK(ggb.host() == gb);  // a column sum in row order: the same additions
    }
    for (DType dt : {DType::bf16, DType::f16}) {
      INFO(troupe::dtype_name(dt));
      std::vector<uint16_t> inp_h(inp.size()), w_h(w.size());
      cpu::to_half(dt, inp_h.data(), inp.data(), inp.size());
      cpu::to_half(dt, w_h.data(), w.data(), w.size());
      Dev<uint16_t> dih(inp_h), dwh(w_h), scratch(dout.size());
      std::vector<float> out(size_t(s.N) * s.OC);
      cpu::linear_forward_h(dt, out.data(), inp_h.data(), w_h.data(), bias.data(), s.N, s.IC, s.OC);
      Dev<float> o(out.size());
      gpu().linear_forward_h(dt, o.get(), dih.get(), dwh.get(), dbias.get(), s.N, s.IC, s.OC);
      // The same 16-bit operands, f32 accumulation in another order.
      require_f32(o.host(), out, "linear_forward_h", 1e-4);
      std::vector<float> gi = dinp0, gw = dw0, gb = db0;
      std::vector<uint16_t> dout_h(dout.size());
      cpu::linear_backward_h(dt, gi.data(), gw.data(), gb.data(), dout.data(), dout_h.data(), inp_h.data(),
                             w_h.data(), s.N, s.IC, s.OC, Out::accumulate);
      Dev<float> ggi(dinp0), ggw(dw0), ggb(db0);
      gpu().linear_backward_h(dt, ggi.get(), ggw.get(), ggb.get(), ddout.get(), scratch.get(), dih.get(),
                              dwh.get(), s.N, s.IC, s.OC, Out::accumulate);
      CHECK(scratch.host() == dout_h);
      require_f32(ggi.host(), gi, "linear_backward_h dinp", 1e-4);
      require_f32(ggw.host(), gw, "linear_backward_h dweight", 1e-4);
      CHECK(ggb.host() == gb);
    }
  }
}

TEST_CASE("cuda kernels: linear on operands that are not 16-byte aligned", "[kernels][cuda][gpu]") {
  if (!have_gpu()) return;
  // Slices of larger buffers, one element in: 4-byte (f32) and 2-byte (16-bit) aligned.
  const int N = 9, IC = 31, OC = 17;
  const auto inp = random_vec(size_t(N) * IC + 1, 61), w = random_vec(size_t(OC) * IC + 1, 62);
  std::vector<float> out(size_t(N) * OC + 1, 0.0f);
  cpu::linear_forward(out.data() + 1, inp.data() + 1, w.data() + 1, nullptr, N, IC, OC);
  Dev<float> di(inp), dw(w), o(out.size());
  gpu().linear_forward(o.get() + 1, di.get() + 1, dw.get() + 1, nullptr, N, IC, OC);
  require_f32(o.host(), out, "linear_forward, unaligned");
  for (DType dt : {DType::bf16, DType::f16}) {
    std::vector<uint16_t> inp_h(inp.size()), w_h(w.size());
    cpu::to_half(dt, inp_h.data(), inp.data(), inp.size());
    cpu::to_half(dt, w_h.data(), w.data(), w.size());
    std::vector<float> want(out.size(), 0.0f);
    cpu::linear_forward_h(dt, want.data() + 1, inp_h.data() + 1, w_h.data() + 1, nullptr, N, IC, OC);
    Dev<uint16_t> dih(inp_h), dwh(w_h);
    Dev<float> oh(want.size());
    gpu().linear_forward_h(dt, oh.get() + 1, dih.get() + 1, dwh.get() + 1, nullptr, N, IC, OC);
    require_f32(oh.host(), want, "linear_forward_h, unaligned", 1e-4);
  }
}

TEST_CASE("cuda kernels: embeddings, norms and losses", "[kernels][cuda][gpu]") {
  if (!have_gpu()) return;
  const int B = 3, T = 11, C = 37, V = 29;
  const size_t N = size_t(B) * T;
  const auto tokens = random_tokens(N, V, 21);
  const auto wte = random_vec(size_t(V) * C, 22), wpe = random_vec(size_t(T) * C, 23);
  const auto dout = random_vec(N * C, 24);
  Dev<int32_t> dtok(tokens);
  Dev<float> dwte(wte), dwpe(wpe), ddout(dout);
  {
    std::vector<float> out(N * C);
    cpu::embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C, V);
    Dev<float> o(out.size());
    gpu().embedding_forward(o.get(), dtok.get(), dwte.get(), dwpe.get(), B, T, C, V);
    CHECK(o.host() == out);
    std::vector<float> gte = wte, gpe = wpe;  // accumulate onto non-zero gradients
    cpu::embedding_backward(gte.data(), gpe.data(), dout.data(), tokens.data(), B, T, C, V);
    Dev<float> g1(wte), g2(wpe);
    gpu().embedding_backward(g1.get(), g2.get(), ddout.get(), dtok.get(), B, T, C, V);
    CHECK(g1.host() == gte);  // the CPU's order of additions
    CHECK(g2.host() == gpe);
    // A token outside the vocabulary is named, and nothing is read for it.
    auto bad = tokens;
    bad[17] = V + 3;
    Dev<int32_t> dbad(bad);
    CHECK_THROWS_WITH(gpu().embedding_forward(o.get(), dbad.get(), dwte.get(), dwpe.get(), B, T, C, V),
                      Catch::Contains("token 32 at 17 outside [0,29)"));
  }
  {
    const int v0 = 10, Vl = 12;
    std::vector<float> out(N * C), g = random_vec(size_t(Vl) * C, 25);
    const auto shard = random_vec(size_t(Vl) * C, 26);
    Dev<float> dshard(shard), o(out.size()), dg(g);
    cpu::embedding_rows_forward(out.data(), tokens.data(), shard.data(), int(N), C, v0, Vl);
    gpu().embedding_rows_forward(o.get(), dtok.get(), dshard.get(), int(N), C, v0, Vl);
    CHECK(o.host() == out);
    cpu::embedding_rows_backward(g.data(), dout.data(), tokens.data(), int(N), C, v0, Vl);
    gpu().embedding_rows_backward(dg.get(), ddout.get(), dtok.get(), int(N), C, v0, Vl);
    CHECK(dg.host() == g);
  }
  {
    const auto x = random_vec(N * C, 27, -2.0f, 3.0f), w = random_vec(size_t(C), 28),
               b = random_vec(size_t(C), 29);
    Dev<float> dx(x), dw(w), db(b), o(N * C), mean(N), rstd(N);
    std::vector<float> out(N * C), m(N), r(N);
    cpu::layernorm_forward(out.data(), m.data(), r.data(), x.data(), w.data(), b.data(), int(N), C);
    gpu().layernorm_forward(o.get(), mean.get(), rstd.get(), dx.get(), dw.get(), db.get(), int(N), C);
    require_f32(o.host(), out, "layernorm_forward");
    require_f32(mean.host(), m, "layernorm mean");
    require_f32(rstd.host(), r, "layernorm rstd");
    std::vector<float> gi = dout, gw = w, gb = b;
    cpu::layernorm_backward(gi.data(), gw.data(), gb.data(), dout.data(), x.data(), w.data(), m.data(),
                            r.data(), int(N), C);
    Dev<float> ggi(dout), ggw(w), ggb(b), dm(m), dr(r);
    gpu().layernorm_backward(ggi.get(), ggw.get(), ggb.get(), ddout.get(), dx.get(), dw.get(), dm.get(),
                             dr.get(), int(N), C);
    require_f32(ggi.host(), gi, "layernorm_backward dinp");
    require_f32(ggw.host(), gw, "layernorm_backward dweight");
    require_f32(ggb.host(), gb, "layernorm_backward dbias");

    std::vector<float> ro(N * C), rr(N);
    cpu::rmsnorm_forward(ro.data(), rr.data(), x.data(), w.data(), int(N), C, 1e-6f);
    gpu().rmsnorm_forward(o.get(), rstd.get(), dx.get(), dw.get(), int(N), C, 1e-6f);
    require_f32(o.host(), ro, "rmsnorm_forward");
    require_f32(rstd.host(), rr, "rmsnorm rstd");
    std::vector<float> rgi = dout, rgw = w;
    cpu::rmsnorm_backward(rgi.data(), rgw.data(), dout.data(), x.data(), w.data(), rr.data(), int(N), C);
    Dev<float> rggi(dout), rggw(w), drr(rr);
    gpu().rmsnorm_backward(rggi.get(), rggw.get(), ddout.get(), dx.get(), dw.get(), drr.get(), int(N), C);
    require_f32(rggi.host(), rgi, "rmsnorm_backward dinp");
    require_f32(rggw.host(), rgw, "rmsnorm_backward dweight");
  }
  {
    const int Vfull = 1000;
    const auto logits = random_vec(N * Vfull, 30, -8.0f, 8.0f), g0 = random_vec(N * Vfull, 31);
    const auto targets = random_tokens(N, Vfull, 32);
    Dev<float> dl(logits), dg(g0);
    Dev<int32_t> dt(targets);
    std::vector<float> g = g0;
    const double want = cpu::cross_entropy(g.data(), logits.data(), targets.data(), int(N), Vfull, 0.25f);
    const double got = gpu().cross_entropy(dg.get(), dl.get(), dt.get(), int(N), Vfull, 0.25f);
    CHECK(got == Approx(want).epsilon(1e-6));
    require_f32(dg.host(), g, "cross_entropy dlogits");
    CHECK(gpu().cross_entropy(nullptr, dl.get(), dt.get(), int(N), Vfull, 1.0f) ==
          Approx(want).epsilon(1e-6));
    auto bad = targets;
    bad[3] = -1;
    Dev<int32_t> dbad(bad);
    CHECK_THROWS_WITH(gpu().cross_entropy(nullptr, dl.get(), dbad.get(), int(N), Vfull, 1.0f),
                      Catch::Contains("target -1 of row 3 outside [0,1000)"));

    const int v0 = 400, Vl = 300;  // a shard of the vocabulary: the logits' columns [400, 700)
    std::vector<float> shard(N * Vl);
    for (size_t n = 0; n < N; ++n)
      for (int v = 0; v < Vl; ++v) shard[n * Vl + v] = logits[n * Vfull + v0 + v];
    std::vector<float> mx(N), se(N), tl(N);
    cpu::cross_entropy_stats(mx.data(), se.data(), tl.data(), shard.data(), targets.data(), int(N), Vl, v0);
    Dev<float> ds(shard), dmx(N), dse(N), dtl(N);
    gpu().cross_entropy_stats(dmx.get(), dse.get(), dtl.get(), ds.get(), dt.get(), int(N), Vl, v0);
    CHECK(dmx.host() == mx);
    CHECK(dtl.host() == tl);
    require_f32(dse.host(), se, "cross_entropy_stats sum_exp");
    std::vector<float> lse(N), gs(N * Vl);
    for (size_t n = 0; n < N; ++n) lse[n] = mx[n] + std::log(se[n]);
    cpu::cross_entropy_shard_backward(gs.data(), shard.data(), targets.data(), lse.data(), int(N), Vl, v0,
                                      0.5f);
    Dev<float> dlse(lse), dgs(N * Vl);
    gpu().cross_entropy_shard_backward(dgs.get(), ds.get(), dt.get(), dlse.get(), int(N), Vl, v0, 0.5f);
    require_f32(dgs.host(), gs, "cross_entropy_shard_backward");
  }
}

TEST_CASE("cuda kernels: fused causal attention, multi-head and grouped-query, f32 and 16-bit",
          "[kernels][cuda][gpu]") {
  if (!have_gpu()) return;
  struct Shape {
    int B, T, NH, HS, NKV;
  };
  for (const Shape s : {Shape{1, 1, 1, 1, 0}, Shape{2, 7, 3, 5, 0}, Shape{2, 33, 4, 16, 2},
                        Shape{1, 70, 8, 8, 1}, Shape{1, 300, 2, 64, 1}, Shape{1, 129, 2, 128, 0}}) {
    INFO("B=" << s.B << " T=" << s.T << " NH=" << s.NH << " HS=" << s.HS << " NKV=" << s.NKV);
    const int NKV = s.NKV == 0 ? s.NH : s.NKV;
    const size_t ld = size_t(s.NH + 2 * NKV) * s.HS, C = size_t(s.NH) * s.HS;
    const size_t BT = size_t(s.B) * s.T, NL = size_t(s.B) * s.NH * s.T;
    const auto qkv = random_vec(BT * ld, 41, -2.0f, 2.0f), dout = random_vec(BT * C, 42);
    std::vector<float> out(BT * C), lse(NL);
    cpu::attention_forward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.NH, s.HS, s.NKV);
    Dev<float> dq(qkv), dd(dout), o(out.size()), l(NL);
    gpu().attention_forward(o.get(), l.get(), dq.get(), s.B, s.T, s.NH, s.HS, s.NKV);
    require_f32(l.host(), lse, "attention log-sum-exp");
    require_f32(o.host(), out, "attention_forward");
    for (Out mode : {Out::accumulate, Out::overwrite}) {
      const auto g0 = random_vec(qkv.size(), 43);
      std::vector<float> g = g0;
      cpu::attention_backward(g.data(), dout.data(), qkv.data(), out.data(), lse.data(), s.B, s.T, s.NH, s.HS,
                              mode, s.NKV);
      Dev<float> dg(g0);
      gpu().attention_backward(dg.get(), dd.get(), dq.get(), o.get(), l.get(), s.B, s.T, s.NH, s.HS, mode,
                               s.NKV);
      require_f32(dg.host(), g, "attention_backward");
    }
    // 16 bits: the same rounded inputs on both sides; results within the 16-bit rounding.
    for (DType dt : {DType::bf16, DType::f16}) {
      INFO(troupe::dtype_name(dt));
      std::vector<uint16_t> qh(qkv.size()), oh(out.size());
      cpu::to_half(dt, qh.data(), qkv.data(), qkv.size());
      std::vector<float> lh(NL), gh(qkv.size());
      cpu::attention_forward_h(dt, oh.data(), lh.data(), qh.data(), s.B, s.T, s.NH, s.HS, s.NKV);
      cpu::attention_backward_h(dt, gh.data(), dout.data(), qh.data(), oh.data(), lh.data(), s.B, s.T, s.NH,
                                s.HS, Out::overwrite, s.NKV);
      Dev<uint16_t> dqh(qh), doh(oh.size());
      Dev<float> dlh(NL), dgh(qkv.size());
      gpu().attention_forward_h(dt, doh.get(), dlh.get(), dqh.get(), s.B, s.T, s.NH, s.HS, s.NKV);
      require_f32(dlh.host(), lh, "attention_forward_h log-sum-exp");
      const double eps = dt == DType::bf16 ? 1.0 / 128 : 1.0 / 1024;
      std::vector<float> got(oh.size()), want(oh.size());
      const auto goth = doh.host();
      for (size_t i = 0; i < oh.size(); ++i) {
        got[i] = dt == DType::bf16 ? troupe::bf16_to_f32(goth[i]) : troupe::f16_to_f32(goth[i]);
        want[i] = dt == DType::bf16 ? troupe::bf16_to_f32(oh[i]) : troupe::f16_to_f32(oh[i]);
      }
      for (size_t i = 0; i < got.size(); ++i)
        REQUIRE(std::fabs(got[i] - want[i]) <= 2 * eps * (1 + std::fabs(want[i])));
      // The backward from the CPU's output, so that both read the same 16-bit out.
      Dev<uint16_t> doh_cpu(oh);
      Dev<float> dlh_cpu(lh);
      gpu().attention_backward_h(dt, dgh.get(), dd.get(), dqh.get(), doh_cpu.get(), dlh_cpu.get(), s.B, s.T,
                                 s.NH, s.HS, Out::overwrite, s.NKV);
      double scale = 0;
      for (float x : gh) scale = std::max(scale, double(std::fabs(x)));
      const auto gg = dgh.host();
      for (size_t i = 0; i < gg.size(); ++i) REQUIRE(std::fabs(gg[i] - gh[i]) <= 8 * eps * (scale + 1e-6));
    }
  }
}

TEST_CASE("cuda kernels: the 16-bit outputs of layernorm, rmsnorm, gelu and swiglu equal the CPU's bits",
          "[kernels][cuda][gpu]") {
  if (!have_gpu()) return;
  const int N = 37, C = 300;
  const size_t n = size_t(N) * C;
  const auto x = random_vec(n, 61, -3.0f, 3.0f), w = random_vec(size_t(C), 62), b = random_vec(size_t(C), 63),
             gu = random_vec(2 * n, 64, -6.0f, 6.0f);
  for (DType dt : {DType::bf16, DType::f16}) {
    INFO(troupe::dtype_name(dt));
    // The CPU twin's bits are the fp32 kernel's then to_half; the GPU's fp32 kernels differ from
    // the CPU's in the last bits, so the GPU's 16-bit outputs are checked against its own
    // fp32 kernel rounded by the CPU's to_half (which the to_half test holds to the GPU's).
    Dev<float> dx(x), dw(w), db(b), dgu(gu), y(n), mean{size_t(N)}, rstd{size_t(N)};
    Dev<uint16_t> yh(n);
    std::vector<uint16_t> want(n);
    gpu().layernorm_forward(y.get(), mean.get(), rstd.get(), dx.get(), dw.get(), db.get(), N, C);
    cpu::to_half(dt, want.data(), y.host().data(), n);
    gpu().layernorm_forward_h(dt, yh.get(), mean.get(), rstd.get(), dx.get(), dw.get(), db.get(), N, C);
    CHECK(yh.host() == want);
    gpu().rmsnorm_forward(y.get(), rstd.get(), dx.get(), dw.get(), N, C, 1e-6f);
    cpu::to_half(dt, want.data(), y.host().data(), n);
    gpu().rmsnorm_forward_h(dt, yh.get(), rstd.get(), dx.get(), dw.get(), N, C, 1e-6f);
    CHECK(yh.host() == want);
    gpu().gelu_forward(y.get(), dx.get(), n);
    cpu::to_half(dt, want.data(), y.host().data(), n);
    gpu().gelu_forward_h(dt, yh.get(), dx.get(), n);
    CHECK(yh.host() == want);
    gpu().swiglu_forward(y.get(), dgu.get(), N, C);
    cpu::to_half(dt, want.data(), y.host().data(), n);
    gpu().swiglu_forward_h(dt, yh.get(), dgu.get(), N, C);
    CHECK(yh.host() == want);
  }
}

TEST_CASE("cuda kernels: AdamW and the sum of squares", "[kernels][cuda][gpu]") {
  if (!have_gpu()) return;
  const size_t n = 100003;
  auto p = random_vec(n, 51), m = random_vec(n, 52, 0.0f, 0.1f), v = random_vec(n, 53, 0.0f, 0.01f);
  const auto g = random_vec(n, 54);
  Dev<float> dp(p), dm(m), dv(v), dg(g);
  for (int64_t t = 1; t <= 3; ++t) {
    cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
    gpu().adamw_update(dp.get(), dg.get(), dm.get(), dv.get(), n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
  }
  require_f32(dp.host(), p, "adamw param");
  require_f32(dm.host(), m, "adamw m");
  require_f32(dv.host(), v, "adamw v");
  const double want = cpu::sum_squares(g.data(), n);
  CHECK(gpu().sum_squares(dg.get(), n) == Approx(want).epsilon(1e-12));
  CHECK(gpu().sum_squares(dg.get(), n) == gpu().sum_squares(dg.get(), n));  // a fixed order
  CHECK(gpu().sum_squares(dg.get(), 0) == 0.0);
}

TEST_CASE("cuda kernels: the device allocator caches what a step frees", "[kernels][cuda][gpu]") {
  if (!have_gpu()) return;
  auto& a = cu::allocator();
  a.empty_cache();
  const auto before = a.stats();
  for (int step = 0; step < 3; ++step) {
    void* x = a.allocate(3 << 20);
    void* y = a.allocate(1000);
    a.deallocate(y);
    a.deallocate(x);
  }
  const auto after = a.stats();
  CHECK(after.backing_allocations - before.backing_allocations == 2);
  CHECK(after.cache_hits - before.cache_hits == 4);
  cu::install();
  {
    troupe::Tensor t = troupe::Tensor::zeros({5, 7}, DType::f32, troupe::Device::cuda);
    std::vector<float> h(35, 1.0f);
    cu::to_host(h.data(), t.data(), 35 * sizeof(float));
    CHECK(h == std::vector<float>(35, 0.0f));
  }
  troupe::register_allocator(troupe::Device::cuda, nullptr);
}

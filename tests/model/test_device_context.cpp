// The seams a device or a lower precision plugs into: a stage's DeviceContext (kernel
// table, allocator, compute dtype), the compute copy of the parameters, the tied-copy
// property of the LM head's wte, and 16-bit files read into f32 parameters.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/dtype_convert.hpp"
#include "core/error.hpp"
#include "core/rng.hpp"
#include "model/param_io.hpp"
#include "model/stage.hpp"
#include "model/tensor_parallel.hpp"
#include "tests/model/model_test_util.hpp"
#include "tests/support/host_device.hpp"

using namespace troupe;
using namespace troupe::model;
using test::CountingAllocator;
using test::tokens;
namespace fs = std::filesystem;

namespace {

ModelConfig tiny() {
  ModelConfig c;
  c.kind = ModelKind::gpt;
  c.seq_len = 8;
  c.d_model = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.seed = 99;
  return c;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

}  // namespace

TEST_CASE("device context: the CPU context, and a stage given it explicitly computes the same bits",
          "[model][device]") {
  const DeviceContext cpu = DeviceContext::cpu();
  cpu.validate();
  CHECK(cpu.device == Device::cpu);
  CHECK(cpu.kernels == &kernels::cpu_kernels());
  CHECK(cpu.alloc == &cpu_allocator());
  CHECK(cpu.stream == nullptr);
  CHECK(cpu.compute_dtype == DType::f32);

  const ModelConfig c = tiny();
  const int B = 2, T = 8;
  const auto tok = tokens(1, B * T), tgt = tokens(2, B * T);
  CountingAllocator counting;
  DeviceContext counted = DeviceContext::cpu();
  counted.alloc = &counting;
  Stage plain(c, LayerRange::full(c.n_layer), 2, B);
  Stage explicit_ctx(c, LayerRange::full(c.n_layer), 2, B, counted);
  CHECK(counting.bytes > 0);  // activations and workspace came from the context's allocator
  CHECK(explicit_ctx.device_context().alloc == &counting);
  const double l1 = plain.forward(0, tok.data(), nullptr, tgt.data(), B, T);
  const double l2 = explicit_ctx.forward(0, tok.data(), nullptr, tgt.data(), B, T);
  CHECK(l1 == l2);
  plain.backward(0, nullptr, 1.0f / (B * T));
  explicit_ctx.backward(0, nullptr, 1.0f / (B * T));
  CHECK(same_bits(plain.store().flat_grads(), explicit_ctx.store().flat_grads()));
  CHECK(same_bits(plain.logits(0), explicit_ctx.logits(0)));
}

TEST_CASE("device context: a stage refuses a device, or a precision its kernels lack", "[model][device]") {
  const ModelConfig c = tiny();
  DeviceContext cuda = DeviceContext::cpu();
  cuda.device = Device::cuda;  // with the CPU kernels and allocator: inconsistent
  CHECK_THROWS_WITH(Stage(c, LayerRange::full(c.n_layer), 1, 1, cuda),
                    Catch::Contains("'cpu' kernels of cpu"));
  // A table without the 16-bit linear kernels cannot compute in bf16.
  kernels::Kernels f32_only = kernels::cpu_kernels();
  f32_only.name = "f32-only";
  f32_only.linear_forward_h = nullptr;
  DeviceContext bf16 = DeviceContext::cpu();
  bf16.kernels = &f32_only;
  bf16.compute_dtype = DType::bf16;
  CHECK_THROWS_WITH(Stage(c, LayerRange::full(c.n_layer), 1, 1, bf16),
                    Catch::Contains("computing in bf16") && Catch::Contains("'f32-only' kernels have none"));
  bf16.kernels = &kernels::cpu_kernels();
  CHECK_NOTHROW(Stage(c, LayerRange::full(c.n_layer), 1, 1, bf16));
  DeviceContext none;
  CHECK_THROWS_AS(Stage(c, LayerRange::full(c.n_layer), 1, 1, none), Error);
  DeviceContext i32 = DeviceContext::cpu();
  i32.compute_dtype = DType::i32;
  CHECK_THROWS_WITH(i32.validate(), Catch::Contains("compute dtype i32"));
}

TEST_CASE("params: with f32 compute the compute weights are the master weights, no copy", "[model][params]") {
  const ModelConfig c = tiny();
  const auto specs = param_specs(c, LayerRange::full(c.n_layer));
  ParamStore ps(specs, c.seed);
  CHECK(ps.compute_dtype() == DType::f32);
  CHECK(ps.flat_compute().data() == ps.flat_params().data());
  for (const Param& p : ps.params()) {
    INFO(p.name);
    CHECK(p.compute.data() == p.data.data());
    CHECK(p.compute.dtype() == DType::f32);
    CHECK(p.compute.shape() == p.data.shape());
  }
  ps.refresh_compute();  // nothing to do
  CHECK(ps.flat_compute().data() == ps.flat_params().data());
}

TEST_CASE("params: a bf16 or f16 compute copy rounds the master weights to nearest even", "[model][params]") {
  const ModelConfig c = tiny();
  const auto specs = param_specs(c, LayerRange::full(c.n_layer));
  for (DType dt : {DType::bf16, DType::f16}) {
    INFO(dtype_name(dt));
    ParamStore ps(specs, c.seed, dt);
    ParamStore master(specs, c.seed);
    CHECK(ps.compute_dtype() == dt);
    CHECK(ps.flat_compute().numel() == ps.flat_params().numel());
    CHECK(ps.flat_compute().data() != ps.flat_params().data());
    auto narrow = [dt](float f) { return dt == DType::bf16 ? f32_to_bf16(f) : f32_to_f16(f); };
    // Master weights stay f32 and equal the f32 store's; the copy is fresh after construction.
    CHECK(same_bits(ps.flat_params(), master.flat_params()));
    CHECK(ps.flat_grads().dtype() == DType::f32);
    auto check_copy = [&] {
      const float* m = ps.flat_params().f32();
      const auto* h = ps.flat_compute().data_as<uint16_t>();
      for (int64_t i = 0; i < ps.flat_params().numel(); ++i)
        if (h[i] != narrow(m[i])) return false;
      return true;
    };
    CHECK(check_copy());
    for (const Param& p : ps.params()) {
      INFO(p.name);
      CHECK(p.compute.dtype() == dt);
      CHECK(p.compute.shape() == p.data.shape());
      const int64_t off = p.data.f32() - ps.flat_params().f32();
      CHECK(p.compute.data_as<uint16_t>() - ps.flat_compute().data_as<uint16_t>() == off);
    }
    // An update of the master reaches the copy at refresh_compute, rounded: 1 + 2^-8 is a
    // bf16 tie (down to 1), 1 + 3*2^-8 another (up to 1 + 2^-6); f16 keeps both exactly.
    Param& w = ps.get("h.0.attn.c_attn.weight");
    w.data.f32()[0] = 1.00390625f;
    w.data.f32()[1] = 1.01171875f;
    w.data.f32()[2] = -3.0e-3f;
    CHECK_FALSE(check_copy());
    ps.refresh_compute();
    CHECK(check_copy());
    const auto* h = w.compute.data_as<uint16_t>();
    if (dt == DType::bf16) {
      CHECK(bf16_to_f32(h[0]) == 1.0f);
      CHECK(bf16_to_f32(h[1]) == 1.015625f);
    } else {
      CHECK(f16_to_f32(h[0]) == 1.00390625f);
      CHECK(f16_to_f32(h[1]) == 1.01171875f);
    }
  }
  CHECK_THROWS_AS(ParamStore(specs, c.seed, DType::i32), Error);
}

TEST_CASE("params: the LM head's wte on a head-only stage is the tied copy, and counts once",
          "[model][params][tied]") {
  const ModelConfig c = tiny();
  Stage whole(c, LayerRange::full(c.n_layer));
  for (const Param& p : whole.params()) CHECK_FALSE(p.tied_copy);
  Stage first(c, {0, 1, true, false}), last(c, {1, 2, false, true});
  for (const Param& p : first.params()) CHECK_FALSE(p.tied_copy);
  int copies = 0;
  for (const Param& p : last.params()) {
    CHECK(p.tied_copy == (p.name == "wte.weight"));
    copies += p.tied_copy;
  }
  CHECK(copies == 1);
  for (const ParamSpec& s : param_specs(c, {1, 2, false, true}))
    CHECK(s.tied_copy == (s.name == "wte.weight"));
  // The global-norm sum leaves the copy out: its weight is counted on the first stage.
  for (Param& p : last.params())
    for (int64_t i = 0; i < p.grad.numel(); ++i) p.grad.f32()[i] = 0.5f;
  double want = 0;
  for (const Param& p : last.params())
    if (p.name != "wte.weight") want += 0.25 * double(p.grad.numel());
  CHECK(tensor_parallel_grad_sum_squares(last.tensor_group(), last.params()) == want);
}

TEST_CASE("param io: a BF16, F16 or F64 file loads into f32 parameters, converted", "[model][io][dtype]") {
  const fs::path dir = fs::temp_directory_path() / ("troupe-pio-dtype-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  ModelConfig c = tiny();
  Stage a(c, LayerRange::full(c.n_layer));
  for (DType dt : {DType::bf16, DType::f16, DType::f64}) {
    INFO(dtype_name(dt));
    // The whole model stored in dt.
    std::vector<std::vector<char>> bufs;
    std::vector<safetensors::WriteEntry> entries;
    for (const Param& p : a.params()) {
      bufs.emplace_back(size_t(p.data.numel()) * dtype_size(dt));
      convert(DType::f32, p.data.data(), dt, bufs.back().data(), size_t(p.data.numel()));
      entries.push_back({p.name, dt, p.global_shape, bufs.back().data()});
    }
    const std::string path = (dir / (std::string(dtype_name(dt)) + ".safetensors")).string();
    safetensors::write(path, entries);
    safetensors::Reader file(path);
    ModelConfig c2 = c;
    c2.seed = 7;
    Stage b(c2, LayerRange::full(c2.n_layer));
    load_params(file, b.params());
    // Columns [4, 12) of a (64, 16) weight: runs of a slice, converted run by run.
    const Param& full = a.param("h.1.mlp.c_fc.weight");
    Param shard;
    shard.name = full.name;
    shard.global_shape = full.global_shape;
    shard.split_dim = 1;
    shard.offset = 4;
    shard.data = Tensor::zeros({64, 8});
    load_param(file, shard);
    size_t i = 0;
    for (const Param& p : a.params()) {
      INFO(p.name);
      std::vector<float> want(size_t(p.data.numel()));
      convert(dt, bufs[i++].data(), DType::f32, want.data(), want.size());
      CHECK(std::memcmp(want.data(), b.param(p.name).data.data(), p.data.nbytes()) == 0);
      if (p.name == full.name)
        for (int64_t r = 0; r < 64; ++r)
          for (int64_t k = 0; k < 8; ++k) CHECK(shard.data.f32()[r * 8 + k] == want[size_t(r * 16 + 4 + k)]);
    }
  }
  const std::vector<int32_t> ints(256 * 16);
  safetensors::write((dir / "ints.safetensors").string(),
                     {{"wte.weight", DType::i32, {256, 16}, ints.data()}});
  safetensors::Reader file((dir / "ints.safetensors").string());
  CHECK_THROWS_WITH(load_param(file, a.param("wte.weight")), Catch::Contains("is i32"));
  fs::remove_all(dir);
}

namespace {

ModelConfig tiny_llama() {
  ModelConfig c = tiny();
  c.kind = ModelKind::llama;
  c.vocab_size = 48;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.ffn_hidden = 24;
  c.norm_eps = 1e-5f;
  c.rope_theta = 10000.0;
  return c;
}

}  // namespace

TEST_CASE("device context: a stage on another device copies its inputs in and computes the CPU's bits",
          "[model][device]") {
  testing::HostBackedDevice dev;
  const kernels::Kernels& table = dev.kernels();
  for (const ModelConfig& c : {tiny(), tiny_llama()})
    for (DType dt : {DType::f32, DType::bf16}) {
      INFO(model_kind_name(c.kind) << " " << dtype_name(dt));
      DeviceContext host = DeviceContext::cpu(), on_dev{Device::cuda, &table, &dev, nullptr, dt};
      host.compute_dtype = dt;
      const int B = 2, N = B * c.seq_len;
      Stage a(c, LayerRange::full(c.n_layer), 1, B, host), b(c, LayerRange::full(c.n_layer), 1, B, on_dev);
      CHECK(b.store().device() == Device::cuda);
      CHECK(b.store().flat_params().device() == Device::cuda);
      CHECK(b.params().front().grad.device() == Device::cuda);
      const int uploads = dev.ins;
      CHECK(uploads >= int(b.params().size()));  // every parameter's initial values were copied in
      CHECK(same_bits(a.store().flat_params(), b.store().flat_params()));
      CHECK(same_bits(a.store().flat_compute(), b.store().flat_compute()));  // bf16: made by the table

      std::vector<int32_t> x = tokens(5, size_t(N)), y = tokens(6, size_t(N));
      for (auto& t : x) t %= c.vocab_size;
      for (auto& t : y) t %= c.vocab_size;
      for (int step = 0; step < 2; ++step) {
        a.zero_grads();
        b.zero_grads();
        const double la = a.forward(0, x.data(), nullptr, y.data(), B, c.seq_len);
        const double lb = b.forward(0, x.data(), nullptr, y.data(), B, c.seq_len);
        CHECK(la == lb);
        CHECK(dev.ins >= uploads + 2 * (step + 1));  // tokens and targets
        a.backward(0, nullptr, 1.0f / float(N));
        b.backward(0, nullptr, 1.0f / float(N));
        CHECK(same_bits(a.store().flat_grads(), b.store().flat_grads()));
        // A plain SGD step on both, then the compute copies refreshed (through the table on b).
        for (Stage* s : {&a, &b}) {
          s->device_context().kernels->add_inplace(s->store().flat_params().f32(),
                                                   s->store().flat_grads().f32(),
                                                   size_t(s->store().flat_params().numel()));
          s->store().refresh_compute();
        }
        CHECK(same_bits(a.store().flat_compute(), b.store().flat_compute()));
      }
      // Host reads go through copy_to_host: a parameter, and the sampling logits.
      const Param& p = b.params().back();
      std::vector<float> got(size_t(p.data.numel()));
      const int outs = dev.outs;
      b.store().download(p.data, got.data());
      CHECK(dev.outs == outs + 1);
      CHECK(std::memcmp(got.data(), a.params().back().data.data(), got.size() * sizeof(float)) == 0);
      std::vector<float> la(size_t(c.vocab_size)), lb(la.size());
      a.last_logits(x.data(), c.seq_len, la.data());
      b.last_logits(x.data(), c.seq_len, lb.data());
      CHECK(la == lb);
      CHECK(dev.outs > outs + 1);
    }
}

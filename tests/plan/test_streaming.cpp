// A device with a small fast memory and a streaming tier (the IPU-class profile): its profile
// reads, what overflows the fast memory streams cheapest traffic first and costs link time,
// a block's working set never streams, and the planner's choice for it differs from a GPU's.
#include <catch2/catch.hpp>

#include "core/error.hpp"
#include "plan/cost_internal.hpp"
#include "plan/cost_model.hpp"
#include "plan/hardware.hpp"
#include "plan/planner.hpp"

using namespace troupe;
using namespace troupe::plan;

namespace {

const char* kTiny = R"(name: tiny-ipu
device: ipu
devices_per_node: 4
memory: 1GiB
memory_bandwidth: 1e13
streaming: {memory: 8GiB, bandwidth: 1e10}
peak_flops: {fp32: 1e13, bf16: 1e13, fp16: 4e13}
network: {intra_node: {latency: 1e-6, bandwidth: 5e10}}
)";

std::string first_error(const std::string& yaml) {
  try {
    parse_hardware(yaml, "ipu.yaml");
  } catch (const SpecError& e) {
    REQUIRE(!e.diagnostics.empty());
    return e.diagnostics.front().str();
  }
  return "";
}

// GPT shapes of the docs' comparison (seq 2048, vocabulary 51200, fp16, ZeRO 1).
PlanRequest gpt(int layers, int d_model, int heads, int64_t batch, int devices) {
  PlanRequest r;
  r.work.model = {ModelType::gpt, layers, d_model, 51200, 2048};
  r.work.model.n_heads = heads;
  r.work.global_batch = batch;
  r.work.compute = DType::f16;
  r.work.zero = 1;
  r.work.engine = EngineKind::megatron;
  r.work.device = DeviceKind::cuda;
  r.devices = devices;
  return r;
}

}  // namespace

TEST_CASE("streaming: the IPU profile reads, and a streaming tier is a checked key",
          "[plan][hardware][streaming]") {
  const HardwareProfile ipu = builtin_hardware("ipu-bow");
  CHECK(ipu.device == ProfileDevice::ipu);
  CHECK(ipu.memory == uint64_t(900e6));
  CHECK(ipu.streaming_memory == uint64_t(64e9));
  CHECK(ipu.streaming_bandwidth == 20e9);
  CHECK(ipu.peak(DType::f16) == 350e12);
  CHECK(ipu.peak(DType::bf16) == ipu.peak(DType::f32));  // no bf16 arithmetic
  const HardwareProfile t = parse_hardware(kTiny, "ipu.yaml");
  CHECK(t.streaming_memory == uint64_t(8) << 30);
  CHECK(to_yaml(parse_hardware(to_yaml(t), "again.yaml")) == to_yaml(t));
  CHECK(builtin_hardware("h100-sxm").streaming_memory == 0);
  CHECK_THAT(first_error(std::string(kTiny) + "streaming_memory: 1GiB\n"), Catch::Contains("unknown key"));
  std::string no_bw = kTiny;
  no_bw.replace(no_bw.find(", bandwidth: 1e10"), 17, "");
  CHECK_THAT(first_error(no_bw), Catch::Contains("'streaming.bandwidth' is missing"));
  std::string bad = kTiny;
  bad.replace(bad.find("bandwidth: 1e10"), 15, "bandwidth: fast");
  CHECK_THAT(first_error(bad), Catch::Contains("ipu.yaml:6:"));
  std::string dev = kTiny;
  dev.replace(dev.find("device: ipu"), 11, "device: tpu");
  CHECK_THAT(first_error(dev), Catch::Contains("must be one of cpu, cuda, ipu"));
}

TEST_CASE("streaming: overflow streams the cheapest traffic first, worked by hand", "[plan][streaming]") {
  plan::detail::RankBytes r;
  r.params = 100, r.grads = 200, r.optimizer = 300, r.activations = 400;
  r.total = 1000;
  r.act_one = 100;  // 4 micro-batches in flight
  r.n_micro = 8;
  r.passes = 2;
  r.working_params = 10, r.working_grads = 20, r.working_activations = 100;
  // Fits: nothing streams.
  plan::detail::StreamPlan s = plan::detail::stream_overflow(r, 1000, 1e9);
  CHECK(s.bytes == 0);
  CHECK(s.fits);
  // 250 over: the optimizer (2 bytes moved per byte and step) goes first, once per step.
  s = plan::detail::stream_overflow(r, 750, 1e9);
  CHECK(s.bytes == 250);
  CHECK(s.step == 500);
  CHECK(s.forward == 0);
  CHECK(s.backward == 0);
  // 500 over: then the activations (2 x 8 micro-batches x 100 / 400 = 4 per byte), 200 of them:
  // half of every micro-batch's activations leave in its forward and come back in its backward.
  s = plan::detail::stream_overflow(r, 500, 1e9);
  CHECK(s.bytes == 500);
  CHECK(s.forward == Approx(0.5 * 100));
  CHECK(s.backward == Approx(0.5 * 100));
  // 900 over: the optimizer, the activations beyond the working set (300), the gradients beyond
  // it (16 bytes moved per byte: 180), the weights beyond it (17 per byte: 90); what stays, the
  // working set of 10 + 20 + 100, does not fit in 100.
  s = plan::detail::stream_overflow(r, 100, 1e9);
  CHECK(s.bytes == Approx(300 + 300 + 180 + 90));
  // Three quarters of each micro-batch's activations, the gradients read and written, the weights
  // read by the forward and the backward.
  CHECK(s.forward == Approx(0.75 * 100 + 90));
  CHECK(s.backward == Approx(0.75 * 100 + 2 * 180 + 90));
  CHECK(s.fits == false);
  // The streaming tier is full.
  CHECK_FALSE(plan::detail::stream_overflow(r, 750, 100).fits);
}

TEST_CASE("streaming: a plan that overflows the device pays the link, one that fits does not",
          "[plan][streaming]") {
  const HardwareProfile ipu = parse_hardware(kTiny, "ipu.yaml");
  HardwareProfile flat = ipu;
  flat.streaming_memory = 0;
  flat.memory = uint64_t(64) << 30;
  Workload w;
  w.model = {ModelType::gpt, 8, 512, 1024, 256};
  w.model.n_heads = 8;
  w.global_batch = 16;
  w.compute = DType::f16;
  // A small model: on chip, nothing streamed, the same time as without a streaming tier.
  const Candidate c{{1, 2, 1}, 1, 1, Recompute::full};
  const Estimate on = estimate(w, c, ipu), plain = estimate(w, c, flat);
  CHECK(on.fits);
  CHECK(on.memory.streamed == 0);
  CHECK(on.time.streaming == 0);
  CHECK(on.time.step == Approx(plain.time.step));
  // 8x the width: the weights and optimizer no longer fit on chip and stream, and the step pays.
  Workload big = w;
  big.model.d_model = 2048;
  big.model.n_heads = 16;
  const Estimate s = estimate(big, c, ipu), s_plain = estimate(big, c, flat);
  CHECK(s.memory.streamed > 0);
  CHECK(s.memory.on_chip <= double(ipu.memory));
  CHECK(s.memory.on_chip + s.memory.streamed == Approx(s.memory.total));
  CHECK(s.fits);
  CHECK(s.time.streaming > 0);
  CHECK(s.time.step > s_plain.time.step);
  CHECK(s.runnable.find("no IPU backend") != std::string::npos);
  // A micro-batch whose block does not fit on chip never fits, whatever streams.
  Workload rows = big;
  rows.global_batch = 64;
  const Estimate huge = estimate(rows, Candidate{{1, 1, 1}, 1, 64, Recompute::none}, ipu);
  CHECK_FALSE(huge.fits);
  CHECK(huge.memory.on_chip > double(ipu.memory));
}

TEST_CASE("streaming: for a 1.3B GPT an IPU pod pipelines deeper, with smaller micro-batches, than H100s",
          "[plan][streaming][planner]") {
  const PlanRequest r = gpt(24, 2048, 16, 512, 64);
  const PlanResult h100 = search(r, builtin_hardware("h100-sxm"));
  const PlanResult ipu = search(r, builtin_hardware("ipu-bow"));
  REQUIRE(h100.fastest());
  REQUIRE(ipu.fastest());
  const Estimate& g = *h100.fastest();
  const Estimate& i = *ipu.fastest();
  INFO("h100 " << g.candidate.str() << ", ipu " << i.candidate.str());
  CHECK(i.candidate.layout.pp * i.candidate.layout.tp > g.candidate.layout.pp * g.candidate.layout.tp);
  CHECK(i.candidate.micro_batch < g.candidate.micro_batch);
  CHECK(i.memory.on_chip <= 900e6);
  CHECK(i.memory.streamed > 0);  // at least the optimizer lives off chip
  CHECK(g.memory.streamed == 0);
  CHECK(ipu.best() == nullptr);  // troupe runs no IPU plan
  CHECK_THAT(ipu.explain(builtin_hardware("ipu-bow")), Catch::Contains("no IPU backend"));
}

// Causal attention on one core: the fused kernels (kernels/cpu/flash_attention.cpp) against
// the materialized path (attention.cpp, which stores the (T,T) probabilities) and PyTorch
// (scaled_dot_product_attention where the installed torch has it, else its eager softmax(q
// k^T) v; bench/attention_reference.py), in the same run: time of the forward and of forward
// + backward, and the peak memory the attention adds.
//
//   attention_bench [--max-seconds=60] [--heads=8] [--hs=64,128] [--t=128,...,8192]
//                   [--precision=f32|bf16|f16] [--no-torch]
//
// Times are the thread's CPU time (PyTorch: the process's, one thread). Every figure comes
// from its own process (this executable again, --one=...), so that each
// reports its own peak: "attn MiB" is the peak resident set minus the resident set before
// the attention's buffers (q|k|v, out, gradients, and whatever the path itself keeps)
// existed. A path skips the larger sizes once the next one (~4x, up to 6 runs) would take
// more than --max-seconds.
//
// Batch 1, `heads` heads of `hs` channels, q|k|v and dout uniform in [-1, 1): the scores
// of random inputs, which is what the cost is about, not what training sees.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/child_process.hpp"
#include "kernels/cpu/gemm_half.hpp"
#include "kernels/cpu/kernels.hpp"

namespace {

namespace kc = troupe::kernels::cpu;
using troupe::DType;
using troupe::bench::ChildRun;
using troupe::bench::report_text;
using troupe::bench::report_value;

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The calling thread's CPU time: on a machine shared with other work it leaves out the slices
// the thread spent descheduled (bench/gemm_timing.hpp does the same).
double thread_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

long rss_kib() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  long kib = 0;
  while (std::fgets(line, sizeof line, f) != nullptr)
    if (std::strncmp(line, "VmRSS:", 6) == 0) kib = std::atol(line + 6);
  std::fclose(f);
  return kib;
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::atoi(item.c_str()));
  return out;
}

// One measurement: variant fused | materialized, in f32 or bf16 (fused only).
int run_one(const std::string& variant, int T, int NH, int HS, DType dt) {
  const long base = rss_kib();
  const int B = 1, C = NH * HS;
  const size_t nqkv = size_t(B) * T * 3 * C, nout = size_t(B) * T * C;
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> qkv(nqkv), dout(nout), out(nout), dqkv(nqkv), lse(size_t(B) * NH * T);
  for (float& x : qkv) x = d(gen);
  for (float& x : dout) x = d(gen);
  std::vector<uint16_t> qkv_h, out_h;
  if (dt != DType::f32) {
    qkv_h.resize(nqkv);
    out_h.resize(nout);
    kc::to_half(dt, qkv_h.data(), qkv.data(), nqkv);
  }
  std::vector<float> att, scratch;
  if (variant == "materialized") {
    att.assign(size_t(B) * NH * T * T, 0.0f);
    scratch.assign(att.size(), 0.0f);
  }
  auto fwd = [&] {
    if (variant == "materialized")
      kc::attention_materialized_forward(out.data(), att.data(), qkv.data(), B, T, NH, HS);
    else if (dt == DType::f32)
      kc::attention_forward(out.data(), lse.data(), qkv.data(), B, T, NH, HS);
    else
      kc::attention_forward_h(dt, out_h.data(), lse.data(), qkv_h.data(), B, T, NH, HS);
  };
  auto bwd = [&] {
    if (variant == "materialized")
      kc::attention_materialized_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), B,
                                          T, NH, HS, kc::Out::overwrite);
    else if (dt == DType::f32)
      kc::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, NH, HS,
                             kc::Out::overwrite);
    else
      kc::attention_backward_h(dt, dqkv.data(), dout.data(), qkv_h.data(), out_h.data(), lse.data(), B, T, NH,
                               HS, kc::Out::overwrite);
  };
  fwd();  // warm-up: block buffers, GEMM choices
  bwd();
  std::vector<double> tf, tb;
  const double budget = now() + 10.0;
  for (int r = 0; r < 5 && (r < 2 || now() < budget); ++r) {
    const double t0 = thread_seconds();
    fwd();
    const double t1 = thread_seconds();
    bwd();
    tf.push_back(t1 - t0);
    tb.push_back(thread_seconds() - t1);
  }
  std::sort(tf.begin(), tf.end());
  std::sort(tb.begin(), tb.end());
  const double f = tf[tf.size() / 2], b = tb[tb.size() / 2];
  std::printf("fwd_ms=%.3f fwdbwd_ms=%.3f attn_kib=%ld\n", f * 1e3, (f + b) * 1e3,
              troupe::bench::self_peak_rss_kib() - base);
  return 0;
}

struct Row {
  std::string path;
  double fwd = NAN, fb = NAN, mib = NAN;
  std::string why;
};

Row measure(const std::vector<std::string>& argv, const std::string& path) {
  const ChildRun r = troupe::bench::run_child(argv, true);
  Row row{path};
  if (!r.started || r.exit_code != 0) {
    const std::string u = report_text(r.out, "unavailable", true);
    row.why = !u.empty() ? u : r.signal ? "killed by signal " + std::to_string(r.signal) : "failed";
    return row;
  }
  row.fwd = report_value(r.out, "fwd_ms");
  row.fb = report_value(r.out, "fwdbwd_ms");
  row.mib = report_value(r.out, "attn_kib") / 1024.0;
  row.path = path + (report_text(r.out, "impl").empty() ? "" : " (" + report_text(r.out, "impl") + ")");
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  double max_seconds = 60;
  int heads = 8;
  std::vector<int> hs = {64, 128}, ts = {128, 256, 512, 1024, 2048, 4096, 8192};
  std::string precision = "f32";
  bool torch = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--one=", 0) == 0) {  // --one=variant:T:NH:HS:dtype
      std::vector<std::string> f;
      std::stringstream in(a.substr(6));
      std::string item;
      while (std::getline(in, item, ':')) f.push_back(item);
      if (f.size() != 5) return 2;
      return run_one(f[0], std::atoi(f[1].c_str()), std::atoi(f[2].c_str()), std::atoi(f[3].c_str()),
                     f[4] == "bf16"  ? DType::bf16
                     : f[4] == "f16" ? DType::f16
                                     : DType::f32);
    }
    if (a.rfind("--max-seconds=", 0) == 0)
      max_seconds = std::atof(a.c_str() + 14);
    else if (a.rfind("--heads=", 0) == 0)
      heads = std::atoi(a.c_str() + 8);
    else if (a.rfind("--hs=", 0) == 0)
      hs = parse_list(a.substr(5));
    else if (a.rfind("--t=", 0) == 0)
      ts = parse_list(a.substr(4));
    else if (a.rfind("--precision=", 0) == 0)
      precision = a.substr(12);
    else if (a == "--no-torch")
      torch = false;
    else {
      std::fprintf(stderr,
                   "usage: attention_bench [--max-seconds=60] [--heads=8] [--hs=64,128] [--t=128,...] "
                   "[--precision=f32|bf16|f16] [--no-torch]\n");
      return 2;
    }
  }
  const std::string self = troupe::bench::self_executable(argv[0]);
  const std::string script = std::string(TROUPE_SOURCE_DIR) + "/bench/attention_reference.py";
  std::printf("causal attention, batch 1, %d heads, one thread, %s; medians of up to 5 runs\n", heads,
              precision.c_str());
  std::printf("%5s %4s  %-34s %10s %12s %10s\n", "T", "HS", "path", "fwd ms", "fwd+bwd ms", "attn MiB");
  for (int h : hs) {
    std::vector<std::string> paths = {"fused", "materialized"};
    if (precision != "f32") paths = {"fused"};
    if (torch) paths.push_back("torch");
    std::vector<bool> stop(paths.size(), false);
    for (int T : ts)
      for (size_t p = 0; p < paths.size(); ++p) {
        if (stop[p]) continue;
        const std::string& path = paths[p];
        std::vector<std::string> cmd;
        if (path == "torch")
          cmd = {troupe::bench::python(), script,   std::to_string(T), std::to_string(heads),
                 std::to_string(h),       precision};
        else
          cmd = {self, "--one=" + path + ":" + std::to_string(T) + ":" + std::to_string(heads) + ":" +
                           std::to_string(h) + ":" + precision};
        const Row r = measure(cmd, path);
        // The next size takes ~4x as long, up to 6 runs of it.
        if (r.why.empty() && 4 * 6 * r.fb * 1e-3 > max_seconds) stop[p] = true;
        if (!r.why.empty()) {
          std::printf("%5d %4d  %-34s %s\n", T, h, path.c_str(), r.why.c_str());
          stop[p] = true;
          continue;
        }
        std::printf("%5d %4d  %-34s %10.2f %12.2f %10.1f\n", T, h, r.path.c_str(), r.fwd, r.fb, r.mib);
        std::fflush(stdout);
      }
  }
  return 0;
}

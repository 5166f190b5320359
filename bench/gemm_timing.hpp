// GFLOP/s of one GEMM shape through one backend (fp32, or 16-bit through
// gemm_half): warm-up, then the median of timed repeats, each long enough to
// dwarf timer resolution. Shared by gemm_peak (the tables) and train_throughput
// (the MFU denominator).
//
// Time is the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID): on a machine
// shared with other work it leaves out the slices the thread spent descheduled,
// so the figure is what one uncontended core delivers; on an idle machine it
// equals wall-clock time.
#pragma once

#include <time.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/gemm_backends.hpp"
#include "kernels/cpu/gemm_half.hpp"

namespace troupe::bench {

struct GemmShape {
  std::string name;
  bool ta, tb;
  int M, N, K;
};

// The shapes a GPT step spends its time in (B*T = 2048 rows, d_model 256,
// 4x MLP, 4 heads of 64, T = 128/256), plus square references.
inline std::vector<GemmShape> gemm_shapes() {
  return {
      {"square 1024", false, false, 1024, 1024, 1024},    {"square 2048", false, false, 2048, 2048, 2048},
      {"fwd qkv   x·W^T", false, true, 2048, 768, 256},   {"fwd fc    x·W^T", false, true, 2048, 1024, 256},
      {"fwd proj  x·W^T", false, true, 2048, 256, 256},   {"fwd fc2   x·W^T", false, true, 2048, 256, 1024},
      {"bwd dX    dy·W", false, false, 2048, 256, 768},   {"bwd dX    dy·W", false, false, 2048, 1024, 256},
      {"bwd dX    dy·W", false, false, 2048, 256, 1024},  {"bwd dW    dy^T·x", true, false, 768, 256, 2048},
      {"bwd dW    dy^T·x", true, false, 256, 1024, 2048}, {"bwd dW    dy^T·x", true, false, 1024, 256, 2048},
      {"attn T128 q·k^T", false, true, 128, 128, 64},     {"attn T128 p·v", false, false, 128, 64, 128},
      {"attn T256 q·k^T", false, true, 256, 256, 64},     {"attn T256 p·v", false, false, 256, 64, 256},
      {"attn T256 dP^T·q", true, false, 256, 64, 256},
  };
}

inline double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

struct GemmRate {
  double median = 0.0, best = 0.0;  // GFLOP/s over the repeats
};

// Random operands of one shape, and C = op(A) op(B) through a given backend.
class GemmOperands {
 public:
  explicit GemmOperands(const GemmShape& s) : s_(s) {
    A_.resize(size_t(s.ta ? s.K : s.M) * lda());
    B_.resize(size_t(s.tb ? s.N : s.K) * ldb());
    C_.resize(size_t(s.M) * s.N);
    std::mt19937 gen(1);
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    for (auto& x : A_) x = d(gen);
    for (auto& x : B_) x = d(gen);
  }
  void run(kernels::cpu::GemmBackend b) {
    kernels::cpu::gemm_with(b, s_.ta, s_.tb, s_.M, s_.N, s_.K, 1.0f, A_.data(), lda(), B_.data(), ldb(), 0.0f,
                            C_.data(), s_.N);
  }
  double flops() const { return 2.0 * s_.M * s_.N * double(s_.K); }

 private:
  int lda() const { return s_.ta ? s_.M : s_.K; }
  int ldb() const { return s_.tb ? s_.K : s_.N; }
  GemmShape s_;
  std::vector<float> A_, B_, C_;
};

// 16-bit operands of one shape (uniform in [-1, 1), rounded to dt), and
// C = op(A) op(B) through a given 16-bit backend.
class HalfGemmOperands {
 public:
  HalfGemmOperands(const GemmShape& s, DType dt) : s_(s), dt_(dt) {
    std::vector<float> a(size_t(s.ta ? s.K : s.M) * lda()), b(size_t(s.tb ? s.N : s.K) * ldb());
    std::mt19937 gen(1);
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    for (auto& x : a) x = d(gen);
    for (auto& x : b) x = d(gen);
    A_.resize(a.size());
    B_.resize(b.size());
    kernels::cpu::to_half(dt, A_.data(), a.data(), a.size());
    kernels::cpu::to_half(dt, B_.data(), b.data(), b.size());
    C_.resize(size_t(s.M) * s.N);
  }
  void run(kernels::cpu::HalfGemmBackend b) {
    kernels::cpu::gemm_half_with(b, dt_, s_.ta, s_.tb, s_.M, s_.N, s_.K, A_.data(), lda(), B_.data(), ldb(),
                                 0.0f, C_.data(), s_.N);
  }
  double flops() const { return 2.0 * s_.M * s_.N * double(s_.K); }

 private:
  int lda() const { return s_.ta ? s_.M : s_.K; }
  int ldb() const { return s_.tb ? s_.K : s_.N; }
  GemmShape s_;
  DType dt_;
  std::vector<uint16_t> A_, B_;
  std::vector<float> C_;
};

// GFLOP/s of `runs`, each one product of `flops`: after a warm-up, `repeats`
// rounds in which every run goes once for about `min_seconds`, so that load from
// other processes that comes and goes falls on all of them alike.
inline std::vector<GemmRate> interleaved_gflops(const std::vector<std::function<void()>>& runs, double flops,
                                                int repeats, double min_seconds) {
  const size_t nb = runs.size();
  // Warm-up (packing buffers, page faults, lazy library init), and an iteration
  // count per run calibrated from it.
  std::vector<int> iters(nb);
  for (size_t k = 0; k < nb; ++k) {
    runs[k]();
    const double t0 = thread_cpu_seconds();
    int n = 0;
    do {
      runs[k]();
      ++n;
    } while (thread_cpu_seconds() - t0 < min_seconds / 2);
    iters[k] = std::max(1, int(min_seconds / ((thread_cpu_seconds() - t0) / n)));
  }
  std::vector<std::vector<double>> rates(nb);
  for (int r = 0; r < repeats; ++r)
    for (size_t k = 0; k < nb; ++k) {
      const double t0 = thread_cpu_seconds();
      for (int i = 0; i < iters[k]; ++i) runs[k]();
      const double dt = thread_cpu_seconds() - t0;
      rates[k].push_back(flops * iters[k] / dt * 1e-9);
    }
  std::vector<GemmRate> out(nb);
  for (size_t k = 0; k < nb; ++k) {
    std::sort(rates[k].begin(), rates[k].end());
    out[k] = {rates[k][rates[k].size() / 2], rates[k].back()};
  }
  return out;
}

// GFLOP/s of shape s through each backend (interleaved_gflops).
inline std::vector<GemmRate> gemm_gflops(const std::vector<kernels::cpu::GemmBackend>& backends,
                                         const GemmShape& s, int repeats = 5, double min_seconds = 0.05) {
  GemmOperands ops(s);
  std::vector<std::function<void()>> runs;
  for (auto b : backends) runs.push_back([&ops, b] { ops.run(b); });
  return interleaved_gflops(runs, ops.flops(), repeats, min_seconds);
}

// GFLOP/s of shape s in 16-bit dtype dt through each 16-bit backend.
inline std::vector<GemmRate> half_gemm_gflops(const std::vector<kernels::cpu::HalfGemmBackend>& backends,
                                              DType dt, const GemmShape& s, int repeats = 5,
                                              double min_seconds = 0.05) {
  HalfGemmOperands ops(s, dt);
  std::vector<std::function<void()>> runs;
  for (auto b : backends) runs.push_back([&ops, b] { ops.run(b); });
  return interleaved_gflops(runs, ops.flops(), repeats, min_seconds);
}

// Every backend this build and CPU offer, in a fixed order.
inline std::vector<kernels::cpu::GemmBackend> available_gemm_backends() {
  std::vector<kernels::cpu::GemmBackend> out;
  for (auto b : {kernels::cpu::GemmBackend::avx512, kernels::cpu::GemmBackend::openblas,
                 kernels::cpu::GemmBackend::dnnl})
    if (kernels::cpu::gemm_backend_available(b)) out.push_back(b);
  return out;
}

// Every 16-bit backend this CPU offers for dt, in a fixed order.
inline std::vector<kernels::cpu::HalfGemmBackend> available_half_gemm_backends(DType dt) {
  std::vector<kernels::cpu::HalfGemmBackend> out;
  for (auto b : {kernels::cpu::HalfGemmBackend::avx512bf16, kernels::cpu::HalfGemmBackend::convert})
    if (kernels::cpu::half_gemm_backend_available(b, dt)) out.push_back(b);
  return out;
}

// The single-core fp32 GEMM ceiling: the best median over every available
// backend on the square shapes and the training shapes, and where it was found.
struct Peak {
  double gflops = 0.0;
  kernels::cpu::GemmBackend backend = kernels::cpu::GemmBackend::openblas;
  GemmShape shape;
};

inline Peak measure_peak(int repeats = 5) {
  Peak best;
  const auto backends = available_gemm_backends();
  for (const auto& s : gemm_shapes()) {
    const auto rates = gemm_gflops(backends, s, repeats);
    for (size_t k = 0; k < rates.size(); ++k)
      if (rates[k].median > best.gflops) best = {rates[k].median, backends[k], s};
  }
  return best;
}

inline double measure_peak_gflops(int repeats = 5) { return measure_peak(repeats).gflops; }

// A ceiling's backend and shape as "<backend>:<index in gemm_shapes()>", so that a
// child process can sample the same ceiling; "" for a shape not in gemm_shapes().
inline std::string peak_id(const Peak& p) {
  const auto shapes = gemm_shapes();
  for (size_t i = 0; i < shapes.size(); ++i) {
    const GemmShape& s = shapes[i];
    if (s.name == p.shape.name && s.ta == p.shape.ta && s.tb == p.shape.tb && s.M == p.shape.M &&
        s.N == p.shape.N && s.K == p.shape.K)
      return std::string(kernels::cpu::gemm_backend_name(p.backend)) + ":" + std::to_string(i);
  }
  return "";
}

// The backend and shape peak_id wrote (gflops left 0); false when `id` names no
// shape, or no backend available here.
inline bool peak_from_id(const std::string& id, Peak* out) {
  const size_t colon = id.find(':');
  if (colon == std::string::npos || colon + 1 == id.size()) return false;
  size_t index = 0;
  for (size_t i = colon + 1; i < id.size(); ++i) {
    if (id[i] < '0' || id[i] > '9') return false;
    index = 10 * index + size_t(id[i] - '0');
  }
  const auto shapes = gemm_shapes();
  if (index >= shapes.size()) return false;
  for (kernels::cpu::GemmBackend b : available_gemm_backends())
    if (id.compare(0, colon, kernels::cpu::gemm_backend_name(b)) == 0) {
      *out = Peak{0.0, b, shapes[index]};
      return true;
    }
  return false;
}

// Re-measures the ceiling's own shape and backend on demand, for samples taken
// between the timed pieces of a run: on a machine whose speed drifts (shared
// hosts, frequency changes) a ratio against the ceiling measured next to each
// piece is steadier than one against a ceiling measured once at the start.
class PeakProbe {
 public:
  explicit PeakProbe(const Peak& p) : backend_(p.backend), ops_(p.shape) { ops_.run(backend_); }

  // GFLOP/s over at least `seconds` of thread CPU time and two products, after
  // one untimed product: whatever ran before has left the operands out of cache,
  // and a cold first product would understate the ceiling.
  double sample(double seconds) {
    ops_.run(backend_);
    const double t0 = thread_cpu_seconds();
    double dt = 0.0;
    int n = 0;
    do {
      ops_.run(backend_);
      ++n;
      dt = thread_cpu_seconds() - t0;
    } while (dt < seconds || n < 2);
    return ops_.flops() * n / dt * 1e-9;
  }

 private:
  kernels::cpu::GemmBackend backend_;
  GemmOperands ops_;
};

}  // namespace troupe::bench

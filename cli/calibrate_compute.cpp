// `troupe plan --calibrate`: the compute figures. GEMM rates at the shapes a plan of the spec
// would run (or a generic grid), the peaks, the memory-bound kernels and the attention core,
// each timed through the kernels troupe's layers call, in `devices` processes at once.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <set>

#include "cli/calibrate_internal.hpp"
#include "core/error.hpp"
#include "kernels/cpu/gemm_half.hpp"
#include "kernels/cpu/kernels.hpp"
#include "plan/cost_model.hpp"

namespace troupe::cli::calibrate_detail {

namespace {

namespace kc = kernels::cpu;

// Median seconds of fn() over repetitions filling about `budget` seconds (one warm-up, at
// least 3 timed).
template <class F>
double time_median(F&& fn, double budget = 0.05) {
  fn();
  std::vector<double> t;
  const auto start = Clock::now();
  while (t.size() < 3 ||
         (std::chrono::duration<double>(Clock::now() - start).count() < budget && t.size() < 200)) {
    const auto t0 = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  return t[t.size() / 2];
}

std::vector<float> random_floats(size_t n) {
  std::vector<float> v(n);
  std::mt19937 g(7);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  for (auto& x : v) x = d(g);
  return v;
}

// The seconds of one product of shape s, through what the model calls.
double time_gemm(const Shape& s) {
  const int M = int(s.m), N = int(s.n), K = int(s.k);
  const bool ta = s.op == plan::GemmOp::tn, tb = s.op == plan::GemmOp::nt;
  const int lda = ta ? M : K, ldb = tb ? K : N;
  std::vector<float> a = random_floats(size_t(M) * K), b = random_floats(size_t(K) * N), c(size_t(M) * N);
  if (s.dt == DType::f32)
    return time_median(
        [&] { kc::gemm(ta, tb, M, N, K, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), N); });
  std::vector<uint16_t> ah(a.size()), bh(b.size());
  kc::to_half(s.dt, ah.data(), a.data(), a.size());
  kc::to_half(s.dt, bh.data(), b.data(), b.size());
  return time_median(
      [&] { kc::gemm_half(s.dt, ta, tb, M, N, K, ah.data(), lda, bh.data(), ldb, 0.0f, c.data(), N); });
}

std::vector<int> divisors(int64_t n, int64_t cap) {
  std::vector<int> d;
  for (int64_t i = 1; i <= n && i <= cap; ++i)
    if (n % i == 0) d.push_back(int(i));
  return d;
}

ComputeFigures measure_kernels(const JobSpec* spec);

// GEMM rates at `shapes`; the other figures averaged over `specs` (a generic block without any).
ComputeFigures measure_compute(const std::vector<Shape>& shapes, const std::vector<JobSpec>& specs) {
  ComputeFigures f;
  std::vector<ComputeFigures> k;
  if (specs.empty()) k.push_back(measure_kernels(nullptr));
  for (const JobSpec& s : specs) k.push_back(measure_kernels(&s));
  for (ComputeFigures& x : k) {
    const auto from = x.scalars(), to = f.scalars();
    for (size_t i = 0; i < from.size(); ++i) *to[i] += *from[i] / double(k.size());
  }
  for (const Shape& s : shapes) f.gemm_rate.push_back(2.0 * s.m * s.n * s.k / time_gemm(s));
  auto probe = [](int n, DType dt) { return 2.0 * n * n * n / time_gemm({n, n, n, plan::GemmOp::nt, dt}); };
  f.peak_f32 = probe(1024, DType::f32);
  f.small_f32 = probe(128, DType::f32);
  f.peak_bf16 = probe(1024, DType::bf16);
  f.peak_f16 = probe(1024, DType::f16);
  return f;
}

// The memory-bound kernels' and the attention core's rates at one spec's shapes (a 4 x 1024 x
// 768 GPT-2 block when there is no spec).
ComputeFigures measure_kernels(const JobSpec* spec) {
  ComputeFigures f;
  const kernels::Kernels& k = kernels::cpu_kernels();
  {
    const size_t n = size_t(8) << 20;  // 8 Mi parameters: 128 MiB of p, g, m, v
    std::vector<float> p = random_floats(n), g = random_floats(n), m(n), v(n);
    int64_t t = 0;
    f.stream_bw =
        28.0 * n /
        time_median(
            [&] {
              k.adamw_update(p.data(), g.data(), m.data(), v.data(), n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, ++t);
            },
            0.3);
  }
  const plan::ModelShape m =
      spec ? plan::model_shape(*spec) : plan::ModelShape{ModelType::gpt, 1, 768, 256, 1024, 12};
  const int T = m.seq_len, D = m.d_model, H = int(m.ffn());
  const int B = std::max(1, std::min(8, 8192 / std::max(1, T)));
  const int N = B * T;
  std::vector<float> x = random_floats(size_t(N) * D), y(size_t(N) * D), dx(size_t(N) * D), w(D, 1.f),
                     bias(D), mean(N), rstd(N), dw(D), db(D);
  std::vector<float> h = random_floats(size_t(N) * H), hy(size_t(N) * H);
  f.elementwise_bw = double(N) * D * 12 /
                     time_median([&] { k.residual_forward(y.data(), x.data(), dx.data(), size_t(N) * D); });
  double t = time_median([&] {
    k.layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), bias.data(), N, D);
  });
  t += time_median([&] {
    k.layernorm_backward(dx.data(), dw.data(), db.data(), y.data(), x.data(), w.data(), mean.data(),
                         rstd.data(), N, D);
  });
  f.norm_bw = double(N) * D * (8 + 16) / t;
  t = time_median([&] { k.gelu_forward(hy.data(), h.data(), size_t(N) * H); });
  t += time_median([&] { k.gelu_backward(h.data(), hy.data(), hy.data(), size_t(N) * H); });
  f.activation_bw = double(N) * H * (12 + 12) / t;
  if (m.type != ModelType::mlp) {
    const int NH = m.heads(), HS = D / NH, NKV = m.kv_heads();
    const int BA = 1;
    std::vector<float> qkv = random_floats(size_t(BA) * T * (NH + 2 * NKV) * HS),
                       out(size_t(BA) * T * NH * HS), lse(size_t(BA) * NH * T), dqkv(qkv.size());
    std::vector<float> dout = random_floats(out.size());
    const double ta =
        time_median([&] { k.attention_forward(out.data(), lse.data(), qkv.data(), BA, T, NH, HS, NKV); });
    const double tb = time_median([&] {
      k.attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), BA, T, NH, HS,
                           kernels::Out::overwrite, NKV);
    });
    // The rate of the FLOPs the cost model prices (plan::attention_flops: the fused kernel's two
    // forward and five backward products) over the time of the attention the engine runs.
    const plan::AttentionFlops af = plan::attention_flops(m, BA, 1);
    f.attention_flops = (af.forward + af.backward) / (ta + tb);
  }
  return f;
}

}  // namespace

// The products a plan of `spec` on up to `devices` devices would run.
std::vector<Shape> spec_shapes(const JobSpec& spec, int devices) {
  const plan::ModelShape m = plan::model_shape(spec);
  std::vector<DType> dts{DType::f32};
  if (spec.train.precision != Precision::fp32) dts.push_back(compute_dtype(spec.train.precision));
  std::set<Shape> out;
  const int64_t D = m.d_model, F = m.ffn(), V = m.vocab_size;
  const double hd = double(D) / m.heads();
  // Micro-batches: the divisors of the global batch, at most 6 of them spread over the range.
  std::vector<int> mbs = divisors(spec.train.global_batch, 1 << 20);
  if (spec.train.micro_batch > 0) mbs = {spec.train.micro_batch};
  while (mbs.size() > 6) mbs.erase(mbs.begin() + 1 + (mbs.size() - 2) / 2);
  for (int tp : divisors(std::max(1, devices), 8)) {
    if (m.type != ModelType::mlp && m.heads() % tp) continue;
    if (D % tp || F % tp) continue;
    for (int mb : mbs) {
      const int64_t N = int64_t(mb) * m.seq_len;
      if (N > (int64_t(1) << 16)) continue;          // larger products run at the largest one's rate
      std::vector<std::pair<int64_t, int64_t>> lin;  // (in, out) of each Linear on a shard
      if (m.type == ModelType::mlp) {
        lin = {{D, F / tp}, {F / tp, D}};
      } else if (m.type == ModelType::llama) {
        const int64_t qkv = int64_t((m.heads() + 2.0 * m.kv_heads()) / tp * hd);
        lin = {{D, qkv}, {D / tp, D}, {D, 2 * F / tp}, {F / tp, D}};
      } else {
        lin = {{D, 3 * D / tp}, {D / tp, D}, {D, F / tp}, {F / tp, D}};
      }
      lin.push_back({D, m.type == ModelType::llama ? V / tp : V});  // the head
      for (const auto& [in, o] : lin)
        for (DType dt : dts) {
          out.insert({N, o, in, plan::GemmOp::nt, dt});
          out.insert({N, in, o, plan::GemmOp::nn, dt});
          out.insert({o, in, N, plan::GemmOp::tn, dt});
        }
    }
  }
  return {out.begin(), out.end()};
}

std::vector<Shape> grid_shapes() {
  std::vector<Shape> out;
  for (int64_t m : {128, 512, 2048})
    for (int64_t n : {256, 1024, 4096})
      for (int64_t k : {256, 1024})
        for (auto op : {plan::GemmOp::nt, plan::GemmOp::nn, plan::GemmOp::tn})
          out.push_back({m, n, k, op, DType::f32});
  return out;
}

// Runs measure_compute in n processes at once; returns each one's figures.
std::vector<ComputeFigures> measure_compute_parallel(const std::vector<Shape>& shapes,
                                                     const std::vector<JobSpec>& specs, int n) {
  const size_t n_scalars = ComputeFigures{}.scalars().size();
  const size_t per = shapes.size() + n_scalars;
  std::vector<int> fds;
  std::vector<pid_t> pids;
  for (int i = 0; i < n; ++i) {
    int p[2];
    if (::pipe(p) != 0) throw Error("calibrate: pipe: " + std::string(std::strerror(errno)));
    const pid_t pid = ::fork();
    if (pid < 0) throw Error("calibrate: fork: " + std::string(std::strerror(errno)));
    if (pid == 0) {
      ::close(p[0]);
      std::vector<double> v;
      try {
        ComputeFigures f = measure_compute(shapes, specs);
        v = f.gemm_rate;
        for (double* x : f.scalars()) v.push_back(*x);
      } catch (...) {
        ::_exit(3);
      }
      const char* d = reinterpret_cast<const char*>(v.data());
      size_t left = v.size() * sizeof(double);
      while (left > 0) {
        const ssize_t w = ::write(p[1], d, left);
        if (w <= 0) ::_exit(4);
        d += w;
        left -= size_t(w);
      }
      ::_exit(0);
    }
    ::close(p[1]);
    fds.push_back(p[0]);
    pids.push_back(pid);
  }
  std::vector<ComputeFigures> all;
  for (int i = 0; i < n; ++i) {
    std::vector<double> v(per);
    char* d = reinterpret_cast<char*>(v.data());
    size_t left = v.size() * sizeof(double), got = 0;
    while (left > 0) {
      const ssize_t r = ::read(fds[size_t(i)], d + got, left);
      if (r <= 0) break;
      got += size_t(r);
      left -= size_t(r);
    }
    ::close(fds[size_t(i)]);
    int status = 0;
    ::waitpid(pids[size_t(i)], &status, 0);
    if (left != 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
      throw Error("calibrate: a measuring process failed (exit status " + std::to_string(status) + ")");
    ComputeFigures f;
    f.gemm_rate.assign(v.begin(), v.begin() + long(shapes.size()));
    const auto to = f.scalars();
    for (size_t j = 0; j < n_scalars; ++j) *to[j] = v[shapes.size() + j];
    all.push_back(std::move(f));
  }
  return all;
}

}  // namespace troupe::cli::calibrate_detail

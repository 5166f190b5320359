// `troupe plan --calibrate`: this machine as a hardware profile.
//
// What is measured, and how:
//   GEMM rates   the kernels troupe's Linears call (kernels::cpu::gemm, gemm_half), one thread
//                each, at the spec's shapes: every Linear of a block, the head, for every
//                micro-batch and tensor degree the planner may choose, in the three operand
//                layouts of forward, input gradient and weight gradient, in f32 and the
//                spec's 16-bit dtype. Timed in `devices` processes at once, as a job's workers
//                run (they share caches, memory bandwidth and the clock's boost), keeping the
//                slowest process's rate (workers step in lockstep); then in one process alone
//                (solo_speedup).
//   peaks        the best of those rates and of a 1024^3 probe, per dtype; the size curve's
//                half point from a 128^3 probe.
//   attention    attention_forward + attention_backward at the spec's heads and length.
//   memory       AdamW over 8 Mi parameters (bytes per second); a residual add, LayerNorm and
//                GELU forward + backward at the spec's sizes, as the cost model counts their
//                bytes, over it.
//   comm         two worker processes joined through gloo as a job's are (shared memory on
//                one host), each collective at 4 KiB .. 16 MiB; latency and bandwidth fitted
//                by least squares to the ring formulas of plan/hardware.hpp.
//   checkpoint   128 MiB written and fsynced beside the output file.
//   capacity     the cores (devices per node), MemTotal / cores (memory per device), a
//                worker's resident memory before it allocates a model.
#include "cli/calibrate.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "cli/commands.hpp"
#include "comm/communicator.hpp"
#include "comm/store.hpp"
#include "core/error.hpp"
#include "core/spec.hpp"
#include "kernels/cpu/gemm_half.hpp"
#include "kernels/cpu/kernels.hpp"
#include "plan/cost_model.hpp"
#include "plan/hardware.hpp"

namespace troupe::cli {

namespace {

using Clock = std::chrono::steady_clock;
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

struct Shape {
  int64_t m, n, k;
  plan::GemmOp op;
  DType dt;
  bool operator<(const Shape& o) const {
    return std::tie(m, n, k, op, dt) < std::tie(o.m, o.n, o.k, o.op, o.dt);
  }
};

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

// ---------------------------------------------------------------- one process's compute figures

struct ComputeFigures {
  std::vector<double> gemm_rate;  // by shape
  double peak_f32 = 0, peak_bf16 = 0, peak_f16 = 0, small_f32 = 0;
  // Bytes per second as the cost model counts them: AdamW over buffers larger than the caches
  // (the memory's bandwidth), and at the spec's activation sizes a residual add, a LayerNorm
  // forward + backward, a GELU forward + backward.
  double stream_bw = 0, elementwise_bw = 0, norm_bw = 0, activation_bw = 0;
  double attention_flops = 0;  // the causal attention core, forward + backward
  // The scalar figures in one order, for the pipe from a measuring process.
  std::vector<double*> scalars() {
    return {&peak_f32,       &peak_bf16, &peak_f16,      &small_f32,      &stream_bw,
            &elementwise_bw, &norm_bw,   &activation_bw, &attention_flops};
  }
};

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

// ---------------------------------------------------------------- comm between two workers

struct Sample {
  double bytes, seconds;
};

// (latency, bandwidth) of time = steps * latency + factor * bytes / bandwidth, by least squares
// on the relative error (each size counts alike, the small ones that fix the latency too).
plan::LinkCost fit(const std::vector<Sample>& s, double steps, double factor) {
  // Minimise sum ((a + c x_i) / t_i - 1)^2: weighted least squares with weights 1 / t_i^2.
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const Sample& p : s) {
    const double w = 1.0 / (p.seconds * p.seconds);
    sw += w;
    sx += w * p.bytes;
    sy += w * p.seconds;
    sxx += w * p.bytes * p.bytes;
    sxy += w * p.bytes * p.seconds;
  }
  double slope = (sw * sxy - sx * sy) / std::max(1e-300, sw * sxx - sx * sx);
  double icpt = (sy - slope * sx) / sw;
  if (icpt < 0) {  // no latency to speak of: the bandwidth alone
    icpt = 0;
    slope = sxy / std::max(1e-300, sxx);
  }
  plan::LinkCost l;
  l.latency = icpt / steps;
  l.bandwidth = slope > 0 ? factor / slope : 1e12;
  if (std::getenv("TROUPE_CALIBRATE_VERBOSE"))
    for (const Sample& p : s)
      std::fprintf(stderr, "  %10.0f bytes %10.1f us (fit %10.1f us)\n", p.bytes, p.seconds * 1e6,
                   (icpt + slope * p.bytes) * 1e6);
  return l;
}

// Rank 0's samples of each collective between two gloo worker processes on this host.
struct CommFigures {
  std::vector<Sample> p2p, allreduce, allgather, reduce_scatter;
  double rss_bytes = 0;  // a worker's resident memory with its communicator, before any model
};

double resident_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) * 1024.0;
  return 0;
}

void comm_child(int rank, const std::string& dir, int out_fd) {
  comm::CommConfig c;
  c.backend = "gloo";
  c.rank = rank;
  c.size = 2;
  c.job = "calibrate";
  c.store = std::make_shared<comm::FileStore>(dir);
  auto world = comm::make_communicator(c);
  CommFigures f;
  for (size_t bytes = 4096; bytes <= (size_t(16) << 20); bytes *= 2) {
    const size_t n = bytes / 4;
    std::vector<float> a(n, 1.f), b(n, 0.f), half(n / 2);
    // Both ranks run the same number of repetitions (a budget in time would differ between them).
    const int reps = int(std::clamp<size_t>((size_t(64) << 20) / bytes, 5, 40));
    auto median = [&](auto&& op) {
      world->barrier();
      op();  // warm-up
      std::vector<double> t;
      for (int i = 0; i < reps; ++i) {
        const auto t0 = Clock::now();
        op();
        t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      }
      std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
      return t[t.size() / 2];
    };
    f.p2p.push_back({double(bytes), median([&] {
                       // One message each way at once, as a pipeline batch sends and receives.
                       world->batch({comm::P2POp::send(a.data(), bytes, 1 - rank, 7),
                                     comm::P2POp::recv(b.data(), bytes, 1 - rank, 7)});
                     })});
    f.allreduce.push_back(
        {double(bytes), median([&] { world->allreduce(a.data(), n, comm::ReduceOp::sum); })});
    f.allgather.push_back({double(bytes), median([&] { world->allgather(half.data(), b.data(), n / 2); })});
    f.reduce_scatter.push_back({double(bytes), median([&] {
                                  world->reduce_scatter(a.data(), half.data(), n / 2, comm::ReduceOp::sum);
                                })});
  }
  f.rss_bytes = resident_bytes();
  if (rank == 0) {
    std::vector<double> v;
    for (auto* s : {&f.p2p, &f.allreduce, &f.allgather, &f.reduce_scatter})
      for (const Sample& x : *s) v.insert(v.end(), {x.bytes, x.seconds});
    v.push_back(f.rss_bytes);
    const char* d = reinterpret_cast<const char*>(v.data());
    size_t left = v.size() * sizeof(double);
    while (left > 0) {
      const ssize_t w = ::write(out_fd, d, left);
      if (w <= 0) break;
      d += w;
      left -= size_t(w);
    }
  }
  world->barrier();
}

CommFigures measure_comm() {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("troupe-calibrate-" + std::to_string(::getpid()))).string();
  std::filesystem::create_directories(dir);
  int p[2];
  if (::pipe(p) != 0) throw Error("calibrate: pipe failed");
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 2; ++rank) {
    const pid_t pid = ::fork();
    if (pid < 0) throw Error("calibrate: fork failed");
    if (pid == 0) {
      ::close(p[0]);
      int code = 0;
      try {
        comm_child(rank, dir, p[1]);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "calibrate: worker %d: %s\n", rank, e.what());
        code = 3;
      }
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  ::close(p[1]);
  std::vector<double> v;
  double buf[512];
  for (;;) {
    const ssize_t r = ::read(p[0], buf, sizeof buf);
    if (r <= 0) break;
    v.insert(v.end(), buf, buf + r / ssize_t(sizeof(double)));
  }
  ::close(p[0]);
  bool ok = true;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  std::filesystem::remove_all(dir);
  const size_t sizes = 13;  // 4 KiB .. 16 MiB by 2
  if (!ok || v.size() != 4 * sizes * 2 + 1)
    throw Error("calibrate: the comm measurement between two workers failed");
  CommFigures f;
  size_t i = 0;
  for (auto* s : {&f.p2p, &f.allreduce, &f.allgather, &f.reduce_scatter})
    for (size_t j = 0; j < sizes; ++j, i += 2) s->push_back({v[i], v[i + 1]});
  f.rss_bytes = v[i];
  return f;
}

double checkpoint_bandwidth(const std::string& dir) {
  const std::string path = dir + "/.troupe-calibrate-" + std::to_string(::getpid());
  const size_t n = size_t(128) << 20;
  std::vector<char> data(size_t(8) << 20, 'x');
  const auto t0 = Clock::now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return 0;
  bool ok = true;
  for (size_t done = 0; done < n && ok; done += data.size())
    ok = ::write(fd, data.data(), data.size()) == ssize_t(data.size());
  ok = ok && ::fsync(fd) == 0;
  ::close(fd);
  const double t = std::chrono::duration<double>(Clock::now() - t0).count();
  ::unlink(path.c_str());
  return ok ? double(n) / t : 0;
}

uint64_t mem_total() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  while (in >> key >> kb) {
    if (key == "MemTotal:") return kb * 1024;
    in.ignore(1 << 10, '\n');
  }
  return 0;
}

// The slowest process's figure: workers that step in lockstep go at the pace of the slowest
// (the cores of a shared host differ, and a core's speed drifts).
double slowest(const std::vector<ComputeFigures>& all, double ComputeFigures::*field) {
  double s = all.front().*field;
  for (const auto& f : all) s = std::min(s, f.*field);
  return s;
}

}  // namespace

int run_calibrate(const std::vector<std::string>& spec_paths, int devices, const std::string& out_arg) {
  std::vector<JobSpec> specs;
  for (const std::string& path : spec_paths) {
    try {
      specs.push_back(load_spec(path));
    } catch (const SpecError& e) {
      std::cerr << e.what();
      return kUsage;
    }
  }
  const bool have_spec = !specs.empty();
  const int cores = std::max(1, int(std::thread::hardware_concurrency()));
  const int procs = devices > 0 ? devices : cores;
  std::string out = out_arg;
  if (out.empty()) {
    const std::string dir = plan::hardware_dir();
    if (dir.empty()) {
      std::cerr
          << "troupe plan --calibrate: no HOME, XDG_CONFIG_HOME or TROUPE_HARDWARE_DIR: give --out FILE\n";
      return kUsage;
    }
    out = dir + "/cpu.yaml";
  }
  const std::filesystem::path out_path(out);
  const std::string out_dir = out_path.has_parent_path() ? out_path.parent_path().string() : ".";
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) {
    std::cerr << "troupe plan --calibrate: cannot create " << out_dir << ": " << ec.message() << "\n";
    return kUsage;
  }
  try {
    std::vector<Shape> shapes;
    if (!have_spec) shapes = grid_shapes();
    for (const JobSpec& s : specs)
      for (const Shape& x : spec_shapes(s, procs))
        if (std::find_if(shapes.begin(), shapes.end(),
                         [&](const Shape& y) { return !(x < y) && !(y < x); }) == shapes.end())
          shapes.push_back(x);
    std::printf("troupe plan --calibrate: %zu GEMM shapes in %d process%s at once, kernels %s\n",
                shapes.size(), procs, procs == 1 ? "" : "es", kc::gemm_backend());
    std::fflush(stdout);
    const std::vector<ComputeFigures> all = measure_compute_parallel(shapes, specs, procs);
    // The same alone: how much faster one worker computes when the others are idle.
    double solo = 1.0;
    if (procs > 1) {
      std::printf("troupe plan --calibrate: the same shapes in one process alone\n");
      std::fflush(stdout);
      const ComputeFigures one = measure_compute_parallel(shapes, specs, 1).front();
      double log_sum = 0;
      for (size_t i = 0; i < shapes.size(); ++i) {
        double loaded = all.front().gemm_rate[i];
        for (const auto& f : all) loaded = std::min(loaded, f.gemm_rate[i]);
        log_sum += std::log(one.gemm_rate[i] / loaded);
      }
      solo = shapes.empty() ? 1.0 : std::clamp(std::exp(log_sum / double(shapes.size())), 1.0, 16.0);
    }
    std::printf("troupe plan --calibrate: comm between two worker processes (gloo)\n");
    std::fflush(stdout);
    const CommFigures comm = measure_comm();
    const double ckpt = checkpoint_bandwidth(out_dir);

    plan::HardwareProfile p = plan::builtin_hardware("cpu");
    p.name = out_path.stem().string();
    if (!plan::valid_hardware_name(p.name)) p.name = "cpu";
    char hostname[256] = {0};
    ::gethostname(hostname, sizeof hostname - 1);
    std::ostringstream desc;
    desc << "calibrated on " << hostname << " (" << cores << " cores, GEMM " << kc::gemm_backend() << ", "
         << procs << " workers at once)";
    for (size_t i = 0; i < spec_paths.size(); ++i) desc << (i ? ", " : " at the shapes of ") << spec_paths[i];
    p.description = desc.str();
    p.device = plan::ProfileDevice::cpu;
    p.devices_per_node = cores;
    p.memory = mem_total() / uint64_t(cores);
    p.memory_bandwidth = slowest(all, &ComputeFigures::stream_bw);
    p.peak_f32 = slowest(all, &ComputeFigures::peak_f32);
    p.peak_bf16 = slowest(all, &ComputeFigures::peak_bf16);
    p.peak_f16 = slowest(all, &ComputeFigures::peak_f16);
    for (size_t i = 0; i < shapes.size(); ++i) {
      plan::GemmPoint g{shapes[i].m,  shapes[i].n,  shapes[i].k,
                        shapes[i].op, shapes[i].dt, all.front().gemm_rate[i]};
      for (const auto& f : all) g.flops_per_s = std::min(g.flops_per_s, f.gemm_rate[i]);
      if (g.dtype == DType::f32) p.peak_f32 = std::max(p.peak_f32, g.flops_per_s);
      if (g.dtype == DType::bf16) p.peak_bf16 = std::max(p.peak_bf16, g.flops_per_s);
      if (g.dtype == DType::f16) p.peak_f16 = std::max(p.peak_f16, g.flops_per_s);
      p.gemm_table.push_back(g);
    }
    p.gemm_efficiency = 1.0;  // the peaks are measured rates
    const double small = slowest(all, &ComputeFigures::small_f32), f128 = 2.0 * 128 * 128 * 128;
    p.gemm_half_flops = small < p.peak_f32 ? f128 * (p.peak_f32 / small - 1) : 0;
    auto efficiency = [&](double ComputeFigures::*field) {
      return std::clamp(slowest(all, field) / p.memory_bandwidth, 1e-3, 100.0);
    };
    p.elementwise_efficiency = efficiency(&ComputeFigures::elementwise_bw);
    p.norm_efficiency = efficiency(&ComputeFigures::norm_bw);
    p.activation_efficiency = efficiency(&ComputeFigures::activation_bw);
    const double att = slowest(all, &ComputeFigures::attention_flops);
    if (att > 0) p.attention_efficiency = std::clamp(att / p.peak_f32, 1e-4, 1.0);
    p.comm_overlap = 0.0;
    p.solo_speedup = solo;
    // Fits, and the measured tables, which price the sizes they cover.
    auto with_table = [](plan::LinkCost l, const std::vector<Sample>& samples) {
      for (const Sample& x : samples) l.table.emplace_back(x.bytes, x.seconds);
      return l;
    };
    p.intra_node.link = with_table(fit(comm.p2p, 1, 1), comm.p2p);
    // Two ranks: an all-reduce is 2 steps of 2(n-1)/n = 1 buffer, the others 1 step of 1/2.
    p.intra_node.allreduce = with_table(fit(comm.allreduce, 2, 1), comm.allreduce);
    p.intra_node.allgather = with_table(fit(comm.allgather, 1, 0.5), comm.allgather);
    p.intra_node.reduce_scatter = with_table(fit(comm.reduce_scatter, 1, 0.5), comm.reduce_scatter);
    p.inter_node = plan::builtin_hardware("cpu").inter_node;  // one host measured: another's link is not
    if (ckpt > 0) p.checkpoint_bandwidth = ckpt;
    p.process_memory = uint64_t(comm.rss_bytes);
    const std::string text = plan::to_yaml(p);
    plan::parse_hardware(text, out);  // what is written reads back
    const std::string tmp = out + ".tmp";
    {
      std::ofstream f(tmp, std::ios::trunc);
      f << "# Written by troupe plan --calibrate; docs/planner.md#calibration says what each figure is.\n"
        << text;
      if (!f) throw Error("cannot write " + tmp);
    }
    std::filesystem::rename(tmp, out);
    std::printf(
        "troupe plan --calibrate: per core fp32 %.1f GFLOP/s, bf16 %.1f, fp16 %.1f; memory %.1f GB/s; "
        "attention %.0f%% of fp32 peak; elementwise %.2f, norms %.2f, activations %.2f of the memory's rate; "
        "allreduce %.1f us + %.2f GB/s, p2p %.1f us + %.2f GB/s; checkpoint %.0f MB/s; one worker alone "
        "%.2fx "
        "as fast\nwrote %s\n",
        p.peak_f32 / 1e9, p.peak_bf16 / 1e9, p.peak_f16 / 1e9, p.memory_bandwidth / 1e9,
        100 * p.attention_efficiency, p.elementwise_efficiency, p.norm_efficiency, p.activation_efficiency,
        p.intra_node.allreduce.latency * 1e6, p.intra_node.allreduce.bandwidth / 1e9,
        p.intra_node.link.latency * 1e6, p.intra_node.link.bandwidth / 1e9, ckpt / 1e6, solo, out.c_str());
  } catch (const std::exception& e) {
    std::cerr << "troupe plan --calibrate: " << e.what() << "\n";
    return kJobFailed;
  }
  return kOk;
}

}  // namespace troupe::cli

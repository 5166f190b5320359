// nccl-tests-style benchmark of the gloo backend: ranks are separate
// processes on this host, one table per operation with the median time of the
// timed iterations (each iteration's time is the slowest rank's), algbw,
// busbw and a correctness check; then the same allreduce through gloo's
// options API directly, and the latency of abort().
//
//   comm_bench [--ranks 2,4] [--min-bytes 4096] [--max-bytes 67108864] [--warmup 2] [--shm 1]
//
// --shm 0 runs the per-operation tables over TCP instead of the same-host
// shared-memory collectives; the allreduce comparison always shows both.
//
// size is nccl-tests' size: the buffer for allreduce/broadcast/sendrecv, the
// gathered (allgather) or scattered (reduce_scatter) whole for the others.
// busbw = algbw x 2(n-1)/n (allreduce), (n-1)/n (allgather, reduce_scatter),
// 1 (broadcast, sendrecv).
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/gloo/gloo_store.hpp"
#include "comm/store.hpp"

using namespace troupe::comm;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  std::vector<int> ranks{2, 4};
  size_t min_bytes = 4096;
  size_t max_bytes = size_t{64} << 20;
  int warmup = 2;
  bool shm = true;
};

int iterations(size_t bytes) {
  return static_cast<int>(std::clamp<size_t>((size_t{512} << 20) / bytes, 5, 50));
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

float value(int rank, size_t i) { return static_cast<float>((rank + 1) * static_cast<int>(i % 13 + 1)); }

// Times `op` (preceded by `barrier` each iteration); returns the median over
// iterations of the slowest rank's time.
double time_op(Communicator& c, int warmup, int iters, const std::function<void()>& barrier,
               const std::function<void()>& op) {
  for (int i = 0; i < warmup; ++i) op();
  std::vector<double> t(iters);
  for (int i = 0; i < iters; ++i) {
    barrier();
    const auto t0 = Clock::now();
    op();
    t[i] = seconds_since(t0);
  }
  c.allreduce(t.data(), t.size(), ReduceOp::max);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct OpSpec {
  const char* name;
  double bus_factor;
  // Runs the op once on buffers sized for `bytes`.
  std::function<void(size_t bytes)> run;
  // Fills inputs with a known pattern, runs once, checks; true if correct.
  std::function<bool(size_t bytes)> check;
};

struct Row {
  size_t bytes;
  double time_s, algbw, busbw;
  bool ok;
};

void print_table(const char* name, int n, bool shm, const std::vector<Row>& rows) {
  std::printf("\n# %s, gloo backend (%s), %d ranks (processes)\n", name,
              shm ? "same-host shared-memory collectives, TCP point-to-point" : "TCP", n);
  std::printf("%12s %12s %10s %10s %6s\n", "size(B)", "time(us)", "algbw", "busbw", "check");
  for (const auto& r : rows)
    std::printf("%12zu %12.1f %10.3f %10.3f %6s\n", r.bytes, r.time_s * 1e6, r.algbw, r.busbw,
                r.ok ? "ok" : "FAIL");
  std::fflush(stdout);
}

int child(const Args& a, int rank, int n, const std::string& dir) {
  auto store = std::make_shared<FileStore>(dir);
  CommConfig cfg;
  cfg.backend = "gloo";
  cfg.rank = rank;
  cfg.size = n;
  cfg.job = "bench";
  cfg.store = store;
  cfg.shm = a.shm;
  auto c = make_communicator(cfg);
  CommConfig tcp_cfg = cfg;
  tcp_cfg.group = "tcp";
  tcp_cfg.shm = false;
  auto c_tcp = make_communicator(tcp_cfg);
  const size_t max_elems = a.max_bytes / 4;
  std::vector<float> x(max_elems), y(max_elems);
  const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  auto barrier = [&] { c->barrier(); };
  auto fill = [&](std::vector<float>& v, size_t count) {
    for (size_t i = 0; i < count; ++i) v[i] = value(rank, i);
  };
  const float s = static_cast<float>(n * (n + 1) / 2);

  std::vector<OpSpec> ops{
      {"allreduce", 2.0 * (n - 1) / n, [&](size_t b) { c->allreduce(x.data(), b / 4, ReduceOp::sum); },
       [&](size_t b) {
         fill(x, b / 4);
         c->allreduce(x.data(), b / 4, ReduceOp::sum);
         for (size_t i = 0; i < b / 4; ++i)
           if (x[i] != s * static_cast<float>(i % 13 + 1)) return false;
         return true;
       }},
      {"allgather", double(n - 1) / n, [&](size_t b) { c->allgather(x.data(), y.data(), b / 4 / n); },
       [&](size_t b) {
         const size_t k = b / 4 / n;
         fill(x, k);
         c->allgather(x.data(), y.data(), k);
         for (int r = 0; r < n; ++r)
           for (size_t i = 0; i < k; ++i)
             if (y[r * k + i] != value(r, i)) return false;
         return true;
       }},
      {"reduce_scatter", double(n - 1) / n,
       [&](size_t b) { c->reduce_scatter(x.data(), y.data(), b / 4 / n, ReduceOp::sum); },
       [&](size_t b) {
         const size_t k = b / 4 / n;
         fill(x, k * n);
         c->reduce_scatter(x.data(), y.data(), k, ReduceOp::sum);
         for (size_t i = 0; i < k; ++i)
           if (y[i] != s * static_cast<float>((rank * k + i) % 13 + 1)) return false;
         return true;
       }},
      {"broadcast", 1.0, [&](size_t b) { c->broadcast(x.data(), b / 4, 0); },
       [&](size_t b) {
         for (size_t i = 0; i < b / 4; ++i) x[i] = rank == 0 ? value(7, i) : 0.f;
         c->broadcast(x.data(), b / 4, 0);
         for (size_t i = 0; i < b / 4; ++i)
           if (x[i] != value(7, i)) return false;
         return true;
       }},
      {"sendrecv", 1.0,
       [&](size_t b) {
         c->batch({P2POp::recv(y.data(), b, prev, 0), P2POp::send(x.data(), b, next, 0)});
       },
       [&](size_t b) {
         fill(x, b / 4);
         c->batch({P2POp::recv(y.data(), b, prev, 0), P2POp::send(x.data(), b, next, 0)});
         for (size_t i = 0; i < b / 4; ++i)
           if (y[i] != value(prev, i)) return false;
         return true;
       }},
  };

  for (const auto& op : ops) {
    std::vector<Row> rows;
    for (size_t b = a.min_bytes; b <= a.max_bytes; b *= 4) {
      const double t = time_op(*c, a.warmup, iterations(b), barrier, [&] { op.run(b); });
      int32_t ok = op.check(b) ? 1 : 0;
      c->allreduce(&ok, 1, ReduceOp::min);
      const double algbw = b / t / 1e9;
      rows.push_back({b, t, algbw, algbw * op.bus_factor, ok == 1});
    }
    if (rank == 0) print_table(op.name, n, a.shm, rows);
  }

  // The same allreduce straight through gloo's options API, on a context of
  // its own built from the same store.
  auto raw = std::make_shared<gloo::rendezvous::Context>(rank, n);
  raw->setTimeout(std::chrono::seconds(30));
  GlooStore raw_store(std::make_shared<PrefixStore>("bench/raw/", store), std::chrono::seconds(30));
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  raw->connectFullMesh(raw_store, dev);
  auto raw_barrier = [&] {
    gloo::BarrierOptions o(raw);
    gloo::barrier(o);
  };
  if (rank == 0) {
    std::printf(
        "\n# allreduce busbw (GB/s), %d ranks: troupe gloo backend with shared memory, troupe over TCP,\n",
        n);
    std::printf(
        "# raw gloo::allreduce (options API); iterations interleaved so all three see the same load\n");
    std::printf("%12s %10s %10s %10s %10s %10s\n", "size(B)", "shm", "tcp", "raw gloo", "shm/raw", "tcp/raw");
  }
  auto raw_allreduce = [&](size_t b) {
    gloo::AllreduceOptions o(raw);
    o.setOutput(x.data(), b / 4);
    o.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    gloo::allreduce(o);
  };
  CommConfig shm_cfg = cfg;
  shm_cfg.group = "shm";
  shm_cfg.shm = true;
  auto c_shm = make_communicator(shm_cfg);
  for (size_t b = a.min_bytes; b <= a.max_bytes; b *= 4) {
    const int iters = iterations(b);
    std::vector<std::function<void()>> variants{[&] { c_shm->allreduce(x.data(), b / 4, ReduceOp::sum); },
                                                [&] { c_tcp->allreduce(x.data(), b / 4, ReduceOp::sum); },
                                                [&] { raw_allreduce(b); }};
    std::vector<std::vector<double>> t(variants.size(), std::vector<double>(iters));
    for (int i = 0; i < a.warmup; ++i)
      for (auto& v : variants) v();
    for (int i = 0; i < iters; ++i)
      for (size_t k = 0; k < variants.size(); ++k) {
        raw_barrier();
        const auto t0 = Clock::now();
        variants[k]();
        t[k][i] = seconds_since(t0);
      }
    std::vector<double> bus;
    for (auto& tk : t) {
      c->allreduce(tk.data(), iters, ReduceOp::max);
      std::sort(tk.begin(), tk.end());
      bus.push_back(b / tk[iters / 2] / 1e9 * 2.0 * (n - 1) / n);
    }
    if (rank == 0)
      std::printf("%12zu %10.3f %10.3f %10.3f %10.2f %10.2f\n", b, bus[0], bus[1], bus[2], bus[0] / bus[2],
                  bus[1] / bus[2]);
  }
  std::fflush(stdout);

  // abort(): rank 0 blocks in an op its peers never join, another thread
  // aborts it; the figure is abort() call -> op returns with CommError{aborted}.
  for (const char* kind : {"allreduce", "recv"}) {
    std::vector<double> lat;
    for (int trial = 0; trial < 5; ++trial) {
      CommConfig ac = cfg;
      ac.group = std::string("abort-") + kind + std::to_string(trial);
      auto ab = make_communicator(ac);
      const std::string done_key = ac.group + "/done";
      if (rank == 0) {
        std::atomic<bool> returned{false};
        Clock::time_point t_abort, t_return;
        std::thread t([&] {
          try {
            if (std::string(kind) == "allreduce")
              ab->allreduce(x.data(), 1 << 20, ReduceOp::sum, Options{std::chrono::seconds(20)});
            else
              ab->recv(x.data(), 4096, 1, 9, Options{std::chrono::seconds(20)});
          } catch (const CommError&) {
          }
          t_return = Clock::now();
        });
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        t_abort = Clock::now();
        ab->abort();
        t.join();
        lat.push_back(std::chrono::duration<double>(t_return - t_abort).count());
        store->set(done_key, "1");
      } else {
        store->get(done_key, std::chrono::seconds(60));
      }
    }
    if (rank == 0) {
      std::sort(lat.begin(), lat.end());
      std::printf("\n# abort latency, %s blocked on rank 0 of %d: median %.3f ms, max %.3f ms (5 trials)\n",
                  kind, n, lat[lat.size() / 2] * 1e3, lat.back() * 1e3);
    }
  }
  std::fflush(stdout);
  // Ranks leave together so nobody sees its peers' sockets close mid-op.
  c->barrier();
  return 0;
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoi(item));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--ranks")
      a.ranks = parse_list(v);
    else if (k == "--min-bytes")
      a.min_bytes = std::stoull(v);
    else if (k == "--max-bytes")
      a.max_bytes = std::stoull(v);
    else if (k == "--warmup")
      a.warmup = std::stoi(v);
    else if (k == "--shm")
      a.shm = v != "0";
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  // Keep sizes divisible by 4-byte elements times the largest rank count.
  a.min_bytes = std::max<size_t>(a.min_bytes, 1024);
  int status = 0;
  for (int n : a.ranks) {
    char tmpl[] = "/tmp/troupe_comm_bench_XXXXXX";
    const std::string dir = ::mkdtemp(tmpl);
    std::vector<pid_t> pids;
    for (int r = 0; r < n; ++r) {
      const pid_t pid = ::fork();
      if (pid == 0) {
        int rc = 1;
        try {
          rc = child(a, r, n, dir);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        }
        std::fflush(stdout);
        ::_exit(rc);
      }
      pids.push_back(pid);
    }
    for (pid_t p : pids) {
      int st = 0;
      ::waitpid(p, &st, 0);
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) status = 1;
    }
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  return status;
}

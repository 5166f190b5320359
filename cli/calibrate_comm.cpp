// `troupe plan --calibrate`: the collectives between two worker processes joined through gloo
// as a job's are, each at 4 KiB .. 16 MiB, and the latency and bandwidth fitted to them.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>

#include "cli/calibrate_internal.hpp"
#include "comm/communicator.hpp"
#include "comm/store.hpp"
#include "core/error.hpp"

namespace troupe::cli::calibrate_detail {

namespace {

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

}  // namespace

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

}  // namespace troupe::cli::calibrate_detail

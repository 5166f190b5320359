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
//
// The compute figures are measured in calibrate_compute.cpp, the comm figures in
// calibrate_comm.cpp (both declared in calibrate_internal.hpp); this file measures the rest
// and writes the profile.
#include "cli/calibrate.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>
#include <vector>

#include "cli/calibrate_internal.hpp"
#include "cli/commands.hpp"
#include "core/error.hpp"
#include "core/spec.hpp"
#include "kernels/cpu/kernels.hpp"
#include "plan/hardware.hpp"

namespace troupe::cli {

using namespace calibrate_detail;

namespace {

namespace kc = kernels::cpu;

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

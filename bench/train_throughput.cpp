// Training throughput of the 1x1x1 engine on GPT configs A and B, in fp32 and in
// mixed precision, its MFU against the single-core GEMM ceiling measured in the
// same run, its peak memory, and the ratios to PyTorch (bench/torch_reference.py)
// on the same model and thread count.
//
//   train_throughput [steps=10] [warmup=2] [--no-torch] [--peak=GFLOPS] [--config=A|B]
//                    [--precision=fp32|bf16|fp16|all]
// --peak skips the ceiling measurement and uses the given figure; --config runs one config.
// --precision (also as two words) adds troupe rows in that train.precision next to fp32
// (all: bf16 and fp16), a PyTorch bf16 autocast row next to PyTorch fp32, and a 16-bit
// GEMM block; fp32, the default, measures what it always did.
//
// Config A: 4 layers, d_model 256, 4 heads, seq 128, batch 16.
// Config B: 8 layers, d_model 512, 8 heads, seq 256, batch 8.
//
// FLOPs per token = 6 * N (parameters without wpe: every weight is used in one
// forward and two backward products) + 12 * L * D * T (attention scores and
// their use, forward and backward, at full T; the causal mask is not credited).
// The same count for every precision: MFU is against the fp32 ceiling, so the
// rows compare with each other; the 16-bit ceilings are printed beside it.
//
// Every row runs in its own process (troupe: this executable again, in the
// hidden --one=<config>:<precision> mode; PyTorch: the script), one after the
// other, so that each reports its own peak RSS (bench/child_process.hpp). A
// troupe child reads its VmHWM after the warm-up steps, before the ceiling
// probe's operands (up to 48 MiB) exist: the figure is the engine's.
//
// Two figures per run: wall-clock tokens/s and tokens per second of process CPU
// time (all threads, as the PyTorch script's time.process_time()). On a machine
// shared with other work the CPU-time figure is what one uncontended core
// gives; on an idle machine both agree. The PyTorch script reports the same
// pair, so the ratio compares like with like. PyTorch's OpenBLAS kernel follows
// the caller's OPENBLAS_CORETYPE (README, Performance). The GEMM ceiling is timed the
// same way (bench/gemm_timing.hpp).
//
// The speed of a core on a shared host drifts by 20 % and more within seconds,
// so a ceiling measured once at the start is a poor denominator for steps timed
// a minute later. Each timed step is therefore bracketed by two short samples
// of the ceiling's own shape and backend, and "paired MFU" is the median over
// steps of step FLOP/s over the mean of its two samples (a PyTorch run: over the
// samples just before and after it). On a steady machine it equals the plain figure.
//
// PyTorch's bf16 products can run at a small fraction of its fp32 ones (1.13 on an
// AVX2-only core: torch.mm at 2048^2 in 4 GFLOP/s against 75), so its autocast row
// times fewer steps: max(2, steps / 4) after one warm-up step.
//
// "loss" is each run's last step: a check that the 16-bit rows train as fp32 does.
// troupe's synthetic data has structure to learn; the PyTorch script draws uniform
// tokens (loss ~ ln 256 = 5.55), so the two sides' losses do not compare.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "bench/child_process.hpp"
#include "bench/flops.hpp"
#include "bench/gemm_timing.hpp"
#include "bench/step_timing.hpp"
#include "core/spec.hpp"
#include "kernels/cpu/kernels.hpp"
#include "worker/engine.hpp"

namespace {

using troupe::Precision;
using troupe::bench::ChildRun;
using troupe::bench::GemmShape;
using troupe::bench::report_text;
using troupe::bench::report_value;
namespace kc = troupe::kernels::cpu;

// Length of each ceiling sample around a timed step.
constexpr double kProbeSeconds = 0.05;
const double kNaN = std::nan("");

struct GptConfig {
  const char* name;
  int layers, d_model, heads, seq_len, batch;
};
const GptConfig kConfigs[] = {{"A", 4, 256, 4, 128, 16}, {"B", 8, 512, 8, 256, 8}};

struct Rates {
  double wall = 0.0, cpu = 0.0;  // tokens/s
};

std::string spec_yaml(const GptConfig& c, int steps, Precision precision) {
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "name: throughput-%s\n"
                "model:\n  type: gpt\n  vocab_size: 256\n  seq_len: %d\n  d_model: %d\n  n_layers: %d\n"
                "  n_heads: %d\n"
                "data:\n  source: synthetic\n"
                "train:\n  steps: %d\n  global_batch: %d\n  optimizer:\n    type: adamw\n    lr: 3e-4\n"
                "    weight_decay: 0.1\n  lr_schedule: constant\n  seed: 0\n  precision: %s\n"
                "resources:\n  device: cpu\n",
                c.name, c.seq_len, c.d_model, c.layers, c.heads, steps, c.batch,
                troupe::to_string(precision));
  return buf;
}

double flops_per_token(const GptConfig& c, long long params) {
  return troupe::bench::gpt_flops_per_token(params, c.layers, c.d_model, c.seq_len);
}

using troupe::bench::median;
using troupe::bench::process_cpu_seconds;

std::string torch_script() { return std::string(TROUPE_SOURCE_DIR) + "/bench/torch_reference.py"; }

// Why a child left no figures: it did not start, a signal ended it, or it exited
// without them. The torch script says "unavailable=<why>" itself.
std::string child_failure(const ChildRun& r, const std::string& what) {
  const std::string unavailable = report_text(r.out, "unavailable", true);
  if (!unavailable.empty()) return unavailable;
  if (!r.started) return "cannot run " + what + ": " + std::strerror(r.exec_errno);
  if (r.signal != 0)
    return what + " ended by signal " + std::to_string(r.signal) + " (" + strsignal(r.signal) + ")";
  return what + " exited with status " + std::to_string(r.exit_code) + " and no figures";
}

// ---------------------------------------------------------------- one troupe row, in its own process

// The hidden --one mode: trains config c in `precision` and prints one line of
// key=value words, or "error=<message>" when the engine refuses the job.
int run_one(const GptConfig& c, Precision precision, int steps, int warmup, const std::string& probe_spec) {
  try {
    const troupe::JobSpec spec =
        troupe::parse_spec(spec_yaml(c, steps + warmup, precision), "<train_throughput>");
    troupe::Engine engine(spec, troupe::EngineAssignment{});
    const long long n_params = engine.num_params();
    const double tokens = double(c.batch) * c.seq_len;
    const double step_gflop = tokens * flops_per_token(c, n_params) * 1e-9;

    for (int i = 0; i < warmup; ++i) engine.step();
    const long engine_rss_kib = warmup > 0 ? troupe::bench::self_peak_rss_kib() : 0;
    troupe::bench::Peak ceiling;
    std::unique_ptr<troupe::bench::PeakProbe> probe;
    if (troupe::bench::peak_from_id(probe_spec, &ceiling))
      probe = std::make_unique<troupe::bench::PeakProbe>(ceiling);
    std::vector<double> wall, cpu, paired;
    double loss = 0.0;
    double before = probe ? probe->sample(kProbeSeconds) : 0.0;
    for (int i = 0; i < steps; ++i) {
      const double c0 = process_cpu_seconds();
      const auto w0 = std::chrono::steady_clock::now();
      loss = engine.step().loss;
      wall.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count());
      cpu.push_back(process_cpu_seconds() - c0);
      if (probe) {
        const double after = probe->sample(kProbeSeconds);
        paired.push_back(step_gflop / cpu.back() / (0.5 * (before + after)));
        before = after;
      }
    }
    std::printf(
        "tokens_per_s=%.3f tokens_per_cpu_s=%.3f params=%lld mfu_paired=%.6f last_loss=%.6f "
        "peak_rss_kib=%ld\n",
        tokens / median(wall), tokens / median(cpu), n_params, probe ? median(paired) : kNaN, loss,
        engine_rss_kib > 0 ? engine_rss_kib : troupe::bench::self_peak_rss_kib());
  } catch (const std::exception& e) {
    std::string what = e.what();
    std::replace(what.begin(), what.end(), '\n', ' ');
    std::printf("error=%s\n", what.c_str());
  }
  return 0;
}

// ---------------------------------------------------------------- rows of the table

struct Row {
  std::string label;  // "troupe bf16", "pytorch bf16 autocast"
  std::string key;    // prefix of its key=value words: "bf16", "torch_fp32"
  std::string why;    // why it has no figures; empty when it has
  Rates rate;
  double mfu_wall = kNaN, mfu_cpu = kNaN, mfu_paired = kNaN;
  double loss = kNaN;
  double rss_mib = kNaN;
  long long params = 0;
  bool ok() const { return why.empty(); }
};

// A row from a child's report (tokens_per_s=... tokens_per_cpu_s=... params=...).
Row training_row(std::string label, std::string key, const ChildRun& r, const std::string& what,
                 const GptConfig& c, double peak) {
  Row row;
  row.label = std::move(label);
  row.key = std::move(key);
  row.why = report_text(r.out, "error", true);
  row.rate = {report_value(r.out, "tokens_per_s"), report_value(r.out, "tokens_per_cpu_s")};
  if (row.why.empty() && !(row.rate.cpu > 0)) row.why = child_failure(r, what);
  if (!row.ok()) return row;
  row.params = (long long)report_value(r.out, "params");
  const double gflop_per_token = flops_per_token(c, row.params) * 1e-9;
  row.mfu_wall = row.rate.wall * gflop_per_token / peak;
  row.mfu_cpu = row.rate.cpu * gflop_per_token / peak;
  row.mfu_paired = report_value(r.out, "mfu_paired");
  row.loss = report_value(r.out, "last_loss");
  const double own = report_value(r.out, "peak_rss_kib");
  row.rss_mib = (own > 0 ? own : double(r.max_rss_kib)) / 1024.0;
  return row;
}

Row troupe_row(const std::string& self, const GptConfig& c, Precision precision, int steps, int warmup,
               const std::string& probe, double peak) {
  std::vector<std::string> argv = {self, std::string("--one=") + c.name + ":" + troupe::to_string(precision),
                                   std::to_string(steps), std::to_string(warmup)};
  if (!probe.empty()) argv.push_back("--probe=" + probe);
  const ChildRun r = troupe::bench::run_child(argv, false);
  return training_row(std::string("troupe ") + troupe::to_string(precision), troupe::to_string(precision), r,
                      "the measuring child", c, peak);
}

Row torch_row(const GptConfig& c, bool autocast, int steps, int warmup, troupe::bench::PeakProbe* probe,
              double peak) {
  std::vector<std::string> argv = {troupe::bench::python(),
                                   torch_script(),
                                   "--layers",
                                   std::to_string(c.layers),
                                   "--d-model",
                                   std::to_string(c.d_model),
                                   "--heads",
                                   std::to_string(c.heads),
                                   "--seq-len",
                                   std::to_string(c.seq_len),
                                   "--batch",
                                   std::to_string(c.batch),
                                   "--steps",
                                   std::to_string(steps),
                                   "--warmup",
                                   std::to_string(warmup),
                                   "--threads",
                                   "1"};
  if (autocast) argv.insert(argv.end(), {"--autocast", "bf16"});
  const double p0 = probe ? probe->sample(kProbeSeconds) : 0.0;
  const ChildRun r = troupe::bench::run_child(argv, true);
  const double p1 = probe ? probe->sample(kProbeSeconds) : 0.0;
  Row row = training_row(autocast ? "pytorch bf16 autocast" : "pytorch fp32",
                         autocast ? "torch_bf16" : "torch_fp32", r,
                         troupe::bench::python() + " " + torch_script(), c, peak);
  // Its rate as a fraction of the ceiling measured next to it.
  if (row.ok() && probe) row.mfu_paired = row.mfu_cpu * peak / (0.5 * (p0 + p1));
  return row;
}

std::string percent(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100 * v);
  return std::isnan(v) ? "n/a" : buf;
}

void print_row(const Row& r) {
  if (!r.ok()) {
    std::printf("  %-22s n/a (%s)\n", r.label.c_str(), r.why.c_str());
  } else {
    std::printf("  %-22s %10.0f %10.0f %9s %8s %8s %7.0f MiB %7.3f\n", r.label.c_str(), r.rate.wall,
                r.rate.cpu, percent(r.mfu_wall).c_str(), percent(r.mfu_cpu).c_str(),
                percent(r.mfu_paired).c_str(), r.rss_mib, r.loss);
  }
  std::fflush(stdout);
}

// "wall=1.23 cpu=1.25" for a / b, or n/a.
std::string ratio_text(const Row& a, const Row& b) {
  if (!a.ok() || !b.ok()) return "n/a";
  char buf[64];
  std::snprintf(buf, sizeof buf, "wall=%.2f cpu=%.2f", a.rate.wall / b.rate.wall, a.rate.cpu / b.rate.cpu);
  return buf;
}

// " key=value" with value printed by fmt, or " key=n/a".
std::string kv(const std::string& key, bool ok, const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return " " + key + "=" + (ok && !std::isnan(v) ? buf : "n/a");
}

// <key>_tokens_per_s_<C>=... <key>_tokens_per_cpu_s_<C>=... <key>_mfu_<C>=... <key>_mfu_cpu_<C>=...
// <key>_mfu_paired_<C>=... <key>_peak_rss_mib_<C>=...
void print_row_kv(const Row& r, const char* config) {
  const std::string c = std::string("_") + config;
  std::string line = kv(r.key + "_tokens_per_s" + c, r.ok(), "%.1f", r.rate.wall) +
                     kv(r.key + "_tokens_per_cpu_s" + c, r.ok(), "%.1f", r.rate.cpu) +
                     kv(r.key + "_mfu" + c, r.ok(), "%.4f", r.mfu_wall) +
                     kv(r.key + "_mfu_cpu" + c, r.ok(), "%.4f", r.mfu_cpu) +
                     kv(r.key + "_mfu_paired" + c, r.ok(), "%.4f", r.mfu_paired) +
                     kv(r.key + "_peak_rss_mib" + c, r.ok(), "%.1f", r.rss_mib);
  std::printf("%s\n", line.c_str() + 1);
}

// The ratios under the table. rows: troupe fp32, troupe's 16-bit rows (up to
// n_troupe), then PyTorch fp32 and, when torch_bf16, PyTorch bf16 autocast.
void print_ratios(const std::vector<Row>& rows, size_t n_troupe, bool torch_bf16,
                  const double half_ceiling[2], double peak) {
  const Row& fp32 = rows[0];
  if (rows.size() > n_troupe) {
    const Row& torch_fp32 = rows[n_troupe];
    std::printf("  troupe/pytorch fp32: %s", ratio_text(fp32, torch_fp32).c_str());
    if (fp32.ok() && torch_fp32.ok() && !std::isnan(fp32.mfu_paired) && !std::isnan(torch_fp32.mfu_paired))
      std::printf(" paired=%.2f", fp32.mfu_paired / torch_fp32.mfu_paired);
    std::printf("\n");
  }
  for (size_t i = 1; i < n_troupe; ++i) {
    const Row& r = rows[i];
    std::printf("  %s/fp32: %s", r.label.c_str(), ratio_text(r, fp32).c_str());
    if (torch_bf16)
      std::printf("   %s/pytorch bf16: %s", r.label.c_str(), ratio_text(r, rows.back()).c_str());
    const double ceiling = half_ceiling[r.key == "bf16" ? 0 : 1];
    if (r.ok() && ceiling > 0)
      std::printf("   MFU cpu against the best 16-bit gemm_half figure above (%.1f GFLOP/s): %.1f%%", ceiling,
                  100 * r.mfu_cpu * peak / ceiling);
    std::printf("\n");
  }
}

// The machine-readable lines of one config (rows as print_ratios).
void print_config_kv(const char* config, const std::vector<Row>& rows, size_t n_troupe, bool torch_bf16) {
  const Row& fp32 = rows[0];
  // The line of old, for scripts and the README: troupe fp32.
  std::printf(
      "config_%s%s%s%s%s%s\n", config, kv("tokens_per_s", fp32.ok(), "%.1f", fp32.rate.wall).c_str(),
      kv("tokens_per_cpu_s", fp32.ok(), "%.1f", fp32.rate.cpu).c_str(),
      kv("mfu", fp32.ok(), "%.4f", fp32.mfu_wall).c_str(),
      kv("mfu_cpu", fp32.ok(), "%.4f", fp32.mfu_cpu).c_str(),
      kv("mfu_paired", fp32.ok(), "%.4f", std::isnan(fp32.mfu_paired) ? 0.0 : fp32.mfu_paired).c_str());
  for (const Row& r : rows) print_row_kv(r, config);
  // <p>_over_fp32_<C>=<cpu-time ratio> <p>_over_fp32_wall_<C>=..., and the same over PyTorch bf16.
  for (size_t i = 1; i < n_troupe; ++i) {
    const Row& r = rows[i];
    auto ratio = [&](const std::string& name, const Row& b) {
      const bool ok = r.ok() && b.ok();
      return kv(r.key + "_over_" + name + "_" + config, ok, "%.3f", r.rate.cpu / b.rate.cpu) +
             kv(r.key + "_over_" + name + "_wall_" + config, ok, "%.3f", r.rate.wall / b.rate.wall);
    };
    const std::string line = ratio("fp32", fp32) + (torch_bf16 ? ratio("torch_bf16", rows.back()) : "");
    std::printf("%s\n", line.c_str() + 1);
  }
}

// ---------------------------------------------------------------- the 16-bit GEMM block

// Two of gemm_shapes(): a square reference and config A's MLP forward, x(2048,256) . W(1024,256)^T.
const GemmShape kHalfShapes[] = {{"square 2048", false, false, 2048, 2048, 2048},
                                 {"fwd fc x.W^T", false, true, 2048, 1024, 256}};
const char* const kHalfShapeKeys[] = {"sq2048", "fc"};

struct GemmRow {
  std::string label, key, why;
  std::vector<double> gflops;  // median per kHalfShapes entry
};

GemmRow gemm_row(std::string label, std::string key) {
  GemmRow g;
  g.label = std::move(label);
  g.key = std::move(key);
  return g;
}

void print_gemm_row(const GemmRow& g) {
  if (!g.why.empty()) {
    std::printf("  %-38s n/a (%s)\n", g.label.c_str(), g.why.c_str());
  } else {
    std::printf("  %-38s", g.label.c_str());
    for (double v : g.gflops) std::printf(" %14.1f", v);
    std::printf("\n");
  }
  std::fflush(stdout);
}

// Troupe's rows for dt (bf16 or f16), one per gemm_half backend that takes dt;
// raises *ceiling to the best of their figures.
std::vector<GemmRow> troupe_half_rows(troupe::DType dt, const char* name, double* ceiling) {
  std::vector<GemmRow> rows;
  for (kc::HalfGemmBackend b : {kc::HalfGemmBackend::avx512bf16, kc::HalfGemmBackend::convert}) {
    const bool vdpbf16ps = b == kc::HalfGemmBackend::avx512bf16;
    if (vdpbf16ps && dt != troupe::DType::bf16) continue;
    const std::string backend = kc::half_gemm_backend_name(b);
    GemmRow g = gemm_row(std::string("troupe ") + name + " gemm_half (" + backend + ")",
                         std::string("troupe_") + name + "_" + backend);
    if (!kc::half_gemm_backend_available(b, dt))
      g.why = vdpbf16ps ? "no AVX512-BF16 on this CPU" : "not available on this CPU";
    else
      for (const GemmShape& s : kHalfShapes) {
        g.gflops.push_back(troupe::bench::half_gemm_gflops({b}, dt, s, 3, 0.1)[0].median);
        *ceiling = std::max(*ceiling, g.gflops.back());
      }
    rows.push_back(g);
  }
  return rows;
}

// PyTorch's torch.mm in fp32 and bf16 on kHalfShapes (torch_reference.py --mm).
std::vector<GemmRow> torch_mm_rows() {
  std::string shapes;
  for (const GemmShape& s : kHalfShapes)
    shapes += (shapes.empty() ? "" : ",") + std::to_string(s.M) + "x" + std::to_string(s.N) + "x" +
              std::to_string(s.K) + ":" + (s.ta ? "T" : "N") + (s.tb ? "T" : "N");
  const ChildRun r = troupe::bench::run_child(
      {troupe::bench::python(), torch_script(), "--mm", "--mm-shapes", shapes, "--threads", "1"}, true);
  std::vector<GemmRow> rows;
  for (const char* dt : {"fp32", "bf16"}) {
    GemmRow g = gemm_row(std::string("pytorch ") + dt + " torch.mm", std::string("torch_") + dt);
    for (const GemmShape& s : kHalfShapes) {
      char line[128];
      std::snprintf(line, sizeof line, "mm dtype=%s M=%d N=%d K=%d", dt, s.M, s.N, s.K);
      const size_t at = r.out.find(line);
      const double v = at == std::string::npos
                           ? kNaN
                           : report_value(r.out.substr(at, r.out.find('\n', at) - at), "gflops");
      if (std::isnan(v)) {
        g.why = child_failure(r, troupe::bench::python() + " " + torch_script() + " --mm");
        break;
      }
      g.gflops.push_back(v);
    }
    rows.push_back(g);
  }
  return rows;
}

// Prints the block; *bf16_ceiling and *fp16_ceiling: the best troupe gemm_half
// figure of each type timed (0 where none).
void half_gemm_block(bool bf16, bool fp16, bool run_torch, double* bf16_ceiling, double* fp16_ceiling) {
  std::printf("16-bit GEMM, 1 thread, GFLOP/s (median; thread CPU time, PyTorch: process CPU time)\n");
  std::printf("  %-38s", "");
  for (const GemmShape& s : kHalfShapes) std::printf(" %14s", s.name.c_str());
  std::printf("\n");
  std::vector<GemmRow> rows;
  const kc::GemmBackend fp32_backend = kc::gemm_default_backend();
  GemmRow fp32 =
      gemm_row(std::string("troupe fp32 gemm (") + kc::gemm_backend_name(fp32_backend) + ")", "troupe_fp32");
  for (const GemmShape& s : kHalfShapes)
    fp32.gflops.push_back(troupe::bench::gemm_gflops({fp32_backend}, s, 3, 0.1)[0].median);
  print_gemm_row(fp32);
  rows.push_back(fp32);
  auto add = [&](std::vector<GemmRow> more) {
    for (const GemmRow& g : more) {
      print_gemm_row(g);
      rows.push_back(g);
    }
  };
  if (bf16) add(troupe_half_rows(troupe::DType::bf16, "bf16", bf16_ceiling));
  if (fp16) add(troupe_half_rows(troupe::DType::f16, "fp16", fp16_ceiling));
  if (run_torch) add(torch_mm_rows());
  for (const GemmRow& g : rows) {
    std::string line;
    for (size_t i = 0; i < std::size(kHalfShapes); ++i)
      line += kv("gemm_gflops_" + g.key + "_" + kHalfShapeKeys[i], g.why.empty(), "%.2f",
                 i < g.gflops.size() ? g.gflops[i] : kNaN);
    std::printf("%s\n", line.c_str() + 1);
  }
  if (bf16)
    std::printf("%s\n", kv("half_peak_gflops_bf16", *bf16_ceiling > 0, "%.1f", *bf16_ceiling).c_str() + 1);
  if (fp16)
    std::printf("%s\n", kv("half_peak_gflops_fp16", *fp16_ceiling > 0, "%.1f", *fp16_ceiling).c_str() + 1);
  std::printf("\n");
}

bool parse_precision(const std::string& s, Precision* out) {
  for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16})
    if (s == troupe::to_string(p)) {
      *out = p;
      return true;
    }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 10, warmup = 2;
  bool run_torch = true;
  double peak = 0.0;
  std::unique_ptr<troupe::bench::PeakProbe> probe;
  std::string only, precision_arg = "fp32", one, probe_spec;
  std::vector<std::string> pos;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--no-torch") == 0)
      run_torch = false;
    else if (std::strncmp(argv[i], "--peak=", 7) == 0)
      peak = std::atof(argv[i] + 7);
    else if (std::strncmp(argv[i], "--config=", 9) == 0)
      only = argv[i] + 9;
    else if (std::strncmp(argv[i], "--precision=", 12) == 0)
      precision_arg = argv[i] + 12;
    else if (std::strcmp(argv[i], "--precision") == 0 && i + 1 < argc)
      precision_arg = argv[++i];
    else if (std::strncmp(argv[i], "--one=", 6) == 0)
      one = argv[i] + 6;
    else if (std::strncmp(argv[i], "--probe=", 8) == 0)
      probe_spec = argv[i] + 8;
    else
      pos.push_back(argv[i]);
  }
  if (pos.size() > 0) steps = std::max(1, std::atoi(pos[0].c_str()));
  if (pos.size() > 1) warmup = std::max(0, std::atoi(pos[1].c_str()));

  if (!one.empty()) {
    Precision p = Precision::fp32;
    for (const GptConfig& c : kConfigs)
      if (one.size() > 2 && one.compare(0, 2, std::string(c.name) + ":") == 0 &&
          parse_precision(one.substr(2), &p))
        return run_one(c, p, steps, warmup, probe_spec);
    std::fprintf(stderr, "train_throughput: --one=%s: expected <A|B>:<fp32|bf16|fp16>\n", one.c_str());
    return 2;
  }

  // troupe runs fp32 and each requested 16-bit precision; PyTorch adds its bf16
  // autocast row whenever a 16-bit one is requested (its CPU autocast has no fp16).
  std::vector<Precision> precisions = {Precision::fp32};
  Precision requested = Precision::fp32;
  if (precision_arg == "all")
    precisions = {Precision::fp32, Precision::bf16, Precision::fp16};
  else if (parse_precision(precision_arg, &requested)) {
    if (requested != Precision::fp32) precisions.push_back(requested);
  } else {
    std::fprintf(stderr, "train_throughput: --precision=%s: expected fp32, bf16, fp16 or all\n",
                 precision_arg.c_str());
    return 2;
  }
  const bool with_bf16 = std::count(precisions.begin(), precisions.end(), Precision::bf16) > 0;
  const bool with_fp16 = std::count(precisions.begin(), precisions.end(), Precision::fp16) > 0;
  const bool half = with_bf16 || with_fp16;

  std::printf("gemm backend: %s\n", kc::gemm_backend());
  std::string child_probe;
  if (peak <= 0.0) {
    std::printf("measuring the single-core GEMM ceiling...\n");
    std::fflush(stdout);
    const troupe::bench::Peak p = troupe::bench::measure_peak(3);
    peak = p.gflops;
    probe = std::make_unique<troupe::bench::PeakProbe>(p);
    child_probe = troupe::bench::peak_id(p);
    std::printf("peak_gflops=%.1f (best median over backends and shapes, thread CPU time: %s, %s)\n\n", peak,
                kc::gemm_backend_name(p.backend), p.shape.name.c_str());
  } else {
    std::printf("peak_gflops=%.1f (given)\n\n", peak);
  }
  double half_ceiling[2] = {0.0, 0.0};  // bf16, fp16: best troupe gemm_half median
  if (half) half_gemm_block(with_bf16, with_fp16, run_torch, &half_ceiling[0], &half_ceiling[1]);

  const std::string self = troupe::bench::self_executable(argv[0]);
  for (const GptConfig& c : kConfigs) {
    if (!only.empty() && only != c.name) continue;
    std::vector<Row> rows;
    for (Precision p : precisions) {
      rows.push_back(troupe_row(self, c, p, steps, warmup, child_probe, peak));
      if (rows.size() == 1) {
        const long long n = rows[0].params;
        std::printf("config %s: L=%d D=%d H=%d T=%d B=%d", c.name, c.layers, c.d_model, c.heads, c.seq_len,
                    c.batch);
        if (n > 0)
          std::printf(" params=%lld (no wpe %lld) flops/token=%.3g", n, n - (long long)c.seq_len * c.d_model,
                      flops_per_token(c, n));
        std::printf("\n");
        std::printf("  %-22s %10s %10s %9s %8s %8s %11s %7s\n", "1 thread", "tok/s wall", "tok/s cpu",
                    "MFU wall", "MFU cpu", "paired", "peak RSS", "loss");
      }
      print_row(rows.back());
    }
    const size_t n_troupe = rows.size();
    const bool torch_bf16 = run_torch && half;
    if (run_torch) {
      rows.push_back(torch_row(c, false, std::max(3, steps / 2), std::max(1, warmup), probe.get(), peak));
      print_row(rows.back());
    }
    if (torch_bf16) {
      rows.push_back(torch_row(c, true, std::max(2, steps / 4), 1, probe.get(), peak));
      print_row(rows.back());
    }
    print_ratios(rows, n_troupe, torch_bf16, half_ceiling, peak);
    print_config_kv(c.name, rows, n_troupe, torch_bf16);
    std::printf("\n");
    std::fflush(stdout);
  }
  return 0;
}

#include "plan/fit.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "plan/cost_model.hpp"
#include "plan/hardware.hpp"

namespace troupe::plan {

namespace {

// "3.4 PB", "141 GB", "812 MB": decimal, three significant digits, for a message.
std::string human_bytes(double b) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB", "PB", "EB", "ZB"};
  int u = 0;
  while (b >= 1000 && u < 7) {
    b /= 1000;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, b < 10 ? "%.2f %s" : b < 100 ? "%.1f %s" : "%.0f %s", b, units[u]);
  return buf;
}

std::string with_commas(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.0f", x);
  std::string s = buf, out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i > 0 && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return out;
}

}  // namespace

FitFloor fit_floor(const JobSpec& spec) {
  FitFloor f;
  const ModelShape m = model_shape(spec);
  f.params = model_params(m);
  const ParallelSpec& p = spec.parallel;
  f.pipeline = p.pipeline > 0 ? p.pipeline : std::max(1, std::min(m.n_layers, kMaxPipelineParallel));
  f.tensor = p.tensor > 0 ? p.tensor : kMaxTensorParallel;
  f.data = p.data > 0 ? p.data : kMaxDataParallel;
  const TrainSpec& t = spec.train;
  const double masters = 4 + (t.precision == Precision::fp32 ? 0 : 2);  // + the 16-bit copy
  const double grads = t.zero >= 2 ? 4.0 / f.data : 4.0;
  const double moments = t.offload == Offload::optimizer ? 0.0 : t.zero >= 1 ? 8.0 / f.data : 8.0;
  // Offloaded, the f32 masters live on the host too; the 16-bit copy (or the f32 weights the
  // kernels read) stays on the device.
  const double weights = t.offload == Offload::optimizer ? (t.precision == Precision::fp32 ? 4 : 2) : masters;
  f.bytes_per_param = weights + grads + moments;
  f.bytes = f.params / (double(f.pipeline) * f.tensor) * f.bytes_per_param;
  return f;
}

uint64_t largest_known_memory(const JobSpec& spec, std::string* name) {
  std::vector<std::string> names = builtin_hardware_names();
  const std::string dir = hardware_dir();
  std::error_code ec;
  if (!dir.empty())
    for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string file = it->path().filename().string();
      if (file.size() > 5 && file.compare(file.size() - 5, 5, ".yaml") == 0)
        names.push_back(file.substr(0, file.size() - 5));
    }
  if (!spec.resources.hardware.empty()) names.push_back(spec.resources.hardware);
  uint64_t best = 0;
  for (const auto& n : names) {
    if (!valid_hardware_name(n)) continue;
    try {
      const HardwareProfile hw = find_hardware(n);
      if (hw.memory > best) {
        best = hw.memory;
        *name = "hardware profile " + n;
      }
    } catch (const std::exception&) {
      // A profile that does not load is no device anyone has.
    }
  }
  if (spec.resources.memory_per_device > best) {
    best = spec.resources.memory_per_device;
    *name = "resources.memory_per_device";
  }
  return best;
}

void require_fits_hardware(const JobSpec& spec) {
  const FitFloor f = fit_floor(spec);
  std::string largest_name;
  const uint64_t largest = largest_known_memory(spec, &largest_name);
  if (largest == 0 || f.bytes <= double(largest)) return;
  auto at = spec.positions.find("model");
  const int line = at == spec.positions.end() ? 0 : at->second.line;
  const int col = at == spec.positions.end() ? 0 : at->second.col;
  const bool auto_layout = spec.parallel.pipeline == 0 || spec.parallel.tensor == 0;
  throw SpecError({Diagnostic{
      spec.source_file, line, col,
      "the model has " + with_commas(f.params) + " parameters: split over " + std::to_string(f.pipeline) +
          " pipeline stage(s) x " + std::to_string(f.tensor) + " tensor shard(s)" +
          (auto_layout ? " (the most this spec allows)" : "") + ", each device holds at least " +
          human_bytes(f.bytes) + " of weights, gradients and optimizer state (" +
          human_bytes(f.bytes_per_param) + " per parameter), more than the " + human_bytes(double(largest)) +
          " of the largest device troupe knows (" + largest_name + ")",
      "a smaller model (model.d_model, model.n_layers), more pipeline stages or tensor shards, ZeRO "
      "(train.zero) or train.offload: optimizer; `troupe plan` shows the memory of each layout"}});
}

}  // namespace troupe::plan

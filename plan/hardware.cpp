#include "plan/hardware.hpp"

#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <limits>
#include <map>
#include <optional>
#include <sstream>

#include "core/error.hpp"
#include "core/hostile_file.hpp"
#include "core/units.hpp"
#include "plan/hardware_builtin.hpp"

namespace troupe::plan {

const char* gemm_op_name(GemmOp op) {
  switch (op) {
    case GemmOp::nt:
      return "nt";
    case GemmOp::nn:
      return "nn";
    case GemmOp::tn:
      return "tn";
  }
  return "?";
}

double LinkCost::two_ranks(double bytes, double steps, double factor) const {
  if (table.empty()) return steps * latency + factor * bytes / bandwidth;
  if (bytes <= table.front().first) return table.front().second;
  if (bytes >= table.back().first) return table.back().second * bytes / table.back().first;
  size_t i = 1;
  while (table[i].first < bytes) ++i;
  const auto& [x0, y0] = table[i - 1];
  const auto& [x1, y1] = table[i];
  const double a = std::log(bytes / x0) / std::log(x1 / x0);
  return std::exp(std::log(y0) + a * std::log(y1 / y0));
}

const char* to_string(ProfileDevice d) {
  switch (d) {
    case ProfileDevice::cpu:
      return "cpu";
    case ProfileDevice::cuda:
      return "cuda";
    case ProfileDevice::ipu:
      return "ipu";
  }
  return "?";
}

double HardwareProfile::peak(DType dt) const {
  if (dt == DType::bf16) return peak_bf16;
  if (dt == DType::f16) return peak_f16;
  return peak_f32;
}

namespace {

constexpr uint64_t kMaxProfileBytes = 1 << 20;
constexpr size_t kMaxGemmPoints = 4096;

// The walk over one profile document: every problem becomes a Diagnostic at the
// node's position; a value that is rejected keeps its default.
class Reader {
 public:
  Reader(const std::string& file, std::vector<Diagnostic>& out) : file_(file), out_(out) {}

  void error(const YAML::Node& at, std::string message, std::string hint) {
    const YAML::Mark m = at.Mark();
    out_.push_back(Diagnostic{file_, m.line >= 0 ? m.line + 1 : 0, m.line >= 0 ? m.column + 1 : 0,
                              std::move(message), std::move(hint)});
  }

  // Keys of `map` that `known` does not list, and duplicates, are errors. False when `map`
  // is not a mapping (then nothing in it is read).
  bool mapping(const YAML::Node& map, const std::string& path, const std::vector<std::string>& known) {
    if (!map.IsMap()) {
      error(map, "'" + path + "' must be a mapping of keys to values",
            "see docs/planner.md#hardware-profiles");
      return false;
    }
    std::map<std::string, int> seen;
    for (auto it = map.begin(); it != map.end(); ++it) {
      const std::string key = it->first.IsScalar() ? it->first.Scalar() : "";
      const std::string full = path.empty() ? key : path + "." + key;
      if (std::find(known.begin(), known.end(), key) == known.end()) {
        std::string list;
        for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
        error(it->first, "unknown key '" + full + "'", "the keys here are " + list);
      } else if (seen[key]++) {
        error(it->first, "duplicate key '" + full + "'", "give each key once");
      }
    }
    return true;
  }

  // A number (plain, or with SI e-notation) in [lo, hi].
  void number(const YAML::Node& map, const std::string& path, const std::string& key, double& out, double lo,
              double hi, bool required = false) {
    const YAML::Node v = map[key];
    if (!v.IsDefined() || v.IsNull()) {
      if (required) error(map, "'" + path + key + "' is missing", "see docs/planner.md#hardware-profiles");
      return;
    }
    double x = std::nan("");
    if (v.IsScalar()) {
      const std::string& s = v.Scalar();
      char* end = nullptr;
      x = std::strtod(s.c_str(), &end);
      if (s.empty() || end != s.c_str() + s.size()) x = std::nan("");
    }
    if (!std::isfinite(x) || x < lo || x > hi) {
      std::ostringstream range;
      range << "a number in [" << lo << ", " << hi << "]";
      error(
          v,
          "'" + path + key + "' must be " + range.str() + ", got '" + (v.IsScalar() ? v.Scalar() : "?") + "'",
          "write a plain number in SI units (seconds, bytes, bytes/s, FLOP/s), e.g. 4.8e12");
      return;
    }
    out = x;
  }

  void integer(const YAML::Node& map, const std::string& path, const std::string& key, int64_t& out,
               int64_t lo, int64_t hi, bool required = false) {
    double x = static_cast<double>(out);
    const size_t before = out_.size();
    number(map, path, key, x, double(lo), double(hi), required);
    if (out_.size() != before) return;
    if (x != std::floor(x)) {
      error(map[key], "'" + path + key + "' must be a whole number", "");
      return;
    }
    out = static_cast<int64_t>(x);
  }

  void size(const YAML::Node& map, const std::string& path, const std::string& key, uint64_t& out,
            bool required = false) {
    const YAML::Node v = map[key];
    if (!v.IsDefined() || v.IsNull()) {
      if (required) error(map, "'" + path + key + "' is missing", "e.g. " + key + ": 80GiB");
      return;
    }
    std::optional<uint64_t> b;
    if (v.IsScalar()) b = parse_size(v.Scalar());
    if (!b) {
      // A number in e-notation ("8.0e10") is a size too.
      double x = std::nan("");
      if (v.IsScalar()) {
        char* end = nullptr;
        x = std::strtod(v.Scalar().c_str(), &end);
        if (end != v.Scalar().c_str() + v.Scalar().size()) x = std::nan("");
      }
      if (std::isfinite(x) && x >= 0 && x < 1e18) b = static_cast<uint64_t>(x);
    }
    if (!b) {
      error(v, "'" + path + key + "' must be a size, got '" + (v.IsScalar() ? v.Scalar() : "?") + "'",
            "e.g. 80GiB, 141GB or 85899345920 (bytes)");
      return;
    }
    out = *b;
  }

  void text(const YAML::Node& map, const std::string& path, const std::string& key, std::string& out,
            bool required = false) {
    const YAML::Node v = map[key];
    if (!v.IsDefined() || v.IsNull()) {
      if (required) error(map, "'" + path + key + "' is missing", "");
      return;
    }
    if (!v.IsScalar() || v.Scalar().size() > 4096) {
      error(v, "'" + path + key + "' must be a line of text (at most 4096 characters)", "");
      return;
    }
    out = v.Scalar();
  }

  template <class E>
  void choice(const YAML::Node& map, const std::string& path, const std::string& key, E& out,
              const std::vector<std::pair<std::string, E>>& names, bool required = false) {
    const YAML::Node v = map[key];
    if (!v.IsDefined() || v.IsNull()) {
      if (required) error(map, "'" + path + key + "' is missing", "");
      return;
    }
    std::string list;
    for (const auto& [n, e] : names) {
      if (v.IsScalar() && v.Scalar() == n) {
        out = e;
        return;
      }
      list += (list.empty() ? "" : ", ") + n;
    }
    error(v,
          "'" + path + key + "' must be one of " + list + ", got '" + (v.IsScalar() ? v.Scalar() : "?") + "'",
          "");
  }

 private:
  const std::string& file_;
  std::vector<Diagnostic>& out_;
};

const std::vector<std::pair<std::string, DType>> kDTypes = {
    {"fp32", DType::f32}, {"bf16", DType::bf16}, {"fp16", DType::f16}};
const std::vector<std::pair<std::string, GemmOp>> kOps = {
    {"nt", GemmOp::nt}, {"nn", GemmOp::nn}, {"tn", GemmOp::tn}};

constexpr double kBig = 1e18;  // no device of this decade moves or computes more per second

// [[bytes, seconds], ...], bytes ascending: a measured table of a link or collective.
void read_table(Reader& r, const YAML::Node& n, const std::string& path, LinkCost& out) {
  const YAML::Node t = n["table"];
  if (!t.IsDefined() || t.IsNull()) return;
  if (!t.IsSequence() || t.size() > 256) {
    r.error(t, "'" + path + ".table' must be a list of at most 256 [bytes, seconds] pairs", "");
    return;
  }
  for (size_t i = 0; i < t.size(); ++i) {
    const YAML::Node e = t[i];
    double bytes = -1, seconds = -1;
    if (e.IsSequence() && e.size() == 2 && e[0].IsScalar() && e[1].IsScalar()) {
      char* end = nullptr;
      bytes = std::strtod(e[0].Scalar().c_str(), &end);
      if (end != e[0].Scalar().c_str() + e[0].Scalar().size()) bytes = -1;
      seconds = std::strtod(e[1].Scalar().c_str(), &end);
      if (end != e[1].Scalar().c_str() + e[1].Scalar().size()) seconds = -1;
    }
    const bool ascending = out.table.empty() || bytes > out.table.back().first;
    if (!(std::isfinite(bytes) && std::isfinite(seconds) && bytes >= 1 && bytes < kBig && seconds > 0 &&
          seconds < 3600 && ascending)) {
      r.error(e,
              "'" + path + ".table[" + std::to_string(i) +
                  "]' must be [bytes, seconds], bytes >= 1 and above the entry before, seconds > 0",
              "e.g. [4096, 2.5e-5]");
      return;
    }
    out.table.emplace_back(bytes, seconds);
  }
}

void read_link(Reader& r, const YAML::Node& n, const std::string& path, LinkCost& out) {
  if (!r.mapping(n, path, {"latency", "bandwidth", "table"})) return;
  r.number(n, path + ".", "latency", out.latency, 0, 10);
  r.number(n, path + ".", "bandwidth", out.bandwidth, 1, kBig, true);
  read_table(r, n, path, out);
}

void read_tier(Reader& r, const YAML::Node& n, const std::string& path, NetworkTier& out) {
  if (!r.mapping(n, path, {"latency", "bandwidth", "table", "allreduce", "allgather", "reduce_scatter"}))
    return;
  r.number(n, path + ".", "latency", out.link.latency, 0, 10);
  r.number(n, path + ".", "bandwidth", out.link.bandwidth, 1, kBig, true);
  read_table(r, n, path, out.link);
  if (n["allreduce"].IsDefined()) read_link(r, n["allreduce"], path + ".allreduce", out.allreduce);
  if (n["allgather"].IsDefined()) read_link(r, n["allgather"], path + ".allgather", out.allgather);
  if (n["reduce_scatter"].IsDefined())
    read_link(r, n["reduce_scatter"], path + ".reduce_scatter", out.reduce_scatter);
}

std::string num(double v) {
  std::ostringstream os;
  os << std::setprecision(std::numeric_limits<double>::max_digits10) << v;
  // The shortest spelling that reads back exactly.
  for (int p = 1; p <= 17; ++p) {
    std::ostringstream t;
    t << std::setprecision(p) << v;
    if (std::strtod(t.str().c_str(), nullptr) == v) return t.str();
  }
  return os.str();
}

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    out += c;
  }
  return out + "\"";
}

std::string table_text(const LinkCost& l) {
  std::string s = "[";
  for (const auto& [b, t] : l.table) s += (s.size() > 1 ? ", [" : "[") + num(b) + ", " + num(t) + "]";
  return s + "]";
}

void write_link(std::ostringstream& y, const char* indent, const char* key, const LinkCost& l) {
  y << indent << key << ": {latency: " << num(l.latency) << ", bandwidth: " << num(l.bandwidth);
  if (!l.table.empty()) y << ", table: " << table_text(l);
  y << "}\n";
}

void write_tier(std::ostringstream& y, const char* key, const NetworkTier& t) {
  y << "  " << key << ":\n";
  y << "    latency: " << num(t.link.latency) << "\n";
  y << "    bandwidth: " << num(t.link.bandwidth) << "\n";
  if (!t.link.table.empty()) y << "    table: " << table_text(t.link) << "\n";
  if (t.allreduce.given()) write_link(y, "    ", "allreduce", t.allreduce);
  if (t.allgather.given()) write_link(y, "    ", "allgather", t.allgather);
  if (t.reduce_scatter.given()) write_link(y, "    ", "reduce_scatter", t.reduce_scatter);
}

}  // namespace

HardwareProfile parse_hardware(const std::string& text, const std::string& filename) {
  std::vector<Diagnostic> out;
  HardwareProfile p;
  p.source = filename;
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    out.push_back({filename, e.mark.line >= 0 ? e.mark.line + 1 : 0, e.mark.line >= 0 ? e.mark.column + 1 : 0,
                   "not valid YAML: " + e.msg,
                   "a hardware profile is a YAML mapping; see configs/hardware/"});
    throw SpecError(std::move(out));
  }
  Reader r(filename, out);
  if (!root.IsMap()) {
    out.push_back({filename, 0, 0, "a hardware profile is a YAML mapping of keys to values",
                   "see configs/hardware/h100-sxm.yaml"});
    throw SpecError(std::move(out));
  }
  r.mapping(root, "",
            {"name",
             "description",
             "device",
             "devices_per_node",
             "memory",
             "memory_bandwidth",
             "streaming",
             "peak_flops",
             "gemm",
             "attention_efficiency",
             "elementwise_efficiency",
             "norm_efficiency",
             "activation_efficiency",
             "kernel_overhead",
             "solo_speedup",
             "comm_overlap",
             "network",
             "checkpoint_bandwidth",
             "step_overhead",
             "process_memory",
             "allocator_slack"});
  r.text(root, "", "name", p.name, true);
  if (!p.name.empty() && !valid_hardware_name(p.name))
    r.error(root["name"], "'name' must be 1 to 64 letters, digits, '.', '_' or '-', got '" + p.name + "'",
            "e.g. name: h100-sxm");
  r.text(root, "", "description", p.description);
  r.choice(root, "", "device", p.device,
           {{"cpu", ProfileDevice::cpu}, {"cuda", ProfileDevice::cuda}, {"ipu", ProfileDevice::ipu}}, true);
  int64_t per_node = p.devices_per_node;
  r.integer(root, "", "devices_per_node", per_node, 1, 1 << 16, true);
  p.devices_per_node = static_cast<int>(per_node);
  r.size(root, "", "memory", p.memory, true);
  r.number(root, "", "memory_bandwidth", p.memory_bandwidth, 1, kBig, true);
  if (const YAML::Node st = root["streaming"];
      st.IsDefined() && r.mapping(st, "streaming", {"memory", "bandwidth"})) {
    r.size(st, "streaming.", "memory", p.streaming_memory, true);
    r.number(st, "streaming.", "bandwidth", p.streaming_bandwidth, 1, kBig, true);
  }
  if (const YAML::Node pf = root["peak_flops"]; !pf.IsDefined()) {
    r.error(root, "'peak_flops' is missing", "e.g. peak_flops: {fp32: 494e12, bf16: 989e12, fp16: 989e12}");
  } else if (r.mapping(pf, "peak_flops", {"fp32", "bf16", "fp16"})) {
    r.number(pf, "peak_flops.", "fp32", p.peak_f32, 1, kBig, true);
    r.number(pf, "peak_flops.", "bf16", p.peak_bf16, 1, kBig, true);
    r.number(pf, "peak_flops.", "fp16", p.peak_f16, 1, kBig, true);
  }
  if (const YAML::Node g = root["gemm"];
      g.IsDefined() && r.mapping(g, "gemm", {"efficiency", "half_flops", "table"})) {
    r.number(g, "gemm.", "efficiency", p.gemm_efficiency, 1e-3, 1);
    r.number(g, "gemm.", "half_flops", p.gemm_half_flops, 0, kBig);
    if (const YAML::Node t = g["table"]; t.IsDefined() && !t.IsNull()) {
      if (!t.IsSequence()) {
        r.error(t, "'gemm.table' must be a list of {m, n, k, op, dtype, flops}", "");
      } else if (t.size() > kMaxGemmPoints) {
        r.error(t,
                "'gemm.table' has " + std::to_string(t.size()) + " entries; at most " +
                    std::to_string(kMaxGemmPoints),
                "calibrate with fewer shapes");
      } else {
        for (size_t i = 0; i < t.size(); ++i) {
          const std::string path = "gemm.table[" + std::to_string(i) + "]";
          const YAML::Node e = t[i];
          if (!r.mapping(e, path, {"m", "n", "k", "op", "dtype", "flops"})) continue;
          GemmPoint pt;
          r.integer(e, path + ".", "m", pt.m, 1, int64_t(1) << 40, true);
          r.integer(e, path + ".", "n", pt.n, 1, int64_t(1) << 40, true);
          r.integer(e, path + ".", "k", pt.k, 1, int64_t(1) << 40, true);
          r.choice(e, path + ".", "op", pt.op, kOps, true);
          r.choice(e, path + ".", "dtype", pt.dtype, kDTypes, true);
          r.number(e, path + ".", "flops", pt.flops_per_s, 1, kBig, true);
          p.gemm_table.push_back(pt);
        }
      }
    }
  }
  r.number(root, "", "attention_efficiency", p.attention_efficiency, 1e-4, 1);
  r.number(root, "", "elementwise_efficiency", p.elementwise_efficiency, 1e-4, 100);
  r.number(root, "", "norm_efficiency", p.norm_efficiency, 1e-4, 100);
  r.number(root, "", "activation_efficiency", p.activation_efficiency, 1e-4, 100);
  r.number(root, "", "kernel_overhead", p.kernel_overhead, 0, 1);
  r.number(root, "", "solo_speedup", p.solo_speedup, 1, 16);
  r.number(root, "", "comm_overlap", p.comm_overlap, 0, 1);
  if (const YAML::Node n = root["network"]; !n.IsDefined()) {
    r.error(root, "'network' is missing",
            "e.g. network: {intra_node: {latency: 5e-6, bandwidth: 450e9}, inter_node: {latency: 1e-5, "
            "bandwidth: 50e9}}");
  } else if (r.mapping(n, "network", {"intra_node", "inter_node"})) {
    if (n["intra_node"].IsDefined())
      read_tier(r, n["intra_node"], "network.intra_node", p.intra_node);
    else
      r.error(n, "'network.intra_node' is missing", "the links between devices of one node");
    if (n["inter_node"].IsDefined())
      read_tier(r, n["inter_node"], "network.inter_node", p.inter_node);
    else
      p.inter_node = p.intra_node;  // a one-node machine: there is no other tier
  }
  r.number(root, "", "checkpoint_bandwidth", p.checkpoint_bandwidth, 0, kBig);
  r.number(root, "", "step_overhead", p.step_overhead, 0, 3600);
  r.size(root, "", "process_memory", p.process_memory);
  r.number(root, "", "allocator_slack", p.allocator_slack, 0, 10);
  if (!out.empty()) throw SpecError(std::move(out));
  return p;
}

std::string to_yaml(const HardwareProfile& p) {
  std::ostringstream y;
  y << "name: " << p.name << "\n";
  if (!p.description.empty()) y << "description: " << quoted(p.description) << "\n";
  y << "device: " << to_string(p.device) << "\n";
  y << "devices_per_node: " << p.devices_per_node << "\n";
  y << "memory: " << format_size(p.memory) << "\n";
  y << "memory_bandwidth: " << num(p.memory_bandwidth) << "\n";
  if (p.streaming_memory > 0)
    y << "streaming: {memory: " << format_size(p.streaming_memory)
      << ", bandwidth: " << num(p.streaming_bandwidth) << "}\n";
  y << "peak_flops: {fp32: " << num(p.peak_f32) << ", bf16: " << num(p.peak_bf16)
    << ", fp16: " << num(p.peak_f16) << "}\n";
  y << "gemm:\n  efficiency: " << num(p.gemm_efficiency) << "\n  half_flops: " << num(p.gemm_half_flops)
    << "\n";
  if (!p.gemm_table.empty()) {
    y << "  table:\n";
    for (const auto& g : p.gemm_table)
      y << "    - {m: " << g.m << ", n: " << g.n << ", k: " << g.k << ", op: " << gemm_op_name(g.op)
        << ", dtype: "
        << (g.dtype == DType::bf16  ? "bf16"
            : g.dtype == DType::f16 ? "fp16"
                                    : "fp32")
        << ", flops: " << num(g.flops_per_s) << "}\n";
  }
  y << "attention_efficiency: " << num(p.attention_efficiency) << "\n";
  y << "elementwise_efficiency: " << num(p.elementwise_efficiency) << "\n";
  y << "norm_efficiency: " << num(p.norm_efficiency) << "\n";
  y << "activation_efficiency: " << num(p.activation_efficiency) << "\n";
  y << "kernel_overhead: " << num(p.kernel_overhead) << "\n";
  y << "solo_speedup: " << num(p.solo_speedup) << "\n";
  y << "comm_overlap: " << num(p.comm_overlap) << "\n";
  y << "network:\n";
  write_tier(y, "intra_node", p.intra_node);
  write_tier(y, "inter_node", p.inter_node);
  y << "checkpoint_bandwidth: " << num(p.checkpoint_bandwidth) << "\n";
  y << "step_overhead: " << num(p.step_overhead) << "\n";
  y << "process_memory: " << format_size(p.process_memory) << "\n";
  y << "allocator_slack: " << num(p.allocator_slack) << "\n";
  return y.str();
}

std::vector<std::string> builtin_hardware_names() {
  std::vector<std::string> names;
  for (const auto& b : builtin_hardware_files()) names.emplace_back(b.name);
  return names;
}

HardwareProfile builtin_hardware(const std::string& name) {
  std::string list;
  for (const auto& b : builtin_hardware_files()) {
    if (b.name == name) return parse_hardware(std::string(b.text), "built-in:" + name);
    list += (list.empty() ? "" : ", ") + std::string(b.name);
  }
  throw Error("unknown hardware profile '" + name + "': the built-in ones are " + list +
              ", and a calibrated one is <name>.yaml in " +
              (hardware_dir().empty() ? std::string("$TROUPE_HARDWARE_DIR") : hardware_dir()));
}

bool valid_hardware_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(),
                     [](char c) {
                       return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                              c == '.' || c == '_' || c == '-';
                     }) &&
         name != "." && name != "..";
}

std::string hardware_dir() {
  if (const char* d = std::getenv("TROUPE_HARDWARE_DIR"); d && *d) return d;
  if (const char* x = std::getenv("XDG_CONFIG_HOME"); x && *x) return std::string(x) + "/troupe/hardware";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.config/troupe/hardware";
  return "";
}

HardwareProfile find_hardware(const std::string& name) {
  if (!valid_hardware_name(name))
    throw Error("'" + name + "' is not a hardware profile name (letters, digits, '.', '_', '-')");
  const std::string dir = hardware_dir();
  if (!dir.empty()) {
    const std::string path = dir + "/" + name + ".yaml";
    uint64_t size = 0;
    int fd = -1;
    try {
      fd = open_regular_file(path, "hardware profile", &size);
    } catch (const Error&) {
      fd = -1;  // no calibrated file of that name (or not a file): the built-in one
    }
    if (fd >= 0) {
      ::close(fd);
      return parse_hardware(read_regular_file(path, kMaxProfileBytes, "hardware profile"), path);
    }
  }
  return builtin_hardware(name);
}

HardwareProfile load_hardware(const std::string& arg) {
  const bool path =
      arg.find('/') != std::string::npos || (arg.size() > 5 && arg.compare(arg.size() - 5, 5, ".yaml") == 0);
  if (!path) return find_hardware(arg);
  return parse_hardware(read_regular_file(arg, kMaxProfileBytes, "hardware profile"), arg);
}

std::string default_hardware_name(DeviceKind device) {
  return device == DeviceKind::cpu ? "cpu" : "h100-sxm";
}

}  // namespace troupe::plan

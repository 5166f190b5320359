// Hardware profiles: what the planner's cost model knows of a device and the links
// between devices. A profile is a YAML file (docs/planner.md lists every key);
// `a100-80gb`, `h100-sxm`, `h200-sxm`, `ipu-bow` and a generic `cpu` are compiled in from
// configs/hardware/, and `troupe plan --calibrate` measures this machine and writes
// one (the `cpu` profile the planner then uses by default).
//
// Units are SI throughout: seconds, bytes, bytes per second, FLOP per second; a
// memory size may also be written as "80GiB". Bandwidths are per device and per
// direction (NVLink 4: 450e9 of an H100's 900 GB/s bidirectional).
//
// A profile file is hostile input like a spec: at most 1 MiB, every key known,
// every number finite and in range, each error at file:line:col with a hint.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "core/spec.hpp"

namespace troupe::plan {

// A product's operand layout, as BLAS spells it for y(M,N) = op(A) op(B): the forward
// y = x W^T is "nt", the input gradient dx = dy W "nn", the weight gradient dW = dy^T x "tn".
enum class GemmOp : uint8_t { nt, nn, tn };
const char* gemm_op_name(GemmOp op);

// A GEMM rate measured on this machine (calibration).
struct GemmPoint {
  int64_t m = 0, n = 0, k = 0;
  GemmOp op = GemmOp::nt;
  DType dtype = DType::f32;
  double flops_per_s = 0;
};

// One link, or one collective's fit: time = latency + bytes / bandwidth per step.
struct LinkCost {
  double latency = 0;    // s
  double bandwidth = 0;  // bytes/s per device, one direction; 0 = not given
  // Measured between two ranks (calibration): (bytes, seconds) with bytes ascending. Where it is
  // given, a message is priced from it (log-log between its points, bandwidth-bound past the
  // last): small messages on a CPU host cost a scheduling wake-up more than any fit says.
  std::vector<std::pair<double, double>> table;
  bool given() const { return bandwidth > 0 || !table.empty(); }
  // Seconds for a message of `bytes` between two ranks: the table, else the fit.
  double two_ranks(double bytes, double steps, double factor) const;
};

// Devices that talk within a node, or across nodes. Collectives over a group follow the
// ring formulas on `link` unless the profile gives a fit or a table of its own (calibration
// measures each collective between two worker processes; n ranks then take (n-1) times two
// ranks' time for a buffer of 2 bytes / n, the same steps of the same size):
//   all-reduce      2(n-1) latency + 2(n-1)/n bytes / bandwidth
//   reduce-scatter,
//   all-gather       (n-1) latency +  (n-1)/n bytes / bandwidth   (bytes: the whole buffer)
//   p2p                    latency +          bytes / bandwidth
struct NetworkTier {
  LinkCost link;
  LinkCost allreduce, allgather, reduce_scatter;  // per-collective fits in the same form
};

// What a profile describes: a CPU core or a GPU (troupe trains on both), or an IPU-class
// accelerator (small on-chip memory, the rest streamed; priced, not run).
enum class ProfileDevice : uint8_t { cpu, cuda, ipu };
const char* to_string(ProfileDevice d);

struct HardwareProfile {
  std::string name;
  std::string description;  // what it is and where its figures come from
  std::string source;       // the file it was read from, or "built-in"
  ProfileDevice device = ProfileDevice::cuda;
  int devices_per_node = 8;
  uint64_t memory = 0;          // bytes per device (an IPU: its on-chip SRAM)
  double memory_bandwidth = 0;  // bytes/s per device
  // A second, slower tier per device that what does not fit in `memory` streams to and from
  // (an IPU's Streaming Memory, DRAM behind a link); 0 bytes: none. The cost model places the
  // bytes that overflow `memory` there, cheapest traffic first, and prices their transfers at
  // streaming_bandwidth (plan/cost_model.hpp).
  uint64_t streaming_memory = 0;
  double streaming_bandwidth = 0;  // bytes/s per device, each direction
  // Dense peak FLOP/s per device by the dtype products compute in (f32: what fp32 GEMMs
  // run on, TF32 tensor cores on a GPU that allows them).
  double peak_f32 = 0, peak_bf16 = 0, peak_f16 = 0;
  // GEMM rate off the table: peak x efficiency x f / (f + half_flops) for a product of
  // f FLOPs (small products do not fill the device), never above what its bytes allow.
  double gemm_efficiency = 0.8;
  double gemm_half_flops = 0;
  std::vector<GemmPoint> gemm_table;  // measured rates; the nearest shape of the same op and dtype wins
  // The attention core's rate as a fraction of the compute dtype's peak (the products of
  // scores and values with their softmax); a fused kernel reaches more than batched GEMMs.
  double attention_efficiency = 0.5;
  // Memory-bound kernels over activations move their bytes at memory_bandwidth x these:
  // residual adds, bias gradients, casts, the embedding, the loss's passes (elementwise); the
  // norms; the activation functions (GELU, SwiGLU). The optimizer's sweeps over parameters run
  // at memory_bandwidth itself. On a CPU whose activations sit in cache the efficiencies may
  // exceed 1; its transcendental functions may keep them far below.
  double elementwise_efficiency = 0.7;
  double norm_efficiency = 0.7;
  double activation_efficiency = 0.7;
  double kernel_overhead = 0;  // s per kernel launch
  // How much faster a device computes when it is the only busy one of its node: the rates
  // above are measured with every device of the node busy (what a job that fills the node
  // sees); with fewer busy, shared caches, memory bandwidth and clock boost give each more,
  // interpolated linearly to this factor for one. 1 for devices that share nothing (GPUs).
  double solo_speedup = 1.0;
  // The share of the data-parallel reduction that runs while the backward computes (a
  // GPU's communication stream: 1; CPU workers that each own their core: little).
  double comm_overlap = 1.0;
  NetworkTier intra_node, inter_node;
  double checkpoint_bandwidth = 0;  // bytes/s written by one worker
  double step_overhead = 0;         // s per optimizer step outside the model (data, metrics, scalars)
  uint64_t process_memory = 0;      // bytes each worker holds besides the model (runtime, libraries)
  double allocator_slack = 0.05;    // fraction added to the model's bytes (fragmentation, caching)

  // Peak FLOP/s for products in `dt` (f32, bf16, f16).
  double peak(DType dt) const;
};

// Parses a profile; throws troupe::SpecError with every problem at file:line:col.
HardwareProfile parse_hardware(const std::string& yaml_text, const std::string& filename);
// The profile as YAML that parse_hardware reads back to the same values.
std::string to_yaml(const HardwareProfile& p);

// The compiled-in profiles (configs/hardware/*.yaml), by name.
std::vector<std::string> builtin_hardware_names();
// Throws troupe::Error naming the built-in ones when `name` is none of them.
HardwareProfile builtin_hardware(const std::string& name);

// A profile name: letters, digits, '.', '_' and '-', 1 to 64 characters. A spec's
// resources.hardware is a name, never a path, so that a submitted job cannot make the
// coordinator read a file of its choosing.
bool valid_hardware_name(const std::string& name);

// Where calibrated profiles live: $TROUPE_HARDWARE_DIR, else $XDG_CONFIG_HOME/troupe/hardware,
// else $HOME/.config/troupe/hardware ("" when none of them is set).
std::string hardware_dir();
// A profile by name: <hardware_dir()>/<name>.yaml when that file exists (a calibration),
// else the built-in one. Throws SpecError (a bad file) or troupe::Error (unknown name).
HardwareProfile find_hardware(const std::string& name);
// `troupe plan --hardware`: a file path when the argument contains '/' or ends in .yaml,
// else find_hardware(name).
HardwareProfile load_hardware(const std::string& name_or_path);
// The profile a job on `device` is planned with when its spec names none: "cpu" (the
// calibrated one when there is one) or "h100-sxm".
std::string default_hardware_name(DeviceKind device);

}  // namespace troupe::plan

// The job spec: a YAML file turned into a typed, validated JobSpec.
//
// Validation collects every problem of a file before it throws, each as a Diagnostic that
// reads like a compiler error ("job.yaml:12:9: error: ...") with a hint the user can act on.
// docs/job-spec.md lists every key, its default, its range and the cross-field rules.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.hpp"
#include "core/layout.hpp"
#include "core/units.hpp"

namespace troupe {

struct Diagnostic {
  std::string file;
  int line = 0;  // 1-based; 0 when the problem is the file as a whole (missing, too large)
  int col = 0;   // 1-based
  std::string message;
  std::string hint;
  // "file:line:col: error: message\n  hint: hint"; without ":line:col" when line is 0, without the
  // hint line when there is no hint.
  std::string str() const;
};

class SpecError : public std::exception {
 public:
  SpecError() = default;
  explicit SpecError(std::vector<Diagnostic> d);
  std::vector<Diagnostic> diagnostics;         // sorted by position, file-level ones first
  const char* what() const noexcept override;  // every diagnostic's str(), one after another

 private:
  mutable std::string what_;
};

enum class ModelType { gpt, mlp, llama };
enum class DataSource { text, synthetic, tokens };
enum class TokenDType { uint16, uint32 };  // data.dtype: the width of a token file's ids
enum class Precision { fp32, bf16, fp16 };
// Activation recomputation: none; selective (each block's attention scores, recomputed from
// q and k before the backward); full (each block's whole forward, from its input); auto (the
// planner chooses). "block" is the older spelling of full.
enum class Recompute { none, selective, full, auto_ };
// train.offload: optimizer keeps the f32 master weights and AdamW's moments in host memory
// (pinned on a GPU) and runs AdamW on the CPU (ZeRO-Offload's split); the device keeps the
// weights and gradients the layers use.
enum class Offload { none, optimizer };
enum class Schedule { gpipe, one_f_one_b, interleaved, zb_h1 };
enum class DeviceKind { cpu, cuda };
// resources.placement: pack = as few agents as hold the job (its ranks talk over loopback);
// spread = one device per agent in turn (Ray's SPREAD): a host's loss takes fewer ranks, and a
// rank's snapshot buddy sits on another host, so the job resumes from memory.
enum class Placement { pack, spread };
enum class LrSchedule { constant, cosine, linear };

// model.rope_scaling: Hugging Face's rope_scaling of rope_type "llama3" (Llama 3.1 and later).
struct RopeScalingSpec {
  std::string type;  // "llama3", or "" for none
  double factor = 0, low_freq_factor = 0, high_freq_factor = 0;
  int original_max_position_embeddings = 0;
};

struct ModelSpec {
  ModelType type = ModelType::gpt;
  int vocab_size = 256;
  int seq_len = 0;
  int d_model = 0;
  int n_layers = 0;
  int n_heads = 0;  // gpt and llama; 0 for mlp
  // llama only (0 / defaults otherwise):
  int n_kv_heads = 0;            // grouped-query attention: key/value heads; n_heads when not given
  int ffn_hidden = 0;            // SwiGLU hidden width; 64 * ceil(8 d_model / 3 / 64) when not given
  double norm_eps = 1e-5;        // RMSNorm epsilon
  double rope_theta = 10000.0;   // rotary embedding base
  RopeScalingSpec rope_scaling;  // llama only
  bool tie_embeddings = false;   // the LM head reads the embedding (gpt: always)
  std::string init_from;         // safetensors file or checkpoint dir to start from; "" = fresh init
};

struct DataSpec {
  DataSource source = DataSource::text;
  // text: a file, or a directory whose text files are read; tokens: a token file, or a
  // directory whose *.bin files are the shards. "" for synthetic.
  std::string path;
  // The tail of the training data held out for evaluation; 0 when val_path gives the split.
  double val_fraction = 0.05;
  // The rest applies to source tokens only (docs/training.md#token-data).
  std::optional<TokenDType> dtype;  // not given: a file's header decides, a raw file is uint16
  std::string val_path;             // the validation split's token file(s); "" = the tail split
  int eot = -1;                     // end-of-text id, in [0, model.vocab_size); -1 = none
  std::string tokenizer;            // tokenizer JSON for encoding prompts; "" = none
};
// The bytes per id data.dtype asks for: 2 or 4, or 0 when it is not given (TokenFile::open).
inline int token_width(const DataSpec& d) { return !d.dtype ? 0 : *d.dtype == TokenDType::uint32 ? 4 : 2; }

struct OptimizerSpec {
  std::string type = "adamw";
  double lr = 3e-4;
  double beta1 = 0.9, beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
};

// A timeline trace of steps [from_step, from_step + steps) (0-based, as metrics.jsonl numbers
// them): each rank writes <run_dir>/trace/rank<r>.json (Chrome trace events). steps 0: off.
struct TraceSpec {
  int64_t from_step = 0;
  int64_t steps = 0;
};

struct TrainSpec {
  int64_t steps = 0;
  int global_batch = 0;  // sequences per optimizer step, over all data-parallel ranks
  int micro_batch = 0;   // sequences per forward/backward on one rank; 0 = "auto" (planner decides)
  OptimizerSpec optimizer;
  LrSchedule lr_schedule = LrSchedule::cosine;
  int64_t warmup_steps = 0;
  double min_lr = 0.0;
  double grad_clip = 1.0;  // max global L2 norm; 0 = off
  Precision precision = Precision::fp32;
  Recompute recompute = Recompute::none;
  Offload offload = Offload::none;
  // ZeRO stage over the data-parallel group: 0 replicates the optimizer, 1 shards AdamW's moments
  // (each rank updates its part, then parameters are all-gathered), 2 also reduce-scatters the
  // gradients instead of all-reducing them.
  int zero = 0;
  TraceSpec trace;
  uint64_t seed = 0;
  int64_t eval_every = 0;  // 0 = off
  int eval_batches = 4;
  int64_t log_every = 1;
};

// The largest degrees a spec may ask for (checked by load_spec; a checkpoint's manifest is
// held to the same).
inline constexpr int kMaxDataParallel = 65536;
inline constexpr int kMaxPipelineParallel = 4096;
inline constexpr int kMaxTensorParallel = 4096;

struct ParallelSpec {
  int data = 1, pipeline = 1, tensor = 1;  // 0 means "auto"
  Schedule schedule = Schedule::one_f_one_b;
  int virtual_stages = 1;  // model chunks per pipeline rank (interleaved schedule)
  // Megatron's sequence parallelism: the parts of a block that tensor parallelism replicates
  // (norms, dropout, residual adds) split over the tensor group by sequence. Planned; the
  // engine refuses it (runnable_issues).
  bool sequence_parallel = false;
};

// At most this many hot spares per job (resources.spares).
constexpr int kMaxSpares = 64;

struct ResourcesSpec {
  DeviceKind device = DeviceKind::cpu;
  int threads_per_worker = 1;
  uint64_t memory_per_device = 0;  // bytes, 0 = the hardware profile's
  // The hardware profile the planner prices the job with (plan/hardware.hpp): a name, never a
  // path; "" = the device's default (the calibrated "cpu" profile, or "h100-sxm").
  std::string hardware;
  // Hot spares: worker processes started with the job on devices of their own, registered and
  // waiting; a failed rank's place goes to one without a process start. Fixed layouts only.
  int spares = 0;
  Placement placement = Placement::pack;
};

struct CheckpointSpec {
  std::string dir;    // "" = <run dir>/ckpt
  int64_t every = 0;  // 0 = off
  int keep = 3;
  bool async = true;
  // A snapshot of the rank's training state in host memory every this many steps (two kept),
  // from which survivors of a failure continue; 0 = off. CPU ranks only.
  int64_t memory_every = 1;
};

struct FaultSpec {
  int max_restarts = 3;
  std::chrono::milliseconds heartbeat{1000};
  std::chrono::milliseconds step_timeout{0};  // 0 = derived from measured step times
};

struct ElasticSpec {
  int min_devices = 0;  // 0 = the planned layout's size
  int max_devices = 0;  // 0 = the planned layout's size
};

// Where a value was written: 1-based line and column.
struct SourcePos {
  int line = 0, col = 0;
};

struct JobSpec {
  std::string name;
  std::string source_file;  // where it was read from; not part of the spec's content
  // Where each key that was written stands, by dotted path ("train.precision"; "" is the
  // document, "train" a section): what later checks point at. Filled by parse_spec, empty for
  // a spec built in code; not part of the spec's content.
  std::map<std::string, SourcePos> positions;
  ModelSpec model;
  DataSpec data;
  TrainSpec train;
  ParallelSpec parallel;
  ResourcesSpec resources;
  CheckpointSpec checkpoint;
  FaultSpec fault;
  ElasticSpec elastic;
};

// Field-by-field equality; JobSpec's ignores source_file and positions, so a spec equals its own
// to_yaml round trip.
bool operator==(const ModelSpec&, const ModelSpec&);
bool operator==(const DataSpec&, const DataSpec&);
bool operator==(const OptimizerSpec&, const OptimizerSpec&);
bool operator==(const TrainSpec&, const TrainSpec&);
bool operator==(const ParallelSpec&, const ParallelSpec&);
bool operator==(const ResourcesSpec&, const ResourcesSpec&);
bool operator==(const CheckpointSpec&, const CheckpointSpec&);
bool operator==(const FaultSpec&, const FaultSpec&);
bool operator==(const ElasticSpec&, const ElasticSpec&);
bool operator==(const JobSpec&, const JobSpec&);
inline bool operator!=(const JobSpec& a, const JobSpec& b) { return !(a == b); }

// A spec file is at most this large; larger files are refused before they are read.
inline constexpr uint64_t kMaxSpecBytes = 1 << 20;

// Reads, parses and validates a spec file. Throws SpecError for every problem, the file's own
// included (missing, a directory, too large, not text).
JobSpec load_spec(const std::string& path);
// Parses and validates YAML text; `filename` is used in diagnostics and stored as source_file.
JobSpec parse_spec(const std::string& yaml_text, const std::string& filename);

// What this build cannot run although the spec is valid: device cuda (the engine trains on
// the CPU). One Diagnostic per problem, at the key's position in source_file, with a hint.
// parse_spec accepts such specs (a spec is also data: a checkpoint's, one written for another
// build); troupe validate, troupe plan, troupe run and the coordinator's submit refuse them, so
// a job that cannot start is never launched and retried. Data files are not looked at here
// (troupe plan needs none, and the coordinator's host need not hold the workers' data): see
// token_file_issues.
std::vector<Diagnostic> runnable_issues(const JobSpec& spec);
// Whether this build has the CUDA kernels (configured with nvcc and NCCL): resources.device:
// cuda runs only then.
bool build_has_cuda();
// Throws SpecError with runnable_issues(spec) when there are any.
void require_runnable(const JobSpec& spec);
// The token files of data.source tokens that cannot be read as the spec says: a path that does
// not exist, a directory without *.bin files, a size or header that does not fit (the checks of
// TokenFile::open, which reads a header and nothing else). When the files total at most
// `scan_up_to` bytes, every id is also checked < model.vocab_size (a pass over the data).
// One Diagnostic per file at data.path (data.val_path for the validation files); none for
// another source. troupe validate and troupe run, which read the data where they run, check these.
std::vector<Diagnostic> token_file_issues(const JobSpec& spec, uint64_t scan_up_to);
// Throws SpecError with runnable_issues(spec) and token_file_issues(spec, scan_up_to), sorted
// by position, when there are any: what troupe validate and troupe run check before starting.
void require_startable(const JobSpec& spec, uint64_t scan_up_to = 0);
// troupe validate scans the ids of token files up to this size in all.
inline constexpr uint64_t kValidateScanBytes = uint64_t{256} << 20;

// The resolved spec as YAML: every key with its value, defaults filled in, "auto" where a parallel
// degree or micro_batch is left to the planner. parse_spec(to_yaml(s), f) == s.
std::string to_yaml(const JobSpec& spec);

// The YAML spelling of each enum value ("1f1b" for Schedule::one_f_one_b).
const char* to_string(ModelType v);
const char* to_string(DataSource v);
const char* to_string(TokenDType v);
const char* to_string(Precision v);
// The dtype the products compute in: f32, bf16 or f16 (master weights stay f32).
DType compute_dtype(Precision v);
const char* to_string(Recompute v);
const char* to_string(Offload v);
const char* to_string(Schedule v);
const char* to_string(DeviceKind v);
const char* to_string(Placement v);
const char* to_string(LrSchedule v);

// Devices of a fully given layout (data * pipeline * tensor), or nullopt when any degree is auto.
std::optional<int> layout_devices(const ParallelSpec& p);
// The layout the spec asks for; a degree left to the planner ('auto') counts as 1.
Layout layout_of(const ParallelSpec& p);

}  // namespace troupe

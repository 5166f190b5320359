// Checkpoint directories (DESIGN.md, "Model, names and checkpoints"):
//
//   <root>/step_000500/   shard files (safetensors) + manifest.json, written last
//   <root>/latest  ->  step_000500
//
// Writers fill <root>/step_N.tmp/ with shard files (each fsynced, with its size and
// xxh64 recorded); commit() then writes manifest.json, fsyncs it, renames the
// directory to step_N and swings `latest` with an atomic symlink rename. A crash at
// any instant leaves the previous checkpoint intact: a .tmp directory is never read.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/safetensors.hpp"

namespace troupe::checkpoint {

inline constexpr int kFormatVersion = 1;

// A checkpoint that fails verification (missing, truncated or corrupt file, bad manifest).
class CheckpointError : public Error {
 public:
  using Error::Error;
};

// A checkpoint refused before its data is read: a manifest troupe did not write (not JSON
// within the reader's limits, a field missing or out of range, a file name that leaves the
// directory) or a file that is not a regular file (a FIFO, a device, a symbolic link). The
// message names the file and the value read; `troupe ckpt` answers it with exit code 2.
class RefusedCheckpoint : public CheckpointError {
 public:
  using CheckpointError::CheckpointError;
};

// A checkpoint could not be written because its file system is full (ENOSPC,
// EDQUOT). Retrying the same steps would fill the same disk: a job fails at once.
class DiskFullError : public CheckpointError {
 public:
  using CheckpointError::CheckpointError;
};

struct FileRecord {
  std::string name;  // relative to the checkpoint directory
  uint64_t size = 0;
  std::string xxh64;  // 16 lowercase hex digits
};

struct Manifest {
  int format_version = kFormatVersion;
  int64_t step = 0;         // optimizer steps completed; training resumes at this step
  int64_t data_cursor = 0;  // global batches consumed (equals step: batches are a function of the step)
  int dp = 1, pp = 1, tp = 1;
  uint64_t seed = 0;
  std::string spec_hash;
  nlohmann::json optimizer;  // the optimizer config the moments belong to
  // Mixed-precision loss-scaler state ({"scale", "clean_steps", "skipped_steps"},
  // parallel/loss_scale.hpp) when the run scaled its loss or skipped a step; null otherwise.
  nlohmann::json loss_scale;
  std::string spec_yaml;  // the resolved job spec (model config for tools like `troupe sample`)
  std::vector<FileRecord> files;
};

// A manifest lists every shard file once and holds the resolved spec: a few hundred KiB for
// thousands of ranks. A larger one is refused before it is parsed.
inline constexpr uint64_t kMaxManifestBytes = uint64_t(64) << 20;

nlohmann::json to_json(const Manifest& m);
// Every field checked: format and format_version; step and data_cursor in [0, 2^62]; layout
// sizes within the spec's limits (data 1..65536, pipeline and tensor 1..4096); rng.seed an
// unsigned 64-bit integer; files an array (non-empty when with_files) of distinct plain names
// (plain_file_name, not manifest.json), sizes in [0, 2^62] and 16-hex-digit checksums.
// Throws RefusedCheckpoint "manifest.json: layout.data is 1099511627776, outside [1, 65536]".
Manifest manifest_from_json(const nlohmann::json& j, bool with_files = true);
// A name of a file directly inside a directory: not empty, ".", ".." nor longer than 255
// bytes, no '/' or NUL, valid UTF-8.
bool plain_file_name(const std::string& name);

std::string step_dir_name(int64_t step);  // "step_000500"

// Creates (emptying any leftover) <root>/step_N.tmp/ and returns its path.
std::string begin(const std::string& root, int64_t step);
// Creates <root>/step_N.tmp/ if needed, keeping what is there: every rank of a job calls
// it and writes only its own files; commit() drops files no rank reported.
std::string prepare(const std::string& root, int64_t step);
// Writes one shard file into the .tmp directory, fsynced, and returns its record.
FileRecord write_shard(const std::string& tmp_dir, const std::string& file_name,
                       const std::vector<safetensors::WriteEntry>& entries,
                       const safetensors::Metadata& metadata = {});
// Writes manifest.json (fsynced), renames tmp to step_N, fsyncs root, points `latest` at it,
// and removes the oldest committed checkpoints beyond `keep` (keep <= 0: keep all) and stale .tmp dirs.
std::string commit(const std::string& root, const Manifest& manifest, int keep);

// Reads <dir>/manifest.json as hostile input (a regular file, not a link, at most
// kMaxManifestBytes, through core/json_read) and checks it (manifest_from_json). Throws
// CheckpointError when it is missing, RefusedCheckpoint for everything else.
Manifest read_manifest(const std::string& dir);
// Reads and checks a committed checkpoint directory: the manifest (read_manifest), then every
// file it lists, opened as a regular file inside `dir` (never a FIFO, never through a link),
// with its size and checksum. Throws CheckpointError naming a missing, truncated or corrupt
// file, RefusedCheckpoint naming one that is no regular file.
Manifest verify(const std::string& dir);
// What verify checks without reading the files' bytes: the manifest, and every file it lists
// a regular file of its size. A reader that checks each file's checksum as it first reads it
// (TensorSource, Verify::on_read) starts from this.
Manifest check_files(const std::string& dir);
// One file of a checkpoint as verify checks it: regular, its size, its checksum.
void verify_file(const std::string& dir, const FileRecord& rec);
// Checksum of a regular file (not a link) as 16 hex digits (xxh64, seed 0).
std::string file_xxh64(const std::string& path);

// Committed checkpoints under root, newest first (by step; .tmp directories excluded).
std::vector<std::string> list(const std::string& root);
// The newest checkpoint under root that verifies; each one skipped is reported through
// `skipped` ("<dir>: <reason>"). nullopt when none verifies.
std::optional<std::string> latest_valid(const std::string& root, std::vector<std::string>* skipped = nullptr);
// The same with the check each candidate must pass (verify, or a cache of it: verified.hpp);
// it throws CheckpointError for one that does not.
std::optional<std::string> latest_valid(const std::string& root, std::vector<std::string>* skipped,
                                        const std::function<void(const std::string&)>& check);

// What one rank holds of a tensor: its global shape and the runs along split_dim
// (split_dim = -1: the whole tensor). The same description is stored per shard in the
// "slices" metadata, so a reader of any layout finds which bytes hold which elements.
//   c_proj.weight (256, 1024) split on dim 1, tensor shard 1 of 2:
//   {global_shape [256,1024], split_dim 1, pieces [{offset 512, length 512, local_offset 0}]}
struct Piece {
  int64_t offset = 0;        // first global index along split_dim
  int64_t length = 0;        // indices in the run
  int64_t local_offset = 0;  // where the run starts in the local tensor
};
struct SliceSpec {
  Shape global_shape;
  int split_dim = -1;
  std::vector<Piece> pieces;  // empty with split_dim >= 0: nothing held
};
Shape local_shape(const SliceSpec& s);
SliceSpec whole(const Shape& global_shape);

// Data-parallel (and other) replicas of a slice each store a part of it, not all of it:
// replica `index` of `count` takes local indices [index*n/count, (index+1)*n/count) of its
// slice along the split dim (dim 0 for a whole tensor), recorded as pieces with global
// offsets. `begin`/`end` are those local indices; `stored` describes the part (no pieces
// when the part is empty).
struct Spread {
  int dim = 0;
  int64_t begin = 0, end = 0;
  SliceSpec stored;
};
Spread spread(const SliceSpec& held, int index, int count);
// Copies local indices [begin, end) along `dim` of a row-major tensor of shape `shape`
// into dst, contiguous.
void copy_block(const float* src, const Shape& shape, int dim, int64_t begin, int64_t end, float* dst);
// The "slices" metadata entry of one tensor.
nlohmann::json slice_json(const SliceSpec& s);

// Named tensors from a safetensors file of whole tensors or a (verified) checkpoint
// directory of any layout, whichever `path` is. Each shard is opened once; reads fetch
// only the byte ranges that hold the wanted elements, straight into the caller's buffer.
// When a checkpoint directory's checksums are checked: all of them when it is opened, or each
// file's when it is first read from. A rank resuming reads its own slices, a few of the files
// of a big job: on_read checks what it reads (the job's ranks together read each file about
// once) instead of every rank reading every file.
enum class Verify { all, on_read };

class TensorSource {
 public:
  // throws CheckpointError / safetensors::FormatError (on_read: also from the reads)
  explicit TensorSource(const std::string& path, Verify verify = Verify::all);
  // The manifest when path is a checkpoint directory.
  const std::optional<Manifest>& manifest() const { return manifest_; }
  bool contains(const std::string& name) const;
  std::vector<std::string> names() const;  // sorted
  Shape global_shape(const std::string& name) const;
  // Reads land in f32 destinations. A tensor stored as BF16, F16 or F64 is converted on
  // the way (core/dtype_convert.hpp: exact from BF16 and F16, F64 rounded to nearest);
  // a file holding an integer tensor is refused when opened.
  //
  // Copies the whole tensor `name` of exactly `shape` into dst; throws CheckpointError
  // when it is missing or has another shape.
  void read(const std::string& name, const Shape& shape, float* dst) const;
  // Fills dst (local_shape(want) floats) with the slice `want` of tensor `name`, assembled
  // from whatever slices the shards hold. Throws CheckpointError when the global shapes
  // disagree or the stored slices do not cover it.
  void read_slice(const std::string& name, const SliceSpec& want, float* dst) const;
  uint64_t bytes_read() const { return bytes_read_; }  // bytes of the stored dtype
  // Files whose checksums were checked (all of them, or with on_read those read from).
  size_t files_verified() const;

 private:
  struct Stored {
    size_t reader = 0;
    DType dtype = DType::f32;
    SliceSpec slice;
    Shape local;
  };
  std::string path_;
  std::optional<Manifest> manifest_;
  std::vector<safetensors::Reader> readers_;
  std::map<std::string, std::vector<Stored>> index_;
  mutable uint64_t bytes_read_ = 0;
  mutable std::vector<char> verified_;  // per reader: its checksum checked
};

// One file of full tensors under DESIGN.md's names (no optimizer state), with
// {"format": "pt"} metadata: what torch's and Hugging Face's safetensors loaders read.
// dtype f32 (default) writes the f32 master weights as they are; bf16 or f16 rounds
// them to nearest even (core/dtype_convert.hpp), the dtype a 16-bit model is shipped in.
// Returns the number of tensors written.
size_t export_model(const std::string& checkpoint_dir, const std::string& out_path, DType dtype = DType::f32);

// Test hook, off unless TROUPE_CKPT_FAULT is set: "write:<step>:<rank>" kills the writer
// of that rank half-way through its shard file (generation 0 only); "commit:<step>" kills
// the committer after the manifest is in step_N.tmp and before the rename.
void fault_point(const std::string& where, int64_t step, int rank = -1, int generation = 0,
                 const std::string& path = "");

// The names stored in a checkpoint: parameters (PyTorch names) and their AdamW moments
// ("optim.m.<name>", "optim.v.<name>"), each once, sorted.
std::vector<std::string> tensor_names(const std::string& dir, const Manifest& m);
// The full (global-shape) tensor `name` assembled from the slices every shard of the
// checkpoint holds, whatever layout wrote it (each shard's "slices" metadata gives the
// global shape, the split dimension and the runs along it). Throws CheckpointError when
// the slices do not cover the tensor.
Tensor read_full(const std::string& dir, const Manifest& m, const std::string& name);

// Whether path is a directory holding a manifest.json (committed or not).
bool is_checkpoint_dir(const std::string& path);

// `dir` itself when it holds a manifest, else the newest valid checkpoint under it.
// Throws CheckpointError when there is none.
std::string resolve(const std::string& dir);
// resolve() for a job about to resume, so that a damaged checkpoint is refused before anything
// starts: `dir` itself when it holds a manifest, verified (every file present with its size and
// checksum); a step_N directory without one is damaged, not a root; else the newest valid
// checkpoint under `dir`, each one skipped reported through `skipped` ("<dir>: <reason>").
// Throws CheckpointError naming the damage: which file is missing, truncated or corrupt, or that
// the manifest is missing or unreadable.
std::string resolve_verified(const std::string& dir, std::vector<std::string>* skipped = nullptr);

}  // namespace troupe::checkpoint

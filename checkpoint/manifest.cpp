// manifest.json: written by the committer, read back as hostile input. Whoever can write a
// job's checkpoint folder can put anything there, and the coordinator reads it when the job
// recovers: the text goes through the bounded JSON reader, the file is opened as a regular
// file only (never a FIFO, never through a symbolic link), every field is range-checked with
// the value it holds in the message, and every file it lists is a plain name inside the
// checkpoint directory.
#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <set>

#include "checkpoint/checkpoint.hpp"
#include "core/hostile_file.hpp"
#include "core/json_read.hpp"
#include "core/spec.hpp"
#include "core/text.hpp"

namespace troupe::checkpoint {

namespace {

using json = nlohmann::json;

constexpr const char* kManifest = "manifest.json";
// Steps, cursors and file sizes stay below 2^62: sums and products of a few cannot overflow.
constexpr int64_t kMaxCount = int64_t(1) << 62;

// A value as read, cut short for a message: a hostile manifest's values may be megabytes.
std::string shown(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 60) s = s.substr(0, 60) + "...";
  return s;
}

[[noreturn]] void refuse(const std::string& why) { throw RefusedCheckpoint("manifest.json: " + why); }

const json& need(const json& obj, const char* key, const std::string& name) {
  auto it = obj.find(key);
  if (it == obj.end()) refuse(name + " is missing");
  return *it;
}

// An integer in [lo, hi]: "layout.data is 1099511627776, outside [1, 65536]", "step is -5, ...",
// "files[0].size is 1e+300, not an integer".
int64_t integer(const json& v, const std::string& name, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) refuse(name + " is " + shown(v) + ", not an integer");
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(hi))
    refuse(name + " is " + shown(v) + ", outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi)
    refuse(name + " is " + shown(v) + ", outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

std::string string(const json& v, const std::string& name) {
  if (!v.is_string()) refuse(name + " is " + shown(v) + ", not a string");
  return v.get<std::string>();
}

bool is_hex16(const std::string& s) {
  if (s.size() != 16) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

}  // namespace

bool plain_file_name(const std::string& name) {
  return !name.empty() && name.size() <= 255 && name != "." && name != ".." &&
         name.find('/') == std::string::npos && name.find('\0') == std::string::npos && valid_utf8(name);
}

json to_json(const Manifest& m) {
  json files = json::array();
  for (const auto& f : m.files) files.push_back({{"name", f.name}, {"size", f.size}, {"xxh64", f.xxh64}});
  json j = {{"format", "troupe-checkpoint"},
            {"format_version", m.format_version},
            {"step", m.step},
            {"data_cursor", m.data_cursor},
            {"layout", {{"data", m.dp}, {"pipeline", m.pp}, {"tensor", m.tp}}},
            {"rng", {{"seed", m.seed}}},
            {"spec_hash", m.spec_hash},
            {"optimizer", m.optimizer},
            {"spec", m.spec_yaml},
            {"files", files}};
  if (!m.loss_scale.is_null()) j["loss_scale"] = m.loss_scale;
  return j;
}

Manifest manifest_from_json(const json& j, bool with_files) {
  if (!j.is_object()) refuse("the top level is " + std::string(j.type_name()) + ", not an object");
  auto format = j.find("format");
  if (format == j.end() || *format != "troupe-checkpoint")
    throw RefusedCheckpoint("not a troupe checkpoint manifest (its \"format\" is " +
                            (format == j.end() ? std::string("missing") : shown(*format)) + ")");
  Manifest m;
  const json& version = need(j, "format_version", "format_version");
  if (!version.is_number_integer() || version != kFormatVersion)
    refuse("format_version is " + shown(version) + ", this build reads " + std::to_string(kFormatVersion));
  m.step = integer(need(j, "step", "step"), "step", 0, kMaxCount);
  m.data_cursor = integer(need(j, "data_cursor", "data_cursor"), "data_cursor", 0, kMaxCount);
  const json& layout = need(j, "layout", "layout");
  if (!layout.is_object()) refuse("layout is " + shown(layout) + ", not an object");
  m.dp = int(integer(need(layout, "data", "layout.data"), "layout.data", 1, kMaxDataParallel));
  m.pp =
      int(integer(need(layout, "pipeline", "layout.pipeline"), "layout.pipeline", 1, kMaxPipelineParallel));
  m.tp = int(integer(need(layout, "tensor", "layout.tensor"), "layout.tensor", 1, kMaxTensorParallel));
  const json& rng = need(j, "rng", "rng");
  if (!rng.is_object()) refuse("rng is " + shown(rng) + ", not an object");
  const json& seed = need(rng, "seed", "rng.seed");
  if (!seed.is_number_unsigned()) refuse("rng.seed is " + shown(seed) + ", not an integer in [0, 2^64)");
  m.seed = seed.get<uint64_t>();
  if (auto it = j.find("spec_hash"); it != j.end()) m.spec_hash = string(*it, "spec_hash");
  if (auto it = j.find("spec"); it != j.end()) m.spec_yaml = string(*it, "spec");
  m.optimizer = json::object();
  if (auto it = j.find("optimizer"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) refuse("optimizer is " + shown(*it) + ", not an object");
    m.optimizer = *it;
  }
  if (auto it = j.find("loss_scale"); it != j.end()) {
    if (!it->is_object()) refuse("loss_scale is " + shown(*it) + ", not an object");
    m.loss_scale = *it;
  }
  const json& files = need(j, "files", "files");
  if (!files.is_array()) refuse("files is " + shown(files) + ", not an array of {name, size, xxh64}");
  if (with_files && files.empty()) refuse("files is empty: a checkpoint holds at least one shard file");
  std::set<std::string> names;
  for (size_t i = 0; i < files.size(); ++i) {
    const json& f = files[i];
    const std::string at = "files[" + std::to_string(i) + "]";
    if (!f.is_object()) refuse(at + " is " + shown(f) + ", not an object");
    FileRecord r;
    r.name = string(need(f, "name", at + ".name"), at + ".name");
    // A plain name inside the checkpoint directory: never "../x", "/etc/x" or "sub/x".
    if (!plain_file_name(r.name) || r.name == kManifest)
      refuse(at + ".name is " + shown(f.at("name")) + ", not the name of a file in the checkpoint directory");
    if (!names.insert(r.name).second) refuse(at + ".name " + shown(f.at("name")) + " is listed twice");
    r.size = uint64_t(integer(need(f, "size", at + ".size"), at + ".size", 0, kMaxCount));
    r.xxh64 = string(need(f, "xxh64", at + ".xxh64"), at + ".xxh64");
    if (!is_hex16(r.xxh64))
      refuse(at + ".xxh64 is " + shown(f.at("xxh64")) + ", not 16 lowercase hex digits");
    m.files.push_back(std::move(r));
  }
  return m;
}

std::string xxh64_of(int fd, const std::string& path) {
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  std::vector<char> buf(1 << 20);
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      XXH64_freeState(st);
      throw CheckpointError(path + ": cannot be read: " + std::strerror(e));
    }
    if (n == 0) break;
    XXH64_update(st, buf.data(), size_t(n));
  }
  const unsigned long long h = XXH64_digest(st);
  XXH64_freeState(st);
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", h);
  return out;
}

int open_checkpoint_file(const std::string& path, uint64_t* size) {
  try {
    return open_regular_file(path, "checkpoint file", size, Links::refuse);
  } catch (const IoError& e) {
    if (e.code() == ENOENT) throw CheckpointError(std::string(e.what()));
    throw RefusedCheckpoint(e.what());
  } catch (const Error& e) {
    throw RefusedCheckpoint(e.what());
  }
}

std::string file_xxh64(const std::string& path) {
  uint64_t size = 0;
  const int fd = open_checkpoint_file(path, &size);
  try {
    std::string h = xxh64_of(fd, path);
    ::close(fd);
    return h;
  } catch (...) {
    ::close(fd);
    throw;
  }
}

Manifest read_manifest(const std::string& dir) {
  const std::string path = dir + "/" + kManifest;
  json_read::Limits limits;
  limits.max_bytes = kMaxManifestBytes;
  json j;
  try {
    j = json_read::read_file(path, "checkpoint manifest", limits, Links::refuse);
  } catch (const IoError& e) {
    if (e.code() == ENOENT)
      throw CheckpointError(dir + ": manifest.json is missing (an uncommitted or damaged checkpoint)");
    throw RefusedCheckpoint(e.what());
  } catch (const Error& e) {
    throw RefusedCheckpoint(e.what());
  }
  try {
    return manifest_from_json(j);
  } catch (const RefusedCheckpoint& e) {
    throw RefusedCheckpoint(dir + ": " + e.what());
  }
}

namespace {

// The file `rec` of checkpoint `dir`: a regular file (never a link) of the manifest's size;
// with `hash`, also of the manifest's checksum. Throws as verify does.
void check_file(const std::string& dir, const FileRecord& rec, bool hash) {
  const std::string p = dir + "/" + rec.name;
  uint64_t size = 0;
  int fd = -1;
  try {
    fd = open_checkpoint_file(p, &size);
  } catch (const RefusedCheckpoint& e) {
    throw RefusedCheckpoint(dir + ": file " + rec.name + " is refused: " + e.what());
  } catch (const CheckpointError&) {
    throw CheckpointError(dir + ": file " + rec.name + " is missing");
  }
  std::string h;
  try {
    if (size != rec.size)
      throw CheckpointError(dir + ": file " + rec.name + " has " + std::to_string(size) +
                            " bytes, the manifest says " + std::to_string(rec.size) +
                            " (truncated or overwritten)");
    if (hash) h = xxh64_of(fd, p);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  if (hash && h != rec.xxh64)
    throw CheckpointError(dir + ": file " + rec.name + " checksum " + h + " does not match the manifest's " +
                          rec.xxh64 + " (corrupt)");
}

}  // namespace

Manifest verify(const std::string& dir) {
  Manifest m = read_manifest(dir);
  for (const auto& rec : m.files) check_file(dir, rec, true);
  return m;
}

Manifest check_files(const std::string& dir) {
  Manifest m = read_manifest(dir);
  for (const auto& rec : m.files) check_file(dir, rec, false);
  return m;
}

void verify_file(const std::string& dir, const FileRecord& rec) { check_file(dir, rec, true); }

}  // namespace troupe::checkpoint

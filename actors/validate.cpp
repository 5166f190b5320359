#include "actors/validate.hpp"

#include <algorithm>

#include "core/text.hpp"

namespace troupe::actors {

namespace {

bool word_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
         c == '-' || c == ':';
}

std::string generation_rank(int32_t generation, int32_t rank) {
  if (generation < 0) return "negative generation " + std::to_string(generation);
  if (rank < 0 || rank >= kMaxRanks) return "rank " + std::to_string(rank) + " out of range";
  return "";
}

// The rank a process was launched as: a place in a world, or a spare's launch rank.
std::string generation_launch_rank(int32_t generation, int32_t rank) {
  if (is_spare_rank(rank)) return generation < 0 ? "negative generation " + std::to_string(generation) : "";
  return generation_rank(generation, rank);
}

// A checkpoint file name: one plain path component.
std::string check_file_name(const std::string& name) {
  if (auto e = check_word(name, 255, "checkpoint file name"); !e.empty()) return e;
  if (name == "." || name == "..") return "checkpoint file name '" + name + "' is not a file";
  return "";
}

}  // namespace

std::string check_word(const std::string& s, size_t max, const char* what) {
  if (s.empty()) return std::string(what) + " is empty";
  if (s.size() > max) return std::string(what) + " is longer than " + std::to_string(max) + " bytes";
  if (!std::all_of(s.begin(), s.end(), word_char))
    return std::string(what) + " holds a byte outside [A-Za-z0-9._:-]";
  return "";
}

std::string check_text(const std::string& s, size_t max, const char* what) {
  if (s.size() > max) return std::string(what) + " is longer than " + std::to_string(max) + " bytes";
  if (auto at = invalid_utf8_at(s); at != std::string::npos)
    return std::string(what) + " is not valid UTF-8 (byte " + std::to_string(at) + ")";
  return "";
}

std::string check(const AgentHello& m) {
  if (auto e = check_word(m.host, kMaxHost, "host"); !e.empty()) return e;
  if (m.devices.empty()) return "no devices offered";
  if (m.devices.size() > kMaxDevices)
    return std::to_string(m.devices.size()) + " devices offered, at most " + std::to_string(kMaxDevices);
  for (const auto& d : m.devices)
    if (auto e = check_word(d, 64, "device"); !e.empty()) return e;
  return "";
}

std::string check(const WorkerHello& m) {
  if (auto e = check_word(m.job_id, kMaxId, "job id"); !e.empty()) return e;
  if (auto e = generation_launch_rank(m.generation, m.rank); !e.empty()) return e;
  if (auto e = check_word(m.host, kMaxHost, "host"); !e.empty()) return e;
  if (m.token.size() > kMaxId) return "launch token too long";
  return "";
}

std::string check(const WorkerExit& m) {
  if (auto e = check_word(m.job_id, kMaxId, "job id"); !e.empty()) return e;
  return generation_launch_rank(m.generation, m.rank);
}

std::string check(const WorkerStopped& m) {
  if (auto e = check_word(m.job_id, kMaxId, "job id"); !e.empty()) return e;
  if (m.pid <= 0) return "pid not positive";
  if (m.signal <= 0 || m.signal > 64) return "stop signal out of range";
  if (m.stopped_ms < 0) return "negative stopped time";
  return generation_launch_rank(m.generation, m.rank);
}

std::string check(const StepMetrics& m) {
  if (auto e = check_word(m.job_id, kMaxId, "job id"); !e.empty()) return e;
  if (auto e = generation_rank(m.generation, m.rank); !e.empty()) return e;
  if (m.step < 0) return "negative step";
  if (m.tokens < 0) return "negative token count";
  if (!(m.loss_scale >= 0 && m.loss_scale <= 1e300)) return "loss scale not a finite number >= 0";
  if (m.device_bytes < 0 || m.device_peak_bytes < m.device_bytes)
    return "device bytes negative or above their peak";
  if (m.snapshot_confirmed < -1) return "confirmed snapshot step below -1";
  return "";
}

std::string check(WorkerResult& m) {
  if (auto e = check_word(m.job_id, kMaxId, "job id"); !e.empty()) return e;
  if (auto e = generation_rank(m.generation, m.rank); !e.empty()) return e;
  // A failure report is kept even when its text is odd: the text is repaired.
  m.error_name = sanitize_utf8(m.error_name, kMaxId);
  m.message = sanitize_utf8(m.message, kMaxText);
  if (m.snapshots.size() > 2) return "more than two snapshots";
  for (int64_t n : m.snapshots)
    if (n < 0) return "negative snapshot step";
  if (m.held.size() > 2) return "more than two held copies";
  for (int64_t n : m.held)
    if (n < 0) return "negative held copy step";
  if (m.held_rank < -1 || m.held_rank >= kMaxRanks || (m.held_rank < 0 && !m.held.empty()))
    return "held copies of no valid rank";
  return "";
}

std::string check(const KillRequest& m) {
  if (auto e = check_word(m.job_id, kMaxId, "job id"); !e.empty()) return e;
  if (m.generations.size() != m.ranks.size()) return "kill request: generations and ranks differ in length";
  if (m.ranks.size() > static_cast<size_t>(kMaxRanks)) return "kill request: too many ranks";
  for (size_t i = 0; i < m.ranks.size(); ++i)
    if (auto e = generation_launch_rank(m.generations[i], m.ranks[i]); !e.empty()) return e;
  return "";
}

std::string check(const StoreKey& k) {
  if (auto e = check_word(k.job_id, kMaxId, "job id"); !e.empty()) return e;
  if (k.generation < 0) return "negative generation";
  if (k.group.size() > kMaxStoreKey || k.key.size() > kMaxStoreKey) return "store key too long";
  return "";
}

std::string check(const CkptShard& m) {
  if (auto e = check_word(m.job_id, kMaxId, "job id"); !e.empty()) return e;
  if (auto e = generation_rank(m.generation, m.rank); !e.empty()) return e;
  if (m.world < 1 || m.world > kMaxRanks || m.rank >= m.world) return "rank outside the world";
  if (m.step < 0) return "negative step";
  if (auto e = check_text(m.root, 4096, "checkpoint root"); !e.empty()) return e;
  if (auto e = check_text(m.manifest_json, kMaxManifest, "manifest"); !e.empty()) return e;
  if (m.files.size() > kMaxCkptFiles) return "too many checkpoint files";
  for (const auto& f : m.files) {
    if (auto e = check_file_name(f.name); !e.empty()) return e;
    if (auto e = check_word(f.xxh64, 32, "checksum"); !e.empty()) return e;
  }
  return "";
}

}  // namespace troupe::actors

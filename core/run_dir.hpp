// The run directory a user can rely on (docs/run-directory.md):
//
//   <runs root>/<job name>-<job id>/
//     spec.yaml        the resolved spec, every default filled in
//     events.log       one line per job event (start, eval, checkpoint, failure, end)
//     metrics.jsonl    one JSON object per optimizer step; eval lines carry val_loss
//     workers/<rank>.log
//     ckpt/            unless the spec puts checkpoints elsewhere
#pragma once

#include <cstdint>
#include <fstream>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <string>

namespace troupe {

// A job id: UTC time plus 4 random hex digits, e.g. "20261130-105823-3fa1".
std::string make_job_id();

class RunDir {
 public:
  // Creates <root>/<name>-<id>/ and its workers/ folder. Throws troupe::Error if it cannot.
  RunDir(const std::string& root, const std::string& job_name, const std::string& job_id);

  const std::string& path() const { return path_; }
  std::string worker_log(int rank) const;
  std::string default_ckpt_dir() const { return path_ + "/ckpt"; }

  void write_spec(const std::string& resolved_yaml);
  // Appends "<UTC time> <message>" to events.log and flushes.
  void event(const std::string& message);
  // Appends one JSON object as a line to metrics.jsonl and flushes.
  void metrics(const nlohmann::json& line);

 private:
  std::string path_;
  std::mutex mu_;
  std::ofstream events_, metrics_;
};

// "2026-11-30T10:58:23.123Z"
std::string utc_timestamp();

}  // namespace troupe

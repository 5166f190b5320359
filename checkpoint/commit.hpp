// The commit protocol of a checkpoint (DESIGN.md, "Model, names and checkpoints"):
//
//   every rank: write its shard files into <root>/step_N.tmp/ (fsynced), then report
//               ShardReport{step, rank, files with size and xxh64}
//   committer:  once all `world` ranks of (job generation, step) reported, write
//               manifest.json listing every file, fsync, rename to step_N, move `latest`
//
// The committer is the coordinator for a job of worker processes; InProcessCommitter
// does the same for ranks that are threads of one process. CommitTracker is the pure
// bookkeeping both share.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.hpp"

namespace troupe::checkpoint {

// What one rank reports after its files are on disk.
struct ShardReport {
  std::string root;  // the checkpoint root (step_N.tmp lies under it)
  int64_t step = 0;
  int rank = 0;
  int world = 1;              // ranks that report for this step
  int keep = 0;               // checkpoint.keep
  std::string manifest_json;  // the manifest without its file list (same on every rank)
  std::vector<FileRecord> files;
};

// A complete set of reports: what commit() needs.
struct ReadyCommit {
  std::string root;
  Manifest manifest;
  int keep = 0;
};

class CommitTracker {
 public:
  // Records a report of `key` (a job generation). Returns the commit once every rank of that
  // step has reported; a second report of the same rank replaces the first. Throws
  // CheckpointError when reports of one step disagree (root, world).
  std::optional<ReadyCommit> add(const std::string& key, const ShardReport& report);
  // Drops the partial sets of `key` (its generation ended); returns how many steps were pending.
  size_t forget(const std::string& key);
  size_t pending() const { return sets_.size(); }

 private:
  struct Set {
    std::string root;
    int world = 0;
    int keep = 0;
    std::string manifest_json;
    std::map<int, std::vector<FileRecord>> by_rank;
  };
  std::map<std::pair<std::string, int64_t>, Set> sets_;
};

// For ranks that are threads of one process (tests, single-host tools): report() blocks
// until every rank of that step has reported and the last one has committed, then returns
// the committed directory (or throws what the commit threw). Waits at most `timeout`.
class InProcessCommitter {
 public:
  explicit InProcessCommitter(std::chrono::milliseconds timeout = std::chrono::minutes(5))
      : timeout_(timeout) {}
  std::string report(const ShardReport& r);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  CommitTracker tracker_;
  std::map<int64_t, std::string> done_;   // step -> committed dir
  std::map<int64_t, std::string> error_;  // step -> why the commit failed
  std::chrono::milliseconds timeout_;
};

}  // namespace troupe::checkpoint

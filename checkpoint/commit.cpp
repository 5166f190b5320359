#include "checkpoint/commit.hpp"

#include <algorithm>

#include "core/json_read.hpp"

namespace troupe::checkpoint {

std::optional<ReadyCommit> CommitTracker::add(const std::string& key, const ShardReport& r) {
  if (r.world < 1 || r.rank < 0 || r.rank >= r.world)
    throw CheckpointError("shard report of rank " + std::to_string(r.rank) + " does not fit world " +
                          std::to_string(r.world));
  Set& s = sets_[{key, r.step}];
  if (s.world == 0) {
    s.root = r.root;
    s.world = r.world;
    s.keep = r.keep;
  }
  if (s.root != r.root || s.world != r.world)
    throw CheckpointError("rank " + std::to_string(r.rank) + " reports step " + std::to_string(r.step) +
                          " under " + r.root + " of " + std::to_string(r.world) + " ranks; others said " +
                          s.root + " of " + std::to_string(s.world));
  if (!r.manifest_json.empty() && (s.manifest_json.empty() || r.rank == 0)) s.manifest_json = r.manifest_json;
  for (const auto& f : r.files)
    if (!plain_file_name(f.name) || f.name == "manifest.json")
      throw CheckpointError("rank " + std::to_string(r.rank) + " reports a file named \"" +
                            f.name.substr(0, 60) + "\": not a plain name inside the checkpoint directory");
  s.by_rank[r.rank] = r.files;
  if (int(s.by_rank.size()) < s.world) return std::nullopt;

  ReadyCommit out;
  out.root = s.root;
  out.keep = s.keep;
  nlohmann::json j;
  try {
    json_read::Limits limits;
    limits.max_bytes = kMaxManifestBytes;
    j = json_read::parse(s.manifest_json, "step " + std::to_string(r.step) + ": the reported manifest",
                         limits);
  } catch (const Error& e) {
    throw CheckpointError(e.what());
  }
  if (!j.is_object())
    throw CheckpointError("step " + std::to_string(r.step) + ": the reported manifest is not an object");
  j["files"] = nlohmann::json::array();
  out.manifest = manifest_from_json(j, /*with_files=*/false);
  for (auto& [rank, files] : s.by_rank)
    for (auto& f : files) out.manifest.files.push_back(f);
  if (out.manifest.step != r.step)
    throw CheckpointError("reports of step " + std::to_string(r.step) + " carry a manifest of step " +
                          std::to_string(out.manifest.step));
  sets_.erase({key, r.step});
  return out;
}

size_t CommitTracker::forget(const std::string& key) {
  size_t n = 0;
  for (auto it = sets_.begin(); it != sets_.end();) {
    if (it->first.first == key) {
      it = sets_.erase(it);
      ++n;
    } else {
      ++it;
    }
  }
  return n;
}

std::string InProcessCommitter::report(const ShardReport& r) {
  std::unique_lock<std::mutex> lock(mu_);
  std::optional<ReadyCommit> ready = tracker_.add("local", r);
  if (ready) {
    try {
      done_[r.step] = commit(ready->root, ready->manifest, ready->keep);
    } catch (const std::exception& e) {
      error_[r.step] = e.what();
    }
    cv_.notify_all();
  } else if (!cv_.wait_for(lock, timeout_, [&] { return done_.count(r.step) || error_.count(r.step); })) {
    throw CheckpointError("step " + std::to_string(r.step) + ": not every rank reported its shard in time");
  }
  if (error_.count(r.step)) throw CheckpointError(error_[r.step]);
  return done_[r.step];
}

}  // namespace troupe::checkpoint

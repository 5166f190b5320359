// What committing a checkpoint of N shards costs its committer (the coordinator's, for a job
// of worker processes), at sizes no machine here runs as processes: N ranks' reports (two
// small files each, written into step_S.tmp as the ranks would) collected by a CommitTracker,
// then checkpoint::commit (the manifest written and fsynced, the directory renamed, `latest`
// moved). Prints, per size, the median time of the reports' collection and of the commit.
//
//   build/bench/commit_cost [--ranks 256,1024,4096,16384] [--repeat 3] [--dir DIR]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/commit.hpp"

namespace fs = std::filesystem;
using namespace troupe::checkpoint;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string file_name(int rank, int i) {
  char b[48];
  std::snprintf(b, sizeof b, "rank%06d.%s", rank, i == 0 ? "params" : "optim");
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> sizes = {256, 1024, 4096, 16384};
  int repeat = 3;
  std::string dir = fs::temp_directory_path().string() + "/troupe-commit-cost";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--ranks" && i + 1 < argc) {
      sizes.clear();
      std::stringstream ss(argv[++i]);
      for (std::string t; std::getline(ss, t, ',');) sizes.push_back(std::max(1, std::atoi(t.c_str())));
    } else if (a == "--repeat" && i + 1 < argc) {
      repeat = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--dir" && i + 1 < argc) {
      dir = argv[++i];
    } else {
      std::fprintf(stderr, "usage: commit_cost [--ranks N,N,...] [--repeat R] [--dir DIR]\n");
      return 2;
    }
  }
  std::printf(
      "| ranks | files | reports collected, ms | commit, ms | manifest, KiB |\n|---:|---:|---:|---:|---:|\n");
  for (int n : sizes) {
    std::vector<double> collect, commit_ms;
    uint64_t manifest_bytes = 0;
    for (int r = 0; r < repeat; ++r) {
      const std::string root = dir + "/n" + std::to_string(n);
      fs::remove_all(root);
      const int64_t step = 100 + r;
      const std::string tmp = root + "/" + step_dir_name(step) + ".tmp";
      fs::create_directories(tmp);
      std::vector<ShardReport> reports(static_cast<size_t>(n));
      Manifest m;
      m.step = step;
      m.data_cursor = step;
      m.dp = n;
      m.optimizer = {{"type", "adamw"}};
      nlohmann::json mj = to_json(m);
      mj.erase("files");
      for (int rank = 0; rank < n; ++rank) {
        ShardReport& rep = reports[size_t(rank)];
        rep.root = root;
        rep.step = step;
        rep.rank = rank;
        rep.world = n;
        rep.keep = 2;
        rep.manifest_json = rank == 0 ? mj.dump() : "";
        for (int f = 0; f < 2; ++f) {
          const std::string name = file_name(rank, f);
          std::ofstream(tmp + "/" + name) << "x";
          rep.files.push_back({name, 1, "0123456789abcdef"});
        }
      }
      CommitTracker tracker;
      auto t0 = Clock::now();
      std::optional<ReadyCommit> ready;
      for (const auto& rep : reports) ready = tracker.add("job/0", rep);
      collect.push_back(ms_since(t0));
      if (!ready) {
        std::fprintf(stderr, "commit_cost: the reports did not complete a commit\n");
        return 1;
      }
      t0 = Clock::now();
      const std::string done = commit(ready->root, ready->manifest, ready->keep);
      commit_ms.push_back(ms_since(t0));
      manifest_bytes = fs::file_size(done + "/manifest.json");
    }
    std::printf("| %d | %d | %.1f | %.1f | %.0f |\n", n, 2 * n, median(collect), median(commit_ms),
                double(manifest_bytes) / 1024.0);
    fs::remove_all(dir + "/n" + std::to_string(n));
  }
  fs::remove_all(dir);
  return 0;
}

// `troupe run --trace` on a 1x2x1 1F1B job with worker processes: each rank writes its trace,
// `troupe trace merge` joins them, and the merged timeline holds exactly the schedule's ops of
// every traced step, in the table's order, between the batches of the pipeline.
#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/support.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using Result = troupe::testing::CommandResult;

std::string only_run_dir(const std::string& root) {
  std::vector<std::string> runs;
  for (const auto& e : fs::directory_iterator(root)) runs.push_back(e.path().string());
  REQUIRE(runs.size() == 1);
  return runs[0];
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  return json::parse(in);
}

}  // namespace

TEST_CASE("trace: a 1x2x1 1f1b job's ranks trace their schedule, and merge shows each step's bubble",
          "[cli][trace]") {
  const std::string tmp = troupe::testing::temp_dir("trace_run");
  const Result r = troupe::testing::run_troupe(
      "run -q configs/layouts/tiny_dp1_pp2_tp1_1f1b.yaml --trace 3 "
      "--runs-dir " +
      tmp + "/runs");
  INFO(r.out);
  REQUIRE(r.code == 0);
  const std::string run = only_run_dir(tmp + "/runs");
  for (int rank : {0, 1}) REQUIRE(fs::is_regular_file(run + "/trace/rank" + std::to_string(rank) + ".json"));

  const Result m = troupe::testing::run_troupe("trace merge " + run);
  INFO(m.out);
  REQUIRE(m.code == 0);
  CHECK(m.out.find("merged 2 ranks, 3 steps (steps 1..3)") != std::string::npos);
  // One line per traced step, its bubble a share strictly between 0 and 1.
  int lines = 0;
  std::istringstream out(m.out);
  for (std::string line; std::getline(out, line);) {
    std::istringstream f(line);
    long step = -1;
    double wall = 0;
    std::string compute, comm, other, idle, bubble;
    if (!(f >> step >> wall >> compute >> comm >> other >> idle >> bubble) || step < 1 || step > 3) continue;
    ++lines;
    const double b = std::stod(bubble);
    CHECK(b > 0.0);
    CHECK(b < 100.0);
  }
  CHECK(lines == 3);

  // The merged file: one process per rank; on each rank's engine track, the compute ops of each
  // traced step are the 1F1B table of that rank (global batch 8 of micro-batch 2: 4 micro-batches).
  const json merged = read_json(run + "/trace/merged.json");
  const std::map<int, std::string> table = {{0, "F0 F1 B0 F2 B1 F3 B2 B3"}, {1, "F0 B0 F1 B1 F2 B2 F3 B3"}};
  std::map<int, std::map<int64_t, std::string>> ops;  // [pid][step] -> names in time order
  std::map<int, std::vector<std::pair<int64_t, std::string>>> seen;
  for (const json& e : merged.at("traceEvents")) {
    if (e.value("ph", "") != "X" || e.value("cat", "") != "compute" || e.value("tid", -1) != 0) continue;
    seen[e.at("pid").get<int>()].push_back({e.at("ts").get<int64_t>(), e.at("name").get<std::string>()});
  }
  REQUIRE(seen.size() == 2);
  for (auto& [pid, list] : seen) {
    std::sort(list.begin(), list.end());
    std::string all;
    for (const auto& [ts, name] : list) all += (all.empty() ? "" : " ") + name;
    INFO("rank " << pid << ": " << all);
    // Three traced steps of the same table.
    CHECK(all == table.at(pid) + " " + table.at(pid) + " " + table.at(pid));
  }
  fs::remove_all(tmp);
}

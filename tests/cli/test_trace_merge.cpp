// `troupe trace merge` as a user meets it: two rank files in a run directory, the summary and
// table printed, merged.json written; damaged or missing input exits 2 with a named message.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/trace.hpp"
#include "tests/support/support.hpp"
#include "tests/support/trace_span.hpp"

namespace fs = std::filesystem;
using namespace troupe::trace;

namespace {

using Result = troupe::testing::CommandResult;

Result cli(const std::string& args) { return troupe::testing::run_troupe(args); }

using troupe::testing::span;

// Steps 3 and 4 of a two-stage pipeline; rank 1's clock runs 250 us behind rank 0's.
//   step 3: rank 0 [0,1000): schedule [0,800), F [0,200), B [200,600), comm [600,700),
//           optimizer [800,900) -> compute .6 comm .1 other .1 idle .2, bubble 1 - 600/800 = .25
//           rank 1 [0,3000): schedule [0,3000), F [0,1500), comm [1500,1800) on the engine,
//           a reducer-track comm that does not count -> compute .5 comm .1 idle .4, bubble .5
//   step 4: rank 0 [1000,2000): F [1000,1500) -> compute .5 idle .5 (no schedule)
//           rank 1 [3000,4000): data [3000,3100) -> other .1 idle .9
//   mean:   step 3  wall 2.0 ms  compute 55%  comm 10%  other 5%  idle 30%  bubble 37.5%
//           step 4  wall 1.0 ms  compute 25%  comm 0%   other 5%  idle 70%  bubble -
void write_run(const std::string& trace_dir) {
  const RankInfo r0{0, 2, "1x2x1", "rank 0: dp 0 pp 0 tp 0, layers [0,2)", 0, 3, 2};
  write_rank_trace(trace_dir + "/rank0.json", r0,
                   {span("step", "step 3", 0, 1000, 3), span("schedule", "1f1b", 0, 800, 3),
                    span("compute", "F0", 0, 200, 3), span("compute", "B0", 200, 400, 3),
                    span("comm", "p2p batch", 600, 100, 3), span("optimizer", "optimizer", 800, 100, 3),
                    span("step", "step 4", 1000, 1000, 4), span("compute", "F0", 1000, 500, 4)});
  const RankInfo r1{1, 2, "1x2x1", "rank 1: dp 0 pp 1 tp 0, layers [2,4)+head", 250, 3, 2};
  write_rank_trace(trace_dir + "/rank1.json", r1,
                   {span("step", "step 3", 0, 3000, 3), span("schedule", "1f1b", 0, 3000, 3),
                    span("compute", "F0", 0, 1500, 3), span("comm", "p2p batch", 1500, 300, 3),
                    span("comm", "allreduce bucket 0", 1800, 900, 3, kReducer),
                    span("step", "step 4", 3000, 1000, 4), span("data", "batch", 3000, 100, 4)});
}

}  // namespace

TEST_CASE("cli: trace merge prints each step's shares and writes merged.json", "[cli][trace]") {
  const std::string run = troupe::testing::temp_dir("trace_cli");
  write_run(run + "/trace");

  const Result r = cli("trace merge " + run);
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("troupe: merged 2 ranks, 2 steps (steps 3..4) into " + run + "/trace/merged.json\n") !=
        std::string::npos);
  CHECK(r.out.find("step   wall ms  compute    comm   other    idle  bubble\n") != std::string::npos);
  CHECK(r.out.find("   3       2.0    55.0%   10.0%    5.0%   30.0%   37.5%\n") != std::string::npos);
  CHECK(r.out.find("   4       1.0    25.0%    0.0%    5.0%   70.0%       -\n") != std::string::npos);

  std::ifstream in(run + "/trace/merged.json");
  const auto doc = nlohmann::json::parse(in);
  int processes = 0;
  int64_t rank1_f0 = -1;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") ++processes;
    if (e["ph"] == "X" && e["pid"] == 1 && e["name"] == "F0") rank1_f0 = e["ts"].get<int64_t>();
  }
  CHECK(processes == 2);
  CHECK(rank1_f0 == 250);

  // The trace folder itself, and --out elsewhere.
  const Result r2 = cli("trace merge " + run + "/trace --out " + run + "/elsewhere/all.json");
  INFO(r2.out);
  CHECK(r2.code == 0);
  CHECK(r2.out.find("into " + run + "/elsewhere/all.json") != std::string::npos);
  CHECK(fs::is_regular_file(run + "/elsewhere/all.json"));
}

TEST_CASE("cli: trace merge refuses damaged and missing input with exit 2", "[cli][trace]") {
  const std::string run = troupe::testing::temp_dir("trace_cli_bad");

  const Result missing = cli("trace merge " + run + "/nope");
  CHECK(missing.code == 2);
  CHECK(missing.out.find(run + "/nope: no such directory") != std::string::npos);

  fs::create_directories(run + "/trace");
  const Result empty = cli("trace merge " + run);
  CHECK(empty.code == 2);
  CHECK(empty.out.find("no rank<r>.json trace files") != std::string::npos);

  write_run(run + "/trace");
  std::ofstream(run + "/trace/rank1.json", std::ios::trunc) << R"({"traceEvents": [ {"ph": "X", )";
  const Result damaged = cli("trace merge " + run);
  INFO(damaged.out);
  CHECK(damaged.code == 2);
  CHECK(damaged.out.find(run + "/trace/rank1.json: not valid JSON") != std::string::npos);
  CHECK_FALSE(fs::exists(run + "/trace/merged.json"));

  const Result usage = cli("trace merge");
  CHECK(usage.code == 2);
}

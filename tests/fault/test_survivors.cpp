// Survivors stay: when one rank of a job dies or stops, only its place is relaunched. Every
// other rank keeps its worker process (same pid, device and rank) and builds the next
// generation's engine in it, from its in-memory snapshot of the newest step every rank
// completed; the new rank receives a data-parallel replica's. No completed step is trained
// again and the loss curve is the uninterrupted run's, bit for bit. Where no replica holds
// the failed rank's state (data 1, or ZeRO's sharded moments) the job resumes from its newest
// checkpoint instead, and says why.
//
// The jobs are endless (kEndlessSteps) and cancelled once the test has seen what it needs;
// their curves are compared with an uninterrupted run of the same spec (see test_fault.cpp).
#include <catch2/catch.hpp>
#include <fstream>
#include <random>
#include <set>

#include "tests/fault/fault.hpp"

using namespace troupe::test;
using nlohmann::json;
using troupe::testing::kEndlessSteps;

namespace {

// configs/layouts/<file>.yaml as an endless job named `name`, with a checkpoint every 5 steps,
// up to 3 restarts, and `train_extra` added to its train section.
std::string layout_spec(const std::string& file, const std::string& name,
                        const std::string& train_extra = "") {
  std::string s = read_file(std::string(TROUPE_SOURCE_DIR) + "/configs/layouts/" + file + ".yaml");
  auto replace = [&](const std::string& from, const std::string& to) {
    auto p = s.find(from);
    REQUIRE(p != std::string::npos);
    s.replace(p, from.size(), to);
  };
  const auto name_at = s.find("name: ");
  REQUIRE(name_at != std::string::npos);
  s.replace(name_at, s.find('\n', name_at) - name_at, "name: " + name);
  replace("steps: 10", "steps: " + std::to_string(kEndlessSteps));
  if (!train_extra.empty()) replace("  seed: 0\n", "  seed: 0\n" + train_extra);
  return s + "\ncheckpoint:\n  every: 5\n  keep: 3\nfault:\n  max_restarts: 3\n";
}

// How many steps metrics.jsonl holds more than once.
int steps_twice(const std::string& run_dir) {
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::set<int64_t> seen;
  int twice = 0;
  for (std::string line; std::getline(in, line);) {
    auto m = nlohmann::json::parse(line, nullptr, false);
    if (m.is_object() && m.contains("loss")) twice += !seen.insert(m["step"].get<int64_t>()).second;
  }
  return twice;
}

// Kills (SIGKILL) or stops (SIGSTOP) one random rank of a running `world`-rank job mid-run and
// checks that the next generation keeps every other rank's process and trains on the curve:
// from memory (no step twice, the same losses bit for bit) when `fallback` is empty, else from
// the newest checkpoint with `fallback` named in events.log.
void one_rank_fails(const std::string& file, int world, int sig, const std::string& train_extra = "",
                    const std::string& fallback = "") {
  Cluster c;
  REQUIRE(c.ready());
  c.add_agent("cpu:" + std::to_string(world));
  REQUIRE(c.wait_devices(world));
  std::string job = c.call({{"op", "submit"}, {"spec", layout_spec(file, "survivors", train_extra)}})["job"];
  std::mt19937 rng(std::random_device{}());
  const int at = std::uniform_int_distribution<int>(3, 25)(rng);
  const int victim_rank = std::uniform_int_distribution<int>(0, world - 1)(rng);
  INFO(file << ": signal " << sig << " to rank " << victim_rank << " after step " << at);
  PidLog pids;
  REQUIRE(wait_steps(c, job, at, pids, 0));
  const std::vector<int> before = worker_pids(c.status(job));
  REQUIRE(static_cast<int>(before.size()) == world);
  REQUIRE(::kill(before[victim_rank], sig) == 0);
  REQUIRE(wait_running(c, job, 1, pids, [](const json& s) {
    return !s["failures"].empty() &&
           s["steps_done"].get<int64_t>() >= s["failures"][0]["step"].get<int64_t>() + 10;
  }));

  auto st = c.status(job);
  CHECK(st["restarts"] == 1);
  REQUIRE(st["failures"].size() == 1);
  CHECK(st["failures"][0]["rank"] == victim_rank);
  const std::vector<int> after = worker_pids(st);
  REQUIRE(after.size() == before.size());
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r);
    if (r == victim_rank)
      CHECK(after[r] != before[r]);
    else
      CHECK(after[r] == before[r]);  // the same process serves generation 1
  }
  const std::string run_dir = st["run_dir"];
  const std::string events = read_file(run_dir + "/events.log");
  CHECK(events.find(std::to_string(world - 1) + " rank(s) kept their process") != std::string::npos);
  INFO("events.log:\n" << events);
  if (fallback.empty()) {
    CHECK(events.find("resuming from in-memory snapshots of step") != std::string::npos);
    CHECK(st["memory_step"].get<int64_t>() > 0);
  } else {
    CHECK(events.find("in-memory snapshots not used: ") != std::string::npos);
    CHECK(events.find(fallback) != std::string::npos);
    CHECK(st["memory_step"] == -1);
  }
  // Only the failed rank's place started a process of generation 1.
  for (int r = 0; r < world; ++r)
    CHECK(std::filesystem::exists(run_dir + "/workers/" + std::to_string(r) + ".g1.log") ==
          (r == victim_rank));
  cancel(c, job, pids);
  if (sig == SIGSTOP) ::kill(before[victim_rank], SIGKILL);  // killed by its agent already
  auto curve = loss_curve(run_dir);
  REQUIRE(!curve.empty());
  REQUIRE(curve.begin()->first == 0);
  REQUIRE(curve.rbegin()->first + 1 == static_cast<int64_t>(curve.size()));
  auto ref = reference(c, layout_spec(file, "survivors-ref", train_extra), curve.size());
  for (const auto& [s, loss] : ref) {
    INFO("step " << s);
    if (fallback.empty())
      CHECK(curve[s] == loss);
    else
      CHECK(curve[s] == Approx(loss).margin(1e-4));
  }
  if (fallback.empty()) CHECK(steps_twice(run_dir) == 0);
}

}  // namespace

TEST_CASE("survivors stay: a rank SIGKILLed under 2x1x1 is replaced alone from memory, no step trained twice",
          "[fault][survivors][multiprocess]") {
  one_rank_fails("tiny_dp2_pp1_tp1", 2, SIGKILL);
}

TEST_CASE("survivors stay: a rank SIGKILLed under 1x2x1 is replaced alone from the checkpoint (no replica)",
          "[fault][survivors][multiprocess]") {
  one_rank_fails("tiny_dp1_pp2_tp1_1f1b", 2, SIGKILL, "", "has no data-parallel replica");
}

TEST_CASE("survivors stay: a rank SIGKILLed under 1x1x2 is replaced alone from the checkpoint (no replica)",
          "[fault][survivors][multiprocess]") {
  one_rank_fails("tiny_dp1_pp1_tp2", 2, SIGKILL, "", "has no data-parallel replica");
}

TEST_CASE("survivors stay: a rank SIGKILLed under 2x2x1 is replaced alone from memory, no step trained twice",
          "[fault][survivors][multiprocess]") {
  one_rank_fails("tiny_dp2_pp2_tp1", 4, SIGKILL);
}

TEST_CASE(
    "survivors stay: a rank SIGKILLed under 2x1x1 with ZeRO 2 is replaced alone from the checkpoint "
    "(sharded)",
    "[fault][survivors][multiprocess]") {
  one_rank_fails("tiny_dp2_pp1_tp1", 2, SIGKILL, "  zero: 2\n", "hold sharded state (train.zero)");
}

TEST_CASE("survivors stay: a SIGSTOPped rank is killed and replaced alone from memory, no step trained twice",
          "[fault][survivors][multiprocess]") {
  one_rank_fails("tiny_dp2_pp1_tp1", 2, SIGSTOP);
}

// Survivors stay: when one rank of a job dies or stops, only its place is relaunched. Every
// other rank keeps its worker process (same pid, device and rank) and builds the next
// generation's engine in it, from its in-memory snapshot of the newest step every rank
// completed; the new rank receives the copy its buddy holds. No completed step is trained
// again and the loss curve is the uninterrupted run's, bit for bit, whatever the layout. Where
// the copy is lost (the buddy died too) or damaged (it fails its checksum) the job resumes from
// its newest checkpoint instead, and says why.
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
// up to 3 restarts, `train_extra` added to its train section and `spares` hot spares.
std::string layout_spec(const std::string& file, const std::string& name, const std::string& train_extra = "",
                        int spares = 0) {
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
  if (spares > 0) s += "\nresources:\n  spares: " + std::to_string(spares) + "\n";
  return s + "\ncheckpoint:\n  every: 5\n  keep: 3\nfault:\n  max_restarts: 3\n";
}

// How many completed steps metrics.jsonl holds twice: a step published again after every
// rank's buddy had confirmed the snapshot that follows it (snapshot_confirmed passed it). A
// step published while its snapshot's copy was still in flight is not completed: the next
// generation may train it again (from the snapshot before it), on the same curve.
int completed_twice(const std::string& run_dir) {
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::set<int64_t> seen;
  int64_t confirmed = -1;
  int twice = 0;
  for (std::string line; std::getline(in, line);) {
    auto m = nlohmann::json::parse(line, nullptr, false);
    if (!m.is_object() || !m.contains("loss")) continue;
    const int64_t step = m["step"].get<int64_t>();
    if (!seen.insert(step).second && step < confirmed) ++twice;
    if (m.contains("snapshot_confirmed"))
      confirmed = std::max(confirmed, m["snapshot_confirmed"].get<int64_t>());
  }
  return twice;
}

// What is done to a running job.
struct Fault {
  Fault(std::string f, int w, int s = SIGKILL, std::string extra = "", std::string fb = "")
      : file(std::move(f)), world(w), sig(s), train_extra(std::move(extra)), fallback(std::move(fb)) {}
  std::string file;  // configs/layouts/<file>.yaml
  int world = 2;
  int sig = SIGKILL;  // sent to one random rank mid-run
  std::string train_extra;
  // Empty: the next generation continues from memory. Else it resumes from the newest
  // checkpoint and events.log says this.
  std::string fallback;
  bool with_buddy = false;  // the rank holding the victim's snapshot copies is killed with it
  bool corrupt = false;     // TROUPE_SNAPSHOT_FAULT=corrupt: every copy held is damaged in memory
  bool spare = false;       // resources.spares 1: the spare's process takes the victim's place
  // TROUPE_BUDDY_SHM=0: snapshots in private memory, every copy sent over the buddy link though
  // the ranks share a host (else each buddy maps its partner's snapshots).
  bool private_memory = false;
  // Whether the job copies snapshots to buddies: none when its data-parallel replicas hold the
  // same state (train.zero 0), and the new rank heals from a replica.
  bool buddies = true;
};

// The pids of the job's spares that registered and wait for a place.
std::vector<int> ready_spares(const json& status) {
  std::vector<int> out;
  for (const auto& v : status.value("spares", json::array()))
    if (v.value("ready", false)) out.push_back(v.value("pid", 0));
  return out;
}

// Kills (SIGKILL) or stops (SIGSTOP) one random rank of a running job mid-run (with its buddy:
// two) and checks that the next generation keeps every other rank's process and trains on the
// curve: from memory (no step twice, the same losses bit for bit) when `fallback` is empty, else
// from the newest checkpoint with `fallback` named in events.log.
void ranks_fail(const Fault& f) {
  const int world = f.world;
  if (f.corrupt) ::setenv("TROUPE_SNAPSHOT_FAULT", "corrupt", 1);
  if (f.private_memory) ::setenv("TROUPE_BUDDY_SHM", "0", 1);
  Cluster c;
  REQUIRE(c.ready());
  c.add_agent("cpu:" + std::to_string(world + (f.spare ? 1 : 0)));  // its workers inherit the environment
  ::unsetenv("TROUPE_SNAPSHOT_FAULT");
  ::unsetenv("TROUPE_BUDDY_SHM");
  REQUIRE(c.wait_devices(world + (f.spare ? 1 : 0)));
  std::string job = c.call(
      {{"op", "submit"}, {"spec", layout_spec(f.file, "survivors", f.train_extra, f.spare ? 1 : 0)}})["job"];
  std::mt19937 rng(std::random_device{}());
  const int at = std::uniform_int_distribution<int>(3, 25)(rng);
  const int victim_rank = std::uniform_int_distribution<int>(0, world - 1)(rng);
  INFO(f.file << ": signal " << f.sig << " to rank " << victim_rank << " after step " << at);
  PidLog pids;
  REQUIRE(wait_steps(c, job, at, pids, 0));
  std::vector<int> spares;
  if (f.spare) {
    REQUIRE(wait_until([&] { return ready_spares(c.status(job)).size() == 1; }, std::chrono::seconds(60)));
    spares = ready_spares(c.status(job));
  }
  const std::vector<int> before = worker_pids(c.status(job));
  REQUIRE(static_cast<int>(before.size()) == world);
  std::set<int> victims = {victim_rank};
  if (f.with_buddy) {
    const int shift = c.status(job)["buddy_shift"];
    REQUIRE(shift > 0);
    victims.insert((victim_rank + shift) % world);
  }
  for (int v : victims) REQUIRE(::kill(before[v], f.sig) == 0);
  // A damaged copy fails the generation that heals from it: one more restart, from disk.
  const size_t restarts = f.corrupt ? 2 : 1;
  const bool recovered = wait_running(c, job, static_cast<int>(restarts), pids, [&](const json& s) {
    return s["failures"].size() == restarts &&
           s["steps_done"].get<int64_t>() >= s["failures"].back()["step"].get<int64_t>() + 10;
  });
  if (!recovered) {
    const json s = c.status(job);
    INFO("status: " << s.dump(1) << "\nevents.log:\n" << read_file(s.value("run_dir", "") + "/events.log"));
    REQUIRE(recovered);
  }

  auto st = c.status(job);
  CHECK(st["restarts"] == restarts);
  REQUIRE(st["failures"].size() == restarts);
  CHECK(victims.count(st["failures"][0]["rank"].get<int>()) == 1);
  const std::vector<int> after = worker_pids(st);
  REQUIRE(after.size() == before.size());
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r);
    if (f.spare && victims.count(r))
      CHECK(after[r] == spares[0]);  // the spare's process, started before the fault
    else if (victims.count(r))
      CHECK(after[r] != before[r]);
    else
      CHECK(after[r] == before[r]);  // the same process serves every later generation
  }
  const std::string run_dir = st["run_dir"];
  const std::string events = read_file(run_dir + "/events.log");
  const int kept = world - static_cast<int>(victims.size());
  CHECK(events.find(std::to_string(kept) + " rank(s) kept their process") != std::string::npos);
  INFO("events.log:\n" << events);
  CHECK((st["buddy_shift"].get<int>() > 0) == f.buddies);
  // On one host each buddy maps its partner's snapshots, unless they are kept private.
  if (f.buddies)
    for (int r = 0; r < world; ++r) {
      const std::string log = read_file(run_dir + "/workers/" + std::to_string(r) + ".log");
      INFO("rank " << r << "'s log:\n" << log);
      REQUIRE(log.find("assignment: ") != std::string::npos);
      CHECK((log.find("(its memory not mapped: ") != std::string::npos) == f.private_memory);
    }
  if (f.fallback.empty()) {
    CHECK(events.find("resuming from in-memory snapshots of step") != std::string::npos);
    CHECK(st["memory_step"].get<int64_t>() > 0);
    CHECK((events.find("receive their state from their buddy") != std::string::npos) == f.buddies);
  } else {
    CHECK(events.find("in-memory snapshots not used: ") != std::string::npos);
    CHECK(events.find(f.fallback) != std::string::npos);
    CHECK(st["memory_step"] == -1);
  }
  // Only the failed ranks' places started processes of later generations, unless a spare took it.
  for (int r = 0; r < world; ++r)
    for (size_t g = 1; g <= restarts; ++g)
      CHECK(std::filesystem::exists(run_dir + "/workers/" + std::to_string(r) + ".g" + std::to_string(g) +
                                    ".log") == (victims.count(r) == 1 && !f.spare));
  if (f.spare) {
    CHECK(events.find("1 place(s) taken by a spare") != std::string::npos);
    // A new spare starts in the place of the one used.
    CHECK(st["spares"].size() == 1);
    CHECK(std::filesystem::exists(run_dir + "/workers/spare1.log"));
  }
  cancel(c, job, pids);
  if (f.sig == SIGSTOP)
    for (int v : victims) ::kill(before[v], SIGKILL);  // killed by its agent already
  auto curve = loss_curve(run_dir);
  REQUIRE(!curve.empty());
  REQUIRE(curve.begin()->first == 0);
  REQUIRE(curve.rbegin()->first + 1 == static_cast<int64_t>(curve.size()));
  auto ref = reference(c, layout_spec(f.file, "survivors-ref", f.train_extra), curve.size());
  for (const auto& [s, loss] : ref) {
    INFO("step " << s);
    if (f.fallback.empty())
      CHECK(curve[s] == loss);
    else
      CHECK(curve[s] == Approx(loss).margin(1e-4));
  }
  if (f.fallback.empty()) CHECK(completed_twice(run_dir) == 0);
}

}  // namespace

TEST_CASE(
    "survivors stay: a rank SIGKILLed under 2x1x1 is replaced alone from its replica, no completed step "
    "trained "
    "twice",
    "[fault][survivors][multiprocess]") {
  Fault f{"tiny_dp2_pp1_tp1", 2};
  f.buddies = false;
  ranks_fail(f);
}

TEST_CASE("survivors stay: a rank SIGKILLed under 1x2x1 is replaced alone from its buddy's copy",
          "[fault][survivors][multiprocess]") {
  ranks_fail(Fault{"tiny_dp1_pp2_tp1_1f1b", 2});
}

TEST_CASE("survivors stay: a rank SIGKILLed under 1x1x2 is replaced alone from its buddy's copy",
          "[fault][survivors][multiprocess]") {
  ranks_fail(Fault{"tiny_dp1_pp1_tp2", 2});
}

TEST_CASE(
    "survivors stay: a rank SIGKILLed under 2x2x1 is replaced alone from its replica, no completed step "
    "trained "
    "twice",
    "[fault][survivors][multiprocess]") {
  Fault f{"tiny_dp2_pp2_tp1", 4};
  f.buddies = false;
  ranks_fail(f);
}

TEST_CASE("survivors stay: a rank SIGKILLed under 2x1x1 with ZeRO 2 is replaced alone from its buddy's copy",
          "[fault][survivors][multiprocess]") {
  ranks_fail(Fault{"tiny_dp2_pp1_tp1", 2, SIGKILL, "  zero: 2\n"});
}

TEST_CASE(
    "survivors stay: with snapshots in private memory a rank SIGKILLed under 1x2x1 is replaced from the copy "
    "its buddy received",
    "[fault][survivors][multiprocess]") {
  Fault f{"tiny_dp1_pp2_tp1_1f1b", 2};
  f.private_memory = true;
  ranks_fail(f);
}

TEST_CASE(
    "survivors stay: a SIGSTOPped rank is killed and replaced alone from memory, no completed step trained "
    "twice",
    "[fault][survivors][multiprocess]") {
  Fault f{"tiny_dp2_pp1_tp1", 2, SIGSTOP};
  f.buddies = false;
  ranks_fail(f);
}

TEST_CASE("survivors stay: a snapshot copy that fails its checksum falls back to the checkpoint, by name",
          "[fault][survivors][multiprocess]") {
  Fault f{"tiny_dp1_pp1_tp2", 2, SIGKILL, "", "fails its checksum"};
  f.corrupt = true;
  ranks_fail(f);
}

TEST_CASE("survivors stay: a rank killed with its buddy falls back to the checkpoint, by name",
          "[fault][survivors][multiprocess]") {
  Fault f{"tiny_dp1_pp2_tp2", 4, SIGKILL, "", "failed too (lost buddy)"};
  f.with_buddy = true;
  ranks_fail(f);
}

TEST_CASE("spares: a rank SIGKILLed under 1x2x1 is replaced by a spare started before the fault, from memory",
          "[fault][survivors][spares][multiprocess]") {
  Fault f{"tiny_dp1_pp2_tp1_1f1b", 2};
  f.spare = true;
  ranks_fail(f);
}

TEST_CASE("placement spread: a 1x2x1 job on two agents loses one and continues from its buddy's copy",
          "[fault][survivors][placement][multiprocess]") {
  Cluster c;
  REQUIRE(c.ready());
  c.add_agent("cpu:2");
  c.add_agent("cpu:2");
  REQUIRE(c.wait_devices(4));
  const std::string spec =
      layout_spec("tiny_dp1_pp2_tp1_1f1b", "spread") + "resources:\n  placement: spread\n";
  std::string job = c.call({{"op", "submit"}, {"spec", spec}})["job"];
  PidLog pids;
  REQUIRE(wait_steps(c, job, 8, pids, 0));
  auto st = c.status(job);
  // One rank on each agent; each rank's buddy is the other.
  REQUIRE(st["workers"].size() == 2);
  CHECK(st["workers"][0]["agent"] != st["workers"][1]["agent"]);
  CHECK(st["buddy_shift"] == 1);
  const int kept = worker_pids(st)[0];
  // The agent of rank 1 (the agents register in either order), and rank 1 with it.
  int agent_pid = 0;
  const json agents = c.call({{"op", "list"}})["agents"];
  for (const auto& ag : agents)
    if (ag["id"] == st["workers"][1]["agent"]) agent_pid = ag["pid"];
  INFO("agents: " << agents.dump() << "; rank 1 on " << st["workers"][1]["agent"]);
  REQUIRE(agent_pid > 0);
  REQUIRE(::kill(agent_pid, SIGKILL) == 0);
  const bool recovered = wait_running(c, job, 1, pids, [&](const json& s) {
    return s["failures"].size() == 1 &&
           s["steps_done"].get<int64_t>() >= s["failures"].back()["step"].get<int64_t>() + 10;
  });
  st = c.status(job);
  const std::string run_dir = st["run_dir"];
  const std::string events = read_file(run_dir + "/events.log");
  INFO("events.log:\n" << events);
  REQUIRE(recovered);
  CHECK(st["failures"][0]["cause"] == "agent_lost");
  CHECK(worker_pids(st)[0] == kept);  // rank 0 kept its process
  CHECK(events.find("resuming from in-memory snapshots of step") != std::string::npos);
  CHECK(events.find("1 rank(s) receive their state from their buddy") != std::string::npos);
  CHECK(st["memory_step"].get<int64_t>() > 0);
  cancel(c, job, pids);
  auto curve = loss_curve(run_dir);
  REQUIRE(!curve.empty());
  auto ref = reference(c, layout_spec("tiny_dp1_pp2_tp1_1f1b", "spread-ref"), curve.size());
  for (const auto& [s, loss] : ref) {
    INFO("step " << s);
    CHECK(curve[s] == loss);
  }
  CHECK(completed_twice(run_dir) == 0);
}

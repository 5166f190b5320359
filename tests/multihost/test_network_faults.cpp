// Network faults on the namespace cluster (netns.hpp): a partition that heals after
// the job recovered without the cut-off host, and links slowed or made lossy (netem, or
// where the kernel has no sch_netem, nftables and a tbf rate limit). Every wait is bounded
// as a failure guard; no test asserts a duration.
#include <signal.h>

#include <catch2/catch.hpp>
#include <iostream>
#include <set>

#include "core/failure.hpp"
#include "tests/multihost/curves.hpp"

namespace troupe::test {
namespace {

using namespace std::chrono_literals;

// The agents of a `list` answer on host `host`.
std::vector<nlohmann::json> agents_on(NetnsCluster& c, const std::string& host) {
  std::vector<nlohmann::json> out;
  auto r = c.call({{"op", "list"}});
  if (!r.value("ok", false)) return out;
  for (const auto& a : r["agents"])
    if (a["host"] == host) out.push_back(a);
  return out;
}

// The pids of a status's workers on `host`.
std::set<int> pids_on(const nlohmann::json& st, const std::string& host) {
  std::set<int> out;
  for (const auto& w : st["workers"])
    if (w["host"] == host && w["pid"].get<int>() > 0) out.insert(w["pid"].get<int>());
  return out;
}

// The hosts of a status's workers.
std::set<std::string> hosts_of(const nlohmann::json& st) {
  std::set<std::string> hosts;
  for (const auto& w : st["workers"]) hosts.insert(w["host"].get<std::string>());
  return hosts;
}

bool all_gone(const std::set<int>& pids) {
  for (int p : pids)
    if (process_alive(p)) return false;
  return true;
}

// Lines of a run's events.log.
std::vector<std::string> event_lines(const std::string& run_dir) {
  std::vector<std::string> out;
  std::istringstream in(read_file(run_dir + "/events.log"));
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// metrics.jsonl of a run that lost generation 0 to a cut: generations only grow down the
// file (no line of an ended generation after one of its successor), and no generation
// writes a step twice. A step twice is expected only across generations (a relaunch
// trains the steps after its checkpoint again).
void check_metrics_by_generation(const std::string& run_dir, int last_generation) {
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::set<std::pair<int, int64_t>> seen;
  int generation = 0;
  size_t lines = 0;
  for (std::string line; std::getline(in, line);) {
    auto m = nlohmann::json::parse(line, nullptr, false);
    if (!m.is_object() || !m.contains("loss")) continue;
    ++lines;
    const int g = m["generation"];
    const int64_t step = m["step"];
    INFO("metrics line " << lines << ": " << line);
    CHECK(g >= generation);
    CHECK(g <= last_generation);
    CHECK(seen.insert({g, step}).second);
    generation = std::max(generation, g);
  }
  CHECK(lines > 0);
  CHECK(generation == last_generation);
}

// events.log of the same run: no checkpoint committed between the first failure (the cut)
// and the relaunch, so none of generation 0 after the cut; the first one after the relaunch
// is past the step it resumed from.
void check_checkpoints_after_cut(const std::string& run_dir, int64_t resumed_from) {
  const auto lines = event_lines(run_dir);
  INFO(run_dir << "/events.log:\n" << read_file(run_dir + "/events.log"));
  bool failed = false, relaunched = false;
  for (const auto& l : lines) {
    failed = failed || contains(l, "failure ");
    if (failed && contains(l, "relaunch generation ")) relaunched = true;
    if (!failed || !contains(l, "checkpoint committed: ")) continue;
    INFO(l);
    CHECK(relaunched);
    const auto p = l.rfind("step_");
    REQUIRE(p != std::string::npos);
    CHECK(std::stoll(l.substr(p + 5)) > resumed_from);
  }
  CHECK(failed);
  CHECK(relaunched);
}

// A checkpointed endless 2x1x1 job across h1 and h2 whose h2 link is cut, recovered on h1.
// A second agent on h1 gives the relaunch its device; it starts only after generation 0
// was placed across the hosts (as in the link-cut test).
struct Partitioned {
  std::string job;
  std::string h2_agent;          // h2's agent id before the cut
  int h2_agent_pid = 0;          // and its process
  std::set<int> old_h1, old_h2;  // generation 0's worker pids per host
  nlohmann::json recovered;      // the status once the relaunch trained past the cut
  int generation = 0;            // the relaunch's
};

// `before_cut` runs just before h2's link goes down (generation 0 running on both hosts).
Partitioned partition(NetnsCluster& c, const std::string& name,
                      const std::function<void(Partitioned&)>& before_cut) {
  Partitioned p;
  c.add_agent(1, "cpu:1");
  c.add_agent(2, "cpu:1");
  REQUIRE(c.wait_devices(2));
  const auto h2_agents = agents_on(c, "h2");
  REQUIRE(h2_agents.size() == 1);
  p.h2_agent = h2_agents[0]["id"];
  p.h2_agent_pid = h2_agents[0]["pid"];
  p.job = c.call(
      {{"op", "submit"},
       {"spec", fault_spec(name, 2, testing::kEndlessSteps, 5, "fault:\n  max_restarts: 3\n")}})["job"];
  REQUIRE(c.wait_state(
      p.job, [](const nlohmann::json& s) { return s["state"] == "running" && s["steps_done"] >= 8; }, 120s));
  const auto gen0 = c.status(p.job);
  REQUIRE(gen0["generation"] == 0);
  p.old_h2 = pids_on(gen0, "h2");
  p.old_h1 = pids_on(gen0, "h1");
  REQUIRE(p.old_h2.size() == 1);
  REQUIRE(p.old_h1.size() == 1);
  c.add_agent(1, "cpu:1");
  REQUIRE(c.wait_devices(3));

  before_cut(p);
  const int64_t before = c.status(p.job)["steps_done"];
  c.net().run_in_host(2, "ip link set eth0 down");
  REQUIRE(c.wait_state(
      p.job,
      [&](const nlohmann::json& s) {
        return s["state"] == "running" && s["generation"] >= 1 && s["steps_done"] >= before + 5;
      },
      180s));
  p.recovered = c.status(p.job);
  INFO(p.recovered.dump(1));
  REQUIRE(hosts_of(p.recovered) == std::set<std::string>{"h1"});
  p.generation = p.recovered["generation"];
  return p;
}

// After the heal: h2's agent process (the same pid) is registered again under a new agent
// id, its device free (the coordinator dropped the old registration with the cut:
// agent_lost; the job at its planned size does not take the device); the job trains on in
// the same generation on h1, without a new failure; then it is cancelled, its workers
// gone, and its metrics and checkpoints hold nothing of generation 0 after the cut.
void check_healed(NetnsCluster& c, const Partitioned& p) {
  REQUIRE(wait_until(
      [&] {
        const auto a = agents_on(c, "h2");
        return a.size() == 1 && a[0]["id"] != p.h2_agent;
      },
      90s));
  const auto again = agents_on(c, "h2")[0];
  INFO(again.dump());
  CHECK(again["pid"] == p.h2_agent_pid);
  REQUIRE(again["devices"].size() == 1);
  CHECK(again["devices"][0]["job"] == "");
  CHECK(c.call({{"op", "list"}})["devices"]["cpu"]["total"] == 3);
  CHECK(wait_until([&] { return all_gone(p.old_h2); }, 30s));
  // h1's worker of generation 0 serves the next generation in the same process.
  for (int pid : p.old_h1) CHECK(pids_on(p.recovered, "h1").count(pid) == 1);

  const int64_t healed = c.status(p.job)["steps_done"];
  REQUIRE(c.wait_state(
      p.job,
      [&](const nlohmann::json& s) {
        return s["state"] == "running" && s["generation"] == p.generation && s["steps_done"] >= healed + 5;
      },
      120s));
  const auto st = c.status(p.job);
  INFO(st.dump(1));
  CHECK(hosts_of(st) == std::set<std::string>{"h1"});
  CHECK(st["failures"].size() == p.recovered["failures"].size());
  const std::set<int> last = pids_on(st, "h1");

  REQUIRE(c.call({{"op", "cancel"}, {"job", p.job}})["ok"] == true);
  REQUIRE(c.wait_state(
      p.job, [](const nlohmann::json& s) { return s["state"] == "cancelled"; }, 60s));
  CHECK(wait_until([&] { return all_gone(last); }, 15s));
  const std::string run_dir = st["run_dir"];
  check_metrics_by_generation(run_dir, p.generation);
  check_checkpoints_after_cut(run_dir, resume_step(p.recovered));
}

TEST_CASE("a healed partition: the cut-off host's old workers stay gone and its agent registers afresh",
          "[multihost][fault]") {
  NetnsCluster c;
  REQUIRE(c.ready());
  INFO("cluster dir " << c.dir());
  const Partitioned p = partition(c, "heal", [](Partitioned&) {});
  // h2's agent, cut off from the coordinator, SIGKILLed and reaped its workers of
  // generation 0 already, before the link is back; h1's serves the next generation.
  CHECK(wait_until([&] { return all_gone(p.old_h2); }, 30s));
  c.net().run_in_host(2, "ip link set eth0 up");
  check_healed(c, p);
}

TEST_CASE("a frozen host partitioned and healed: its old worker, thawed, does not come back into the job",
          "[multihost][fault]") {
  NetnsCluster c;
  REQUIRE(c.ready());
  INFO("cluster dir " << c.dir());
  // h2's agent and worker stopped before the cut (a host that stalls and drops off the
  // network): neither notices the cut, so the old worker is still there after the heal.
  const Partitioned p = partition(c, "frozen", [](Partitioned& q) {
    REQUIRE(::kill(q.h2_agent_pid, SIGSTOP) == 0);
    REQUIRE(::kill(*q.old_h2.begin(), SIGSTOP) == 0);
  });
  const int old_worker = *p.old_h2.begin();
  REQUIRE(process_alive(old_worker));
  c.net().run_in_host(2, "ip link set eth0 up");
  // The worker first, alone: it resumes mid-step of generation 0, with its job's
  // generation ended and its connections dropped by the coordinator.
  REQUIRE(::kill(old_worker, SIGCONT) == 0);
  const int64_t thawed = c.status(p.job)["steps_done"];
  CHECK(c.wait_state(
      p.job,
      [&](const nlohmann::json& s) {
        return s["state"] == "running" && s["generation"] == p.generation && s["steps_done"] >= thawed + 5;
      },
      60s));
  REQUIRE(::kill(p.h2_agent_pid, SIGCONT) == 0);
  check_healed(c, p);
}

// Specs on impaired links copy their in-memory snapshots to the buddies every 10 steps, not
// every step (docs/fault-tolerance.md: the copies' traffic).
const char* const kSparseSnapshots = "\ncheckpoint:\n  memory_every: 10\n";

// A failed job's cause is one core/failure.hpp names.
void check_named_failure(const nlohmann::json& st) {
  const std::string cause = st.value("failure", "");
  INFO("failure '" << cause << "': " << st.value("reason", ""));
  CHECK(parse_failure_cause(cause).has_value());
}

// The shaper of this machine; exits 77 (skipped) with the reason when it has none. Before any
// cluster is made: exiting runs no destructors.
Shaper require_shaper() {
  std::string why;
  if (auto s = link_shaper(&why)) return *s;
  std::cout << "skipped: cannot slow or drop on links: " << why << std::endl;
  std::exit(77);
}

// Submits `spec` on h1 + h2 (cpu:1 each), impairs h2's link once the job has trained `at`
// steps, and waits for the end; the status then.
nlohmann::json run_impaired(NetnsCluster& c, const std::string& spec, int64_t at, Shaper shaper,
                            const Impairment& how, std::chrono::milliseconds limit, int64_t* steps_after) {
  c.add_agent(1, "cpu:1");
  c.add_agent(2, "cpu:1");
  REQUIRE(c.wait_devices(2));
  const std::string job = c.call({{"op", "submit"}, {"spec", spec}})["job"];
  REQUIRE(c.wait_state(
      job, [&](const nlohmann::json& s) { return s["state"] == "running" && s["steps_done"] >= at; }, 120s));
  const int64_t set_at = c.status(job)["steps_done"];
  c.net().impair(2, shaper, how);
  // Steps keep coming: the highest one seen grows past the setting.
  int64_t highest = set_at;
  const bool ended = c.wait_state(
      job,
      [&](const nlohmann::json& s) {
        highest = std::max(highest, s.value("steps_done", int64_t{0}));
        return s["state"] == "succeeded" || s["state"] == "failed";
      },
      limit);
  const auto st = c.status(job);
  INFO(st.dump(1));
  c.net().clear_impairment(2);
  if (!ended) {
    // A guard, not a measurement: cancel so that the cluster goes down cleanly.
    c.call({{"op", "cancel"}, {"job", job}});
    FAIL("the job neither succeeded nor failed under " << how.str(shaper));
  }
  *steps_after = highest - set_at;
  WARN("h2's link " << how.str(shaper) << " from step " << set_at << ": the job "
                    << st["state"].get<std::string>() << ", " << *steps_after << " steps under it");
  return st;
}

TEST_CASE(
    "a lossy, slow link (1% loss with 20 ms delay or a 20 Mbit/s rate): the job trains the one-host curve",
    "[multihost][fault][netem]") {
  const Shaper shaper = require_shaper();
  constexpr int kSteps = 60;
  // In-memory snapshots every 10 steps: each copy to the buddy is the whole training state
  // (2.6 MB here), which a 20 Mbit/s link carries in about a second.
  const std::string spec = layout_spec("tiny_dp2_pp1_tp1", "lossy", kSteps) + kSparseSnapshots;
  const auto want = one_host_curve(spec, 2);
  NetnsCluster c;
  REQUIRE(c.ready());
  INFO("cluster dir " << c.dir());
  Impairment how;
  how.delay_ms = 20;
  how.loss_pct = 1;
  how.rate = "20mbit";
  INFO("h2's link: " << how.str(shaper));
  int64_t steps_after = 0;
  const auto st = run_impaired(c, spec, 3, shaper, how, 200s, &steps_after);
  INFO(st.dump(1));
  if (st["state"] == "failed") {
    check_named_failure(st);
    return;
  }
  CHECK(steps_after > 0);
  check_same_curve(loss_curve(st["run_dir"]), want, kSteps);
}

TEST_CASE("a very slow link (200 ms delay, or 2 Mbit/s): the job succeeds or fails with a named cause",
          "[multihost][fault][netem]") {
  const Shaper shaper = require_shaper();
  NetnsCluster c;
  REQUIRE(c.ready());
  INFO("cluster dir " << c.dir());
  Impairment how;
  how.delay_ms = 200;
  how.rate = "2mbit";
  INFO("h2's link: " << how.str(shaper));
  int64_t steps_after = 0;
  const auto st = run_impaired(c, layout_spec("tiny_dp2_pp1_tp1", "slow", 15) + kSparseSnapshots, 2, shaper,
                               how, 200s, &steps_after);
  INFO(st.dump(1));
  if (st["state"] == "failed")
    check_named_failure(st);
  else
    CHECK(st["state"] == "succeeded");
}

}  // namespace
}  // namespace troupe::test

// Failure detection, recovery and elasticity end to end: worker, agent and
// hang faults against real processes; resize through the API and the CLI.
// Every test ends with no worker process left and no .tmp checkpoint loaded.
#include <catch2/catch.hpp>
#include <random>

#include "tests/fault/fault.hpp"

using namespace troupe::test;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

// Waits for a job to end, remembering the pids it used on the way.
std::string wait_end(Cluster& c, const std::string& job, PidLog& pids,
                     std::chrono::milliseconds limit = 180s) {
  std::string state;
  wait_until(
      [&] {
        auto s = c.status(job);
        pids.add(s);
        state = s.is_object() ? s.value("state", "") : "";
        return state == "succeeded" || state == "failed" || state == "cancelled";
      },
      limit);
  return state;
}

// Runs a spec to completion (the uninterrupted reference).
std::map<int64_t, double> reference(Cluster& c, const std::string& spec) {
  std::string job = c.call({{"op", "submit"}, {"spec", spec}})["job"];
  PidLog pids;
  REQUIRE(wait_end(c, job, pids) == "succeeded");
  return loss_curve(c.status(job)["run_dir"]);
}

// Waits until the job has completed at least `steps` steps in its current generation.
bool wait_steps(Cluster& c, const std::string& job, int64_t steps, PidLog& pids) {
  return c.wait_state(job, [&](const json& s) {
    pids.add(s);
    return s["state"] == "running" && s["steps_done"].get<int64_t>() >= steps;
  });
}

void check_no_tmp_loaded(const std::string& run_dir) {
  std::string events = read_file(run_dir + "/events.log");
  CHECK(events.find(".tmp") == std::string::npos);
}

}  // namespace

TEST_CASE("a worker SIGKILLed at a random step: the job recovers and ends with the uninterrupted loss",
          "[fault][multiprocess]") {
  Cluster c;
  REQUIRE(c.ready());
  c.add_agent("cpu:2");
  REQUIRE(c.wait_devices(2));
  const std::string extra = "fault:\n  max_restarts: 3\n";
  auto ref = reference(c, fault_spec("ref", 2, 60, 5, extra));
  REQUIRE(ref.size() == 60);

  std::string job = c.call({{"op", "submit"}, {"spec", fault_spec("kill", 2, 60, 5, extra)}})["job"];
  std::mt19937 rng(std::random_device{}());
  int at = std::uniform_int_distribution<int>(3, 40)(rng);
  int victim_rank = std::uniform_int_distribution<int>(0, 1)(rng);
  INFO("SIGKILL rank " << victim_rank << " after step " << at);
  PidLog pids;
  REQUIRE(wait_steps(c, job, at, pids));
  int victim = worker_pids(c.status(job))[victim_rank];
  REQUIRE(::kill(victim, SIGKILL) == 0);
  REQUIRE(wait_end(c, job, pids) == "succeeded");

  auto st = c.status(job);
  CHECK(st["restarts"] == 1);
  CHECK(st["generation"] == 1);
  CHECK(st["layout"] == "2x1x1");
  REQUIRE(st["failures"].size() == 1);
  const auto& f = st["failures"][0];
  CHECK(f["cause"] == "worker_killed");
  CHECK(f["rank"] == victim_rank);
  CHECK(f["pid"] == victim);
  CHECK_FALSE(f["host"].get<std::string>().empty());
  std::string resumed = st["resume_from"];
  CHECK(resumed.find(".tmp") == std::string::npos);
  auto curve = loss_curve(st["run_dir"]);
  REQUIRE(curve.size() == 60);
  CHECK(curve.rbegin()->second == Approx(ref.rbegin()->second).margin(1e-4));
  for (const auto& [s, loss] : ref) CHECK(curve[s] == Approx(loss).margin(1e-4));
  std::string events = read_file(std::string(st["run_dir"]) + "/events.log");
  CHECK(events.find("state recovering: worker_killed") != std::string::npos);
  CHECK(events.find("relaunch generation 1") != std::string::npos);
  check_no_tmp_loaded(st["run_dir"]);
  CHECK(wait_until([&] { return pids.all_gone(); }, 15s));
}

TEST_CASE("an agent SIGKILLed with its workers: the job continues on a smaller data dimension",
          "[fault][elastic][multiprocess]") {
  Cluster c;
  REQUIRE(c.ready());
  c.add_agent("cpu:2");
  Proc& second = c.add_agent("cpu:2");
  REQUIRE(c.wait_devices(4));
  std::string extra = "fault:\n  max_restarts: 2\nelastic:\n  min_devices: 2\n";
  std::string job = c.call({{"op", "submit"}, {"spec", fault_spec("agentloss", 4, 60, 5, extra)}})["job"];
  PidLog pids;
  REQUIRE(wait_steps(c, job, 8, pids));
  REQUIRE(c.status(job)["layout"] == "4x1x1");
  second.signal(SIGKILL);
  REQUIRE(wait_end(c, job, pids) == "succeeded");
  auto st = c.status(job);
  CHECK(st["layout"] == "2x1x1");
  CHECK(st["planned_layout"] == "4x1x1");
  REQUIRE(st["failures"].size() >= 1);
  CHECK(st["failures"][0]["cause"] == "agent_lost");
  CHECK(st["steps_done"] == 60);
  CHECK(loss_curve(st["run_dir"]).size() == 60);
  check_no_tmp_loaded(st["run_dir"]);
  CHECK(wait_until([&] { return pids.all_gone(); }, 15s));
}

TEST_CASE("a SIGSTOPped worker is detected by heartbeat loss and reported with its rank and op",
          "[fault][multiprocess]") {
  Cluster c;
  REQUIRE(c.ready());
  c.add_agent("cpu:2");
  REQUIRE(c.wait_devices(2));
  std::string job = c.call(
      {{"op", "submit"}, {"spec", fault_spec("hang", 2, 400, 20, "fault:\n  max_restarts: 1\n")}})["job"];
  PidLog pids;
  REQUIRE(wait_steps(c, job, 5, pids));
  // Let the coordinator learn where the ranks are before one of them stops.
  REQUIRE(
      c.wait_state(job, [](const json& s) { return !s["workers"][1]["where"].get<std::string>().empty(); }));
  int victim = worker_pids(c.status(job))[1];
  REQUIRE(::kill(victim, SIGSTOP) == 0);
  REQUIRE(c.wait_state(
      job, [](const json& s) { return !s["failures"].empty(); }, 30s));
  auto st = c.status(job);
  const auto& f = st["failures"][0];
  CHECK(f["cause"] == "worker_lost");
  CHECK(f["rank"] == 1);
  CHECK(f["pid"] == victim);
  std::string where = f["where"];
  INFO("rank 1 was in: " << where);
  CHECK(where.find("step") != std::string::npos);
  std::string events = read_file(std::string(st["run_dir"]) + "/events.log");
  CHECK(events.find("failure worker_lost in generation 0: rank 1 (pid " + std::to_string(victim)) !=
        std::string::npos);
  CHECK(events.find("[rank was in: ") != std::string::npos);
  // The stopped process is SIGKILLed by its agent (a stopped process takes SIGKILL).
  CHECK(wait_until([&] { return !process_alive(victim); }, 15s));
  c.call({{"op", "cancel"}, {"job", job}});
  CHECK(wait_end(c, job, pids) == "cancelled");
  CHECK(wait_until([&] { return pids.all_gone(); }, 15s));
}

TEST_CASE("a new agent mid-run makes the job grow, the loss curve stays the uninterrupted one",
          "[fault][elastic][multiprocess]") {
  Cluster c;
  REQUIRE(c.ready());
  c.add_agent("cpu:1");
  REQUIRE(c.wait_devices(1));
  const std::string extra = "elastic:\n  min_devices: 1\n  max_devices: 2\n";
  auto ref = reference(c, fault_spec("ref", 1, 150, 10, extra));
  std::string job = c.call({{"op", "submit"}, {"spec", fault_spec("grow", 1, 150, 10, extra)}})["job"];
  PidLog pids;
  REQUIRE(wait_steps(c, job, 5, pids));
  c.add_agent("cpu:1");
  REQUIRE(wait_end(c, job, pids) == "succeeded");
  auto st = c.status(job);
  CHECK(st["layout"] == "2x1x1");
  CHECK(st["restarts"] == 0);
  CHECK(st["generation"] == 1);
  auto curve = loss_curve(st["run_dir"]);
  REQUIRE(curve.size() == ref.size());
  for (const auto& [s, loss] : ref) CHECK(curve[s] == Approx(loss).margin(1e-4));
  std::string events = read_file(std::string(st["run_dir"]) + "/events.log");
  CHECK(events.find("resize to 2 devices after step") != std::string::npos);
  check_no_tmp_loaded(st["run_dir"]);
  CHECK(wait_until([&] { return pids.all_gone(); }, 15s));
}

TEST_CASE("troupe scale shrinks and grows a running job", "[fault][elastic][multiprocess]") {
  Cluster c;
  REQUIRE(c.ready());
  c.add_agent("cpu:2");
  REQUIRE(c.wait_devices(2));
  std::string job = c.call(
      {{"op", "submit"}, {"spec", fault_spec("scale", 2, 400, 10, "elastic:\n  min_devices: 1\n")}})["job"];
  PidLog pids;
  REQUIRE(wait_steps(c, job, 3, pids));
  auto scale = [&](int n) {
    Proc p({troupe_binary(), "scale", job, "--devices", std::to_string(n), "--api", c.api()},
           c.dir() + "/scale" + std::to_string(n) + ".log");
    int code = p.wait(30s);
    INFO(p.output());
    return code;
  };
  CHECK(scale(3) == 1);  // 8 rows do not split over 3
  REQUIRE(scale(1) == 0);
  REQUIRE(c.wait_state(job, [&](const json& s) {
    pids.add(s);
    return s["layout"] == "1x1x1" && s["state"] == "running" && s["steps_done"] > 0;
  }));
  int64_t before = c.status(job)["steps_done"];
  REQUIRE(scale(2) == 0);
  REQUIRE(c.wait_state(job, [&](const json& s) {
    pids.add(s);
    return s["layout"] == "2x1x1" && s["state"] == "running" && s["steps_done"] > before;
  }));
  auto st = c.status(job);
  CHECK(st["generation"] == 2);
  CHECK(st["restarts"] == 0);
  CHECK(st["failures"].empty());
  c.call({{"op", "cancel"}, {"job", job}});
  CHECK(wait_end(c, job, pids) == "cancelled");
  check_no_tmp_loaded(st["run_dir"]);
  CHECK(wait_until([&] { return pids.all_gone(); }, 15s));
}

TEST_CASE("more failures than fault.max_restarts fail the job with the last cause", "[fault][multiprocess]") {
  Cluster c;
  REQUIRE(c.ready());
  c.add_agent("cpu:1");
  REQUIRE(c.wait_devices(1));
  std::string job =
      c.call({{"op", "submit"},
              {"spec", fault_spec("doomed", 1, 100000, 50, "fault:\n  max_restarts: 1\n")}})["job"];
  PidLog pids;
  for (int round = 0; round < 2; ++round) {
    REQUIRE(c.wait_state(job, [&](const json& s) {
      pids.add(s);
      return s["state"] == "running" && s["generation"] == round && s["steps_done"] > 0;
    }));
    REQUIRE(::kill(worker_pids(c.status(job))[0], SIGKILL) == 0);
    if (round == 0) REQUIRE(c.wait_state(job, [](const json& s) { return s["generation"] == 1; }));
  }
  REQUIRE(wait_end(c, job, pids) == "failed");
  auto st = c.status(job);
  CHECK(st["failure"] == "worker_killed");
  std::string reason = st["reason"];
  CHECK(reason.find("killed by SIGKILL") != std::string::npos);
  CHECK(reason.find("after 1 restart(s); fault.max_restarts = 1") != std::string::npos);
  CHECK(st["failures"].size() == 2);
  CHECK(wait_until([&] { return pids.all_gone(); }, 15s));
}

// A coordinator restart with real processes: the coordinator keeps its job table
// in --state-dir, is SIGKILLed mid-job and started again on the same ports; the
// agent stops its workers, reconnects and registers again, and the job ends with
// the loss of an uninterrupted run.
#include <netinet/in.h>
#include <sys/socket.h>

#include <catch2/catch.hpp>

#include "tests/fault/fault.hpp"

using namespace troupe::test;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

// Free loopback ports, each found by binding port 0; all are held until every
// one is known, so the ports differ.
std::vector<int> free_ports(int n) {
  std::vector<int> fds, ports;
  for (int i = 0; i < n; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof a;
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      return {};
    fds.push_back(fd);
    ports.push_back(ntohs(a.sin_port));
  }
  for (int fd : fds) ::close(fd);
  return ports;
}

// A coordinator that can be killed and started again with the same ports and state directory.
class Restartable {
 public:
  Restartable() {
    char tmpl[] = "/tmp/troupe-restart-XXXXXX";
    dir_ = mkdtemp(tmpl);
    auto p = free_ports(3);
    if (p.size() == 3) {
      listen_ = "127.0.0.1:" + std::to_string(p[0]);
      api_ = "tcp://127.0.0.1:" + std::to_string(p[1]);
      pub_ = "tcp://127.0.0.1:" + std::to_string(p[2]);
    }
  }
  ~Restartable() {
    agent_.reset();
    coordinator_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // Starts the coordinator; true once it serves on the chosen ports.
  bool start() {
    std::filesystem::remove(dir_ + "/ready.json");
    ++starts_;
    coordinator_ = std::make_unique<Proc>(
        std::vector<std::string>{troupe_binary(), "coordinator", "--listen", listen_, "--api", api_,
                                 "--api-pub", pub_, "--runs-dir", dir_ + "/runs", "--state-dir",
                                 dir_ + "/state", "--ready-file", dir_ + "/ready.json"},
        dir_ + "/coordinator" + std::to_string(starts_) + ".log");
    if (!wait_until([&] { return std::filesystem::exists(dir_ + "/ready.json"); }, 30s)) return false;
    return json::parse(read_file(dir_ + "/ready.json")).value("listen", "") == listen_;
  }
  Proc& coordinator() { return *coordinator_; }
  Proc& start_agent(const std::string& devices) {
    agent_ = std::make_unique<Proc>(
        std::vector<std::string>{troupe_binary(), "agent", "--coordinator", listen_, "--devices", devices},
        dir_ + "/agent.log");
    return *agent_;
  }
  json call(json req) {
    troupe::coord::ClientOptions o;
    o.endpoint = api_;
    return troupe::coord::api_call(o, std::move(req));
  }
  json status(const std::string& job) { return call({{"op", "status"}, {"job", job}})["job"]; }
  bool wait_devices(int n) {
    return wait_until(
        [&] {
          auto r = call({{"op", "list"}});
          return r.value("ok", false) && r["devices"]["cpu"]["total"] == n;
        },
        60s);
  }
  // Waits for the job to end (or `pred` to hold), remembering the worker pids it used.
  std::string wait_for(const std::string& job, PidLog& pids, const std::function<bool(const json&)>& pred,
                       std::chrono::milliseconds limit = 180s) {
    std::string state;
    wait_until(
        [&] {
          auto s = status(job);
          pids.add(s);
          state = s.is_object() ? s.value("state", "") : "";
          return state == "succeeded" || state == "failed" || state == "cancelled" ||
                 (s.is_object() && pred(s));
        },
        limit);
    return state;
  }
  const std::string& dir() const { return dir_; }
  bool ports() const { return !listen_.empty(); }

 private:
  std::string dir_, listen_, api_, pub_;
  int starts_ = 0;
  std::unique_ptr<Proc> coordinator_, agent_;
};

}  // namespace

TEST_CASE(
    "a coordinator SIGKILLed mid-job and restarted on its state dir: the job ends with the uninterrupted "
    "loss",
    "[fault][restart][multiprocess]") {
  Restartable c;
  REQUIRE(c.ports());
  REQUIRE(c.start());
  Proc& agent = c.start_agent("cpu:1");
  REQUIRE(c.wait_devices(1));
  // No restarts allowed: losing the coordinator is not a failure of the job.
  const std::string extra = "fault:\n  max_restarts: 0\n";
  const int steps = 40;
  auto never = [](const json&) { return false; };

  PidLog ref_pids;
  std::string ref_job = c.call({{"op", "submit"}, {"spec", fault_spec("ref", 1, steps, 4, extra)}})["job"];
  REQUIRE(c.wait_for(ref_job, ref_pids, never) == "succeeded");
  auto ref = loss_curve(c.status(ref_job)["run_dir"]);
  REQUIRE(ref.size() == static_cast<size_t>(steps));

  std::string job = c.call({{"op", "submit"}, {"spec", fault_spec("restart", 1, steps, 4, extra)}})["job"];
  PidLog pids;
  REQUIRE(c.wait_for(job, pids, [](const json& s) {
    return s["state"] == "running" && s["steps_done"].get<int64_t>() >= 12;
  }) == "running");
  std::vector<int> first_workers = worker_pids(c.status(job));

  c.coordinator().signal(SIGKILL);
  REQUIRE(c.coordinator().wait(30s) == 128 + SIGKILL);
  // The agent outlives its coordinator and stops the generation that died with it.
  CHECK(wait_until(
      [&] {
        for (int p : first_workers)
          if (process_alive(p)) return false;
        return true;
      },
      30s));
  CHECK(agent.wait(0ms) == -1);

  REQUIRE(c.start());
  auto st = c.status(job);
  REQUIRE(st.is_object());
  CHECK(c.status(ref_job)["state"] == "succeeded");  // terminal jobs are kept as they were
  REQUIRE(c.wait_devices(1));                        // the agent registered again
  REQUIRE(c.wait_for(job, pids, never) == "succeeded");

  st = c.status(job);
  INFO(st.dump());
  CHECK(st["generation"] == 1);
  CHECK(st["restarts"] == 0);
  std::string resumed = st["resume_from"];
  CHECK(resumed.find("step_") != std::string::npos);
  CHECK(resumed.find(".tmp") == std::string::npos);
  CHECK(st["steps_done"] == steps);
  CHECK(st["loss"].get<double>() == Approx(ref.rbegin()->second).margin(1e-4));
  auto curve = loss_curve(st["run_dir"]);
  REQUIRE(curve.size() == static_cast<size_t>(steps));
  for (const auto& [s, loss] : ref) CHECK(curve[s] == Approx(loss).margin(1e-4));
  std::string events = read_file(std::string(st["run_dir"]) + "/events.log");
  CHECK(events.find("coordinator restarted") != std::string::npos);
  CHECK(events.find("relaunch generation 1") != std::string::npos);
  CHECK(read_file(c.dir() + "/agent.log").find("reconnected") != std::string::npos);
  CHECK(agent.wait(0ms) == -1);
  CHECK(wait_until([&] { return pids.all_gone() && ref_pids.all_gone(); }, 15s));
}

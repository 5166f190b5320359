// A coordinator restart with real processes: the coordinator keeps its job table
// in --state-dir, is SIGKILLed mid-job and started again on the same ports; the
// agent stops its workers, reconnects and registers again, and the job ends with
// the loss of an uninterrupted run.
//
// The coordinator kills itself (TROUPE_CKPT_FAULT=commit:12, between the last shard
// report of step 12 and its rename): a point inside the job that no machine can run
// past, so the job is mid-way when its coordinator goes however fast it trains.
#include <netinet/in.h>
#include <sys/socket.h>

#include <catch2/catch.hpp>
#include <cstdlib>

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
    troupe::actors::write_secret(dir_ + "/secret.pem");
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

  // Starts the coordinator, with TROUPE_CKPT_FAULT=`fault` when not empty (the agent and
  // its workers never see it); true once it serves on the chosen ports.
  bool start(const std::string& fault = "") {
    std::filesystem::remove(dir_ + "/ready.json");
    ++starts_;
    if (!fault.empty()) ::setenv("TROUPE_CKPT_FAULT", fault.c_str(), 1);
    coordinator_ = std::make_unique<Proc>(
        std::vector<std::string>{troupe_binary(), "coordinator", "--listen", listen_, "--api", api_,
                                 "--api-pub", pub_, "--runs-dir", dir_ + "/runs", "--state-dir",
                                 dir_ + "/state", "--ready-file", dir_ + "/ready.json", "--secret-file",
                                 dir_ + "/secret.pem"},
        dir_ + "/coordinator" + std::to_string(starts_) + ".log");
    ::unsetenv("TROUPE_CKPT_FAULT");
    if (!wait_until([&] { return std::filesystem::exists(dir_ + "/ready.json"); }, 30s)) return false;
    return json::parse(read_file(dir_ + "/ready.json")).value("listen", "") == listen_;
  }
  Proc& coordinator() { return *coordinator_; }
  Proc& start_agent(const std::string& devices) {
    agent_ = std::make_unique<Proc>(
        std::vector<std::string>{troupe_binary(), "agent", "--coordinator", listen_, "--devices", devices,
                                 "--secret-file", dir_ + "/secret.pem"},
        dir_ + "/agent.log");
    return *agent_;
  }
  json call(json req) {
    troupe::coord::ClientOptions o;
    o.endpoint = api_;
    o.token = troupe::actors::api_token(dir_ + "/secret.pem");
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

// The pid a worker log names in its first line: "troupe worker: job ... (pid N)".
int worker_log_pid(const std::string& log) {
  const std::string text = read_file(log);
  const auto p = text.find("(pid ");
  return p == std::string::npos ? -1 : std::atoi(text.c_str() + p + 5);
}

}  // namespace

TEST_CASE(
    "a coordinator SIGKILLed mid-job and restarted on its state dir: the job ends with the uninterrupted "
    "loss",
    "[fault][restart][multiprocess]") {
  Restartable c;
  REQUIRE(c.ports());
  REQUIRE(c.start("commit:12"));
  Proc& agent = c.start_agent("cpu:1");
  REQUIRE(c.wait_devices(1));
  // No restarts allowed: losing the coordinator is not a failure of the job.
  const std::string extra = "fault:\n  max_restarts: 0\n";
  const int steps = 40;
  auto never = [](const json&) { return false; };

  // The reference checkpoints only at its end (every: 0), so the fault at step 12 spares it.
  PidLog ref_pids;
  std::string ref_job = c.call({{"op", "submit"}, {"spec", fault_spec("ref", 1, steps, 0, extra)}})["job"];
  REQUIRE(c.wait_for(ref_job, ref_pids, never) == "succeeded");
  auto ref = loss_curve(c.status(ref_job)["run_dir"]);
  REQUIRE(ref.size() == static_cast<size_t>(steps));

  std::string job = c.call({{"op", "submit"}, {"spec", fault_spec("restart", 1, steps, 4, extra)}})["job"];
  REQUIRE(c.coordinator().wait(120s) == 128 + SIGKILL);
  std::string run_dir;
  for (const auto& e : std::filesystem::directory_iterator(c.dir() + "/runs"))
    if (e.path().filename().string().find(job) != std::string::npos) run_dir = e.path().string();
  REQUIRE(!run_dir.empty());
  // The checkpoint of step 12 was written but never committed; step 8's is the newest.
  CHECK(std::filesystem::exists(run_dir + "/ckpt/step_000012.tmp/manifest.json"));
  CHECK_FALSE(std::filesystem::exists(run_dir + "/ckpt/step_000012"));
  const int first_worker = worker_log_pid(run_dir + "/workers/0.log");
  REQUIRE(first_worker > 0);
  PidLog pids;
  pids.pids.insert(first_worker);
  // The agent outlives its coordinator and stops the generation that died with it.
  CHECK(wait_until([&] { return !process_alive(first_worker); }, 30s));
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
  CHECK(st["run_dir"] == run_dir);
  CHECK(st["resume_from"] == run_dir + "/ckpt/step_000008");
  CHECK(st["steps_done"] == steps);
  CHECK(st["loss"].get<double>() == Approx(ref.rbegin()->second).margin(1e-4));
  auto curve = loss_curve(st["run_dir"]);
  REQUIRE(curve.size() == static_cast<size_t>(steps));
  for (const auto& [s, loss] : ref) CHECK(curve[s] == Approx(loss).margin(1e-4));
  std::string events = read_file(std::string(st["run_dir"]) + "/events.log");
  CHECK(events.find("coordinator restarted") != std::string::npos);
  CHECK(events.find("relaunch generation 1") != std::string::npos);
  CHECK(read_file(c.dir() + "/agent.log").find("reconnected") != std::string::npos);
  CHECK(read_file(c.dir() + "/coordinator1.log").find("TROUPE_CKPT_FAULT=commit:12") != std::string::npos);
  CHECK(agent.wait(0ms) == -1);
  CHECK(wait_until([&] { return pids.all_gone() && ref_pids.all_gone(); }, 15s));
}

// Recovery figures: for each fault kind, the detection latency (fault -> the
// coordinator's failure record) and the time from the fault to the first step
// completed by the relaunched generation, median of several runs.
//
//   recovery [runs=3]
//
// The job is the tiny GPT of configs/layouts (data 2, checkpoint every 5 steps)
// on CPU; the fault strikes after step 10.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "tests/control/cluster.hpp"

using namespace troupe::test;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

double wall_ms() {
  using namespace std::chrono;
  return duration_cast<microseconds>(system_clock::now().time_since_epoch()).count() / 1000.0;
}

std::string spec(const std::string& extra) {
  std::string s = read_file(std::string(TROUPE_SOURCE_DIR) + "/configs/layouts/tiny_dp2_pp1_tp1.yaml");
  auto p = s.find("steps: 10");
  s.replace(p, 9, "steps: 1000000");
  return s + "\ncheckpoint:\n  every: 5\nfault:\n  max_restarts: 3\n" + extra;
}

// The first metrics line of generation 1 in the run directory, polled.
bool relaunched_step(const std::string& run_dir) {
  std::ifstream in(run_dir + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto m = json::parse(line, nullptr, false);
    if (m.is_object() && m.value("generation", 0) >= 1) return true;
  }
  return false;
}

struct Sample {
  double detect_ms = -1, recover_ms = -1, step_ms = 0;
};

enum class Fault {
  worker_sigkill,
  worker_sigkill_spare,
  agent_sigkill,
  worker_sigstop,
  worker_sigstop_spare
};
bool with_spare(Fault f) { return f == Fault::worker_sigkill_spare || f == Fault::worker_sigstop_spare; }
const char* name(Fault f) {
  switch (f) {
    case Fault::worker_sigkill:
      return "worker SIGKILL (down message)";
    case Fault::worker_sigkill_spare:
      return "worker SIGKILL, a hot spare";
    case Fault::agent_sigkill:
      return "agent SIGKILL (shrink 2 -> 1)";
    case Fault::worker_sigstop:
      return "worker SIGSTOP (its agent sees it)";
    case Fault::worker_sigstop_spare:
      return "worker SIGSTOP, a hot spare";
  }
  return "?";
}

Sample run_once(Fault kind) {
  Sample out;
  Cluster c;
  if (!c.ready()) return out;
  std::string extra;
  if (kind == Fault::agent_sigkill) {
    c.add_agent("cpu:1");
    c.add_agent("cpu:1");
    extra = "elastic:\n  min_devices: 1\n";
  } else if (with_spare(kind)) {
    c.add_agent("cpu:3");
    extra = "resources:\n  spares: 1\n";
  } else {
    c.add_agent("cpu:2");
  }
  if (!c.wait_devices(with_spare(kind) ? 3 : 2)) return out;
  std::string job = c.call({{"op", "submit"}, {"spec", spec(extra)}})["job"];
  if (!c.wait_state(job, [&](const json& s) {
        const bool spare_ready =
            !with_spare(kind) || (!s["spares"].empty() && s["spares"][0].value("ready", false));
        return s["state"] == "running" && s["steps_done"] >= 10 && spare_ready;
      })) {
    std::fprintf(stderr, "recovery: the job did not train 10 steps: %s\n", c.status(job).dump().c_str());
    return out;
  }
  auto st = c.status(job);
  std::string run_dir = st["run_dir"];
  int victim = worker_pids(st)[1];
  // For the agent fault, the second agent (devices are placed in registration order).
  int agent_pid = 0;
  if (kind == Fault::agent_sigkill) {
    auto list = c.call({{"op", "list"}});
    for (const auto& a : list["agents"])
      if (a.value("pid", 0) != 0) agent_pid = a["pid"];
  }
  double t0 = wall_ms();
  if (kind == Fault::worker_sigkill || kind == Fault::worker_sigkill_spare) ::kill(victim, SIGKILL);
  if (kind == Fault::worker_sigstop || kind == Fault::worker_sigstop_spare) ::kill(victim, SIGSTOP);
  if (kind == Fault::agent_sigkill) ::kill(agent_pid, SIGKILL);
  double seen = 0;
  wait_until(
      [&] {
        if (relaunched_step(run_dir)) {
          seen = wall_ms();
          return true;
        }
        return false;
      },
      60s);
  st = c.status(job);
  if (seen > 0) out.recover_ms = seen - t0;
  if (!st["failures"].empty()) out.detect_ms = st["failures"][0]["time_ms"].get<double>() - t0;
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::vector<double> steps;
  for (std::string line; std::getline(in, line);) {
    auto m = json::parse(line, nullptr, false);
    if (m.is_object() && m.contains("step_ms")) steps.push_back(m["step_ms"].get<double>());
  }
  if (!steps.empty()) {
    std::nth_element(steps.begin(), steps.begin() + steps.size() / 2, steps.end());
    out.step_ms = steps[steps.size() / 2];
  }
  c.call({{"op", "cancel"}, {"job", job}});
  if (kind == Fault::worker_sigstop || kind == Fault::worker_sigstop_spare) ::kill(victim, SIGKILL);
  return out;
}

double median(std::vector<double> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return x < 0; }), v.end());
  if (v.empty()) return -1;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int runs = argc > 1 ? std::max(1, std::atoi(argv[1])) : 3;
  std::printf("recovery of the tiny GPT (data 2, CPU, checkpoint every 5 steps), median of %d run(s)\n",
              runs);
  std::printf("%-34s %14s %22s %12s\n", "fault", "detect ms", "fault->first step ms", "step ms");
  for (Fault f : {Fault::worker_sigkill, Fault::worker_sigkill_spare, Fault::agent_sigkill,
                  Fault::worker_sigstop, Fault::worker_sigstop_spare}) {
    std::vector<double> d, r, s;
    for (int i = 0; i < runs; ++i) {
      Sample x = run_once(f);
      d.push_back(x.detect_ms);
      r.push_back(x.recover_ms);
      s.push_back(x.step_ms);
    }
    std::printf("%-34s %14.0f %22.0f %12.1f\n", name(f), median(d), median(r), median(s));
    std::fflush(stdout);
  }
  return 0;
}

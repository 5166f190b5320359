// Helpers of the fault tests: specs with checkpoints and fault/elastic keys,
// the loss curve of a run directory, and the pids a job has used.
#pragma once

#include <catch2/catch.hpp>
#include <map>
#include <set>

#include "tests/control/cluster.hpp"
#include "tests/support/support.hpp"

namespace troupe::test {

// The tiny GPT of configs/layouts with `dp` data ranks, `steps` steps, a
// checkpoint every `every` steps, and extra YAML sections appended.
inline std::string fault_spec(const std::string& name, int dp, int64_t steps, int every,
                              const std::string& extra) {
  std::string s = read_file(std::string(TROUPE_SOURCE_DIR) + "/configs/layouts/tiny_dp2_pp1_tp1.yaml");
  auto replace = [&](const std::string& from, const std::string& to) {
    auto p = s.find(from);
    if (p != std::string::npos) s.replace(p, from.size(), to);
  };
  replace("name: tiny-dp2-pp1-tp1", "name: " + name);
  replace("steps: 10", "steps: " + std::to_string(steps));
  replace("data: 2", "data: " + std::to_string(dp));
  return s + "\ncheckpoint:\n  every: " + std::to_string(every) + "\n  keep: 3\n" + extra;
}

// step -> loss of metrics.jsonl; a step written again by a later generation overrides.
inline std::map<int64_t, double> loss_curve(const std::string& run_dir) {
  std::map<int64_t, double> curve;
  std::ifstream in(run_dir + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto m = nlohmann::json::parse(line, nullptr, false);
    if (m.is_object() && m.contains("loss")) curve[m["step"].get<int64_t>()] = m["loss"].get<double>();
  }
  return curve;
}

// The step a generation's status says it resumed from: N of its resume_from ".../step_<N>",
// 0 when it started from scratch.
inline int64_t resume_step(const nlohmann::json& status) {
  const std::string from = status.value("resume_from", "");
  const auto p = from.rfind("step_");
  return p == std::string::npos ? 0 : std::stoll(from.substr(p + 5));
}

// Remembers every worker pid a job's status has shown.
struct PidLog {
  std::set<int> pids;
  void add(const nlohmann::json& status) {
    if (!status.is_object()) return;
    for (int p : worker_pids(status))
      if (p > 0) pids.insert(p);
  }
  bool all_gone() const {
    for (int p : pids)
      if (process_alive(p)) return false;
    return true;
  }
};

// Waits for a job to end, remembering the pids it used on the way.
inline std::string wait_end(Cluster& c, const std::string& job, PidLog& pids,
                            std::chrono::milliseconds limit = std::chrono::seconds(180)) {
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

// Waits until the job runs `generation` (any generation when -1) and `pred` holds for its status.
inline bool wait_running(Cluster& c, const std::string& job, int generation, PidLog& pids,
                         const std::function<bool(const nlohmann::json&)>& pred,
                         std::chrono::milliseconds limit = std::chrono::seconds(120)) {
  return c.wait_state(
      job,
      [&](const nlohmann::json& s) {
        pids.add(s);
        return s["state"] == "running" && (generation < 0 || s["generation"] == generation) && pred(s);
      },
      limit);
}

// Waits until the job runs and has reported `steps` steps. steps_done counts the highest
// step reported, by this generation or an earlier one.
inline bool wait_steps(Cluster& c, const std::string& job, int64_t steps, PidLog& pids, int generation = -1) {
  return wait_running(c, job, generation, pids,
                      [&](const nlohmann::json& s) { return s["steps_done"].get<int64_t>() >= steps; });
}

// Cancels a running job and waits until it is cancelled and its workers are gone.
inline void cancel(Cluster& c, const std::string& job, PidLog& pids) {
  REQUIRE(c.call({{"op", "cancel"}, {"job", job}})["ok"] == true);
  REQUIRE(wait_end(c, job, pids) == "cancelled");
  CHECK(wait_until([&] { return pids.all_gone(); }, std::chrono::seconds(15)));
}

// The losses of steps 0 .. steps-1 of an uninterrupted run of `spec` (an endless job):
// it trains until it has reported them, then is cancelled.
inline std::map<int64_t, double> reference(Cluster& c, const std::string& spec, int64_t steps) {
  std::string job = c.call({{"op", "submit"}, {"spec", spec}})["job"];
  PidLog pids;
  REQUIRE(wait_steps(c, job, steps, pids));
  std::string run_dir = c.status(job)["run_dir"];
  cancel(c, job, pids);
  auto curve = loss_curve(run_dir);
  curve.erase(curve.lower_bound(steps), curve.end());
  REQUIRE(curve.size() == static_cast<size_t>(steps));
  return curve;
}

}  // namespace troupe::test

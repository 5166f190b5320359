// The scale driver's internals (driver.hpp): setup and the run in driver.cpp, the phases and
// the table in phases.cpp.
#pragma once

#include <atomic>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "bench/scale/driver.hpp"
#include "bench/scale/measure.hpp"
#include "bench/scale/observed.hpp"
#include "bench/scale/sim.hpp"
#include "coordinator/client.hpp"

namespace troupe::scale {

using nlohmann::json;

// Seconds from a to b (CLOCK_MONOTONIC ns); -1 when either is unknown.
inline double seconds(int64_t a, int64_t b) { return a > 0 && b > 0 ? (b - a) / 1e9 : -1; }

class Driver {
 public:
  explicit Driver(const DriverOptions& o) : o_(o), obs_(o.ranks) { obs_.gloo = o.gloo_max > 0; }
  ~Driver();

  int run();
  // Prints the table and writes the JSON of what was measured.
  void report();

 private:
  bool start_coordinator();
  void start_sims();
  void read_sims();
  bool wait(double limit_s, const std::function<bool()>& pred) {
    std::unique_lock<std::mutex> lock(obs_.mu);
    return obs_.cv.wait_for(
        lock, std::chrono::milliseconds(static_cast<int64_t>(limit_s * o_.patience * 1000)), pred);
  }
  // CPU seconds so far: the coordinator's, and the harness's (simulated processes and driver).
  std::pair<double, double> cpu() const {
    double h = self_cpu_seconds();
    for (const auto& s : sims_) h += std::max(0.0, cpu_seconds(s->pid()));
    return {cpu_seconds(coordinator_->pid()), h};
  }
  // Marks the end of a phase: its wall time and the CPU each side spent in it.
  void phase(const std::string& name) {
    const auto [c, h] = cpu();
    const int64_t t = now_ns();
    results_["phases"].push_back({{"phase", name},
                                  {"wall_s", (t - phase_t_) / 1e9},
                                  {"coordinator_cpu_s", c - phase_cpu_.first},
                                  {"harness_cpu_s", h - phase_cpu_.second}});
    phase_t_ = t;
    phase_cpu_ = {c, h};
  }
  void check(const std::string& name, bool ok, const std::string& detail = "") {
    results_["checks"].push_back({{"check", name}, {"ok", ok}, {"detail", detail}});
    if (!ok) ++failed_;
    std::cerr << "scale: " << (ok ? "ok   " : "FAIL ") << name << (detail.empty() ? "" : ": " + detail)
              << std::endl;
  }
  json api(json req) {
    coord::ClientOptions c;
    c.endpoint = ready_.value("api", "");
    c.token = token_;
    c.timeout = std::chrono::seconds(60);
    return coord::api_call(c, std::move(req));
  }
  std::string spec() const;
  // Waits for every rank of `gen` to be rendezvoused; records its launch figures under `prefix`.
  bool launch_phase(int gen, int64_t from, const std::string& prefix);
  // The abort latencies from `from` of every rank of `gen` not in `gone`.
  json aborts(int gen, const std::set<int>& gone, int64_t from);
  // The coordinator's failure event of `gen`: cause, rank, detection after `from`.
  json failure(int gen, int64_t from);
  void first_step(int gen, int64_t from, json& out);
  void steady_phase();
  void queries();
  // Sends `fault` ("kill" or "hang") for rank `victim` of generation `gen` to its process and
  // waits for it in `seen`: when it happened (as the observer recorded it), 0 when it did not.
  int64_t inject(const std::string& fault, int gen, int victim, std::map<std::pair<int, int>, int64_t>& seen);
  void kill_phase();
  void hang_phase();
  void agent_phase();
  void print_table() const;

  DriverOptions o_;
  Observed obs_;
  std::string dir_, secret_, token_, job_;
  json ready_;
  json results_ = json::object();
  int failed_ = 0;
  int agents_ = 0, dp_ = 1, pp_ = 1, tp_ = 1;
  std::unique_ptr<Child> coordinator_;
  std::vector<std::unique_ptr<Child>> sims_;
  std::unique_ptr<EventFeed> feed_;
  std::thread reader_;
  std::atomic<bool> stop_reader_{false};
  int64_t phase_t_ = 0;
  std::pair<double, double> phase_cpu_{0, 0};
};

}  // namespace troupe::scale

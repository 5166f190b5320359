// What the scale driver has seen: the simulated processes' lines (sim.hpp) and the
// coordinator's events, with their times. Every member is guarded by `mu`; waiters sleep on
// `cv`, which the readers notify after each batch.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

namespace troupe::scale {

// One rank of one generation, as its simulated node reported it (CLOCK_MONOTONIC ns; 0 = not yet).
struct RankSeen {
  int64_t launch = 0, connected = 0, assigned = 0, nccl = 0, gloo = 0, abort = 0, exit = 0;
  bool assigned_ok = false, nccl_ok = false, gloo_ok = false, failed = false;
  int exit_code = -1, agent = -1, sim = -1;
  int64_t nccl_requests = 0, gloo_requests = 0;
  int gloo_skipped = 0;
  std::string error;
};

// Per (generation, step), summed over the simulated processes.
struct StepSeen {
  int64_t count = 0, last_sent = 0;
};
struct CkptSeen {
  int64_t count = 0, first_sent = 0, last_sent = 0, last_reply = 0, fails = 0;
  std::string error;
};

struct Observed {
  explicit Observed(int ranks) : ranks(ranks) {}

  void take_sim_line(int sim, const std::string& line);
  void take_event(const nlohmann::json& e, int64_t arrival_ns);

  RankSeen& rank(int gen, int r);
  // Ranks of `gen` for which pred holds.
  int count(int gen, bool (*pred)(const RankSeen&)) const;
  // The failure event of generation `gen` (null until it came).
  const nlohmann::json* failure_of(int gen) const;

  int ranks;
  bool gloo = false;  // the gloo pattern runs after the nccl one
  std::mutex mu;
  std::condition_variable cv;
  std::map<int, std::vector<RankSeen>> gens;
  std::map<int, int64_t> registered;  // agent -> its last registration
  std::map<int, int> agent_sim;       // agent -> simulated process
  std::map<int, int64_t> agent_lost;
  std::map<std::pair<int, int>, int64_t> killed, hung;  // (generation, rank) -> when
  std::map<std::pair<int, int64_t>, StepSeen> steps;
  std::map<std::pair<int, int64_t>, CkptSeen> ckpts;
  std::vector<std::string> problems;  // the first 200 the simulated processes reported
  int64_t connect_retries = 0;        // agents' connection attempts tried again
  int ended_sims = 0;                 // simulated processes whose output ended
  // The coordinator's events.
  std::map<std::pair<int, int64_t>, int64_t> step_events;  // (generation, step) -> arrival
  std::vector<std::pair<nlohmann::json, int64_t>> failures, checkpoints, states;
};

// A rank that finished its rendezvous (both patterns when the gloo one runs).
bool rendezvoused(const RankSeen& r);

}  // namespace troupe::scale

// What the dashboard shows beyond the job table: each job's recent history,
// kept from the coordinator's events (the JSON the PUB socket sends), and the
// Prometheus text of /metrics. Plain C++: no sockets, no actors.
//
//   history.on_event(R"({"event":"step","job":"j-1","metrics":{"step":4,"loss":2.7,...}})");
//   history.job_view("j-1", 0)
//     -> {"metrics":[{"seq":1764590000000001,"step":4,"loss":2.7,...}], "events":[...],
//         "checkpoints":[...], "last_seq":1764590000000001}
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace troupe::coord {

struct HistoryLimits {
  size_t points = 4096;  // metric points per job; beyond, every other older point is dropped
  size_t events = 200;   // timeline entries per job (the newest)
  size_t checkpoints = 100;
  size_t jobs = 256;  // jobs remembered (the one updated longest ago forgotten first)
};

class JobHistory {
 public:
  explicit JobHistory(HistoryLimits limits = {});

  // Takes one event; what does not parse or is not about a job is ignored. Never throws.
  // Thread-safe: the coordinator actor calls it while the HTTP thread reads.
  void on_event(const std::string& event_json) noexcept;

  // The job's points with seq > after_seq (oldest first), its timeline and checkpoints, and
  // last_seq (its newest point's, 0 when none); empty arrays for a job it has not seen.
  //
  // A point's seq is never reused: one counter for every job, starting at this history's
  // creation time in microseconds since the epoch, so a page that asks after the last seq it
  // has misses nothing across a relaunch (whose steps go back), a forgotten job seen again,
  // or a coordinator restarted since.
  nlohmann::json job_view(const std::string& job, int64_t after_seq) const;

  struct Latest {
    int64_t step = 0;
    double loss = 0, tokens_per_s = 0, step_ms = 0;
    // The mean step time of the generation's last points but its first (which carries the
    // rendezvous and the first allocations): for the ETA. 0 while there is none.
    double mean_step_ms = 0;
  };
  std::optional<Latest> latest(const std::string& job) const;

 private:
  struct Point {
    int64_t seq = 0, step = 0, generation = 0;
    double loss = 0, lr = 0, tokens_per_s = 0, step_ms = 0, val_loss = 0;
    bool has_val_loss = false;
  };
  struct Job {
    std::deque<Point> points;
    std::deque<nlohmann::json> events, checkpoints;
    int64_t touched = 0;  // the history's tick when it last changed
  };
  Job& job_locked(const std::string& id);
  void take(const nlohmann::json& e);
  void take_step(Job& j, const nlohmann::json& metrics);

  HistoryLimits limits_;
  mutable std::mutex mu_;
  std::map<std::string, Job> jobs_;
  int64_t next_seq_;
  int64_t tick_ = 0;
};

// The Prometheus text exposition (version 0.0.4) of the coordinator:
//   list     the API's "list" reply (jobs, agents, devices);
//   status   the API's "status" job objects of the jobs still live (their workers);
//   history  the last step of each job.
std::string prometheus_text(const nlohmann::json& list, const std::vector<nlohmann::json>& status,
                            const JobHistory& history);

// `value` as a Prometheus label value: backslash, double quote and newline escaped.
std::string prometheus_label(const std::string& value);

}  // namespace troupe::coord

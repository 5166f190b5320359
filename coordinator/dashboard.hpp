// What the dashboard shows beyond the job table: each job's recent history,
// kept from the coordinator's events (the JSON the PUB socket sends), and the
// Prometheus text of /metrics. Plain C++: no sockets, no actors.
//
//   history.on_event(R"({"event":"step","job":"j-1","metrics":{"step":4,"loss":2.7,...}})");
//   history.job_view("j-1", 0)
//     -> {"metrics":[{"seq":1,"step":4,"loss":2.7,...}], "events":[...], "checkpoints":[...],
//         "last_seq":1}
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace troupe::coord {

struct HistoryLimits {
  size_t points = 4096;  // metric points per job; beyond, every other older point is dropped
  size_t events = 500;   // timeline entries per job (the newest)
  size_t checkpoints = 100;
  size_t jobs = 256;  // jobs remembered (the oldest forgotten first)
};

class JobHistory {
 public:
  explicit JobHistory(HistoryLimits limits = {});

  // Takes one event; what does not parse or is not about a job is ignored. Never throws.
  // Thread-safe: the coordinator actor calls it while the HTTP thread reads.
  void on_event(const std::string& event_json) noexcept;

  // The job's points with seq > after_seq (oldest first), its timeline and checkpoints, and
  // last_seq, the newest point's seq (0: none; lower than a page's own after a coordinator
  // restart, when the page starts over); empty arrays for a job it has not seen.
  nlohmann::json job_view(const std::string& job, int64_t after_seq) const;

  struct Latest {
    int64_t step = 0;
    double loss = 0, tokens_per_s = 0, step_ms = 0;
    double mean_step_ms = 0;  // over the last points of the generation: for the ETA
  };
  std::optional<Latest> latest(const std::string& job) const;

 private:
  struct Job {
    std::deque<nlohmann::json> points, events, checkpoints;
    int64_t next_seq = 1;
  };
  Job& job_locked(const std::string& id);
  void take(const nlohmann::json& e);

  HistoryLimits limits_;
  mutable std::mutex mu_;
  std::map<std::string, Job> jobs_;
  std::deque<std::string> order_;  // job ids, first seen first
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

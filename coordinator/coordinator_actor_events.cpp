// The coordinator's events on disk and on the feed: each job's run directory
// (events.log, metrics.jsonl) and the job table of --state-dir.
#include <filesystem>
#include <iostream>

#include "coordinator/coordinator_actor_state.hpp"
#include "coordinator/event_text.hpp"
#include "core/failure.hpp"
#include "core/text.hpp"

namespace troupe::coord::actor {

namespace {

// A full disk: the step_N.tmp directories the ranks began are removed (never a committed step_N).
void remove_partial_checkpoints(const std::string& root, RunDir& rd) {
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(root, ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("step_", 0) != 0 || name.size() < 9 || name.compare(name.size() - 4, 4, ".tmp") != 0)
      continue;
    std::error_code rm;
    std::filesystem::remove_all(it->path(), rm);
    rd.event("removed the partial checkpoint " + it->path().string() +
             (rm ? " (failed: " + rm.message() + ")" : ""));
  }
}

}  // namespace

void record_event(self_ptr self, nlohmann::json e) {
  auto& s = self->state;
  e["time"] = utc_timestamp();
  const std::string kind = e.value("event", "");
  const std::string job = e.value("job", "");
  try {
    if (kind == "submitted") {
      std::filesystem::path dir = e["run_dir"].get<std::string>();
      auto rd = std::make_unique<RunDir>(dir.parent_path().string(), e["name"].get<std::string>(), job);
      rd->write_spec(e["spec"].get<std::string>());
      rd->event(event_text(e));
      s.run_dirs[job] = std::move(rd);
      e.erase("spec");
    } else if (auto it = s.run_dirs.find(job); it != s.run_dirs.end()) {
      RunDir& rd = *it->second;
      if (kind == "step") {
        rd.metrics(e["metrics"]);
      } else if (std::string line = event_text(e); !line.empty()) {
        rd.event(line);
      }
      if (kind == "failure" && parse_failure_cause(e.value("cause", "")) == FailureCause::disk_full)
        if (const Job* j = s.st->job(job)) remove_partial_checkpoints(s.st->checkpoint_root(*j), rd);
    }
  } catch (const std::exception& ex) {
    // A full disk must not take the coordinator down; the event still goes out.
    e["run_dir_error"] = ex.what();
  }
  if (s.opt.on_event) s.opt.on_event(json_text(e));
  if (kind == "state" && (e["state"] == "succeeded" || e["state"] == "failed" || e["state"] == "cancelled")) {
    s.run_dirs.erase(job);
  }
}

void persist(self_ptr self, const std::vector<nlohmann::json>& events) {
  auto& s = self->state;
  if (s.opt.state_dir.empty()) return;
  bool changed = false;
  for (const auto& e : events) {
    const std::string kind = e.value("event", "");
    changed = changed || (kind != "step" && kind != "agent" && kind != "log" && kind != "worker_exit");
  }
  if (!changed) return;
  try {
    save_table(s.opt.state_dir, s.st->table_json());
  } catch (const std::exception& ex) {
    // The jobs keep running; the table on disk is the previous one, intact.
    std::cerr << "troupe coordinator: cannot save the job table: " << ex.what() << std::endl;
  }
}

}  // namespace troupe::coord::actor

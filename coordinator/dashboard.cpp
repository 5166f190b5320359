#include "coordinator/dashboard.hpp"

#include <cstdio>
#include <functional>
#include <sstream>

#include "coordinator/event_text.hpp"

namespace troupe::coord {

JobHistory::JobHistory(HistoryLimits limits) : limits_(limits) {}

JobHistory::Job& JobHistory::job_locked(const std::string& id) {
  auto it = jobs_.find(id);
  if (it != jobs_.end()) return it->second;
  if (jobs_.size() >= limits_.jobs && !order_.empty()) {
    jobs_.erase(order_.front());
    order_.pop_front();
  }
  order_.push_back(id);
  return jobs_[id];
}

void JobHistory::on_event(const std::string& event_json) noexcept {
  try {
    auto e = nlohmann::json::parse(event_json, nullptr, false);
    if (!e.is_object()) return;
    std::lock_guard<std::mutex> lock(mu_);
    take(e);
  } catch (const std::exception&) {
    // A field of an unexpected type: the event is not shown, the coordinator goes on.
  }
}

namespace {

template <typename T>
void push_bounded(std::deque<T>& q, T v, size_t limit) {
  q.push_back(std::move(v));
  while (q.size() > limit) q.pop_front();
}

// Copies the listed keys of `from` that are present.
void copy_keys(const nlohmann::json& from, nlohmann::json& to, std::initializer_list<const char*> keys) {
  for (const char* k : keys)
    if (auto it = from.find(k); it != from.end() && !it->is_null()) to[k] = *it;
}

}  // namespace

void JobHistory::take(const nlohmann::json& e) {
  const auto job = e.find("job");
  const auto kind_it = e.find("event");
  if (job == e.end() || !job->is_string() || kind_it == e.end() || !kind_it->is_string()) return;
  const std::string& kind = kind_it->get_ref<const std::string&>();
  Job& j = job_locked(job->get<std::string>());

  if (kind == "step") {
    const auto m = e.find("metrics");
    if (m == e.end() || !m->is_object()) return;
    nlohmann::json p = nlohmann::json::object();
    for (const char* k : {"step", "loss", "val_loss", "tokens_per_s", "step_ms", "generation", "lr"})
      if (auto it = m->find(k); it != m->end() && it->is_number()) p[k] = *it;
    // A point is a step with a loss; what else a line lacks, the charts leave out.
    if (!p.contains("step") || !p["step"].is_number_integer() || !p.contains("loss")) return;
    p["seq"] = j.next_seq++;
    j.points.push_back(std::move(p));
    if (j.points.size() > limits_.points) {
      // Thin the older half to every other point: the curve keeps its whole span.
      const size_t half = j.points.size() / 2;
      std::deque<nlohmann::json> kept;
      for (size_t i = 0; i < j.points.size(); ++i)
        if (i >= half || i % 2 == 0) kept.push_back(std::move(j.points[i]));
      j.points.swap(kept);
    }
    return;
  }
  const std::string text = event_text(e);
  if (text.empty()) return;
  // A job that waits says so on every tick of the coordinator; the timeline keeps the first.
  if (!j.events.empty() && j.events.back().value("message", "") == text) return;
  nlohmann::json entry = {{"event", kind}, {"message", text}};
  copy_keys(e, entry, {"time", "generation", "state"});
  if (kind == "failure") copy_keys(e, entry, {"cause", "rank", "host", "pid", "device", "step"});
  push_bounded(j.events, std::move(entry), limits_.events);
  if (kind == "checkpoint") {
    nlohmann::json c = nlohmann::json::object();
    copy_keys(e, c, {"time", "step", "dir", "generation"});
    push_bounded(j.checkpoints, std::move(c), limits_.checkpoints);
  }
}

nlohmann::json JobHistory::job_view(const std::string& id, int64_t after_seq) const {
  nlohmann::json out = {{"metrics", nlohmann::json::array()},
                        {"events", nlohmann::json::array()},
                        {"checkpoints", nlohmann::json::array()}};
  out["last_seq"] = 0;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return out;
  out["last_seq"] = it->second.next_seq - 1;
  for (const auto& p : it->second.points)
    if (p.value("seq", int64_t{0}) > after_seq) out["metrics"].push_back(p);
  for (const auto& ev : it->second.events) out["events"].push_back(ev);
  for (const auto& c : it->second.checkpoints) out["checkpoints"].push_back(c);
  return out;
}

std::optional<JobHistory::Latest> JobHistory::latest(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end() || it->second.points.empty()) return std::nullopt;
  const auto& pts = it->second.points;
  const nlohmann::json& last = pts.back();
  Latest l;
  l.step = last.value("step", int64_t{0});
  l.loss = last.value("loss", 0.0);
  l.tokens_per_s = last.value("tokens_per_s", 0.0);
  l.step_ms = last.value("step_ms", 0.0);
  const int64_t gen = last.value("generation", int64_t{0});
  double sum = 0;
  int n = 0;
  for (auto p = pts.rbegin(); p != pts.rend() && n < 20 && p->value("generation", int64_t{0}) == gen;
       ++p, ++n)
    sum += p->value("step_ms", 0.0);
  l.mean_step_ms = n ? sum / n : l.step_ms;
  return l;
}

std::string prometheus_label(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

namespace {

// One metric family: its HELP and TYPE lines, then its samples.
class Family {
 public:
  Family(std::ostringstream& out, const char* name, const char* type, const char* help)
      : out_(out), name_(name) {
    out_ << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
  }
  void sample(const std::vector<std::pair<const char*, std::string>>& labels, double value) {
    out_ << name_;
    if (!labels.empty()) {
      out_ << "{";
      for (size_t i = 0; i < labels.size(); ++i)
        out_ << (i ? "," : "") << labels[i].first << "=\"" << prometheus_label(labels[i].second) << "\"";
      out_ << "}";
    }
    char num[64];
    std::snprintf(num, sizeof num, "%.17g", value);
    out_ << " " << num << "\n";
  }

 private:
  std::ostringstream& out_;
  const char* name_;
};

std::string str(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end()) return "";
  return it->is_string() ? it->get<std::string>() : it->dump();
}

double num(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}

}  // namespace

std::string prometheus_text(const nlohmann::json& list, const std::vector<nlohmann::json>& status,
                            const JobHistory& history) {
  std::ostringstream out;
  const nlohmann::json jobs = list.value("jobs", nlohmann::json::array());
  const nlohmann::json agents = list.value("agents", nlohmann::json::array());
  const nlohmann::json devices = list.value("devices", nlohmann::json::object());

  {
    Family f(out, "troupe_jobs", "gauge", "Jobs in the coordinator's table, by state.");
    for (const char* st :
         {"queued", "planning", "launching", "running", "recovering", "succeeded", "failed", "cancelled"}) {
      int n = 0;
      for (const auto& j : jobs) n += str(j, "state") == st ? 1 : 0;
      f.sample({{"state", st}}, n);
    }
  }
  {
    Family f(out, "troupe_queue_length", "gauge", "Jobs queued for devices.");
    int n = 0;
    for (const auto& j : jobs) n += str(j, "state") == "queued" ? 1 : 0;
    f.sample({}, n);
  }
  Family(out, "troupe_agents", "gauge", "Agents registered.").sample({}, double(agents.size()));
  for (const char* which : {"total", "free"}) {
    const std::string name = std::string("troupe_devices_") + which;
    Family f(out, name.c_str(), "gauge",
             which[0] == 't' ? "Devices the agents offer." : "Devices no job holds.");
    for (const auto& [kind, d] : devices.items()) f.sample({{"kind", kind}}, num(d, which));
  }

  // Per job: one family at a time over every job (the format wants a family's samples together).
  auto per_job = [&](const char* name, const char* type, const char* help,
                     const std::function<std::optional<double>(const nlohmann::json&)>& value) {
    Family f(out, name, type, help);
    for (const auto& j : jobs)
      if (auto v = value(j)) f.sample({{"job", str(j, "id")}, {"name", str(j, "name")}}, *v);
  };
  {
    Family f(out, "troupe_job_info", "gauge", "A job's state and layout (always 1).");
    for (const auto& j : jobs)
      f.sample({{"job", str(j, "id")},
                {"name", str(j, "name")},
                {"state", str(j, "state")},
                {"layout", str(j, "layout")}},
               1);
  }
  per_job("troupe_job_generation", "gauge", "The job's generation (0 at launch, one more at each relaunch).",
          [](const nlohmann::json& j) { return num(j, "generation"); });
  per_job("troupe_job_restarts_total", "counter", "Relaunches caused by failures.",
          [](const nlohmann::json& j) { return num(j, "restarts"); });
  per_job("troupe_job_steps_done", "gauge", "Optimizer steps completed.",
          [](const nlohmann::json& j) { return num(j, "steps_done"); });
  per_job("troupe_job_steps_total", "gauge", "Optimizer steps the job runs.",
          [](const nlohmann::json& j) { return num(j, "total_steps"); });
  auto last = [&](const nlohmann::json& j) { return history.latest(str(j, "id")); };
  per_job("troupe_job_loss", "gauge", "Training loss of the last step.", [&](const nlohmann::json& j) {
    auto l = last(j);
    return l ? std::optional<double>(l->loss) : std::nullopt;
  });
  per_job("troupe_job_tokens_per_second", "gauge", "Tokens per second of the last step.",
          [&](const nlohmann::json& j) {
            auto l = last(j);
            return l ? std::optional<double>(l->tokens_per_s) : std::nullopt;
          });
  per_job("troupe_job_step_seconds", "gauge", "Duration of the last step (its slowest rank).",
          [&](const nlohmann::json& j) {
            auto l = last(j);
            return l ? std::optional<double>(l->step_ms / 1000.0) : std::nullopt;
          });

  {
    Family f(out, "troupe_worker_heartbeat_age_seconds", "gauge",
             "Seconds since the worker last said where it is.");
    for (const auto& j : status)
      for (const auto& w : j.value("workers", nlohmann::json::array()))
        if (w.contains("heartbeat_age_s"))
          f.sample({{"job", str(j, "id")},
                    {"rank", str(w, "rank")},
                    {"host", str(w, "host")},
                    {"device", str(w, "device")}},
                   num(w, "heartbeat_age_s"));
  }
  {
    Family f(out, "troupe_worker_info", "gauge", "Where a worker runs and what it last did (always 1).");
    for (const auto& j : status)
      for (const auto& w : j.value("workers", nlohmann::json::array()))
        f.sample({{"job", str(j, "id")},
                  {"rank", str(w, "rank")},
                  {"host", str(w, "host")},
                  {"device", str(w, "device")},
                  {"pid", str(w, "pid")},
                  {"where", str(w, "where")}},
                 1);
  }
  return out.str();
}

}  // namespace troupe::coord

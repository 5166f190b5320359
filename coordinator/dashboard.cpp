#include "coordinator/dashboard.hpp"

#include <chrono>
#include <cstdio>
#include <sstream>

#include "coordinator/api.hpp"
#include "coordinator/event_text.hpp"
#include "coordinator/job.hpp"

namespace troupe::coord {

namespace {

int64_t epoch_us() {
  using namespace std::chrono;
  return duration_cast<microseconds>(system_clock::now().time_since_epoch()).count();
}

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

// The number at `key`, or nullopt when absent or not a number.
std::optional<double> number(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

}  // namespace

JobHistory::JobHistory(HistoryLimits limits) : limits_(limits), next_seq_(epoch_us()) {}

JobHistory::Job& JobHistory::job_locked(const std::string& id) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) {
    if (jobs_.size() >= limits_.jobs) {
      // Forget the job that changed longest ago: a finished one, as a rule, not a running one.
      auto oldest = jobs_.begin();
      for (auto j = jobs_.begin(); j != jobs_.end(); ++j)
        if (j->second.touched < oldest->second.touched) oldest = j;
      jobs_.erase(oldest);
    }
    it = jobs_.emplace(id, Job{}).first;
  }
  it->second.touched = ++tick_;
  return it->second;
}

void JobHistory::on_event(const std::string& event_json) noexcept {
  try {
    auto e = json_read::parse(event_json, "an event", api_reply_limits());
    if (!e.is_object()) return;
    std::lock_guard<std::mutex> lock(mu_);
    take(e);
  } catch (const std::exception&) {
    // A field of an unexpected type (or no memory): the event is not shown, the coordinator goes on.
  }
}

void JobHistory::take_step(Job& j, const nlohmann::json& m) {
  const auto step = m.find("step");
  const auto loss = number(m, "loss");
  // A point is a step with a loss; what else a line lacks, the charts leave out.
  if (step == m.end() || !step->is_number_integer() || !loss) return;
  Point p;
  p.seq = ++next_seq_;
  p.step = step->get<int64_t>();
  p.loss = *loss;
  p.generation = static_cast<int64_t>(number(m, "generation").value_or(0));
  p.lr = number(m, "lr").value_or(0);
  p.tokens_per_s = number(m, "tokens_per_s").value_or(0);
  p.step_ms = number(m, "step_ms").value_or(0);
  if (auto v = number(m, "val_loss")) {
    p.val_loss = *v;
    p.has_val_loss = true;
  }
  j.points.push_back(p);
  if (j.points.size() > limits_.points) {
    // Thin the older half to every other point: the curve keeps its whole span.
    const size_t half = j.points.size() / 2;
    std::deque<Point> kept;
    for (size_t i = 0; i < j.points.size(); ++i)
      if (i >= half || i % 2 == 0) kept.push_back(j.points[i]);
    j.points.swap(kept);
  }
}

void JobHistory::take(const nlohmann::json& e) {
  const auto job = e.find("job");
  const auto kind_it = e.find("event");
  if (job == e.end() || !job->is_string() || kind_it == e.end() || !kind_it->is_string()) return;
  const std::string& kind = kind_it->get_ref<const std::string&>();
  if (kind == "step") {
    const auto m = e.find("metrics");
    if (m != e.end() && m->is_object()) take_step(job_locked(job->get<std::string>()), *m);
    return;
  }
  const std::string text = event_text(e);
  if (text.empty()) return;
  Job& j = job_locked(job->get<std::string>());
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
                        {"checkpoints", nlohmann::json::array()},
                        {"last_seq", 0}};
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return out;
  const Job& j = it->second;
  if (!j.points.empty()) out["last_seq"] = j.points.back().seq;
  for (const Point& p : j.points) {
    if (p.seq <= after_seq) continue;
    nlohmann::json o = {{"seq", p.seq},
                        {"step", p.step},
                        {"loss", p.loss},
                        {"lr", p.lr},
                        {"step_ms", p.step_ms},
                        {"tokens_per_s", p.tokens_per_s},
                        {"generation", p.generation}};
    if (p.has_val_loss) o["val_loss"] = p.val_loss;
    out["metrics"].push_back(std::move(o));
  }
  for (const auto& ev : j.events) out["events"].push_back(ev);
  for (const auto& c : j.checkpoints) out["checkpoints"].push_back(c);
  return out;
}

std::optional<JobHistory::Latest> JobHistory::latest(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end() || it->second.points.empty()) return std::nullopt;
  const auto& pts = it->second.points;
  const Point& last = pts.back();
  Latest l;
  l.step = last.step;
  l.loss = last.loss;
  l.tokens_per_s = last.tokens_per_s;
  l.step_ms = last.step_ms;
  // The generation's last 20 points, without its first.
  double sum = 0;
  int n = 0;
  for (auto p = pts.rbegin(); p != pts.rend() && n < 20 && p->generation == last.generation; ++p) {
    const bool first_of_generation = std::next(p) == pts.rend() || std::next(p)->generation != p->generation;
    if (first_of_generation || p->step_ms <= 0) continue;
    sum += p->step_ms;
    ++n;
  }
  l.mean_step_ms = n ? sum / n : 0;
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

using Labels = std::vector<std::pair<const char*, std::string>>;

// One metric family: its HELP and TYPE lines, then its samples.
class Family {
 public:
  Family(std::ostringstream& out, const char* name, const char* type, const char* help)
      : out_(out), name_(name) {
    out_ << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
  }
  void sample(const Labels& labels, double value) {
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

double num(const nlohmann::json& j, const char* key) { return number(j, key).value_or(0.0); }

// j[key] when it is an array, else an empty one; not a copy (a job's workers are thousands).
const nlohmann::json& array_at(const nlohmann::json& j, const char* key) {
  static const nlohmann::json empty = nlohmann::json::array();
  auto it = j.find(key);
  return it != j.end() && it->is_array() ? *it : empty;
}

constexpr JobState kStates[] = {JobState::queued,  JobState::planning,   JobState::launching,
                                JobState::running, JobState::recovering, JobState::succeeded,
                                JobState::failed,  JobState::cancelled};

}  // namespace

std::string prometheus_text(const nlohmann::json& list, const std::vector<nlohmann::json>& status,
                            const JobHistory& history) {
  std::ostringstream out;
  const nlohmann::json jobs = list.value("jobs", nlohmann::json::array());
  const nlohmann::json agents = list.value("agents", nlohmann::json::array());
  const nlohmann::json devices = list.value("devices", nlohmann::json::object());

  auto count = [&](JobState st) {
    int n = 0;
    for (const auto& j : jobs) n += str(j, "state") == to_string(st) ? 1 : 0;
    return n;
  };
  {
    Family f(out, "troupe_jobs", "gauge", "Jobs in the coordinator's table, by state.");
    for (JobState st : kStates) f.sample({{"state", to_string(st)}}, count(st));
  }
  Family(out, "troupe_queue_length", "gauge", "Jobs queued for devices.").sample({}, count(JobState::queued));
  Family(out, "troupe_agents", "gauge", "Agents registered.")
      .sample({}, number(list, "agents_total").value_or(double(agents.size())));
  for (const char* which : {"total", "free"}) {
    const std::string name = std::string("troupe_devices_") + which;
    Family f(out, name.c_str(), "gauge",
             which[0] == 't' ? "Devices the agents offer." : "Devices no job holds.");
    for (const auto& [kind, d] : devices.items()) f.sample({{"kind", kind}}, num(d, which));
  }

  {
    Family f(out, "troupe_job_info", "gauge", "A job's state and layout (always 1).");
    for (const auto& j : jobs)
      f.sample({{"job", str(j, "id")},
                {"name", str(j, "name")},
                {"state", str(j, "state")},
                {"layout", str(j, "layout")}},
               1);
  }
  // One family at a time over every job (the format wants a family's samples together);
  // a value of nullopt leaves the job out of that family.
  using Value =
      std::optional<double> (*)(const nlohmann::json& job, const std::optional<JobHistory::Latest>&);
  struct PerJob {
    const char *name, *type, *help;
    Value value;
  };
  const PerJob per_job[] = {
      {"troupe_job_generation", "gauge", "The job's generation (0 at launch, one more at each relaunch).",
       [](const nlohmann::json& j, const auto&) { return number(j, "generation"); }},
      {"troupe_job_restarts_total", "counter", "Relaunches caused by failures.",
       [](const nlohmann::json& j, const auto&) { return number(j, "restarts"); }},
      {"troupe_job_steps_done", "gauge", "Optimizer steps completed.",
       [](const nlohmann::json& j, const auto&) { return number(j, "steps_done"); }},
      {"troupe_job_steps_planned", "gauge", "Optimizer steps the job runs.",
       [](const nlohmann::json& j, const auto&) { return number(j, "total_steps"); }},
      {"troupe_job_loss", "gauge", "Training loss of the last step.",
       [](const nlohmann::json&, const auto& l) {
         return l ? std::optional<double>(l->loss) : std::nullopt;
       }},
      {"troupe_job_tokens_per_second", "gauge", "Tokens per second of the last step.",
       [](const nlohmann::json&, const auto& l) {
         return l ? std::optional<double>(l->tokens_per_s) : std::nullopt;
       }},
      {"troupe_job_step_seconds", "gauge", "Duration of the last step (its slowest rank).",
       [](const nlohmann::json&, const auto& l) {
         return l ? std::optional<double>(l->step_ms / 1000.0) : std::nullopt;
       }},
  };
  std::vector<std::optional<JobHistory::Latest>> latest;
  for (const auto& j : jobs) latest.push_back(history.latest(str(j, "id")));
  for (const PerJob& m : per_job) {
    Family f(out, m.name, m.type, m.help);
    for (size_t i = 0; i < jobs.size(); ++i)
      if (auto v = m.value(jobs[i], latest[i]))
        f.sample({{"job", str(jobs[i], "id")}, {"name", str(jobs[i], "name")}}, *v);
  }

  // Per worker of a live job. What a worker is doing ("where") changes every step, so it is in
  // the JSON, not a label here: a label that changes makes a new series each time.
  auto worker_labels = [](const nlohmann::json& job, const nlohmann::json& w) -> Labels {
    return {{"job", str(job, "id")},
            {"rank", str(w, "rank")},
            {"host", str(w, "host")},
            {"device", str(w, "device")}};
  };
  {
    // The job's oldest "where" answer in one series: what an alert on a hang watches, however
    // many workers the job has.
    Family f(out, "troupe_job_heartbeat_age_max_seconds", "gauge",
             "Seconds since the job's least recent worker said where it is.");
    for (const auto& j : status) {
      const nlohmann::json summary = j.value("worker_summary", nlohmann::json::object());
      if (auto age = number(summary, "heartbeat_age_max_s")) f.sample({{"job", str(j, "id")}}, *age);
    }
  }
  {
    Family f(out, "troupe_worker_heartbeat_age_seconds", "gauge",
             "Seconds since the worker last said where it is.");
    for (const auto& j : status)
      for (const auto& w : array_at(j, "workers"))
        if (auto age = number(w, "heartbeat_age_s")) f.sample(worker_labels(j, w), *age);
  }
  {
    Family f(out, "troupe_worker_info", "gauge", "Where a worker runs: its host, device and pid (always 1).");
    for (const auto& j : status)
      for (const auto& w : array_at(j, "workers")) {
        Labels l = worker_labels(j, w);
        l.push_back({"pid", str(w, "pid")});
        f.sample(l, 1);
      }
  }
  return out.str();
}

}  // namespace troupe::coord

// The job table of `troupe coordinator --state-dir` (coordinator/state.hpp):
// CoordinatorState to JSON and back, and the file that holds it.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "coordinator/state.hpp"
#include "core/error.hpp"
#include "core/hostile_file.hpp"
#include "core/json_read.hpp"
#include "core/spec.hpp"

namespace troupe::coord {

namespace {

constexpr int kTableFormat = 1;

nlohmann::json layout_json(const Layout& l) { return {l.dp, l.pp, l.tp}; }

Layout layout_from(const nlohmann::json& x) {
  TROUPE_CHECK(x.is_array() && x.size() == 3, "bad layout in the job table: ", x.dump());
  Layout l{x[0].get<int>(), x[1].get<int>(), x[2].get<int>()};
  TROUPE_CHECK(l.dp > 0 && l.pp > 0 && l.tp > 0, "bad layout in the job table: ", x.dump());
  return l;
}

JobState state_from(const std::string& name) {
  for (JobState s : {JobState::queued, JobState::planning, JobState::launching, JobState::running,
                     JobState::recovering, JobState::succeeded, JobState::failed, JobState::cancelled})
    if (name == to_string(s)) return s;
  TROUPE_CHECK(false, "unknown job state '", name, "' in the job table");
  return JobState::failed;
}

nlohmann::json plan_inputs_json(const plan::PlanInputs& p) {
  return {{"model", to_string(p.model.type)},  {"n_layers", p.model.n_layers},
          {"d_model", p.model.d_model},        {"vocab_size", p.model.vocab_size},
          {"seq_len", p.model.seq_len},        {"global_batch", p.global_batch},
          {"micro_batch", p.micro_batch},      {"schedule", plan::schedule_name(p.schedule)},
          {"virtual_stages", p.virtual_stages}};
}

plan::PlanInputs plan_inputs_from(const nlohmann::json& x) {
  plan::PlanInputs p;
  const std::string model = x.at("model").get<std::string>();
  bool known = false;
  for (ModelType t : {ModelType::gpt, ModelType::mlp, ModelType::llama})
    if (model == to_string(t)) {
      p.model.type = t;
      known = true;
    }
  TROUPE_CHECK(known, "unknown model type '", model, "' in the job table");
  p.model.n_layers = x.at("n_layers").get<int>();
  p.model.d_model = x.at("d_model").get<int>();
  p.model.vocab_size = x.at("vocab_size").get<int>();
  p.model.seq_len = x.at("seq_len").get<int>();
  p.global_batch = x.at("global_batch").get<int>();
  p.micro_batch = x.at("micro_batch").get<int>();
  p.schedule = plan::schedule_from_name(x.at("schedule").get<std::string>());
  p.virtual_stages = x.at("virtual_stages").get<int>();
  return p;
}

nlohmann::json request_json(const JobRequest& r) {
  return {{"name", r.name},
          {"spec_yaml", r.spec_yaml},
          {"device_kind", r.device_kind},
          {"layout", layout_json(r.layout)},
          {"plan", plan_inputs_json(r.plan)},
          {"total_steps", r.total_steps},
          {"resume_from", r.resume_from},
          {"checkpoint_dir", r.checkpoint_dir},
          {"checkpoint_keep", r.checkpoint_keep},
          {"max_restarts", r.max_restarts},
          {"restart_backoff_ms", r.restart_backoff_ms},
          {"step_timeout_ms", r.step_timeout_ms},
          {"replacement_wait_ms", r.replacement_wait_ms},
          {"min_devices", r.min_devices},
          {"max_devices", r.max_devices},
          {"spares", r.spares},
          {"spread", r.spread},
          {"replicated", r.replicated},
          {"auto_plan", r.auto_plan},
          {"hardware_yaml", r.hardware_yaml}};
}

JobRequest request_from(const nlohmann::json& x) {
  JobRequest r;
  r.name = x.at("name").get<std::string>();
  r.spec_yaml = x.at("spec_yaml").get<std::string>();
  r.device_kind = x.at("device_kind").get<std::string>();
  r.layout = layout_from(x.at("layout"));
  // Tables written before the plan inputs were kept: derive them from the spec (whose
  // SpecError would not be a troupe::Error, which is what a table that cannot load throws).
  if (x.contains("plan")) {
    r.plan = plan_inputs_from(x.at("plan"));
  } else {
    try {
      r.plan = plan::plan_inputs(parse_spec(r.spec_yaml, "the job table"));
    } catch (const SpecError& e) {
      throw Error(std::string("job ") + r.name +
                  " in the job table has no plan and a spec that does not parse:\n" + e.what());
    }
  }
  r.total_steps = x.at("total_steps").get<int64_t>();
  r.resume_from = x.at("resume_from").get<std::string>();
  r.checkpoint_dir = x.at("checkpoint_dir").get<std::string>();
  r.checkpoint_keep = x.value("checkpoint_keep", 0);
  r.max_restarts = x.at("max_restarts").get<int>();
  r.restart_backoff_ms = x.at("restart_backoff_ms").get<double>();
  r.step_timeout_ms = x.at("step_timeout_ms").get<double>();
  r.replacement_wait_ms = x.at("replacement_wait_ms").get<double>();
  r.min_devices = x.at("min_devices").get<int>();
  r.max_devices = x.at("max_devices").get<int>();
  r.spares = std::clamp(x.value("spares", 0), 0, kMaxSpares);
  r.spread = x.value("spread", false);
  r.replicated = x.value("replicated", false);
  r.auto_plan = x.value("auto_plan", false);
  r.hardware_yaml = x.value("hardware_yaml", std::string());
  TROUPE_CHECK(!r.auto_plan || !r.hardware_yaml.empty(), "job ", r.name,
               " in the job table is planned automatically but has no hardware profile");
  return r;
}

}  // namespace

nlohmann::json CoordinatorState::table_json() const {
  nlohmann::json jobs = nlohmann::json::array();
  for (const auto& id : order_) {
    const Job& j = jobs_.at(id);
    jobs.push_back({{"id", j.id},
                    {"request", request_json(j.request)},
                    {"state", to_string(j.state)},
                    {"reason", j.reason},
                    {"failure_name", j.failure ? to_string(*j.failure) : ""},
                    {"layout", layout_json(j.layout)},
                    {"generation", j.generation},
                    {"restarts", j.restarts},
                    {"run_dir", j.run_dir},
                    {"resume_from", j.resume_from},
                    {"target_dp", j.target_dp},
                    {"target_devices", j.target_devices},
                    {"first_devices", j.first_devices},
                    {"failures", j.failures},
                    {"last_step", j.last_step},
                    {"last_loss", j.last_loss},
                    {"control_messages", j.control_messages},
                    {"submitted_ms", j.submitted_ms},
                    {"first_step_ms", j.first_step_ms},
                    {"finished_ms", j.finished_ms}});
  }
  return {{"format", kTableFormat}, {"jobs", jobs}};
}

void CoordinatorState::load_table(const nlohmann::json& table, Actions* out) {
  TROUPE_CHECK(jobs_.empty(), "a job table is loaded only into a coordinator without jobs");
  TROUPE_CHECK(table.is_object() && table.value("format", 0) == kTableFormat && table.contains("jobs") &&
                   table["jobs"].is_array(),
               "not a troupe job table (format ", kTableFormat, ")");
  const double now = now_ms();
  std::vector<Job> loaded;
  try {
    for (const auto& x : table["jobs"]) {
      Job j;
      j.id = x.at("id").get<std::string>();
      TROUPE_CHECK(!j.id.empty(), "a job without an id in the job table");
      j.request = request_from(x.at("request"));
      j.spec_yaml = j.request.spec_yaml;
      j.state = state_from(x.at("state").get<std::string>());
      j.reason = x.at("reason").get<std::string>();
      const std::string failure = x.at("failure_name").get<std::string>();
      if (!failure.empty()) {
        // A cause this version does not name (an older or newer table) is kept as a generic one.
        j.failure = parse_failure_cause(failure).value_or(FailureCause::worker_failed);
      }
      j.layout = layout_from(x.at("layout"));
      j.generation = x.at("generation").get<int>();
      j.restarts = x.at("restarts").get<int>();
      j.run_dir = x.at("run_dir").get<std::string>();
      j.resume_from = x.at("resume_from").get<std::string>();
      j.target_dp = x.at("target_dp").get<int>();
      j.target_devices = x.value("target_devices", 0);
      j.first_devices = x.value("first_devices", 0);
      for (const auto& f : x.at("failures")) j.failures.push_back(f);
      j.last_step = x.at("last_step").get<int64_t>();
      j.last_loss = x.at("last_loss").get<double>();
      j.control_messages = x.at("control_messages").get<int64_t>();
      j.submitted_ms = x.at("submitted_ms").get<double>();
      j.first_step_ms = x.at("first_step_ms").get<double>();
      j.finished_ms = x.at("finished_ms").get<double>();
      loaded.push_back(std::move(j));
    }
  } catch (const nlohmann::json::exception& e) {
    TROUPE_CHECK(false, "malformed job table: ", e.what());
  }
  for (auto& j : loaded) {
    TROUPE_CHECK(!jobs_.count(j.id), "job ", j.id, " appears twice in the job table");
    if (!is_terminal(j.state) && j.state != JobState::queued) {
      // The old generation's workers were killed by their agents when the
      // coordinator went away; a recovering job had not launched its next one yet.
      if (j.state != JobState::recovering) ++j.generation;
      j.state = JobState::recovering;
      j.reason = "coordinator restarted: relaunching as generation " + std::to_string(j.generation) +
                 " from the newest verified checkpoint";
      j.drain_step = -1;
      j.relaunch_at_ms = now;
      j.recovery_deadline_ms = now + j.request.replacement_wait_ms;
      out->events.push_back(
          {{"event", "state"}, {"job", j.id}, {"state", "recovering"}, {"reason", j.reason}});
    }
    order_.push_back(j.id);
    std::string id = j.id;
    jobs_[id] = std::move(j);
  }
}

std::string state_file(const std::string& state_dir) { return state_dir + "/jobs.json"; }

void save_table(const std::string& state_dir, const nlohmann::json& table) {
  std::error_code ec;
  std::filesystem::create_directories(state_dir, ec);
  TROUPE_CHECK(!ec, "cannot create the state directory ", state_dir, ": ", ec.message());
  const std::string path = state_file(state_dir), tmp = path + ".tmp";
  const std::string text = table.dump(1) + "\n";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TROUPE_CHECK(fd >= 0, "cannot write ", tmp, ": ", std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      ::close(fd);
      TROUPE_CHECK(false, "cannot write ", tmp, ": ", std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  bool synced = ::fsync(fd) == 0;
  int err = errno;
  ::close(fd);
  TROUPE_CHECK(synced, "cannot fsync ", tmp, ": ", std::strerror(err));
  TROUPE_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename ", tmp, ": ",
               std::strerror(errno));
  // The rename itself is durable only once the directory is synced.
  int dfd = ::open(state_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

// The job table lists every job the coordinator knows, each with its resolved spec.
constexpr uint64_t kMaxTableBytes = uint64_t(256) << 20;

nlohmann::json load_table_file(const std::string& state_dir) {
  const std::string path = state_file(state_dir);
  if (!std::filesystem::exists(path)) return nullptr;
  json_read::Limits limits;
  limits.max_bytes = kMaxTableBytes;
  try {
    return json_read::read_file(path, "job table", limits, Links::refuse);
  } catch (const Error& e) {
    throw Error(std::string("the job table ") + e.what());
  }
}

}  // namespace troupe::coord

#include "coordinator/dashboard_server.hpp"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "coordinator/api.hpp"
#include "coordinator/dashboard.hpp"
#include "coordinator/http_server.hpp"
#include "coordinator/job.hpp"
#include "coordinator/web_assets.hpp"
#include "core/error.hpp"
#include "core/hostile_file.hpp"
#include "core/run_dir.hpp"
#include "core/text.hpp"

namespace troupe::coord {

namespace {

constexpr uint64_t kMaxTraceBytes = 64ull << 20;

// Only what the page loads: its own scripts and styles, nothing from elsewhere.
constexpr const char* kPagePolicy =
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'";

HttpResponse json_response(int status, const nlohmann::json& body) {
  return HttpResponse::json(status, json_text(body));
}

HttpResponse error_response(int status, const std::string& name, const std::string& message) {
  return json_response(status, {{"error", name}, {"message", message}});
}

// The coordinator's answer, or the reason there is none (it did not answer, or refused).
nlohmann::json parse_answer(const std::string& text) {
  nlohmann::json j;
  try {
    j = json_read::parse(text, "the coordinator's answer", api_reply_limits());
  } catch (const Error&) {
  }
  if (!j.is_object())
    return {{"ok", false}, {"error", "internal"}, {"message", "the coordinator's answer is not JSON"}};
  return j;
}

// A failed "status": 404 for a job the coordinator does not know, 503 when it did not answer.
HttpResponse status_error(const nlohmann::json& answer) {
  const bool unknown = answer.value("error", "") == "unknown_job";
  return error_response(unknown ? 404 : 503, unknown ? "unknown_job" : "coordinator",
                        answer.value("message", ""));
}

// Adds the job's last step (loss, tokens_per_s, step_ms) and, while it runs, its ETA
// (the steps left at the mean step time of its generation's last points).
void add_latest(nlohmann::json& j, const JobHistory& history) {
  auto l = history.latest(j.value("id", ""));
  if (!l) return;
  j["loss"] = l->loss;
  j["tokens_per_s"] = l->tokens_per_s;
  j["step_ms"] = l->step_ms;
  const int64_t left = j.value("total_steps", int64_t{0}) - j.value("steps_done", int64_t{0});
  if (j.value("state", "") == "running" && left >= 0 && l->mean_step_ms > 0)
    j["eta_s"] = double(left) * l->mean_step_ms / 1000.0;
}

}  // namespace

DashboardServer::DashboardServer(DashboardOptions options, Ask ask)
    : opt_(std::move(options)), ask_(std::move(ask)), history_(std::make_unique<JobHistory>()) {
  HttpOptions h;
  h.listen = opt_.listen;
  h.token = opt_.token;
  // The page's own files hold no data: off loopback a browser cannot add the token to a
  // <script src>, so they are served to anyone (the JSON they read is not).
  for (const char* a : {"/", "/index.html", "/app.js", "/app.css", "/trace.js"}) h.public_paths.push_back(a);
  // (On loopback the server refuses a request whose Host is not a loopback name: a page of
  // another site that points its own name at 127.0.0.1 cannot read the dashboard.)
  http_ = std::make_unique<HttpServer>(h, [this](const HttpRequest& r) { return route(r); });
}

DashboardServer::~DashboardServer() { stop(); }

void DashboardServer::stop() {
  if (http_) http_->stop();
}

void DashboardServer::on_event(const std::string& event_json) noexcept { history_->on_event(event_json); }

const std::string& DashboardServer::address() const { return http_->address(); }

std::string DashboardServer::url() const { return "http://" + address() + "/"; }

bool DashboardServer::requires_token() const { return http_->requires_token(); }

HttpResponse DashboardServer::route(const HttpRequest& req) {
  const std::string& p = req.path;
  if (const WebAsset* a = find_web_asset(p)) {
    HttpResponse r;
    r.content_type = std::string(a->content_type);
    r.body = std::string(a->body);
    r.headers.push_back({"Content-Security-Policy", kPagePolicy});
    return r;
  }
  if (p == "/api/jobs") return jobs();
  if (p == "/metrics") return metrics();
  const std::string prefix = "/api/jobs/";
  if (p.compare(0, prefix.size(), prefix) == 0) {
    std::string id = p.substr(prefix.size());
    const std::string trace_suffix = "/trace";
    if (id.size() > trace_suffix.size() &&
        id.compare(id.size() - trace_suffix.size(), trace_suffix.size(), trace_suffix) == 0)
      return trace(id.substr(0, id.size() - trace_suffix.size()));
    if (!id.empty() && id.find('/') == std::string::npos) return job(id, req.query_param("after"));
  }
  return error_response(404, "not_found", "no page " + p + " (/, /api/jobs, /api/jobs/<id>, /metrics)");
}

HttpResponse DashboardServer::jobs() {
  nlohmann::json list = parse_answer(ask_(R"({"op":"list"})"));
  if (!list.value("ok", false)) return error_response(503, "coordinator", list.value("message", ""));
  int queued = 0;
  for (auto& j : list["jobs"]) {
    queued += j.value("state", "") == to_string(JobState::queued) ? 1 : 0;
    add_latest(j, *history_);
  }
  list.erase("ok");
  list["queue"] = queued;
  list["time"] = utc_timestamp();
  return json_response(200, list);
}

HttpResponse DashboardServer::job(const std::string& id, const std::string& after) {
  int64_t after_seq = 0;
  if (!after.empty()) {
    size_t used = 0;
    try {
      after_seq = std::stoll(after, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != after.size() || after_seq < 0)
      return error_response(400, "bad_request", "'after' is a point's seq: a whole number >= 0");
  }
  nlohmann::json st = parse_answer(ask_(json_text({{"op", "status"}, {"job", id}})));
  if (!st.value("ok", false)) return status_error(st);
  nlohmann::json out = history_->job_view(id, after_seq);
  add_latest(st["job"], *history_);
  std::error_code ec;
  const std::string run_dir = st["job"].value("run_dir", "");
  st["job"]["has_trace"] =
      !run_dir.empty() &&
      std::filesystem::is_regular_file(std::filesystem::symlink_status(run_dir + "/trace/merged.json", ec));
  out["job"] = std::move(st["job"]);
  return json_response(200, out);
}

HttpResponse DashboardServer::trace(const std::string& id) {
  nlohmann::json st = parse_answer(ask_(json_text({{"op", "status"}, {"job", id}})));
  if (!st.value("ok", false)) return status_error(st);
  const std::string run_dir = st["job"].value("run_dir", "");
  if (run_dir.empty()) return error_response(404, "no_trace", "job " + id + " has no run directory");
  try {
    // Not through a link: the file is served to whoever may read the dashboard.
    return HttpResponse::json(200, read_regular_file(run_dir + "/trace/merged.json", kMaxTraceBytes,
                                                     "merged trace", Links::refuse));
  } catch (const Error& e) {
    return error_response(
        404, "no_trace",
        std::string(e.what()) + " (a job traced with train.trace: run `troupe trace merge " + run_dir + "`)");
  }
}

HttpResponse DashboardServer::metrics() {
  // Of each worker only what prometheus_text reads: a fifth of the bytes of a full page, and
  // the actor spends no time on the workers' places in the plan.
  static const nlohmann::json kMetricsWorkerFields = {"rank", "host", "device", "pid", "heartbeat_age_s"};
  nlohmann::json list = parse_answer(ask_(R"({"op":"list"})"));
  if (!list.value("ok", false)) return HttpResponse::text(503, "the coordinator did not answer\n");
  std::vector<nlohmann::json> live;
  for (const auto& j : list["jobs"]) {
    const std::string state = j.value("state", "");
    if (state == to_string(JobState::succeeded) || state == to_string(JobState::failed) ||
        state == to_string(JobState::cancelled))
      continue;
    // Every worker of the job, a page per request: the actor answers other messages between
    // pages, however big the job.
    nlohmann::json job;
    for (size_t from = 0;;) {
      nlohmann::json st = parse_answer(ask_(json_text({{"op", "status"},
                                                       {"job", j.value("id", "")},
                                                       {"workers_from", from},
                                                       {"workers_limit", ListPage::kMax},
                                                       {"worker_fields", kMetricsWorkerFields}})));
      if (!st.value("ok", false) || !st["job"].is_object()) break;
      nlohmann::json& page = st["job"];
      size_t next = 0;
      if (auto n = page.find("workers_next");
          n != page.end() && n->is_number_integer() && n->get<int64_t>() > 0)
        next = static_cast<size_t>(n->get<int64_t>());
      if (job.is_null()) {
        job = std::move(page);
      } else if (page["workers"].is_array() && job["workers"].is_array()) {
        for (auto& w : page["workers"]) job["workers"].push_back(std::move(w));
      }
      if (next <= from) break;
      from = next;
    }
    if (job.is_object()) live.push_back(std::move(job));
  }
  HttpResponse r = HttpResponse::text(200, prometheus_text(list, live, *history_));
  r.content_type = "text/plain; version=0.0.4; charset=utf-8";
  return r;
}

}  // namespace troupe::coord

// The coordinator's --http port end to end: the JSON endpoints and /metrics
// of a real job on worker processes, through a worker's SIGKILL and the
// job's recovery; the token rule off loopback. (The page itself is tested in
// a browser: tests/browser.)
#include <signal.h>

#include <catch2/catch.hpp>
#include <cmath>

#include "tests/fault/fault.hpp"
#include "tests/support/http_get.hpp"
#include "tests/support/prometheus.hpp"

using namespace troupe::test;
using nlohmann::json;
using troupe::testing::kEndlessSteps;
using namespace std::chrono_literals;

namespace {

json get_json(const std::string& address, const std::string& target) {
  auto r = http_get(address, target);
  if (r.status != 200) return json();
  return json::parse(r.body, nullptr, false);
}

PromText scrape(const std::string& address) {
  auto r = http_get(address, "/metrics");
  REQUIRE(r.status == 200);
  CHECK(r.header("Content-Type").find("text/plain; version=0.0.4") == 0);
  return parse_prometheus(r.body);
}

}  // namespace

TEST_CASE("the dashboard's endpoints and /metrics follow a job through a worker's SIGKILL and its recovery",
          "[dashboard][multiprocess]") {
  Cluster c({"--http", "127.0.0.1:0"});
  REQUIRE(c.ready());
  const std::string http = c.ready_json().value("http", "");
  REQUIRE_FALSE(http.empty());
  c.add_agent("cpu:2");
  REQUIRE(c.wait_devices(2));
  std::string job =
      c.call({{"op", "submit"},
              {"spec", fault_spec("dash", 2, kEndlessSteps, 5, "fault:\n  max_restarts: 3\n")}})["job"];
  PidLog pids;
  REQUIRE(wait_steps(c, job, 6, pids, 0));

  // The jobs table: the row with its progress.
  json jobs = get_json(http, "/api/jobs");
  REQUIRE(jobs.is_object());
  CHECK(jobs["devices"]["cpu"]["total"] == 2);
  CHECK(jobs["agents"].size() == 1);
  CHECK(jobs["queue"] == 0);
  REQUIRE(jobs["jobs"].size() == 1);
  const json row = jobs["jobs"][0];
  CHECK(row["id"] == job);
  CHECK(row["state"] == "running");
  CHECK(row["layout"] == "2x1x1");
  CHECK(row["restarts"] == 0);
  CHECK(row["tokens_per_s"].get<double>() > 0);
  CHECK(row["eta_s"].get<double>() > 0);
  CHECK(std::isfinite(row["loss"].get<double>()));

  // One job: its points in order, and only the newer ones after a seq.
  json one = get_json(http, "/api/jobs/" + job);
  REQUIRE(one.is_object());
  CHECK(one["job"]["id"] == job);
  CHECK(one["job"]["workers"].size() == 2);
  CHECK(one["job"]["has_trace"] == false);
  auto& pts = one["metrics"];
  REQUIRE(pts.size() >= 6);
  for (size_t i = 1; i < pts.size(); ++i) {
    CHECK(pts[i]["seq"].get<int64_t>() > pts[i - 1]["seq"].get<int64_t>());
    CHECK(pts[i]["step"].get<int64_t>() == pts[i - 1]["step"].get<int64_t>() + 1);
  }
  const int64_t last_seq = pts.back()["seq"];
  json newer;
  REQUIRE(wait_until(
      [&] {
        newer = get_json(http, "/api/jobs/" + job + "?after=" + std::to_string(last_seq));
        return newer.is_object() && !newer["metrics"].empty();
      },
      60s));
  for (const auto& p : newer["metrics"]) CHECK(p["seq"].get<int64_t>() > last_seq);
  CHECK(newer["last_seq"] == newer["metrics"].back()["seq"]);
  CHECK(newer["metrics"][0]["step"].get<int64_t>() > pts.back()["step"].get<int64_t>());
  bool saw_running = false;
  for (const auto& e : one["events"]) saw_running = saw_running || e.value("state", "") == "running";
  CHECK(saw_running);
  CHECK(http_get(http, "/api/jobs/no-such-job").status == 404);
  CHECK(http_get(http, "/api/jobs/" + job + "?after=x").status == 400);
  CHECK(http_get(http, "/api/jobs/" + job + "/trace").status == 404);  // not traced
  // A page of another site that points its name at 127.0.0.1 says so in its Host.
  const int port = std::stoi(http.substr(http.rfind(':') + 1));
  CHECK(http_raw(port, "GET /api/jobs HTTP/1.1\r\nHost: rebound.example:" + std::to_string(port) + "\r\n\r\n")
            .status == 421);

  // /metrics: the job, the devices, and both workers' heartbeats (once each has answered).
  REQUIRE(wait_until(
      [&] {
        return scrape(http).find("troupe_worker_heartbeat_age_seconds", {{"job", job}}).size() == 2;
      },
      60s));
  PromText m = scrape(http);
  CHECK(m.value("troupe_jobs", {{"state", "running"}}) == 1);
  CHECK(m.value("troupe_agents") == 1);
  CHECK(m.value("troupe_devices_total", {{"kind", "cpu"}}) == 2);
  CHECK(m.value("troupe_devices_free", {{"kind", "cpu"}}) == 0);
  CHECK(m.value("troupe_job_generation", {{"job", job}}) == 0);
  CHECK(m.value("troupe_job_restarts_total", {{"job", job}}) == 0);
  CHECK(m.value("troupe_job_tokens_per_second", {{"job", job}}) > 0);
  CHECK(m.value("troupe_job_step_seconds", {{"job", job}}) > 0);
  CHECK(std::isfinite(m.value("troupe_job_loss", {{"job", job}})));
  const json st = c.status(job);
  for (const auto& w : st["workers"])
    CHECK(m.find("troupe_worker_info", {{"job", job},
                                        {"rank", std::to_string(w["rank"].get<int>())},
                                        {"pid", std::to_string(w["pid"].get<int>())},
                                        {"host", w["host"].get<std::string>()}})
              .size() == 1);

  // A worker killed: the failure in the timeline, the relaunch as generation 1, and the
  // new generation's points reach a page that asks after the last seq it had.
  const int victim = worker_pids(st)[1];
  json before = get_json(http, "/api/jobs/" + job);
  const int64_t seq_before = before["metrics"].back()["seq"];
  REQUIRE(::kill(victim, SIGKILL) == 0);
  REQUIRE(wait_running(c, job, 1, pids, [](const json& s) { return s["steps_done"].get<int64_t>() > 0; }));
  json after;
  REQUIRE(wait_until(
      [&] {
        after = get_json(http, "/api/jobs/" + job + "?after=" + std::to_string(seq_before));
        if (!after.is_object()) return false;
        for (const auto& p : after["metrics"])
          if (p["generation"] == 1) return true;
        return false;
      },
      120s));
  bool failure = false, relaunch = false;
  for (const auto& e : after["events"]) {
    if (e["event"] == "failure") {
      failure = true;
      CHECK(e["cause"] == "worker_killed");
      CHECK(e["pid"] == victim);
      CHECK(e["rank"] == 1);
    }
    relaunch = relaunch || (e["event"] == "relaunch" && e["generation"] == 1);
  }
  CHECK(failure);
  CHECK(relaunch);
  CHECK_FALSE(after["checkpoints"].empty());
  PromText m2 = scrape(http);
  CHECK(m2.value("troupe_job_generation", {{"job", job}}) == 1);
  CHECK(m2.value("troupe_job_restarts_total", {{"job", job}}) == 1);
  cancel(c, job, pids);
  CHECK(scrape(http).value("troupe_jobs", {{"state", "cancelled"}}) == 1);
}

TEST_CASE("off loopback every dashboard request needs the API token", "[dashboard][multiprocess]") {
  Cluster c({"--http", "0.0.0.0:0"});
  REQUIRE(c.ready());
  const std::string http = c.ready_json().value("http", "");
  REQUIRE_FALSE(http.empty());
  CHECK(http_get(http, "/api/jobs").status == 401);
  CHECK(http_get(http, "/metrics").status == 401);
  CHECK(http_get(http, "/api/jobs", {"Authorization: Bearer wrong"}).status == 401);
  CHECK(http_get(http, "/api/jobs", {"Authorization: Bearer " + c.token()}).status == 200);
  CHECK(http_get(http, "/metrics?token=" + c.token()).status == 200);
}

TEST_CASE("a dashboard address that cannot be served stops the coordinator at start with its reason",
          "[dashboard][multiprocess]") {
  char tmpl[] = "/tmp/troupe-dash-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  troupe::actors::write_secret(dir + "/secret.pem");
  Proc p({troupe_binary(), "coordinator", "--listen", "127.0.0.1:0", "--api", "tcp://127.0.0.1:0", "--http",
          "nowhere:abc", "--runs-dir", dir + "/runs", "--secret-file", dir + "/secret.pem"},
         dir + "/coordinator.log");
  CHECK(p.wait(60s) == 2);
  CHECK(p.output().find("nowhere:abc") != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("troupe run --http serves the run's dashboard while it trains", "[dashboard][multiprocess]") {
  char tmpl[] = "/tmp/troupe-dash-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string spec = dir + "/job.yaml";
  std::ofstream(spec) << fault_spec("run-http", 1, kEndlessSteps, 1000, "");
  Proc run({troupe_binary(), "run", spec, "--runs-dir", dir + "/runs", "--http", "127.0.0.1:0"},
           dir + "/run.log");
  std::string http;
  REQUIRE(wait_until(
      [&] {
        const std::string out = run.output();
        const std::string mark = "dashboard http://";
        const size_t at = out.find(mark);
        if (at == std::string::npos) return false;
        const size_t end = out.find('/', at + mark.size());
        if (end == std::string::npos) return false;
        http = out.substr(at + mark.size(), end - at - mark.size());
        return true;
      },
      60s));
  INFO(run.output());
  // Its one job, once it has stepped: the table row and the Prometheus figures.
  json row;
  REQUIRE(wait_until(
      [&] {
        json jobs = get_json(http, "/api/jobs");
        if (!jobs.is_object() || jobs["jobs"].size() != 1) return false;
        row = jobs["jobs"][0];
        return row.contains("loss");
      },
      120s));
  CHECK(row["name"] == "run-http");
  CHECK(row["state"] == "running");
  PromText m = scrape(http);
  CHECK(m.value("troupe_jobs", {{"state", "running"}}) == 1);
  CHECK(m.value("troupe_job_tokens_per_second", {{"job", row["id"].get<std::string>()}}) > 0);
  run.signal(SIGINT);
  CHECK(run.wait(60s) == 130);
  std::filesystem::remove_all(dir);
}

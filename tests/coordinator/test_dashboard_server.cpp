// The dashboard's routes over a real HTTP server, with the coordinator's answers given by the
// test (the whole path with a real coordinator: tests/fault/test_dashboard_http.cpp).
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <vector>

#include "actors/version.hpp"
#include "coordinator/api.hpp"
#include "coordinator/dashboard_server.hpp"
#include "core/json_read.hpp"
#include "tests/support/http_get.hpp"
#include "tests/support/prometheus.hpp"
#include "tests/support/sized_job.hpp"

using namespace troupe::coord;
using nlohmann::json;
using troupe::test::http_get;
using troupe::test::http_raw;

namespace {

// A coordinator that knows one running job, "j-1", whose run directory is `run_dir`.
struct FakeCoordinator {
  std::string run_dir;
  bool answering = true;
  std::string operator()(const std::string& request) const {
    if (!answering) return json{{"ok", false}, {"error", "internal"}, {"message", "timed out"}}.dump();
    const json r = json::parse(request);
    const json job = {
        {"id", "j-1"},        {"name", "tiny"},          {"state", "running"}, {"layout", "1x1x1"},
        {"generation", 0},    {"restarts", 0},           {"steps_done", 3},    {"total_steps", 103},
        {"run_dir", run_dir}, {"workers", json::array()}};
    if (r["op"] == "list")
      return json{{"ok", true}, {"jobs", {job}}, {"agents", json::array()}, {"devices", json::object()}}
          .dump();
    if (r["op"] == "status" && r["job"] == "j-1") return json{{"ok", true}, {"job", job}}.dump();
    return json{{"ok", false}, {"error", "unknown_job"}, {"message", "no job"}}.dump();
  }
};

std::string step_event(int64_t step, double step_ms) {
  return json{
      {"event", "step"},
      {"job", "j-1"},
      {"metrics",
       {{"step", step}, {"loss", 2.0}, {"tokens_per_s", 100.0}, {"step_ms", step_ms}, {"generation", 0}}}}
      .dump();
}

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/troupe-dash-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

}  // namespace

TEST_CASE("the dashboard serves its page, the jobs with their ETA, and one job after a seq", "[dashboard]") {
  TempDir dir;
  FakeCoordinator fake{dir.path};
  DashboardServer d({"127.0.0.1:0", "token"}, [&](const std::string& r) { return fake(r); });
  CHECK_FALSE(d.requires_token());
  auto page = http_get(d.address(), "/");
  CHECK(page.status == 200);
  CHECK(page.header("Content-Type").find("text/html") == 0);
  CHECK(page.header("Content-Security-Policy").find("default-src 'self'") == 0);
  CHECK(http_get(d.address(), "/app.js").status == 200);
  CHECK(http_get(d.address(), "/nothing-here").status == 404);

  // The first step of a generation is left out of the ETA's mean: 100 steps left at 10 ms.
  d.on_event(step_event(0, 500));
  d.on_event(step_event(1, 10));
  d.on_event(step_event(2, 10));
  json jobs = json::parse(http_get(d.address(), "/api/jobs").body);
  REQUIRE(jobs["jobs"].size() == 1);
  CHECK(jobs["jobs"][0]["eta_s"] == Approx(1.0));
  CHECK(jobs["jobs"][0]["tokens_per_s"] == 100.0);
  CHECK(jobs["queue"] == 0);

  json one = json::parse(http_get(d.address(), "/api/jobs/j-1").body);
  REQUIRE(one["metrics"].size() == 3);
  const int64_t second = one["metrics"][1]["seq"];
  json newer = json::parse(http_get(d.address(), "/api/jobs/j-1?after=" + std::to_string(second)).body);
  REQUIRE(newer["metrics"].size() == 1);
  CHECK(newer["metrics"][0]["step"] == 2);
  CHECK(newer["last_seq"] == newer["metrics"][0]["seq"]);
  CHECK(http_get(d.address(), "/api/jobs/j-1?after=-1").status == 400);
  CHECK(http_get(d.address(), "/api/jobs/j-1?after=7x").status == 400);
  CHECK(http_get(d.address(), "/api/jobs/j-9").status == 404);
  fake.answering = false;
  CHECK(http_get(d.address(), "/api/jobs/j-1").status == 503);
  CHECK(http_get(d.address(), "/api/jobs").status == 503);
  CHECK(http_get(d.address(), "/metrics").status == 503);
}

TEST_CASE("a job's merged trace is served once there is one, never through a link", "[dashboard]") {
  TempDir dir;
  FakeCoordinator fake{dir.path};
  DashboardServer d({"127.0.0.1:0", "token"}, [&](const std::string& r) { return fake(r); });
  CHECK(json::parse(http_get(d.address(), "/api/jobs/j-1").body)["job"]["has_trace"] == false);
  CHECK(http_get(d.address(), "/api/jobs/j-1/trace").status == 404);

  std::filesystem::create_directories(dir.path + "/trace");
  std::ofstream(dir.path + "/secret.txt") << "not for the dashboard";
  std::filesystem::create_symlink(dir.path + "/secret.txt", dir.path + "/trace/merged.json");
  CHECK(json::parse(http_get(d.address(), "/api/jobs/j-1").body)["job"]["has_trace"] == false);
  auto linked = http_get(d.address(), "/api/jobs/j-1/trace");
  CHECK(linked.status == 404);
  CHECK(linked.body.find("not for the dashboard") == std::string::npos);

  std::filesystem::remove(dir.path + "/trace/merged.json");
  std::ofstream(dir.path + "/trace/merged.json") << R"({"traceEvents":[]})";
  CHECK(json::parse(http_get(d.address(), "/api/jobs/j-1").body)["job"]["has_trace"] == true);
  auto t = http_get(d.address(), "/api/jobs/j-1/trace");
  CHECK(t.status == 200);
  CHECK(t.body == R"({"traceEvents":[]})");
}

TEST_CASE("off loopback the page's files need no token and its data does", "[dashboard]") {
  TempDir dir;
  FakeCoordinator fake{dir.path};
  DashboardServer d({"0.0.0.0:0", "s3cret"}, [&](const std::string& r) { return fake(r); });
  CHECK(d.requires_token());
  for (const char* p : {"/", "/app.js", "/app.css", "/trace.js"}) {
    INFO(p);
    CHECK(http_get(d.address(), p).status == 200);
  }
  CHECK(http_get(d.address(), "/api/jobs").status == 401);
  CHECK(http_get(d.address(), "/api/jobs/j-1").status == 401);
  CHECK(http_get(d.address(), "/metrics").status == 401);
  CHECK(http_get(d.address(), "/api/jobs", {"Authorization: Bearer s3cret"}).status == 200);
}

TEST_CASE("on loopback a request that names another host is refused", "[dashboard]") {
  TempDir dir;
  FakeCoordinator fake{dir.path};
  DashboardServer d({"127.0.0.1:0", "token"}, [&](const std::string& r) { return fake(r); });
  const int port = std::stoi(d.address().substr(d.address().rfind(':') + 1));
  CHECK(http_raw(port, "GET /api/jobs HTTP/1.1\r\nHost: rebound.example\r\n\r\n").status == 421);
  CHECK(http_raw(port, "GET /api/jobs HTTP/1.1\r\nHost: localhost:" + std::to_string(port) + "\r\n\r\n")
            .status == 200);
}

TEST_CASE("200 slow connections sending their headers a byte a second do not stop a GET of /metrics",
          "[dashboard][http]") {
  TempDir dir;
  FakeCoordinator fake{dir.path};
  DashboardServer d({"127.0.0.1:0", "token"}, [&](const std::string& r) { return fake(r); });
  // The slow client: 200 connections from eight addresses (25 each, more than an address's
  // share and, together, than every slot), each sending its request a byte a second and never
  // finishing it; one the server closes is left closed.
  const std::string head = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + std::string(64, 's');
  std::vector<std::unique_ptr<troupe::test::HttpConn>> slow;
  for (int i = 0; i < 200; ++i)
    slow.push_back(
        std::make_unique<troupe::test::HttpConn>(d.address(), 0, "127.0.0." + std::to_string(2 + i % 8)));
  std::atomic<bool> stop{false};
  std::atomic<int> sent{0};
  std::thread sender([&] {
    for (size_t at = 0; !stop.load() && at < head.size(); ++at) {
      for (auto& c : slow)
        if (c->ok()) c->send(head.substr(at, 1));
      ++sent;
      for (int t = 0; t < 10 && !stop.load(); ++t)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  while (sent.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  // Another client, from its own address, asks as a scraper would: every time a 200.
  for (int i = 0; i < 5; ++i) {
    const auto r = http_get(d.address(), "/metrics");
    CHECK(r.status == 200);
    CHECK(r.body.find("troupe_jobs{state=\"running\"} 1") != std::string::npos);
  }
  // Meanwhile the slow client held slots: most of the 64 (the others were answered 503).
  int held = 0;
  for (auto& c : slow) {
    pollfd p{c->fd(), POLLIN, 0};
    held += c->ok() && ::poll(&p, 1, 0) == 0;
  }
  CHECK(held >= 32);
  stop.store(true);
  sender.join();
}

TEST_CASE("/metrics has every worker of a job bigger than a status page, asked a page at a time",
          "[dashboard]") {
  // The coordinator's state itself answers, as its actor does (the request read under the
  // API's limits): 5,008 ranks, two pages of 4,096 at most.
  TempDir dir;
  CoordinatorState st(dir.path, troupe::actors::kProtocolVersion);
  const std::string id = troupe::test::sized_job(st, 5008);
  std::vector<json> asked;
  DashboardServer d({"127.0.0.1:0", ""}, [&](const std::string& text) {
    json req = troupe::json_read::parse(text, "the request", api_request_limits());
    asked.push_back(req);
    Actions a;
    return handle_api_request(st, req, &a).dump();
  });
  const auto r = http_get(d.address(), "/metrics");
  REQUIRE(r.status == 200);
  const auto prom = troupe::test::parse_prometheus(r.body);
  const auto info = prom.find("troupe_worker_info", {{"job", id}});
  REQUIRE(info.size() == 5008);
  std::set<std::string> ranks;
  for (const auto& s : info) ranks.insert(s.labels.at("rank"));
  CHECK(ranks.size() == 5008);
  CHECK(ranks.count("0") == 1);
  CHECK(ranks.count("5007") == 1);
  CHECK(prom.find("troupe_worker_heartbeat_age_seconds", {{"job", id}}).size() == 5008);
  CHECK(prom.value("troupe_job_heartbeat_age_max_seconds", {{"job", id}}) >= 0);
  // list, then the job's two pages.
  REQUIRE(asked.size() == 3);
  CHECK(asked[1]["workers_from"] == 0);
  CHECK(asked[2]["workers_from"] == 4096);
}

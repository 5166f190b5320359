// The dashboard's history (kept from the coordinator's events) and its
// Prometheus text, without sockets or actors.
#include <catch2/catch.hpp>

#include "coordinator/dashboard.hpp"
#include "tests/support/prometheus.hpp"

using namespace troupe::coord;
using troupe::test::parse_prometheus;

namespace {

std::string step_event(const std::string& job, int64_t step, double loss, int generation = 1) {
  return nlohmann::json{{"event", "step"},
                        {"job", job},
                        {"metrics",
                         {{"step", step},
                          {"loss", loss},
                          {"lr", 1e-3},
                          {"tokens_per_s", 1000.0 + step},
                          {"step_ms", 10.0 + step},
                          {"generation", generation},
                          {"layout", "2x1x1"}}}}
      .dump();
}

}  // namespace

TEST_CASE("the history keeps a job's points in order, each with a rising seq", "[dashboard]") {
  JobHistory h;
  for (int s = 0; s < 5; ++s) h.on_event(step_event("j-1", s, 3.0 - 0.1 * s));
  auto v = h.job_view("j-1", 0);
  REQUIRE(v["metrics"].size() == 5);
  const int64_t first = v["metrics"][0]["seq"];
  CHECK(v["last_seq"] == first + 4);
  for (int i = 0; i < 5; ++i) {
    CHECK(v["metrics"][i]["seq"] == first + i);
    CHECK(v["metrics"][i]["step"] == i);
    CHECK(v["metrics"][i]["generation"] == 1);
    CHECK_FALSE(v["metrics"][i].contains("layout"));
  }
  // after = the last seq a page has: only the newer points.
  auto newer = h.job_view("j-1", first + 2);
  REQUIRE(newer["metrics"].size() == 2);
  CHECK(newer["metrics"][0]["step"] == 3);
  auto l = h.latest("j-1");
  REQUIRE(l);
  CHECK(l->step == 4);
  CHECK(l->loss == Approx(2.6));
  CHECK(l->tokens_per_s == Approx(1004));
  CHECK(l->mean_step_ms == Approx((11 + 12 + 13 + 14) / 4.0));  // not the generation's first step
  CHECK_FALSE(h.latest("j-2"));
  CHECK(h.job_view("j-2", 0)["metrics"].empty());
}

TEST_CASE("a recovered job's lower step numbers still reach a page that asks after its last seq",
          "[dashboard]") {
  JobHistory h;
  for (int s = 0; s < 8; ++s) h.on_event(step_event("j", s, 3.0));
  // Generation 2 resumes from the checkpoint of step 5.
  for (int s = 6; s < 9; ++s) h.on_event(step_event("j", s, 2.5, 2));
  const int64_t seen = h.job_view("j", 0)["metrics"][7]["seq"];
  auto v = h.job_view("j", seen);
  REQUIRE(v["metrics"].size() == 3);
  CHECK(v["metrics"][0]["step"] == 6);
  CHECK(v["metrics"][0]["generation"] == 2);
  // The ETA's mean is the new generation's alone, without its first step.
  CHECK(h.latest("j")->mean_step_ms == Approx((17 + 18) / 2.0));
}

TEST_CASE("the history thins old points and drops old events and jobs at its limits", "[dashboard]") {
  HistoryLimits lim;
  lim.points = 100;
  lim.events = 10;
  lim.jobs = 3;
  JobHistory h(lim);
  for (int s = 0; s < 1000; ++s) h.on_event(step_event("j", s, 1.0));
  auto pts = h.job_view("j", 0)["metrics"];
  CHECK(pts.size() <= 100);
  CHECK(pts.size() >= 50);
  CHECK(pts.front()["step"] == 0);  // the curve keeps its whole span
  CHECK(pts.back()["step"] == 999);
  for (size_t i = 1; i < pts.size(); ++i) CHECK(pts[i]["seq"] > pts[i - 1]["seq"]);

  for (int i = 0; i < 30; ++i)
    h.on_event(
        nlohmann::json{{"event", "log"}, {"job", "j"}, {"message", "line " + std::to_string(i)}}.dump());
  auto ev = h.job_view("j", 0)["events"];
  REQUIRE(ev.size() == 10);
  CHECK(ev.back()["message"] == "line 29");

  for (const char* id : {"a", "b", "c"}) h.on_event(step_event(id, 0, 1.0));
  CHECK(h.job_view("j", 0)["metrics"].empty());  // the oldest job was forgotten
  CHECK(h.job_view("c", 0)["metrics"].size() == 1);
}

TEST_CASE("seqs never go back: across jobs, a forgotten job seen again, and a later history", "[dashboard]") {
  HistoryLimits lim;
  lim.jobs = 2;
  JobHistory h(lim);
  h.on_event(step_event("a", 0, 1.0));
  h.on_event(step_event("b", 0, 1.0));
  const int64_t a0 = h.job_view("a", 0)["last_seq"], b0 = h.job_view("b", 0)["last_seq"];
  CHECK(b0 > a0);
  h.on_event(step_event("a", 1, 1.0));  // a changed last: c makes the history forget b
  h.on_event(step_event("c", 0, 1.0));
  CHECK(h.job_view("a", 0)["metrics"].size() == 2);
  CHECK(h.job_view("b", 0)["metrics"].empty());
  h.on_event(step_event("b", 5, 1.0));
  CHECK(h.job_view("b", 0)["last_seq"].get<int64_t>() > b0);
  // A coordinator restarted: its history numbers above what a page still holds.
  JobHistory later;
  later.on_event(step_event("a", 0, 1.0));
  CHECK(later.job_view("a", 0)["last_seq"].get<int64_t>() > h.job_view("b", 0)["last_seq"].get<int64_t>());
}

TEST_CASE("the timeline has the job's failures, relaunches and checkpoints in words", "[dashboard]") {
  JobHistory h;
  h.on_event(R"({"event":"state","job":"j","state":"running","reason":"","time":"t1"})");
  h.on_event(R"({"event":"waiting","job":"j","state":"queued","reason":"no devices"})");
  h.on_event(R"({"event":"waiting","job":"j","state":"queued","reason":"no devices"})");
  h.on_event(
      R"({"event":"checkpoint","job":"j","generation":1,"step":4,"dir":"/r/ckpt/step_4","time":"t2"})");
  h.on_event(R"({"event":"failure","job":"j","generation":1,"cause":"worker_killed","rank":1,"host":"h",)"
             R"("pid":42,"message":"rank 1 (pid 42) was killed by SIGKILL","where":"step 6: B1"})");
  h.on_event(R"({"event":"relaunch","job":"j","generation":2,"from_layout":"2x1x1","layout":"2x1x1",)"
             R"("resume_from":"/r/ckpt/step_4"})");
  h.on_event(R"({"event":"agent","agent":"a","state":"lost"})");  // not about a job
  auto v = h.job_view("j", 0);
  auto ev = v["events"];
  REQUIRE(ev.size() == 5);  // the repeated wait once
  CHECK(ev[0]["message"] == "state running");
  CHECK(ev[0]["time"] == "t1");
  CHECK(ev[1]["message"] == "waiting: no devices");
  CHECK(ev[2]["event"] == "checkpoint");
  CHECK(ev[3]["event"] == "failure");
  CHECK(ev[3]["cause"] == "worker_killed");
  CHECK(ev[3]["pid"] == 42);
  CHECK(ev[3]["message"] ==
        "failure worker_killed in generation 1: rank 1 (pid 42) was killed by SIGKILL [rank was in: step 6: "
        "B1]");
  CHECK(ev[4]["message"] == "relaunch generation 2 as 2x1x1 (was 2x1x1) from /r/ckpt/step_4");
  REQUIRE(v["checkpoints"].size() == 1);
  CHECK(v["checkpoints"][0] ==
        nlohmann::json{{"time", "t2"}, {"step", 4}, {"dir", "/r/ckpt/step_4"}, {"generation", 1}});
}

TEST_CASE("events that are not JSON objects or have mistyped fields are ignored", "[dashboard]") {
  JobHistory h;
  for (const char* bad : {"", "not json", "[1,2]", R"({"event":"step","job":7})", R"({"event":3,"job":"j"})",
                          R"({"event":"step","job":"j","metrics":"x"})",
                          R"({"event":"step","job":"j","metrics":{"step":"seven","loss":{}}})",
                          R"({"event":"failure","job":"j","generation":"one","message":5})"})
    h.on_event(bad);
  auto v = h.job_view("j", 0);
  CHECK(v["metrics"].empty());
  CHECK(v["events"].empty());
  CHECK(v["last_seq"] == 0);
  CHECK_FALSE(h.latest("j"));
}

TEST_CASE("the Prometheus text parses and carries the jobs, agents, devices and workers", "[dashboard]") {
  JobHistory h;
  h.on_event(step_event("j-1", 7, 2.5));
  nlohmann::json list = {
      {"jobs",
       {{{"id", "j-1"},
         {"name", "tiny \"quoted\"\\ \nname"},
         {"state", "running"},
         {"layout", "2x1x1"},
         {"generation", 2},
         {"restarts", 1},
         {"steps_done", 8},
         {"total_steps", 100}},
        {{"id", "j-0"},
         {"name", "old"},
         {"state", "succeeded"},
         {"layout", "1x1x1"},
         {"generation", 1},
         {"restarts", 0},
         {"steps_done", 10},
         {"total_steps", 10}},
        {{"id", "j-2"},
         {"name", "waits"},
         {"state", "queued"},
         {"layout", "4x1x1"},
         {"generation", 0},
         {"restarts", 0},
         {"steps_done", 0},
         {"total_steps", 10}}}},
      {"agents", {{{"id", "a1"}, {"host", "h"}, {"pid", 1}, {"devices", nlohmann::json::array()}}}},
      {"devices", {{"cpu", {{"total", 4}, {"free", 2}}}, {"cuda", {{"total", 0}, {"free", 0}}}}}};
  std::vector<nlohmann::json> status = {
      {{"id", "j-1"},
       {"workers",
        {{{"rank", 0},
          {"host", "h"},
          {"device", "cpu:0"},
          {"pid", 11},
          {"where", "step 7: F1"},
          {"heartbeat_age_s", 0.25}},
         {{"rank", 1}, {"host", "h"}, {"device", "cpu:1"}, {"pid", 12}, {"where", ""}}}}}};
  const std::string text = prometheus_text(list, status, h);
  auto p = parse_prometheus(text);
  CHECK(p.value("troupe_jobs", {{"state", "running"}}) == 1);
  CHECK(p.value("troupe_jobs", {{"state", "succeeded"}}) == 1);
  CHECK(p.value("troupe_jobs", {{"state", "failed"}}) == 0);
  CHECK(p.value("troupe_queue_length") == 1);
  CHECK(p.value("troupe_agents") == 1);
  CHECK(p.value("troupe_devices_total", {{"kind", "cpu"}}) == 4);
  CHECK(p.value("troupe_devices_free", {{"kind", "cpu"}}) == 2);
  CHECK(p.types.at("troupe_job_restarts_total") == "counter");
  CHECK(p.value("troupe_job_restarts_total", {{"job", "j-1"}}) == 1);
  CHECK(p.value("troupe_job_generation", {{"job", "j-1"}}) == 2);
  CHECK(p.value("troupe_job_info", {{"job", "j-1"}, {"state", "running"}, {"layout", "2x1x1"}}) == 1);
  // The name's quote, backslash and newline survive the escaping.
  CHECK(p.find("troupe_job_info", {{"job", "j-1"}})[0].labels.at("name") == "tiny \"quoted\"\\ \nname");
  CHECK(p.value("troupe_job_loss", {{"job", "j-1"}}) == 2.5);
  CHECK(p.value("troupe_job_tokens_per_second", {{"job", "j-1"}}) == 1007);
  CHECK(p.value("troupe_job_step_seconds", {{"job", "j-1"}}) == Approx(0.017));
  CHECK(p.find("troupe_job_loss", {{"job", "j-0"}}).empty());  // no step seen
  CHECK(p.value("troupe_worker_heartbeat_age_seconds", {{"job", "j-1"}, {"rank", "0"}}) == 0.25);
  CHECK(p.find("troupe_worker_heartbeat_age_seconds", {{"rank", "1"}}).empty());
  CHECK(p.value("troupe_worker_info", {{"job", "j-1"}, {"rank", "0"}, {"pid", "11"}, {"device", "cpu:0"}}) ==
        1);
  // What a worker does changes every step: not a label (a new series each time).
  CHECK(p.find("troupe_worker_info")[0].labels.count("where") == 0);
  CHECK(p.value("troupe_job_steps_planned", {{"job", "j-1"}}) == 100);
}

TEST_CASE("the Prometheus reader refuses what a scraper would", "[dashboard]") {
  CHECK_THROWS(parse_prometheus("x 1\n"));  // no TYPE
  CHECK_THROWS(parse_prometheus("# TYPE x gauge\nx{a=\"1} 2\n"));
  CHECK_THROWS(parse_prometheus("# TYPE x gauge\nx{a=\"\\q\"} 2\n"));
  CHECK_THROWS(parse_prometheus("# TYPE x gauge\nx one\n"));
  CHECK_THROWS(parse_prometheus("# TYPE x gauge\n# TYPE y gauge\ny 1\nx 2\n"));
  CHECK_THROWS(parse_prometheus("# TYPE 1x gauge\n"));
  CHECK_THROWS(parse_prometheus("# TYPE x gauge\nx{a=\"1\"} 1\nx{a=\"1\"} 2\n"));  // one series twice
  CHECK(
      parse_prometheus("# HELP x a\n# TYPE x gauge\nx{a=\"q\\\"\\n\"} 2.5\n").value("x", {{"a", "q\"\n"}}) ==
      2.5);
}

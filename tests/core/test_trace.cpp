// Timeline traces (core/trace.hpp): the recorder's window and threads, the rank file's round
// trip, hostile files refused by name, and merge's clock offsets and shares against figures
// worked out by hand.
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "core/error.hpp"
#include "core/trace.hpp"
#include "tests/support/support.hpp"
#include "tests/support/trace_span.hpp"

namespace fs = std::filesystem;
using namespace troupe::trace;
using Args = std::vector<std::pair<std::string, std::string>>;

namespace {

using troupe::testing::span;

std::string write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// The message read_rank_trace refuses `text` with ("" if it does not).
std::string refusal(const std::string& path, const std::string& text, ReadLimits limits = {}) {
  write_text(path, text);
  try {
    read_rank_trace(path, limits);
  } catch (const troupe::Error& e) {
    return e.what();
  }
  return "";
}

const char* kInfo = R"("troupe": {"rank": 0, "world": 1, "layout": "1x1x1", "place": "rank 0",
  "clock_offset_us": 0, "from_step": 0, "steps": 1})";

std::string file_with_event(const std::string& event) {
  return std::string(R"({"traceEvents": [)") + event + "], " + kInfo + "}";
}

// Two ranks of a pipeline, two steps each, on clocks 500 us apart. Shares by hand:
//
// rank 0, step 0 = [0, 1000):  data [0,100)  F0 [100,300)  p2p [300,400)  B0 [400,800) holding a
//   comm [500,600) (counts as the backward's)  idle [800,900)  optimizer [900,1000);
//   schedule [100,900).  compute 600, comm 100, other 200, idle 100; bubble 1 - 600/800 = 0.25
// rank 0, step 1 = [1000, 2000): F [1000,1500)  comm [1500,1700); no schedule.
//   compute .5, comm .2, idle .3
// rank 1, step 0 = [10000, 12000): schedule over all of it, F [10000,11000), a reducer-track
//   allreduce [11000,11500) (not the engine's), p2p [11500,11600).  compute .5, comm .05,
//   idle .45; bubble 1 - 1000/2000 = 0.5
// rank 1, step 1 = [12000, 13000): checkpoint [12000,12500), F [12500,12600).  other .5,
//   compute .1, idle .4
// rank 1, step 2: only rank 1 has it, so merge leaves it out.
std::vector<RankTrace> two_ranks() {
  RankTrace r0;
  r0.info = {0, 2, "1x2x1", "rank 0: dp 0 pp 0 tp 0, layers [0,2)", 0, 0, 2};
  r0.spans = {span("step", "step 0", 0, 1000, 0),
              span("data", "batch", 0, 100, 0),
              span("schedule", "1f1b", 100, 800, 0),
              span("compute", "F0", 100, 200, 0, kEngine, {{"chunk", "0"}}),
              span("comm", "p2p batch", 300, 100, 0),
              span("compute", "B0", 400, 400, 0),
              span("comm", "allreduce bucket 1", 500, 100, 0),
              span("optimizer", "optimizer", 900, 100, 0),
              span("step", "step 1", 1000, 1000, 1),
              span("compute", "F0", 1000, 500, 1),
              span("comm", "p2p batch", 1500, 200, 1)};
  RankTrace r1;
  r1.info = {1, 2, "1x2x1", "rank 1: dp 0 pp 1 tp 0, layers [2,4)+head", 500, 0, 2};
  r1.spans = {
      span("step", "step 0", 10000, 2000, 0),
      span("schedule", "1f1b", 10000, 2000, 0),
      span("compute", "F0", 10000, 1000, 0),
      span("comm", "allreduce bucket 0", 11000, 500, 0, kReducer, {{"op", "allreduce"}, {"bytes", "4096"}}),
      span("comm", "p2p batch", 11500, 100, 0, kPipelineComm),
      span("comm", "p2p batch", 11500, 100, 0),
      span("step", "step 1", 12000, 1000, 1),
      span("checkpoint", "snapshot", 12000, 500, 1),
      span("compute", "F0", 12500, 100, 1),
      span("step", "step 2", 13000, 1000, 2),
      span("compute", "F0", 13000, 1000, 2)};
  return {r0, r1};
}

}  // namespace

TEST_CASE("trace: an off recorder records nothing", "[core][trace]") {
  Recorder r;
  CHECK_FALSE(r.active());
  r.set_step(0);
  CHECK_FALSE(r.active());
  CHECK_FALSE(r.done());
  r.add(span("compute", "F0", 0, 1, -1));
  { Recorder::Scope s(r, "compute", "F1"); }
  CHECK(r.take().empty());
  CHECK(r.steps() == 0);
}

TEST_CASE("trace: the recorder keeps the steps of its window only", "[core][trace]") {
  Recorder r(2, 3);  // steps 2, 3, 4
  CHECK(r.from_step() == 2);
  CHECK(r.steps() == 3);
  CHECK_FALSE(r.active());  // no step yet
  for (int64_t step = 0; step < 7; ++step) {
    r.set_step(step);
    CHECK(r.active() == (step >= 2 && step <= 4));
    CHECK(r.done() == (step >= 5));
    r.add(span("compute", "F", r.now_us(), 1, -1));     // the step comes from set_step
    r.add(span("data", "prefetch", r.now_us(), 1, 9));  // its own step is kept
  }
  const auto spans = r.take();
  REQUIRE(spans.size() == 6);
  std::multiset<int64_t> steps;
  for (const auto& s : spans) steps.insert(s.cat == "compute" ? s.step : -s.step);
  CHECK(steps == std::multiset<int64_t>{2, 3, 4, -9, -9, -9});
  CHECK(r.take().empty());  // take leaves none

  CHECK_THROWS_AS(Recorder(-1, 2), troupe::Error);
  CHECK_THROWS_AS(Recorder(0, -2), troupe::Error);
}

TEST_CASE("trace: a scope records one span, in the step it began in", "[core][trace]") {
  Recorder r(4, 1);
  r.set_step(4);
  const int64_t before = r.now_us();
  {
    Recorder::Scope s(r, "comm", "allreduce bucket 1", kReducer, {{"op", "allreduce"}, {"bytes", "4096"}});
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    r.set_step(5);  // the window closes while the span is open: it still counts
  }
  CHECK_FALSE(r.active());
  CHECK(r.done());
  { Recorder::Scope late(r, "compute", "F0"); }  // begins outside the window: dropped
  const auto spans = r.take();
  REQUIRE(spans.size() == 1);
  const Span& s = spans[0];
  CHECK(s.cat == "comm");
  CHECK(s.name == "allreduce bucket 1");
  CHECK(s.track == kReducer);
  CHECK(s.step == 4);
  CHECK(s.args == Args{{"op", "allreduce"}, {"bytes", "4096"}});
  CHECK(s.ts_us >= before);
  CHECK(s.dur_us >= 2000);
  CHECK(s.ts_us + s.dur_us <= r.now_us());
  const auto t = std::chrono::steady_clock::now();
  CHECK(r.to_us(t) <= r.now_us());
}

TEST_CASE("trace: two threads record at once", "[core][trace]") {
  Recorder r(0, 1);
  r.set_step(0);
  constexpr int kEach = 20000;
  auto work = [&r](int track) {
    for (int i = 0; i < kEach; ++i) {
      if (i % 2) {
        r.add(span("comm", std::to_string(i), r.now_us(), 0, -1, track));
      } else {
        Recorder::Scope s(r, "compute", std::to_string(i), track);
      }
    }
  };
  std::thread a(work, kEngine), b(work, kReducer);
  a.join();
  b.join();
  const auto spans = r.take();
  REQUIRE(spans.size() == size_t(2 * kEach));
  std::set<std::pair<int, std::string>> seen;
  for (size_t i = 0; i < spans.size(); ++i) {
    seen.insert({spans[i].track, spans[i].name});
    CHECK(spans[i].step == 0);
    if (i) REQUIRE(spans[i - 1].ts_us <= spans[i].ts_us);  // start order
  }
  CHECK(seen.size() == size_t(2 * kEach));
}

TEST_CASE("trace: a moved recorder keeps its window and spans", "[core][trace]") {
  Recorder a(1, 1);
  a.set_step(1);
  a.add(span("compute", "F0", 5, 1, -1));
  Recorder b;
  b = std::move(a);
  CHECK(b.active());
  CHECK(b.from_step() == 1);
  REQUIRE(b.take().size() == 1);
}

TEST_CASE("trace: a rank trace reads back as written", "[core][trace]") {
  const std::string dir = troupe::testing::temp_dir("trace_rt");
  const std::string path = dir + "/trace/rank1.json";  // the trace/ folder is created
  const RankInfo info{1, 4, "2x2x1", "rank 1: dp 0 pp 1 tp 0, layers [2,4)+head", -1234, 12, 3};
  const std::vector<Span> spans = {
      span("step", "step 12", 100, 5000, 12),
      span("compute", "B2.1", 150, 300, 12, kEngine, {{"chunk", "1"}, {"micro_batch", "2"}}),
      span("comm", "allreduce \"bucket\" 1\n\xc3\xa9", 400, 0, 12, kReducer,
           {{"op", "allreduce"}, {"bytes", "4096"}, {"group", "dp"}}),
      span("data", "load", -20, 7, -1, kPipelineComm),
      span("eval", "eval", 9000, 10, 13, 7)};  // a track the viewer gets a plain name for
  write_rank_trace(path, info, spans);
  CHECK_FALSE(fs::exists(path + ".tmp"));

  const RankTrace t = read_rank_trace(path);
  CHECK(t.info.rank == 1);
  CHECK(t.info.world == 4);
  CHECK(t.info.layout == "2x2x1");
  CHECK(t.info.place == info.place);
  CHECK(t.info.clock_offset_us == -1234);
  CHECK(t.info.from_step == 12);
  CHECK(t.info.steps == 3);
  REQUIRE(t.spans.size() == spans.size());
  for (size_t i = 0; i < spans.size(); ++i) {
    INFO("span " << i);
    CHECK(t.spans[i].cat == spans[i].cat);
    CHECK(t.spans[i].name == spans[i].name);
    CHECK(t.spans[i].ts_us == spans[i].ts_us);
    CHECK(t.spans[i].dur_us == spans[i].dur_us);
    CHECK(t.spans[i].step == spans[i].step);
    CHECK(t.spans[i].track == spans[i].track);
    CHECK(t.spans[i].args == spans[i].args);
  }

  // What a viewer reads: complete events, the process and track names, the time unit.
  std::ifstream in(path);
  const auto doc = nlohmann::json::parse(in);
  CHECK(doc["displayTimeUnit"] == "ms");
  std::set<std::string> names;
  for (const auto& e : doc["traceEvents"]) {
    CHECK(e["pid"] == 1);
    if (e["ph"] == "M" && (e["name"] == "process_name" || e["name"] == "thread_name"))
      names.insert(e["args"]["name"].get<std::string>());
  }
  CHECK(names ==
        std::set<std::string>{info.place, "engine", "data-parallel reducer", "pipeline comm", "track 7"});
}

TEST_CASE("trace: hostile trace files are refused by name", "[core][trace]") {
  const std::string dir = troupe::testing::temp_dir("trace_bad");
  const std::string p = dir + "/rank0.json";
  auto has = [](const std::string& msg, const std::string& part) {
    INFO(msg);
    CHECK(msg.find(part) != std::string::npos);
  };
  const std::string good =
      R"({"ph": "X", "pid": 0, "tid": 0, "cat": "compute", "name": "F0", "ts": 1, "dur": 2})";
  REQUIRE(refusal(p, file_with_event(good)).empty());

  const std::string not_json = refusal(p, "this is not JSON");
  has(not_json, p);
  has(not_json, "not valid JSON");
  has(refusal(p, std::string("{") + kInfo + "}"), "no \"traceEvents\" array");
  has(refusal(p, std::string(R"({"traceEvents": 3, )") + kInfo + "}"), "\"traceEvents\" is number");
  has(refusal(p, R"({"traceEvents": []})"), "no \"troupe\" section");
  has(refusal(p, "[1, 2]"), "the top level is array");

  const std::string str_ts = refusal(
      p,
      file_with_event(R"({"ph": "X", "pid": 0, "tid": 0, "cat": "c", "name": "n", "ts": "12", "dur": 2})"));
  has(str_ts, p);
  has(str_ts, "event 0: \"ts\" is string, expected a number");
  has(refusal(p, file_with_event(
                     R"({"ph": "X", "pid": 0, "tid": 0, "cat": "c", "name": "n", "ts": 1, "dur": -5})")),
      "\"dur\" is -5, a negative duration");
  has(refusal(p, file_with_event(R"({"ph": "X", "pid": 0, "tid": 0, "cat": "c", "ts": 1, "dur": 5})")),
      "event 0: \"name\" is missing");
  has(refusal(p, file_with_event(
                     R"({"ph": "X", "pid": 3, "tid": 0, "cat": "c", "name": "n", "ts": 1, "dur": 5})")),
      "pid 3 is not this file's rank 0");
  has(refusal(p, file_with_event(R"({"ph": "B", "pid": 0, "tid": 0, "name": "n", "ts": 1})")), "phase \"B\"");
  has(refusal(p, file_with_event(good + ", 7")), "event 1: is number, expected an object");
  has(refusal(p, R"({"traceEvents": [], "troupe": {"rank": 2, "world": 2, "layout": "", "place": "",
                    "clock_offset_us": 0, "from_step": 0, "steps": 1}})"),
      "\"troupe\": \"rank\" is 2, outside [0, 1]");
  has(refusal(p, std::string(200, '[') + std::string(200, ']')), "the top level is array");
  // Deep where a reader passes over: still counted, and refused at the limit.
  has(refusal(p, "{\"meta\": " + std::string(1000000, '[') + std::string(1000000, ']') + "}"),
      "JSON nested deeper than 32 levels");

  ReadLimits small;
  small.max_bytes = 64;
  has(refusal(p, file_with_event(good), small), "a trace file is at most 64 bytes");
  ReadLimits few;
  few.max_events = 1;
  has(refusal(p, file_with_event(good + ", " + good), few), "more than the 1 events a trace file may hold");

  const std::string fifo = dir + "/fifo.json";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  try {
    read_rank_trace(fifo);
    FAIL("a FIFO was read");
  } catch (const troupe::Error& e) {
    has(e.what(), fifo + ": not a regular file");
  }
  fs::create_directories(dir + "/adir");
  try {
    read_rank_trace(dir + "/adir");
    FAIL("a directory was read");
  } catch (const troupe::Error& e) {
    has(e.what(), "is a directory, not a trace file");
  }
  CHECK_THROWS_WITH(read_rank_trace(dir + "/missing.json"), Catch::Contains("missing.json: cannot open"));
}

TEST_CASE("trace: hostile shapes cost linear time and bounded memory, or are refused by name",
          "[core][trace]") {
  const std::string dir = troupe::testing::temp_dir("trace_shapes");
  const std::string p = dir + "/rank0.json";
  auto has = [](const std::string& msg, const std::string& part) {
    INFO(msg);
    CHECK(msg.find(part) != std::string::npos);
  };
  const std::string head = R"({"ph": "X", "pid": 0, "tid": 0, "cat": "c", "name": "n", "ts": 1, "dur": 2, )";
  // 100k arguments in one event (quadratic before: 50 s for 1 MB): refused at the 65th.
  std::string many = head + R"("args": {)";
  for (int i = 0; i < 100000; ++i) many += (i ? ",\"k" : "\"k") + std::to_string(i) + "\": \"v\"";
  has(refusal(p, file_with_event(many + "}}")), "event 0: more than 64 arguments");
  // 100k keys in a section the reader passes over: read in one pass.
  std::string meta = R"({"meta": {)";
  for (int i = 0; i < 100000; ++i) meta += (i ? ",\"k" : "\"k") + std::to_string(i) + "\": 1";
  CHECK(refusal(p, meta + "}, " + file_with_event(head + R"("args": {"step": 0}})").substr(1)).empty());
  // Keys twice: in an event, among its arguments, at the top.
  has(refusal(p, file_with_event(head + R"("ts": 3})")), "event 0: the key \"ts\" appears twice");
  has(refusal(p, file_with_event(head + R"("args": {"a": "1", "a": "2"}})")),
      "the argument \"a\" appears twice");
  has(refusal(p, std::string(R"({"traceEvents": [], "traceEvents": [], )") + kInfo + "}"),
      "the key \"traceEvents\" appears twice");
  // Spans that would take more than 4x the file (64 tiny arguments each): refused.
  std::string wide = head + R"("args": {)";
  for (int i = 0; i < 64; ++i) wide += (i ? ",\"" : "\"") + std::to_string(i) + "\": 1";
  wide += "}}";
  std::string events;
  for (int i = 0; i < 4000; ++i) events += (i ? ", " : "") + wide;
  has(refusal(p, file_with_event(events)),
      "bytes (4 times the file): arguments or names too many or too long");
  // An argument that is a container is kept as its JSON text.
  REQUIRE(refusal(p, file_with_event(head + R"("args": {"shape": [2, {"k": null}], "step": 4}})")).empty());
  const RankTrace t = read_rank_trace(p);
  REQUIRE(t.spans.size() == 1);
  CHECK(t.spans[0].step == 4);
  CHECK(t.spans[0].args == Args{{"shape", R"([2,{"k":null}])"}});
  fs::remove_all(dir);
}

TEST_CASE("trace: rank trace files sort by rank number", "[core][trace]") {
  const std::string dir = troupe::testing::temp_dir("trace_files");
  CHECK_THROWS_WITH(rank_trace_files(dir), Catch::Contains("no rank<r>.json trace files"));
  CHECK_THROWS_WITH(rank_trace_files(dir + "/none"), Catch::Contains("not a directory"));
  for (const char* n : {"rank10.json", "rank2.json", "rank0.json", "rank1.json", "merged.json", "rankx.json",
                        "rank1.json.tmp", "rank.json"})
    write_text(dir + "/" + n, "{}");
  const auto files = rank_trace_files(dir);
  REQUIRE(files.size() == 4);
  CHECK(fs::path(files[0]).filename() == "rank0.json");
  CHECK(fs::path(files[1]).filename() == "rank1.json");
  CHECK(fs::path(files[2]).filename() == "rank2.json");
  CHECK(fs::path(files[3]).filename() == "rank10.json");
}

TEST_CASE("trace: one rank's step shares count nested leaves once", "[core][trace]") {
  const auto ranks = two_ranks();
  const StepShares s = step_shares(ranks[0].spans, 0);
  CHECK(s.step == 0);
  CHECK(s.wall_ms == Approx(1.0));
  CHECK(s.compute == Approx(0.6));
  CHECK(s.comm == Approx(0.1));
  CHECK(s.other == Approx(0.2));
  CHECK(s.idle == Approx(0.1));
  CHECK(s.bubble == Approx(0.25));
  CHECK(step_shares(ranks[0].spans, 1).bubble == -1);
  CHECK(step_shares(ranks[0].spans, 7).wall_ms < 0);

  // A leaf that runs past the end of the one it started in counts its own tail.
  const std::vector<Span> spans = {span("step", "step 3", 0, 100, 3), span("compute", "B0", 0, 50, 3),
                                   span("comm", "p2p", 40, 30, 3), span("compute", "W0", 90, 20, 3)};
  const StepShares t = step_shares(spans, 3);
  CHECK(t.compute == Approx(0.6));  // [0,50) + [90,100): clipped to the step
  CHECK(t.comm == Approx(0.2));     // [50,70)
  CHECK(t.idle == Approx(0.2));
}

TEST_CASE("trace: merge puts ranks on rank 0's clock and averages their shares", "[core][trace]") {
  const std::string dir = troupe::testing::temp_dir("trace_merge");
  const std::string out = dir + "/trace/merged.json";
  const auto shares = merge(two_ranks(), out);
  REQUIRE(shares.size() == 2);  // step 2 is rank 1's only

  CHECK(shares[0].step == 0);
  CHECK(shares[0].wall_ms == Approx(1.5));
  CHECK(shares[0].compute == Approx(0.55));
  CHECK(shares[0].comm == Approx(0.075));
  CHECK(shares[0].other == Approx(0.1));
  CHECK(shares[0].idle == Approx(0.275));
  CHECK(shares[0].bubble == Approx(0.375));

  CHECK(shares[1].step == 1);
  CHECK(shares[1].wall_ms == Approx(1.0));
  CHECK(shares[1].compute == Approx(0.3));
  CHECK(shares[1].comm == Approx(0.1));
  CHECK(shares[1].other == Approx(0.25));
  CHECK(shares[1].idle == Approx(0.35));
  CHECK(shares[1].bubble == -1);  // no schedule span in step 1

  std::ifstream in(out);
  const auto doc = nlohmann::json::parse(in);  // valid JSON
  CHECK(doc["displayTimeUnit"] == "ms");
  std::map<int, std::string> processes;
  int64_t rank1_step0 = -1, rank0_step0 = -1;
  size_t complete = 0;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name")
      processes[e["pid"].get<int>()] = e["args"]["name"].get<std::string>();
    if (e["ph"] != "X") continue;
    ++complete;
    if (e["name"] == "step 0") (e["pid"] == 1 ? rank1_step0 : rank0_step0) = e["ts"].get<int64_t>();
  }
  CHECK(processes == std::map<int, std::string>{{0, "rank 0: dp 0 pp 0 tp 0, layers [0,2)"},
                                                {1, "rank 1: dp 0 pp 1 tp 0, layers [2,4)+head"}});
  CHECK(complete == 22);
  CHECK(rank0_step0 == 0);
  CHECK(rank1_step0 == 10500);  // 10000 on its clock + 500
  CHECK(doc["troupe"]["ranks"].size() == 2);
  CHECK(doc["troupe"]["shares"].size() == 2);

  auto dup = two_ranks();
  dup[1].info.rank = 0;
  CHECK_THROWS_WITH(merge(dup, out), Catch::Contains("rank 0 appears twice"));
  CHECK_THROWS_AS(merge({}, out), troupe::Error);
}

TEST_CASE("trace: merge refuses traces of different runs, and a missing rank", "[core][trace]") {
  const std::string dir = troupe::testing::temp_dir("trace_merge_mixed");
  std::vector<RankTrace> ranks = two_ranks();
  ranks[1].info.layout = "2x1x1";  // another generation's file
  REQUIRE_THROWS_WITH(merge(ranks, dir + "/m.json"),
                      Catch::Contains("traces of different runs or generations"));
  ranks = two_ranks();
  ranks.pop_back();
  REQUIRE_THROWS_WITH(merge(ranks, dir + "/m.json"), Catch::Contains("1 rank files for a world of 2"));
  ranks = two_ranks();
  ranks[1].info.rank = 5;
  REQUIRE_THROWS_WITH(merge(ranks, dir + "/m.json"), Catch::Contains("rank 5 outside a world of 2"));
}

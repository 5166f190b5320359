// The job table of `troupe coordinator --state-dir`: saved atomically, loaded
// back with every field, live jobs mapped to recovering as their next generation.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "coordinator/spec_request.hpp"
#include "coordinator/state.hpp"
#include "core/error.hpp"

using namespace troupe::coord;

namespace {

JobRequest job_request(const std::string& name, int dp) {
  JobRequest r;
  r.name = name;
  r.spec_yaml = "name: " + name + "\ntrain:\n  steps: 20\n";
  r.layout = {dp, 1, 1};
  r.plan.model.n_layers = 2;
  r.total_steps = 20;
  r.max_restarts = 2;
  r.restart_backoff_ms = 1e9;  // a recovering job stays recovering while the test looks at it
  r.plan.global_batch = 8;
  r.plan.micro_batch = 2;
  r.checkpoint_dir = "/ckpt/" + name;
  return r;
}

const Job& job_of(const CoordinatorState& st, const std::string& id) {
  const Job* j = st.job(id);
  REQUIRE(j != nullptr);
  return *j;
}

nlohmann::json entry(const nlohmann::json& table, const std::string& id) {
  for (const auto& j : table["jobs"])
    if (j["id"] == id) return j;
  return nullptr;
}

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/troupe-table-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

}  // namespace

TEST_CASE("job table: save and load round-trip, live jobs become recovering as generation + 1", "[table]") {
  CoordinatorState st("/tmp/troupe-table-runs", 7);
  int next = 0;
  st.set_id_source([&] { return "job" + std::to_string(++next); });
  Actions a;
  REQUIRE(st.register_agent(7, "h1", 10, {"cpu:0", "cpu:1"}, &a).accepted);

  // job1 succeeds; job2 runs with a step done; job3 (2 devices) waits; job4 is
  // recovering after a failure; job5 is cancelled while queued.
  std::string done = st.submit(job_request("done", 1), &a);
  REQUIRE(st.register_worker(7, done, 0, 0, "h1", 100, &a).refused.empty());
  st.worker_done(done, 0, 0, /*drained=*/false, &a);
  REQUIRE(job_of(st, done).state == JobState::succeeded);

  std::string running = st.submit(job_request("running", 1), &a);
  REQUIRE(st.register_worker(7, running, 0, 0, "h1", 101, &a).refused.empty());
  StepSample s;
  s.step = 4;
  s.loss = 3.25;
  s.tokens = 64;
  st.step(running, 0, s, &a);
  REQUIRE(job_of(st, running).state == JobState::running);

  std::string queued = st.submit(job_request("queued", 2), &a);
  REQUIRE(job_of(st, queued).state == JobState::queued);

  std::string failing = st.submit(job_request("failing", 1), &a);
  REQUIRE(job_of(st, failing).state == JobState::launching);
  REQUIRE(st.register_worker(7, failing, 0, 0, "h1", 102, &a).refused.empty());
  st.worker_exited(failing, 0, 0, 102, -1, 9, &a);
  REQUIRE(job_of(st, failing).state == JobState::recovering);
  REQUIRE(job_of(st, failing).generation == 1);

  std::string cancelled = st.submit(job_request("cancelled", 2), &a);
  REQUIRE(st.cancel(cancelled, "by the user", &a, nullptr));

  TempDir dir;
  const nlohmann::json table = st.table_json();
  save_table(dir.path + "/state", table);
  CHECK(std::filesystem::exists(state_file(dir.path + "/state")));
  CHECK_FALSE(std::filesystem::exists(state_file(dir.path + "/state") + ".tmp"));
  const nlohmann::json read = load_table_file(dir.path + "/state");
  CHECK(read == table);
  CHECK(load_table_file(dir.path + "/none").is_null());

  CoordinatorState back("/tmp/troupe-table-runs", 7);
  Actions loaded;
  back.load_table(read, &loaded);
  REQUIRE(back.jobs().size() == 5);

  // Queued and terminal jobs are exactly what was saved.
  const nlohmann::json again = back.table_json();
  for (const auto& id : {done, queued, cancelled}) CHECK(entry(again, id) == entry(table, id));
  CHECK(job_of(back, done).state == JobState::succeeded);
  CHECK(job_of(back, queued).state == JobState::queued);
  CHECK(job_of(back, cancelled).state == JobState::cancelled);
  CHECK(job_of(back, cancelled).reason == "by the user");

  // The running generation died with the coordinator: the next one relaunches.
  const Job& r = job_of(back, running);
  CHECK(r.state == JobState::recovering);
  CHECK(r.generation == 1);
  CHECK(r.restarts == 0);
  CHECK(r.last_step == 4);
  CHECK(r.last_loss == 3.25);
  CHECK(r.run_dir == job_of(st, running).run_dir);
  CHECK(r.request.spec_yaml == job_request("running", 1).spec_yaml);
  CHECK(r.request.plan.global_batch == 8);
  CHECK(r.request.checkpoint_dir == "/ckpt/running");
  CHECK(r.ranks.empty());
  CHECK(r.reason.find("coordinator restarted") != std::string::npos);
  bool announced = false;
  for (const auto& e : loaded.events)
    announced = announced || (e["event"] == "state" && e["job"] == running && e["state"] == "recovering");
  CHECK(announced);

  // A job recovering when the table was saved had not launched its generation yet.
  const Job& f = job_of(back, failing);
  CHECK(f.state == JobState::recovering);
  CHECK(f.generation == 1);
  CHECK(f.restarts == 1);
  REQUIRE(f.failures.size() == 1);
  CHECK(f.failures[0]["cause"] == "worker_killed");

  // Devices come back: the recovering jobs relaunch from their newest checkpoints.
  back.set_checkpoint_finder([](const std::string& root, std::vector<std::string>*) {
    return root == "/ckpt/running" ? std::string("/ckpt/running/step_000005") : std::string();
  });
  Actions reg;
  REQUIRE(back.register_agent(7, "h2", 20, {"cpu:0", "cpu:1"}, &reg).accepted);
  CHECK(job_of(back, running).state == JobState::launching);
  CHECK(job_of(back, running).resume_from == "/ckpt/running/step_000005");
  CHECK(job_of(back, failing).state == JobState::launching);
  CHECK(job_of(back, failing).resume_from.empty());
  int gen1 = 0;
  for (const auto& l : reg.launches)
    gen1 += l.generation == 1 && (l.job_id == running || l.job_id == failing);
  CHECK(gen1 == 2);
  // Generation 0 of the relaunched job is refused everywhere.
  CHECK_FALSE(back.store_refusal(running, 0).empty());
  CHECK(back.store_refusal(running, 1).empty());
}

TEST_CASE("job table: a malformed table is refused with a reason", "[table]") {
  CoordinatorState st("/tmp/troupe-table-runs", 7);
  Actions a;
  CHECK_THROWS_AS(st.load_table(nlohmann::json::object(), &a), troupe::Error);
  CHECK_THROWS_AS(st.load_table(nlohmann::json::parse(R"({"format":1,"jobs":[{"id":"x"}]})"), &a),
                  troupe::Error);
  CHECK(st.jobs().empty());

  TempDir dir;
  std::filesystem::create_directories(dir.path);
  std::ofstream(state_file(dir.path)) << "{not json";
  CHECK_THROWS_AS(load_table_file(dir.path), troupe::Error);

  // Loading is for a coordinator that has no jobs yet.
  CoordinatorState full("/tmp/troupe-table-runs", 7);
  REQUIRE(full.register_agent(7, "h1", 10, {"cpu:0"}, &a).accepted);
  JobRequest r;
  r.name = "x";
  r.layout = {1, 1, 1};
  full.submit(r, &a);
  CHECK_THROWS_AS(full.load_table(full.table_json(), &a), troupe::Error);
}

TEST_CASE("job table: a failed job keeps its cause, an unknown cause loads as worker_failed", "[table]") {
  CoordinatorState st("/tmp/troupe-table-runs", 7);
  Actions a;
  REQUIRE(st.register_agent(7, "h1", 10, {"cpu:0"}, &a).accepted);
  std::string id = st.submit(job_request("bad", 1), &a);
  REQUIRE(st.register_worker(7, id, 0, 0, "h1", 100, &a).refused.empty());
  st.worker_failed(id, 0, 0, troupe::FailureCause::invalid_spec, "unknown key", &a);
  REQUIRE(job_of(st, id).state == JobState::failed);
  nlohmann::json table = st.table_json();
  CHECK(entry(table, id)["failure_name"] == "invalid_spec");
  CoordinatorState back("/tmp/troupe-table-runs", 7);
  Actions loaded;
  back.load_table(table, &loaded);
  CHECK(job_of(back, id).failure == troupe::FailureCause::invalid_spec);
  CHECK(back.job_json(job_of(back, id))["failure"] == "invalid_spec");
  CHECK(back.table_json() == table);

  // A cause this version does not name (another version's table) keeps the job, not the name.
  table["jobs"][0]["failure_name"] = "made_up";
  CoordinatorState other("/tmp/troupe-table-runs", 7);
  other.load_table(table, &loaded);
  CHECK(job_of(other, id).failure == troupe::FailureCause::worker_failed);
  CHECK(job_of(other, id).state == JobState::failed);
}

TEST_CASE("job table: a table without plan inputs derives them from its spec", "[table]") {
  CoordinatorState st("/tmp/troupe-table-runs", 7);
  Actions a;
  JobRequest r = job_request_from_yaml(
      "name: old\nmodel: {type: gpt, seq_len: 16, d_model: 32, n_layers: 3, n_heads: 2}\n"
      "data: {source: synthetic}\ntrain: {steps: 4, global_batch: 6, micro_batch: 3}\n",
      "old.yaml");
  std::string id = st.submit(r, &a);
  nlohmann::json table = st.table_json();
  for (auto& j : table["jobs"]) j["request"].erase("plan");  // as a table of an earlier version
  CoordinatorState back("/tmp/troupe-table-runs", 7);
  Actions loaded;
  back.load_table(table, &loaded);
  const auto& in = job_of(back, id).request.plan;
  CHECK(in.model.n_layers == 3);
  CHECK(in.global_batch == 6);
  CHECK(in.micro_batch == 3);
  // Such a table whose spec does not parse is refused with a troupe::Error naming the job.
  for (auto& j : table["jobs"]) j["request"]["spec_yaml"] = "model: [\n";
  CoordinatorState bad("/tmp/troupe-table-runs", 7);
  CHECK_THROWS_AS(bad.load_table(table, &loaded), troupe::Error);
  CHECK_THROWS_WITH(bad.load_table(table, &loaded),
                    Catch::Contains("job old in the job table has no plan and a spec that does not parse"));
}

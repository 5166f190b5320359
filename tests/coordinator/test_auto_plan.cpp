// Jobs that leave their layout to the planner (parallel: auto): the coordinator plans at
// launch for the devices there are, and again at every relaunch — after a failure on fewer
// devices, after a resize or a growth on more — where tensor and pipeline may change too.
// Pure state: no actors, no processes.
#include <catch2/catch.hpp>
#include <filesystem>

#include "coordinator/policy.hpp"
#include "coordinator/spec_request.hpp"
#include "coordinator/state.hpp"
#include "plan/hardware.hpp"

using namespace troupe;
using namespace troupe::coord;

namespace {

// A 4-layer GPT whose batch of one sequence cannot be split over data replicas: more devices
// can only go to pipeline stages or tensor shards.
std::string spec_yaml(const std::string& elastic = "", int global_batch = 1) {
  return "name: auto\n"
         "model: {type: gpt, seq_len: 32, d_model: 64, n_layers: 4, n_heads: 4}\n"
         "data: {source: synthetic}\n"
         "train: {steps: 1000, global_batch: " +
         std::to_string(global_batch) +
         ", micro_batch: auto, recompute: auto}\n"
         "parallel: {data: auto, pipeline: auto, tensor: auto}\n"
         "fault: {max_restarts: 5}\n" +
         elastic;
}

std::vector<std::string> cpus(int n) {
  std::vector<std::string> d;
  for (int i = 0; i < n; ++i) d.push_back("cpu:" + std::to_string(i));
  return d;
}

struct Cluster {
  std::string root = (std::filesystem::temp_directory_path() / "troupe-auto-test").string();
  CoordinatorState st{root, 7};
  std::vector<std::string> agents;
  std::string job;
  int next = 0;
  Cluster() {
    st.set_id_source([this] { return "job" + std::to_string(++next); });
    st.set_checkpoint_finder(
        [](const std::string& r, std::vector<std::string>*) { return r + "/step_000004"; });
  }
  void agent(int devices) {
    Actions a;
    agents.push_back(
        st.register_agent(7, "h" + std::to_string(agents.size() + 1), 1, cpus(devices), &a).message);
  }
  // `backoff_ms`: before the first relaunch. A test that looks at the job between a failure and
  // its relaunch needs one longer than any pause of the machine between the two calls.
  Actions submit(const std::string& yaml, double backoff_ms = 1) {
    JobRequest r = job_request_from_yaml(yaml, "auto.yaml", plan::to_yaml(plan::builtin_hardware("cpu")));
    r.restart_backoff_ms = backoff_ms;
    Actions a;
    job = st.submit(std::move(r), &a);
    return a;
  }
  void run_steps(int n) {
    Actions a;
    const Job& j = *st.job(job);
    for (int r = 0; r < int(j.ranks.size()); ++r)
      st.register_worker(7, job, j.generation, r, j.ranks[r].host, 100 + r, &a);
    for (int s = 0; s < n; ++s)
      for (int r = 0; r < int(j.ranks.size()); ++r)
        st.step(job, j.generation, StepSample{r, j.last_step + 1, 2.0, 1e-3, 32, 10.0, 1.0, {}}, &a);
  }
  const Job& j() const { return *st.job(job); }
};

const nlohmann::json* plan_event(const Actions& a) {
  for (const auto& e : a.events)
    if (e.value("event", "") == "plan") return &e;
  return nullptr;
}

}  // namespace

TEST_CASE("auto: the coordinator plans a job for the devices there are and says why", "[auto][planner]") {
  Cluster c;
  c.agent(4);
  const JobRequest r = job_request_from_yaml(spec_yaml(), "auto.yaml");
  CHECK(r.auto_plan);
  CHECK(!r.hardware_yaml.empty());
  const Actions a = c.submit(spec_yaml());
  CHECK(c.j().state == JobState::launching);
  CHECK(c.j().layout.world() == 4);
  CHECK(c.j().layout.dp == 1);  // a batch of one sequence
  CHECK(a.launches.size() == 4);
  const nlohmann::json* e = plan_event(a);
  REQUIRE(e != nullptr);
  CHECK(e->value("layout", "") == c.j().layout.str());
  CHECK(e->value("generation", -1) == 0);
  CHECK(e->value("devices", 0) == 4);
  CHECK(e->value("predicted_step_s", 0.0) > 0);
  CHECK_THAT(e->value("why", ""), Catch::Contains("s/step predicted"));
  // The workers get the planned spec: the choice written in, nothing left to the planner.
  const JobSpec s = parse_spec(c.j().spec_yaml, "planned");
  CHECK(layout_of(s.parallel) == c.j().layout);
  CHECK(s.train.micro_batch == c.j().plan.micro_batch);
  CHECK(s.train.recompute != Recompute::auto_);
  CHECK(c.j().plan.layout == c.j().layout);
  // The request keeps what was submitted: the next launch plans again.
  CHECK(parse_spec(c.j().request.spec_yaml, "submitted").parallel.data == 0);
}

TEST_CASE("auto: after losing devices the re-plan changes pipeline and tensor, not only data",
          "[auto][planner][recovery]") {
  Cluster c;
  c.agent(2);
  c.agent(2);
  c.submit(spec_yaml(), /*backoff_ms=*/8000);  // the longest backoff there is
  const Layout first = c.j().layout;
  REQUIRE(first.world() == 4);
  c.run_steps(3);
  CHECK(c.j().state == JobState::running);
  Actions x;
  c.st.remove_agent(c.agents[1], &x);
  CHECK(c.j().state == JobState::recovering);
  Actions t;
  c.st.tick(now_ms() + 9000, &t);
  CHECK(c.j().state == JobState::launching);
  CHECK(c.j().generation == 1);
  CHECK(c.j().layout.world() == 2);
  CHECK(c.j().layout.dp == 1);  // so the pipeline or the tensor degree went down
  CHECK(c.j().layout.pp * c.j().layout.tp == 2);
  CHECK(c.j().layout != first);
  const nlohmann::json* e = plan_event(t);
  REQUIRE(e != nullptr);
  CHECK(e->value("generation", -1) == 1);
  CHECK(e->value("layout", "") == c.j().layout.str());
  CHECK(c.j().resume_from == c.j().run_dir + "/ckpt/step_000004");
  CHECK(parse_spec(c.j().spec_yaml, "planned").parallel.pipeline == c.j().layout.pp);
}

TEST_CASE("auto: below elastic.min_devices the job waits, then fails at the deadline", "[auto][recovery]") {
  Cluster c;
  c.agent(2);
  c.agent(2);
  Actions a = c.submit(spec_yaml("elastic: {min_devices: 4}\n"));
  CHECK(c.j().layout.world() == 4);
  c.run_steps(1);
  Actions x;
  c.st.remove_agent(c.agents[1], &x);
  Actions t;
  c.st.tick(now_ms() + 1000, &t);
  CHECK(c.j().state == JobState::recovering);
  CHECK_THAT(c.j().reason, Catch::Contains("the job needs 4 or more"));
  Actions late;
  c.st.tick(now_ms() + 10 * 60 * 1000.0, &late);
  CHECK(c.j().state == JobState::failed);
  CHECK(c.j().failure == FailureCause::no_devices);
}

TEST_CASE("auto: a queued job whose model fits nowhere waits with the planner's reason", "[auto][planner]") {
  Cluster c;
  c.agent(2);
  const std::string huge =
      "name: huge\n"
      "model: {type: gpt, seq_len: 2048, d_model: 8192, n_layers: 64, n_heads: 64}\n"
      "data: {source: synthetic}\n"
      "train: {steps: 10, global_batch: 8}\n"
      "parallel: {data: auto, pipeline: auto, tensor: auto}\n";
  c.submit(huge);
  CHECK(c.j().state == JobState::queued);
  CHECK_THAT(c.j().reason, Catch::Contains("nothing fits in"));
  CHECK_THAT(c.j().reason, Catch::Contains("the smallest plan"));
}

TEST_CASE("auto: troupe scale re-plans for exactly the devices asked for", "[auto][elastic]") {
  Cluster c;
  c.agent(4);
  c.submit(spec_yaml("elastic: {max_devices: 4}\n"));
  c.run_steps(3);
  std::string why;
  Actions x;
  CHECK_FALSE(c.st.scale(c.job, 9, &x, &why));
  CHECK_THAT(why, Catch::Contains("not enough free devices"));
  REQUIRE(c.st.scale(c.job, 2, &x, &why));
  CHECK(c.j().target_devices == 2);
  REQUIRE(x.drains.size() == 4);
  Actions d;
  for (int r = 0; r < 4; ++r) c.st.worker_done(c.job, 0, r, /*drained=*/true, &d);
  CHECK(c.j().state == JobState::launching);
  CHECK(c.j().layout.world() == 2);
  CHECK(c.j().restarts == 0);  // a resize is not a failure
  CHECK(plan_event(d) != nullptr);
}

TEST_CASE("auto: a new agent grows a job below max_devices when the planner predicts a faster step",
          "[auto][elastic]") {
  Cluster c;
  c.agent(1);
  // A batch of 4 sequences: 2 devices take two data replicas, which the cpu profile prices faster.
  c.submit(spec_yaml("elastic: {max_devices: 2}\n", 4));
  CHECK(c.j().layout.world() == 1);
  c.run_steps(2);
  c.agent(1);  // its registration schedules: the job is drained for a resize to 2
  CHECK(c.j().target_devices == 2);
  CHECK(c.j().drain_step >= 0);
  Actions d;
  c.st.worker_done(c.job, 0, 0, /*drained=*/true, &d);
  CHECK(c.j().layout.world() == 2);
}

TEST_CASE("auto: the job table keeps an auto job's request and its profile", "[auto][table]") {
  Cluster c;
  c.agent(2);
  c.submit(spec_yaml());
  const nlohmann::json table = c.st.table_json();
  CoordinatorState again(c.root, 7);
  Actions a;
  again.load_table(table, &a);
  const Job* j = again.job(c.job);
  REQUIRE(j);
  CHECK(j->request.auto_plan);
  CHECK(j->request.hardware_yaml == c.j().request.hardware_yaml);
  CHECK(j->state == JobState::recovering);  // it was launching: it relaunches, planned again
}

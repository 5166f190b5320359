// The coordinator's pure state: registry, job state machine, placement,
// metrics aggregation and the rendezvous store, without actors or processes.
#include <catch2/catch.hpp>
#include <cmath>
#include <csignal>
#include <filesystem>

#include "actors/version.hpp"
#include "coordinator/job.hpp"
#include "coordinator/metrics.hpp"
#include "coordinator/registry.hpp"
#include "coordinator/rendezvous.hpp"
#include "coordinator/spec_request.hpp"
#include "coordinator/state.hpp"
#include "coordinator/where_polls.hpp"
#include "core/error.hpp"

using namespace troupe::coord;
using troupe::FailureCause;

namespace {

JobRequest request(const std::string& name, int dp, int pp = 1, int tp = 1, const std::string& kind = "cpu") {
  JobRequest r;
  r.name = name;
  r.spec_yaml = "name: " + name + "\n";
  r.device_kind = kind;
  r.layout = {dp, pp, tp};
  r.plan.model.n_layers = 4;
  r.plan.global_batch = 840;  // divisible by every data size a test asks for
  r.total_steps = 3;
  return r;
}

std::vector<std::string> cpus(int n) {
  std::vector<std::string> d;
  for (int i = 0; i < n; ++i) d.push_back("cpu:" + std::to_string(i));
  return d;
}

struct Fixture {
  std::string root = (std::filesystem::temp_directory_path() / "troupe-state-test").string();
  CoordinatorState st{root, 7};
  int next = 0;
  Fixture() {
    st.set_id_source([this] { return "job" + std::to_string(++next); });
  }
};

bool has_state_event(const Actions& a, const std::string& job, const std::string& state) {
  for (const auto& e : a.events)
    if (e["event"] == "state" && e["job"] == job && e["state"] == state) return true;
  return false;
}

}  // namespace

TEST_CASE("registry: agents register devices, duplicates and bad names are refused", "[registry]") {
  DeviceRegistry reg;
  auto a = reg.add_agent("h1", 10, cpus(4));
  auto b = reg.add_agent("h2", 11, {"cuda:0", "cuda:1"});
  CHECK(a != b);
  CHECK(reg.total("cpu") == 4);
  CHECK(reg.total("cuda") == 2);
  CHECK(reg.free("cpu") == 4);
  CHECK_THROWS_AS(reg.add_agent("h3", 12, {"cpu:0", "cpu:0"}), troupe::Error);
  CHECK_THROWS_AS(reg.add_agent("h3", 12, {"tpu:0"}), troupe::Error);
  CHECK_THROWS_AS(reg.add_agent("h3", 12, {"cpu:x"}), troupe::Error);
  CHECK_THROWS_AS(reg.add_agent("h3", 12, {}), troupe::Error);

  std::string why;
  auto got = reg.allocate("j1", "cpu", 3, &why);
  REQUIRE(got);
  CHECK(got->size() == 3);
  CHECK(reg.free("cpu") == 1);
  CHECK(reg.held_by("j1").size() == 3);
  auto jobs = reg.remove_agent(a);
  REQUIRE(jobs.size() == 1);
  CHECK(jobs[0] == "j1");
  CHECK(reg.total("cpu") == 0);
  CHECK(reg.agent(a) == nullptr);
}

TEST_CASE("registry: allocation prefers one agent, else spans agents, else says why", "[registry]") {
  DeviceRegistry reg;
  auto a = reg.add_agent("h1", 1, cpus(2));
  auto b = reg.add_agent("h2", 2, cpus(4));
  std::string why;
  auto one = reg.allocate("j1", "cpu", 3, &why);
  REQUIRE(one);
  for (const auto& d : *one) CHECK(d.agent_id == b);  // only b holds all three
  auto span = reg.allocate("j2", "cpu", 3, &why);     // no agent has 3 free: spans a and b
  REQUIRE(span);
  CHECK(span->front().agent_id == a);
  CHECK(span->back().agent_id == b);
  CHECK_FALSE(reg.allocate("j3", "cpu", 1, &why));
  CHECK(why == "waiting for 1 free cpu device(s): 0 free of 6 registered");
  reg.release("j1");
  CHECK(reg.free("cpu") == 3);
  CHECK_FALSE(reg.allocate("j3", "cuda", 1, &why));
  CHECK(why.find("too few") != std::string::npos);
}

TEST_CASE("registry: a spread allocation takes one device of each agent in turn", "[registry]") {
  DeviceRegistry reg;
  auto a = reg.add_agent("h1", 1, cpus(2));
  auto b = reg.add_agent("h2", 2, cpus(4));
  auto c = reg.add_agent("h3", 3, cpus(1));
  std::string why;
  // Five of seven: a, b, c, then a and b again (c has no second device).
  auto got = reg.allocate("j1", "cpu", 5, &why, true);
  REQUIRE(got);
  std::vector<std::string> agents;
  for (const auto& d : *got) agents.push_back(d.agent_id);
  CHECK(agents == std::vector<std::string>{a, b, c, a, b});
  CHECK((*got)[0].device == "cpu:0");
  CHECK((*got)[3].device == "cpu:1");
  // What is left: two devices of b; a spread job of three waits, naming what it needs.
  CHECK_FALSE(reg.allocate("j2", "cpu", 3, &why, true));
  CHECK(why == "waiting for 3 free cpu device(s): 2 free of 7 registered");
  auto rest = reg.allocate("j2", "cpu", 2, &why, true);
  REQUIRE(rest);
  CHECK(rest->front().agent_id == b);
  CHECK(rest->back().agent_id == b);

  // A relaunch's new places go to the agents holding the fewest of the job's devices.
  DeviceRegistry two;
  auto h1 = two.add_agent("h1", 1, cpus(2));
  auto h2 = two.add_agent("h2", 2, cpus(2));
  auto one = two.allocate("j", "cpu", 1, &why, true, {{h1, 1}});
  REQUIRE(one);
  CHECK(one->front().agent_id == h2);
  auto packed = two.allocate("k", "cpu", 1, &why, false, {{h1, 1}});
  REQUIRE(packed);
  CHECK(packed->front().agent_id == h1);  // packed: the held devices do not matter
}

TEST_CASE("job FSM: legal and illegal transitions", "[fsm]") {
  using S = JobState;
  CHECK(transition_allowed(S::queued, S::planning));
  CHECK(transition_allowed(S::planning, S::launching));
  CHECK(transition_allowed(S::planning, S::queued));
  CHECK(transition_allowed(S::launching, S::running));
  CHECK(transition_allowed(S::running, S::succeeded));
  for (S s : {S::queued, S::planning, S::launching, S::running}) {
    CHECK(transition_allowed(s, S::failed));
    CHECK(transition_allowed(s, S::cancelled));
  }
  CHECK_FALSE(transition_allowed(S::queued, S::running));
  CHECK_FALSE(transition_allowed(S::queued, S::succeeded));
  CHECK_FALSE(transition_allowed(S::launching, S::succeeded));
  CHECK_FALSE(transition_allowed(S::running, S::queued));
  for (S t : {S::succeeded, S::failed, S::cancelled})
    for (S to : {S::queued, S::running, S::failed, S::cancelled, S::succeeded})
      CHECK_FALSE(transition_allowed(t, to));
  IllegalTransition e(S::succeeded, S::running);
  CHECK(std::string(e.what()) == "illegal job transition succeeded -> running");
}

TEST_CASE("placement: two jobs that fit run at once, a third waits with a reason", "[placement]") {
  Fixture f;
  Actions a;
  REQUIRE(f.st.register_agent(7, "h1", 100, cpus(2), &a).accepted);
  REQUIRE(f.st.register_agent(7, "h2", 101, cpus(2), &a).accepted);
  Actions s1, s2, s3;
  auto j1 = f.st.submit(request("a", 2), &s1);
  auto j2 = f.st.submit(request("b", 2), &s2);
  auto j3 = f.st.submit(request("c", 1), &s3);
  CHECK(f.st.job(j1)->state == JobState::launching);
  CHECK(f.st.job(j2)->state == JobState::launching);
  CHECK(s1.launches.size() == 2);
  CHECK(s2.launches.size() == 2);
  CHECK(s1.launches[0].agent_id != s2.launches[0].agent_id);  // each job on one host
  CHECK(s3.launches.empty());
  CHECK(f.st.job(j3)->state == JobState::queued);
  CHECK(f.st.job(j3)->reason == "waiting for 1 free cpu device(s): 0 free of 4 registered");
  CHECK(s1.launches[1].log_path == f.st.job(j1)->run_dir + "/workers/1.log");

  // j1 finishes: j3 is placed on a freed device.
  Actions done;
  for (int r = 0; r < 2; ++r) f.st.register_worker(7, j1, 0, r, "h1", 200 + r, &done);
  CHECK(f.st.job(j1)->state == JobState::running);
  f.st.worker_done(j1, 0, 0, /*drained=*/false, &done);
  CHECK(f.st.job(j1)->state == JobState::running);
  f.st.worker_done(j1, 0, 1, /*drained=*/false, &done);
  CHECK(f.st.job(j1)->state == JobState::succeeded);
  CHECK(f.st.job(j3)->state == JobState::launching);
  REQUIRE(done.launches.size() == 1);
  CHECK(done.launches[0].job_id == j3);
  CHECK(has_state_event(done, j1, "succeeded"));
  CHECK(has_state_event(done, j3, "launching"));
}

TEST_CASE("workers: registration checks protocol, generation, rank and duplicates", "[workers]") {
  Fixture f;
  Actions a;
  auto refused = f.st.register_agent(6, "h1", 1, cpus(2), &a);
  CHECK_FALSE(refused.accepted);
  CHECK(refused.message.find("agent speaks protocol 6, the coordinator speaks protocol 7") !=
        std::string::npos);
  REQUIRE(f.st.register_agent(7, "h1", 1, cpus(2), &a).accepted);
  auto j = f.st.submit(request("w", 1, 2, 1), &a);
  CHECK(f.st.register_worker(7, "nope", 0, 0, "h", 1, &a).refused == "unknown job 'nope'");
  CHECK(f.st.register_worker(7, j, 3, 0, "h", 1, &a).refused.find("stale generation 3") != std::string::npos);
  CHECK(f.st.register_worker(7, j, 0, 2, "h", 1, &a).refused.find("outside") != std::string::npos);
  auto ok = f.st.register_worker(7, j, 0, 1, "h", 1, &a);
  CHECK(ok.refused.empty());
  CHECK(ok.rank == 1);
  CHECK(f.st.register_worker(7, j, 0, 1, "h", 1, &a).refused.find("already registered") != std::string::npos);
  Actions m;
  auto bad = f.st.register_worker(5, j, 0, 0, "h", 1, &m);
  CHECK(bad.refused.find("worker speaks protocol 5, the coordinator speaks protocol 7") != std::string::npos);
  CHECK(f.st.job(j)->state == JobState::failed);
  CHECK(f.st.job(j)->failure == FailureCause::protocol_mismatch);
}

TEST_CASE("failures: a killed worker fails its job by name and stops the others", "[failures]") {
  Fixture f;
  Actions a;
  REQUIRE(f.st.register_agent(7, "h1", 1, cpus(2), &a).accepted);
  auto j = f.st.submit(request("k", 2), &a);
  f.st.worker_launched(j, 0, 0, 300);
  f.st.worker_launched(j, 0, 1, 301);
  f.st.register_worker(7, j, 0, 0, "h1", 300, &a);
  f.st.register_worker(7, j, 0, 1, "h1", 301, &a);
  Actions x;
  f.st.worker_exited(j, 0, 1, 301, -1, 9, &x);
  const Job* job = f.st.job(j);
  CHECK(job->state == JobState::failed);
  CHECK(job->failure == FailureCause::worker_killed);
  CHECK(job->reason.find("rank 1 (pid 301, cpu:1 on h1) was killed by SIGKILL") != std::string::npos);
  REQUIRE(x.aborts.size() == 1);
  CHECK(x.aborts[0].rank == 0);
  REQUIRE(x.kills.size() == 1);
  CHECK(f.st.registry().free("cpu") == 2);
  // Late news about a finished job changes nothing.
  Actions late;
  f.st.worker_lost(j, 0, 0, "gone", &late);
  CHECK(job->failure == FailureCause::worker_killed);
  CHECK(late.kills.empty());
}

TEST_CASE("cancel: running and queued jobs, not finished ones", "[cancel]") {
  Fixture f;
  Actions a;
  REQUIRE(f.st.register_agent(7, "h1", 1, cpus(1), &a).accepted);
  auto j1 = f.st.submit(request("r", 1), &a);
  auto j2 = f.st.submit(request("q", 1), &a);
  f.st.register_worker(7, j1, 0, 0, "h1", 5, &a);
  Actions c;
  std::string why;
  REQUIRE(f.st.cancel(j1, "cancelled by user", &c, &why));
  CHECK(f.st.job(j1)->state == JobState::cancelled);
  CHECK(c.aborts.size() == 1);
  CHECK(c.kills.size() == 1);
  CHECK(f.st.job(j2)->state == JobState::launching);  // took the freed device
  CHECK_FALSE(f.st.cancel(j1, "again", &c, &why));
  CHECK(why == "job " + j1 + " already cancelled");
  CHECK_FALSE(f.st.cancel("zzz", "x", &c, &why));
  CHECK(why == "unknown job 'zzz'");
}

TEST_CASE("agent loss fails the jobs on it", "[failures]") {
  Fixture f;
  Actions a;
  auto r = f.st.register_agent(7, "h1", 42, cpus(1), &a);
  auto j = f.st.submit(request("x", 1), &a);
  Actions l;
  f.st.remove_agent(r.message, &l);
  CHECK(f.st.job(j)->failure == FailureCause::agent_lost);
  CHECK(f.st.job(j)->reason.find("h1 (pid 42) disconnected") != std::string::npos);
  CHECK(f.st.registry().total("cpu") == 0);
}

TEST_CASE("metrics: fp16 steps carry the loss scale, whether the step was skipped, and by how many ranks",
          "[metrics]") {
  MetricsAggregator m(2, 0, "2x1x1");
  StepSample a{0, 4, 2.5, 1e-3, 512, 40.0, std::nan(""), std::nullopt};
  a.loss_scale = 65536.0;
  a.skipped = true;
  StepSample b = a;
  b.rank = 1;
  CHECK_FALSE(m.add(a));
  auto line = m.add(b);
  REQUIRE(line);
  CHECK((*line)["loss_scale"].get<double>() == 65536.0);
  CHECK((*line)["skipped"] == true);
  CHECK((*line)["skipped_ranks"] == 2);
  CHECK((*line)["grad_norm"].is_null());  // a skipped step has no norm: null, not NaN text
  // Without loss scaling (fp32, bf16) the keys are absent.
  auto plain = m.add(StepSample{0, 5, 2.4, 1e-3, 512, 40.0, 1.0, std::nullopt});
  CHECK_FALSE(plain);
  plain = m.add(StepSample{1, 5, 2.4, 1e-3, 512, 40.0, 1.0, std::nullopt});
  REQUIRE(plain);
  CHECK_FALSE(plain->contains("loss_scale"));
  CHECK_FALSE(plain->contains("skipped"));
}

TEST_CASE("metrics: GPU ranks' device memory, the largest rank's, and no keys on the CPU", "[metrics]") {
  MetricsAggregator m(2, 0, "2x1x1");
  StepSample a{0, 7, 2.5, 1e-3, 512, 40.0, 1.0, std::nullopt};
  a.device_bytes = 3000;
  a.device_peak_bytes = 5000;
  StepSample b = a;
  b.rank = 1;
  b.device_bytes = 4000;
  b.device_peak_bytes = 4500;
  CHECK_FALSE(m.add(a));
  auto line = m.add(b);
  REQUIRE(line);
  CHECK((*line)["device_bytes"] == 4000);
  CHECK((*line)["device_peak_bytes"] == 5000);
  CHECK_FALSE(m.add(StepSample{0, 8, 2.4, 1e-3, 512, 40.0, 1.0, std::nullopt}));
  auto cpu = m.add(StepSample{1, 8, 2.4, 1e-3, 512, 40.0, 1.0, std::nullopt});
  REQUIRE(cpu);
  CHECK_FALSE(cpu->contains("device_bytes"));
}

TEST_CASE("metrics: one line per step once every rank reported", "[metrics]") {
  MetricsAggregator m(2, 3, "2x1x1");
  StepSample s0{0, 0, 2.5, 1e-3, 512, 40.0, 1.0, std::nullopt};
  StepSample s1{1, 0, 2.5, 1e-3, 512, 50.0, 1.0, 2.7};
  CHECK_FALSE(m.add(s0));
  CHECK_FALSE(m.add(s0));  // duplicate
  auto line = m.add(s1);
  REQUIRE(line);
  CHECK((*line)["step"] == 0);
  CHECK((*line)["loss"].get<double>() == Approx(2.5));
  CHECK((*line)["step_ms"].get<double>() == Approx(50.0));
  CHECK((*line)["tokens_per_s"].get<double>() == Approx(512 / 0.05));
  CHECK((*line)["val_loss"].get<double>() == Approx(2.7));
  CHECK((*line)["generation"] == 3);
  CHECK((*line)["layout"] == "2x1x1");
  CHECK_FALSE(m.add(s1));                                             // late duplicate of an emitted step
  CHECK_FALSE(m.add(StepSample{5, 1, 0, 0, 0, 0, 0, std::nullopt}));  // outside the world
  CHECK(m.steps_completed() == 1);

  Fixture f;
  Actions a;
  REQUIRE(f.st.register_agent(7, "h1", 1, cpus(1), &a).accepted);
  auto j = f.st.submit(request("m", 1), &a);
  f.st.register_worker(7, j, 0, 0, "h1", 5, &a);
  Actions st;
  f.st.step(j, 0, StepSample{0, 0, 3.0, 1e-3, 64, 10, 1, std::nullopt}, &st);
  REQUIRE(st.events.size() == 1);
  CHECK(st.events[0]["event"] == "step");
  CHECK(st.events[0]["metrics"]["loss"].get<double>() == Approx(3.0));
  auto js = f.st.job_json(*f.st.job(j));
  CHECK(js["steps_done"] == 1);
  CHECK(js.contains("first_step_latency_ms"));
  CHECK(js["control_messages"] == 2);  // registration + one step
}

TEST_CASE("rendezvous: set wakes waiters, namespaces per generation, stale generations refused", "[store]") {
  RendezvousStore s;
  auto ns0 = store_namespace("j", 0, "world");
  auto ns1 = store_namespace("j", 1, "world");
  auto w = s.add_waiter(ns0, "addr/1");
  auto w2 = s.add_waiter(ns0, "addr/2");
  auto woken = s.set(ns0, "addr/1", "10.0.0.1:4000");
  REQUIRE(woken.size() == 1);
  CHECK(woken[0] == w);
  CHECK(s.get(ns0, "addr/1") == std::optional<std::string>("10.0.0.1:4000"));
  CHECK_FALSE(s.get(ns1, "addr/1"));
  CHECK(s.remove_waiter(w2));
  CHECK_FALSE(s.remove_waiter(w));
  s.set(store_namespace("k", 0, "world"), "x", std::string("\0\1", 2));
  s.drop_job("j");
  CHECK(s.size() == 1);
  CHECK(s.get(store_namespace("k", 0, "world"), "x")->size() == 2);

  Fixture f;
  Actions a;
  REQUIRE(f.st.register_agent(7, "h1", 1, cpus(1), &a).accepted);
  auto j = f.st.submit(request("s", 1), &a);
  CHECK(f.st.store_refusal(j, 0).empty());
  CHECK(f.st.store_refusal(j, 1).find("stale generation 1") != std::string::npos);
  CHECK(f.st.store_refusal("nope", 0).find("unknown job") != std::string::npos);
}

TEST_CASE("spec request: layout, device and resolved YAML come from the job spec", "[spec]") {
  auto r = job_request(
      troupe::load_spec(std::string(TROUPE_SOURCE_DIR) + "/configs/layouts/tiny_dp2_pp2_tp1.yaml"));
  CHECK(r.layout.dp == 2);
  CHECK(r.layout.pp == 2);
  CHECK(r.layout.tp == 1);
  CHECK(r.device_kind == "cpu");
  CHECK(r.plan.model.n_layers == 4);
  CHECK(r.total_steps > 0);
  CHECK(troupe::parse_spec(r.spec_yaml, "resolved.yaml").name == r.name);
  CHECK_THROWS_AS(job_request_from_yaml("name: [oops", "bad.yaml"), troupe::SpecError);
}

// ---------------------------------------------------------------- recovery and elasticity

namespace {

// A running job of layout dp x 1 x 1 on two agents of `per_agent` devices each.
struct Running {
  Fixture f;
  std::string a1, a2, job;
  explicit Running(int dp, int per_agent, JobRequest r) {
    Actions a;
    a1 = f.st.register_agent(7, "h1", 1, cpus(per_agent), &a).message;
    a2 = f.st.register_agent(7, "h2", 2, cpus(per_agent), &a).message;
    r.layout = {dp, 1, 1};
    job = f.st.submit(std::move(r), &a);
    f.st.set_checkpoint_finder(
        [](const std::string& root, std::vector<std::string>*) { return root + "/step_000004"; });
    register_all();
  }
  void register_all() {
    Actions a;
    const Job* j = f.st.job(job);
    for (int r = 0; r < static_cast<int>(j->ranks.size()); ++r)
      f.st.register_worker(7, job, j->generation, r, j->ranks[r].host, 100 + r, &a);
  }
  // The survivors of the generation that ended report it and wait (as worker processes do).
  void park_survivors() {
    Actions a;
    const Job& jb = j();
    for (const Survivor& v : std::vector<Survivor>(jb.survivors))
      f.st.worker_failed(job, v.generation, v.rank, FailureCause::aborted, "aborted", &a, true);
  }
  const Job& j() const { return *f.st.job(job); }
};

JobRequest elastic(int max_restarts, int min_devices = 0, int max_devices = 0) {
  JobRequest r = request("e", 1);
  r.max_restarts = max_restarts;
  r.min_devices = min_devices;
  r.max_devices = max_devices;
  r.plan.global_batch = 8;
  r.plan.micro_batch = 1;
  r.total_steps = 1000;
  r.restart_backoff_ms = 100;
  return r;
}

}  // namespace

TEST_CASE("job FSM: recovering sits between running and the next launch", "[fsm][recovery]") {
  CHECK(transition_allowed(JobState::running, JobState::recovering));
  CHECK(transition_allowed(JobState::launching, JobState::recovering));
  CHECK(transition_allowed(JobState::recovering, JobState::launching));
  CHECK(transition_allowed(JobState::recovering, JobState::failed));
  CHECK(transition_allowed(JobState::recovering, JobState::cancelled));
  CHECK_FALSE(transition_allowed(JobState::recovering, JobState::running));
  CHECK_FALSE(transition_allowed(JobState::recovering, JobState::succeeded));
  CHECK_FALSE(transition_allowed(JobState::queued, JobState::recovering));
  CHECK_FALSE(transition_allowed(JobState::succeeded, JobState::recovering));
  CHECK(std::string(to_string(JobState::recovering)) == "recovering");
}

TEST_CASE("recovery: a killed rank aborts every survivor and relaunches generation + 1 from the checkpoint",
          "[recovery]") {
  Running r(2, 2, elastic(2));
  REQUIRE(r.j().state == JobState::running);
  Actions x;
  r.f.st.worker_where(r.job, 0, 0, "step 7: allreduce gradients");
  r.f.st.worker_exited(r.job, 0, 1, 101, -1, 9, &x);
  CHECK(r.j().state == JobState::recovering);
  CHECK(r.j().generation == 1);
  CHECK(r.j().restarts == 1);
  REQUIRE(x.aborts.size() == 1);  // the survivor, at once
  CHECK(x.aborts[0].rank == 0);
  CHECK(x.aborts[0].generation == 0);
  REQUIRE(r.j().failures.size() == 1);
  CHECK(r.j().failures[0]["cause"] == "worker_killed");
  CHECK(r.j().failures[0]["rank"] == 1);
  CHECK(r.j().failures[0]["pid"] == 101);
  CHECK(r.j().failures[0]["host"] == "h1");
  CHECK(x.launches.empty());  // backoff first
  // Old-generation news is dropped.
  Actions late;
  r.f.st.worker_failed(r.job, 0, 0, FailureCause::aborted, "aborted", &late);
  CHECK(r.j().state == JobState::recovering);
  Actions t;
  r.f.st.tick(now_ms() + 1000, &t);
  CHECK(r.j().state == JobState::launching);
  REQUIRE(t.launches.size() == 2);
  CHECK(t.launches[0].generation == 1);
  CHECK(r.j().resume_from == r.j().run_dir + "/ckpt/step_000004");
  CHECK(r.j().layout.str() == "2x1x1");
  CHECK(has_state_event(t, r.job, "launching"));
  r.register_all();
  CHECK(r.j().state == JobState::running);
}

TEST_CASE("survivors: the killed rank alone is relaunched, its peers keep their process, device and rank",
          "[recovery][survivors]") {
  Running r(4, 2, elastic(2));
  REQUIRE(r.j().state == JobState::running);
  Actions x;
  r.f.st.worker_exited(r.job, 0, 2, 102, -1, 9, &x);
  CHECK(r.j().state == JobState::recovering);
  // Every survivor is aborted; nothing of theirs is killed; the killed rank's devices are free.
  CHECK(x.aborts.size() == 3);
  CHECK(x.kills.empty());  // the killed rank is gone already
  REQUIRE(r.j().survivors.size() == 3);
  CHECK(r.f.st.registry().free("cpu") == 1);
  // Until they report the end of their generation, the relaunch waits for them.
  Actions early;
  r.f.st.tick(now_ms() + 150, &early);
  CHECK(r.j().state == JobState::recovering);
  r.park_survivors();
  Actions t;
  r.f.st.tick(now_ms() + 1000, &t);
  CHECK(r.j().state == JobState::launching);
  REQUIRE(t.launches.size() == 1);
  CHECK(t.launches[0].rank == 2);
  CHECK(t.launches[0].generation == 1);
  REQUIRE(t.reassigns.size() == 3);
  for (const auto& g : t.reassigns) {
    CHECK(g.from_generation == 0);
    CHECK(g.generation == 1);
    CHECK(g.rank != 2);
  }
  CHECK(r.j().ranks[0].registered);
  CHECK(r.j().ranks[0].pid == 100);
  CHECK(r.j().ranks[0].launch_generation == 0);
  CHECK(r.j().ranks[2].launch_generation == 1);
  CHECK(r.j().resume_from == r.j().run_dir + "/ckpt/step_000004");
  CHECK(r.j().survivors.empty());
  CHECK(r.f.st.registry().free("cpu") == 0);
  Actions reg;
  CHECK(r.f.st.register_worker(7, r.job, 1, 2, "h2", 200, &reg).refused.empty());
  CHECK(r.j().state == JobState::running);

  // A rank of generation 0's launch that is no survivor now: its exit changes nothing.
  Actions stale;
  r.f.st.worker_exited(r.job, 0, 2, 102, -1, 9, &stale);
  CHECK(stale.events.empty());
  CHECK(r.j().state == JobState::running);
  // The agent knows a survivor by its launch (generation 0): its death fails generation 1 by name.
  Actions d;
  r.f.st.worker_exited(r.job, 0, 1, 101, -1, 9, &d);
  CHECK(r.j().state == JobState::recovering);
  REQUIRE(r.j().failures.size() == 2);
  CHECK(r.j().failures[1]["generation"] == 1);
  CHECK(r.j().failures[1]["rank"] == 1);
  CHECK(r.j().failures[1]["cause"] == "worker_killed");
}

TEST_CASE("survivors: a stay nobody keeps is released at once, a survivor whose loss comes late is dropped",
          "[recovery][survivors]") {
  // A cancelled job's ranks report their abort with `stays`: each is told to exit.
  Running r(2, 2, elastic(2));
  Actions c;
  std::string why;
  REQUIRE(r.f.st.cancel(r.job, "cancelled by user", &c, &why));
  Actions x;
  r.f.st.worker_failed(r.job, 0, 0, FailureCause::aborted, "aborted", &x, true);
  REQUIRE(x.releases.size() == 1);
  CHECK(x.releases[0].rank == 0);
  CHECK(x.releases[0].reason == "job cancelled");

  // A survivor whose lost connection is noticed after its generation ended: released, killed,
  // its device freed; the relaunch replaces it.
  Running q(2, 2, elastic(2));
  Actions y;
  q.f.st.worker_exited(q.job, 0, 1, 101, -1, 9, &y);
  REQUIRE(q.j().survivors.size() == 1);
  const int free_before = q.f.st.registry().free("cpu");
  Actions l;
  q.f.st.worker_lost(q.job, 0, 0, "connection lost", &l);
  CHECK(q.j().survivors.empty());
  CHECK(l.releases.size() == 1);
  CHECK(l.kills.size() == 1);
  CHECK(q.f.st.registry().free("cpu") == free_before + 1);

  // A rank that failed by its own fault cannot stay, whatever it says.
  Running e(2, 2, elastic(2));
  Actions f;
  e.f.st.worker_failed(e.job, 0, 0, FailureCause::engine_error, "kernel failed", &f, true);
  REQUIRE(e.j().state == JobState::recovering);  // at once: no peer report to wait on
  CHECK(e.j().survivors.size() == 1);
  CHECK(e.j().survivors[0].rank == 1);
}

TEST_CASE("survivors: a rank reporting a peer's failure stays, one that never reports is replaced",
          "[recovery][survivors]") {
  Running r(2, 2, elastic(2));
  Actions x;
  // Rank 0 sees its peer fail through the data plane first and stays for the next generation.
  // Its report names no culprit: the failure waits a moment for one.
  r.f.st.worker_failed(r.job, 0, 0, FailureCause::comm_peer_lost, "peer lost", &x, true);
  CHECK(r.j().state == JobState::running);
  Actions none;
  r.f.st.tick(now_ms(), &none);
  CHECK(r.j().state == JobState::running);
  Actions g;
  r.f.st.tick(now_ms() + 1000, &g);
  REQUIRE(r.j().state == JobState::recovering);
  CHECK(r.j().failures[0]["rank"] == 0);
  CHECK(r.j().failures[0]["cause"] == "comm_peer_lost");
  REQUIRE(r.j().survivors.size() == 2);  // nobody is blamed yet
  CHECK(r.j().survivors[0].parked);
  CHECK_FALSE(r.j().survivors[1].parked);
  // Rank 1 never reports (a stopped process): past the wait it is released, killed and replaced.
  Actions t;
  r.f.st.tick(now_ms() + 5000, &t);
  CHECK(r.j().state == JobState::launching);
  REQUIRE(t.releases.size() == 1);
  CHECK(t.releases[0].rank == 1);
  bool killed = false;
  for (const auto& k : t.kills)
    for (size_t i = 0; i < k.ranks.size(); ++i) killed = killed || (k.ranks[i] == 1 && k.generations[i] == 0);
  CHECK(killed);
  REQUIRE(t.launches.size() == 1);
  CHECK(t.launches[0].rank == 1);
  REQUIRE(t.reassigns.size() == 1);
  CHECK(t.reassigns[0].rank == 0);
}

TEST_CASE("survivors: a peer's report waits for the culprit's, which names the failure",
          "[recovery][survivors]") {
  Running r(2, 2, elastic(2));
  Actions x;
  r.f.st.worker_failed(r.job, 0, 0, FailureCause::comm_peer_lost, "peer lost", &x, true);
  r.f.st.worker_exited(r.job, 0, 1, 101, -1, 9, &x);
  REQUIRE(r.j().state == JobState::recovering);
  REQUIRE(r.j().failures.size() == 1);
  CHECK(r.j().failures[0]["rank"] == 1);
  CHECK(r.j().failures[0]["cause"] == "worker_killed");
  REQUIRE(r.j().survivors.size() == 1);
  CHECK(r.j().survivors[0].rank == 0);
  CHECK(r.j().survivors[0].parked);  // its report is in hand
  Actions t;
  r.f.st.tick(now_ms() + 1000, &t);
  CHECK(r.j().failures.size() == 1);  // the peer's report made no second failure
  REQUIRE(t.launches.size() == 1);
  CHECK(t.launches[0].rank == 1);
  REQUIRE(t.reassigns.size() == 1);
}

TEST_CASE("survivors: the relaunch continues from in-memory snapshots when every place can be filled",
          "[recovery][survivors][memory]") {
  // 4x1x1 on two agents of 2: rank 2 dies after every rank reported step 6.
  JobRequest req = elastic(2);
  Running r(4, 2, req);
  Actions s;
  for (int rank = 0; rank < 4; ++rank)
    r.f.st.step(r.job, 0, StepSample{rank, 6, 2.0, 1e-3, 64, 10.0, 1.0, {}}, &s);
  REQUIRE(r.j().last_step == 6);
  Actions x;
  r.f.st.worker_exited(r.job, 0, 2, 102, -1, 9, &x);
  Actions p;
  for (int rank : {0, 1, 3})
    r.f.st.worker_failed(r.job, 0, rank, FailureCause::aborted, "aborted", &p, true,
                         MemoryHeld{{8, 7}, true, {}, -1});
  Actions t;
  r.f.st.tick(now_ms() + 1000, &t);
  REQUIRE(r.j().state == JobState::launching);
  // Step 7 is the newest step every rank completed (the last one reported: 6).
  CHECK(r.j().memory_step == 7);
  // Rank 2's data-parallel group is every rank: the lowest survivor sends to all.
  REQUIRE(r.j().heal_roots.size() == 4);
  for (int h : r.j().heal_roots) CHECK(h == 0);
}

TEST_CASE("buddies: a replicated job whose replicas sit on other agents has none, and heals from a replica",
          "[recovery][survivors][memory]") {
  // 4x1x1 with train.zero 0 on two agents of 2: each rank's replicas include the other agent's.
  JobRequest req = elastic(2);
  req.replicated = true;
  Running r(4, 2, req);
  CHECK(r.j().buddy_shift == 0);
  Actions s;
  for (int rank = 0; rank < 4; ++rank)
    r.f.st.step(r.job, 0, StepSample{rank, 7, 2.0, 1e-3, 64, 10.0, 1.0, {}}, &s);
  Actions x;
  r.f.st.worker_exited(r.job, 0, 3, 103, -1, 9, &x);
  Actions p;
  for (int rank : {0, 1, 2})
    r.f.st.worker_failed(r.job, 0, rank, FailureCause::aborted, "aborted", &p, true,
                         MemoryHeld{{8, 7}, true, {}, -1});
  Actions t;
  r.f.st.tick(now_ms() + 1000, &t);
  REQUIRE(r.j().state == JobState::launching);
  CHECK(r.j().memory_step == 8);  // every rank holds its own snapshot of the last step: none again
  for (int h : r.j().heal_roots) CHECK(h == 0);

  // Sharded state (train.zero 1 or 2) is no replica's: buddies on the other agent.
  JobRequest sharded = elastic(2);
  Running z(4, 2, sharded);
  CHECK(z.j().buddy_shift == 2);
  // Replicas that all share their rank's agent (2x2x1 spread on two agents: ranks 0 and 2 on
  // h1, 1 and 3 on h2) keep buddies, on the other agent.
  Fixture f;
  Actions a;
  REQUIRE(f.st.register_agent(7, "h1", 1, cpus(2), &a).accepted);
  REQUIRE(f.st.register_agent(7, "h2", 2, cpus(2), &a).accepted);
  JobRequest spread = request("s", 2, 2);
  spread.replicated = true;
  spread.spread = true;
  const std::string id = f.st.submit(std::move(spread), &a);
  const Job& j = *f.st.job(id);
  REQUIRE(j.ranks.size() == 4);
  REQUIRE(j.ranks[0].device.agent_id == j.ranks[2].device.agent_id);
  CHECK(j.buddy_shift == 1);
}

namespace {

// 4x1x1 on two agents of 2 (ranks 0, 1 on h1; 2, 3 on h2: every buddy sits on the other agent,
// shift 2): every rank reports step 7, then `victims` are SIGKILLed.
void killed_after_step_7(Running& r, std::initializer_list<int> victims) {
  REQUIRE(r.j().buddy_shift == 2);
  Actions s;
  for (int rank = 0; rank < 4; ++rank)
    r.f.st.step(r.job, 0, StepSample{rank, 7, 2.0, 1e-3, 64, 10.0, 1.0, {}}, &s);
  Actions x;
  for (int v : victims) r.f.st.worker_exited(r.job, 0, v, 100 + v, -1, 9, &x);
}

// The relaunch after the failure (the clock past its backoff) resumes from the checkpoint, and
// events.log says why the in-memory snapshots are not used.
void memory_not_used_because(Running& r, const std::string& why) {
  Actions t;
  r.f.st.tick(now_ms() + 1000, &t);
  REQUIRE(r.j().state == JobState::launching);
  CHECK(r.j().memory_step == -1);
  bool named = false;
  for (const auto& e : t.events)
    named =
        named || (e["event"] == "log" &&
                  e["message"].get<std::string>().find("in-memory snapshots not used") != std::string::npos &&
                  e["message"].get<std::string>().find(why) != std::string::npos);
  CHECK(named);
}

}  // namespace

TEST_CASE("survivors: in-memory snapshots are not used, by name, when a place cannot be filled from them",
          "[recovery][survivors][memory]") {
  struct Case {
    std::vector<int64_t> held;
    bool replicated;
    std::string why;
  };
  for (const Case& c : {Case{{}, true, "holds none"}, Case{{9, 8}, true, "no longer holds step 7"},
                        Case{{8, 7}, false, "hold sharded state (train.zero)"}}) {
    INFO(c.why);
    Running r(2, 2, elastic(2));
    Actions s;
    for (int rank = 0; rank < 2; ++rank)
      r.f.st.step(r.job, 0, StepSample{rank, 6, 2.0, 1e-3, 64, 10.0, 1.0, {}}, &s);
    Actions x;
    r.f.st.worker_exited(r.job, 0, 1, 101, -1, 9, &x);
    r.f.st.worker_failed(r.job, 0, 0, FailureCause::aborted, "aborted", &x, true,
                         MemoryHeld{c.held, c.replicated, {}, -1});
    memory_not_used_because(r, c.why);
  }
}

TEST_CASE("survivors: a new rank receives its buddy's copy, the step steps back when the newest is in flight",
          "[recovery][survivors][memory][buddy]") {
  Running r(4, 2, elastic(2));
  killed_after_step_7(r, {1});
  Actions p;
  // Sharded state (no replica to heal from). Rank 3 holds rank 1's copies; the copy of step 8
  // was in flight when rank 1 died, so it holds step 7 only.
  for (int rank : {0, 2, 3}) {
    MemoryHeld m{{8, 7}, false, {8, 7}, (rank + 2) % 4};
    if (rank == 3) m.copies = {7};
    r.f.st.worker_failed(r.job, 0, rank, FailureCause::aborted, "aborted", &p, true, m);
  }
  Actions t;
  r.f.st.tick(now_ms() + 1000, &t);
  REQUIRE(r.j().state == JobState::launching);
  CHECK(r.j().memory_step == 7);
  REQUIRE(r.j().heal_from_buddy.size() == 4);
  CHECK(r.j().heal_from_buddy == std::vector<char>{0, 1, 0, 0});
  for (int h : r.j().heal_roots) CHECK(h == -1);
  CHECK(r.j().buddy_shift == 2);  // the copies held follow the ring: it stays
}

TEST_CASE("survivors: a rank whose buddy died with it resumes from the checkpoint, by name",
          "[recovery][survivors][memory][buddy]") {
  Running r(4, 2, elastic(2));
  killed_after_step_7(r, {1, 3});
  Actions p;
  for (int rank : {0, 2})
    r.f.st.worker_failed(r.job, 0, rank, FailureCause::aborted, "aborted", &p, true,
                         MemoryHeld{{8, 7}, false, {8, 7}, (rank + 2) % 4});
  memory_not_used_because(r, "rank 1: its buddy, rank 3, failed too (lost buddy)");

  // Data 3 on agents of 2 and 1 devices: shift 1 (no shift puts every buddy on another agent).
  // Ranks 0 and 2 die; rank 0's copy of step 8 was still in flight to rank 1, rank 2's buddy is
  // rank 0. The lost buddy is named, not the copy in flight, whichever rank comes first.
  Fixture f;
  Actions a;
  f.st.register_agent(7, "h1", 1, cpus(2), &a);
  f.st.register_agent(7, "h2", 2, cpus(1), &a);
  JobRequest req = elastic(2);
  req.layout = {3, 1, 1};
  req.plan.global_batch = 6;
  const std::string job = f.st.submit(req, &a);
  f.st.set_checkpoint_finder(
      [](const std::string& root, std::vector<std::string>*) { return root + "/step_000004"; });
  for (int rank = 0; rank < 3; ++rank) f.st.register_worker(7, job, 0, rank, "h", 100 + rank, &a);
  REQUIRE(f.st.job(job)->buddy_shift == 1);
  for (int rank = 0; rank < 3; ++rank)
    f.st.step(job, 0, StepSample{rank, 7, 2.0, 1e-3, 64, 10.0, 1.0, {}}, &a);
  for (int v : {0, 2}) f.st.worker_exited(job, 0, v, 100 + v, -1, 9, &a);
  f.st.worker_failed(job, 0, 1, FailureCause::aborted, "aborted", &a, true,
                     MemoryHeld{{8, 7}, false, {7}, 0});
  Actions t;
  f.st.tick(now_ms() + 1000, &t);
  REQUIRE(f.st.job(job)->state == JobState::launching);
  bool named = false;
  for (const auto& e : t.events)
    named = named || (e["event"] == "log" &&
                      e["message"].get<std::string>().find(
                          "rank 2: its buddy, rank 0, failed too (lost buddy)") != std::string::npos);
  CHECK(named);
}

TEST_CASE("survivors: a layout change or the job's end releases them", "[recovery][survivors]") {
  // Shrink: an agent lost with two ranks, min_devices 2: data 4 -> 2, nobody keeps a place.
  Running r(4, 2, elastic(2, 2));
  Actions x;
  r.f.st.remove_agent(r.a2, &x);
  r.park_survivors();
  REQUIRE(r.j().survivors.size() == 2);
  Actions t;
  r.f.st.tick(now_ms() + 1000, &t);
  CHECK(r.j().layout.str() == "2x1x1");
  CHECK(t.releases.size() == 2);
  CHECK(t.reassigns.empty());
  CHECK(t.launches.size() == 2);

  // Cancelled while recovering: the survivors are told and killed, their devices freed.
  Running q(2, 2, elastic(2));
  Actions y;
  q.f.st.worker_exited(q.job, 0, 1, 101, -1, 9, &y);
  REQUIRE(q.j().survivors.size() == 1);
  Actions c;
  std::string why;
  REQUIRE(q.f.st.cancel(q.job, "cancelled by user", &c, &why));
  REQUIRE(c.releases.size() == 1);
  CHECK(c.releases[0].rank == 0);
  CHECK(q.j().survivors.empty());
  CHECK(q.f.st.registry().free("cpu") == 4);
}

TEST_CASE(
    "recovery: the backoff doubles over generations that fail before a step and starts again after one "
    "trains",
    "[recovery]") {
  Running r(1, 1, elastic(10));
  int n = 0;
  // Fails the current generation (after a step when `trained`) and relaunches it; true when
  // its relaunch was set `backoff_ms` after the failure (the failure's own clock reading lies
  // between the two read here).
  auto waits = [&](bool trained, double backoff_ms) {
    Actions a;
    if (trained)
      r.f.st.step(r.job, r.j().generation, StepSample{0, r.j().last_step + 1, 2.0, 1e-3, 64, 10.0, 1.0, {}},
                  &a);
    const double before = now_ms();
    // (Each failure its own: the same one twice before a step is a setup error, not restarted.)
    r.f.st.worker_failed(r.job, r.j().generation, 0, FailureCause::engine_error,
                         "kernel failed " + std::to_string(++n), &a);
    const double after = now_ms();
    REQUIRE(r.j().state == JobState::recovering);
    const double at = r.j().relaunch_at_ms;
    Actions t;
    r.f.st.tick(at + 1, &t);
    REQUIRE(r.j().state == JobState::launching);
    r.register_all();
    REQUIRE(r.j().state == JobState::running);
    return at >= before + backoff_ms && at <= after + backoff_ms;
  };
  // 100 ms first (elastic() sets it), then 200, 400 while no generation steps ...
  CHECK(waits(true, 100));
  CHECK(waits(false, 200));
  CHECK(waits(false, 400));
  // ... and 100 ms again once one has trained.
  CHECK(waits(true, 100));
}

TEST_CASE("recovery: without a checkpoint the relaunch starts from scratch (or the submitted resume)",
          "[recovery]") {
  Running r(1, 1, elastic(1));
  r.f.st.set_checkpoint_finder([](const std::string&, std::vector<std::string>* skipped) {
    skipped->push_back("step_000002: manifest.json is missing");
    return std::string();
  });
  Actions x;
  r.f.st.worker_failed(r.job, 0, 0, FailureCause::engine_error, "kernel failed", &x);
  CHECK(r.j().state == JobState::recovering);
  Actions t;
  r.f.st.tick(now_ms() + 1000, &t);
  CHECK(r.j().state == JobState::launching);
  CHECK(r.j().resume_from.empty());
  bool logged = false;
  for (const auto& e : t.events)
    logged = logged || e.value("message", "").find("manifest.json") != std::string::npos;
  CHECK(logged);
}

TEST_CASE("recovery: max_restarts exceeded fails the job with its cause", "[recovery]") {
  Running r(1, 1, elastic(1));
  Actions x;
  r.f.st.worker_exited(r.job, 0, 0, 100, -1, 9, &x);
  REQUIRE(r.j().state == JobState::recovering);
  Actions t;
  r.f.st.tick(now_ms() + 1000, &t);
  r.register_all();
  Actions y;
  r.f.st.worker_exited(r.job, 1, 0, 100, 3, 0, &y);
  CHECK(r.j().state == JobState::failed);
  CHECK(r.j().failure == FailureCause::worker_exited);
  CHECK(r.j().reason.find("exited with code 3") != std::string::npos);
  CHECK(r.j().reason.find("after 1 restart(s); fault.max_restarts = 1") != std::string::npos);
  CHECK(r.f.st.registry().free("cpu") == 2);
}

TEST_CASE("recovery: invalid specs and full disks are not retried", "[recovery]") {
  for (FailureCause cause : {FailureCause::invalid_spec, FailureCause::disk_full}) {
    Running r(1, 1, elastic(3));
    Actions x;
    r.f.st.worker_failed(r.job, 0, 0, cause, "bad", &x);
    CHECK(r.j().state == JobState::failed);
    CHECK(r.j().failure == cause);
    CHECK(r.j().restarts == 0);
    CHECK(r.j().reason == std::string(to_string(cause)) + ": rank 0: bad");
    // The failure is recorded like any other (the actor removes partial checkpoints on disk_full).
    REQUIRE(r.j().failures.size() == 1);
    CHECK(r.j().failures[0]["cause"] == to_string(cause));
    bool announced = false;
    for (const auto& e : x.events)
      announced = announced || (e["event"] == "failure" && e["cause"] == to_string(cause));
    CHECK(announced);
  }
}

TEST_CASE("workers: news of another generation or a rank outside the world changes nothing", "[workers]") {
  Running r(2, 2, elastic(3));
  const int64_t messages = r.j().control_messages;
  Actions x;
  r.f.st.worker_failed(r.job, 1, 0, FailureCause::engine_error, "old", &x);  // not yet a generation
  r.f.st.worker_failed(r.job, 0, 2, FailureCause::engine_error, "no such rank", &x);
  r.f.st.worker_failed(r.job, 0, -1, FailureCause::engine_error, "no such rank", &x);
  r.f.st.worker_done(r.job, 0, 5, /*drained=*/false, &x);
  r.f.st.worker_lost(r.job, 0, 9, "gone", &x);
  r.f.st.worker_exited(r.job, 0, 7, 1, 0, 9, &x);
  r.f.st.worker_where(r.job, 0, 3, "nowhere");
  r.f.st.worker_launched(r.job, 0, 4, 99);
  r.f.st.step(r.job, 0, StepSample{6, 0, 2.0, 1e-3, 64, 10.0, 1.0, {}}, &x);
  r.f.st.worker_failed("nope", 0, 0, FailureCause::engine_error, "unknown job", &x);
  CHECK(r.j().state == JobState::running);
  CHECK(r.j().failures.empty());
  CHECK(r.j().control_messages == messages);
  CHECK(x.events.empty());
  CHECK(x.aborts.empty());
  // A job that ended takes no more results.
  Actions c;
  REQUIRE(r.f.st.cancel(r.job, "by the user", &c, nullptr));
  r.f.st.worker_failed(r.job, 0, 0, FailureCause::engine_error, "late", &c);
  r.f.st.worker_done(r.job, 0, 1, /*drained=*/false, &c);
  CHECK(r.j().state == JobState::cancelled);
  CHECK(r.j().failures.empty());
}

TEST_CASE("recovery: an agent lost shrinks the data dimension within min_devices", "[recovery][elastic]") {
  Running r(4, 2, elastic(2, /*min_devices=*/2));
  REQUIRE(r.j().ranks.size() == 4);
  Actions x;
  r.f.st.remove_agent(r.a2, &x);
  CHECK(r.j().state == JobState::recovering);
  CHECK(r.j().failures.back()["cause"] == "agent_lost");
  Actions t;
  r.f.st.tick(now_ms() + 1000, &t);
  CHECK(r.j().state == JobState::launching);
  CHECK(r.j().layout.str() == "2x1x1");
  CHECK(t.launches.size() == 2);
}

TEST_CASE("where polls: every rank at least each 500 ms up to 2,045 ranks, then 4,096 polls a second in all",
          "[recovery][where]") {
  CHECK(where_polls_per_tick(1) == 1);
  CHECK(where_round_ms(1) == 100);
  CHECK(where_round_ms(8) == 400);  // 2 a tick: at most 500 ms
  CHECK(where_round_ms(2045) == 500);
  CHECK(where_round_ms(2048) == 600);
  CHECK(where_polls_per_tick(4096) == 409);
  CHECK(where_round_ms(4096) == 1100);
  CHECK(where_round_ms(16384) == 4100);
}

TEST_CASE(
    "recovery: a wait for devices is told as its count changes, at most once a second, the last one too",
    "[recovery][elastic]") {
  JobRequest req = elastic(2);  // min_devices 0 = the planned 4
  req.restart_backoff_ms = 0;
  Running r(4, 2, req);
  auto told = [](const Actions& a, std::vector<std::string>* out) {
    for (const auto& e : a.events)
      if (e["event"] == "waiting") out->push_back(e["reason"].get<std::string>());
  };
  std::vector<std::string> events;
  const double t_start = now_ms();
  Actions x;
  r.f.st.remove_agent(r.a2, &x);
  told(x, &events);
  r.park_survivors();
  // Agents of one device come and go, ten times: each changes the count of free devices (2, 3,
  // 2, ...), none makes the 4 the job needs. Status says the latest count at once; an event
  // tells a change at most once a second (the clock here is the wall clock: the bound below
  // counts the seconds that really passed).
  for (int i = 0; i < 10; ++i) {
    Actions g;
    auto reg = r.f.st.register_agent(7, "h" + std::to_string(10 + i), 100 + i, cpus(1), &g);
    REQUIRE(reg.accepted);
    told(g, &events);
    CHECK(r.j().reason.find("waiting for devices: 3 cpu free") != std::string::npos);
    if (i == 9) break;  // the last one stays
    Actions l;
    r.f.st.remove_agent(reg.message, &l);
    told(l, &events);
    CHECK(r.j().reason.find("waiting for devices: 2 cpu free") != std::string::npos);
  }
  CHECK(r.j().state == JobState::recovering);
  const double elapsed_s = (now_ms() - t_start) / 1000;
  CHECK(events.size() <= size_t(1 + elapsed_s + 1));
  // The tick tells the last count within the second, once.
  Actions t;
  r.f.st.tick(now_ms() + 1100, &t);
  told(t, &events);
  REQUIRE(!events.empty());
  CHECK(events.back().find("waiting for devices: 3 cpu free") != std::string::npos);
  Actions u;
  r.f.st.tick(now_ms() + 5000, &u);
  std::vector<std::string> later;
  told(u, &later);
  CHECK(later.empty());
}

TEST_CASE("scheduling: a queued job's wait is told as agents come, at most once a second, the last one too",
          "[scheduling]") {
  Fixture f;
  Actions a;
  const std::string job = f.st.submit(request("big", 12), &a);
  REQUIRE(f.st.job(job)->state == JobState::queued);
  auto told = [&](const Actions& x, std::vector<std::string>* out) {
    for (const auto& e : x.events)
      if (e["event"] == "waiting" && e["job"] == job) out->push_back(e["reason"].get<std::string>());
  };
  std::vector<std::string> events;
  told(a, &events);
  // Eleven agents of one device register, one by one (a cluster starting): each changes the
  // free count, none is enough. Status has the latest at once; the events at most one a second
  // of the time that really passed.
  const double t_start = now_ms();
  for (int i = 0; i < 11; ++i) {
    Actions g;
    REQUIRE(f.st.register_agent(7, "h" + std::to_string(i), 100 + i, cpus(1), &g).accepted);
    told(g, &events);
  }
  CHECK(f.st.job(job)->state == JobState::queued);
  const std::string last = f.st.job(job)->reason;
  CHECK(last.find("11 free") != std::string::npos);
  const double elapsed_s = (now_ms() - t_start) / 1000;
  CHECK(events.size() <= size_t(1 + elapsed_s + 1));
  Actions t;
  f.st.tick(now_ms() + 1100, &t);
  told(t, &events);
  REQUIRE(!events.empty());
  CHECK(events.back() == last);
  Actions u;
  f.st.tick(now_ms() + 5000, &u);
  std::vector<std::string> later;
  told(u, &later);
  CHECK(later.empty());
  // The twelfth places it.
  Actions p;
  REQUIRE(f.st.register_agent(7, "h11", 111, cpus(1), &p).accepted);
  CHECK(f.st.job(job)->state == JobState::launching);
}

TEST_CASE("recovery: below min_devices the job waits for replacements, then fails at the deadline",
          "[recovery][elastic]") {
  JobRequest req = elastic(2);  // min_devices 0 = the planned 4
  req.restart_backoff_ms = 0;
  Running r(4, 2, req);
  Actions x;
  r.f.st.remove_agent(r.a2, &x);
  r.park_survivors();
  double t0 = now_ms() + 1000;
  Actions t;
  r.f.st.tick(t0, &t);
  CHECK(r.j().state == JobState::recovering);
  CHECK(r.j().reason.find("waiting for devices: 2 cpu free, the job needs 4") != std::string::npos);
  // A replacement agent arrives: the job relaunches on it at full size.
  Actions g;
  r.f.st.register_agent(7, "h3", 3, cpus(2), &g);
  CHECK(r.j().state == JobState::launching);
  CHECK(r.j().layout.str() == "4x1x1");

  Running q(4, 2, elastic(2));
  Actions y;
  q.f.st.remove_agent(q.a2, &y);
  Actions late;
  q.f.st.tick(now_ms() + 1000 + q.j().request.replacement_wait_ms + 1000, &late);
  CHECK(q.j().state == JobState::failed);
  CHECK(q.j().failure == FailureCause::no_devices);
}

TEST_CASE("recovery: the data size keeps global_batch divisible by data x micro_batch",
          "[recovery][elastic]") {
  JobRequest req = elastic(2, 1);
  req.plan.global_batch = 12;
  req.plan.micro_batch = 2;  // data 3 divides (12 % 6 == 0), data 4 does not (12 % 8 != 0)
  Running r(3, 3, req);
  Actions x;
  r.f.st.worker_exited(r.job, 0, 0, 100, -1, 9, &x);
  r.park_survivors();
  // The released devices are free again: data 3 fits.
  Actions t;
  r.f.st.tick(now_ms() + 1000, &t);
  CHECK(r.j().layout.dp == 3);
  CHECK(r.f.st.scale(r.job, 4, &t, nullptr) == false);  // launching, not running
  r.register_all();
  std::string why;
  CHECK_FALSE(r.f.st.scale(r.job, 4, &t, &why));
  CHECK(why == "data 4 cannot be planned: global_batch / data = 3 is not a multiple of micro_batch 2");
}

TEST_CASE("watchdog: a running job with no step within step_timeout fails over naming where ranks are",
          "[recovery][watchdog]") {
  JobRequest req = elastic(1);
  req.step_timeout_ms = 5000;
  Running r(2, 2, req);
  r.f.st.worker_where(r.job, 0, 0, "step 3: allreduce gradients (bucket 1)");
  r.f.st.worker_where(r.job, 0, 1, "step 3: backward micro-batch 2");
  Actions quiet;
  r.f.st.tick(now_ms() + 1000, &quiet);
  CHECK(r.j().state == JobState::running);
  Actions x;
  r.f.st.tick(now_ms() + 6000, &x);
  CHECK(r.j().state == JobState::recovering);
  const auto& f = r.j().failures.back();
  CHECK(f["cause"] == "step_timeout");
  std::string msg = f["message"];
  CHECK(msg.find("rank 0 (pid 100 on h1): step 3: allreduce gradients (bucket 1)") != std::string::npos);
  CHECK(msg.find("rank 1 (pid 101 on h1): step 3: backward micro-batch 2") != std::string::npos);
  CHECK(x.aborts.size() == 2);
}

TEST_CASE("watchdog: a rank moving through evaluation batches is progress, a rank stuck in one is not",
          "[recovery][watchdog]") {
  JobRequest req = elastic(1);
  req.step_timeout_ms = 5000;
  Running r(1, 1, req);
  const double t0 = now_ms();
  // An evaluation longer than the limit, batch after batch: the job keeps running.
  r.f.st.worker_where(r.job, 0, 0, "eval batch 0", t0 + 1000);
  r.f.st.worker_where(r.job, 0, 0, "eval batch 1", t0 + 4000);
  r.f.st.worker_where(r.job, 0, 0, "eval batch 2", t0 + 8000);
  Actions a;
  r.f.st.tick(t0 + 12000, &a);
  CHECK(r.j().state == JobState::running);
  // The same batch again is no progress: stuck in it, the rank is caught.
  r.f.st.worker_where(r.job, 0, 0, "eval batch 2", t0 + 12500);
  Actions b;
  r.f.st.tick(t0 + 13500, &b);
  REQUIRE(r.j().state == JobState::recovering);
  CHECK(std::string(r.j().failures.back()["message"]).find("eval batch 2") != std::string::npos);
  // Inside a training step a moving "where" is not progress: only a completed step is.
  Running q(1, 1, req);
  const double t1 = now_ms();
  q.f.st.worker_where(q.job, 0, 0, "step 3: forward micro-batch 0", t1 + 1000);
  q.f.st.worker_where(q.job, 0, 0, "step 3: backward micro-batch 0", t1 + 4000);
  Actions c;
  q.f.st.tick(t1 + 6000, &c);
  CHECK(q.j().state == JobState::recovering);
}

TEST_CASE("watchdog: derived limit is max(10 s, 20 x the median step time)", "[watchdog]") {
  Running r(1, 1, elastic(0));
  Actions a;
  CHECK(r.f.st.step_timeout_ms(r.j()) == 120000);  // nothing measured yet: start-up bound
  for (int s = 0; s < 5; ++s) r.f.st.step(r.job, 0, StepSample{0, s, 2.0, 1e-3, 64, 1000.0, 1.0, {}}, &a);
  CHECK(r.f.st.step_timeout_ms(r.j()) == Approx(20000));
  Running q(1, 1, elastic(0));
  for (int s = 0; s < 5; ++s) q.f.st.step(q.job, 0, StepSample{0, s, 2.0, 1e-3, 64, 5.0, 1.0, {}}, &a);
  CHECK(q.f.st.step_timeout_ms(q.j()) == Approx(10000));
}

TEST_CASE("scale: drain at a step boundary, relaunch at the new size from the drain checkpoint",
          "[elastic]") {
  Running r(2, 2, elastic(0, 1, 4));
  Actions a;
  for (int s = 0; s < 3; ++s)
    for (int k = 0; k < 2; ++k) r.f.st.step(r.job, 0, StepSample{k, s, 2.0, 1e-3, 64, 10.0, 1.0, {}}, &a);
  std::string why;
  Actions x;
  CHECK_FALSE(r.f.st.scale(r.job, 8, &x, &why));
  CHECK(why.find("not enough free devices") != std::string::npos);
  REQUIRE(r.f.st.scale(r.job, 1, &x, &why));
  REQUIRE(x.drains.size() == 2);
  int64_t at = x.drains[0].step;
  CHECK(at > 2);
  CHECK(r.j().drain_step == at);
  CHECK_FALSE(r.f.st.scale(r.job, 4, &x, &why));  // one resize at a time
  Actions d;
  r.f.st.worker_done(r.job, 0, 0, /*drained=*/true, &d);
  CHECK(r.j().state == JobState::running);
  r.f.st.worker_done(r.job, 0, 1, /*drained=*/true, &d);
  CHECK(r.j().state == JobState::launching);
  CHECK(r.j().generation == 1);
  CHECK(r.j().restarts == 0);  // a resize is not a failure
  CHECK(r.j().layout.str() == "1x1x1");
  CHECK(d.launches.size() == 1);
  CHECK(has_state_event(d, r.job, "recovering"));
}

TEST_CASE("elastic growth: a new agent makes a job below max_devices grow", "[elastic]") {
  Fixture f;
  Actions a;
  f.st.register_agent(7, "h1", 1, cpus(1), &a);
  auto job = f.st.submit(elastic(0, 1, 2), &a);
  f.st.register_worker(7, job, 0, 0, "h1", 100, &a);
  f.st.step(job, 0, StepSample{0, 0, 2.0, 1e-3, 64, 10.0, 1.0, {}}, &a);
  Actions g;
  f.st.register_agent(7, "h2", 2, cpus(1), &g);
  REQUIRE(g.drains.size() == 1);
  CHECK(f.st.job(job)->target_dp == 2);
  Actions d;
  f.st.worker_done(job, 0, 0, /*drained=*/true, &d);
  CHECK(f.st.job(job)->layout.str() == "2x1x1");
  CHECK(d.launches.size() == 2);
}

TEST_CASE("recovery: during the backoff the freed devices stay with the recovering job", "[recovery]") {
  JobRequest req = elastic(1);
  req.restart_backoff_ms = 500;
  Running r(1, 1, req);  // one device held, one free
  Actions q;
  auto waiting = r.f.st.submit(request("q", 2), &q);
  REQUIRE(r.f.st.job(waiting)->state == JobState::queued);
  Actions x;
  r.f.st.worker_exited(r.job, 0, 0, 100, -1, 9, &x);
  CHECK(r.j().state == JobState::recovering);
  CHECK(r.f.st.registry().free("cpu") == 2);
  CHECK(x.launches.empty());
  CHECK(r.f.st.job(waiting)->state == JobState::queued);
  Actions t;
  r.f.st.tick(now_ms() + 1000, &t);
  CHECK(r.j().state == JobState::launching);
  CHECK(r.j().generation == 1);
  CHECK(r.f.st.job(waiting)->state == JobState::queued);
}

TEST_CASE("spares: started with the job, a ready spare takes a failed rank's place without a launch",
          "[recovery][spares]") {
  JobRequest req = elastic(3);
  req.spares = 1;
  Running r(2, 2, req);
  const int spare0 = troupe::actors::kFirstSpareRank;
  // Placed on world + spares devices: two ranks and one spare process, launched as a spare rank.
  REQUIRE(r.j().spares.size() == 1);
  CHECK(r.j().spares[0].launch_rank == spare0);
  CHECK(r.f.st.registry().free("cpu") == 1);
  CHECK(r.j().state == JobState::running);
  // An unknown spare may not register; the launched one may, once.
  Actions reg;
  CHECK(!r.f.st.register_worker(7, r.job, 0, spare0 + 5, "h1", 300, &reg).refused.empty());
  const WorkerAssignment w = r.f.st.register_worker(7, r.job, 0, spare0, "h2", 300, &reg);
  REQUIRE(w.refused.empty());
  CHECK(w.spare);
  CHECK(r.j().spares[0].ready);
  CHECK(!r.f.st.register_worker(7, r.job, 0, spare0, "h2", 300, &reg).refused.empty());

  // Rank 1 is killed: the survivor and the spare keep their devices. No process starts, so no
  // backoff: the relaunch goes as soon as the survivor reports the end of its generation.
  Actions x;
  for (int rank = 0; rank < 2; ++rank)
    r.f.st.step(r.job, 0, StepSample{rank, 0, 2.0, 1e-3, 64, 10.0, 1.0, {}}, &x);
  const double killed = now_ms();
  r.f.st.worker_exited(r.job, 0, 1, 101, -1, 9, &x);
  REQUIRE(r.j().state == JobState::recovering);
  CHECK(r.j().relaunch_at_ms <= now_ms());
  CHECK(r.j().relaunch_at_ms >= killed);
  CHECK(r.f.st.registry().free("cpu") == 2);
  Actions t;
  r.f.st.worker_failed(r.job, 0, 0, FailureCause::aborted, "aborted", &t, true);
  // Every place is filled by a running process: the survivor keeps rank 0, the spare takes rank 1,
  // and a new spare starts on a free device.
  CHECK(r.j().state == JobState::running);
  REQUIRE(t.reassigns.size() == 2);
  bool spare_took_1 = false;
  for (const auto& g : t.reassigns)
    if (g.rank == 1) {
      spare_took_1 = true;
      CHECK(g.from_rank == spare0);
      CHECK(g.from_generation == 0);
      CHECK(g.generation == 1);
    }
  CHECK(spare_took_1);
  REQUIRE(t.launches.size() == 1);
  CHECK(t.launches[0].rank == spare0 + 1);
  CHECK(t.launches[0].generation == 1);
  CHECK(r.j().ranks[1].pid == 300);
  CHECK(r.j().ranks[1].launch_rank == spare0);
  CHECK(r.j().ranks[1].launch_generation == 0);
  REQUIRE(r.j().spares.size() == 1);
  CHECK(!r.j().spares[0].ready);
  CHECK(r.f.st.registry().free("cpu") == 1);  // 4 devices: rank 0, the spare at rank 1, the new spare

  // A waiting spare that dies costs the job nothing but its device.
  Actions s;
  r.f.st.worker_exited(r.job, 1, spare0 + 1, 301, -1, 9, &s);
  CHECK(r.j().spares.empty());
  CHECK(r.j().state == JobState::running);
  CHECK(r.f.st.registry().free("cpu") == 2);
  // The spare that took rank 1 is a rank now: its agent reports it by its launch, which fails the
  // generation by name.
  Actions d;
  r.f.st.worker_exited(r.job, 0, spare0, 300, -1, 9, &d);
  CHECK(r.j().state == JobState::recovering);
  REQUIRE(r.j().failures.size() == 2);
  CHECK(r.j().failures[1]["rank"] == 1);
  CHECK(r.j().failures[1]["cause"] == "worker_killed");
}

TEST_CASE("spares: losing the agent that holds only a job's spare fails nothing", "[recovery][spares]") {
  Fixture f;
  Actions a;
  const std::string a1 = f.st.register_agent(7, "h1", 1, cpus(2), &a).message;
  JobRequest req = elastic(1);
  req.layout = {2, 1, 1};
  req.spares = 1;
  const std::string job = f.st.submit(req, &a);
  const std::string a2 = f.st.register_agent(7, "h2", 2, cpus(1), &a).message;
  for (int rank = 0; rank < 2; ++rank) f.st.register_worker(7, job, 0, rank, "h1", 100 + rank, &a);
  REQUIRE(f.st.job(job)->state == JobState::running);
  REQUIRE(f.st.job(job)->spares.size() == 1);
  REQUIRE(f.st.job(job)->spares[0].device.agent_id == a2);
  Actions x;
  f.st.remove_agent(a2, &x);
  CHECK(f.st.job(job)->state == JobState::running);
  CHECK(f.st.job(job)->spares.empty());
  CHECK(f.st.job(job)->failures.empty());
}

TEST_CASE("spares: a job waits for its spares' devices, and its end releases them", "[recovery][spares]") {
  Fixture f;
  Actions a;
  f.st.register_agent(7, "h1", 1, cpus(2), &a);
  JobRequest req = elastic(1);
  req.layout = {2, 1, 1};
  req.spares = 1;
  const std::string job = f.st.submit(req, &a);
  CHECK(f.st.job(job)->state == JobState::queued);
  CHECK(f.st.job(job)->reason.find("resources.spares") != std::string::npos);
  Actions b;
  f.st.register_agent(7, "h2", 2, cpus(1), &b);
  REQUIRE(f.st.job(job)->state == JobState::launching);
  REQUIRE(b.launches.size() == 3);
  const int spare0 = troupe::actors::kFirstSpareRank;
  Actions reg;
  REQUIRE(f.st.register_worker(7, job, 0, spare0, "h2", 300, &reg).spare);
  Actions c;
  std::string why;
  REQUIRE(f.st.cancel(job, "cancelled by user", &c, &why));
  REQUIRE(c.releases.size() == 1);
  CHECK(c.releases[0].rank == spare0);
  CHECK(c.releases[0].generation == 0);
  CHECK(f.st.job(job)->spares.empty());
  CHECK(f.st.registry().free("cpu") == 3);
}

TEST_CASE("failure event: the ranks' last where answers grouped by answer, rank ranges, bounded",
          "[recovery]") {
  Running r(4, 2, elastic(2));
  for (int rank : {0, 1, 3}) r.f.st.worker_where(r.job, 0, rank, "step 3: allreduce");
  r.f.st.worker_where(r.job, 0, 2, "step 3: forward mb 1");
  Actions x;
  r.f.st.worker_exited(r.job, 0, 2, 102, -1, 9, &x);
  REQUIRE(r.j().failures.size() == 1);
  CHECK(r.j().failures[0]["ranks_where"] ==
        nlohmann::json({{"step 3: allreduce", "0-1,3"}, {"step 3: forward mb 1", "2"}}));
  CHECK(!r.j().failures[0].contains("ranks_where_more"));

  // Forty ranks each somewhere else: the first 32 answers, the other 8 ranks counted.
  JobRequest wide = elastic(2);
  wide.plan.global_batch = 40;
  Running many(40, 20, wide);
  REQUIRE(many.j().state == JobState::running);
  for (int rank = 0; rank < 40; ++rank)
    many.f.st.worker_where(many.job, 0, rank, "op " + std::to_string(rank));
  Actions y;
  many.f.st.worker_exited(many.job, 0, 0, 100, -1, 9, &y);
  REQUIRE(many.j().failures.size() == 1);
  CHECK(many.j().failures[0]["ranks_where"].size() == 32);
  CHECK(many.j().failures[0]["ranks_where"]["op 31"] == "31");
  CHECK(many.j().failures[0]["ranks_where_more"] == 8);
}

TEST_CASE(
    "stopped: a rank its agent saw stopped fails by name and is killed, its peers stay, a spare is dropped",
    "[recovery][survivors][spares]") {
  JobRequest req = elastic(3);
  req.spares = 1;
  Running r(2, 2, req);
  const int spare0 = troupe::actors::kFirstSpareRank;
  Actions reg;
  REQUIRE(r.f.st.register_worker(7, r.job, 0, spare0, "h2", 300, &reg).refused.empty());
  // A report naming a launch of no rank, or of another job, changes nothing.
  Actions none;
  r.f.st.worker_stopped(r.job, 0, 5, 105, SIGSTOP, 100, &none);
  r.f.st.worker_stopped("nojob", 0, 1, 101, SIGSTOP, 100, &none);
  CHECK(none.events.empty());
  CHECK(none.kills.empty());
  CHECK(r.j().state == JobState::running);

  Actions x;
  r.f.st.worker_stopped(r.job, 0, 1, 101, SIGSTOP, 120, &x);
  REQUIRE(r.j().state == JobState::recovering);
  REQUIRE(r.j().failures.size() == 1);
  const auto& f = r.j().failures[0];
  CHECK(f["cause"] == "worker_stopped");
  CHECK(f["rank"] == 1);
  CHECK(f["message"].get<std::string>().find("was stopped by SIGSTOP for 0.1 s") != std::string::npos);
  // The stopped process is killed (it cannot act on an abort); rank 0 is aborted and stays.
  REQUIRE(x.kills.size() == 1);
  CHECK(x.kills[0].ranks == std::vector<int>{1});
  CHECK(std::any_of(x.aborts.begin(), x.aborts.end(), [](const Abort& a) { return a.rank == 0; }));
  REQUIRE(r.j().survivors.size() == 1);
  CHECK(r.j().survivors[0].rank == 0);

  // A waiting survivor seen stopped is dropped and killed; so is a spare.
  Actions y;
  r.f.st.worker_stopped(r.job, 0, 0, 100, SIGTSTP, 150, &y);
  CHECK(r.j().survivors.empty());
  REQUIRE(y.kills.size() == 1);
  CHECK(y.kills[0].ranks == std::vector<int>{0});
  Actions z;
  r.f.st.worker_stopped(r.job, 0, spare0, 300, SIGSTOP, 100, &z);
  CHECK(r.j().spares.empty());
  REQUIRE(z.kills.size() == 1);
  CHECK(z.kills[0].ranks == std::vector<int>{spare0});
}

TEST_CASE("placement: a spread job spans the agents, so losing one heals from the buddy on the other",
          "[recovery][survivors][memory][placement]") {
  for (bool spread : {false, true}) {
    INFO((spread ? "spread" : "pack"));
    Fixture f;
    Actions a;
    const std::string a1 = f.st.register_agent(7, "h1", 1, cpus(2), &a).message;
    const std::string a2 = f.st.register_agent(7, "h2", 2, cpus(2), &a).message;
    JobRequest req = elastic(2);
    req.layout = {2, 1, 1};
    req.spread = spread;
    const std::string job = f.st.submit(req, &a);
    f.st.set_checkpoint_finder(
        [](const std::string& root, std::vector<std::string>*) { return root + "/step_000004"; });
    const Job& j = *f.st.job(job);
    REQUIRE(j.ranks.size() == 2);
    CHECK(j.ranks[0].device.agent_id == a1);
    CHECK(j.ranks[1].device.agent_id == (spread ? a2 : a1));
    for (int rank = 0; rank < 2; ++rank)
      f.st.register_worker(7, job, 0, rank, j.ranks[rank].host, 100 + rank, &a);
    REQUIRE(j.buddy_shift == 1);
    for (int rank = 0; rank < 2; ++rank)
      f.st.step(job, 0, StepSample{rank, 7, 2.0, 1e-3, 64, 10.0, 1.0, {}}, &a);
    // Spread: the second agent is lost with rank 1. Packed: the first, with both ranks.
    Actions x;
    f.st.remove_agent(spread ? a2 : a1, &x);
    REQUIRE(j.state == JobState::recovering);
    if (spread) {
      // Rank 0 stays with its own snapshots and rank 1's copy; rank 1's place goes to h1's free
      // device and receives its state from its buddy.
      Actions p;
      f.st.worker_failed(job, 0, 0, FailureCause::aborted, "aborted", &p, true,
                         MemoryHeld{{8, 7}, false, {8, 7}, 1});
    }
    Actions t;
    f.st.tick(now_ms() + 1000, &t);
    REQUIRE(j.state == JobState::launching);
    CHECK(j.memory_step == (spread ? 8 : -1));
    if (spread) {
      CHECK(j.heal_from_buddy[1]);
      CHECK(j.ranks[0].pid == 100);
    }
  }
}

TEST_CASE("placement: a spread job's relaunch puts the new rank where the job has the fewest ranks",
          "[recovery][placement]") {
  Fixture f;
  Actions a;
  f.st.register_agent(7, "h1", 1, cpus(2), &a);
  const std::string a2 = f.st.register_agent(7, "h2", 2, cpus(2), &a).message;
  JobRequest req = elastic(2);
  req.layout = {2, 1, 1};
  req.spread = true;
  const std::string job = f.st.submit(req, &a);
  const Job& j = *f.st.job(job);
  for (int rank = 0; rank < 2; ++rank)
    f.st.register_worker(7, job, 0, rank, j.ranks[rank].host, 100 + rank, &a);
  REQUIRE(j.ranks[1].device.agent_id == a2);
  Actions x;
  f.st.worker_exited(job, 0, 1, 101, -1, 9, &x);  // rank 1, on h2
  f.st.worker_failed(job, 0, 0, FailureCause::aborted, "aborted", &x, true);
  Actions t;
  f.st.tick(now_ms() + 1000, &t);
  REQUIRE(j.state == JobState::launching);
  // h1 has a free device too, and holds rank 0: the new rank 1 goes to h2 again.
  REQUIRE(t.launches.size() == 1);
  CHECK(j.ranks[1].device.agent_id == a2);
}

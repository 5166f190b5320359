// The failure, restart and elasticity policy (coordinator/policy.hpp) as plain
// functions of a job: no registry, no actors.
#include <catch2/catch.hpp>

#include "coordinator/policy.hpp"

using namespace troupe::coord;
using troupe::FailureCause;

namespace {

// A running job of layout dp x pp x tp that has completed `steps` steps.
Job running(int dp, int pp = 1, int tp = 1, int64_t steps = 10) {
  Job j;
  j.id = "j";
  j.state = JobState::running;
  j.request.layout = {dp, pp, tp};
  j.request.plan.model.n_layers = 4;
  j.request.plan.global_batch = 840;  // divisible by every data size a test asks for
  j.request.total_steps = 1000;
  j.request.max_restarts = 2;
  j.layout = j.request.layout;
  j.last_step = steps - 1;
  j.stepped = steps > 0;
  return j;
}

nlohmann::json failure(FailureCause cause, const std::string& message, int generation,
                       bool before_first_step) {
  return {{"cause", troupe::to_string(cause)},
          {"message", message},
          {"generation", generation},
          {"before_first_step", before_first_step}};
}

}  // namespace

TEST_CASE("policy: a retryable failure restarts until max_restarts is spent", "[policy]") {
  Job j = running(1);
  auto v = judge_failure(j, FailureCause::worker_killed, "rank 0 was killed by SIGKILL");
  CHECK(v.restart);
  CHECK(v.message == "rank 0 was killed by SIGKILL");
  j.restarts = 2;
  v = judge_failure(j, FailureCause::worker_killed, "rank 0 was killed by SIGKILL");
  CHECK_FALSE(v.restart);
  CHECK(v.message == "rank 0 was killed by SIGKILL (after 2 restart(s); fault.max_restarts = 2)");
  j.request.max_restarts = 0;
  j.restarts = 0;
  v = judge_failure(j, FailureCause::engine_error, "x");
  CHECK_FALSE(v.restart);
  CHECK(v.message == "x");  // no restarts allowed: nothing to explain
}

TEST_CASE("policy: causes that are not retryable fail at once, with the failure's own message", "[policy]") {
  Job j = running(1);
  for (FailureCause c : {FailureCause::invalid_spec, FailureCause::disk_full, FailureCause::protocol_mismatch,
                         FailureCause::no_devices}) {
    auto v = judge_failure(j, c, "rank 0: no");
    CHECK_FALSE(v.restart);
    CHECK(v.message == "rank 0: no");
  }
}

TEST_CASE("policy: the same failure before the first step of two generations is a setup error", "[policy]") {
  // Generation 0 failed before its first step; generation 1 has not stepped either.
  auto second_generation = [] {
    Job j = running(2, 1, 1, /*steps=*/0);
    j.generation = 1;
    j.restarts = 1;
    j.failures.push_back(
        failure(FailureCause::engine_error, "rank 1: cannot open init.safetensors", 0, true));
    return j;
  };
  const std::string again = "rank 0: cannot open init.safetensors";  // another rank this time: the same
  Job j = second_generation();
  CHECK(repeats_setup_failure(j, FailureCause::engine_error, again));
  auto v = judge_failure(j, FailureCause::engine_error, again);
  CHECK_FALSE(v.restart);
  CHECK(v.message.find("the same failure ended generation 0 before its first step") != std::string::npos);
  // Another cause, another message, a generation that stepped or a gap of a generation: not a repeat.
  CHECK_FALSE(repeats_setup_failure(j, FailureCause::comm_peer_lost, again));
  CHECK_FALSE(repeats_setup_failure(j, FailureCause::engine_error, "rank 0: cannot open other.safetensors"));
  j.stepped = true;
  CHECK_FALSE(repeats_setup_failure(j, FailureCause::engine_error, again));
  j = second_generation();
  j.generation = 2;
  CHECK_FALSE(repeats_setup_failure(j, FailureCause::engine_error, again));
  j = second_generation();
  j.failures.back()["before_first_step"] = false;
  CHECK_FALSE(repeats_setup_failure(j, FailureCause::engine_error, again));
}

TEST_CASE("policy: without_rank drops only a leading rank N: prefix", "[policy]") {
  CHECK(without_rank("rank 12: no such file") == "no such file");
  CHECK(without_rank("rank 0: a: b") == "a: b");
  CHECK(without_rank("rank : x") == "rank : x");
  CHECK(without_rank("rank 1x: x") == "rank 1x: x");
  CHECK(without_rank("ranked 1: x") == "ranked 1: x");
  CHECK(without_rank("rank 3 (pid 7) exited") == "rank 3 (pid 7) exited");
  CHECK(without_rank("") == "");
}

TEST_CASE("policy: restart backoff doubles from the first wait up to 8 s", "[policy]") {
  CHECK(restart_backoff_ms(250, 1) == 250);
  CHECK(restart_backoff_ms(250, 2) == 500);
  CHECK(restart_backoff_ms(250, 3) == 1000);
  CHECK(restart_backoff_ms(250, 6) == 8000);
  CHECK(restart_backoff_ms(250, 40) == 8000);
  CHECK(restart_backoff_ms(20000, 1) == 8000);
  CHECK(restart_backoff_ms(0, 5) == 0);
}

TEST_CASE("policy: the watchdog limit and the median step time", "[policy][watchdog]") {
  JobRequest r;
  CHECK(median_ms({}) == 0);
  CHECK(median_ms({5, 1, 3}) == 3);
  CHECK(step_timeout_ms(r, {}) == 120000);
  CHECK(step_timeout_ms(r, {1000, 900, 1100}) == Approx(20000));
  CHECK(step_timeout_ms(r, {5, 5, 5}) == Approx(10000));
  r.step_timeout_ms = 3000;
  CHECK(step_timeout_ms(r, {1000}) == 3000);
}

TEST_CASE("policy: the data size fits the free devices, min_devices and the global batch",
          "[policy][elastic]") {
  Job j = running(4, 2, 1);  // pipeline x tensor = 2
  j.request.plan.global_batch = 12;
  j.request.plan.micro_batch = 2;
  CHECK(min_devices(j) == 8);  // the planned size
  j.request.min_devices = 2;
  CHECK(min_devices(j) == 2);
  CHECK(fit_data_size(j, 4, 8) == 3);  // data 4: 12 % 8 != 0; data 3: 12 % 6 == 0
  CHECK(fit_data_size(j, 4, 5) == 2);
  CHECK(fit_data_size(j, 4, 3) == 1);
  CHECK(fit_data_size(j, 4, 1) == 0);
  j.request.min_devices = 6;
  CHECK(fit_data_size(j, 4, 5) == 0);  // data 2 = 4 devices < 6
  // min_devices never exceeds what the current generation holds.
  j.layout.dp = 2;
  CHECK(min_devices(j) == 4);
}

TEST_CASE("policy: a resize is refused with a reason, and drains a few steps ahead", "[policy][elastic]") {
  Job j = running(2, 1, 1, /*steps=*/10);
  j.request.plan.global_batch = 8;
  j.request.plan.micro_batch = 1;
  CHECK(drain_step(j) == 9 + 3);  // no step time measured: 3 steps
  j.step_ms = {10, 10, 10};       // 300 ms = 30 steps
  CHECK(drain_step(j) == 9 + 31);
  CHECK(resize_refusal(j, 4, 2).empty());
  CHECK(resize_refusal(j, 1, 0).empty());
  CHECK(resize_refusal(j, 8, 2) == "not enough free devices: 8 wanted, 2 held + 2 free");
  CHECK(resize_refusal(j, 2, 2) == "job j already runs on 2 devices");
  CHECK(resize_refusal(j, 0, 2) ==
        "0 devices is not a multiple of pipeline x tensor = 1 (the layout keeps them)");
  j.request.plan.global_batch = 6;
  CHECK(resize_refusal(j, 4, 2) ==
        "data 4 cannot be planned: global_batch 6 is not divisible by data 4: use a "
        "global_batch that is a multiple of the data degree");
  j.request.plan.global_batch = 8;
  j.request.total_steps = 40;
  CHECK(resize_refusal(j, 4, 2) == "job j ends (step 40) before it could be resized");
  j.request.total_steps = 1000;
  j.drain_step = 20;
  CHECK(resize_refusal(j, 4, 2) == "job j is already being resized");
  j.state = JobState::recovering;
  CHECK(resize_refusal(j, 4, 2) == "job j is recovering; only a running job is resized");

  Job pp = running(1, 2, 2);
  CHECK(resize_refusal(pp, 6, 8) ==
        "6 devices is not a multiple of pipeline x tensor = 4 (the layout keeps them)");
}

TEST_CASE("policy: a running job grows towards max_devices on free devices", "[policy][elastic]") {
  Job j = running(1);
  j.request.plan.global_batch = 8;
  j.request.plan.micro_batch = 1;
  CHECK(grow_data_size(j, 4) == 0);  // max_devices 0 = the planned size: no growth
  j.request.max_devices = 4;
  CHECK(grow_data_size(j, 0) == 0);
  CHECK(grow_data_size(j, 1) == 2);
  CHECK(grow_data_size(j, 2) == 2);  // data 3 does not divide the batch of 8
  CHECK(grow_data_size(j, 7) == 4);
  j.drain_step = 12;
  CHECK(grow_data_size(j, 7) == 0);  // already resizing
  Job fresh = running(1, 1, 1, /*steps=*/0);
  fresh.request.max_devices = 4;
  CHECK(grow_data_size(fresh, 7) == 0);  // not before its first step
}

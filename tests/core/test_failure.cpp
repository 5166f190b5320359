// Failure causes (core/failure.hpp): every name round-trips, nothing else parses,
// and a peer's text is believed only for the causes a worker reports.
#include <catch2/catch.hpp>
#include <set>
#include <string>

#include "core/failure.hpp"

using troupe::FailureCause;
using troupe::kFailureCauses;

TEST_CASE("failure causes: every name is distinct and parses back to its cause", "[failure]") {
  std::set<std::string> names;
  for (FailureCause c : kFailureCauses) {
    const std::string name = troupe::to_string(c);
    CHECK(names.insert(name).second);
    auto back = troupe::parse_failure_cause(name);
    REQUIRE(back);
    CHECK(*back == c);
  }
  CHECK(names.size() == static_cast<size_t>(FailureCause::no_devices) + 1);
}

TEST_CASE("failure causes: the names are the ones logs, the job table and the API show", "[failure]") {
  // Changing one breaks saved job tables and every client that matches on it.
  CHECK(std::string(troupe::to_string(FailureCause::invalid_spec)) == "invalid_spec");
  CHECK(std::string(troupe::to_string(FailureCause::disk_full)) == "disk_full");
  CHECK(std::string(troupe::to_string(FailureCause::engine_error)) == "engine_error");
  CHECK(std::string(troupe::to_string(FailureCause::aborted)) == "aborted");
  CHECK(std::string(troupe::to_string(FailureCause::comm_peer_lost)) == "comm_peer_lost");
  CHECK(std::string(troupe::to_string(FailureCause::comm_timed_out)) == "comm_timed_out");
  CHECK(std::string(troupe::to_string(FailureCause::worker_failed)) == "worker_failed");
  CHECK(std::string(troupe::to_string(FailureCause::worker_killed)) == "worker_killed");
  CHECK(std::string(troupe::to_string(FailureCause::agent_lost)) == "agent_lost");
  CHECK(std::string(troupe::to_string(FailureCause::step_timeout)) == "step_timeout");
  CHECK(std::string(troupe::to_string(FailureCause::no_devices)) == "no_devices");
}

TEST_CASE("failure causes: hostile and near-miss text does not parse", "[failure]") {
  using namespace std::string_literals;
  for (const std::string& s :
       {""s, "drained"s, "lost"s, "ok"s, "Engine_Error"s, "engine_error "s, " engine_error"s,
        "engine_error\n"s, "engine_error\0"s, "engine"s, "comm_"s, "comm_unknown"s, "comm_peer_lost_"s,
        "disk_full;rm -rf"s, "invalid_spec\xff"s, std::string(1 << 16, 'a'), "\xc3\x28"s}) {
    INFO(s.substr(0, 40));
    CHECK_FALSE(troupe::parse_failure_cause(s));
    CHECK(troupe::reported_failure_cause(s) == FailureCause::worker_failed);
  }
}

TEST_CASE("failure causes: a worker's report is believed only for causes a worker reports", "[failure]") {
  for (FailureCause c : kFailureCauses) {
    FailureCause got = troupe::reported_failure_cause(troupe::to_string(c));
    if (troupe::reported_by_worker(c))
      CHECK(got == c);
    else
      CHECK(got == FailureCause::worker_failed);  // a worker cannot claim its agent was lost
  }
  CHECK(troupe::reported_by_worker(FailureCause::comm_internal));
  CHECK_FALSE(troupe::reported_by_worker(FailureCause::agent_lost));
  CHECK_FALSE(troupe::reported_by_worker(FailureCause::step_timeout));
}

TEST_CASE("failure causes: a spec, a full disk, a protocol or missing devices are not retried", "[failure]") {
  std::set<FailureCause> final = {FailureCause::invalid_spec, FailureCause::disk_full,
                                  FailureCause::protocol_mismatch, FailureCause::no_devices};
  for (FailureCause c : kFailureCauses) {
    INFO(troupe::to_string(c));
    CHECK(troupe::retryable(c) == (final.count(c) == 0));
  }
}

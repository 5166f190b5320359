// In one process: the coordinator actor, a real agent actor (its workers are
// processes of the built troupe binary), the rendezvous store seen through the
// worker-side client, and `troupe run`'s embedded entry point.
#include <catch2/catch.hpp>
#include <thread>

#include "actors/secret.hpp"
#include "actors/system.hpp"
#include "comm/error.hpp"
#include "coordinator/coordinator_actor.hpp"
#include "coordinator/embedded/embedded.hpp"
#include "tests/control/cluster.hpp"
#include "tests/support/support.hpp"
#include "worker/agent.hpp"
#include "worker/coordinator_store.hpp"

using namespace troupe;
using namespace std::chrono_literals;
using nlohmann::json;

TEST_CASE("the coordinator's rendezvous store: set, blocking get, add, wait, timeout, stale generation",
          "[control][store]") {
  char tmpl[] = "/tmp/troupe-store-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  {
    actors::EphemeralSecret secret;
    actors::NodeConfig cfg(secret.path());
    caf::actor_system sys{cfg};
    coord::CoordinatorActorOptions copt;
    copt.runs_dir = dir + "/runs";
    auto coordinator = coord::spawn_coordinator(sys, copt);
    auto port = actors::publish(coordinator, 0, "127.0.0.1");
    REQUIRE(port);
    worker::AgentActorOptions aopt;
    aopt.coordinator_address = "127.0.0.1:" + std::to_string(*port);
    aopt.devices = {"cpu:0"};
    aopt.worker_binary = test::troupe_binary();
    aopt.secret_file = secret.path();
    auto agent = worker::spawn_agent(sys, coordinator, aopt);
    auto ask = [&](const json& r) {
      caf::scoped_actor self{sys};
      json out;
      self->request(coordinator, 10s, actors::api_atom::value, r.dump())
          .receive([&](std::string& s) { out = json::parse(s); }, [&](caf::error&) {});
      return out;
    };
    REQUIRE(test::wait_until([&] { return ask({{"op", "list"}})["devices"]["cpu"]["total"] == 1; }, 10s));
    std::string job =
        ask({{"op", "submit"}, {"spec", test::tiny_spec("store", testing::kEndlessSteps)}})["job"];
    REQUIRE(!job.empty());

    auto a = worker::make_coordinator_store(sys, coordinator, job, 0);
    auto b = worker::make_coordinator_store(sys, coordinator, job, 0);
    std::string got;
    std::thread reader([&] { got = b->get("gloo/addr/1", 10s); });  // parks until a sets it
    std::this_thread::sleep_for(50ms);
    a->set("gloo/addr/1", std::string("10.0.0.7:4000\0x", 15));
    reader.join();
    CHECK(got == std::string("10.0.0.7:4000\0x", 15));
    CHECK(a->add("count", 2) == 2);
    CHECK(b->add("count", 3) == 5);
    std::thread setter([&] { a->set("k2", "v2"); });
    b->wait({"gloo/addr/1", "k2"}, 10s);
    setter.join();
    CHECK(b->get("k2", 1s) == "v2");
    try {
      b->get("never", 100ms);
      FAIL("a missing key must time out");
    } catch (const comm::CommError& e) {
      CHECK(e.code() == comm::CommErrc::timed_out);
      CHECK(std::string(e.what()).find("never") != std::string::npos);
    }
    auto stale = worker::make_coordinator_store(sys, coordinator, job, 7);
    try {
      stale->set("x", "y");
      FAIL("a stale generation must be refused");
    } catch (const comm::CommError& e) {
      CHECK(std::string(e.what()).find("stale generation 7") != std::string::npos);
    }
    CHECK(ask({{"op", "cancel"}, {"job", job}})["ok"] == true);
    caf::anon_send(agent, actors::shutdown_atom::value);
    caf::anon_send_exit(coordinator, caf::exit_reason::user_shutdown);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("run_job_embedded: coordinator and agent in this process, workers as children",
          "[control][embedded]") {
  char tmpl[] = "/tmp/troupe-embedded-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  embedded::RunOptions o;
  o.runs_dir = dir + "/runs";
  o.worker_binary = test::troupe_binary();
  o.quiet = true;
  auto spec = parse_spec(test::tiny_spec("embedded", 5), "embedded.yaml");
  CHECK(embedded::run_job_embedded(spec, o) == 0);
  int runs = 0;
  for (const auto& d : std::filesystem::directory_iterator(dir + "/runs")) {
    ++runs;
    std::ifstream m(d.path() / "metrics.jsonl");
    int lines = 0;
    for (std::string l; std::getline(m, l);) ++lines;
    CHECK(lines == 5);
  }
  CHECK(runs == 1);
  // A job its engine cannot run fails with the engine's named error: exit code 1.
  auto wide =
      parse_spec(test::read_file(std::string(TROUPE_SOURCE_DIR) + "/configs/layouts/tiny_dp2_pp1_tp1.yaml"),
                 "wide.yaml");
  wide.train.steps = 2;
  int rc = embedded::run_job_embedded(wide, o);
  REQUIRE((rc == 0 || rc == 1));  // 0 once the engine runs 2x1x1
  for (const auto& d : std::filesystem::directory_iterator(dir + "/runs")) {
    if (d.path().filename().string().rfind("tiny-dp2", 0) != 0) continue;
    auto events = test::read_file((d.path() / "events.log").string());
    CHECK(events.find(rc == 0 ? "state succeeded" : "state failed: engine_error") != std::string::npos);
  }
  std::filesystem::remove_all(dir);
}

// Jobs across hosts: a coordinator in one network namespace, agents in two others
// (netns.hpp). A job placed across hosts trains the same loss curve as on one host,
// its ranks talking over the hosts' 10.77.0.x addresses.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>

#include "tests/multihost/curves.hpp"
#include "worker/data_address.hpp"

namespace troupe::test {
namespace {

using namespace std::chrono_literals;

// Runs `spec` to the end on `c` and checks where its ranks ran: every worker on h1 or
// h2 (both used), its log naming that host's address as its data plane.
std::map<int64_t, double> across_hosts_curve(NetnsCluster& c, const std::string& spec) {
  const std::string job = c.call({{"op", "submit"}, {"spec", spec}})["job"];
  INFO("cluster dir " << c.dir());
  REQUIRE(c.wait_state(
      job, [](const nlohmann::json& s) { return s["state"] == "succeeded" || s["state"] == "failed"; },
      200s));
  const auto st = c.status(job);
  INFO(st.dump(1));
  REQUIRE(st["state"] == "succeeded");
  const std::string run_dir = st["run_dir"];
  const std::map<std::string, std::string> address = {{Netns::host_name(1), Netns::address(1)},
                                                      {Netns::host_name(2), Netns::address(2)}};
  std::set<std::string> hosts;
  for (const auto& w : st["workers"]) {
    const std::string host = w["host"], log = read_file(run_dir + "/workers/" + w["rank"].dump() + ".log");
    INFO("rank " << w["rank"] << " on " << host << ":\n" << log);
    REQUIRE(address.count(host) == 1);
    CHECK(log.find("data plane: " + address.at(host) + "\n") != std::string::npos);
    hosts.insert(host);
  }
  CHECK(hosts.size() == 2);
  return loss_curve(run_dir);
}

TEST_CASE("the data-plane address is the route's source or the named interface's", "[multihost]") {
  using namespace troupe::worker;
  CHECK(route_source_address("127.0.0.1") == "127.0.0.1");
  CHECK(route_source_address("localhost") == "127.0.0.1");
  CHECK(route_source_address("no-such-host.invalid") == "");
  CHECK(interface_address("lo") == "127.0.0.1");
  CHECK(interface_address("127.0.0.1") == "127.0.0.1");
  CHECK_THROWS_WITH(interface_address("nosuch0"), Catch::Contains("no interface of that name"));
  CHECK_THROWS_WITH(interface_address("192.0.2.254"),
                    Catch::Contains("no interface of this host has that address"));
  CHECK(data_plane_address("127.0.0.1", "") == "127.0.0.1");
  CHECK(data_plane_address("10.77.0.1", "lo") == "127.0.0.1");
}

TEST_CASE("a 2x1x1 job across two hosts trains the loss curve of one host", "[multihost]") {
  constexpr int kSteps = 30;
  const std::string spec = layout_spec("tiny_dp2_pp1_tp1", "across", kSteps);
  const auto want = one_host_curve(spec, 2);
  NetnsCluster c;
  REQUIRE(c.ready());
  c.add_agent(1, "cpu:1");
  c.add_agent(2, "cpu:1");
  REQUIRE(c.wait_devices(2));
  check_same_curve(across_hosts_curve(c, spec), want, kSteps);
}

TEST_CASE("a 2x2x1 job across two hosts trains the loss curve of one host", "[multihost]") {
  constexpr int kSteps = 30;
  const std::string spec = layout_spec("tiny_dp2_pp2_tp1", "across", kSteps);
  const auto want = one_host_curve(spec, 4);
  NetnsCluster c;
  REQUIRE(c.ready());
  // An interface that is not there: the agent refuses to start.
  Proc& bad = c.add_agent(1, "cpu:2", {"--data-interface", "nosuch0"});
  REQUIRE(bad.wait(30s) == 2);
  CHECK(bad.output().find("--data-interface nosuch0: no interface of that name") != std::string::npos);
  // The data plane named both ways: by interface and by address.
  c.add_agent(1, "cpu:2", {"--data-interface", "eth0"});
  c.add_agent(2, "cpu:2", {"--data-interface", Netns::address(2)});
  REQUIRE(c.wait_devices(4));
  check_same_curve(across_hosts_curve(c, spec), want, kSteps);
}

// The hosts of a status's workers.
std::set<std::string> worker_hosts(const nlohmann::json& st) {
  std::set<std::string> hosts;
  for (const auto& w : st["workers"]) hosts.insert(w["host"].get<std::string>());
  return hosts;
}

TEST_CASE("a host whose link goes down mid-job: the job recovers on the other host and trains on",
          "[multihost][fault]") {
  NetnsCluster c;
  REQUIRE(c.ready());
  INFO("cluster dir " << c.dir());
  c.add_agent(1, "cpu:1");
  c.add_agent(2, "cpu:1");
  REQUIRE(c.wait_devices(2));
  const std::string job = c.call(
      {{"op", "submit"},
       {"spec", fault_spec("linkcut", 2, testing::kEndlessSteps, 5, "fault:\n  max_restarts: 3\n")}})["job"];
  // Generation 0 across h1 and h2, past its first checkpoint.
  REQUIRE(c.wait_state(
      job, [](const nlohmann::json& s) { return s["state"] == "running" && s["steps_done"] >= 8; }, 120s));
  REQUIRE(c.status(job)["generation"] == 0);
  REQUIRE(worker_hosts(c.status(job)) == std::set<std::string>{"h1", "h2"});
  // A spare device on h1 for the relaunch: a second agent there, started only now so
  // that generation 0 was placed across the hosts.
  c.add_agent(1, "cpu:1");
  REQUIRE(c.wait_devices(3));

  const int64_t before = c.status(job)["steps_done"];
  c.net().run_in_host(2, "ip link set eth0 down");
  // The coordinator loses h2 (no packet answers: its connections time out), relaunches
  // on h1 from a checkpoint, and the new generation trains past where the cut left it.
  REQUIRE(c.wait_state(
      job,
      [&](const nlohmann::json& s) {
        return s["state"] == "running" && s["generation"] >= 1 && s["steps_done"] >= before + 5;
      },
      180s));
  const auto st = c.status(job);
  INFO(st.dump(1));
  REQUIRE(st["failures"].size() >= 1);
  CHECK(st["layout"] == "2x1x1");
  CHECK(resume_step(st) >= 5);
  CHECK(worker_hosts(st) == std::set<std::string>{"h1"});
  const std::string run_dir = st["run_dir"], gen = "g" + st["generation"].dump();
  // The rank on h1 kept its process (and its log) for the new generation; the one from h2
  // was started anew on h1.
  for (const auto& w : st["workers"]) {
    const std::string started = run_dir + "/workers/" + w["rank"].dump() + "." + gen + ".log";
    const std::string log =
        std::filesystem::exists(started) ? started : run_dir + "/workers/" + w["rank"].dump() + ".log";
    CHECK(read_file(log).find("data plane: " + Netns::address(1) + "\n") != std::string::npos);
  }
  INFO(run_dir << "/events.log:\n" << read_file(run_dir + "/events.log"));
  CHECK(read_file(run_dir + "/events.log").find("1 rank(s) kept their process") != std::string::npos);

  REQUIRE(c.call({{"op", "cancel"}, {"job", job}})["ok"] == true);
  CHECK(c.wait_state(
      job, [](const nlohmann::json& s) { return s["state"] == "cancelled"; }, 60s));
}

}  // namespace
}  // namespace troupe::test

// Probes once whether network namespaces can be made; when not, every test exits 77
// (ctest: skipped) with the reason. Listing the tests (catch_discover_tests at build
// time) needs no namespaces and probes nothing.
int main(int argc, char** argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    listing = listing || a.rfind("--list", 0) == 0 || a == "-l" || a == "-h" || a == "--help";
  }
  if (!listing) {
    const std::string why = troupe::test::netns_unavailable();
    if (!why.empty()) {
      std::cout << "skipped: cannot create network namespaces: " << why << std::endl;
      return 77;
    }
  }
  return Catch::Session().run(argc, argv);
}

// Loss curves of the multihost tests: a layout file as a job spec, the curve it
// trains on one host (the reference), and the check that another run kept to it.
#pragma once

#include <catch2/catch.hpp>
#include <map>

#include "tests/fault/fault.hpp"
#include "tests/multihost/netns.hpp"

namespace troupe::test {

// A layout file of configs/layouts, renamed, with `steps` steps.
inline std::string layout_spec(const std::string& layout, const std::string& name, int steps) {
  std::string s = read_file(std::string(TROUPE_SOURCE_DIR) + "/configs/layouts/" + layout + ".yaml");
  auto replace = [&](const std::string& from, const std::string& to) {
    auto p = s.find(from);
    if (p != std::string::npos) s.replace(p, from.size(), to);
  };
  replace("\nname: ", "\nname: " + name + "-");  // the file's name stays as a suffix
  replace("steps: 10", "steps: " + std::to_string(steps));
  return s;
}

// The loss curve of `spec` on one host: a loopback cluster, one agent with `devices`.
inline std::map<int64_t, double> one_host_curve(const std::string& spec, int devices) {
  Cluster c;
  REQUIRE(c.ready());
  c.add_agent("cpu:" + std::to_string(devices));
  REQUIRE(c.wait_devices(devices));
  const std::string job = c.call({{"op", "submit"}, {"spec", spec}})["job"];
  REQUIRE(c.wait_state(job, "succeeded", std::chrono::seconds(180)));
  const std::string run_dir = c.status(job)["run_dir"];
  // One host: the data plane stays on loopback.
  CHECK(read_file(run_dir + "/workers/0.log").find("data plane: 127.0.0.1\n") != std::string::npos);
  return loss_curve(run_dir);
}

// Every step of `want` (`steps` of them) in `got`, its loss within 1e-6.
inline void check_same_curve(const std::map<int64_t, double>& got, const std::map<int64_t, double>& want,
                             int steps) {
  REQUIRE(want.size() == size_t(steps));
  REQUIRE(got.size() == want.size());
  for (const auto& [step, loss] : want) {
    INFO("step " << step);
    REQUIRE(got.count(step) == 1);
    CHECK(std::abs(got.at(step) - loss) <= 1e-6);
  }
}

}  // namespace troupe::test

// One plan, seen the same from every side: `troupe status` (the coordinator's
// plan), the worker logs (the assignment each rank got, and the plan its engine
// rebuilt and checked) and the rank grid of plan/grid.hpp agree on every rank.
#include <catch2/catch.hpp>
#include <regex>
#include <set>

#include "plan/grid.hpp"
#include "tests/control/cluster.hpp"
#include "tests/support/support.hpp"

using namespace troupe::test;
using nlohmann::json;
using namespace std::chrono_literals;

TEST_CASE("2x2x2: status and the worker logs agree on every rank's grid coordinates and layers",
          "[control][plan][multiprocess]") {
  Cluster c;
  REQUIRE(c.ready());
  c.add_agent("cpu:4");
  c.add_agent("cpu:4");
  REQUIRE(c.wait_devices(8));
  std::string spec = read_file(std::string(TROUPE_SOURCE_DIR) + "/configs/layouts/tiny_dp2_pp2_tp2.yaml");
  spec.replace(spec.find("steps: 10"), 9, "steps: 3");
  auto sub = c.call({{"op", "submit"}, {"spec", spec}, {"filename", "grid.yaml"}});
  REQUIRE(sub["ok"] == true);
  const std::string job = sub["job"];
  REQUIRE(c.wait_state(job, "succeeded"));

  const json st = c.status(job);
  REQUIRE(st["workers"].size() == 8);
  const troupe::plan::Layout layout{2, 2, 2};
  const std::regex place_re(R"(rank (\d+): dp (\d+) pp (\d+) tp (\d+), layers (\S.*))");
  std::set<std::string> stage_layers[2];
  for (int r = 0; r < 8; ++r) {
    INFO("rank " << r);
    const json& w = st["workers"][size_t(r)];
    const troupe::plan::Coord want = troupe::plan::coord_of(layout, r);
    CHECK(w["dp"] == want.d);
    CHECK(w["pp"] == want.p);
    CHECK(w["tp"] == want.t);
    const std::string layers = w["layers"];
    stage_layers[want.p].insert(layers);
    const std::string place = "rank " + std::to_string(r) + ": dp " + std::to_string(want.d) + " pp " +
                              std::to_string(want.p) + " tp " + std::to_string(want.t) + ", layers " + layers;
    CHECK(w["place"] == place);
    const std::string log = read_file(std::string(st["run_dir"]) + "/workers/" + std::to_string(r) + ".log");
    CHECK(log.find("assignment: " + place + " of layout 2x2x2") != std::string::npos);
    CHECK(log.find("plan: layout 2x2x2") != std::string::npos);
    std::smatch m;
    REQUIRE(std::regex_search(log, m, place_re));
    CHECK(std::stoi(m[1]) == r);
  }
  // Each pipeline stage has one set of layers, shared by its four ranks; the first holds the
  // embedding, the last the head.
  REQUIRE(stage_layers[0].size() == 1);
  REQUIRE(stage_layers[1].size() == 1);
  CHECK(stage_layers[0].begin()->find("+embedding") != std::string::npos);
  CHECK(stage_layers[1].begin()->find("+head") != std::string::npos);
}

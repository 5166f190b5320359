// The client API's submit, answered from the coordinator's state without actors or sockets.
#include <catch2/catch.hpp>
#include <filesystem>
#include <set>

#include "actors/version.hpp"
#include "coordinator/api.hpp"
#include "coordinator/state.hpp"
#include "core/spec.hpp"
#include "tests/support/sized_job.hpp"

using namespace troupe::coord;

namespace {

const char* kSpec =
    "name: tiny\nmodel: {type: gpt, seq_len: 16, d_model: 32, n_layers: 2, n_heads: 2}\n"
    "data: {source: synthetic}\n"
    "train:\n  steps: 2\n  global_batch: 4\n";

nlohmann::json submit(CoordinatorState& st, const std::string& spec, Actions* a) {
  return handle_api_request(st, {{"op", "submit"}, {"spec", spec}, {"filename", "job.yaml"}}, a);
}

}  // namespace

TEST_CASE("api submit: what this build cannot run is invalid_spec at file:line:col, nothing queued",
          "[api][spec]") {
  CoordinatorState st((std::filesystem::temp_directory_path() / "troupe-api-test").string(), 7);
  Actions a;
  // cuda with a pipeline: refused at parallel.pipeline (a CUDA build) or at the device (a build without).
  auto cuda = submit(st, std::string(kSpec) + "resources:\n  device: cuda\nparallel: {pipeline: 2}\n", &a);
  CHECK(cuda["error"] == "invalid_spec");
  CHECK(cuda["message"].get<std::string>().find(
            troupe::build_has_cuda()
                ? "job.yaml:9:22: error: resources.device: cuda trains over data parallelism only"
                : "job.yaml:8:11: error: resources.device: cuda: this build has no "
                  "CUDA kernels") != std::string::npos);
  REQUIRE(cuda["diagnostics"].size() == 1);
  CHECK(a.events.empty());
  CHECK(st.list_json()["jobs"].empty());

  // The same spec on the CPU is queued, in fp32 and in bf16.
  auto ok = submit(st, kSpec, &a);
  CHECK(ok["ok"] == true);
  CHECK(st.list_json()["jobs"].size() == 1);
  auto bf16 = submit(st, std::string(kSpec) + "  precision: bf16\n", &a);
  CHECK(bf16["ok"] == true);
  CHECK(st.list_json()["jobs"].size() == 2);
}

TEST_CASE("api status: a big job's answer lists one page of workers and sums up every rank", "[api]") {
  CoordinatorState st((std::filesystem::temp_directory_path() / "troupe-api-test").string(),
                      troupe::actors::kProtocolVersion);
  const std::string id = troupe::test::sized_job(st, 1024);
  Actions a;
  auto status = [&](nlohmann::json req) {
    req["op"] = "status";
    req["job"] = id;
    return handle_api_request(st, req, &a);
  };

  // By default the first 256 workers, in full; every rank in the summary.
  auto first = status({});
  REQUIRE(first["ok"] == true);
  const auto& j = first["job"];
  CHECK(j["workers_total"] == 1024);
  CHECK(j["workers_from"] == 0);
  CHECK(j["workers_next"] == 256);
  REQUIRE(j["workers"].size() == 256);
  CHECK(j["workers"][0]["rank"] == 0);
  CHECK(j["workers"][255]["rank"] == 255);
  CHECK(j["workers"][255].contains("place"));
  const auto& sum = j["worker_summary"];
  CHECK(sum["ranks"] == 1024);
  CHECK(sum["registered"] == 1024);
  CHECK(sum["done"] == 0);
  CHECK(sum["exited"] == 0);
  // Ranks 0, 97, ..., 970 answered "allreduce", the others "forward": two groups of ranges.
  REQUIRE(sum["where"].size() == 2);
  CHECK(sum["where"]["step 12: allreduce (dp)"] == "0,97,194,291,388,485,582,679,776,873,970");
  CHECK(sum["where"]["step 12: forward layer 3"].get<std::string>().rfind("1-96,98-193,", 0) == 0);
  CHECK(sum["heartbeat_age_max_s"].get<double>() >= 0);
  CHECK(sum.contains("heartbeat_age_max_rank"));

  // Any page; the last one names no next.
  auto last = status({{"workers_from", 1000}, {"workers_limit", 100}});
  REQUIRE(last["job"]["workers"].size() == 24);
  CHECK(last["job"]["workers"][0]["rank"] == 1000);
  CHECK_FALSE(last["job"].contains("workers_next"));
  CHECK(status({{"workers_from", 5000}})["job"]["workers"].empty());
  auto all = status({{"workers_limit", 4096}});
  CHECK(all["job"]["workers"].size() == 1024);
  CHECK_FALSE(all["job"].contains("workers_next"));

  // A page that is no page is refused by name.
  for (const nlohmann::json& bad :
       {nlohmann::json{{"workers_limit", 0}}, nlohmann::json{{"workers_limit", 4097}},
        nlohmann::json{{"workers_from", -1}}, nlohmann::json{{"workers_from", "3"}},
        nlohmann::json{{"workers_limit", 1.5}}}) {
    auto r = status(bad);
    CHECK(r["ok"] == false);
    CHECK(r["error"] == "bad_request");
    CHECK(r["message"].get<std::string>().find("must be a whole number") != std::string::npos);
  }
}

TEST_CASE("api status: worker_fields gives each worker only the fields named, and refuses others by name",
          "[api]") {
  CoordinatorState st((std::filesystem::temp_directory_path() / "troupe-api-test").string(),
                      troupe::actors::kProtocolVersion);
  const std::string id = troupe::test::sized_job(st, 64);
  Actions a;
  auto status = [&](nlohmann::json req) {
    req["op"] = "status";
    req["job"] = id;
    return handle_api_request(st, req, &a);
  };
  const auto full = status({});
  REQUIRE(full["ok"] == true);
  const auto& fw = full["job"]["workers"];
  REQUIRE(fw.size() == 64);
  // By default every field, the plan's too.
  for (const auto& name : WorkerFields::names()) CHECK(fw[5].contains(name));

  const auto brief = status({{"worker_fields", {"rank", "host", "pid", "heartbeat_age_s"}}});
  REQUIRE(brief["ok"] == true);
  const auto& bw = brief["job"]["workers"];
  REQUIRE(bw.size() == 64);
  for (size_t r = 0; r < bw.size(); ++r) {
    CHECK(bw[r].size() == 4);
    CHECK(bw[r]["rank"] == fw[r]["rank"]);
    CHECK(bw[r]["host"] == fw[r]["host"]);
    CHECK(bw[r]["pid"] == fw[r]["pid"]);
    CHECK(bw[r]["heartbeat_age_s"].get<double>() >= 0);
  }
  // The summary and the job's own fields are the same whatever the workers carry.
  CHECK(brief["job"]["worker_summary"]["where"] == full["job"]["worker_summary"]["where"]);
  CHECK(brief["job"]["layout"] == full["job"]["layout"]);
  // Only the plan's fields: worked out as in the full answer.
  const auto plan = status({{"worker_fields", {"place", "tp"}}});
  CHECK(plan["job"]["workers"][9]["place"] == fw[9]["place"]);
  CHECK(plan["job"]["workers"][9]["tp"] == fw[9]["tp"]);
  CHECK(plan["job"]["workers"][9].size() == 2);

  for (const nlohmann::json& bad :
       {nlohmann::json("rank"), nlohmann::json::array(), nlohmann::json{"rank", "secret"},
        nlohmann::json{"rank", 3}, nlohmann::json(std::vector<std::string>(16, "rank"))}) {
    auto r = status({{"worker_fields", bad}});
    CHECK(r["ok"] == false);
    CHECK(r["error"] == "bad_request");
    CHECK(r["message"].get<std::string>().find("'worker_fields'") != std::string::npos);
  }
  CHECK(status({{"worker_fields", {"rank", "secret"}}})["message"].get<std::string>().find("'secret'") !=
        std::string::npos);
}

TEST_CASE("api list: the agents come a page at a time, with their total", "[api]") {
  CoordinatorState st((std::filesystem::temp_directory_path() / "troupe-api-test").string(),
                      troupe::actors::kProtocolVersion);
  troupe::test::sized_job(st, 4096);  // 512 agents of 8 devices, all held
  Actions a;
  auto first = handle_api_request(st, {{"op", "list"}}, &a);
  REQUIRE(first["ok"] == true);
  CHECK(first["agents_total"] == 512);
  CHECK(first["agents"].size() == 256);
  CHECK(first["agents_next"] == 256);
  CHECK(first["devices"]["cpu"]["total"] == 4096);
  CHECK(first["devices"]["cpu"]["free"] == 0);
  REQUIRE(first["jobs"].size() == 1);
  auto rest = handle_api_request(st, {{"op", "list"}, {"agents_from", 256}, {"agents_limit", 4096}}, &a);
  CHECK(rest["agents"].size() == 256);
  CHECK_FALSE(rest.contains("agents_next"));
  std::set<std::string> ids;
  for (const auto* page : {&first, &rest})
    for (const auto& ag : (*page)["agents"]) ids.insert(ag["id"].get<std::string>());
  CHECK(ids.size() == 512);
  CHECK(handle_api_request(st, {{"op", "list"}, {"agents_limit", 0}}, &a)["error"] == "bad_request");
}

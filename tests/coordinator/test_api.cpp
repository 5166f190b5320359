// The client API's submit, answered from the coordinator's state without actors or sockets.
#include <catch2/catch.hpp>
#include <filesystem>

#include "coordinator/api.hpp"
#include "coordinator/state.hpp"
#include "core/spec.hpp"

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

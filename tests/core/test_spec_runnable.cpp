// What a valid spec asks that this build cannot run: reported at the key, with a hint.
#include <catch2/catch.hpp>
#include <filesystem>

#include "core/spec.hpp"

namespace fs = std::filesystem;
using troupe::JobSpec;
using troupe::parse_spec;

namespace {

const char* kSpec = R"(name: tiny
model:
  type: gpt
  seq_len: 32
  d_model: 64
  n_layers: 2
  n_heads: 4
data:
  source: synthetic
train:
  steps: 10
  global_batch: 8
)";

}  // namespace

TEST_CASE(
    "runnable: cuda runs data-parallel in a CUDA build, and a pipeline, a tensor group, ZeRO or a build "
    "without CUDA kernels are refused at the key",
    "[core][spec]") {
  const std::string text = std::string(kSpec) + "  precision: bf16\nresources:\n  device: cuda\n";
  const JobSpec s = parse_spec(text, "job.yaml");  // a valid spec: it is data as well as a job
  const auto issues = troupe::runnable_issues(s);
  if (troupe::build_has_cuda()) {
    CHECK(issues.empty());
  } else {
    REQUIRE(issues.size() == 1);
    CHECK(issues[0].str() ==
          "job.yaml:15:11: error: resources.device: cuda: this build has no CUDA kernels (it was configured "
          "without nvcc and NCCL)\n"
          "  hint: build troupe where CUDA and NCCL are installed (docs/gpu.md), or use device: cpu");
  }

  // Data parallelism runs; a pipeline is refused at its degree in a CUDA build (at the device key
  // otherwise).
  const JobSpec data2 =
      parse_spec(std::string(kSpec) + "parallel:\n  data: 2\nresources:\n  device: cuda\n", "data2.yaml");
  CHECK(troupe::runnable_issues(data2).size() == (troupe::build_has_cuda() ? 0u : 1u));
  const JobSpec pp2 =
      parse_spec(std::string(kSpec) + "parallel:\n  pipeline: 2\nresources:\n  device: cuda\n", "pp2.yaml");
  const auto more = troupe::runnable_issues(pp2);
  REQUIRE(more.size() == 1);
  if (troupe::build_has_cuda()) {
    CHECK(
        more[0].str() ==
        "pp2.yaml:14:13: error: resources.device: cuda trains over data parallelism only in this engine, not "
        "pipeline 2, tensor 1: the pipeline's and the tensor group's transfers on device memory are not "
        "built yet\n"
        "  hint: set parallel.pipeline and parallel.tensor to 1 (parallel.data may be any), or use device: "
        "cpu");
    try {
      troupe::require_runnable(pp2);
      FAIL("require_runnable accepted cuda with a pipeline");
    } catch (const troupe::SpecError& e) {
      REQUIRE(e.diagnostics.size() == 1);
      CHECK(std::string(e.what()).find("pp2.yaml:14:13:") != std::string::npos);
    }
    const JobSpec zero = parse_spec(std::string(kSpec) + "  zero: 1\nresources: {device: cuda}\n", "z.yaml");
    REQUIRE(troupe::runnable_issues(zero).size() == 1);
    CHECK(troupe::runnable_issues(zero)[0].line == 13);
    CHECK(troupe::runnable_issues(zero)[0].str().find("cuda runs train.zero 0 only") != std::string::npos);
  } else {
    CHECK(more[0].line == 16);
  }

  for (const char* p : {"bf16", "fp16"}) {
    const JobSpec mixed = parse_spec(std::string(kSpec) + "  precision: " + p + "\n", "mixed.yaml");
    INFO(p);
    CHECK(troupe::runnable_issues(mixed).empty());
  }

  // A flow mapping points at the value too.
  const JobSpec flow =
      parse_spec(std::string(kSpec) + "resources: {device: cuda}\nparallel: {tensor: 2}\n", "flow.yaml");
  REQUIRE(troupe::runnable_issues(flow).size() == 1);
  CHECK(troupe::runnable_issues(flow)[0].line == (troupe::build_has_cuda() ? 14 : 13));
  CHECK(troupe::runnable_issues(flow)[0].col == (troupe::build_has_cuda() ? 20 : 21));
}

TEST_CASE("runnable: fp32 on cpu, and every shipped config, has no issues", "[core][spec]") {
  const JobSpec s =
      parse_spec(std::string(kSpec) + "  precision: fp32\nresources: {device: cpu}\n", "a.yaml");
  CHECK(troupe::runnable_issues(s).empty());
  CHECK_NOTHROW(troupe::require_runnable(s));
  CHECK(troupe::runnable_issues(parse_spec(kSpec, "b.yaml")).empty());
  for (const auto& e : fs::recursive_directory_iterator(fs::path(TROUPE_SOURCE_DIR) / "configs"))
    if (e.path().extension() == ".yaml" && e.path().parent_path().filename() != "hardware") {  // job specs
      INFO(e.path().string());
      CHECK(troupe::runnable_issues(troupe::load_spec(e.path().string())).empty());
    }
}

TEST_CASE("runnable: a spec built in code is refused for the file as a whole", "[core][spec]") {
  JobSpec s = parse_spec(kSpec, "a.yaml");
  s.positions.clear();
  s.source_file.clear();
  s.parallel.tensor = 2;
  s.parallel.sequence_parallel = true;
  const auto issues = troupe::runnable_issues(s);
  REQUIRE(issues.size() == 1);
  CHECK(issues[0].line == 0);
  CHECK(issues[0].str().rfind("<job spec>: error: parallel.sequence_parallel is planned", 0) == 0);
  // The resolved form of a parsed spec points into the resolved text.
  s.source_file = "a.yaml";
  const JobSpec back = parse_spec(troupe::to_yaml(s), "spec.yaml");
  REQUIRE(troupe::runnable_issues(back).size() == 1);
  CHECK(troupe::runnable_issues(back)[0].file == "spec.yaml");
  CHECK(troupe::runnable_issues(back)[0].line > 1);
}

TEST_CASE("runnable: ZeRO 3 parses, and is refused at train.zero, while 0 to 2 run", "[core][spec][zero]") {
  const JobSpec s = parse_spec(std::string(kSpec) + "  zero: 3\n", "job.yaml");
  const auto issues = troupe::runnable_issues(s);
  REQUIRE(issues.size() == 1);
  CHECK(issues[0].line == 13);  // the line of `zero: 3`
  CHECK(issues[0].str().find("train.zero: 3 (sharded parameters, gathered per layer) is not implemented") !=
        std::string::npos);
  for (int z : {0, 1, 2}) {
    INFO("zero " << z);
    CHECK(troupe::runnable_issues(
              parse_spec(std::string(kSpec) + "  zero: " + std::to_string(z) + "\n", "z.yaml"))
              .empty());
  }
}

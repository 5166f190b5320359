// Hardware profiles: the compiled-in ones read, a written one reads back, and a hostile file
// gets a named error at its line and column, never a crash.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/error.hpp"
#include "plan/hardware.hpp"

using namespace troupe;
using namespace troupe::plan;

namespace {

std::string first_error(const std::string& yaml) {
  try {
    parse_hardware(yaml, "hw.yaml");
  } catch (const SpecError& e) {
    REQUIRE(!e.diagnostics.empty());
    return e.diagnostics.front().str();
  }
  return "";
}

const char* kMinimal = R"(name: tiny
device: cpu
devices_per_node: 2
memory: 1GiB
memory_bandwidth: 1e10
peak_flops: {fp32: 1e11, bf16: 1e11, fp16: 5e10}
network: {intra_node: {latency: 1e-5, bandwidth: 1e9}}
)";

}  // namespace

TEST_CASE("hardware: the built-in profiles", "[plan][hardware]") {
  const auto names = builtin_hardware_names();
  for (const char* n : {"a100-80gb", "h100-sxm", "h200-sxm", "cpu"})
    CHECK(std::find(names.begin(), names.end(), std::string(n)) != names.end());
  const HardwareProfile a = builtin_hardware("a100-80gb");
  CHECK(a.device == ProfileDevice::cuda);
  CHECK(a.devices_per_node == 8);
  CHECK(a.memory == uint64_t(80) << 30);
  CHECK(a.peak(DType::bf16) == 312e12);
  CHECK(a.memory_bandwidth == 2.039e12);
  CHECK(a.intra_node.link.bandwidth == 300e9);
  CHECK(a.inter_node.link.bandwidth == 25e9);
  const HardwareProfile h = builtin_hardware("h200-sxm");
  CHECK(h.memory == uint64_t(141e9));
  CHECK(h.peak(DType::bf16) == builtin_hardware("h100-sxm").peak(DType::bf16));
  CHECK(h.memory_bandwidth > builtin_hardware("h100-sxm").memory_bandwidth);
  CHECK_THROWS_WITH(builtin_hardware("tpu-v9"), Catch::Contains("the built-in ones are"));
  CHECK(default_hardware_name(DeviceKind::cpu) == "cpu");
}

TEST_CASE("hardware: a profile reads back what it wrote", "[plan][hardware]") {
  for (const auto& n : builtin_hardware_names()) {
    const HardwareProfile p = builtin_hardware(n);
    const HardwareProfile q = parse_hardware(to_yaml(p), "again.yaml");
    CHECK(to_yaml(q) == to_yaml(p));
  }
  HardwareProfile p = parse_hardware(kMinimal, "hw.yaml");
  CHECK(p.inter_node.link.bandwidth == p.intra_node.link.bandwidth);  // one node: no other tier
  p.gemm_table.push_back({256, 1024, 768, GemmOp::tn, DType::bf16, 3.5e10});
  p.intra_node.allreduce = {2e-5, 3e9};
  const HardwareProfile q = parse_hardware(to_yaml(p), "again.yaml");
  REQUIRE(q.gemm_table.size() == 1);
  CHECK(q.gemm_table[0].op == GemmOp::tn);
  CHECK(q.gemm_table[0].dtype == DType::bf16);
  CHECK(q.gemm_table[0].flops_per_s == 3.5e10);
  CHECK(q.intra_node.allreduce.bandwidth == 3e9);
}

TEST_CASE("hardware: a bad profile is refused at file:line:col with a hint", "[plan][hardware]") {
  CHECK_THAT(first_error(std::string(kMinimal) + "memory_bandwith: 1e10\n"),
             Catch::Contains("hw.yaml:8:1: error: unknown key 'memory_bandwith'"));
  CHECK_THAT(first_error(std::string(kMinimal) + "kernel_overhead: -1\n"),
             Catch::Contains("hw.yaml:8:18: error: 'kernel_overhead' must be a number in [0, 1]"));
  CHECK_THAT(first_error(std::string(kMinimal) + "comm_overlap: lots\n"), Catch::Contains("got 'lots'"));
  CHECK_THAT(first_error(std::string(kMinimal) + "step_overhead: .nan\n"), Catch::Contains("step_overhead"));
  CHECK_THAT(first_error(std::string(kMinimal) +
                         "gemm: {table: [{m: 1, n: 2, k: 3, op: xy, dtype: fp32, flops: 1}]}\n"),
             Catch::Contains("'gemm.table[0].op' must be one of nt, nn, tn"));
  CHECK_THAT(first_error("name: x\n"), Catch::Contains("'device' is missing"));
  CHECK_THAT(first_error("[1, 2]"), Catch::Contains("a YAML mapping"));
  CHECK_THAT(first_error("name: {a: [1,"), Catch::Contains("not valid YAML"));
  CHECK_THAT(first_error(std::string(kMinimal) + "name: again\n"), Catch::Contains("duplicate key 'name'"));
  std::string bad_name = kMinimal;
  bad_name.replace(bad_name.find("tiny"), 4, "../etc");
  CHECK_THAT(first_error(bad_name), Catch::Contains("'name' must be 1 to 64 letters"));
}

TEST_CASE("hardware: a spec names a profile, never a path, and files come from the command line",
          "[plan][hardware]") {
  CHECK(valid_hardware_name("h100-sxm"));
  CHECK(valid_hardware_name("my_box.v2"));
  CHECK(!valid_hardware_name(""));
  CHECK(!valid_hardware_name(".."));
  CHECK(!valid_hardware_name("a/b"));
  CHECK(!valid_hardware_name(std::string(65, 'a')));
  CHECK_THROWS_WITH(find_hardware("../../etc/passwd"), Catch::Contains("not a hardware profile name"));

  const auto dir = std::filesystem::temp_directory_path() / ("troupe-hw-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  ::setenv("TROUPE_HARDWARE_DIR", dir.c_str(), 1);
  CHECK(hardware_dir() == dir.string());
  // No calibrated file: the built-in one. A calibrated one of that name wins.
  CHECK(find_hardware("cpu").source == "built-in:cpu");
  {
    std::ofstream f(dir / "cpu.yaml");
    f << std::string(kMinimal);
  }
  CHECK(find_hardware("cpu").name == "tiny");
  CHECK(load_hardware((dir / "cpu.yaml").string()).name == "tiny");
  // A directory where the file should be is not read as one.
  std::filesystem::create_directories(dir / "odd.yaml");
  CHECK_THROWS_WITH(find_hardware("odd"), Catch::Contains("unknown hardware profile 'odd'"));
  // Too large a file is refused before it is parsed.
  {
    std::ofstream f(dir / "huge.yaml");
    f << std::string(kMinimal) << "# " << std::string(size_t(1) << 20, 'x') << "\n";
  }
  CHECK_THROWS_WITH(load_hardware((dir / "huge.yaml").string()), Catch::Contains("at most"));
  ::unsetenv("TROUPE_HARDWARE_DIR");
  std::filesystem::remove_all(dir);
}

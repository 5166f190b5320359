// Failures that a restart would only repeat: the job fails at once with the cause,
// instead of burning fault.max_restarts on the same error.
#include <sys/mount.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>

#include "checkpoint/checkpoint.hpp"
#include "tests/fault/fault.hpp"
#include "tests/support/support.hpp"

using namespace troupe::test;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

bool ended(const json& s) {
  return s["state"] == "failed" || s["state"] == "succeeded" || s["state"] == "cancelled";
}

}  // namespace

TEST_CASE("a setup error that repeats before the first step fails the job after one restart, with its cause",
          "[fault][multiprocess]") {
  Cluster c;
  REQUIRE(c.ready());
  c.add_agent("cpu:2");
  REQUIRE(c.wait_devices(2));
  // The file to start from is not there: every generation fails the same way while setting up.
  std::string spec = fault_spec("missing", 2, 50, 10, "fault:\n  max_restarts: 5\n");
  auto at = spec.find("model:");
  REQUIRE(at != std::string::npos);
  spec.insert(spec.find('\n', at) + 1, "  init_from: " + c.dir() + "/no-such-model.safetensors\n");
  std::string job = c.call({{"op", "submit"}, {"spec", spec}})["job"];
  REQUIRE(!job.empty());
  REQUIRE(c.wait_state(job, ended, 120s));
  auto st = c.status(job);
  CHECK(st["state"] == "failed");
  CHECK(st["restarts"] == 1);  // one retry shows it repeats; then no more
  std::string reason = st["reason"];
  INFO(reason);
  CHECK(reason.find("no-such-model.safetensors") != std::string::npos);
  CHECK(reason.find("a setup error that a restart repeats") != std::string::npos);
}

TEST_CASE("a checkpoint disk that fills up fails the job at once, says so, and leaves no partial step",
          "[fault][multiprocess]") {
  const std::string dir = troupe::testing::temp_dir("disk_full");
  const std::string mnt = dir + "/small";
  std::filesystem::create_directories(mnt);
  // A real full disk: a 6 MiB tmpfs (needs root; skipped with a message where mount is refused).
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=6m") != 0) {
    WARN("skipped: cannot mount a small tmpfs here (" << std::strerror(errno) << ")");
    return;
  }
  struct Unmount {
    std::string p;
    ~Unmount() { ::umount2(p.c_str(), MNT_DETACH); }
  } unmount{mnt};
  {
    Cluster c;
    REQUIRE(c.ready());
    c.add_agent("cpu:1");
    REQUIRE(c.wait_devices(1));
    // Each checkpoint of the tiny model takes 2.6 MB and all are kept: the third does not fit.
    std::string spec =
        fault_spec("full", 1, troupe::testing::kEndlessSteps, 5, "fault:\n  max_restarts: 5\n");
    auto keep = spec.find("  keep: 3");
    REQUIRE(keep != std::string::npos);
    spec.replace(keep, 9, "  keep: 1000\n  dir: " + mnt + "/ckpt");
    auto sub = c.call({{"op", "submit"}, {"spec", spec}});
    INFO(sub.dump());
    REQUIRE(sub["ok"] == true);
    std::string job = sub["job"];
    REQUIRE(c.wait_state(job, ended, 120s));
    auto st = c.status(job);
    CHECK(st["state"] == "failed");
    CHECK(st["restarts"] == 0);
    CHECK(st["failure"] == "disk_full");
    std::string reason = st["reason"];
    INFO(reason);
    CHECK(reason.find("No space left on device") != std::string::npos);
    CHECK(reason.find(mnt + "/ckpt") != std::string::npos);
    // What was committed before is intact; nothing half-written is left.
    int committed = 0;
    for (const auto& e : std::filesystem::directory_iterator(mnt + "/ckpt")) {
      const std::string name = e.path().filename().string();
      CHECK(name.find(".tmp") == std::string::npos);
      if (name.rfind("step_", 0) == 0) {
        CHECK_NOTHROW(troupe::checkpoint::verify(e.path().string()));
        ++committed;
      }
    }
    CHECK(committed >= 1);
  }
  ::umount2(mnt.c_str(), MNT_DETACH);
  std::filesystem::remove_all(dir);
}

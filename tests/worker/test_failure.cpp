// What a rank reports when its training throws (worker/failure.hpp).
#include <catch2/catch.hpp>
#include <string>

#include "checkpoint/checkpoint.hpp"
#include "comm/error.hpp"
#include "core/spec.hpp"
#include "worker/engine.hpp"
#include "worker/failure.hpp"

using troupe::FailureCause;
using troupe::worker::failure_of;

namespace {

template <class E>
troupe::worker::WorkerFailure of(E e, const std::string& abort_reason = "") {
  return failure_of(std::make_exception_ptr(e), abort_reason);
}

}  // namespace

TEST_CASE("worker failure: each exception maps to its cause and keeps its message", "[failure]") {
  auto spec = of(troupe::SpecError());
  CHECK(spec.cause == FailureCause::invalid_spec);
  auto disk = of(troupe::checkpoint::DiskFullError("ckpt/step_4.tmp: No space left on device"));
  CHECK(disk.cause == FailureCause::disk_full);
  CHECK(disk.message == "ckpt/step_4.tmp: No space left on device");
  // A full disk is a checkpoint error, but not every checkpoint error is a full disk.
  CHECK(of(troupe::checkpoint::CheckpointError("bad manifest")).cause == FailureCause::engine_error);
  auto engine = of(std::runtime_error("kernel failed"));
  CHECK(engine.cause == FailureCause::engine_error);
  CHECK(engine.message == "kernel failed");
  auto other = failure_of(std::make_exception_ptr(42), "");
  CHECK(other.cause == FailureCause::engine_error);
  CHECK_FALSE(other.message.empty());
  CHECK(failure_of(nullptr, "").cause == FailureCause::engine_error);
}

TEST_CASE("worker failure: an abort reports why the coordinator aborted", "[failure]") {
  auto a = of(troupe::EngineAborted(), "generation 0 aborted: worker_killed");
  CHECK(a.cause == FailureCause::aborted);
  CHECK(a.message == "generation 0 aborted: worker_killed");
  CHECK(of(troupe::EngineAborted()).message == "aborted");
}

TEST_CASE("worker failure: comm errors are comm_ and the data plane's own name", "[failure]") {
  using troupe::comm::CommErrc;
  for (CommErrc code : {CommErrc::peer_lost, CommErrc::timed_out, CommErrc::aborted,
                        CommErrc::invalid_argument, CommErrc::internal}) {
    auto f = of(troupe::comm::CommError(code, "allreduce on rank 1"));
    CHECK(std::string(troupe::to_string(f.cause)) == std::string("comm_") + troupe::comm::to_string(code));
    CHECK(f.message.find("allreduce on rank 1") != std::string::npos);
  }
}

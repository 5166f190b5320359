#include "core/failure.hpp"

#include <cstddef>

namespace troupe {

namespace {

// kFailureCauses holds each cause once, in declaration order.
constexpr bool in_order() {
  std::size_t i = 0;
  for (FailureCause c : kFailureCauses)
    if (static_cast<std::size_t>(c) != i++) return false;
  return i == static_cast<std::size_t>(FailureCause::no_devices) + 1;
}
static_assert(in_order(), "kFailureCauses must list every FailureCause in declaration order");

}  // namespace

const char* to_string(FailureCause cause) {
  switch (cause) {
    case FailureCause::invalid_spec:
      return "invalid_spec";
    case FailureCause::disk_full:
      return "disk_full";
    case FailureCause::engine_error:
      return "engine_error";
    case FailureCause::aborted:
      return "aborted";
    case FailureCause::comm_peer_lost:
      return "comm_peer_lost";
    case FailureCause::comm_timed_out:
      return "comm_timed_out";
    case FailureCause::comm_aborted:
      return "comm_aborted";
    case FailureCause::comm_invalid_argument:
      return "comm_invalid_argument";
    case FailureCause::comm_internal:
      return "comm_internal";
    case FailureCause::worker_failed:
      return "worker_failed";
    case FailureCause::worker_killed:
      return "worker_killed";
    case FailureCause::worker_exited:
      return "worker_exited";
    case FailureCause::worker_lost:
      return "worker_lost";
    case FailureCause::worker_stopped:
      return "worker_stopped";
    case FailureCause::launch_failed:
      return "launch_failed";
    case FailureCause::agent_lost:
      return "agent_lost";
    case FailureCause::protocol_mismatch:
      return "protocol_mismatch";
    case FailureCause::step_timeout:
      return "step_timeout";
    case FailureCause::no_devices:
      return "no_devices";
  }
  return "worker_failed";
}

std::optional<FailureCause> parse_failure_cause(std::string_view name) {
  for (FailureCause c : kFailureCauses)
    if (name == to_string(c)) return c;
  return std::nullopt;
}

bool reported_by_worker(FailureCause cause) {
  switch (cause) {
    case FailureCause::invalid_spec:
    case FailureCause::disk_full:
    case FailureCause::engine_error:
    case FailureCause::aborted:
    case FailureCause::comm_peer_lost:
    case FailureCause::comm_timed_out:
    case FailureCause::comm_aborted:
    case FailureCause::comm_invalid_argument:
    case FailureCause::comm_internal:
    case FailureCause::worker_failed:
      return true;
    default:
      return false;
  }
}

FailureCause reported_failure_cause(std::string_view name) {
  auto c = parse_failure_cause(name);
  return c && reported_by_worker(*c) ? *c : FailureCause::worker_failed;
}

bool survivable(FailureCause cause) {
  return cause == FailureCause::aborted || cause == FailureCause::comm_peer_lost ||
         cause == FailureCause::comm_timed_out || cause == FailureCause::comm_aborted;
}

bool retryable(FailureCause cause) {
  switch (cause) {
    case FailureCause::invalid_spec:
    case FailureCause::disk_full:
    case FailureCause::protocol_mismatch:
    case FailureCause::no_devices:
      return false;
    default:
      return true;
  }
}

}  // namespace troupe

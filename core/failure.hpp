// Why a rank or a generation of a job ended badly, by name.
//
// A worker names the cause of its own failure (WorkerResult::error_name); the
// coordinator names what it saw itself (a process that died, an agent that
// disconnected, a step that never completed) and decides from the cause
// whether a restart can help. The names are the text of logs, events, the job
// table and the API's `failure` field (docs/api.md lists them): they do not
// change. parse_failure_cause() reads one back; text from a peer goes through
// reported_failure_cause(), which believes only what a worker may report.
#pragma once

#include <optional>
#include <string_view>

namespace troupe {

enum class FailureCause {
  // ---- reported by the worker that failed (worker/failure.hpp)
  invalid_spec,           // the engine refused the resolved spec: every relaunch would too
  disk_full,              // a checkpoint write hit ENOSPC or EDQUOT: a relaunch fills the same disk
  engine_error,           // the training engine threw (the message is the engine's)
  aborted,                // the coordinator aborted the rank's generation before it failed otherwise
  comm_peer_lost,         // data plane: a peer closed its connection, died or failed the group
  comm_timed_out,         // data plane: a collective or transfer passed its deadline
  comm_aborted,           // data plane: the communicator was aborted
  comm_invalid_argument,  // data plane: bad rank, size or dtype, or a communicator to rebuild
  comm_internal,          // data plane: the backend reported something unexpected
  worker_failed,          // a worker failed without naming a cause a worker reports
  // ---- seen by the coordinator
  worker_killed,      // a worker process died of a signal
  worker_exited,      // a worker process exited before finishing
  worker_lost,        // the connection to a worker broke before it reported
  worker_stopped,     // a worker process stayed stopped (SIGSTOP, SIGTSTP): its agent saw it
  launch_failed,      // an agent could not start a worker process
  agent_lost,         // the agent holding one of the job's devices disconnected
  protocol_mismatch,  // a worker speaks another control-protocol version
  step_timeout,       // no step completed within the watchdog's limit
  no_devices,         // a recovering job found too few devices before its replacement deadline
};

// Every cause, in the order above.
inline constexpr FailureCause kFailureCauses[] = {
    FailureCause::invalid_spec,      FailureCause::disk_full,
    FailureCause::engine_error,      FailureCause::aborted,
    FailureCause::comm_peer_lost,    FailureCause::comm_timed_out,
    FailureCause::comm_aborted,      FailureCause::comm_invalid_argument,
    FailureCause::comm_internal,     FailureCause::worker_failed,
    FailureCause::worker_killed,     FailureCause::worker_exited,
    FailureCause::worker_lost,       FailureCause::worker_stopped,
    FailureCause::launch_failed,     FailureCause::agent_lost,
    FailureCause::protocol_mismatch, FailureCause::step_timeout,
    FailureCause::no_devices,
};

// "invalid_spec", "comm_peer_lost" (comm_ + comm::to_string of the CommErrc), ...
const char* to_string(FailureCause cause);
// The cause whose to_string() is exactly `name`; nullopt for any other text.
std::optional<FailureCause> parse_failure_cause(std::string_view name);

// Whether a worker reports this cause itself (the first group above).
bool reported_by_worker(FailureCause cause);
// The cause a worker's report names: one that a worker reports, else
// worker_failed. An empty, unknown or coordinator-only name from a peer is not
// taken at its word (a worker cannot claim that its agent was lost).
FailureCause reported_failure_cause(std::string_view name);

// Whether a rank that failed with this cause is healthy and may serve a later generation
// of its job in the same process: its generation was aborted under it (aborted), or a peer
// failed it through the data plane (comm_peer_lost, comm_timed_out, comm_aborted).
bool survivable(FailureCause cause);

// Whether relaunching the job can help. A spec the engine refuses, a full
// checkpoint disk or another protocol version fail the same way every time, and
// no_devices ends a recovery that waited in vain.
bool retryable(FailureCause cause);

}  // namespace troupe

// The named cause (core/failure.hpp) of the exception that ended a rank's
// training: what the worker reports to the coordinator, which decides from the
// cause whether a restart can help.
#pragma once

#include <exception>
#include <string>

#include "core/failure.hpp"

namespace troupe::worker {

struct WorkerFailure {
  FailureCause cause = FailureCause::engine_error;
  std::string message;
};

// EngineAborted -> aborted, with `abort_reason` (why the coordinator aborted the
// rank; "" = "aborted") as the message; SpecError -> invalid_spec; DiskFullError
// -> disk_full; comm::CommError -> comm_<its code>; any other exception ->
// engine_error. Every message but an abort's is the exception's what().
WorkerFailure failure_of(std::exception_ptr error, const std::string& abort_reason);

}  // namespace troupe::worker

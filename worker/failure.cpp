#include "worker/failure.hpp"

#include "checkpoint/checkpoint.hpp"
#include "comm/error.hpp"
#include "core/spec.hpp"
#include "worker/engine.hpp"

namespace troupe::worker {

namespace {

// The data plane's own name for what went wrong: peer_lost, timed_out, ...
FailureCause comm_cause(comm::CommErrc code) {
  switch (code) {
    case comm::CommErrc::peer_lost:
      return FailureCause::comm_peer_lost;
    case comm::CommErrc::timed_out:
      return FailureCause::comm_timed_out;
    case comm::CommErrc::aborted:
      return FailureCause::comm_aborted;
    case comm::CommErrc::invalid_argument:
      return FailureCause::comm_invalid_argument;
    case comm::CommErrc::internal:
      return FailureCause::comm_internal;
  }
  return FailureCause::comm_internal;
}

}  // namespace

WorkerFailure failure_of(std::exception_ptr error, const std::string& abort_reason) {
  if (!error) return {FailureCause::engine_error, "failed without an exception"};
  try {
    std::rethrow_exception(error);
  } catch (const EngineAborted&) {
    return {FailureCause::aborted, abort_reason.empty() ? "aborted" : abort_reason};
  } catch (const SpecError& e) {
    return {FailureCause::invalid_spec, e.what()};
  } catch (const checkpoint::DiskFullError& e) {
    return {FailureCause::disk_full, e.what()};
  } catch (const comm::CommError& e) {
    return {comm_cause(e.code()), e.what()};
  } catch (const std::exception& e) {
    return {FailureCause::engine_error, e.what()};
  } catch (...) {
    return {FailureCause::engine_error, "an exception that is not a std::exception"};
  }
}

}  // namespace troupe::worker

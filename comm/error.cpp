#include "comm/error.hpp"

namespace troupe::comm {

const char* to_string(CommErrc code) {
  switch (code) {
    case CommErrc::peer_lost:
      return "peer_lost";
    case CommErrc::timed_out:
      return "timed_out";
    case CommErrc::aborted:
      return "aborted";
    case CommErrc::invalid_argument:
      return "invalid_argument";
    case CommErrc::internal:
      return "internal";
  }
  return "unknown";
}

CommError::CommError(CommErrc code, const std::string& message)
    : std::runtime_error(std::string(to_string(code)) + ": " + message), code_(code) {}

}  // namespace troupe::comm

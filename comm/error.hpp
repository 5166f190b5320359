// Named failures of the data plane.
//
// Every expected distributed failure (a peer died, a wait ran out, someone
// aborted the group, a caller passed inconsistent arguments) surfaces as a
// CommError whose code says which, and whose message names the operation, the
// rank, the peer when known and the group. Nothing in comm/ hangs or crashes on
// these paths.
#pragma once

#include <stdexcept>
#include <string>

namespace troupe::comm {

enum class CommErrc {
  peer_lost,         // a peer closed its connection, died or failed the group
  timed_out,         // the operation's deadline passed
  aborted,           // abort() was called on this communicator
  invalid_argument,  // bad rank, size, dtype, or a communicator that must be rebuilt
  internal,          // a backend reported something unexpected
};

const char* to_string(CommErrc code);

class CommError : public std::runtime_error {
 public:
  CommError(CommErrc code, const std::string& message);
  CommErrc code() const { return code_; }

 private:
  CommErrc code_;
};

}  // namespace troupe::comm

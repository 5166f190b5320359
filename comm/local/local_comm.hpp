// The `local` backend: ranks are threads of one process sharing a mailbox and
// a pointer table under one mutex. Same contract and errors as the network
// backends, so unit tests of everything above comm/ run without sockets.
#pragma once

#include <memory>

#include "comm/communicator.hpp"

namespace troupe::comm {

std::unique_ptr<Communicator> make_local_communicator(const CommConfig& cfg);

}  // namespace troupe::comm

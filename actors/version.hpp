// The control-plane protocol version (no CAF here: any code may include it).
// Bump it whenever a message type or an actor interface in protocol.hpp changes.
#pragma once

#include <cstdint>

namespace troupe::actors {

constexpr int32_t kProtocolVersion = 8;

}  // namespace troupe::actors

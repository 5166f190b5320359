// The control-plane protocol version (no CAF here: any code may include it).
// Bump it whenever a message type or an actor interface in protocol.hpp changes.
#pragma once

#include <cstdint>

namespace troupe::actors {

constexpr int32_t kProtocolVersion = 14;

// Hot spares (resources.spares): the n-th spare process of a job is launched and registered
// as rank kFirstSpareRank + n (mod kSpareRanks), a launch rank outside every world, until an
// Assignment gives it a place. Its agent knows it by that launch rank for its whole life.
constexpr int32_t kFirstSpareRank = 1 << 20;
constexpr int32_t kSpareRanks = 1 << 20;
constexpr bool is_spare_rank(int32_t rank) {
  return rank >= kFirstSpareRank && rank - kFirstSpareRank < kSpareRanks;
}

}  // namespace troupe::actors

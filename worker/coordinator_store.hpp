// The rendezvous store served by the coordinator, seen from a worker: a
// comm::Store whose keys live in the coordinator under (job, generation), so
// a relaunched generation never reads an older one's keys and a stale worker
// is refused. Every call is a request with a deadline; failures are
// comm::CommError (timed_out when a key never came, internal when refused).
// Includes CAF: only actor-hosting code includes this header.
#pragma once

#include <memory>
#include <string>

#include "actors/protocol.hpp"
#include "comm/store.hpp"

namespace troupe::worker {

std::shared_ptr<comm::Store> make_coordinator_store(
    caf::actor_system& sys, actors::coordinator_actor coordinator, std::string job_id, int generation,
    std::chrono::milliseconds request_timeout = std::chrono::milliseconds(10000));

}  // namespace troupe::worker

// The `gloo` backend: CPU ranks as processes over gloo's TCP transport, using
// only gloo's options API (allreduce, allgather, broadcast, barrier, unbound
// buffer send/recv); reduce-scatter is a ring over unbound buffers.
//
// Operations run on the calling thread with gloo's per-op timeout. abort()
// from another thread interrupts whatever gloo waits on: it makes gloo fail
// every pending wait of the context and close its connections (the path gloo
// takes on its own timeouts), so the caller gets CommError{aborted} and the
// peers fail fast with peer_lost. Any failure also closes the connections, so
// a dead rank's failure reaches every survivor, not only its ring neighbours.
#pragma once

#include <memory>

#include "comm/communicator.hpp"

namespace troupe::comm {

std::unique_ptr<Communicator> make_gloo_communicator(const CommConfig& cfg);

}  // namespace troupe::comm

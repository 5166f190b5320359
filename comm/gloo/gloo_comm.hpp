// The `gloo` backend: CPU ranks as processes over gloo's TCP transport, using
// only gloo's options API (allreduce, allgather, broadcast, barrier, unbound
// buffer send/recv); reduce-scatter is a ring over unbound buffers.
//
// Each communicator runs its gloo calls on one operation thread of its own, so
// the calling thread waits on a condition it controls: abort() wakes it at
// once, whatever gloo is blocked in. The operation thread then finishes by
// itself: abort and every failure close the context's connections, which makes
// the peers fail fast too (peer_lost), and every gloo wait has the op's timeout.
#pragma once

#include <memory>

#include "comm/communicator.hpp"

namespace troupe::comm {

std::unique_ptr<Communicator> make_gloo_communicator(const CommConfig& cfg);

}  // namespace troupe::comm

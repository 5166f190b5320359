// Workers reach the coordinator through their host's agent: one connection per host.
//
// An agent publishes a relay hub on its host's loopback (mutual TLS on the cluster secret, as
// every connection). A worker it started connects to the hub and asks for a relay with its
// launch token (one relay per live launch): an actor of the agent's node, bound to the
// worker's node, that the worker then uses as its coordinator.
// The relay
//   * forwards what the worker sends (registration, steps, results, checkpoint reports, store
//     requests) only from the worker's node and, once registered, only for the (job,
//     generation, rank) the coordinator assigned it: a worker cannot speak for another rank
//     of its host;
//   * registers itself as the worker's handle, so the coordinator's abort, "where", drain and
//     assignments come to it over the agent's connection and it hands them to the worker
//     (sent as itself: the worker takes them only from its coordinator, which the relay is);
//     "where" comes from the agent too, which asks every relay of its host for the
//     coordinator at once (agent_actor, actors/protocol.hpp);
//   * hands its worker's step reports to the host's step batcher, which sends the host's
//     reports on together (one message per host and window of kStepBatchWindow, not one per
//     rank and step), and has the batcher flush before it passes on its worker's result, so
//     that the coordinator has the last steps before the result;
//   * ends when its worker goes (process exit, or the worker's connection to the agent timed
//     out: a hang) or when the coordinator goes, with the same reason, so that the coordinator
//     sees the worker down through its monitor of the relay, and the worker sees its
//     coordinator down through its monitor of the relay.
// The coordinator then keeps one connection, one TLS session and one heartbeat per host, not
// per rank; the workers' heartbeats stay on their host.
#pragma once

#include <caf/fwd.hpp>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "actors/protocol.hpp"

namespace troupe::worker {

// The launch tokens of an agent's live workers: a relay is handed out only for one of them, and
// one at a time, so that a peer on the host that was not launched (it holds the cluster secret,
// but no token) gets none and cannot fill the agent's memory with relays waiting for it. The
// agent adds a token as it starts the worker and removes it as it reaps the worker (any thread).
class LaunchTokens {
 public:
  void add(const std::string& token);
  void remove(const std::string& token);
  // A relay for `token` may start: the token is live and has none now (it has one from now on).
  bool take(const std::string& token);
  // The relay for `token` ended.
  void release(const std::string& token);

 private:
  std::mutex mu_;
  std::map<std::string, bool> live_;  // token -> it has a relay now
};

// How long a host's step batcher holds a report before it sends its batch on: a host's ranks end
// a step within a few milliseconds of each other (they wait on each other's collectives), so one
// window takes each rank's report of that step. A report waits a tenth of its step's time at
// most, so that the coordinator's picture of a job with short steps lags by less than a step.
constexpr auto kStepBatchWindow = std::chrono::milliseconds(50);

// A host's step batcher (actors::step_batcher_actor), an actor of `sys`'s node. It ends when
// the coordinator's handle goes down, or when its owner ends it (spawn_agent: with the agent).
actors::step_batcher_actor start_step_batcher(caf::actor_system& sys,
                                              const actors::coordinator_actor& coordinator,
                                              std::chrono::milliseconds window = kStepBatchWindow);

// An agent's hub: spawned and published on 127.0.0.1 (any free port). Returns the hub
// ("127.0.0.1:PORT" in *address), or an invalid handle where publishing failed (*address then
// says why). Its relays hand their steps to `batcher`. spawn_agent (worker/agent.hpp) starts
// both and ends them with its agent.
actors::relay_hub_actor start_relay_hub(caf::actor_system& sys, const actors::coordinator_actor& coordinator,
                                        actors::step_batcher_actor batcher,
                                        std::shared_ptr<LaunchTokens> tokens, std::string* address);

// A worker's side: connects to the hub at `address` and asks for its relay with its launch
// token. Retries the connection with backoff (250 ms doubling to 4 s) while a loaded host
// handshakes.
caf::expected<actors::coordinator_actor> connect_relay(caf::actor_system& sys, const std::string& address,
                                                       const std::string& token);

}  // namespace troupe::worker

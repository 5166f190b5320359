// A simulated worker: the control-plane half of a worker process (worker/worker_process.cpp)
// without an engine. It registers with its launch token, checks its Assignment, runs the
// rendezvous of its communicators through the coordinator's store (rendezvous_script.hpp),
// reports a step every step_ms and a checkpoint shard (a real small file, a real manifest)
// every ckpt_every steps, answers "where", and on an abort reports its failure and ends, as
// a worker does.
#pragma once

#include <cstdint>
#include <string>

#include "actors/protocol.hpp"

namespace troupe::scale {

// What a simulated worker tells its process (thread-safe).
class SimSink {
 public:
  virtual ~SimSink() = default;
  virtual void emit(const std::string& line) = 0;
  virtual void step_sent(int generation, int64_t step, int64_t t_ns) = 0;
  virtual void ckpt_done(int generation, int64_t step, int64_t sent_ns, int64_t reply_ns, bool ok,
                         const std::string& error) = 0;
  // The worker stopped with `exit_code`: its node goes, and its agent reports the exit.
  virtual void ended(uint64_t node, int exit_code) = 0;
};

struct SimWorkerConfig {
  std::string job_id;
  int32_t generation = 0;
  int32_t rank = 0;
  int32_t pid = 0;
  std::string host;   // its agent's host
  std::string token;  // the launch token
  uint64_t node = 0;  // its node in the process
  int step_ms = 1000;
  int ckpt_every = 0;
  int ckpt_bytes = 4096;
  int gloo_max = 0;
  std::string relay;  // its agent's relay hub ("" = connect to the coordinator)
  // An inline worker's: its agent's node's step batcher, which its steps go through as a relayed
  // worker's do (invalid: each step goes to the coordinator itself).
  actors::step_batcher_actor batcher;
  // Its steps come from tick_sim_worker (its process's one ticker), not from a timer of its own.
  bool ticked = false;
};

// One step of a ticked worker, if it is stepping (any thread).
void tick_sim_worker(const caf::actor& worker);

// The worker stops as a SIGSTOPped process does: it handles nothing more until killed (any thread).
void hang_sim_worker(const caf::actor& worker);

caf::actor spawn_sim_worker(caf::actor_system& sys, actors::coordinator_actor coordinator,
                            SimWorkerConfig cfg, SimSink* sink);

}  // namespace troupe::scale

// The coordinator actor's own state and the parts of its shell that live in
// files of their own: who may send what (coordinator_actor_auth.cpp) and the
// run directories and event feed (coordinator_actor_events.cpp). Only the
// coordinator actor's sources include this.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "actors/protocol.hpp"
#include "checkpoint/commit.hpp"
#include "coordinator/coordinator_actor.hpp"
#include "coordinator/state.hpp"
#include "core/run_dir.hpp"

namespace troupe::coord::actor {

using namespace troupe::actors;

struct WorkerRef {
  std::string job;
  int32_t generation = 0;
  int32_t rank = 0;
};

using RankKey = std::tuple<std::string, int32_t, int32_t>;  // (job, generation, rank)

// Checkpoint commits (the manifest of every shard written and fsynced, the directory renamed,
// old checkpoints pruned) run in the committer actor, on a thread of its own, so that a commit
// of many shards never holds the coordinator's actor. A relaunch waits for its job's commits
// before it picks a checkpoint: one in flight may rename or prune what it would pick, or the
// directory the next generation writes into.
class CommitsInFlight {
 public:
  void begin(const std::string& job);
  void end(const std::string& job);
  // False when the job's commits did not end within `timeout`.
  bool wait(const std::string& job, std::chrono::milliseconds timeout);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, int> running_;
};

struct CoordActorState {
  std::unique_ptr<CoordinatorState> st;
  // Who may speak for what (every peer already holds the cluster secret; these
  // keep one from speaking for another). A message counts for a rank or an agent
  // only from the process (CAF node) of the handle registered below in `workers`
  // or `agents`: CAF names the node on the connection, the sender cannot choose it.
  std::map<RankKey, std::string> launch_tokens;  // issued with a launch, spent by the registration
  std::map<RankKey, std::string> launch_agents;  // the agent that was asked to start the rank
  uint64_t refused = 0;                          // messages refused so far (logged, rate-limited)
  CoordinatorActorOptions opt;
  std::map<std::string, agent_actor> agents;  // agent id -> handle
  std::map<caf::actor_addr, std::string> agent_ids;
  std::map<caf::actor_addr, WorkerRef> worker_refs;
  std::map<std::tuple<std::string, int32_t, int32_t>, worker_actor> workers;
  // The processes (CAF nodes) of `workers`' ranks (spares not counted): (node, job,
  // generation) -> how many ranks of that generation registered from it. A store request is
  // checked against it in O(log N), not by a walk over the generation's ranks.
  std::map<std::tuple<caf::node_id, std::string, int32_t>, int> rank_nodes;
  std::map<std::string, std::unique_ptr<RunDir>> run_dirs;
  struct Waiter {
    caf::typed_response_promise<StoreValue> promise;
    std::string ns, key;
  };
  std::map<uint64_t, Waiter> waiters;
  std::map<std::tuple<std::string, int32_t, int32_t>, std::string> lost_reasons;
  // Checkpoint reports per (job generation, step) until every rank has reported.
  checkpoint::CommitTracker ckpt;
  caf::actor committer;  // runs checkpoint::commit (CommitsInFlight)
  std::shared_ptr<CommitsInFlight> commits = std::make_shared<CommitsInFlight>();
  std::map<std::tuple<std::string, int32_t, int64_t>, std::vector<caf::typed_response_promise<CkptCommitted>>>
      ckpt_waiting;
  // The rank the next "where" poll starts from (coordinator_actor.cpp, poll_where).
  std::optional<std::tuple<std::string, int32_t, int32_t>> where_next;
  // poll_where's view of the hosts (the agents by node, and how many hosts and ranks connected
  // by themselves it asks in turn), worked out again when a worker or an agent comes or goes,
  // and every second: not every tick, over every rank.
  struct WhereView {
    bool stale = true;
    int ticks = 0;
    std::map<caf::node_id, agent_actor> agents;
    size_t targets = 0;
  } where_view;
  static inline const char* name = "troupe.coordinator";
};

using self_ptr = coordinator_actor::stateful_pointer<CoordActorState>;

// ---- the registered worker handles (coordinator_actor_auth.cpp)

// Registers `handle` as `key` in `workers` and `rank_nodes`.
void add_worker(self_ptr self, const RankKey& key, const worker_actor& handle);
// Forgets the handle registered as `key` (if any) in both.
void remove_worker(self_ptr self, const RankKey& key);

// ---- who may send what (coordinator_actor_auth.cpp)

// A refused message is logged (the first 20, then every 1000th: a flood does not fill the disk).
void refuse(self_ptr self, const char* what, const std::string& why);
// A handler that threw: the actor lives on (an exception would end it), the cause is logged.
void internal_error(const char* what, const std::exception& e);
// The API arrives from this process's own API thread, never over the network.
bool from_local(self_ptr self);
// The process that registered as (job, generation, rank). This process itself
// (`troupe run`, tests) may speak for any rank: it is the coordinator.
bool from_worker(self_ptr self, const std::string& job, int32_t generation, int32_t rank);
// Any process that registered as a rank of (job, generation).
bool from_job_worker(self_ptr self, const std::string& job, int32_t generation);
// The agent that was asked to start (job, generation, rank).
bool from_launching_agent(self_ptr self, const std::string& job, int32_t generation, int32_t rank);
// "" when a store request may be served: a well-formed key, a bounded value,
// from a registered rank of a current generation.
std::string store_refusal(self_ptr self, const StoreKey& k, size_t value_bytes);

// ---- run directories and events (coordinator_actor_events.cpp)

// Writes an event to its job's run directory (events.log, metrics.jsonl) and
// hands it to opt.on_event.
void record_event(self_ptr self, nlohmann::json e);
// Saves the job table when an event changed it (a step or an agent does not).
void persist(self_ptr self, const std::vector<nlohmann::json>& events);

}  // namespace troupe::coord::actor

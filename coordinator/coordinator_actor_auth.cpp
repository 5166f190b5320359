// Who may send what. Every peer already holds the cluster secret; these checks
// keep one from speaking for another: a message counts for a rank or an agent
// only from the process (CAF node) of the handle registered for it.
#include <iostream>

#include "actors/validate.hpp"
#include "coordinator/coordinator_actor_state.hpp"
#include "core/text.hpp"

namespace troupe::coord::actor {

namespace {

// CAF names the node at the other end of the connection a message came on: the sender cannot
// choose it (a routed message, whose source node its sender states, or a handshake as a node
// already connected, closes its connection: actors/basp_guard.cpp). Through an agent, that node is the
// agent's: its relay for each rank passes on only what that rank's worker says (worker/relay.hpp).
bool from_node(self_ptr self, const caf::node_id& node) {
  auto sender = self->current_sender();
  return sender && node && sender->node() == node;
}

}  // namespace

void refuse(self_ptr self, const char* what, const std::string& why) {
  auto n = ++self->state.refused;
  if (n <= 20 || n % 1000 == 0) {
    auto sender = self->current_sender();
    std::cerr << "troupe coordinator: refused " << what << " from "
              << (sender ? caf::to_string(sender->node()) : std::string("an anonymous sender")) << ": "
              << sanitize_utf8(why, 512) << " (" << n << " refused so far)" << std::endl;
  }
}

void internal_error(const char* what, const std::exception& e) {
  std::cerr << "troupe coordinator: internal error in " << what << ": " << sanitize_utf8(e.what(), 4096)
            << std::endl;
}

bool from_local(self_ptr self) { return from_node(self, self->node()); }

bool from_worker(self_ptr self, const std::string& job, int32_t generation, int32_t rank) {
  auto it = self->state.workers.find({job, generation, rank});
  return (it != self->state.workers.end() && from_node(self, it->second->node())) || from_local(self);
}

void add_worker(self_ptr self, const RankKey& key, const worker_actor& handle) {
  auto& s = self->state;
  remove_worker(self, key);
  s.workers[key] = handle;
  s.where_view.stale = true;
  if (!is_spare_rank(std::get<2>(key))) ++s.rank_nodes[{handle->node(), std::get<0>(key), std::get<1>(key)}];
}

void remove_worker(self_ptr self, const RankKey& key) {
  auto& s = self->state;
  auto it = s.workers.find(key);
  if (it == s.workers.end()) return;
  if (!is_spare_rank(std::get<2>(key))) {
    auto n = s.rank_nodes.find({it->second->node(), std::get<0>(key), std::get<1>(key)});
    if (n != s.rank_nodes.end() && --n->second <= 0) s.rank_nodes.erase(n);
  }
  s.workers.erase(it);
  s.where_view.stale = true;
}

bool from_job_worker(self_ptr self, const std::string& job, int32_t generation) {
  if (from_local(self)) return true;
  // A rank of the generation, not a spare (a spare waiting for a place has no rendezvous).
  auto sender = self->current_sender();
  return sender && sender->node() && self->state.rank_nodes.count({sender->node(), job, generation}) > 0;
}

bool from_launching_agent(self_ptr self, const std::string& job, int32_t generation, int32_t rank) {
  auto& s = self->state;
  auto a = s.launch_agents.find({job, generation, rank});
  if (a == s.launch_agents.end()) return false;
  auto n = s.agents.find(a->second);
  return n != s.agents.end() && from_node(self, n->second->node());
}

std::string store_refusal(self_ptr self, const StoreKey& k, size_t value_bytes) {
  if (auto why = check(k); !why.empty()) {
    refuse(self, "a store request", why);
    return why;
  }
  if (value_bytes > kMaxStoreValue) {
    refuse(self, "a store request", "value of " + std::to_string(value_bytes) + " bytes");
    return "store value too large";
  }
  std::string refusal = self->state.st->store_refusal(k.job_id, k.generation);
  if (!refusal.empty()) return refusal;
  if (!from_job_worker(self, k.job_id, k.generation)) {
    refuse(self, "a store request", "not from a registered rank of job " + k.job_id);
    return "not a registered rank of this job generation";
  }
  return "";
}

}  // namespace troupe::coord::actor

// The rendezvous store the coordinator serves to workers building their
// communicators (gloo addresses, NCCL unique ids). Keys live in namespaces
// "<job>/<generation>/<group>", so a relaunched generation never reads the
// keys of the one before it. A get on a missing key parks a waiter that the
// matching set wakes; the actor shell expires waiters at their timeout.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace troupe::coord {

std::string store_namespace(const std::string& job_id, int generation, const std::string& group);

class RendezvousStore {
 public:
  // Stores the value; returns the waiters it satisfies (they are removed).
  std::vector<uint64_t> set(const std::string& ns, const std::string& key, std::string value);
  std::optional<std::string> get(const std::string& ns, const std::string& key) const;
  // Adds delta to a decimal counter (missing = 0); returns the new value and the waiters it wakes.
  std::pair<int64_t, std::vector<uint64_t>> add(const std::string& ns, const std::string& key, int64_t delta);

  // Parks a waiter for (ns, key); returns its id.
  uint64_t add_waiter(const std::string& ns, const std::string& key);
  // Removes a waiter (timeout); false if a set already satisfied it.
  bool remove_waiter(uint64_t id);
  size_t waiters() const { return waiters_.size(); }

  // Forgets every namespace of a job (it ended or moved to a new generation).
  void drop_job(const std::string& job_id);
  size_t size() const;

 private:
  std::map<std::string, std::map<std::string, std::string>> data_;  // ns -> key -> value
  struct Waiter {
    std::string ns, key;
  };
  std::map<uint64_t, Waiter> waiters_;
  uint64_t next_waiter_ = 1;
};

}  // namespace troupe::coord

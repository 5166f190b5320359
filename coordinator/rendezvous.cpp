#include "coordinator/rendezvous.hpp"

#include <string>

namespace troupe::coord {

std::string store_namespace(const std::string& job_id, int generation, const std::string& group) {
  return job_id + "/" + std::to_string(generation) + "/" + group;
}

std::vector<uint64_t> RendezvousStore::set(const std::string& ns, const std::string& key, std::string value) {
  data_[ns][key] = std::move(value);
  std::vector<uint64_t> woken;
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->second.ns == ns && it->second.key == key) {
      woken.push_back(it->first);
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
  return woken;
}

std::optional<std::string> RendezvousStore::get(const std::string& ns, const std::string& key) const {
  auto n = data_.find(ns);
  if (n == data_.end()) return std::nullopt;
  auto k = n->second.find(key);
  if (k == n->second.end()) return std::nullopt;
  return k->second;
}

std::pair<int64_t, std::vector<uint64_t>> RendezvousStore::add(const std::string& ns, const std::string& key,
                                                               int64_t delta) {
  int64_t v = 0;
  if (auto old = get(ns, key)) {
    try {
      v = std::stoll(*old);
    } catch (const std::exception&) {
      v = 0;
    }
  }
  v += delta;
  return {v, set(ns, key, std::to_string(v))};
}

uint64_t RendezvousStore::add_waiter(const std::string& ns, const std::string& key) {
  uint64_t id = next_waiter_++;
  waiters_[id] = {ns, key};
  return id;
}

bool RendezvousStore::remove_waiter(uint64_t id) { return waiters_.erase(id) > 0; }

void RendezvousStore::drop_job(const std::string& job_id) {
  std::string prefix = job_id + "/";
  for (auto it = data_.begin(); it != data_.end();)
    it = it->first.compare(0, prefix.size(), prefix) == 0 ? data_.erase(it) : std::next(it);
}

size_t RendezvousStore::size() const {
  size_t n = 0;
  for (const auto& [ns, kv] : data_) n += kv.size();
  return n;
}

}  // namespace troupe::coord

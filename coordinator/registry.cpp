#include "coordinator/registry.hpp"

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.hpp"

namespace troupe::coord {

std::string device_kind(const std::string& device) { return device.substr(0, device.find(':')); }

void check_device_name(const std::string& device) {
  auto colon = device.find(':');
  bool ok = colon != std::string::npos && colon + 1 < device.size();
  if (ok) {
    std::string kind = device.substr(0, colon);
    ok = kind == "cpu" || kind == "cuda";
    for (size_t i = colon + 1; ok && i < device.size(); ++i) ok = device[i] >= '0' && device[i] <= '9';
  }
  TROUPE_CHECK(ok, "bad device name '", device, "' (expected cpu:N or cuda:N)");
}

std::string DeviceRegistry::add_agent(const std::string& host, int pid,
                                      const std::vector<std::string>& devices) {
  TROUPE_CHECK(!devices.empty(), "an agent must offer at least one device");
  std::set<std::string> seen;
  for (const auto& d : devices) {
    check_device_name(d);
    TROUPE_CHECK(seen.insert(d).second, "device ", d, " listed twice");
  }
  char id[32];
  std::snprintf(id, sizeof id, "agent-%03d", next_id_++);
  Agent a;
  a.id = id;
  a.host = host;
  a.pid = pid;
  a.devices = devices;
  for (const auto& d : devices) a.owner[d] = "";
  agents_[a.id] = a;
  return id;
}

std::vector<std::string> DeviceRegistry::remove_agent(const std::string& agent_id) {
  std::vector<std::string> jobs;
  auto it = agents_.find(agent_id);
  if (it == agents_.end()) return jobs;
  for (const auto& [dev, job] : it->second.owner)
    if (!job.empty() && std::find(jobs.begin(), jobs.end(), job) == jobs.end()) jobs.push_back(job);
  agents_.erase(it);
  return jobs;
}

const Agent* DeviceRegistry::agent(const std::string& agent_id) const {
  auto it = agents_.find(agent_id);
  return it == agents_.end() ? nullptr : &it->second;
}

int DeviceRegistry::total(const std::string& kind) const {
  int n = 0;
  for (const auto& [id, a] : agents_)
    for (const auto& d : a.devices) n += device_kind(d) == kind;
  return n;
}

int DeviceRegistry::free(const std::string& kind) const {
  int n = 0;
  for (const auto& [id, a] : agents_)
    for (const auto& d : a.devices) n += device_kind(d) == kind && a.owner.at(d).empty();
  return n;
}

std::optional<std::vector<DeviceRef>> DeviceRegistry::allocate(const std::string& job_id,
                                                               const std::string& kind, int n,
                                                               std::string* why, bool spread,
                                                               const std::map<std::string, int>& held) {
  TROUPE_CHECK(n > 0, "a job needs at least one device");
  auto free_on = [&](const Agent& a) {
    std::vector<std::string> out;
    for (const auto& d : a.devices)
      if (device_kind(d) == kind && a.owner.at(d).empty()) out.push_back(d);
    return out;
  };
  int have = free(kind);
  if (have < n) {
    if (why) {
      int all = total(kind);
      *why = "waiting for " + std::to_string(n) + " free " + kind + " device(s): " + std::to_string(have) +
             " free of " + std::to_string(all) + " registered";
      if (all < n) *why += " (the cluster has too few; start more agents)";
    }
    return std::nullopt;
  }
  std::vector<DeviceRef> out;
  if (spread) {
    struct Pool {
      std::string id;
      std::vector<std::string> free;
      int load = 0;  // the job's devices on this agent
      size_t next = 0;
    };
    std::vector<Pool> pool;
    for (auto& [id, a] : agents_) {
      const auto h = held.find(id);
      pool.push_back({id, free_on(a), h == held.end() ? 0 : h->second, 0});
    }
    while (static_cast<int>(out.size()) < n) {
      Pool* best = nullptr;
      for (auto& p : pool)
        if (p.next < p.free.size() && (!best || p.load < best->load)) best = &p;
      out.push_back({best->id, best->free[best->next++]});
      ++best->load;
    }
  }
  for (auto& [id, a] : agents_) {
    if (!out.empty()) break;
    auto f = free_on(a);
    if (static_cast<int>(f.size()) >= n) {
      for (int i = 0; i < n; ++i) out.push_back({id, f[i]});
      break;
    }
  }
  if (out.empty()) {
    for (auto& [id, a] : agents_)
      for (const auto& d : free_on(a))
        if (static_cast<int>(out.size()) < n) out.push_back({id, d});
  }
  for (const auto& ref : out) agents_.at(ref.agent_id).owner[ref.device] = job_id;
  return out;
}

void DeviceRegistry::release(const std::string& job_id, const std::vector<DeviceRef>& keep) {
  for (auto& [id, a] : agents_)
    for (auto& [dev, job] : a.owner)
      if (job == job_id && std::find(keep.begin(), keep.end(), DeviceRef{id, dev}) == keep.end()) job.clear();
}

void DeviceRegistry::release_device(const std::string& job_id, const DeviceRef& device) {
  auto a = agents_.find(device.agent_id);
  if (a == agents_.end()) return;
  auto o = a->second.owner.find(device.device);
  if (o != a->second.owner.end() && o->second == job_id) o->second.clear();
}

std::vector<DeviceRef> DeviceRegistry::held_by(const std::string& job_id) const {
  std::vector<DeviceRef> out;
  for (const auto& [id, a] : agents_)
    for (const auto& d : a.devices)
      if (a.owner.at(d) == job_id) out.push_back({id, d});
  return out;
}

nlohmann::json DeviceRegistry::to_json(size_t from, size_t count) const {
  auto agents = nlohmann::json::array();
  if (from >= agents_.size()) return agents;
  auto it = std::next(agents_.begin(), static_cast<std::ptrdiff_t>(from));
  for (; it != agents_.end() && count > 0; ++it, --count) {
    const auto& [id, a] = *it;
    nlohmann::json devs = nlohmann::json::array();
    for (const auto& d : a.devices) devs.push_back({{"device", d}, {"job", a.owner.at(d)}});
    agents.push_back({{"id", id}, {"host", a.host}, {"pid", a.pid}, {"devices", devs}});
  }
  return agents;
}

}  // namespace troupe::coord

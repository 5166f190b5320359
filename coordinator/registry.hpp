// The device registry: which agents are connected and which of their devices
// are free or held by a job. Plain C++; the coordinator actor owns one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

namespace troupe::coord {

// One device on one agent, e.g. {"agent-2", "cuda:1"}.
struct DeviceRef {
  std::string agent_id;
  std::string device;
  bool operator==(const DeviceRef& o) const { return agent_id == o.agent_id && device == o.device; }
};

struct Agent {
  std::string id;
  std::string host;
  int pid = 0;
  std::vector<std::string> devices;          // in registration order
  std::map<std::string, std::string> owner;  // device -> job id ("" = free)
};

// "cuda:3" -> "cuda"
std::string device_kind(const std::string& device);
// Throws troupe::Error unless device reads "<cpu|cuda>:<index>".
void check_device_name(const std::string& device);

class DeviceRegistry {
 public:
  // Returns the new agent's id ("agent-<n>"). Throws troupe::Error on bad or duplicate device names.
  std::string add_agent(const std::string& host, int pid, const std::vector<std::string>& devices);
  // Forgets the agent; returns the ids of the jobs that held any of its devices.
  std::vector<std::string> remove_agent(const std::string& agent_id);

  const Agent* agent(const std::string& agent_id) const;
  const std::map<std::string, Agent>& agents() const { return agents_; }

  int total(const std::string& kind) const;
  int free(const std::string& kind) const;

  // Holds n free devices of `kind` for job_id, or returns nullopt and says why
  // in *why. Packed (the default): one agent that can hold the whole job (its
  // ranks then talk over loopback), else agents filled in registration order.
  // Spread: each device from the agent that holds the fewest of the job's
  // devices so far (`held`: those it keeps, by agent id, plus the ones taken
  // here), the first registered on a tie: one of each agent in turn, round
  // after round, so the job spans as many agents as it can.
  std::optional<std::vector<DeviceRef>> allocate(const std::string& job_id, const std::string& kind, int n,
                                                 std::string* why, bool spread = false,
                                                 const std::map<std::string, int>& held = {});
  // Frees every device held by job_id but those in `keep`.
  void release(const std::string& job_id, const std::vector<DeviceRef>& keep = {});
  // Frees one device if job_id holds it.
  void release_device(const std::string& job_id, const DeviceRef& device);
  std::vector<DeviceRef> held_by(const std::string& job_id) const;

  // The agents in id order, [from, from + count): id, host, pid, devices (with their jobs).
  nlohmann::json to_json(size_t from = 0, size_t count = SIZE_MAX) const;

 private:
  std::map<std::string, Agent> agents_;  // ordered by id = registration order (zero-padded)
  int next_id_ = 1;
};

}  // namespace troupe::coord

// The agent actor: one per host. It registers the host's devices with the
// coordinator, starts one worker process per device when asked (fork + exec of
// the troupe binary), reaps them with waitpid and reports how each ended.
// Workers never outlive their agent: each child gets PR_SET_PDEATHSIG=SIGKILL
// before exec, and the agent SIGKILLs and reaps them when it stops.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "actors/protocol.hpp"

namespace troupe::worker {

struct AgentActorOptions {
  std::string coordinator_address;   // "host:port" handed to the workers
  std::vector<std::string> devices;  // "cpu:0", ...
  std::string worker_binary = "/proc/self/exe";
  int protocol = actors::kProtocolVersion;
  int worker_protocol_override = 0;  // tests: start workers that claim another version
  // Called once when the agent stops: exit code and why (refused, coordinator lost, shut down).
  std::function<void(int, const std::string&)> on_stop;
};

actors::agent_actor spawn_agent(caf::actor_system& sys, actors::coordinator_actor coordinator,
                                AgentActorOptions options);

}  // namespace troupe::worker

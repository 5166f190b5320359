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

// on_stop's code when the coordinator went away (or never answered the
// registration): the workers are killed and reaped; the process may reconnect.
constexpr int kAgentLostCoordinator = 3;

// The environment variable that carries LaunchRequest::token to the worker process.
constexpr const char* kLaunchTokenEnv = "TROUPE_LAUNCH_TOKEN";

struct AgentActorOptions {
  std::string coordinator_address;   // "host:port" handed to the workers
  std::vector<std::string> devices;  // "cpu:0", ...
  std::string worker_binary = "/proc/self/exe";
  std::string secret_file;     // the cluster secret, handed to every worker it starts
  std::string data_interface;  // handed to every worker it starts ("" = none given)
  int protocol = actors::kProtocolVersion;
  int worker_protocol_override = 0;  // tests: start workers that claim another version
  // Called once when the agent stops: a code (0 shut down, 1 refused, kAgentLostCoordinator) and why.
  std::function<void(int, const std::string&)> on_stop;
  // Called when the coordinator accepted the registration.
  std::function<void()> on_registered;
};

actors::agent_actor spawn_agent(caf::actor_system& sys, actors::coordinator_actor coordinator,
                                AgentActorOptions options);

}  // namespace troupe::worker

// The agent actor: one per host. It registers the host's devices with the
// coordinator, starts one worker process per device when asked (fork + exec of
// the troupe binary), reaps them with waitpid and reports how each ended, and
// which of them stay stopped by a signal (a hang its parent sees first).
// Workers never outlive their agent: each child gets PR_SET_PDEATHSIG=SIGKILL
// before exec, and the agent SIGKILLs and reaps them when it stops.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "actors/protocol.hpp"

namespace troupe::worker {

// on_stop's code when the coordinator went away (or never answered the
// registration): the workers are killed and reaped; the process may reconnect.
constexpr int kAgentLostCoordinator = 3;

// The environment variable that carries LaunchRequest::token to the worker process.
constexpr const char* kLaunchTokenEnv = "TROUPE_LAUNCH_TOKEN";

// How an agent's workers come and go. The default (make_process_launcher) forks and execs
// the troupe binary and reaps with waitpid; bench/scale starts simulated workers inside its
// own processes through the same agent actor.
class WorkerLauncher {
 public:
  virtual ~WorkerLauncher() = default;
  // Starts the worker of a checked request; its pid (> 0) or -errno. `relay`: the address of
  // the agent's relay hub the worker reaches the coordinator through (worker/relay.hpp); ""
  // = none: it connects to the coordinator itself.
  virtual int32_t start(const actors::LaunchRequest& r, const std::string& relay) = 0;
  // Kills a started worker (SIGKILL); it is reported by reap() once it is gone.
  virtual void kill(int32_t pid) = 0;
  struct Ended {
    int32_t pid = 0;
    int32_t exit_code = -1;  // when it exited normally
    int32_t signal = 0;      // when a signal ended it
  };
  // The started workers that ended since the last call; `block` waits for every one of them.
  virtual std::vector<Ended> reap(bool block) = 0;
  struct Stopped {
    int32_t pid = 0;
    int32_t signal = 0;                  // the signal that stopped it
    std::chrono::milliseconds since{0};  // how long it has been stopped
  };
  // The started workers stopped by a signal and not continued, as of the last reap(); none
  // where the launcher's workers cannot be stopped.
  virtual std::vector<Stopped> stopped() { return {}; }
};

struct AgentActorOptions {
  std::string coordinator_address;   // "host:port" handed to the workers
  std::vector<std::string> devices;  // "cpu:0", ...
  std::string host;                  // the host name it registers with ("" = this host's)
  std::string worker_binary = "/proc/self/exe";
  std::string secret_file;     // the cluster secret, handed to every worker it starts
  std::string data_interface;  // handed to every worker it starts ("" = none given)
  // Its workers reach the coordinator through a relay hub on this host's loopback
  // (worker/relay.hpp): one connection per host. false: each connects to the coordinator.
  bool relay = true;
  int protocol = actors::kProtocolVersion;
  int worker_protocol_override = 0;  // tests: start workers that claim another version
  // Called once when the agent stops: a code (0 shut down, 1 refused, kAgentLostCoordinator) and why.
  std::function<void(int, const std::string&)> on_stop;
  // Called when the coordinator accepted the registration.
  std::function<void()> on_registered;
  // nullptr = worker processes (make_process_launcher of these options).
  std::shared_ptr<WorkerLauncher> launcher;
  // How often ended workers are collected and reported.
  std::chrono::milliseconds reap_every{20};
  // A worker stopped by a signal for this long is reported to the coordinator (a hang): a stop
  // and continue within it (job control, a sampling profiler) is not.
  std::chrono::milliseconds stopped_grace{50};
};

// fork + exec of options.worker_binary with the worker's arguments, PR_SET_PDEATHSIG, the
// launch token in the environment; waitpid.
std::shared_ptr<WorkerLauncher> make_process_launcher(const AgentActorOptions& options);

// With options.relay, also starts the agent's relay hub and its step batcher (both ended with the
// agent); where the hub cannot be published the workers connect to the coordinator themselves
// (said on stderr).
actors::agent_actor spawn_agent(caf::actor_system& sys, actors::coordinator_actor coordinator,
                                AgentActorOptions options);

}  // namespace troupe::worker

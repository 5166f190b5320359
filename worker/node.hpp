// The `troupe agent` and `troupe worker` processes. No CAF here: the CLI includes it.
#pragma once

#include <string>
#include <vector>

namespace troupe::worker {

struct AgentOptions {
  std::string coordinator;        // "host:port"
  std::string devices = "cpu:1";  // "cpu:N", "cuda:all", "cuda:0,1" or a list "cpu:0,cpu:1"
  std::string worker_binary = "/proc/self/exe";
  std::string secret_file;           // the cluster secret (actors/secret.hpp); required
  int protocol_override = 0;         // hidden: test a refused registration
  int worker_protocol_override = 0;  // hidden: start workers that claim another version
  // After losing the coordinator, how long to keep reconnecting (backoff 100 ms doubling to 2 s).
  double reconnect_timeout_s = 60;
  // The data plane's interface name or IPv4 address, handed to every worker; "" = the
  // source address of the route toward the coordinator (worker/data_address.hpp).
  std::string data_interface;
  // The workers reach the coordinator through this agent (one connection per host); false:
  // each connects to it itself.
  bool relay = true;
};

// "cpu:4" -> cpu:0..cpu:3; "cuda:all" -> every GPU this process sees (worker/device.hpp); "cuda:0,2" ->
// cuda:0, cuda:2. Throws troupe::Error on a malformed list.
std::vector<std::string> expand_devices(const std::string& spec);
// The --devices of a job of `n` devices of `kind` ("cpu" or "cuda") on this host: "cpu:n", or
// the first n GPUs ("cuda:0,1"). A host with fewer than n GPUs is refused, naming how many it has.
std::string local_devices(const std::string& kind, int n);

// Registers, serves launch requests until SIGINT/SIGTERM (130 / 0) or until the
// coordinator refuses it (1). When the coordinator goes away the workers are
// killed and reaped (their generation is dead), and the agent reconnects to the
// same address and registers again; after reconnect_timeout_s without a
// coordinator it exits (1). The first connection is not retried: a wrong
// address is retried with the same backoff for up to reconnect_timeout_s, so an
// agent may start before its coordinator listens. A secret that does not pass
// check_secret() is a usage error (2), and so is a data_interface that names no
// interface or address of this host; a coordinator that refuses the TLS
// handshake (another secret) looks like one that is not there.
int run_agent(const AgentOptions& options);

struct WorkerOptions {
  std::string coordinator;  // "host:port"
  std::string job_id;
  int generation = 0;
  int rank = 0;
  std::string device;
  std::string secret_file;
  int protocol_override = 0;
  std::string data_interface;  // as AgentOptions::data_interface
  std::string relay;  // "host:port" of the agent's relay hub (worker/relay.hpp); "" = connect directly
};

// Connects, asks for its assignment, trains on an engine thread while the
// worker actor answers abort and where. 0 when the rank finished, 1 when it
// failed (reported to the coordinator with a name first), 3 when refused.
int run_worker(const WorkerOptions& options);

}  // namespace troupe::worker

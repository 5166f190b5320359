// `troupe coordinator`: the coordinator actor published for agents and workers,
// plus the ZeroMQ client API. No CAF here: the CLI includes it.
#pragma once

#include <string>

namespace troupe::coord {

struct CoordinatorOptions {
  std::string listen = "127.0.0.1:0";        // actor port for agents and workers; 0 = ephemeral
  std::string api = "tcp://127.0.0.1:5555";  // ROUTER; port 0 = ephemeral
  std::string api_pub;                       // PUB; "" = next port
  std::string api_token_file;                // "" = the token derived from the secret (actors::api_token)
  std::string secret_file;                   // the cluster secret (actors/secret.hpp); required
  std::string runs_dir = "runs";
  std::string state_dir;  // "" = the job table is not persisted; else saved and reloaded here
  std::string http;       // dashboard + /metrics at HOST:PORT ("" = none; port 0 = any free port)
  std::string
      ready_file;  // written once serving: {"listen":"host:port","api":...,"pub":...,"http":...,"pid":...}
  std::string
      hardware;  // auto jobs' hardware profile when their spec names none: a name or a file ("" = default)
  int protocol_override = 0;
};

// Serves until SIGINT or SIGTERM, then cancels the running jobs (their workers
// are killed by their agents) and returns the process exit code. If the
// coordinator actor itself ever fails, the process exits at once (70) with
// the cause on stderr, so that a supervisor restarts it (with --state-dir its
// jobs continue) instead of it serving errors.
int run_coordinator(const CoordinatorOptions& options);

// Reads a token file: its first line, surrounding whitespace removed. Throws troupe::Error.
std::string read_token_file(const std::string& path);

}  // namespace troupe::coord

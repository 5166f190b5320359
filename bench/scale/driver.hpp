// The scale harness's driver: starts the real coordinator (`troupe coordinator`, mutual TLS,
// --state-dir, --http), the simulated processes (sim.hpp), submits one job over every device,
// walks it through its phases (launch, steady state, checkpoints, queries, a rank killed, a
// rank hung, an agent lost) and prints what each took (docs/scale.md).
#pragma once

#include <string>

namespace troupe::scale {

struct DriverOptions {
  int ranks = 256;
  int per_agent = 8;         // devices (ranks) per simulated agent
  int agents_per_proc = 16;  // simulated agents (and their workers) per simulated process
  int pp = 0, tp = 0;        // layout; 0 = tensor across an agent's devices, pipeline 2
  int step_ms = 1000;
  int steady_s = 20;    // the steady-state window
  int ckpt_every = 10;  // steps between checkpoints
  int gloo_max = 0;     // the gloo pattern in groups of at most this many ranks (0 = not run)
  bool faults = true;   // a rank killed, a rank hung, an agent lost
  // Workers reach the coordinator through their agent's relay (worker/relay.hpp), as
  // deployed; false: each holds its own connection to the coordinator (troupe agent --no-relay).
  bool relay = true;
  // Each simulated worker is an actor of its agent's node, speaking to the coordinator over the
  // agent's connection: what the coordinator sees of relayed workers (one connection per host,
  // each rank's records on it) without the workers' own nodes and loopback connections, which
  // the harness cannot hold past 512 ranks on two cores.
  bool inline_workers = false;
  // The hung rank: "stop" is a SIGSTOPped worker process (no reads, no writes, no heartbeats:
  // its connection to its relay hub, or to the coordinator, times out); "stuck" a worker whose
  // control actor stops answering while its process and connection live (no step, no "where"
  // answer: the step watchdog's case, named by its stale "where").
  std::string hang = "stop";
  double patience = 1;  // multiplies every wait's limit
  // The coordinator's niceness. On a cluster it has a machine of its own; here thousands of
  // simulated nodes' threads share two cores with it, and at equal priority they starve the
  // one multiplexer thread being measured (best effort: needs CAP_SYS_NICE).
  int coordinator_nice = -10;
  // Connections being opened at once, over every simulated process (each opens its share).
  // Every simulated host here is 127.0.0.1, and the coordinator's handshake guard keeps at
  // most 64 pending handshakes per address (actors/handshake_guard.hpp); more at once also
  // starve the harness's own nodes of the two cores (docs/scale.md).
  int connects = 16;
  // The niceness of the simulated nodes' connection threads (CAF's multiplexer and clock
  // threads), between the coordinator's and their actors': a host's agent reads and writes its
  // connection on cores of its own, here it shares two with hundreds (best effort, as above).
  int io_nice = -5;
  // The simulated agents reap their workers this often (a real agent: every 20 ms). Each reap
  // is a timer of the agent's node; at 512 agents the harness pays for them.
  int reap_ms = 50;
  std::string json_out;  // the figures as JSON ("" = none)
  std::string dir;       // working directory ("" = a new one under /tmp, removed at the end)
  std::string self_exe = "/proc/self/exe";
  std::string troupe_binary;
};

// 0 when every check held (each rank got its assignment and its peers, every fault aborted
// every survivor and the next generation formed), 1 otherwise; 2 for bad options.
int run_driver(const DriverOptions& o);

}  // namespace troupe::scale

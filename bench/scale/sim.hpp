// One process of the simulated cluster of bench/scale: a slice of the agents (the real agent
// actor, each in an actor system of its own, connected to the coordinator over mutual TLS)
// and the workers they start, each a simulated worker (sim_worker.hpp) in an actor system of
// its own with its own connection, as a worker process has. No compute, no data plane.
//
// Actor systems of one process would share its process id in their CAF node ids; every
// actor system this process makes gets a process id of its own instead (node_ids.cpp), so
// each simulated node is a node of its own to the coordinator.
//
// It talks to the driver in lines: commands on stdin, events on stdout (observed.cpp,
// Observed::take_sim_line, reads them); times are CLOCK_MONOTONIC nanoseconds, one clock for every
// process of the machine.
#pragma once

#include <cstdint>
#include <string>

namespace troupe::scale {

struct SimOptions {
  std::string coordinator;  // host:port
  std::string secret_file;
  int index = 0;  // this process among the simulated ones
  int first_agent = 0, agents = 1, devices = 8;
  int step_ms = 1000;  // a rank reports a step this often
  int ckpt_every = 0;  // steps between checkpoints (0 = none)
  int ckpt_bytes = 4096;
  int gloo_max = 0;             // the gloo pattern runs in groups of at most this many ranks (0 = none)
  int launch_threads = 8;       // threads that start and stop simulated nodes
  int tick_offset_ms = 0;       // inline workers: when in each step period this process's step
  int io_nice = 0;              // the niceness of its nodes' connection threads (DriverOptions::io_nice)
  int reap_ms = 50;             // the agents' reaping period
  bool relay = true;            // workers through their agent's relay (DriverOptions::relay)
  bool inline_workers = false;  // workers as actors of their agent's node (DriverOptions::inline_workers)
};

int run_sim(const SimOptions& o);

// CLOCK_MONOTONIC in nanoseconds.
int64_t now_ns();

// Node ids (node_ids.cpp): from now on, every actor system of this process gets a process id
// of its own, unique among the simulated processes (index < 2048).
void distinct_node_ids(int process_index);

}  // namespace troupe::scale

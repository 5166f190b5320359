// bench/scale: the control plane at N ranks, simulated on one machine (docs/scale.md).
//
//   scale --ranks 1024 [--per-agent 8] [--agents-per-process 16] [--step-ms 1000]
//         [--steady 20] [--checkpoint-every 10] [--gloo-max 0] [--no-faults] [--workers-inline]
//         [--json FILE]
//
// `scale sim ...` is one simulated process; the driver starts those itself.
#include <CLI/CLI.hpp>
#include <iostream>

#include "bench/scale/driver.hpp"
#include "bench/scale/sim.hpp"

int main(int argc, char** argv) {
  CLI::App app{"troupe's control plane against simulated ranks (docs/scale.md)"};
  troupe::scale::DriverOptions d;
  d.troupe_binary = std::string(TROUPE_BINARY_DIR) + "/troupe";
  bool no_faults = false;
  app.add_option("--ranks", d.ranks, "simulated ranks (a multiple of --per-agent)");
  app.add_option("--per-agent", d.per_agent, "devices per simulated agent");
  app.add_option("--agents-per-process", d.agents_per_proc, "simulated agents per simulated process");
  app.add_option("--pipeline", d.pp, "pipeline size (0: 2)");
  app.add_option("--tensor", d.tp, "tensor size (0: --per-agent, at most 8)");
  app.add_option("--step-ms", d.step_ms, "each rank reports a step this often");
  app.add_option("--steady", d.steady_s, "seconds of steady state measured");
  app.add_option("--checkpoint-every", d.ckpt_every, "steps between checkpoints");
  app.add_option("--gloo-max", d.gloo_max,
                 "run the gloo pattern in groups of at most this many ranks (0: not)");
  app.add_option("--patience", d.patience, "multiplies every wait's limit");
  app.add_option("--coordinator-nice", d.coordinator_nice,
                 "the coordinator's niceness (negative needs CAP_SYS_NICE; else 0)");
  app.add_option("--io-nice", d.io_nice,
                 "the niceness of the simulated nodes' connection threads (negative needs CAP_SYS_NICE)");
  app.add_option("--connects", d.connects, "connections opened at once over all simulated processes");
  app.add_option("--reap-ms", d.reap_ms, "the simulated agents reap their workers this often");
  app.add_option("--json", d.json_out, "write the figures and checks as JSON here");
  app.add_flag("--no-relay{false}", d.relay,
               "each simulated worker connects to the coordinator itself (default: through its agent)");
  app.add_flag("--workers-inline", d.inline_workers,
               "each simulated worker is an actor of its agent's node: the coordinator sees one "
               "connection per host as with relayed workers");
  app.add_option("--dir", d.dir, "working directory, kept (default: a new one under /tmp, removed)");
  app.add_option("--troupe", d.troupe_binary, "the troupe binary whose coordinator is measured");
  app.add_flag("--no-faults", no_faults, "skip the killed rank, the hung rank and the lost agent");
  app.add_option("--hang", d.hang,
                 "the hung rank: stop (SIGSTOP: its connection times out) or stuck (its control actor "
                 "stops answering, its connection lives: the step watchdog's case)")
      ->check(CLI::IsMember({"stop", "stuck"}));

  troupe::scale::SimOptions s;
  auto* sim = app.add_subcommand("sim", "one simulated process (started by the driver)");
  sim->add_option("--coordinator", s.coordinator)->required();
  sim->add_option("--secret-file", s.secret_file)->required();
  sim->add_option("--index", s.index);
  sim->add_option("--first-agent", s.first_agent);
  sim->add_option("--agents", s.agents);
  sim->add_option("--devices", s.devices);
  sim->add_option("--step-ms", s.step_ms);
  sim->add_option("--checkpoint-every", s.ckpt_every);
  sim->add_option("--gloo-max", s.gloo_max);
  sim->add_option("--launch-threads", s.launch_threads);
  sim->add_option("--reap-ms", s.reap_ms);
  sim->add_option("--io-nice", s.io_nice);
  sim->add_option("--tick-offset-ms", s.tick_offset_ms);
  sim->add_flag("--no-relay{false}", s.relay);
  sim->add_flag("--workers-inline", s.inline_workers);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (*sim) return troupe::scale::run_sim(s);
  d.faults = !no_faults;
  return troupe::scale::run_driver(d);
}

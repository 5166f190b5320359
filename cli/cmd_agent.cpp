#include <CLI/CLI.hpp>

#include "actors/secret.hpp"
#include "cli/commands.hpp"
#include "worker/node.hpp"

namespace troupe::cli {

void add_agent_command(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("agent", "Offer this host's devices to a coordinator and run its workers");
  static worker::AgentOptions o;
  cmd->add_option("--coordinator", o.coordinator, "HOST:PORT of the coordinator (its --listen)")->required();
  cmd->add_option("--devices", o.devices, "cpu:N, cuda:all or cuda:0,1")->capture_default_str();
  cmd->add_option("--secret-file", o.secret_file, "The cluster secret: the same file as the coordinator's")
      ->envname(actors::kSecretEnv);
  cmd->add_option("--reconnect-timeout", o.reconnect_timeout_s,
                  "Seconds to keep trying to reach the coordinator, at start and after it goes away (its "
                  "workers are stopped)")
      ->capture_default_str();
  cmd->add_option("--data-interface", o.data_interface,
                  "Interface name or IPv4 address of this host that the workers' data plane listens on "
                  "(default: the source address of the route toward the coordinator)");
  cmd->add_flag("--no-relay{false}", o.relay,
                "Each worker connects to the coordinator itself (default: through this agent, one "
                "connection per host)");
  cmd->add_option("--protocol-version-override", o.protocol_override)->group("");
  cmd->add_option("--worker-protocol-version-override", o.worker_protocol_override)->group("");
  cmd->callback([exit_code] { *exit_code = worker::run_agent(o); });
}

// Started by an agent (fork + exec); not for users.
void add_worker_command(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("worker", "One worker process (started by an agent)");
  cmd->group("");
  static worker::WorkerOptions o;
  cmd->add_option("--coordinator", o.coordinator)->required();
  cmd->add_option("--job", o.job_id)->required();
  cmd->add_option("--generation", o.generation)->required();
  cmd->add_option("--rank", o.rank)->required();
  cmd->add_option("--device", o.device)->required();
  cmd->add_option("--secret-file", o.secret_file)->required();
  cmd->add_option("--protocol-version-override", o.protocol_override);
  cmd->add_option("--data-interface", o.data_interface);
  cmd->add_option("--relay", o.relay);
  cmd->callback([exit_code] { *exit_code = worker::run_worker(o); });
}

}  // namespace troupe::cli

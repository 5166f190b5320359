#include <CLI/CLI.hpp>
#include <iostream>

#include "actors/secret.hpp"
#include "cli/commands.hpp"
#include "coordinator/server.hpp"
#include "core/error.hpp"

namespace troupe::cli {

void add_coordinator_command(CLI::App& app, int* exit_code) {
  auto* cmd =
      app.add_subcommand("coordinator", "Serve the job queue: agents register here, clients submit here");
  static coord::CoordinatorOptions o;
  cmd->add_option("--listen", o.listen, "HOST:PORT for agents and workers (port 0 = any free port)")
      ->capture_default_str();
  cmd->add_option("--api", o.api, "ZeroMQ ROUTER endpoint of the client API (port 0 = any free port)")
      ->capture_default_str();
  cmd->add_option("--api-pub", o.api_pub, "ZeroMQ PUB endpoint for events (default: the API's port + 1)");
  cmd->add_option("--api-token-file", o.api_token_file,
                  "File whose first line every API request must carry as \"token\" (required off loopback)");
  cmd->add_option(
         "--secret-file", o.secret_file,
         "The cluster secret (`troupe secret init FILE`): agents and workers must hold the same file")
      ->envname(actors::kSecretEnv);
  cmd->add_option("--runs-dir", o.runs_dir, "Root of the run directories")->capture_default_str();
  cmd->add_option("--state-dir", o.state_dir,
                  "Keep the job table in DIR/jobs.json; a coordinator restarted with the same DIR continues "
                  "its jobs");
  cmd->add_option("--http", o.http,
                  "Serve the dashboard and Prometheus /metrics at HOST:PORT (port 0 = any free port; off "
                  "loopback every request needs the API token)");
  cmd->add_option("--ready-file", o.ready_file, "Write the bound addresses here as JSON once serving");
  cmd->add_option(
      "--hardware", o.hardware,
      "Hardware profile for jobs the planner lays out (parallel: auto) whose spec names none: a name "
      "(cpu, h100-sxm, ...) or a YAML file (default: cpu, the calibrated one if any, or h100-sxm)");
  cmd->add_option("--protocol-version-override", o.protocol_override)->group("");
  cmd->callback([exit_code] {
    try {
      *exit_code = coord::run_coordinator(o);
    } catch (const Error& e) {
      std::cerr << "troupe coordinator: " << e.what() << "\n";
      *exit_code = kUsage;
    }
  });
}

}  // namespace troupe::cli

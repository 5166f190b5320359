// troupe: train deep-learning models across many devices.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <iostream>

#include "cli/commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"troupe: data x pipeline x tensor parallel training that survives failures", "troupe"};
  app.require_subcommand(1);
  app.fallthrough();  // global options may also follow the subcommand
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace | debug | info | warn | error | off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));

  int exit_code = troupe::cli::kOk;
  troupe::cli::add_version_command(app, &exit_code);
  troupe::cli::add_validate_command(app, &exit_code);
  troupe::cli::add_plan_command(app, &exit_code);
  troupe::cli::add_run_command(app, &exit_code);
  troupe::cli::add_sample_command(app, &exit_code);
  troupe::cli::add_data_command(app, &exit_code);
  troupe::cli::add_coordinator_command(app, &exit_code);
  troupe::cli::add_agent_command(app, &exit_code);
  troupe::cli::add_worker_command(app, &exit_code);
  troupe::cli::add_client_commands(app, &exit_code);
  troupe::cli::add_ckpt_command(app, &exit_code);
  troupe::cli::add_secret_command(app, &exit_code);
  troupe::cli::add_trace_command(app, &exit_code);
  app.parse_complete_callback([&] { spdlog::set_level(spdlog::level::from_str(log_level)); });

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version are "errors" with exit code 0.
    int rc = app.exit(e);
    return rc == 0 ? troupe::cli::kOk : troupe::cli::kUsage;
  }
  return exit_code;
}

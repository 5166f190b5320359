#include <CLI/CLI.hpp>
#include <iostream>

#include "actors/secret.hpp"
#include "cli/commands.hpp"
#include "core/error.hpp"

namespace troupe::cli {

void add_secret_command(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("secret", "Make the cluster secret that authenticates the control plane");
  cmd->require_subcommand(1);
  auto* init = cmd->add_subcommand(
      "init", "Write a new secret to FILE (mode 0600; an existing file is never overwritten)");
  static std::string path;
  static int days = 3650;
  init->add_option("FILE", path, "Where to write it; copy it to every host of the cluster")->required();
  init->add_option("--days", days, "How long it stays valid")
      ->capture_default_str()
      ->check(CLI::Range(1, 36500));
  auto* tok = cmd->add_subcommand(
      "api-token",
      "Print the API token that holders of the secret FILE send (for clients in other languages)");
  static std::string tok_path;
  tok->add_option("FILE", tok_path, "The cluster secret")->required();
  tok->callback([exit_code] {
    try {
      actors::check_secret(tok_path);
      std::cout << actors::api_token(tok_path) << std::endl;
      *exit_code = kOk;
    } catch (const Error& e) {
      std::cerr << "troupe secret: " << e.what() << "\n";
      *exit_code = kUsage;
    }
  });
  init->callback([exit_code] {
    try {
      actors::write_secret(path, days);
      actors::check_secret(path);
      std::cout << "troupe secret: wrote " << path
                << " (mode 0600). Give it to the coordinator, every agent and every client host with "
                   "--secret-file or "
                << actors::kSecretEnv << "; keep it private." << std::endl;
      *exit_code = kOk;
    } catch (const Error& e) {
      std::cerr << "troupe secret: " << e.what() << "\n";
      *exit_code = kUsage;
    }
  });
}

}  // namespace troupe::cli

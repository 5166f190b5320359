#include <CLI/CLI.hpp>
#include <iostream>

#include "cli/commands.hpp"
#include "core/spec.hpp"
#include "plan/fit.hpp"

namespace troupe::cli {

void add_validate_command(CLI::App& app, int* exit_code) {
  auto* cmd =
      app.add_subcommand("validate", "Check job specs and print each one resolved, with every default");
  static std::vector<std::string> files;
  static bool quiet = false;
  cmd->add_option("specs", files, "YAML job spec files")->required();
  cmd->add_flag("-q,--quiet", quiet, "Only report errors");
  cmd->callback([exit_code] {
    int bad = 0;
    for (size_t i = 0; i < files.size(); ++i) {
      try {
        JobSpec spec = load_spec(files[i]);
        // Small token files are read through once here, so that an id the model cannot embed is
        // found now rather than at the workers' start.
        require_startable(spec, kValidateScanBytes);
        // A model no device could hold under any layout the spec allows is refused here too.
        plan::require_fits_hardware(spec);
        if (quiet) continue;
        if (files.size() > 1) std::cout << (i ? "---\n" : "") << "# " << files[i] << "\n";
        std::cout << to_yaml(spec);
      } catch (const SpecError& e) {
        ++bad;
        std::cerr << e.what();
        if (!std::string(e.what()).empty() && e.what()[std::string(e.what()).size() - 1] != '\n')
          std::cerr << "\n";
      }
    }
    if (bad) std::cerr << bad << " of " << files.size() << " spec file(s) invalid\n";
    *exit_code = bad ? kUsage : kOk;
  });
}

}  // namespace troupe::cli

// `troupe plan job.yaml`: the plan a job would run, without running it.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "cli/commands.hpp"
#include "core/spec.hpp"
#include "plan/plan.hpp"

namespace troupe::cli {

void add_plan_command(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand(
      "plan", "Print the plan of a job: stage layers, micro-batches, schedule, and where each rank sits");
  static std::string file;
  cmd->add_option("spec", file, "YAML job spec")->required();
  cmd->callback([exit_code] {
    JobSpec spec;
    try {
      spec = load_spec(file);
      require_runnable(spec);
    } catch (const SpecError& e) {
      std::cerr << e.what();
      *exit_code = kUsage;
      return;
    }
    if (!layout_devices(spec.parallel)) {
      std::cerr << "troupe plan: " << file << ": parallel degrees set to 'auto' need the planner; "
                << "give data, pipeline and tensor as numbers\n";
      *exit_code = kUsage;
      return;
    }
    const Layout layout = layout_of(spec.parallel);
    try {
      const plan::Plan p = plan::make_plan(plan::plan_inputs(spec), layout);
      std::printf("%s\n", p.str().c_str());
      for (int k = 0; k < p.partition.n_chunks(); ++k)
        std::printf("  model chunk %d: %s, cost %.3f block-equivalents\n", k,
                    plan::layers_str({p.partition.chunks[size_t(k)]}).c_str(), p.partition.cost[size_t(k)]);
      if (layout.pp > 1)
        std::printf("  schedule: simulated bubble %.1f%% (theory %.1f%%)\n", 100.0 * p.check.bubble,
                    100.0 * plan::theoretical_bubble(p.schedule, layout.pp, p.virtual_stages, p.n_micro));
      for (int r = 0; r < layout.world(); ++r) std::printf("%s\n", plan::rank_place(p, r).str().c_str());
      *exit_code = kOk;
    } catch (const Error& e) {
      std::cerr << "troupe plan: " << file << ": " << e.what() << "\n";
      *exit_code = kUsage;
    }
  });
}

}  // namespace troupe::cli

// `troupe trace merge RUN_DIR [--out FILE]`: the ranks' timeline traces (core/trace.hpp) as one
// file on rank 0's clock, a process per rank, and what each traced step spent its time on.
//
//   $ troupe trace merge runs/x
//   troupe: merged 2 ranks, 3 steps (steps 2..4) into runs/x/trace/merged.json
//   step   wall ms  compute    comm   other    idle  bubble
//      2     812.3    61.2%   30.1%    3.0%    5.7%   33.0%
//
// RUN_DIR is a run directory (its trace/ folder is read) or that trace folder itself. Exit 2
// on a missing directory, no rank files or a damaged one (named); 1 when merged.json cannot be
// written.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "cli/commands.hpp"
#include "core/error.hpp"
#include "core/trace.hpp"

namespace troupe::cli {

namespace {

namespace fs = std::filesystem;

std::string percent(double share) {
  if (share < 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", share * 100.0);
  return buf;
}

void print_shares(const std::vector<trace::StepShares>& steps) {
  std::printf("%4s%10s%9s%8s%8s%8s%8s\n", "step", "wall ms", "compute", "comm", "other", "idle", "bubble");
  for (const auto& s : steps)
    std::printf("%4lld%10.1f%9s%8s%8s%8s%8s\n", static_cast<long long>(s.step), s.wall_ms,
                percent(s.compute).c_str(), percent(s.comm).c_str(), percent(s.other).c_str(),
                percent(s.idle).c_str(), percent(s.bubble).c_str());
}

int cmd_merge(const std::string& run_dir, std::string out) {
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec)) {
    std::cerr << "troupe trace merge: " << run_dir << ": no such directory\n";
    return kUsage;
  }
  const std::string dir =
      fs::is_directory(fs::path(run_dir) / "trace", ec) ? (fs::path(run_dir) / "trace").string() : run_dir;
  if (out.empty()) out = (fs::path(dir) / "merged.json").string();
  std::vector<trace::RankTrace> ranks;
  std::vector<trace::StepShares> steps;
  try {
    // What is read is the input (a damaged or hostile file: 2); what is written, the output (1).
    for (const auto& f : trace::rank_trace_files(dir)) ranks.push_back(trace::read_rank_trace(f));
  } catch (const Error& e) {
    std::cerr << "troupe trace merge: " << e.what() << "\n";
    return kUsage;
  }
  try {
    steps = trace::merge(ranks, out);
  } catch (const IoError& e) {
    std::cerr << "troupe trace merge: " << e.what() << "\n";
    return kJobFailed;
  } catch (const Error& e) {
    std::cerr << "troupe trace merge: " << e.what() << "\n";
    return kUsage;
  }
  std::printf("troupe: merged %zu rank%s, %zu step%s", ranks.size(), ranks.size() == 1 ? "" : "s",
              steps.size(), steps.size() == 1 ? "" : "s");
  if (!steps.empty())
    std::printf(" (steps %lld..%lld)", static_cast<long long>(steps.front().step),
                static_cast<long long>(steps.back().step));
  std::printf(" into %s\n", out.c_str());
  if (steps.empty())
    std::printf("(no step has a \"step\" span in every rank's trace)\n");
  else
    print_shares(steps);
  return kOk;
}

}  // namespace

void add_trace_command(CLI::App& app, int* exit_code) {
  auto* tr = app.add_subcommand("trace", "Timeline traces of train.trace steps (Chrome trace-event JSON)");
  tr->require_subcommand(1);
  static std::string run_dir, out;
  auto* merge = tr->add_subcommand(
      "merge",
      "Put the ranks' trace/rank<r>.json on rank 0's clock in one file (a process per rank, for Perfetto or "
      "chrome://tracing) and print each step's compute / communication / bubble shares");
  merge->add_option("run_dir", run_dir, "Run directory (or its trace/ folder)")->required();
  merge->add_option("--out", out, "Merged file to write (default RUN_DIR/trace/merged.json)");
  merge->callback([exit_code] { *exit_code = cmd_merge(run_dir, out); });
}

}  // namespace troupe::cli

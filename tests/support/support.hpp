// Helpers shared by the test executables: a fresh temporary directory, a shell
// command (or the built `troupe` binary) run with its output and exit code captured,
// and the step count of a job that a test stops itself.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace troupe::testing {

// train.steps of a job that must still run when the test acts on it (kills, scales,
// interrupts or cancels it): no machine trains this many steps of a tiny model within a
// test, so the job cannot end first however fast it runs. The test ends it itself.
// A job that must end by itself has a bounded length instead, and nothing acts on it
// from outside while it runs.
inline constexpr int64_t kEndlessSteps = 1000000000;

// An empty directory under the system temp dir, unique to this process: <tmp>/troupe_<name>_<pid>.
inline std::string temp_dir(const std::string& name) {
  const auto d =
      std::filesystem::temp_directory_path() / ("troupe_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d.string();
}

struct CommandResult {
  int code = -1;    // exit code, or 128 + signal
  std::string out;  // stdout and stderr together
};

// Runs `command` through /bin/sh with stderr folded into stdout.
inline CommandResult run_command(const std::string& command) {
  const std::string cmd = command + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) throw std::runtime_error("popen failed for: " + command);
  CommandResult r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

// Runs `<env> build/troupe <args>` from the source tree.
inline CommandResult run_troupe(const std::string& args, const std::string& env = "") {
  return run_command(std::string("cd ") + TROUPE_SOURCE_DIR + " && " + env + " " + TROUPE_BINARY_DIR +
                     "/troupe " + args);
}

}  // namespace troupe::testing

// One measurement per process, for benchmarks that report peak memory next to
// speed: each child's peak resident set is its own, not its parent's and not
// that of a measurement that ran before it in the same process.
//
// Peak RSS. wait4's ru_maxrss (KiB) also counts the image a child was forked
// from: Linux carries the hiwater mark of the pre-exec address space over exec.
// A child that can reports its own VmHWM (self_peak_rss_kib), which starts
// afresh at exec, and the caller prefers it; ru_maxrss is the fallback.
//
// A child reports on stdout in key=value words (report_value reads them).
#pragma once

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace troupe::bench {

struct ChildRun {
  bool started = false;  // fork and exec succeeded
  int exec_errno = 0;    // why not, when they did not
  int exit_code = -1;    // when it exited
  int signal = 0;        // when a signal ended it
  std::string out;       // everything it wrote to stdout
  long max_rss_kib = 0;  // wait4's ru_maxrss
};

// Runs argv[0] (looked up on PATH) with argv, its stdout captured, its stderr
// inherited or sent to /dev/null; returns when it has exited.
inline ChildRun run_child(const std::vector<std::string>& argv, bool quiet_stderr) {
  ChildRun r;
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // out: the child's stdout. err: close-on-exec, so it reads EOF when exec worked
  // and the child's errno when it did not.
  int out[2], err[2];
  if (pipe(out) != 0) return r;
  if (pipe2(err, O_CLOEXEC) != 0) {
    close(out[0]);
    close(out[1]);
    return r;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid == 0) {
    // Only async-signal-safe calls until exec.
    dup2(out[1], STDOUT_FILENO);
    close(out[0]);
    close(out[1]);
    close(err[0]);
    if (quiet_stderr) {
      const int null_fd = open("/dev/null", O_WRONLY);
      if (null_fd >= 0) dup2(null_fd, STDERR_FILENO);
    }
    execvp(args[0], args.data());
    const int e = errno;
    (void)!write(err[1], &e, sizeof e);
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  if (pid < 0) {
    close(out[0]);
    close(err[0]);
    return r;
  }
  char buf[4096];
  for (;;) {
    const ssize_t n = read(out[0], buf, sizeof buf);
    if (n > 0)
      r.out.append(buf, size_t(n));
    else if (n == 0 || errno != EINTR)
      break;
  }
  close(out[0]);
  r.started = read(err[0], &r.exec_errno, sizeof r.exec_errno) != ssize_t(sizeof r.exec_errno);
  if (r.started) r.exec_errno = 0;
  close(err[0]);
  int status = 0;
  rusage ru{};
  while (wait4(pid, &status, 0, &ru) < 0 && errno == EINTR) {
  }
  r.max_rss_kib = ru.ru_maxrss;
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  return r;
}

// This process's peak resident set since its exec (VmHWM), in KiB; 0 without /proc.
inline long self_peak_rss_kib() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  long kib = 0;
  while (std::fgets(line, sizeof line, f) != nullptr)
    if (std::strncmp(line, "VmHWM:", 6) == 0) {
      kib = std::atol(line + 6);
      break;
    }
  std::fclose(f);
  return kib;
}

// The path of the running executable, for a re-exec of itself; `fallback` (argv[0])
// where /proc is missing.
inline std::string self_executable(const char* fallback) {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, size_t(n)) : std::string(fallback);
}

// The interpreter for the PyTorch reference scripts: $TROUPE_PYTHON, else the system python3
// (where Debian's python3-torch lives), else python3 on PATH.
inline std::string python() {
  if (const char* env = std::getenv("TROUPE_PYTHON")) return env;
  if (FILE* f = std::fopen("/usr/bin/python3", "r")) {
    std::fclose(f);
    return "/usr/bin/python3";
  }
  return "python3";
}

// The text after the last "key=" that starts a word in `out`, up to the end of its
// line when to_eol, else up to the next blank; "" when absent.
inline std::string report_text(const std::string& out, const std::string& key, bool to_eol = false) {
  const std::string k = key + "=";
  for (size_t at = out.rfind(k); at != std::string::npos;
       at = at == 0 ? std::string::npos : out.rfind(k, at - 1)) {
    if (at != 0 && out[at - 1] != ' ' && out[at - 1] != '\n') continue;
    const size_t from = at + k.size();
    const size_t to = out.find_first_of(to_eol ? "\n" : " \n", from);
    return out.substr(from, to == std::string::npos ? std::string::npos : to - from);
  }
  return "";
}

// The number after "key=" (report_text); NaN when absent or not a number.
inline double report_value(const std::string& out, const std::string& key) {
  const std::string text = report_text(out, key);
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  return text.empty() || end == text.c_str() ? std::nan("") : v;
}

}  // namespace troupe::bench

// What the scale driver measures with: processes it starts with pipes, CPU time and resident
// memory of a process (/proc), percentiles, one HTTP GET, the coordinator's event feed.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

namespace troupe::scale {

// A child with its stdin and stdout on pipes (stderr to `log`); killed (SIGKILL) and reaped
// by the destructor unless it exited. `nice` is its scheduling niceness, where the system
// allows it (a negative one needs CAP_SYS_NICE; without it the child runs at 0).
class Child {
 public:
  Child(const std::vector<std::string>& argv, const std::string& log, bool pipes, int nice = 0);
  ~Child();
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  int pid() const { return pid_; }
  int out_fd() const { return out_; }
  void send_line(const std::string& line);  // to its stdin
  void close_stdin();
  // Exit code (128 + signal when a signal ended it), or -1 when it still runs after `ms`.
  int wait(int ms);

 private:
  int pid_ = -1, in_ = -1, out_ = -1;
  bool reaped_ = false;
  int code_ = -1;
};

// CPU seconds (user + system) a process has used so far; its threads included. -1 when gone.
double cpu_seconds(int pid);
double self_cpu_seconds();
// Resident set in KiB (VmRSS), and its peak (VmHWM); 0 when gone.
int64_t rss_kib(int pid);
int64_t peak_rss_kib(int pid);

// p in [0, 100] of the values (nearest rank); 0 when empty.
double percentile(std::vector<double> v, double p);

struct HttpResult {
  bool ok = false;
  int status = 0;
  size_t bytes = 0;  // body
  double ms = 0;
  std::string error;
};
// GET http://host:port/path, the whole answer read (Connection: close).
HttpResult http_get(const std::string& host_port, const std::string& path);

// CLOCK_REALTIME milliseconds (the coordinator stamps events with it) at a CLOCK_MONOTONIC time.
double realtime_ms_at(int64_t mono_ns);

// Subscribes to the coordinator's PUB socket (PLAIN, the API token) on a thread and hands
// each event, with its CLOCK_MONOTONIC arrival time, to on_event.
class EventFeed {
 public:
  EventFeed(std::string endpoint, std::string token,
            std::function<void(const nlohmann::json&, int64_t arrival_ns)> on_event);
  ~EventFeed();

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace troupe::scale

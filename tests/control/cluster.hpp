// Multi-process test helpers: start the built `troupe` binary as coordinator,
// agents and clients on loopback with ephemeral ports; every wait is bounded.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "actors/secret.hpp"
#include "coordinator/client.hpp"

namespace troupe::test {

inline std::string troupe_binary() { return std::string(TROUPE_BINARY_DIR) + "/troupe"; }

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Polls pred every 20 ms until it holds or `limit` passes; returns pred().
inline bool wait_until(const std::function<bool()>& pred, std::chrono::milliseconds limit) {
  auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pred();
}

// A process is gone when /proc has no live entry for it (a zombie counts as gone:
// it runs nothing and holds no device).
inline bool process_alive(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return false;
  std::string s;
  try {
    s.assign(std::istreambuf_iterator<char>(stat), std::istreambuf_iterator<char>());
  } catch (const std::ios_base::failure&) {
    return false;  // reaped between open and read: reading its stat fails with ESRCH
  }
  auto paren = s.rfind(')');
  return paren != std::string::npos && paren + 2 < s.size() && s[paren + 2] != 'Z';
}

class Proc {
 public:
  Proc(const std::vector<std::string>& args, const std::string& log) : log_(log) {
    std::vector<std::string> a = args;
    std::vector<char*> argv;
    for (auto& s : a) argv.push_back(s.data());
    argv.push_back(nullptr);
    pid_t parent = getpid();
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // a crashed test leaves nothing behind
      if (getppid() != parent) _exit(127);
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      execv(argv[0], argv.data());
      _exit(127);
    }
  }
  ~Proc() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  Proc(const Proc&) = delete;
  Proc& operator=(const Proc&) = delete;

  int pid() const { return pid_; }
  void signal(int sig) { ::kill(pid_, sig); }
  // Exit code (128 + signal when killed), or -1 if still running after `limit`.
  int wait(std::chrono::milliseconds limit) {
    if (reaped_) return code_;
    bool done = wait_until(
        [&] {
          int st = 0;
          pid_t got = waitpid(pid_, &st, WNOHANG);
          if (got == pid_) {
            reaped_ = true;
            code_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
          }
          return reaped_;
        },
        limit);
    return done ? code_ : -1;
  }
  std::string output() const { return read_file(log_); }
  // Whether its output held `text` within `limit`.
  bool says(const std::string& text, std::chrono::milliseconds limit = std::chrono::seconds(30)) const {
    return wait_until([&] { return output().find(text) != std::string::npos; }, limit);
  }

 private:
  std::string log_;
  pid_t pid_ = -1;
  bool reaped_ = false;
  int code_ = -1;
};

// A coordinator process and its agents, in a fresh temporary directory, all
// holding the same new cluster secret (secret()).
class Cluster {
 public:
  explicit Cluster(std::vector<std::string> coordinator_extra = {},
                   const std::string& api = "tcp://127.0.0.1:0") {
    char tmpl[] = "/tmp/troupe-control-XXXXXX";
    dir_ = mkdtemp(tmpl);
    actors::write_secret(secret());
    std::vector<std::string> args = {
        troupe_binary(), "coordinator",  "--listen",     "127.0.0.1:0",        "--api",         api,
        "--runs-dir",    dir_ + "/runs", "--ready-file", dir_ + "/ready.json", "--secret-file", secret()};
    for (auto& a : coordinator_extra) args.push_back(a);
    coordinator_ = std::make_unique<Proc>(args, dir_ + "/coordinator.log");
    wait_until([&] { return std::filesystem::exists(dir_ + "/ready.json"); }, std::chrono::seconds(30));
    if (std::filesystem::exists(dir_ + "/ready.json"))
      ready_ = nlohmann::json::parse(read_file(dir_ + "/ready.json"));
  }
  ~Cluster() {
    agents_.clear();
    coordinator_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  bool ready() const { return ready_.is_object(); }
  std::string listen() const { return ready_.value("listen", ""); }
  std::string api() const { return ready_.value("api", ""); }
  std::string pub() const { return ready_.value("pub", ""); }
  int coordinator_pid() const { return ready_.value("pid", 0); }
  const nlohmann::json& ready_json() const { return ready_; }
  const std::string& dir() const { return dir_; }
  std::string secret() const { return dir_ + "/secret.pem"; }
  Proc& coordinator() { return *coordinator_; }

  Proc& add_agent(const std::string& devices, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {troupe_binary(), "agent", "--coordinator", listen(),
                                     "--devices",     devices, "--secret-file", secret()};
    for (auto& a : extra) args.push_back(a);
    agents_.push_back(
        std::make_unique<Proc>(args, dir_ + "/agent" + std::to_string(agents_.size()) + ".log"));
    return *agents_.back();
  }
  // Waits until the coordinator counts `n` cpu devices.
  bool wait_devices(int n) {
    return wait_until(
        [&] {
          auto r = call({{"op", "list"}});
          return r.value("ok", false) && r["devices"]["cpu"]["total"] == n;
        },
        std::chrono::seconds(30));
  }

  // The API token holders of the cluster secret derive.
  std::string token() const { return actors::api_token(secret()); }
  // One API request, with `token` ("" = the secret's).
  nlohmann::json call(nlohmann::json req, const std::string& token = "") {
    coord::ClientOptions o;
    o.endpoint = api();
    o.token = token.empty() ? this->token() : token;
    return coord::api_call(o, std::move(req));
  }
  nlohmann::json status(const std::string& job) { return call({{"op", "status"}, {"job", job}})["job"]; }
  bool wait_state(const std::string& job, const std::function<bool(const nlohmann::json&)>& pred,
                  std::chrono::milliseconds limit = std::chrono::seconds(60)) {
    return wait_until(
        [&] {
          auto s = status(job);
          return s.is_object() && pred(s);
        },
        limit);
  }
  bool wait_state(const std::string& job, const std::string& state,
                  std::chrono::milliseconds limit = std::chrono::seconds(60)) {
    return wait_state(
        job, [&](const nlohmann::json& s) { return s["state"] == state; }, limit);
  }

 private:
  std::string dir_;
  nlohmann::json ready_;
  std::unique_ptr<Proc> coordinator_;
  std::vector<std::unique_ptr<Proc>> agents_;
};

// The tiny 1x1x1 job spec, renamed, with `steps` optimizer steps.
inline std::string tiny_spec(const std::string& name, int steps) {
  std::string s = read_file(std::string(TROUPE_SOURCE_DIR) + "/configs/layouts/tiny_dp1_pp1_tp1.yaml");
  auto replace = [&](const std::string& from, const std::string& to) {
    auto p = s.find(from);
    if (p != std::string::npos) s.replace(p, from.size(), to);
  };
  replace("name: tiny-dp1-pp1-tp1", "name: " + name);
  replace("steps: 10", "steps: " + std::to_string(steps));
  return s;
}

inline std::vector<int> worker_pids(const nlohmann::json& status) {
  std::vector<int> pids;
  for (const auto& w : status["workers"]) pids.push_back(w["pid"].get<int>());
  return pids;
}

}  // namespace troupe::test

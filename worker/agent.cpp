#include "worker/agent.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>

#include "actors/system.hpp"
#include "actors/validate.hpp"
#include "worker/relay.hpp"

namespace troupe::worker {

namespace {

using namespace troupe::actors;

struct Child {
  std::string job_id;
  int32_t generation = 0;
  int32_t rank = 0;
  std::string token;  // its launch's: its relay's key (worker/relay.hpp)
};

// A "where" the coordinator asked for the host's workers: answered when each worker answered,
// or at its deadline (the reap tick looks) with what came.
struct WherePending {
  WhereAnswers out;
  size_t left = 0;
  bool delivered = false;
  std::chrono::steady_clock::time_point deadline;
  caf::typed_response_promise<WhereAnswers> rp;
  void deliver() {
    if (delivered) return;
    delivered = true;
    rp.deliver(std::move(out));
  }
};

struct AgentState {
  AgentActorOptions opt;
  coordinator_actor coordinator;
  std::shared_ptr<WorkerLauncher> launcher;
  std::string relay_address;             // the relay hub's, "" = none
  std::shared_ptr<LaunchTokens> tokens;  // the live launches', shared with the relay hub
  std::map<pid_t, Child> children;
  std::set<pid_t> reported_stops;  // stopped children already reported, until continued
  bool stopped = false;
  std::vector<std::shared_ptr<WherePending>> where_pending;
  static inline const char* name = "troupe.agent";
};

using self_ptr = agent_actor::stateful_pointer<AgentState>;

extern "C" char** environ;

// Worker processes: fork + exec of the troupe binary, reaped with waitpid.
class ProcessLauncher : public WorkerLauncher {
 public:
  explicit ProcessLauncher(const AgentActorOptions& o) : o_(o) {}

  int32_t start(const LaunchRequest& r, const std::string& relay) override {
    std::vector<std::string> args = {o_.worker_binary, "worker",
                                     "--coordinator",  o_.coordinator_address,
                                     "--job",          r.job_id,
                                     "--generation",   std::to_string(r.generation),
                                     "--rank",         std::to_string(r.rank),
                                     "--device",       r.device,
                                     "--secret-file",  o_.secret_file};
    if (!relay.empty()) {
      args.push_back("--relay");
      args.push_back(relay);
    }
    if (!o_.data_interface.empty()) {
      args.push_back("--data-interface");
      args.push_back(o_.data_interface);
    }
    if (o_.worker_protocol_override) {
      args.push_back("--protocol-version-override");
      args.push_back(std::to_string(o_.worker_protocol_override));
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    // The launch token goes through the environment, which only this user can
    // read (/proc/PID/environ), not the command line, which everyone can.
    std::vector<std::string> env;
    for (char** e = environ; e && *e; ++e)
      if (std::string(*e).rfind(std::string(kLaunchTokenEnv) + "=", 0) != 0) env.emplace_back(*e);
    env.push_back(std::string(kLaunchTokenEnv) + "=" + r.token);
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    int logfd = -1;
    if (!r.log_path.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(std::filesystem::path(r.log_path).parent_path(), ec);
      logfd = ::open(r.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (logfd < 0) return -errno;
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
      int err = errno;
      if (logfd >= 0) ::close(logfd);
      return -err;
    }
    if (pid == 0) {
      // Only async-signal-safe calls from here to exec.
      setpgid(0, 0);  // a Ctrl-C at the terminal reaches the agent, which stops its workers itself
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);  // the agent died between fork and prctl
      if (logfd >= 0) {
        dup2(logfd, 1);
        dup2(logfd, 2);
      }
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);  // the agent blocks SIGINT/SIGTERM; exec would keep the mask
      // Inherited sockets (the agent's CAF connections) must not live on in the worker.
#ifdef SYS_close_range
      if (syscall(SYS_close_range, 3u, ~0u, 0u) != 0)
#endif
        for (int fd = 3; fd < 4096; ++fd) ::close(fd);
      execve(argv[0], argv.data(), envp.data());
      _exit(127);
    }
    if (logfd >= 0) ::close(logfd);
    pids_.push_back(pid);
    return pid;
  }

  void kill(int32_t pid) override {
    if (std::find(pids_.begin(), pids_.end(), pid) != pids_.end()) ::kill(pid, SIGKILL);
  }

  std::vector<Ended> reap(bool block) override {
    std::vector<Ended> out;
    const auto now = std::chrono::steady_clock::now();
    for (auto it = pids_.begin(); it != pids_.end();) {
      int status = 0;
      pid_t got = waitpid(*it, &status, block ? 0 : WNOHANG | WUNTRACED | WCONTINUED);
      if (got > 0 && WIFSTOPPED(status)) {
        stopped_.emplace(*it, std::make_pair(WSTOPSIG(status), now));
        continue;  // the same pid again: it may have been continued or killed since
      }
      if (got > 0 && WIFCONTINUED(status)) {
        stopped_.erase(*it);
        continue;
      }
      if (got == 0) {
        ++it;
        continue;
      }
      Ended e{*it, -1, 0};
      if (got > 0 && WIFEXITED(status)) e.exit_code = WEXITSTATUS(status);
      if (got > 0 && WIFSIGNALED(status)) e.signal = WTERMSIG(status);
      out.push_back(e);
      stopped_.erase(*it);
      it = pids_.erase(it);
    }
    return out;
  }

  std::vector<Stopped> stopped() override {
    std::vector<Stopped> out;
    const auto now = std::chrono::steady_clock::now();
    for (const auto& [pid, s] : stopped_)
      out.push_back({pid, s.first, std::chrono::duration_cast<std::chrono::milliseconds>(now - s.second)});
    return out;
  }

 private:
  AgentActorOptions o_;
  std::vector<pid_t> pids_;
  // Children stopped by a signal and not continued: the signal and when it was seen.
  std::map<pid_t, std::pair<int, std::chrono::steady_clock::time_point>> stopped_;
};

// Starts one worker. Returns its pid, or -errno (-EINVAL for a request that names a
// device this agent does not offer, or a malformed id).
int32_t start_worker(self_ptr self, const LaunchRequest& r) {
  auto& o = self->state.opt;
  if (std::find(o.devices.begin(), o.devices.end(), r.device) == o.devices.end() ||
      !check_word(r.job_id, kMaxId, "job id").empty() || !check_word(r.token, kMaxId, "token").empty() ||
      r.generation < 0 || r.rank < 0 || r.log_path.size() > 4096 ||
      r.log_path.find('\0') != std::string::npos)
    return -EINVAL;
  // The token is live before the worker can ask for its relay.
  if (!self->state.relay_address.empty()) self->state.tokens->add(r.token);
  const int32_t pid = self->state.launcher->start(r, self->state.relay_address);
  if (pid > 0)
    self->state.children[pid] = Child{r.job_id, r.generation, r.rank, r.token};
  else
    self->state.tokens->remove(r.token);
  return pid;
}

void reap(self_ptr self, bool block) {
  auto& s = self->state;
  for (const auto& e : s.launcher->reap(block)) {
    auto it = s.children.find(e.pid);
    if (it == s.children.end()) continue;
    WorkerExit x{it->second.job_id, it->second.generation, it->second.rank, e.pid, e.exit_code, e.signal};
    if (!block) self->send(s.coordinator, worker_exit_atom::value, x);
    s.tokens->remove(it->second.token);
    s.children.erase(it);
  }
}

// A child stopped for the grace period is reported once per stop: the coordinator takes it
// for a hang and has it killed (a stopped process takes SIGKILL).
void report_stopped(self_ptr self) {
  auto& s = self->state;
  std::set<pid_t> now_stopped;
  for (const auto& t : s.launcher->stopped()) {
    now_stopped.insert(t.pid);
    auto it = s.children.find(t.pid);
    if (it == s.children.end() || t.since < s.opt.stopped_grace || s.reported_stops.count(t.pid)) continue;
    s.reported_stops.insert(t.pid);
    const auto ms = std::min<int64_t>(t.since.count(), INT32_MAX);
    self->send(s.coordinator, worker_stop_atom::value,
               WorkerStopped{it->second.job_id, it->second.generation, it->second.rank, t.pid, t.signal,
                             static_cast<int32_t>(ms)});
  }
  // Continued or gone: a later stop is news again.
  for (auto it = s.reported_stops.begin(); it != s.reported_stops.end();)
    it = now_stopped.count(*it) ? std::next(it) : s.reported_stops.erase(it);
}

void stop(self_ptr self, int code, const std::string& why) {
  auto& s = self->state;
  if (s.stopped) return;
  s.stopped = true;
  for (const auto& [pid, c] : s.children) s.launcher->kill(pid);
  reap(self, true);
  if (s.opt.on_stop) s.opt.on_stop(code, why);
  self->quit();
}

}  // namespace

std::shared_ptr<WorkerLauncher> make_process_launcher(const AgentActorOptions& options) {
  return std::make_shared<ProcessLauncher>(options);
}

namespace {

// How long the agent waits for its host's workers to say where they are: its reap tick (20 ms
// unless set otherwise) answers then with what came, within the coordinator's wait for the
// agent (1 s), so that a hung rank leaves only its own answer out. One deadline per question,
// not a timer per worker.
constexpr auto kWhereWait = std::chrono::milliseconds(400);
// What the agent passes on of one worker's answer, at most (the coordinator cuts it further).
constexpr size_t kMaxWhereText = 1024;

// Asks each worker named (an actor of this node: a relay, or an actor the agent's launcher
// made here) where it is, and answers for all once each has answered or kWhereWait passed.
// A handle of another node is left unanswered: an agent speaks only for its own host. (A
// worker that never answers: its relay's own request to it ends in 5 s, and so does this.)
caf::typed_response_promise<WhereAnswers> ask_where(self_ptr self, std::vector<worker_actor> workers) {
  auto p = std::make_shared<WherePending>();
  p->out.answered.assign(workers.size(), 0);
  p->out.where.assign(workers.size(), "");
  p->left = workers.size() + 1;  // and this call's own, last
  p->deadline = std::chrono::steady_clock::now() + kWhereWait;
  p->rp = self->make_response_promise<WhereAnswers>();
  auto one_done = [p] {
    if (--p->left == 0) p->deliver();
  };
  for (size_t i = 0; i < workers.size(); ++i) {
    const worker_actor& w = workers[i];
    if (!w || w.node() != self->node()) {
      one_done();
      continue;
    }
    self->request(w, caf::infinite, where_atom::value)
        .then(
            [p, i, one_done](std::string& said) {
              if (!p->delivered) {
                if (said.size() > kMaxWhereText) said.resize(kMaxWhereText);
                p->out.answered[i] = 1;
                p->out.where[i] = std::move(said);
              }
              one_done();
            },
            [one_done](caf::error&) { one_done(); });
  }
  auto rp = p->rp;
  one_done();
  if (!p->delivered) self->state.where_pending.push_back(p);
  return rp;
}

// The reap tick: questions past their deadline are answered with what came.
void where_deadlines(self_ptr self) {
  auto& pending = self->state.where_pending;
  const auto now = std::chrono::steady_clock::now();
  for (auto& p : pending)
    if (now >= p->deadline) p->deliver();
  pending.erase(std::remove_if(pending.begin(), pending.end(), [](const auto& p) { return p->delivered; }),
                pending.end());
}

agent_actor::behavior_type agent_fn(self_ptr self, coordinator_actor coordinator, AgentActorOptions opt,
                                    std::string relay_address, std::shared_ptr<LaunchTokens> tokens) {
  self->state.relay_address = std::move(relay_address);
  self->state.tokens = std::move(tokens);
  self->state.launcher = opt.launcher ? opt.launcher : make_process_launcher(opt);
  self->state.opt = std::move(opt);
  self->state.coordinator = coordinator;
  self->monitor(coordinator);
  self->set_down_handler([=](caf::down_msg& dm) {
    stop(self, kAgentLostCoordinator, "lost the coordinator: " + self->system().render(dm.reason));
  });
  AgentHello hello{self->state.opt.protocol,
                   self->state.opt.host.empty() ? host_name() : self->state.opt.host,
                   static_cast<int32_t>(getpid()), self->state.opt.devices};
  self->request(coordinator, std::chrono::seconds(30), reg_agent_atom::value, hello)
      .then(
          [=](const Welcome& w) {
            if (!w.accepted)
              stop(self, 1, "refused by the coordinator: " + w.message);
            else if (self->state.opt.on_registered)
              self->state.opt.on_registered();
          },
          [=](caf::error& e) {
            stop(self, kAgentLostCoordinator, "registration failed: " + self->system().render(e));
          });
  self->delayed_send(self, self->state.opt.reap_every, tick_atom::value);
  return {
      [=](launch_atom, const LaunchRequest& r) -> int32_t { return start_worker(self, r); },
      [=](kill_atom, const KillRequest& k) {
        if (!check(k).empty()) return;  // only the coordinator sends it; a malformed one names nothing
        for (const auto& [pid, c] : self->state.children) {
          if (c.job_id != k.job_id) continue;
          for (size_t i = 0; i < k.ranks.size(); ++i)
            if (c.generation == k.generations[i] && c.rank == k.ranks[i]) self->state.launcher->kill(pid);
        }
      },
      [=](abort_atom, int32_t generation, const std::string& why, const std::vector<worker_actor>& workers) {
        // Only from the coordinator, for at most a host's share, and only to this node's actors
        // (its relays, or its launcher's): as "where".
        auto sender = self->current_sender();
        if (!sender || sender->node() != self->state.coordinator.node() || workers.size() > kMaxWhereBatch)
          return;
        for (const auto& w : workers)
          if (w && w.node() == self->node()) self->send(w, abort_atom::value, generation, why);
      },
      [=](where_atom, std::vector<worker_actor>& workers) -> caf::typed_response_promise<WhereAnswers> {
        // Only the coordinator asks (checked before the promise is made: making it takes the
        // sender from the message).
        auto sender = self->current_sender();
        if (!sender || sender->node() != self->state.coordinator.node() || workers.size() > kMaxWhereBatch) {
          auto rp = self->make_response_promise<WhereAnswers>();
          rp.deliver(caf::make_error(caf::sec::unexpected_message));
          return rp;
        }
        return ask_where(self, std::move(workers));
      },
      [=](tick_atom) {
        where_deadlines(self);
        reap(self, false);
        report_stopped(self);
        self->delayed_send(self, self->state.opt.reap_every, tick_atom::value);
      },
      [=](shutdown_atom) { stop(self, 0, "shut down"); },
  };
}

}  // namespace

actors::agent_actor spawn_agent(caf::actor_system& sys, actors::coordinator_actor coordinator,
                                AgentActorOptions options) {
  relay_hub_actor hub;
  step_batcher_actor batcher;
  std::string relay_address;
  auto tokens = std::make_shared<LaunchTokens>();
  if (options.relay) {
    batcher = start_step_batcher(sys, coordinator);
    hub = start_relay_hub(sys, coordinator, batcher, tokens, &relay_address);
    if (!hub) {
      std::cerr << "troupe agent: cannot publish the relay hub on 127.0.0.1 (" << relay_address
                << "): its workers connect to the coordinator themselves" << std::endl;
      relay_address.clear();
    } else {
      std::cerr << "troupe agent: workers reach the coordinator through the relay hub at " << relay_address
                << std::endl;
    }
  }
  auto agent = sys.spawn(agent_fn, std::move(coordinator), std::move(options), std::move(relay_address),
                         std::move(tokens));
  if (hub)
    agent->attach_functor(
        [hub](const caf::error&) { caf::anon_send_exit(hub, caf::exit_reason::user_shutdown); });
  if (batcher)
    agent->attach_functor(
        [batcher](const caf::error&) { caf::anon_send_exit(batcher, caf::exit_reason::user_shutdown); });
  return agent;
}

}  // namespace troupe::worker

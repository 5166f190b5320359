#include "bench/scale/sim.hpp"

#include <dirent.h>
#include <sys/resource.h>
#include <time.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <functional>
#include <future>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "actors/system.hpp"
#include "bench/scale/sim_worker.hpp"
#include "core/run_dir.hpp"
#include "worker/agent.hpp"
#include "worker/relay.hpp"

namespace troupe::scale {

int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

namespace {

using namespace troupe::actors;

// Threads that run queued tasks (starting and stopping nodes: handshakes block).
class Pool {
 public:
  explicit Pool(int n) {
    for (int i = 0; i < n; ++i) threads_.emplace_back([this] { loop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void submit(std::function<void()> f) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      q_.push_back(std::move(f));
    }
    cv_.notify_one();
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> f;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !q_.empty(); });
        if (q_.empty()) return;
        f = std::move(q_.front());
        q_.pop_front();
      }
      f();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> q_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

class Sim;

// The agent's workers are simulated nodes of this process.
class SimLauncher : public worker::WorkerLauncher {
 public:
  SimLauncher(Sim& sim, int agent) : sim_(sim), agent_(agent) {}
  int32_t start(const LaunchRequest& r, const std::string& relay) override;
  void kill(int32_t pid) override;
  std::vector<Ended> reap(bool) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Ended> out;
    out.swap(ended_);
    return out;
  }
  void push(Ended e) {
    std::lock_guard<std::mutex> lock(mu_);
    ended_.push_back(e);
  }

 private:
  Sim& sim_;
  int agent_;
  std::mutex mu_;
  std::vector<Ended> ended_;
};

struct Node {
  std::mutex mu;  // held while the node is built or torn down
  std::unique_ptr<NodeConfig> cfg;
  std::unique_ptr<caf::actor_system> sys;
  caf::actor actor;
  std::shared_ptr<std::promise<void>> thaw;  // set while its multiplexer is held (a hang)
};

struct AgentNode;

struct WorkerNode : Node {
  std::shared_ptr<AgentNode> host;  // inline workers: the agent whose node it is an actor of
  uint64_t id = 0;
  int agent = 0;
  int32_t pid = 0;
  int generation = 0, rank = 0;
  bool gone = false;
};

struct AgentNode : Node {
  int index = 0;
  std::string host;
  std::shared_ptr<SimLauncher> launcher;
  std::optional<coordinator_actor> coordinator;  // its connection's handle, for inline workers
  actors::step_batcher_actor batcher;            // its node's, for inline workers' steps
  std::atomic<bool> lost{false};                 // its node is going: no new actor on it
};

class Sim : public SimSink {
 public:
  explicit Sim(const SimOptions& o)
      : o_(o),
        addr_(parse_host_port(o.coordinator)),
        next_pid_((o.index + 1) * 100000),
        pool_(std::max(1, o.launch_threads)) {}

  int run() {
    flusher_ = std::thread([this] { flush_loop(); });
    if (o_.inline_workers) ticker_ = std::thread([this] { tick_loop(); });
    for (int i = 0; i < o_.agents; ++i) {
      auto a = std::make_shared<AgentNode>();
      a->index = o_.first_agent + i;
      a->host = "simhost-" + std::to_string(a->index);
      a->launcher = std::make_shared<SimLauncher>(*this, a->index);
      {
        std::lock_guard<std::mutex> lock(mu_);
        agents_[a->index] = a;
      }
      pool_.submit([this, a] { start_agent(a); });
    }
    for (std::string line; std::getline(std::cin, line);) {
      std::istringstream in(line);
      std::string cmd;
      in >> cmd;
      if (cmd == "quit") break;
      if (cmd == "kill" || cmd == "hang" || cmd == "stick") {
        int gen = -1, rank = -1;
        in >> gen >> rank;
        if (cmd == "kill")
          kill_rank(gen, rank);
        else if (cmd == "hang")
          hang_rank(gen, rank);
        else
          stick_rank(gen, rank);
      } else if (cmd == "lose_agent") {
        int index = -1, restart_ms = 1000;
        in >> index >> restart_ms;
        lose_agent(index, restart_ms);
      }
    }
    shutdown();
  }

  // ---- SimSink (worker actors' threads)
  void emit(const std::string& line) override {
    std::lock_guard<std::mutex> lock(out_mu_);
    std::fwrite(line.data(), 1, line.size(), stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
  }
  void step_sent(int gen, int64_t step, int64_t t) override {
    std::lock_guard<std::mutex> lock(agg_mu_);
    Agg& a = steps_[{gen, step}];
    ++a.count;
    a.max_t = std::max(a.max_t, t);
    a.touched = now_ns();
  }
  void ckpt_done(int gen, int64_t step, int64_t sent, int64_t reply, bool ok,
                 const std::string& error) override {
    std::lock_guard<std::mutex> lock(agg_mu_);
    Agg& a = ckpts_[{gen, step}];
    ++a.count;
    a.min_t = a.min_t == 0 ? sent : std::min(a.min_t, sent);
    a.max_sent = std::max(a.max_sent, sent);
    a.max_t = std::max(a.max_t, reply);
    if (!ok) {
      ++a.fails;
      if (a.error.empty()) a.error = error.substr(0, 200);
    }
    a.touched = now_ns();
  }
  void ended(uint64_t node, int exit_code) override {
    pool_.submit([this, node, exit_code] { destroy_worker(node, exit_code, 0, true); });
  }

  // ---- the agents' launchers (their actor threads)
  int32_t start_worker(int agent, const LaunchRequest& r, const std::string& relay) {
    auto n = std::make_shared<WorkerNode>();
    {
      std::lock_guard<std::mutex> lock(mu_);
      n->id = next_node_++;
      n->pid = next_pid_++;
      n->agent = agent;
      n->generation = r.generation;
      n->rank = r.rank;
      workers_[n->id] = n;
      by_pid_[n->pid] = n->id;
      by_rank_[{r.generation, r.rank}] = n->id;
      if (o_.inline_workers)
        if (auto a = agents_.find(agent); a != agents_.end()) n->host = a->second;
    }
    emit("launch " + std::to_string(r.generation) + " " + std::to_string(r.rank) + " " +
         std::to_string(now_ns()) + " " + std::to_string(agent));
    SimWorkerConfig c;
    c.job_id = r.job_id;
    c.generation = r.generation;
    c.rank = r.rank;
    c.pid = n->pid;
    c.host = "simhost-" + std::to_string(agent);
    c.token = r.token;
    c.node = n->id;
    c.step_ms = o_.step_ms;
    c.ckpt_every = o_.ckpt_every;
    c.ckpt_bytes = o_.ckpt_bytes;
    c.gloo_max = o_.gloo_max;
    c.relay = o_.inline_workers ? std::string() : relay;
    c.ticked = o_.inline_workers;
    pool_.submit([this, n, c] { build_worker(n, c); });
    return n->pid;
  }
  void kill_pid(int32_t pid) {
    uint64_t id = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = by_pid_.find(pid);
      if (it == by_pid_.end()) return;
      id = it->second;
    }
    pool_.submit([this, id] { destroy_worker(id, -1, 9, true); });
  }

 private:
  struct Agg {
    int64_t count = 0, min_t = 0, max_sent = 0, max_t = 0, fails = 0, touched = 0;
    std::string error;
  };

  void start_agent(const std::shared_ptr<AgentNode>& a) {
    std::lock_guard<std::mutex> node_lock(a->mu);
    a->cfg = std::make_unique<NodeConfig>(o_.secret_file);
    a->cfg->set("scheduler.max-threads", size_t{1});
    a->sys = std::make_unique<caf::actor_system>(*a->cfg);
    const int at = a->index;
    auto coord = connect_with_retry<coordinator_actor>(
        *a->sys, addr_.first, addr_.second, std::chrono::milliseconds(100), std::chrono::milliseconds(16000),
        [this, at, node = caf::to_string(a->sys->node())](const caf::error& e,
                                                          std::chrono::milliseconds wait) {
          emit("agent " + std::to_string(at) + " retry " + std::to_string(now_ns()) + " node " + node +
               " in " + std::to_string(wait.count()) + " ms after " + caf::to_string(e));
        });
    if (!coord) {
      emit("agent " + std::to_string(a->index) +
           " stopped 1 cannot reach the coordinator: " + a->sys->render(coord.error()));
      return;
    }
    worker::AgentActorOptions ao;
    ao.coordinator_address = o_.coordinator;
    for (int d = 0; d < o_.devices; ++d) ao.devices.push_back("cpu:" + std::to_string(d));
    ao.host = a->host;
    ao.secret_file = o_.secret_file;
    ao.launcher = a->launcher;
    ao.relay = o_.relay && !o_.inline_workers;  // inline workers need no hub: a batcher of their own
    ao.reap_every = std::chrono::milliseconds(o_.reap_ms);
    const int index = a->index;
    ao.on_registered = [this, index] {
      emit("agent " + std::to_string(index) + " registered " + std::to_string(now_ns()));
    };
    std::weak_ptr<AgentNode> weak = a;
    ao.on_stop = [this, index, weak](int code, const std::string& why) {
      emit("agent " + std::to_string(index) + " stopped " + std::to_string(code) + " " + why + " at " +
           utc_timestamp());
      // As a supervisor (systemd, Slurm) restarts an agent process that exits: its node goes
      // (not from its own thread) and a fresh one registers after a second.
      auto agent = weak.lock();
      if (code == 0 || !agent || agent->lost) return;
      std::lock_guard<std::mutex> lock(mu_);
      if (!stopping_) restarts_.emplace_back([this, index] { lose_agent(index, 1000, false); });
    };
    a->coordinator = *coord;
    if (o_.inline_workers) a->batcher = worker::start_step_batcher(*a->sys, *coord);
    a->actor = caf::actor_cast<caf::actor>(worker::spawn_agent(*a->sys, *coord, ao));
    // The batcher ends with its agent, as spawn_agent's own does (else its node's system would
    // wait for it as it stops).
    if (a->batcher)
      a->actor->attach_functor(
          [b = a->batcher](const caf::error&) { caf::anon_send_exit(b, caf::exit_reason::user_shutdown); });
  }

  void build_worker(const std::shared_ptr<WorkerNode>& n, SimWorkerConfig c) {
    std::lock_guard<std::mutex> node_lock(n->mu);
    if (n->gone) return;
    if (o_.inline_workers) return build_inline_worker(n, std::move(c));
    n->cfg = std::make_unique<NodeConfig>(o_.secret_file);
    n->cfg->set("scheduler.max-threads", size_t{1});
    n->sys = std::make_unique<caf::actor_system>(*n->cfg);
    // As a worker process: through its agent's relay, or to the coordinator itself; a few
    // tries with backoff while a loaded peer handshakes.
    auto coord = c.relay.empty() ? connect_with_retry<coordinator_actor>(*n->sys, addr_.first, addr_.second,
                                                                         std::chrono::milliseconds(250),
                                                                         std::chrono::milliseconds(4000))
                                 : worker::connect_relay(*n->sys, c.relay, c.token);
    if (!coord) {
      emit("connect_failed " + std::to_string(c.generation) + " " + std::to_string(c.rank) + " " +
           std::to_string(now_ns()) + " " + n->sys->render(coord.error()));
      ended(n->id, 1);
      return;
    }
    n->actor = spawn_sim_worker(*n->sys, *coord, std::move(c), this);
  }

  // An actor of its agent's node: it speaks to the coordinator over the agent's connection (as
  // a relay does for a worker process), and goes with the agent's node. (Under n->mu.)
  void build_inline_worker(const std::shared_ptr<WorkerNode>& n, SimWorkerConfig c) {
    const auto& a = n->host;
    if (a) {
      std::lock_guard<std::mutex> agent_lock(a->mu);
      if (a->sys && !a->lost && a->coordinator) {
        c.batcher = a->batcher;
        n->actor = spawn_sim_worker(*a->sys, *a->coordinator, std::move(c), this);
        return;
      }
    }
    emit("connect_failed " + std::to_string(c.generation) + " " + std::to_string(c.rank) + " " +
         std::to_string(now_ns()) + " its agent is gone");
    ended(n->id, 1);
  }

  // The worker's process is gone: its system stops (its connection closes) and, when its agent
  // lives, the agent reaps it.
  void destroy_worker(uint64_t id, int exit_code, int signal, bool report) {
    std::shared_ptr<WorkerNode> n;
    std::shared_ptr<AgentNode> agent;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = workers_.find(id);
      if (it == workers_.end()) return;
      n = it->second;
      workers_.erase(it);
      by_pid_.erase(n->pid);
      auto r = by_rank_.find({n->generation, n->rank});
      if (r != by_rank_.end() && r->second == id) by_rank_.erase(r);
      if (auto a = agents_.find(n->agent); a != agents_.end()) agent = a->second;
    }
    {
      std::lock_guard<std::mutex> node_lock(n->mu);
      n->gone = true;
      stop_node(*n);
    }
    if (report && agent) agent->launcher->push({n->pid, exit_code, signal});
  }

  // `detached`: its system stops on a thread of its own, and this returns at once.
  static void stop_node(Node& n, bool detached = false) {
    if (n.thaw) n.thaw->set_value();  // a held multiplexer runs again, so that the system can stop
    n.thaw.reset();
    if (n.actor) caf::anon_send_exit(n.actor, caf::exit_reason::kill);
    n.actor = nullptr;
    auto stop = [sys = std::move(n.sys), cfg = std::move(n.cfg)]() mutable {
      sys.reset();
      cfg.reset();
    };
    if (detached)
      std::thread(std::move(stop)).detach();
    else
      stop();
  }

  std::shared_ptr<WorkerNode> worker_at(int gen, int rank) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = by_rank_.find({gen, rank});
    if (it == by_rank_.end()) return nullptr;
    auto w = workers_.find(it->second);
    return w == workers_.end() ? nullptr : w->second;
  }

  // SIGKILL: the process and its connection are gone at once; its agent reaps it.
  void kill_rank(int gen, int rank) {
    auto n = worker_at(gen, rank);
    if (!n) return emit("killed " + std::to_string(gen) + " " + std::to_string(rank) + " 0 not here");
    emit("killed " + std::to_string(gen) + " " + std::to_string(rank) + " " + std::to_string(now_ns()));
    destroy_worker(n->id, -1, 9, true);
  }

  // SIGSTOP, as the network sees it: the node's multiplexer stops, so it neither reads nor
  // writes (no heartbeats) while its process and connection stay. An inline worker shares its
  // agent's node, as a relayed worker its agent's connection: it stops reading, and when its
  // connection to the relay hub would time out (kConnectionTimeout), it ends as its relay
  // does then, with the link's reason.
  void hang_rank(int gen, int rank) {
    if (o_.inline_workers) {
      auto n = stick_rank(gen, rank);
      if (!n) return;
      std::lock_guard<std::mutex> lock(flush_mu_);
      link_timeouts_.push_back({std::chrono::steady_clock::now() + actors::kConnectionTimeout, n});
      return;
    }
    auto n = worker_at(gen, rank);
    if (!n) return emit("hung " + std::to_string(gen) + " " + std::to_string(rank) + " 0 not here");
    std::lock_guard<std::mutex> node_lock(n->mu);
    if (!n->sys || n->thaw) return;
    n->thaw = std::make_shared<std::promise<void>>();
    std::shared_future<void> f = n->thaw->get_future().share();
    n->sys->middleman().backend().post([f] { f.wait(); });
    emit("hung " + std::to_string(gen) + " " + std::to_string(rank) + " " + std::to_string(now_ns()));
  }

  // A worker whose control actor stops answering while its process and connection live.
  std::shared_ptr<WorkerNode> stick_rank(int gen, int rank) {
    auto n = worker_at(gen, rank);
    if (!n) {
      emit("hung " + std::to_string(gen) + " " + std::to_string(rank) + " 0 not here");
      return nullptr;
    }
    std::lock_guard<std::mutex> node_lock(n->mu);
    if (!n->actor || n->gone) {
      emit("hung " + std::to_string(gen) + " " + std::to_string(rank) + " 0 not running");
      return nullptr;
    }
    hang_sim_worker(n->actor);
    emit("hung " + std::to_string(gen) + " " + std::to_string(rank) + " " + std::to_string(now_ns()));
    return n;
  }

  // The hung inline workers whose relay's link has timed out by now end (under flush_mu_).
  void end_timed_out_links() {
    const auto now = std::chrono::steady_clock::now();
    for (auto it = link_timeouts_.begin(); it != link_timeouts_.end();) {
      if (it->at > now) {
        ++it;
        continue;
      }
      if (auto n = it->node.lock()) {
        std::lock_guard<std::mutex> node_lock(n->mu);
        if (n->actor && !n->gone) caf::anon_send_exit(n->actor, caf::exit_reason::remote_link_unreachable);
      }
      it = link_timeouts_.erase(it);
    }
  }

  // The agent's process dies: its connection closes and its workers die with it
  // (PR_SET_PDEATHSIG); a supervisor starts it again after restart_ms.
  // `injected`: the driver's fault (reported as "lost"); else the agent stopped by itself.
  void lose_agent(int index, int restart_ms, bool injected = true) {
    std::shared_ptr<AgentNode> a;
    std::vector<uint64_t> mine;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = agents_.find(index);
      if (it == agents_.end()) return emit("agent " + std::to_string(index) + " lost 0 not here");
      a = it->second;
    }
    {
      // From now on no inline worker starts on its node (its system waits for its actors).
      std::lock_guard<std::mutex> node_lock(a->mu);
      if (a->lost.exchange(true)) return;  // going already
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [id, w] : workers_)
        if (w->agent == index) mine.push_back(id);
    }
    if (injected) emit("agent " + std::to_string(index) + " lost " + std::to_string(now_ns()));
    if (o_.inline_workers)  // its workers are actors of its node: they go first
      for (uint64_t id : mine) destroy_worker(id, -1, 9, false);
    {
      // Its actor ends now; its system stops on a thread of its own, holding no lock: the
      // supervisor's restart below does not wait for it (a system waits for all its actors,
      // and one of a lost agent's, in about one inline run in three at 256 ranks, never ended).
      std::lock_guard<std::mutex> node_lock(a->mu);
      stop_node(*a, /*detached=*/true);
    }
    if (!o_.inline_workers)
      for (uint64_t id : mine) pool_.submit([this, id] { destroy_worker(id, -1, 9, false); });
    std::lock_guard<std::mutex> lock(mu_);
    restarts_.emplace_back([this, index, restart_ms] {
      std::this_thread::sleep_for(std::chrono::milliseconds(restart_ms));
      auto fresh = std::make_shared<AgentNode>();
      fresh->index = index;
      fresh->host = "simhost-" + std::to_string(index);
      fresh->launcher = std::make_shared<SimLauncher>(*this, index);
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_) return;
        agents_[index] = fresh;
      }
      pool_.submit([this, fresh] { start_agent(fresh); });
    });
  }

  // Inline workers step together, on one clock per process: a timer per worker would wake its
  // agent's clock thread once per rank and step, the harness's largest cost at 4,096 ranks.
  // The processes tick at offsets spread over the step (o_.tick_offset_ms): the threads of
  // 512 simulated hosts woken at once (a run queue of 780 on two cores) starved the
  // connections' heartbeats past their timeout, which hosts with cores of their own would not.
  void tick_loop() {
    auto next = std::chrono::steady_clock::now() + std::chrono::milliseconds(o_.tick_offset_ms);
    std::unique_lock<std::mutex> lock(flush_mu_);
    while (!flush_stop_) {
      next += std::chrono::milliseconds(o_.step_ms);
      flush_cv_.wait_until(lock, next);
      if (flush_stop_) break;
      lock.unlock();
      std::vector<std::shared_ptr<WorkerNode>> all;
      {
        std::lock_guard<std::mutex> l(mu_);
        for (const auto& [id, w] : workers_) all.push_back(w);
      }
      for (const auto& w : all) {
        std::lock_guard<std::mutex> node_lock(w->mu);  // its actor is not being torn down meanwhile
        if (w->actor && !w->gone) tick_sim_worker(w->actor);
      }
      lock.lock();
    }
  }

  void flush_loop() {
    std::unique_lock<std::mutex> lock(flush_mu_);
    while (!flush_stop_) {
      flush_cv_.wait_for(lock, std::chrono::milliseconds(250));
      flush(false);
      end_timed_out_links();
      raise_connection_threads();
    }
    flush(true);
  }

  // Each simulated host has its own cores on a cluster; here hundreds share two, and a burst of
  // actor work (a relaunch of thousands of ranks) starved the threads that read and write the
  // nodes' connections and time their heartbeats, so that connections timed out that a host
  // would have kept. Those threads (CAF's multiplexer and clock threads) run at o_.io_nice, the
  // actors and the harness's own threads at the process's priority. (Needs CAP_SYS_NICE to go
  // below 0; else nothing changes.)
  void raise_connection_threads() {
    if (o_.io_nice == 0) return;
    DIR* d = ::opendir("/proc/self/task");
    if (d == nullptr) return;
    while (dirent* e = ::readdir(d)) {
      const int tid = std::atoi(e->d_name);
      if (tid <= 0 || !raised_.insert(tid).second) continue;
      std::ifstream comm("/proc/self/task/" + std::string(e->d_name) + "/comm");
      std::string name;
      std::getline(comm, name);
      if (name == "caf.multiplexer" || name == "caf.clock")
        (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(tid), o_.io_nice);
    }
    ::closedir(d);
  }
  void flush(bool all) {
    std::vector<std::string> lines;
    {
      std::lock_guard<std::mutex> lock(agg_mu_);
      const int64_t quiet = now_ns() - 1500000000;
      for (auto it = steps_.begin(); it != steps_.end();) {
        if (!all && it->second.touched > quiet) {
          ++it;
          continue;
        }
        lines.push_back("step " + std::to_string(it->first.first) + " " + std::to_string(it->first.second) +
                        " " + std::to_string(it->second.count) + " " + std::to_string(it->second.max_t));
        it = steps_.erase(it);
      }
      for (auto it = ckpts_.begin(); it != ckpts_.end();) {
        if (!all && it->second.touched > quiet) {
          ++it;
          continue;
        }
        const Agg& a = it->second;
        lines.push_back("ckpt " + std::to_string(it->first.first) + " " + std::to_string(it->first.second) +
                        " " + std::to_string(a.count) + " " + std::to_string(a.min_t) + " " +
                        std::to_string(a.max_sent) + " " + std::to_string(a.max_t) + " " +
                        std::to_string(a.fails) + " " + a.error);
        it = ckpts_.erase(it);
      }
    }
    for (const auto& l : lines) emit(l);
  }

  // The driver is done with this process: it ends at once, as a killed one does (tearing
  // down thousands of actor systems one at a time took longer than the run itself).
  [[noreturn]] void shutdown() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    {
      std::lock_guard<std::mutex> lock(flush_mu_);
      flush_stop_ = true;
    }
    flush_cv_.notify_all();
    flusher_.join();
    if (ticker_.joinable()) ticker_.join();
    std::fflush(stdout);
    std::_Exit(0);
  }

  SimOptions o_;
  std::pair<std::string, uint16_t> addr_;
  std::mutex out_mu_;
  std::mutex mu_;
  std::map<int, std::shared_ptr<AgentNode>> agents_;
  std::map<uint64_t, std::shared_ptr<WorkerNode>> workers_;
  std::map<int32_t, uint64_t> by_pid_;
  std::map<std::pair<int, int>, uint64_t> by_rank_;
  uint64_t next_node_ = 1;
  int32_t next_pid_;
  bool stopping_ = false;
  std::vector<std::thread> restarts_;  // agents a supervisor starts again (never joined: see shutdown)
  std::mutex agg_mu_;
  std::map<std::pair<int, int64_t>, Agg> steps_, ckpts_;
  std::mutex flush_mu_;
  struct LinkTimeout {
    std::chrono::steady_clock::time_point at;
    std::weak_ptr<WorkerNode> node;
  };
  std::vector<LinkTimeout> link_timeouts_;  // hung inline workers (flush_mu_)
  std::condition_variable flush_cv_;
  bool flush_stop_ = false;
  std::thread flusher_;
  std::thread ticker_;    // inline workers' steps
  std::set<int> raised_;  // threads raise_connection_threads looked at (flusher_'s)
  Pool pool_;             // last: its threads stop (finishing what is queued) before the rest goes
};

int32_t SimLauncher::start(const LaunchRequest& r, const std::string& relay) {
  return sim_.start_worker(agent_, r, relay);
}
void SimLauncher::kill(int32_t pid) { sim_.kill_pid(pid); }

}  // namespace

int run_sim(const SimOptions& o) {
  distinct_node_ids(o.index);
  Sim sim(o);
  return sim.run();
}

}  // namespace troupe::scale

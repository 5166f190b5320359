// Chaos soak: one endless job (2x1x1 unless --layout) on the three-host namespace cluster
// (tests/multihost/netns.hpp) while faults strike at seeded random times, one at a
// time; at the end a table of how the job came through, and its loss curve checked
// against an uninterrupted one-host run of the same spec.
//
//   chaos [--minutes M] [--seed S] [--checkpoint-every N] [--layout FILE] [--interval Q] [--spares K]
//         [--spread] [--calibrate C] [--faults K1,K2,...]
//         (as root; M = 2, S = time of day, N = 5 steps, FILE = tiny_dp2_pp1_tp1 of
//          configs/layouts, Q: the quiet spell before each fault in seconds, else 2-6 s at random,
//          K: the job's hot spares, resources.spares, 0 by default; --spread: resources.placement:
//          spread, the job's ranks on both hosts; C: seconds of the fault-free spell before the
//          faults, 30 by default; K: the fault kinds to draw from, of worker_kill, worker_stop,
//          agent_kill, link_cut and coordinator_restart, all five by default)
//
// ETTR (effective training time ratio): the steps trained once x the clean step time / the
// wall time of the faults' period. The clean step time is the job's own wall time per step in
// the quiet spells between faults (from each spell's second second to the next fault: the same
// cluster, placements and polling; checkpoints, snapshots and metrics included); also printed
// against the median step and against the one-host reference run's wall time per step. The
// fault-free spell before the first fault is timed and printed apart: a job relaunched while a
// host is down may run packed onto one host, at another pace than spread.
//
//   h0: coordinator --listen 10.77.0.1:29400 --state-dir DIR (restartable)
//   h1: agent cpu:2     h2: agent cpu:2     (either host alone holds the job)
//
// Faults: a worker SIGKILLed; a worker SIGSTOPped (SIGCONT 3 s later); an agent
// SIGKILLed (started again 1 s later); h1's or h2's eth0 down (up again 5 s later,
// or once the job trains again, whichever is later); the coordinator SIGTERMed and
// started again on the same --state-dir. The next fault comes only after the job
// trains again (or 90 s passed) and every agent has registered its devices again.
//
// Recovered: metrics.jsonl gains a step of a later generation; or, when the fault
// missed the job (an agent or link of the host the job does not run on), a step at
// least two past the last one before the fault in the same generation (steps continue: the
// fault missed the job's host). Time to recovery: the fault to the moment that line is
// seen (metrics.jsonl polled every 10 ms). Steps recomputed: the last step before the
// fault minus the step the new generation resumed from (status resume_from).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>

#include "tests/multihost/netns.hpp"

using namespace troupe::test;
using nlohmann::json;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kPort = 29400;  // fixed: agents reconnect to the same address after a restart
constexpr int kDevicesPerHost = 2;
constexpr auto kRecoveryBound = 90s;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The tiny GPT of configs/layouts/<layout>.yaml, endless, a checkpoint every `every` steps;
// `steps` > 0 bounds it.
std::string job_spec(const std::string& layout, const std::string& name, int64_t steps, int64_t every,
                     int spares = 0, bool spread = false) {
  std::string s = read_file(std::string(TROUPE_SOURCE_DIR) + "/configs/layouts/" + layout + ".yaml");
  auto replace = [&](const std::string& from, const std::string& to) {
    auto p = s.find(from);
    if (p != std::string::npos) s.replace(p, from.size(), to);
  };
  if (const auto at = s.find("name: "); at != std::string::npos)
    s.replace(at, s.find('\n', at) - at, "name: " + name);
  replace("steps: 10", "steps: " + std::to_string(steps > 0 ? steps : troupe::testing::kEndlessSteps));
  if (spares > 0 || spread)
    s += "\nresources:\n  spares: " + std::to_string(spares) +
         "\n  placement: " + (spread ? "spread" : "pack") + "\n";
  return s + "\ncheckpoint:\n  every: " + std::to_string(every) +
         "\n  keep: 3\nfault:\n  max_restarts: 1000\n";
}

// The step a generation continued with: its in-memory snapshot's, else its checkpoint's.
int64_t resume_step(const json& status) {
  if (status.value("memory_step", int64_t{-1}) >= 0) return status["memory_step"].get<int64_t>();
  const std::string from = status.value("resume_from", "");
  const auto p = from.rfind("step_");
  return p == std::string::npos ? 0 : std::stoll(from.substr(p + 5));
}

// metrics.jsonl read as it grows: the lines added since the last poll.
class MetricsTail {
 public:
  struct Point {
    double loss = 0;
    int64_t generation = 0;
    std::string layout;
  };
  explicit MetricsTail(std::string path) : path_(std::move(path)) {}

  // Reads the new complete lines; calls on_step(step, generation) for each step line.
  void poll(const std::function<void(int64_t, int64_t)>& on_step = {}) {
    std::ifstream in(path_);
    if (!in) return;
    in.seekg(0, std::ios::end);
    const auto size = static_cast<std::streamoff>(in.tellg());
    if (size < offset_) offset_ = 0;  // rewritten: read it again from the start
    in.seekg(offset_);
    for (std::string line; std::getline(in, line);) {
      if (in.eof()) break;  // a line still being written: read it next time
      offset_ += static_cast<std::streamoff>(line.size()) + 1;
      auto m = json::parse(line, nullptr, false);
      if (!m.is_object() || !m.contains("loss") || !m["loss"].is_number()) continue;
      const int64_t step = m["step"], gen = m.value("generation", int64_t{0});
      // The last-written line of a step is the one of the generation that went on.
      curve_[step] = {m["loss"].get<double>(), gen, m.value("layout", "")};
      if (m.contains("step_ms") && m["step_ms"].is_number()) step_ms_.push_back(m["step_ms"].get<double>());
      last_step_ = step;
      last_gen_ = std::max(last_gen_, gen);
      last_of_gen_[gen] = std::max(last_of_gen_[gen], step);
      if (on_step) on_step(step, gen);
    }
  }
  int64_t last_step() const { return last_step_; }
  int64_t last_generation() const { return last_gen_; }
  // The highest step generation `gen` reported: its steps reported after a fault
  // were trained before it.
  int64_t last_step_of(int64_t gen) const {
    auto it = last_of_gen_.find(gen);
    return it == last_of_gen_.end() ? 0 : it->second;
  }
  const std::map<int64_t, Point>& curve() const { return curve_; }
  double median_step_ms() const {
    if (step_ms_.empty()) return 0;
    std::vector<double> v = step_ms_;
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  }

 private:
  std::vector<double> step_ms_;
  std::string path_;
  std::streamoff offset_ = 0;
  int64_t last_step_ = 0, last_gen_ = 0;
  std::map<int64_t, Point> curve_;
  std::map<int64_t, int64_t> last_of_gen_;
};

// The namespace cluster with a restartable coordinator: NetnsCluster's coordinator
// has no --state-dir and an ephemeral port, so this one starts its own processes.
class ChaosCluster {
 public:
  ChaosCluster() {
    char tmpl[] = "/tmp/troupe-chaos-XXXXXX";
    dir_ = mkdtemp(tmpl);
    troupe::actors::write_secret(secret());
  }
  ~ChaosCluster() {
    for (auto& a : agents_) a.reset();
    coordinator_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  const std::string& dir() const { return dir_; }
  std::string secret() const { return dir_ + "/secret.pem"; }
  std::string listen() const { return Netns::address(0) + ":" + std::to_string(kPort); }
  const Netns& net() const { return net_; }

  // Starts the coordinator (again) and waits for its ready file.
  bool start_coordinator() {
    std::filesystem::remove(dir_ + "/ready.json");
    const std::vector<std::string> args = {troupe_binary(), "coordinator",
                                           "--listen",      listen(),
                                           "--api",         "ipc://" + dir_ + "/api",
                                           "--api-pub",     "ipc://" + dir_ + "/pub",
                                           "--runs-dir",    dir_ + "/runs",
                                           "--state-dir",   dir_ + "/state",
                                           "--ready-file",  dir_ + "/ready.json",
                                           "--secret-file", secret()};
    coordinator_ = std::make_unique<Proc>(net_.in_host(0, args),
                                          dir_ + "/coordinator" + std::to_string(starts_++) + ".log");
    return wait_until([&] { return std::filesystem::exists(dir_ + "/ready.json"); }, 30s);
  }
  // SIGTERM (jobs are kept in the state dir), SIGKILL if it has not gone in 20 s.
  void stop_coordinator() {
    coordinator_->signal(SIGTERM);
    if (coordinator_->wait(20s) < 0) coordinator_->signal(SIGKILL);
    coordinator_->wait(5s);
  }

  void start_agent(int host) {
    const std::vector<std::string> args = {troupe_binary(), "agent",
                                           "--coordinator", listen(),
                                           "--devices",     "cpu:" + std::to_string(kDevicesPerHost),
                                           "--secret-file", secret()};
    agents_[host] =
        std::make_unique<Proc>(net_.in_host(host, args), dir_ + "/agent-h" + std::to_string(host) + "-" +
                                                             std::to_string(starts_++) + ".log");
  }
  // `ip netns exec`, `unshare` and `sh` each exec the next: the Proc is the agent itself.
  Proc& agent(int host) { return *agents_[host]; }

  json call(json req) {
    troupe::coord::ClientOptions o;
    o.endpoint = "ipc://" + dir_ + "/api";
    o.token = troupe::actors::api_token(secret());
    o.timeout = 3000ms;
    return troupe::coord::api_call(o, std::move(req));
  }
  json status(const std::string& job) { return call({{"op", "status"}, {"job", job}})["job"]; }
  int devices() {
    auto r = call({{"op", "list"}});
    return r.value("ok", false) ? r["devices"]["cpu"]["total"].get<int>() : -1;
  }

 private:
  Netns net_;  // first: the namespaces go after every process in them
  std::string dir_;
  int starts_ = 0;
  std::unique_ptr<Proc> coordinator_;
  std::unique_ptr<Proc> agents_[Netns::kHosts];
};

enum class Kind { worker_kill, worker_stop, agent_kill, link_cut, coordinator_restart };
// Each kind, its name on the command line (--faults) and in the table.
struct KindInfo {
  Kind kind;
  const char* flag;
  const char* title;
};
constexpr KindInfo kKindInfo[] = {
    {Kind::worker_kill, "worker_kill", "worker SIGKILL"},
    {Kind::worker_stop, "worker_stop", "worker SIGSTOP/SIGCONT"},
    {Kind::agent_kill, "agent_kill", "agent SIGKILL + restart"},
    {Kind::link_cut, "link_cut", "link cut h1/h2 + restore"},
    {Kind::coordinator_restart, "coordinator_restart", "coordinator restart"},
};
const char* name(Kind k) { return kKindInfo[static_cast<int>(k)].title; }

struct Record {
  Kind kind = Kind::worker_kill;
  double at_s = 0;     // since the job's first step
  std::string target;  // "rank 1 pid 123 on h1", "h2", ...
  bool hit = true;     // the job's workers were struck (their host, or the coordinator)
  bool recovered = false;
  bool new_generation = false;
  double recovery_s = -1;  // fault -> the next step seen
  int64_t last_step = 0, resumed_from = 0;
  // Steps resumed_from .. last_step were trained twice (resumed_from: the step the new generation
  // continued with).
  int64_t recomputed() const {
    return new_generation ? std::max<int64_t>(0, last_step + 1 - resumed_from) : 0;
  }
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  // Nearest rank: the smallest value with at least p of the samples at or below it.
  const size_t i = static_cast<size_t>(std::ceil(p * v.size()));
  return v[std::min(v.size() - 1, i == 0 ? 0 : i - 1)];
}

// The loss curve of `spec` uninterrupted on one host (a loopback cluster, one agent)
// up to step `steps`. The spec stays endless and the run is cancelled past `steps`:
// train.steps shapes the learning-rate schedule, so a bounded spec trains another curve.
// The uninterrupted run: its losses, and its wall time per step from its first step to its
// last (checkpoints, snapshots and metrics included, start-up left out): the clean step time
// a fault-free run of the spec pays.
struct Reference {
  std::map<int64_t, double> curve;
  double step_s = 0;
};

Reference one_host_curve(const std::string& spec, int64_t steps) {
  Cluster c;
  if (!c.ready()) return {};
  c.add_agent("cpu:" + std::to_string(kDevicesPerHost));
  if (!c.wait_devices(kDevicesPerHost)) return {};
  const std::string job = c.call({{"op", "submit"}, {"spec", spec}})["job"];
  int64_t first_done = 0;
  c.wait_state(
      job,
      [&](const json& s) {
        return (first_done = s.value("steps_done", int64_t{0})) > 0 || s["state"] == "failed";
      },
      120s);
  const auto t0 = Clock::now();
  int64_t last_done = 0;
  c.wait_state(
      job,
      // Steps 0 .. `steps`: steps_done counts them, so one more than the last step's number.
      [&](const json& s) {
        return (last_done = s.value("steps_done", int64_t{0})) > steps || s["state"] == "failed";
      },
      std::chrono::seconds(120 + steps / 5));
  Reference ref;
  if (last_done > first_done) ref.step_s = seconds_since(t0) / double(last_done - first_done);
  const std::string run_dir = c.status(job).value("run_dir", "");
  c.call({{"op", "cancel"}, {"job", job}});
  c.wait_state(job, "cancelled", 30s);
  MetricsTail tail(run_dir + "/metrics.jsonl");
  tail.poll();
  for (const auto& [step, p] : tail.curve())
    if (step <= steps) ref.curve[step] = p.loss;
  return ref;
}

struct Options {
  double minutes = 2;
  uint64_t seed = 0;
  int64_t checkpoint_every = 5;
  std::string layout = "tiny_dp2_pp1_tp1";
  double interval_s = 0;  // 0: 2-6 s at random
  int spares = 0;
  bool spread = false;
  double calibrate_s = 30;  // the fault-free spell that times a clean step on this cluster
  std::vector<Kind> kinds;  // empty: every kind
};

// "link_cut,worker_kill" -> the kinds named; empty when a name is not a kind.
std::vector<Kind> parse_kinds(const std::string& list) {
  std::vector<Kind> out;
  size_t at = 0;
  while (at <= list.size()) {
    const size_t end = std::min(list.find(',', at), list.size());
    const std::string item = list.substr(at, end - at);
    const auto k = std::find_if(std::begin(kKindInfo), std::end(kKindInfo),
                                [&](const KindInfo& c) { return item == c.flag; });
    if (k == std::end(kKindInfo)) return {};
    if (std::find(out.begin(), out.end(), k->kind) == out.end()) out.push_back(k->kind);
    at = end + 1;
  }
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  o.seed = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count() % 1000000);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--minutes" || a == "--seed") && i + 1 < argc) {
      (a == "--minutes" ? o.minutes = std::atof(argv[++i]) : o.seed = std::strtoull(argv[++i], nullptr, 10));
    } else if (a == "--checkpoint-every" && i + 1 < argc && std::atoll(argv[i + 1]) > 0) {
      o.checkpoint_every = std::atoll(argv[++i]);
    } else if (a == "--layout" && i + 1 < argc &&
               std::filesystem::exists(std::string(TROUPE_SOURCE_DIR) + "/configs/layouts/" + argv[i + 1] +
                                       ".yaml")) {
      o.layout = argv[++i];
    } else if (a == "--interval" && i + 1 < argc && std::atof(argv[i + 1]) > 0) {
      o.interval_s = std::atof(argv[++i]);
    } else if (a == "--spares" && i + 1 < argc && std::atoi(argv[i + 1]) >= 0) {
      o.spares = std::atoi(argv[++i]);
    } else if (a == "--spread") {
      o.spread = true;
    } else if (a == "--calibrate" && i + 1 < argc && std::atof(argv[i + 1]) > 0) {
      o.calibrate_s = std::atof(argv[++i]);
    } else if (a == "--faults" && i + 1 < argc && !(o.kinds = parse_kinds(argv[i + 1])).empty()) {
      ++i;
    } else {
      std::fprintf(
          stderr,
          "usage: chaos [--minutes M] [--seed S] [--checkpoint-every N] [--layout FILE] [--interval Q] "
          "[--spares K] [--spread] [--calibrate C] [--faults K1,K2,...]\n"
          "  fault kinds: worker_kill, worker_stop, agent_kill, link_cut, coordinator_restart\n");
      std::exit(2);
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parse(argc, argv);
  if (const std::string why = netns_unavailable(); !why.empty()) {
    std::printf("chaos: cannot create network namespaces: %s\n", why.c_str());
    return 77;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::mt19937_64 rng(opt.seed);
  auto uniform = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
  auto pick = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); };

  ChaosCluster c;
  std::printf(
      "chaos: %.1f min, seed %llu, layout %s, checkpoint every %lld steps, %d spare(s), %s, cluster dir %s\n",
      opt.minutes, (unsigned long long)opt.seed, opt.layout.c_str(), (long long)opt.checkpoint_every,
      opt.spares, opt.spread ? "spread" : "packed", c.dir().c_str());
  if (!c.start_coordinator()) {
    std::printf("chaos: the coordinator did not start (see %s)\n", c.dir().c_str());
    return 1;
  }
  c.start_agent(1);
  c.start_agent(2);
  const int all_devices = 2 * kDevicesPerHost;
  if (!wait_until([&] { return c.devices() == all_devices; }, 60s)) {
    std::printf("chaos: the agents did not register their devices\n");
    return 1;
  }
  const std::string job = c.call(
      {{"op", "submit"},
       {"spec", job_spec(opt.layout, "chaos", 0, opt.checkpoint_every, opt.spares, opt.spread)}})["job"];
  if (!wait_until([&] { return c.status(job).value("steps_done", int64_t{0}) >= 8; }, 120s)) {
    std::printf("chaos: job %s did not train 8 steps\n", job.c_str());
    return 1;
  }
  const std::string run_dir = c.status(job)["run_dir"];
  MetricsTail tail(run_dir + "/metrics.jsonl");
  tail.poll();
  // The clean step: the job's wall time per step here, before any fault.
  const int64_t calm_from = tail.last_step();
  const auto calm_start = Clock::now();
  while (seconds_since(calm_start) < opt.calibrate_s) {
    tail.poll();
    std::this_thread::sleep_for(50ms);
  }
  tail.poll();
  const int64_t first_step = tail.last_step();
  const double calm_step_s =
      first_step > calm_from ? seconds_since(calm_start) / double(first_step - calm_from) : 0.0;
  std::printf(
      "chaos: job %s trains (run dir %s): %.2f ms per step over %.0f s without faults; faults for %.1f min\n",
      job.c_str(), run_dir.c_str(), 1000.0 * calm_step_s, opt.calibrate_s, opt.minutes);

  const auto start = Clock::now();
  const auto end = start + std::chrono::milliseconds(static_cast<int64_t>(opt.minutes * 60000));
  std::vector<Record> records;
  bool job_ended = false;
  std::vector<Kind> round;
  // The quiet spells' own pace, from their second second on (a new generation's first steps
  // are slower): the clean step of the job as it was placed then.
  double quiet_s = 0;
  int64_t quiet_steps = 0;
  while (Clock::now() < end && !job_ended) {
    // A quiet spell, the job training, before the next fault.
    const auto spell_start = Clock::now();
    const auto quiet_until = spell_start + std::chrono::milliseconds(static_cast<int64_t>(
                                               (opt.interval_s > 0 ? opt.interval_s : uniform(2, 6)) * 1000));
    int64_t spell_step = -1, spell_generation = -1;
    Clock::time_point spell_t;
    while (Clock::now() < quiet_until) {
      tail.poll();
      if (spell_step < 0 && Clock::now() - spell_start >= 1s) {
        spell_step = tail.last_step();
        spell_generation = tail.last_generation();
        spell_t = Clock::now();
      }
      std::this_thread::sleep_for(50ms);
    }
    tail.poll();
    if (spell_step >= 0 && tail.last_generation() == spell_generation && tail.last_step() > spell_step) {
      quiet_s += seconds_since(spell_t);
      quiet_steps += tail.last_step() - spell_step;
    }
    if (Clock::now() >= end) break;

    Record r;
    // Kinds in rounds of all those asked for, each round in a seeded random order: every kind
    // comes up in a short run.
    if (round.empty()) {
      round = opt.kinds;
      if (round.empty())
        for (const auto& info : kKindInfo) round.push_back(info.kind);
      std::shuffle(round.begin(), round.end(), rng);
    }
    r.kind = round.back();
    round.pop_back();
    tail.poll();
    const json st = c.status(job);
    r.last_step = tail.last_step();
    const int64_t gen0 = tail.last_generation();
    std::set<std::string> job_hosts;  // where the job's workers run, as the status says
    if (st.is_object() && st["workers"].is_array())
      for (const auto& w : st["workers"]) job_hosts.insert(w.value("host", ""));
    // Heals pending for after the fault: at `heal_at`, once.
    std::function<void()> heal;
    Clock::time_point heal_at;
    bool heal_after_recovery = false;
    Clock::time_point t0;
    auto strike = [&] {
      t0 = Clock::now();
      r.at_s = seconds_since(start);
    };

    if (r.kind == Kind::worker_kill || r.kind == Kind::worker_stop) {
      const auto& ws = st["workers"];
      if (!ws.is_array() || ws.empty()) continue;
      const auto& w = ws[pick(static_cast<int>(ws.size()))];
      const int pid = w["pid"];
      r.target = "rank " + w["rank"].dump() + " pid " + std::to_string(pid) + " on " + w.value("host", "?");
      strike();
      if (r.kind == Kind::worker_kill) {
        ::kill(pid, SIGKILL);
      } else {
        ::kill(pid, SIGSTOP);
        heal = [pid] { ::kill(pid, SIGCONT); };  // gone by then, SIGKILLed by its agent: no matter
        heal_at = Clock::now() + 3s;
      }
    } else if (r.kind == Kind::agent_kill) {
      const int host = 1 + pick(2);
      r.target = Netns::host_name(host);
      r.hit = job_hosts.empty() || job_hosts.count(r.target) > 0;
      strike();
      c.agent(host).signal(SIGKILL);
      c.agent(host).wait(5s);
      heal = [&c, host] { c.start_agent(host); };
      heal_at = Clock::now() + 1s;
    } else if (r.kind == Kind::link_cut) {
      const int host = 1 + pick(2);
      r.target = Netns::host_name(host);
      r.hit = job_hosts.empty() || job_hosts.count(r.target) > 0;
      strike();
      c.net().run_in_host(host, "ip link set eth0 down");
      heal = [&c, host] { c.net().run_in_host(host, "ip link set eth0 up"); };
      heal_at = Clock::now() + 5s;
      heal_after_recovery = true;
    } else {
      r.target = "h0";
      strike();
      c.stop_coordinator();
      heal = [&c] { c.start_coordinator(); };
      heal_at = Clock::now();
    }
    std::printf("[%7.1fs] fault: %s (%s%s) after step %lld of generation %lld\n", r.at_s, name(r.kind),
                r.target.c_str(), r.hit ? "" : ", not the job's host", (long long)r.last_step,
                (long long)gen0);

    // Until the job trains again or the bound passes, healing on the way.
    while (!r.recovered && Clock::now() - t0 < kRecoveryBound) {
      if (heal && !heal_after_recovery && Clock::now() >= heal_at) {
        heal();
        heal = nullptr;
      }
      tail.poll([&](int64_t step, int64_t gen) {
        if (r.recovered) return;
        // Lines of the old generation still come in after a fault that hit it: steps
        // it finished before, reported late. Only a relaunch means it came back.
        if (gen > gen0 || (!r.hit && step >= r.last_step + 2)) {
          r.recovered = true;
          r.new_generation = gen > gen0;
          r.recovery_s = seconds_since(t0);
        }
      });
      if (heal && heal_after_recovery && Clock::now() >= heal_at + kRecoveryBound / 2) {
        heal();  // the job cannot come back without this host: give it back
        heal = nullptr;
      }
      std::this_thread::sleep_for(10ms);
    }
    if (heal) {
      std::this_thread::sleep_until(heal_at);
      heal();
    }
    if (r.new_generation) {
      json now;
      wait_until(
          [&] {
            now = c.status(job);
            return now.is_object() && now.value("generation", int64_t{0}) > gen0;
          },
          10s);
      r.resumed_from = now.is_object() ? resume_step(now) : 0;
      r.last_step = tail.last_step_of(gen0);
    }
    // Every agent back with its devices before the next fault.
    const bool whole = wait_until([&] { return c.devices() == all_devices; }, 60s);
    const json after = c.status(job);
    const std::string state = after.is_object() ? after.value("state", "?") : "unreachable";
    job_ended = state == "failed" || state == "cancelled" || state == "succeeded";
    if (r.recovered)
      std::printf("[%7.1fs]   recovered in %.2f s: %s, steps recomputed %lld; job %s, generation %lld%s\n",
                  seconds_since(start), r.recovery_s,
                  r.new_generation ? ("generation " + std::to_string(tail.last_generation()) + " from step " +
                                      std::to_string(r.resumed_from))
                                         .c_str()
                                   : "steps continue",
                  (long long)r.recomputed(), state.c_str(), (long long)after.value("generation", int64_t{-1}),
                  whole ? "" : "; not every agent is back");
    else
      std::printf("[%7.1fs]   NOT recovered within %lld s; job %s: %s\n", seconds_since(start),
                  (long long)std::chrono::duration_cast<std::chrono::seconds>(kRecoveryBound).count(),
                  state.c_str(), after.is_object() ? after.value("reason", "").c_str() : "");
    records.push_back(r);
  }

  tail.poll();
  const double trained_s = seconds_since(start);
  c.call({{"op", "cancel"}, {"job", job}});
  wait_until([&] { return c.status(job).value("state", "") == "cancelled"; }, 30s);
  tail.poll();
  const json final_status = c.status(job);

  std::printf(
      "\nchaos: %.1f s of faults, seed %llu, %zu fault(s); job %s at step %lld, generation %lld, %s\n",
      trained_s, (unsigned long long)opt.seed, records.size(), job.c_str(), (long long)tail.last_step(),
      (long long)tail.last_generation(), final_status.value("state", "?").c_str());
  // Effective training time ratio: the steps trained once, at the clean step time (the median
  // step time of the run), over the wall time.
  int64_t twice = 0;
  for (const auto& r : records) twice += r.recomputed();
  const double clean_s = tail.median_step_ms() / 1000.0;
  const int64_t once = tail.last_step() - first_step;
  const double quiet_step_s = quiet_steps > 0 ? quiet_s / double(quiet_steps) : 0.0;
  if (quiet_step_s > 0)
    std::printf(
        "ETTR %.1f %%: %lld step(s) trained once x %.2f ms (the wall time per step in the quiet spells "
        "between faults, %.0f s of them) / %.1f s; %lld step(s) trained twice\n",
        100.0 * double(once) * quiet_step_s / trained_s, (long long)once, 1000.0 * quiet_step_s, quiet_s,
        trained_s, (long long)twice);
  std::printf("ETTR %.1f %% by the median step: %lld step(s) trained once x %.1f ms / %.1f s\n",
              100.0 * double(once) * clean_s / trained_s, (long long)once, 1000.0 * clean_s, trained_s);
  std::printf(
      "| fault | injected | hit the job | recovered | recovery median s | p95 s | max s (faults that hit the "
      "job) | steps recomputed "
      "|\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (const auto& [k, flag, title] : kKindInfo) {
    std::vector<double> t;
    int n = 0, ok = 0, hit = 0;
    int64_t recomputed = 0;
    for (const auto& r : records) {
      if (r.kind != k) continue;
      ++n;
      hit += r.hit;
      ok += r.recovered;
      // A fault that missed the job costs it nothing: its "recovery" is the next step.
      if (r.recovered && r.hit) t.push_back(r.recovery_s);
      recomputed += r.recomputed();
    }
    std::printf("| %s | %d | %d | %d | %.2f | %.2f | %.2f | %lld |\n", name(k), n, hit, ok,
                percentile(t, 0.5), percentile(t, 0.95),
                t.empty() ? NAN : *std::max_element(t.begin(), t.end()), (long long)recomputed);
  }

  // The loss curve against an uninterrupted one-host run of the same spec, over the
  // steps trained whose last-written line came from the planned layout.
  const int64_t steps = tail.curve().empty() ? 0 : tail.curve().rbegin()->first;
  std::printf("\nchaos: reference run of %lld steps on one host...\n", (long long)steps);
  const Reference ref = one_host_curve(job_spec(opt.layout, "chaos", 0, opt.checkpoint_every), steps);
  const auto& want = ref.curve;
  int64_t compared = 0, mismatched = 0, other_layout = 0, missing = 0;
  double worst = 0;
  // The planned layout: the first generation's (a shrink may run others later).
  const std::string planned = tail.curve().empty() ? "" : tail.curve().begin()->second.layout;
  for (const auto& [step, p] : tail.curve()) {
    if (p.layout != planned) {
      ++other_layout;
      continue;
    }
    auto w = want.find(step);
    if (w == want.end()) {
      ++missing;
      continue;
    }
    ++compared;
    const double d = std::abs(p.loss - w->second);
    worst = std::max(worst, d);
    if (d > 1e-5 && mismatched++ == 0)
      std::printf("first difference beyond 1e-5: step %lld (generation %lld): %.8f vs. %.8f\n",
                  (long long)step, (long long)p.generation, p.loss, w->second);
  }
  std::printf(
      "loss curve vs. uninterrupted one-host run: %lld step(s) compared, %lld beyond 1e-5 "
      "(largest difference %.3g), %lld on another layout, %lld missing from the reference: %s\n",
      (long long)compared, (long long)mismatched, worst, (long long)other_layout, (long long)missing,
      compared > 0 && mismatched == 0 && missing == 0 ? "MATCH" : "NO MATCH");
  // ETTR again at the reference's step time: what the faults cost, apart from what every step
  // of a fault-free run also pays (checkpoint writes, snapshots, metrics) that the median
  // step leaves out.
  if (ref.step_s > 0)
    std::printf(
        "ETTR %.1f %% against the uninterrupted run: %lld step(s) trained once x %.2f ms (its wall time per "
        "step) / %.1f s\n",
        100.0 * double(once) * ref.step_s / trained_s, (long long)once, 1000.0 * ref.step_s, trained_s);
  return compared > 0 && mismatched == 0 && missing == 0 ? 0 : 1;
}

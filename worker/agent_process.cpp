// The `troupe agent` process: connect, register, serve until told to stop.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <mutex>

#include "actors/secret.hpp"
#include "actors/system.hpp"
#include "core/error.hpp"
#include "worker/agent.hpp"
#include "worker/data_address.hpp"
#include "worker/device.hpp"
#include "worker/node.hpp"

namespace troupe::worker {

std::vector<std::string> expand_devices(const std::string& spec) {
  std::vector<std::string> out;
  auto colon = spec.find(':');
  TROUPE_CHECK(colon != std::string::npos, "bad --devices '", spec, "' (cpu:N, cuda:all or cuda:0,1)");
  std::string kind = spec.substr(0, colon), rest = spec.substr(colon + 1);
  TROUPE_CHECK(kind == "cpu" || kind == "cuda", "bad device kind '", kind, "' in --devices (cpu or cuda)");
  auto is_number = [](const std::string& s) {
    return !s.empty() && s.size() < 6 && s.find_first_not_of("0123456789") == std::string::npos;
  };
  // The CUDA runtime's count in a CUDA build, else the driver's (worker/device.hpp).
  std::string why;
  if (kind == "cuda" && rest == "all") {
    const int n = local_gpu_count(&why);
    TROUPE_CHECK(n > 0, "--devices cuda:all: no GPU found (", why, ")");
    for (int i = 0; i < n; ++i) out.push_back("cuda:" + std::to_string(i));
    return out;
  }
  if (kind == "cpu" && rest.find(',') == std::string::npos) {
    TROUPE_CHECK(is_number(rest) && std::stoi(rest) > 0, "bad --devices '", spec, "': cpu:N needs N >= 1");
    for (int i = 0; i < std::stoi(rest); ++i) out.push_back("cpu:" + std::to_string(i));
    return out;
  }
  // A list of indices: "cuda:0,2" or "cpu:0,1".
  const int gpus = kind == "cuda" ? local_gpu_count(&why) : 0;
  size_t pos = 0;
  while (pos <= rest.size()) {
    auto comma = rest.find(',', pos);
    std::string item = rest.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    TROUPE_CHECK(is_number(item), "bad device index '", item, "' in --devices '", spec, "'");
    // A GPU that is not there is refused here, not offered and trained on the CPU later.
    if (kind == "cuda")
      TROUPE_CHECK(std::stoi(item) < gpus, "--devices ", spec, ": no GPU cuda:", item, " on this host (",
                   gpus, " GPU(s)", gpus == 0 ? ": " + why : std::string(), ")");
    out.push_back(kind + ":" + std::to_string(std::stoi(item)));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

std::string local_devices(const std::string& kind, int n) {
  require(n >= 1, "a job needs at least one device, not ", n);
  if (kind != "cuda") return kind + ":" + std::to_string(n);
  std::string why;
  const int have = local_gpu_count(&why);
  require(have >= n, "resources.device: cuda: the job needs ", n, " GPU(s), this host has ", have,
          have == 0 ? " (" + why + ")" : std::string(),
          ": run it where the GPUs are (troupe agent --devices cuda:all), or use device: cpu");
  std::string out = "cuda:";
  for (int i = 0; i < n; ++i) out += (i > 0 ? "," : "") + std::to_string(i);
  return out;
}

namespace {

enum class SessionEnd { unreachable, signalled, stopped };

struct Session {
  SessionEnd end = SessionEnd::unreachable;
  int sig = 0;
  int code = 0;
  std::string why;
  bool registered = false;
  std::string unreachable;  // why the connection failed
};

// One connection to the coordinator: its own actor system, so that nothing of a
// dead coordinator (cached connections, proxies) is reused by the next one.
Session serve(const AgentOptions& o, const std::vector<std::string>& devices,
              const std::pair<std::string, uint16_t>& addr, const sigset_t& sigs, bool again) {
  Session out;
  actors::NodeConfig cfg(o.secret_file);
  caf::actor_system sys{cfg};
  auto coord = actors::connect<actors::coordinator_actor>(sys, addr.first, addr.second);
  if (!coord) {
    out.unreachable = sys.render(coord.error());
    return out;
  }
  std::mutex mu;
  std::atomic<bool> stopped{false};
  AgentActorOptions aopt;
  aopt.coordinator_address = o.coordinator;
  aopt.devices = devices;
  aopt.worker_binary = o.worker_binary;
  aopt.secret_file = o.secret_file;
  aopt.data_interface = o.data_interface;
  aopt.relay = o.relay;
  if (o.protocol_override) aopt.protocol = o.protocol_override;
  aopt.worker_protocol_override = o.worker_protocol_override;
  aopt.on_stop = [&](int c, const std::string& w) {
    std::lock_guard<std::mutex> lock(mu);
    out.code = c;
    out.why = w;
    stopped.store(true);
  };
  aopt.on_registered = [&] {
    std::lock_guard<std::mutex> lock(mu);
    out.registered = true;
  };
  auto agent = spawn_agent(sys, *coord, aopt);
  // An agent actor that fails (an exception in a handler) ends the session with the
  // cause instead of leaving a process that serves nothing. A normal quit has
  // called on_stop already and touches nothing here.
  caf::actor_cast<caf::abstract_actor*>(agent)->attach_functor([&, render = &sys](const caf::error& reason) {
    if (!reason || reason == caf::exit_reason::normal) return;
    std::lock_guard<std::mutex> lock(mu);
    if (stopped.load()) return;
    out.code = 1;
    out.why = "the agent actor failed: " + render->render(reason);
    stopped.store(true);
  });
  out.end = SessionEnd::stopped;
  std::cout << "troupe agent: " << (again ? "reconnected, offering" : "offering");
  for (const auto& d : devices) std::cout << " " << d;
  std::cout << " to " << o.coordinator << std::endl;
  timespec poll{0, 50 * 1000 * 1000};
  while (!stopped.load()) {
    int s = sigtimedwait(&sigs, nullptr, &poll);
    if (s > 0) {
      out.end = SessionEnd::signalled;
      out.sig = s;
      caf::anon_send(agent, actors::shutdown_atom::value);
      while (!stopped.load()) sigtimedwait(&sigs, nullptr, &poll);
    }
  }
  std::lock_guard<std::mutex> lock(mu);
  return out;
}

}  // namespace

int run_agent(const AgentOptions& o) {
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  std::vector<std::string> devices;
  std::pair<std::string, uint16_t> addr;
  try {
    devices = expand_devices(o.devices);
    addr = actors::parse_host_port(o.coordinator);
    actors::check_secret(o.secret_file);
    if (!o.data_interface.empty()) interface_address(o.data_interface);
  } catch (const Error& e) {
    std::cerr << "troupe agent: " << e.what() << "\n";
    return 2;
  }
  using clock = std::chrono::steady_clock;
  const auto timeout =
      std::chrono::milliseconds(static_cast<int64_t>(std::max(o.reconnect_timeout_s, 0.0) * 1000));
  constexpr auto kFirstBackoff = std::chrono::milliseconds(100),
                 kMaxBackoff = std::chrono::milliseconds(2000);
  bool connected_once = false;
  std::string lost_why;
  // An agent may start before its coordinator listens: the first connection is
  // retried like a lost one, from the start of the process.
  clock::time_point lost_at = clock::now();
  auto backoff = kFirstBackoff;
  for (;;) {
    Session s = serve(o, devices, addr, sigs, connected_once);
    if (s.end == SessionEnd::signalled) return s.sig == SIGINT ? 130 : 0;
    if (s.end == SessionEnd::unreachable && lost_why.empty()) {
      lost_why = "cannot reach the coordinator at " + o.coordinator + ": " + s.unreachable;
      std::cerr << "troupe agent: " << lost_why << "; retrying for up to " << o.reconnect_timeout_s << " s"
                << std::endl;
    }
    if (s.end == SessionEnd::stopped) {
      connected_once = true;
      if (s.code != kAgentLostCoordinator) {
        if (s.code != 0) std::cerr << "troupe agent: " << s.why << "\n";
        return s.code;
      }
      // A registered session restarts the clock; one that never registered does not,
      // so a coordinator that accepts connections but never answers still ends the wait.
      if (s.registered || lost_why.empty()) {
        lost_at = clock::now();
        backoff = kFirstBackoff;
      }
      lost_why = s.why;
      std::cerr << "troupe agent: " << lost_why << "; workers stopped, reconnecting to " << o.coordinator
                << " for up to " << o.reconnect_timeout_s << " s" << std::endl;
    }
    auto left = lost_at + timeout - clock::now();
    if (left <= clock::duration::zero()) {
      std::cerr << "troupe agent: " << lost_why << "; no coordinator at " << o.coordinator << " for "
                << o.reconnect_timeout_s << " s, giving up\n";
      return 1;
    }
    auto wait = std::min<clock::duration>(backoff, left);
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(wait).count();
    timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    int sig = sigtimedwait(&sigs, nullptr, &ts);
    if (sig > 0) return sig == SIGINT ? 130 : 0;
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
}

}  // namespace troupe::worker

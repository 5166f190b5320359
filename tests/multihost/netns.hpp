// A test cluster of three hosts made of Linux network namespaces, one bridge
// between them, and the built `troupe` binary running in them.
//
//   trp<pid>h0  eth0 10.77.0.1/24 --veth-- v0 --+
//   trp<pid>h1  eth0 10.77.0.2/24 --veth-- v1 --+-- br0 in trp<pid>sw
//   trp<pid>h2  eth0 10.77.0.3/24 --veth-- v2 --+
//
// Each namespace has its own routes, so the fixed subnet never meets another test
// process's; the names carry the test's pid so that two never collide, and a
// cluster removes the leftovers of test processes that died before cleaning up.
// A process runs in host i through `ip netns exec trp<pid>h<i>`, under its own UTS
// namespace named "h<i>", so the coordinator sees distinct host names; and as each
// `ip netns exec` makes a new mount namespace, gloo never takes two ranks of
// different hosts for one (comm/gloo/shm_group.cpp): they talk over TCP.
//
// The coordinator runs in h0, listening on 10.77.0.1; its client API is on ipc://
// sockets in the cluster's directory, which the test process (in the root
// namespace) reaches as a unix socket in the shared filesystem.
//
// Faults on the network are made from outside: `ip link set eth0 down|up` in a host
// (run_in_host) cuts and heals it; Netns::impair delays or drops what a host sends: with
// netem (`tc ... netem`) where the kernel has sch_netem, else with nftables (random drops)
// and a token bucket (`tc ... tbf`, a rate limit whose queue delays what exceeds it).
#pragma once

#include <optional>
#include <regex>
#include <set>

#include "tests/control/cluster.hpp"
#include "tests/support/support.hpp"

namespace troupe::test {

// `command` through the shell; throws std::runtime_error with its output when it fails.
inline std::string must_run(const std::string& command) {
  auto r = testing::run_command(command);
  if (r.code != 0)
    throw std::runtime_error("`" + command + "` failed (" + std::to_string(r.code) + "): " + r.out);
  return r.out;
}

// The absolute path of `ip` (Proc execs without a PATH search), "" when there is none.
inline std::string ip_binary() {
  auto r = testing::run_command("command -v ip");
  std::string path = r.code == 0 ? r.out.substr(0, r.out.find('\n')) : "";
  return !path.empty() && path[0] == '/' ? path : "";
}

// Why this process cannot make network namespaces and run in them, "" when it can:
// it makes one (trp<pid>probe), runs in it and removes it.
inline std::string netns_unavailable() {
  if (geteuid() != 0) return "not root (uid " + std::to_string(geteuid()) + ")";
  if (ip_binary().empty()) return "no `ip` command (iproute2) on the PATH";
  if (testing::run_command("command -v unshare").code != 0) return "no `unshare` command (util-linux)";
  const std::string probe = "trp" + std::to_string(getpid()) + "probe";
  auto r = testing::run_command("ip netns add " + probe);
  if (r.code != 0) return "`ip netns add " + probe + "` failed: " + r.out;
  // Entering one (it remounts /sys) and a UTS namespace of its own can fail apart.
  const std::string enter = "ip netns exec " + probe + " unshare --uts true";
  r = testing::run_command(enter);
  testing::run_command("ip netns del " + probe);
  return r.code == 0 ? "" : "`" + enter + "` failed: " + r.out;
}

// How links are slowed and made lossy here (Netns::impair).
enum class Shaper {
  netem,    // tc netem: a fixed delay and random loss
  nft_tbf,  // no sch_netem: nftables drops packets at random, tc tbf limits the rate
};

// The shaper this machine has, or nullopt with why in *why: a probe namespace
// (trp<pid>probe) takes a netem qdisc on its loopback, else a tbf qdisc and an nftables
// rule. Call it after netns_unavailable() found namespaces usable.
inline std::optional<Shaper> link_shaper(std::string* why) {
  if (testing::run_command("command -v tc").code != 0) {
    *why = "no `tc` command (iproute2) on the PATH";
    return std::nullopt;
  }
  const std::string probe = "trp" + std::to_string(getpid()) + "probe";
  auto r = testing::run_command("ip netns add " + probe);
  if (r.code != 0) {
    *why = "`ip netns add " + probe + "` failed: " + r.out;
    return std::nullopt;
  }
  const std::string in = "ip netns exec " + probe + " ";
  std::optional<Shaper> found;
  const auto netem = testing::run_command(in + "tc qdisc add dev lo root netem delay 1ms");
  if (netem.code == 0) {
    found = Shaper::netem;
  } else {
    const auto tbf =
        testing::run_command(in + "tc qdisc add dev lo root tbf rate 10mbit burst 32kbit latency 400ms");
    const auto nft = testing::run_command(in + "nft add table inet troupe_probe");
    if (tbf.code == 0 && nft.code == 0)
      found = Shaper::nft_tbf;
    else
      *why = "no sch_netem (" + netem.out + "), and no tbf qdisc (" + tbf.out + ") or nftables (" + nft.out +
             ")";
  }
  testing::run_command("ip netns del " + probe);
  return found;
}

// A link's impairment: netem's delay and loss, or (Shaper::nft_tbf) the same loss and, for
// the delay, a rate limit.
struct Impairment {
  int delay_ms = 0;     // netem
  double loss_pct = 0;  // both
  std::string rate;     // nft_tbf: tbf's rate ("20mbit"), "" = none
  std::string str(Shaper s) const {
    std::string out;
    if (s == Shaper::netem && delay_ms > 0) out += "delay " + std::to_string(delay_ms) + "ms";
    if (s == Shaper::nft_tbf && !rate.empty()) out += "rate " + rate;
    if (loss_pct > 0) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "loss %g%%", loss_pct);
      out += (out.empty() ? "" : " ") + std::string(buf);
    }
    return out;
  }
};

// Deletes the namespaces trp<pid>* of pids that are no longer alive.
inline void remove_netns_leftovers() {
  static const std::regex ours("^trp([0-9]+)(h[0-9]+|sw|probe)$");
  std::istringstream list(testing::run_command("ip netns list").out);
  for (std::string line; std::getline(list, line);) {
    const std::string name = line.substr(0, line.find(' '));  // "name (id: 3)"
    std::smatch m;
    if (!std::regex_match(name, m, ours)) continue;
    const int pid = std::stoi(m[1].str());
    if (pid != getpid() && !process_alive(pid)) testing::run_command("ip netns del " + name);
  }
}

// The namespaces and the bridge (see the top of the file); deleted with the object,
// which takes the veths with them. Throws std::runtime_error when a step fails.
class Netns {
 public:
  static constexpr int kHosts = 3;

  Netns() : prefix_("trp" + std::to_string(getpid())) {
    remove_netns_leftovers();
    try {
      const std::string sw = name("sw");
      create(sw);
      must_run("ip -n " + sw + " link add br0 type bridge && ip -n " + sw + " link set br0 up");
      for (int i = 0; i < kHosts; ++i) {
        const std::string h = host(i), v = "v" + std::to_string(i);
        create(h);
        must_run("ip -n " + sw + " link add " + v + " type veth peer name eth0 netns " + h);
        must_run("ip -n " + sw + " link set " + v + " master br0 up");
        must_run("ip -n " + h + " addr add " + address(i) + "/24 dev eth0");
        must_run("ip -n " + h + " link set eth0 up && ip -n " + h + " link set lo up");
      }
    } catch (...) {
      remove();
      throw;
    }
  }
  ~Netns() { remove(); }
  Netns(const Netns&) = delete;
  Netns& operator=(const Netns&) = delete;

  std::string host(int i) const { return name("h" + std::to_string(i)); }
  static std::string address(int i) { return "10.77.0." + std::to_string(i + 1); }
  static std::string host_name(int i) { return "h" + std::to_string(i); }

  // argv run in host i, under a UTS namespace whose host name is host_name(i).
  std::vector<std::string> in_host(int i, const std::vector<std::string>& argv) const {
    std::vector<std::string> out = {ip_binary(), "netns",   "exec",
                                    host(i),     "unshare", "--uts",
                                    "sh",        "-c",      "hostname \"$0\" && exec \"$@\"",
                                    host_name(i)};
    out.insert(out.end(), argv.begin(), argv.end());
    return out;
  }
  // A shell command run in host i (no own host name): `ip link set eth0 down`.
  std::string run_in_host(int i, const std::string& command) const {
    return must_run("ip netns exec " + host(i) + " " + command);
  }
  // Impairs what host i sends out of its eth0, in place of an earlier setting; both
  // directions of every connection of the host go through it (its packets out, the acks of
  // what it gets). netem: `tc ... netem delay <d>ms loss <p>%`; nft_tbf: an nftables rule
  // that drops <p>% of eth0's packets at random, and `tc ... tbf rate <rate>`.
  void impair(int i, Shaper s, const Impairment& x) const {
    clear_impairment(i);
    if (s == Shaper::netem) {
      run_in_host(i, "tc qdisc replace dev eth0 root netem " + x.str(s));
      return;
    }
    if (!x.rate.empty())
      run_in_host(i, "tc qdisc replace dev eth0 root tbf rate " + x.rate + " burst 64kbit latency 2s");
    if (x.loss_pct > 0) {
      run_in_host(i, "nft add table inet troupe_loss");
      run_in_host(i, "nft add chain inet troupe_loss out '{ type filter hook output priority 0 ; }'");
      run_in_host(i, "nft add rule inet troupe_loss out oifname eth0 numgen random mod 10000 '<' " +
                         std::to_string(int(x.loss_pct * 100)) + " drop");
    }
  }
  // Takes host i's impairment off again (its eth0 back to the default qdisc, no rule).
  void clear_impairment(int i) const {
    testing::run_command("ip netns exec " + host(i) + " tc qdisc del dev eth0 root");
    testing::run_command("ip netns exec " + host(i) + " nft delete table inet troupe_loss");
  }

 private:
  std::string name(const std::string& suffix) const { return prefix_ + suffix; }
  void create(const std::string& ns) {
    must_run("ip netns add " + ns);
    made_.push_back(ns);
  }
  void remove() {
    for (const auto& ns : made_) testing::run_command("ip netns del " + ns);
    made_.clear();
  }

  std::string prefix_;
  std::vector<std::string> made_;
};

// A coordinator in h0 and agents in the other hosts, in a fresh temporary directory,
// all holding one new cluster secret. The same client calls as Cluster.
class NetnsCluster {
 public:
  NetnsCluster() {
    char tmpl[] = "/tmp/troupe-netns-XXXXXX";
    dir_ = mkdtemp(tmpl);
    actors::write_secret(secret());
    std::vector<std::string> args = {troupe_binary(), "coordinator",
                                     "--listen",      Netns::address(0) + ":0",
                                     "--api",         "ipc://" + dir_ + "/api",
                                     "--api-pub",     "ipc://" + dir_ + "/pub",
                                     "--runs-dir",    dir_ + "/runs",
                                     "--ready-file",  dir_ + "/ready.json",
                                     "--secret-file", secret()};
    coordinator_ = std::make_unique<Proc>(net_.in_host(0, args), dir_ + "/coordinator.log");
    wait_until([&] { return std::filesystem::exists(dir_ + "/ready.json"); }, std::chrono::seconds(30));
    if (std::filesystem::exists(dir_ + "/ready.json"))
      ready_ = nlohmann::json::parse(read_file(dir_ + "/ready.json"));
  }
  ~NetnsCluster() {
    agents_.clear();
    coordinator_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  bool ready() const { return ready_.is_object(); }
  std::string listen() const { return ready_.value("listen", ""); }
  const std::string& dir() const { return dir_; }
  std::string secret() const { return dir_ + "/secret.pem"; }
  const Netns& net() const { return net_; }
  Proc& coordinator() { return *coordinator_; }

  // An agent in host `host` (1 or 2), its log <dir>/agent<n>.log.
  Proc& add_agent(int host, const std::string& devices, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {troupe_binary(), "agent", "--coordinator", listen(),
                                     "--devices",     devices, "--secret-file", secret()};
    for (auto& a : extra) args.push_back(a);
    agents_.push_back(std::make_unique<Proc>(net_.in_host(host, args),
                                             dir_ + "/agent" + std::to_string(agents_.size()) + ".log"));
    return *agents_.back();
  }
  bool wait_devices(int n) {
    return wait_until(
        [&] {
          auto r = call({{"op", "list"}});
          return r.value("ok", false) && r["devices"]["cpu"]["total"] == n;
        },
        std::chrono::seconds(60));
  }

  nlohmann::json call(nlohmann::json req) {
    coord::ClientOptions o;
    o.endpoint = ready_.value("api", "");
    o.token = actors::api_token(secret());
    return coord::api_call(o, std::move(req));
  }
  nlohmann::json status(const std::string& job) { return call({{"op", "status"}, {"job", job}})["job"]; }
  bool wait_state(const std::string& job, const std::function<bool(const nlohmann::json&)>& pred,
                  std::chrono::milliseconds limit) {
    return wait_until(
        [&] {
          auto s = status(job);
          return s.is_object() && pred(s);
        },
        limit);
  }

 private:
  // Declared first: the namespaces go after every process in them.
  Netns net_;
  std::string dir_;
  nlohmann::json ready_;
  std::unique_ptr<Proc> coordinator_;
  std::vector<std::unique_ptr<Proc>> agents_;
};

}  // namespace troupe::test

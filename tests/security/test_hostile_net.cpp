// Hostile peers on the coordinator's other doors, on loopback against real processes: the
// event (PUB) socket, which admits only subscribers that prove the API token and drops frames
// past its size limit; the control port, whose connections that never finish their handshake
// are closed at a deadline and capped per address; the dashboard, whose slots are shared per
// address so that one client's slow connections keep nobody else out.
#include <poll.h>
#include <signal.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <thread>
#include <zmq.hpp>

#include "tests/control/cluster.hpp"
#include "tests/security/peer.hpp"
#include "tests/support/http_get.hpp"
#include "tests/support/support.hpp"

using namespace troupe;
using namespace troupe::test;
using namespace std::chrono_literals;
using nlohmann::json;
using troupe::testing::CommandResult;
using troupe::testing::run_command;

namespace {

// A job of one rank that runs until cancelled.
std::string endless(const std::string& name) { return tiny_spec(name, int(troupe::testing::kEndlessSteps)); }

size_t open_fds(int pid) {
  size_t n = 0;
  for (auto& e : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd"))
    n += (void(e), 1);
  return n;
}

// A TCP connection from `source` (127.0.0.x) to "host:port"; -1 when it cannot be made.
int tcp_from(const std::string& source, const std::string& listen) {
  auto [host, port] = actors::parse_host_port(listen);
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in local{};
  local.sin_family = AF_INET;
  ::inet_pton(AF_INET, source.c_str(), &local.sin_addr);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  ::inet_pton(AF_INET, host.c_str(), &to.sin_addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Whether the peer closes `fd` (its end of stream, or a reset, arrives) within `limit`; what
// it sent before is read and dropped.
bool closed_by_peer(int fd, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
    if (::poll(&p, 1, int(std::max<int64_t>(1, left.count()))) != 1) continue;
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return true;
  }
  return false;
}

// A subscriber of the PUB socket with `password` ("" = no credentials at all).
struct Subscriber {
  zmq::context_t ctx{1};
  zmq::socket_t sub{ctx, zmq::socket_type::sub};
  Subscriber(const std::string& endpoint, const std::string& password) {
    sub.set(zmq::sockopt::linger, 0);
    if (!password.empty()) {
      sub.set(zmq::sockopt::plain_username, "anyone");
      sub.set(zmq::sockopt::plain_password, password);
    }
    sub.set(zmq::sockopt::subscribe, "");
    sub.connect(endpoint);
  }
  // Events that have arrived, without waiting.
  int drain() {
    int n = 0;
    zmq::message_t m;
    while (sub.recv(m, zmq::recv_flags::dontwait)) ++n;
    return n;
  }
};

// The 64-byte ZMTP 3.0 greeting of a client with `mechanism`.
std::string zmtp_greeting(const std::string& mechanism) {
  std::string g(64, '\0');
  g[0] = '\xff';
  g[9] = '\x7f';
  g[10] = 3;
  g[11] = 0;
  g.replace(12, mechanism.size(), mechanism);
  return g;
}

}  // namespace

TEST_CASE("hostile net: the event socket sends nothing to a subscriber without the token",
          "[security][api][multiprocess]") {
  Cluster c;
  REQUIRE(c.ready());
  c.add_agent("cpu:1");
  REQUIRE(c.wait_devices(1));
  Subscriber with(c.pub(), c.token());
  Subscriber without(c.pub(), "");
  Subscriber wrong(c.pub(), std::string(64, '0'));
  const std::string job = c.call({{"op", "submit"}, {"spec", endless("watched")}})["job"];
  REQUIRE(!job.empty());
  // While the holder of the token receives 30 events (states, steps, metrics, paths, pids),
  // the others receive none.
  int got = 0, leaked = 0;
  CHECK(wait_until(
      [&] {
        got += with.drain();
        leaked += without.drain() + wrong.drain();
        return got >= 30;
      },
      120s));
  CHECK(got >= 30);
  CHECK(leaked == 0);
  // troupe watch proves the token itself and follows the job.
  // (The job never ends: `timeout` stops the watch once it has had time to print steps.)
  auto watch = run_command("timeout 15 " + std::string(TROUPE_BINARY_DIR) + "/troupe watch --api " + c.api() +
                           " --secret-file " + c.secret() + " " + job);
  CHECK(watch.out.find("step ") != std::string::npos);
  c.call({{"op", "cancel"}, {"job", job}});
}

TEST_CASE("hostile net: frames past the event socket's limit cost the coordinator no memory",
          "[security][api][multiprocess]") {
  Cluster c;
  REQUIRE(c.ready());
  const long before = peak_rss_kib(c.coordinator_pid());
  REQUIRE(before > 0);
  auto [host, port_text] = [&] {
    const std::string p = c.pub().substr(6);  // tcp://host:port
    return std::make_pair(p.substr(0, p.rfind(':')), p.substr(p.rfind(':') + 1));
  }();
  const std::string pub = host + ":" + port_text;
  // A raw peer that greets as a PLAIN client, then announces a 4 GiB frame and sends 256 MiB.
  for (const char* mechanism : {"PLAIN", "NULL"}) {
    const int fd = tcp_from("127.0.0.1", pub);
    REQUIRE(fd >= 0);
    std::string frame = zmtp_greeting(mechanism) + std::string("\x06\x00\x00\x00\x01\x00\x00\x00\x00", 9);
    ssize_t sent = ::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL);
    CHECK(sent == ssize_t(frame.size()));
    const std::string chunk(1 << 20, 'x');
    size_t total = 0;
    for (int i = 0; i < 256; ++i) {
      const ssize_t n = ::send(fd, chunk.data(), chunk.size(), MSG_NOSIGNAL);
      if (n <= 0) break;  // the coordinator closed the connection
      total += size_t(n);
    }
    INFO(mechanism << ": " << total << " bytes taken before the connection closed");
    CHECK(closed_by_peer(fd, 60s));
    ::close(fd);
  }
  // A subscriber with the token whose subscription is past the limit (4 KiB): disconnected.
  // (16 KiB, not more: the sender's own ZeroMQ keeps its subscriptions in a trie too.)
  {
    zmq::context_t ctx{1};
    zmq::socket_t x{ctx, zmq::socket_type::xsub};
    x.set(zmq::sockopt::linger, 0);
    x.set(zmq::sockopt::plain_username, "troupe");
    x.set(zmq::sockopt::plain_password, c.token());
    zmq_socket_monitor(x.handle(), "inproc://big-subscriber",
                       ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED);
    zmq::socket_t monitor{ctx, zmq::socket_type::pair};
    monitor.set(zmq::sockopt::rcvtimeo, 60000);
    monitor.connect("inproc://big-subscriber");
    x.connect(c.pub());
    auto next_event = [&] {
      zmq::message_t e, addr;
      if (!monitor.recv(e)) return 0;
      if (e.more()) (void)monitor.recv(addr);
      uint16_t id = 0;
      std::memcpy(&id, e.data(), sizeof id);
      return int(id);
    };
    CHECK(next_event() == ZMQ_EVENT_HANDSHAKE_SUCCEEDED);  // the token lets it in
    std::string big(16 << 10, 'a');
    big[0] = 1;  // a subscription
    x.send(zmq::buffer(big), zmq::send_flags::none);
    CHECK(next_event() == ZMQ_EVENT_DISCONNECTED);
  }
  const long after = peak_rss_kib(c.coordinator_pid());
  INFO("coordinator peak RSS " << before << " KiB before, " << after << " KiB after");
  CHECK(after < before + 32 * 1024);
  CHECK(process_alive(c.coordinator_pid()));
  CHECK(c.call({{"op", "list"}})["ok"] == true);
}

TEST_CASE(
    "hostile net: 300 idle connections to the control port neither keep an agent out nor their descriptors",
    "[security][multiprocess]") {
  Cluster c;
  REQUIRE(c.ready());
  const int pid = c.coordinator_pid();
  const size_t baseline = open_fds(pid);
  // 300 connections from 127.0.0.2 that never send a byte, and 5 that stop inside a TLS record.
  std::vector<int> idle;
  for (int i = 0; i < 300; ++i) {
    const int fd = tcp_from("127.0.0.2", c.listen());
    REQUIRE(fd >= 0);
    idle.push_back(fd);
  }
  for (int i = 0; i < 5; ++i) {
    const int fd = tcp_from("127.0.0.3", c.listen());
    REQUIRE(fd >= 0);
    CHECK(::send(fd, "\x16\x03\x01", 3, MSG_NOSIGNAL) == 3);
    idle.push_back(fd);
  }
  // Pending handshakes per address are capped (64): the coordinator holds a bounded number.
  CHECK(wait_until([&] { return open_fds(pid) <= baseline + 64 + 5 + 8; }, 60s));
  INFO("coordinator descriptors: " << baseline << " before, " << open_fds(pid) << " with the flood held");
  // A real agent registers meanwhile, from another address.
  c.add_agent("cpu:1");
  CHECK(c.wait_devices(1));
  // Every idle connection is closed by the coordinator (most at once, the rest at the
  // deadline), and its descriptors go back.
  int closed = 0;
  for (int fd : idle) closed += closed_by_peer(fd, 120s);
  CHECK(closed == int(idle.size()));
  for (int fd : idle) ::close(fd);
  CHECK(wait_until([&] { return open_fds(pid) <= baseline + 8; }, 60s));
  INFO("coordinator descriptors after: " << open_fds(pid));
  CHECK(process_alive(pid));
  CHECK(c.call({{"op", "list"}})["agents"].size() == 1);
}

TEST_CASE("hostile net: idle connections from the agent's own address do not keep it out",
          "[security][multiprocess]") {
  Cluster c;
  REQUIRE(c.ready());
  std::vector<int> idle;
  for (int i = 0; i < 300; ++i) {
    const int fd = tcp_from("127.0.0.1", c.listen());
    REQUIRE(fd >= 0);
    idle.push_back(fd);
  }
  // The oldest pending handshakes of an address make room for its newest: the agent's.
  c.add_agent("cpu:1");
  CHECK(c.wait_devices(1));
  int closed = 0;
  for (int fd : idle) closed += closed_by_peer(fd, 120s);
  CHECK(closed == int(idle.size()));
  for (int fd : idle) ::close(fd);
  CHECK(c.call({{"op", "list"}})["agents"].size() == 1);
}

TEST_CASE("hostile net: 70 slow reconnecting connections from one client keep /metrics answering another",
          "[security][dashboard][multiprocess]") {
  Cluster c({"--http", "127.0.0.1:0"});
  REQUIRE(c.ready());
  const std::string http = c.ready_json().value("http", "");
  REQUIRE(!http.empty());
  std::atomic<bool> stop{false};
  std::atomic<int> reconnects{0};
  // The slow client: 70 connections, each a request it never finishes; one the server closes
  // is opened again at once. Two addresses, so that it holds more than one address's share.
  std::thread slow([&] {
    std::vector<std::unique_ptr<HttpConn>> conns(70);
    while (!stop.load()) {
      for (size_t i = 0; i < conns.size() && !stop.load(); ++i) {
        auto& conn = conns[i];
        if (conn && conn->ok()) {
          pollfd p{conn->fd(), POLLIN, 0};
          if (::poll(&p, 1, 0) == 0) continue;  // still held
          conn->reply();
          ++reconnects;
        }
        conn = std::make_unique<HttpConn>(http, 0, i % 2 ? "127.0.0.2" : "127.0.0.3");
        if (conn->ok()) conn->send("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n");
      }
      std::this_thread::sleep_for(20ms);
    }
  });
  // Let it take its slots, then ask as a real client would, twenty times.
  std::this_thread::sleep_for(2s);
  int ok = 0;
  std::string last;
  for (int i = 0; i < 20; ++i) {
    auto r =
        run_command("python3 -c \"import urllib.request,sys; r=urllib.request.urlopen('http://" + http +
                    "/metrics', timeout=60); sys.stdout.write(str(r.status)+' '+r.read().decode()[:40])\"");
    last = r.out;
    ok += r.code == 0 && r.out.rfind("200 ", 0) == 0;
  }
  stop.store(true);
  slow.join();
  INFO("last answer: " << last << "; the slow client reconnected " << reconnects.load() << " times");
  CHECK(ok == 20);
  CHECK(process_alive(c.coordinator_pid()));
}

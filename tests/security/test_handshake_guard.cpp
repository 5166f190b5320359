// The control port's table of pending handshakes (actors/handshake_guard.hpp), on its own:
// which connections it closes for a deadline, for an address's share, and for the total; and
// where it puts an accepted connection's descriptor (DescriptorCursor), on its own and behind
// a published port.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <set>
#include <thread>

#include "actors/handshake_guard.hpp"
#include "actors/secret.hpp"
#include "actors/system.hpp"

using namespace troupe;
using namespace troupe::actors;
using namespace std::chrono_literals;
using Clock = PendingHandshakes::Clock;

TEST_CASE("handshake guard: an address past its share loses its oldest pending handshake",
          "[security][handshake]") {
  HandshakeLimits l;
  l.per_address = 3;
  l.total = 100;
  PendingHandshakes t(l);
  const auto t0 = Clock::now();
  std::vector<PendingHandshakes::Id> evict;
  std::vector<PendingHandshakes::Id> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(t.admit("10.0.0.1", t0, &evict));
  CHECK(evict.empty());
  const auto other = t.admit("10.0.0.2", t0, &evict);
  CHECK(evict.empty());
  // The fourth of 10.0.0.1 takes the place of its first; 10.0.0.2 is untouched.
  const auto fourth = t.admit("10.0.0.1", t0, &evict);
  CHECK(evict == std::vector<PendingHandshakes::Id>{ids[0]});
  CHECK(t.pending("10.0.0.1") == 3);
  CHECK(t.pending("10.0.0.2") == 1);
  // A finished handshake frees its place: the next one of 10.0.0.1 evicts nobody.
  t.established(ids[1]);
  evict.clear();
  t.admit("10.0.0.1", t0, &evict);
  CHECK(evict.empty());
  t.closed(other);
  t.closed(fourth);
  CHECK(t.pending("10.0.0.2") == 0);
  CHECK(t.pending() == 2);
}

TEST_CASE("handshake guard: the oldest of all goes past the total, whatever its address",
          "[security][handshake]") {
  HandshakeLimits l;
  l.per_address = 100;
  l.total = 4;
  PendingHandshakes t(l);
  const auto t0 = Clock::now();
  std::vector<PendingHandshakes::Id> evict, ids;
  for (int i = 0; i < 4; ++i) ids.push_back(t.admit("10.0.0." + std::to_string(i), t0, &evict));
  CHECK(evict.empty());
  t.admit("10.0.0.9", t0, &evict);
  CHECK(evict == std::vector<PendingHandshakes::Id>{ids[0]});
  CHECK(t.pending() == 4);
}

TEST_CASE("handshake guard: handshakes pending past the deadline expire, oldest first",
          "[security][handshake]") {
  HandshakeLimits l;
  l.deadline = 10s;
  PendingHandshakes t(l);
  const auto t0 = Clock::now();
  std::vector<PendingHandshakes::Id> evict;
  const auto a = t.admit("10.0.0.1", t0, &evict);
  const auto b = t.admit("10.0.0.1", t0 + 3s, &evict);
  const auto c = t.admit("10.0.0.2", t0 + 6s, &evict);
  t.established(b);
  CHECK(t.expired(t0 + 9s).empty());
  CHECK(t.expired(t0 + 10s) == std::vector<PendingHandshakes::Id>{a});
  CHECK(t.expired(t0 + 15s).empty());  // b finished its handshake
  CHECK(t.expired(t0 + 16s) == std::vector<PendingHandshakes::Id>{c});
  CHECK(t.pending() == 0);
}

TEST_CASE("handshake guard: IPv6 addresses count per /64, IPv4-mapped ones as IPv4",
          "[security][handshake]") {
  CHECK(address_key("10.1.2.3") == "10.1.2.3");
  CHECK(address_key("::ffff:10.1.2.3") == "10.1.2.3");
  CHECK(address_key("2001:db8:1:2:a:b:c:d") == "2001:db8:1:2::/64");
  CHECK(address_key("[2001:db8:1:2::99]") == "2001:db8:1:2::/64");
  CHECK(address_key("not an address") == "not an address");
  HandshakeLimits l;
  l.per_address = 2;
  PendingHandshakes t(l);
  std::vector<PendingHandshakes::Id> evict;
  const auto first = t.admit("2001:db8:1:2::1", Clock::now(), &evict);
  t.admit("2001:db8:1:2::2", Clock::now(), &evict);
  t.admit("2001:db8:1:2:ffff::3", Clock::now(), &evict);  // a third of the same /64
  CHECK(evict == std::vector<PendingHandshakes::Id>{first});
}

namespace {

// A descriptor to place (a pipe's read end; its write end closed).
int spare_descriptor() {
  int p[2];
  REQUIRE(::pipe(p) == 0);
  ::close(p[1]);
  return p[0];
}

bool is_open(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

}  // namespace

TEST_CASE(
    "descriptor cursor: a closed number comes back only after a turn of the range, and a full range "
    "keeps the descriptor where it is",
    "[security][handshake]") {
  // A range of 4 numbers high above anything this test process holds.
  const int first = 900;
  DescriptorCursor c(first, first + 4);
  std::vector<int> got;
  for (int i = 0; i < 3; ++i) {
    const int fd = spare_descriptor();
    const int placed = c.place(fd);
    CHECK(placed == first + i);
    CHECK(!is_open(fd));  // moved, not copied
    got.push_back(placed);
  }
  // The first closes; the next goes on to the fourth number, not back to the first.
  ::close(got[0]);
  const int fourth = c.place(spare_descriptor());
  CHECK(fourth == first + 3);
  // Past the end the cursor turns: the first number is free again and taken.
  const int again = c.place(spare_descriptor());
  CHECK(again == first);
  // Every number taken: the descriptor stays where it was, open.
  const int stays = spare_descriptor();
  CHECK(c.place(stays) == stays);
  CHECK(is_open(stays));
  for (int fd : {got[1], got[2], fourth, again, stays}) ::close(fd);
}

TEST_CASE("control port: a connection accepted after another closed never gets the closed one's number",
          "[security][handshake]") {
  // CAF names a connection by its descriptor number and forgets a closed one a turn later;
  // the control port must not hand that number to the next peer meanwhile.
  const std::string dir = "/tmp/troupe-test-descriptors-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  write_secret(dir + "/secret.pem");
  NodeConfig cfg(dir + "/secret.pem");
  caf::actor_system sys(cfg);
  auto echo = sys.spawn([]() -> caf::behavior { return {[](int x) { return x; }}; });
  auto port = publish(echo, 0, "127.0.0.1");
  REQUIRE(port);
  // The server's descriptor of a client socket: the one whose peer is the client's own address.
  auto server_side = [](int client) {
    sockaddr_in mine{};
    socklen_t len = sizeof mine;
    ::getsockname(client, reinterpret_cast<sockaddr*>(&mine), &len);
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
      const int fd = std::atoi(e.path().filename().c_str());
      sockaddr_in peer{};
      socklen_t plen = sizeof peer;
      if (fd == client || ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &plen) != 0) continue;
      if (peer.sin_family == AF_INET && peer.sin_port == mine.sin_port &&
          peer.sin_addr.s_addr == mine.sin_addr.s_addr)
        return fd;
    }
    return -1;
  };
  std::set<int> numbers;
  for (int i = 0; i < 6; ++i) {
    const int client = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(client >= 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(*port);
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(client, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0);
    int server = -1;
    for (int t = 0; t < 3000 && server < 0; ++t) {
      server = server_side(client);
      if (server < 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    REQUIRE(server >= 0);
    numbers.insert(server);
    // The peer goes; the port sees the end of its stream and closes its side.
    ::close(client);
    bool closed = false;
    for (int t = 0; t < 3000 && !closed; ++t) {
      sockaddr_in peer{};
      socklen_t plen = sizeof peer;
      closed = ::getpeername(server, reinterpret_cast<sockaddr*>(&peer), &plen) != 0;
      if (!closed) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    REQUIRE(closed);
  }
  CHECK(numbers.size() == 6);
  caf::anon_send_exit(echo, caf::exit_reason::kill);
  std::filesystem::remove_all(dir);
}

// The control port's table of pending handshakes (actors/handshake_guard.hpp), on its own:
// which connections it closes for a deadline, for an address's share, and for the total.
#include <catch2/catch.hpp>

#include "actors/handshake_guard.hpp"

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

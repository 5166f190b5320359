// Connections to the control port that have not finished their handshake. CAF's OpenSSL
// acceptor keeps every accepted connection until its peer speaks: 300 connections that never
// sent a byte were held for as long as their peers liked (the coordinator's descriptors went
// from 22 to 323, and an agent's first connect timed out meanwhile). The control port counts
// them here instead:
//
//   accept ----> pending --(the peer's first bytes after TLS: its BASP handshake)--> established
//                   |
//                   +--(past the deadline, or the oldest of its address past per_address,
//                       or the oldest of all past total)--> closed by the port
//
// Plain bookkeeping (no sockets, no locks): actors/guarded_accept.cpp holds one under a mutex
// and closes what it names. Tested without CAF in tests/security/test_handshake_guard.cpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <list>
#include <map>
#include <string>
#include <vector>

#include "core/net_address.hpp"

namespace troupe::actors {

struct HandshakeLimits {
  // TLS and the BASP handshake take milliseconds (one round trip each, a signature, a few
  // KiB); a peer that has not finished after this long is not going to.
  std::chrono::milliseconds deadline{10000};
  // Pending handshakes from one address (core/net_address.hpp: an IPv4 address, or an IPv6
  // /64): a host's agent and its workers connect at once, one per device.
  int per_address = 64;
  // Pending handshakes in all, whatever their addresses.
  int total = 512;
};

class PendingHandshakes {
 public:
  using Clock = std::chrono::steady_clock;
  using Id = uint64_t;

  explicit PendingHandshakes(HandshakeLimits limits = {}) : limits_(limits) {}

  // A connection from `address` accepted at `now`: its id. The connections to close to make
  // room for it go to *evict (removed here): the oldest pending one of its address when that
  // address already has per_address, then the oldest of all when there are `total`.
  Id admit(const std::string& address, Clock::time_point now, std::vector<Id>* evict);
  // The handshake is done: no longer pending (nothing when `id` is not pending).
  void established(Id id);
  // The connection is gone, whatever its state.
  void closed(Id id) { established(id); }
  // The pending connections accepted before now - deadline, oldest first (removed here).
  std::vector<Id> expired(Clock::time_point now);

  size_t pending() const { return order_.size(); }
  size_t pending(const std::string& address) const;
  const HandshakeLimits& limits() const { return limits_; }

 private:
  struct Entry {
    std::string address;
    Clock::time_point since;
  };
  void erase(std::list<Id>::iterator it);

  HandshakeLimits limits_;
  Id next_ = 1;
  std::list<Id> order_;  // pending, oldest first
  std::map<Id, std::pair<Entry, std::list<Id>::iterator>> entries_;
  std::map<std::string, std::list<Id>> by_address_;  // each address's pending, oldest first
};

// Where an accepted connection's descriptor goes. CAF 0.17.6 names a connection by its
// descriptor number, and its BASP broker forgets a closed connection (its route to the peer's
// node, its handshake state) only once the messages already read from it are delivered, a
// turn through its worker queue later. A connection accepted meanwhile gets the lowest free
// number, often the one just closed: the broker took it for the old connection, so the new
// peer's messages counted as the old peer's node's, and the late clean-up then dropped the new
// peer's route (at 4,096 simulated ranks: an agent lost a few seconds after it reconnected, and
// a down message refused as another node's). Each accepted descriptor moves to the lowest free
// number at or after a cursor that only goes up, to `first` again past the end: a number
// comes back only after a whole turn of the range, not while its last connection is forgotten.
class DescriptorCursor {
 public:
  static constexpr int kFirst = 4096;
  // `end` 0: the process's descriptor limit (RLIMIT_NOFILE, raised to its hard limit by
  // raise_descriptor_limit()); where that is below 2 × first, its upper half.
  explicit DescriptorCursor(int first = kFirst, int end = 0);
  // `fd` moved to its new number (the old one closed), or `fd` itself when no number in
  // [first, end) is free (the range is too small or full).
  int place(int fd);

 private:
  int first_, end_, next_;
};

// The soft descriptor limit raised to the hard one (a coordinator holds one per agent or
// relay-less worker, and DescriptorCursor spreads them); returns the limit now in force.
int raise_descriptor_limit();

}  // namespace troupe::actors

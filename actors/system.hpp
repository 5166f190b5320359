// The actor-system configuration every troupe node (coordinator, agent,
// worker) starts from: all protocol types registered, the middleman loaded and
// heartbeats on with the same settings everywhere, and the middleman's
// connections authenticated by mutual TLS on the cluster secret
// (actors/secret.hpp). Set in code on purpose: a caf-application.ini in the
// working directory must not change them.
#pragma once

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/openssl/all.hpp>
#include <chrono>
#include <functional>
#include <set>
#include <string>
#include <thread>

#include "actors/handshake_guard.hpp"

namespace troupe::actors {

// Heartbeats let a hung (not dead) peer be noticed: a peer silent for
// kConnectionTimeout is dropped and its actors go down (CAF checks at each heartbeat
// tick: after 2.0 to 2.5 s). Any message counts as a sign of life, so heartbeats matter
// on quiet connections only; at 200 ms they were half the records a coordinator of 512
// hosts handled (docs/scale.md).
constexpr auto kHeartbeatInterval = std::chrono::milliseconds(500);
constexpr auto kConnectionTimeout = std::chrono::milliseconds(2000);

class NodeConfig : public caf::actor_system_config {
 public:
  // `secret_file` must have passed check_secret(): every connection this node
  // makes or accepts presents its certificate and requires the peer's to be the same.
  explicit NodeConfig(const std::string& secret_file);
};

// CAF's OpenSSL acceptor with a handshake guard (actors/guarded_accept.cpp): a connection
// that has not finished TLS and the BASP handshake by limits.deadline is closed, and an
// address has at most limits.per_address of them pending (the oldest goes first).
caf::expected<uint16_t> publish_guarded(caf::actor_system& sys, caf::strong_actor_ptr whom,
                                        std::set<std::string> sigs, uint16_t port, const std::string& host,
                                        const HandshakeLimits& limits = {});

// Publishes an actor on host:port (0 = any free port) for peers that hold the
// cluster secret; returns the bound port. Never the plain middleman: a peer
// without the secret fails the TLS handshake before a BASP byte is read, and one
// that never finishes it is closed at the deadline (publish_guarded).
template <class Handle>
caf::expected<uint16_t> publish(const Handle& actor, uint16_t port, const std::string& host,
                                const HandshakeLimits& limits = {}) {
  if (!actor) return caf::sec::cannot_publish_invalid_actor;
  auto& sys = actor.home_system();
  return publish_guarded(sys, caf::actor_cast<caf::strong_actor_ptr>(actor), sys.message_types(actor), port,
                         host, limits);
}

// Connects to an actor published with publish() (the peer must hold the same secret).
template <class Handle>
caf::expected<Handle> connect(caf::actor_system& sys, const std::string& host, uint16_t port) {
  return caf::openssl::remote_actor<Handle>(sys, host, port);
}

// No troupe node routes control messages (actors/basp_guard.cpp): a connection that sends a
// routed BASP message, whose source node its sender states, is closed. Active: CAF's own
// dispatch was found (NodeConfig refuses to start without it); called: this process's BASP
// messages went through the guard; refused: routed messages seen so far.
bool basp_guard_active();
bool basp_guard_called();
uint64_t basp_guard_refused();

// connect(), tried again after `first`, twice that, ... up to `last`: a loaded peer may take
// longer than the connection timeout to finish the TLS and BASP handshakes. `on_retry` hears
// each failure and the wait that follows it.
template <class Handle>
caf::expected<Handle> connect_with_retry(
    caf::actor_system& sys, const std::string& host, uint16_t port, std::chrono::milliseconds first,
    std::chrono::milliseconds last,
    const std::function<void(const caf::error&, std::chrono::milliseconds)>& on_retry = {}) {
  auto h = connect<Handle>(sys, host, port);
  for (auto backoff = first; !h && backoff <= last; backoff *= 2) {
    if (on_retry) on_retry(h.error(), backoff);
    std::this_thread::sleep_for(backoff);
    h = connect<Handle>(sys, host, port);
  }
  return h;
}

// "host:port" -> (host, port); throws troupe::Error on a malformed address.
std::pair<std::string, uint16_t> parse_host_port(const std::string& address);

// The name of this host (gethostname).
std::string host_name();

}  // namespace troupe::actors

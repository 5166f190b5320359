// The actor-system configuration every troupe node (coordinator, agent,
// worker) starts from: all protocol types registered, the middleman loaded and
// heartbeats on with the same settings everywhere. Set in code on purpose: a
// caf-application.ini in the working directory must not change them.
#pragma once

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <string>

namespace troupe::actors {

// Heartbeats let a hung (not dead) peer be noticed: a peer silent for
// kConnectionTimeout is dropped and its actors go down.
constexpr auto kHeartbeatInterval = std::chrono::milliseconds(200);
constexpr auto kConnectionTimeout = std::chrono::milliseconds(2000);

class NodeConfig : public caf::actor_system_config {
 public:
  NodeConfig();
};

// "host:port" -> (host, port); throws troupe::Error on a malformed address.
std::pair<std::string, uint16_t> parse_host_port(const std::string& address);

// The name of this host (gethostname).
std::string host_name();

}  // namespace troupe::actors

// A stranger or an insider on loopback: a test-side CAF node that connects to
// a coordinator process with a given secret (or with none, over the plain
// middleman), and raw TCP for what is not CAF at all.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include "actors/protocol.hpp"
#include "actors/system.hpp"

namespace troupe::test {

// A node holding `secret` (a path), as an agent or worker would.
class Peer {
 public:
  explicit Peer(const std::string& secret) : cfg_(secret), sys_(cfg_) {}
  caf::actor_system& sys() { return sys_; }
  caf::expected<actors::coordinator_actor> connect(const std::string& listen) {
    auto [host, port] = actors::parse_host_port(listen);
    return actors::connect<actors::coordinator_actor>(sys_, host, port);
  }
  // One request and its answer, or nullopt when none came within `limit`.
  template <class R, class... Ts>
  std::optional<R> ask(const actors::coordinator_actor& c, Ts&&... xs) {
    caf::scoped_actor self{sys_};
    std::optional<R> out;
    self->request(c, std::chrono::seconds(10), std::forward<Ts>(xs)...)
        .receive([&](R& r) { out = std::move(r); }, [&](caf::error&) {});
    return out;
  }

 private:
  actors::NodeConfig cfg_;
  caf::actor_system sys_;
};

// A node with CAF's plain middleman and no TLS: what the control port spoke before.
struct PlainConfig : caf::actor_system_config {
  PlainConfig() {
    load<caf::io::middleman>();
    set("logger.console", caf::atom("none"));
  }
};
class PlainPeer {
 public:
  caf::expected<actors::coordinator_actor> connect(const std::string& listen) {
    auto [host, port] = actors::parse_host_port(listen);
    return sys_.middleman().remote_actor<actors::coordinator_actor>(host, port);
  }

 private:
  PlainConfig cfg_;
  caf::actor_system sys_{cfg_};
};

// Sends `bytes` to host:port over a fresh TCP connection and waits up to 2 s for
// the peer to answer or close; returns false if it could not connect.
inline bool send_raw(const std::string& listen, const std::string& bytes) {
  auto [host, port] = actors::parse_host_port(listen);
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  ::inet_pton(AF_INET, host.c_str(), &a.sin_addr);
  timeval tv{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  if (ok) ok = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
  char buf[256];
  if (ok) (void)::recv(fd, buf, sizeof buf, 0);
  ::close(fd);
  return ok;
}

// A BASP header (CAF 0.17: operation, 3 bytes padding and flags, payload length,
// operation data, source and destination actor) claiming `payload_len` bytes follow.
inline std::string basp_header(uint8_t operation, uint32_t payload_len) {
  std::string h(40, '\0');
  h[0] = static_cast<char>(operation);
  for (int i = 0; i < 4; ++i) h[8 + i] = static_cast<char>((payload_len >> (24 - 8 * i)) & 0xff);
  return h + std::string(40, 'A');
}

// Peak resident memory of a process (VmHWM), in KiB; -1 when unknown.
inline long peak_rss_kib(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

}  // namespace troupe::test

// A stranger or an insider on loopback: a test-side CAF node that connects to
// a coordinator process with a given secret (or with none, over the plain
// middleman), and raw TCP for what is not CAF at all.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/io/basp/header.hpp>
#include <chrono>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

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

// A TCP connection to host:port (IPv4) whose reads wait at most `receive_timeout_s`: its
// descriptor, or -1 (none is left open).
inline int connect_tcp(const std::string& listen, int receive_timeout_s) {
  auto [host, port] = actors::parse_host_port(listen);
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  ::inet_pton(AF_INET, host.c_str(), &a.sin_addr);
  timeval tv{receive_timeout_s, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Sends `bytes` to host:port over a fresh TCP connection and waits up to 2 s for
// the peer to answer or close; returns false if it could not connect.
inline bool send_raw(const std::string& listen, const std::string& bytes) {
  int fd = connect_tcp(listen, 2);
  if (fd < 0) return false;
  bool ok = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
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

// An insider that speaks BASP by hand over mutual TLS with the cluster secret: CAF's framing
// (a header, then its payload, as CAF's binary serializer writes them), for what a CAF node
// never sends, such as a monitor or down message that names another node as its source.
class RawBaspPeer {
 public:
  RawBaspPeer(caf::actor_system& sys, const std::string& secret, const std::string& listen) : sys_(sys) {
    ::signal(SIGPIPE, SIG_IGN);  // a write after the peer closed is an error, not the end of the test
    ctx_ = SSL_CTX_new(TLS_client_method());
    if (ctx_ == nullptr || SSL_CTX_use_certificate_chain_file(ctx_, secret.c_str()) != 1 ||
        SSL_CTX_use_PrivateKey_file(ctx_, secret.c_str(), SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_load_verify_locations(ctx_, secret.c_str(), nullptr) != 1)
      return;
    SSL_CTX_set_verify(ctx_, SSL_VERIFY_PEER, nullptr);
    fd_ = connect_tcp(listen, 30);
    if (fd_ < 0) return;
    ssl_ = SSL_new(ctx_);
    SSL_set_fd(ssl_, fd_);
    ok_ = SSL_connect(ssl_) == 1;
  }
  ~RawBaspPeer() {
    if (ssl_ != nullptr) SSL_free(ssl_);
    if (fd_ >= 0) ::close(fd_);
    if (ctx_ != nullptr) SSL_CTX_free(ctx_);
  }
  RawBaspPeer(const RawBaspPeer&) = delete;
  RawBaspPeer& operator=(const RawBaspPeer&) = delete;

  // Reads the server's handshake (its node id into *server) and answers as node `me`.
  bool handshake(const caf::node_id& me, caf::node_id* server) {
    caf::io::basp::header hdr;
    std::vector<char> payload;
    if (!ok_ || !read_message(&hdr, &payload) ||
        hdr.operation != caf::io::basp::message_type::server_handshake)
      return false;
    caf::binary_deserializer in{sys_, payload};
    if (in(*server)) return false;
    return send(caf::io::basp::message_type::client_handshake, 0, 0, 0, me);
  }
  // One message: a header of `operation` (with its data, source and destination actor), the
  // payload `xs` serialized after it.
  template <class... Ts>
  bool send(caf::io::basp::message_type operation, uint64_t data, caf::actor_id source, caf::actor_id dest,
            Ts&&... xs) {
    std::vector<char> payload;
    caf::binary_serializer ps{sys_, payload};
    if (ps(xs...)) return false;
    caf::io::basp::header hdr{operation, 0, static_cast<uint32_t>(payload.size()), data, source, dest};
    std::vector<char> out;
    caf::binary_serializer hs{sys_, out};
    if (hs(hdr)) return false;
    out.insert(out.end(), payload.begin(), payload.end());
    return ok_ && SSL_write(ssl_, out.data(), static_cast<int>(out.size())) == static_cast<int>(out.size());
  }
  // Reads what comes until the peer closes the connection (true) or 30 s pass (false).
  bool closed_by_peer() {
    char buf[4096];
    for (;;) {
      errno = 0;
      const int n = SSL_read(ssl_, buf, sizeof buf);
      if (n > 0) continue;
      // A close with or without TLS's close_notify (OpenSSL 3 calls the latter an error); only
      // the receive timeout is not one.
      const int e = SSL_get_error(ssl_, n);
      const bool timed_out = e == SSL_ERROR_WANT_READ || errno == EAGAIN || errno == EWOULDBLOCK;
      ERR_clear_error();
      return !timed_out;
    }
  }

 private:
  bool read_exact(char* p, size_t n) {
    while (n > 0) {
      const int got = SSL_read(ssl_, p, static_cast<int>(n));
      if (got <= 0) return false;
      p += got;
      n -= static_cast<size_t>(got);
    }
    return true;
  }
  bool read_message(caf::io::basp::header* hdr, std::vector<char>* payload) {
    std::vector<char> h(caf::io::basp::header_size);
    if (!read_exact(h.data(), h.size())) return false;
    caf::binary_deserializer in{sys_, h};
    if (in(*hdr) || hdr->payload_len > (1u << 20)) return false;
    payload->resize(hdr->payload_len);
    return read_exact(payload->data(), payload->size());
  }

  caf::actor_system& sys_;
  SSL_CTX* ctx_ = nullptr;
  SSL* ssl_ = nullptr;
  int fd_ = -1;
  bool ok_ = false;
};

// Peak resident memory of a process (VmHWM), in KiB; -1 when unknown.
inline long peak_rss_kib(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

}  // namespace troupe::test

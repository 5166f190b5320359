// A blocking HTTP/1.1 client for tests: one request per connection, the answer read
// until the server closes. http_get and http_raw do a whole round trip; HttpConn is
// the connection itself, for a test that sends a request in pieces, holds a
// connection open, reads an answer slowly, or watches the server cut it off.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace troupe::test {

struct HttpReply {
  int status = 0;          // 0: no answer (could not connect, or it closed first)
  std::string head, body;  // head: the status line and headers, without the blank line

  // The value of header `name` (case-insensitive), "" when absent.
  std::string header(const std::string& name) const {
    const size_t at = find_header(name);
    if (at == std::string::npos) return "";
    const size_t end = std::min(head.find("\r\n", at), head.size());
    const size_t v = head.find_first_not_of(' ', at + name.size() + 1);
    return v < end ? head.substr(v, end - v) : "";
  }
  bool has(const std::string& name) const { return find_header(name) != std::string::npos; }

  // Where the line of header `name` starts in head, or npos.
  size_t find_header(const std::string& name) const {
    for (size_t pos = head.find("\r\n"); pos != std::string::npos; pos = head.find("\r\n", pos)) {
      pos += 2;
      bool same = pos + name.size() < head.size() && head[pos + name.size()] == ':';
      for (size_t i = 0; same && i < name.size(); ++i)
        same = std::tolower(static_cast<unsigned char>(head[pos + i])) ==
               std::tolower(static_cast<unsigned char>(name[i]));
      if (same) return pos;
    }
    return std::string::npos;
  }
};

// "HTTP/1.1 200 OK\r\nA: b\r\n\r\nbody" -> {200, "HTTP/1.1 200 OK\r\nA: b", "body"}; anything
// that is not an HTTP/1.1 answer with a whole head -> status 0.
inline HttpReply parse_reply(const std::string& all) {
  HttpReply r;
  const size_t split = all.find("\r\n\r\n");
  if (all.compare(0, 9, "HTTP/1.1 ") != 0 || split == std::string::npos) return r;
  r.status = std::atoi(all.c_str() + 9);
  r.head = all.substr(0, split);
  r.body = all.substr(split + 4);
  return r;
}

class HttpConn {
 public:
  // Connects to "host:port": an IPv4 literal or "[IPv6]"; 0.0.0.0 and [::] are reached on
  // loopback. recv_buffer > 0 sets SO_RCVBUF before connecting, which keeps the window
  // small, so that an answer the test does not read stays in the server's hands. `source`
  // (an IPv4 literal, "127.0.0.2") binds the local end first: a second client on loopback.
  explicit HttpConn(const std::string& address, int recv_buffer = 0, const std::string& source = "") {
    const size_t colon = address.rfind(':');
    if (colon == std::string::npos || colon == 0) return;
    std::string host = address.substr(0, colon);
    const int port = std::atoi(address.c_str() + colon + 1);
    sockaddr_storage ss{};
    socklen_t len = 0;
    bool parsed = false;
    if (host.front() == '[') {
      host = host.substr(1, host.size() - 2);
      if (host == "::") host = "::1";
      auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
      a->sin6_family = AF_INET6;
      a->sin6_port = htons(static_cast<uint16_t>(port));
      parsed = ::inet_pton(AF_INET6, host.c_str(), &a->sin6_addr) == 1;
      len = sizeof *a;
    } else {
      if (host == "0.0.0.0") host = "127.0.0.1";
      auto* a = reinterpret_cast<sockaddr_in*>(&ss);
      a->sin_family = AF_INET;
      a->sin_port = htons(static_cast<uint16_t>(port));
      parsed = ::inet_pton(AF_INET, host.c_str(), &a->sin_addr) == 1;
      len = sizeof *a;
    }
    if (!parsed) return;
    fd_ = ::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) return;
    // A safety net so that a server bug fails the test instead of hanging it; no test relies on it.
    timeval tv{60, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (recv_buffer > 0) ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &recv_buffer, sizeof recv_buffer);
    if (!source.empty()) {
      sockaddr_in local{};
      local.sin_family = AF_INET;
      if (::inet_pton(AF_INET, source.c_str(), &local.sin_addr) != 1 ||
          ::bind(fd_, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0) {
        close();
        return;
      }
    }
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&ss), len) != 0) close();
  }
  ~HttpConn() { close(); }
  HttpConn(const HttpConn&) = delete;
  HttpConn& operator=(const HttpConn&) = delete;

  bool ok() const { return fd_ >= 0; }

  // Sends all of `bytes`, or stops where the server has closed (a 431 before the
  // whole head): what it answered is still read.
  void send(const std::string& bytes) {
    for (size_t at = 0; fd_ >= 0 && at < bytes.size();) {
      const ssize_t n = ::send(fd_, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      at += static_cast<size_t>(n);
    }
  }

  // One recv of at most `max` bytes, appended to received(): > 0 the bytes read, 0 the
  // server closed, -1 an error (error() has its errno: ECONNRESET, or EAGAIN at the net).
  ssize_t read_some(size_t max = 65536) {
    if (fd_ < 0) return -1;
    std::string buf(max, '\0');
    ssize_t n;
    do {
      n = ::recv(fd_, &buf[0], max, 0);
    } while (n < 0 && errno == EINTR);
    if (n < 0) error_ = errno;
    if (n > 0) received_.append(buf, 0, static_cast<size_t>(n));
    return n;
  }

  // Reads up to the server's close and parses all that arrived, read_some's bytes too.
  HttpReply reply() {
    while (read_some() > 0) {
    }
    close();
    return parse_reply(received_);
  }

  // Waits, reading nothing, until the server resets the connection or timeout_ms passes;
  // true when it was reset. (A close with FIN would only show once the answer is read.)
  bool wait_reset(int timeout_ms) {
    pollfd p{fd_, 0, 0};  // no events asked: poll returns on POLLERR / POLLHUP only
    return ::poll(&p, 1, timeout_ms) == 1 && (p.revents & (POLLERR | POLLHUP)) != 0;
  }

  const std::string& received() const { return received_; }
  int error() const { return error_; }
  int fd() const { return fd_; }

  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  int error_ = 0;
  std::string received_;
};

// Sends `raw` to 127.0.0.1:`port` as it is and reads the answer.
inline HttpReply http_raw(int port, const std::string& raw) {
  HttpConn c("127.0.0.1:" + std::to_string(port));
  if (!c.ok()) return HttpReply{};
  c.send(raw);
  return c.reply();
}

// GET `target` ("/metrics") from `address` ("127.0.0.1:PORT") with extra header lines.
inline HttpReply http_get(const std::string& address, const std::string& target,
                          const std::vector<std::string>& headers = {}) {
  const int port = std::atoi(address.substr(address.rfind(':') + 1).c_str());
  std::string req = "GET " + target + " HTTP/1.1\r\nHost: " + address + "\r\n";
  for (const auto& h : headers) req += h + "\r\n";
  return http_raw(port, req + "\r\n");
}

}  // namespace troupe::test

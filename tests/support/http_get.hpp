// A blocking HTTP/1.1 GET for tests: one request per connection, the whole
// answer read until the server closes.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace troupe::test {

struct HttpReply {
  int status = 0;  // 0: no answer (could not connect, or it closed first)
  std::string head, body;
  // The value of header `name` (case-insensitive), "" when absent.
  std::string header(const std::string& name) const {
    size_t pos = 0;
    while ((pos = head.find("\r\n", pos)) != std::string::npos) {
      pos += 2;
      size_t colon = head.find(':', pos), end = head.find("\r\n", pos);
      if (colon == std::string::npos || colon > end) continue;
      std::string n = head.substr(pos, colon - pos);
      bool same = n.size() == name.size();
      for (size_t i = 0; same && i < n.size(); ++i) same = std::tolower(n[i]) == std::tolower(name[i]);
      if (same) {
        size_t v = head.find_first_not_of(' ', colon + 1);
        return head.substr(v, end - v);
      }
    }
    return "";
  }
};

// Sends `raw` to 127.0.0.1:`port` as it is and reads the answer.
inline HttpReply http_raw(int port, const std::string& raw) {
  HttpReply r;
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return r;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return r;
  }
  for (size_t sent = 0; sent < raw.size();) {
    ssize_t n = ::send(fd, raw.data() + sent, raw.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += size_t(n);
  }
  std::string all;
  char buf[65536];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) all.append(buf, size_t(n));
  ::close(fd);
  const size_t split = all.find("\r\n\r\n");
  if (all.compare(0, 9, "HTTP/1.1 ") != 0 || split == std::string::npos) return r;
  r.status = std::atoi(all.c_str() + 9);
  r.head = all.substr(0, split);
  r.body = all.substr(split + 4);
  return r;
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

// A closed-loop HTTP load generator for bench/http_latency.cpp: `concurrency`
// connections at once from one thread (poll(2), non-blocking sockets), each one
// request ("GET <target>", Connection: close) read to the server's close; a finished
// connection is replaced at once by a new one until the time is up. Latency is the
// time from connect() to the answer's last byte. Every answer is checked: status 200
// and a body of the expected length, or it counts as a failure.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace troupe::bench {

struct LoadResult {
  int64_t ok = 0;      // 200 with the whole body
  int64_t failed = 0;  // another status, a short body, a reset, a refused connect, a timeout
  double seconds = 0;
  std::vector<double> latency_ms;  // of the ok answers

  double percentile(double p) const {
    if (latency_ms.empty()) return 0;
    std::vector<double> v = latency_ms;
    const size_t k = std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * double(v.size())));
    std::nth_element(v.begin(), v.begin() + long(k), v.end());
    return v[k];
  }
  double max() const {
    return latency_ms.empty() ? 0 : *std::max_element(latency_ms.begin(), latency_ms.end());
  }
};

class HttpLoad {
 public:
  // port on 127.0.0.1; expected_body: the length every answer's body must have.
  HttpLoad(int port, std::string target, size_t expected_body)
      : port_(port), target_(std::move(target)), expected_(expected_body) {}

  LoadResult run(int concurrency, double seconds) {
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    const auto end = t0 + std::chrono::duration<double>(seconds);
    const std::string request = "GET " + target_ + " HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port_) +
                                "\r\nConnection: close\r\n\r\n";
    std::vector<Conn> conns(static_cast<size_t>(concurrency));
    LoadResult r;
    for (auto& c : conns) open(c, r);
    std::vector<pollfd> fds(conns.size());
    while (true) {
      const auto now = clock::now();
      bool any = false;
      for (size_t i = 0; i < conns.size(); ++i) {
        fds[i] = {conns[i].fd, static_cast<short>(conns[i].sent < request.size() ? POLLOUT : POLLIN), 0};
        any = any || conns[i].fd >= 0;
      }
      if (!any) break;
      if (::poll(fds.data(), fds.size(), 100) < 0 && errno != EINTR) break;
      for (size_t i = 0; i < conns.size(); ++i) {
        Conn& c = conns[i];
        if (c.fd < 0) continue;
        const double age_ms = ms_since(c.start);
        if (fds[i].revents == 0) {
          if (age_ms > 30000) finish(c, r, false, age_ms);  // a stuck connection is a failure
        } else if (c.sent < request.size()) {
          const ssize_t n = ::send(c.fd, request.data() + c.sent, request.size() - c.sent, MSG_NOSIGNAL);
          if (n > 0) c.sent += size_t(n);
          if (n < 0 && errno != EAGAIN && errno != EINTR) finish(c, r, false, age_ms);
        } else {
          char buf[65536];
          const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
          if (n > 0) c.in.append(buf, size_t(n));
          if (n == 0) finish(c, r, answered_ok(c.in), age_ms);
          if (n < 0 && errno != EAGAIN && errno != EINTR) finish(c, r, false, age_ms);
        }
        if (c.fd < 0 && now < end) open(c, r);
      }
    }
    r.seconds = std::chrono::duration<double>(clock::now() - t0).count();
    return r;
  }

 private:
  struct Conn {
    int fd = -1;
    size_t sent = 0;
    std::string in;
    std::chrono::steady_clock::time_point start;
  };

  static double ms_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
  }

  // A connect() refused at once counts as a failure.
  void open(Conn& c, LoadResult& r) {
    c = Conn();
    c.start = std::chrono::steady_clock::now();
    c.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c.fd < 0) return;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port_));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(c.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 && errno != EINPROGRESS) {
      ::close(c.fd);
      c.fd = -1;
      ++r.failed;
    }
  }

  void finish(Conn& c, LoadResult& r, bool ok, double ms) {
    ::close(c.fd);
    c.fd = -1;
    if (ok) {
      ++r.ok;
      r.latency_ms.push_back(ms);
    } else {
      ++r.failed;
    }
  }

  bool answered_ok(const std::string& in) const {
    const size_t split = in.find("\r\n\r\n");
    return in.compare(0, 13, "HTTP/1.1 200 ") == 0 && split != std::string::npos &&
           in.size() - split - 4 == expected_;
  }

  int port_;
  std::string target_;
  size_t expected_;
};

}  // namespace troupe::bench

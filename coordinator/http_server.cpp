// The dashboard's HTTP transport (http_server.hpp): the response writer and the
// address parser are plain functions, as is the head parser (http_parse.cpp);
// HttpServer::Loop is the poll(2) loop around them and the only code that
// touches a socket.
#include "coordinator/http_server.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <string_view>
#include <utility>

#include "coordinator/http_parse.hpp"
#include "core/error.hpp"
#include "core/net_address.hpp"
#include "core/text.hpp"

namespace troupe::coord {
using namespace http;

namespace {

// After the answer is written the server sends FIN and reads what the peer still
// sends, so that closing a socket with unread bytes (the rest of an oversized head)
// does not send an RST, which can make the peer drop the answer it has not read yet.
// That wait is short and bounded in bytes.
constexpr int kLingerMs = 1000;
constexpr size_t kMaxDrainBytes = 1 << 20;
// accept() failing for lack of descriptors (EMFILE) leaves the connection queued,
// so poll would report it again at once: stop listening this long instead of spinning.
constexpr int kAcceptBackoffMs = 100;
constexpr int kMaxAcceptsPerRound = 64;

int64_t now_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(steady_clock::now().time_since_epoch()).count();
}

// ---------------------------------------------------------------- the response

// The reason phrase of each status this server or a dashboard handler answers, and the
// "error" name of the JSON body when the server itself refuses with it.
struct StatusName {
  int status;
  const char* reason;
  const char* error;
};
constexpr StatusName kStatuses[] = {{200, "OK", ""},
                                    {201, "Created", ""},
                                    {202, "Accepted", ""},
                                    {204, "No Content", ""},
                                    {301, "Moved Permanently", ""},
                                    {302, "Found", ""},
                                    {303, "See Other", ""},
                                    {304, "Not Modified", ""},
                                    {307, "Temporary Redirect", ""},
                                    {308, "Permanent Redirect", ""},
                                    {400, "Bad Request", "bad_request"},
                                    {401, "Unauthorized", "unauthorized"},
                                    {403, "Forbidden", ""},
                                    {404, "Not Found", ""},
                                    {405, "Method Not Allowed", "method_not_allowed"},
                                    {408, "Request Timeout", "timeout"},
                                    {409, "Conflict", ""},
                                    {410, "Gone", ""},
                                    {413, "Content Too Large", "body_not_accepted"},
                                    {421, "Misdirected Request", "wrong_host"},
                                    {429, "Too Many Requests", ""},
                                    {431, "Request Header Fields Too Large", "headers_too_large"},
                                    {500, "Internal Server Error", "internal"},
                                    {501, "Not Implemented", ""},
                                    {502, "Bad Gateway", ""},
                                    {503, "Service Unavailable", "unavailable"},
                                    {504, "Gateway Timeout", ""}};

const StatusName* find_status(int status) {
  for (const auto& s : kStatuses)
    if (s.status == status) return &s;
  return nullptr;
}

// A status with no phrase here goes out with an empty one, which HTTP allows.
const char* reason(int status) {
  const auto* s = find_status(status);
  return s != nullptr ? s->reason : "";
}

// The server's own refusal: {"error":"bad_request","message":"..."}.
HttpResponse error_response(int status, const std::string& message) {
  const auto* s = find_status(status);
  const std::string error = s != nullptr && *s->error != 0 ? s->error : "internal";
  return HttpResponse::json(status, json_text({{"error", error}, {"message", message}}));
}

// Why the handler's answer cannot go out as it is, or "" when it can.
std::string invalid_response(const HttpResponse& r, size_t max_body) {
  if (r.status < 200 || r.status > 599) return "the handler answered status " + std::to_string(r.status);
  if (r.body.size() > max_body)
    return "the response (" + std::to_string(r.body.size()) + " bytes) is larger than the limit of " +
           std::to_string(max_body) + " bytes";
  if (!is_field_value(r.content_type)) return "the handler answered a content type with a control byte";
  for (const auto& [name, value] : r.headers)
    if (!is_token(name) || !is_field_value(value)) return "the handler answered an invalid header";
  return "";
}

// The status line and headers of r. 204 and 304 carry no body and, for 204, no length.
std::string response_head(const HttpResponse& r) {
  std::string h = "HTTP/1.1 " + std::to_string(r.status) + " " + reason(r.status) + "\r\n";
  h += "Content-Type: " + r.content_type + "\r\n";
  if (r.status != 204 && r.status != 304) h += "Content-Length: " + std::to_string(r.body.size()) + "\r\n";
  h += "Connection: close\r\nX-Content-Type-Options: nosniff\r\nReferrer-Policy: no-referrer\r\n";
  bool cache_control = false;
  for (const auto& [name, value] : r.headers) {
    const auto n = lower(name);
    if (n == "content-length" || n == "content-type" || n == "connection" || n == "transfer-encoding" ||
        n == "x-content-type-options" || n == "referrer-policy")
      continue;
    cache_control = cache_control || n == "cache-control";
    h += name + ": " + value + "\r\n";
  }
  if (!cache_control) h += "Cache-Control: no-store\r\n";
  return h + "\r\n";
}

// 204 and 304 never carry a body; HEAD is answered GET's head without one.
bool sends_body(int status, bool head_only) { return !head_only && status != 204 && status != 304; }

// Whether the Host names anything but a loopback name: a page of another site that points
// its own name at 127.0.0.1 (DNS rebinding) names that site. Browsers always send a Host;
// HTTP/1.0 may leave it out (the parser asks it of HTTP/1.1), and that is no other name.
bool names_other_host(const HttpRequest& r) {
  for (const auto& [name, value] : r.headers)
    if (name == "host") return !is_loopback_host(host_name(value));
  return false;
}

bool authorized(const HttpRequest& r, const std::string& token) {
  const std::string auth = r.header("authorization");
  // Both are compared, whichever is present, so the time taken says nothing of which matched.
  const bool bearer = auth.size() > 7 && lower(auth.substr(0, 7)) == "bearer ";
  const bool by_header = constant_time_equal(bearer ? std::string(trim(auth.substr(7))) : "", token);
  const bool by_query = constant_time_equal(r.query_param("token"), token);
  return by_header || by_query;
}

// ---------------------------------------------------------------- addresses

struct Endpoint {
  sockaddr_storage addr{};
  socklen_t len = 0;
  std::string host;
};

// "127.0.0.1:8080", "localhost:0", "[::1]:8080" -> a socket address; throws on anything else.
Endpoint parse_listen(const std::string& listen) {
  const std::string bad = "cannot parse the dashboard address '" + listen +
                          "': expected HOST:PORT, HOST an IPv4 address, localhost or [IPv6], PORT 0-65535 "
                          "(0: any free port)";
  const size_t colon = listen.rfind(':');
  require(colon != std::string::npos && colon > 0, bad);
  Endpoint ep;
  ep.host = listen.substr(0, colon);
  const std::string port = listen.substr(colon + 1);
  require(!port.empty() && port.size() <= 5 &&
              std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }),
          bad);
  const int p = std::stoi(port);
  require(p <= 65535, bad);
  if (ep.host.front() == '[') {
    require(ep.host.size() > 2 && ep.host.back() == ']', bad);
    auto* a = reinterpret_cast<sockaddr_in6*>(&ep.addr);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(static_cast<uint16_t>(p));
    require(::inet_pton(AF_INET6, ep.host.substr(1, ep.host.size() - 2).c_str(), &a->sin6_addr) == 1, bad);
    ep.len = sizeof(sockaddr_in6);
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&ep.addr);
    a->sin_family = AF_INET;
    a->sin_port = htons(static_cast<uint16_t>(p));
    const std::string host = lower(ep.host) == "localhost" ? "127.0.0.1" : ep.host;
    require(::inet_pton(AF_INET, host.c_str(), &a->sin_addr) == 1, bad);
    ep.len = sizeof(sockaddr_in);
  }
  return ep;
}

// "127.0.0.1:53422" -> "127.0.0.1", "[::1]:53422" -> "[::1]".
std::string host_of(const std::string& peer) { return peer.substr(0, peer.rfind(':')); }

// "127.0.0.1:53422" or "[::1]:53422".
std::string format_address(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
    return "[" + std::string(buf) + "]:" + std::to_string(ntohs(a->sin6_port));
  }
  const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
  ::inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
  return std::string(buf) + ":" + std::to_string(ntohs(a->sin_port));
}

}  // namespace

HttpResponse HttpResponse::json(int status, std::string body) {
  HttpResponse r;
  r.status = status;
  r.content_type = "application/json; charset=utf-8";
  r.body = std::move(body);
  return r;
}

HttpResponse HttpResponse::text(int status, std::string body) {
  HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

bool is_loopback_host(const std::string& host) {
  std::string h = host;
  if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  if (lower(h) == "localhost") return true;
  in_addr a4{};
  if (::inet_pton(AF_INET, h.c_str(), &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
  in6_addr a6{};
  if (::inet_pton(AF_INET6, h.c_str(), &a6) != 1) return false;
  if (IN6_IS_ADDR_LOOPBACK(&a6)) return true;
  return IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127;  // ::ffff:127.x.y.z
}

// ---------------------------------------------------------------- the loop

namespace {

// An accepted socket until the connection table holds it: whatever throws in between
// (memory for the table, the peer's name) closes it instead of leaking it.
class AcceptedFd {
 public:
  explicit AcceptedFd(int fd) : fd_(fd) {}
  ~AcceptedFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  AcceptedFd(const AcceptedFd&) = delete;
  AcceptedFd& operator=(const AcceptedFd&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

// One peer's connection. reading: bytes of the head arrive in `in`; writing:
// out_head + out_body go out; draining: FIN sent, waiting for the peer's FIN (kLingerMs).
struct Conn {
  enum class State { reading, writing, draining };
  int fd = -1;  // -1: closed, removed before the next poll
  State state = State::reading;
  bool over_limit = false;  // accepted beyond max_connections to be answered 503
  std::string peer;
  std::string key;  // the address its limits count under (address_key)
  int64_t accepted = 0;
  std::string in;
  size_t scan = 0;  // head_end's place in `in`
  std::string out_head, out_body;
  size_t sent = 0;     // bytes of out_head + out_body written
  size_t held = 0;     // bytes of out_body counted in Loop::inflight
  size_t drained = 0;  // bytes read and dropped while draining
  // Steady-clock ms: reading, the whole head; writing, the whole answer; draining, the linger.
  int64_t deadline = 0;
};

}  // namespace

struct HttpServer::Loop {
  HttpOptions opt;
  Handler handler;
  bool requires_token = false;
  std::atomic<int64_t>* requests = nullptr;
  std::atomic<bool> stopping{false};
  int listen_fd = -1;
  int wake[2] = {-1, -1};  // stop() writes a byte to wake[1] to end a poll that would wait forever
  std::vector<Conn> conns;
  size_t inflight = 0;  // the sum of conns' held: answer bytes being written
  int64_t accept_paused_until = 0;

  ~Loop() {
    close_all();
    for (int fd : wake)
      if (fd >= 0) ::close(fd);
  }

  void close_all() {
    for (auto& c : conns) close(c);
    conns.clear();
    if (listen_fd >= 0) ::close(listen_fd);
    listen_fd = -1;
  }

  void close(Conn& c) {
    release(c);
    if (c.fd >= 0) ::close(c.fd);
    c.fd = -1;
  }

  void release(Conn& c) {
    inflight -= c.held;
    c.held = 0;
    c.out_head = std::string();
    c.out_body = std::string();
  }

  // The thread's body: nothing escapes it. A failure outside any one connection
  // (memory for the poll set) pauses briefly rather than spinning.
  void run() {
    while (!stopping.load()) {
      try {
        poll_once();
      } catch (...) {
        ::poll(nullptr, 0, 10);
      }
    }
  }

  void poll_once() {
    conns.erase(std::remove_if(conns.begin(), conns.end(), [](const Conn& c) { return c.fd < 0; }),
                conns.end());
    int64_t now = now_ms();
    const bool accepting = now >= accept_paused_until;
    std::vector<pollfd> fds;
    fds.push_back({wake[0], POLLIN, 0});
    fds.push_back({accepting ? listen_fd : -1, POLLIN, 0});
    int64_t wait = accepting ? -1 : accept_paused_until - now;
    for (const auto& c : conns) {
      fds.push_back({c.fd, static_cast<short>(c.state == Conn::State::writing ? POLLOUT : POLLIN), 0});
      const int64_t left = std::max<int64_t>(0, c.deadline - now);
      wait = wait < 0 ? left : std::min(wait, left);
    }
    if (::poll(fds.data(), fds.size(), static_cast<int>(std::min<int64_t>(wait, 60000))) < 0) return;
    if (fds[0].revents != 0) {
      char buf[64];
      while (::read(wake[0], buf, sizeof buf) > 0) {
      }
    }
    if (stopping.load()) return;
    // Connections before new ones: a slot freed in this round is free for them.
    now = now_ms();
    for (size_t i = 0; i < conns.size(); ++i) {
      Conn& c = conns[i];
      try {
        if (fds[i + 2].revents != 0) (c.state == Conn::State::writing ? write_some(c) : read_some(c));
        if (c.fd >= 0 && now >= c.deadline) expire(c);
      } catch (...) {
        close(c);
      }
    }
    if (fds[1].revents != 0) accept_some();
  }

  void accept_some() {
    for (int k = 0; k < kMaxAcceptsPerRound; ++k) {
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      AcceptedFd fd(
          ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (fd.get() < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
        accept_paused_until = now_ms() + kAcceptBackoffMs;  // EMFILE, ENFILE, ENOBUFS, ENOMEM
        return;
      }
      Conn fresh;
      fresh.peer = format_address(ss);
      fresh.key = address_key(host_of(fresh.peer));
      const std::string refusal = admit(fresh.key);
      if (refusal == "close") continue;  // a flood beyond its 503s: closed unanswered
      conns.push_back(std::move(fresh));
      Conn& c = conns.back();
      c.fd = fd.release();
      c.accepted = now_ms();
      c.deadline = c.accepted + opt.idle_timeout_ms;
      if (!refusal.empty()) {
        c.over_limit = true;
        respond(c, error_response(503, refusal), false);
      }
    }
  }

  // Whether a connection of address `key` gets a slot: "" yes (after closing the busiest
  // address's oldest waiting connection when every slot is taken), a message for its 503, or
  // "close" when even the 503s are past their bound.
  std::string admit(const std::string& key) {
    int slots = 0, mine = 0, mine_503 = 0, answering = 0;
    std::map<std::string, int> held;  // address -> slots (a few dozen entries at most)
    for (const auto& c : conns) {
      if (c.fd < 0) continue;
      if (c.over_limit) {
        ++answering;
        mine_503 += c.key == key;
        continue;
      }
      ++slots;
      mine += c.key == key;
      ++held[c.key];
    }
    // Each 503 holds its connection until it is read: a few per address, twice the slots in all.
    const bool no_more_503 = mine_503 >= 4 || slots + answering >= 2 * opt.max_connections;
    if (mine >= opt.max_connections_per_address)
      return no_more_503 ? "close"
                         : "too many connections from " + key + " (at most " +
                               std::to_string(opt.max_connections_per_address) + "); try again";
    if (slots < opt.max_connections) return "";
    // Every slot is taken: the address holding the most gives one up, if it holds more than the
    // newcomer would. Its oldest connection still waiting for a whole request goes.
    auto busiest = std::max_element(held.begin(), held.end(),
                                    [](const auto& a, const auto& b) { return a.second < b.second; });
    if (busiest != held.end() && busiest->second > mine + 1) {
      Conn* oldest = nullptr;
      for (auto& c : conns)
        if (c.fd >= 0 && !c.over_limit && c.key == busiest->first && c.state == Conn::State::reading &&
            (oldest == nullptr || c.accepted < oldest->accepted))
          oldest = &c;
      if (oldest != nullptr) {
        close(*oldest);
        return "";
      }
    }
    return no_more_503 ? "close" : "too many connections; try again";
  }

  void read_some(Conn& c) {
    char buf[16384];
    const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n <= 0) return close(c);  // the peer left (a half-sent head is not answered) or failed
    if (c.state == Conn::State::draining) {
      c.drained += static_cast<size_t>(n);
      if (c.drained > kMaxDrainBytes) close(c);
      return;
    }
    c.in.append(buf, static_cast<size_t>(n));
    const size_t end = head_end(c.in, &c.scan);
    if ((end == 0 && c.in.size() > opt.max_header_bytes) || end > opt.max_header_bytes)
      return respond(c,
                     error_response(431, "the request head is larger than " +
                                             std::to_string(opt.max_header_bytes) + " bytes"),
                     false);
    if (end == 0) return;
    ParsedHead p = parse_head(std::string_view(c.in.data(), end));
    p.request.peer = c.peer;
    // A refused HEAD gets no body either: its request line is read here, not from p.
    answer(c, std::move(p), c.in.compare(0, 5, "HEAD ") == 0);
  }

  // A whole head has arrived: the refusal, the 421, the 401, or what the handler says.
  void answer(Conn& c, ParsedHead p, bool head_only) {
    if (p.status != 0) {
      auto r = error_response(p.status, p.message);
      if (p.status == 405) r.headers.emplace_back("Allow", "GET, HEAD");
      return respond(c, std::move(r), head_only);
    }
    if (!requires_token && opt.check_host && names_other_host(p.request))
      return respond(
          c,
          error_response(421, "this address answers on a loopback name only (127.0.0.1, localhost, [::1])"),
          head_only);
    const auto& pub = opt.public_paths;
    const bool is_public = std::find(pub.begin(), pub.end(), p.request.path) != pub.end();
    if (requires_token && !is_public && !authorized(p.request, opt.token)) {
      auto r = error_response(401,
                              "this dashboard needs the API's token: send 'Authorization: Bearer <token>' or "
                              "add ?token=<token> to the address");
      r.headers.emplace_back("WWW-Authenticate", "Bearer");
      return respond(c, std::move(r), head_only);
    }
    HttpResponse r;
    try {
      r = handler(p.request);
    } catch (const std::exception& e) {
      r = error_response(500, e.what());
    } catch (...) {
      r = error_response(500, "the handler failed with an unknown exception");
    }
    const std::string why = invalid_response(r, opt.max_response_bytes);
    if (!why.empty()) r = error_response(500, why);
    const size_t body = sends_body(r.status, head_only) ? r.body.size() : 0;
    if (body > opt.max_inflight_bytes - std::min(inflight, opt.max_inflight_bytes))
      r = error_response(503, "the server is writing too many answers at once; try again");
    respond(c, std::move(r), head_only);
  }

  // The answer's bytes are held (and counted in inflight) until written or the connection
  // is closed; they have one deadline: a slow reader is cut off, however steadily it reads.
  void respond(Conn& c, HttpResponse r, bool head_only) {
    c.in = std::string();  // frees the head's bytes while the answer is written
    c.out_head = response_head(r);
    // HEAD: the head has the length; the body is dropped here, not when the head is written.
    if (sends_body(r.status, head_only)) c.out_body = std::move(r.body);
    r.body = std::string();
    c.held = c.out_body.size();
    inflight += c.held;
    c.sent = 0;
    c.state = Conn::State::writing;
    const auto send_ms = static_cast<int64_t>(c.out_body.size() * 1000 / opt.min_send_rate);
    c.deadline = now_ms() + std::max<int64_t>(opt.idle_timeout_ms, send_ms);
    requests->fetch_add(1);
    write_some(c);
  }

  void write_some(Conn& c) {
    const size_t total = c.out_head.size() + c.out_body.size();
    while (c.sent < total) {
      iovec iov[2];
      int n_iov = 0;
      if (c.sent < c.out_head.size()) iov[n_iov++] = {c.out_head.data() + c.sent, c.out_head.size() - c.sent};
      const size_t body_from = c.sent > c.out_head.size() ? c.sent - c.out_head.size() : 0;
      if (body_from < c.out_body.size())
        iov[n_iov++] = {c.out_body.data() + body_from, c.out_body.size() - body_from};
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<size_t>(n_iov);
      const ssize_t n = ::sendmsg(c.fd, &msg, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n < 0) return close(c);  // EPIPE, ECONNRESET: the peer is gone
      c.sent += static_cast<size_t>(n);
    }
    release(c);
    ::shutdown(c.fd, SHUT_WR);
    c.state = Conn::State::draining;
    c.deadline = now_ms() + std::min(opt.idle_timeout_ms, kLingerMs);
  }

  void expire(Conn& c) {
    if (c.state == Conn::State::reading && !c.in.empty())
      return respond(c, error_response(408, "the request head did not arrive in time"), false);
    if (c.state == Conn::State::writing) {
      // An RST, so that the kernel drops the answer's unsent bytes too, rather than
      // keeping them for a peer that has shown it will not take them.
      const linger reset{1, 0};
      ::setsockopt(c.fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
    }
    close(c);  // silent, a peer that did not take its answer in time, or a drain that is over
  }
};

// ---------------------------------------------------------------- HttpServer

HttpServer::HttpServer(HttpOptions options, Handler handler) : loop_(std::make_unique<Loop>()) {
  Loop& l = *loop_;
  l.opt = std::move(options);
  l.handler = std::move(handler);
  l.requests = &requests_;
  TROUPE_CHECK(l.handler != nullptr, "the dashboard needs a handler");
  TROUPE_CHECK(l.opt.max_connections >= 1 && l.opt.max_connections_per_address >= 1 &&
                   l.opt.idle_timeout_ms >= 1 && l.opt.max_header_bytes >= 16 && l.opt.min_send_rate >= 1,
               "bad dashboard limits");
  const Endpoint ep = parse_listen(l.opt.listen);
  requires_token_ = l.requires_token = !is_loopback_host(ep.host);
  require(!requires_token_ || !l.opt.token.empty(), "the dashboard address ", l.opt.listen,
          " is not a loopback address: it needs a token (the API's token) that every request must carry; "
          "give one, or listen on 127.0.0.1");

  const int family = ep.addr.ss_family;
  l.listen_fd = ::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  const int one = 1;
  bool ok = l.listen_fd >= 0 && ::setsockopt(l.listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0;
  // [::] means IPv6 only, as it reads; IPv4 has its own 0.0.0.0.
  if (ok && family == AF_INET6)
    ok = ::setsockopt(l.listen_fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one) == 0;
  ok = ok && ::bind(l.listen_fd, reinterpret_cast<const sockaddr*>(&ep.addr), ep.len) == 0 &&
       ::listen(l.listen_fd, SOMAXCONN) == 0;
  require(ok, "cannot listen on the dashboard address ", l.opt.listen, ": ", std::strerror(errno));
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  TROUPE_CHECK(::getsockname(l.listen_fd, reinterpret_cast<sockaddr*>(&bound), &len) == 0,
               std::strerror(errno));
  address_ = format_address(bound);
  TROUPE_CHECK(::pipe2(l.wake, O_NONBLOCK | O_CLOEXEC) == 0,
               "cannot make the dashboard's wake pipe: ", std::strerror(errno));
  thread_ = std::thread([&l] { l.run(); });
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::stop() {
  loop_->stopping.store(true);
  const char byte = 1;
  (void)!::write(loop_->wake[1], &byte, 1);  // a full pipe has woken the loop already
  // From the handler, on the server thread: the loop ends when it returns; the destructor joins.
  if (std::this_thread::get_id() == thread_.get_id()) return;
  if (joined_.exchange(true)) return;
  if (thread_.joinable()) thread_.join();
  loop_->close_all();
}

}  // namespace troupe::coord

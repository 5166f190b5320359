// The dashboard's HTTP transport (http_server.hpp) on cpp-httplib. The library's Server
// reads each request's line and headers, calls the handlers below and writes the answer.
// What it cannot keep by itself is kept here, around it and through the hooks it offers:
//
//   accept_loop                 accepts, and decides each connection's admission to a slot
//                               (ConnectionTable) there, in the order of accept; hands it to
//                               ConnectionQueue, a thread per connection;
//   serve                       the library's process_request over a DeadlineStream, then
//                               the close with its drain;
//   set_pre_routing_handler     every request: the checks (http_checks.hpp), the Host, the
//                               token, the caller's handler, the bytes in flight;
//   set_post_routing_handler    every answer, the library's refusals too: the security
//                               headers, and the time its body has to go out;
//   set_error_handler           the library's own refusals (a malformed line) as JSON, and
//                               a head that was too large or late as 431 / 408.
//
// The listening socket and its accept loop are ours, not the library's: its backlog,
// close-on-exec and IPv6-only flags, the order of admission, and an accept(2) that fails for
// want of descriptors or memory retried rather than ending the loop.
#include "coordinator/http_server.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>

#include "coordinator/http_checks.hpp"
#include "coordinator/http_guard.hpp"
#include "core/error.hpp"
#include "core/net_address.hpp"
#include "core/text.hpp"

namespace troupe::coord {
using namespace http;

namespace {

// After the answer, what the peer still sends is read and dropped this long at most.
constexpr int kLingerMs = 1000;
// accept(2) out of descriptors or memory: tried again after this long.
constexpr auto kAcceptRetry = std::chrono::milliseconds(10);

// The connection this thread serves: the library's handlers see only its Request and
// Response, and call them on the thread that runs process_and_close_socket.
thread_local Connection* t_conn = nullptr;

// The "error" name of the JSON body of each refusal the transport makes itself.
const char* error_name(int status) {
  switch (status) {
    case 400:
      return "bad_request";
    case 401:
      return "unauthorized";
    case 405:
      return "method_not_allowed";
    case 408:
      return "timeout";
    case 413:
      return "body_not_accepted";
    case 414:
      return "target_too_long";
    case 416:
      return "bad_range";
    case 421:
      return "wrong_host";
    case 431:
      return "headers_too_large";
    case 503:
      return "unavailable";
    default:
      return "internal";
  }
}

// {"error":"bad_request","message":"..."}.
std::string error_json(int status, const std::string& message) {
  return json_text({{"error", error_name(status)}, {"message", message}});
}

HttpResponse error_response(int status, const std::string& message) {
  return HttpResponse::json(status, error_json(status, message));
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

// Headers the transport writes itself: the handler's copies are dropped.
bool owned_header(const std::string& name) {
  const std::string n = lower(name);
  return n == "content-length" || n == "content-type" || n == "connection" || n == "transfer-encoding" ||
         n == "x-content-type-options" || n == "referrer-policy" || n == "keep-alive" ||
         n == "content-encoding" || n == "content-range" || n == "accept-ranges";
}

bool authorized(const HttpRequest& r, const std::string& token) {
  const std::string auth = r.header("authorization");
  // The library percent-decodes header values, so a token with a '%' escape in it arrives
  // decoded. Every comparison is made, whichever matches, so the time taken says nothing.
  const bool bearer = auth.size() > 7 && lower(auth.substr(0, 7)) == "bearer ";
  const std::string given = bearer ? std::string(trim(auth.substr(7))) : "";
  const bool as_sent = constant_time_equal(given, token);
  const bool decoded = constant_time_equal(given, percent_decode(token));
  const bool by_query = constant_time_equal(r.query_param("token"), token);
  return (bearer && (as_sent || decoded)) || by_query;
}

// The headers the library adds to what the peer sent (its own reading of the socket).
bool library_header(const std::string& name) {
  const std::string n = lower(name);
  return n == "remote_addr" || n == "remote_port" || n == "local_addr" || n == "local_port";
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

std::string HttpRequest::query_param(const std::string& key) const {
  for (const auto& [k, v] : params)
    if (k == key) return v;
  return "";
}

std::string HttpRequest::header(const std::string& name) const {
  const std::string n = lower(name);
  for (const auto& [k, v] : headers)
    if (k == n) return v;
  return "";
}

// ---------------------------------------------------------------- the server

struct HttpServer::Impl : httplib::Server {
  HttpOptions opt;
  HttpServer::Handler handler;
  bool requires_token = false;
  std::atomic<int64_t>* requests;
  ConnectionTable table;
  std::atomic<bool> stopping{false};
  ConnectionQueue queue;  // declared last: destroyed first, joining the threads that use the rest

  Impl(HttpOptions o, HttpServer::Handler h, std::atomic<int64_t>* counter)
      : opt(std::move(o)),
        handler(std::move(h)),
        requests(counter),
        table(opt.max_connections, opt.max_connections_per_address),
        queue(2 * static_cast<size_t>(opt.max_connections) + 8) {
    set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      answer(req, res);
      return HandlerResponse::Handled;
    });
    set_post_routing_handler(
        [this](const httplib::Request& req, httplib::Response& res) { finish(req, res); });
    set_error_handler(HandlerWithResponse(
        [this](const httplib::Request&, httplib::Response& res) { return refusal(res); }));
    set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
      if (t_conn != nullptr) t_conn->decided = true;
      res.status = 500;
      res.set_content(error_json(500, "the dashboard failed while answering"),
                      "application/json; charset=utf-8");
    });
  }

  // Binds `ep` and listens. accept_loop waits in accept(2) until the socket is shut down.
  int listen_on(const Endpoint& ep) {
    const int fd = ::socket(ep.addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    bool ok = fd >= 0 && ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0;
    // [::] means IPv6 only, as it reads; IPv4 has its own 0.0.0.0.
    if (ok && ep.addr.ss_family == AF_INET6)
      ok = ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one) == 0;
    ok = ok && ::bind(fd, reinterpret_cast<const sockaddr*>(&ep.addr), ep.len) == 0 &&
         ::listen(fd, SOMAXCONN) == 0;
    const int err = errno;
    if (!ok && fd >= 0) ::close(fd);
    require(ok, "cannot listen on the dashboard address ", opt.listen, ": ", std::strerror(err));
    return fd;
  }

  // Until the listening socket is shut down: each connection admitted here, in the order of
  // accept, then served on a thread of the queue (or closed at once when dropped).
  void accept_loop(int listen_fd) {
    while (!stopping.load()) {
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      const int sock = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_CLOEXEC);
      if (sock < 0) {
        if (stopping.load()) break;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          std::this_thread::sleep_for(kAcceptRetry);
          continue;
        }
        if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED || errno == EPROTO || errno == EPERM ||
            errno == ENETDOWN || errno == EHOSTUNREACH || errno == ENETUNREACH)
          continue;
        break;  // the socket itself is gone (shut down or closed)
      }
      try {
        std::string peer = format_address(ss);
        const Admission a = table.admit(address_key(host_of(peer)), sock);
        if (a.kind == Admission::drop) {
          ::close(sock);
          continue;
        }
        queue.enqueue([this, sock, a, peer = std::move(peer)] { serve(sock, a, peer); });
      } catch (...) {
        ::close(sock);  // out of memory for one connection: the next is tried
      }
    }
  }

  // One admitted connection, on its own thread: refused or served, then closed.
  void serve(int sock, const Admission& a, const std::string& peer) {
    Connection c;
    c.fd = sock;
    c.peer = peer;
    c.answered = requests;
    c.head_deadline = steady_ms() + opt.idle_timeout_ms;
    c.head_limit = opt.max_header_bytes;
    c.answer_ms = opt.idle_timeout_ms;
    try {
      if (a.kind == Admission::refuse) {
        write_refusal(c, 503, error_json(503, a.message));
      } else {
        t_conn = &c;
        DeadlineStream strm(c);
        bool closed = false;
        process_request(strm, true, closed, [&](httplib::Request& req) {
          // The whole head is in: no longer a connection to give up for a newcomer. The body
          // goes out as it is and whole: no compression, no ranges, no 100 Continue.
          table.waiting_done(a.id);
          req.headers.erase("Accept-Encoding");
          req.headers.erase("Expect");
          req.ranges.clear();
        });
        t_conn = nullptr;
        // The library wrote nothing when the request line itself was too long or late.
        if (!c.wrote && !c.peer_gone && !c.cut_off) {
          if (c.too_large)
            write_refusal(c, 431, error_json(431, too_large_message()));
          else if (c.timed_out && c.head_bytes > 0)
            write_refusal(c, 408, error_json(408, "the request head did not arrive in time"));
        }
      }
    } catch (...) {
      t_conn = nullptr;
    }
    table.give_back(c.held);
    try {
      wind_down(c, std::min(opt.idle_timeout_ms, kLingerMs));
    } catch (...) {
    }
    table.release(a.id);
    ::close(sock);
  }

  std::string too_large_message() const {
    return "the request head is larger than " + std::to_string(opt.max_header_bytes) + " bytes";
  }

  // The pre-routing handler: every request the library has read whole gets its answer here.
  void answer(const httplib::Request& req, httplib::Response& res) {
    Connection& c = *t_conn;
    c.decided = true;
    HttpResponse r = decide(req, c);
    const size_t body = req.method == "HEAD" ? 0 : r.body.size();
    if (body > 0 && !table.reserve(body, opt.max_inflight_bytes))
      r = error_response(503, "the server is writing too many answers at once; try again");
    else
      c.held = body;
    res.status = r.status;
    for (const auto& [name, value] : r.headers)
      if (!owned_header(name)) res.set_header(name, value);
    res.set_header("Content-Type", r.content_type);
    res.body = std::move(r.body);
  }

  // What a request gets: a refusal, or the handler's answer.
  HttpResponse decide(const httplib::Request& req, const Connection& c) {
    if (Refusal f = check_target(req.target)) return error_response(f.status, f.message);
    if (req.method != "GET" && req.method != "HEAD") {
      auto r = error_response(405, "this server answers GET and HEAD only");
      r.headers.emplace_back("Allow", "GET, HEAD");
      return r;
    }
    HttpRequest r;
    r.method = req.method;
    r.path = req.path;
    const size_t q = req.target.find('?');
    if (q != std::string::npos) r.query = req.target.substr(q + 1);
    r.params.assign(req.params.begin(), req.params.end());
    r.peer = c.peer;
    for (const auto& [name, value] : req.headers)
      if (!library_header(name)) r.headers.emplace_back(name, std::string(trim(value)));
    if (Refusal f = check_headers(r.headers, req.version == "HTTP/1.1"))
      return error_response(f.status, f.message);
    for (auto& h : r.headers) h.first = lower(h.first);

    // Where no token is asked: a page of another site that points its own name at 127.0.0.1
    // (DNS rebinding) names that site in its Host. HTTP/1.0 may leave the Host out.
    const bool has_host =
        std::any_of(r.headers.begin(), r.headers.end(), [](const auto& h) { return h.first == "host"; });
    if (!requires_token && opt.check_host && has_host && !is_loopback_host(host_name(r.header("host"))))
      return error_response(421,
                            "this address answers on a loopback name only (127.0.0.1, localhost, [::1])");
    const auto& pub = opt.public_paths;
    const bool is_public = std::find(pub.begin(), pub.end(), r.path) != pub.end();
    if (requires_token && !is_public && !authorized(r, opt.token)) {
      auto refused =
          error_response(401,
                         "this dashboard needs the API's token: send 'Authorization: Bearer <token>' or "
                         "add ?token=<token> to the address");
      refused.headers.emplace_back("WWW-Authenticate", "Bearer");
      return refused;
    }
    HttpResponse out;
    try {
      out = handler(r);
    } catch (const std::exception& e) {
      return error_response(500, e.what());
    } catch (...) {
      return error_response(500, "the handler failed with an unknown exception");
    }
    const std::string why = invalid_response(out, opt.max_response_bytes);
    return why.empty() ? out : error_response(500, why);
  }

  // The post-routing handler, for every answer: the security headers, and the time its body
  // has to go out, max(idle_timeout_ms, its size at min_send_rate).
  void finish(const httplib::Request& req, httplib::Response& res) {
    for (const char* name : {"Accept-Ranges", "Keep-Alive", "X-Content-Type-Options", "Referrer-Policy"})
      res.headers.erase(name);
    res.set_header("X-Content-Type-Options", "nosniff");
    res.set_header("Referrer-Policy", "no-referrer");
    if (!res.has_header("Cache-Control")) res.set_header("Cache-Control", "no-store");
    if (t_conn == nullptr) return;
    const size_t body = req.method == "HEAD" ? 0 : res.body.size();
    t_conn->answer_ms =
        std::max<int64_t>(opt.idle_timeout_ms, static_cast<int64_t>(body * 1000 / opt.min_send_rate));
  }

  // The error handler: the library's own refusals (it could not read the request) as JSON;
  // the answers decided above pass through as they are.
  HandlerResponse refusal(httplib::Response& res) {
    if (t_conn == nullptr || t_conn->decided) return HandlerResponse::Unhandled;
    std::string message =
        "the request line or a header line is malformed: expected 'METHOD /path HTTP/1.x' "
        "and 'Name: value' lines, each ending in CRLF";
    if (t_conn->too_large) {
      res.status = 431;
      message = too_large_message();
    } else if (t_conn->timed_out) {
      res.status = 408;
      message = "the request head did not arrive in time";
    } else if (res.status == 414) {
      message = "the request line is longer than 8192 bytes";
    } else if (res.status == 416) {
      message = "a bad Range header";
    } else if (res.status != 400) {
      message = "the request could not be read";
    }
    res.headers.clear();
    res.set_content(error_json(res.status, message), "application/json; charset=utf-8");
    return HandlerResponse::Handled;
  }
};

HttpServer::HttpServer(HttpOptions options, Handler handler)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(handler), &requests_)) {
  Impl& s = *impl_;
  TROUPE_CHECK(s.handler != nullptr, "the dashboard needs a handler");
  TROUPE_CHECK(s.opt.max_connections >= 1 && s.opt.max_connections_per_address >= 1 &&
                   s.opt.idle_timeout_ms >= 1 && s.opt.max_header_bytes >= 16 && s.opt.min_send_rate >= 1,
               "bad dashboard limits");
  const Endpoint ep = parse_listen(s.opt.listen);
  requires_token_ = s.requires_token = !is_loopback_host(ep.host);
  require(!requires_token_ || !s.opt.token.empty(), "the dashboard address ", s.opt.listen,
          " is not a loopback address: it needs a token (the API's token) that every request must carry; "
          "give one, or listen on 127.0.0.1");
  listen_fd_ = s.listen_on(ep);
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  TROUPE_CHECK(::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len) == 0,
               std::strerror(errno));
  address_ = format_address(bound);
  thread_ = std::thread([this] { impl_->accept_loop(listen_fd_); });
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::stop() {
  if (!stopped_.exchange(true)) {
    impl_->stopping.store(true);
    ::shutdown(listen_fd_, SHUT_RDWR);  // accept(2) returns: the loop ends
  }
  impl_->table.stop_all();
  // From a handler, on a connection's thread: the owner joins when it stops or destroys.
  if (ConnectionQueue::on_queue_thread()) return;
  if (joined_.exchange(true)) return;
  if (thread_.joinable()) thread_.join();
  ::close(listen_fd_);
  impl_->queue.shutdown();  // each connection's thread, once its answer is done
}

}  // namespace troupe::coord

// The dashboard's HTTP/1.1 transport: cpp-httplib (Debian's libcpp-httplib) reads each
// request's line and headers and writes the answer; this layer (http_guard.hpp,
// http_checks.hpp) keeps every peer bounded around it. Read-only: GET and HEAD, no
// request bodies, one answer per connection (Connection: close). The routes are the
// caller's Handler, called on the connection's thread (handlers run concurrently, one
// per connection at most).
//
// Everything a peer sends is hostile. Every connection is bounded in bytes
// (max_header_bytes), in time (the whole head within idle_timeout_ms from accept; one
// deadline for the whole answer) and in number (max_connections), and the answers being
// written are bounded together (max_inflight_bytes); a peer that sends half a request,
// a byte at a time, or reads its answer slowly or never, holds one slot for a bounded
// time and delays nobody else. Malformed input, a wrong Host and a missing token are
// answered 4xx and never reach the handler.
//
// The slots are shared fairly between addresses (core/net_address.hpp: an IPv4 address or
// an IPv6 /64). One address holds at most max_connections_per_address of them; beyond, it
// is answered 503 (a few such answers at a time, then closed unanswered). When every slot is
// taken, a newcomer whose address holds fewer than the busiest address is let in by closing
// that address's oldest connection still waiting for its request: a client that keeps slow
// connections open, however many addresses it uses, cannot keep another one out.
//
// A connection's life (each on a thread of its own, taken in the order of accept):
//
//   accept -> admitted? --no--> 503, or closed unanswered past a few 503s
//                |
//               yes -> the library reads the head --(whole, valid)--> handler --+
//                        |                                                       +--> answer -> FIN, drain ->
//                        closed
//                        +--(malformed, too large, timed out, wrong Host,        |      |
//                            no token)--> 4xx ---------------------------------+      +--(past its
//                            deadline)--> reset
//
//   drain: what the peer still sends is read and dropped for a moment, so that the close is
//   no RST, which could make the peer lose the answer unread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace troupe::coord {

struct HttpRequest {
  std::string method;  // "GET" or "HEAD" (others never reach the handler)
  std::string path;    // percent-decoded path, always starts with '/', no query ("/api/jobs/j-1")
  std::string query;   // raw query string after '?', "" if none ("after=12&token=abc")
  // The query's parameters as the library decodes them ('+' = space), in no set order.
  std::vector<std::pair<std::string, std::string>> params;
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased, values trimmed
  std::string peer;                                          // "127.0.0.1:53422"

  // The value of query parameter `key` (percent-decoded, '+' = space), or "" when absent.
  // "a=1&b=x%20y+z&c" -> query_param("b") == "x y z", query_param("c") == "". A key given
  // twice has one of its values.
  std::string query_param(const std::string& key) const;
  // The value of header `name` (lower-case), or "" when absent.
  std::string header(const std::string& name) const;
};

struct HttpResponse {
  int status = 200;  // 200-599; anything else goes out as a 500
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  // Extra headers. The server owns the framing ones (Content-Length, Connection,
  // Transfer-Encoding, Content-Type: use content_type) and the security ones
  // (X-Content-Type-Options, Referrer-Policy): the handler's copies are dropped.
  // A Cache-Control here replaces the default "no-store".
  std::vector<std::pair<std::string, std::string>> headers;

  static HttpResponse json(int status, std::string body);  // application/json; charset=utf-8
  static HttpResponse text(int status, std::string body);
};

struct HttpOptions {
  // HOST:PORT, port 0 = any free port; HOST an IPv4 literal, "localhost", or "[::1]"-style IPv6.
  std::string listen = "127.0.0.1:0";
  std::string token;  // required on every request when the bound address is not loopback
  // Exact decoded paths answered without the token ("/", "/app.js"): what a browser loads
  // through <script src> or <link href> cannot carry an Authorization header. They must
  // hold no data.
  std::vector<std::string> public_paths;
  // Where no token is asked (a loopback address), a request whose Host is not a loopback
  // name is answered 421: a page of another site that points its own name at 127.0.0.1
  // (DNS rebinding) names that site in its Host.
  bool check_host = true;
  // Request line + headers; more -> 431, connection closed. (The library answers a request
  // line over 8 KiB 414 and ignores a header line over 8 KiB: its limits, compiled in.)
  size_t max_header_bytes = 16 << 10;
  int max_connections = 64;              // beyond: accepted, answered 503, closed
  int max_connections_per_address = 16;  // one address's share (503 beyond)
  // Threads: one per connection with a slot or a 503 being written, 2 * max_connections + 8
  // at most.
  // A connection that has not sent a whole request this long after accept is closed (408
  // if it sent bytes). An answer has max(this, its body at min_send_rate) from its first
  // byte to be taken whole, or the connection is reset: a peer reading a byte now and
  // then does not hold its answer's memory for ever.
  int idle_timeout_ms = 10000;
  size_t min_send_rate = 256 << 10;      // bytes per second; a 64 MiB body has 256 s
  size_t max_response_bytes = 64 << 20;  // a handler body larger than this -> 500
  // The bodies of answers being written, all connections together; a handler's answer
  // that would go beyond it is answered 503 instead.
  size_t max_inflight_bytes = 256 << 20;
};

// True for 127.0.0.0/8, ::1 (bracketed or not) and localhost.
bool is_loopback_host(const std::string& host);

class HttpServer {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;

  // Binds and starts serving (its accept loop on a thread of its own). Throws
  // troupe::Error when HOST:PORT does not parse, when a non-loopback address has no token,
  // or when it cannot bind (the message names the address and strerror).
  HttpServer(HttpOptions options, Handler handler);
  ~HttpServer();  // stops and joins
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // The bound "host:port" with the real port ("127.0.0.1:43117", "[::1]:43117").
  const std::string& address() const { return address_; }
  bool requires_token() const { return requires_token_; }
  // Shuts every connection down, closes the listening socket, joins the threads.
  // Idempotent; from inside the handler it only asks the server to end.
  void stop();
  // Requests answered, any status (a 400, a 503 to a connection over the limit, a 408):
  // answers whose first byte went out.
  int64_t requests() const { return requests_.load(); }

 private:
  struct Impl;  // the library's server and the guard around it (http_server.cpp)
  std::unique_ptr<Impl> impl_;
  std::string address_;
  bool requires_token_ = false;
  int listen_fd_ = -1;
  std::atomic<bool> stopped_{false}, joined_{false};
  std::atomic<int64_t> requests_{0};
  std::thread thread_;
};

}  // namespace troupe::coord

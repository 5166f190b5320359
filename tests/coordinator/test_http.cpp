// The dashboard's HTTP server against a tiny blocking socket client: what a
// well-formed request gets, what a hostile one gets (and that the handler never
// sees it), the limits, the token, and the request parser on its own.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>

#include "coordinator/http_parse.hpp"
#include "coordinator/http_server.hpp"
#include "core/error.hpp"

using namespace troupe::coord;

namespace {

// ---------------------------------------------------------------- the client

// A connected blocking socket to "host:port" (0.0.0.0 reached as 127.0.0.1), or -1.
int connect_to(const std::string& address) {
  const size_t colon = address.rfind(':');
  std::string host = address.substr(0, colon);
  const int port = std::stoi(address.substr(colon + 1));
  sockaddr_storage ss{};
  socklen_t len = 0;
  if (host.front() == '[') {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), &a->sin6_addr);
    len = sizeof *a;
  } else {
    if (host == "0.0.0.0") host = "127.0.0.1";
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    a->sin_family = AF_INET;
    a->sin_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET, host.c_str(), &a->sin_addr);
    len = sizeof *a;
  }
  const int fd = ::socket(ss.ss_family, SOCK_STREAM, 0);
  // A safety net so that a server bug fails the test instead of hanging it; no test relies on it.
  timeval tv{30, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void send_all(int fd, const std::string& bytes) {
  for (size_t at = 0; at < bytes.size();) {
    const ssize_t n = ::send(fd, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
    if (n <= 0) return;  // the server may close early (431); what it answered is still read
    at += static_cast<size_t>(n);
  }
}

struct Reply {
  int status = 0;                              // 0: the server closed without answering
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
  bool has(const std::string& name) const { return headers.count(name) != 0; }
  std::string header(const std::string& name) const { return has(name) ? headers.at(name) : ""; }
};

// Reads to the server's close and splits the answer.
Reply read_reply(int fd) {
  std::string raw;
  char buf[65536];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) raw.append(buf, static_cast<size_t>(n));
  ::close(fd);
  Reply r;
  const size_t end = raw.find("\r\n\r\n");
  if (raw.compare(0, 9, "HTTP/1.1 ") != 0 || end == std::string::npos) return r;
  r.status = std::stoi(raw.substr(9, 3));
  for (size_t at = raw.find("\r\n") + 2; at < end;) {
    const size_t nl = raw.find("\r\n", at);
    const std::string line = raw.substr(at, nl - at);
    const size_t colon = line.find(':');
    r.headers[http::lower(line.substr(0, colon))] = line.substr(colon + 2);
    at = nl + 2;
  }
  r.body = raw.substr(end + 4);
  return r;
}

Reply round_trip(const std::string& address, const std::string& bytes) {
  const int fd = connect_to(address);
  REQUIRE(fd >= 0);
  send_all(fd, bytes);
  return read_reply(fd);
}

Reply get(const std::string& address, const std::string& target, const std::string& headers = "",
          const std::string& method = "GET") {
  return round_trip(address, method + " " + target + " HTTP/1.1\r\nHost: test\r\n" + headers + "\r\n");
}

// ---------------------------------------------------------------- a server with routes

// A server whose handler answers a few test routes and counts its calls.
struct Served {
  std::atomic<int> calls{0};
  std::mutex mu;
  HttpRequest last;  // the last request the handler saw
  HttpServer server;

  explicit Served(HttpOptions opt = {})
      : server(std::move(opt), [this](const HttpRequest& r) { return route(r); }) {}
  std::string addr() const { return server.address(); }
  HttpRequest seen() {
    std::lock_guard<std::mutex> lock(mu);
    return last;
  }

  HttpResponse route(const HttpRequest& r) {
    ++calls;
    {
      std::lock_guard<std::mutex> lock(mu);
      last = r;
    }
    if (r.path == "/") {
      auto resp = HttpResponse::text(200, "hello");
      resp.headers.emplace_back("X-Route", "root");
      return resp;
    }
    if (r.path == "/cached") {
      auto resp = HttpResponse::json(200, "{}");
      resp.headers.emplace_back("Cache-Control", "max-age=60");
      resp.headers.emplace_back("Content-Length", "999");  // the server's framing wins
      return resp;
    }
    if (r.path == "/throw") throw std::runtime_error("the coordinator did not answer");
    if (r.path == "/split") {
      auto resp = HttpResponse::text(200, "x");
      resp.headers.emplace_back("X-Split", "a\r\nSet-Cookie: evil=1");
      return resp;
    }
    if (r.path == "/big") {
      std::string body(8 << 20, '\0');
      for (size_t i = 0; i < body.size(); ++i) body[i] = static_cast<char>('a' + (i * 7 + i / 4096) % 26);
      return HttpResponse::text(200, std::move(body));
    }
    return HttpResponse::json(404, R"({"error":"not_found"})");
  }
};

HttpOptions with(std::string listen, std::string token = "") {
  HttpOptions o;
  o.listen = std::move(listen);
  o.token = std::move(token);
  return o;
}

}  // namespace

// ---------------------------------------------------------------- well-formed requests

TEST_CASE("http GET answers the handler's status, body and content type, with the security headers",
          "[http]") {
  Served s;
  const Reply r = get(s.addr(), "/");
  CHECK(r.status == 200);
  CHECK(r.body == "hello");
  CHECK(r.header("content-type") == "text/plain; charset=utf-8");
  CHECK(r.header("content-length") == "5");
  CHECK(r.header("connection") == "close");
  CHECK(r.header("cache-control") == "no-store");
  CHECK(r.header("x-content-type-options") == "nosniff");
  CHECK(r.header("referrer-policy") == "no-referrer");
  CHECK(r.header("x-route") == "root");
  CHECK(s.server.requests() == 1);

  // The handler may set its own caching, never the framing.
  const Reply c = get(s.addr(), "/cached");
  CHECK(c.header("content-type") == "application/json; charset=utf-8");
  CHECK(c.header("cache-control") == "max-age=60");
  CHECK(c.header("content-length") == "2");
  CHECK(c.body == "{}");

  // 404 from the handler passes through; HEAD has GET's headers and no body.
  const Reply missing = get(s.addr(), "/nothing/here");
  CHECK(missing.status == 404);
  CHECK(missing.body == R"({"error":"not_found"})");
  const Reply head = get(s.addr(), "/", "", "HEAD");
  CHECK(head.status == 200);
  CHECK(head.header("content-length") == "5");
  CHECK(head.body.empty());
  CHECK(s.seen().method == "HEAD");
  CHECK(s.server.requests() == 4);
}

TEST_CASE("http the handler sees the decoded path, the raw query and trimmed lower-case headers", "[http]") {
  Served s;
  const Reply r = get(s.addr(), "/api/jobs/j%2D1%20x?after=12&name=a+b%26c&flag&token=abc",
                      "X-Thing: \t spaced value  \r\n");
  CHECK(r.status == 404);
  const HttpRequest q = s.seen();
  CHECK(q.method == "GET");
  CHECK(q.path == "/api/jobs/j-1 x");
  CHECK(q.query == "after=12&name=a+b%26c&flag&token=abc");
  CHECK(q.query_param("after") == "12");
  CHECK(q.query_param("name") == "a b&c");
  CHECK(q.query_param("flag") == "");
  CHECK(q.query_param("absent") == "");
  CHECK(q.header("x-thing") == "spaced value");
  CHECK(q.header("X-Thing") == "spaced value");
  CHECK(q.header("host") == "test");
  CHECK(q.header("absent") == "");
  CHECK(q.peer.rfind("127.0.0.1:", 0) == 0);

  // HTTP/1.0, bare LF line ends, and names that only look like a climb.
  CHECK(round_trip(s.addr(), "GET / HTTP/1.0\nHost: a\n\n").status == 200);
  CHECK(get(s.addr(), "/a..b/..c/x..").status == 404);
  CHECK(s.seen().path == "/a..b/..c/x..");
}

TEST_CASE("http a large response arrives whole", "[http]") {
  Served s;
  const Reply r = get(s.addr(), "/big");
  REQUIRE(r.status == 200);
  CHECK(r.header("content-length") == std::to_string(8 << 20));
  REQUIRE(r.body.size() == (8u << 20));
  bool same = true;
  for (size_t i = 0; i < r.body.size() && same; ++i)
    same = r.body[i] == static_cast<char>('a' + (i * 7 + i / 4096) % 26);
  CHECK(same);
}

// ---------------------------------------------------------------- hostile requests

TEST_CASE("http POST is 405 with Allow, a request body is refused, neither reaches the handler", "[http]") {
  Served s;
  const Reply post = get(s.addr(), "/", "", "POST");
  CHECK(post.status == 405);
  CHECK(post.header("allow") == "GET, HEAD");
  CHECK(get(s.addr(), "/", "", "DELETE").status == 405);
  CHECK(get(s.addr(), "/", "Content-Length: 5\r\n").status == 413);
  CHECK(round_trip(s.addr(), "GET / HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello").status == 413);
  CHECK(get(s.addr(), "/", "Transfer-Encoding: chunked\r\n").status == 413);
  CHECK(get(s.addr(), "/", "Content-Length: abc\r\n").status == 400);
  CHECK(get(s.addr(), "/", "Content-Length: 0\r\nContent-Length: 1\r\n").status == 400);
  CHECK(s.calls == 0);
  CHECK(get(s.addr(), "/", "Content-Length: 0\r\n").status == 200);
  CHECK(s.calls == 1);
}

TEST_CASE("http malformed requests, traversal and NUL are 400 and never reach the handler", "[http]") {
  Served s;
  std::string many;
  for (int i = 0; i < 101; ++i) many += "X-" + std::to_string(i) + ": v\r\n";
  const std::vector<std::string> bad = {
      "GARBAGE\r\n\r\n",
      "\r\n",
      "GET /\r\n\r\n",
      "GET / HTTP/2.0\r\n\r\n",
      "GET / FTP/1.1\r\n\r\n",
      "GET  / HTTP/1.1\r\n\r\n",
      "GET / HTTP/1.1 \r\n\r\n",
      "G(T / HTTP/1.1\r\n\r\n",
      "GET http://example.com/ HTTP/1.1\r\n\r\n",
      "GET * HTTP/1.1\r\n\r\n",
      "GET /a\x01z HTTP/1.1\r\n\r\n",
      "GET /caf\xc3\xa9 HTTP/1.1\r\n\r\n",
      "GET /a#frag HTTP/1.1\r\n\r\n",
      "GET /a%zz HTTP/1.1\r\n\r\n",
      "GET /a%4 HTTP/1.1\r\n\r\n",
      "GET /a%00b HTTP/1.1\r\n\r\n",
      "GET /a%0d%0ab HTTP/1.1\r\n\r\n",
      "GET /%ff HTTP/1.1\r\n\r\n",
      "GET /?x=%00 HTTP/1.1\r\n\r\n",
      "GET /?x=%g0 HTTP/1.1\r\n\r\n",
      "GET /a/../etc/passwd HTTP/1.1\r\n\r\n",
      "GET /a/.. HTTP/1.1\r\n\r\n",
      "GET /.. HTTP/1.1\r\n\r\n",
      "GET /a/%2e%2e/b HTTP/1.1\r\n\r\n",
      "GET /a%2f..%2fb HTTP/1.1\r\n\r\n",
      "GET / HTTP/1.1\r\nNoColon\r\n\r\n",
      "GET / HTTP/1.1\r\nX: a\r\n folded\r\n\r\n",
      "GET / HTTP/1.1\r\n\tX: a\r\n\r\n",
      "GET / HTTP/1.1\r\nBad Name: v\r\n\r\n",
      "GET / HTTP/1.1\r\n: v\r\n\r\n",
      "GET / HTTP/1.1\r\nX: a\rb\r\n\r\n",
      std::string("GET / HTTP/1.1\r\nX: a") + '\0' + "b\r\n\r\n",
      "GET / HTTP/1.1\r\n" + many + "\r\n",
  };
  for (const auto& req : bad) {
    INFO(req);
    const Reply r = round_trip(s.addr(), req);
    CHECK(r.status == 400);
    CHECK(r.body.find(R"("error":"bad_request")") != std::string::npos);
  }
  CHECK(s.calls == 0);
  CHECK(s.server.requests() == static_cast<int64_t>(bad.size()));
  const Reply head = get(s.addr(), "/a%00", "", "HEAD");  // refused, and without a body as HEAD asks
  CHECK((head.status == 400 && head.body.empty() && head.has("content-length")));
  CHECK(get(s.addr(), "/").status == 200);  // and the server still serves
}

TEST_CASE("http a head larger than max_header_bytes is 431", "[http]") {
  HttpOptions o;
  o.max_header_bytes = 1024;
  Served s(o);
  CHECK(get(s.addr(), "/", "X-Pad: " + std::string(4000, 'a') + "\r\n").status == 431);
  CHECK(round_trip(s.addr(), "GET /" + std::string(100000, 'a')).status == 431);  // never ends
  CHECK(get(s.addr(), "/", "X-Pad: " + std::string(900, 'a') + "\r\n").status == 200);
  CHECK(s.calls == 1);
}

TEST_CASE("http a handler that throws is 500 with its message and the next request is served", "[http]") {
  HttpOptions o;
  o.max_response_bytes = 1 << 20;
  Served s(o);
  const Reply r = get(s.addr(), "/throw");
  CHECK(r.status == 500);
  CHECK(r.header("content-type") == "application/json; charset=utf-8");
  CHECK(r.body == R"({"error":"internal","message":"the coordinator did not answer"})");
  CHECK(get(s.addr(), "/").status == 200);
  // A header that would split the response, and a body over the limit, are the handler's bugs: 500.
  const Reply split = get(s.addr(), "/split");
  CHECK(split.status == 500);
  CHECK_FALSE(split.has("set-cookie"));
  CHECK(get(s.addr(), "/big").status == 500);
  CHECK(get(s.addr(), "/").status == 200);
}

// ---------------------------------------------------------------- slow peers and limits

TEST_CASE("http a client holding half a request does not stop a second one from being answered", "[http]") {
  Served s;
  const int slow = connect_to(s.addr());
  REQUIRE(slow >= 0);
  send_all(slow, "GET / HTTP/1.1\r\nHost: te");
  CHECK(get(s.addr(), "/").status == 200);
  send_all(slow, "st\r\n\r\n");
  CHECK(read_reply(slow).status == 200);
  CHECK(s.calls == 2);
}

TEST_CASE("http connections beyond max_connections are answered 503", "[http]") {
  HttpOptions o;
  o.max_connections = 2;
  Served s(o);
  // The server accepts in the order the connections were made: a and b hold both slots.
  const int a = connect_to(s.addr());
  const int b = connect_to(s.addr());
  REQUIRE(a >= 0);
  REQUIRE(b >= 0);
  const Reply over = get(s.addr(), "/");
  CHECK(over.status == 503);
  CHECK(over.body.find(R"("error":"unavailable")") != std::string::npos);
  send_all(b, "GET / HTTP/1.1\r\n\r\n");
  CHECK(read_reply(b).status == 200);
  ::close(a);
  CHECK(s.calls == 1);
}

TEST_CASE("http a silent connection is closed at idle_timeout, a partial one answered 408", "[http]") {
  HttpOptions o;
  o.idle_timeout_ms = 200;
  Served s(o);
  const int silent = connect_to(s.addr());
  const int partial = connect_to(s.addr());
  REQUIRE(silent >= 0);
  REQUIRE(partial >= 0);
  send_all(partial, "GET / HTTP/1.1\r\n");
  CHECK(read_reply(partial).status == 408);
  CHECK(read_reply(silent).status == 0);
  CHECK(s.calls == 0);
}

// ---------------------------------------------------------------- the token

TEST_CASE("http a non-loopback address needs the token, in the Authorization header or the query", "[http]") {
  try {
    HttpServer no_token(with("0.0.0.0:0"), [](const HttpRequest&) { return HttpResponse::text(200, ""); });
    FAIL("0.0.0.0 without a token was accepted");
  } catch (const troupe::Error& e) {
    CHECK(std::string(e.what()).find("the dashboard address 0.0.0.0:0 is not a loopback address: it needs a "
                                     "token (the API's token)") != std::string::npos);
  }

  Served s(with("0.0.0.0:0", "s3cret"));
  CHECK(s.server.requires_token());
  const Reply none = get(s.addr(), "/");
  CHECK(none.status == 401);
  CHECK(none.header("www-authenticate") == "Bearer");
  CHECK(none.header("content-type") == "application/json; charset=utf-8");
  CHECK(none.body.find(R"("error":"unauthorized","message":)") != std::string::npos);
  CHECK(get(s.addr(), "/", "Authorization: Bearer s3cret\r\n").status == 200);
  CHECK(get(s.addr(), "/", "Authorization: bearer s3cret\r\n").status == 200);
  CHECK(get(s.addr(), "/?token=s3cret").status == 200);
  CHECK(get(s.addr(), "/", "Authorization: Bearer s3cre\r\n").status == 401);
  CHECK(get(s.addr(), "/", "Authorization: Basic s3cret\r\n").status == 401);
  CHECK(get(s.addr(), "/?token=s3cretx").status == 401);
  CHECK(get(s.addr(), "/?token=").status == 401);
  CHECK(s.calls == 3);

  // On loopback a token is not asked for.
  Served local(with("127.0.0.1:0", "s3cret"));
  CHECK_FALSE(local.server.requires_token());
  CHECK(get(local.addr(), "/").status == 200);
}

TEST_CASE("http is_loopback_host", "[http]") {
  for (const char* h :
       {"127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost", "LocalHost", "::ffff:127.0.0.1"})
    CHECK(is_loopback_host(h));
  for (const char* h :
       {"0.0.0.0", "10.0.0.1", "128.0.0.1", "127.evil.com", "::", "[::]", "", "[]", "example.com"})
    CHECK_FALSE(is_loopback_host(h));
}

// ---------------------------------------------------------------- addresses and lifetime

TEST_CASE("http listen addresses: bad ones throw, port 0 gives a real port, a taken port names the error",
          "[http]") {
  auto ok = [](const HttpRequest&) { return HttpResponse::text(200, "ok"); };
  for (const char* bad :
       {"", "127.0.0.1", "127.0.0.1:", ":8080", "127.0.0.1:65536", "127.0.0.1:abc", "127.0.0.1:-1",
        "127.0.0.1:80x", "example.com:80", "1.2.3:80", "::1:80", "[::1:80", "[]:80", "[nope]:80"}) {
    INFO(bad);
    CHECK_THROWS_WITH(HttpServer(with(bad), ok), Catch::Contains("cannot parse the dashboard address"));
  }

  HttpServer a(with("127.0.0.1:0"), ok);
  REQUIRE(a.address().rfind("127.0.0.1:", 0) == 0);
  const std::string port = a.address().substr(10);
  CHECK(std::stoi(port) > 0);
  CHECK_THROWS_WITH(HttpServer(with(a.address()), ok),
                    Catch::Contains("cannot listen on the dashboard address " + a.address()) &&
                        Catch::Contains(std::strerror(EADDRINUSE)));

  HttpServer by_name(with("localhost:0"), ok);
  CHECK(by_name.address().rfind("127.0.0.1:", 0) == 0);
  CHECK_FALSE(by_name.requires_token());
  CHECK(get(by_name.address(), "/").body == "ok");

  // IPv6 where this machine has ::1.
  const int probe = ::socket(AF_INET6, SOCK_STREAM, 0);
  sockaddr_in6 six{};
  six.sin6_family = AF_INET6;
  six.sin6_addr = in6addr_loopback;
  const bool has_v6 = probe >= 0 && ::bind(probe, reinterpret_cast<sockaddr*>(&six), sizeof six) == 0;
  if (probe >= 0) ::close(probe);
  if (has_v6) {
    HttpServer v6(with("[::1]:0"), ok);
    CHECK(v6.address().rfind("[::1]:", 0) == 0);
    CHECK_FALSE(v6.requires_token());
    CHECK(get(v6.address(), "/").body == "ok");
  }
}

TEST_CASE("http stop twice is fine and the address stops answering", "[http]") {
  Served s;
  const std::string addr = s.addr();
  CHECK(get(addr, "/").status == 200);
  s.server.stop();
  s.server.stop();
  CHECK(connect_to(addr) < 0);
  CHECK(s.server.requests() == 1);
}

// ---------------------------------------------------------------- the parser alone

TEST_CASE("http head_end finds the blank line however the bytes arrive", "[http]") {
  const std::string whole = "GET / HTTP/1.1\r\nHost: a\r\n\r\nrest";
  std::string in;
  size_t scan = 0, end = 0;
  for (char c : whole) {
    in.push_back(c);
    if ((end = http::head_end(in, &scan)) != 0) break;
  }
  CHECK(end == whole.size() - 4);
  scan = 0;
  CHECK(http::head_end("GET / HTTP/1.1\nHost: a\n\n", &scan) == 24);
  scan = 0;
  CHECK(http::head_end("GET / HTTP/1.1\r\nHost: a\r\n", &scan) == 0);

  const auto p = http::parse_head("HEAD /x%20y?q=1 HTTP/1.0\r\nA-B:  c \r\n\r\n");
  CHECK(p.status == 0);
  CHECK(p.request.method == "HEAD");
  CHECK(p.request.path == "/x y");
  CHECK(p.request.query == "q=1");
  REQUIRE(p.request.headers.size() == 1);
  CHECK(p.request.headers[0] == std::make_pair(std::string("a-b"), std::string("c")));
  CHECK(http::parse_head("PUT / HTTP/1.1\r\n\r\n").status == 405);
  CHECK(http::parse_head("GET /%2e%2e HTTP/1.1\r\n\r\n").status == 400);
}

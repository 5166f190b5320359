// The dashboard's HTTP server against the tests' blocking client (tests/support/http_get.hpp):
// what a well-formed request gets, what a hostile one gets (and that the handler never
// sees it), the limits (slow peers, the bytes in flight, a deadline per answer), the Host
// and the token, and the request parser on its own.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "coordinator/http_checks.hpp"
#include "coordinator/http_server.hpp"
#include "core/error.hpp"
#include "tests/support/http_get.hpp"

using namespace troupe::coord;
using troupe::test::HttpConn;
using troupe::test::HttpReply;

namespace {

// ---------------------------------------------------------------- the client

HttpReply round_trip(const std::string& address, const std::string& bytes) {
  HttpConn c(address);
  REQUIRE(c.ok());
  c.send(bytes);
  return c.reply();
}

// The request as a browser sends it to `address`, which it names as its Host.
std::string request(const std::string& address, const std::string& target, const std::string& headers = "",
                    const std::string& method = "GET") {
  return method + " " + target + " HTTP/1.1\r\nHost: " + address + "\r\n" + headers + "\r\n";
}

HttpReply get(const std::string& address, const std::string& target, const std::string& headers = "",
              const std::string& method = "GET") {
  return round_trip(address, request(address, target, headers, method));
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
    if (r.path == "/get-only" && r.method != "GET") {
      auto resp = HttpResponse::json(405, R"({"error":"get_only"})");
      resp.headers.emplace_back("Allow", "GET");
      return resp;
    }
    if (r.path == "/throw") throw std::runtime_error("the coordinator did not answer");
    if (r.path == "/split") {
      auto resp = HttpResponse::text(200, "x");
      resp.headers.emplace_back("X-Split", "a\r\nSet-Cookie: evil=1");
      return resp;
    }
    if (r.path == "/huge") return HttpResponse::text(200, std::string(32 << 20, 'x'));
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
  const HttpReply r = get(s.addr(), "/");
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
  const HttpReply c = get(s.addr(), "/cached");
  CHECK(c.header("content-type") == "application/json; charset=utf-8");
  CHECK(c.header("cache-control") == "max-age=60");
  CHECK(c.header("content-length") == "2");
  CHECK(c.body == "{}");

  // 404 from the handler passes through; HEAD has GET's headers and no body.
  const HttpReply missing = get(s.addr(), "/nothing/here");
  CHECK(missing.status == 404);
  CHECK(missing.body == R"({"error":"not_found"})");
  const HttpReply head = get(s.addr(), "/", "", "HEAD");
  CHECK(head.status == 200);
  CHECK(head.header("content-length") == "5");
  CHECK(head.body.empty());
  CHECK(s.seen().method == "HEAD");
  CHECK(s.server.requests() == 4);
}

TEST_CASE("http the handler sees the decoded path, the raw query and trimmed lower-case headers", "[http]") {
  Served s;
  const HttpReply r = get(s.addr(), "/api/jobs/j%2D1%20x?after=12&name=a+b%26c&flag&token=abc",
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
  CHECK(q.header("host") == s.addr());
  CHECK(q.header("absent") == "");
  CHECK(q.peer.rfind("127.0.0.1:", 0) == 0);

  // HTTP/1.0, and names that only look like a climb. Lines end in CRLF: the library answers
  // a request line ending in a bare LF 400 (RFC 9112 allows either).
  CHECK(round_trip(s.addr(), "GET / HTTP/1.0\r\nHost: localhost\r\n\r\n").status == 200);
  CHECK(round_trip(s.addr(), "GET / HTTP/1.0\nHost: localhost\n\n").status == 400);
  CHECK(get(s.addr(), "/a..b/..c/x..").status == 404);
  CHECK(s.seen().path == "/a..b/..c/x..");
}

TEST_CASE("http a large response arrives whole", "[http]") {
  Served s;
  const HttpReply r = get(s.addr(), "/big");
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
  const HttpReply post = get(s.addr(), "/", "", "POST");
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

TEST_CASE("http HEAD answered 405 by the handler has the length and no body", "[http]") {
  Served s;
  const HttpReply head = get(s.addr(), "/get-only", "", "HEAD");
  CHECK(head.status == 405);
  CHECK(head.header("allow") == "GET");
  CHECK(head.header("content-length") == std::to_string(std::string(R"({"error":"get_only"})").size()));
  CHECK(head.body.empty());
  // A method the server refuses itself keeps its body: it is not HEAD.
  const HttpReply post = get(s.addr(), "/get-only", "", "POST");
  CHECK(post.status == 405);
  CHECK(post.body.find(R"("error":"method_not_allowed")") != std::string::npos);
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
      "G(T / HTTP/1.1\r\n\r\n",
      "GET http://example.com/ HTTP/1.1\r\n\r\n",
      "GET * HTTP/1.1\r\n\r\n",
      "GET /a\x01z HTTP/1.1\r\n\r\n",
      "GET /caf\xc3\xa9 HTTP/1.1\r\n\r\n",
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
      "GET / HTTP/1.1\r\n\tX: a\r\n\r\n",
      "GET / HTTP/1.1\r\nBad Name: v\r\n\r\n",
      "GET / HTTP/1.1\r\n: v\r\n\r\n",
      "GET / HTTP/1.1\r\nX: a\rb\r\n\r\n",
      std::string("GET / HTTP/1.1\r\nX: a") + '\0' + "b\r\n\r\n",
      "GET / HTTP/1.1\r\n" + many + "\r\n",
  };
  for (const auto& line : bad) {
    // A valid Host right after the request line: each is refused for its own fault.
    const size_t eol = line.find("\r\n");
    const std::string req = eol == std::string::npos || eol == 0
                                ? line
                                : line.substr(0, eol + 2) + "Host: localhost\r\n" + line.substr(eol + 2);
    INFO(req);
    const HttpReply r = round_trip(s.addr(), req);
    CHECK(r.status == 400);
    CHECK(r.body.find(R"("error":"bad_request")") != std::string::npos);
  }
  CHECK(s.calls == 0);
  CHECK(s.server.requests() == static_cast<int64_t>(bad.size()));
  const HttpReply head = get(s.addr(), "/a%00", "", "HEAD");  // refused, and without a body as HEAD asks
  CHECK((head.status == 400 && head.body.empty() && head.has("content-length")));
  CHECK(get(s.addr(), "/").status == 200);  // and the server still serves

  // What the library reads leniently, and how: spaces around the target are skipped, a
  // fragment is cut off, a header line without a colon (a folded one too) is dropped. None
  // can smuggle a second request: one answer per connection, nothing after the head is read.
  const std::vector<std::pair<std::string, std::string>> lenient = {
      {"GET  / HTTP/1.1\r\nHost: localhost\r\n\r\n", "/"},
      {"GET / HTTP/1.1 \r\nHost: localhost\r\n\r\n", "/"},
      {"GET /a#frag HTTP/1.1\r\nHost: localhost\r\n\r\n", "/a"},
      {"GET / HTTP/1.1\r\nHost: localhost\r\nNoColon\r\n\r\n", "/"},
      {"GET / HTTP/1.1\r\nHost: localhost\r\nX: a\r\n folded\r\n\r\n", "/"},
  };
  for (const auto& [req, path] : lenient) {
    INFO(req);
    CHECK(round_trip(s.addr(), req).status == (path == "/" ? 200 : 404));
    CHECK(s.seen().path == path);
    CHECK(s.seen().header("nocolon") == "");
  }
}

TEST_CASE("http a head larger than max_header_bytes is 431", "[http]") {
  HttpOptions o;
  o.max_header_bytes = 1024;
  Served s(o);
  CHECK(get(s.addr(), "/", "X-Pad: " + std::string(4000, 'a') + "\r\n").status == 431);
  CHECK(round_trip(s.addr(), "GET /" + std::string(100000, 'a')).status == 431);  // never ends
  CHECK(get(s.addr(), "/", "X-Pad: " + std::string(900, 'a') + "\r\n").status == 200);
  CHECK(s.calls == 1);

  // Within the default 16 KiB, the library's own line limits (8 KiB, compiled in): a longer
  // request line is 414, a longer header line 400; neither reaches the handler.
  Served wide;
  const HttpReply long_line = get(wide.addr(), "/" + std::string(9000, 'a'));
  CHECK(long_line.status == 414);
  CHECK(long_line.body.find(R"("error":"target_too_long")") != std::string::npos);
  CHECK(get(wide.addr(), "/", "X-Pad: " + std::string(9000, 'a') + "\r\n").status == 400);
  CHECK(get(wide.addr(), "/", "X-Pad: " + std::string(7000, 'a') + "\r\n").status == 200);
  CHECK(wide.calls == 1);
}

TEST_CASE("http a handler that throws is 500 with its message and the next request is served", "[http]") {
  HttpOptions o;
  o.max_response_bytes = 1 << 20;
  Served s(o);
  const HttpReply r = get(s.addr(), "/throw");
  CHECK(r.status == 500);
  CHECK(r.header("content-type") == "application/json; charset=utf-8");
  CHECK(r.body == R"({"error":"internal","message":"the coordinator did not answer"})");
  CHECK(get(s.addr(), "/").status == 200);
  // A header that would split the response, and a body over the limit, are the handler's bugs: 500.
  const HttpReply split = get(s.addr(), "/split");
  CHECK(split.status == 500);
  CHECK_FALSE(split.has("set-cookie"));
  CHECK(get(s.addr(), "/big").status == 500);
  CHECK(get(s.addr(), "/").status == 200);
}

// ---------------------------------------------------------------- slow peers and limits

TEST_CASE("http a client holding half a request does not stop a second one from being answered", "[http]") {
  Served s;
  HttpConn slow(s.addr());
  REQUIRE(slow.ok());
  slow.send("GET / HTTP/1.1\r\nHost: 127.0");
  CHECK(get(s.addr(), "/").status == 200);
  slow.send(".0.1\r\n\r\n");
  CHECK(slow.reply().status == 200);
  CHECK(s.calls == 2);
}

TEST_CASE("http connections beyond max_connections are answered 503", "[http]") {
  HttpOptions o;
  o.max_connections = 2;
  Served s(o);
  // The server accepts in the order the connections were made: a and b hold both slots.
  HttpConn a(s.addr());
  HttpConn b(s.addr());
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  const HttpReply over = get(s.addr(), "/");
  CHECK(over.status == 503);
  CHECK(over.body.find(R"("error":"unavailable")") != std::string::npos);
  b.send(request(s.addr(), "/"));
  CHECK(b.reply().status == 200);
  a.close();
  CHECK(s.calls == 1);
}

TEST_CASE("http one address holds at most its share of slots, another address is served meanwhile",
          "[http]") {
  HttpOptions o;
  o.max_connections = 8;
  o.max_connections_per_address = 3;
  Served s(o);
  // 127.0.0.2 holds three slots with half-sent requests; its fourth is answered 503 by name.
  std::vector<std::unique_ptr<HttpConn>> slow;
  for (int i = 0; i < 3; ++i) {
    slow.push_back(std::make_unique<HttpConn>(s.addr(), 0, "127.0.0.2"));
    REQUIRE(slow.back()->ok());
    slow.back()->send("GET / HTTP/1.1\r\nHost: 127.0");
  }
  HttpConn fourth(s.addr(), 0, "127.0.0.2");
  REQUIRE(fourth.ok());
  const HttpReply over = fourth.reply();
  CHECK(over.status == 503);
  CHECK(over.body.find("too many connections from 127.0.0.2 (at most 3)") != std::string::npos);
  // A flood from the same address gets no slot: each connection is answered 503 or, past a few
  // 503s held at once, closed unanswered. 127.0.0.1 is served all along.
  std::vector<std::unique_ptr<HttpConn>> flood;
  for (int i = 0; i < 20; ++i) flood.push_back(std::make_unique<HttpConn>(s.addr(), 0, "127.0.0.2"));
  for (int i = 0; i < 5; ++i) CHECK(get(s.addr(), "/").status == 200);
  for (auto& c : flood) {
    const int status = c->reply().status;
    CHECK((status == 503 || status == 0));
  }
  CHECK(s.calls == 5);
}

TEST_CASE("http with every slot taken, the busiest address gives its oldest waiting connection to a newcomer",
          "[http]") {
  HttpOptions o;
  o.max_connections = 6;
  o.max_connections_per_address = 6;
  Served s(o);
  auto waiting = [&](const char* from) {
    auto c = std::make_unique<HttpConn>(s.addr(), 0, from);
    REQUIRE(c->ok());
    c->send("GET / HTTP/1.1\r\n");  // a request it does not finish (yet)
    return c;
  };
  // Two addresses take every slot: 4 from .2, then 2 from .3 (accepted in this order).
  std::vector<std::unique_ptr<HttpConn>> slow;
  for (const char* from : {"127.0.0.2", "127.0.0.2", "127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.3"})
    slow.push_back(waiting(from));
  // Each newcomer takes the oldest waiting connection of the busiest address, which is closed
  // unanswered: .2 holds 4, then 3, then ties with .3 at 2 (and goes first by name).
  std::vector<std::unique_ptr<HttpConn>> fresh;
  for (const char* from : {"127.0.0.4", "127.0.0.5", "127.0.0.6"}) {
    fresh.push_back(waiting(from));
    CHECK(slow[fresh.size() - 1]->reply().status == 0);
  }
  // .3 holds 2 like .2: it takes nothing from a peer with its own share, and is answered 503.
  HttpConn third(s.addr(), 0, "127.0.0.3");
  REQUIRE(third.ok());
  CHECK(third.reply().status == 503);
  // Everyone left finishes the request and is answered.
  for (auto* group : {&fresh, &slow})
    for (auto& c : *group) {
      if (!c->ok()) continue;
      c->send("Host: 127.0.0.1\r\n\r\n");
      CHECK(c->reply().status == 200);
    }
  CHECK(s.calls == 6);
}

TEST_CASE("http a silent connection is closed at idle_timeout, a partial one answered 408", "[http]") {
  HttpOptions o;
  o.idle_timeout_ms = 200;
  Served s(o);
  HttpConn silent(s.addr());
  HttpConn partial(s.addr());
  REQUIRE(silent.ok());
  REQUIRE(partial.ok());
  partial.send("GET / HTTP/1.1\r\n");
  CHECK(partial.reply().status == 408);
  CHECK(silent.reply().status == 0);
  CHECK(s.calls == 0);
}

TEST_CASE("http an answer that would take the bytes being written past max_inflight_bytes is 503", "[http]") {
  HttpOptions o;
  o.max_inflight_bytes = 40 << 20;  // one /huge (32 MiB) fits, two do not
  Served s(o);
  // A small receive window: the answer is larger than any socket buffers, so it stays
  // in the server's hands until it is read.
  HttpConn first(s.addr(), 16 << 10);
  REQUIRE(first.ok());
  first.send(request(s.addr(), "/huge"));
  // Its first bytes have arrived: the server is writing it.
  while (first.received().size() < 12 && first.read_some(64) > 0) {
  }
  REQUIRE(first.received().rfind("HTTP/1.1 200", 0) == 0);
  const HttpReply second = get(s.addr(), "/huge");
  CHECK(second.status == 503);
  CHECK(second.body.find(R"("error":"unavailable")") != std::string::npos);
  CHECK(get(s.addr(), "/big").status == 200);                 // 8 MiB more still fit
  const HttpReply head = get(s.addr(), "/huge", "", "HEAD");  // HEAD holds no body
  CHECK(head.status == 200);
  CHECK(head.header("content-length") == std::to_string(32 << 20));
  // Once the first is read whole its bytes are given back.
  const HttpReply whole = first.reply();
  CHECK(whole.status == 200);
  CHECK(whole.body.size() == (32u << 20));
  CHECK(get(s.addr(), "/huge").status == 200);

  // An answer larger than the limit on its own never fits.
  o.max_inflight_bytes = 4 << 20;
  Served small(o);
  CHECK(get(small.addr(), "/big").status == 503);
  CHECK(get(small.addr(), "/big", "", "HEAD").status == 200);
}

TEST_CASE("http an answer not taken whole by its deadline is cut off, however steadily it is read",
          "[http]") {
  HttpOptions o;
  o.idle_timeout_ms = 500;
  o.min_send_rate = 1 << 30;        // /huge's 32 MiB take 31 ms at this rate: the deadline is 500 ms
  o.max_inflight_bytes = 40 << 20;  // one /huge at a time
  Served s(o);
  // A small receive window, so that the answer cannot sit whole in socket buffers.
  HttpConn reader(s.addr(), 16 << 10);
  HttpConn idle(s.addr(), 16 << 10);
  REQUIRE(reader.ok());
  REQUIRE(idle.ok());

  SECTION("a peer reading a little now and then") {
    // 16 KiB at most, then a 1 ms pause: 32 MiB would take 2 s at the very least. The
    // server's writes make progress well within 500 ms each, so a deadline counted from
    // the last byte taken would never come.
    reader.send(request(s.addr(), "/huge"));
    ssize_t n;
    while ((n = reader.read_some(16 << 10)) > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    CHECK((n == 0 || reader.error() == ECONNRESET));
    CHECK(reader.received().rfind("HTTP/1.1 200", 0) == 0);
    CHECK(reader.received().size() < (32u << 20));
  }
  SECTION("a peer that never reads") {
    idle.send(request(s.addr(), "/huge"));
    CHECK(idle.wait_reset(30000));  // a guard only: the server resets it at its deadline
  }
  // The cut answer's bytes were given back.
  CHECK(get(s.addr(), "/huge").status == 200);
}

TEST_CASE("http a handler still working does not hold the other connections", "[http]") {
  std::mutex mu;
  std::condition_variable cv;
  bool release = false, waiting = false;
  HttpServer server(HttpOptions{}, [&](const HttpRequest& r) {
    if (r.path == "/wait") {
      std::unique_lock<std::mutex> lock(mu);
      waiting = true;
      cv.notify_all();
      cv.wait(lock, [&] { return release; });
    }
    return HttpResponse::text(200, r.path);
  });
  HttpConn slow(server.address());
  REQUIRE(slow.ok());
  slow.send(request(server.address(), "/wait"));
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return waiting; });
  }
  // The handler of /wait is still working (as it would waiting on the coordinator).
  CHECK(get(server.address(), "/other").body == "/other");
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  CHECK(slow.reply().body == "/wait");
}

TEST_CASE("http a body goes out whole and as it is, whatever Range or Accept-Encoding ask", "[http]") {
  Served s;
  const HttpReply r =
      get(s.addr(), "/big", "Range: bytes=0-9\r\nAccept-Encoding: gzip, br\r\nExpect: 100-continue\r\n");
  CHECK(r.status == 200);
  CHECK(r.body.size() == (8u << 20));
  CHECK_FALSE(r.has("content-encoding"));
  CHECK_FALSE(r.has("content-range"));
  CHECK_FALSE(r.has("accept-ranges"));
  CHECK(r.head.find("100 Continue") == std::string::npos);
  // The handler still sees what was asked.
  CHECK(s.seen().header("range") == "bytes=0-9");
}

// ---------------------------------------------------------------- the Host

TEST_CASE("http on loopback a Host that is no loopback name is 421 and never reaches the handler", "[http]") {
  Served s;
  const std::string port = s.addr().substr(s.addr().rfind(':') + 1);
  CHECK(get(s.addr(), "/").status == 200);  // its own address is a loopback name
  const std::vector<std::string> wrong = {"rebound.example:" + port,
                                          "rebound.example",
                                          "127.0.0.1.evil.com",
                                          "localhost.evil.com:80",
                                          "[::1]x",
                                          "localhost:80:80",
                                          "::1",
                                          "127.0.0.1:8x",
                                          "[::1",
                                          "0.0.0.0:" + port,
                                          "10.0.0.1"};
  for (const auto& host : wrong) {
    INFO(host);
    const HttpReply r = round_trip(s.addr(), "GET / HTTP/1.1\r\nHost: " + host + "\r\n\r\n");
    CHECK(r.status == 421);
    CHECK(r.head.rfind("HTTP/1.1 421 Misdirected Request\r\n", 0) == 0);
    CHECK(r.header("content-type") == "application/json; charset=utf-8");
    CHECK(r.body == R"x({"error":"wrong_host","message":"this address answers on a loopback name only )x"
                    R"x((127.0.0.1, localhost, [::1])"})x");
  }
  CHECK(s.calls == 1);
  // An empty Host is dropped by the library (a header with no value): no Host, 400.
  CHECK(round_trip(s.addr(), "GET / HTTP/1.1\r\nHost: \r\n\r\n").status == 400);
  const std::vector<std::string> right = {"127.0.0.1:" + port, "127.0.0.1",     "127.0.0.2:1", "localhost",
                                          "LocalHost:" + port, "[::1]:" + port, "[::1]",       "localhost:"};
  for (const auto& host : right) {
    INFO(host);
    CHECK(round_trip(s.addr(), "GET / HTTP/1.1\r\nHost: " + host + "\r\n\r\n").status == 200);
  }
  // HEAD is refused without a body; HTTP/1.0 may leave the Host out, but not name another one.
  const HttpReply head = round_trip(s.addr(), "HEAD / HTTP/1.1\r\nHost: rebound.example\r\n\r\n");
  CHECK((head.status == 421 && head.body.empty() && head.has("content-length")));
  CHECK(round_trip(s.addr(), "GET / HTTP/1.0\r\n\r\n").status == 200);
  CHECK(round_trip(s.addr(), "GET / HTTP/1.0\r\nHost: rebound.example\r\n\r\n").status == 421);
  CHECK(s.calls == 1 + static_cast<int>(right.size()) + 1);
}

TEST_CASE("http HTTP/1.1 without a Host, or any request with two, is 400", "[http]") {
  Served s;
  for (const char* req : {"GET / HTTP/1.1\r\n\r\n", "GET / HTTP/1.1\r\nX-Host: localhost\r\n\r\n",
                          "GET / HTTP/1.1\r\nHost: localhost\r\nHost: localhost\r\n\r\n",
                          "GET / HTTP/1.0\r\nHost: localhost\r\nhost: 127.0.0.1\r\n\r\n"}) {
    INFO(req);
    const HttpReply r = round_trip(s.addr(), req);
    CHECK(r.status == 400);
    CHECK(r.body.find(R"("error":"bad_request")") != std::string::npos);
  }
  CHECK(s.calls == 0);
}

TEST_CASE("http the Host is not checked when check_host is off, nor where the token is asked", "[http]") {
  HttpOptions o;
  o.check_host = false;
  Served off(o);
  CHECK(round_trip(off.addr(), "GET / HTTP/1.1\r\nHost: rebound.example\r\n\r\n").status == 200);
  Served remote(with("0.0.0.0:0", "s3cret"));
  CHECK(round_trip(remote.addr(), "GET /?token=s3cret HTTP/1.1\r\nHost: dashboard.example\r\n\r\n").status ==
        200);
  CHECK(off.calls == 1);
  CHECK(remote.calls == 1);
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
  const HttpReply none = get(s.addr(), "/");
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

TEST_CASE("http off loopback the public paths are answered without the token, the others ask for it",
          "[http]") {
  auto o = with("0.0.0.0:0", "s3cret");
  o.public_paths = {"/", "/app.js", "/app.css"};
  Served s(o);
  const HttpReply page = get(s.addr(), "/");
  CHECK(page.status == 200);
  CHECK(page.body == "hello");
  CHECK(get(s.addr(), "/?x=1").status == 200);       // the query is no part of the path
  CHECK(get(s.addr(), "/app.js").status == 404);     // the handler's answer, not a 401
  CHECK(get(s.addr(), "/%61pp.css").status == 404);  // decoded, it is /app.css
  CHECK(s.calls == 4);
  for (const char* target : {"/cached", "/big", "/app.js/", "/App.js", "//", "/app.js.map", "/nothing"}) {
    INFO(target);
    CHECK(get(s.addr(), target).status == 401);
  }
  CHECK(get(s.addr(), "/cached", "Authorization: Bearer s3cret\r\n").status == 200);
  CHECK(s.calls == 5);
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
  CHECK_FALSE(HttpConn(addr).ok());
  CHECK(s.server.requests() == 1);
}

// ---------------------------------------------------------------- the parser alone

TEST_CASE("http host_name takes the port and the brackets off a Host", "[http]") {
  CHECK(http::host_name("127.0.0.1:8080") == "127.0.0.1");
  CHECK(http::host_name("127.0.0.1") == "127.0.0.1");
  CHECK(http::host_name("localhost:") == "localhost");
  CHECK(http::host_name("[::1]:80") == "::1");
  CHECK(http::host_name("[::1]") == "::1");
  CHECK(http::host_name("Example.COM:443") == "Example.COM");
  for (const char* bad : {"::1", "a:b", "a:80:80", "[::1]x", "[::1]:8x", "[::1", "[]:80", "[]"}) {
    INFO(bad);
    CHECK(http::host_name(bad) == "");
  }
}

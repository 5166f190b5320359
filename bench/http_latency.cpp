// /metrics latency under many concurrent connections: the dashboard's HTTP transport
// (coordinator/http_server.hpp, the reference: cpp-httplib with the guard around it)
// against the two HTTP server libraries Debian ships as they come, measured in the same
// run on the same body. (At commit e228066 the reference was the hand-written poll(2)
// loop the transport replaced; that commit's bench measures it.)
//
//   http_latency [concurrency=200] [seconds=4] [rounds=3]
//   http_latency --serve NAME [seconds=60]     serve one of them alone (for wrk), print its port
//
// The body is the Prometheus text the coordinator's prometheus_text makes for 4 running
// jobs of 16 workers each (about 16 KB), made once and copied into every answer, so
// that the figures are the transports'. Each server closes the connection after its answer
// (the dashboard's own rule; the load generator asks Connection: close of all of them). The
// load generator (bench/http_load.hpp) keeps `concurrency` connections open from one thread,
// each a whole request; rounds alternate the servers, and each figure is the median of the
// rounds. An answer counts only when it is a 200 with the whole body.
//
// The transport's limits are raised above the concurrency here (its defaults answer 503
// beyond 64 connections, 16 per address), so that every server answers every connection;
// it runs a thread per connection.
// The libraries run as they come: cpp-httplib's thread pool of CPPHTTPLIB_THREAD_POOL_COUNT
// threads (as compiled into Debian's libcpp-httplib: max(8, cores - 1)) and its listen
// backlog of 5, and once more with the backlog the other two use (SOMAXCONN); civetweb's
// 50 worker threads.
#include <civetweb.h>
#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/http_load.hpp"
#include "coordinator/dashboard.hpp"
#include "coordinator/http_server.hpp"

using namespace troupe;

namespace {

constexpr const char* kContentType = "text/plain; version=0.0.4; charset=utf-8";

// What /metrics says of 4 running jobs of 16 workers, each with a few steps of history.
std::string metrics_body() {
  coord::JobHistory history;
  nlohmann::json list = {
      {"ok", true}, {"agents", nlohmann::json::array()}, {"jobs", nlohmann::json::array()}};
  list["devices"] = {{"cpu", {{"total", 64}, {"free", 0}}}};
  std::vector<nlohmann::json> live;
  for (int j = 0; j < 4; ++j) {
    const std::string id = "j-" + std::to_string(j + 1);
    nlohmann::json job = {{"id", id},           {"name", "llama-" + std::to_string(j)},
                          {"state", "running"}, {"layout", "4x2x2"},
                          {"generation", 1},    {"restarts", 1},
                          {"steps_done", 1234}, {"total_steps", 100000}};
    nlohmann::json workers = nlohmann::json::array();
    for (int r = 0; r < 16; ++r)
      workers.push_back({{"rank", r},
                         {"host", "node-" + std::to_string(r / 8)},
                         {"device", "cuda:" + std::to_string(r % 8)},
                         {"pid", 40000 + 100 * j + r},
                         {"heartbeat_age_s", 0.25 + r * 0.01}});
    list["jobs"].push_back(job);
    job["workers"] = workers;
    live.push_back(job);
    for (int s = 0; s < 8; ++s)
      history.on_event(nlohmann::json{{"event", "step"},
                                      {"job", id},
                                      {"metrics",
                                       {{"step", s},
                                        {"loss", 3.0 - 0.01 * s},
                                        {"tokens_per_s", 51234.5},
                                        {"step_ms", 812.5},
                                        {"generation", 1}}}}
                           .dump());
    list["agents"].push_back({{"id", "agent-" + std::to_string(j)}, {"host", "node-" + std::to_string(j)}});
  }
  return coord::prometheus_text(list, live, history);
}

// One server under test: started on 127.0.0.1, any free port; stopped by its destructor.
struct Served {
  virtual ~Served() = default;
  virtual int port() const = 0;
};

struct Reference : Served {
  std::unique_ptr<coord::HttpServer> server;
  explicit Reference(const std::string& body) {
    coord::HttpOptions o;
    o.max_connections = 1024;
    o.max_connections_per_address = 1024;
    server = std::make_unique<coord::HttpServer>(o, [&body](const coord::HttpRequest& r) {
      if (r.path != "/metrics") return coord::HttpResponse::text(404, "");
      auto a = coord::HttpResponse::text(200, body);
      a.content_type = kContentType;
      return a;
    });
  }
  int port() const override { return std::stoi(server->address().substr(server->address().rfind(':') + 1)); }
};

// Debian's libcpp-httplib listens with a backlog of CPPHTTPLIB_LISTEN_BACKLOG (5) compiled
// in; the socket is the Server's (protected), and listen(2) again sets a longer queue.
struct WideServer : httplib::Server {
  void widen_backlog() { ::listen(svr_sock_, SOMAXCONN); }
};

struct CppHttplib : Served {
  WideServer server;
  std::thread thread;
  int port_ = 0;
  CppHttplib(const std::string& body, bool wide) {
    server.Get("/metrics", [&body](const httplib::Request&, httplib::Response& res) {
      res.set_content(body, kContentType);
    });
    port_ = server.bind_to_any_port("127.0.0.1");
    if (wide) server.widen_backlog();
    thread = std::thread([this] { server.listen_after_bind(); });
    while (!server.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~CppHttplib() override {
    server.stop();
    thread.join();
  }
  int port() const override { return port_; }
};

struct Civetweb : Served {
  mg_context* ctx = nullptr;
  int port_ = 0;
  static int handler(mg_connection* c, void* data) {
    const auto* body = static_cast<const std::string*>(data);
    mg_send_http_ok(c, kContentType, static_cast<long long>(body->size()));
    mg_write(c, body->data(), body->size());
    return 200;
  }
  explicit Civetweb(const std::string& body) {
    const char* options[] = {"listening_ports", "127.0.0.1:0", "enable_keep_alive", "no", nullptr};
    mg_callbacks callbacks{};
    ctx = mg_start(&callbacks, nullptr, options);
    if (ctx == nullptr) {
      std::fprintf(stderr, "civetweb did not start\n");
      std::exit(1);
    }
    mg_set_request_handler(ctx, "/metrics$", handler, const_cast<std::string*>(&body));
    mg_server_port ports[1];
    if (mg_get_server_ports(ctx, 1, ports) == 1) port_ = ports[0].port;
  }
  ~Civetweb() override { mg_stop(ctx); }
  int port() const override { return port_; }
};

using Make = std::function<std::unique_ptr<Served>(const std::string&)>;
const std::vector<std::pair<std::string, Make>>& servers() {
  static const std::vector<std::pair<std::string, Make>> all = {
      {"troupe HttpServer (reference)", [](const std::string& b) { return std::make_unique<Reference>(b); }},
      {"cpp-httplib " CPPHTTPLIB_VERSION,
       [](const std::string& b) { return std::make_unique<CppHttplib>(b, false); }},
      {"cpp-httplib, backlog SOMAXCONN",
       [](const std::string& b) { return std::make_unique<CppHttplib>(b, true); }},
      {"civetweb " CIVETWEB_VERSION, [](const std::string& b) { return std::make_unique<Civetweb>(b); }},
  };
  return all;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  mg_init_library(0);
  const std::string body = metrics_body();
  if (argc >= 3 && std::string(argv[1]) == "--serve") {
    for (const auto& [name, make] : servers()) {
      if (name.rfind(argv[2], 0) != 0) continue;
      auto s = make(body);
      std::printf("%s on 127.0.0.1:%d\n", name.c_str(), s->port());
      std::fflush(stdout);
      std::this_thread::sleep_for(std::chrono::seconds(argc > 3 ? std::atoi(argv[3]) : 60));
      return 0;
    }
    std::fprintf(stderr, "http_latency: no server named '%s' (troupe, cpp-httplib, civetweb)\n", argv[2]);
    return 2;
  }
  const int concurrency = argc > 1 ? std::atoi(argv[1]) : 200;
  const double seconds = argc > 2 ? std::atof(argv[2]) : 4.0;
  const int rounds = argc > 3 ? std::atoi(argv[3]) : 3;
  if (concurrency < 1 || seconds <= 0 || rounds < 1) {
    std::fprintf(stderr, "usage: http_latency [concurrency>=1] [seconds>0] [rounds>=1]\n");
    return 2;
  }
  std::printf("GET /metrics (%zu bytes), %d concurrent connections, %.1f s per server and round, %d rounds\n",
              body.size(), concurrency, seconds, rounds);

  struct Figures {
    std::vector<double> rps, p50, p90, p99, max;
    int64_t ok = 0, failed = 0;
  };
  std::map<std::string, Figures> figures;
  for (int round = 0; round < rounds; ++round)
    for (const auto& [name, make] : servers()) {
      auto s = make(body);
      bench::HttpLoad load(s->port(), "/metrics", body.size());
      load.run(concurrency, 0.5);  // warm-up: threads started, pages touched
      const bench::LoadResult r = load.run(concurrency, seconds);
      Figures& f = figures[name];
      f.rps.push_back(double(r.ok) / r.seconds);
      f.p50.push_back(r.percentile(50));
      f.p90.push_back(r.percentile(90));
      f.p99.push_back(r.percentile(99));
      f.max.push_back(r.max());
      f.ok += r.ok;
      f.failed += r.failed;
    }

  std::printf("\n%-32s %10s %9s %9s %9s %9s %10s %8s\n", "server", "answers/s", "p50 ms", "p90 ms", "p99 ms",
              "max ms", "answered", "failed");
  double ref_p50 = 0, ref_p99 = 0, ref_rps = 0;
  for (const auto& [name, make] : servers()) {
    const Figures& f = figures[name];
    std::printf("%-32s %10.0f %9.2f %9.2f %9.2f %9.1f %10lld %8lld\n", name.c_str(), median(f.rps),
                median(f.p50), median(f.p90), median(f.p99), median(f.max), static_cast<long long>(f.ok),
                static_cast<long long>(f.failed));
    if (ref_rps == 0) {
      ref_rps = median(f.rps);
      ref_p50 = median(f.p50);
      ref_p99 = median(f.p99);
    }
  }
  std::printf("\nagainst the reference (first row): answers/s, p50, p99 as ratios\n");
  for (const auto& [name, make] : servers()) {
    const Figures& f = figures[name];
    std::printf("%-32s %9.2fx %8.2fx %8.2fx\n", name.c_str(), median(f.rps) / ref_rps,
                median(f.p50) / ref_p50, median(f.p99) / ref_p99);
  }
  return 0;
}

// `--http HOST:PORT`: the dashboard, its JSON endpoints and /metrics, served
// from this process (docs/observability.md). Read-only: it asks the
// coordinator the API's "list" and "status" and adds the history it keeps from
// the events. No CAF here: the CLI and the embedded run include it.
//
//   GET /, /app.js, /trace.js, /app.css   the page (served from the binary, to anyone)
//   GET /api/jobs                the jobs table, agents, devices, queue
//   GET /api/jobs/<id>?after=N   one job: status, workers, metric points (seq > N), events, checkpoints
//   GET /api/jobs/<id>/trace     its merged trace (`troupe trace merge`), when there is one
//   GET /metrics                 Prometheus text
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace troupe::coord {

class HttpServer;
class JobHistory;
struct HttpRequest;
struct HttpResponse;

struct DashboardOptions {
  std::string listen = "127.0.0.1:0";  // port 0 = any free port
  std::string token;                   // required off loopback: the API's token
};

class DashboardServer {
 public:
  // Answers one API request (JSON text) as the coordinator does; blocking.
  using Ask = std::function<std::string(const std::string& request_json)>;

  // Binds and serves; throws troupe::Error when it cannot (the address, a missing token).
  DashboardServer(DashboardOptions options, Ask ask);
  ~DashboardServer();
  DashboardServer(const DashboardServer&) = delete;
  DashboardServer& operator=(const DashboardServer&) = delete;

  // Feeds the history; called with every coordinator event. Never throws.
  void on_event(const std::string& event_json) noexcept;

  const std::string& address() const;  // bound "host:port"
  std::string url() const;             // "http://host:port/"
  bool requires_token() const;         // off loopback: every request carries the token
  void stop();

 private:
  HttpResponse route(const HttpRequest& req);
  HttpResponse jobs();
  HttpResponse job(const std::string& id, const std::string& after);
  HttpResponse trace(const std::string& id);
  HttpResponse metrics();

  DashboardOptions opt_;
  Ask ask_;
  std::unique_ptr<JobHistory> history_;
  std::unique_ptr<HttpServer> http_;
};

// Hands the coordinator's events (its actor thread) to a dashboard that starts after the
// coordinator and stops before it. Shared with the event callback, so the callback may
// outlive the dashboard: after detach() returns, no event reaches the old one.
class DashboardFeed {
 public:
  void attach(DashboardServer* d) {
    std::lock_guard<std::mutex> lock(mu_);
    to_ = d;
  }
  void detach() { attach(nullptr); }
  // Declared after the dashboard it guards: however the scope ends, the feed lets go of the
  // dashboard before the dashboard is destroyed.
  struct DetachOnExit {
    DashboardFeed& feed;
    ~DetachOnExit() { feed.detach(); }
  };
  void publish(const std::string& event_json) noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    if (to_) to_->on_event(event_json);
  }

 private:
  std::mutex mu_;
  DashboardServer* to_ = nullptr;
};

}  // namespace troupe::coord

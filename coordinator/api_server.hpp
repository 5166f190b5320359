// The client API over ZeroMQ: a ROUTER socket answers JSON requests, a PUB
// socket sends JSON events. One thread owns both sockets (ZeroMQ sockets are
// not thread-safe); other threads hand it events through publish().
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace troupe::coord {

struct ApiOptions {
  std::string endpoint = "tcp://127.0.0.1:5555";  // ROUTER; port 0 or * = ephemeral
  std::string pub_endpoint;                       // "" = same host, next port (ephemeral if ROUTER is)
  std::string token;                              // required in every request when set
  int64_t max_message_bytes = 16 << 20;           // larger messages drop their connection (ZMQ_MAXMSGSIZE)
};

// True for 127.0.0.0/8, ::1, localhost and ipc:// / inproc:// endpoints.
bool is_loopback_endpoint(const std::string& endpoint);

class ApiServer {
 public:
  // Answers one request (a JSON text that parsed as an object with an "op"); blocking.
  using Handler = std::function<std::string(const std::string& request)>;

  // Binds both sockets; throws troupe::Error if it cannot, or if a
  // non-loopback endpoint has no token.
  ApiServer(ApiOptions options, Handler handler);
  ~ApiServer();
  ApiServer(const ApiServer&) = delete;
  ApiServer& operator=(const ApiServer&) = delete;

  // The bound endpoints, with real ports.
  const std::string& endpoint() const { return endpoint_; }
  const std::string& pub_endpoint() const { return pub_endpoint_; }

  void publish(std::string event_json);
  void stop();

  int64_t requests() const { return requests_.load(); }

 private:
  void loop();
  std::string answer(const std::string& payload);

  ApiOptions opt_;
  Handler handler_;
  struct Sockets;
  Sockets* sockets_ = nullptr;
  std::string endpoint_, pub_endpoint_;
  std::mutex mu_;
  std::deque<std::string> events_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> requests_{0};
  std::thread thread_;
};

}  // namespace troupe::coord

// The client API over ZeroMQ: a ROUTER socket answers JSON requests, a PUB
// socket sends JSON events. One thread owns every socket (ZeroMQ sockets are
// not thread-safe); other threads hand it events through publish().
//
// Both carry the token, on loopback too: every request has it in its "token" field, and a
// subscriber proves it before it is sent a single event. The PUB socket is a ZMQ_PLAIN
// server whose password is the token; this thread answers ZeroMQ's authentication requests
// (ZAP, RFC 27) on inproc://zeromq.zap.01, comparing in constant time. Every socket has a
// message limit (ZMQ_MAXMSGSIZE): a peer that announces a larger frame is disconnected before
// its bytes are buffered.
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
  std::string token;                              // required in every request, and of every subscriber
  int64_t max_message_bytes = 16 << 20;           // larger messages drop their connection (ZMQ_MAXMSGSIZE)
  // What a subscriber sends: its authentication (the token: 64 bytes) and its subscriptions (a
  // topic prefix each; troupe's clients subscribe to ""). ZeroMQ keeps subscriptions in a trie
  // with a level per byte, so a long one is also deep.
  int64_t max_subscriber_message_bytes = 4 << 10;
};

// True for 127.0.0.0/8, ::1, localhost and ipc:// / inproc:// endpoints.
bool is_loopback_endpoint(const std::string& endpoint);

class ApiServer {
 public:
  // Answers one request (a JSON text that parsed as an object with an "op"); blocking.
  using Handler = std::function<std::string(const std::string& request)>;

  // Binds both sockets; throws troupe::Error if it cannot, or without a token.
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
  // Subscribers let in, and turned away for a wrong or missing token (ZAP answers).
  int64_t subscribers_admitted() const { return admitted_.load(); }
  int64_t subscribers_refused() const { return refused_.load(); }

 private:
  void loop();
  std::string answer(const std::string& payload);
  void answer_zap();

  ApiOptions opt_;
  Handler handler_;
  struct Sockets;
  Sockets* sockets_ = nullptr;
  std::string endpoint_, pub_endpoint_;
  std::mutex mu_;
  std::deque<std::string> events_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> requests_{0};
  std::atomic<int64_t> admitted_{0}, refused_{0};
  std::thread thread_;
};

}  // namespace troupe::coord

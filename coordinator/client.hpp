// A client of the coordinator's ZeroMQ API (used by `troupe submit|status|list|watch|cancel`).
#pragma once

#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace troupe::coord {

struct ClientOptions {
  std::string endpoint = "tcp://127.0.0.1:5555";
  std::string token;  // added to every request when set
  std::chrono::milliseconds timeout{10000};
};

// Sends one request and returns the reply; a timeout or a transport failure
// comes back as {"ok":false,"error":"unreachable",...}.
nlohmann::json api_call(const ClientOptions& options, nlohmann::json request);

// The largest reply or event a client takes (ZMQ_MAXMSGSIZE on its sockets): a peer that
// pretends to be the coordinator cannot make it buffer more.
inline constexpr int64_t kMaxReplyBytes = int64_t(256) << 20;

enum class WatchEnd {
  stopped,  // on_event returned false
  idle,     // no event within idle_timeout
  refused,  // the coordinator turned the token away (a wrong or missing token)
};

// Subscribes to the PUB endpoint, proving `token` (ZMQ_PLAIN; the coordinator admits no
// subscriber without it), and calls on_event for each event until it returns false, the
// timeout passes without any event, or the token is refused.
WatchEnd watch_events(const std::string& pub_endpoint, const std::string& token,
                      const std::function<bool(const nlohmann::json&)>& on_event,
                      std::chrono::milliseconds idle_timeout);

}  // namespace troupe::coord

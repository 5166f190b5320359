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

// Subscribes to the PUB endpoint and calls on_event for each event until it
// returns false or the timeout passes without any event (returns false then).
bool watch_events(const std::string& pub_endpoint, const std::function<bool(const nlohmann::json&)>& on_event,
                  std::chrono::milliseconds idle_timeout);

}  // namespace troupe::coord

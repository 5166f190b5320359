// The client API's requests, answered from the coordinator's state (plain C++;
// the ZeroMQ transport is api_server.hpp). docs/api.md documents every message.
//
//   {"op":"submit","spec":"<yaml>","filename":"job.yaml"} -> {"ok":true,"job":"<id>","state":"queued",...}
//   {"op":"status","job":"<id>"}                          -> {"ok":true,"job":{...}}
//   {"op":"list"}                                         ->
//   {"ok":true,"jobs":[...],"agents":[...],"devices":{...}}
//   {"op":"cancel","job":"<id>"}                          -> {"ok":true,"job":"<id>","state":"cancelled"}
//   {"op":"scale","job":"<id>","devices":N}               -> {"ok":true,"job":"<id>","devices":N,"after_step":S,...}
// Failures: {"ok":false,"error":"<name>","message":"..."}. The ZeroMQ server
// refuses bytes that are not UTF-8 before they reach here (bad_request).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "coordinator/state.hpp"

namespace troupe::coord {

nlohmann::json api_error(const std::string& name, const std::string& message);

// Answers one request (already parsed JSON). Side effects go to *out.
nlohmann::json handle_api_request(CoordinatorState& state, const nlohmann::json& request, Actions* out);

}  // namespace troupe::coord

// The client API's requests, answered from the coordinator's state (plain C++;
// the ZeroMQ transport is api_server.hpp). docs/api.md documents every message.
//
//   {"op":"submit","spec":"<yaml>","filename":"job.yaml","resume":"<ckpt dir>"}
//       -> {"ok":true,"job":"<id>","state":"queued","reason":"...","run_dir":"..."}
//       (state: queued, or launching when it was placed at once; filename and resume are
//       optional; errors invalid_spec with "diagnostics", invalid_job)
//   {"op":"status","job":"<id>","workers_from":0,"workers_limit":256,"worker_fields":["rank"]}
//       -> {"ok":true,"job":{...}}  (state.hpp: job_json; the page is optional: by default the
//       first 256 workers, at most 4096; "workers_next" names the next page's first rank;
//       worker_fields is optional too: each worker's fields, by default all)
//   {"op":"list","agents_from":0,"agents_limit":256}
//       -> {"ok":true,"jobs":[...],"agents":[...],"agents_total":N,"devices":{...}}
//       (agents: one page, as status's workers; "agents_next" names the next page's first)
//   {"op":"cancel","job":"<id>"} -> {"ok":true,"job":"<id>","state":"cancelled"}
//       (errors unknown_job, already_finished)
//   {"op":"scale","job":"<id>","devices":N}
//       -> {"ok":true,"job":"<id>","devices":N,"after_step":S,"from_layout":"2x1x1"}
//       (a drain after step S, then a relaunch at the new size; errors unknown_job, cannot_scale)
// Failures: {"ok":false,"error":"<name>","message":"..."}; a missing or mistyped
// field is bad_request, another op unknown_op. Before a request reaches here the
// ZeroMQ server has checked its token (unauthorized), that it is UTF-8 and a JSON
// object (bad_request, bad_json), and answered "info" itself. These are names of
// refused requests; why a job failed is its "failure" (core/failure.hpp), where
// invalid_spec names a spec that a worker's engine refused.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "coordinator/state.hpp"
#include "core/json_read.hpp"

namespace troupe::coord {

// The bounds the API's JSON is read under (core/json_read.hpp): a request at most the
// socket's message limit (16 MiB), nested at most 16 deep (no request nests more than 2); a
// reply or an event at most 256 MiB and 64 deep.
json_read::Limits api_request_limits();
json_read::Limits api_reply_limits();

nlohmann::json api_error(const std::string& name, const std::string& message);

// Answers one request (already parsed JSON). Side effects go to *out.
nlohmann::json handle_api_request(CoordinatorState& state, const nlohmann::json& request, Actions* out);

}  // namespace troupe::coord

// The one line a coordinator event leaves in its run's events.log and on the
// dashboard's timeline.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace troupe::coord {

// {"event":"failure","cause":"worker_killed","generation":1,"message":"rank 1 ...","where":"step 7: B2"}
//   -> "failure worker_killed in generation 1: rank 1 ... [rank was in: step 7: B2]".
// "" for the events that leave no line (step, agent).
std::string event_text(const nlohmann::json& event);

}  // namespace troupe::coord

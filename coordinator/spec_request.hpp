// JobSpec (core/spec.hpp) -> the JobRequest the coordinator schedules.
#pragma once

#include <string>

#include "coordinator/state.hpp"
#include "core/spec.hpp"

namespace troupe::coord {

// A degree left "auto" (0) is planned as 1 until the cost-model planner fills it.
JobRequest job_request(const JobSpec& spec);

// Parses and validates YAML text (throws troupe::SpecError) into a request.
JobRequest job_request_from_yaml(const std::string& yaml_text, const std::string& filename);

}  // namespace troupe::coord

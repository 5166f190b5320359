// JobSpec (core/spec.hpp) -> the JobRequest the coordinator schedules.
#pragma once

#include <string>

#include "coordinator/state.hpp"
#include "core/spec.hpp"

namespace troupe::coord {

// A spec that leaves anything to the planner (plan::has_auto) becomes an auto request, with
// the hardware profile it is planned with: the spec's resources.hardware, else
// `default_hardware` (a profile's YAML; `troupe coordinator --hardware`), else the device's
// default (plan::default_hardware_name). Throws troupe::SpecError when the profile is unknown.
JobRequest job_request(const JobSpec& spec, const std::string& default_hardware = "");

// Parses and validates YAML text (throws troupe::SpecError) into a request.
JobRequest job_request_from_yaml(const std::string& yaml_text, const std::string& filename,
                                 const std::string& default_hardware = "");

}  // namespace troupe::coord

#include "coordinator/spec_request.hpp"

namespace troupe::coord {

JobRequest job_request(const JobSpec& spec) {
  JobRequest r;
  r.name = spec.name;
  r.spec_yaml = to_yaml(spec);
  r.device_kind = to_string(spec.resources.device);
  auto degree = [](int d) { return d > 0 ? d : 1; };
  r.layout = {degree(spec.parallel.data), degree(spec.parallel.pipeline), degree(spec.parallel.tensor)};
  r.n_layers = spec.model.n_layers > 0 ? spec.model.n_layers : 1;
  r.total_steps = spec.train.steps;
  return r;
}

JobRequest job_request_from_yaml(const std::string& yaml_text, const std::string& filename) {
  return job_request(parse_spec(yaml_text, filename));
}

}  // namespace troupe::coord

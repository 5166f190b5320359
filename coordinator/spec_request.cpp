#include "coordinator/spec_request.hpp"

namespace troupe::coord {

JobRequest job_request(const JobSpec& spec) {
  JobRequest r;
  r.name = spec.name;
  r.spec_yaml = to_yaml(spec);
  r.device_kind = to_string(spec.resources.device);
  auto degree = [](int d) { return d > 0 ? d : 1; };
  r.layout = {degree(spec.parallel.data), degree(spec.parallel.pipeline), degree(spec.parallel.tensor)};
  r.plan = plan::plan_inputs(spec);
  r.total_steps = spec.train.steps;
  r.checkpoint_dir = spec.checkpoint.dir;
  r.checkpoint_keep = spec.checkpoint.keep;
  r.max_restarts = spec.fault.max_restarts;
  r.step_timeout_ms = static_cast<double>(spec.fault.step_timeout.count());
  r.min_devices = spec.elastic.min_devices;
  r.max_devices = spec.elastic.max_devices;
  return r;
}

JobRequest job_request_from_yaml(const std::string& yaml_text, const std::string& filename) {
  JobSpec spec = parse_spec(yaml_text, filename);
  require_runnable(spec);  // a job no worker can start is refused at submit, not retried
  return job_request(spec);
}

}  // namespace troupe::coord

#include "coordinator/spec_request.hpp"

namespace troupe::coord {

JobRequest job_request(const JobSpec& spec) {
  JobRequest r;
  r.name = spec.name;
  r.spec_yaml = to_yaml(spec);
  r.device_kind = to_string(spec.resources.device);
  r.layout = layout_of(spec.parallel);
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
  JobRequest r = job_request(spec);
  // So is a layout the plan cannot split the model, the batch or the schedule over.
  try {
    plan::make_plan(r.plan, r.layout);
  } catch (const Error& e) {
    throw SpecError({Diagnostic{filename, 0, 0, "no plan for layout " + r.layout.str() + ": " + e.what(),
                                "troupe plan " + (filename.empty() ? std::string("JOB.yaml") : filename) +
                                    " shows what a layout runs"}});
  }
  return r;
}

}  // namespace troupe::coord

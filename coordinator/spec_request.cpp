#include "coordinator/spec_request.hpp"

#include "plan/fit.hpp"
#include "plan/hardware.hpp"
#include "plan/planner.hpp"

namespace troupe::coord {

namespace {

// The profile an auto job is planned with, as YAML.
std::string hardware_of(const JobSpec& spec, const std::string& default_hardware) {
  if (spec.resources.hardware.empty() && !default_hardware.empty()) return default_hardware;
  const std::string name = !spec.resources.hardware.empty()
                               ? spec.resources.hardware
                               : plan::default_hardware_name(spec.resources.device);
  try {
    return plan::to_yaml(plan::find_hardware(name));
  } catch (const SpecError& e) {
    throw SpecError({Diagnostic{spec.source_file, 0, 0, "hardware profile '" + name + "': " + e.what(), ""}});
  } catch (const std::exception& e) {
    auto at = spec.positions.find("resources.hardware");
    throw SpecError({Diagnostic{spec.source_file, at == spec.positions.end() ? 0 : at->second.line,
                                at == spec.positions.end() ? 0 : at->second.col, e.what(),
                                "resources.hardware names a profile of configs/hardware/ or a calibrated one "
                                "(troupe plan --calibrate)"}});
  }
}

}  // namespace

JobRequest job_request(const JobSpec& spec, const std::string& default_hardware) {
  JobRequest r;
  r.name = spec.name;
  r.spec_yaml = to_yaml(spec);
  r.device_kind = to_string(spec.resources.device);
  r.layout = layout_of(spec.parallel);
  r.plan = plan::plan_inputs(spec);
  r.total_steps = spec.train.steps;
  r.checkpoint_dir = spec.checkpoint.dir;
  r.checkpoint_keep = spec.checkpoint.keep;
  // What the engine decides for itself (worker/engine_memory.cpp: memory_snapshots()).
  r.memory_snapshots = spec.checkpoint.memory_every > 0 && spec.resources.device == DeviceKind::cpu &&
                       spec.train.offload == Offload::none;
  r.max_restarts = spec.fault.max_restarts;
  r.step_timeout_ms = static_cast<double>(spec.fault.step_timeout.count());
  r.min_devices = spec.elastic.min_devices;
  r.max_devices = spec.elastic.max_devices;
  r.spares = spec.resources.spares;
  r.spread = spec.resources.placement == Placement::spread;
  r.replicated = spec.train.zero == 0;
  r.auto_plan = plan::has_auto(spec);
  if (r.auto_plan) r.hardware_yaml = hardware_of(spec, default_hardware);
  return r;
}

JobRequest job_request_from_yaml(const std::string& yaml_text, const std::string& filename,
                                 const std::string& default_hardware) {
  JobSpec spec = parse_spec(yaml_text, filename);
  require_runnable(spec);             // a job no worker can start is refused at submit, not retried
  plan::require_fits_hardware(spec);  // nor one no device could hold
  JobRequest r = job_request(spec, default_hardware);
  if (r.auto_plan && r.spares > 0) {
    auto at = spec.positions.find("resources.spares");
    throw SpecError({Diagnostic{filename, at == spec.positions.end() ? 0 : at->second.line,
                                at == spec.positions.end() ? 0 : at->second.col,
                                "resources.spares: " + std::to_string(r.spares) +
                                    ": hot spares take the places of a fixed layout; this spec leaves "
                                    "its layout to the planner (parallel: auto)",
                                "fix parallel.data, pipeline and tensor, or delete resources.spares"}});
  }
  // An auto job is planned at launch, for the devices there are then.
  if (r.auto_plan) return r;
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

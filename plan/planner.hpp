// The planner: every (data, pipeline, tensor, virtual stages, micro-batch, recompute)
// that divides the model and the batch, priced by the cost model (plan/cost_model.hpp)
// and ranked by predicted step time; the rest with the reason. What a spec fixes stays
// fixed: a degree written as a number, micro_batch, recompute, virtual_stages; what it
// leaves `auto` is searched.
//
// Devices: a search plans for exactly `devices` devices; only when no layout of that many
// can be planned at all (none divides the model and the batch) does it try one fewer,
// and so on. A spec whose three degrees are numbers holds that one layout.
//
// The choice (best()) is the fastest plan that fits in memory and that troupe's engine
// runs today; `troupe plan` shows the others too, marked.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/spec.hpp"
#include "plan/cost_model.hpp"
#include "plan/hardware.hpp"

namespace troupe::plan {

struct PlanRequest {
  Workload work;
  int devices = 1;  // the devices there are
  // What the spec fixes (0 / nullopt: the planner chooses).
  int data = 0, pipeline = 0, tensor = 0;
  int micro_batch = 0;
  std::optional<Recompute> recompute;
  int virtual_stages = 0;      // 0: 1, or searched from 2 up under the interleaved schedule
  double memory_limit = 0;     // bytes per device (resources.memory_per_device); 0: the profile's
  bool time_if_unfit = false;  // price the time of candidates that do not fit too (a spec that fixes all)
};
// What the spec fixes and leaves to the planner, for `devices` devices.
PlanRequest plan_request(const JobSpec& spec, int devices);

// A candidate that is not ranked: refused (the model, the batch or the schedule does not split
// that way) or priced and found not to fit a device's memory.
struct Rejected {
  std::string candidate;  // Candidate::str()
  Layout layout;
  std::string reason;
  bool memory = false;  // it was priced: PlanResult::plans holds it too (fits false)
};

// Every candidate the search counts is accounted for once: ranked (a plan that fits) or
// rejected with its reason, so candidates == ranked() + rejected.size().
struct PlanResult {
  // Every candidate that can be planned: those that fit, fastest first, then those that do not
  // (priced for memory only; each is also in `rejected`).
  std::vector<Estimate> plans;
  std::vector<Rejected> rejected;  // those refused or that do not fit, each with why
  int devices = 0;                 // devices the plans use
  size_t candidates = 0;           // examined, over every device count tried
  double seconds = 0;              // the search took
  double memory_limit = 0;         // bytes per device the plans were held to
  // Plans that fit (the ranked ones).
  size_t ranked() const;
  // The fastest plan that fits and that troupe runs, or nullptr.
  const Estimate* best() const;
  // The fastest plan that fits, whether troupe runs it or not (a GPU job today), or nullptr.
  const Estimate* fastest() const;
  // Why best() won (or why there is none): its figures against the runner-up's, or, when
  // nothing fits, the smallest memory a plan needs and what would help.
  std::string explain(const HardwareProfile& hw) const;
};

PlanResult search(const PlanRequest& req, const HardwareProfile& hw);

// The spec with a candidate written in: the three degrees, micro_batch, recompute and (under
// the interleaved schedule) virtual_stages — what a generation of an auto job runs.
JobSpec resolve(const JobSpec& spec, const Candidate& c);

// Plans an auto job for `devices` devices: the spec of best() and its estimate, with why it
// was chosen. Throws troupe::Error with PlanResult::explain() when nothing can be chosen.
struct Choice {
  JobSpec spec;
  Estimate estimate;
  std::string why;
  size_t candidates = 0;
};
Choice choose(const JobSpec& spec, int devices, const HardwareProfile& hw);
// Whether the spec leaves anything to the planner (a degree, micro_batch, recompute or
// virtual_stages written as auto).
bool has_auto(const JobSpec& spec);

// The devices an auto job is planned for on a machine of `available` devices: all of them,
// capped by elastic.max_devices when given.
int planned_devices(const JobSpec& spec, int available);

}  // namespace troupe::plan

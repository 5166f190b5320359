// The JSON views of CoordinatorState that the client API answers with
// (docs/api.md: status, list).
#include <algorithm>

#include "coordinator/state.hpp"

namespace troupe::coord {

nlohmann::json CoordinatorState::job_json(const Job& j) const {
  nlohmann::json workers = nlohmann::json::array();
  const double now = now_ms();
  for (size_t r = 0; r < j.ranks.size(); ++r) {
    const RankSlot& s = j.ranks[r];
    workers.push_back({{"rank", r},
                       {"agent", s.device.agent_id},
                       {"host", s.host},
                       {"device", s.device.device},
                       {"pid", s.pid},
                       {"where", s.where},
                       {"registered", s.registered},
                       {"done", s.done},
                       {"exited", s.exited}});
    if (s.where_ms > 0) workers.back()["heartbeat_age_s"] = std::max(0.0, (now - s.where_ms) / 1000.0);
    // Where the rank sits in the generation's plan: the same line its worker log prints.
    // (A job restored from the table has no plan until its next launch.)
    if (j.plan.layout == j.layout && int(r) < j.plan.layout.world() && !j.plan.partition.chunks.empty()) {
      const plan::RankPlace place = plan::rank_place(j.plan, int(r));
      workers.back().update({{"dp", place.coord.d},
                             {"pp", place.coord.p},
                             {"tp", place.coord.t},
                             {"layers", plan::layers_str(place.chunks)},
                             {"place", place.str()}});
    }
  }
  nlohmann::json out = {
      {"id", j.id},
      {"name", j.request.name},
      {"state", to_string(j.state)},
      {"reason", j.reason},
      {"failure", j.failure ? to_string(*j.failure) : ""},
      {"layout", j.layout.str()},
      {"planned_layout", j.request.auto_plan ? std::string("auto") : j.request.layout.str()},
      {"world", j.layout.world()},
      {"restarts", j.restarts},
      {"max_restarts", j.request.max_restarts},
      {"resume_from", j.resume_from},
      {"memory_step", j.memory_step},
      {"buddy_shift", j.buddy_shift},
      {"failures", j.failures},
      {"device_kind", j.request.device_kind},
      {"generation", j.generation},
      {"run_dir", j.run_dir},
      {"steps_done", j.last_step + 1},
      {"total_steps", j.request.total_steps},
      {"control_messages", j.control_messages},
      {"workers", workers}};
  nlohmann::json spares = nlohmann::json::array();
  for (const Spare& v : j.spares)
    spares.push_back({{"agent", v.device.agent_id},
                      {"host", v.host},
                      {"device", v.device.device},
                      {"pid", v.pid},
                      {"ready", v.ready}});
  out["spares"] = spares;
  if (j.last_step >= 0) out["loss"] = j.last_loss;
  if (j.planned.is_object()) {
    // What the planner chose for this generation, and why.
    nlohmann::json p = j.planned;
    p.erase("event");
    p.erase("job");
    out["plan"] = p;
  }
  if (j.first_step_ms > 0) out["first_step_latency_ms"] = j.first_step_ms - j.submitted_ms;
  if (j.finished_ms > 0) out["duration_ms"] = j.finished_ms - j.submitted_ms;
  return out;
}

nlohmann::json CoordinatorState::list_json() const {
  nlohmann::json jobs = nlohmann::json::array();
  for (const auto& id : order_) {
    const Job& j = jobs_.at(id);
    jobs.push_back({{"id", j.id},
                    {"name", j.request.name},
                    {"state", to_string(j.state)},
                    {"reason", j.reason},
                    {"layout", j.layout.str()},
                    {"generation", j.generation},
                    {"restarts", j.restarts},
                    {"steps_done", j.last_step + 1},
                    {"total_steps", j.request.total_steps}});
  }
  nlohmann::json devices;
  for (const char* kind : {"cpu", "cuda"})
    devices[kind] = {{"total", registry_.total(kind)}, {"free", registry_.free(kind)}};
  return {{"jobs", jobs}, {"agents", registry_.to_json()}, {"devices", devices}};
}

}  // namespace troupe::coord

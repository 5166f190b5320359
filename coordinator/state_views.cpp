// The JSON views of CoordinatorState that the client API answers with
// (docs/api.md: status, list).
#include <algorithm>

#include "coordinator/state.hpp"

namespace troupe::coord {

// At most this many distinct "where" answers in a failure event or a status summary.
constexpr size_t kWhereGroups = 32;

// "0-3,5,7-9" for ranks in ascending order.
static std::string rank_ranges(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    out +=
        (out.empty() ? "" : ",") + std::to_string(ranks[i]) + (j > i ? "-" + std::to_string(ranks[j]) : "");
    i = j + 1;
  }
  return out;
}

// A failure event (kept in status, up to 32 of them) and the status summary so grow with the
// ranks' distinct states, not their number.
nlohmann::json where_groups(const std::vector<RankSlot>& ranks, int* more) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  std::map<std::string, size_t> index;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const std::string& w = ranks[r].where;
    if (w.empty()) continue;
    auto it = index.find(w);
    if (it == index.end()) {
      if (groups.size() >= kWhereGroups) {
        ++*more;
        continue;
      }
      it = index.emplace(w, groups.size()).first;
      groups.push_back({w, {}});
    }
    groups[it->second].second.push_back(static_cast<int>(r));
  }
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [w, rs] : groups) out[w] = rank_ranges(rs);
  return out;
}

const std::vector<std::string>& WorkerFields::names() {
  static const std::vector<std::string> n = {"rank",  "agent",      "host", "device", "pid",
                                             "where", "registered", "done", "exited", "heartbeat_age_s",
                                             "dp",    "pp",         "tp",   "layers", "place"};
  static_assert(kCount == 15, "a name for every field");
  return n;
}

bool WorkerFields::parse(const nlohmann::json& list, WorkerFields* out, std::string* why) {
  const auto& known = names();
  auto known_list = [&] {
    std::string s;
    for (const auto& k : known) s += (s.empty() ? "" : ", ") + k;
    return s;
  };
  if (!list.is_array() || list.empty() || list.size() > known.size()) {
    *why = "'worker_fields' must be a list of 1 to " + std::to_string(known.size()) + " of " + known_list();
    return false;
  }
  out->mask = 0;
  for (const auto& f : list) {
    auto it =
        f.is_string() ? std::find(known.begin(), known.end(), f.get_ref<const std::string&>()) : known.end();
    if (it == known.end()) {
      *why = "'worker_fields' names " +
             (f.is_string() ? "'" + f.get<std::string>().substr(0, 64) + "'" : f.type_name()) +
             ", not a worker's field (" + known_list() + ")";
      return false;
    }
    out->mask |= uint32_t{1} << (it - known.begin());
  }
  return true;
}

nlohmann::json CoordinatorState::job_json(const Job& j, const ListPage& page,
                                          const WorkerFields& fields) const {
  // The page of workers [from, from + limit), each with the fields asked for; every rank only
  // in the summary.
  const size_t n = j.ranks.size();
  const auto [from, to] = page.range(n);
  nlohmann::json workers = nlohmann::json::array();
  const double now = now_ms();
  const bool placed = j.plan.layout == j.layout && !j.plan.partition.chunks.empty();
  using F = WorkerFields;
  const bool with_plan = fields.has(F::dp) || fields.has(F::pp) || fields.has(F::tp) ||
                         fields.has(F::layers) || fields.has(F::place);
  for (size_t r = from; r < to; ++r) {
    const RankSlot& s = j.ranks[r];
    nlohmann::json w = nlohmann::json::object();
    if (fields.has(F::rank)) w["rank"] = r;
    if (fields.has(F::agent)) w["agent"] = s.device.agent_id;
    if (fields.has(F::host)) w["host"] = s.host;
    if (fields.has(F::device)) w["device"] = s.device.device;
    if (fields.has(F::pid)) w["pid"] = s.pid;
    if (fields.has(F::where)) w["where"] = s.where;
    if (fields.has(F::registered)) w["registered"] = s.registered;
    if (fields.has(F::done)) w["done"] = s.done;
    if (fields.has(F::exited)) w["exited"] = s.exited;
    if (fields.has(F::heartbeat_age_s) && s.where_ms > 0)
      w["heartbeat_age_s"] = std::max(0.0, (now - s.where_ms) / 1000.0);
    // Where the rank sits in the generation's plan: the same line its worker log prints.
    // (A job restored from the table has no plan until its next launch.)
    if (with_plan && placed && int(r) < j.plan.layout.world()) {
      const plan::RankPlace place = plan::rank_place(j.plan, int(r));
      if (fields.has(F::dp)) w["dp"] = place.coord.d;
      if (fields.has(F::pp)) w["pp"] = place.coord.p;
      if (fields.has(F::tp)) w["tp"] = place.coord.t;
      if (fields.has(F::layers)) w["layers"] = plan::layers_str(place.chunks);
      if (fields.has(F::place)) w["place"] = place.str();
    }
    workers.push_back(std::move(w));
  }
  int registered = 0, done = 0, exited = 0, where_more = 0;
  double oldest_s = -1;
  int oldest_rank = -1;
  for (size_t r = 0; r < n; ++r) {
    const RankSlot& s = j.ranks[r];
    registered += s.registered ? 1 : 0;
    done += s.done ? 1 : 0;
    exited += s.exited ? 1 : 0;
    const double age = s.where_ms > 0 ? std::max(0.0, (now - s.where_ms) / 1000.0) : -1;
    if (age > oldest_s) {
      oldest_s = age;
      oldest_rank = static_cast<int>(r);
    }
  }
  nlohmann::json summary = {{"ranks", n},
                            {"registered", registered},
                            {"done", done},
                            {"exited", exited},
                            {"where", where_groups(j.ranks, &where_more)}};
  if (where_more > 0) summary["where_more"] = where_more;
  if (oldest_rank >= 0) {
    summary["heartbeat_age_max_s"] = oldest_s;
    summary["heartbeat_age_max_rank"] = oldest_rank;
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
      {"workers_total", n},
      {"workers_from", from},
      {"worker_summary", std::move(summary)}};
  if (to < n) out["workers_next"] = to;
  out["workers"] = std::move(workers);
  nlohmann::json spares = nlohmann::json::array();
  for (const Spare& v : j.spares)
    spares.push_back({{"agent", v.device.agent_id},
                      {"host", v.host},
                      {"device", v.device.device},
                      {"pid", v.pid},
                      {"ready", v.ready}});
  out["spares"] = std::move(spares);
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

nlohmann::json CoordinatorState::list_json(const ListPage& page) const {
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
  const size_t total = registry_.agents().size();
  const auto [from, to] = page.range(total);
  nlohmann::json out = {{"jobs", std::move(jobs)},
                        {"agents", registry_.to_json(from, to - from)},
                        {"agents_total", total},
                        {"agents_from", from},
                        {"devices", std::move(devices)}};
  if (to < total) out["agents_next"] = to;
  return out;
}

}  // namespace troupe::coord

#include "bench/scale/observed.hpp"

#include <sstream>

namespace troupe::scale {

namespace {
void note(Observed& o, const std::string& what) {
  if (o.problems.size() < 200) o.problems.push_back(what);
}
std::string rest_of(std::istringstream& in) {
  std::string r;
  std::getline(in, r);
  return r.empty() ? r : r.substr(1);
}
}  // namespace

bool rendezvoused(const RankSeen& r) { return r.nccl_ok && (r.gloo_ok || r.gloo_requests < 0); }

RankSeen& Observed::rank(int gen, int r) {
  auto& v = gens[gen];
  if (v.empty()) v.resize(static_cast<size_t>(ranks));
  static RankSeen none;
  if (r < 0 || r >= ranks) return none = RankSeen{};
  return v[static_cast<size_t>(r)];
}

int Observed::count(int gen, bool (*pred)(const RankSeen&)) const {
  auto it = gens.find(gen);
  if (it == gens.end()) return 0;
  int n = 0;
  for (const auto& r : it->second) n += pred(r) ? 1 : 0;
  return n;
}

const nlohmann::json* Observed::failure_of(int gen) const {
  for (const auto& [e, t] : failures)
    if (e.value("generation", -1) == gen) return &e;
  return nullptr;
}

void Observed::take_sim_line(int sim, const std::string& line) {
  std::istringstream in(line);
  std::string kind;
  in >> kind;
  if (kind == "agent") {
    int a = -1;
    std::string what;
    in >> a >> what;
    int64_t t = 0;
    if (what == "registered" && in >> t) {
      registered[a] = t;
      agent_sim[a] = sim;
    } else if (what == "lost" && in >> t && t > 0) {
      agent_lost[a] = t;
      registered.erase(a);
    } else if (what == "stopped") {
      note(*this, "agent " + std::to_string(a) + " stopped: " + rest_of(in));
    } else if (what == "retry") {  // counted apart: a loaded registration has hundreds
      if (++connect_retries <= 10) note(*this, "agent " + std::to_string(a) + " retry: " + rest_of(in));
    }
    return;
  }
  if (kind == "step" || kind == "ckpt") {
    int gen = 0;
    int64_t step = 0, count = 0;
    in >> gen >> step >> count;
    if (kind == "step") {
      int64_t t = 0;
      in >> t;
      StepSeen& s = steps[{gen, step}];
      s.count += count;
      s.last_sent = std::max(s.last_sent, t);
    } else {
      int64_t first = 0, last = 0, reply = 0, fails = 0;
      in >> first >> last >> reply >> fails;
      CkptSeen& c = ckpts[{gen, step}];
      c.count += count;
      c.first_sent = c.first_sent == 0 ? first : std::min(c.first_sent, first);
      c.last_sent = std::max(c.last_sent, last);
      c.last_reply = std::max(c.last_reply, reply);
      c.fails += fails;
      if (fails > 0 && c.error.empty()) c.error = rest_of(in);
    }
    return;
  }
  int gen = -1, r = -1;
  int64_t t = 0;
  in >> gen >> r;
  if (kind == "killed" || kind == "hung") {
    in >> t;
    if (t > 0)
      (kind == "killed" ? killed : hung)[{gen, r}] = t;
    else
      note(*this, line);
    return;
  }
  RankSeen& s = rank(gen, r);
  if (kind == "launch") {
    in >> s.launch >> s.agent;
    s.sim = sim;
  } else if (kind == "connected") {
    in >> s.connected;
  } else if (kind == "connect_failed") {
    in >> t;
    s.failed = true;
    s.error = rest_of(in);
    note(*this, line);
  } else if (kind == "assigned") {
    int ok = 0;
    in >> s.assigned >> ok;
    s.assigned_ok = ok == 1;
    if (!s.assigned_ok) {
      s.error = rest_of(in);
      note(*this, line);
    }
  } else if (kind == "rdv") {
    std::string pattern;
    int ok = 0;
    int64_t requests = 0, ns = 0;
    int skipped = 0;
    in >> pattern >> t >> ok >> requests >> ns >> skipped;
    const bool nccl = pattern == "nccl";
    (nccl ? s.nccl : s.gloo) = t;
    (nccl ? s.nccl_ok : s.gloo_ok) = ok == 1;
    (nccl ? s.nccl_requests : s.gloo_requests) = requests;
    if (!nccl) s.gloo_skipped = skipped;
    if (nccl && ok == 1 && !gloo) s.gloo_requests = -1;  // no gloo pattern to wait for
    if (ok != 1) {
      s.failed = true;
      s.error = rest_of(in);
      note(*this, line);
    }
  } else if (kind == "abort") {
    in >> s.abort;
  } else if (kind == "exit") {
    in >> s.exit_code >> s.exit;
  }
}

void Observed::take_event(const nlohmann::json& e, int64_t t) {
  const std::string kind = e.value("event", "");
  if (kind == "step" && e.contains("metrics")) {
    const auto& m = e["metrics"];
    step_events.emplace(std::make_pair(m.value("generation", -1), m.value("step", int64_t(-1))), t);
  } else if (kind == "failure") {
    failures.emplace_back(e, t);
  } else if (kind == "checkpoint") {
    checkpoints.emplace_back(e, t);
  } else if (kind == "state") {
    states.emplace_back(e, t);
  }
}

}  // namespace troupe::scale

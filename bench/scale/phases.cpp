// The phases of a scale run (driver_impl.hpp) and the table they print.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "bench/scale/driver_impl.hpp"

namespace troupe::scale {

namespace {

json stats_ms(const std::vector<double>& ms) {
  return {{"n", ms.size()},
          {"p50_ms", percentile(ms, 50)},
          {"p99_ms", percentile(ms, 99)},
          {"max_ms", percentile(ms, 100)}};
}

bool has_step(const Observed& o, int gen) {
  auto it = o.step_events.lower_bound({gen, INT64_MIN});
  return it != o.step_events.end() && it->first.first == gen;
}

}  // namespace

bool Driver::launch_phase(int gen, int64_t from, const std::string& prefix) {
  const int n = o_.ranks;
  const double limit = 120 + 0.05 * n;
  wait(limit, [&] {
    const int ok = obs_.count(gen, [](const RankSeen& r) { return rendezvoused(r); });
    const int bad =
        obs_.count(gen, [](const RankSeen& r) { return r.failed || (r.assigned > 0 && !r.assigned_ok); });
    return ok + bad >= n;
  });
  std::lock_guard<std::mutex> lock(obs_.mu);
  int64_t first = 0, last_launch = 0, connected = 0, assigned = 0, nccl = 0, gloo = 0;
  int launched = 0, assigned_ok = 0, nccl_ok = 0, gloo_ok = 0, skipped = 0;
  int64_t nccl_requests = 0, gloo_requests = 0;
  std::string error;
  for (const RankSeen& r : obs_.gens[gen]) {
    if (r.launch > 0) {
      ++launched;
      first = first == 0 ? r.launch : std::min(first, r.launch);
      last_launch = std::max(last_launch, r.launch);
    }
    connected = std::max(connected, r.connected);
    assigned = std::max(assigned, r.assigned);
    nccl = std::max(nccl, r.nccl);
    gloo = std::max(gloo, r.gloo);
    assigned_ok += r.assigned_ok;
    nccl_ok += r.nccl_ok;
    gloo_ok += r.gloo_ok;
    skipped = std::max(skipped, r.gloo_skipped);
    nccl_requests += r.nccl_requests;
    gloo_requests += std::max<int64_t>(0, r.gloo_requests);
    if (error.empty() && !r.error.empty()) error = r.error;
  }
  const int64_t done = std::max(nccl, obs_.gloo ? gloo : 0);
  results_[prefix] = {{"generation", gen},
                      {"launched", launched},
                      {"first_launch_s", seconds(from, first)},
                      {"all_launched_s", seconds(from, last_launch)},
                      {"connected_s", seconds(first, connected)},
                      {"assigned_s", seconds(first, assigned)},
                      {"nccl_s", seconds(first, nccl)},
                      {"nccl_requests", nccl_requests},
                      {"rendezvoused_s", seconds(from, done)}};
  if (obs_.gloo)
    results_[prefix].update({{"gloo_s", seconds(nccl, gloo)},
                             {"gloo_requests", gloo_requests},
                             {"gloo_groups_skipped", skipped}});
  check(prefix + ": every rank of generation " + std::to_string(gen) + " got its assignment",
        assigned_ok == n,
        std::to_string(assigned_ok) + " of " + std::to_string(n) + (error.empty() ? "" : "; " + error));
  check(prefix + ": every rank read its peers' values (nccl pattern)", nccl_ok == n,
        std::to_string(nccl_ok) + " of " + std::to_string(n));
  if (obs_.gloo)
    check(prefix + ": every rank read its peers' addresses (gloo pattern)", gloo_ok == n,
          std::to_string(gloo_ok) + " of " + std::to_string(n));
  return assigned_ok == n && nccl_ok == n && (!obs_.gloo || gloo_ok == n);
}

void Driver::steady_phase() {
  wait(120, [&] { return has_step(obs_, 0); });
  std::this_thread::sleep_for(std::chrono::seconds(3));
  const auto [c0, h0] = cpu();
  const int64_t ta = now_ns();
  std::this_thread::sleep_for(std::chrono::seconds(o_.steady_s));
  const auto [c1, h1] = cpu();
  const int64_t tb = now_ns();
  const double wall = (tb - ta) / 1e9;
  int64_t sims_rss = 0;
  for (const auto& s : sims_) sims_rss += rss_kib(s->pid());
  const int64_t rss = rss_kib(coordinator_->pid());
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // the last aggregates
  std::vector<double> latency, commit, spread;
  int64_t steps = 0, ckpts = 0, ckpt_fails = 0;
  std::string ckpt_error;
  {
    std::lock_guard<std::mutex> lock(obs_.mu);
    for (const auto& [k, arrival] : obs_.step_events) {
      if (k.first != 0 || arrival < ta || arrival > tb) continue;
      ++steps;
      auto s = obs_.steps.find(k);
      if (s != obs_.steps.end() && s->second.count == o_.ranks)
        latency.push_back((arrival - s->second.last_sent) / 1e6);
    }
    for (const auto& [k, c] : obs_.ckpts) {
      if (k.first != 0) continue;
      ++ckpts;
      ckpt_fails += c.fails;
      if (ckpt_error.empty()) ckpt_error = c.error;
      if (c.count == o_.ranks && c.fails == 0) {
        commit.push_back((c.last_reply - c.last_sent) / 1e6);
        spread.push_back((c.last_reply - c.first_sent) / 1e6);
      }
    }
  }
  results_["steady"] = {{"window_s", wall},
                        {"coordinator_cpu_share", (c1 - c0) / wall},
                        {"harness_cpu_share", (h1 - h0) / wall},
                        {"coordinator_rss_kib", rss},
                        {"coordinator_rss_kib_per_rank", double(rss) / o_.ranks},
                        {"harness_rss_kib", sims_rss},
                        {"steps_in_window", steps},
                        {"step_latency", stats_ms(latency)},
                        {"checkpoints", ckpts},
                        {"commit_after_last_report", stats_ms(commit)},
                        {"commit_after_first_report", stats_ms(spread)}};
  check("steady state: steps completed", steps > 0,
        std::to_string(steps) + " in " + std::to_string(wall) + " s");
  if (o_.ckpt_every > 0)
    check("steady state: every checkpoint committed",
          ckpts > 0 && ckpt_fails == 0 && commit.size() == size_t(ckpts),
          std::to_string(commit.size()) + " of " + std::to_string(ckpts) +
              (ckpt_error.empty() ? "" : "; " + ckpt_error));
}

void Driver::queries() {
  std::vector<double> status_ms, list_ms, metrics_ms;
  size_t status_bytes = 0, list_bytes = 0, metrics_bytes = 0;
  bool ok = true;
  // Nine rounds, a third of a step apart: one answer can wait behind a burst of step reports,
  // the median is what a scraper sees.
  for (int i = 0; i < 9; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o_.step_ms / 3 + 1));
    int64_t t = now_ns();
    json st = api({{"op", "status"}, {"job", job_}});
    status_ms.push_back((now_ns() - t) / 1e6);
    status_bytes = st.dump().size();
    ok = ok && st.value("ok", false);
    t = now_ns();
    json li = api({{"op", "list"}});
    list_ms.push_back((now_ns() - t) / 1e6);
    list_bytes = li.dump().size();
    ok = ok && li.value("ok", false);
    HttpResult m = http_get(ready_.value("http", ""), "/metrics");
    metrics_ms.push_back(m.ms);
    metrics_bytes = m.bytes;
    ok = ok && m.ok;
  }
  results_["queries"] = {{"status_ms", percentile(status_ms, 50)},
                         {"status_ms_range", {percentile(status_ms, 0), percentile(status_ms, 100)}},
                         {"status_bytes", status_bytes},
                         {"list_ms", percentile(list_ms, 50)},
                         {"list_ms_range", {percentile(list_ms, 0), percentile(list_ms, 100)}},
                         {"list_bytes", list_bytes},
                         {"metrics_ms", percentile(metrics_ms, 50)},
                         {"metrics_ms_range", {percentile(metrics_ms, 0), percentile(metrics_ms, 100)}},
                         {"metrics_bytes", metrics_bytes}};
  check("status, list and /metrics answered", ok);
}

// Waits for every rank of `gen` but `gone` to hear the abort; its latencies from `from`.
json Driver::aborts(int gen, const std::set<int>& gone, int64_t from) {
  const int expect = o_.ranks - static_cast<int>(gone.size());
  auto heard = [&] {
    int n = 0;
    auto it = obs_.gens.find(gen);
    if (it == obs_.gens.end()) return 0;
    for (int r = 0; r < o_.ranks; ++r) n += !gone.count(r) && it->second[r].abort > 0;
    return n;
  };
  wait(30 + 0.01 * o_.ranks, [&] { return heard() >= expect; });
  std::lock_guard<std::mutex> lock(obs_.mu);
  std::vector<double> ms;
  for (int r = 0; r < o_.ranks; ++r)
    if (!gone.count(r) && obs_.gens[gen][r].abort > 0) ms.push_back((obs_.gens[gen][r].abort - from) / 1e6);
  check("generation " + std::to_string(gen) + ": every survivor was told to abort", int(ms.size()) == expect,
        std::to_string(ms.size()) + " of " + std::to_string(expect));
  return stats_ms(ms);
}

json Driver::failure(int gen, int64_t from) {
  wait(60, [&] { return obs_.failure_of(gen) != nullptr; });
  std::lock_guard<std::mutex> lock(obs_.mu);
  const json* f = obs_.failure_of(gen);
  if (!f) {
    check("generation " + std::to_string(gen) + ": the coordinator recorded the failure", false);
    return json::object();
  }
  return {{"cause", f->value("cause", "")},
          {"rank", f->value("rank", -1)},
          {"detected_ms", f->value("time_ms", 0.0) - realtime_ms_at(from)},
          {"message_bytes", f->value("message", "").size()},
          {"event_bytes", f->dump().size()}};
}

void Driver::first_step(int gen, int64_t from, json& out) {
  wait(120, [&] { return has_step(obs_, gen); });
  std::lock_guard<std::mutex> lock(obs_.mu);
  auto it = obs_.step_events.lower_bound({gen, INT64_MIN});
  const bool ok = it != obs_.step_events.end() && it->first.first == gen;
  out["first_step_s"] = ok ? seconds(from, it->second) : -1.0;
  check("generation " + std::to_string(gen) + " completed a step", ok);
}

int64_t Driver::inject(const std::string& fault, int gen, int victim,
                       std::map<std::pair<int, int>, int64_t>& seen) {
  int sim = -1;
  {
    std::lock_guard<std::mutex> lock(obs_.mu);
    sim = obs_.rank(gen, victim).sim;
  }
  if (sim < 0) {
    check(fault + ": the victim's process is known", false);
    return 0;
  }
  sims_[sim]->send_line(fault + " " + std::to_string(gen) + " " + std::to_string(victim));
  wait(10, [&] { return seen.count({gen, victim}) > 0; });
  std::lock_guard<std::mutex> lock(obs_.mu);
  auto it = seen.find({gen, victim});
  return it != seen.end() ? it->second : 0;
}

void Driver::kill_phase() {
  const int gen = 0, victim = o_.ranks / 2 + 1;
  const int64_t t = inject("kill", gen, victim, obs_.killed);
  if (t == 0) return check("kill: rank killed", false);
  json out = {{"rank", victim}};
  out["abort"] = aborts(gen, {victim}, t);
  out["failure"] = failure(gen, t);
  check("kill: the failure names the killed rank", out["failure"].value("rank", -1) == victim,
        out["failure"].value("cause", ""));
  launch_phase(gen + 1, t, "kill_relaunch");
  first_step(gen + 1, t, out);
  results_["kill"] = out;
}

void Driver::hang_phase() {
  const int gen = 1, victim = o_.ranks / 4 + 3;
  const int64_t t = inject(o_.hang == "stuck" ? "stick" : "hang", gen, victim, obs_.hung);
  if (t == 0) return check("hang: rank held", false);
  json out = {{"rank", victim}};
  out["failure"] = failure(gen, t);
  check("hang: the failure names the hung rank", out["failure"].value("rank", -1) == victim,
        out["failure"].value("cause", ""));
  out["abort"] = aborts(gen, {victim}, t);
  launch_phase(gen + 1, t, "hang_relaunch");
  first_step(gen + 1, t, out);
  results_["hang"] = out;
}

void Driver::agent_phase() {
  const int gen = 2;  // after the kill's relaunch, and the hang's
  int agent = -1, sim = -1;
  std::set<int> on_agent;
  {
    std::lock_guard<std::mutex> lock(obs_.mu);
    agent = obs_.rank(gen, o_.ranks / 2).agent;
    if (obs_.agent_sim.count(agent)) sim = obs_.agent_sim[agent];
    for (int r = 0; r < o_.ranks; ++r)
      if (obs_.rank(gen, r).agent == agent) on_agent.insert(r);
  }
  if (sim < 0) return check("agent: the victim's process is known", false);
  sims_[sim]->send_line("lose_agent " + std::to_string(agent) + " 1000");
  wait(10, [&] { return obs_.agent_lost.count(agent) > 0; });
  int64_t t = 0;
  {
    std::lock_guard<std::mutex> lock(obs_.mu);
    t = obs_.agent_lost.count(agent) ? obs_.agent_lost[agent] : 0;
  }
  if (t == 0) return check("agent: agent lost", false);
  json out = {{"agent", agent}, {"ranks_on_it", on_agent.size()}};
  out["failure"] = failure(gen, t);
  check("agent: the failure is the agent's", out["failure"].value("cause", "") == "agent_lost",
        out["failure"].value("cause", ""));
  out["abort"] = aborts(gen, on_agent, t);
  launch_phase(gen + 1, t, "agent_relaunch");
  first_step(gen + 1, t, out);
  results_["agent"] = out;
}

namespace {

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}
double num(const json& j, const char* k) {
  return j.contains(k) && j[k].is_number() ? j[k].get<double>() : -1;
}
std::string dist(const json& j) {
  if (!j.is_object()) return "-";
  return fmt("%.0f", num(j, "p50_ms")) + " / " + fmt("%.0f", num(j, "p99_ms")) + " / " +
         fmt("%.0f", num(j, "max_ms")) + " ms (" + std::to_string(j.value("n", 0)) + ")";
}
void row(const std::string& what, const std::string& value) {
  std::printf("  %-52s %s\n", what.c_str(), value.c_str());
}

void launch_rows(const json& r, const std::string& what) {
  if (!r.is_object()) return;
  row(what + ": first launch -> every rank connected", fmt("%.2f s", num(r, "connected_s")));
  row(what + ": first launch -> every rank assigned", fmt("%.2f s", num(r, "assigned_s")));
  row(what + ": first launch -> nccl-pattern rendezvous",
      fmt("%.2f s", num(r, "nccl_s")) + " (" + std::to_string(r.value("nccl_requests", 0)) + " requests)");
  if (r.contains("gloo_s"))
    row(what + ": then the gloo-pattern rendezvous",
        fmt("%.2f s", num(r, "gloo_s")) + " (" + std::to_string(r.value("gloo_requests", 0)) + " requests, " +
            std::to_string(r.value("gloo_groups_skipped", 0)) + " group(s) skipped)");
}

}  // namespace

void Driver::print_table() const {
  const json& r = results_;
  std::printf(
      "\ntroupe control plane at %d ranks: %d agents x %d, layout %s, %d simulated process(es), workers %s\n",
      r.value("ranks", 0), r.value("agents", 0), r.value("per_agent", 0), r.value("layout", "").c_str(),
      r.value("sim_processes", 0), r.value("workers", "").c_str());
  row("agents registered (one TLS connection each)", fmt("%.2f s", num(r, "register_s")));
  row("submit -> placed (the reply)", fmt("%.0f ms", num(r, "submit_reply_ms")));
  if (r.contains("launch")) {
    row("submit -> every launch at its agent", fmt("%.2f s", num(r["launch"], "all_launched_s")));
    launch_rows(r["launch"], "launch");
    row("submit -> every rank rendezvoused", fmt("%.2f s", num(r["launch"], "rendezvoused_s")));
  }
  if (r.contains("steady")) {
    const json& s = r["steady"];
    row("steady state: coordinator CPU (share of one core)",
        fmt("%.1f %%", 100 * num(s, "coordinator_cpu_share")));
    row("steady state: coordinator RSS",
        fmt("%.1f MiB", num(s, "coordinator_rss_kib") / 1024) +
            fmt(" (%.1f KiB per rank)", num(s, "coordinator_rss_kib_per_rank")));
    row("steady state: harness CPU (share of one core)", fmt("%.1f %%", 100 * num(s, "harness_cpu_share")));
    row("steady state: step metric, last report -> published", dist(s["step_latency"]));
    row("checkpoint: last shard report -> committed", dist(s["commit_after_last_report"]));
    row("checkpoint: first shard report -> committed", dist(s["commit_after_first_report"]));
  }
  if (r.contains("queries")) {
    const json& q = r["queries"];
    // The median of nine, its range, and the answer's size.
    auto query = [&](const char* name, const char* what) {
      const std::string k = std::string(what) + "_ms";
      std::string range;
      if (auto it = q.find(k + "_range"); it != q.end() && it->is_array() && it->size() == 2)
        range = fmt(" (%.0f", (*it)[0].get<double>()) + fmt("-%.0f)", (*it)[1].get<double>());
      row(name, fmt("%.0f ms", num(q, k.c_str())) + range +
                    fmt(", %.0f KiB", num(q, (std::string(what) + "_bytes").c_str()) / 1024));
    };
    query("status of the job", "status");
    query("list", "list");
    query("/metrics", "metrics");
  }
  auto fault = [&](const char* key, const char* what, const char* relaunch) {
    if (!r.contains(key)) return;
    const json& k = r[key];
    const json f = k.value("failure", json::object());
    row(std::string(what) + ": failure recorded",
        fmt("%.0f ms", num(f, "detected_ms")) + " (" + f.value("cause", "?") + ", rank " +
            std::to_string(f.value("rank", -1)) + fmt(", %.0f KiB event)", num(f, "event_bytes") / 1024));
    row(std::string(what) + ": every survivor told to abort (p50/p99/max)", dist(k["abort"]));
    if (r.contains(relaunch)) {
      launch_rows(r[relaunch], std::string("  next generation"));
      row(std::string(what) + ": -> next generation rendezvoused",
          fmt("%.2f s", num(r[relaunch], "rendezvoused_s")));
    }
    row(std::string(what) + ": -> its first step", fmt("%.2f s", num(k, "first_step_s")));
  };
  fault("kill", "rank killed", "kill_relaunch");
  fault("hang", "rank hung", "hang_relaunch");
  fault("agent", "agent lost", "agent_relaunch");
  std::printf("  %-20s %10s %18s %18s\n", "CPU by phase", "wall s", "coordinator s", "harness s");
  for (const auto& p : r.value("phases", json::array()))
    std::printf("  %-20s %10.2f %18.2f %18.2f\n", p.value("phase", "").c_str(), num(p, "wall_s"),
                num(p, "coordinator_cpu_s"), num(p, "harness_cpu_s"));
  std::printf("  checks failed: %d\n", r.value("failed_checks", 0));
  std::printf("  agents' connection attempts tried again: %lld\n",
              static_cast<long long>(r.value("agent_connect_retries", int64_t{0})));
  const json problems = r.value("problems", json::array());
  for (size_t i = 0; i < problems.size() && i < 20; ++i)
    std::printf("  problem: %s\n", problems[i].get<std::string>().c_str());
  if (problems.size() > 20) std::printf("  (%zu problems in all: the JSON has them)\n", problems.size());
  std::fflush(stdout);
}

}  // namespace troupe::scale

#include "coordinator/coordinator_actor.hpp"

#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <tuple>

#include "checkpoint/commit.hpp"
#include "coordinator/api.hpp"
#include "coordinator/state.hpp"
#include "core/run_dir.hpp"

namespace troupe::coord {

namespace {

using namespace troupe::actors;

struct WorkerRef {
  std::string job;
  int32_t generation = 0;
  int32_t rank = 0;
};

struct CoordActorState {
  std::unique_ptr<CoordinatorState> st;
  CoordinatorActorOptions opt;
  std::map<std::string, agent_actor> agents;  // agent id -> handle
  std::map<caf::actor_addr, std::string> agent_ids;
  std::map<caf::actor_addr, WorkerRef> worker_refs;
  std::map<std::tuple<std::string, int32_t, int32_t>, worker_actor> workers;
  std::map<std::string, std::unique_ptr<RunDir>> run_dirs;
  struct Waiter {
    caf::typed_response_promise<StoreValue> promise;
    std::string ns, key;
  };
  std::map<uint64_t, Waiter> waiters;
  std::map<std::tuple<std::string, int32_t, int32_t>, std::string> lost_reasons;
  // Checkpoint reports per (job generation, step) until every rank has reported.
  checkpoint::CommitTracker ckpt;
  std::map<std::tuple<std::string, int32_t, int64_t>, std::vector<caf::typed_response_promise<CkptCommitted>>>
      ckpt_waiting;
  uint64_t ticks = 0;
  static inline const char* name = "troupe.coordinator";
};

using self_ptr = coordinator_actor::stateful_pointer<CoordActorState>;

// The recovery clock and the step watchdog run every kTick; ranks are asked
// "where are you" every kWhereEveryTicks ticks.
constexpr auto kTick = std::chrono::milliseconds(100);
constexpr uint64_t kWhereEveryTicks = 5;

void record_event(self_ptr self, nlohmann::json e) {
  auto& s = self->state;
  e["time"] = utc_timestamp();
  const std::string kind = e.value("event", "");
  const std::string job = e.value("job", "");
  try {
    if (kind == "submitted") {
      std::filesystem::path dir = e["run_dir"].get<std::string>();
      auto rd = std::make_unique<RunDir>(dir.parent_path().string(), e["name"].get<std::string>(), job);
      rd->write_spec(e["spec"].get<std::string>());
      rd->event("submitted job " + job + " (" + e["name"].get<std::string>() + ", layout " +
                e["layout"].get<std::string>() + ")");
      s.run_dirs[job] = std::move(rd);
      e.erase("spec");
    } else if (auto it = s.run_dirs.find(job); it != s.run_dirs.end()) {
      RunDir& rd = *it->second;
      if (kind == "state") {
        std::string reason = e.value("reason", "");
        rd.event("state " + e["state"].get<std::string>() + (reason.empty() ? "" : ": " + reason));
      } else if (kind == "waiting") {
        rd.event("waiting: " + e.value("reason", ""));
      } else if (kind == "step") {
        rd.metrics(e["metrics"]);
      } else if (kind == "checkpoint") {
        rd.event("checkpoint committed: " + e.value("dir", ""));
      } else if (kind == "worker_exit") {
        rd.event("worker " + e.value("message", ""));
      } else if (kind == "failure") {
        std::string where = e.value("where", "");
        rd.event("failure " + e.value("cause", "") + " in generation " +
                 std::to_string(e.value("generation", 0)) + ": " + e.value("message", "") +
                 (where.empty() ? "" : " [rank was in: " + where + "]"));
      } else if (kind == "relaunch") {
        std::string from = e.value("resume_from", "");
        rd.event("relaunch generation " + std::to_string(e.value("generation", 0)) + " as " +
                 e.value("layout", "") + " (was " + e.value("from_layout", "") + ") " +
                 (from.empty() ? "from scratch" : "from " + from));
      } else if (kind == "resize") {
        rd.event("resize to " + std::to_string(e.value("devices", 0)) + " devices after step " +
                 std::to_string(e.value("after_step", int64_t{0})));
      } else if (kind == "log") {
        rd.event(e.value("message", ""));
      }
    }
  } catch (const std::exception& ex) {
    // A full disk must not take the coordinator down; the event still goes out.
    e["run_dir_error"] = ex.what();
  }
  if (s.opt.on_event) s.opt.on_event(e.dump());
  if (kind == "state" && (e["state"] == "succeeded" || e["state"] == "failed" || e["state"] == "cancelled"))
    s.run_dirs.erase(job);
}

// A generation that ends commits nothing more: its ranks waiting on a checkpoint hear why.
void drop_checkpoints(self_ptr self, const std::string& job, int32_t generation, const std::string& why) {
  auto& s = self->state;
  s.ckpt.forget(job + "/" + std::to_string(generation));
  for (auto it = s.ckpt_waiting.begin(); it != s.ckpt_waiting.end();) {
    if (std::get<0>(it->first) == job && std::get<1>(it->first) == generation) {
      for (auto& rp : it->second) rp.deliver(CkptCommitted{false, "", why});
      it = s.ckpt_waiting.erase(it);
    } else {
      ++it;
    }
  }
}

// The commit point of a checkpoint (checkpoint/commit.hpp): manifest.json is written and
// step_N.tmp renamed only after every rank of (job, generation, step) reported its files;
// then every rank's request is answered with the committed directory.
void take_shard(self_ptr self, const CkptShard& r, caf::typed_response_promise<CkptCommitted> rp) {
  auto& s = self->state;
  if (!s.st->current(r.job_id, r.generation)) {
    rp.deliver(CkptCommitted{
        false, "", "generation " + std::to_string(r.generation) + " of job " + r.job_id + " is not running"});
    return;
  }
  checkpoint::ShardReport rep;
  rep.root = r.root;
  rep.step = r.step;
  rep.rank = r.rank;
  rep.world = r.world;
  rep.keep = r.keep;
  rep.manifest_json = r.manifest_json;
  for (const auto& f : r.files) rep.files.push_back({f.name, f.size, f.xxh64});
  const auto key = std::make_tuple(r.job_id, r.generation, r.step);
  s.ckpt_waiting[key].push_back(rp);
  CkptCommitted out;
  try {
    auto ready = s.ckpt.add(r.job_id + "/" + std::to_string(r.generation), rep);
    if (!ready) return;
    out.dir = checkpoint::commit(ready->root, ready->manifest, ready->keep);
    out.ok = true;
    record_event(self, {{"event", "checkpoint"},
                        {"job", r.job_id},
                        {"generation", r.generation},
                        {"step", r.step},
                        {"dir", out.dir}});
  } catch (const std::exception& e) {
    out.error = e.what();
  }
  for (auto& p : s.ckpt_waiting[key]) p.deliver(out);
  s.ckpt_waiting.erase(key);
}

// Saves the job table when an event changed it (a step or an agent does not).
void persist(self_ptr self, const std::vector<nlohmann::json>& events) {
  auto& s = self->state;
  if (s.opt.state_dir.empty()) return;
  bool changed = false;
  for (const auto& e : events) {
    const std::string kind = e.value("event", "");
    changed = changed || (kind != "step" && kind != "agent" && kind != "log" && kind != "worker_exit");
  }
  if (!changed) return;
  try {
    save_table(s.opt.state_dir, s.st->table_json());
  } catch (const std::exception& ex) {
    // The jobs keep running; the table on disk is the previous one, intact.
    std::cerr << "troupe coordinator: cannot save the job table: " << ex.what() << std::endl;
  }
}

void apply(self_ptr self, Actions&& a) {
  auto& s = self->state;
  persist(self, a.events);
  for (auto& e : a.events) record_event(self, std::move(e));
  for (const auto& l : a.launches) {
    auto it = s.agents.find(l.agent_id);
    if (it == s.agents.end()) {
      Actions more;
      s.st->launch_failed(l.job_id, l.generation, l.rank, "agent " + l.agent_id + " is gone", &more);
      apply(self, std::move(more));
      continue;
    }
    LaunchRequest req{l.job_id, l.generation, l.rank, l.device, l.log_path};
    self->request(it->second, std::chrono::seconds(30), launch_atom::value, req)
        .then(
            [=](int32_t pid) {
              if (pid > 0) {
                self->state.st->worker_launched(l.job_id, l.generation, l.rank, pid);
                return;
              }
              Actions more;
              self->state.st->launch_failed(l.job_id, l.generation, l.rank,
                                            "fork/exec failed: " + std::string(std::strerror(-pid)), &more);
              apply(self, std::move(more));
            },
            [=](caf::error& err) {
              Actions more;
              self->state.st->launch_failed(l.job_id, l.generation, l.rank,
                                            "launch request failed: " + self->system().render(err), &more);
              apply(self, std::move(more));
            });
  }
  for (const auto& ab : a.aborts) {
    auto it = s.workers.find({ab.job_id, ab.generation, ab.rank});
    if (it != s.workers.end()) self->send(it->second, abort_atom::value, ab.reason);
    drop_checkpoints(self, ab.job_id, ab.generation, "generation aborted: " + ab.reason);
  }
  for (const auto& d : a.drains) {
    auto it = s.workers.find({d.job_id, d.generation, d.rank});
    if (it != s.workers.end()) self->send(it->second, drain_atom::value, d.step);
  }
  for (const auto& k : a.kills) {
    auto it = s.agents.find(k.agent_id);
    if (it != s.agents.end())
      self->delayed_send(it->second, s.opt.kill_grace, kill_atom::value, k.job_id, k.generation);
  }
}

void wake_waiters(self_ptr self, const std::vector<uint64_t>& ids) {
  auto& s = self->state;
  for (auto id : ids) {
    auto it = s.waiters.find(id);
    if (it == s.waiters.end()) continue;
    auto v = s.st->store().get(it->second.ns, it->second.key);
    it->second.promise.deliver(StoreValue{true, v ? *v : std::string(), ""});
    s.waiters.erase(it);
  }
}

coordinator_actor::behavior_type coordinator_fn(self_ptr self, CoordinatorActorOptions opt) {
  self->state.opt = opt;
  self->state.st = std::make_unique<CoordinatorState>(opt.runs_dir, opt.protocol);
  if (!opt.state_dir.empty()) {
    auto table = load_table_file(opt.state_dir);
    if (!table.is_null()) {
      Actions a;
      self->state.st->load_table(table, &a);
      // Live jobs keep writing to the run directories they had.
      for (const auto& [id, job] : self->state.st->jobs()) {
        if (is_terminal(job.state)) continue;
        try {
          std::filesystem::path dir = job.run_dir;
          auto rd = std::make_unique<RunDir>(dir.parent_path().string(), job.request.name, id);
          rd->event("coordinator restarted: job table loaded from " + state_file(opt.state_dir));
          self->state.run_dirs[id] = std::move(rd);
        } catch (const std::exception& ex) {
          std::cerr << "troupe coordinator: job " << id << ": " << ex.what() << std::endl;
        }
      }
      apply(self, std::move(a));
    }
  }
  self->delayed_send(self, kTick, tick_atom::value);

  self->set_down_handler([=](caf::down_msg& dm) {
    auto& s = self->state;
    if (auto it = s.agent_ids.find(dm.source); it != s.agent_ids.end()) {
      std::string id = it->second;
      s.agent_ids.erase(it);
      s.agents.erase(id);
      Actions a;
      s.st->remove_agent(id, &a);
      apply(self, std::move(a));
      return;
    }
    if (auto it = s.worker_refs.find(dm.source); it != s.worker_refs.end()) {
      WorkerRef w = it->second;
      s.worker_refs.erase(it);
      s.workers.erase({w.job, w.generation, w.rank});
      if (!s.st->current(w.job, w.generation)) return;
      // The agent's exit report (with the signal) follows within a reaping
      // period (20 ms); give it a moment before calling the rank merely "lost".
      s.lost_reasons[{w.job, w.generation, w.rank}] = self->system().render(dm.reason);
      self->delayed_send(self, std::chrono::milliseconds(250), lost_atom::value, w.job, w.generation, w.rank);
    }
  });

  return {
      [=](reg_agent_atom, const AgentHello& h) -> Welcome {
        Actions a;
        auto r = self->state.st->register_agent(h.protocol, h.host, h.pid, h.devices, &a);
        if (r.accepted) {
          auto handle = caf::actor_cast<agent_actor>(self->current_sender());
          self->monitor(handle);
          self->state.agents[r.message] = handle;
          self->state.agent_ids[handle.address()] = r.message;
        }
        apply(self, std::move(a));
        return Welcome{r.accepted, r.message, self->state.opt.protocol};
      },
      [=](reg_worker_atom, const WorkerHello& h) -> Assignment {
        Actions a;
        auto w =
            self->state.st->register_worker(h.protocol, h.job_id, h.generation, h.rank, h.host, h.pid, &a);
        Assignment out;
        out.refused = w.refused;
        if (w.refused.empty()) {
          const Job& j = *w.job;
          auto handle = caf::actor_cast<worker_actor>(self->current_sender());
          self->monitor(handle);
          self->state.workers[{h.job_id, h.generation, h.rank}] = handle;
          self->state.worker_refs[handle.address()] = WorkerRef{h.job_id, h.generation, h.rank};
          const auto& l = j.layout;
          out.job_id = j.id;
          out.generation = j.generation;
          out.rank = w.rank;
          out.world = l.world();
          out.dp = l.dp;
          out.pp = l.pp;
          out.tp = l.tp;
          out.dp_index = w.coords.dp_index;
          out.pp_index = w.coords.pp_index;
          out.tp_index = w.coords.tp_index;
          out.first_layer = w.coords.first_layer;
          out.last_layer = w.coords.last_layer;
          out.device = j.ranks[w.rank].device.device;
          out.spec_yaml = j.request.spec_yaml;
          out.resume_from = j.resume_from;
          out.run_dir = j.run_dir;
        }
        apply(self, std::move(a));
        return out;
      },
      [=](worker_exit_atom, const WorkerExit& x) {
        Actions a;
        self->state.st->worker_exited(x.job_id, x.generation, x.rank, x.pid, x.exit_code, x.signal, &a);
        apply(self, std::move(a));
      },
      [=](step_atom, const StepMetrics& m) {
        StepSample s{m.rank, m.step, m.loss, m.lr, m.tokens, m.step_ms, m.grad_norm, std::nullopt};
        if (m.has_val_loss) s.val_loss = m.val_loss;
        s.compute_ms = m.compute_ms;
        s.comm_ms = m.comm_ms;
        s.bubble_ms = m.bubble_ms;
        Actions a;
        self->state.st->step(m.job_id, m.generation, s, &a);
        apply(self, std::move(a));
      },
      [=](worker_done_atom, const WorkerResult& r) -> bool {
        Actions a;
        self->state.st->worker_done(r.job_id, r.generation, r.rank, r.ok, r.error_name, r.message, &a);
        apply(self, std::move(a));
        return true;
      },
      [=](ckpt_shard_atom, const CkptShard& r) -> caf::typed_response_promise<CkptCommitted> {
        auto rp = self->make_response_promise<CkptCommitted>();
        take_shard(self, r, rp);
        return rp;
      },
      [=](store_set_atom, const StoreKey& k, const std::string& value) -> StoreValue {
        auto& st = *self->state.st;
        std::string refusal = st.store_refusal(k.job_id, k.generation);
        if (!refusal.empty()) return StoreValue{false, "", refusal};
        auto woken = st.store().set(store_namespace(k.job_id, k.generation, k.group), k.key, value);
        wake_waiters(self, woken);
        return StoreValue{true, "", ""};
      },
      [=](store_add_atom, const StoreKey& k, int64_t delta) -> StoreValue {
        auto& st = *self->state.st;
        std::string refusal = st.store_refusal(k.job_id, k.generation);
        if (!refusal.empty()) return StoreValue{false, "", refusal};
        auto [v, woken] = st.store().add(store_namespace(k.job_id, k.generation, k.group), k.key, delta);
        wake_waiters(self, woken);
        return StoreValue{true, std::to_string(v), ""};
      },
      [=](store_get_atom, const StoreKey& k, int64_t timeout_ms) -> caf::typed_response_promise<StoreValue> {
        auto rp = self->make_response_promise<StoreValue>();
        auto& st = *self->state.st;
        std::string refusal = st.store_refusal(k.job_id, k.generation);
        if (!refusal.empty()) {
          rp.deliver(StoreValue{false, "", refusal});
          return rp;
        }
        std::string ns = store_namespace(k.job_id, k.generation, k.group);
        if (auto v = st.store().get(ns, k.key)) {
          rp.deliver(StoreValue{true, *v, ""});
          return rp;
        }
        uint64_t id = st.store().add_waiter(ns, k.key);
        self->state.waiters[id] = CoordActorState::Waiter{rp, ns, k.key};
        self->delayed_send(self, std::chrono::milliseconds(std::max<int64_t>(timeout_ms, 0)),
                           store_expire_atom::value, id);
        return rp;
      },
      [=](store_expire_atom, uint64_t id) {
        auto& s = self->state;
        auto it = s.waiters.find(id);
        if (it == s.waiters.end() || !s.st->store().remove_waiter(id)) return;
        it->second.promise.deliver(
            StoreValue{false, "", "timed out waiting for key '" + it->second.key + "'"});
        s.waiters.erase(it);
      },
      [=](api_atom, const std::string& text) -> std::string {
        nlohmann::json req;
        try {
          req = nlohmann::json::parse(text);
        } catch (const nlohmann::json::exception& e) {
          return api_error("bad_json", e.what()).dump();
        }
        Actions a;
        nlohmann::json reply;
        try {
          reply = handle_api_request(*self->state.st, req, &a);
        } catch (const std::exception& e) {
          reply = api_error("internal", e.what());
        }
        apply(self, std::move(a));
        return reply.dump();
      },
      [=](lost_atom, const std::string& job, int32_t generation, int32_t rank) {
        auto& s = self->state;
        std::string why = "connection lost";
        if (auto it = s.lost_reasons.find({job, generation, rank}); it != s.lost_reasons.end()) {
          why = it->second;
          s.lost_reasons.erase(it);
        }
        Actions a;
        s.st->worker_lost(job, generation, rank, why, &a);
        apply(self, std::move(a));
      },
      [=](tick_atom) {
        auto& s = self->state;
        Actions a;
        s.st->tick(now_ms(), &a);
        apply(self, std::move(a));
        // Ask every live rank where it is, so a rank that hangs later is
        // reported with the op it was in (a stopped process cannot answer).
        if (++s.ticks % kWhereEveryTicks == 0)
          for (const auto& [key, handle] : s.workers) {
            auto [job, generation, rank] = key;
            if (!s.st->current(job, generation)) continue;
            self->request(handle, std::chrono::seconds(1), where_atom::value)
                .then([=](const std::string& w) { self->state.st->worker_where(job, generation, rank, w); },
                      [](caf::error&) {});
          }
        self->delayed_send(self, kTick, tick_atom::value);
      },
  };
}

}  // namespace

actors::coordinator_actor spawn_coordinator(caf::actor_system& sys, CoordinatorActorOptions options) {
  return sys.spawn(coordinator_fn, std::move(options));
}

}  // namespace troupe::coord

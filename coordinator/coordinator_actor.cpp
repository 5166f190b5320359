// The coordinator actor: turns CoordinatorState's Actions into messages, and
// every message it takes into a call of CoordinatorState once it has been
// checked (actors/validate.hpp) and its sender authorized
// (coordinator_actor_auth.cpp). Its run directories and event feed are
// coordinator_actor_events.cpp.
#include "coordinator/coordinator_actor.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <set>

#include "actors/secret.hpp"
#include "actors/validate.hpp"
#include "coordinator/api.hpp"
#include "coordinator/coordinator_actor_state.hpp"
#include "coordinator/where_polls.hpp"
#include "core/buddy_ring.hpp"
#include "core/failure.hpp"
#include "core/run_dir.hpp"
#include "core/text.hpp"
#include "plan/plan.hpp"

namespace troupe::coord::actor {

// One commit handed to the committer actor and back.
struct CommitJob {
  std::string job;
  checkpoint::ReadyCommit ready;
  std::string dir;    // committed
  std::string error;  // or why not
};
using CommitJobPtr = std::shared_ptr<CommitJob>;

}  // namespace troupe::coord::actor

// A pointer between two actors of this process: never serialized.
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::coord::actor::CommitJobPtr)

namespace troupe::coord::actor {

void CommitsInFlight::begin(const std::string& job) {
  std::lock_guard<std::mutex> lock(mu_);
  ++running_[job];
}

void CommitsInFlight::end(const std::string& job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (--running_[job] <= 0) running_.erase(job);
  }
  cv_.notify_all();
}

bool CommitsInFlight::wait(const std::string& job, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return running_.count(job) == 0; });
}

}  // namespace troupe::coord::actor

namespace troupe::coord {

namespace {

using namespace troupe::coord::actor;

// The recovery clock, the step watchdog and the "where" polls (where_polls.hpp) run every kTick.
constexpr auto kTick = std::chrono::milliseconds(kWhereTickMs);

// poll_where's view of the hosts: the agents by node, and how many polls a round makes (a
// host for the ranks whose handles live on its agent's node, a rank for each connected by
// itself). Worked out again when a worker or an agent came or went, and every second.
// Each registered agent by its node (a relay or inline worker shares its agent's node).
std::map<caf::node_id, agent_actor> agents_by_node(const CoordActorState& s) {
  std::map<caf::node_id, agent_actor> out;
  for (const auto& [id, a] : s.agents)
    if (a) out.emplace(a.node(), a);
  return out;
}

void refresh_where_view(self_ptr self) {
  auto& s = self->state;
  auto& view = s.where_view;
  if (!view.stale && ++view.ticks < int(1000 / kWhereTickMs)) return;
  view.agents = agents_by_node(s);
  std::set<caf::node_id> counted;
  view.targets = 0;
  for (const auto& [key, handle] : s.workers) {
    const auto& [job, generation, rank] = key;
    if (is_spare_rank(rank) || !s.st->current(job, generation)) continue;
    if (!view.agents.count(handle.node()) || counted.insert(handle.node()).second) ++view.targets;
  }
  view.stale = false;
  view.ticks = 0;
}

// The ranks of one host a tick asks, through its agent.
struct WhereHost {
  agent_actor agent;
  std::vector<RankKey> keys;
  std::vector<worker_actor> handles;
};

// Asks the agent for its ranks' "where" and takes the answers for the handles named, index by
// index; an answer of another size is dropped whole.
void ask_host_where(self_ptr self, WhereHost h) {
  self->request(h.agent, std::chrono::seconds(1), where_atom::value, h.handles)
      .then(
          [self, keys = std::move(h.keys)](const WhereAnswers& a) {
            if (a.answered.size() != keys.size() || a.where.size() != keys.size()) return;
            for (size_t i = 0; i < keys.size(); ++i)
              if (a.answered[i] != 0) {
                const auto& [job, generation, rank] = keys[i];
                self->state.st->worker_where(job, generation, rank, sanitize_utf8(a.where[i], kMaxText));
              }
          },
          [](caf::error&) {});
}

// Asks the next share of the ranks where they are (from where the last tick stopped, around),
// so that a rank that hangs later is reported with the op it was in (a stopped process cannot
// answer). A rank whose handle lives on its agent's node (its relay) is asked through the
// agent, with the other ranks of that host this tick reaches: one request per host, which
// counts as one poll of the tick's share. A rank connected by itself is asked itself. At most
// kWhereRanksPerTick ranks a tick, however they are asked.
void poll_where(self_ptr self) {
  auto& s = self->state;
  if (s.workers.empty()) return;
  refresh_where_view(self);
  const auto& agent_at = s.where_view.agents;
  if (s.where_view.targets == 0) return;
  size_t quota = where_polls_per_tick(s.where_view.targets);
  size_t ranks_left = kWhereRanksPerTick;
  std::map<caf::node_id, WhereHost> hosts;
  auto it = s.where_next ? s.workers.lower_bound(*s.where_next) : s.workers.begin();
  for (size_t seen = 0; seen < s.workers.size(); ++seen, ++it) {
    if (it == s.workers.end()) it = s.workers.begin();
    const auto& [key, handle] = *it;
    const auto& [job, generation, rank] = key;
    if (is_spare_rank(rank) || !s.st->current(job, generation)) continue;
    if (ranks_left == 0) break;
    const caf::node_id node = handle.node();
    if (auto agent = agent_at.find(node); agent != agent_at.end()) {
      auto h = hosts.find(node);
      if (h != hosts.end() && h->second.keys.size() >= kMaxWhereBatch) {
        ask_host_where(self, std::move(h->second));
        hosts.erase(h);
        h = hosts.end();
      }
      if (h == hosts.end()) {
        if (quota == 0) break;
        --quota;
        h = hosts.emplace(node, WhereHost{agent->second, {}, {}}).first;
      }
      h->second.keys.push_back(key);
      h->second.handles.push_back(handle);
      --ranks_left;
      continue;
    }
    if (quota == 0) break;
    --quota;
    --ranks_left;
    self->request(handle, std::chrono::seconds(1), where_atom::value)
        .then(
            [self, job = job, generation = generation, rank = rank](const std::string& w) {
              self->state.st->worker_where(job, generation, rank, sanitize_utf8(w, kMaxText));
            },
            [](caf::error&) {});
  }
  for (auto& [node, h] : hosts) ask_host_where(self, std::move(h));
  if (it == s.workers.end()) it = s.workers.begin();
  s.where_next = it->first;
}

// A generation that ends commits nothing more: its ranks waiting on a checkpoint hear why.
// Tells each rank of `aborts` to abort: the ranks whose handle lives on an agent's node (a relay,
// an actor of its launcher) in one message to that agent per generation and reason, which
// passes it on (one message per host, not per rank: 512 instead of 4,096 at 4,096 ranks);
// any other rank (connected by itself) directly.
void send_aborts(self_ptr self, const std::vector<Abort>& aborts) {
  auto& s = self->state;
  if (aborts.empty()) return;
  const std::map<caf::node_id, agent_actor> agents = agents_by_node(s);
  std::map<std::tuple<caf::node_id, int32_t, std::string>, std::vector<worker_actor>> by_host;
  for (const auto& ab : aborts) {
    auto it = s.workers.find({ab.job_id, ab.generation, ab.rank});
    if (it == s.workers.end()) continue;
    const worker_actor& w = it->second;
    if (agents.count(w.node()))
      by_host[{w.node(), ab.generation, ab.reason}].push_back(w);
    else
      self->send(w, abort_atom::value, int32_t{ab.generation}, ab.reason);
  }
  for (auto& [key, handles] : by_host) {
    const auto& [node, generation, reason] = key;
    const agent_actor& agent = agents.at(node);
    for (size_t from = 0; from < handles.size(); from += kMaxWhereBatch) {
      const size_t to = std::min(handles.size(), from + kMaxWhereBatch);
      self->send(agent, abort_atom::value, generation, reason,
                 std::vector<worker_actor>(handles.begin() + from, handles.begin() + to));
    }
  }
}

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

// The committer: checkpoint::commit, one at a time, on a thread of its own (detached). It
// ends the commit's count itself: a relaunch may be waiting for it on the coordinator's thread,
// which reads the reply only after.
caf::behavior committer_fn(caf::event_based_actor*, std::shared_ptr<CommitsInFlight> commits) {
  return {[commits](const CommitJobPtr& j) -> CommitJobPtr {
    try {
      j->dir = checkpoint::commit(j->ready.root, j->ready.manifest, j->ready.keep);
    } catch (const std::exception& e) {
      j->error = e.what();
    }
    commits->end(j->job);
    return j;
  }};
}

// The commit point of a checkpoint (checkpoint/commit.hpp): manifest.json is written and
// step_N.tmp renamed only after every rank of (job, generation, step) reported its files;
// then every rank's request is answered with the committed directory. The reports are
// collected here; the commit itself runs in the committer.
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
  // The ranks waiting on this step hear the outcome; a generation that ended meanwhile was
  // told already (drop_checkpoints).
  auto answer = [self, key](const CkptCommitted& out) {
    auto& s = self->state;
    auto it = s.ckpt_waiting.find(key);
    if (it == s.ckpt_waiting.end()) return;
    for (auto& p : it->second) p.deliver(out);
    s.ckpt_waiting.erase(it);
  };
  auto job = std::make_shared<CommitJob>();
  job->job = r.job_id;
  try {
    auto ready = s.ckpt.add(r.job_id + "/" + std::to_string(r.generation), rep);
    if (!ready) return;
    job->ready = std::move(*ready);
  } catch (const std::exception& e) {
    answer(CkptCommitted{false, "", e.what()});
    return;
  }
  const std::string id = r.job_id;
  const int32_t generation = r.generation;
  const int64_t step = r.step;
  s.commits->begin(id);
  self->request(s.committer, caf::infinite, job)
      .then(
          [self, answer, id, generation, step](const CommitJobPtr& done) {
            CkptCommitted out;
            out.ok = done->error.empty();
            out.dir = done->dir;
            out.error = done->error;
            if (out.ok) {
              self->state.st->checkpoint_committed(out.dir);
              record_event(self, {{"event", "checkpoint"},
                                  {"job", id},
                                  {"generation", generation},
                                  {"step", step},
                                  {"dir", out.dir}});
            }
            answer(out);
          },
          [self, answer](caf::error& e) {
            answer(CkptCommitted{false, "", "the checkpoint committer failed: " + self->system().render(e)});
          });
}

// What rank `rank` of the job's current generation runs: its place in the generation's plan
// (computed once at launch: CoordinatorState::launch), device, spec and checkpoint.
Assignment assignment_of(const Job& j, int rank) {
  Assignment out;
  const auto& l = j.layout;
  out.job_id = j.id;
  out.generation = j.generation;
  out.rank = rank;
  out.world = l.world();
  out.dp = l.dp;
  out.pp = l.pp;
  out.tp = l.tp;
  const plan::Plan& p = j.plan;
  const plan::RankPlace place = plan::rank_place(p, rank);
  out.dp_index = place.coord.d;
  out.pp_index = place.coord.p;
  out.tp_index = place.coord.t;
  out.micro_batch = p.micro_batch;
  for (int b : p.boundaries()) out.chunk_boundaries.push_back(b);
  out.place = place.str();
  out.device = j.ranks[rank].device.device;
  out.spec_yaml = j.spec_yaml;  // the generation's (an auto job's: planned)
  out.resume_from = j.resume_from;
  out.run_dir = j.run_dir;
  out.memory_step = j.memory_step;
  if (j.memory_step >= 0 && rank < static_cast<int>(j.heal_roots.size())) out.heal_root = j.heal_roots[rank];
  out.buddy_shift = j.buddy_shift;
  if (j.memory_step >= 0 && j.buddy_shift > 0 && static_cast<int>(j.heal_from_buddy.size()) == l.world()) {
    out.heal_from_buddy = j.heal_from_buddy[rank] != 0;
    out.heal_to_partner = j.heal_from_buddy[BuddyRing{l.world(), j.buddy_shift}.partner(rank)] != 0;
  }
  return out;
}

// What a spare hears when it registers: its launch, and no place yet (world 0). It waits for
// the Assignment of a place (or a refused one).
Assignment spare_assignment(const Job& j, int generation, int launch_rank) {
  Assignment out;
  out.job_id = j.id;
  out.generation = generation;
  out.rank = launch_rank;
  out.world = 0;
  out.run_dir = j.run_dir;
  out.place = "spare";
  return out;
}

// A survivor serves the job's current generation: its handle moves to the new key and it
// is sent the generation's Assignment.
void apply(self_ptr self, Actions&& a);

// A rank's step report: only from the node its rank registered from (its own process, or the
// agent whose relay it registered through).
void take_step(self_ptr self, const StepMetrics& m) {
  if (auto why = check(m); !why.empty()) return refuse(self, "step metrics", why);
  if (!from_worker(self, m.job_id, m.generation, m.rank)) {
    if (self->state.st->current(m.job_id, m.generation))
      refuse(self, "step metrics", "not from the process registered as rank " + std::to_string(m.rank));
    return;
  }
  try {
    StepSample s{m.rank, m.step, m.loss, m.lr, m.tokens, m.step_ms, m.grad_norm, std::nullopt};
    if (m.has_val_loss) s.val_loss = m.val_loss;
    s.compute_ms = m.compute_ms;
    s.comm_ms = m.comm_ms;
    s.bubble_ms = m.bubble_ms;
    s.loss_scale = m.loss_scale;
    s.skipped = m.skipped;
    s.device_bytes = m.device_bytes;
    s.device_peak_bytes = m.device_peak_bytes;
    s.snapshot_confirmed = m.snapshot_confirmed;
    Actions a;
    self->state.st->step(m.job_id, m.generation, s, &a);
    apply(self, std::move(a));
  } catch (const std::exception& e) {
    internal_error("step metrics", e);
  }
}

void reassign(self_ptr self, const Actions::Reassign& r) {
  auto& s = self->state;
  auto it = s.workers.find({r.job_id, r.from_generation, r.from_rank});
  const Job* j = s.st->job(r.job_id);
  if (!j || j->generation != r.generation || r.rank >= static_cast<int>(j->ranks.size())) return;
  if (it == s.workers.end()) {
    // Its connection broke before its assignment: the new generation has no process there.
    Actions a;
    s.st->worker_lost(r.job_id, r.generation, r.rank, "its connection broke before its assignment", &a);
    apply(self, std::move(a));
    return;
  }
  worker_actor handle = it->second;
  remove_worker(self, RankKey{r.job_id, r.from_generation, r.from_rank});
  add_worker(self, {r.job_id, r.generation, r.rank}, handle);
  s.worker_refs[handle.address()] = WorkerRef{r.job_id, r.generation, r.rank};
  self->send(handle, assign_atom::value, assignment_of(*j, r.rank));
}

void apply(self_ptr self, Actions&& a) {
  auto& s = self->state;
  persist(self, a.events);
  for (auto& e : a.events) record_event(self, std::move(e));
  // Survivors first: their handles carry the new generation before a launch that fails at
  // once can end it.
  for (const auto& r : a.reassigns) reassign(self, r);
  for (const auto& l : a.launches) {
    auto it = s.agents.find(l.agent_id);
    if (it == s.agents.end()) {
      Actions more;
      s.st->launch_failed(l.job_id, l.generation, l.rank, "agent " + l.agent_id + " is gone", &more);
      apply(self, std::move(more));
      continue;
    }
    LaunchRequest req{l.job_id, l.generation, l.rank, l.device, l.log_path, random_hex(16)};
    s.launch_tokens[{l.job_id, l.generation, l.rank}] = req.token;
    s.launch_agents[{l.job_id, l.generation, l.rank}] = l.agent_id;
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
  // A generation's checkpoints in progress are dropped once for it, not once per rank told
  // (each drop walks every shard report still waiting: N² at a failure during a checkpoint).
  std::map<std::pair<std::string, int32_t>, const std::string*> aborted;
  send_aborts(self, a.aborts);
  for (const auto& ab : a.aborts) aborted.emplace(std::make_pair(ab.job_id, ab.generation), &ab.reason);
  for (const auto& [gen, reason] : aborted)
    drop_checkpoints(self, gen.first, gen.second, "generation aborted: " + *reason);
  for (const auto& d : a.drains) {
    auto it = s.workers.find({d.job_id, d.generation, d.rank});
    if (it != s.workers.end()) self->send(it->second, drain_atom::value, int32_t{d.generation}, d.step);
  }
  for (const auto& r : a.releases) {
    auto it = s.workers.find({r.job_id, r.generation, r.rank});
    if (it == s.workers.end()) continue;
    Assignment none;
    none.refused = "no later generation needs this process: " + r.reason;
    self->send(it->second, assign_atom::value, none);
  }
  for (const auto& k : a.kills) {
    auto it = s.agents.find(k.agent_id);
    if (it == s.agents.end()) continue;
    KillRequest req{k.job_id, {}, {}};
    for (size_t i = 0; i < k.ranks.size(); ++i) {
      req.generations.push_back(k.generations[i]);
      req.ranks.push_back(k.ranks[i]);
    }
    self->delayed_send(it->second, s.opt.kill_grace, kill_atom::value, req);
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

// An agent's report on a process it launched (exit, stop): well formed and from that agent,
// else refused by name.
template <class Report>
bool launch_report_taken(self_ptr self, const char* what, const Report& x) {
  if (auto why = check(x); !why.empty()) {
    refuse(self, what, why);
    return false;
  }
  if (from_launching_agent(self, x.job_id, x.generation, x.rank)) return true;
  refuse(self, what, "not from the agent that launched job " + x.job_id + " rank " + std::to_string(x.rank));
  return false;
}

coordinator_actor::behavior_type coordinator_fn(self_ptr self, CoordinatorActorOptions opt) {
  self->state.opt = opt;
  self->state.st = std::make_unique<CoordinatorState>(opt.runs_dir, opt.protocol);
  self->state.st->set_default_hardware(opt.default_hardware);
  self->state.committer = self->spawn<caf::detached + caf::linked>(committer_fn, self->state.commits);
  self->state.st->set_before_checkpoint_pick([commits = self->state.commits](const std::string& job) {
    if (!commits->wait(job, std::chrono::seconds(120)))
      std::cerr << "troupe coordinator: job " << job
                << ": a checkpoint commit still runs after 120 s; picking a checkpoint without it"
                << std::endl;
  });
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
      // Whether its connection went (remote_link_unreachable) or its actor ended, and which
      // node it was: what tells a lost host from a lost connection in the log.
      std::cerr << utc_timestamp() << " troupe coordinator: agent " << id << " lost (node "
                << caf::to_string(dm.source.node()) << "): " << self->system().render(dm.reason) << std::endl;
      s.agent_ids.erase(it);
      s.agents.erase(id);
      s.where_view.stale = true;
      // Its processes died with it: their launches name nothing any more.
      for (auto l = s.launch_agents.begin(); l != s.launch_agents.end();) {
        if (l->second == id) {
          s.launch_tokens.erase(l->first);
          l = s.launch_agents.erase(l);
        } else {
          ++l;
        }
      }
      try {
        Actions a;
        s.st->remove_agent(id, &a);
        apply(self, std::move(a));
      } catch (const std::exception& e) {
        internal_error("agent loss", e);
      }
      return;
    }
    if (auto it = s.worker_refs.find(dm.source); it != s.worker_refs.end()) {
      WorkerRef w = it->second;
      s.worker_refs.erase(it);
      remove_worker(self, {w.job, w.generation, w.rank});
      if (!s.st->current(w.job, w.generation)) {
        // A survivor of an ended generation can serve no other.
        try {
          Actions a;
          s.st->survivor_lost(w.job, w.generation, w.rank, &a);
          apply(self, std::move(a));
        } catch (const std::exception& e) {
          internal_error("survivor loss", e);
        }
        return;
      }
      // The agent's exit report (with the signal) follows within a reaping
      // period (20 ms); give it a moment before calling the rank merely "lost".
      s.lost_reasons[{w.job, w.generation, w.rank}] = self->system().render(dm.reason);
      self->delayed_send(self, std::chrono::milliseconds(250), lost_atom::value, w.job, w.generation, w.rank);
    }
  });

  // Every handler checks what it was sent (actors/validate.hpp) and who sent it
  // before the state sees it, and none lets an exception out: an exception
  // would end the actor and leave the process serving nothing.
  return {
      [=](reg_agent_atom, const AgentHello& h) -> Welcome {
        auto& s = self->state;
        if (auto why = check(h); !why.empty()) {
          refuse(self, "an agent registration", why);
          return Welcome{false, "refused: " + why, s.opt.protocol};
        }
        auto sender = self->current_sender();
        if (!sender) return Welcome{false, "refused: anonymous registration", s.opt.protocol};
        try {
          Actions a;
          auto r = s.st->register_agent(h.protocol, h.host, h.pid, h.devices, &a);
          if (r.accepted) {
            auto handle = caf::actor_cast<agent_actor>(sender);
            self->monitor(handle);
            s.agents[r.message] = handle;
            s.where_view.stale = true;
            s.agent_ids[handle.address()] = r.message;
          }
          apply(self, std::move(a));
          return Welcome{r.accepted, r.message, s.opt.protocol};
        } catch (const std::exception& e) {
          internal_error("agent registration", e);
          return Welcome{false, "refused: internal error", s.opt.protocol};
        }
      },
      [=](reg_worker_atom, const WorkerHello& h) -> Assignment {
        auto& s = self->state;
        Assignment out;
        if (auto why = check(h); !why.empty()) {
          refuse(self, "a worker registration", why);
          out.refused = why;
          return out;
        }
        // Only the process its agent started holds the launch's token; it is spent here.
        const RankKey key{h.job_id, h.generation, h.rank};
        auto tok = s.launch_tokens.find(key);
        auto sender = self->current_sender();
        if (tok == s.launch_tokens.end() || !sender || !constant_time_equal(tok->second, h.token)) {
          out.refused = "job " + h.job_id + " generation " + std::to_string(h.generation) + " rank " +
                        std::to_string(h.rank) + " was not launched with this token";
          if (s.st->current(h.job_id, h.generation)) refuse(self, "a worker registration", out.refused);
          return out;
        }
        try {
          Actions a;
          auto w = s.st->register_worker(h.protocol, h.job_id, h.generation, h.rank, h.host, h.pid, &a);
          out.refused = w.refused;
          if (w.refused.empty()) {
            s.launch_tokens.erase(tok);
            auto handle = caf::actor_cast<worker_actor>(sender);
            self->monitor(handle);
            add_worker(self, key, handle);
            s.worker_refs[handle.address()] = WorkerRef{h.job_id, h.generation, h.rank};
            out = w.spare ? spare_assignment(*w.job, h.generation, w.rank) : assignment_of(*w.job, w.rank);
          }
          apply(self, std::move(a));
        } catch (const std::exception& e) {
          internal_error("worker registration", e);
          out = Assignment{};
          out.refused = "internal error";
        }
        return out;
      },
      [=](worker_exit_atom, const WorkerExit& x) {
        if (!launch_report_taken(self, "a worker exit report", x)) return;
        // The process of that launch is gone: nothing names it any more (the table stays as
        // large as the live processes, not every launch the job ever made).
        self->state.launch_agents.erase({x.job_id, x.generation, x.rank});
        self->state.launch_tokens.erase({x.job_id, x.generation, x.rank});
        try {
          Actions a;
          self->state.st->worker_exited(x.job_id, x.generation, x.rank, x.pid, x.exit_code, x.signal, &a);
          apply(self, std::move(a));
        } catch (const std::exception& e) {
          internal_error("worker exit", e);
        }
      },
      [=](worker_stop_atom, const WorkerStopped& x) {
        if (!launch_report_taken(self, "a worker stop report", x)) return;
        try {
          Actions a;
          self->state.st->worker_stopped(x.job_id, x.generation, x.rank, x.pid, x.signal, x.stopped_ms, &a);
          apply(self, std::move(a));
        } catch (const std::exception& e) {
          internal_error("worker stop", e);
        }
      },
      [=](step_atom, const StepMetrics& m) { take_step(self, m); },
      [=](steps_atom, const std::vector<StepMetrics>& batch) {
        // A host's reports, from its step batcher (an actor of the agent's node, the node of the
        // relays its ranks registered through): each is checked as one sent alone.
        if (batch.size() > kMaxStepBatch)
          return refuse(self, "step metrics",
                        "a batch of " + std::to_string(batch.size()) + " (at most " +
                            std::to_string(kMaxStepBatch) + ")");
        for (const auto& m : batch) take_step(self, m);
      },
      [=](worker_done_atom, WorkerResult r) -> bool {
        if (auto why = check(r); !why.empty()) {
          refuse(self, "a worker result", why);
          return false;
        }
        if (!from_worker(self, r.job_id, r.generation, r.rank)) {
          if (self->state.st->current(r.job_id, r.generation))
            refuse(self, "a worker result",
                   "not from the process registered as rank " + std::to_string(r.rank));
          return false;
        }
        try {
          Actions a;
          if (r.ok)
            self->state.st->worker_done(r.job_id, r.generation, r.rank, r.drained, &a);
          else  // the name is the peer's: only a cause a worker reports is believed
            self->state.st->worker_failed(r.job_id, r.generation, r.rank,
                                          reported_failure_cause(r.error_name), r.message, &a, r.stays,
                                          MemoryHeld{r.snapshots, r.replicated, r.held, r.held_rank});
          apply(self, std::move(a));
        } catch (const std::exception& e) {
          internal_error("worker result", e);
        }
        return true;
      },
      [=](ckpt_shard_atom, CkptShard r) -> caf::typed_response_promise<CkptCommitted> {
        auto& s = self->state;
        std::string why = check(r);
        if (why.empty() && !from_worker(self, r.job_id, r.generation, r.rank))
          why = "not from the process registered as rank " + std::to_string(r.rank);
        if (why.empty()) {
          // A rank commits only into its own job's checkpoint directory, with the job's own keep.
          const Job* j = s.st->job(r.job_id);
          if (!j || j->generation != r.generation) {
            why = "generation " + std::to_string(r.generation) + " of job " + r.job_id + " is not running";
          } else if (std::filesystem::path(r.root).lexically_normal() !=
                     std::filesystem::path(s.st->checkpoint_root(*j)).lexically_normal()) {
            why = "checkpoint root " + r.root + " is not the job's (" + s.st->checkpoint_root(*j) + ")";
          } else if (r.world != j->layout.world()) {
            why =
                "world " + std::to_string(r.world) + " is not the job's " + std::to_string(j->layout.world());
          } else {
            r.keep = j->request.checkpoint_keep;
          }
        }
        if (!why.empty()) refuse(self, "a checkpoint report", why);
        // Made after the checks: making it takes the sender out of the current message.
        auto rp = self->make_response_promise<CkptCommitted>();
        if (!why.empty()) {
          rp.deliver(CkptCommitted{false, "", "refused: " + why});
          return rp;
        }
        try {
          take_shard(self, r, rp);
        } catch (const std::exception& e) {
          internal_error("checkpoint report", e);
          if (rp.pending()) rp.deliver(CkptCommitted{false, "", "internal error"});
        }
        return rp;
      },
      [=](store_set_atom, const StoreKey& k, const std::string& value) -> StoreValue {
        if (auto why = store_refusal(self, k, value.size()); !why.empty()) return StoreValue{false, "", why};
        auto& st = *self->state.st;
        auto woken = st.store().set(store_namespace(k.job_id, k.generation, k.group), k.key, value);
        wake_waiters(self, woken);
        return StoreValue{true, "", ""};
      },
      [=](store_add_atom, const StoreKey& k, int64_t delta) -> StoreValue {
        if (auto why = store_refusal(self, k, 0); !why.empty()) return StoreValue{false, "", why};
        auto& st = *self->state.st;
        auto [v, woken] = st.store().add(store_namespace(k.job_id, k.generation, k.group), k.key, delta);
        wake_waiters(self, woken);
        return StoreValue{true, std::to_string(v), ""};
      },
      [=](store_get_atom, const StoreKey& k, int64_t timeout_ms) -> caf::typed_response_promise<StoreValue> {
        // Checked before the promise is made: making it takes the sender out of the current message.
        std::string why = store_refusal(self, k, 0);
        auto rp = self->make_response_promise<StoreValue>();
        if (!why.empty()) {
          rp.deliver(StoreValue{false, "", why});
          return rp;
        }
        auto& st = *self->state.st;
        std::string ns = store_namespace(k.job_id, k.generation, k.group);
        if (auto v = st.store().get(ns, k.key)) {
          rp.deliver(StoreValue{true, *v, ""});
          return rp;
        }
        uint64_t id = st.store().add_waiter(ns, k.key);
        self->state.waiters[id] = CoordActorState::Waiter{rp, ns, k.key};
        // A wait is bounded whatever the peer asks for.
        self->delayed_send(self, std::chrono::milliseconds(std::clamp<int64_t>(timeout_ms, 0, 3600 * 1000)),
                           store_expire_atom::value, id);
        return rp;
      },
      [=](store_expire_atom, uint64_t id) {
        auto& s = self->state;
        auto it = s.waiters.find(id);
        if (it == s.waiters.end() || !s.st->store().remove_waiter(id)) return;
        it->second.promise.deliver(
            StoreValue{false, "", "timed out waiting for key '" + sanitize_utf8(it->second.key, 256) + "'"});
        s.waiters.erase(it);
      },
      [=](api_atom, const std::string& text) -> std::string {
        if (!from_local(self)) {
          refuse(self, "an API request", "the API is served to this process's API thread only");
          return json_text(api_error("unauthorized", "API requests go to the ZeroMQ endpoint"));
        }
        if (auto bad = invalid_utf8_at(text); bad != std::string::npos)
          return json_text(
              api_error("bad_request", "the request is not valid UTF-8 (byte " + std::to_string(bad) + ")"));
        nlohmann::json req;
        try {
          req = json_read::parse(text, "the request", api_request_limits());
        } catch (const Error& e) {
          return json_text(api_error("bad_json", e.what()));
        }
        Actions a;
        nlohmann::json reply;
        try {
          reply = handle_api_request(*self->state.st, req, &a);
        } catch (const std::exception& e) {
          reply = api_error("internal", e.what());
        }
        try {
          apply(self, std::move(a));
        } catch (const std::exception& e) {
          internal_error("API request", e);
        }
        return json_text(reply);
      },
      [=](lost_atom, const std::string& job, int32_t generation, int32_t rank) {
        if (!from_local(self)) return refuse(self, "a lost-rank timer", "not sent by this coordinator");
        auto& s = self->state;
        std::string why = "connection lost";
        if (auto it = s.lost_reasons.find({job, generation, rank}); it != s.lost_reasons.end()) {
          why = it->second;
          s.lost_reasons.erase(it);
        }
        try {
          Actions a;
          s.st->worker_lost(job, generation, rank, why, &a);
          apply(self, std::move(a));
        } catch (const std::exception& e) {
          internal_error("lost rank", e);
        }
      },
      [=](tick_atom) {
        if (!from_local(self)) return refuse(self, "a tick", "not sent by this coordinator");
        auto& s = self->state;
        try {
          Actions a;
          s.st->tick(now_ms(), &a);
          apply(self, std::move(a));
        } catch (const std::exception& e) {
          internal_error("tick", e);
        }
        poll_where(self);
        self->delayed_send(self, kTick, tick_atom::value);
      },
  };
}

}  // namespace

actors::coordinator_actor spawn_coordinator(caf::actor_system& sys, CoordinatorActorOptions options) {
  return sys.spawn(coordinator_fn, std::move(options));
}

}  // namespace troupe::coord

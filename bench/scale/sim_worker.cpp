#include "bench/scale/sim_worker.hpp"

#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "bench/scale/rendezvous_script.hpp"
#include "bench/scale/sim.hpp"
#include "checkpoint/checkpoint.hpp"
#include "plan/grid.hpp"

namespace troupe::scale {

namespace {

using namespace troupe::actors;
using sim_step_atom = caf::atom_constant<caf::atom("sim_step")>;
using sim_hang_atom = caf::atom_constant<caf::atom("sim_hang")>;

// How long the coordinator may park a rendezvous read (the communicators' default).
constexpr int64_t kStoreWaitMs = 120000;

struct WorkerState {
  SimWorkerConfig cfg;
  SimSink* sink = nullptr;
  coordinator_actor coord;
  Assignment a;
  std::string where = "registering";
  std::unique_ptr<RendezvousScript> script;
  Pattern pattern = Pattern::nccl;
  int64_t rdv_start = 0;
  int64_t step = 0;
  int64_t drain_after = -1;
  bool stepping = false;
  bool ended = false;
  static inline const char* name = "troupe.sim_worker";
};

using self_ptr = caf::stateful_actor<WorkerState>*;

std::string key_of(const WorkerState& s) {
  return std::to_string(s.cfg.generation) + " " + std::to_string(s.cfg.rank);
}

// The worker's process exits with `code` (its agent reports it).
void end(self_ptr self, int code) {
  auto& s = self->state;
  if (s.ended) return;
  s.ended = true;
  s.stepping = false;
  s.sink->emit("exit " + key_of(s) + " " + std::to_string(code) + " " + std::to_string(now_ns()));
  s.sink->ended(s.cfg.node, code);
  self->quit();
}

// A failure the worker names, reported before it ends (worker_done, then the exit).
void fail(self_ptr self, const std::string& cause, const std::string& message) {
  auto& s = self->state;
  if (s.ended) return;
  s.stepping = false;
  WorkerResult r{s.cfg.job_id, s.cfg.generation, s.cfg.rank, false, cause, message, false};
  self->request(s.coord, std::chrono::seconds(10), worker_done_atom::value, r)
      .then([=](bool) { end(self, 1); }, [=](caf::error&) { end(self, 1); });
}

// What a real worker checks of its Assignment before it connects to anyone (shipped_plan).
std::string check_assignment(const WorkerState& s, const Assignment& a) {
  if (!a.refused.empty()) return "refused: " + a.refused;
  if (a.job_id != s.cfg.job_id || a.generation != s.cfg.generation || a.rank != s.cfg.rank)
    return "assignment for another rank: job " + a.job_id + " generation " + std::to_string(a.generation) +
           " rank " + std::to_string(a.rank);
  const plan::Layout layout{a.dp, a.pp, a.tp};
  if (a.dp < 1 || a.pp < 1 || a.tp < 1 || a.world != layout.world() || a.rank >= a.world)
    return "rank " + std::to_string(a.rank) + " of " + std::to_string(a.world) + " does not fit layout " +
           layout.str();
  if (!(plan::coord_of(layout, a.rank) == plan::Coord{a.dp_index, a.pp_index, a.tp_index}))
    return "grid coordinates do not match rank " + std::to_string(a.rank);
  if (a.place.rfind("rank " + std::to_string(a.rank) + ":", 0) != 0) return "place '" + a.place + "'";
  if (a.spec_yaml.empty() || a.run_dir.empty() || a.chunk_boundaries.size() < 2) return "no spec or plan";
  return "";
}

void start_stepping(self_ptr self);
void next_store_op(self_ptr self);

void start_pattern(self_ptr self, Pattern p) {
  auto& s = self->state;
  s.pattern = p;
  s.rdv_start = now_ns();
  s.script = std::make_unique<RendezvousScript>(
      p, rank_groups(s.a.job_id, s.a.generation, s.a.dp, s.a.pp, s.a.tp, s.a.rank), s.cfg.host,
      p == Pattern::gloo ? s.cfg.gloo_max : 0);
  s.where = std::string("connecting (") + (p == Pattern::nccl ? "nccl" : "gloo") + " rendezvous)";
  next_store_op(self);
}

void pattern_done(self_ptr self) {
  auto& s = self->state;
  const int64_t t = now_ns();
  s.sink->emit("rdv " + key_of(s) + (s.pattern == Pattern::nccl ? " nccl " : " gloo ") + std::to_string(t) +
               " 1 " + std::to_string(s.script->issued()) + " " + std::to_string(t - s.rdv_start) + " " +
               std::to_string(s.script->skipped_groups()));
  if (s.pattern == Pattern::nccl && s.cfg.gloo_max > 0) return start_pattern(self, Pattern::gloo);
  s.script.reset();
  start_stepping(self);
}

void store_failed(self_ptr self, const std::string& key, const std::string& why) {
  auto& s = self->state;
  if (s.ended || !s.script) return;  // aborted meanwhile
  s.sink->emit("rdv " + key_of(s) + (s.pattern == Pattern::nccl ? " nccl " : " gloo ") +
               std::to_string(now_ns()) + " 0 " + std::to_string(s.script->issued()) + " 0 0 " + key + ": " +
               why);
  fail(self, why.rfind("timed out", 0) == 0 ? "comm_timed_out" : "comm_internal",
       "coordinator store '" + key + "': " + why);
}

void next_store_op(self_ptr self) {
  auto& s = self->state;
  if (s.ended || !s.script) return;
  std::optional<StoreOp> op = s.script->next();
  if (!op) return pattern_done(self);
  StoreKey k{s.a.job_id, s.a.generation, "", op->key};
  if (op->kind == StoreOp::Kind::set) {
    self->request(s.coord, std::chrono::seconds(30), store_set_atom::value, k, op->value)
        .then(
            [=](const StoreValue& v) {
              if (!v.found) return store_failed(self, k.key, v.error);
              next_store_op(self);
            },
            [=](caf::error& e) { store_failed(self, k.key, self->system().render(e)); });
    return;
  }
  self->request(s.coord, std::chrono::milliseconds(kStoreWaitMs + 10000), store_get_atom::value, k,
                kStoreWaitMs)
      .then(
          [=](const StoreValue& v) {
            if (!v.found) return store_failed(self, k.key, v.error);
            const bool match = op->expect.empty()
                                   ? !v.value.empty()
                                   : v.value.size() >= op->expect_at + op->expect.size() &&
                                         v.value.compare(op->expect_at, op->expect.size(), op->expect) == 0;
            if (!self->state.script) return;  // aborted meanwhile
            if (!match && op->shm_probe) {
              self->state.script->shm_mismatch();
            } else if (!match) {
              return store_failed(
                  self, k.key,
                  "read " + std::to_string(v.value.size()) + " bytes that are not what its peer wrote");
            }
            next_store_op(self);
          },
          [=](caf::error& e) { store_failed(self, k.key, self->system().render(e)); });
}

// The shard of one rank: a small file in step_N.tmp and the manifest without its file list.
void checkpoint(self_ptr self, int64_t step) {
  auto& s = self->state;
  const Assignment& a = s.a;
  const std::string root = a.run_dir + "/ckpt";
  CkptShard m{a.job_id, a.generation, a.rank, a.world, step, root, 0, "", {}};
  const int64_t sent = now_ns();
  try {
    // One writer at a time in this process: 4,096 ranks creating their files in one directory
    // at once, from 512 simulated hosts' threads, spun on the directory's lock and starved the
    // two cores (hosts write from cores of their own).
    static std::mutex one_writer;
    std::lock_guard<std::mutex> lock(one_writer);
    const std::string dir = checkpoint::prepare(root, step);
    const std::string name = "rank_" + std::to_string(a.rank) + ".bin";
    {
      std::string bytes(static_cast<size_t>(s.cfg.ckpt_bytes), '\0');
      for (size_t i = 0; i < bytes.size(); ++i)
        bytes[i] = static_cast<char>((i * 131 + a.rank + step) & 0xff);
      std::ofstream f(dir + "/" + name, std::ios::binary | std::ios::trunc);
      f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
      if (!f) throw Error("cannot write " + dir + "/" + name);
    }
    m.files.push_back(
        {name, static_cast<uint64_t>(s.cfg.ckpt_bytes), checkpoint::file_xxh64(dir + "/" + name)});
    checkpoint::Manifest man;
    man.step = step;
    man.data_cursor = step;
    man.dp = a.dp;
    man.pp = a.pp;
    man.tp = a.tp;
    man.spec_yaml = a.spec_yaml;
    m.manifest_json = checkpoint::to_json(man).dump();
  } catch (const std::exception& e) {
    s.sink->ckpt_done(a.generation, step, sent, now_ns(), false, e.what());
    return;
  }
  const bool drain = s.drain_after >= 0 && step == s.drain_after + 1;
  self->request(s.coord, std::chrono::minutes(5), ckpt_shard_atom::value, m)
      .then(
          [=](const CkptCommitted& c) {
            self->state.sink->ckpt_done(self->state.cfg.generation, step, sent, now_ns(), c.ok, c.error);
            if (drain && c.ok) {
              auto& st = self->state;
              WorkerResult r{st.cfg.job_id, st.cfg.generation, st.cfg.rank, true, "", "", true};
              auto done = [=] {
                self->request(self->state.coord, std::chrono::seconds(10), worker_done_atom::value, r)
                    .then([=](bool) { end(self, 0); }, [=](caf::error&) { end(self, 0); });
              };
              // As a relay passes on a result: after the steps its host's batcher holds.
              if (st.cfg.batcher)
                self->request(st.cfg.batcher, std::chrono::seconds(10), flush_atom::value)
                    .then([=](bool) { done(); }, [=](caf::error&) { done(); });
              else
                done();
            }
          },
          [=](caf::error& e) {
            self->state.sink->ckpt_done(self->state.cfg.generation, step, sent, now_ns(), false,
                                        self->system().render(e));
          });
}

// The step a checkpoint's manifest names, read once per process: its manifest lists every
// rank's files (788 KiB at 4,096 ranks), and 4,096 simulated ranks parsing it on two cores
// (each real rank on its own host) starved the harness at every relaunch.
int64_t resumed_step(const std::string& checkpoint_dir) {
  static std::mutex mu;
  static std::map<std::string, int64_t> steps;
  std::lock_guard<std::mutex> lock(mu);
  auto it = steps.find(checkpoint_dir);
  if (it == steps.end())
    it = steps.emplace(checkpoint_dir, checkpoint::read_manifest(checkpoint_dir).step).first;
  return it->second;
}

void start_stepping(self_ptr self) {
  auto& s = self->state;
  s.step = s.a.first_step;
  // As the engine: a relaunch resumes after the step of the checkpoint it names.
  if (!s.a.resume_from.empty()) {
    try {
      s.step = resumed_step(s.a.resume_from);
    } catch (const std::exception& e) {
      return fail(self, "engine_error", std::string("cannot resume: ") + e.what());
    }
  }
  s.stepping = true;
  s.where = "step " + std::to_string(s.step) + ": forward mb 0";
  if (!s.cfg.ticked) self->delayed_send(self, std::chrono::milliseconds(s.cfg.step_ms), sim_step_atom::value);
}

void one_step(self_ptr self) {
  auto& s = self->state;
  if (!s.stepping || s.ended) return;
  const int64_t step = s.step++;
  StepMetrics m;
  m.job_id = s.a.job_id;
  m.generation = s.a.generation;
  m.rank = s.a.rank;
  m.step = step;
  m.loss = 5.5 / (1.0 + 0.001 * static_cast<double>(step));
  m.lr = 3e-4;
  m.tokens = 4096;
  m.step_ms = s.cfg.step_ms;
  m.grad_norm = 1.0;
  m.compute_ms = 0.6 * s.cfg.step_ms;
  m.comm_ms = 0.3 * s.cfg.step_ms;
  m.bubble_ms = 0.1 * s.cfg.step_ms;
  if (s.cfg.batcher)
    self->send(s.cfg.batcher, step_atom::value, m);
  else
    self->send(s.coord, step_atom::value, m);
  s.sink->step_sent(s.a.generation, step, now_ns());
  s.where = "step " + std::to_string(s.step) + (s.step % 2 ? ": backward mb 1" : ": forward mb 0");
  const bool drain = s.drain_after >= 0 && step >= s.drain_after;
  if ((s.cfg.ckpt_every > 0 && (step + 1) % s.cfg.ckpt_every == 0) || drain) checkpoint(self, step + 1);
  if (drain) {
    s.stepping = false;
    s.where = "draining";
    return;
  }
  if (!s.cfg.ticked) self->delayed_send(self, std::chrono::milliseconds(s.cfg.step_ms), sim_step_atom::value);
}

caf::behavior sim_worker_fn(self_ptr self, coordinator_actor coord, SimWorkerConfig cfg, SimSink* sink) {
  auto& s = self->state;
  s.cfg = std::move(cfg);
  s.sink = sink;
  s.coord = coord;
  self->monitor(coord);
  self->set_down_handler([=](caf::down_msg&) { end(self, 1); });
  sink->emit("connected " + key_of(s) + " " + std::to_string(now_ns()));
  WorkerHello hello{kProtocolVersion, s.cfg.job_id, s.cfg.generation, s.cfg.rank,
                    s.cfg.pid,        s.cfg.host,   s.cfg.token};
  self->request(coord, std::chrono::seconds(30), reg_worker_atom::value, hello)
      .then(
          [=](const Assignment& a) {
            auto& st = self->state;
            const std::string why = check_assignment(st, a);
            st.sink->emit("assigned " + key_of(st) + " " + std::to_string(now_ns()) +
                          (why.empty() ? " 1 " : " 0 ") + (why.empty() ? std::to_string(a.world) : why));
            if (!a.refused.empty()) return end(self, 3);
            if (!why.empty()) return fail(self, "invalid_spec", why);
            st.a = a;
            start_pattern(self, Pattern::nccl);
          },
          [=](caf::error& e) {
            self->state.sink->emit("assigned " + key_of(self->state) + " " + std::to_string(now_ns()) +
                                   " 0 registration failed: " + self->system().render(e));
            end(self, 1);
          });
  return {
      [=](abort_atom, int32_t, const std::string& reason) {
        auto& st = self->state;
        if (st.ended || st.where == "aborted") return;
        st.sink->emit("abort " + key_of(st) + " " + std::to_string(now_ns()));
        st.where = "aborted";
        st.script.reset();
        fail(self, "aborted", reason);
      },
      [=](where_atom) -> std::string { return self->state.where; },
      [=](drain_atom, int32_t, int64_t step) { self->state.drain_after = step; },
      // A simulated rank never stays for a later generation (its WorkerResult says so): the
      // coordinator sends it none.
      [=](assign_atom, const Assignment&) {},
      [=](sim_step_atom) { one_step(self); },
      // SIGSTOP of a worker process whose connection stays: it reads nothing more (no step, no
      // "where" answer, no abort) until its agent kills it.
      [=](sim_hang_atom) {
        self->state.stepping = false;
        self->set_default_handler(caf::skip);
        self->become([](sim_hang_atom) {});
      },
  };
}

}  // namespace

void tick_sim_worker(const caf::actor& worker) { caf::anon_send(worker, sim_step_atom::value); }

void hang_sim_worker(const caf::actor& worker) { caf::anon_send(worker, sim_hang_atom::value); }

caf::actor spawn_sim_worker(caf::actor_system& sys, coordinator_actor coordinator, SimWorkerConfig cfg,
                            SimSink* sink) {
  return sys.spawn(sim_worker_fn, std::move(coordinator), std::move(cfg), sink);
}

}  // namespace troupe::scale

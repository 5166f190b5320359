// The worker process: one worker actor (control) + one engine thread (compute).
//
// A process may serve several generations of its job: when its generation is aborted under
// it (a peer failed), it reports so with `stays` and waits; the coordinator then pushes the
// Assignment of the next generation (same rank and device: a new Engine in this process) or
// a refused one (it exits).
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <future>
#include <iostream>
#include <mutex>
#include <thread>

#include "actors/protocol.hpp"
#include "actors/secret.hpp"
#include "actors/system.hpp"
#include "comm/error.hpp"
#include "core/error.hpp"
#include "core/spec.hpp"
#include "worker/agent.hpp"
#include "worker/coordinator_store.hpp"
#include "worker/data_address.hpp"
#include "worker/engine.hpp"
#include "worker/failure.hpp"
#include "worker/memory_snapshot.hpp"
#include "worker/node.hpp"
#include "worker/relay.hpp"
#include "worker/train_loop.hpp"

namespace troupe::worker {

namespace {

using namespace troupe::actors;

// How long a process whose generation ended waits for its next assignment.
constexpr auto kParkedWait = std::chrono::minutes(10);
// A spare waits for a place as long as its job runs (the coordinator releases it at the end).
constexpr auto kSpareWait = std::chrono::hours(24 * 365);

// Shared by the worker actor (abort, drain, where, assignments) and the engine thread.
struct Control {
  std::mutex mu;
  std::condition_variable cv;
  Engine* engine = nullptr;
  int32_t generation = -1;    // the generation the engine thread runs (-1: none yet)
  int32_t aborted_upto = -1;  // every generation up to this one was aborted
  bool aborted = false;       // the current generation was
  std::string abort_reason;
  std::string phase = "registering";
  std::deque<Assignment> assignments;  // the registration's, then those pushed for later generations
  // A resize: checkpoint after this step and stop (-1 = none); a drain of a generation this
  // process has not begun yet waits for it.
  std::atomic<int64_t> drain_after{-1};
  int32_t drain_generation = -1;
  int64_t drain_step = -1;

  void assign(Assignment a) {
    std::lock_guard<std::mutex> lock(mu);
    assignments.push_back(std::move(a));
    cv.notify_all();
  }
  // The next assignment, or a refused one after `limit`.
  Assignment next_assignment(std::chrono::milliseconds limit) {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, limit, [&] { return !assignments.empty(); })) {
      Assignment none;
      none.refused = "no assignment within " + std::to_string(limit.count() / 1000) + " s";
      return none;
    }
    Assignment a = std::move(assignments.front());
    assignments.pop_front();
    return a;
  }
  // The engine thread starts generation `g`: news of earlier ones no longer concerns it.
  void begin(int32_t g) {
    std::lock_guard<std::mutex> lock(mu);
    generation = g;
    aborted = g <= aborted_upto;
    if (!aborted) abort_reason.clear();
    drain_after = drain_generation == g ? drain_step : -1;
    phase = "building the engine";
  }
  // `g` < 0: whatever runs now (the coordinator is gone).
  void abort(int32_t g, const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    if (g < 0) g = std::max(generation, aborted_upto);
    if (g > aborted_upto) {
      aborted_upto = g;
      abort_reason = why;
    }
    if (g != generation) return;
    aborted = true;
    if (engine) engine->request_abort();
  }
  void drain(int32_t g, int64_t step) {
    std::lock_guard<std::mutex> lock(mu);
    if (g < generation) return;
    drain_generation = g;
    drain_step = step;
    if (g == generation) drain_after = step;
  }
};

// A rank whose generation ended under it (aborted by the coordinator, or failed by a peer
// through the data plane) is healthy and may serve the next one; any other failure ends it.
bool stays_after(const std::string& error_name) {
  const auto cause = parse_failure_cause(error_name);
  return cause && survivable(*cause);
}

struct WorkerState {
  std::shared_ptr<Control> control;
  static inline const char* name = "troupe.worker";
};

worker_actor::behavior_type worker_fn(worker_actor::stateful_pointer<WorkerState> self,
                                      coordinator_actor coord, WorkerHello hello,
                                      std::shared_ptr<Control> control) {
  self->state.control = control;
  self->monitor(coord);
  self->set_down_handler([=](caf::down_msg& dm) {
    Assignment none;
    none.refused = "lost the coordinator: " + self->system().render(dm.reason);
    control->assign(none);
    control->abort(-1, "lost the coordinator");
  });
  self->request(coord, std::chrono::seconds(30), reg_worker_atom::value, hello)
      .then([=](const Assignment& a) { control->assign(a); },
            [=](caf::error& e) {
              Assignment none;
              none.refused = "registration failed: " + self->system().render(e);
              control->assign(none);
            });
  return {
      [=](abort_atom, int32_t generation, const std::string& reason) { control->abort(generation, reason); },
      [=](drain_atom, int32_t generation, int64_t step) { control->drain(generation, step); },
      [=](assign_atom, const Assignment& a) {
        // Only the coordinator assigns: a peer that holds the cluster secret cannot.
        const auto& sender = self->current_sender();
        if (sender && sender->node() == coord.node()) control->assign(a);
      },
      [=](where_atom) -> std::string {
        std::lock_guard<std::mutex> lock(control->mu);
        return control->engine ? control->engine->where() : control->phase;
      },
  };
}

// Steps go to the coordinator as they complete; the drain step comes from the worker actor.
class CoordinatorReporter : public LoopReporter {
 public:
  CoordinatorReporter(const Assignment& a, const coordinator_actor& coord, const worker_actor& me,
                      Control& control)
      : a_(a), coord_(coord), me_(me), control_(control) {}
  void step(const StepReport& r) override {
    StepMetrics m{a_.job_id,
                  a_.generation,
                  a_.rank,
                  r.step,
                  r.loss,
                  r.lr,
                  r.tokens,
                  r.step_ms,
                  r.grad_norm,
                  r.val_loss.has_value(),
                  r.val_loss.value_or(0.0),
                  r.compute_ms,
                  r.comm_ms,
                  r.bubble_ms,
                  r.loss_scale,
                  r.skipped,
                  r.device_bytes,
                  r.device_peak_bytes,
                  r.snapshot_confirmed};
    // Sent as the worker actor: the coordinator takes steps only from the rank that registered.
    caf::send_as(me_, coord_, step_atom::value, m);
    std::cout << "step " << r.step << " loss " << r.loss << " step_ms " << r.step_ms << std::endl;
  }
  void checkpoint_started(const std::string& dir) override { std::cout << "checkpoint " << dir << std::endl; }
  int64_t drain_after() override { return control_.drain_after.load(); }

 private:
  const Assignment& a_;
  coordinator_actor coord_;
  worker_actor me_;
  Control& control_;
};

// The plan the coordinator shipped, rebuilt against the spec (make_plan checks that the
// boundaries cover its model and the micro-batches its batch), and this rank's place in it,
// which must be the one the coordinator assigned: checked before anything connects.
plan::Plan shipped_plan(const Assignment& a, const JobSpec& spec) {
  const plan::Layout layout{a.dp, a.pp, a.tp};
  std::vector<int> boundaries(a.chunk_boundaries.begin(), a.chunk_boundaries.end());
  plan::Plan p = plan::make_plan(plan::plan_inputs(spec), layout, a.micro_batch, boundaries);
  require(a.world == layout.world() && a.rank >= 0 && a.rank < layout.world(), "assignment: rank ", a.rank,
          " of ", a.world, " does not fit layout ", layout.str());
  const plan::RankPlace place = plan::rank_place(p, a.rank);
  require(place.coord == plan::Coord{a.dp_index, a.pp_index, a.tp_index} && place.str() == a.place,
          "assignment: the plan places this rank as \"", place.str(), "\", the coordinator as \"", a.place,
          "\" (dp ", a.dp_index, " pp ", a.pp_index, " tp ", a.tp_index, ")");
  return p;
}

WorkerResult train(const Assignment& a, const coordinator_actor& coord, const worker_actor& me,
                   Control& control, std::shared_ptr<comm::Store> store, const std::string& comm_host,
                   MemorySnapshots& snapshots, MemorySnapshots& held) {
  WorkerResult res;
  res.job_id = a.job_id;
  res.generation = a.generation;
  res.rank = a.rank;
  try {
    JobSpec spec = parse_spec(a.spec_yaml, a.run_dir + "/spec.yaml");
    EngineAssignment ea;
    ea.rank = a.rank;
    ea.layout = {a.dp, a.pp, a.tp};
    ea.plan = shipped_plan(a, spec);
    ea.generation = a.generation;
    ea.resume_from = a.resume_from;
    ea.snapshots = &snapshots;
    ea.memory_step = a.memory_step;
    ea.heal_root = a.heal_root;
    require(a.buddy_shift >= 0 && a.buddy_shift < std::max(a.world, 1) &&
                (a.memory_step >= 0 || !(a.heal_from_buddy || a.heal_to_partner)),
            "assignment: buddy shift ", a.buddy_shift, " over ", a.world, " ranks");
    ea.buddy_shift = a.buddy_shift;
    ea.held = &held;
    ea.heal_from_buddy = a.heal_from_buddy;
    ea.heal_to_partner = a.heal_to_partner;
    ea.trace_dir = a.run_dir + "/trace";
    // Ranks find each other through the coordinator's store, under (job, generation).
    ea.comm.backend = spec.resources.device == DeviceKind::cuda ? "nccl" : "gloo";
    ea.comm.job = a.job_id;
    ea.comm.generation = a.generation;
    ea.comm.store = std::move(store);
    ea.comm.hostname = comm_host;
    if (a.device.rfind("cuda:", 0) == 0) ea.comm.device = std::stoi(a.device.substr(5));
    // Checkpoints are committed by the coordinator once every rank reported its files.
    ea.commit_shard = [coord, job = a.job_id, gen = a.generation](const checkpoint::ShardReport& r) {
      CkptShard m{job, gen, r.rank, r.world, r.step, r.root, r.keep, r.manifest_json, {}};
      for (const auto& f : r.files) m.files.push_back({f.name, f.size, f.xxh64});
      caf::scoped_actor self{coord->home_system()};
      CkptCommitted out;
      self->request(coord, std::chrono::minutes(5), ckpt_shard_atom::value, m)
          .receive([&](const CkptCommitted& c) { out = c; },
                   [&](caf::error& e) {
                     out.error = "no answer from the coordinator: " + self->system().render(e);
                   });
      if (!out.ok)
        throw checkpoint::CheckpointError("checkpoint of step " + std::to_string(r.step) +
                                          " not committed: " + out.error);
      return out.dir;
    };
    {
      std::lock_guard<std::mutex> lock(control.mu);
      if (control.aborted) throw EngineAborted();
    }
    Engine engine(spec, ea);
    std::cout << "plan: " << engine.plan().str() << std::endl;
    std::cout << "memory: " << to_string(engine.memory()) << std::endl;
    {
      std::lock_guard<std::mutex> lock(control.mu);
      control.engine = &engine;
      if (control.aborted) engine.request_abort();
    }
    const std::string ckpt_dir = spec.checkpoint.dir.empty() ? a.run_dir + "/ckpt" : spec.checkpoint.dir;
    CoordinatorReporter reporter(a, coord, me, control);
    LoopEnd end = LoopEnd::finished;
    try {
      end = train_to_end(engine, spec, ckpt_dir, reporter);
    } catch (...) {
      std::lock_guard<std::mutex> lock(control.mu);
      control.engine = nullptr;
      throw;
    }
    const bool drained = end == LoopEnd::drained;
    if (drained) std::cout << "drained after step " << engine.next_step() - 1 << std::endl;
    rusage ru{};
    if (getrusage(RUSAGE_SELF, &ru) == 0)
      std::cout << "peak RSS " << ru.ru_maxrss / 1024 << " MiB" << std::endl;
    std::lock_guard<std::mutex> lock(control.mu);
    control.engine = nullptr;
    control.phase = drained ? "drained" : "finished";
    res.ok = true;
    res.drained = drained;
  } catch (...) {
    std::string abort_reason;
    {
      std::lock_guard<std::mutex> lock(control.mu);
      abort_reason = control.abort_reason;
    }
    WorkerFailure f = failure_of(std::current_exception(), abort_reason);
    res.error_name = to_string(f.cause);
    res.message = f.message;
  }
  return res;
}

}  // namespace

int run_worker(const WorkerOptions& o) {
  std::cout << "troupe worker: job " << o.job_id << " generation " << o.generation
            << (actors::is_spare_rank(o.rank) ? " spare " + std::to_string(o.rank - actors::kFirstSpareRank)
                                              : " rank " + std::to_string(o.rank))
            << " on " << o.device << " (pid " << getpid() << ")" << std::endl;
  std::pair<std::string, uint16_t> addr;
  std::string data_address;
  try {
    addr = parse_host_port(o.coordinator);
    data_address = data_plane_address(addr.first, o.data_interface);
  } catch (const Error& e) {
    std::cerr << "troupe worker: " << e.what() << "\n";
    return 2;
  }
  // The agent hands the launch token over in the environment; it goes no further.
  const char* tok = std::getenv(kLaunchTokenEnv);
  std::string token = tok ? tok : "";
  ::unsetenv(kLaunchTokenEnv);
  try {
    check_secret(o.secret_file);
  } catch (const Error& e) {
    std::cerr << "troupe worker: " << e.what() << "\n";
    return 2;
  }
  NodeConfig cfg(o.secret_file);
  caf::actor_system sys{cfg};
  // Through the agent's relay (worker/relay.hpp) when it has one, else directly. A loaded
  // host can take longer than the connection timeout to finish the TLS and CAF handshakes;
  // a few tries with backoff keep that from failing the generation.
  caf::expected<coordinator_actor> coord{caf::sec::invalid_argument};
  if (!o.relay.empty()) {
    coord = connect_relay(sys, o.relay, token);
    if (!coord) {
      std::cerr << "troupe worker: cannot reach the coordinator through the agent's relay at " << o.relay
                << ": " << sys.render(coord.error()) << "\n";
      return 1;
    }
    std::cout << "troupe worker: reached the coordinator through its agent's relay at " << o.relay
              << std::endl;
  } else {
    coord = connect_with_retry<coordinator_actor>(
        sys, addr.first, addr.second, std::chrono::milliseconds(250), std::chrono::seconds(4),
        [&](const caf::error& e, std::chrono::milliseconds backoff) {
          std::cerr << "troupe worker: cannot reach the coordinator at " << o.coordinator << " ("
                    << sys.render(e) << "); retrying in " << backoff.count() << " ms" << std::endl;
        });
    if (!coord) {
      std::cerr << "troupe worker: cannot reach the coordinator at " << o.coordinator << ": "
                << sys.render(coord.error()) << "\n";
      return 1;
    }
  }
  auto control = std::make_shared<Control>();
  WorkerHello hello{o.protocol_override ? o.protocol_override : kProtocolVersion,
                    o.job_id,
                    o.generation,
                    o.rank,
                    static_cast<int32_t>(getpid()),
                    host_name(),
                    token};
  auto self_actor = sys.spawn(worker_fn, *coord, hello, control);
  // The registration answers within its 30 s timeout (or the down handler does).
  Assignment a = control->next_assignment(std::chrono::minutes(1));
  if (!a.refused.empty()) {
    std::cerr << "troupe worker: refused: " << a.refused << "\n";
    caf::anon_send_exit(self_actor, caf::exit_reason::user_shutdown);
    return 3;
  }
  // On one host the ranks talk over loopback; across hosts over the address the
  // coordinator reaches this host by, unless the agent named one.
  std::cout << "data plane: " << data_address << std::endl;
  if (actors::is_spare_rank(a.rank)) {
    // A hot spare: started, connected and registered; a relaunch gives it a failed rank's place.
    std::cout << "spare " << a.rank - actors::kFirstSpareRank << ": registered, waiting for a place"
              << std::endl;
    {
      std::lock_guard<std::mutex> lock(control->mu);
      control->phase = "spare: waiting for a place";
    }
    a = control->next_assignment(kSpareWait);
    if (!a.refused.empty() || actors::is_spare_rank(a.rank)) {
      std::cout << "troupe worker: "
                << (a.refused.empty() ? "a spare's assignment names no place" : a.refused) << std::endl;
      caf::anon_send_exit(self_actor, caf::exit_reason::user_shutdown);
      return a.refused.rfind("no later generation", 0) == 0 ? 0 : 1;  // released, or lost
    }
    std::cout << "spare: takes rank " << a.rank << " of generation " << a.generation << std::endl;
  }

  WorkerResult result;
  MemorySnapshots snapshots;  // this rank's state after its latest steps, across generations
  MemorySnapshots held;       // copies of its buddy partner's
  for (bool first = true;; first = false) {
    std::string from = a.resume_from.empty() ? "" : ", resuming from " + a.resume_from;
    if (a.memory_step >= 0)
      from = ", resuming from the in-memory snapshot of step " + std::to_string(a.memory_step) +
             (a.heal_root >= 0 ? " (rank " + std::to_string(a.heal_root) + "'s)" : "") +
             (a.heal_from_buddy ? " (its buddy's copy)" : "");
    std::cout << (first ? "" : "generation " + std::to_string(a.generation) + ": ")
              << "assignment: " << a.place << " of layout " << plan::Layout{a.dp, a.pp, a.tp}.str() << from
              << std::endl;
    control->begin(a.generation);
    auto store = make_coordinator_store(sys, *coord, a.job_id, a.generation);
    std::thread engine_thread(
        [&] { result = train(a, *coord, self_actor, *control, store, data_address, snapshots, held); });
    engine_thread.join();
    result.stays = !result.ok && stays_after(result.error_name);
    if (result.stays) {
      result.snapshots = snapshots.held();
      result.replicated = snapshots.replicated();
      result.held = held.held();
      result.held_rank = held.rank();
    }
    if (!result.ok)
      std::cerr << "troupe worker: " << result.error_name << ": " << result.message << std::endl;

    // The coordinator acknowledges the result before this process exits or waits, so it
    // learns why a rank ended before its agent reports the exit.
    bool taken = false;
    caf::scoped_actor self{sys};
    self->request(*coord, std::chrono::seconds(10), worker_done_atom::value, result)
        .receive([&](bool ok) { taken = ok; },
                 [&](caf::error& e) {
                   std::cerr << "troupe worker: the coordinator did not take the result: " << sys.render(e)
                             << "\n";
                 });
    if (!result.stays || !taken) break;
    std::cout << "generation " << a.generation << " ended (" << result.error_name
              << "): waiting for the next assignment" << std::endl;
    a = control->next_assignment(kParkedWait);
    if (!a.refused.empty()) {
      std::cout << "troupe worker: " << a.refused << std::endl;
      result.ok = a.refused.rfind("no later generation", 0) == 0;  // released, not failed
      break;
    }
  }
  caf::anon_send_exit(self_actor, caf::exit_reason::user_shutdown);
  return result.ok ? 0 : 1;
}

}  // namespace troupe::worker

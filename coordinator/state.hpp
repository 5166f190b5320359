// The coordinator's whole state as plain C++: registry, job table, placement,
// step metrics and rendezvous store. Every entry point returns the side effects
// the actor shell must carry out (launch, abort, kill, publish) as values, so
// all of the scheduling logic is tested without actors or processes.
//
// Where it lives: state.cpp (agents, the job state machine, workers' reports),
// state_recovery.cpp (restarts, relaunches, the watchdog, resizing; the policy
// they apply is policy.hpp), state_persist.cpp (the job table of --state-dir),
// state_views.cpp (the API's JSON).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/job.hpp"
#include "coordinator/metrics.hpp"
#include "coordinator/registry.hpp"
#include "coordinator/rendezvous.hpp"
#include "core/failure.hpp"
#include "plan/plan.hpp"

namespace troupe::checkpoint {
class VerifiedCheckpoints;
}

namespace troupe::coord {

// What the coordinator needs from a job spec (coordinator/spec_request.hpp builds it).
struct JobRequest {
  std::string name;
  std::string spec_yaml;  // resolved, every default filled in
  std::string device_kind = "cpu";
  Layout layout;
  // What the plan of each generation depends on (model shape, batch, schedule): the
  // layout may change with a resize, the rest does not.
  plan::PlanInputs plan;
  int64_t total_steps = 0;
  std::string resume_from;  // checkpoint directory every rank resumes from ("" = fresh)
  // Failure handling and elasticity (spec keys fault.*, elastic.*, checkpoint.dir).
  std::string checkpoint_dir;    // "" = <run dir>/ckpt
  int checkpoint_keep = 0;       // checkpoint.keep: committed steps kept (0 = all)
  bool memory_snapshots = true;  // the ranks take in-memory snapshots (checkpoint.memory_every)
  int spares = 0;       // resources.spares: idle worker processes kept ready to take a failed rank's place
  bool spread = false;  // resources.placement: spread (one device per agent in turn), else pack
  // train.zero 0: a rank's data-parallel replicas hold its state bit for bit, so their own
  // snapshots are its copies (no buddy copies where they sit on other agents: choose_buddies).
  bool replicated = false;
  int max_restarts = 0;
  double restart_backoff_ms = 250;     // before the first relaunch; doubles with each restart, at most 8 s
  double step_timeout_ms = 0;          // 0 = max(10 s, 20 x the median step time)
  double replacement_wait_ms = 60000;  // how long a recovering job waits for devices
  int min_devices = 0;                 // 0 = the planned layout's size
  int max_devices = 0;                 // 0 = the planned layout's size
  // The planner (plan/planner.hpp): a spec that leaves a degree, micro_batch, recompute or
  // virtual_stages to it is planned at every launch (the first, and every relaunch after a
  // failure or a resize) for the devices there are: layout (tensor and pipeline too),
  // micro-batch, recompute. `layout` then holds the spec's fixed degrees and 1 for the rest.
  bool auto_plan = false;
  std::string hardware_yaml;  // the hardware profile it is planned with, resolved at submit
};

// What a rank whose process stays holds in memory (its WorkerResult): the steps of its own
// in-memory snapshots (the step each continues with), and of the copies of its buddy
// partner's (worker/snapshot_buddy.hpp).
struct MemoryHeld {
  std::vector<int64_t> snapshots;
  bool replicated = false;  // a data-parallel replica may be healed from them (train.zero 0)
  std::vector<int64_t> copies;
  int copies_of = -1;  // the partner's rank (-1: none held)
};

struct RankSlot {
  DeviceRef device;
  std::string host;
  int pid = 0;
  // The launch that started this rank's process: its agent knows it by (job,
  // launch_generation, launch_rank). Older than the job's generation for a survivor; a
  // spare's launch rank (actors/version.hpp: kFirstSpareRank) for a place a spare took.
  int launch_generation = 0;
  int launch_rank = 0;
  bool registered = false;  // the worker process asked for its assignment
  bool done = false;        // it reported success
  bool drained = false;     // with done: it stopped after the checkpoint of a resize
  bool exited = false;      // its agent reaped it
  bool stays = false;       // it reported a failure a peer caused and waits for the next generation
  MemoryHeld memory;        // with stays
  std::string where;        // its last answer to "where are you" ("" = none yet)
  double where_ms = 0;      // when it answered
};

// A rank's worker process that outlived its generation (a peer failed) and may serve the
// next one in the same place: it keeps its process, device and rank.
struct Survivor {
  int rank = 0;
  int generation = 0;         // the generation it last ran (its key on the coordinator)
  int launch_generation = 0;  // its agent's key (RankSlot::launch_generation, launch_rank)
  int launch_rank = 0;
  int pid = 0;
  DeviceRef device;
  std::string host;
  bool parked = false;  // it reported the end of its generation and waits for an assignment
  MemoryHeld memory;
};

// A hot spare: a worker process started for the job on a device of its own, registered and
// waiting (ready) until a relaunch gives it a failed rank's place. It outlives generations.
struct Spare {
  int launch_generation = 0;  // its agent's key, and its key on the coordinator while it waits
  int launch_rank = 0;        // actors/version.hpp: kFirstSpareRank + n
  int pid = 0;
  DeviceRef device;
  std::string host;
  bool ready = false;  // it registered and waits for a place
  int rank = -1;       // the place the job's next launch gives it (-1: none)
};

struct Job {
  std::string id;
  JobRequest request;
  JobState state = JobState::queued;
  Layout layout;       // of the current generation (request.layout until a resize)
  plan::Plan plan;     // of the current generation: computed once at launch, shipped to every rank
  std::string reason;  // why it waits, or why it failed / was cancelled
  std::optional<FailureCause> failure;  // why it failed (failed jobs only)
  int generation = 0;
  std::string run_dir;
  std::vector<RankSlot> ranks;  // by rank, once placed
  // Recovering: the processes of the failed generation that may serve the next one (they
  // hold their devices meanwhile). Taken by the relaunch when the layout stays, else released.
  std::vector<Survivor> survivors;
  // resources.spares: the job's spare processes (their devices are the job's), and how many it
  // launched so far (each gets the next spare launch rank). A relaunch gives ready spares the
  // places no survivor keeps (Spare::rank) and starts new ones on free devices.
  std::vector<Spare> spares;
  int spare_launches = 0;
  // The first report of the current generation from a rank that a peer failed through the data
  // plane (comm_peer_lost, ...): it names no culprit, so it becomes the generation's failure only
  // when no direct report (an exit, a lost connection) of another rank follows within a grace
  // period (tick()).
  struct PeerReport {
    int rank = 0;
    FailureCause cause = FailureCause::worker_failed;
    std::string message;
    double at_ms = 0;
  };
  std::optional<PeerReport> peer_report;
  // The current generation continues from in-memory snapshots of this step (-1: from
  // resume_from), each rank of a data-parallel group that took in a new rank receiving
  // heal_roots[its rank]'s (-1: its own).
  int64_t memory_step = -1;
  std::vector<int> heal_roots;
  // Buddies: rank r's snapshots are copied into rank (r + buddy_shift) mod world's memory (0:
  // none). Chosen at a launch that does not continue from memory (the copies held follow it);
  // heal_from_buddy[r]: with memory_step, rank r receives its state from its buddy.
  int buddy_shift = 0;
  std::vector<char> heal_from_buddy;
  bool memory_failed = false;     // a generation resumed from memory failed before its first step
  std::string memory_failed_why;  // how
  std::unique_ptr<MetricsAggregator> metrics;
  int64_t last_step = -1;
  double last_loss = 0;
  int64_t control_messages = 0;                                 // worker -> coordinator messages of this job
  double submitted_ms = 0, first_step_ms = 0, finished_ms = 0;  // since the epoch
  // Recovery and elasticity.
  int restarts = 0;  // relaunches caused by failures
  // Failures in a row of generations that never completed a step: the restart backoff's
  // exponent. A generation that trained resets it, so a long job's occasional failure
  // waits fault.restart_backoff again, and only a crash loop waits longer and longer.
  int crash_streak = 0;
  std::string resume_from;          // checkpoint of the current generation ("" = fresh)
  int target_dp = 0;                // data size wanted at the next relaunch (0 = layout.dp)
  double relaunch_at_ms = 0;        // recovering: not before (backoff)
  double recovery_deadline_ms = 0;  // recovering: fail when devices are still missing by then
  // The reason the last "waiting" event in this state told, and when (tell_waiting).
  std::string waiting_told;
  double waiting_told_ms = 0;
  double last_progress_ms = 0;           // running: the last completed step (or the start)
  std::vector<double> step_ms;           // recent step times (the watchdog's median)
  std::vector<nlohmann::json> failures;  // every failure: generation, rank, host, pid, cause, where
  int64_t drain_step = -1;               // a resize waits for the checkpoint after this step
  bool stepped = false;                  // the current generation completed a step
  // The current generation's spec, as its workers get it: the request's, or for an auto job
  // the request's with the planner's choice written in (plan::resolve).
  std::string spec_yaml;
  // Auto jobs: the devices wanted at the next relaunch (a resize; 0 = what is free), the
  // devices of the first plan (elastic.max_devices's default), the current plan's predicted
  // step time, and the choice the next launch runs (set just before it).
  int target_devices = 0;
  int first_devices = 0;
  int grow_checked_free = -1;  // the free devices grow() last planned for
  nlohmann::json planned;      // the current generation's "plan" event (status shows it)
  double predicted_step_s = 0;
  struct Choice {
    std::string spec_yaml;
    Layout layout;
    int micro_batch = 1;
    std::vector<int> boundaries;
    nlohmann::json event;  // the "plan" event: what was chosen and why
  };
  std::optional<Choice> choice;
};

// Side effects for the actor shell, in order.
struct Launch {
  std::string agent_id;
  std::string job_id;
  int generation = 0;
  int rank = 0;
  std::string device;
  std::string log_path;
};
struct Abort {
  std::string job_id;
  int generation = 0;
  int rank = 0;
  std::string reason;
};
// SIGKILL worker processes of a job on an agent, each named by its launch (generation,
// rank), after a grace period that lets aborted workers exit on their own.
struct Kill {
  std::string agent_id;
  std::string job_id;
  std::vector<int> generations;
  std::vector<int> ranks;
};
struct Actions {
  std::vector<Launch> launches;
  std::vector<Abort> aborts;
  std::vector<Kill> kills;
  // Ask every rank of (job, generation) to checkpoint after `step` and stop (a resize).
  struct Drain {
    std::string job_id;
    int generation = 0;
    int rank = 0;
    int64_t step = 0;
  };
  std::vector<Drain> drains;
  // A survivor or a spare serves a later generation: the shell re-keys its handle from
  // (job, from_generation, from_rank) to (job, generation, rank) and pushes it the Assignment.
  struct Reassign {
    std::string job_id;
    int from_generation = 0;
    int from_rank = 0;
    int rank = 0;
    int generation = 0;
  };
  std::vector<Reassign> reassigns;
  // A survivor no generation takes: it is told so (a refused Assignment) and exits.
  struct Release {
    std::string job_id;
    int generation = 0;
    int rank = 0;
    std::string reason;
  };
  std::vector<Release> releases;
  // Events for the run directory and the PUB socket: {"event":"state"|"step"|"log", "job":..., ...}.
  std::vector<nlohmann::json> events;
  void append(Actions&& o);
};

struct RegisterResult {
  bool accepted = false;
  std::string message;  // refusal, or the new agent's id
};

struct WorkerAssignment {
  std::string refused;
  const Job* job = nullptr;
  int rank = 0;
  bool spare = false;     // a spare: it waits for a place (rank is its launch rank)
  plan::RankPlace place;  // where the rank sits in job->plan
};

// Milliseconds since the epoch (system clock): the state's "now" where a caller gives none.
double now_ms();

// The part of a long list an answer holds in full: entries [from, from + limit) of a job's
// workers (status) or of the agents (list). The rest is summed up (status: counts, "where"
// groups, the oldest heartbeat; list: device totals), so an answer is bounded by its page, not
// by the job or the cluster.
struct ListPage {
  static constexpr size_t kDefault = 256;  // unless the request asks for another page
  static constexpr size_t kMax = 4096;
  size_t from = 0;
  size_t limit = kDefault;
  // The entries [first, second) of a list of n that the page holds.
  std::pair<size_t, size_t> range(size_t n) const {
    const size_t first = std::min(from, n);
    return {first, first + std::min(n - first, std::clamp<size_t>(limit, 1, kMax))};
  }
};

// Which of a worker's fields a status page carries (docs/api.md, "status": "worker_fields"):
// all by default. A scraper asks for the few it reads; the place in the plan (dp, pp, tp,
// layers, place), the costliest to work out per rank, is worked out only when asked for.
struct WorkerFields {
  // A worker's fields, in the order a worker lists them; bit f of `mask` is field f, and
  // names()[f] its name in the JSON.
  enum Field : uint32_t {
    rank,
    agent,
    host,
    device,
    pid,
    where,
    registered,
    done,
    exited,
    heartbeat_age_s,
    dp,
    pp,
    tp,
    layers,
    place,
    kCount
  };
  static const std::vector<std::string>& names();
  // The fields named in `list` (a JSON array of names), or false with why not in *why.
  static bool parse(const nlohmann::json& list, WorkerFields* out, std::string* why);
  uint32_t mask = ~uint32_t{0};
  bool has(Field f) const { return (mask >> f & 1) != 0; }
};

// Every rank's last "where" answer, grouped by answer as rank ranges ({"step 12: allreduce":
// "0-5,7"}), at most 32 answers in rank order; *more counts the ranks of the others.
nlohmann::json where_groups(const std::vector<RankSlot>& ranks, int* more);

class CoordinatorState {
 public:
  CoordinatorState(std::string runs_root, int protocol_version);

  // ---- agents
  RegisterResult register_agent(int protocol, const std::string& host, int pid,
                                const std::vector<std::string>& devices, Actions* out);
  void remove_agent(const std::string& agent_id, Actions* out);
  const DeviceRegistry& registry() const { return registry_; }

  // ---- jobs
  // Queues a job (state queued) and tries to place it. Returns its id.
  std::string submit(JobRequest request, Actions* out);
  // Places and launches what fits, oldest first; a job that does not fit stays
  // queued with the reason. Called after every change that frees devices.
  void schedule(Actions* out);
  // Cancels a job that has not ended. Returns false (and says why) if it has.
  bool cancel(const std::string& job_id, const std::string& reason, Actions* out, std::string* why);

  // ---- workers
  // The agent started rank's process.
  void worker_launched(const std::string& job_id, int generation, int rank, int pid);
  // The agent could not start it.
  void launch_failed(const std::string& job_id, int generation, int rank, const std::string& message,
                     Actions* out);
  WorkerAssignment register_worker(int protocol, const std::string& job_id, int generation, int rank,
                                   const std::string& host, int pid, Actions* out);
  void step(const std::string& job_id, int generation, const StepSample& sample, Actions* out);
  // The rank finished: all its steps, or (drained) up to the checkpoint of a resize.
  void worker_done(const std::string& job_id, int generation, int rank, bool drained, Actions* out);
  // The rank failed with a cause it named (core/failure.hpp: reported_failure_cause). `stays`:
  // its process waits for a later generation (it was aborted, or a peer failed it); a rank
  // of a generation that already ended so becomes a parked survivor.
  void worker_failed(const std::string& job_id, int generation, int rank, FailureCause cause,
                     const std::string& message, Actions* out, bool stays = false,
                     const MemoryHeld& memory = {});
  // The connection to a survivor of an ended generation broke: it serves no other.
  void survivor_lost(const std::string& job_id, int generation, int rank, Actions* out);
  // The agent reaped the process: exit_code >= 0, or the signal that ended it.
  void worker_exited(const std::string& job_id, int generation, int rank, int pid, int exit_code, int signal,
                     Actions* out);
  // The worker's actor went down (connection lost) before it finished.
  void worker_lost(const std::string& job_id, int generation, int rank, const std::string& why, Actions* out);
  // Its agent saw the process of launch (generation, rank) stopped by `signal` for `stopped_ms`:
  // a hang. A rank fails (worker_stopped) and its process is killed; a spare or a waiting
  // survivor is dropped and killed.
  void worker_stopped(const std::string& job_id, int generation, int rank, int pid, int signal,
                      int stopped_ms, Actions* out);
  // A rank answered "where are you".
  // A rank's "where" (heartbeat). A rank that moves on to another evaluation batch counts as
  // progress for the step watchdog: an evaluation of eval_batches forward passes runs between
  // two step reports and may outlast the limit derived from step times, while a rank stuck
  // in a batch stops moving and is caught as before. `now` is the clock (now_ms()).
  void worker_where(const std::string& job_id, int generation, int rank, const std::string& where,
                    double now = now_ms());

  // ---- time and elasticity
  // Drives the clock: relaunches recovering jobs whose backoff has passed,
  // fails those whose replacement deadline has passed, and runs the
  // step-progress watchdog of running jobs. The actor calls it every ~100 ms.
  void tick(double now, Actions* out);
  // The step-progress watchdog's limit for a job, in ms.
  double step_timeout_ms(const Job& job) const;
  // Resizes a running job to `devices` devices (a multiple of pipeline x tensor):
  // checkpoint at the next step boundary, relaunch with the new data size.
  // Returns false (and says why) when it cannot.
  bool scale(const std::string& job_id, int devices, Actions* out, std::string* why);
  // Checkpoint root of a job.
  std::string checkpoint_root(const Job& job) const;
  // A checkpoint was committed: it is verified now, off the caller's thread, so that the
  // relaunch that picks it checks only that its files did not change.
  void checkpoint_committed(const std::string& dir);
  // Finds the newest verified checkpoint under a root ("" = none); tests replace it.
  void set_checkpoint_finder(
      std::function<std::string(const std::string& root, std::vector<std::string>* skipped)> f) {
    find_checkpoint_ = std::move(f);
  }
  // Called with a job's id before a relaunch picks its checkpoint: the coordinator actor waits
  // there for the job's checkpoint commits still running off its thread.
  void set_before_checkpoint_pick(std::function<void(const std::string& job)> f) {
    before_checkpoint_pick_ = std::move(f);
  }

  // ---- queries (the JSON views: coordinator/state_views.cpp)
  const Job* job(const std::string& job_id) const;
  const std::map<std::string, Job>& jobs() const { return jobs_; }
  // A job's status: everything about it, a summary of every rank, and the workers of one
  // page in full (docs/api.md, "status").
  nlohmann::json job_json(const Job& job, const ListPage& page = {}, const WorkerFields& fields = {}) const;
  nlohmann::json list_json(const ListPage& agents = {}) const;
  bool current(const std::string& job_id, int generation) const;

  // ---- rendezvous (namespaced by job and generation; stale generations are refused)
  RendezvousStore& store() { return store_; }
  // "" if (job, generation) may use the store, else why not.
  std::string store_refusal(const std::string& job_id, int generation) const;

  // ---- persistence (`troupe coordinator --state-dir`; coordinator/state_persist.cpp)
  // The job table: every job's id, name, request (resolved spec, layout, policy),
  // state, generation, restarts, run dir, checkpoint and failures, in submission order.
  nlohmann::json table_json() const;
  // Loads a saved table into a state that has no jobs yet. Queued and terminal
  // jobs stay as they were; a job that was planning, launching, running or
  // recovering lost its generation with the old coordinator: it becomes
  // recovering as generation + 1 (not counted as a restart) and relaunches from
  // its newest verified checkpoint once devices are there. Throws troupe::Error
  // on a malformed table.
  void load_table(const nlohmann::json& table, Actions* out);

  // The hardware profile (YAML) an auto job is planned with when its spec names none; "" =
  // the device's default (plan::default_hardware_name).
  void set_default_hardware(std::string yaml) { default_hardware_ = std::move(yaml); }
  const std::string& default_hardware() const { return default_hardware_; }

  // For tests and ids: a fixed id generator replaces make_job_id().
  void set_id_source(std::function<std::string()> f) { make_id_ = std::move(f); }

 private:
  Job* find(const std::string& job_id);
  // The job that a message of (job_id, generation, rank) concerns: nullptr unless
  // `generation` is the job's current one and `rank` one of its ranks. News of an
  // old generation, or of a rank outside the world, changes nothing.
  Job* rank_job(const std::string& job_id, int generation, int rank);
  // The same, and nullptr once the job has ended.
  Job* live_rank_job(const std::string& job_id, int generation, int rank);
  // The rank of job j whose process was launched as (generation, rank): a survivor keeps its
  // launch key, a spare that took a place has a spare's. -1 = none.
  static int launched_rank(const Job& j, int generation, int rank);
  void transition(Job& job, JobState to, const std::string& reason, Actions* out);
  // Ends the job's current generation: the job goes to `to` (a terminal state, or
  // recovering), its live workers are aborted with `abort_reason` ("" when every
  // rank has finished), its devices and rendezvous keys are freed. Recovering moves
  // the job to generation + 1, to relaunch from relaunch_at_ms (0 = at once). A
  // relaunch after a backoff is left to tick(); every other end schedules at once.
  void end_generation(Job& job, JobState to, const std::string& reason, const std::string& abort_reason,
                      double relaunch_at_ms, Actions* out);
  void fail(Job& job, FailureCause cause, const std::string& message, Actions* out);
  // Aborts the job's live workers and asks their agents to kill what is left, except the
  // ranks kept as survivors (job.survivors of the current generation).
  void stop_workers(Job& job, const std::string& reason, Actions* out);
  // The ranks of the current generation whose processes may serve the next: registered, not
  // finished, not exited and not `blamed` (the rank the failure is put on; -1: none).
  void keep_survivors(Job& job, int blamed);
  // Releases the survivors for which `drop` holds: told to exit, killed, devices freed.
  void drop_survivors(Job& job, const std::function<bool(const Survivor&)>& drop, const std::string& why,
                      Actions* out);
  bool try_place(Job& job, Actions* out);
  // ---- spares (coordinator/state_spares.cpp)
  // Launches a spare process on each of `devices` (held for the job already).
  void launch_spares(Job& job, const std::vector<DeviceRef>& devices, Actions* out);
  // Starts spares on free devices until the job has resources.spares of them again.
  void replenish_spares(Job& job, Actions* out);
  // The job's spare launched as (generation, rank), or nullptr.
  Spare* find_spare(Job& job, int generation, int rank);
  // Forgets a spare whose process is gone or going (`kill`: its agent is told to kill it,
  // `release`: it is told no generation needs it), frees its device, says why in events.log.
  void drop_spare(Job& job, int generation, int rank, const std::string& why, bool kill, bool release,
                  Actions* out);
  // The spares' share of the relaunch: gives ready spares the places in `taken` that no
  // survivor keeps (at most `need`), writing their devices into `devices`. Returns how many.
  int place_spares(Job& job, std::vector<DeviceRef>& devices, std::vector<bool>& taken, int need);
  // A rank failed: restart the job (recovering) when its policy allows, else fail it
  // (coordinator/policy.hpp: judge_failure).
  // `rank_stays`: the rank reported the failure and waits for a later generation (a peer
  // failed it): it is not blamed and may serve the next generation.
  void on_failure(Job& job, FailureCause cause, const std::string& message, int rank, Actions* out,
                  bool rank_stays = false);
  // Recovering: plan on the free devices and launch generation + 1, or keep waiting.
  void try_relaunch(Job& job, double now, Actions* out);
  // The same for an auto job: the planner chooses the layout for the devices there are.
  void relaunch_auto(Job& job, double now, Actions* out);
  // A "waiting" event for the job's reason if it changed since the last one told, at most
  // one a second (state_recovery.cpp); tick() tells the last change within the second.
  void tell_waiting(Job& job, const char* state, double now, Actions* out);
  // A recovering job without the devices it needs: fails with no_devices past its deadline,
  // else waits (its reason, told by tell_waiting).
  void wait_for_devices(Job& job, double now, const std::string& why, Actions* out);
  // Decides whether the relaunch that keeps job.survivors continues from in-memory snapshots
  // (job.memory_step, job.heal_roots) or from the checkpoint at `disk_step`; says which in `out`.
  void plan_memory_resume(Job& job, int64_t disk_step, Actions* out);
  // Sets job.buddy_shift for the job's placement (job.ranks), unless it continues from memory.
  void choose_buddies(Job& job);
  // Launches generation + 1 of `job` on `devices` from its newest verified checkpoint.
  void relaunch_from_checkpoint(Job& job, const Layout& from, const std::vector<DeviceRef>& devices,
                                Actions* out);
  void launch(Job& job, const std::vector<DeviceRef>& devices, Actions* out);
  // Jobs below elastic.max_devices grow onto free devices.
  void grow(Actions* out);

  std::string runs_root_;
  int protocol_;
  DeviceRegistry registry_;
  std::map<std::string, Job> jobs_;
  std::vector<std::string> order_;  // submission order
  RendezvousStore store_;
  std::function<std::string()> make_id_;
  std::string default_hardware_;
  // The checkpoints verified (each committed one on its own thread); the default finder's.
  std::shared_ptr<checkpoint::VerifiedCheckpoints> verified_;
  std::function<std::string(const std::string&, std::vector<std::string>*)> find_checkpoint_;
  std::function<void(const std::string&)> before_checkpoint_pick_;
};

// The job table file under a state directory: written to a temporary file,
// fsynced, renamed over `jobs.json` and the directory fsynced, so a crash at any
// moment leaves the previous table or the new one. Throw troupe::Error.
std::string state_file(const std::string& state_dir);
void save_table(const std::string& state_dir, const nlohmann::json& table);
// The saved table, or null when the directory holds none yet.
nlohmann::json load_table_file(const std::string& state_dir);

// "SIGKILL" for 9, "signal 42" for unnamed ones.
std::string signal_name(int sig);

}  // namespace troupe::coord

// The control-plane protocol between coordinator, agents and workers, written
// once: every message type, every atom and every typed actor interface.
//
// Include this only from the few translation units that host actors (it pulls
// in caf/all.hpp); kernels, model and the pure coordinator state never see it.
//
// Who sends what:
//
//   agent  --register_agent(AgentHello)--> coordinator   => Welcome
//   coord  --launch(LaunchRequest)-------> agent         => pid
//   agent  --worker_exit(WorkerExit)-----> coordinator     (after waitpid)
//   agent  --worker_stop(WorkerStopped)--> coordinator     (a worker stayed stopped: a hang)
//   worker --register_worker(WorkerHello)> coordinator   => Assignment
//   worker --step(StepMetrics)-----------> coordinator     (one per optimizer step)
//   worker --worker_done(WorkerResult)---> coordinator
//   worker --store_set/get/add-----------> coordinator   => StoreValue
//   worker --ckpt_shard(CkptShard)-------> coordinator   => CkptCommitted (once every rank reported
//                                                            and the coordinator committed step_N)
//   coord  --abort(generation, reason)---> worker
//   coord  --where-----------------------> worker        => "step 12: forward mb 3"
//   coord  --drain(generation, step)-----> worker          (checkpoint after `step`, then stop: a resize)
//   coord  --assign(Assignment)----------> worker          (a survivor's next generation, or refused: exit)
//   coord  --kill(KillRequest)-----------> agent           (SIGKILL the named launches of a job)
//   worker --relay-----------------------> agent's hub   => coordinator_actor (its relay)
//
// A worker started by an agent speaks to the coordinator through its agent (worker/relay.hpp):
// it connects to the hub the agent published on its host's loopback and asks for a relay,
// an actor of the agent's node that it uses as the coordinator. The relay forwards what the
// worker sends (only for the rank it registered as) and what the coordinator sends it, so the
// coordinator keeps one connection per host, not one per rank, and knows each rank by its
// relay. A worker started without an agent's hub connects to the coordinator itself.
//
// A worker's life may span generations: a rank whose generation was aborted under it
// reports a WorkerResult with `stays` and waits; the coordinator either pushes it the
// Assignment of a later generation (it keeps its rank, device and process) or a refused
// one (it exits). Its agent still knows it by its launch: (job, launch generation, rank).
// A hot spare (resources.spares) is launched and registers as a spare rank
// (version.hpp: kFirstSpareRank + n); its registration is answered with an Assignment of
// world 0 (no place), and it waits for the Assignment of a place the same way.
//
// Registration carries kProtocolVersion; the coordinator refuses a peer that
// speaks another version, naming both versions.
#pragma once

#include <caf/all.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "actors/version.hpp"

namespace troupe::actors {

// ---------------------------------------------------------------- atoms (<= 10 chars)
using reg_agent_atom = caf::atom_constant<caf::atom("reg_agent")>;
using reg_worker_atom = caf::atom_constant<caf::atom("reg_worker")>;
using launch_atom = caf::atom_constant<caf::atom("launch")>;
using kill_atom = caf::atom_constant<caf::atom("kill")>;
using worker_exit_atom = caf::atom_constant<caf::atom("wexit")>;
using worker_stop_atom = caf::atom_constant<caf::atom("wstop")>;
using step_atom = caf::atom_constant<caf::atom("step")>;
using worker_done_atom = caf::atom_constant<caf::atom("wdone")>;
using abort_atom = caf::atom_constant<caf::atom("abort")>;
using where_atom = caf::atom_constant<caf::atom("where")>;
using store_set_atom = caf::atom_constant<caf::atom("st_set")>;
using store_get_atom = caf::atom_constant<caf::atom("st_get")>;
using store_add_atom = caf::atom_constant<caf::atom("st_add")>;
using store_expire_atom = caf::atom_constant<caf::atom("st_expire")>;
using api_atom = caf::atom_constant<caf::atom("api")>;
using tick_atom = caf::atom_constant<caf::atom("tick")>;
using shutdown_atom = caf::atom_constant<caf::atom("shutdown")>;
using lost_atom = caf::atom_constant<caf::atom("lost")>;
using ckpt_shard_atom = caf::atom_constant<caf::atom("ckpt_shard")>;
using drain_atom = caf::atom_constant<caf::atom("drain")>;
using assign_atom = caf::atom_constant<caf::atom("assign")>;
using relay_atom = caf::atom_constant<caf::atom("relay")>;
using steps_atom = caf::atom_constant<caf::atom("steps")>;
using flush_atom = caf::atom_constant<caf::atom("flush")>;

// ---------------------------------------------------------------- messages

// An agent introduces its host and devices ("cpu:0", "cuda:3").
struct AgentHello {
  int32_t protocol = kProtocolVersion;
  std::string host;
  int32_t pid = 0;
  std::vector<std::string> devices;
};

// The coordinator's answer to a registration.
struct Welcome {
  bool accepted = false;
  std::string message;  // why it was refused, or the agent id
  int32_t coordinator_protocol = kProtocolVersion;
};

// Start one worker process for (job, generation, rank) on one device.
struct LaunchRequest {
  std::string job_id;
  int32_t generation = 0;
  int32_t rank = 0;
  std::string device;    // "cpu:3"
  std::string log_path;  // stdout+stderr of the worker; "" = inherit
  // Random, one per launch: the worker shows it when it registers, so that only
  // the process this agent started can speak for (job, generation, rank).
  std::string token;
};

// A worker process ended (reaped by its agent with waitpid).
struct WorkerExit {
  std::string job_id;
  int32_t generation = 0;
  int32_t rank = 0;
  int32_t pid = 0;
  int32_t exit_code = -1;  // when it exited normally
  int32_t signal = 0;      // when a signal ended it (9 = SIGKILL)
};

// A worker process was stopped by a signal (waitpid WUNTRACED: SIGSTOP, SIGTSTP, ...) and was
// not continued for `stopped_ms`: it is hung as surely as if it had deadlocked. Named by its
// launch, as WorkerExit.
struct WorkerStopped {
  std::string job_id;
  int32_t generation = 0;
  int32_t rank = 0;
  int32_t pid = 0;
  int32_t signal = 0;      // the signal that stopped it (19 = SIGSTOP)
  int32_t stopped_ms = 0;  // how long it had been stopped when reported
};

// A worker process asks for its assignment.
struct WorkerHello {
  int32_t protocol = kProtocolVersion;
  std::string job_id;
  int32_t generation = 0;
  int32_t rank = 0;
  int32_t pid = 0;
  std::string host;
  std::string token;  // LaunchRequest::token of this launch
};

// What one rank runs: its place on the grid of plan/grid.hpp, rank = (dp_index * pp +
// pp_index) * tp + tp_index (tensor fastest), and the generation's plan.
struct Assignment {
  std::string refused;  // non-empty: registration refused, nothing to run
  std::string job_id;
  int32_t generation = 0;
  int32_t rank = 0;
  int32_t world = 1;
  int32_t dp = 1, pp = 1, tp = 1;
  int32_t dp_index = 0, pp_index = 0, tp_index = 0;  // the rank's grid coordinates (plan/grid.hpp)
  // The generation's plan (plan/plan.hpp), computed once by the coordinator: rows per
  // micro-batch and the chunk boundaries (model chunk k holds layers [b[k], b[k+1])).
  // The worker rebuilds the plan from them and its engine checks it against the spec.
  int32_t micro_batch = 1;
  std::vector<int32_t> chunk_boundaries;
  std::string place;  // plan::RankPlace::str(): "rank 5: dp 1 pp 0 tp 1, layers [0,2)+embedding"
  std::string device;
  std::string spec_yaml;    // the resolved job spec
  std::string run_dir;      // runs/<name>-<id>
  std::string resume_from;  // checkpoint directory, "" = fresh
  int64_t first_step = 0;
  // Resume from the in-memory snapshot of this step (the step it continues with; -1 = from
  // resume_from): a survivor from its own, a new rank from a replica in its data-parallel group.
  int64_t memory_step = -1;
  // With memory_step: the rank whose snapshot every rank of this rank's data-parallel group
  // receives (a new rank joined it; -1 = none: every member holds its own).
  int32_t heal_root = -1;
  // Buddies: rank r's snapshots are copied into rank (r + buddy_shift) mod world's memory
  // (0: none). With memory_step: this rank was started anew and receives its state from its
  // buddy (heal_from_buddy); the rank whose copy it holds was, and is sent it (heal_to_partner).
  int32_t buddy_shift = 0;
  bool heal_from_buddy = false;
  bool heal_to_partner = false;
};

// One optimizer step as seen by one rank.
struct StepMetrics {
  std::string job_id;
  int32_t generation = 0;
  int32_t rank = 0;
  int64_t step = 0;
  double loss = 0, lr = 0;
  int64_t tokens = 0;
  double step_ms = 0, grad_norm = 0;
  bool has_val_loss = false;
  double val_loss = 0;
  double compute_ms = 0, comm_ms = 0, bubble_ms = 0;  // the step's split on this rank
  double loss_scale = 0;  // fp16: the loss scale of the step; 0 without loss scaling
  bool skipped = false;   // fp16: this rank skipped the optimizer step (an inf/NaN somewhere)
  int64_t device_bytes = 0, device_peak_bytes = 0;  // a GPU rank's device memory in use, and its peak
  int64_t snapshot_confirmed = -1;  // the step its newest snapshot its buddy confirmed continues with
};

// A rank finished (ok: all its steps, or up to a resize's checkpoint when
// drained), or failed with a named cause.
struct WorkerResult {
  std::string job_id;
  int32_t generation = 0;
  int32_t rank = 0;
  bool ok = false;
  std::string error_name;  // !ok: to_string(FailureCause) (core/failure.hpp), e.g. "engine_error"
  std::string message;
  bool drained = false;  // ok: it checkpointed after the drain step and stopped (a resize)
  // !ok: the process keeps running and waits for the Assignment of a later generation (its
  // generation was aborted under it, or a peer failed it); false: it exits.
  bool stays = false;
  // The steps whose in-memory snapshot the process holds (it continues with each), and
  // whether a replica of its data-parallel group may be healed from them (train.zero 0).
  std::vector<int64_t> snapshots;
  bool replicated = false;
  // The steps of the copies of another rank's snapshots it holds (its buddy partner's), and
  // that rank (-1: none).
  std::vector<int64_t> held;
  int32_t held_rank = -1;
};

// SIGKILL the worker processes an agent launched as (job, generations[i], ranks[i]).
struct KillRequest {
  std::string job_id;
  std::vector<int32_t> generations;
  std::vector<int32_t> ranks;
};

// An agent's answer to "where are your ranks" (agent_actor): for the i-th worker handle the
// coordinator named, whether it answered within the agent's wait and what it said.
struct WhereAnswers {
  std::vector<uint8_t> answered;
  std::vector<std::string> where;
};
// Worker handles one "where" request to an agent names, at most (an agent's answer for more is
// refused unread: the coordinator sends one request per host of at most this many ranks).
constexpr size_t kMaxWhereBatch = 1024;
// Step reports one batch of a host's carries, at most (a larger batch is refused unread).
constexpr size_t kMaxStepBatch = 1024;

// A rendezvous key, namespaced by (job, generation, group).
struct StoreKey {
  std::string job_id;
  int32_t generation = 0;
  std::string group;
  std::string key;
};

struct StoreValue {
  bool found = false;
  std::string value;
  std::string error;  // "timeout", "stale generation", ...
};

// One checkpoint file a rank wrote into step_N.tmp/ (fsynced).
struct CkptFile {
  std::string name;
  uint64_t size = 0;
  std::string xxh64;
};

// A rank's checkpoint report for one step. The coordinator commits step_N under root once
// every rank of (job, generation) reported it.
struct CkptShard {
  std::string job_id;
  int32_t generation = 0;
  int32_t rank = 0;
  int32_t world = 1;
  int64_t step = 0;
  std::string root;           // checkpoint root (shared storage across hosts)
  int32_t keep = 0;           // checkpoint.keep
  std::string manifest_json;  // manifest without its file list
  std::vector<CkptFile> files;
};

struct CkptCommitted {
  bool ok = false;
  std::string dir;    // the committed step_N directory
  std::string error;  // why not: stale generation, inconsistent reports, I/O
};

// ---------------------------------------------------------------- inspectors

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, AgentHello& x) {
  return f(caf::meta::type_name("AgentHello"), x.protocol, x.host, x.pid, x.devices);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Welcome& x) {
  return f(caf::meta::type_name("Welcome"), x.accepted, x.message, x.coordinator_protocol);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, LaunchRequest& x) {
  return f(caf::meta::type_name("LaunchRequest"), x.job_id, x.generation, x.rank, x.device, x.log_path,
           x.token);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, WorkerExit& x) {
  return f(caf::meta::type_name("WorkerExit"), x.job_id, x.generation, x.rank, x.pid, x.exit_code, x.signal);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, WorkerStopped& x) {
  return f(caf::meta::type_name("WorkerStopped"), x.job_id, x.generation, x.rank, x.pid, x.signal,
           x.stopped_ms);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, WorkerHello& x) {
  return f(caf::meta::type_name("WorkerHello"), x.protocol, x.job_id, x.generation, x.rank, x.pid, x.host,
           x.token);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Assignment& x) {
  return f(caf::meta::type_name("Assignment"), x.refused, x.job_id, x.generation, x.rank, x.world, x.dp, x.pp,
           x.tp, x.dp_index, x.pp_index, x.tp_index, x.micro_batch, x.chunk_boundaries, x.place, x.device,
           x.spec_yaml, x.run_dir, x.resume_from, x.first_step, x.memory_step, x.heal_root, x.buddy_shift,
           x.heal_from_buddy, x.heal_to_partner);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StepMetrics& x) {
  return f(caf::meta::type_name("StepMetrics"), x.job_id, x.generation, x.rank, x.step, x.loss, x.lr,
           x.tokens, x.step_ms, x.grad_norm, x.has_val_loss, x.val_loss, x.compute_ms, x.comm_ms, x.bubble_ms,
           x.loss_scale, x.skipped, x.device_bytes, x.device_peak_bytes, x.snapshot_confirmed);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, WorkerResult& x) {
  return f(caf::meta::type_name("WorkerResult"), x.job_id, x.generation, x.rank, x.ok, x.error_name,
           x.message, x.drained, x.stays, x.snapshots, x.replicated, x.held, x.held_rank);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, KillRequest& x) {
  return f(caf::meta::type_name("KillRequest"), x.job_id, x.generations, x.ranks);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, CkptFile& x) {
  return f(caf::meta::type_name("CkptFile"), x.name, x.size, x.xxh64);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, CkptShard& x) {
  return f(caf::meta::type_name("CkptShard"), x.job_id, x.generation, x.rank, x.world, x.step, x.root, x.keep,
           x.manifest_json, x.files);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, CkptCommitted& x) {
  return f(caf::meta::type_name("CkptCommitted"), x.ok, x.dir, x.error);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, WhereAnswers& x) {
  return f(caf::meta::type_name("WhereAnswers"), x.answered, x.where);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StoreKey& x) {
  return f(caf::meta::type_name("StoreKey"), x.job_id, x.generation, x.group, x.key);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StoreValue& x) {
  return f(caf::meta::type_name("StoreValue"), x.found, x.value, x.error);
}

// ---------------------------------------------------------------- typed interfaces

// Messages marked "self" are timers an actor sends to itself.
using coordinator_actor = caf::typed_actor<
    caf::replies_to<reg_agent_atom, AgentHello>::with<Welcome>,
    caf::replies_to<reg_worker_atom, WorkerHello>::with<Assignment>,
    caf::reacts_to<worker_exit_atom, WorkerExit>, caf::reacts_to<worker_stop_atom, WorkerStopped>,
    caf::reacts_to<step_atom, StepMetrics>,
    caf::reacts_to<steps_atom, std::vector<StepMetrics>>,         // a host's, from its step batcher
    caf::replies_to<worker_done_atom, WorkerResult>::with<bool>,  // acked before the worker exits
    caf::replies_to<ckpt_shard_atom, CkptShard>::with<CkptCommitted>,
    caf::replies_to<store_set_atom, StoreKey, std::string>::with<StoreValue>,
    caf::replies_to<store_add_atom, StoreKey, int64_t>::with<StoreValue>,  // value = new count, decimal
    caf::replies_to<store_get_atom, StoreKey, int64_t>::with<StoreValue>,
    caf::reacts_to<store_expire_atom, uint64_t>,                // self
    caf::replies_to<api_atom, std::string>::with<std::string>,  // local: the ZeroMQ API thread
    caf::reacts_to<lost_atom, std::string, int32_t, int32_t>,   // self: (job, generation, rank)
    caf::reacts_to<tick_atom>>;                                 // self: recovery clock and watchdog

// Answered at once while the engine thread computes. Abort and drain name the generation
// they concern: a worker ignores them for any other.
// A drained rank checkpoints after the given step and reports a WorkerResult with ok and drained.
using worker_actor =
    caf::typed_actor<caf::reacts_to<abort_atom, int32_t, std::string>,
                     caf::replies_to<where_atom>::with<std::string>,
                     caf::reacts_to<drain_atom, int32_t, int64_t>, caf::reacts_to<assign_atom, Assignment>>;

// A kill names each process by its launch (a survivor keeps the key it was launched with).
// "Where" names workers of the agent's host (their relays, actors of the agent's node): the
// agent asks each and answers for all, so the coordinator asks once per host, not per rank.
// An abort (generation, reason) names them too: the agent passes it to each.
using agent_actor =
    caf::typed_actor<caf::replies_to<launch_atom, LaunchRequest>::with<int32_t>,  // pid or -errno
                     caf::reacts_to<kill_atom, KillRequest>,
                     caf::replies_to<where_atom, std::vector<worker_actor>>::with<WhereAnswers>,
                     caf::reacts_to<abort_atom, int32_t, std::string, std::vector<worker_actor>>,
                     caf::reacts_to<tick_atom>,  // self: reap children
                     caf::reacts_to<shutdown_atom>>;

// An agent's relay hub (worker/relay.hpp): a worker of its host asks it for the relay it
// then uses as its coordinator.
using relay_hub_actor = caf::typed_actor<caf::replies_to<relay_atom, std::string>::with<coordinator_actor>>;

// A host's step batcher (worker/relay.hpp), an actor of its agent's node: the host's relays hand
// it their workers' step reports, and it sends them on to the coordinator together, one
// message per host and batch window instead of one per rank and step. A flush sends what it
// holds at once (a relay asks before it passes on its worker's result, so that the last steps
// reach the coordinator first). Only actors of its own node are heard.
using step_batcher_actor =
    caf::typed_actor<caf::reacts_to<step_atom, StepMetrics>, caf::replies_to<flush_atom>::with<bool>,
                     caf::reacts_to<tick_atom>>;  // self: the window closes

}  // namespace troupe::actors

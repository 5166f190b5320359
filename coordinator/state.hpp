// The coordinator's whole state as plain C++: registry, job table, placement,
// step metrics and rendezvous store. Every entry point returns the side effects
// the actor shell must carry out (launch, abort, kill, publish) as values, so
// all of the scheduling logic is tested without actors or processes.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "coordinator/job.hpp"
#include "coordinator/metrics.hpp"
#include "coordinator/registry.hpp"
#include "coordinator/rendezvous.hpp"

namespace troupe::coord {

// What the coordinator needs from a job spec (coordinator/spec_request.hpp builds it).
struct JobRequest {
  std::string name;
  std::string spec_yaml;  // resolved, every default filled in
  std::string device_kind = "cpu";
  Layout layout;
  int n_layers = 1;
  int64_t total_steps = 0;
  std::string resume_from;  // checkpoint directory every rank resumes from ("" = fresh)
};

struct RankSlot {
  DeviceRef device;
  std::string host;
  int pid = 0;
  bool registered = false;  // the worker process asked for its assignment
  bool done = false;        // it reported success
  bool exited = false;      // its agent reaped it
};

struct Job {
  std::string id;
  JobRequest request;
  JobState state = JobState::queued;
  std::string reason;        // why it waits, or why it failed / was cancelled
  std::string failure_name;  // e.g. "worker_killed", "engine_error", "agent_lost"
  int generation = 0;
  std::string run_dir;
  std::vector<RankSlot> ranks;  // by rank, once placed
  std::unique_ptr<MetricsAggregator> metrics;
  int64_t last_step = -1;
  double last_loss = 0;
  int64_t control_messages = 0;                                 // worker -> coordinator messages of this job
  double submitted_ms = 0, first_step_ms = 0, finished_ms = 0;  // since the epoch
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
// SIGKILL what is left of (job, generation) on an agent, after a grace period
// that lets aborted workers exit on their own.
struct Kill {
  std::string agent_id;
  std::string job_id;
  int generation = 0;
};
struct Actions {
  std::vector<Launch> launches;
  std::vector<Abort> aborts;
  std::vector<Kill> kills;
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
  RankCoords coords;
};

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
  void worker_done(const std::string& job_id, int generation, int rank, bool ok,
                   const std::string& error_name, const std::string& message, Actions* out);
  // The agent reaped the process: exit_code >= 0, or the signal that ended it.
  void worker_exited(const std::string& job_id, int generation, int rank, int pid, int exit_code, int signal,
                     Actions* out);
  // The worker's actor went down (connection lost) before it finished.
  void worker_lost(const std::string& job_id, int generation, int rank, const std::string& why, Actions* out);

  // ---- queries
  const Job* job(const std::string& job_id) const;
  const std::map<std::string, Job>& jobs() const { return jobs_; }
  nlohmann::json job_json(const Job& job) const;
  nlohmann::json list_json() const;
  bool current(const std::string& job_id, int generation) const;

  // ---- rendezvous (namespaced by job and generation; stale generations are refused)
  RendezvousStore& store() { return store_; }
  // "" if (job, generation) may use the store, else why not.
  std::string store_refusal(const std::string& job_id, int generation) const;

  // For tests and ids: a fixed id generator replaces make_job_id().
  void set_id_source(std::function<std::string()> f) { make_id_ = std::move(f); }

 private:
  Job* find(const std::string& job_id);
  void transition(Job& job, JobState to, const std::string& reason, Actions* out);
  void fail(Job& job, const std::string& name, const std::string& message, Actions* out);
  // Aborts the job's live workers and asks their agents to kill what is left.
  void stop_workers(Job& job, const std::string& reason, Actions* out);
  bool try_place(Job& job, Actions* out);

  std::string runs_root_;
  int protocol_;
  DeviceRegistry registry_;
  std::map<std::string, Job> jobs_;
  std::vector<std::string> order_;  // submission order
  RendezvousStore store_;
  std::function<std::string()> make_id_;
};

double now_ms();
// "SIGKILL" for 9, "signal 42" for unnamed ones.
std::string signal_name(int sig);

}  // namespace troupe::coord

// The training engine of one rank (the worker's engine thread runs it): runs optimizer steps of a job on its
// slice of the model (its pipeline stage and tensor shard) and reports what happened.
//
// It is plain C++ with no actors: `troupe run` may drive it in-process (1x1x1),
// and the worker process drives it on its engine thread. The control thread
// may call request_abort() and where() at any time while step() runs.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>

#include "checkpoint/commit.hpp"
#include "comm/communicator.hpp"
#include "core/spec.hpp"
#include "plan/plan.hpp"

namespace troupe {

namespace model {
struct DeviceContext;
}
class MemorySnapshots;  // worker/memory_snapshot.hpp

// Which part of the job this rank runs (the coordinator's assignment).
// Ranks sit on the grid of plan/grid.hpp: rank = (d * pp + p) * tp + t.
struct EngineAssignment {
  int rank = 0;
  plan::Layout layout;  // this generation's dp x pp x tp
  // The plan to run (the coordinator's, shipped in the Assignment); the engine checks it
  // fits the spec's model and batch. Unset: the engine plans `layout` itself (make_plan).
  std::optional<plan::Plan> plan;
  int generation = 0;
  std::string resume_from;  // checkpoint directory to load ("" = fresh init or model.init_from)
  // In-memory snapshots (checkpoint.memory_every): where the engine keeps them after its steps
  // (they outlive it: the worker process owns them); null = none taken.
  MemorySnapshots* snapshots = nullptr;
  // Continue from the snapshot of this step instead of resume_from (-1 = no): this rank's own,
  // or, with heal_root >= 0, the one the data-parallel group receives from rank heal_root
  // (a replica: train.zero 0).
  int64_t memory_step = -1;
  int heal_root = -1;
  // Buddies (worker/snapshot_buddy.hpp): rank r's snapshots are copied into the memory of rank
  // (r + buddy_shift) mod world (0: no copies), which keeps them in `held` (the worker process
  // owns it). With memory_step: this rank was started anew and receives its state from its
  // buddy (heal_from_buddy); its partner was, and is sent the copy held of it (heal_to_partner).
  int buddy_shift = 0;
  MemorySnapshots* held = nullptr;
  bool heal_from_buddy = false;
  bool heal_to_partner = false;
  // How to build the world communicator when world > 1: backend, store, job and
  // generation (rank, size and group are filled in from the fields above).
  comm::CommConfig comm;
  std::chrono::milliseconds comm_timeout{60000};  // deadline of every collective and transfer
  // Takes this rank's checkpoint report once its files are on disk and returns the committed
  // directory when every rank has reported (the worker asks the coordinator; threads of one
  // process share a checkpoint::InProcessCommitter). Unset with one rank: the engine commits.
  std::function<std::string(const checkpoint::ShardReport&)> commit_shard;
  // Where train.trace writes rank<r>.json ("" = no trace, whatever the spec says).
  std::string trace_dir;
  // Tests only: the device context to train on instead of resources.device's (its kernels and
  // allocator outlive the engine; its compute dtype is replaced by train.precision's).
  const model::DeviceContext* device_override = nullptr;
};

struct StepReport {
  int64_t step = 0;                // 0-based optimizer step just completed
  double loss = 0.0;               // mean training loss over the global batch
  double lr = 0.0;                 // learning rate used by this step
  int64_t tokens = 0;              // tokens in the global batch
  double step_ms = 0.0;            // wall time of the step on this rank
  double grad_norm = 0.0;          // global gradient norm before clipping (NaN on a skipped step)
  double compute_ms = 0.0;         // pipeline: time inside forward/backward
  double comm_ms = 0.0;            // pipeline transfers and the gradient/loss reductions
  double bubble_ms = 0.0;          // pipeline: step time minus compute time
  double overlap_ms = 0.0;         // pp == 1: gradient allreduce time hidden behind backward
  std::optional<double> val_loss;  // set on eval steps (train.eval_every)
  double loss_scale = 0.0;         // fp16: the loss scale this step ran with; 0 without scaling
  bool skipped = false;            // fp16: an inf/NaN on some rank skipped this optimizer step
  // A GPU rank's device allocator after the step: bytes in use, and the most ever in use (0 on the CPU).
  int64_t device_bytes = 0, device_peak_bytes = 0;
  // The step the newest snapshot its buddy confirmed continues with (-1: none, or no buddies).
  int64_t snapshot_confirmed = -1;
};

// Bytes this rank holds for training state (not activations): what ZeRO shards.
struct EngineMemory {
  int64_t params = 0;   // f32 master weights (every rank holds its chunks' whole parameters)
  int64_t compute = 0;  // their 16-bit copy in mixed precision (0 in fp32)
  int64_t grads = 0;    // the f32 gradient buffers the backward accumulates into
  // What of them stays resident between the buckets of a backward: all of it, except under
  // ZeRO 2 without a pipeline (this rank's parts; the rest is released after each bucket's
  // reduce-scatter, which overlaps the backward). With a pipeline the reduce-scatter follows
  // the schedule: the whole gradient is resident until then.
  int64_t grads_kept = 0;
  int64_t optimizer = 0;  // AdamW's m and v: this rank's part under ZeRO 1 and 2
  int zero = 0;           // the ZeRO stage in effect (0 without data parallelism)
  // Host memory of the two in-memory snapshots (checkpoint.memory_every), and with buddies of
  // the two copies of the partner's (counted as large as this rank's own) unless this rank
  // maps the partner's own snapshots (a buddy on the same host: worker/snapshot_segment.hpp).
  int64_t snapshots = 0;
};

// "params 97.2 MiB, grads 97.2 MiB (24.3 MiB kept between buckets), optimizer 48.6 MiB
// (ZeRO 2)": what the worker log prints.
std::string to_string(const EngineMemory& m);

// Thrown by step() after request_abort().
class EngineAborted : public std::runtime_error {
 public:
  EngineAborted() : std::runtime_error("engine aborted") {}
};

class Engine {
 public:
  Engine(const JobSpec& spec, const EngineAssignment& assignment);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // The step the next call to step() runs (0 for a fresh job, k after resuming at step k).
  int64_t next_step() const;
  bool done() const { return next_step() >= total_steps_; }
  // True when the engine loaded a checkpoint (assignment.resume_from) or a snapshot.
  bool resumed() const;

  // Runs one optimizer step (all micro-batches, reduction, clipping, AdamW).
  StepReport step();
  // Mean loss over train.eval_batches validation batches.
  double evaluate();

  // Checkpoints the state after the last completed step into dir/step_<N> (each rank its
  // slices into step_<N>.tmp, committed once every rank reported; updates dir/latest) and
  // returns that path. With checkpoint.async the state is copied to host memory and written
  // by a background thread while training goes on; at most one write is in flight.
  std::string save_checkpoint(const std::string& dir);
  // Waits until the last checkpoint is committed (rethrowing its error); returns its path.
  std::string wait_checkpoint();

  // Thread-safe: makes the running or next step() throw EngineAborted; a rank
  // blocked in a collective is released at once (its communicators are aborted).
  void request_abort();
  // Thread-safe: the operation in progress, e.g. "step 12: forward micro-batch 3".
  std::string where() const;

  int64_t num_params() const;
  EngineMemory memory() const;
  // The plan this rank runs and its place in it (what the worker log prints).
  const plan::Plan& plan() const;
  plan::RankPlace place() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int64_t total_steps_ = 0;
  std::atomic<bool> abort_{false};
};

}  // namespace troupe

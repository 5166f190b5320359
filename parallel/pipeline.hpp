// The pipeline executor: runs one rank's row of a checked schedule table.
//
// For each compute op of plan::rank_program(schedule, rank):
//   F(mb, c): x = the activations received for (mb, model chunk k) or, on model
//             chunk 0, the micro-batch's tokens; Stage::forward on mb's slot; the
//             last model chunk adds the loss SUM of mb (targets from the source).
//   B(mb, c): dout = the gradient received for (mb, k), or on the last chunk the
//             loss itself with dloss = 1 / (global tokens); Stage::backward, or in a
//             split schedule (zb-h1) Stage::backward_input: the input gradient only.
//   W(mb, c): split schedules: Stage::backward_weights, the weight gradients of mb.
// and for each batch step one Communicator::batch with the group's sends (the
// F output / B input gradient, from the stage's slot) and the next group's
// receives, posted together (Megatron's send_forward_recv_backward and
// send_backward_recv_forward), which the checker has proven deadlock-free.
// Tags: plan::transfer_tag(carry, mb, receiving model chunk) - unique within a step.
// The W's that follow a batch run on this thread while the batch is in flight on
// another (they read and write nothing it carries), as the checker simulates.
//
// Activation slots: chunk c needs plan::check_schedule(...).peak_in_flight[rank][c];
// a micro-batch takes a free slot at F (the most recently freed, deterministic)
// and gives it back after the batch that sends its input gradient (at once on
// model chunk 0, which sends none); in a split schedule, after its W and the batch
// it overlapped.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "model/stage.hpp"
#include "plan/partition.hpp"
#include "plan/schedule.hpp"

namespace troupe::trace {
class Recorder;
}

namespace troupe::parallel {

// Micro-batch mb of this step: tokens (B,T) for model chunk 0, targets (B,T) for
// the last model chunk; each pointer only where this rank needs it, valid until
// the next call.
struct MicroBatch {
  const int32_t* tokens = nullptr;
  const int32_t* targets = nullptr;
};
using MicroBatchSource = std::function<MicroBatch(int mb)>;

struct PipelineTiming {
  double step_ms = 0.0;     // wall time of run()
  double compute_ms = 0.0;  // inside Stage::forward / backward (and backward_weights: W)
  // Inside Communicator::batch (transfer + waiting for the peer); a batch that W's overlap
  // counts its time beyond theirs.
  double comm_ms = 0.0;
  double bubble_ms = 0.0;  // step_ms - compute_ms: idle, waiting for neighbours or the wire
};

struct PipelineStepResult {
  bool has_loss = false;  // this rank holds the last model chunk
  double loss_sum = 0.0;  // sum of every token's loss over the step's micro-batches
  PipelineTiming timing;
};

// What the partition's cost model needs of a model.
plan::ModelShape shape_of(const model::ModelConfig& cfg);

// The stages of pipeline rank `rank`: [c] = model chunk c * pp + rank of the
// partition, each tensor shard `shard` over `tp_group` with the activation slots
// `check` says chunk c needs (one per chunk without a pipeline: part.pp == 1 and an
// empty check), computing on `ctx` (device, kernels, allocator, compute dtype). The one
// place stages of a rank are built.
std::vector<std::unique_ptr<model::Stage>> make_rank_stages(
    const model::ModelConfig& cfg, const plan::Partition& part, int rank, const plan::CheckResult& check,
    int max_micro_batch, const model::TensorShard& shard = {}, comm::Communicator* tp_group = nullptr,
    const model::DeviceContext& ctx = model::DeviceContext::cpu());

class PipelineExecutor {
 public:
  // comm: the pipeline group (rank == pipeline rank, size == pp); stages: this
  // rank's chunks, [c] = local chunk c, not owned. Checks the schedule (throws
  // ScheduleError) and that every stage has the slots it needs and the
  // embedding / head exactly where the table expects them.
  PipelineExecutor(plan::Schedule schedule, int rank, std::vector<model::Stage*> stages,
                   comm::Communicator* comm, int micro_batch, int seq_len, comm::Options options = {});
  // The same with a table check_schedule has already proven (a plan's): not checked again.
  PipelineExecutor(plan::Schedule schedule, plan::CheckResult checked, int rank,
                   std::vector<model::Stage*> stages, comm::Communicator* comm, int micro_batch, int seq_len,
                   comm::Options options = {});

  // One step: every op of the table. dloss = dL/d(each token's loss), e.g.
  // 1 / (global batch * T). Grads accumulate into the stages (zero them between
  // optimizer steps). Communication errors propagate as comm::CommError.
  PipelineStepResult run(const MicroBatchSource& data, float dloss);

  const plan::Schedule& schedule() const { return schedule_; }
  const plan::CheckResult& check() const { return check_; }
  // Thread-safe: the op in progress, e.g. "pipeline rank 1: F3.1" or "... batch before B2".
  std::string where() const;
  // Spans of every op and batch into `r` while its step is traced (null: none). The
  // recorder outlives the executor.
  void set_tracer(trace::Recorder* r) { tracer_ = r; }

 private:
  float* inbox(uint32_t tag);
  void compute(const plan::Op& op, const MicroBatchSource& data, float dloss, PipelineStepResult& res);
  void exchange(const std::vector<plan::Transfer>& batch);
  std::vector<comm::P2POp> post(const std::vector<plan::Transfer>& batch);  // buffers of a batch
  void batch_done();    // after a batch: frees the slots whose input gradient it sent
  bool traced() const;  // a tracer is set and the current step is traced
  const float* send_buffer(const plan::Transfer& t);

  plan::Schedule schedule_;
  int rank_;
  std::vector<model::Stage*> stages_;
  comm::Communicator* comm_;
  int B_, T_;
  size_t numel_;  // B*T*D of one message
  comm::Options options_;
  plan::CheckResult check_;
  std::vector<plan::ProgramStep> program_;
  std::vector<std::vector<int>> free_slots_;  // [chunk] slots not in use; taken from the back
  std::vector<std::map<int, int>> slot_of_;   // [chunk] mb -> slot
  std::vector<std::pair<int, int>> to_free_;  // (chunk, mb) freed after the next batch
  bool overlapping_ = false;                  // W's running while a batch is in flight
  trace::Recorder* tracer_ = nullptr;
  std::map<uint32_t, std::vector<float>> inbox_;  // received, not yet consumed; by tag
  std::vector<std::vector<float>> spare_;
  std::atomic<int> at_{-1};
};

// Sums the tied wte.weight gradient of the first and the last model chunk over
// the embedding group (its two ranks: the pipeline's first and last), so both
// hold the full model's gradient. `stages` are this rank's chunks; a null group
// (one pipeline stage, or a rank outside the group) does nothing.
void allreduce_tied_embedding(const std::vector<model::Stage*>& stages, comm::Communicator* embedding_group,
                              const comm::Options& options = {});

}  // namespace troupe::parallel

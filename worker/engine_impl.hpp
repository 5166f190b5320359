// Engine::Impl, the state of one rank's training and what it does with it. Private to the
// engine: only worker/engine*.cpp include it. Its members are defined by idea, one file each:
//   engine.cpp             building the rank (plan check, data, groups, stages, optimizer),
//                          the Engine's public face and "where are you?"
//   engine_step.cpp        one optimizer step: the schedule (or the micro-batch loop), the
//                          data-parallel reduction, loss scaling, the norm, clipping, AdamW
//   engine_eval.cpp        evaluation: a forward-only chain over the validation batches
//   engine_checkpoint.cpp  the rank's checkpoint: snapshot and write, resume and init_from
//   engine_staging.cpp     device staging: host copies of device tensors (snapshots, the
//                          offloaded optimizer, NCCL's scalar reductions), the rank's device
//   engine_trace.cpp       train.trace glue: the clock offset to rank 0, the rank's trace file
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/shard.hpp"
#include "comm/communicator.hpp"
#include "core/dataset.hpp"
#include "core/tensor.hpp"
#include "core/trace.hpp"
#include "model/device_context.hpp"
#include "model/stage.hpp"
#include "parallel/data_parallel.hpp"
#include "parallel/grid.hpp"
#include "parallel/loss_scale.hpp"
#include "parallel/optimizer.hpp"
#include "parallel/pipeline.hpp"
#include "parallel/zero.hpp"
#include "worker/engine.hpp"
#include "worker/snapshot_buddy.hpp"

namespace troupe {

// A span of the trace when it is on: std::optional<trace::Recorder::Scope> emplaced only then,
// so that with tracing off no name is built.
using MaybeSpan = std::optional<trace::Recorder::Scope>;

struct Engine::Impl {
  JobSpec spec;
  EngineAssignment asg;
  Dataset data;
  model::ModelConfig cfg;
  // train.trace: this rank's spans of the traced steps (declared before the executor, which
  // records into it), its clock's offset to rank 0's, and whether its file is written.
  trace::Recorder tracer;
  int64_t clock_offset_us = 0;
  bool trace_written = false;
  int T = 0;
  plan::Plan plan;  // what this generation runs (shipped, or planned here)
  plan::RankPlace where_in_plan;
  parallel::PipelinePlace place;
  comm::Options copt;
  std::unique_ptr<comm::Communicator> world, dp_group, pp_group, tp_group, embed_group;

  // This rank's model chunks (one unless the schedule is interleaved) and their parameters.
  std::vector<std::unique_ptr<model::Stage>> stages;
  std::vector<model::Stage*> stage_ptrs;
  std::unique_ptr<parallel::PipelineExecutor> exec;  // pipeline > 1
  std::vector<model::Param*> params;                 // every chunk's, in chunk order
  std::vector<ParamRef> refs;
  std::unique_ptr<AdamW> opt;
  // train.offload: optimizer: AdamW runs on the CPU over host copies of the master weights and
  // gradients (pinned on a GPU), one per ref, its moments in host memory; the parameters on the
  // device are the copies the layers read, written back after every update.
  std::vector<Tensor> host_master, host_grad;
  // Mixed precision: the compute dtype of the products, and fp16's dynamic loss scale.
  model::DeviceContext ctx = model::DeviceContext::cpu();
  parallel::LossScaler scaler{false};
  parallel::OverflowFault fault;
  // Data-parallel reduction: bucket size and, with pp == 1, the thread that reduces each
  // bucket of the last micro-batch's backward (ZeRO 2: of every micro-batch's) as soon as
  // it is final (TROUPE_DP_OVERLAP=0: after the backward, on the engine thread). With a pipeline the last
  // backward of each chunk runs inside the executor, interleaved with transfers of other micro-batches, and
  // the tied-embedding sum has to precede the embedding's bucket, so the reduction stays after the schedule.
  size_t bucket_floats = parallel::kDefaultBucketFloats;
  std::unique_ptr<parallel::BucketReducer> reducer;
  // ZeRO (train.zero >= 1 with data > 1): this data-parallel rank's part of every bucket of the
  // flat buffers; AdamW runs on its pieces only (refs are then pieces, not parameters).
  int zero = 0;
  std::unique_ptr<parallel::ZeroPartition> zpart;

  int64_t next_step = 0;
  std::vector<int32_t> tokens, targets;
  std::vector<float> act;  // (B,T,D) evaluation activations between pipeline ranks

  mutable std::mutex where_mu;
  std::string where = "idle";

  // NCCL's scalar reductions: a device double (engine_staging.cpp).
  Tensor scalar_scratch;

  // Checkpoints: the background writer (checkpoint.async), what it threw, what it committed.
  std::thread writer;
  std::atomic<bool> traced_write{false};  // the writer thread runs a write that is traced
  std::exception_ptr writer_error;
  std::string last_committed;

  // Host memory a snapshot reads a device tensor from (engine_staging.cpp: host_view).
  mutable std::vector<Tensor> staging;

  // ---- engine.cpp: the rank

  Impl(const JobSpec& s, const EngineAssignment& a);
  ~Impl();
  const comm::GridCoord& coord() const { return place.coord; }
  int world_size() const { return asg.layout.world(); }
  const plan::Layout& layout() const { return asg.layout; }
  void connect();
  void build_stages();
  void set_where(std::string w);
  std::string current_where() const;

  // ---- engine_step.cpp: one step

  StepReport step(const std::atomic<bool>& abort);
  void check_abort(const std::atomic<bool>& abort) {
    if (abort.load()) throw EngineAborted();
  }
  int first_row(int mb) const { return where_in_plan.first_row + mb * plan.micro_batch; }
  void refresh_compute();
  void reduce_data_parallel();
  double world_sum(double v);
  // The world's reduction and barrier over the tensor, pipeline and data groups in turn.
  std::array<comm::Communicator*, 3> grid_groups() const {
    return {tp_group.get(), pp_group.get(), dp_group.get()};
  }
  void grid_allreduce(double* v, comm::ReduceOp op);
  void grid_barrier();
  double grad_norm_squared();
  double zero_grad_sum_squares() const;
  bool world_found_inf();
  void collect_overlap(const std::vector<parallel::BucketReducer::Span>& spans,
                       parallel::BucketReducer::clock::time_point until, StepReport& r);

  // ---- engine_eval.cpp

  double evaluate();

  // ---- engine_checkpoint.cpp: save, resume, init_from

  static checkpoint::SliceSpec held_slice(const model::Param& p);
  void init_from(const std::string& path);
  void resume(const std::string& dir);
  void restore_loss_scale(const nlohmann::json& j, const std::string& dir);
  std::string manifest_json() const;
  checkpoint::ShardSnapshot snapshot(const std::string& root) const;
  std::string write_snapshot(const checkpoint::ShardSnapshot& s);
  std::string wait_writer();
  std::string save(const std::string& root);

  // ---- engine_memory.cpp: in-memory snapshots (checkpoint.memory_every)

  bool memory_snapshots() const;
  std::string memory_fingerprint() const;
  void take_memory_snapshot();
  // `checked`: its checksum was just checked (a copy received from the buddy), not again.
  void restore_memory(int64_t step, bool checked = false);
  void heal_from_replica(int root);
  // What a snapshot holds: every chunk's f32 parameters, and AdamW's m and v (its ZeRO part).
  int64_t state_bytes() const;
  void start_buddies();
  void share_snapshots();
  void resume_from_memory();
  // The link that copies each snapshot into the buddy's memory (null: no buddies).
  std::unique_ptr<BuddyLink> buddy;

  // ---- engine_staging.cpp: between host and device

  void use_device() const;
  void optimizer_step(double lr, int64_t t);
  static bool nccl(const comm::Communicator& c) { return std::string(c.backend()) == "nccl"; }
  void scalar_allreduce(comm::Communicator& c, double* v, comm::ReduceOp op);
  const float* host_view(const Tensor& t, size_t slot) const;
  // Fills an f32 tensor of this rank's device (a parameter, a moment) from host code: in
  // place on the CPU, through a host buffer and a copy on a device.
  template <class Read>
  void load_into(const Tensor& t, Read&& read) {
    if (t.device() == Device::cpu) return read(t.f32());
    std::vector<float> host(size_t(t.numel()));
    read(host.data());
    ctx.alloc->copy_from_host(t.data(), host.data(), t.nbytes());
  }

  // ---- engine_trace.cpp: train.trace

  void measure_clock_offset();
  void write_trace() noexcept;
  void write_trace_file();
  // Opens `sp` as a span of category `cat` when the current step is traced; name() is called
  // only then.
  template <class Name>
  void open(MaybeSpan& sp, const char* cat, Name&& name, int track = trace::kEngine) {
    if (tracer.active()) sp.emplace(tracer, cat, name(), track);
  }
};

}  // namespace troupe

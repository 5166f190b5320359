#include "worker/engine.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <iostream>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/commit.hpp"
#include "checkpoint/hf.hpp"
#include "checkpoint/shard.hpp"
#include "comm/groups.hpp"
#include "core/caching_allocator.hpp"
#include "core/dataset.hpp"
#include "core/error.hpp"
#include "core/rng.hpp"
#include "core/safetensors.hpp"
#include "core/trace.hpp"
#include "kernels/kernels.hpp"
#include "model/device_context.hpp"
#include "model/from_spec.hpp"
#include "model/param_io.hpp"
#include "model/stage.hpp"
#include "model/tensor_parallel.hpp"
#include "parallel/data_parallel.hpp"
#include "parallel/grid.hpp"
#include "parallel/loss_scale.hpp"
#include "parallel/optimizer.hpp"
#include "parallel/pipeline.hpp"
#include "parallel/zero.hpp"
#include "worker/device.hpp"

namespace troupe {

namespace {

// Bytes of synthetic data: enough windows that batches of small test models do not repeat soon.
constexpr size_t kSyntheticBytes = size_t(1) << 20;
// Tags of the forward-only evaluation chain (the training schedule's tags stay below).
constexpr uint32_t kEvalTagBase = 1u << 30;
// Tags of the clock-offset exchange at connect (tracing only), below the evaluation's.
constexpr uint32_t kClockTagBase = 1u << 29;

// A span of the trace when it is on: std::optional<trace::Recorder::Scope> emplaced only then,
// so that with tracing off no name is built.
using MaybeSpan = std::optional<trace::Recorder::Scope>;

Dataset make_dataset(const JobSpec& spec) {
  if (spec.data.source == DataSource::synthetic)
    return Dataset::synthetic(spec.train.seed, kSyntheticBytes, spec.data.val_fraction);
  const DataSpec& d = spec.data;
  if (d.source == DataSource::tokens)
    return Dataset::from_tokens({d.path},
                                d.val_path.empty() ? std::vector<std::string>{} : std::vector{d.val_path},
                                token_width(d), spec.model.vocab_size, d.val_fraction, d.path);
  return Dataset::from_path(spec.data.path, spec.data.val_fraction);
}

std::string hex64(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

size_t env_size(const char* name, size_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long x = std::strtoull(v, &end, 10);
  TROUPE_CHECK(end != nullptr && *end == '\0', name, "=", v, " is not a non-negative integer");
  return size_t(x);
}

// A given plan (make_plan made it, so it is consistent in itself) is checked against the
// spec it is to run: the assignment's layout with the spec's pipeline and tensor sizes
// (a resize changes only data), the spec's batch, schedule and micro-batch size when it
// sets one, and chunks that cover the spec's model. Without one the engine plans.
plan::Plan checked_plan(const JobSpec& spec, const EngineAssignment& a) {
  const plan::PlanInputs in = plan::plan_inputs(spec);
  if (!a.plan) return plan::make_plan(in, a.layout);
  const plan::Plan& p = *a.plan;
  const std::string what = "assignment: the plan (" + p.str() + ") ";
  require(p.layout == a.layout, what, "is for layout ", p.layout.str(), ", which does not fit layout ",
          a.layout.str());
  require((spec.parallel.pipeline <= 0 || p.layout.pp == spec.parallel.pipeline) &&
              (spec.parallel.tensor <= 0 || p.layout.tp == spec.parallel.tensor),
          what, "does not keep the spec's pipeline ", spec.parallel.pipeline, " and tensor ",
          spec.parallel.tensor);
  require(int64_t(p.local_rows) * p.layout.dp == in.global_batch &&
              int64_t(p.n_micro) * p.micro_batch == p.local_rows &&
              (in.micro_batch <= 0 || p.micro_batch == in.micro_batch),
          what, "does not split the spec's global_batch ", in.global_batch, " in micro-batches of ",
          in.micro_batch > 0 ? std::to_string(in.micro_batch) : std::string("any size"));
  require(p.layout.pp == 1 || (p.schedule == in.schedule && p.virtual_stages == in.virtual_stages), what,
          "does not run the spec's schedule");
  const std::vector<int> b = p.boundaries();
  require(b.front() == 0 && b.back() == in.model.n_layers, what, "covers layers [", b.front(), ", ", b.back(),
          "), the spec's model has ", in.model.n_layers);
  return p;
}

}  // namespace

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

  Impl(const JobSpec& s, const EngineAssignment& a)
      : spec(s),
        asg(a),
        data(make_dataset(s)),
        cfg(model::model_config(s)),
        tracer(s.train.trace.from_step, s.train.trace.steps) {
    plan::check_layout(a.layout);
    TROUPE_CHECK(a.rank >= 0 && a.rank < a.layout.world(), "assignment: rank ", a.rank, " of ",
                 a.layout.world(), " does not fit layout ", a.layout.str());
    // Second line of defence: validate, run and submit refuse these first (core/spec_runnable.cpp).
    TROUPE_CHECK(s.resources.device == DeviceKind::cpu || (a.layout.pp == 1 && a.layout.tp == 1),
                 "resources.device: ", to_string(s.resources.device),
                 " trains over data parallelism only in this engine (layout Nx1x1), not ", a.layout.str(),
                 ": its pipeline and tensor groups would need device memory in their transfers");
    TROUPE_CHECK(s.resources.device == DeviceKind::cpu || s.train.zero == 0,
                 "resources.device: ", to_string(s.resources.device),
                 " runs train.zero 0 only in this engine");
    T = s.model.seq_len;
    plan = checked_plan(s, a);
    where_in_plan = plan::rank_place(plan, a.rank);
    TROUPE_CHECK(data.split_size(Split::train) > size_t(T) + 1, "the training data (",
                 data.split_size(Split::train), data.is_bytes() ? " bytes" : " tokens",
                 ") is shorter than one window of seq_len + 1 = ", T + 1);
    TROUPE_CHECK(s.train.eval_every == 0 || data.split_size(Split::val) > size_t(T) + 1,
                 "the validation data (", data.split_size(Split::val), data.is_bytes() ? " bytes" : " tokens",
                 ") is shorter than one window of seq_len + 1 = ", T + 1,
                 ": evaluation (train.eval_every) needs one");
    place = parallel::pipeline_place(a.rank, a.layout.dp, a.layout.pp, a.layout.tp);
    copt.timeout = a.comm_timeout;
    if (a.device_override != nullptr) {
      ctx = *a.device_override;
      ctx.compute_dtype = compute_dtype(s.train.precision);
    } else {
      ctx = worker::device_context(s.resources.device, a.comm.device, compute_dtype(s.train.precision));
    }
    scaler = parallel::LossScaler(s.train.precision == Precision::fp16);
    fault = parallel::OverflowFault::from_env();
    if (world_size() > 1) connect();
    build_stages();
    bucket_floats = env_size("TROUPE_DP_BUCKET_FLOATS", parallel::kDefaultBucketFloats);
    TROUPE_CHECK(bucket_floats > 0, "TROUPE_DP_BUCKET_FLOATS must be positive");
    for (auto* st : stage_ptrs)
      for (auto& p : st->params()) params.push_back(&p);
    zero = dp_group ? s.train.zero : 0;
    TROUPE_CHECK(zero <= 2, "train.zero ", zero, ": this engine runs ZeRO stages 0, 1 and 2");
    if (zero > 0) {
      zpart = std::make_unique<parallel::ZeroPartition>(stage_ptrs, layout().dp, coord().d, bucket_floats);
      refs = zpart->refs();
    } else {
      for (auto* p : params)
        refs.push_back({p->name, p->data.f32(), p->grad.f32(), size_t(p->data.numel()), p->decay});
    }
    if (s.train.offload == Offload::optimizer) {
      TROUPE_CHECK(!zpart, "train.offload: optimizer does not shard the optimizer (train.zero 0)");
      Allocator& host = worker::staging_allocator(s.resources.device);
      std::vector<ParamRef> on_host;
      for (const ParamRef& r : refs) {
        host_master.push_back(Tensor::empty({int64_t(r.numel)}, DType::f32, host));
        host_grad.push_back(Tensor::empty({int64_t(r.numel)}, DType::f32, host));
        on_host.push_back({r.name, host_master.back().f32(), host_grad.back().f32(), r.numel, r.decay});
      }
      opt = std::make_unique<AdamW>(s.train.optimizer, on_host, kernels::cpu_kernels(), host);
    } else {
      opt = std::make_unique<AdamW>(s.train.optimizer, refs, *ctx.kernels, *ctx.alloc);
    }
    const char* overlap = std::getenv("TROUPE_DP_OVERLAP");
    // The overlapped reduction runs on the reducer's own thread, over host memory: CPU jobs only.
    if (dp_group && !exec && ctx.device == Device::cpu &&
        !(overlap != nullptr && std::string(overlap) == "0"))
      reducer = std::make_unique<parallel::BucketReducer>(
          dp_group.get(), copt, bucket_floats,
          zero == 2 ? parallel::BucketCollective::reduce_scatter : parallel::BucketCollective::allreduce,
          *ctx.alloc);
    tokens.resize(size_t(plan.micro_batch) * T);
    targets.resize(size_t(plan.micro_batch) * T);
    if (!a.resume_from.empty())
      resume(a.resume_from);
    else if (!s.model.init_from.empty())
      init_from(s.model.init_from);
    for (size_t i = 0; i < host_master.size(); ++i)  // offload: the host copy of the master weights
      ctx.alloc->copy_to_host(host_master[i].data(), refs[i].data, refs[i].numel * sizeof(float));
    refresh_compute();
  }

  // One AdamW update: on the device, or under offload on the host copies (gradients copied
  // out, master weights copied back in).
  void optimizer_step(double lr, int64_t t) {
    if (host_master.empty()) return opt->step(lr, t);
    for (size_t i = 0; i < refs.size(); ++i)
      ctx.alloc->copy_to_host(host_grad[i].data(), refs[i].grad, refs[i].numel * sizeof(float));
    opt->step(lr, t);
    for (size_t i = 0; i < refs.size(); ++i)
      ctx.alloc->copy_from_host(refs[i].data, host_master[i].data(), refs[i].numel * sizeof(float));
  }

  // The products' 16-bit copy of the master weights, after they changed.
  void refresh_compute() {
    for (auto* st : stage_ptrs) st->store().refresh_compute();
  }

  const comm::GridCoord& coord() const { return place.coord; }
  int world_size() const { return asg.layout.world(); }
  const plan::Layout& layout() const { return asg.layout; }

  // The world communicator and this rank's groups (comm/groups.hpp).
  void connect() {
    set_where("connecting to " + std::to_string(world_size() - 1) + " peers");
    comm::CommConfig c = asg.comm;
    c.rank = asg.rank;
    c.size = world_size();
    c.generation = asg.generation;
    c.group = "world";
    world = comm::make_communicator(c);
    // (Its transfers are host memory: not over NCCL, where the trace keeps each rank's own clock.)
    if (tracer.steps() > 0 && !nccl(*world)) measure_clock_offset();
    const comm::GridGroups g = comm::grid_groups(layout().dp, layout().pp, layout().tp);
    const int r = asg.rank;
    if (layout().dp > 1)
      dp_group = world->new_group(comm::group_of(g.data, r), comm::group_name("dp", g.data, r));
    if (layout().tp > 1)
      tp_group = world->new_group(comm::group_of(g.tensor, r), comm::group_name("tp", g.tensor, r));
    if (layout().pp > 1) {
      pp_group = world->new_group(comm::group_of(g.pipeline, r), comm::group_name("pp", g.pipeline, r));
      // The tied embedding lives on the first and the last stage of each pipeline.
      if ((place.first || place.last) && cfg.tied_head())
        embed_group =
            world->new_group(place.embedding_group, "emb" + std::to_string(place.embedding_group[0]));
    }
  }

  // NTP-style against rank 0 over the world communicator: rank 0 stamps t0, rank r answers
  // with its own clock t1, rank 0 stamps t2 on the answer and sends back (t0 + t2) / 2 - t1.
  // Every rank of a traced job calls it: the spec, the same on all, decides.
  void measure_clock_offset() {
    set_where("measuring clock offsets for the trace");
    if (asg.rank == 0) {
      for (int r = 1; r < world_size(); ++r) {
        const int64_t t0 = tracer.now_us();
        int64_t t1 = 0;
        world->send(&t0, sizeof t0, r, kClockTagBase, copt);
        world->recv(&t1, sizeof t1, r, kClockTagBase + 1, copt);
        const int64_t t2 = tracer.now_us();
        const int64_t off = (t0 + t2) / 2 - t1;
        world->send(&off, sizeof off, r, kClockTagBase + 2, copt);
      }
      return;
    }
    int64_t t0 = 0;
    world->recv(&t0, sizeof t0, 0, kClockTagBase, copt);
    const int64_t t1 = tracer.now_us();
    world->send(&t1, sizeof t1, 0, kClockTagBase + 1, copt);
    world->recv(&clock_offset_us, sizeof clock_offset_us, 0, kClockTagBase + 2, copt);
  }

  // The trace file of this rank, once the traced steps and the checkpoint after the last of
  // them are done: at the next step, or when the engine ends. A trace that cannot be written
  // is reported and dropped; it never stops the job.
  void write_trace() noexcept {
    if (trace_written || tracer.steps() == 0 || asg.trace_dir.empty()) return;
    trace_written = true;
    try {
      write_trace_file();
    } catch (const std::exception& e) {
      std::cerr << "troupe: rank " << asg.rank << ": the trace was not written: " << e.what() << std::endl;
    }
  }
  void write_trace_file() {
    trace::RankInfo info;
    info.rank = asg.rank;
    info.world = world_size();
    info.layout = layout().str();
    info.place = where_in_plan.str();
    info.clock_offset_us = clock_offset_us;
    info.from_step = spec.train.trace.from_step;
    info.steps = spec.train.trace.steps;
    trace::write_rank_trace(asg.trace_dir + "/rank" + std::to_string(asg.rank) + ".json", info,
                            tracer.take());
  }

  // Opens `sp` as a span of category `cat` when the current step is traced; name() is called
  // only then.
  template <class Name>
  void open(MaybeSpan& sp, const char* cat, Name&& name, int track = trace::kEngine) {
    if (tracer.active()) sp.emplace(tracer, cat, name(), track);
  }

  // This pipeline rank's model chunks under the plan, each a tensor shard; with a
  // pipeline, the executor runs the plan's checked schedule over them.
  void build_stages() {
    stages = parallel::make_rank_stages(cfg, plan.partition, coord().p, plan.check, plan.micro_batch,
                                        model::TensorShard{coord().t, layout().tp}, tp_group.get(), ctx);
    for (auto& st : stages) stage_ptrs.push_back(st.get());
    if (layout().pp > 1) {
      exec = std::make_unique<parallel::PipelineExecutor>(plan.table, plan.check, coord().p, stage_ptrs,
                                                          pp_group.get(), plan.micro_batch, T, copt);
      if (tracer.steps() > 0) exec->set_tracer(&tracer);
    }
  }

  void set_where(std::string w) {
    std::lock_guard<std::mutex> lock(where_mu);
    where = std::move(w);
  }
  std::string current_where() const {
    if (exec && where.rfind("step", 0) == 0 && where.find("pipeline") != std::string::npos)
      return where + " (" + exec->where() + ")";
    std::lock_guard<std::mutex> lock(where_mu);
    return where;
  }

  // ------------------------------------------------------------------ loading

  // What this rank holds of a parameter, in the checkpoint's terms.
  static checkpoint::SliceSpec held_slice(const model::Param& p) {
    checkpoint::SliceSpec s{p.global_shape, p.split_dim, {}};
    for (const auto& pc : p.slice_pieces()) s.pieces.push_back({pc.offset, pc.length, pc.local_offset});
    return s;
  }

  // model.init_from (checkpoint::hf::init_source: a Hugging Face directory, a checkpoint of any
  // layout, a safetensors file): only parameters are read, each rank reading just its slices.
  void init_from(const std::string& path) {
    const checkpoint::hf::SliceReader read = checkpoint::hf::init_source(path, spec);
    for (auto* p : params) load_into(p->data, [&](float* out) { read(p->name, held_slice(*p), out); });
  }

  // Fills an f32 tensor of this rank's device (a parameter, a moment) from host code: in
  // place on the CPU, through a host buffer and a copy on a device.
  template <class Read>
  void load_into(const Tensor& t, Read&& read) {
    if (t.device() == Device::cpu) return read(t.f32());
    std::vector<float> host(size_t(t.numel()));
    read(host.data());
    ctx.alloc->copy_from_host(t.data(), host.data(), t.nbytes());
  }

  // Resuming under any layout: after the manifest and every checksum verify, each rank
  // reads its slices of the parameters and of both AdamW moments from whichever shards
  // hold them, and continues at the checkpoint's step.
  void resume(const std::string& dir) {
    checkpoint::TensorSource src(checkpoint::resolve(dir));
    TROUPE_CHECK(src.manifest().has_value(), dir, ": not a checkpoint directory");
    std::vector<float> m, v;  // ZeRO: one parameter's whole moments at a time
    size_t i = 0;
    for (size_t c = 0; c < stage_ptrs.size(); ++c)
      for (size_t j = 0; j < stage_ptrs[c]->params().size(); ++j, ++i) {
        model::Param& p = *params[i];
        const checkpoint::SliceSpec want = held_slice(p);
        load_into(p.data, [&](float* out) { src.read_slice(p.name, want, out); });
        if (!zpart) {
          load_into(opt->m(i), [&](float* out) { src.read_slice("optim.m." + p.name, want, out); });
          load_into(opt->v(i), [&](float* out) { src.read_slice("optim.v." + p.name, want, out); });
          continue;
        }
        m.resize(size_t(p.data.numel()));
        v.resize(m.size());
        src.read_slice("optim.m." + p.name, want, m.data());
        src.read_slice("optim.v." + p.name, want, v.data());
        zpart->load_param_moments(c, j, m.data(), v.data(), *opt);
      }
    next_step = src.manifest()->step;
    restore_loss_scale(src.manifest()->loss_scale, dir);
  }

  // A checkpoint's loss-scaler state (null: it never scaled nor skipped). Restored in
  // every precision: AdamW's step count leaves out the skipped steps.
  void restore_loss_scale(const nlohmann::json& j, const std::string& dir) {
    if (j.is_null()) return;
    try {
      parallel::LossScaleState st;
      st.scale = j.at("scale").get<double>();
      st.clean_steps = j.at("clean_steps").get<int64_t>();
      st.skipped_steps = j.at("skipped_steps").get<int64_t>();
      scaler.restore(st);
    } catch (const nlohmann::json::exception& e) {
      throw Error(dir + ": malformed loss_scale in the manifest: " + e.what());
    }
  }

  // ------------------------------------------------------------------ one step

  void check_abort(const std::atomic<bool>& abort) {
    if (abort.load()) throw EngineAborted();
  }

  int first_row(int mb) const { return where_in_plan.first_row + mb * plan.micro_batch; }

  // Sums the gradients over the data-parallel group, bucket by bucket, after the backward
  // (ZeRO 2: each rank receives the sum of its parts only).
  void reduce_data_parallel() {
    if (!dp_group) return;
    // NCCL runs on the communicator's own stream: the backward's kernels must be done first.
    worker::synchronize(spec.resources.device);
    if (zero == 2) {
      set_where("step " + std::to_string(next_step) + ": data-parallel reduce-scatter of the gradients");
      zpart->reduce_scatter_grads(*dp_group, copt);
      return;
    }
    for (auto* st : stage_ptrs) {
      const Tensor& flat = st->store().flat_grads();
      parallel::reduce_buckets(*dp_group, flat.f32(), size_t(flat.numel()), bucket_floats, copt,
                               [&](size_t k) {
                                 set_where("step " + std::to_string(next_step) +
                                           ": data-parallel allreduce of bucket " + std::to_string(k));
                               });
    }
  }

  static bool nccl(const comm::Communicator& c) { return std::string(c.backend()) == "nccl"; }

  // A host double reduced over a group: in place for gloo; for NCCL, which reduces device
  // memory only, through a device scratch (the copies wait for the compute stream).
  Tensor scalar_scratch;
  void scalar_allreduce(comm::Communicator& c, double* v, comm::ReduceOp op) {
    if (!nccl(c)) return c.allreduce(v, 1, op, copt);
    if (!scalar_scratch.defined()) scalar_scratch = Tensor::zeros({1}, DType::f64, *ctx.alloc);
    ctx.alloc->copy_from_host(scalar_scratch.data(), v, sizeof *v);
    c.allreduce(scalar_scratch.data(), 1, DType::f64, op, copt);
    ctx.alloc->copy_to_host(v, scalar_scratch.data(), sizeof *v);
  }

  // Sum of a scalar over the world (loss sums, squared norms).
  double world_sum(double v) {
    if (world) scalar_allreduce(*world, &v, comm::ReduceOp::sum);
    return v;
  }

  // Squared global gradient norm: each tensor group sums its shards (replicated
  // parameters once); the tied embedding counts once (its copy on the last stage,
  // Param::tied_copy, is left out); data replicas hold the same gradients after the
  // reduction, so one replica counts.
  double grad_norm_squared() {
    if (zpart) return world_sum(zero_grad_sum_squares());
    double local = 0.0;
    for (auto* st : stage_ptrs)
      local += model::tensor_parallel_grad_sum_squares(st->tensor_group(), st->params(),
                                                       *st->device_context().kernels);
    return world_sum(coord().t == 0 && coord().d == 0 ? local : 0.0);
  }

  // ZeRO: each data-parallel rank sums the squares of the pieces it owns (the only gradients
  // reduced under stage 2); a parameter replicated over the tensor group counts on shard 0, a
  // split one on every shard, the tied copy never.
  double zero_grad_sum_squares() const {
    double local = 0.0;
    const std::vector<parallel::ZeroPartition::Piece>& pieces = zpart->pieces();
    for (size_t i = 0; i < pieces.size(); ++i) {
      const model::Stage& st = *stage_ptrs[pieces[i].stage];
      const model::Param& p = st.params()[pieces[i].param];
      if (p.tied_copy || (p.split_dim < 0 && coord().t != 0)) continue;
      local += st.device_context().kernels->sum_squares(refs[i].grad, refs[i].numel);
    }
    return local;
  }

  // The part of each reduced bucket's time that ran before `until` (the end of the backward
  // it overlapped); in a trace, each bucket on the reducer's track.
  void collect_overlap(const std::vector<parallel::BucketReducer::Span>& spans,
                       parallel::BucketReducer::clock::time_point until, StepReport& r) {
    for (const auto& [b0, b1] : spans) {
      r.overlap_ms +=
          std::max(0.0, std::chrono::duration<double, std::milli>(std::min(b1, until) - b0).count());
      if (!tracer.active()) continue;
      trace::Span sp;
      sp.cat = "comm";
      sp.name = zero == 2 ? "reduce-scatter bucket" : "allreduce bucket";
      sp.ts_us = tracer.to_us(b0);
      sp.dur_us = std::max<int64_t>(0, tracer.to_us(b1) - sp.ts_us);
      sp.track = trace::kReducer;
      sp.args = {{"group", "dp"}};
      tracer.add(std::move(sp));
    }
  }

  // The CUDA device of this rank for the calling thread (steps, evaluations and checkpoints
  // may run on another thread than the one that built the engine).
  void use_device() const { worker::use_device(spec.resources.device, asg.comm.device); }

  StepReport step(const std::atomic<bool>& abort) {
    use_device();
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    const int64_t s = next_step;
    tracer.set_step(s);
    // (Not while a traced checkpoint is still being written: its span goes in too.)
    if (tracer.done() && !traced_write.load()) write_trace();
    MaybeSpan step_span;
    open(step_span, "step", [&] { return "step " + std::to_string(s); });
    const int B = spec.train.global_batch;
    const double scale = scaler.scale();
    const float dloss = float(scale / double(int64_t(B) * T));
    if (zero == 2)
      zpart->release_grads();  // the whole gradient held only while a backward writes it
    else
      for (auto* st : stage_ptrs) st->zero_grads();
    double loss_sum = 0.0;
    StepReport r;
    if (!exec) {
      const auto t_compute = clock::now();
      model::Stage& st = *stage_ptrs[0];
      const int micro_batch = plan.micro_batch, n_micro = plan.n_micro;
      double waited_ms = 0.0;  // ZeRO 2: waits for the previous micro-batch's buckets
      try {
        for (int mb = 0; mb < n_micro; ++mb) {
          check_abort(abort);
          {
            MaybeSpan sp;
            open(sp, "data", [&] { return "batch rows of micro-batch " + std::to_string(mb); });
            data.get_rows(s, B, T, first_row(mb), first_row(mb) + micro_batch, tokens.data(), targets.data());
          }
          set_where("step " + std::to_string(s) + ": forward micro-batch " + std::to_string(mb));
          {
            MaybeSpan sp;
            open(sp, "compute", [&] { return "F" + std::to_string(mb); });
            loss_sum += st.forward(0, tokens.data(), nullptr, targets.data(), micro_batch, T);
          }
          check_abort(abort);
          set_where("step " + std::to_string(s) + ": backward micro-batch " + std::to_string(mb));
          // Earlier micro-batches only accumulate: no bucket is final before the last one.
          // Under ZeRO 2 each micro-batch's buckets are reduce-scattered (and all but this
          // rank's parts released) as they finish; the next backward writes them again only
          // once they are done.
          if (reducer && zero == 2 && mb > 0) {
            MaybeSpan sp;
            open(sp, "comm", [] { return std::string("wait for the previous micro-batch's buckets"); });
            const auto t_wait = clock::now();
            collect_overlap(reducer->wait(), t_wait, r);
            waited_ms += std::chrono::duration<double, std::milli>(clock::now() - t_wait).count();
          }
          MaybeSpan sp;
          open(sp, "compute", [&] { return "B" + std::to_string(mb); });
          if (reducer && (zero == 2 || mb == n_micro - 1))
            reducer->backward_overlapped(st, dloss);
          else
            st.backward(0, nullptr, dloss);
        }
      } catch (...) {
        if (reducer) reducer->cancel();  // an earlier micro-batch's buckets may be in flight
        throw;
      }
      const auto t_backward_end = clock::now();
      r.compute_ms =
          std::chrono::duration<double, std::milli>(t_backward_end - t_compute).count() - waited_ms;
      r.comm_ms += waited_ms;
      if (reducer) {
        MaybeSpan sp;
        open(sp, "comm", [] { return std::string("wait for the data-parallel reduction"); });
        const auto t_wait = clock::now();
        set_where("step " + std::to_string(s) + ": data-parallel " +
                  (zero == 2 ? "reduce-scatter" : "allreduce") + " of the remaining buckets");
        collect_overlap(reducer->wait(), t_backward_end, r);
        r.comm_ms += std::chrono::duration<double, std::milli>(clock::now() - t_wait).count();
      }
    } else {
      set_where("step " + std::to_string(s) + ": pipeline schedule");
      auto source = [&](int mb) {
        MaybeSpan sp;
        open(sp, "data", [&] { return "batch rows of micro-batch " + std::to_string(mb); });
        data.get_rows(s, B, T, first_row(mb), first_row(mb) + plan.micro_batch, tokens.data(),
                      targets.data());
        return parallel::MicroBatch{tokens.data(), targets.data()};
      };
      MaybeSpan schedule_span;
      open(schedule_span, "schedule", [&] { return std::string(plan::schedule_name(plan.schedule)); });
      parallel::PipelineStepResult pr = exec->run(source, dloss);
      schedule_span.reset();
      loss_sum = pr.has_loss ? pr.loss_sum : 0.0;
      r.compute_ms = pr.timing.compute_ms;
      r.bubble_ms = pr.timing.bubble_ms;
      r.comm_ms = pr.timing.comm_ms;
      set_where("step " + std::to_string(s) + ": tied-embedding gradient sum");
      MaybeSpan sp;
      if (cfg.tied_head() && embed_group)
        open(sp, "comm", [] { return std::string("allreduce tied embedding"); });
      if (cfg.tied_head()) parallel::allreduce_tied_embedding(stage_ptrs, embed_group.get(), copt);
    }
    check_abort(abort);
    const auto t_comm = clock::now();
    if (!reducer && dp_group) {
      MaybeSpan sp;
      open(sp, "comm",
           [&] { return std::string(zero == 2 ? "reduce-scatter" : "allreduce") + " gradients"; });
      reduce_data_parallel();
    }
    // Each data replica's last pipeline stage holds its rows' loss; tensor shards hold copies.
    {
      MaybeSpan sp;
      if (world) open(sp, "comm", [] { return std::string("allreduce loss"); });
      loss_sum = world_sum(place.last && coord().t == 0 ? loss_sum : 0.0);
    }
    set_where("step " + std::to_string(s) + ": optimizer");
    if (fault.fires(s, asg.rank, asg.generation)) parallel::poison_grads(*stage_ptrs.front(), s, asg.rank);
    const bool stepped = scaler.update(scaler.enabled() && world_found_inf());
    double norm = std::numeric_limits<double>::quiet_NaN();
    const double lr = lr_at(spec.train, s);
    if (stepped) {
      if (scale != 1.0 && zpart) {
        // Only the owned parts: the rest of a ZeRO 2 gradient is released and stays so.
        for (const ParamRef& p : refs) ctx.kernels->scale_inplace(p.grad, float(1.0 / scale), p.numel);
      } else if (scale != 1.0) {
        parallel::scale_grads(stage_ptrs, float(1.0 / scale));
      }
      MaybeSpan sp;
      open(sp, "comm", [] { return std::string("gradient norm"); });
      norm = std::sqrt(grad_norm_squared());
    }
    r.comm_ms += std::chrono::duration<double, std::milli>(clock::now() - t_comm).count();
    if (stepped) {
      {
        MaybeSpan sp;
        open(sp, "optimizer", [] { return std::string("optimizer"); });
        clip_grads(refs, norm, spec.train.grad_clip, *ctx.kernels);
        // AdamW counts the updates it made: a skipped fp16 step is not one.
        optimizer_step(lr, s + 1 - scaler.state().skipped_steps);
      }
      if (zpart) {
        MaybeSpan sp;
        open(sp, "comm", [] { return std::string("allgather parameters"); });
        set_where("step " + std::to_string(s) + ": data-parallel all-gather of the updated parameters");
        zpart->allgather_params(*dp_group, copt);
      }
      MaybeSpan sp;
      if (ctx.compute_dtype != DType::f32) open(sp, "optimizer", [] { return std::string("16-bit copy"); });
      refresh_compute();
    }
    next_step = s + 1;

    r.step = s;
    r.loss_scale = scaler.enabled() ? scale : 0.0;
    r.skipped = !stepped;
    r.loss = loss_sum / double(int64_t(B) * T);
    r.lr = lr;
    r.tokens = int64_t(B) * T;
    r.grad_norm = norm;
    if (spec.train.eval_every > 0 &&
        (next_step % spec.train.eval_every == 0 || next_step == spec.train.steps)) {
      MaybeSpan sp;
      open(sp, "eval", [] { return std::string("evaluation"); });
      r.val_loss = evaluate();
    }
    r.step_ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
    if (const auto* cache = dynamic_cast<const CachingAllocator*>(ctx.alloc)) {
      const CachingAllocator::Stats st = cache->stats();
      r.device_bytes = int64_t(st.in_use_bytes);
      r.device_peak_bytes = int64_t(st.peak_in_use_bytes);
    }
    set_where("idle after step " + std::to_string(s));
    return r;
  }

  // fp16: whether any rank's gradients hold an inf or NaN, as one all-reduce of a flag.
  bool world_found_inf() {
    double flag = parallel::grads_finite(stage_ptrs) ? 0.0 : 1.0;
    if (world) scalar_allreduce(*world, &flag, comm::ReduceOp::max);
    return flag > 0.0;
  }

  // Mean loss over train.eval_batches validation batches. With a pipeline, a forward-only
  // chain through the model chunks in order (chunk k on pipeline rank k mod pp); every data
  // replica evaluates the same batches.
  double evaluate() {
    use_device();
    const int Bm = plan.micro_batch;
    const int64_t n_batches = data.num_eval_batches(Bm, T);
    const int n_chunks = plan.partition.n_chunks(), pp = layout().pp;
    const int D = cfg.d_model;
    act.resize(size_t(Bm) * T * D);
    double sum = 0.0;
    for (int k = 0; k < spec.train.eval_batches; ++k) {
      set_where("eval batch " + std::to_string(k));
      data.get_rows(Split::val, k % n_batches, Bm, T, 0, Bm, tokens.data(), targets.data());
      if (!exec) {
        sum += stage_ptrs[0]->forward(0, tokens.data(), nullptr, targets.data(), Bm, T);
        continue;
      }
      for (int chunk = coord().p; chunk < n_chunks; chunk += pp) {
        model::Stage& st = *stage_ptrs[size_t(chunk / pp)];
        const int prev = (coord().p + pp - 1) % pp, next = (coord().p + 1) % pp;
        if (chunk > 0)
          pp_group->recv(act.data(), act.size() * sizeof(float), prev, kEvalTagBase + uint32_t(chunk), copt);
        const bool last = chunk == n_chunks - 1;
        const double l =
            st.forward(0, chunk == 0 ? tokens.data() : nullptr, chunk == 0 ? nullptr : act.data(),
                       last ? targets.data() : nullptr, Bm, T);
        if (last)
          sum += l;
        else
          pp_group->send(st.output(0).f32(), act.size() * sizeof(float), next,
                         kEvalTagBase + uint32_t(chunk + 1), copt);
      }
    }
    const bool counts = coord().d == 0 && coord().t == 0 && place.last;
    const double total = world_sum(counts ? sum : 0.0);
    return total / (double(spec.train.eval_batches) * Bm * T);
  }

  // ------------------------------------------------------------------ checkpoints

  std::thread writer;
  std::atomic<bool> traced_write{false};  // the writer thread runs a write that is traced
  std::exception_ptr writer_error;
  std::string last_committed;

  ~Impl() {
    if (writer.joinable()) writer.join();
    if (tracer.active() || tracer.done()) write_trace();
  }

  std::string manifest_json() const {
    checkpoint::Manifest m;
    m.step = next_step;
    m.data_cursor = next_step;
    m.dp = layout().dp;
    m.pp = layout().pp;
    m.tp = layout().tp;
    m.seed = spec.train.seed;
    m.spec_yaml = to_yaml(spec);
    m.spec_hash = hex64(rng::name_hash(m.spec_yaml));
    const auto& o = spec.train.optimizer;
    m.optimizer = {{"type", o.type},   {"lr", o.lr},   {"beta1", o.beta1},
                   {"beta2", o.beta2}, {"eps", o.eps}, {"weight_decay", o.weight_decay}};
    const parallel::LossScaleState& ls = scaler.state();
    if (scaler.enabled() || ls.skipped_steps > 0)
      m.loss_scale = {
          {"scale", ls.scale}, {"clean_steps", ls.clean_steps}, {"skipped_steps", ls.skipped_steps}};
    return checkpoint::to_json(m).dump();
  }

  // Host memory a snapshot reads a device tensor from (pinned on a GPU): one buffer per
  // tensor (slot: 3 per parameter, its values and both moments), made at the first
  // checkpoint and reused. A CPU tensor is read in place.
  mutable std::vector<Tensor> staging;
  const float* host_view(const Tensor& t, size_t slot) const {
    if (t.device() == Device::cpu) return t.f32();
    if (staging.size() <= slot) staging.resize(slot + 1);
    Tensor& h = staging[slot];
    if (h.numel() != t.numel())
      h = Tensor::empty({t.numel()}, DType::f32, worker::staging_allocator(spec.resources.device));
    ctx.alloc->copy_to_host(h.data(), t.data(), t.nbytes());
    return h.f32();
  }

  // What this rank holds, each tensor once. A split tensor is replicated over the
  // data-parallel group, a whole one over data and tensor groups: the replicas share
  // its bytes out.
  // ZeRO: the moments of each stored part are gathered from their owners over the data group
  // (collective: every data replica snapshots the same step) straight into the snapshot's parts.
  checkpoint::ShardSnapshot snapshot(const std::string& root) const {
    std::vector<checkpoint::HeldTensor> held;
    std::vector<parallel::ZeroPartition::MomentPart> wants;
    held.reserve(params.size());
    size_t i = 0;
    for (size_t c = 0; c < stage_ptrs.size(); ++c)
      for (size_t j = 0; j < stage_ptrs[c]->params().size(); ++j) {
        const model::Param& p = stage_ptrs[c]->params()[j];
        const size_t k = i++;
        if (p.tied_copy) continue;  // stored once, by the first stage
        const bool split = p.split_dim >= 0;
        checkpoint::HeldTensor t{p.name,
                                 held_slice(p),
                                 p.data.shape(),
                                 host_view(p.data, 3 * k),
                                 nullptr,
                                 nullptr,
                                 split ? coord().d : coord().d * layout().tp + coord().t,
                                 split ? layout().dp : layout().dp * layout().tp};
        if (!zpart) {
          t.m = host_view(opt->m(k), 3 * k + 1);
          t.v = host_view(opt->v(k), 3 * k + 2);
        } else {
          const checkpoint::Spread part = checkpoint::spread(t.held, t.replica, t.replicas);
          const int64_t rows = std::max<int64_t>(0, part.end - part.begin);
          const size_t n = rows > 0 ? size_t(p.data.numel() / p.data.size(part.dim) * rows) : 0;
          t.m_part.resize(n);
          t.v_part.resize(n);
          wants.push_back({c, j, part.dim, part.begin, part.end, t.m_part.data(), t.v_part.data()});
        }
        held.push_back(std::move(t));  // a moved vector keeps its buffer
      }
    if (zpart) zpart->gather_moment_parts(*dp_group, *opt, wants, copt);
    return checkpoint::snapshot_shard(root, next_step, asg.rank, world_size(), asg.generation, layout().str(),
                                      spec.checkpoint.keep, std::move(held), manifest_json());
  }

  // Writes the snapshot (fsynced), reports it and returns the committed directory. With
  // one rank and no committer the engine commits by itself.
  std::string write_snapshot(const checkpoint::ShardSnapshot& s) {
    const checkpoint::ShardReport rep = checkpoint::write_snapshot(s);
    if (asg.commit_shard) return asg.commit_shard(rep);
    checkpoint::CommitTracker one;
    if (world_size() == 1) {
      auto ready = one.add("self", rep);
      return checkpoint::commit(ready->root, ready->manifest, ready->keep);
    }
    // No committer: the ranks meet at barriers (save() keeps this path synchronous) and
    // rank 0 commits what every rank wrote.
    world->barrier(copt);
    const std::string dir = s.root + "/" + checkpoint::step_dir_name(s.step);
    if (asg.rank == 0) {
      const std::string tmp = checkpoint::prepare(s.root, s.step);
      std::optional<checkpoint::ReadyCommit> ready;
      for (int r = 0; r < world_size(); ++r) {
        checkpoint::ShardReport other = rep;
        other.rank = r;
        const std::string name = checkpoint::shard_file_name(r), f = tmp + "/" + name;
        other.files = {{name, std::filesystem::file_size(f), checkpoint::file_xxh64(f)}};
        ready = one.add("self", other);
      }
      checkpoint::commit(ready->root, ready->manifest, ready->keep);
    }
    world->barrier(copt);
    return dir;
  }

  // At most one write in flight: the next save (and the end of training) waits here and
  // rethrows what the previous write threw.
  std::string wait_writer() {
    if (writer.joinable()) writer.join();
    if (writer_error) {
      std::exception_ptr e = writer_error;
      writer_error = nullptr;
      std::rethrow_exception(e);
    }
    return last_committed;
  }

  std::string save(const std::string& root) {
    use_device();
    set_where("checkpoint step " + std::to_string(next_step) + ": waiting for the previous write");
    if (!zpart) {
      wait_writer();
    } else {
      // The snapshot gathers moments over the data group: a previous write that failed on
      // one rank stops every rank here, before the gather, not in it.
      std::exception_ptr failed;
      try {
        wait_writer();
      } catch (...) {
        failed = std::current_exception();
      }
      double flag = failed ? 1.0 : 0.0;
      dp_group->allreduce(&flag, 1, comm::ReduceOp::max, copt);
      if (failed) std::rethrow_exception(failed);
      if (flag > 0.0)
        throw checkpoint::CheckpointError(
            "the previous checkpoint write failed on another data-parallel rank");
    }
    set_where("checkpoint step " + std::to_string(next_step) + ": copying to host memory");
    MaybeSpan snap_span;
    open(snap_span, "checkpoint", [] { return std::string("checkpoint snapshot"); });
    auto snap = std::make_shared<checkpoint::ShardSnapshot>(snapshot(root));
    snap_span.reset();
    const std::string dir = root + "/" + checkpoint::step_dir_name(next_step);
    if (spec.checkpoint.async && (asg.commit_shard || world_size() == 1)) {
      // The write's span (on its own track: it overlaps the steps that follow) is opened here,
      // on the engine thread, so whether it is traced does not race the next step's set_step.
      auto span = std::make_shared<MaybeSpan>();
      open(
          *span, "checkpoint", [] { return std::string("checkpoint write"); }, trace::kCheckpointWriter);
      traced_write.store(span->has_value());
      writer = std::thread([this, snap, span] {
        try {
          last_committed = write_snapshot(*snap);
        } catch (...) {
          writer_error = std::current_exception();
        }
        span->reset();
        traced_write.store(false);
      });
    } else {
      set_where("checkpoint step " + std::to_string(next_step) + ": writing");
      MaybeSpan sp;
      open(sp, "checkpoint", [] { return std::string("checkpoint write"); });
      last_committed = write_snapshot(*snap);
    }
    set_where("idle after the checkpoint of step " + std::to_string(next_step));
    return dir;
  }
};

Engine::Engine(const JobSpec& spec, const EngineAssignment& assignment)
    : impl_(std::make_unique<Impl>(spec, assignment)), total_steps_(spec.train.steps) {}
Engine::~Engine() = default;

int64_t Engine::next_step() const { return impl_->next_step; }
StepReport Engine::step() {
  try {
    return impl_->step(abort_);
  } catch (const comm::CommError&) {
    if (abort_.load()) throw EngineAborted();
    throw;
  }
}
void Engine::request_abort() {
  abort_.store(true);
  for (auto* c : {impl_->embed_group.get(), impl_->tp_group.get(), impl_->pp_group.get(),
                  impl_->dp_group.get(), impl_->world.get()})
    if (c) c->abort();
}
double Engine::evaluate() { return impl_->evaluate(); }
std::string Engine::save_checkpoint(const std::string& dir) {
  try {
    return impl_->save(dir);
  } catch (const comm::CommError&) {  // the ZeRO snapshot's gather, released by request_abort
    if (abort_.load()) throw EngineAborted();
    throw;
  }
}
std::string Engine::wait_checkpoint() { return impl_->wait_writer(); }
int64_t Engine::num_params() const {
  int64_t n = 0;
  for (auto* st : impl_->stage_ptrs) n += st->num_params();
  return n;
}
std::string to_string(const EngineMemory& m) {
  auto mib = [](int64_t b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f MiB", double(b) / double(1 << 20));
    return std::string(buf);
  };
  std::string s = "params " + mib(m.params);
  if (m.compute > 0) s += " (+ " + mib(m.compute) + " 16-bit copy)";
  s += ", grads " + mib(m.grads);
  if (m.grads_kept != m.grads) s += " (" + mib(m.grads_kept) + " kept between buckets)";
  s += ", optimizer " + mib(m.optimizer);
  if (m.zero > 0) s += " (ZeRO " + std::to_string(m.zero) + ")";
  return s;
}

EngineMemory Engine::memory() const {
  EngineMemory m;
  for (auto* st : impl_->stage_ptrs) {
    const model::ParamStore& ps = st->store();
    m.params += int64_t(ps.flat_params().nbytes());
    m.grads += int64_t(ps.flat_grads().nbytes());
    if (ps.compute_dtype() != DType::f32) m.compute += int64_t(ps.flat_compute().nbytes());
  }
  for (const ParamRef& r : impl_->refs) m.optimizer += int64_t(2 * r.numel * sizeof(float));
  m.zero = impl_->zero;
  // Released bucket by bucket only where the reducer overlaps the backward (no pipeline).
  m.grads_kept =
      m.zero == 2 && impl_->reducer ? int64_t(impl_->zpart->owned_floats() * sizeof(float)) : m.grads;
  return m;
}
std::string Engine::where() const { return impl_->current_where(); }
bool Engine::resumed() const { return !impl_->asg.resume_from.empty(); }
const plan::Plan& Engine::plan() const { return impl_->plan; }
plan::RankPlace Engine::place() const { return impl_->where_in_plan; }

}  // namespace troupe

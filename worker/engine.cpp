// The engine of one rank: building it (the plan checked against the spec, the data, the
// communicator groups, the stages and the optimizer) and the Engine's public face. What the
// rank does is in engine_step.cpp, engine_eval.cpp, engine_checkpoint.cpp, engine_staging.cpp
// and engine_trace.cpp; its state is worker/engine_impl.hpp.
#include "worker/engine.hpp"

#include <cstdlib>
#include <string>

#include "comm/groups.hpp"
#include "core/error.hpp"
#include "kernels/kernels.hpp"
#include "model/from_spec.hpp"
#include "worker/device.hpp"
#include "worker/engine_impl.hpp"
#include "worker/memory_snapshot.hpp"

namespace troupe {

namespace {

// Bytes of synthetic data: enough windows that batches of small test models do not repeat soon.
constexpr size_t kSyntheticBytes = size_t(1) << 20;

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

Engine::Impl::Impl(const JobSpec& s, const EngineAssignment& a)
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
               "resources.device: ", to_string(s.resources.device), " runs train.zero 0 only in this engine");
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
  if (dp_group && !exec && ctx.device == Device::cpu && !(overlap != nullptr && std::string(overlap) == "0"))
    reducer = std::make_unique<parallel::BucketReducer>(
        dp_group.get(), copt, bucket_floats,
        zero == 2 ? parallel::BucketCollective::reduce_scatter : parallel::BucketCollective::allreduce,
        *ctx.alloc);
  tokens.resize(size_t(plan.micro_batch) * T);
  targets.resize(size_t(plan.micro_batch) * T);
  start_buddies();
  if (a.memory_step >= 0) {
    resume_from_memory();
  } else if (!a.resume_from.empty()) {
    resume(a.resume_from);
  } else if (!s.model.init_from.empty()) {
    init_from(s.model.init_from);
  }
  // Snapshots of an abandoned run are never restored later: a rank keeps only the one it
  // continues from (a healed group's members, none: they hold the root's state now), and the
  // copy of its partner's of that step.
  if (a.snapshots) a.snapshots->keep_only(a.memory_step >= 0 && a.heal_root < 0 ? a.memory_step : -1);
  if (a.held) a.held->keep_only(a.memory_step);
  for (size_t i = 0; i < host_master.size(); ++i)  // offload: the host copy of the master weights
    ctx.alloc->copy_to_host(host_master[i].data(), refs[i].data, refs[i].numel * sizeof(float));
  refresh_compute();
}

Engine::Impl::~Impl() {
  if (writer.joinable()) writer.join();
  if (tracer.active() || tracer.done()) write_trace();
}

// The world communicator and this rank's groups (comm/groups.hpp). What spans the world (the
// loss, the gradient norm, the overflow flag, the checkpoint barrier) is reduced over the
// groups in turn (grid_allreduce), so with gloo the world connects no pair of its own (a full
// mesh is N^2 connections and store requests) unless a trace measures clock offsets against
// rank 0; each rank connects only within the groups it uses.
void Engine::Impl::connect() {
  set_where("connecting to " + std::to_string(world_size() - 1) + " peers");
  comm::CommConfig c = asg.comm;
  c.rank = asg.rank;
  c.size = world_size();
  c.generation = asg.generation;
  c.group = "world";
  if (tracer.steps() == 0)
    c.peers = std::vector<int>{};
  else if (asg.rank != 0)
    c.peers = std::vector<int>{0};
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
      embed_group = world->new_group(place.embedding_group, "emb" + std::to_string(place.embedding_group[0]));
  }
}

// This pipeline rank's model chunks under the plan, each a tensor shard; with a
// pipeline, the executor runs the plan's checked schedule over them.
void Engine::Impl::build_stages() {
  stages = parallel::make_rank_stages(cfg, plan.partition, coord().p, plan.check, plan.micro_batch,
                                      model::TensorShard{coord().t, layout().tp}, tp_group.get(), ctx);
  for (auto& st : stages) stage_ptrs.push_back(st.get());
  if (layout().pp > 1) {
    exec = std::make_unique<parallel::PipelineExecutor>(plan.table, plan.check, coord().p, stage_ptrs,
                                                        pp_group.get(), plan.micro_batch, T, copt);
    if (tracer.steps() > 0) exec->set_tracer(&tracer);
  }
}

void Engine::Impl::set_where(std::string w) {
  std::lock_guard<std::mutex> lock(where_mu);
  where = std::move(w);
}

std::string Engine::Impl::current_where() const {
  if (exec && where.rfind("step", 0) == 0 && where.find("pipeline") != std::string::npos)
    return where + " (" + exec->where() + ")";
  std::lock_guard<std::mutex> lock(where_mu);
  return where;
}

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
  if (impl_->buddy) impl_->buddy->abort();
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
  if (m.snapshots > 0) s += ", in-memory snapshots " + mib(m.snapshots);
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
  // A partner's copies are its own pages when this rank maps them (a buddy on the same host).
  if (impl_->memory_snapshots())
    m.snapshots = (impl_->buddy && !impl_->buddy->maps_partner() ? 4 : 2) * impl_->state_bytes();
  // Released bucket by bucket only where the reducer overlaps the backward (no pipeline).
  m.grads_kept =
      m.zero == 2 && impl_->reducer ? int64_t(impl_->zpart->owned_floats() * sizeof(float)) : m.grads;
  return m;
}
std::string Engine::where() const { return impl_->current_where(); }
bool Engine::resumed() const { return !impl_->asg.resume_from.empty() || impl_->asg.memory_step >= 0; }
const plan::Plan& Engine::plan() const { return impl_->plan; }
plan::RankPlace Engine::place() const { return impl_->where_in_plan; }

}  // namespace troupe

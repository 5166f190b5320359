#include "worker/engine.hpp"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.hpp"
#include "comm/groups.hpp"
#include "core/dataset.hpp"
#include "core/error.hpp"
#include "core/rng.hpp"
#include "core/safetensors.hpp"
#include "model/from_spec.hpp"
#include "model/param_io.hpp"
#include "model/stage.hpp"
#include "model/tensor_parallel.hpp"
#include "parallel/grid.hpp"
#include "parallel/optimizer.hpp"
#include "parallel/partition.hpp"
#include "parallel/pipeline.hpp"
#include "parallel/schedule.hpp"

namespace troupe {

namespace {

// Bytes of synthetic data: enough windows that batches of small test models do not repeat soon.
constexpr size_t kSyntheticBytes = size_t(1) << 20;
// Data-parallel gradient buckets: 4 Mi floats (16 MiB), reduced one after another.
constexpr size_t kBucketFloats = size_t(4) << 20;
// Tags of the forward-only evaluation chain (the training schedule's tags stay below).
constexpr uint32_t kEvalTagBase = 1u << 30;

Dataset make_dataset(const JobSpec& spec) {
  if (spec.data.source == DataSource::synthetic)
    return Dataset::synthetic(spec.train.seed, kSyntheticBytes, spec.data.val_fraction);
  return Dataset::from_path(spec.data.path, spec.data.val_fraction);
}

std::string hex64(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

parallel::ScheduleKind schedule_kind(Schedule s) {
  switch (s) {
    case Schedule::gpipe:
      return parallel::ScheduleKind::gpipe;
    case Schedule::interleaved:
      return parallel::ScheduleKind::interleaved;
    default:
      return parallel::ScheduleKind::one_f_one_b;
  }
}

std::string shard_file(int rank) { return "shard_r" + std::to_string(rank) + ".safetensors"; }

}  // namespace

struct Engine::Impl {
  JobSpec spec;
  EngineAssignment asg;
  Dataset data;
  model::ModelConfig cfg;
  int T = 0;
  int micro_batch = 0;  // rows per forward/backward
  int n_micro = 0;      // micro-batches per step on this rank
  int local_rows = 0;   // rows of the global batch this data-parallel rank takes
  parallel::PipelinePlace place;
  comm::Options copt;
  std::unique_ptr<comm::Communicator> world, dp_group, pp_group, tp_group, embed_group;

  // This rank's model chunks (one unless the schedule is interleaved) and their parameters.
  parallel::Partition part;
  std::vector<std::unique_ptr<model::Stage>> stages;
  std::vector<model::Stage*> stage_ptrs;
  std::unique_ptr<parallel::PipelineExecutor> exec;  // pipeline > 1
  std::vector<model::Param*> params;                 // every chunk's, in chunk order
  std::vector<ParamRef> refs;
  std::unique_ptr<AdamW> opt;

  int64_t next_step = 0;
  std::vector<int32_t> tokens, targets;
  std::vector<float> act;  // (B,T,D) evaluation activations between pipeline ranks

  mutable std::mutex where_mu;
  std::string where = "idle";

  Impl(const JobSpec& s, const EngineAssignment& a)
      : spec(s), asg(a), data(make_dataset(s)), cfg(model::model_config(s)) {
    TROUPE_CHECK(a.dp >= 1 && a.pp >= 1 && a.tp >= 1 && a.world == a.dp * a.pp * a.tp && a.rank >= 0 &&
                     a.rank < a.world,
                 "assignment: rank ", a.rank, " of ", a.world, " does not fit layout ", a.dp, "x", a.pp, "x",
                 a.tp);
    TROUPE_CHECK(s.train.precision == Precision::fp32, "precision ", to_string(s.train.precision),
                 " needs device cuda; the CPU engine trains in fp32");
    T = s.model.seq_len;
    const int B = s.train.global_batch;
    TROUPE_CHECK(B % a.dp == 0, "global_batch ", B, " is not divisible by data ", a.dp);
    local_rows = B / a.dp;
    micro_batch = s.train.micro_batch > 0 ? s.train.micro_batch : local_rows;
    TROUPE_CHECK(local_rows % micro_batch == 0, "global_batch / data = ", local_rows,
                 " is not a multiple of micro_batch ", micro_batch);
    n_micro = local_rows / micro_batch;
    TROUPE_CHECK(data.split_size(Split::train) > size_t(T) + 1, "the training data (",
                 data.split_size(Split::train),
                 " bytes) is shorter than one window of seq_len + 1 = ", T + 1);
    place = parallel::pipeline_place(a.rank, a.dp, a.pp, a.tp);
    copt.timeout = a.comm_timeout;
    if (a.world > 1) connect();
    build_stages();
    for (auto* st : stage_ptrs)
      for (auto& p : st->params()) {
        params.push_back(&p);
        refs.push_back({p.name, p.data.f32(), p.grad.f32(), size_t(p.data.numel()), p.decay});
      }
    opt = std::make_unique<AdamW>(s.train.optimizer, refs);
    tokens.resize(size_t(micro_batch) * T);
    targets.resize(size_t(micro_batch) * T);
    if (!a.resume_from.empty())
      resume(a.resume_from);
    else if (!s.model.init_from.empty())
      init_from(s.model.init_from);
  }

  const comm::GridCoord& coord() const { return place.coord; }

  // The world communicator and this rank's groups (comm/groups.hpp: tensor innermost).
  void connect() {
    set_where("connecting to " + std::to_string(asg.world - 1) + " peers");
    comm::CommConfig c = asg.comm;
    c.rank = asg.rank;
    c.size = asg.world;
    c.generation = asg.generation;
    c.group = "world";
    world = comm::make_communicator(c);
    const comm::GridGroups g = comm::grid_groups(asg.dp, asg.pp, asg.tp);
    const int r = asg.rank;
    if (asg.dp > 1) dp_group = world->new_group(comm::group_of(g.data, r), comm::group_name("dp", g.data, r));
    if (asg.tp > 1)
      tp_group = world->new_group(comm::group_of(g.tensor, r), comm::group_name("tp", g.tensor, r));
    if (asg.pp > 1) {
      pp_group = world->new_group(comm::group_of(g.pipeline, r), comm::group_name("pp", g.pipeline, r));
      // The tied embedding lives on the first and the last stage of each pipeline.
      if (place.first || place.last)
        embed_group =
            world->new_group(place.embedding_group, "emb" + std::to_string(place.embedding_group[0]));
    }
  }

  // Model chunks of this pipeline rank, each a tensor shard; the schedule fixes how many
  // micro-batches each chunk keeps in flight (its activation slots).
  void build_stages() {
    const int v = spec.parallel.virtual_stages;
    part = parallel::partition_layers(cfg.n_layer, asg.pp, v, cfg);
    const model::TensorShard shard{coord().t, asg.tp};
    if (asg.pp == 1) {
      stages.push_back(
          std::make_unique<model::Stage>(cfg, part.of(0, 0), 1, micro_batch, shard, tp_group.get()));
    } else {
      parallel::Schedule sched =
          parallel::make_schedule(schedule_kind(spec.parallel.schedule), asg.pp, v, n_micro);
      parallel::CheckResult check = parallel::check_schedule(sched);
      for (int c = 0; c < v; ++c)
        stages.push_back(std::make_unique<model::Stage>(cfg, part.of(coord().p, c),
                                                        std::max(1, check.peak_in_flight[coord().p][c]),
                                                        micro_batch, shard, tp_group.get()));
      for (auto& st : stages) stage_ptrs.push_back(st.get());
      exec = std::make_unique<parallel::PipelineExecutor>(std::move(sched), coord().p, stage_ptrs,
                                                          pp_group.get(), micro_batch, T, copt);
      return;
    }
    for (auto& st : stages) stage_ptrs.push_back(st.get());
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

  // model.init_from: a safetensors file of full tensors (PyTorch names), or a checkpoint
  // directory written under the 1x1x1 layout. Each shard reads only its slices.
  void init_from(const std::string& path) {
    std::string file = path;
    if (checkpoint::is_checkpoint_dir(path)) {
      checkpoint::Manifest m = checkpoint::verify(path);
      TROUPE_CHECK(m.dp * m.pp * m.tp == 1 || (m.pp == 1 && m.tp == 1), path, ": a checkpoint of layout ",
                   m.dp, "x", m.pp, "x", m.tp, " holds sliced tensors; export it to one file first");
      file = path + "/" + shard_file(0);
    }
    safetensors::Reader r(file);
    for (auto* p : params) model::load_param(r, *p);
  }

  // Resuming: the same layout reads back exactly what each rank wrote, parameters and
  // AdamW moments (data-parallel replicas read their replica-0 twin's shard).
  void resume(const std::string& dir) {
    checkpoint::Manifest m = checkpoint::verify(dir);
    TROUPE_CHECK(
        m.pp == asg.pp && m.tp == asg.tp && (m.dp == asg.dp || m.dp * m.pp * m.tp == 1 || m.pp * m.tp == 1),
        dir, ": written under layout ", m.dp, "x", m.pp, "x", m.tp, "; this job runs ", asg.dp, "x", asg.pp,
        "x", asg.tp, " (pipeline and tensor must match)");
    const int twin = (0 * asg.pp + coord().p) * asg.tp + coord().t;
    safetensors::Reader r(dir + "/" + shard_file(twin));
    auto read = [&](const std::string& name, const Tensor& like, float* dst) {
      TROUPE_CHECK(r.contains(name), r.path(), ": tensor ", name, " is missing");
      const auto& info = r.info(name);
      TROUPE_CHECK(info.dtype == DType::f32 && info.shape == like.shape(), r.path(), ": tensor ", name,
                   " has another dtype or shape than this rank's slice");
      r.read_bytes(name, 0, info.nbytes(), dst);
    };
    for (size_t i = 0; i < params.size(); ++i) {
      read(params[i]->name, params[i]->data, params[i]->data.f32());
      read("optim.m." + params[i]->name, params[i]->data, opt->m(i).data());
      read("optim.v." + params[i]->name, params[i]->data, opt->v(i).data());
    }
    next_step = m.step;
  }

  // ------------------------------------------------------------------ one step

  void check_abort(const std::atomic<bool>& abort) {
    if (abort.load()) throw EngineAborted();
  }

  int first_row(int mb) const { return coord().d * local_rows + mb * micro_batch; }

  // Sums the gradients over the data-parallel group, bucket by bucket. Each rank's
  // backward already scaled its share by 1/(global tokens), so the sum is the mean
  // gradient of the global batch.
  void reduce_data_parallel() {
    if (!dp_group) return;
    for (auto* st : stage_ptrs) {
      const Tensor& flat = st->store().flat_grads();
      float* g = flat.f32();
      const size_t n = size_t(flat.numel());
      for (size_t off = 0; off < n; off += kBucketFloats) {
        set_where("step " + std::to_string(next_step) + ": data-parallel allreduce of bucket " +
                  std::to_string(off / kBucketFloats));
        dp_group->allreduce(g + off, std::min(kBucketFloats, n - off), comm::ReduceOp::sum, copt);
      }
    }
  }

  // Sum of a scalar over the world (loss sums, squared norms).
  double world_sum(double v) {
    if (world) world->allreduce(&v, 1, comm::ReduceOp::sum, copt);
    return v;
  }

  // Squared global gradient norm: each tensor group sums its shards (replicated
  // parameters once); the tied embedding counts once (on the first stage); data
  // replicas hold the same gradients after the reduction, so one replica counts.
  double grad_norm_squared() {
    double local = 0.0;
    for (auto* st : stage_ptrs) {
      std::vector<model::Param> counted;
      for (const auto& p : st->params())
        if (!(p.name == "wte.weight" && asg.pp > 1 && !st->range().has_embedding)) counted.push_back(p);
      local += model::tensor_parallel_grad_sum_squares(st->tensor_group(), counted);
    }
    return world_sum(coord().t == 0 && coord().d == 0 ? local : 0.0);
  }

  StepReport step(const std::atomic<bool>& abort) {
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    const int64_t s = next_step;
    const int B = spec.train.global_batch;
    const float dloss = 1.0f / float(int64_t(B) * T);
    for (auto* st : stage_ptrs) st->zero_grads();
    double loss_sum = 0.0;
    StepReport r;
    if (!exec) {
      model::Stage& st = *stage_ptrs[0];
      for (int mb = 0; mb < n_micro; ++mb) {
        check_abort(abort);
        data.get_rows(s, B, T, first_row(mb), first_row(mb) + micro_batch, tokens.data(), targets.data());
        set_where("step " + std::to_string(s) + ": forward micro-batch " + std::to_string(mb));
        loss_sum += st.forward(0, tokens.data(), nullptr, targets.data(), micro_batch, T);
        check_abort(abort);
        set_where("step " + std::to_string(s) + ": backward micro-batch " + std::to_string(mb));
        st.backward(0, nullptr, dloss);
      }
    } else {
      set_where("step " + std::to_string(s) + ": pipeline schedule");
      auto source = [&](int mb) {
        data.get_rows(s, B, T, first_row(mb), first_row(mb) + micro_batch, tokens.data(), targets.data());
        return parallel::MicroBatch{tokens.data(), targets.data()};
      };
      parallel::PipelineStepResult pr = exec->run(source, dloss);
      loss_sum = pr.has_loss ? pr.loss_sum : 0.0;
      r.compute_ms = pr.timing.compute_ms;
      r.bubble_ms = pr.timing.bubble_ms;
      r.comm_ms = pr.timing.comm_ms;
      set_where("step " + std::to_string(s) + ": tied-embedding gradient sum");
      parallel::allreduce_tied_embedding(stage_ptrs, embed_group.get(), copt);
    }
    check_abort(abort);
    const auto t_comm = clock::now();
    reduce_data_parallel();
    // Each data replica's last pipeline stage holds its rows' loss; tensor shards hold copies.
    loss_sum = world_sum(place.last && coord().t == 0 ? loss_sum : 0.0);
    set_where("step " + std::to_string(s) + ": optimizer");
    const double norm = std::sqrt(grad_norm_squared());
    r.comm_ms += std::chrono::duration<double, std::milli>(clock::now() - t_comm).count();
    for (auto* st : stage_ptrs) clip_grads(stage_refs(st), norm, spec.train.grad_clip);
    const double lr = lr_at(spec.train, s);
    opt->step(lr, s + 1);
    next_step = s + 1;

    r.step = s;
    r.loss = loss_sum / double(int64_t(B) * T);
    r.lr = lr;
    r.tokens = int64_t(B) * T;
    r.grad_norm = norm;
    if (spec.train.eval_every > 0 &&
        (next_step % spec.train.eval_every == 0 || next_step == spec.train.steps))
      r.val_loss = evaluate();
    r.step_ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
    set_where("idle after step " + std::to_string(s));
    return r;
  }

  std::vector<ParamRef> stage_refs(model::Stage* st) const {
    std::vector<ParamRef> out;
    for (const auto& ref : refs)
      for (const auto& p : st->params())
        if (p.data.f32() == ref.data) out.push_back(ref);
    return out;
  }

  // Mean loss over train.eval_batches validation batches. With a pipeline, a forward-only
  // chain through the model chunks in order (chunk k on pipeline rank k mod pp); every data
  // replica evaluates the same batches.
  double evaluate() {
    const int Bm = micro_batch;
    const int64_t n_batches = data.num_eval_batches(Bm, T);
    const int n_chunks = part.n_chunks();
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
      for (int chunk = coord().p; chunk < n_chunks; chunk += asg.pp) {
        model::Stage& st = *stage_ptrs[size_t(chunk / asg.pp)];
        const int prev = (coord().p + asg.pp - 1) % asg.pp, next = (coord().p + 1) % asg.pp;
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

  // Replica 0 of each (pipeline, tensor) position writes its slices and moments to
  // shard_r<rank>.safetensors; rank 0 commits once every shard is on disk.
  std::string save(const std::string& root) {
    set_where("checkpoint step " + std::to_string(next_step));
    std::string tmp;
    if (asg.rank == 0) tmp = checkpoint::begin(root, next_step);
    if (world) world->barrier(copt);
    tmp = root + "/" + checkpoint::step_dir_name(next_step) + ".tmp";
    if (coord().d == 0) write_shard(tmp);
    if (world) world->barrier(copt);
    std::string dir = root + "/" + checkpoint::step_dir_name(next_step);
    if (asg.rank == 0) dir = commit(root, tmp);
    if (world) world->barrier(copt);
    set_where("idle after checkpoint");
    return dir;
  }

  void write_shard(const std::string& tmp) {
    std::vector<safetensors::WriteEntry> entries;
    nlohmann::json slices = nlohmann::json::object();
    for (auto* p : params) {
      entries.push_back(safetensors::entry(p->name, p->data));
      nlohmann::json pieces = nlohmann::json::array();
      for (const auto& pc : p->slice_pieces())
        pieces.push_back({{"offset", pc.offset}, {"length", pc.length}, {"local_offset", pc.local_offset}});
      slices[p->name] = {{"global_shape", p->global_shape}, {"split_dim", p->split_dim}, {"pieces", pieces}};
    }
    for (size_t i = 0; i < params.size(); ++i)
      entries.push_back(
          {"optim.m." + params[i]->name, DType::f32, params[i]->data.shape(), opt->m(i).data()});
    for (size_t i = 0; i < params.size(); ++i)
      entries.push_back(
          {"optim.v." + params[i]->name, DType::f32, params[i]->data.shape(), opt->v(i).data()});
    safetensors::WriteOptions wo;
    wo.fsync = true;
    safetensors::write(
        tmp + "/" + shard_file(asg.rank), entries,
        {{"format", "troupe"},
         {"step", std::to_string(next_step)},
         {"rank", std::to_string(asg.rank)},
         {"layout", std::to_string(asg.dp) + "x" + std::to_string(asg.pp) + "x" + std::to_string(asg.tp)},
         {"slices", slices.dump()}},
        wo);
  }

  std::string commit(const std::string& root, const std::string& tmp) {
    checkpoint::Manifest m;
    m.step = next_step;
    m.data_cursor = next_step;
    m.dp = asg.dp;
    m.pp = asg.pp;
    m.tp = asg.tp;
    m.seed = spec.train.seed;
    m.spec_yaml = to_yaml(spec);
    m.spec_hash = hex64(rng::name_hash(m.spec_yaml));
    const auto& o = spec.train.optimizer;
    m.optimizer = {{"type", o.type},   {"lr", o.lr},   {"beta1", o.beta1},
                   {"beta2", o.beta2}, {"eps", o.eps}, {"weight_decay", o.weight_decay}};
    for (int p = 0; p < asg.pp; ++p)
      for (int t = 0; t < asg.tp; ++t) {
        const std::string f = shard_file(p * asg.tp + t);
        m.files.push_back(
            {f, std::filesystem::file_size(tmp + "/" + f), checkpoint::file_xxh64(tmp + "/" + f)});
      }
    return checkpoint::commit(root, m, spec.checkpoint.keep);
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
std::string Engine::save_checkpoint(const std::string& dir) { return impl_->save(dir); }
int64_t Engine::num_params() const {
  int64_t n = 0;
  for (auto* st : impl_->stage_ptrs) n += st->num_params();
  return n;
}
std::string Engine::where() const { return impl_->current_where(); }

}  // namespace troupe

#include "worker/engine.hpp"

#include <chrono>
#include <cmath>
#include <mutex>

#include "checkpoint/checkpoint.hpp"
#include "comm/groups.hpp"
#include "core/dataset.hpp"
#include "core/error.hpp"
#include "core/rng.hpp"
#include "core/safetensors.hpp"
#include "model/from_spec.hpp"
#include "model/stage.hpp"
#include "parallel/optimizer.hpp"

namespace troupe {

namespace {

// Bytes of synthetic data: enough windows that batches of small test models do not repeat soon.
constexpr size_t kSyntheticBytes = size_t(1) << 20;
// Data-parallel gradient buckets: 4 Mi floats (16 MiB), reduced one after another.
constexpr size_t kBucketFloats = size_t(4) << 20;

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
  comm::GridCoord coord{0, 0, 0};
  comm::Options copt;
  std::unique_ptr<comm::Communicator> world, dp_group;
  std::unique_ptr<model::Stage> stage;
  std::vector<ParamRef> refs;
  std::unique_ptr<AdamW> opt;
  int64_t next_step = 0;
  std::vector<int32_t> tokens, targets;

  mutable std::mutex where_mu;
  std::string where = "idle";

  Impl(const JobSpec& s, const EngineAssignment& a)
      : spec(s), asg(a), data(make_dataset(s)), cfg(model::model_config(s)) {
    TROUPE_CHECK(a.dp >= 1 && a.pp >= 1 && a.tp >= 1 && a.world == a.dp * a.pp * a.tp && a.rank >= 0 &&
                     a.rank < a.world,
                 "assignment: rank ", a.rank, " of ", a.world, " does not fit layout ", a.dp, "x", a.pp, "x",
                 a.tp);
    TROUPE_CHECK(a.pp == 1 && a.tp == 1, "layout ", a.dp, "x", a.pp, "x", a.tp,
                 ": this engine runs data parallelism only (pipeline = tensor = 1)");
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
    coord = comm::grid_coord(a.rank, a.dp, a.pp, a.tp);
    copt.timeout = a.comm_timeout;
    if (a.world > 1) connect();
    TROUPE_CHECK(data.split_size(Split::train) > size_t(T) + 1, "the training data (",
                 data.split_size(Split::train),
                 " bytes) is shorter than one window of seq_len + 1 = ", T + 1);
    stage = std::make_unique<model::Stage>(cfg, model::StageRange::full(cfg), 1, micro_batch);
    for (auto& p : stage->params())
      refs.push_back({p.name, p.data.f32(), p.grad.f32(), size_t(p.data.numel()), p.decay});
    opt = std::make_unique<AdamW>(s.train.optimizer, refs);
    tokens.resize(size_t(micro_batch) * T);
    targets.resize(size_t(micro_batch) * T);
    if (!a.resume_from.empty())
      resume(a.resume_from);
    else if (!s.model.init_from.empty())
      load_params(s.model.init_from, /*with_optimizer=*/false);
  }

  // The world communicator and this rank's groups (comm/groups.hpp).
  void connect() {
    set_where("connecting to " + std::to_string(asg.world - 1) + " peers");
    comm::CommConfig c = asg.comm;
    c.rank = asg.rank;
    c.size = asg.world;
    c.generation = asg.generation;
    c.group = "world";
    world = comm::make_communicator(c);
    const comm::GridGroups g = comm::grid_groups(asg.dp, asg.pp, asg.tp);
    dp_group = world->new_group(comm::group_of(g.data, asg.rank), comm::group_name("dp", g.data, asg.rank));
  }

  // Sums the gradients over the data-parallel group, bucket by bucket. Each rank's
  // backward already scaled its share by 1/(global tokens), so the sum is the mean
  // gradient of the global batch.
  void reduce_data_parallel() {
    if (!dp_group || dp_group->size() == 1) return;
    const Tensor& flat = stage->store().flat_grads();
    float* g = flat.f32();
    const size_t n = size_t(flat.numel());
    for (size_t off = 0; off < n; off += kBucketFloats) {
      set_where("step " + std::to_string(next_step) + ": data-parallel allreduce of bucket " +
                std::to_string(off / kBucketFloats));
      dp_group->allreduce(g + off, std::min(kBucketFloats, n - off), comm::ReduceOp::sum, copt);
    }
  }

  // Sum of a scalar over the world (loss sums, squared norms).
  double world_sum(double v) {
    if (world) world->allreduce(&v, 1, comm::ReduceOp::sum, copt);
    return v;
  }

  void set_where(std::string w) {
    std::lock_guard<std::mutex> lock(where_mu);
    where = std::move(w);
  }

  // Copies every parameter (and, with_optimizer, the AdamW moments) from a safetensors
  // file or a checkpoint directory. Returns the checkpoint's step (0 for a file).
  int64_t load_params(const std::string& path, bool with_optimizer) {
    checkpoint::TensorSource src(path);
    auto& params = stage->params();
    for (size_t i = 0; i < params.size(); ++i) {
      const Shape& shape = params[i].data.shape();
      src.read(params[i].name, shape, params[i].data.f32());
      if (with_optimizer) {
        src.read("optim.m." + params[i].name, shape, opt->m(i).data());
        src.read("optim.v." + params[i].name, shape, opt->v(i).data());
      }
    }
    return src.manifest() ? src.manifest()->step : 0;
  }

  void resume(const std::string& dir) { next_step = load_params(dir, /*with_optimizer=*/true); }

  void check_abort(const std::atomic<bool>& abort) {
    if (abort.load()) throw EngineAborted();
  }

  StepReport step(const std::atomic<bool>& abort) {
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    const int64_t s = next_step;
    const int B = spec.train.global_batch;
    const float dloss = 1.0f / float(int64_t(B) * T);
    stage->zero_grads();
    double loss_sum = 0.0;
    for (int mb = 0; mb < n_micro; ++mb) {
      check_abort(abort);
      const int row0 = coord.d * local_rows + mb * micro_batch;
      data.get_rows(s, B, T, row0, row0 + micro_batch, tokens.data(), targets.data());
      set_where("step " + std::to_string(s) + ": forward micro-batch " + std::to_string(mb));
      loss_sum += stage->forward(0, tokens.data(), nullptr, targets.data(), micro_batch, T);
      check_abort(abort);
      set_where("step " + std::to_string(s) + ": backward micro-batch " + std::to_string(mb));
      stage->backward(0, nullptr, dloss);
    }
    check_abort(abort);
    reduce_data_parallel();
    loss_sum = world_sum(loss_sum);
    set_where("step " + std::to_string(s) + ": optimizer");
    // After the reduction every data-parallel replica holds the same gradients.
    const double norm = std::sqrt(world_sum(grad_sum_squares(refs)) / asg.dp);
    clip_grads(refs, norm, spec.train.grad_clip);
    const double lr = lr_at(spec.train, s);
    opt->step(lr, s + 1);
    next_step = s + 1;

    StepReport r;
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

  double evaluate() {
    const int Bm = micro_batch;
    const int64_t n_batches = data.num_eval_batches(Bm, T);
    double sum = 0.0;
    for (int k = 0; k < spec.train.eval_batches; ++k) {
      set_where("eval batch " + std::to_string(k));
      data.get_rows(Split::val, k % n_batches, Bm, T, 0, Bm, tokens.data(), targets.data());
      sum += stage->forward(0, tokens.data(), nullptr, targets.data(), Bm, T) / double(int64_t(Bm) * T);
    }
    return sum / spec.train.eval_batches;
  }

  std::string save(const std::string& root) {
    set_where("checkpoint step " + std::to_string(next_step));
    // Data-parallel replicas hold the same state: replica 0 writes, the others wait.
    std::string dir = root + "/" + checkpoint::step_dir_name(next_step);
    if (coord.d == 0) dir = write_checkpoint(root);
    if (world) world->barrier(copt);
    set_where("idle after checkpoint");
    return dir;
  }

  std::string write_checkpoint(const std::string& root) {
    const std::string tmp = checkpoint::begin(root, next_step);
    std::vector<safetensors::WriteEntry> entries;
    auto& params = stage->params();
    for (size_t i = 0; i < params.size(); ++i)
      entries.push_back(safetensors::entry(params[i].name, params[i].data));
    for (size_t i = 0; i < params.size(); ++i)
      entries.push_back({"optim.m." + params[i].name, DType::f32, params[i].data.shape(), opt->m(i).data()});
    for (size_t i = 0; i < params.size(); ++i)
      entries.push_back({"optim.v." + params[i].name, DType::f32, params[i].data.shape(), opt->v(i).data()});
    checkpoint::Manifest m;
    m.step = next_step;
    m.data_cursor = next_step;
    m.seed = spec.train.seed;
    m.spec_yaml = to_yaml(spec);
    m.spec_hash = hex64(rng::name_hash(m.spec_yaml));
    const auto& o = spec.train.optimizer;
    m.optimizer = {{"type", o.type},   {"lr", o.lr},   {"beta1", o.beta1},
                   {"beta2", o.beta2}, {"eps", o.eps}, {"weight_decay", o.weight_decay}};
    m.files.push_back(checkpoint::write_shard(tmp, "shard_r0.safetensors", entries,
                                              {{"format", "troupe"}, {"step", std::to_string(next_step)}}));
    m.dp = asg.dp;
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
  for (auto* c : {impl_->dp_group.get(), impl_->world.get()})
    if (c) c->abort();
}
double Engine::evaluate() { return impl_->evaluate(); }
std::string Engine::save_checkpoint(const std::string& dir) { return impl_->save(dir); }
int64_t Engine::num_params() const { return impl_->stage->num_params(); }
std::string Engine::where() const {
  std::lock_guard<std::mutex> lock(impl_->where_mu);
  return impl_->where;
}

}  // namespace troupe

#include "worker/engine.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <exception>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/commit.hpp"
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
// TROUPE_DP_BUCKET_FLOATS overrides the size.
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

size_t env_size(const char* name, size_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long x = std::strtoull(v, &end, 10);
  TROUPE_CHECK(end != nullptr && *end == '\0', name, "=", v, " is not a non-negative integer");
  return size_t(x);
}

// The buckets of a flat gradient buffer of n floats: fixed-size runs cut from the end, so
// the first bucket complete during backward (which walks the buffer from its end) is the
// first to go; the partial one is [0, n mod size). The overlapped and the post-backward
// reductions cut the same buckets, so every element sees the same collective.
size_t bucket_begin(size_t end, size_t bucket) { return end > bucket ? end - bucket : 0; }

// Allreduces gradient buckets over the data-parallel group on a thread of its own while
// the engine thread runs the rest of the backward. During a step only this thread uses
// the group; the first error is kept and rethrown by wait() on the engine thread.
class BucketReducer {
 public:
  using clock = std::chrono::steady_clock;

  BucketReducer(comm::Communicator* group, const comm::Options& opt)
      : group_(group), opt_(opt), thread_([this] { run(); }) {}
  ~BucketReducer() {
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
      queue_.clear();
    }
    cv_.notify_all();
    thread_.join();
  }
  BucketReducer(const BucketReducer&) = delete;
  BucketReducer& operator=(const BucketReducer&) = delete;

  void submit(float* data, size_t count) {
    {
      std::lock_guard<std::mutex> lock(m_);
      queue_.push_back({data, count});
    }
    cv_.notify_all();
  }

  // Blocks until every submitted bucket is reduced (or dropped after an error); rethrows
  // the first error. Returns the busy intervals of the buckets since the last wait.
  std::vector<std::pair<clock::time_point, clock::time_point>> wait() {
    std::unique_lock<std::mutex> lock(m_);
    idle_.wait(lock, [&] { return queue_.empty() && !busy_; });
    auto spans = std::move(spans_);
    spans_.clear();
    if (error_) {
      std::exception_ptr e = error_;
      error_ = nullptr;
      std::rethrow_exception(e);
    }
    return spans;
  }

  // The engine thread failed mid-backward: queued buckets are dropped, and one in flight
  // is released by aborting the group (its peers learn at once; the step is lost anyway).
  void cancel() noexcept {
    std::unique_lock<std::mutex> lock(m_);
    queue_.clear();
    if (busy_) group_->abort();
    idle_.wait(lock, [&] { return !busy_; });
    spans_.clear();
    error_ = nullptr;
  }

 private:
  struct Bucket {
    float* data;
    size_t count;
  };

  void run() {
    std::unique_lock<std::mutex> lock(m_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      const Bucket b = queue_.front();
      queue_.pop_front();
      if (error_) {
        if (queue_.empty()) idle_.notify_all();
        continue;
      }
      busy_ = true;
      lock.unlock();
      std::exception_ptr err;
      const auto t0 = clock::now();
      try {
        group_->allreduce(b.data, b.count, comm::ReduceOp::sum, opt_);
      } catch (...) {
        err = std::current_exception();
      }
      const auto t1 = clock::now();
      lock.lock();
      busy_ = false;
      spans_.emplace_back(t0, t1);
      if (err && !error_) error_ = err;
      if (queue_.empty()) idle_.notify_all();
    }
  }

  comm::Communicator* group_;
  comm::Options opt_;
  std::mutex m_;
  std::condition_variable cv_, idle_;
  std::deque<Bucket> queue_;
  bool busy_ = false, stop_ = false;
  std::exception_ptr error_;
  std::vector<std::pair<clock::time_point, clock::time_point>> spans_;
  std::thread thread_;  // last: starts once the members it uses exist
};

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
  // Data-parallel reduction: bucket size and, with pp == 1, the thread that reduces each
  // bucket of the last micro-batch's backward as soon as it is final (TROUPE_DP_OVERLAP=0:
  // after the backward, on the engine thread). With a pipeline the last backward of each
  // chunk runs inside the executor, interleaved with transfers of other micro-batches,
  // and the tied-embedding sum has to precede the embedding's bucket, so the reduction
  // stays after the schedule.
  size_t bucket_floats = kBucketFloats;
  std::unique_ptr<BucketReducer> reducer;

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
    // Second line of defence: validate, run and submit refuse these first (core/spec_runnable.cpp).
    TROUPE_CHECK(s.train.precision == Precision::fp32, "train.precision ", to_string(s.train.precision),
                 " is not supported by this build yet: the engine trains in fp32");
    TROUPE_CHECK(s.resources.device == DeviceKind::cpu, "resources.device ", to_string(s.resources.device),
                 ": this build's engine trains on CPU only");
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
    bucket_floats = env_size("TROUPE_DP_BUCKET_FLOATS", kBucketFloats);
    TROUPE_CHECK(bucket_floats > 0, "TROUPE_DP_BUCKET_FLOATS must be positive");
    const char* overlap = std::getenv("TROUPE_DP_OVERLAP");
    if (dp_group && !exec && !(overlap != nullptr && std::string(overlap) == "0"))
      reducer = std::make_unique<BucketReducer>(dp_group.get(), copt);
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

  // What this rank holds of a parameter, in the checkpoint's terms.
  static checkpoint::SliceSpec held_slice(const model::Param& p) {
    checkpoint::SliceSpec s{p.global_shape, p.split_dim, {}};
    for (const auto& pc : p.slice_pieces()) s.pieces.push_back({pc.offset, pc.length, pc.local_offset});
    return s;
  }

  // model.init_from: a safetensors file of full tensors (PyTorch names), or a checkpoint
  // directory (or a root holding them) of any layout. Only parameters are read, each
  // shard reading just the byte ranges of its slices.
  void init_from(const std::string& path) {
    checkpoint::TensorSource src(std::filesystem::is_directory(path) ? checkpoint::resolve(path) : path);
    for (auto* p : params) src.read_slice(p->name, held_slice(*p), p->data.f32());
  }

  // Resuming under any layout: after the manifest and every checksum verify, each rank
  // reads its slices of the parameters and of both AdamW moments from whichever shards
  // hold them, and continues at the checkpoint's step.
  void resume(const std::string& dir) {
    checkpoint::TensorSource src(checkpoint::resolve(dir));
    TROUPE_CHECK(src.manifest().has_value(), dir, ": not a checkpoint directory");
    for (size_t i = 0; i < params.size(); ++i) {
      const checkpoint::SliceSpec want = held_slice(*params[i]);
      src.read_slice(params[i]->name, want, params[i]->data.f32());
      src.read_slice("optim.m." + params[i]->name, want, opt->m(i).data());
      src.read_slice("optim.v." + params[i]->name, want, opt->v(i).data());
    }
    next_step = src.manifest()->step;
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
      size_t k = 0;
      for (size_t end = n; end > 0; end = bucket_begin(end, bucket_floats), ++k) {
        set_where("step " + std::to_string(next_step) + ": data-parallel allreduce of bucket " +
                  std::to_string(k));
        const size_t begin = bucket_begin(end, bucket_floats);
        dp_group->allreduce(g + begin, end - begin, comm::ReduceOp::sum, copt);
      }
    }
  }

  // The last micro-batch's backward on a pipeline-free rank, each gradient bucket handed
  // to the reducer as soon as the backward has finished writing it. Returns when the
  // backward is done; the buckets may still be in flight (reducer->wait()).
  void backward_overlapped(model::Stage& st, float dloss) {
    const Tensor& flat = st.store().flat_grads();
    float* g = flat.f32();
    const size_t n = size_t(flat.numel());
    size_t ready_from = n, next_end = n;
    auto ship = [&](size_t final_from) {
      while (next_end > 0 && bucket_begin(next_end, bucket_floats) >= final_from) {
        const size_t begin = bucket_begin(next_end, bucket_floats);
        reducer->submit(g + begin, next_end - begin);
        next_end = begin;
      }
    };
    try {
      st.backward(0, nullptr, dloss, [&](size_t first, size_t end) {
        if (end != ready_from) return;  // not the tail: waits for the flush below
        ready_from = first;
        ship(ready_from);
      });
      ship(0);
    } catch (...) {
      reducer->cancel();
      throw;
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
      const auto t_compute = clock::now();
      model::Stage& st = *stage_ptrs[0];
      for (int mb = 0; mb < n_micro; ++mb) {
        check_abort(abort);
        data.get_rows(s, B, T, first_row(mb), first_row(mb) + micro_batch, tokens.data(), targets.data());
        set_where("step " + std::to_string(s) + ": forward micro-batch " + std::to_string(mb));
        loss_sum += st.forward(0, tokens.data(), nullptr, targets.data(), micro_batch, T);
        check_abort(abort);
        set_where("step " + std::to_string(s) + ": backward micro-batch " + std::to_string(mb));
        // Earlier micro-batches only accumulate: no bucket is final before the last one.
        if (reducer && mb == n_micro - 1)
          backward_overlapped(st, dloss);
        else
          st.backward(0, nullptr, dloss);
      }
      const auto t_backward_end = clock::now();
      r.compute_ms = std::chrono::duration<double, std::milli>(t_backward_end - t_compute).count();
      if (reducer) {
        const auto t_wait = clock::now();
        set_where("step " + std::to_string(s) + ": data-parallel allreduce of the remaining buckets");
        for (const auto& [b0, b1] : reducer->wait())
          r.overlap_ms += std::max(
              0.0, std::chrono::duration<double, std::milli>(std::min(b1, t_backward_end) - b0).count());
        r.comm_ms += std::chrono::duration<double, std::milli>(clock::now() - t_wait).count();
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
    if (!reducer) reduce_data_parallel();
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

  // This rank's part of the state at a step boundary, copied out of the live tensors so
  // training may go on while it is written.
  struct Snapshot {
    std::string root;
    int64_t step = 0;
    std::string file;
    std::vector<std::string> names;
    std::vector<Shape> shapes;
    std::vector<std::vector<float>> buffers;
    safetensors::Metadata meta;
    std::string manifest_json;
  };
  std::thread writer;
  std::exception_ptr writer_error;
  std::string last_committed;

  ~Impl() {
    if (writer.joinable()) writer.join();
  }

  // Replicas of a tensor share its bytes out instead of writing them twice: a split tensor
  // is replicated over the data-parallel group, a whole one over data and tensor groups.
  std::pair<int, int> replica_of(const model::Param& p) const {
    if (p.split_dim >= 0) return {coord().d, asg.dp};
    return {coord().d * asg.tp + coord().t, asg.dp * asg.tp};
  }

  std::string manifest_json() const {
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
    return checkpoint::to_json(m).dump();
  }

  Snapshot snapshot(const std::string& root) const {
    Snapshot s;
    s.root = std::filesystem::absolute(root).lexically_normal().string();
    s.step = next_step;
    s.file = shard_file(asg.rank);
    // The tied LM head of the last stage is a copy of the first stage's wte.
    std::vector<const float*> tied_copies;
    for (auto* st : stage_ptrs)
      for (const auto& p : st->params())
        if (p.name == "wte.weight" && asg.pp > 1 && !st->range().has_embedding)
          tied_copies.push_back(p.data.f32());
    nlohmann::json slices = nlohmann::json::object();
    for (size_t i = 0; i < params.size(); ++i) {
      const model::Param& p = *params[i];
      if (std::find(tied_copies.begin(), tied_copies.end(), p.data.f32()) != tied_copies.end()) continue;
      const auto [index, count] = replica_of(p);
      const checkpoint::Spread part = checkpoint::spread(held_slice(p), index, count);
      if (part.end <= part.begin) continue;
      const Shape shape = checkpoint::local_shape(part.stored);
      int64_t n = 1;
      for (auto d : shape) n *= d;
      const float* sources[3] = {p.data.f32(), opt->m(i).data(), opt->v(i).data()};
      const char* prefixes[3] = {"", "optim.m.", "optim.v."};
      for (int k = 0; k < 3; ++k) {
        s.names.push_back(prefixes[k] + p.name);
        s.shapes.push_back(shape);
        s.buffers.emplace_back(size_t(n));
        checkpoint::copy_block(sources[k], p.data.shape(), part.dim, part.begin, part.end,
                               s.buffers.back().data());
      }
      slices[p.name] = checkpoint::slice_json(part.stored);
    }
    s.meta = {
        {"format", "troupe"},
        {"step", std::to_string(next_step)},
        {"rank", std::to_string(asg.rank)},
        {"layout", std::to_string(asg.dp) + "x" + std::to_string(asg.pp) + "x" + std::to_string(asg.tp)},
        {"slices", slices.dump()}};
    s.manifest_json = manifest_json();
    return s;
  }

  // Writes the snapshot (fsynced), reports it and returns the committed directory. With
  // one rank and no committer the engine commits by itself.
  std::string write_snapshot(const Snapshot& s) {
    const std::string tmp = checkpoint::prepare(s.root, s.step);
    const std::string path = tmp + "/" + s.file;
    std::vector<safetensors::WriteEntry> entries;
    for (size_t k = 0; k < s.names.size(); ++k)
      entries.push_back({s.names[k], DType::f32, s.shapes[k], s.buffers[k].data()});
    safetensors::WriteOptions wo;
    wo.fsync = true;
    uint64_t size = 0;
    try {
      size = safetensors::write(path, entries, s.meta, wo);
    } catch (const IoError& e) {
      if (e.code() != ENOSPC && e.code() != EDQUOT) throw;
      // The partial file is gone (safetensors::write); so is step_N.tmp once no rank has a file in it.
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      throw checkpoint::DiskFullError(std::string(e.what()) + " (checkpoint of step " +
                                      std::to_string(s.step) +
                                      "; the partial file was removed, earlier checkpoints are intact): free "
                                      "space under " +
                                      s.root + " or set checkpoint.dir elsewhere");
    }
    checkpoint::fault_point("write", s.step, asg.rank, asg.generation, path);
    checkpoint::ShardReport rep;
    rep.root = s.root;
    rep.step = s.step;
    rep.rank = asg.rank;
    rep.world = asg.world;
    rep.keep = spec.checkpoint.keep;
    rep.manifest_json = s.manifest_json;
    rep.files.push_back({s.file, size, checkpoint::file_xxh64(path)});
    if (asg.commit_shard) return asg.commit_shard(rep);
    checkpoint::CommitTracker one;
    if (asg.world == 1) {
      auto ready = one.add("self", rep);
      return checkpoint::commit(ready->root, ready->manifest, ready->keep);
    }
    // No committer: the ranks meet at barriers (save() keeps this path synchronous) and
    // rank 0 commits what every rank wrote.
    world->barrier(copt);
    const std::string dir = s.root + "/" + checkpoint::step_dir_name(s.step);
    if (asg.rank == 0) {
      std::optional<checkpoint::ReadyCommit> ready;
      for (int r = 0; r < asg.world; ++r) {
        checkpoint::ShardReport other = rep;
        other.rank = r;
        const std::string f = tmp + "/" + shard_file(r);
        other.files = {{shard_file(r), std::filesystem::file_size(f), checkpoint::file_xxh64(f)}};
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
    set_where("checkpoint step " + std::to_string(next_step) + ": waiting for the previous write");
    wait_writer();
    set_where("checkpoint step " + std::to_string(next_step) + ": copying to host memory");
    auto snap = std::make_shared<Snapshot>(snapshot(root));
    const std::string dir = root + "/" + checkpoint::step_dir_name(next_step);
    if (spec.checkpoint.async && (asg.commit_shard || asg.world == 1)) {
      writer = std::thread([this, snap] {
        try {
          last_committed = write_snapshot(*snap);
        } catch (...) {
          writer_error = std::current_exception();
        }
      });
    } else {
      set_where("checkpoint step " + std::to_string(next_step) + ": writing");
      last_committed = write_snapshot(*snap);
    }
    set_where("idle after checkpoint");
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
std::string Engine::save_checkpoint(const std::string& dir) { return impl_->save(dir); }
std::string Engine::wait_checkpoint() { return impl_->wait_writer(); }
int64_t Engine::num_params() const {
  int64_t n = 0;
  for (auto* st : impl_->stage_ptrs) n += st->num_params();
  return n;
}
std::string Engine::where() const { return impl_->current_where(); }

}  // namespace troupe

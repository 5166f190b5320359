// One optimizer step of the rank: the micro-batches (through the pipeline schedule when there
// is one), the data-parallel reduction of the gradients, the loss, fp16's loss scale, the
// gradient norm and clipping, AdamW, and the timings and trace spans of each part.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>

#include "core/caching_allocator.hpp"
#include "model/tensor_parallel.hpp"
#include "worker/device.hpp"
#include "worker/engine_impl.hpp"

namespace troupe {

StepReport Engine::Impl::step(const std::atomic<bool>& abort) {
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
    r.compute_ms = std::chrono::duration<double, std::milli>(t_backward_end - t_compute).count() - waited_ms;
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
      data.get_rows(s, B, T, first_row(mb), first_row(mb) + plan.micro_batch, tokens.data(), targets.data());
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
    open(sp, "comm", [&] { return std::string(zero == 2 ? "reduce-scatter" : "allreduce") + " gradients"; });
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
  take_memory_snapshot();
  if (buddy) {
    r.snapshot_confirmed = buddy->confirmed();
  } else if (dp_group && zero == 0 && memory_snapshots() && asg.snapshots) {
    // Replicated, without buddies: each replica holds the same state in its own snapshot.
    const std::vector<int64_t> held = asg.snapshots->held();
    if (!held.empty()) r.snapshot_confirmed = held.front();
  }
  set_where("idle after step " + std::to_string(s));
  return r;
}

// The products' 16-bit copy of the master weights, after they changed.
void Engine::Impl::refresh_compute() {
  for (auto* st : stage_ptrs) st->store().refresh_compute();
}

// Sums the gradients over the data-parallel group, bucket by bucket, after the backward
// (ZeRO 2: each rank receives the sum of its parts only).
void Engine::Impl::reduce_data_parallel() {
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
    parallel::reduce_buckets(*dp_group, flat.f32(), size_t(flat.numel()), bucket_floats, copt, [&](size_t k) {
      set_where("step " + std::to_string(next_step) + ": data-parallel allreduce of bucket " +
                std::to_string(k));
    });
  }
}

// A scalar reduced over the world as over its groups in turn: the tensor, the pipeline and the
// data groups partition the grid, so after all three every rank holds the reduction over every
// rank (a gloo world connects no pair: Impl::connect). NCCL's world is connected (its
// bootstrap is no mesh): one reduction there instead of three.
void Engine::Impl::grid_allreduce(double* v, comm::ReduceOp op) {
  if (world && nccl(*world)) return scalar_allreduce(*world, v, op);
  for (comm::Communicator* g : grid_groups())
    if (g) scalar_allreduce(*g, v, op);
}

// Sum of a scalar over the world (loss sums, squared norms).
double Engine::Impl::world_sum(double v) {
  grid_allreduce(&v, comm::ReduceOp::sum);
  return v;
}

// Squared global gradient norm: each tensor group sums its shards (replicated
// parameters once); the tied embedding counts once (its copy on the last stage,
// Param::tied_copy, is left out); data replicas hold the same gradients after the
// reduction, so one replica counts.
double Engine::Impl::grad_norm_squared() {
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
double Engine::Impl::zero_grad_sum_squares() const {
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

// fp16: whether any rank's gradients hold an inf or NaN, as one all-reduce of a flag.
bool Engine::Impl::world_found_inf() {
  double flag = parallel::grads_finite(stage_ptrs) ? 0.0 : 1.0;
  grid_allreduce(&flag, comm::ReduceOp::max);
  return flag > 0.0;
}

// The part of each reduced bucket's time that ran before `until` (the end of the backward
// it overlapped); in a trace, each bucket on the reducer's track.
void Engine::Impl::collect_overlap(const std::vector<parallel::BucketReducer::Span>& spans,
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

}  // namespace troupe

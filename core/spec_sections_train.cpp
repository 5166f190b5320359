// The train section (with train.optimizer and train.trace): steps, batch, schedule of the
// learning rate, precision, recompute, ZeRO, evaluation, and the rules between them.
#include <algorithm>
#include <cstdint>
#include <string>

#include "core/spec_sections.hpp"

namespace troupe::spec_detail {

namespace {

// ---- train.optimizer

const Table& optimizer_table() {
  static const Table t{{
      {"type", [](S& s, K& k, JobSpec& j) { s.choice(k, j.train.optimizer.type, {"adamw"}); }},
      {"lr",
       [](S& s, K& k, JobSpec& j) {
         s.real(k, j.train.optimizer.lr, 0.0, false, 10.0, true,
                "a learning rate > 0; AdamW typically uses 1e-4 to 3e-3");
       }},
      {"beta1",
       [](S& s, K& k, JobSpec& j) {
         s.real(k, j.train.optimizer.beta1, 0.0, true, 1.0, false,
                "beta1 is in [0, 1); PyTorch's default is 0.9");
       }},
      {"beta2",
       [](S& s, K& k, JobSpec& j) {
         s.real(k, j.train.optimizer.beta2, 0.0, true, 1.0, false,
                "beta2 is in [0, 1); GPT training uses 0.95, PyTorch 0.999");
       }},
      {"betas",
       [](S& s, K& k, JobSpec& j) {
         OptimizerSpec& o = j.train.optimizer;
         s.real_pair(k, o.beta1, o.beta2, 0.0, 1.0, {"beta1", "beta2"},
                     "betas is [beta1, beta2], each in [0, 1); GPT training uses [0.9, 0.95], PyTorch "
                     "[0.9, 0.999]");
         if (s.has(k) && (s.has("beta1") || s.has("beta2"))) {
           const std::string both = s.has("beta1") && s.has("beta2") ? "'beta1' and 'beta2'"
                                    : s.has("beta1")                 ? "'beta1'"
                                                                     : "'beta2'";
           Ctx& ctx = s.ctx();
           ctx.error(
               ctx.loc("train.optimizer.betas"),
               "'train.optimizer.betas' is given together with " + both +
                   ": both spellings set the same values",
               "keep one spelling: delete betas, or delete " + both + " and write betas: [beta1, beta2]");
           ctx.mark_bad("train.optimizer.betas");
         }
       }},
      {"eps",
       [](S& s, K& k, JobSpec& j) {
         s.real(k, j.train.optimizer.eps, 0.0, false, 1.0, true, "eps is > 0; the usual value is 1e-8");
       }},
      {"weight_decay",
       [](S& s, K& k, JobSpec& j) {
         s.real(k, j.train.optimizer.weight_decay, 0.0, true, 1e9, true,
                "weight_decay is >= 0, e.g. 0.1 (0 = off)");
       }},
  }};
  return t;
}

const Table& trace_table() {
  static const Table t{{
      {"from_step",
       [](S& s, K& k, JobSpec& j) {
         s.integer(k, j.train.trace.from_step, 0, kI64Max, false,
                   "from_step is the first traced step, 0-based as in metrics.jsonl");
       }},
      {"steps",
       [](S& s, K& k, JobSpec& j) {
         s.integer(k, j.train.trace.steps, 0, 1000, false,
                   "steps is how many steps to trace, 0 (off) to 1000");
       }},
  }};
  return t;
}

// ---- train

void train_rules(Section& s, JobSpec& j) {
  Ctx& ctx = s.ctx();
  const TrainSpec& t = j.train;
  const DataSpec& d = j.data;
  if (ctx.ok("train.steps") && ctx.ok("train.warmup_steps") && t.warmup_steps > t.steps)
    ctx.error(ctx.loc("train.warmup_steps"),
              "train.warmup_steps (" + std::to_string(t.warmup_steps) + ") is longer than train.steps (" +
                  std::to_string(t.steps) + ")",
              "warm-up is part of the run; use warmup_steps <= steps");
  if (ctx.ok("train.min_lr") && ctx.ok("train.optimizer.lr") && t.min_lr > t.optimizer.lr)
    ctx.error(ctx.loc("train.min_lr"),
              "train.min_lr (" + fmt_real(t.min_lr) + ") is above train.optimizer.lr (" +
                  fmt_real(t.optimizer.lr) + ")",
              "the schedule decays from lr down to min_lr; e.g. min_lr: " + short_real(t.optimizer.lr / 10));
  if (ctx.ok("train.steps") && ctx.ok("train.trace.from_step") && ctx.ok("train.trace.steps") &&
      t.trace.steps > 0 && t.trace.from_step > t.steps - t.trace.steps)
    ctx.error(ctx.loc("train.trace.from_step"),
              "the trace of steps [" + std::to_string(t.trace.from_step) + ", " +
                  std::to_string(t.trace.from_step + t.trace.steps) + ") ends after train.steps (" +
                  std::to_string(t.steps) + ")",
              "steps are 0-based: trace within [0, " + std::to_string(t.steps) +
                  "), e.g. from_step: " + std::to_string(std::max<int64_t>(0, t.steps - t.trace.steps)));
  if (ctx.ok("train.global_batch") && ctx.ok("train.micro_batch") && t.micro_batch > t.global_batch)
    ctx.error(ctx.loc("train.micro_batch"),
              "train.micro_batch (" + std::to_string(t.micro_batch) +
                  ") is larger than train.global_batch (" + std::to_string(t.global_batch) + ")",
              "a micro-batch is a slice of the global batch; use micro_batch <= global_batch");
  if (ctx.ok("train.eval_every") && t.eval_every > 0 && ctx.ok("data.val_fraction") &&
      ctx.ok("data.source") && d.val_fraction == 0 &&
      (d.source == DataSource::text || (d.source == DataSource::tokens && d.val_path.empty())))
    ctx.error(ctx.loc("train.eval_every"), "train.eval_every is set but data.val_fraction is 0",
              "evaluation reads the held-out split; set data.val_fraction (e.g. 0.05) or eval_every: 0");
}

}  // namespace

const Table& train_table() {
  static const Table t{
      {
          {"steps",
           [](S& s, K& k, JobSpec& j) {
             s.integer(k, j.train.steps, 1, kI64Max, true, "train.steps must be 1 or more");
           }},
          {"global_batch",
           [](S& s, K& k, JobSpec& j) { s.integer(k, j.train.global_batch, 1, 1 << 24, true); }},
          // A positive integer or auto (0, left to the planner); absent means global_batch / data,
          // filled in by parallel's rules once the data degree is known.
          {"micro_batch", [](S& s, K& k, JobSpec& j) { s.degree(k, j.train.micro_batch, 1 << 24); }},
          {"optimizer", nullptr, &optimizer_table()},
          {"trace", nullptr, &trace_table()},
          {"lr_schedule", [](S& s, K& k, JobSpec& j) { s.enumeration(k, j.train.lr_schedule); }},
          {"warmup_steps", [](S& s, K& k, JobSpec& j) { s.integer(k, j.train.warmup_steps, 0, kI64Max); }},
          {"min_lr",
           [](S& s, K& k, JobSpec& j) {
             s.real(k, j.train.min_lr, 0.0, true, 10.0, true,
                    "min_lr is >= 0 and at most the optimizer's lr");
           }},
          {"grad_clip",
           [](S& s, K& k, JobSpec& j) {
             s.real(k, j.train.grad_clip, 0.0, true, 1e12, true,
                    "grad_clip is a max L2 norm >= 0 (0 = off), e.g. 1.0");
           }},
          {"precision", [](S& s, K& k, JobSpec& j) { s.enumeration(k, j.train.precision); }},
          {"recompute",
           [](S& s, K& k, JobSpec& j) {
             if (s.scalar_is(k, "block"))  // the older spelling of full
               j.train.recompute = Recompute::full;
             else
               s.enumeration(k, j.train.recompute);
           }},
          {"offload", [](S& s, K& k, JobSpec& j) { s.enumeration(k, j.train.offload); }},
          {"zero",
           [](S& s, K& k, JobSpec& j) {
             s.integer(k, j.train.zero, 0, 3, false,
                       "zero is 0 (replicated optimizer), 1 (sharded AdamW state), 2 (also sharded "
                       "gradients) or 3 (also sharded parameters)");
           }},
          {"seed", [](S& s, K& k, JobSpec& j) { s.seed(k, j.train.seed); }},
          {"eval_every",
           [](S& s, K& k, JobSpec& j) {
             s.integer(k, j.train.eval_every, 0, kI64Max, false,
                       "eval_every is 0 (off) or a step interval >= 1");
           }},
          {"eval_batches", [](S& s, K& k, JobSpec& j) { s.integer(k, j.train.eval_batches, 1, 1 << 20); }},
          {"log_every", [](S& s, K& k, JobSpec& j) { s.integer(k, j.train.log_every, 1, kI64Max); }},
      },
      train_rules};
  return t;
}

}  // namespace troupe::spec_detail

// The parallel section: the data, pipeline and tensor degrees (or auto), the schedule, and the
// rules that tie them to the model's shape and the batch.
#include <algorithm>
#include <cstdint>
#include <string>

#include "core/spec_sections.hpp"

namespace troupe::spec_detail {

namespace {

void parallel_rules(Section& s, JobSpec& j) {
  Ctx& ctx = s.ctx();
  const ModelSpec& m = j.model;
  TrainSpec& t = j.train;
  const ParallelSpec& p = j.parallel;

  const bool tp_ok = ctx.ok("parallel.tensor") && p.tensor > 0;
  if (tp_ok && has_heads(ctx, m) && ctx.ok("model.n_heads") && m.n_heads > 0 && m.n_heads % p.tensor != 0)
    ctx.error(
        ctx.loc("parallel.tensor"),
        "model.n_heads (" + std::to_string(m.n_heads) + ") is not divisible by parallel.tensor (" +
            std::to_string(p.tensor) + ")",
        "tensor parallelism splits attention by heads; e.g. tensor: " + nearby_divisors(m.n_heads, p.tensor));
  if (tp_ok && is_llama(ctx, m)) {
    // Shards split key/value heads too (no replication), the SwiGLU hidden units and the vocabulary.
    auto divides = [&](const char* key, int64_t n, const std::string& why) {
      if (ctx.ok(key) && n > 0 && n % p.tensor != 0)
        ctx.error(ctx.loc("parallel.tensor"),
                  std::string(key) + " (" + std::to_string(n) + ") is not divisible by parallel.tensor (" +
                      std::to_string(p.tensor) + ")",
                  why + "; e.g. tensor: " + nearby_divisors(n, p.tensor));
    };
    divides("model.n_kv_heads", m.n_kv_heads, "each tensor shard holds whole key/value heads");
    divides("model.ffn_hidden", m.ffn_hidden, "tensor parallelism splits the SwiGLU hidden units");
    divides(
        "model.vocab_size", m.vocab_size,
        "the embedding and the LM head are split by vocabulary rows (each shard holds vocab_size / tensor)");
  }
  if (tp_ok && ctx.ok("model.d_model") && m.d_model > 0 && m.d_model % p.tensor != 0)
    ctx.error(
        ctx.loc("parallel.tensor"),
        "model.d_model (" + std::to_string(m.d_model) + ") is not divisible by parallel.tensor (" +
            std::to_string(p.tensor) + ")",
        "tensor parallelism splits the model's width; e.g. tensor: " + nearby_divisors(m.d_model, p.tensor));
  if (tp_ok && ctx.ok("model.type") && m.type == ModelType::gpt && ctx.ok("model.ffn_hidden") &&
      m.ffn_hidden > 0 && m.ffn_hidden % p.tensor != 0)
    ctx.error(ctx.loc("parallel.tensor"),
              "model.ffn_hidden (" + std::to_string(m.ffn_hidden) +
                  ") is not divisible by parallel.tensor (" + std::to_string(p.tensor) + ")",
              "tensor parallelism splits the MLP's hidden units; e.g. tensor: " +
                  nearby_divisors(m.ffn_hidden, p.tensor));

  // micro_batch as read: written as a number (> 0), written as auto (0), or not written.
  const bool dp_ok = ctx.ok("parallel.data") && p.data > 0;
  const bool micro_given = ctx.present("train.micro_batch");
  if (dp_ok && ctx.ok("train.global_batch") && ctx.ok("train.micro_batch") && t.global_batch > 0) {
    if (micro_given && t.micro_batch > 0) {
      int64_t per_step = int64_t(p.data) * t.micro_batch;
      if (t.global_batch % per_step != 0)
        ctx.error(
            ctx.loc("train.micro_batch"),
            "train.global_batch (" + std::to_string(t.global_batch) +
                ") is not divisible by parallel.data x train.micro_batch (" + std::to_string(p.data) + " x " +
                std::to_string(t.micro_batch) + " = " + std::to_string(per_step) + ")",
            "each data-parallel rank runs a whole number of micro-batches per step; e.g. micro_batch: " +
                nearby_divisors(t.global_batch / std::max(1, p.data), t.micro_batch));
    } else if (!micro_given) {
      if (t.global_batch % p.data != 0)
        ctx.error(ctx.loc("train.global_batch"),
                  "train.global_batch (" + std::to_string(t.global_batch) +
                      ") is not divisible by parallel.data (" + std::to_string(p.data) + ")",
                  "every data-parallel rank takes an equal share; use a global_batch that is a multiple of " +
                      std::to_string(p.data));
      else
        t.micro_batch = t.global_batch / p.data;
    }
  }

  const bool vs_ok = ctx.ok("parallel.virtual_stages");
  const bool sched_ok = ctx.ok("parallel.schedule");
  const bool pp_ok = ctx.ok("parallel.pipeline") && p.pipeline > 0;
  if (sched_ok && vs_ok && p.schedule == Schedule::interleaved && p.virtual_stages == 1)
    ctx.error(
        ctx.loc("parallel.schedule"), "schedule interleaved needs parallel.virtual_stages of 2 or more",
        "set parallel.virtual_stages: 2 (model chunks per pipeline rank) or auto, or use schedule: 1f1b");
  if (sched_ok && pp_ok && p.schedule == Schedule::interleaved && p.pipeline < 2)
    ctx.error(ctx.loc("parallel.schedule"), "schedule interleaved needs parallel.pipeline of 2 or more",
              "interleaving spreads model chunks over pipeline ranks; set pipeline: 2 or use schedule: 1f1b");
  if (sched_ok && pp_ok && p.pipeline > 1 && p.schedule == Schedule::zb_h1 && ctx.ok("train.recompute") &&
      t.recompute == Recompute::full)
    ctx.error(ctx.loc("parallel.schedule"),
              "schedule zb-h1 runs each weight gradient after its input gradient, from every block's saved "
              "activations: train.recompute " +
                  std::string(to_string(t.recompute)) + " does not keep them",
              "use train.recompute: none or selective with zb-h1, or schedule: 1f1b with recompute: full");
  if (ctx.ok("train.offload") && ctx.ok("train.zero") && t.offload == Offload::optimizer && t.zero > 0)
    ctx.error(ctx.loc("train.offload"),
              "train.offload: optimizer keeps the whole optimizer in host memory: it does not shard it, as "
              "train.zero " +
                  std::to_string(t.zero) + " asks",
              "use zero: 0 with offload: optimizer, or offload: none");
  if (sched_ok && vs_ok && p.schedule != Schedule::interleaved && p.virtual_stages != 1)
    ctx.error(ctx.loc("parallel.virtual_stages"),
              "parallel.virtual_stages " +
                  (p.virtual_stages == 0 ? std::string("auto") : std::to_string(p.virtual_stages)) +
                  " needs schedule interleaved",
              "set parallel.schedule: interleaved, or virtual_stages: 1");
  if (ctx.ok("parallel.sequence_parallel") && p.sequence_parallel && ctx.ok("parallel.tensor") &&
      p.tensor == 1)
    ctx.error(ctx.loc("parallel.sequence_parallel"),
              "parallel.sequence_parallel splits by sequence what the tensor group replicates: it needs "
              "parallel.tensor above 1",
              "set parallel.tensor: 2 or more (or auto), or sequence_parallel: false");
  if (pp_ok && vs_ok && p.virtual_stages > 0 && ctx.ok("model.n_layers") && m.n_layers > 0) {
    const int64_t chunks = int64_t(p.pipeline) * p.virtual_stages;
    if (m.n_layers < chunks)
      ctx.error(ctx.loc("parallel.pipeline"),
                "model.n_layers (" + std::to_string(m.n_layers) + ") is fewer than the " +
                    std::to_string(chunks) + " pipeline stages (pipeline x virtual_stages = " +
                    std::to_string(p.pipeline) + " x " + std::to_string(p.virtual_stages) + ")",
                "every stage needs at least one layer; lower parallel.pipeline or raise model.n_layers");
  }
}

}  // namespace

const Table& parallel_table() {
  static const Table t{
      {
          {"data", [](S& s, K& k, JobSpec& j) { s.degree(k, j.parallel.data, kMaxDataParallel); }},
          {"pipeline",
           [](S& s, K& k, JobSpec& j) { s.degree(k, j.parallel.pipeline, kMaxPipelineParallel); }},
          {"tensor", [](S& s, K& k, JobSpec& j) { s.degree(k, j.parallel.tensor, kMaxTensorParallel); }},
          {"schedule", [](S& s, K& k, JobSpec& j) { s.enumeration(k, j.parallel.schedule); }},
          // A positive integer, or auto (0) for the planner to choose under the interleaved schedule.
          {"virtual_stages", [](S& s, K& k, JobSpec& j) { s.degree(k, j.parallel.virtual_stages, 1024); }},
          {"sequence_parallel", [](S& s, K& k, JobSpec& j) { s.boolean(k, j.parallel.sequence_parallel); }},
      },
      parallel_rules};
  return t;
}

}  // namespace troupe::spec_detail

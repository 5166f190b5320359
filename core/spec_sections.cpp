// The spec's sections as tables: each key once, with the getter that reads and checks it, then the
// section's rules. The tables are the schema: the keys they declare are the keys a section accepts
// and the ones did-you-mean suggests (schema() in spec_validate.cpp walks them), so a key added
// here is both read and known. docs/job-spec.md describes the same keys for users.
//
// Rules run after their section's fields and may read earlier sections (parallel's rules check
// the model's width and the train batch), which is why the root table lists sections in the order
// they depend on each other.
#include <algorithm>
#include <cstdint>
#include <limits>

#include "core/layout.hpp"
#include "core/spec_internal.hpp"

namespace troupe::spec_detail {

namespace {

constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();

// Divisors of n nearest to `near`, to suggest a value that satisfies a divisibility rule.
std::string nearby_divisors(int64_t n, int64_t near, int64_t min = 1) {
  std::vector<int64_t> ds;
  for (int64_t d = 1; d * d <= n && d < 1000000; ++d)
    if (n % d == 0) {
      if (d >= min) ds.push_back(d);
      if (n / d >= min) ds.push_back(n / d);
    }
  if (ds.empty())
    return "none: no divisor of " + std::to_string(n) + " is " + std::to_string(min) + " or more";
  std::sort(ds.begin(), ds.end());
  ds.erase(std::unique(ds.begin(), ds.end()), ds.end());
  std::sort(ds.begin(), ds.end(), [&](int64_t a, int64_t b) {
    return std::llabs(a - near) < std::llabs(b - near) ||
           (std::llabs(a - near) == std::llabs(b - near) && a < b);
  });
  if (ds.size() > 3) ds.resize(3);
  std::sort(ds.begin(), ds.end());
  std::string s;
  for (size_t i = 0; i < ds.size(); ++i)
    s += (i ? (i + 1 == ds.size() ? " or " : ", ") : "") + std::to_string(ds[i]);
  return s;
}

bool valid_name(const std::string& s) {
  if (s.empty() || s.size() > 64 || s[0] == '.' || s[0] == '-') return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_' || c == '.';
  });
}

bool is_gpt(Ctx& ctx, const ModelSpec& m) { return ctx.ok("model.type") && m.type == ModelType::gpt; }
bool is_llama(Ctx& ctx, const ModelSpec& m) { return ctx.ok("model.type") && m.type == ModelType::llama; }
// Models with attention heads: gpt and llama.
bool has_heads(Ctx& ctx, const ModelSpec& m) { return is_gpt(ctx, m) || is_llama(ctx, m); }

// A key only a llama reads: `read` reads it for a llama; on other model types it is refused
// with a hint.
template <class Read>
void llama_key(Section& s, const std::string& key, JobSpec& j, Read read) {
  if (is_llama(s.ctx(), j.model))
    read();
  else if (s.has(key))
    s.refuse(key, "'model." + key + "' applies only to model.type llama",
             std::string("delete it, or set model.type: llama") +
                 (j.model.type == ModelType::gpt && key == "tie_embeddings" ? " (gpt always ties its LM head)"
                                                                            : ""));
}

// Each reader below has this shape: `s` is the section, `k` the key the table declares for it.
using S = Section;
using K = const std::string;

// ---- model

void model_rules(Section& s, JobSpec& j) {
  Ctx& ctx = s.ctx();
  ModelSpec& m = j.model;
  const bool heads_ok = has_heads(ctx, m) && ctx.ok("model.n_heads") && m.n_heads > 0;
  if (heads_ok && ctx.ok("model.d_model") && m.d_model % m.n_heads != 0)
    ctx.error(
        ctx.loc("model.n_heads"),
        "model.d_model (" + std::to_string(m.d_model) + ") is not divisible by model.n_heads (" +
            std::to_string(m.n_heads) + ")",
        "each head gets d_model / n_heads channels; e.g. n_heads: " + nearby_divisors(m.d_model, m.n_heads));
  if (ctx.ok("model.type") && m.type == ModelType::gpt && ctx.ok("model.d_model") &&
      ctx.ok("model.ffn_hidden") && m.ffn_hidden == 0 && m.d_model > 0)
    m.ffn_hidden = 4 * m.d_model;  // GPT-2's MLP
  if (!is_llama(ctx, m)) {
    const RopeScalingSpec& r = m.rope_scaling;
    const bool read = !r.type.empty() || r.factor != 0 || r.low_freq_factor != 0 || r.high_freq_factor != 0 ||
                      r.original_max_position_embeddings != 0;
    if (s.has("rope_scaling") && read && ctx.ok("model.type"))
      s.refuse("rope_scaling", "'model.rope_scaling' applies only to model.type llama",
               "delete it, or set model.type: llama");
    m.rope_scaling = RopeScalingSpec{};
    return;
  }
  if (heads_ok && ctx.ok("model.n_kv_heads")) {
    if (m.n_kv_heads == 0) m.n_kv_heads = m.n_heads;
    if (m.n_heads % m.n_kv_heads != 0)
      ctx.error(ctx.loc(ctx.present("model.n_kv_heads") ? "model.n_kv_heads" : "model.n_heads"),
                "model.n_heads (" + std::to_string(m.n_heads) + ") is not divisible by model.n_kv_heads (" +
                    std::to_string(m.n_kv_heads) + ")",
                "grouped-query attention shares each key/value head among n_heads / n_kv_heads query heads; "
                "e.g. n_kv_heads: " +
                    nearby_divisors(m.n_heads, m.n_kv_heads));
  }
  if (heads_ok && ctx.ok("model.d_model") && m.d_model % m.n_heads == 0 && (m.d_model / m.n_heads) % 2 != 0)
    ctx.error(ctx.loc("model.n_heads"),
              "the head size d_model / n_heads (" + std::to_string(m.d_model / m.n_heads) + ") is odd",
              "rotary embeddings rotate channel pairs; choose n_heads so that d_model / n_heads is even");
  if (ctx.ok("model.d_model") && ctx.ok("model.ffn_hidden") && m.ffn_hidden == 0 && m.d_model > 0)
    m.ffn_hidden = static_cast<int>((int64_t{8} * m.d_model / 3 + 63) / 64 * 64);
}

// ---- model.rope_scaling

void rope_scaling_rules(Section& s, JobSpec& j) {
  Ctx& ctx = s.ctx();
  RopeScalingSpec& r = j.model.rope_scaling;
  static const char* const kKeys[] = {"type", "factor", "low_freq_factor", "high_freq_factor",
                                      "original_max_position_embeddings"};
  bool written = false;
  for (const char* k : kKeys) written = written || s.has(k);
  if (!written) {  // absent, or written empty: no scaling
    r = RopeScalingSpec{};
    return;
  }
  for (const char* k : kKeys)
    if (!s.has(k))
      s.missing(k,
                std::string("'") + k +
                    ": <value>' (a llama3 rope_scaling has all five keys, as in Hugging Face's config.json; "
                    "Llama 3.2: {type: llama3, factor: 32, low_freq_factor: 1, high_freq_factor: 4, "
                    "original_max_position_embeddings: 8192})");
  if (ctx.ok("model.rope_scaling.low_freq_factor") && ctx.ok("model.rope_scaling.high_freq_factor") &&
      s.has("low_freq_factor") && s.has("high_freq_factor") && r.high_freq_factor <= r.low_freq_factor)
    ctx.error(
        ctx.loc("model.rope_scaling.high_freq_factor"),
        "model.rope_scaling.high_freq_factor (" + fmt_real(r.high_freq_factor) +
            ") is not above low_freq_factor (" + fmt_real(r.low_freq_factor) + ")",
        "the frequencies between the two are blended; Llama 3 uses low_freq_factor: 1, high_freq_factor: 4");
}

const Table& rope_scaling_table() {
  static const Table t{
      {
          {"type", [](S& s, K& k, JobSpec& j) { s.choice(k, j.model.rope_scaling.type, {"llama3"}); }},
          {"factor",
           [](S& s, K& k, JobSpec& j) {
             s.real(k, j.model.rope_scaling.factor, 1.0, true, 1e6, true,
                    "how many times the context is stretched, >= 1; Llama 3.1 uses 8, Llama 3.2 32");
           }},
          {"low_freq_factor",
           [](S& s, K& k, JobSpec& j) {
             s.real(k, j.model.rope_scaling.low_freq_factor, 0.0, false, 1e6, true, "> 0; Llama 3 uses 1");
           }},
          {"high_freq_factor",
           [](S& s, K& k, JobSpec& j) {
             s.real(k, j.model.rope_scaling.high_freq_factor, 0.0, false, 1e6, true,
                    "above low_freq_factor; Llama 3 uses 4");
           }},
          {"original_max_position_embeddings",
           [](S& s, K& k, JobSpec& j) {
             s.integer(k, j.model.rope_scaling.original_max_position_embeddings, 1, 1 << 24, false,
                       "the context the model was first trained with; Llama 3 uses 8192");
           }},
      },
      rope_scaling_rules};
  return t;
}

const Table& model_table() {
  static const Table t{
      {
          {"type", [](S& s, K& k, JobSpec& j) { s.enumeration(k, j.model.type, true); }},
          {"vocab_size", [](S& s, K& k, JobSpec& j) { s.integer(k, j.model.vocab_size, 2, 1 << 24); }},
          {"seq_len", [](S& s, K& k, JobSpec& j) { s.integer(k, j.model.seq_len, 1, 1 << 20, true); }},
          {"d_model", [](S& s, K& k, JobSpec& j) { s.integer(k, j.model.d_model, 1, 1 << 16, true); }},
          {"n_layers", [](S& s, K& k, JobSpec& j) { s.integer(k, j.model.n_layers, 1, 4096, true); }},
          {"n_heads",
           [](S& s, K& k, JobSpec& j) {
             if (s.ctx().ok("model.type") && j.model.type == ModelType::mlp) {
               if (s.has(k))
                 s.refuse(k, "'model.n_heads' applies only to model.type gpt or llama",
                          "delete it (an MLP has no attention heads), or set model.type: gpt");
             } else {
               s.integer(k, j.model.n_heads, 1, 1 << 16, has_heads(s.ctx(), j.model));
             }
           }},
          {"n_kv_heads",
           [](S& s, K& k, JobSpec& j) {
             llama_key(s, k, j, [&] { s.integer(k, j.model.n_kv_heads, 1, 1 << 16); });
           }},
          {"ffn_hidden",
           [](S& s, K& k, JobSpec& j) {
             if (s.ctx().ok("model.type") && j.model.type == ModelType::mlp) {
               if (s.has(k))
                 s.refuse(k, "'model.ffn_hidden' applies only to model.type gpt or llama",
                          "delete it (the MLP model's hidden width is 4 d_model), or set model.type: gpt");
             } else {
               s.integer(k, j.model.ffn_hidden, 1, 1 << 20);
             }
           }},
          {"norm_eps",
           [](S& s, K& k, JobSpec& j) {
             llama_key(s, k, j, [&] {
               s.real(k, j.model.norm_eps, 0.0, false, 1.0, false, "RMSNorm's epsilon, in (0, 1); e.g. 1e-5");
             });
           }},
          {"rope_theta",
           [](S& s, K& k, JobSpec& j) {
             llama_key(s, k, j, [&] {
               s.real(k, j.model.rope_theta, 1.0, false, 1e9, true,
                      "the rotary base, above 1; Llama 2 uses 10000, Llama 3 500000");
             });
           }},
          {"rope_scaling", nullptr, &rope_scaling_table()},
          {"tie_embeddings",
           [](S& s, K& k, JobSpec& j) { llama_key(s, k, j, [&] { s.boolean(k, j.model.tie_embeddings); }); }},
          {"init_from", [](S& s, K& k, JobSpec& j) { s.string(k, j.model.init_from); }},
      },
      model_rules};
  return t;
}

// ---- data

// Whether `k`, a key of token data, is to be read: yes for data.source tokens; for another source
// a written key is refused at its position, so that a stray key is noticed.
bool tokens_key(S& s, K& k, const JobSpec& j) {
  if (!s.ctx().ok("data.source")) return false;
  if (j.data.source == DataSource::tokens) return true;
  if (s.has(k))
    s.refuse(k, "'data." + k + "' applies only to data.source tokens",
             "delete it, or set data.source: tokens (token files; see docs/training.md#token-data)");
  return false;
}

void data_rules(Section& s, JobSpec& j) {
  Ctx& ctx = s.ctx();
  DataSpec& d = j.data;
  if (!ctx.ok("data") || !ctx.ok("data.source")) return;
  const int vocab = j.model.vocab_size;
  if (d.source != DataSource::tokens && ctx.ok("model.vocab_size") && vocab != 256)
    ctx.error(ctx.loc("model.vocab_size"),
              "model.vocab_size is " + std::to_string(vocab) + " but data.source " + to_string(d.source) +
                  " is bytes: byte-level text has 256 ids",
              "set model.vocab_size: 256 or use data.source: tokens");
  if (d.source != DataSource::tokens) return;
  if (d.eot >= 0 && ctx.ok("data.eot") && ctx.ok("model.vocab_size") && d.eot >= vocab)
    ctx.error(ctx.loc("data.eot"),
              "data.eot (" + std::to_string(d.eot) + ") is not below model.vocab_size (" +
                  std::to_string(vocab) + ")",
              "the end-of-text id is a token id, in [0, model.vocab_size); troupe's tokenizer uses 256");
  if (!d.val_path.empty() && ctx.ok("data.val_path")) {
    // The split is val_path's files; the tail of the training tokens is not held out.
    if (ctx.present("data.val_fraction") && ctx.ok("data.val_fraction") && d.val_fraction != 0) {
      ctx.error(ctx.loc("data.val_fraction"),
                "data.val_path and data.val_fraction (" + fmt_real(d.val_fraction) +
                    ") both choose the validation split",
                "delete val_fraction (the files of val_path are the validation split), or delete val_path "
                "to hold out the last val_fraction of the training tokens");
      ctx.mark_bad("data.val_fraction");
    } else {
      d.val_fraction = 0;
    }
  }
}

const Table& data_table() {
  static const Table t{
      {
          {"source", [](S& s, K& k, JobSpec& j) { s.enumeration(k, j.data.source); }},
          {"path",
           [](S& s, K& k, JobSpec& j) {
             Ctx& ctx = s.ctx();
             if (!ctx.ok("data") || !ctx.ok("data.source")) return;
             if (j.data.source != DataSource::synthetic) {
               if (ctx.present("data")) s.string(k, j.data.path, true, false);
             } else if (s.has(k)) {
               s.refuse(k, "'data.path' is read only when data.source is text or tokens",
                        "delete it, or set data.source: text");
             }
           }},
          {"val_fraction",
           [](S& s, K& k, JobSpec& j) {
             s.real(k, j.data.val_fraction, 0.0, true, 1.0, false,
                    "the share of the data held out for evaluation, in [0, 1); e.g. 0.05");
           }},
          {"dtype",
           [](S& s, K& k, JobSpec& j) {
             if (!tokens_key(s, k, j) || !s.has(k)) return;
             TokenDType v = TokenDType::uint16;
             s.enumeration(k, v);
             if (s.ctx().ok("data.dtype")) j.data.dtype = v;
           }},
          {"val_path",
           [](S& s, K& k, JobSpec& j) {
             if (tokens_key(s, k, j)) s.string(k, j.data.val_path);
           }},
          {"eot",
           [](S& s, K& k, JobSpec& j) {
             if (tokens_key(s, k, j))
               s.integer(k, j.data.eot, 0, (1 << 24) - 1, false,
                         "the end-of-text token id, in [0, model.vocab_size); troupe's tokenizer uses 256");
           }},
          {"tokenizer",
           [](S& s, K& k, JobSpec& j) {
             if (tokens_key(s, k, j)) s.string(k, j.data.tokenizer);
           }},
      },
      data_rules};
  return t;
}

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

// ---- parallel

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

// ---- resources, checkpoint, fault

const Table& resources_table() {
  static const Table t{{
      {"device", [](S& s, K& k, JobSpec& j) { s.enumeration(k, j.resources.device); }},
      {"threads_per_worker",
       [](S& s, K& k, JobSpec& j) { s.integer(k, j.resources.threads_per_worker, 1, 1024); }},
      {"memory_per_device", [](S& s, K& k, JobSpec& j) { s.size(k, j.resources.memory_per_device); }},
      {"hardware", [](S& s, K& k, JobSpec& j) { s.hardware_name(k, j.resources.hardware); }},
  }};
  return t;
}

const Table& checkpoint_table() {
  static const Table t{{
      {"dir", [](S& s, K& k, JobSpec& j) { s.string(k, j.checkpoint.dir); }},
      {"every",
       [](S& s, K& k, JobSpec& j) {
         s.integer(k, j.checkpoint.every, 0, kI64Max, false,
                   "checkpoint.every is 0 (off) or a step interval >= 1");
       }},
      {"keep",
       [](S& s, K& k, JobSpec& j) {
         s.integer(k, j.checkpoint.keep, 1, 1 << 20, false,
                   "checkpoint.keep is how many checkpoints to keep, 1 or more");
       }},
      {"async", [](S& s, K& k, JobSpec& j) { s.boolean(k, j.checkpoint.async); }},
  }};
  return t;
}

const Table& fault_table() {
  static const Table t{{
      {"max_restarts", [](S& s, K& k, JobSpec& j) { s.integer(k, j.fault.max_restarts, 0, 1 << 20); }},
      {"heartbeat", [](S& s, K& k, JobSpec& j) { s.duration(k, j.fault.heartbeat, false); }},
      {"step_timeout", [](S& s, K& k, JobSpec& j) { s.duration(k, j.fault.step_timeout, true); }},
  }};
  return t;
}

// ---- elastic

void elastic_rules(Section& s, JobSpec& j) {
  Ctx& ctx = s.ctx();
  const ElasticSpec& e = j.elastic;
  const ParallelSpec& p = j.parallel;
  const bool min_ok = ctx.ok("elastic.min_devices") && e.min_devices > 0;
  const bool max_ok = ctx.ok("elastic.max_devices") && e.max_devices > 0;
  if (min_ok && max_ok && e.min_devices > e.max_devices)
    ctx.error(ctx.loc("elastic.min_devices"),
              "elastic.min_devices (" + std::to_string(e.min_devices) + ") is above elastic.max_devices (" +
                  std::to_string(e.max_devices) + ")",
              "min_devices <= max_devices");
  if (!ctx.ok("parallel.data") || !ctx.ok("parallel.pipeline") || !ctx.ok("parallel.tensor")) return;
  auto n = layout_devices(p);
  if (!n) return;
  const std::string layout = layout_of(p).str();
  if (min_ok && *n < e.min_devices)
    ctx.error(ctx.loc("elastic.min_devices"),
              "the layout " + layout + " uses " + std::to_string(*n) +
                  " devices, fewer than elastic.min_devices (" + std::to_string(e.min_devices) + ")",
              "data x pipeline x tensor must lie within [min_devices, max_devices]");
  if (max_ok && *n > e.max_devices)
    ctx.error(ctx.loc("elastic.max_devices"),
              "the layout " + layout + " uses " + std::to_string(*n) +
                  " devices, more than elastic.max_devices (" + std::to_string(e.max_devices) + ")",
              "data x pipeline x tensor must lie within [min_devices, max_devices]");
}

const Table& elastic_table() {
  static const Table t{
      {
          {"min_devices",
           [](S& s, K& k, JobSpec& j) {
             s.integer(k, j.elastic.min_devices, 0, 1 << 20, false, "0 (the planned layout's size) or more");
           }},
          {"max_devices",
           [](S& s, K& k, JobSpec& j) {
             s.integer(k, j.elastic.max_devices, 0, 1 << 20, false, "0 (the planned layout's size) or more");
           }},
      },
      elastic_rules};
  return t;
}

// ---- the document

void read_name(Section& s, const std::string& k, JobSpec& j) {
  s.string(k, j.name, true);
  Ctx& ctx = s.ctx();
  if (ctx.present("name") && ctx.ok("name") && !valid_name(j.name))
    ctx.error(ctx.loc("name"), "job name '" + shown(j.name) + "' is not a valid name",
              "use 1-64 letters, digits, '-', '_' or '.', not starting with '-' or '.'; it names the run "
              "directory");
}

constexpr bool kRequired = true;

}  // namespace

const Table& spec_table() {
  static const Table t{{
      {"name", read_name},
      {"model", nullptr, &model_table(), kRequired},
      {"data", nullptr, &data_table(), kRequired},
      {"train", nullptr, &train_table(), kRequired},
      {"parallel", nullptr, &parallel_table()},
      {"resources", nullptr, &resources_table()},
      {"checkpoint", nullptr, &checkpoint_table()},
      {"fault", nullptr, &fault_table()},
      {"elastic", nullptr, &elastic_table()},
  }};
  return t;
}

}  // namespace troupe::spec_detail

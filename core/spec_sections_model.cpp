// The model section (and model.rope_scaling): the model's shape, the keys only a llama reads,
// and the rules that tie them (heads divide the width, grouped-query heads, the hidden width).
#include <cstdint>
#include <string>

#include "core/spec_sections.hpp"

namespace troupe::spec_detail {

namespace {

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

}  // namespace

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

}  // namespace troupe::spec_detail

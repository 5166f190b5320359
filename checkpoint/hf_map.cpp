// The Hugging Face layout of each model as data: one table of tensors per model, the
// config.json each is described by, and the in-memory mapping between the namings.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <tuple>

#include "checkpoint/hf.hpp"

namespace troupe::checkpoint::hf {

namespace {

// A dimension of a tensor in the table, in terms of ModelDims.
enum class Sym { none, V, T, D, Q, KV, QKV, F, F2 };

// Which rows of the troupe tensor a Hugging Face tensor holds.
enum class Part { all, q, k, v, gate, up };

struct Rule {
  const char* troupe;  // "{L}" stands for the layer index
  const char* hf;
  Sym rows, cols;  // the troupe tensor's shape; cols none: 1-D
  Part part = Part::all;
  bool transpose = false;    // Hugging Face stores the part as (cols, rows)
  bool untied_only = false;  // absent when the LM head is the embedding
};

// GPT2LMHeadModel. Conv1D weights are (in, out); the LM head is wte (not in the file).
const Rule kGpt[] = {
    {"wte.weight", "transformer.wte.weight", Sym::V, Sym::D},
    {"wpe.weight", "transformer.wpe.weight", Sym::T, Sym::D},
    {"h.{L}.ln_1.weight", "transformer.h.{L}.ln_1.weight", Sym::D, Sym::none},
    {"h.{L}.ln_1.bias", "transformer.h.{L}.ln_1.bias", Sym::D, Sym::none},
    {"h.{L}.attn.c_attn.weight", "transformer.h.{L}.attn.c_attn.weight", Sym::QKV, Sym::D, Part::all, true},
    {"h.{L}.attn.c_attn.bias", "transformer.h.{L}.attn.c_attn.bias", Sym::QKV, Sym::none},
    {"h.{L}.attn.c_proj.weight", "transformer.h.{L}.attn.c_proj.weight", Sym::D, Sym::Q, Part::all, true},
    {"h.{L}.attn.c_proj.bias", "transformer.h.{L}.attn.c_proj.bias", Sym::D, Sym::none},
    {"h.{L}.ln_2.weight", "transformer.h.{L}.ln_2.weight", Sym::D, Sym::none},
    {"h.{L}.ln_2.bias", "transformer.h.{L}.ln_2.bias", Sym::D, Sym::none},
    {"h.{L}.mlp.c_fc.weight", "transformer.h.{L}.mlp.c_fc.weight", Sym::F, Sym::D, Part::all, true},
    {"h.{L}.mlp.c_fc.bias", "transformer.h.{L}.mlp.c_fc.bias", Sym::F, Sym::none},
    {"h.{L}.mlp.c_proj.weight", "transformer.h.{L}.mlp.c_proj.weight", Sym::D, Sym::F, Part::all, true},
    {"h.{L}.mlp.c_proj.bias", "transformer.h.{L}.mlp.c_proj.bias", Sym::D, Sym::none},
    {"ln_f.weight", "transformer.ln_f.weight", Sym::D, Sym::none},
    {"ln_f.bias", "transformer.ln_f.bias", Sym::D, Sym::none},
};

// LlamaForCausalLM. nn.Linear weights are (out, in) like troupe's; no biases.
const Rule kLlama[] = {
    {"wte.weight", "model.embed_tokens.weight", Sym::V, Sym::D},
    {"h.{L}.ln_1.weight", "model.layers.{L}.input_layernorm.weight", Sym::D, Sym::none},
    {"h.{L}.attn.c_attn.weight", "model.layers.{L}.self_attn.q_proj.weight", Sym::QKV, Sym::D, Part::q},
    {"h.{L}.attn.c_attn.weight", "model.layers.{L}.self_attn.k_proj.weight", Sym::QKV, Sym::D, Part::k},
    {"h.{L}.attn.c_attn.weight", "model.layers.{L}.self_attn.v_proj.weight", Sym::QKV, Sym::D, Part::v},
    {"h.{L}.attn.c_proj.weight", "model.layers.{L}.self_attn.o_proj.weight", Sym::D, Sym::Q},
    {"h.{L}.ln_2.weight", "model.layers.{L}.post_attention_layernorm.weight", Sym::D, Sym::none},
    {"h.{L}.mlp.c_fc.weight", "model.layers.{L}.mlp.gate_proj.weight", Sym::F2, Sym::D, Part::gate},
    {"h.{L}.mlp.c_fc.weight", "model.layers.{L}.mlp.up_proj.weight", Sym::F2, Sym::D, Part::up},
    {"h.{L}.mlp.c_proj.weight", "model.layers.{L}.mlp.down_proj.weight", Sym::D, Sym::F},
    {"ln_f.weight", "model.norm.weight", Sym::D, Sym::none},
    {"lm_head.weight", "lm_head.weight", Sym::V, Sym::D, Part::all, false, true},
};

int64_t size_of(Sym s, const ModelDims& d) {
  const int64_t hs = d.head_dim();
  switch (s) {
    case Sym::none:
      return 1;
    case Sym::V:
      return d.vocab_size;
    case Sym::T:
      return d.seq_len;
    case Sym::D:
      return d.d_model;
    case Sym::Q:
      return d.n_heads * hs;
    case Sym::KV:
      return d.n_kv_heads * hs;
    case Sym::QKV:
      return (d.n_heads + 2 * int64_t{d.n_kv_heads}) * hs;
    case Sym::F:
      return d.ffn_hidden;
    case Sym::F2:
      return 2 * int64_t{d.ffn_hidden};
  }
  return 0;
}

// Rows [begin, begin + count) of the troupe tensor that a part holds.
std::pair<int64_t, int64_t> part_rows(Part p, int64_t all_rows, const ModelDims& d) {
  const int64_t q = size_of(Sym::Q, d), kv = size_of(Sym::KV, d), f = d.ffn_hidden;
  switch (p) {
    case Part::all:
      return {0, all_rows};
    case Part::q:
      return {0, q};
    case Part::k:
      return {q, kv};
    case Part::v:
      return {q + kv, kv};
    case Part::gate:
      return {0, f};
    case Part::up:
      return {f, f};
  }
  return {0, 0};
}

std::string with_layer(const char* pattern, int layer) {
  std::string s = pattern;
  const size_t at = s.find("{L}");
  if (at != std::string::npos) s.replace(at, 3, std::to_string(layer));
  return s;
}

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

// config.json's rope_scaling: null, or Llama 3.1's object.
nlohmann::json rope_scaling_json(const RopeScalingSpec& r) {
  if (r.type.empty()) return nullptr;
  return {{"rope_type", r.type},
          {"factor", r.factor},
          {"low_freq_factor", r.low_freq_factor},
          {"high_freq_factor", r.high_freq_factor},
          {"original_max_position_embeddings", r.original_max_position_embeddings}};
}

}  // namespace

ModelDims dims_of(const JobSpec& spec) {
  const ModelSpec& m = spec.model;
  ModelDims d;
  d.vocab_size = m.vocab_size;
  d.seq_len = m.seq_len;
  d.max_positions = m.seq_len;
  d.d_model = m.d_model;
  d.n_layers = m.n_layers;
  d.n_heads = m.n_heads;
  switch (m.type) {
    case ModelType::gpt:
      d.type = "gpt";
      d.n_kv_heads = m.n_heads;
      d.ffn_hidden = m.ffn_hidden > 0 ? m.ffn_hidden : 4 * m.d_model;
      d.norm_eps = 1e-5;  // kernels/cpu/layernorm.cpp kEps
      d.tie_embeddings = true;
      return d;
    case ModelType::llama:
      d.type = "llama";
      d.n_kv_heads = m.n_kv_heads > 0 ? m.n_kv_heads : m.n_heads;
      d.ffn_hidden = m.ffn_hidden;
      d.norm_eps = m.norm_eps;
      d.rope_theta = m.rope_theta;
      d.rope_scaling = m.rope_scaling;
      d.tie_embeddings = m.tie_embeddings;
      return d;
    default:
      throw CheckpointError(std::string("model.type ") + to_string(m.type) +
                            " has no Hugging Face layout (gpt and llama have one)");
  }
}

std::vector<TensorMap> tensor_map(const ModelDims& d) {
  const Rule* begin = nullptr;
  size_t n = 0;
  if (d.type == "gpt") {
    begin = kGpt;
    n = std::size(kGpt);
  } else if (d.type == "llama") {
    begin = kLlama;
    n = std::size(kLlama);
  } else {
    throw CheckpointError("model.type " + d.type + " has no Hugging Face layout (gpt and llama have one)");
  }
  std::vector<TensorMap> out;
  auto add = [&](const Rule& r, int layer) {
    TensorMap m;
    m.troupe_name = with_layer(r.troupe, layer);
    m.hf_name = with_layer(r.hf, layer);
    const int64_t rows = size_of(r.rows, d), cols = size_of(r.cols, d);
    m.troupe_shape = r.cols == Sym::none ? Shape{rows} : Shape{rows, cols};
    std::tie(m.row_begin, m.rows) = part_rows(r.part, rows, d);
    m.transpose = r.transpose;
    if (r.cols == Sym::none)
      m.hf_shape = {m.rows};
    else if (r.transpose)
      m.hf_shape = {cols, m.rows};
    else
      m.hf_shape = {r.rows == Sym::T ? std::max<int64_t>(d.max_positions, m.rows) : m.rows, cols};
    out.push_back(std::move(m));
  };
  // Table order; the per-layer rules (contiguous in each table) expand in place, layer by
  // layer, so that a block's tensors stay together: the order of a forward.
  bool layers_done = false;
  for (size_t i = 0; i < n; ++i) {
    const Rule& r = begin[i];
    if (r.untied_only && d.tie_embeddings) continue;
    if (std::strstr(r.troupe, "{L}") == nullptr) {
      add(r, 0);
    } else if (!layers_done) {
      layers_done = true;
      for (int layer = 0; layer < d.n_layers; ++layer)
        for (size_t j = i; j < n && std::strstr(begin[j].troupe, "{L}") != nullptr; ++j) add(begin[j], layer);
    }
  }
  return out;
}

nlohmann::json config_json(const ModelDims& d, DType dtype) {
  const char* torch_dtype = dtype == DType::bf16 ? "bfloat16" : dtype == DType::f16 ? "float16" : "float32";
  if (d.type == "gpt")
    return {
        {"architectures", nlohmann::json::array({"GPT2LMHeadModel"})},
        {"model_type", "gpt2"},
        {"vocab_size", d.vocab_size},
        {"n_embd", d.d_model},
        {"n_layer", d.n_layers},
        {"n_head", d.n_heads},
        {"n_positions", d.seq_len},
        {"n_ctx", d.seq_len},
        {"n_inner", d.ffn_hidden == 4 * int64_t{d.d_model} ? nlohmann::json() : nlohmann::json(d.ffn_hidden)},
        {"activation_function", "gelu_new"},  // kernels/cpu/gelu.cpp: the tanh approximation
        {"layer_norm_epsilon", d.norm_eps},
        {"tie_word_embeddings", true},
        {"scale_attn_weights", true},
        {"scale_attn_by_inverse_layer_idx", false},
        {"reorder_and_upcast_attn", false},
        {"resid_pdrop", 0.0},
        {"embd_pdrop", 0.0},
        {"attn_pdrop", 0.0},
        {"initializer_range", 0.02},
        {"use_cache", true},
        {"torch_dtype", torch_dtype}};
  if (d.type == "llama")
    return {{"architectures", nlohmann::json::array({"LlamaForCausalLM"})},
            {"model_type", "llama"},
            {"vocab_size", d.vocab_size},
            {"hidden_size", d.d_model},
            {"intermediate_size", d.ffn_hidden},
            {"num_hidden_layers", d.n_layers},
            {"num_attention_heads", d.n_heads},
            {"num_key_value_heads", d.n_kv_heads},
            {"head_dim", d.head_dim()},
            {"hidden_act", "silu"},
            {"max_position_embeddings", d.seq_len},
            {"rms_norm_eps", d.norm_eps},
            {"rope_theta", d.rope_theta},
            {"rope_scaling", rope_scaling_json(d.rope_scaling)},
            {"tie_word_embeddings", d.tie_embeddings},
            {"attention_bias", false},
            {"attention_dropout", 0.0},
            {"mlp_bias", false},
            {"pretraining_tp", 1},
            {"initializer_range", 0.02},
            {"use_cache", true},
            {"torch_dtype", torch_dtype}};
  throw CheckpointError("model.type " + d.type + " has no Hugging Face layout (gpt and llama have one)");
}

namespace {

// Reads config keys without letting a json exception escape; collects every disagreement.
// A key that is absent or null takes Hugging Face's default for it.
struct ConfigCheck {
  const nlohmann::json& cfg;
  std::vector<std::string> bad;

  const nlohmann::json* get(const char* key) const {
    auto it = cfg.find(key);
    return it == cfg.end() || it->is_null() ? nullptr : &*it;
  }
  void fail(const char* key, const std::string& why) { bad.push_back(std::string(key) + " " + why); }

  int64_t integer(const char* key, int64_t dflt) {
    const nlohmann::json* v = get(key);
    if (v == nullptr) return dflt;
    if (!v->is_number_integer()) {
      fail(key, "is " + v->dump() + ", not an integer");
      return dflt;
    }
    // 2^64 - 1 is an integer too, and no int64_t: said as read, not wrapped to -1.
    if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX)) {
      fail(key, "is " + v->dump() + ", out of range");
      return dflt;
    }
    return v->get<int64_t>();
  }
  double number(const char* key, double dflt) {
    const nlohmann::json* v = get(key);
    if (v == nullptr) return dflt;
    if (!v->is_number()) {
      fail(key, "is " + v->dump() + ", not a number");
      return dflt;
    }
    return v->get<double>();
  }
  bool boolean(const char* key, bool dflt) {
    const nlohmann::json* v = get(key);
    if (v == nullptr) return dflt;
    if (!v->is_boolean()) {
      fail(key, "is " + v->dump() + ", not true or false");
      return dflt;
    }
    return v->get<bool>();
  }
  std::string string(const char* key, const std::string& dflt) {
    const nlohmann::json* v = get(key);
    if (v == nullptr) return dflt;
    if (!v->is_string()) {
      fail(key, "is " + v->dump() + ", not a string");
      return dflt;
    }
    return v->get<std::string>();
  }

  void same(const char* key, int64_t dflt, int64_t want, const char* spec_key) {
    const size_t failures = bad.size();
    const int64_t v = integer(key, dflt);
    if (bad.size() == failures && v != want)
      fail(key, "is " + std::to_string(v) + ", the job's " + spec_key + " is " + std::to_string(want));
  }
  void same_eps(const char* key, double dflt, double want, const std::string& what) {
    const double v = number(key, dflt);
    if (!(std::fabs(v - want) <= 1e-9 * std::fabs(want)))
      fail(key, "is " + num(v) + ", " + what + " " + num(want));
  }
  void same_bool(const char* key, bool dflt, bool want, const std::string& what) {
    const bool v = boolean(key, dflt);
    if (v != want) fail(key, std::string("is ") + (v ? "true" : "false") + ", " + what);
  }
  int positions(const char* key, int64_t dflt, int seq_len) {
    const int64_t v = integer(key, dflt);
    if (v < seq_len)
      fail(key,
           "is " + std::to_string(v) + ", shorter than the job's model.seq_len " + std::to_string(seq_len));
    return int(std::max<int64_t>(v, seq_len));
  }
};

// rope_scaling: null when the job's model has none, else rope_type (or the older key type)
// "llama3" and the four numbers of the job's model.rope_scaling.
void check_rope_scaling(ConfigCheck& c, const RopeScalingSpec& want) {
  const nlohmann::json* rs = c.get("rope_scaling");
  const std::string spec_hint =
      "model.rope_scaling: {type: llama3, factor: F, low_freq_factor: L, high_freq_factor: H, "
      "original_max_position_embeddings: N} with the config's values";
  if (rs == nullptr) {
    if (!want.type.empty())
      c.fail("rope_scaling",
             "is null, the job's model.rope_scaling is " + want.type + " (delete it from the spec)");
    return;
  }
  if (!rs->is_object()) return c.fail("rope_scaling", "is " + rs->dump() + ", not an object or null");
  std::string type;
  for (const char* key : {"rope_type", "type"}) {
    auto it = rs->find(key);
    if (it != rs->end() && it->is_string()) type = it->get<std::string>();
  }
  if (type != "llama3")
    return c.fail("rope_scaling",
                  "has rope_type \"" + type + "\": troupe's llama supports \"llama3\" scaling (or none)");
  for (auto it = rs->begin(); it != rs->end(); ++it) {
    const std::string& k = it.key();
    if (k != "rope_type" && k != "type" && k != "factor" && k != "low_freq_factor" &&
        k != "high_freq_factor" && k != "original_max_position_embeddings")
      c.fail("rope_scaling", "has the key \"" + k + "\", which llama3 scaling does not read (not guessed)");
  }
  if (want.type.empty())
    return c.fail("rope_scaling", "is llama3, the job's model has no rope_scaling: add " + spec_hint);
  auto number = [&](const char* key, double spec_value) {
    auto it = rs->find(key);
    if (it == rs->end() || !it->is_number())
      return c.fail("rope_scaling", std::string("has no number \"") + key + "\"");
    const double v = it->get<double>();
    if (!(std::fabs(v - spec_value) <= 1e-9 * std::fabs(spec_value)))
      c.fail("rope_scaling", std::string(key) + " is " + num(v) + ", the job's model.rope_scaling." + key +
                                 " is " + num(spec_value));
  };
  number("factor", want.factor);
  number("low_freq_factor", want.low_freq_factor);
  number("high_freq_factor", want.high_freq_factor);
  number("original_max_position_embeddings", want.original_max_position_embeddings);
}

}  // namespace

ModelDims check_config(const nlohmann::json& config, const ModelDims& spec, const std::string& where) {
  if (!config.is_object()) throw CheckpointError(where + ": not a JSON object");
  ConfigCheck c{config, {}};
  ModelDims d = spec;
  const std::string model_type = c.string("model_type", "");
  const char* want_type = spec.type == "gpt" ? "gpt2" : spec.type == "llama" ? "llama" : "";
  if (model_type != want_type)
    c.fail("model_type",
           "is \"" + model_type + "\", the job's model.type " + spec.type + " is \"" + want_type + "\"");
  else if (spec.type == "gpt") {
    // Hugging Face's GPT2Config defaults for absent keys.
    c.same("vocab_size", 50257, spec.vocab_size, "model.vocab_size");
    c.same("n_embd", 768, spec.d_model, "model.d_model");
    c.same("n_layer", 12, spec.n_layers, "model.n_layers");
    c.same("n_head", 12, spec.n_heads, "model.n_heads");
    d.max_positions = c.positions("n_positions", 1024, spec.seq_len);
    const int64_t inner = c.integer("n_inner", 4 * int64_t{spec.d_model});
    if (inner != spec.ffn_hidden)
      c.fail("n_inner", "is " + std::to_string(inner) + ", the spec's model.ffn_hidden is " +
                            std::to_string(spec.ffn_hidden));
    const std::string act = c.string("activation_function", "gelu_new");
    if (act != "gelu_new" && act != "gelu_pytorch_tanh")
      c.fail("activation_function",
             "is \"" + act + "\", troupe's gpt computes \"gelu_new\" (GELU, tanh approximation)");
    c.same_eps("layer_norm_epsilon", 1e-5, spec.norm_eps, "troupe's gpt LayerNorm uses");
    c.same_bool("tie_word_embeddings", true, true, "troupe's gpt ties the LM head to wte");
    c.same_bool("scale_attn_weights", true, true, "troupe's gpt scales attention by 1/sqrt(head size)");
    c.same_bool("scale_attn_by_inverse_layer_idx", false, false, "troupe's gpt does not scale by layer");
  } else {
    // Hugging Face's LlamaConfig defaults for absent keys.
    c.same("vocab_size", 32000, spec.vocab_size, "model.vocab_size");
    c.same("hidden_size", 4096, spec.d_model, "model.d_model");
    c.same("intermediate_size", 11008, spec.ffn_hidden, "model.ffn_hidden");
    c.same("num_hidden_layers", 32, spec.n_layers, "model.n_layers");
    const int64_t heads = c.integer("num_attention_heads", 32);
    c.same("num_attention_heads", 32, spec.n_heads, "model.n_heads");
    c.same("num_key_value_heads", heads, spec.n_kv_heads, "model.n_kv_heads");
    c.same("head_dim", spec.head_dim(), spec.head_dim(), "head size model.d_model / model.n_heads");
    d.max_positions = c.positions("max_position_embeddings", 2048, spec.seq_len);
    c.same_eps("rms_norm_eps", 1e-6, spec.norm_eps, "the job's model.norm_eps is");
    c.same_eps("rope_theta", 10000.0, spec.rope_theta, "the job's model.rope_theta is");
    c.same_bool("tie_word_embeddings", false, spec.tie_embeddings,
                std::string("the job's model.tie_embeddings is ") + (spec.tie_embeddings ? "true" : "false"));
    const std::string act = c.string("hidden_act", "silu");
    if (act != "silu") c.fail("hidden_act", "is \"" + act + "\", troupe's llama MLP computes \"silu\"");
    c.same_bool("attention_bias", false, false, "troupe's llama has no biases");
    c.same_bool("mlp_bias", false, false, "troupe's llama has no biases");
    check_rope_scaling(c, spec.rope_scaling);
  }
  if (!c.bad.empty()) {
    std::string why = where + ": the Hugging Face config does not describe the job's model:";
    for (const auto& b : c.bad) why += "\n  " + b;
    throw CheckpointError(why);
  }
  return d;
}

namespace {

// Rows [r0, r0 + n) of a row-major (R, C) tensor, transposed or not, into dst.
void take_part(const float* src, int64_t C, int64_t r0, int64_t n, bool transpose, float* dst) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < C; ++c) dst[transpose ? c * n + r : r * C + c] = src[(r0 + r) * C + c];
}

int64_t cols_of(const Shape& s) { return s.size() > 1 ? s[1] : 1; }

void require_tensor(const std::map<std::string, Tensor>& m, const std::string& name, const Shape& shape) {
  auto it = m.find(name);
  if (it == m.end()) throw CheckpointError("tensor " + name + " is missing");
  if (it->second.shape() != shape)
    throw CheckpointError("tensor " + name + " has shape " + shape_str(it->second.shape()) +
                          ", the model's is " + shape_str(shape));
}

}  // namespace

std::map<std::string, Tensor> to_hf(const ModelDims& d, const std::map<std::string, Tensor>& troupe) {
  std::map<std::string, Tensor> out;
  for (const TensorMap& m : tensor_map(d)) {
    require_tensor(troupe, m.troupe_name, m.troupe_shape);
    Tensor t = Tensor::zeros(m.hf_shape, DType::f32);  // a longer position table: zeros beyond
    take_part(troupe.at(m.troupe_name).f32(), cols_of(m.troupe_shape), m.row_begin, m.rows, m.transpose,
              t.f32());
    out[m.hf_name] = std::move(t);
  }
  return out;
}

std::map<std::string, Tensor> from_hf(const ModelDims& d, const std::map<std::string, Tensor>& hf) {
  std::map<std::string, Tensor> out;
  for (const TensorMap& m : tensor_map(d)) {
    require_tensor(hf, m.hf_name, m.hf_shape);
    auto it = out.find(m.troupe_name);
    if (it == out.end()) it = out.emplace(m.troupe_name, Tensor::zeros(m.troupe_shape, DType::f32)).first;
    const float* src = hf.at(m.hf_name).f32();
    float* dst = it->second.f32();
    const int64_t C = cols_of(m.troupe_shape);
    for (int64_t r = 0; r < m.rows; ++r)
      for (int64_t c = 0; c < C; ++c)
        dst[(m.row_begin + r) * C + c] = src[m.transpose ? c * m.rows + r : r * C + c];
  }
  return out;
}

}  // namespace troupe::checkpoint::hf

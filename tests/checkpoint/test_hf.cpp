// Hugging Face layout: the name/shape mapping of gpt and llama both ways (row splits,
// transposes), slice reads of every kind from a Hugging Face directory, config.json checks,
// and a trained GPT exported and read back by init_from under another layout, bit for bit.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/hf.hpp"
#include "core/dtype_convert.hpp"
#include "core/safetensors.hpp"
#include "core/spec.hpp"
#include "tests/support/local_ranks.hpp"
#include "tests/support/support.hpp"

namespace fs = std::filesystem;
using namespace troupe;
namespace hf = troupe::checkpoint::hf;
using TensorMapByName = std::map<std::string, Tensor>;

namespace {

hf::ModelDims gpt_dims() {
  hf::ModelDims d;
  d.type = "gpt";
  d.vocab_size = 40;
  d.seq_len = d.max_positions = 12;
  d.d_model = 16;
  d.n_layers = 2;
  d.n_heads = d.n_kv_heads = 4;
  d.ffn_hidden = 64;
  return d;
}

// NH=4, NKV=2, HS=8, F=24: c_attn (64, 32) = q (32) | k (16) | v (16), c_fc (48, 32) = gate | up.
hf::ModelDims llama_dims(bool tie = false) {
  hf::ModelDims d;
  d.type = "llama";
  d.vocab_size = 50;
  d.seq_len = d.max_positions = 16;
  d.d_model = 32;
  d.n_layers = 2;
  d.n_heads = 4;
  d.n_kv_heads = 2;
  d.ffn_hidden = 24;
  d.norm_eps = 1e-6;
  d.rope_theta = 500000.0;
  d.tie_embeddings = tie;
  return d;
}

// A distinct value per (tensor, element): a mix-up of rows or a transpose shows.
Tensor filled(const Shape& shape, int salt) {
  Tensor t = Tensor::empty(shape, DType::f32);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = float(std::sin(0.37 * double(i) + 1.7 * salt)) + salt;
  return t;
}

// Every troupe tensor of the model, with distinct values.
TensorMapByName troupe_tensors(const hf::ModelDims& d) {
  TensorMapByName out;
  int salt = 0;
  for (const auto& m : hf::tensor_map(d))
    if (!out.count(m.troupe_name)) out.emplace(m.troupe_name, filled(m.troupe_shape, ++salt));
  return out;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

void write_safetensors(const std::string& path, const TensorMapByName& tensors) {
  std::vector<safetensors::WriteEntry> entries;
  for (const auto& kv : tensors) entries.push_back(safetensors::entry(kv.first, kv.second));
  safetensors::write(path, entries, {{"format", "pt"}});
}

// A Hugging Face directory of the model `d` holding `troupe`'s values.
std::string write_hf_dir(const std::string& dir, const hf::ModelDims& d, const TensorMapByName& troupe,
                         const nlohmann::json& config) {
  fs::create_directories(dir);
  std::ofstream(dir + "/config.json") << config.dump(2);
  write_safetensors(dir + "/model.safetensors", hf::to_hf(d, troupe));
  return dir;
}

// Rows [r0, r0 + n) and columns [c0, c0 + m) of a row-major (R, C) tensor.
std::vector<float> block(const Tensor& t, int64_t r0, int64_t n, int64_t c0, int64_t m) {
  const int64_t C = t.shape().size() > 1 ? t.shape()[1] : 1;
  std::vector<float> out;
  for (int64_t r = r0; r < r0 + n; ++r)
    for (int64_t c = c0; c < c0 + m; ++c) out.push_back(t.f32()[r * C + c]);
  return out;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("hf: gpt maps to GPT-2's names with Conv1D weights transposed, and back", "[checkpoint][hf]") {
  const hf::ModelDims d = gpt_dims();
  const TensorMapByName troupe = troupe_tensors(d);
  CHECK(troupe.size() == 2 * 12 + 4);
  const TensorMapByName out = hf::to_hf(d, troupe);
  CHECK(out.size() == troupe.size());  // no lm_head: tied to wte, as Hugging Face saves it
  CHECK(out.count("lm_head.weight") == 0);
  CHECK(out.at("transformer.wte.weight").shape() == Shape{40, 16});
  CHECK(out.at("transformer.wpe.weight").shape() == Shape{12, 16});
  CHECK(out.at("transformer.h.1.attn.c_attn.weight").shape() == Shape{16, 48});
  CHECK(out.at("transformer.h.1.attn.c_attn.bias").shape() == Shape{48});
  CHECK(out.at("transformer.h.0.mlp.c_fc.weight").shape() == Shape{16, 64});
  CHECK(out.at("transformer.h.0.mlp.c_proj.weight").shape() == Shape{64, 16});
  CHECK(out.at("transformer.ln_f.bias").shape() == Shape{16});
  // Conv1D (in, out): element (c, r) is troupe's (r, c).
  const Tensor& a = troupe.at("h.1.attn.c_attn.weight");
  const Tensor& b = out.at("transformer.h.1.attn.c_attn.weight");
  for (int64_t r : {0, 17, 47})
    for (int64_t c : {0, 5, 15}) CHECK(b.f32()[c * 48 + r] == a.f32()[r * 16 + c]);
  CHECK(same_bits(out.at("transformer.wte.weight"), troupe.at("wte.weight")));
  const TensorMapByName back = hf::from_hf(d, out);
  REQUIRE(back.size() == troupe.size());
  for (const auto& kv : troupe) {
    INFO(kv.first);
    CHECK(same_bits(back.at(kv.first), kv.second));
  }
}

TEST_CASE("hf: llama's fused q|k|v and gate|up rows split into Hugging Face's projections, and back",
          "[checkpoint][hf]") {
  const hf::ModelDims d = llama_dims();
  // A checkpoint-less safetensors of troupe names, read back as a model would be.
  const std::string dir = testing::temp_dir("hf_llama_map");
  write_safetensors(dir + "/troupe.safetensors", troupe_tensors(d));
  safetensors::Reader r(dir + "/troupe.safetensors");
  TensorMapByName troupe;
  for (const auto& n : r.names()) troupe.emplace(n, r.read(n));
  CHECK(troupe.at("h.0.attn.c_attn.weight").shape() == Shape{64, 32});
  CHECK(troupe.at("h.0.mlp.c_fc.weight").shape() == Shape{48, 32});
  CHECK(troupe.at("h.0.attn.c_proj.weight").shape() == Shape{32, 32});
  CHECK(troupe.at("h.0.mlp.c_proj.weight").shape() == Shape{32, 24});

  const TensorMapByName out = hf::to_hf(d, troupe);
  CHECK(out.size() == 3 + 2 * 9);  // embed, norm, lm_head; 9 per layer
  const std::string h = "model.layers.1.";
  const Tensor& qkv = troupe.at("h.1.attn.c_attn.weight");
  auto rows_of = [](const Tensor& t) { return block(t, 0, t.shape()[0], 0, t.shape()[1]); };
  CHECK(out.at(h + "self_attn.q_proj.weight").shape() == Shape{32, 32});
  CHECK(out.at(h + "self_attn.k_proj.weight").shape() == Shape{16, 32});
  CHECK(out.at(h + "self_attn.v_proj.weight").shape() == Shape{16, 32});
  CHECK(rows_of(out.at(h + "self_attn.q_proj.weight")) == block(qkv, 0, 32, 0, 32));
  CHECK(rows_of(out.at(h + "self_attn.k_proj.weight")) == block(qkv, 32, 16, 0, 32));
  CHECK(rows_of(out.at(h + "self_attn.v_proj.weight")) == block(qkv, 48, 16, 0, 32));
  const Tensor& fc = troupe.at("h.1.mlp.c_fc.weight");
  CHECK(rows_of(out.at(h + "mlp.gate_proj.weight")) == block(fc, 0, 24, 0, 32));
  CHECK(rows_of(out.at(h + "mlp.up_proj.weight")) == block(fc, 24, 24, 0, 32));
  CHECK(same_bits(out.at(h + "self_attn.o_proj.weight"), troupe.at("h.1.attn.c_proj.weight")));
  CHECK(same_bits(out.at(h + "mlp.down_proj.weight"), troupe.at("h.1.mlp.c_proj.weight")));
  CHECK(same_bits(out.at(h + "input_layernorm.weight"), troupe.at("h.1.ln_1.weight")));
  CHECK(same_bits(out.at(h + "post_attention_layernorm.weight"), troupe.at("h.1.ln_2.weight")));
  CHECK(same_bits(out.at("model.embed_tokens.weight"), troupe.at("wte.weight")));
  CHECK(same_bits(out.at("model.norm.weight"), troupe.at("ln_f.weight")));
  CHECK(same_bits(out.at("lm_head.weight"), troupe.at("lm_head.weight")));
  const TensorMapByName back = hf::from_hf(d, out);
  REQUIRE(back.size() == troupe.size());
  for (const auto& kv : troupe) {
    INFO(kv.first);
    CHECK(same_bits(back.at(kv.first), kv.second));
  }
  // Tied: no lm_head on either side.
  const hf::ModelDims tied = llama_dims(true);
  for (const auto& m : hf::tensor_map(tied)) CHECK(m.troupe_name != "lm_head.weight");
  TensorMapByName no_head = troupe;
  no_head.erase("lm_head.weight");
  CHECK(hf::to_hf(tied, no_head).count("lm_head.weight") == 0);
  // A missing or misshapen tensor is named.
  CHECK_THAT(error_of([&] { hf::to_hf(d, no_head); }), Catch::Contains("lm_head.weight is missing"));
  TensorMapByName wrong = troupe;
  wrong["h.0.mlp.c_fc.weight"] = filled({24, 32}, 1);
  CHECK_THAT(error_of([&] { hf::to_hf(d, wrong); }),
             Catch::Contains("h.0.mlp.c_fc.weight has shape [24, 32], the model's is [48, 32]"));
  fs::remove_all(dir);
}

TEST_CASE("hf: a directory is read slice by slice, across row splits and transposes", "[checkpoint][hf]") {
  const std::string dir = testing::temp_dir("hf_slices");
  for (const hf::ModelDims& d : {llama_dims(), gpt_dims()}) {
    INFO(d.type);
    const TensorMapByName troupe = troupe_tensors(d);
    nlohmann::json config = hf::config_json(d, DType::f32);
    const std::string at = write_hf_dir(dir + "/" + d.type, d, troupe, config);
    const hf::HfSource src(at, d);
    // Each tensor whole, then split on dim 0 in tensor-parallel-like runs, then on dim 1.
    for (const auto& kv : troupe) {
      INFO(kv.first);
      const Tensor& full = kv.second;
      const int64_t R = full.shape()[0], C = full.shape().size() > 1 ? full.shape()[1] : 1;
      Tensor got = Tensor::zeros(full.shape(), DType::f32);
      src.read_slice(kv.first, checkpoint::whole(full.shape()), got.f32());
      CHECK(same_bits(got, full));
      // Rows [R/8, R/4) then [R/2 + 3, R/2 + 3 + R/4): they cross the q|k|v and gate|up cuts.
      checkpoint::SliceSpec rows{full.shape(), 0, {{R / 8, R / 8, 0}, {R / 2 + 3, R / 4, R / 8}}};
      std::vector<float> want = block(full, R / 8, R / 8, 0, C), second = block(full, R / 2 + 3, R / 4, 0, C);
      want.insert(want.end(), second.begin(), second.end());
      std::vector<float> slice(want.size());
      src.read_slice(kv.first, rows, slice.data());
      CHECK(slice == want);
      if (C == 1) continue;
      checkpoint::SliceSpec cols{full.shape(), 1, {{C / 2, C / 2, 0}, {1, 3, C / 2}}};
      std::vector<float> wantc;
      for (int64_t r = 0; r < R; ++r) {
        for (float v : block(full, r, 1, C / 2, C / 2)) wantc.push_back(v);
        for (float v : block(full, r, 1, 1, 3)) wantc.push_back(v);
      }
      std::vector<float> slicec(wantc.size());
      src.read_slice(kv.first, cols, slicec.data());
      CHECK(slicec == wantc);
    }
    CHECK_THAT(error_of([&] {
                 float x;
                 src.read_slice("h.9.ln_1.weight", checkpoint::whole({1}), &x);
               }),
               Catch::Contains("h.9.ln_1.weight has no tensor in the Hugging Face layout"));
  }
  fs::remove_all(dir);
}

TEST_CASE("hf: a longer position table, BF16 tensors, names without transformer., index shards",
          "[checkpoint][hf]") {
  const std::string dir = testing::temp_dir("hf_variants");
  const hf::ModelDims d = gpt_dims();
  const TensorMapByName troupe = troupe_tensors(d);
  // n_positions 20 > seq_len 12: troupe reads the first 12 rows of wpe.
  hf::ModelDims longer = d;
  longer.max_positions = 20;
  nlohmann::json config = hf::config_json(d, DType::bf16);
  config["n_positions"] = 20;
  TensorMapByName stored = hf::to_hf(longer, troupe);
  REQUIRE(stored.at("transformer.wpe.weight").shape() == Shape{20, 16});
  // As GPT2Model saves it (no "transformer." prefix), in BF16, plus the attn.bias mask buffers.
  TensorMapByName bare;
  for (auto& kv : stored) {
    Tensor b = Tensor::empty(kv.second.shape(), DType::bf16);
    convert(DType::f32, kv.second.data(), DType::bf16, b.data(), size_t(kv.second.numel()));
    bare.emplace(kv.first.substr(std::strlen("transformer.")), std::move(b));
  }
  bare.emplace("h.0.attn.bias", filled({1, 1, 12, 12}, 3));
  fs::create_directories(dir + "/bare");
  std::ofstream(dir + "/bare/config.json") << config.dump();
  write_safetensors(dir + "/bare/model.safetensors", bare);
  {
    const hf::HfSource src(dir + "/bare", d);
    CHECK(src.dims().max_positions == 20);
    for (const auto& kv : troupe) {
      INFO(kv.first);
      Tensor got = Tensor::zeros(kv.second.shape(), DType::f32);
      src.read_slice(kv.first, checkpoint::whole(kv.second.shape()), got.f32());
      for (int64_t i = 0; i < got.numel(); ++i) {
        uint16_t h;
        convert(DType::f32, kv.second.f32() + i, DType::bf16, &h, 1);
        float want;
        convert(DType::bf16, &h, DType::f32, &want, 1);
        REQUIRE(got.f32()[i] == want);
      }
    }
  }
  // Shards named by model.safetensors.index.json.
  const std::string sharded = dir + "/sharded";
  fs::create_directories(sharded);
  std::ofstream(sharded + "/config.json") << hf::config_json(d, DType::f32).dump();
  TensorMapByName a, b;
  nlohmann::json weight_map = nlohmann::json::object();
  for (auto& kv : hf::to_hf(d, troupe)) {
    const bool first = kv.first.find(".h.1.") == std::string::npos;
    weight_map[kv.first] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
    (first ? a : b).emplace(kv.first, kv.second);
  }
  write_safetensors(sharded + "/model-00001-of-00002.safetensors", a);
  write_safetensors(sharded + "/model-00002-of-00002.safetensors", b);
  auto write_index = [&](const nlohmann::json& wm) {
    std::ofstream(sharded + "/model.safetensors.index.json") << nlohmann::json{{"weight_map", wm}}.dump();
  };
  write_index(weight_map);
  {
    const hf::HfSource src(sharded, d);
    for (const auto& kv : troupe) {
      Tensor got = Tensor::zeros(kv.second.shape(), DType::f32);
      src.read_slice(kv.first, checkpoint::whole(kv.second.shape()), got.f32());
      CHECK(same_bits(got, kv.second));
    }
  }
  nlohmann::json escape = weight_map;
  escape["transformer.wte.weight"] = "../model-00001-of-00002.safetensors";
  write_index(escape);
  CHECK_THAT(error_of([&] { hf::HfSource(sharded, d); }), Catch::Contains("not a file in"));
  nlohmann::json lying = weight_map;
  lying["transformer.wte.weight"] = "model-00002-of-00002.safetensors";
  write_index(lying);
  CHECK_THAT(error_of([&] { hf::HfSource(sharded, d); }), Catch::Contains("which does not hold it"));
  fs::remove_all(dir);
}

TEST_CASE("hf: every disagreement of config.json with the job's model is refused by key",
          "[checkpoint][hf]") {
  struct Case {
    hf::ModelDims dims;
    const char* key;
    nlohmann::json value;
    const char* says;
  };
  const hf::ModelDims g = gpt_dims(), l = llama_dims();
  hf::ModelDims ls = llama_dims();  // Llama 3.2's rope scaling
  ls.rope_scaling = {"llama3", 32.0, 1.0, 4.0, 8192};
  const nlohmann::json llama3 = {{"rope_type", "llama3"},
                                 {"factor", 32.0},
                                 {"low_freq_factor", 1.0},
                                 {"high_freq_factor", 4.0},
                                 {"original_max_position_embeddings", 8192}};
  nlohmann::json factor8 = llama3, old_key = llama3, extra = llama3;
  factor8["factor"] = 8.0;
  old_key.erase("rope_type");
  old_key["type"] = "dynamic";
  extra["attention_factor"] = 1.5;
  const std::vector<Case> cases = {
      {g, "model_type", "llama", "model_type is \"llama\", the job's model.type gpt is \"gpt2\""},
      {g, "vocab_size", 41, "vocab_size is 41, the job's model.vocab_size is 40"},
      {g, "n_embd", 32, "n_embd is 32, the job's model.d_model is 16"},
      {g, "n_layer", 3, "n_layer is 3, the job's model.n_layers is 2"},
      {g, "n_head", 2, "n_head is 2, the job's model.n_heads is 4"},
      {g, "n_positions", 8, "n_positions is 8, shorter than the job's model.seq_len 12"},
      {g, "n_inner", 60, "n_inner is 60, the spec's model.ffn_hidden is 64"},
      {g, "activation_function", "gelu", "activation_function is \"gelu\""},
      {g, "layer_norm_epsilon", 1e-6, "layer_norm_epsilon is 1e-06, troupe's gpt LayerNorm uses 1e-05"},
      {g, "tie_word_embeddings", false, "tie_word_embeddings is false"},
      {g, "scale_attn_by_inverse_layer_idx", true, "scale_attn_by_inverse_layer_idx is true"},
      {g, "n_embd", "16", "n_embd is \"16\", not an integer"},
      {l, "model_type", "gpt2", "model_type is \"gpt2\", the job's model.type llama is \"llama\""},
      {l, "vocab_size", 51, "vocab_size is 51, the job's model.vocab_size is 50"},
      {l, "hidden_size", 64, "hidden_size is 64, the job's model.d_model is 32"},
      {l, "intermediate_size", 32, "intermediate_size is 32, the job's model.ffn_hidden is 24"},
      {l, "num_hidden_layers", 1, "num_hidden_layers is 1, the job's model.n_layers is 2"},
      {l, "num_attention_heads", 8, "num_attention_heads is 8, the job's model.n_heads is 4"},
      {l, "num_key_value_heads", 4, "num_key_value_heads is 4, the job's model.n_kv_heads is 2"},
      {l, "head_dim", 16, "head_dim is 16"},
      {l, "max_position_embeddings", 8,
       "max_position_embeddings is 8, shorter than the job's model.seq_len 16"},
      {l, "rms_norm_eps", 1e-5, "rms_norm_eps is 1e-05, the job's model.norm_eps is 1e-06"},
      {l, "rope_theta", 10000.0, "rope_theta is 10000, the job's model.rope_theta is 500000"},
      {l, "tie_word_embeddings", true,
       "tie_word_embeddings is true, the job's model.tie_embeddings is false"},
      {l, "hidden_act", "gelu", "hidden_act is \"gelu\""},
      {l, "attention_bias", true, "attention_bias is true"},
      {l, "mlp_bias", true, "mlp_bias is true"},
      {l,
       "rope_scaling",
       {{"type", "linear"}, {"factor", 2.0}},
       "rope_scaling has rope_type \"linear\": troupe's llama supports \"llama3\" scaling (or none)"},
      {l, "rope_scaling", llama3, "rope_scaling is llama3, the job's model has no rope_scaling: add"},
      {ls, "rope_scaling", nullptr, "rope_scaling is null, the job's model.rope_scaling is llama3"},
      {ls, "rope_scaling", factor8, "rope_scaling factor is 8, the job's model.rope_scaling.factor is 32"},
      {ls, "rope_scaling", old_key, "rope_scaling has rope_type \"dynamic\""},
      {ls, "rope_scaling", extra, "rope_scaling has the key \"attention_factor\""},
      {l, "rms_norm_eps", nlohmann::json::array(), "rms_norm_eps is [], not a number"},
  };
  for (const Case& c : cases) {
    INFO(c.dims.type << " " << c.key);
    nlohmann::json config = hf::config_json(c.dims, DType::f32);
    CHECK_NOTHROW(hf::check_config(config, c.dims, "x/config.json"));
    config[c.key] = c.value;
    const std::string why = error_of([&] { hf::check_config(config, c.dims, "x/config.json"); });
    CHECK_THAT(
        why, Catch::StartsWith("x/config.json: the Hugging Face config does not describe the job's model:") &&
                 Catch::Contains(std::string("\n  ") + c.says));
  }
  // Absent keys take Hugging Face's defaults: a GPT-2 config without n_positions has 1024.
  nlohmann::json config = hf::config_json(g, DType::f32);
  config.erase("n_positions");
  CHECK(hf::check_config(config, g, "c").max_positions == 1024);
  // Every mismatch at once.
  config["n_layer"] = 7;
  config["n_head"] = 8;
  const std::string why = error_of([&] { hf::check_config(config, g, "c"); });
  CHECK_THAT(why, Catch::Contains("n_layer is 7") && Catch::Contains("n_head is 8"));
  CHECK_THAT(error_of([&] { hf::check_config(nlohmann::json::array(), g, "c"); }),
             Catch::Contains("not a JSON object"));
}

TEST_CASE("hf: a hostile directory is refused naming the file or tensor", "[checkpoint][hf]") {
  const std::string dir = testing::temp_dir("hf_hostile");
  const hf::ModelDims d = gpt_dims();
  const TensorMapByName troupe = troupe_tensors(d);
  const nlohmann::json config = hf::config_json(d, DType::f32);
  auto open = [&](const std::string& at) { return error_of([&] { hf::HfSource(at, d); }); };
  write_hf_dir(dir + "/ok", d, troupe, config);
  CHECK(open(dir + "/ok").empty());
  // config.json: not JSON, not an object, oversized.
  fs::create_directories(dir + "/bad");
  std::ofstream(dir + "/bad/config.json") << "{\"n_embd\": ";
  CHECK_THAT(open(dir + "/bad"), Catch::Contains("config.json: not valid JSON"));
  std::ofstream(dir + "/bad/config.json") << "[1, 2]";
  CHECK_THAT(open(dir + "/bad"), Catch::Contains("config.json: not a JSON object"));
  std::ofstream(dir + "/bad/config.json") << std::string(2 << 20, ' ');
  CHECK_THAT(open(dir + "/bad"), Catch::Contains("bytes, more than the"));
  std::ofstream(dir + "/bad/config.json") << config.dump();
  CHECK_THAT(open(dir + "/bad"),
             Catch::Contains("neither model.safetensors nor model.safetensors.index.json"));
  // Tensors: missing, misshapen, integer.
  TensorMapByName tensors = hf::to_hf(d, troupe);
  tensors.erase("transformer.h.1.mlp.c_fc.bias");
  write_safetensors(dir + "/bad/model.safetensors", tensors);
  CHECK_THAT(open(dir + "/bad"),
             Catch::Contains("tensor transformer.h.1.mlp.c_fc.bias is missing (troupe's h.1.mlp.c_fc.bias)"));
  tensors["transformer.h.1.mlp.c_fc.bias"] = filled({63}, 1);
  write_safetensors(dir + "/bad/model.safetensors", tensors);
  CHECK_THAT(
      open(dir + "/bad"),
      Catch::Contains("tensor transformer.h.1.mlp.c_fc.bias has shape [63], the job's model and config.json "
                      "make it [64]"));
  tensors["transformer.h.1.mlp.c_fc.bias"] = Tensor::zeros({64}, DType::i32);
  write_safetensors(dir + "/bad/model.safetensors", tensors);
  CHECK_THAT(open(dir + "/bad"), Catch::Contains("tensor transformer.h.1.mlp.c_fc.bias is I32"));
  std::ofstream(dir + "/bad/model.safetensors") << "garbage";
  CHECK_FALSE(open(dir + "/bad").empty());
  fs::remove_all(dir);
}

namespace {

JobSpec gpt_spec(const std::string& model_extra = "") {
  return parse_spec(
      "name: h\nmodel: {type: gpt, seq_len: 16, d_model: 32, n_layers: 4, n_heads: 4" + model_extra +
          "}\n"
          "data: {source: synthetic}\n"
          "train: {steps: 3, global_batch: 8, micro_batch: 2, seed: 5, optimizer: {lr: 0.01}}\n",
      "h.yaml");
}

void require_ran(const testing::LayoutRun& run) {
  for (size_t r = 0; r < run.errors.size(); ++r) {
    INFO("rank " << r);
    REQUIRE(run.errors[r] == "");
  }
}

}  // namespace

TEST_CASE(
    "hf: a trained GPT exported and read by init_from under another layout has its parameters bit for bit",
    "[checkpoint][hf][export]") {
  const std::string root = testing::temp_dir("hf_export");
  const JobSpec spec = gpt_spec();
  require_ran(testing::run_layout(spec, {2, 2, 2}, "", 3, root + "/a"));
  const std::string ck = root + "/a/step_000003";
  const std::string out = root + "/hf";
  CHECK(hf::export_hf(ck, out) == 4 * 12 + 4);
  const nlohmann::json config = nlohmann::json::parse(std::ifstream(out + "/config.json"));
  CHECK(config["architectures"] == nlohmann::json::array({"GPT2LMHeadModel"}));
  CHECK(config["n_embd"] == 32);
  CHECK(config["n_positions"] == 16);
  CHECK(config["activation_function"] == "gelu_new");
  CHECK(config["torch_dtype"] == "float32");
  safetensors::Reader r(out + "/model.safetensors");
  CHECK(r.metadata().at("format") == "pt");
  CHECK(r.info("transformer.h.3.attn.c_attn.weight").shape == Shape{32, 96});
  CHECK_FALSE(r.contains("lm_head.weight"));
  CHECK_FALSE(fs::exists(out + "/model.safetensors.tmp"));
  CHECK_FALSE(fs::exists(out + "/config.json.tmp"));

  // init_from the export under 1x2x2 (another seed), then save: every parameter is the original's.
  JobSpec s2 = spec;
  s2.model.init_from = out;
  s2.train.seed = 77;
  require_ran(testing::run_layout(s2, {1, 2, 2}, "", 0, root + "/b"));
  const checkpoint::Manifest ma = checkpoint::verify(ck), mb = checkpoint::verify(root + "/b/step_000000");
  int params = 0;
  for (const auto& name : checkpoint::tensor_names(ck, ma)) {
    if (name.rfind("optim.", 0) == 0) continue;
    INFO(name);
    ++params;
    CHECK(same_bits(checkpoint::read_full(ck, ma, name),
                    checkpoint::read_full(root + "/b/step_000000", mb, name)));
  }
  CHECK(params == 4 * 12 + 4);

  // A 16-bit export: BF16 tensors, each the rounded f32 master.
  hf::export_hf(ck, root + "/hf16", DType::bf16);
  safetensors::Reader r16(root + "/hf16/model.safetensors");
  CHECK(r16.info("transformer.wte.weight").dtype == DType::bf16);
  CHECK(nlohmann::json::parse(std::ifstream(root + "/hf16/config.json"))["torch_dtype"] == "bfloat16");
  const Tensor wte = checkpoint::read_full(ck, ma, "wte.weight");
  Tensor rounded = Tensor::empty(wte.shape(), DType::bf16);
  convert(DType::f32, wte.data(), DType::bf16, rounded.data(), size_t(wte.numel()));
  CHECK(same_bits(r16.read("transformer.wte.weight"), rounded));

  // A job whose model the config does not describe fails at start, naming the key.
  JobSpec s3 = gpt_spec();
  s3.model.n_layers = 2;
  s3.model.init_from = out;
  const testing::LayoutRun bad = testing::run_layout(s3, {1, 1, 1}, "", 0);
  REQUIRE(bad.errors.size() == 1);
  CHECK_THAT(bad.errors[0], Catch::Contains("n_layer is 4, the job's model.n_layers is 2"));
  // Exporting over a checkpoint is refused; an mlp has no Hugging Face layout.
  CHECK_THAT(error_of([&] { hf::export_hf(ck, root + "/a/step_000003"); }),
             Catch::Contains("a troupe checkpoint"));
  const JobSpec mlp = parse_spec(
      "name: m\nmodel: {type: mlp, seq_len: 8, d_model: 16, n_layers: 2}\ndata: {source: synthetic}\n"
      "train: {steps: 1, global_batch: 2, seed: 1}\n",
      "m.yaml");
  require_ran(testing::run_layout(mlp, {1, 1, 1}, "", 1, root + "/m"));
  CHECK_THAT(error_of([&] { hf::export_hf(root + "/m/step_000001", root + "/hf_mlp"); }),
             Catch::Contains("model.type mlp has no Hugging Face layout"));
  CHECK_FALSE(fs::exists(root + "/hf_mlp"));
  fs::remove_all(root);
}

// `troupe sample --ckpt DIR --prompt "..." --tokens N [--tokenizer FILE]`: generates text
// from a checkpoint. Token ids are bytes by default; with a tokenizer (troupe's BPE JSON or a
// Hugging Face tokenizer.json, core/tokenizer.hpp) the prompt is encoded with it after the id
// that starts a document (a Hugging Face bos), generated ids are decoded with it, only ids it
// has a token for are sampled, and generation stops at its end-of-text (eos) token.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <limits>

#include "checkpoint/checkpoint.hpp"
#include "cli/commands.hpp"
#include "core/rng.hpp"
#include "core/spec.hpp"
#include "core/tokenizer.hpp"
#include "model/from_spec.hpp"
#include "model/sample.hpp"
#include "model/stage.hpp"

namespace troupe::cli {

namespace {

struct SampleOptions {
  std::string ckpt;
  std::string prompt;
  int tokens = 200;
  double temperature = 0.8;
  uint64_t seed = 0;
  int top_k = 0;
  std::string tokenizer;
  bool special = false;
};

int sample(const SampleOptions& o) {
  std::string dir;
  std::optional<checkpoint::TensorSource> src;
  try {
    dir = checkpoint::resolve(o.ckpt);
    src.emplace(dir);
  } catch (const std::exception& e) {
    std::cerr << "troupe sample: " << e.what() << "\n";
    return kUsage;
  }
  JobSpec spec;
  try {
    spec = parse_spec(src->manifest()->spec_yaml, dir + "/manifest.json");
  } catch (const SpecError& e) {
    std::cerr << "troupe sample: the checkpoint's spec does not parse:\n" << e.what();
    return kJobFailed;
  }
  // The tokenizer: --tokenizer, else the one the job trained with (data.tokenizer).
  std::unique_ptr<TextTokenizer> tok;
  const std::string tok_path = !o.tokenizer.empty() ? o.tokenizer : spec.data.tokenizer;
  if (!tok_path.empty()) {
    try {
      tok = load_tokenizer(tok_path);
    } catch (const std::exception& e) {
      std::cerr << "troupe sample: " << e.what() << "\n";
      if (o.tokenizer.empty())
        std::cerr << "  (the checkpoint's data.tokenizer; give --tokenizer FILE to use another)\n";
      return kUsage;
    }
  }
  const model::ModelConfig cfg = model::model_config(spec);
  // The model computes as it trained: in mixed precision its products read the 16-bit
  // copy of the f32 masters the checkpoint holds.
  model::DeviceContext dc = model::DeviceContext::cpu();
  dc.compute_dtype = compute_dtype(spec.train.precision);
  model::Stage stage(cfg, LayerRange::full(cfg.n_layer), 1, 1, dc);
  try {
    for (auto& p : stage.params()) src->read(p.name, p.data.shape(), p.data.f32());
    stage.store().refresh_compute();
  } catch (const std::exception& e) {
    std::cerr << "troupe sample: " << e.what() << "\n";
    return kJobFailed;
  }

  // Ids the model may emit: with a tokenizer only those it can decode (a model's
  // vocab_size is often padded past the tokenizer's).
  int V = cfg.vocab_size;
  std::vector<int32_t> ctx;
  if (o.special && !(tok && tok->has_special_tokens())) {
    std::cerr
        << "troupe sample: --special needs a Hugging Face tokenizer (troupe's BPE has no special tokens)\n";
    return kUsage;
  }
  if (tok) {
    if (tok->vocab_size() > uint32_t(cfg.vocab_size)) {
      std::cerr << "troupe sample: the tokenizer " << tok_path << " has " << tok->vocab_size()
                << " tokens, more than the model's vocab_size of " << cfg.vocab_size << "\n";
      return kUsage;
    }
    V = int(tok->vocab_size());
    // A document starts as the data framed it: with the tokenizer's bos, or after end-of-text.
    if (tok->document_start()) ctx.push_back(int32_t(*tok->document_start()));
    for (uint32_t id : tok->encode(o.prompt, o.special)) ctx.push_back(int32_t(id));
    if (ctx.empty() && tok->end_of_text()) ctx.push_back(int32_t(*tok->end_of_text()));
    if (ctx.empty()) {
      std::cerr << "troupe sample: give --prompt: the tokenizer has no token to start a document with\n";
      return kUsage;
    }
  } else {
    if (cfg.vocab_size != 256) {
      std::cerr << "troupe sample: the model's vocab_size is " << cfg.vocab_size
                << ", not the 256 bytes: give --tokenizer FILE (the tokenizer its data was made with)\n";
      return kUsage;
    }
    for (unsigned char c : o.prompt) ctx.push_back(c);
    if (ctx.empty()) ctx.push_back('\n');
  }
  // Generation ends at end-of-text: the tokenizer's, or the job's data.eot.
  const int64_t eot = tok && tok->end_of_text() ? int64_t{*tok->end_of_text()} : spec.data.eot;
  std::fwrite(o.prompt.data(), 1, o.prompt.size(), stdout);
  std::vector<float> logits(size_t(cfg.vocab_size));
  rng::Stream stream(o.seed, rng::name_hash("troupe.sample"));
  try {
    for (int i = 0; i < o.tokens; ++i) {
      const int T = std::min<int>(int(ctx.size()), cfg.seq_len);
      stage.last_logits(ctx.data() + ctx.size() - size_t(T), T, logits.data());
      if (tok)  // ids between a tokenizer's tokens (a gap in its vocabulary) are never drawn
        for (int v = 0; v < V; ++v)
          if (!tok->has_token(uint32_t(v))) logits[size_t(v)] = -std::numeric_limits<float>::infinity();
      const int32_t next = model::sample_token(logits.data(), V, float(o.temperature), o.top_k, stream);
      ctx.push_back(next);
      if (next == eot) break;
      if (tok) {
        const std::string_view text = tok->token_bytes(uint32_t(next));
        std::fwrite(text.data(), 1, text.size(), stdout);
      } else {
        std::fputc(next, stdout);
      }
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fputc('\n', stdout);
    std::cerr << "troupe sample: " << e.what() << "\n";
    return kJobFailed;
  }
  std::fputc('\n', stdout);
  return kOk;
}

}  // namespace

void add_sample_command(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("sample", "Generate text from a checkpoint");
  static SampleOptions opt;
  cmd->add_option("--ckpt", opt.ckpt, "Checkpoint directory (a step_N directory or a root with latest)")
      ->required();
  cmd->add_option("--prompt", opt.prompt, "Text to continue");
  cmd->add_option("--tokens", opt.tokens, "Tokens to generate (bytes without --tokenizer)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--temperature", opt.temperature, "0 = greedy")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 100.0));
  cmd->add_option("--seed", opt.seed, "Sampling seed")->capture_default_str();
  cmd->add_option("--top-k", opt.top_k, "Sample among the k most likely tokens (0 = all)")
      ->capture_default_str();
  cmd->add_option(
      "--tokenizer", opt.tokenizer,
      "Tokenizer (troupe's JSON or a Hugging Face tokenizer.json): encode the prompt, decode tokens, stop at "
      "end-of-text; default: the job's data.tokenizer");
  cmd->add_flag("--special", opt.special,
                "Special tokens written in the prompt (\"<|eot_id|>\") become their ids");
  cmd->callback([exit_code] { *exit_code = sample(opt); });
}

}  // namespace troupe::cli

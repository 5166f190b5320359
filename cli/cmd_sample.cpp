// `troupe sample --ckpt DIR --prompt "..." --tokens N`: generates bytes from a checkpoint.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "checkpoint/checkpoint.hpp"
#include "cli/commands.hpp"
#include "core/rng.hpp"
#include "core/spec.hpp"
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
  const model::ModelConfig cfg = model::model_config(spec);
  // The model computes as it trained: in mixed precision its products read the 16-bit
  // copy of the f32 masters the checkpoint holds.
  model::DeviceContext dc = model::DeviceContext::cpu();
  dc.compute_dtype = compute_dtype(spec.train.precision);
  model::Stage stage(cfg, model::StageRange::full(cfg), 1, 1, dc);
  try {
    for (auto& p : stage.params()) src->read(p.name, p.data.shape(), p.data.f32());
    stage.store().refresh_compute();
  } catch (const std::exception& e) {
    std::cerr << "troupe sample: " << e.what() << "\n";
    return kJobFailed;
  }

  std::vector<int32_t> ctx;
  for (unsigned char c : o.prompt) ctx.push_back(c);
  if (ctx.empty()) ctx.push_back('\n');
  std::fwrite(o.prompt.data(), 1, o.prompt.size(), stdout);
  std::vector<float> logits(size_t(cfg.vocab_size));
  rng::Stream stream(o.seed, rng::name_hash("troupe.sample"));
  for (int i = 0; i < o.tokens; ++i) {
    const int T = std::min<int>(int(ctx.size()), cfg.seq_len);
    stage.last_logits(ctx.data() + ctx.size() - size_t(T), T, logits.data());
    const int32_t next =
        model::sample_token(logits.data(), cfg.vocab_size, float(o.temperature), o.top_k, stream);
    ctx.push_back(next);
    std::fputc(next, stdout);
    std::fflush(stdout);
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
  cmd->add_option("--tokens", opt.tokens, "Bytes to generate")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--temperature", opt.temperature, "0 = greedy")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 100.0));
  cmd->add_option("--seed", opt.seed, "Sampling seed")->capture_default_str();
  cmd->add_option("--top-k", opt.top_k, "Sample among the k most likely bytes (0 = all)")
      ->capture_default_str();
  cmd->callback([exit_code] { *exit_code = sample(opt); });
}

}  // namespace troupe::cli

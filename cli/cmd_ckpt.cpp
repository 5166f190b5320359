// `troupe ckpt ls|inspect|verify|export`: checkpoint directories without a job.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/hf.hpp"
#include "cli/commands.hpp"
#include "core/layout.hpp"
#include "core/spec.hpp"

namespace troupe::cli {

namespace {

namespace fs = std::filesystem;

std::string layout_of(const checkpoint::Manifest& m) { return Layout{m.dp, m.pp, m.tp}.str(); }

uint64_t total_bytes(const checkpoint::Manifest& m) {
  uint64_t n = 0;
  for (const auto& f : m.files) n += f.size;
  return n;
}

// The checkpoints `dir` names: itself when it holds a manifest, else the committed ones under it.
std::vector<std::string> checkpoints_in(const std::string& dir) {
  if (checkpoint::is_checkpoint_dir(dir) && dir.find(".tmp") == std::string::npos) return {dir};
  return checkpoint::list(dir);
}

std::string latest_target(const std::string& root) {
  std::error_code ec;
  fs::path link = fs::path(root) / "latest";
  if (!fs::is_symlink(link, ec)) return "";
  return (fs::path(root) / fs::read_symlink(link, ec)).lexically_normal().string();
}

int cmd_ls(const std::string& dir) {
  if (!fs::is_directory(dir)) {
    std::cerr << "troupe ckpt ls: " << dir << ": not a directory\n";
    return kUsage;
  }
  const auto dirs = checkpoints_in(dir);
  const std::string latest = latest_target(dir);
  std::printf("%-14s %8s %8s %7s %12s  %s\n", "checkpoint", "step", "layout", "files", "bytes", "status");
  for (const auto& d : dirs) {
    std::string status = "ok";
    checkpoint::Manifest m;
    try {
      m = checkpoint::verify(d);
    } catch (const checkpoint::RefusedCheckpoint& e) {
      status = std::string("REFUSED: ") + e.what();
    } catch (const checkpoint::CheckpointError& e) {
      status = std::string("BAD: ") + e.what();
    }
    const bool is_latest = fs::path(d).lexically_normal().string() == latest;
    std::printf("%-14s %8lld %8s %7zu %12llu  %s%s\n", fs::path(d).filename().c_str(),
                static_cast<long long>(m.step), status == "ok" ? layout_of(m).c_str() : "?", m.files.size(),
                static_cast<unsigned long long>(total_bytes(m)), status.c_str(),
                is_latest ? " (latest)" : "");
  }
  if (dirs.empty()) std::printf("(no committed checkpoints in %s)\n", dir.c_str());
  return kOk;
}

int cmd_inspect(const std::string& dir) {
  std::string ck;
  try {
    ck = checkpoint::resolve(dir);
    checkpoint::TensorSource src(ck);
    const checkpoint::Manifest& m = *src.manifest();
    std::printf(
        "checkpoint  %s\nstep        %lld (data cursor %lld)\nlayout      %s (data x pipeline x tensor)\n"
        "seed        %llu\nspec hash   %s\noptimizer   %s\n",
        ck.c_str(), static_cast<long long>(m.step), static_cast<long long>(m.data_cursor),
        layout_of(m).c_str(), static_cast<unsigned long long>(m.seed), m.spec_hash.c_str(),
        m.optimizer.dump().c_str());
    std::printf("files       %zu, %llu bytes\n", m.files.size(),
                static_cast<unsigned long long>(total_bytes(m)));
    for (const auto& f : m.files)
      std::printf("  %-28s %12llu  xxh64 %s\n", f.name.c_str(), static_cast<unsigned long long>(f.size),
                  f.xxh64.c_str());
    int64_t params = 0;
    std::printf("tensors\n");
    for (const auto& name : src.names()) {
      const Shape g = src.global_shape(name);
      int64_t n = 1;
      for (auto d : g) n *= d;
      if (name.rfind("optim.", 0) != 0) params += n;
      std::printf("  %-40s %s\n", name.c_str(), shape_str(g).c_str());
    }
    std::printf("parameters  %lld\n", static_cast<long long>(params));
  } catch (const checkpoint::RefusedCheckpoint& e) {
    std::cerr << "troupe ckpt inspect: refused: " << e.what() << "\n";
    return kUsage;
  } catch (const std::exception& e) {
    std::cerr << "troupe ckpt inspect: " << e.what() << "\n";
    return kJobFailed;
  }
  return kOk;
}

int cmd_verify(const std::string& dir) {
  const auto dirs = checkpoints_in(dir);
  if (dirs.empty()) {
    std::cerr << "troupe ckpt verify: " << dir << ": no committed checkpoints\n";
    return kJobFailed;
  }
  int bad = 0, refused = 0;
  for (const auto& d : dirs) {
    try {
      checkpoint::Manifest m = checkpoint::verify(d);
      std::printf("ok   %s (step %lld, %zu files)\n", d.c_str(), static_cast<long long>(m.step),
                  m.files.size());
    } catch (const checkpoint::RefusedCheckpoint& e) {
      ++refused;
      std::printf("REFUSED  %s\n", e.what());
    } catch (const checkpoint::CheckpointError& e) {
      ++bad;
      std::printf("BAD  %s\n", e.what());
    }
  }
  // A checkpoint that is not one troupe wrote is bad input (2); a damaged one a failure (1).
  return refused ? kUsage : bad ? kJobFailed : kOk;
}

int cmd_export(const std::string& dir, const std::string& out, const std::string& format,
               const std::string& dtype) {
  try {
    const std::string ck = checkpoint::resolve(dir);
    DType dt = DType::f32;  // --dtype is one of the precisions' names (checked by the option)
    for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16})
      if (dtype == to_string(p)) dt = compute_dtype(p);
    if (format == "hf") {
      const size_t n = checkpoint::hf::export_hf(ck, out, dt);
      std::printf("exported %zu tensors of %s to %s (Hugging Face layout, %s)\n", n, ck.c_str(), out.c_str(),
                  dtype_name(dt));
      return kOk;
    }
    const size_t n = checkpoint::export_model(ck, out, dt);
    std::printf("exported %zu tensors of %s to %s (%s)\n", n, ck.c_str(), out.c_str(), dtype_name(dt));
  } catch (const std::exception& e) {
    std::cerr << "troupe ckpt export: " << e.what() << "\n";
    return kJobFailed;
  }
  return kOk;
}

}  // namespace

void add_ckpt_command(CLI::App& app, int* exit_code) {
  auto* ckpt = app.add_subcommand("ckpt", "List, inspect, verify and export checkpoints");
  ckpt->require_subcommand(1);
  static std::string dir, out, dtype = "fp32", format = "safetensors";
  auto* ls = ckpt->add_subcommand("ls", "List the checkpoints under a directory, newest first");
  ls->add_option("dir", dir, "Checkpoint root (or one step_N directory)")->required();
  ls->callback([exit_code] { *exit_code = cmd_ls(dir); });
  auto* inspect = ckpt->add_subcommand("inspect", "Manifest, files and tensors of a checkpoint");
  inspect->add_option("dir", dir, "A step_N directory, or a root (its newest valid checkpoint)")->required();
  inspect->callback([exit_code] { *exit_code = cmd_inspect(dir); });
  auto* verify = ckpt->add_subcommand(
      "verify", "Check manifests, sizes and checksums; exit 1 if any is damaged, 2 if any is refused");
  verify->add_option("dir", dir, "Checkpoint root (or one step_N directory)")->required();
  verify->callback([exit_code] { *exit_code = cmd_verify(dir); });
  auto* exp = ckpt->add_subcommand(
      "export", "Write the model as one safetensors file of full tensors, or as a Hugging Face directory");
  exp->add_option("dir", dir, "A step_N directory, or a root (its newest valid checkpoint)")->required();
  exp->add_option("--out", out, "Output .safetensors file (--format hf: a directory)")->required();
  exp->add_option("--format", format,
                  "safetensors: troupe's names in one file; hf: config.json + model.safetensors "
                  "under Hugging Face's names (GPT2LMHeadModel, LlamaForCausalLM)")
      ->capture_default_str()
      ->check(CLI::IsMember({"safetensors", "hf"}));
  exp->add_option("--dtype", dtype, "Tensor dtype of the file: the fp32 masters, or rounded to bf16 / fp16")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  exp->callback([exit_code] { *exit_code = cmd_export(dir, out, format, dtype); });
}

}  // namespace troupe::cli

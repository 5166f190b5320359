// What a valid spec asks of this build that its engine cannot do. The schema (spec_sections*.cpp)
// says what a spec may say; this says what runs here, so that a job the workers would refuse at
// start (and the coordinator would relaunch max_restarts times) is refused before it is launched:
// a cuda device in a build without CUDA kernels or over a pipeline or tensor group, token files that are
// missing or malformed (their headers and sizes are read; troupe validate also scans the ids of small ones).
#include <algorithm>
#include <cmath>
#include <map>

#include "core/dataset.hpp"
#include "core/error.hpp"
#include "core/spec.hpp"
#include "core/token_file.hpp"

namespace troupe {

namespace {

// The position of `path`, or of the closest enclosing section written; 0:0 (the file as a whole)
// for a spec built in code.
SourcePos position(const JobSpec& spec, std::string path) {
  for (;;) {
    auto it = spec.positions.find(path);
    if (it != spec.positions.end()) return it->second;
    if (path.empty()) return SourcePos{};
    const size_t dot = path.rfind('.');
    path.resize(dot == std::string::npos ? 0 : dot);
  }
}

std::string file_of(const JobSpec& spec) {
  return spec.source_file.empty() ? "<job spec>" : spec.source_file;
}

void sort_by_position(std::vector<Diagnostic>& out) {
  std::stable_sort(out.begin(), out.end(), [](const Diagnostic& a, const Diagnostic& b) {
    return a.line != b.line ? a.line < b.line : a.col < b.col;
  });
}

}  // namespace

std::vector<Diagnostic> token_file_issues(const JobSpec& spec, uint64_t scan_up_to) {
  std::vector<Diagnostic> out;
  const DataSpec& d = spec.data;
  if (d.source != DataSource::tokens) return out;
  auto issue = [&](const std::string& key, std::string message, std::string hint) {
    const SourcePos at = position(spec, key);
    out.push_back(Diagnostic{file_of(spec), at.line, at.col, std::move(message), std::move(hint)});
  };
  const int width = token_width(d);
  // The opened files, kept for the id scan when one may follow.
  std::vector<std::pair<std::string, TokenFile>> opened;
  uint64_t total = 0;
  std::map<std::string, uint64_t> tokens;  // by key: the tokens its files hold
  auto check = [&](const std::string& key, const std::string& path) {
    if (path.empty()) return;
    std::vector<std::string> files;
    try {
      files = list_token_files(path);
    } catch (const Error& e) {
      issue(key, e.what(),
            key +
                " is a token file, or a directory whose *.bin files are the shards (troupe data tokenize "
                "writes them)");
      return;
    }
    for (const auto& f : files) {
      try {
        TokenFile t = TokenFile::open(f, width);
        total += t.file_bytes();
        tokens[key] += t.size();
        if (scan_up_to > 0) opened.emplace_back(key, std::move(t));
      } catch (const Error& e) {
        const std::string what = e.what();
        issue(key, what,
              what.find("but data.dtype is") != std::string::npos
                  ? "delete data.dtype (a header gives the width), or write the file with the dtype the spec "
                    "names"
                  : "a token file is llm.c's .bin (a 1024-byte header, then the tokens) or a raw array of "
                    "data.dtype ids; see docs/training.md#token-data");
      }
    }
  };
  check("data.path", d.path);
  check("data.val_path", d.val_path);
  // Evaluation reads windows of seq_len + 1 tokens of the validation split.
  const uint64_t window = uint64_t(std::max(spec.model.seq_len, 0)) + 1;
  if (out.empty() && spec.train.eval_every > 0) {
    const bool files = !d.val_path.empty();
    const uint64_t val =
        files ? tokens["data.val_path"] : uint64_t(std::floor(double(tokens["data.path"]) * d.val_fraction));
    if (val <= window)
      issue(files ? "data.val_path" : "data.val_fraction",
            "the validation split holds " + std::to_string(val) +
                " tokens, too few for one window of seq_len + 1 = " + std::to_string(window),
            files ? "give data.val_path more tokens, or set train.eval_every: 0"
                  : "raise data.val_fraction, give a data.val_path, or set train.eval_every: 0");
  }
  if (out.empty() && total <= scan_up_to)
    for (const auto& [key, f] : opened) {
      try {
        f.scan_ids(spec.model.vocab_size);
      } catch (const Error& e) {
        issue(key, e.what(),
              "the ids come from a tokenizer with more ids than the model has: set model.vocab_size to the "
              "tokenizer's vocab_size, or retokenize");
      }
    }
  sort_by_position(out);
  return out;
}

bool build_has_cuda() {
#ifdef TROUPE_BUILD_HAS_CUDA
  return true;
#else
  return false;
#endif
}

std::vector<Diagnostic> runnable_issues(const JobSpec& spec) {
  auto degree = [](int d) { return d <= 0 ? std::string("auto") : std::to_string(d); };
  std::vector<Diagnostic> out;
  auto issue = [&](const std::string& path, std::string message, std::string hint) {
    const SourcePos at = position(spec, path);
    out.push_back(Diagnostic{file_of(spec), at.line, at.col, std::move(message), std::move(hint)});
  };
  // cuda: a build without the CUDA kernels cannot train it (docs/gpu.md).
  if (spec.resources.device == DeviceKind::cuda && !build_has_cuda())
    issue("resources.device",
          "resources.device: cuda: this build has no CUDA kernels (it was configured without nvcc and NCCL)",
          "build troupe where CUDA and NCCL are installed (docs/gpu.md), or use device: cpu");
  // cuda: data parallelism over NCCL; the pipeline's and the tensor group's transfers take host
  // memory, and so do ZeRO's partitions.
  const ParallelSpec& par = spec.parallel;
  const bool gpu = spec.resources.device == DeviceKind::cuda && build_has_cuda();
  if (gpu && (par.pipeline != 1 || par.tensor != 1))
    issue(par.pipeline != 1 ? "parallel.pipeline" : "parallel.tensor",
          "resources.device: cuda trains over data parallelism only in this engine, not pipeline " +
              degree(par.pipeline) + ", tensor " + degree(par.tensor) +
              ": the pipeline's and the tensor group's transfers on device memory are not built yet",
          "set parallel.pipeline and parallel.tensor to 1 (parallel.data may be any), or use device: cpu");
  if (gpu && spec.train.zero > 0 && spec.train.zero < 3)
    issue("train.zero",
          "resources.device: cuda runs train.zero 0 only in this engine: its partitions of the optimizer and "
          "the gradients live in host memory",
          "delete train.zero (or set it to 0), or use device: cpu");
  if (spec.parallel.sequence_parallel)
    issue("parallel.sequence_parallel",
          "parallel.sequence_parallel is planned (troupe plan prices it) but not implemented in this engine",
          "set sequence_parallel: false to run the job");
  if (spec.train.zero == 3)
    issue("train.zero",
          "train.zero: 3 (sharded parameters, gathered per layer) is not implemented in this engine",
          "use zero: 2 (sharded optimizer state and gradients) or zero: 1");
  sort_by_position(out);
  return out;
}

void require_runnable(const JobSpec& spec) {
  auto issues = runnable_issues(spec);
  if (!issues.empty()) throw SpecError(std::move(issues));
}

void require_startable(const JobSpec& spec, uint64_t scan_up_to) {
  auto issues = runnable_issues(spec);
  auto files = token_file_issues(spec, scan_up_to);
  issues.insert(issues.end(), files.begin(), files.end());
  sort_by_position(issues);
  if (!issues.empty()) throw SpecError(std::move(issues));
}

}  // namespace troupe

// What a valid spec asks of this build that its engine cannot do. The schema (spec_sections.cpp)
// says what a spec may say; this says what runs here, so that a job the workers would refuse at
// start (and the coordinator would relaunch max_restarts times) is refused before it is launched.
#include <algorithm>

#include "core/spec.hpp"

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

}  // namespace

std::vector<Diagnostic> runnable_issues(const JobSpec& spec) {
  std::vector<Diagnostic> out;
  const std::string file = spec.source_file.empty() ? "<job spec>" : spec.source_file;
  auto issue = [&](const std::string& path, std::string message, std::string hint) {
    const SourcePos at = position(spec, path);
    out.push_back(Diagnostic{file, at.line, at.col, std::move(message), std::move(hint)});
  };
  // The comm layer can use NCCL, but there are no CUDA kernels: a cuda job would train on the CPU.
  if (spec.resources.device == DeviceKind::cuda)
    issue("resources.device", "resources.device: cuda: this build's engine trains on CPU only",
          "use device: cpu (or delete the key: cpu is the default)");
  std::stable_sort(out.begin(), out.end(), [](const Diagnostic& a, const Diagnostic& b) {
    return a.line != b.line ? a.line < b.line : a.col < b.col;
  });
  return out;
}

void require_runnable(const JobSpec& spec) {
  auto issues = runnable_issues(spec);
  if (!issues.empty()) throw SpecError(std::move(issues));
}

}  // namespace troupe

// The recorder and the rank trace files: Chrome trace-event JSON written atomically and read
// back as hostile input. Merging and the per-step shares are in trace_merge.cpp.
#include "core/trace.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.hpp"
#include "core/trace_json.hpp"

namespace troupe::trace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

// ---- Recorder ----

Recorder::Recorder(int64_t from_step, int64_t steps) : from_step_(from_step), steps_(steps) {
  require(from_step >= 0, "trace: from_step is ", from_step, "; it counts optimizer steps from 0");
  require(steps >= 0, "trace: steps is ", steps, "; 0 turns tracing off");
}

Recorder::Recorder(Recorder&& o) noexcept { *this = std::move(o); }

Recorder& Recorder::operator=(Recorder&& o) noexcept {
  if (this == &o) return *this;
  from_step_ = o.from_step_;
  steps_ = o.steps_;
  origin_ = o.origin_;
  step_.store(o.step_.load());
  active_.store(o.active_.load());
  std::lock_guard<std::mutex> lock(o.mu_);
  spans_ = std::move(o.spans_);
  o.spans_.clear();
  return *this;
}

void Recorder::set_step(int64_t step) {
  step_.store(step, std::memory_order_relaxed);
  active_.store(steps_ > 0 && step >= from_step_ && step - from_step_ < steps_, std::memory_order_relaxed);
}

bool Recorder::done() const {
  return steps_ > 0 && step_.load(std::memory_order_relaxed) - from_step_ >= steps_;
}

void Recorder::add(Span s) {
  if (!active()) return;
  if (s.step == -1) s.step = step_.load(std::memory_order_relaxed);
  push(std::move(s));
}

void Recorder::push(Span s) {
  std::lock_guard<std::mutex> lock(mu_);
  spans_.push_back(std::move(s));
}

std::vector<Span> Recorder::take() {
  std::vector<Span> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out.swap(spans_);
  }
  // Threads append in the order their spans end; the viewer and the shares want starts.
  std::stable_sort(out.begin(), out.end(), [](const Span& a, const Span& b) { return a.ts_us < b.ts_us; });
  return out;
}

Recorder::Scope::Scope(Recorder& r, std::string cat, std::string name, int track,
                       std::vector<std::pair<std::string, std::string>> args) {
  if (!r.active()) return;
  r_ = &r;
  span_.cat = std::move(cat);
  span_.name = std::move(name);
  span_.track = track;
  span_.args = std::move(args);
  span_.step = r.step_.load(std::memory_order_relaxed);
  span_.ts_us = r.now_us();
}

Recorder::Scope::~Scope() noexcept {
  if (r_ == nullptr) return;
  span_.dur_us = std::max<int64_t>(0, r_->now_us() - span_.ts_us);
  try {
    r_->push(std::move(span_));
  } catch (...) {  // out of memory for one more span: the trace loses it, the job goes on
  }
}

// ---- writing ----

namespace {

const char* track_name(int track) {
  switch (track) {
    case kEngine:
      return "engine";
    case kReducer:
      return "data-parallel reducer";
    case kPipelineComm:
      return "pipeline comm";
    case kCheckpointWriter:
      return "checkpoint writer";
    default:
      return nullptr;
  }
}

}  // namespace

namespace json_detail {

namespace {

ojson metadata(int pid, int tid, const char* what, const ojson& args) {
  ojson m;
  m["ph"] = "M";
  m["pid"] = pid;
  m["tid"] = tid;
  m["name"] = what;
  m["args"] = args;
  return m;
}

void append(std::string& out, const ojson& event) {
  out += out.empty() ? "{\"traceEvents\": [\n" : ",\n";
  out += event.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

}  // namespace

void append_process(std::string& out, int pid, const std::string& process_name,
                    const std::vector<Span>& spans) {
  append(out, metadata(pid, 0, "process_name", {{"name", process_name}}));
  append(out, metadata(pid, 0, "process_sort_index", {{"sort_index", pid}}));
  // The three known tracks always, so an idle reducer still shows; any other one its spans use.
  // (A set: a hostile file may give every one of its spans another tid.)
  std::set<int> tracks = {kEngine, kReducer, kPipelineComm};
  for (const auto& s : spans) tracks.insert(s.track);
  for (int t : tracks) {
    const char* known = track_name(t);
    append(out, metadata(pid, t, "thread_name", {{"name", known ? known : "track " + std::to_string(t)}}));
    append(out, metadata(pid, t, "thread_sort_index", {{"sort_index", t}}));
  }
}

void append_spans(std::string& out, int pid, const std::vector<Span>& spans, int64_t shift_us) {
  for (const auto& s : spans) {
    ojson e;
    e["ph"] = "X";
    e["pid"] = pid;
    e["tid"] = s.track;
    e["cat"] = s.cat;
    e["name"] = s.name;
    e["ts"] = s.ts_us + shift_us;
    e["dur"] = s.dur_us;
    ojson args = ojson::object();
    if (s.step >= 0) args["step"] = s.step;
    for (const auto& [k, v] : s.args) args[k] = v;
    e["args"] = std::move(args);
    append(out, e);
  }
}

ojson info_json(const RankInfo& info) {
  return {{"rank", info.rank},
          {"world", info.world},
          {"layout", info.layout},
          {"place", info.place},
          {"clock_offset_us", info.clock_offset_us},
          {"from_step", info.from_step},
          {"steps", info.steps}};
}

void finish_and_write(const std::string& path, std::string& out, const ojson& troupe_section) {
  if (out.empty()) out = "{\"traceEvents\": [";
  out += "\n],\n\"displayTimeUnit\": \"ms\",\n\"troupe\": ";
  out += troupe_section.dump(-1, ' ', false, ojson::error_handler_t::replace);
  out += "}\n";

  std::error_code ec;
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) fs::create_directories(parent, ec);
  if (ec) throw IoError("cannot create " + parent.string() + ": " + ec.message(), ec.value());
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw IoError("cannot write " + tmp + ": " + std::strerror(errno), errno);
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::write(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = n < 0 ? errno : EIO;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw IoError("cannot write " + tmp + ": " + std::strerror(e), e);
    }
    done += static_cast<size_t>(n);
  }
  // fsync before the rename: after a crash the name holds the whole file or the old one.
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw IoError("cannot write " + tmp + ": " + std::strerror(e), e);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw IoError("cannot rename " + tmp + " to " + path + ": " + std::strerror(e), e);
  }
}

}  // namespace json_detail

void write_rank_trace(const std::string& path, const RankInfo& info, const std::vector<Span>& spans) {
  std::string out;
  json_detail::append_process(out, info.rank,
                              info.place.empty() ? "rank " + std::to_string(info.rank) : info.place, spans);
  json_detail::append_spans(out, info.rank, spans, 0);
  json_detail::finish_and_write(path, out, json_detail::info_json(info));
}

}  // namespace troupe::trace

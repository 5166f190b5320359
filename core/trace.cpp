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
#include "core/hostile_file.hpp"
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

// ---- reading ----

namespace {

// |ts|, |dur| and offsets stay below 2^53 us (285 years): sums of them cannot overflow.
constexpr int64_t kMaxTimeUs = int64_t(1) << 53;
// Our files nest 4 deep; a deeper one is not ours, and refusing it bounds the parser's work.
constexpr int kMaxDepth = 32;

// Field readers: each failure names the file, where in it, and the field.
struct Fields {
  const std::string& path;
  std::string where;  // "event 3", "\"troupe\""

  [[noreturn]] void fail(const std::string& what) const { throw Error(path + ": " + where + ": " + what); }

  const ojson& field(const ojson& obj, const char* key) const {
    auto it = obj.find(key);
    if (it == obj.end()) fail(std::string("\"") + key + "\" is missing");
    return *it;
  }
  void expect(const ojson& v, bool ok, const char* key, const char* wanted) const {
    if (!ok)
      fail(std::string("\"") + key + "\" is " + (v.is_null() ? "null" : v.type_name()) + ", expected " +
           wanted);
  }
  std::string str(const ojson& obj, const char* key) const {
    const ojson& v = field(obj, key);
    expect(v, v.is_string(), key, "a string");
    return v.get<std::string>();
  }
  // An integer, or a whole-valued number in range (other tools write 12.0).
  int64_t integer(const ojson& obj, const char* key, int64_t lo, int64_t hi) const {
    const ojson& v = field(obj, key);
    return integer_value(v, key, lo, hi);
  }
  int64_t integer_value(const ojson& v, const char* key, int64_t lo, int64_t hi) const {
    expect(v, v.is_number(), key, "a number");
    int64_t x = 0;
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) fail(std::string("\"") + key + "\" is out of range");
      x = static_cast<int64_t>(u);
    } else if (v.is_number_integer()) {
      x = v.get<int64_t>();
    } else {
      const double d = v.get<double>();
      if (!std::isfinite(d) || std::fabs(d) > double(kMaxTimeUs))
        fail(std::string("\"") + key + "\" is out of range");
      x = static_cast<int64_t>(std::llround(d));
    }
    if (x < lo || x > hi)
      fail(std::string("\"") + key + "\" is " + std::to_string(x) + ", outside [" + std::to_string(lo) +
           ", " + std::to_string(hi) + "]");
    return x;
  }
};

RankInfo read_info(const std::string& path, const ojson& doc) {
  auto it = doc.find("troupe");
  require(it != doc.end(), path, ": no \"troupe\" section (not a troupe rank trace)");
  const Fields f{path, "\"troupe\""};
  if (!it->is_object()) f.fail(std::string("is ") + it->type_name() + ", expected an object");
  RankInfo info;
  info.world = static_cast<int>(f.integer(*it, "world", 1, 1 << 24));
  info.rank = static_cast<int>(f.integer(*it, "rank", 0, info.world - 1));
  info.layout = f.str(*it, "layout");
  info.place = f.str(*it, "place");
  info.clock_offset_us = f.integer(*it, "clock_offset_us", -kMaxTimeUs, kMaxTimeUs);
  info.from_step = f.integer(*it, "from_step", 0, kMaxTimeUs);
  info.steps = f.integer(*it, "steps", 0, kMaxTimeUs);
  return info;
}

Span read_span(const Fields& f, const ojson& e, int rank) {
  const int64_t pid = f.integer(e, "pid", 0, 1 << 24);
  if (pid != rank) f.fail("pid " + std::to_string(pid) + " is not this file's rank " + std::to_string(rank));
  Span s;
  s.track = static_cast<int>(f.integer(e, "tid", 0, 1 << 20));
  s.cat = f.str(e, "cat");
  s.name = f.str(e, "name");
  s.ts_us = f.integer(e, "ts", -kMaxTimeUs, kMaxTimeUs);
  const ojson& dur = f.field(e, "dur");
  f.expect(dur, dur.is_number(), "dur", "a number");
  if (dur.is_number_integer() && !dur.is_number_unsigned() && dur.get<int64_t>() < 0)
    f.fail("\"dur\" is " + std::to_string(dur.get<int64_t>()) + ", a negative duration");
  if (dur.is_number_float() && dur.get<double>() < 0) f.fail("\"dur\" is negative");
  s.dur_us = f.integer_value(dur, "dur", 0, kMaxTimeUs);
  auto args = e.find("args");
  if (args == e.end()) return s;
  if (!args->is_object()) f.fail(std::string("\"args\" is ") + args->type_name() + ", expected an object");
  for (auto it = args->begin(); it != args->end(); ++it) {
    if (it.key() == "step" && it->is_number()) {
      s.step = f.integer_value(*it, "step", 0, kMaxTimeUs);
    } else if (it->is_string()) {
      s.args.emplace_back(it.key(), it->get<std::string>());
    } else {
      // Another tool's argument: kept as its JSON text, so nothing the viewer showed is lost.
      s.args.emplace_back(it.key(), it->dump(-1, ' ', false, ojson::error_handler_t::replace));
    }
  }
  return s;
}

}  // namespace

RankTrace read_rank_trace(const std::string& path) { return read_rank_trace(path, ReadLimits{}); }

RankTrace read_rank_trace(const std::string& path, const ReadLimits& limits) {
  const std::string text = read_regular_file(path, limits.max_bytes, "trace file");
  require(json_depth(text, kMaxDepth) <= kMaxDepth, path, ": JSON nested deeper than ", kMaxDepth,
          " levels (not a trace file)");
  ojson doc;
  try {
    doc = ojson::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": not valid JSON: " + e.what());
  }
  require(doc.is_object(), path, ": the top level is ", doc.type_name(), ", expected an object");
  auto events = doc.find("traceEvents");
  require(events != doc.end(), path, ": no \"traceEvents\" array");
  require(events->is_array(), path, ": \"traceEvents\" is ", events->type_name(), ", expected an array");
  require(events->size() <= limits.max_events, path, ": ", events->size(), " events, more than the ",
          limits.max_events, " a trace file may hold");

  RankTrace t;
  t.info = read_info(path, doc);
  t.spans.reserve(events->size());
  for (size_t i = 0; i < events->size(); ++i) {
    const ojson& e = (*events)[i];
    const Fields f{path, "event " + std::to_string(i)};
    if (!e.is_object()) f.fail(std::string("is ") + e.type_name() + ", expected an object");
    const std::string ph = f.str(e, "ph");
    if (ph == "M") continue;  // names and sort order: written anew from RankInfo
    if (ph != "X") f.fail("phase \"" + ph + "\" is not one troupe writes (\"X\" or \"M\")");
    t.spans.push_back(read_span(f, e, t.info.rank));
  }
  return t;
}

}  // namespace troupe::trace

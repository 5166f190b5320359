// Reading a rank's trace file back, as hostile input: one pass over the text (core/json_read),
// one event at a time. The text is held once; of each event only its Span is kept, so a trace
// takes its text plus at most 4x its size in spans (refused beyond), whatever its shape, and the
// work is linear in its events and keys (an event's keys in an ordered map, at most kMaxArgs
// arguments each).
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.hpp"
#include "core/hostile_file.hpp"
#include "core/json_read.hpp"
#include "core/trace.hpp"

namespace troupe::trace {

namespace {

using json = nlohmann::json;

// |ts|, |dur| and offsets stay below 2^53 us (285 years): sums of them cannot overflow.
constexpr int64_t kMaxTimeUs = int64_t(1) << 53;
// Our files nest 4 deep (an argument of another tool's may hold a little more); a deeper one
// is not a trace, and refusing it bounds the reader's work.
constexpr int kMaxDepth = 32;
// troupe writes at most a handful of arguments per span; other tools a few more.
constexpr size_t kMaxArgs = 64;
// One event, or the "troupe" section, as a DOM: a few hundred bytes for a real one.
constexpr uint64_t kPartBudget = uint64_t(1) << 20;
// The spans kept may take this many times the file's bytes (plus 1 MiB).
constexpr uint64_t kSpanMemoryFactor = 4;

// Field readers: each failure names the file, where in it, and the field.
struct Fields {
  const std::string& path;
  std::string where;  // "event 3", "\"troupe\""

  [[noreturn]] void fail(const std::string& what) const { throw Error(path + ": " + where + ": " + what); }

  const json& field(const json& obj, const char* key) const {
    auto it = obj.find(key);
    if (it == obj.end()) fail(std::string("\"") + key + "\" is missing");
    return *it;
  }
  void expect(const json& v, bool ok, const char* key, const char* wanted) const {
    if (!ok)
      fail(std::string("\"") + key + "\" is " + (v.is_null() ? "null" : v.type_name()) + ", expected " +
           wanted);
  }
  std::string str(const json& obj, const char* key) const {
    const json& v = field(obj, key);
    expect(v, v.is_string(), key, "a string");
    return v.get<std::string>();
  }
  // An integer, or a whole-valued number in range (other tools write 12.0).
  int64_t integer(const json& obj, const char* key, int64_t lo, int64_t hi) const {
    return integer_value(field(obj, key), key, lo, hi);
  }
  int64_t integer_value(const json& v, const char* key, int64_t lo, int64_t hi) const {
    expect(v, v.is_number(), key, "a number");
    int64_t x = 0;
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX))
        fail(std::string("\"") + key + "\" is " + std::to_string(u) + ", out of range");
      x = static_cast<int64_t>(u);
    } else if (v.is_number_integer()) {
      x = v.get<int64_t>();
    } else {
      const double d = v.get<double>();
      if (!std::isfinite(d) || std::fabs(d) > double(kMaxTimeUs))
        fail(std::string("\"") + key + "\" is " + v.dump() + ", out of range");
      x = static_cast<int64_t>(std::llround(d));
    }
    if (x < lo || x > hi)
      fail(std::string("\"") + key + "\" is " + std::to_string(x) + ", outside [" + std::to_string(lo) +
           ", " + std::to_string(hi) + "]");
    return x;
  }
};

RankInfo read_info(const std::string& path, const json& t) {
  const Fields f{path, "\"troupe\""};
  if (!t.is_object()) f.fail(std::string("is ") + t.type_name() + ", expected an object");
  RankInfo info;
  info.world = static_cast<int>(f.integer(t, "world", 1, 1 << 24));
  info.rank = static_cast<int>(f.integer(t, "rank", 0, info.world - 1));
  info.layout = f.str(t, "layout");
  info.place = f.str(t, "place");
  info.clock_offset_us = f.integer(t, "clock_offset_us", -kMaxTimeUs, kMaxTimeUs);
  info.from_step = f.integer(t, "from_step", 0, kMaxTimeUs);
  info.steps = f.integer(t, "steps", 0, kMaxTimeUs);
  return info;
}

// A span's fields (args aside) checked and converted; the pid is checked against the rank
// once the "troupe" section has been read.
Span read_span(const Fields& f, const json& e, std::vector<std::pair<std::string, json>>&& args) {
  Span s;
  s.track = static_cast<int>(f.integer(e, "tid", 0, 1 << 20));
  s.cat = f.str(e, "cat");
  s.name = f.str(e, "name");
  s.ts_us = f.integer(e, "ts", -kMaxTimeUs, kMaxTimeUs);
  const json& dur = f.field(e, "dur");
  f.expect(dur, dur.is_number(), "dur", "a number");
  if (dur.is_number_integer() && !dur.is_number_unsigned() && dur.get<int64_t>() < 0)
    f.fail("\"dur\" is " + std::to_string(dur.get<int64_t>()) + ", a negative duration");
  if (dur.is_number_float() && dur.get<double>() < 0) f.fail("\"dur\" is negative");
  s.dur_us = f.integer_value(dur, "dur", 0, kMaxTimeUs);
  s.args.reserve(args.size());
  for (auto& [k, v] : args) {
    if (k == "step" && v.is_number()) {
      s.step = f.integer_value(v, "step", 0, kMaxTimeUs);
    } else if (v.is_string()) {
      s.args.emplace_back(std::move(k), std::move(v.get_ref<std::string&>()));
    } else {
      // Another tool's argument: kept as its JSON text, so nothing the viewer showed is lost.
      s.args.emplace_back(std::move(k), v.dump(-1, ' ', false, json::error_handler_t::replace));
    }
  }
  return s;
}

uint64_t heap_bytes(const std::string& s) { return s.capacity() > 15 ? s.capacity() + 17 : 0; }

// What a kept span costs: its slot in the vector (doubled by growth) and its heap.
uint64_t span_bytes(const Span& s) {
  uint64_t n = 2 * sizeof(Span) + heap_bytes(s.cat) + heap_bytes(s.name);
  if (!s.args.empty()) n += s.args.capacity() * sizeof(s.args[0]) + 16;
  for (const auto& [k, v] : s.args) n += heap_bytes(k) + heap_bytes(v);
  return n;
}

// The events of a trace document, as a state machine over its nesting:
//
//   depth 0  {                                      the document
//   depth 1    "traceEvents": [                     the events      "troupe": {...}  other keys
//   depth 2      {                                  one event       (built whole)    (passed over)
//   depth 3        "ph": "X", ..., "args": {        its fields
//   depth 4          "step": 12, "op": "x", ...     its arguments, in order (a container
//                                                   among them built whole, then written back)
class TraceReader : public json_read::Handler {
 public:
  TraceReader(const std::string& path, const ReadLimits& limits, uint64_t text_bytes)
      : path_(path), limits_(limits), span_budget_(text_bytes * kSpanMemoryFactor + (uint64_t(1) << 20)) {}

  bool value(json&& v, int depth) override {
    if (part_) return feed_part([&](json_read::Handler& h) { return h.value(std::move(v), depth); });
    if (skip_depth_ >= 0) return true;
    if (depth == 0) return stop(std::string("the top level is ") + v.type_name() + ", expected an object");
    if (depth == 1) return top_scalar(v);
    if (depth == 2)
      return stop("event " + std::to_string(n_events_) + ": is " + v.type_name() + ", expected an object");
    if (depth == 3) return event_field(std::move(v));
    return arg(std::move(v));  // depth 4, in "args"
  }

  bool begin(bool object, int depth) override {
    if (part_) return feed_part([&](json_read::Handler& h) { return h.begin(object, depth); });
    if (skip_depth_ >= 0) return true;
    switch (depth) {
      case 0:
        return object || stop("the top level is array, expected an object");
      case 1:
        if (top_key_ == "traceEvents") {
          if (object) return stop("\"traceEvents\" is object, expected an array");
          saw_events_ = true;
          return true;
        }
        if (top_key_ == "troupe") return start_part(depth, object);
        return skip(depth);
      case 2:
        if (!object) return stop("event " + std::to_string(n_events_) + ": is array, expected an object");
        if (++n_events_ > limits_.max_events)
          return stop("more than the " + std::to_string(limits_.max_events) +
                      " events a trace file may hold");
        event_ = json::object();
        args_.clear();
        seen_args_ = false;
        return true;
      case 3:
        if (event_key_ == "args") {
          if (!object) return stop(event_name() + ": \"args\" is array, expected an object");
          return fresh_event_key();
        }
        // A known field that is a container: kept as an empty one of its type, for the message
        // that names it; the rest of the event's containers are passed over.
        if (known(event_key_)) {
          if (!fresh_event_key()) return false;
          event_[event_key_] = object ? json::object() : json::array();
        }
        return skip(depth);
      default:  // an argument that is an object or an array
        return start_part(depth, object);
    }
  }

  bool key(std::string&& k, int depth) override {
    if (part_) return feed_part([&](json_read::Handler& h) { return h.key(std::move(k), depth); });
    if (skip_depth_ >= 0) return true;
    if (depth == 1) {
      if (!top_keys_.insert(k).second) return stop("the key \"" + k.substr(0, 40) + "\" appears twice");
      top_key_ = std::move(k);
    } else if (depth == 3) {
      event_key_ = std::move(k);
    } else {
      if (args_.size() >= kMaxArgs)
        return stop(event_name() + ": more than " + std::to_string(kMaxArgs) + " arguments");
      for (const auto& a : args_)
        if (a.first == k)
          return stop(event_name() + ": the argument \"" + k.substr(0, 40) + "\" appears twice");
      arg_key_ = std::move(k);
    }
    return true;
  }

  bool end(bool object, int depth) override {
    if (part_) return feed_part([&](json_read::Handler& h) { return h.end(object, depth); });
    if (skip_depth_ >= 0) {
      if (depth == skip_depth_) skip_depth_ = -1;
      return true;
    }
    if (depth == 2) return finish_event();
    return true;
  }

  RankTrace finish() {
    require(troupe_ != nullptr, path_, ": no \"troupe\" section (not a troupe rank trace)");
    require(saw_events_, path_, ": no \"traceEvents\" array");
    RankTrace t;
    t.info = read_info(path_, *troupe_);
    if (first_pid_ >= 0 && first_pid_ != t.info.rank)
      Fields{path_, "event " + std::to_string(first_pid_event_)}.fail(
          "pid " + std::to_string(first_pid_) + " is not this file's rank " + std::to_string(t.info.rank));
    if (other_pid_event_ >= 0)
      Fields{path_, "event " + std::to_string(other_pid_event_)}.fail(
          "pid " + std::to_string(other_pid_) + " is not this file's rank " + std::to_string(t.info.rank));
    t.spans = std::move(spans_);
    return t;
  }

 private:
  static bool known(const std::string& k) {
    for (const char* n : {"ph", "pid", "tid", "cat", "name", "ts", "dur"})
      if (k == n) return true;
    return false;
  }
  std::string event_name() const { return "event " + std::to_string(n_events_ - 1); }
  bool stop(std::string why) {
    fail(std::move(why));
    return false;
  }
  bool skip(int depth) {
    skip_depth_ = depth;
    return true;
  }
  bool fresh_event_key() {
    if (event_.contains(event_key_) || (event_key_ == "args" && seen_args_))
      return stop(event_name() + ": the key \"" + event_key_ + "\" appears twice");
    seen_args_ = seen_args_ || event_key_ == "args";
    return true;
  }

  bool top_scalar(const json& v) {
    if (top_key_ == "traceEvents")
      return stop(std::string("\"traceEvents\" is ") + v.type_name() + ", expected an array");
    if (top_key_ == "troupe")
      return stop(std::string("\"troupe\": is ") + v.type_name() + ", expected an object");
    return true;
  }

  bool event_field(json&& v) {
    if (event_key_ == "args")
      return stop(event_name() + ": \"args\" is " + v.type_name() + ", expected an object");
    if (!known(event_key_)) return true;
    if (!fresh_event_key()) return false;
    event_[event_key_] = std::move(v);
    return true;
  }

  bool arg(json&& v) {
    args_.emplace_back(std::move(arg_key_), std::move(v));
    return true;
  }

  // The "troupe" section, or one argument that is a container: built whole, then handed on.
  bool start_part(int depth, bool object) {
    part_ = std::make_unique<json_read::DomBuilder>(kPartBudget);
    part_depth_ = depth;
    return part_->begin(object, depth);
  }
  template <class F>
  bool feed_part(F&& f) {
    if (!f(*part_)) return stop((depth_name()) + part_->error());
    if (!part_->done()) return true;
    json v = part_->take();
    part_.reset();
    if (part_depth_ == 1) {
      troupe_ = std::make_unique<json>(std::move(v));
      return true;
    }
    return arg(std::move(v));
  }
  std::string depth_name() const { return part_depth_ == 1 ? "\"troupe\": " : event_name() + ": "; }

  bool finish_event() {
    const Fields f{path_, event_name()};
    const std::string ph = f.str(event_, "ph");
    if (ph == "M") return true;  // names and sort order: written anew from RankInfo
    if (ph != "X") f.fail("phase \"" + ph + "\" is not one troupe writes (\"X\" or \"M\")");
    const int64_t pid = f.integer(event_, "pid", 0, 1 << 24);
    if (first_pid_ < 0) {
      first_pid_ = pid;
      first_pid_event_ = n_events_ - 1;
    } else if (pid != first_pid_ && other_pid_event_ < 0) {
      other_pid_ = pid;
      other_pid_event_ = n_events_ - 1;
    }
    spans_.push_back(read_span(f, event_, std::move(args_)));
    args_.clear();
    span_memory_ += span_bytes(spans_.back());
    if (span_memory_ > span_budget_)
      f.fail("the spans read so far take more than " + std::to_string(span_budget_) + " bytes (" +
             std::to_string(kSpanMemoryFactor) + " times the file): arguments or names too many or too long");
    return true;
  }

  const std::string& path_;
  ReadLimits limits_;
  uint64_t span_budget_, span_memory_ = 0;
  std::set<std::string> top_keys_;
  std::string top_key_, event_key_, arg_key_;
  bool saw_events_ = false, seen_args_ = false;
  int skip_depth_ = -1;  // >= 0: passing over the container that began at this depth
  std::unique_ptr<json_read::DomBuilder> part_;
  int part_depth_ = 0;
  std::unique_ptr<json> troupe_;
  uint64_t n_events_ = 0;
  json event_;
  std::vector<std::pair<std::string, json>> args_;
  int64_t first_pid_ = -1, other_pid_ = -1;
  int64_t first_pid_event_ = -1, other_pid_event_ = -1;
  std::vector<Span> spans_;
};

}  // namespace

RankTrace read_rank_trace(const std::string& path) { return read_rank_trace(path, ReadLimits{}); }

RankTrace read_rank_trace(const std::string& path, const ReadLimits& limits) {
  const std::string text = read_regular_file(path, limits.max_bytes, "trace file");
  TraceReader reader(path, limits, text.size());
  json_read::Limits jl;
  jl.max_bytes = limits.max_bytes;
  jl.max_depth = kMaxDepth;
  json_read::read_events(text, path, jl, reader);
  return reader.finish();
}

}  // namespace troupe::trace

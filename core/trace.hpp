// Timeline traces: what each rank did, span by span, during a window of optimizer steps.
//
// `train.trace: {from_step, steps}` makes every rank keep a Recorder; the engine marks spans
// (a step, the pipeline schedule, each F/B/W, each collective, the optimizer, checkpoint
// snapshot/write, data loading) and, once the window has passed, writes
//
//   <run_dir>/trace/rank<r>.json
//
// in the Chrome trace-event format that Perfetto and chrome://tracing open: pid = rank,
// tid = track, one "X" (complete) event per span, "M" events naming the process and tracks:
//
//   {"traceEvents": [
//      {"ph":"M","pid":1,"tid":0,"name":"process_name","args":{"name":"rank 1: dp 0 pp 1 tp 0, ..."}},
//      {"ph":"M","pid":1,"tid":0,"name":"thread_name","args":{"name":"engine"}},
//      {"ph":"X","pid":1,"tid":0,"cat":"compute","name":"F3","ts":1200,"dur":310,
//       "args":{"step":12,"chunk":"0"}},
//      ...],
//    "displayTimeUnit": "ms",
//    "troupe": {"rank":1,"world":2,"layout":"1x2x1","place":"...","clock_offset_us":-35,
//               "from_step":12,"steps":3}}
//
// "step" in an event's args is the span's optimizer step (absent when -1); a span's own args
// are strings and should not use that key. `troupe trace merge` (merge below) puts the ranks
// on rank 0's clock in one file and reports per-step compute / communication / bubble shares.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace troupe::trace {

// Tracks (Chrome "tid") within a rank: what thread a span ran on.
enum Track : int { kEngine = 0, kReducer = 1, kPipelineComm = 2, kCheckpointWriter = 3 };

struct Span {
  std::string cat;    // "step", "schedule", "compute", "comm", "optimizer", "checkpoint", "data", "eval"
  std::string name;   // "step 12", "F3", "B2.1", "W0", "p2p batch", "allreduce bucket", "optimizer", ...
  int64_t ts_us = 0;  // start, microseconds on the recorder's clock (steady_clock since its origin)
  int64_t dur_us = 0;
  int64_t step = -1;  // optimizer step it belongs to (-1: none)
  int track = kEngine;
  std::vector<std::pair<std::string, std::string>> args;  // shown by the viewer: {"op","allreduce"}, ...
};

// Collects the spans of steps [from_step, from_step + steps) of one rank. With steps == 0 it
// is off, and every call is one relaxed atomic load (no clock read, no lock, no allocation):
// tracing off costs nothing measurable. (The caller's own std::string and args arguments are
// built before the call: on a hot path with long names or args, test active() first.)
class Recorder {
 public:
  Recorder() = default;  // off
  Recorder(int64_t from_step, int64_t steps);
  // Movable so an owner can set it up late; only before any thread records into it.
  Recorder(Recorder&& o) noexcept;
  Recorder& operator=(Recorder&& o) noexcept;

  // The engine's step now running (thread-safe); spans count while it is traced.
  void set_step(int64_t step);
  // The current step is traced.
  bool active() const { return active_.load(std::memory_order_relaxed); }
  // Every traced step has passed (set_step beyond the window); false when off.
  bool done() const;
  // steady_clock microseconds since this recorder's origin.
  int64_t now_us() const { return to_us(std::chrono::steady_clock::now()); }
  // The same for a time point taken elsewhere.
  int64_t to_us(std::chrono::steady_clock::time_point t) const {
    return std::chrono::duration_cast<std::chrono::microseconds>(t - origin_).count();
  }
  // Thread-safe; dropped unless active(); s.step defaults (-1) to the current step.
  void add(Span s);

  // RAII: records [construction, destruction) as one span when active() at construction,
  // even when the step has moved on by its destruction (a span belongs to the step it began in).
  class Scope {
   public:
    Scope(Recorder& r, std::string cat, std::string name, int track = kEngine,
          std::vector<std::pair<std::string, std::string>> args = {});
    ~Scope() noexcept;
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Recorder* r_ = nullptr;  // null: not recording
    Span span_;
  };

  // The spans so far, in start order; leaves none.
  std::vector<Span> take();
  int64_t from_step() const { return from_step_; }
  int64_t steps() const { return steps_; }

 private:
  void push(Span s);  // no window check: the caller made it

  int64_t from_step_ = 0;
  int64_t steps_ = 0;
  std::chrono::steady_clock::time_point origin_ = std::chrono::steady_clock::now();
  std::atomic<int64_t> step_{-1};
  std::atomic<bool> active_{false};
  std::mutex mu_;
  std::vector<Span> spans_;
};

// What a rank's file says of itself, beside its spans.
struct RankInfo {
  int rank = 0, world = 1;
  std::string layout;  // "1x2x1"
  std::string place;   // "rank 1: dp 0 pp 1 tp 0, layers [2,4)+head"
  int64_t clock_offset_us =
      0;  // add to this rank's ts to get rank 0's clock (measured at rendezvous; 0 for rank 0)
  int64_t from_step = 0, steps = 0;
};
struct RankTrace {
  RankInfo info;
  std::vector<Span> spans;
};

// Writes {"traceEvents": [...], "displayTimeUnit": "ms", "troupe": {RankInfo fields}} with
// pid = rank, tid = track, "X" (complete) events, and "M" metadata events naming the process
// ("rank 1: dp 0 pp 1 tp 0 ...") and the tracks ("engine", "data-parallel reducer",
// "pipeline comm"). Atomic: written to path + ".tmp", fsynced, renamed. Creates the parent
// directory. Throws troupe::IoError when the disk refuses.
void write_rank_trace(const std::string& path, const RankInfo& info, const std::vector<Span>& spans);

// What read_rank_trace accepts at most; tests pass smaller limits.
inline constexpr uint64_t kMaxTraceFileBytes = uint64_t(256) << 20;
inline constexpr uint64_t kMaxTraceEvents = 10'000'000;
struct ReadLimits {
  uint64_t max_bytes = kMaxTraceFileBytes;
  uint64_t max_events = kMaxTraceEvents;
};

// Reads one back. The file is hostile: at most 256 MiB, refused unless a regular file; JSON
// parse errors, missing or mistyped fields, negative durations, more than 10 million events
// are troupe::Error naming the file and what is wrong.
RankTrace read_rank_trace(const std::string& path);
RankTrace read_rank_trace(const std::string& path, const ReadLimits& limits);

struct StepShares {
  int64_t step = 0;
  double wall_ms = 0;  // mean over ranks of the "step" span
  // Mean over ranks of the share of the step span on the engine track in compute / comm
  // spans, in the rest (optimizer, checkpoint, data, eval), and in none.
  double compute = 0, comm = 0, other = 0, idle = 0;
  // Pipeline: mean over ranks of 1 - (compute inside the "schedule" span) / (schedule span);
  // -1 when no rank has a schedule span in the step (what bench/pipeline_bubble measures).
  double bubble = -1;
};

// The shares of one step of one rank's spans, or nothing (wall_ms < 0) when the rank has no
// "step" span for it. merge() averages these over the ranks.
StepShares step_shares(const std::vector<Span>& spans, int64_t step);

// Every rank's spans shifted by its clock_offset_us onto rank 0's clock, one process per rank,
// written to out_path (the same format; atomic); returns the shares of every step present in
// all ranks, in step order.
std::vector<StepShares> merge(const std::vector<RankTrace>& ranks, const std::string& out_path);

// "rank<r>.json" files of dir, sorted by rank (rank0, rank1, ..., rank10); throws troupe::Error
// when dir is not a directory or holds none.
std::vector<std::string> rank_trace_files(const std::string& dir);

}  // namespace troupe::trace

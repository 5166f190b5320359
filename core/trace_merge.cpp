// Merging rank traces onto one clock, and the per-step shares `troupe trace merge` prints.
//
// The engine track nests: a "step" span holds a "schedule" span, which holds F/B/W compute
// spans and "comm" batches; beside the schedule sit the optimizer, checkpoint, data, eval.
//
//   step 12  |==============================================================|
//   schedule |   |==========================================|               |
//   leaves   |dd |FF|  |cc|FF|BBBB|cc|  |BBBB|cc|      |BBBB|oooo| kkk     |
//
// "step" and "schedule" are frames, not work: the shares count only the leaves (compute,
// comm, and every other category), each instant once, by the outermost leaf covering it (a
// comm span the engine opened inside a backward counts as compute, the backward's).
// idle is what no leaf covers. The bubble is the schedule's time without compute.
#include <algorithm>
#include <array>
#include <cctype>
#include <cstdint>
#include <filesystem>
#include <map>
#include <set>

#include "core/error.hpp"
#include "core/trace.hpp"
#include "core/trace_json.hpp"

namespace troupe::trace {

namespace fs = std::filesystem;

namespace {

enum Kind { kCompute = 0, kComm = 1, kOther = 2 };

// A stretch of the engine track that one outermost leaf covers.
struct Segment {
  int64_t lo, hi;  // [lo, hi) microseconds
  Kind kind;
};

bool is_frame(const Span& s) { return s.cat == "step" || s.cat == "schedule"; }

Kind kind_of(const std::string& cat) {
  if (cat == "compute") return kCompute;
  if (cat == "comm") return kComm;
  return kOther;
}

// The engine track's leaves as disjoint segments in time order, each instant attributed to the
// outermost leaf that covers it: sorted by start (the longer first on a tie), a leaf counts
// only past the end of everything before it.
std::vector<Segment> segments(const std::vector<Span>& spans) {
  std::vector<const Span*> leaves;
  for (const auto& s : spans)
    if (s.track == kEngine && !is_frame(s) && s.dur_us > 0) leaves.push_back(&s);
  std::sort(leaves.begin(), leaves.end(), [](const Span* a, const Span* b) {
    return a->ts_us != b->ts_us ? a->ts_us < b->ts_us : a->dur_us > b->dur_us;
  });
  std::vector<Segment> out;
  int64_t covered = INT64_MIN;
  for (const Span* s : leaves) {
    const int64_t lo = std::max(s->ts_us, covered), hi = s->ts_us + s->dur_us;
    if (hi <= lo) continue;
    out.push_back({lo, hi, kind_of(s->cat)});
    covered = hi;
  }
  return out;
}

// Microseconds of [lo, hi) covered by each kind.
std::array<int64_t, 3> covered_in(const std::vector<Segment>& segs, int64_t lo, int64_t hi) {
  std::array<int64_t, 3> t{0, 0, 0};
  auto it =
      std::lower_bound(segs.begin(), segs.end(), lo, [](const Segment& s, int64_t x) { return s.hi <= x; });
  for (; it != segs.end() && it->lo < hi; ++it) t[it->kind] += std::min(hi, it->hi) - std::max(lo, it->lo);
  return t;
}

const Span* step_span(const std::vector<Span>& spans, int64_t step) {
  for (const auto& s : spans)
    if (s.track == kEngine && s.cat == "step" && s.step == step) return &s;
  return nullptr;
}

StepShares shares_of(const std::vector<Span>& spans, const std::vector<Segment>& segs, const Span& step) {
  StepShares r;
  r.step = step.step;
  r.wall_ms = double(step.dur_us) / 1000.0;
  const int64_t lo = step.ts_us, hi = step.ts_us + step.dur_us;
  if (step.dur_us > 0) {
    const auto t = covered_in(segs, lo, hi);
    r.compute = double(t[kCompute]) / double(step.dur_us);
    r.comm = double(t[kComm]) / double(step.dur_us);
    r.other = double(t[kOther]) / double(step.dur_us);
    r.idle = std::max(0.0, 1.0 - r.compute - r.comm - r.other);
  }
  int64_t sched = 0, sched_compute = 0;
  bool any = false;
  for (const auto& s : spans) {
    if (s.track != kEngine || s.cat != "schedule" || s.ts_us < lo || s.ts_us >= hi) continue;
    any = true;
    sched += s.dur_us;
    sched_compute += covered_in(segs, s.ts_us, s.ts_us + s.dur_us)[kCompute];
  }
  if (any) r.bubble = sched > 0 ? 1.0 - double(sched_compute) / double(sched) : 0.0;
  return r;
}

}  // namespace

StepShares step_shares(const std::vector<Span>& spans, int64_t step) {
  const Span* s = step_span(spans, step);
  if (s == nullptr) {
    StepShares none;
    none.step = step;
    none.wall_ms = -1;
    return none;
  }
  return shares_of(spans, segments(spans), *s);
}

std::vector<StepShares> merge(const std::vector<RankTrace>& ranks, const std::string& out_path) {
  require(!ranks.empty(), "trace merge: no rank traces to merge");
  std::set<int> seen;
  for (const auto& r : ranks)
    require(seen.insert(r.info.rank).second, "trace merge: rank ", r.info.rank, " appears twice");
  // One job's traces: every rank of one world, layout and window (a resized or restarted job can
  // leave another generation's files behind).
  const RankInfo& first_info = ranks.front().info;
  for (const auto& r : ranks) {
    const RankInfo& i = r.info;
    require(i.world == first_info.world && i.layout == first_info.layout &&
                i.from_step == first_info.from_step && i.steps == first_info.steps,
            "trace merge: rank ", i.rank, " traced steps [", i.from_step, ", ", i.from_step + i.steps,
            ") of layout ", i.layout, " (world ", i.world, "), rank ", first_info.rank, " steps [",
            first_info.from_step, ", ", first_info.from_step + first_info.steps, ") of layout ",
            first_info.layout, ": traces of different runs or generations; remove the stale files");
    require(i.rank >= 0 && i.rank < first_info.world, "trace merge: rank ", i.rank, " outside a world of ",
            first_info.world);
  }
  require(static_cast<int>(ranks.size()) == first_info.world, "trace merge: ", ranks.size(),
          " rank files for a world of ", first_info.world, ": a rank's trace is missing");

  // Per rank: step -> its shares. A step counts when every rank has its "step" span.
  std::vector<std::map<int64_t, StepShares>> per_rank(ranks.size());
  for (size_t i = 0; i < ranks.size(); ++i) {
    const auto segs = segments(ranks[i].spans);
    for (const auto& s : ranks[i].spans)
      if (s.track == kEngine && s.cat == "step" && s.step >= 0 && !per_rank[i].count(s.step))
        per_rank[i][s.step] = shares_of(ranks[i].spans, segs, s);
  }
  std::vector<StepShares> out;
  for (const auto& [step, first] : per_rank[0]) {
    (void)first;
    StepShares m;
    m.step = step;
    int with_bubble = 0;
    double bubble = 0;
    bool in_all = true;
    for (const auto& pr : per_rank) {
      auto it = pr.find(step);
      if (it == pr.end()) {
        in_all = false;
        break;
      }
      const StepShares& r = it->second;
      m.wall_ms += r.wall_ms;
      m.compute += r.compute;
      m.comm += r.comm;
      m.other += r.other;
      m.idle += r.idle;
      if (r.bubble >= 0) {
        bubble += r.bubble;
        ++with_bubble;
      }
    }
    if (!in_all) continue;
    const double n = double(ranks.size());
    m.wall_ms /= n;
    m.compute /= n;
    m.comm /= n;
    m.other /= n;
    m.idle /= n;
    m.bubble = with_bubble ? bubble / with_bubble : -1;
    out.push_back(m);
  }

  // One process per rank, in rank order, on rank 0's clock.
  std::vector<const RankTrace*> order;
  for (const auto& r : ranks) order.push_back(&r);
  std::sort(order.begin(), order.end(),
            [](const RankTrace* a, const RankTrace* b) { return a->info.rank < b->info.rank; });
  std::string text;
  nlohmann::ordered_json section;
  section["merged"] = true;
  section["world"] = order.front()->info.world;
  section["ranks"] = nlohmann::ordered_json::array();
  for (const RankTrace* r : order) {
    const std::string name = r->info.place.empty() ? "rank " + std::to_string(r->info.rank) : r->info.place;
    json_detail::append_process(text, r->info.rank, name, r->spans);
    json_detail::append_spans(text, r->info.rank, r->spans, r->info.clock_offset_us);
    section["ranks"].push_back(json_detail::info_json(r->info));
  }
  section["shares"] = nlohmann::ordered_json::array();
  for (const auto& s : out)
    section["shares"].push_back({{"step", s.step},
                                 {"wall_ms", s.wall_ms},
                                 {"compute", s.compute},
                                 {"comm", s.comm},
                                 {"other", s.other},
                                 {"idle", s.idle},
                                 {"bubble", s.bubble}});
  json_detail::finish_and_write(out_path, text, section);
  return out;
}

std::vector<std::string> rank_trace_files(const std::string& dir) {
  std::error_code ec;
  require(fs::is_directory(dir, ec), dir, ": not a directory");
  std::vector<std::pair<long, std::string>> found;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    // rank<digits>.json; a handful of digits, so the number cannot overflow.
    if (name.size() < 10 || name.size() > 18 || name.compare(0, 4, "rank") != 0 ||
        name.compare(name.size() - 5, 5, ".json") != 0)
      continue;
    const std::string digits = name.substr(4, name.size() - 9);
    if (!std::all_of(digits.begin(), digits.end(), [](unsigned char c) { return std::isdigit(c); })) continue;
    found.emplace_back(std::stol(digits), it->path().string());
  }
  require(!ec, dir, ": cannot list: ", ec.message());
  require(!found.empty(), dir, ": no rank<r>.json trace files");
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

}  // namespace troupe::trace

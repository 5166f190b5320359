// The spec's sections as tables: each key once, with the getter that reads and checks it, then the
// section's rules. The tables are the schema: the keys they declare are the keys a section accepts
// and the ones did-you-mean suggests (schema() in spec_validate.cpp walks them), so a key added
// to a table is both read and known. docs/job-spec.md describes the same keys for users.
//
// Rules run after their section's fields and may read earlier sections (parallel's rules check
// the model's width and the train batch), which is why the root table lists sections in the order
// they depend on each other.
//
// This file: the root table, the small sections (resources, checkpoint, fault, elastic) and the
// helpers the section files share (core/spec_sections.hpp); model, data, train and parallel have
// a file each (spec_sections_<section>.cpp).
#include "core/spec_sections.hpp"

#include <algorithm>
#include <cstdint>

#include "core/layout.hpp"

namespace troupe::spec_detail {

// Divisors of n nearest to `near`, to suggest a value that satisfies a divisibility rule.
std::string nearby_divisors(int64_t n, int64_t near, int64_t min) {
  std::vector<int64_t> ds;
  for (int64_t d = 1; d * d <= n && d < 1000000; ++d)
    if (n % d == 0) {
      if (d >= min) ds.push_back(d);
      if (n / d >= min) ds.push_back(n / d);
    }
  if (ds.empty())
    return "none: no divisor of " + std::to_string(n) + " is " + std::to_string(min) + " or more";
  std::sort(ds.begin(), ds.end());
  ds.erase(std::unique(ds.begin(), ds.end()), ds.end());
  std::sort(ds.begin(), ds.end(), [&](int64_t a, int64_t b) {
    return std::llabs(a - near) < std::llabs(b - near) ||
           (std::llabs(a - near) == std::llabs(b - near) && a < b);
  });
  if (ds.size() > 3) ds.resize(3);
  std::sort(ds.begin(), ds.end());
  std::string s;
  for (size_t i = 0; i < ds.size(); ++i)
    s += (i ? (i + 1 == ds.size() ? " or " : ", ") : "") + std::to_string(ds[i]);
  return s;
}

bool is_gpt(Ctx& ctx, const ModelSpec& m) { return ctx.ok("model.type") && m.type == ModelType::gpt; }
bool is_llama(Ctx& ctx, const ModelSpec& m) { return ctx.ok("model.type") && m.type == ModelType::llama; }
// Models with attention heads: gpt and llama.
bool has_heads(Ctx& ctx, const ModelSpec& m) { return is_gpt(ctx, m) || is_llama(ctx, m); }

namespace {

bool valid_name(const std::string& s) {
  if (s.empty() || s.size() > 64 || s[0] == '.' || s[0] == '-') return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_' || c == '.';
  });
}

// ---- resources, checkpoint, fault

const Table& resources_table() {
  static const Table t{{
      {"device", [](S& s, K& k, JobSpec& j) { s.enumeration(k, j.resources.device); }},
      {"threads_per_worker",
       [](S& s, K& k, JobSpec& j) { s.integer(k, j.resources.threads_per_worker, 1, 1024); }},
      {"memory_per_device", [](S& s, K& k, JobSpec& j) { s.size(k, j.resources.memory_per_device); }},
      {"hardware", [](S& s, K& k, JobSpec& j) { s.hardware_name(k, j.resources.hardware); }},
      {"spares",
       [](S& s, K& k, JobSpec& j) {
         s.integer(k, j.resources.spares, 0, kMaxSpares, false,
                   "resources.spares is 0 (none) to " + std::to_string(kMaxSpares) +
                       " idle worker processes kept ready");
       }},
      {"placement", [](S& s, K& k, JobSpec& j) { s.enumeration(k, j.resources.placement); }},
  }};
  return t;
}

const Table& checkpoint_table() {
  static const Table t{{
      {"dir", [](S& s, K& k, JobSpec& j) { s.string(k, j.checkpoint.dir); }},
      {"every",
       [](S& s, K& k, JobSpec& j) {
         s.integer(k, j.checkpoint.every, 0, kI64Max, false,
                   "checkpoint.every is 0 (off) or a step interval >= 1");
       }},
      {"keep",
       [](S& s, K& k, JobSpec& j) {
         s.integer(k, j.checkpoint.keep, 1, 1 << 20, false,
                   "checkpoint.keep is how many checkpoints to keep, 1 or more");
       }},
      {"async", [](S& s, K& k, JobSpec& j) { s.boolean(k, j.checkpoint.async); }},
      {"memory_every",
       [](S& s, K& k, JobSpec& j) {
         s.integer(k, j.checkpoint.memory_every, 0, kI64Max, false,
                   "checkpoint.memory_every is 0 (off) or a step interval >= 1");
       }},
  }};
  return t;
}

const Table& fault_table() {
  static const Table t{{
      {"max_restarts", [](S& s, K& k, JobSpec& j) { s.integer(k, j.fault.max_restarts, 0, 1 << 20); }},
      {"heartbeat", [](S& s, K& k, JobSpec& j) { s.duration(k, j.fault.heartbeat, false); }},
      {"step_timeout", [](S& s, K& k, JobSpec& j) { s.duration(k, j.fault.step_timeout, true); }},
  }};
  return t;
}

// ---- elastic

void elastic_rules(Section& s, JobSpec& j) {
  Ctx& ctx = s.ctx();
  const ElasticSpec& e = j.elastic;
  const ParallelSpec& p = j.parallel;
  const bool min_ok = ctx.ok("elastic.min_devices") && e.min_devices > 0;
  const bool max_ok = ctx.ok("elastic.max_devices") && e.max_devices > 0;
  if (min_ok && max_ok && e.min_devices > e.max_devices)
    ctx.error(ctx.loc("elastic.min_devices"),
              "elastic.min_devices (" + std::to_string(e.min_devices) + ") is above elastic.max_devices (" +
                  std::to_string(e.max_devices) + ")",
              "min_devices <= max_devices");
  if (!ctx.ok("parallel.data") || !ctx.ok("parallel.pipeline") || !ctx.ok("parallel.tensor")) return;
  auto n = layout_devices(p);
  if (!n) return;
  const std::string layout = layout_of(p).str();
  if (min_ok && *n < e.min_devices)
    ctx.error(ctx.loc("elastic.min_devices"),
              "the layout " + layout + " uses " + std::to_string(*n) +
                  " devices, fewer than elastic.min_devices (" + std::to_string(e.min_devices) + ")",
              "data x pipeline x tensor must lie within [min_devices, max_devices]");
  if (max_ok && *n > e.max_devices)
    ctx.error(ctx.loc("elastic.max_devices"),
              "the layout " + layout + " uses " + std::to_string(*n) +
                  " devices, more than elastic.max_devices (" + std::to_string(e.max_devices) + ")",
              "data x pipeline x tensor must lie within [min_devices, max_devices]");
}

const Table& elastic_table() {
  static const Table t{
      {
          {"min_devices",
           [](S& s, K& k, JobSpec& j) {
             s.integer(k, j.elastic.min_devices, 0, 1 << 20, false, "0 (the planned layout's size) or more");
           }},
          {"max_devices",
           [](S& s, K& k, JobSpec& j) {
             s.integer(k, j.elastic.max_devices, 0, 1 << 20, false, "0 (the planned layout's size) or more");
           }},
      },
      elastic_rules};
  return t;
}

// ---- the document

void read_name(Section& s, const std::string& k, JobSpec& j) {
  s.string(k, j.name, true);
  Ctx& ctx = s.ctx();
  if (ctx.present("name") && ctx.ok("name") && !valid_name(j.name))
    ctx.error(ctx.loc("name"), "job name '" + shown(j.name) + "' is not a valid name",
              "use 1-64 letters, digits, '-', '_' or '.', not starting with '-' or '.'; it names the run "
              "directory");
}

constexpr bool kRequired = true;

}  // namespace

const Table& spec_table() {
  static const Table t{{
      {"name", read_name},
      {"model", nullptr, &model_table(), kRequired},
      {"data", nullptr, &data_table(), kRequired},
      {"train", nullptr, &train_table(), kRequired},
      {"parallel", nullptr, &parallel_table()},
      {"resources", nullptr, &resources_table()},
      {"checkpoint", nullptr, &checkpoint_table()},
      {"fault", nullptr, &fault_table()},
      {"elastic", nullptr, &elastic_table()},
  }};
  return t;
}

}  // namespace troupe::spec_detail

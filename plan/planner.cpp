#include "plan/planner.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "core/error.hpp"

namespace troupe::plan {

PlanRequest plan_request(const JobSpec& spec, int devices) {
  PlanRequest r;
  r.work = workload(spec);
  r.devices = devices;
  r.data = spec.parallel.data;
  r.pipeline = spec.parallel.pipeline;
  r.tensor = spec.parallel.tensor;
  r.micro_batch = spec.train.micro_batch;
  if (spec.train.recompute != Recompute::auto_) r.recompute = spec.train.recompute;
  // virtual_stages is read only under the interleaved schedule; written there, it is fixed.
  if (spec.parallel.schedule == troupe::Schedule::interleaved &&
      spec.positions.count("parallel.virtual_stages"))
    r.virtual_stages = spec.parallel.virtual_stages;
  r.memory_limit = double(spec.resources.memory_per_device);
  return r;
}

JobSpec resolve(const JobSpec& spec, const Candidate& c) {
  JobSpec s = spec;
  s.parallel.data = c.layout.dp;
  s.parallel.pipeline = c.layout.pp;
  s.parallel.tensor = c.layout.tp;
  s.train.micro_batch = c.micro_batch;
  s.train.recompute = c.recompute;
  if (s.parallel.schedule == troupe::Schedule::interleaved && c.layout.pp > 1)
    s.parallel.virtual_stages = c.virtual_stages;
  else if (s.parallel.schedule == troupe::Schedule::interleaved)
    s.parallel.schedule = troupe::Schedule::one_f_one_b;  // one stage: no schedule to interleave
  if (s.parallel.schedule != troupe::Schedule::interleaved) s.parallel.virtual_stages = 1;
  return s;
}

bool has_auto(const JobSpec& spec) {
  const ParallelSpec& p = spec.parallel;
  return p.data == 0 || p.pipeline == 0 || p.tensor == 0 || spec.train.micro_batch == 0 ||
         spec.train.recompute == Recompute::auto_ || p.virtual_stages == 0;
}

Choice choose(const JobSpec& spec, int devices, const HardwareProfile& hw) {
  const PlanResult r = search(plan_request(spec, devices), hw);
  const Estimate* b = r.best();
  if (!b) throw Error(r.explain(hw));
  return Choice{resolve(spec, b->candidate), *b, r.explain(hw), r.candidates};
}

int planned_devices(const JobSpec& spec, int available) {
  int n = std::max(1, available);
  if (spec.elastic.max_devices > 0) n = std::min(n, spec.elastic.max_devices);
  return n;
}

size_t PlanResult::ranked() const {
  return size_t(std::count_if(plans.begin(), plans.end(), [](const Estimate& e) { return e.fits; }));
}

const Estimate* PlanResult::best() const {
  for (const Estimate& e : plans)
    if (e.fits && e.runnable.empty()) return &e;
  return nullptr;
}

const Estimate* PlanResult::fastest() const {
  for (const Estimate& e : plans)
    if (e.fits) return &e;
  return nullptr;
}

namespace {

std::vector<int> divisors(int64_t n) {
  std::vector<int> d;
  for (int64_t i = 1; i * i <= n; ++i)
    if (n % i == 0) {
      d.push_back(int(i));
      if (i * i != n) d.push_back(int(n / i));
    }
  std::sort(d.begin(), d.end());
  return d;
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / double(1ull << 30));
  return buf;
}

// Why a priced candidate does not fit: the bytes it needs against what a device has.
std::string memory_reason(const Estimate& e, const PlanRequest& req, const HardwareProfile& hw) {
  const std::string rank = " (pipeline rank " + std::to_string(e.memory.pipeline_rank) + "), ";
  const std::string have = gib(req.memory_limit > 0 ? req.memory_limit : double(hw.memory));
  if (hw.streaming_memory == 0)
    return "needs " + gib(e.memory.total) + " per device" + rank + have + " available";
  return "needs " + gib(e.memory.on_chip) + " on the device after streaming " + gib(e.memory.streamed) +
         rank + have + " on the device and " + gib(double(hw.streaming_memory)) +
         " streaming memory available (a block's working set and the process never stream)";
}

// Layouts of exactly n devices with the spec's fixed degrees.
std::vector<Layout> layouts_of(const PlanRequest& r, int n) {
  std::vector<Layout> out;
  for (int tp : divisors(n)) {
    if (r.tensor > 0 && tp != r.tensor) continue;
    for (int pp : divisors(n / tp)) {
      if (r.pipeline > 0 && pp != r.pipeline) continue;
      const int dp = n / tp / pp;
      if (r.data > 0 && dp != r.data) continue;
      out.push_back({dp, pp, tp});
    }
  }
  return out;
}

}  // namespace

PlanResult search(const PlanRequest& req, const HardwareProfile& hw) {
  const auto t0 = std::chrono::steady_clock::now();
  PlanResult res;
  res.memory_limit = req.memory_limit > 0 ? req.memory_limit : double(hw.memory);
  const Workload& w = req.work;
  const bool fixed = req.data > 0 && req.pipeline > 0 && req.tensor > 0;
  std::vector<Recompute> modes;
  if (req.recompute) {
    modes = {*req.recompute};
  } else {
    modes = {Recompute::none, Recompute::full};
    // Selective recomputation drops the attention probabilities, which the fused attention never
    // keeps: it would be none again. Only a materialised attention makes it a choice of its own.
    if (w.model.type != ModelType::mlp && w.attention == AttentionKind::materialized)
      modes.insert(modes.begin() + 1, Recompute::selective);
  }
  const bool interleaved = w.schedule == ScheduleKind::interleaved;
  ScheduleCache cache;
  EstimateOptions eo;
  eo.memory_limit = req.memory_limit;
  eo.cache = &cache;
  eo.time_if_unfit = req.time_if_unfit;  // else a plan that does not fit is rejected: its time is not needed
  int n = fixed ? req.data * req.pipeline * req.tensor : std::max(1, req.devices);
  for (; n >= 1; --n) {
    std::vector<Rejected> rejected;
    const size_t before = res.plans.size();
    for (const Layout& L : layouts_of(req, n)) {
      std::vector<int> vs{1};
      if (interleaved && L.pp > 1) {
        vs.clear();
        if (req.virtual_stages > 0)
          vs.push_back(req.virtual_stages);
        else
          for (int v = 2; int64_t(v) * L.pp <= w.model.n_layers; ++v) vs.push_back(v);
      }
      std::vector<int> mbs;
      if (req.micro_batch > 0)
        mbs.assign(1, req.micro_batch);
      else if (w.global_batch % L.dp == 0)
        mbs = divisors(w.global_batch / L.dp);
      else
        mbs.assign(1, 1);
      for (int v : vs)
        for (int mb : mbs)
          for (Recompute rc : modes) {
            Candidate c{L, v, mb, rc};
            ++res.candidates;
            if (std::string why = refusal(w, c); !why.empty()) {
              rejected.push_back({c.str(), L, why});
              continue;
            }
            Estimate e = estimate(w, c, hw, eo);
            if (!e.fits) rejected.push_back({c.str(), L, memory_reason(e, req, hw), true});
            res.plans.push_back(std::move(e));
          }
    }
    res.rejected.insert(res.rejected.end(), rejected.begin(), rejected.end());
    if (res.plans.size() > before || fixed) {
      res.devices = n;
      break;
    }
  }
  std::stable_sort(res.plans.begin(), res.plans.end(), [](const Estimate& a, const Estimate& b) {
    // Those that fit, fastest first; the rest after them.
    return a.fits != b.fits ? a.fits : a.time.step < b.time.step;
  });
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

std::string PlanResult::explain(const HardwareProfile& hw) const {
  char buf[512];
  const Estimate* b = best();
  if (!b && fastest()) {
    const Estimate* f = fastest();
    std::snprintf(
        buf, sizeof buf,
        "%s: %.3f s/step predicted, %.0f tokens/s, MFU %.1f%%, %s per device; troupe's engine cannot "
        "run it today (%s)",
        f->candidate.str().c_str(), f->time.step, f->tokens_per_s, 100 * f->mfu, gib(f->memory.total).c_str(),
        f->runnable.c_str());
    return buf;
  }
  if (!b) {
    if (plans.empty())
      return "no layout of the devices divides the model and the batch" +
             (rejected.empty() ? std::string()
                               : ": " + rejected.front().candidate + ": " + rejected.front().reason);
    // The smallest plan troupe runs, else the smallest priced one (a profile troupe does not run on).
    const Estimate* smallest = nullptr;
    for (int pass = 0; pass < 2 && !smallest; ++pass)
      for (const Estimate& e : plans)
        if ((pass == 1 || e.runnable.empty()) && (!smallest || e.memory.on_chip < smallest->memory.on_chip))
          smallest = &e;
    std::snprintf(
        buf, sizeof buf,
        "nothing fits in %s per device: the smallest plan, %s, needs %s (pipeline rank %d); give the "
        "job more devices or devices with more memory, or lower the memory: recompute full, zero 1 "
        "or 2, a smaller micro_batch or seq_len",
        gib(memory_limit > 0 ? memory_limit : double(hw.memory)).c_str(), smallest->candidate.str().c_str(),
        gib(smallest->memory.on_chip).c_str(), smallest->memory.pipeline_rank);
    return buf;
  }
  std::snprintf(buf, sizeof buf, "%s: %.3f s/step predicted, %.0f tokens/s, MFU %.1f%%, %s per device",
                b->candidate.str().c_str(), b->time.step, b->tokens_per_s, 100 * b->mfu,
                gib(b->memory.total).c_str());
  std::string s = buf;
  const Estimate* next = nullptr;
  for (const Estimate& e : plans)
    if (&e != b && e.fits && e.runnable.empty()) {
      next = &e;
      break;
    }
  size_t fit = 0;
  for (const Estimate& e : plans) fit += e.fits && e.runnable.empty();
  if (next) {
    std::snprintf(buf, sizeof buf, "; %.1f%% faster than the next, %s (%.3f s/step)",
                  100 * (next->time.step / b->time.step - 1), next->candidate.str().c_str(), next->time.step);
    s += buf;
  }
  // A faster plan that troupe cannot run yet is worth saying.
  for (const Estimate& e : plans) {
    if (&e == b) break;
    if (e.fits && !e.runnable.empty()) {
      std::snprintf(buf, sizeof buf, "; %s would be %.1f%% faster but %s", e.candidate.str().c_str(),
                    100 * (b->time.step / e.time.step - 1), e.runnable.c_str());
      s += buf;
      break;
    }
  }
  std::snprintf(buf, sizeof buf, " (%zu of %zu candidates fit and run, hardware %s)", fit, candidates,
                hw.name.c_str());
  return s + buf;
}

}  // namespace troupe::plan

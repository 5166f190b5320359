// `troupe plan job.yaml`: the planner's dry run. Nothing starts.
//
//   troupe plan SPEC [--devices N] [--hardware NAME|FILE] [--top K] [--json]
//                    [--attention fused|materialized]
//   troupe plan --calibrate [SPEC] [--devices N] [--out FILE]
//
// Prints the plans that fit, fastest first (layout, virtual stages, micro-batch,
// recompute, predicted step time, tokens/s, MFU, memory per rank by part, bubble,
// communication share, whether troupe runs it today), the choice and why, what was
// rejected and why, and the chosen plan's stages and ranks. --json prints one object.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/calibrate.hpp"
#include "cli/commands.hpp"
#include "core/error.hpp"
#include "core/spec.hpp"
#include "plan/hardware.hpp"
#include "plan/plan.hpp"
#include "plan/planner.hpp"

namespace troupe::cli {

namespace {

struct PlanArgs {
  std::vector<std::string> specs;  // one; --calibrate takes any number
  std::string spec;
  int devices = 0;
  std::string hardware;
  int top = 0;
  bool json = false;
  std::string attention = "fused";
  bool calibrate = false;
  std::string out;
};

double gib(double bytes) { return bytes / double(1ull << 30); }

nlohmann::json plan_json(const plan::Estimate& e) {
  const plan::Candidate& c = e.candidate;
  return {{"data", c.layout.dp},
          {"pipeline", c.layout.pp},
          {"tensor", c.layout.tp},
          {"virtual_stages", c.virtual_stages},
          {"micro_batch", c.micro_batch},
          {"micro_batches", e.n_micro},
          {"recompute", to_string(c.recompute)},
          {"sequence_parallel", e.sequence_parallel},
          {"schedule", plan::schedule_name(e.schedule)},
          {"step_time_s", e.time.step},
          {"tokens_per_s", e.tokens_per_s},
          {"mfu", e.mfu},
          {"bubble_fraction", e.time.bubble_fraction},
          {"comm_share", e.time.comm_share},
          {"time_s",
           {{"compute", e.time.compute},
            {"tensor_comm", e.time.tp_comm},
            {"pipeline_comm", e.time.pp_comm},
            {"bubble", e.time.bubble},
            {"data_comm", e.time.dp_comm},
            {"optimizer", e.time.optimizer},
            {"streaming", e.time.streaming},
            {"other", e.time.other}}},
          {"memory_bytes",
           {{"params", e.memory.params},
            {"grads", e.memory.grads},
            {"optimizer", e.memory.optimizer},
            {"snapshots", e.memory.snapshots},
            {"activations", e.memory.activations},
            {"other", e.memory.other},
            {"total", e.memory.total},
            {"streamed", e.memory.streamed},
            {"on_device", e.memory.on_chip}}},
          {"memory_pipeline_rank", e.memory.pipeline_rank},
          {"boundaries", e.boundaries},
          {"fits", e.fits},
          {"runnable", e.runnable.empty()},
          {"not_runnable_because", e.runnable}};
}

// The chosen plan as the engine will run it: stage chunks, the schedule's bubble, every rank.
void print_details(const JobSpec& resolved, const plan::Estimate& e) {
  const plan::Plan p =
      plan::make_plan(plan::plan_inputs(resolved), e.candidate.layout, e.candidate.micro_batch, e.boundaries);
  std::printf("\n%s\n", p.str().c_str());
  for (int k = 0; k < p.partition.n_chunks(); ++k)
    std::printf("  model chunk %d: %s\n", k, plan::layers_str({p.partition.chunks[size_t(k)]}).c_str());
  if (p.layout.pp > 1)
    std::printf("  schedule: simulated bubble %.1f%% (theory %.1f%% with equal stages and free transfers)\n",
                100.0 * e.time.bubble_fraction,
                100.0 * plan::theoretical_bubble(p.schedule, p.layout.pp, p.virtual_stages, p.n_micro));
  const int world = p.layout.world();
  for (int r = 0; r < world && r < 64; ++r) std::printf("%s\n", plan::rank_place(p, r).str().c_str());
  if (world > 64) std::printf("... and %d more ranks\n", world - 64);
}

// The rejected candidates by kind, then one line per distinct reason (the first candidate it
// refused, and how many more), at most 8 reasons; --json lists every one.
void print_rejected(const plan::PlanResult& res, bool one) {
  std::map<std::string, size_t> by_kind;
  std::vector<std::pair<const plan::Rejected*, size_t>> reasons;
  std::map<std::string, size_t> index;
  for (const auto& r : res.rejected) {
    if (one && r.memory) continue;
    by_kind[r.memory ? "do not fit in memory" : "do not divide the model, the batch or the schedule"]++;
    auto [it, fresh] = index.emplace(r.reason, reasons.size());
    if (fresh)
      reasons.push_back({&r, 0});
    else
      ++reasons[it->second].second;
  }
  if (by_kind.empty()) return;
  std::printf("\nrejected:");
  for (const auto& [k, n] : by_kind) std::printf(" %zu %s;", n, k.c_str());
  std::printf(" e.g.\n");
  for (size_t i = 0; i < reasons.size() && i < 8; ++i) {
    std::printf("  %s: %s", reasons[i].first->candidate.c_str(), reasons[i].first->reason.c_str());
    if (reasons[i].second > 0) std::printf(" (and %zu more for this reason)", reasons[i].second);
    std::printf("\n");
  }
  if (reasons.size() > 8)
    std::printf("  ... %zu more reasons (--json lists every candidate)\n", reasons.size() - 8);
}

int run_plan(const PlanArgs& a) {
  JobSpec spec;
  try {
    spec = load_spec(a.spec);
  } catch (const SpecError& e) {
    std::cerr << e.what();
    return kUsage;
  }
  plan::HardwareProfile hw;
  const std::string hw_name = !a.hardware.empty() ? a.hardware
                              : !spec.resources.hardware.empty()
                                  ? spec.resources.hardware
                                  : plan::default_hardware_name(spec.resources.device);
  try {
    hw = plan::load_hardware(hw_name);
  } catch (const SpecError& e) {
    std::cerr << e.what();
    return kUsage;
  } catch (const std::exception& e) {
    std::cerr << "troupe plan: --hardware: " << e.what() << "\n";
    return kUsage;
  }
  const bool fixed = spec.parallel.data > 0 && spec.parallel.pipeline > 0 && spec.parallel.tensor > 0;
  if (fixed && a.devices > 0 && a.devices != *layout_devices(spec.parallel)) {
    std::cerr << "troupe plan: --devices " << a.devices << ": " << a.spec << " fixes every degree ("
              << layout_of(spec.parallel).str()
              << "); set parallel.data, pipeline or tensor to auto to plan for " << a.devices << " device"
              << (a.devices == 1 ? "" : "s") << ", or leave --devices out\n";
    return kUsage;
  }
  int devices = a.devices;
  if (devices <= 0) {
    if (fixed)
      devices = *layout_devices(spec.parallel);
    else if (hw.device == plan::ProfileDevice::cpu)
      devices = plan::planned_devices(
          spec, std::max(1, int(std::thread::hardware_concurrency()) / spec.resources.threads_per_worker));
    else
      devices = plan::planned_devices(spec, hw.devices_per_node);
  }
  plan::PlanResult res;
  plan::Workload work;
  // A spec that leaves nothing to the planner is one plan: shown whether it fits or not.
  const bool one = !plan::has_auto(spec);
  try {
    plan::PlanRequest req = plan::plan_request(spec, devices);
    req.time_if_unfit = one;
    req.work.attention =
        a.attention == "materialized" ? plan::AttentionKind::materialized : plan::AttentionKind::fused;
    work = req.work;
    res = plan::search(req, hw);
  } catch (const std::exception& e) {
    std::cerr << "troupe plan: " << a.spec << ": " << e.what() << "\n";
    return kUsage;
  }
  // Plans that fit, fastest first; those that do not fit are among the rejected.
  std::vector<const plan::Estimate*> fit;
  for (const auto& e : res.plans)
    if (e.fits || one) fit.push_back(&e);
  const plan::Estimate* best = res.best();
  // A plan troupe cannot run yet (a GPU job) is still a plan: the dry run shows the fastest.
  const plan::Estimate* shown = best ? best : res.fastest();
  if (!shown && one && !fit.empty()) shown = fit.front();
  const size_t top = a.top > 0 ? size_t(a.top) : a.json ? fit.size() : 10;

  if (a.json) {
    nlohmann::json out;
    out["spec"] = a.spec;
    out["devices"] = res.devices;
    out["hardware"] = hw.name;
    out["candidates"] = res.candidates;
    out["attention"] = plan::to_string(work.attention);
    out["attention_assumed"] = plan::attention_assumed(work);
    out["search_seconds"] = res.seconds;
    out["plans"] = nlohmann::json::array();
    for (size_t i = 0; i < fit.size() && i < top; ++i) out["plans"].push_back(plan_json(*fit[i]));
    // Every candidate is ranked (among "plans" unless --top cut it) or rejected, once: a spec
    // that fixes everything shows its one plan whether it fits or not, and so not twice.
    out["rejected"] = nlohmann::json::array();
    size_t rejected = 0;
    for (const auto& r : res.rejected) {
      if (one && r.memory) continue;
      ++rejected;
      out["rejected"].push_back({{"candidate", r.candidate},
                                 {"layout", r.layout.str()},
                                 {"reason", r.reason},
                                 {"memory", r.memory}});
    }
    out["counts"] = {{"candidates", res.candidates}, {"ranked", fit.size()}, {"rejected", rejected}};
    out["chosen"] = shown ? plan_json(*shown) : nlohmann::json();
    out["explanation"] = res.explain(hw);
    std::printf("%s\n", out.dump(1).c_str());
    return shown ? kOk : kUsage;
  }

  std::printf("troupe plan: %s on %d device%s, hardware %s (%s): %zu candidates in %.3f s, %zu fit\n",
              a.spec.c_str(), res.devices, res.devices == 1 ? "" : "s", hw.name.c_str(), hw.source.c_str(),
              res.candidates, res.seconds, fit.size());
  std::printf("attention: %s\n", plan::attention_assumed(work));
  if (hw.streaming_memory > 0)
    std::printf(
        "streaming: what overflows %.2f GiB per device streams to %.0f GiB at %.0f GB/s (column stream)\n",
        gib(double(hw.memory)), gib(double(hw.streaming_memory)), hw.streaming_bandwidth / 1e9);
  const bool streams = hw.streaming_memory > 0;
  if (!fit.empty()) {
    std::printf("\n   %-10s %3s %5s %-9s %9s %10s %6s | %7s %7s %7s %7s %7s%s GiB | %6s %5s  %s\n", "layout",
                "v", "mb", "recompute", "step s", "tokens/s", "MFU", "params", "grads", "optim", "activ",
                "total", streams ? "  stream" : "", "bubble", "comm", "runs here");
    for (size_t i = 0; i < fit.size() && i < top; ++i) {
      const plan::Estimate& e = *fit[i];
      const plan::Candidate& c = e.candidate;
      char stream[16] = "";
      if (streams) std::snprintf(stream, sizeof stream, " %7.2f", gib(e.memory.streamed));
      std::printf(
          "%s%2zu %-10s %3d %5d %-9s %9.4f %10.0f %5.1f%% | %7.2f %7.2f %7.2f %7.2f %7.2f%s     | %5.1f%% "
          "%4.0f%%  %s\n",
          &e == shown ? "*" : " ", i + 1, c.layout.str().c_str(), c.virtual_stages, c.micro_batch,
          to_string(c.recompute), e.time.step, e.tokens_per_s, 100 * e.mfu, gib(e.memory.params),
          gib(e.memory.grads), gib(e.memory.optimizer), gib(e.memory.activations), gib(e.memory.total),
          stream, 100 * e.time.bubble_fraction, 100 * e.time.comm_share,
          !e.fits              ? "no: does not fit in a device's memory"
          : e.runnable.empty() ? "yes"
                               : ("no: " + e.runnable).c_str());
    }
    if (fit.size() > top) std::printf("   ... %zu more (--top N, or --json for all)\n", fit.size() - top);
    if (!fit.empty() && fit[0]->memory.snapshots > 0)
      std::printf(
          "   total includes the two in-memory snapshots (checkpoint.memory_every: 0 turns them off)\n");
  }
  if (!res.rejected.empty()) print_rejected(res, one);
  if (!shown) {
    std::fflush(stdout);
    std::fprintf(stderr, "troupe plan: %s: %s\n", a.spec.c_str(), res.explain(hw).c_str());
    return kUsage;
  }
  if (!shown->fits) {
    std::fflush(stdout);
    std::fprintf(
        stderr,
        "troupe plan: warning: %s needs %.2f GiB per device (pipeline rank %d); hardware %s has %.2f GiB "
        "(resources.memory_per_device overrides it)\n",
        shown->candidate.str().c_str(), gib(shown->memory.on_chip), shown->memory.pipeline_rank,
        hw.name.c_str(),
        gib(spec.resources.memory_per_device > 0 ? double(spec.resources.memory_per_device)
                                                 : double(hw.memory)));
  } else {
    std::printf("\n%s: %s\n", best ? "chosen" : "fastest", res.explain(hw).c_str());
  }
  try {
    print_details(plan::resolve(spec, shown->candidate), *shown);
  } catch (const std::exception& e) {
    std::cerr << "troupe plan: " << a.spec << ": " << e.what() << "\n";
    return kUsage;
  }
  return kOk;
}

}  // namespace

void add_plan_command(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand(
      "plan",
      "Plan a job without running it: every layout, micro-batch and recompute mode that fits, ranked by "
      "predicted step time, the choice and why, and where each rank sits");
  static PlanArgs a;
  cmd->add_option("spec", a.specs, "YAML job spec (--calibrate: any number, whose shapes are measured)");
  cmd->add_option("--devices", a.devices,
                  "Devices to plan for (default: the spec's layout, or this machine's)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option(
      "--hardware", a.hardware,
      "Hardware profile: a name (a100-80gb, h100-sxm, h200-sxm, ipu-bow, cpu, or a calibrated one) or a "
      "YAML file (default: the spec's resources.hardware, else cpu or h100-sxm by device)");
  cmd->add_option("--top", a.top, "Plans to show (default 10; --json: all)")->check(CLI::Range(1, 1 << 20));
  cmd->add_flag("--json", a.json, "One JSON object on stdout: plans, rejected, chosen");
  cmd->add_option("--attention", a.attention,
                  "How attention is priced: fused (the causal kernel troupe runs: no s x s scores kept) or "
                  "materialized (a kernel that keeps the s x s scores, as Megatron-LM's of 2021-22: for "
                  "comparing with runs that used one)")
      ->check(CLI::IsMember({"fused", "materialized"}));
  cmd->add_flag("--calibrate", a.calibrate,
                "Measure this machine (GEMM rates at the spec's shapes, the comm backend between worker "
                "processes, memory and checkpoint bandwidth) and write a cpu hardware profile");
  cmd->add_option("--out", a.out,
                  "With --calibrate: where to write the profile (default <hardware dir>/cpu.yaml)");
  cmd->callback([exit_code] {
    if (a.calibrate) {
      *exit_code = run_calibrate(a.specs, a.devices, a.out);
      return;
    }
    if (a.specs.size() != 1) {
      std::cerr << "troupe plan: give one job spec (troupe plan JOB.yaml), or --calibrate [SPEC...]\n";
      *exit_code = kUsage;
      return;
    }
    a.spec = a.specs.front();
    *exit_code = run_plan(a);
  });
}

}  // namespace troupe::cli

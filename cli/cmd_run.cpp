// `troupe run job.yaml`: runs a job to completion on this machine.
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "checkpoint/checkpoint.hpp"
#include "cli/commands.hpp"
#include "cli/progress.hpp"
#include "coordinator/embedded/embedded.hpp"
#include "coordinator/metrics.hpp"
#include "core/run_dir.hpp"
#include "core/spec.hpp"
#include "plan/fit.hpp"
#include "plan/grid.hpp"
#include "plan/hardware.hpp"
#include "plan/planner.hpp"
#include "worker/engine.hpp"
#include "worker/train_loop.hpp"

namespace troupe::cli {

namespace {

std::atomic<Engine*> g_engine{nullptr};
std::atomic<bool> g_interrupted{false};

extern "C" void on_sigint(int) {
  g_interrupted.store(true);
  if (Engine* e = g_engine.load()) e->request_abort();
}

struct RunOptions {
  std::string spec_path;
  std::string runs_dir = "runs";
  std::string resume;
  bool quiet = false;
  bool in_process = false;
  int64_t trace = 0;     // --trace N: steps [1, 1 + N) (the first warms up), over train.trace
  std::string http;      // --http HOST:PORT: the dashboard of this run
  int devices = 0;       // --devices N: an auto job's devices (0 = one per core)
  std::string hardware;  // --hardware NAME|FILE: an auto job's profile
};

std::string layout_string(const JobSpec& s) { return layout_of(s.parallel).str(); }

// The in-process run writes its run directory itself: metrics.jsonl (the coordinator's
// one metrics record, from a world of one rank), events, the worker log and progress.
class RunDirReporter : public LoopReporter {
 public:
  RunDirReporter(RunDir& run, spdlog::logger& log, Progress& progress, const std::string& layout)
      : run_(run), log_(log), progress_(progress), metrics_(1, 0, layout) {}
  void step(const StepReport& r) override {
    coord::StepSample s{0,           r.step,       r.loss,     r.lr,           r.tokens,
                        r.step_ms,   r.grad_norm,  r.val_loss, r.compute_ms,   r.comm_ms,
                        r.bubble_ms, r.loss_scale, r.skipped,  r.device_bytes, r.device_peak_bytes};
    if (auto line = metrics_.add(s)) run_.metrics(*line);
    log_.info("step {} loss {:.6f} lr {:.3e} grad_norm {:.4f} {:.1f} ms", r.step, r.loss, r.lr, r.grad_norm,
              r.step_ms);
    if (r.val_loss)
      run_.event("eval at step " + std::to_string(r.step) + ": val_loss " + std::to_string(*r.val_loss));
    progress_.step(r.step, r.loss, r.lr, double(r.tokens) / (r.step_ms / 1000.0), r.step_ms,
                   r.val_loss.value_or(-1.0));
  }
  void checkpoint_started(const std::string& dir) override { run_.event("checkpoint started: " + dir); }
  void checkpoint_committed(const std::string& dir) override { run_.event("checkpoint committed: " + dir); }

 private:
  RunDir& run_;
  spdlog::logger& log_;
  Progress& progress_;
  coord::MetricsAggregator metrics_;
};

// The default: an embedded coordinator and local agent in this process, one worker
// process per device (the same path a cluster job takes).
// An auto job: the planner's profile and devices, and the plan it will run (printed).
struct AutoRun {
  std::string hardware_yaml;
  int devices = 0;
};

int run_workers(const JobSpec& spec, const RunOptions& opt, const std::string& resume_from,
                const AutoRun& autorun) {
  Progress progress(spec.train.steps, spec.train.log_every, !opt.quiet);
  embedded::RunOptions ro;
  ro.runs_dir = opt.runs_dir;
  if (autorun.devices > 0) {
    ro.devices = std::string(to_string(spec.resources.device)) + ":" + std::to_string(autorun.devices);
    ro.hardware = autorun.hardware_yaml;
    ro.on_plan = [&](const nlohmann::json& e) {
      if (opt.quiet) return;
      progress.finish();
      std::printf("troupe: generation %d planned: %s\n", e.value("generation", 0),
                  e.value("why", "").c_str());
    };
  }
  ro.quiet = opt.quiet;
  ro.resume_from = resume_from;
  ro.http = opt.http;
  std::string run_dir;
  ro.on_submitted = [&](const std::string& job, const std::string& dir) {
    run_dir = dir;
    if (!opt.quiet)
      std::printf("troupe: job %s (%s), layout %s, %lld steps, run directory %s\n", spec.name.c_str(),
                  job.c_str(), autorun.devices > 0 ? "planned at launch" : layout_string(spec).c_str(),
                  static_cast<long long>(spec.train.steps), dir.c_str());
  };
  ro.on_step = [&](const nlohmann::json& m) {
    progress.step(m.value("step", int64_t(0)), m.value("loss", 0.0), m.value("lr", 0.0),
                  m.value("tokens_per_s", 0.0), m.value("step_ms", 0.0),
                  m.contains("val_loss") ? m["val_loss"].get<double>() : -1.0);
  };
  const int rc = embedded::run_job_embedded(spec, ro);
  progress.finish();
  if (rc == kOk && !opt.quiet) {
    const std::string ckpt = spec.checkpoint.dir.empty() ? run_dir + "/ckpt" : spec.checkpoint.dir;
    std::printf("troupe: job %s succeeded; checkpoint in %s\n", spec.name.c_str(), ckpt.c_str());
  }
  return rc;
}

int run_job(const RunOptions& opt) {
  JobSpec spec;
  try {
    spec = load_spec(opt.spec_path);
    if (opt.trace > 0) {
      // The first step warms up (allocations, page faults): the trace starts after it when it can.
      spec.train.trace.steps = std::min<int64_t>(opt.trace, spec.train.steps);
      spec.train.trace.from_step = std::min<int64_t>(1, spec.train.steps - spec.train.trace.steps);
    }
    require_startable(spec);
    plan::require_fits_hardware(spec);  // before any allocation, not in the allocator
  } catch (const SpecError& e) {
    std::cerr << e.what();
    return kUsage;
  }
  AutoRun autorun;
  if (plan::has_auto(spec)) {
    // The planner chooses what the spec leaves to it, for this machine's devices; the embedded
    // coordinator plans the same way at every launch (and re-plans after a failure).
    plan::HardwareProfile hw;
    try {
      hw = plan::load_hardware(!opt.hardware.empty() ? opt.hardware
                               : !spec.resources.hardware.empty()
                                   ? spec.resources.hardware
                                   : plan::default_hardware_name(spec.resources.device));
    } catch (const SpecError& e) {
      std::cerr << e.what();
      return kUsage;
    } catch (const std::exception& e) {
      std::cerr << "troupe run: hardware profile: " << e.what() << "\n";
      return kUsage;
    }
    const int cores =
        std::max(1, int(std::thread::hardware_concurrency()) / spec.resources.threads_per_worker);
    autorun.devices = opt.in_process ? 1 : opt.devices > 0 ? opt.devices : plan::planned_devices(spec, cores);
    autorun.hardware_yaml = plan::to_yaml(hw);
    try {
      const plan::Choice c = plan::choose(spec, autorun.devices, hw);
      if (!opt.quiet) std::printf("troupe: planned for %d device(s): %s\n", autorun.devices, c.why.c_str());
      if (opt.in_process) spec = c.spec;
    } catch (const std::exception& e) {
      std::cerr << "troupe run: " << spec.source_file << ": " << e.what() << "\n";
      return kUsage;
    }
  } else if (opt.devices > 0 && opt.devices != *layout_devices(spec.parallel)) {
    std::cerr << "troupe run: --devices " << opt.devices
              << " applies to a spec that leaves its layout to the "
              << "planner (parallel: auto); " << spec.source_file << " asks for " << layout_string(spec)
              << "\n";
    return kUsage;
  }
  std::string resume_from;
  if (!opt.resume.empty()) {
    // Checked here, not by the workers: a damaged checkpoint would fail every launch of the job.
    std::vector<std::string> skipped;
    try {
      resume_from = checkpoint::resolve_verified(opt.resume, &skipped);
    } catch (const std::exception& e) {
      std::cerr << "troupe run: --resume: " << e.what() << "\n";
      return kUsage;
    }
    for (const auto& s : skipped) std::cerr << "troupe run: --resume: skipped " << s << "\n";
    if (!skipped.empty()) std::cerr << "troupe run: --resume: resuming from " << resume_from << "\n";
  }
  if (!opt.in_process) return run_workers(spec, opt, resume_from, autorun);
  if (!opt.http.empty()) {
    std::cerr << "troupe run: --http serves the embedded coordinator's dashboard; drop --in-process\n";
    return kUsage;
  }
  if (*layout_devices(spec.parallel) != 1) {
    std::cerr << "troupe run: --in-process runs one device; layout " << layout_string(spec) << " needs "
              << *layout_devices(spec.parallel) << " worker processes (drop --in-process)\n";
    return kUsage;
  }

  RunDir run(opt.runs_dir, spec.name, make_job_id());
  run.write_spec(to_yaml(spec));
  const std::string ckpt_dir = spec.checkpoint.dir.empty() ? run.default_ckpt_dir() : spec.checkpoint.dir;
  auto log = spdlog::basic_logger_mt("worker0", run.worker_log(0), /*truncate=*/true);
  log->set_level(spdlog::get_level());
  log->flush_on(spdlog::level::info);

  EngineAssignment asg;
  asg.resume_from = resume_from;
  asg.trace_dir = run.path() + "/trace";
  Progress progress(spec.train.steps, spec.train.log_every, !opt.quiet);
  std::printf("troupe: job %s, run directory %s\n", spec.name.c_str(), run.path().c_str());

  std::unique_ptr<Engine> engine;
  try {
    engine = std::make_unique<Engine>(spec, asg);
  } catch (const std::exception& e) {
    run.event(std::string("job failed at start: ") + e.what());
    std::cerr << "troupe: job " << spec.name << " failed to start: " << e.what() << "\n";
    return kJobFailed;
  }
  std::printf("troupe: %s model, %lld parameters, layout %s, %lld steps from step %lld\n",
              to_string(spec.model.type), static_cast<long long>(engine->num_params()),
              layout_string(spec).c_str(), static_cast<long long>(spec.train.steps),
              static_cast<long long>(engine->next_step()));
  run.event("job started: layout " + layout_string(spec) + ", first step " +
            std::to_string(engine->next_step()) +
            (asg.resume_from.empty() ? "" : ", resumed from " + asg.resume_from));
  log->info("engine started: {} parameters, first step {}", engine->num_params(), engine->next_step());
  log->info("plan: {}; {}", engine->plan().str(), engine->place().str());
  log->info("memory: {}", to_string(engine->memory()));

  g_engine.store(engine.get());
  std::signal(SIGINT, on_sigint);
  std::signal(SIGTERM, on_sigint);
  int rc = kOk;
  try {
    RunDirReporter reporter(run, *log, progress, layout_string(spec));
    train_to_end(*engine, spec, ckpt_dir, reporter);
    progress.finish();
    run.event("job succeeded");
    std::printf("troupe: job %s succeeded; checkpoint in %s\n", spec.name.c_str(), ckpt_dir.c_str());
  } catch (const EngineAborted&) {
    progress.finish();
    run.event("job interrupted at step " + std::to_string(engine->next_step()));
    std::fprintf(stderr, "troupe: interrupted at step %lld\n", static_cast<long long>(engine->next_step()));
    rc = kInterrupted;
  } catch (const std::exception& e) {
    progress.finish();
    run.event(std::string("job failed: ") + e.what());
    std::fprintf(stderr, "troupe: job %s failed: %s\n", spec.name.c_str(), e.what());
    rc = kJobFailed;
  }
  g_engine.store(nullptr);
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  if (rc == kOk && g_interrupted.load()) rc = kInterrupted;
  return rc;
}

}  // namespace

void add_run_command(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("run", "Run a job to completion on this machine");
  static RunOptions opt;
  cmd->add_option("spec", opt.spec_path, "YAML job spec")->required();
  cmd->add_option("--runs-dir", opt.runs_dir, "Root of the run directories")->capture_default_str();
  cmd->add_option("--resume", opt.resume,
                  "Resume from a checkpoint directory (a step_N directory or a root with latest)");
  cmd->add_flag("-q,--quiet", opt.quiet, "No progress output");
  cmd->add_option(
         "--trace", opt.trace,
         "Trace N steps from the second (train.trace): each rank writes trace/rank<r>.json in the run "
         "directory; `troupe trace merge` joins them")
      ->check(CLI::Range(int64_t(1), int64_t(1000)));
  cmd->add_option(
      "--http", opt.http,
      "Serve the dashboard and Prometheus /metrics of this run at HOST:PORT (port 0 = any free port)");
  cmd->add_option(
         "--devices", opt.devices,
         "Devices for a spec that leaves its layout to the planner (parallel: auto): worker processes "
         "on this machine (default: one per core / threads_per_worker, at most elastic.max_devices)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--hardware", opt.hardware,
                  "Hardware profile the planner prices an auto job with: a name or a YAML file (default: the "
                  "spec's resources.hardware, else cpu, the calibrated one if any)");
  cmd->add_flag("--in-process", opt.in_process,
                "Train a one-device job inside this process instead of a worker process (debugging)");
  cmd->callback([exit_code] { *exit_code = run_job(opt); });
}

}  // namespace troupe::cli

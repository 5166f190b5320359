// Ranks of one job as threads of the test process over the `local` communicator.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/commit.hpp"
#include "worker/engine.hpp"

namespace troupe::testing {

// The assignment of rank `rank` in layout dp x pp x tp, connected through `world`.
inline EngineAssignment local_assignment(int rank, int dp, int pp, int tp,
                                         const std::shared_ptr<comm::LocalWorld>& world) {
  EngineAssignment a;
  a.rank = rank;
  a.layout = {dp, pp, tp};
  a.comm.backend = "local";
  a.comm.local_world = world;
  return a;
}

// Runs body(rank) for every rank on its own thread and joins them; returns each rank's
// exception message ("" when it returned normally).
inline std::vector<std::string> run_ranks(int world, const std::function<void(int)>& body) {
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (const std::exception& ex) {
        errors[static_cast<size_t>(r)] = ex.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

// What every rank of a layout run reported.
struct LayoutRun {
  std::vector<std::vector<StepReport>> reports;  // [rank][step]
  std::vector<std::string> errors;               // [rank]: "" when it ran to the end
};

// Runs layout `l` as threads from `resume` ("" = fresh) until step `stop`, and saves a
// checkpoint into `root` when `root` is set (committed through one InProcessCommitter,
// or, without one, by the engine's own barrier path).
inline LayoutRun run_layout(const JobSpec& spec, Layout l, const std::string& resume, int64_t stop,
                            const std::string& root = "", bool use_committer = true) {
  const int world = l.world();
  auto local_world = comm::make_local_world(world);
  checkpoint::InProcessCommitter committer;
  LayoutRun out;
  out.reports.resize(static_cast<size_t>(world));
  out.errors = run_ranks(world, [&](int r) {
    EngineAssignment a = local_assignment(r, l.dp, l.pp, l.tp, local_world);
    a.resume_from = resume;
    if (use_committer)
      a.commit_shard = [&](const checkpoint::ShardReport& rep) { return committer.report(rep); };
    Engine e(spec, a);
    while (e.next_step() < stop) out.reports[static_cast<size_t>(r)].push_back(e.step());
    if (!root.empty()) {
      e.save_checkpoint(root);
      e.wait_checkpoint();
    }
  });
  return out;
}

}  // namespace troupe::testing

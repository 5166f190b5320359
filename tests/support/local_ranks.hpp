// Ranks of one job as threads of the test process over the `local` communicator.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

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

}  // namespace troupe::testing

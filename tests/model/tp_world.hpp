// Tensor-parallel shards of one stage as threads of the test over the `local` communicator.
#pragma once

#include <catch2/catch.hpp>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.hpp"
#include "model/stage.hpp"

namespace troupe::model::testing {

// tp shards of one stage, each with its rank of a local communicator group. run() calls
// fn on one thread per shard (the collectives inside need all of them at once).
struct TpWorld {
  std::vector<std::unique_ptr<comm::Communicator>> comms;
  std::vector<std::unique_ptr<Stage>> stages;

  TpWorld(const ModelConfig& c, int tp, const LayerRange& range, int n_slots = 1, int max_B = 1)
      : comms(static_cast<size_t>(tp)), stages(static_cast<size_t>(tp)) {
    auto world = comm::make_local_world(tp);
    run_threads([&](int r) {
      comm::CommConfig cc;
      cc.backend = "local";
      cc.rank = r;
      cc.size = tp;
      cc.group = "tp";
      cc.local_world = world;
      comms[static_cast<size_t>(r)] = comm::make_communicator(cc);
      stages[static_cast<size_t>(r)] = std::make_unique<Stage>(c, range, n_slots, max_B, TensorShard{r, tp},
                                                               comms[static_cast<size_t>(r)].get());
    });
  }
  int size() const { return static_cast<int>(stages.size()); }
  Stage& operator[](int r) { return *stages[static_cast<size_t>(r)]; }

  void run(const std::function<void(int, Stage&)>& fn) {
    run_threads([&](int r) { fn(r, *stages[static_cast<size_t>(r)]); });
  }

 private:
  void run_threads(const std::function<void(int)>& fn) {
    std::vector<std::string> errors(comms.size());
    std::vector<std::thread> ts;
    for (int r = 0; r < static_cast<int>(comms.size()); ++r)
      ts.emplace_back([&, r] {
        try {
          fn(r);
        } catch (const std::exception& e) {
          errors[static_cast<size_t>(r)] = e.what();
          if (comms[static_cast<size_t>(r)]) comms[static_cast<size_t>(r)]->abort();  // unblock the peers
        }
      });
    for (auto& t : ts) t.join();
    for (size_t r = 0; r < errors.size(); ++r) {
      INFO("shard " << r);
      REQUIRE(errors[r] == "");
    }
  }
};

}  // namespace troupe::model::testing

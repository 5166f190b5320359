// A job of N ranks placed, launched and registered in a CoordinatorState, without processes:
// N/8 agents of 8 CPU devices, layout (N/16)x2x8, every rank answering "where". For tests of
// what the coordinator's answers cost and hold at sizes no machine here runs as processes
// (bench/control_views.cpp, tests/coordinator/test_api.cpp).
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "actors/version.hpp"
#include "coordinator/state.hpp"

namespace troupe::test {

// Returns the job's id. `ranks` is a multiple of 16.
inline std::string sized_job(coord::CoordinatorState& st, int ranks) {
  if (ranks <= 0 || ranks % 16 != 0) throw std::invalid_argument("sized_job: ranks must be a multiple of 16");
  const int protocol = actors::kProtocolVersion;
  coord::Actions a;
  for (int i = 0; i < ranks / 8; ++i) {
    std::vector<std::string> devices;
    for (int d = 0; d < 8; ++d) devices.push_back("cpu:" + std::to_string(d));
    if (!st.register_agent(protocol, "host-" + std::to_string(i), 1000 + i, devices, &a).accepted)
      throw std::runtime_error("sized_job: an agent was refused");
  }
  coord::JobRequest r;
  r.name = "sized";
  r.spec_yaml = "name: sized\n";
  r.device_kind = "cpu";
  r.layout = {ranks / 16, 2, 8};
  r.plan.model.n_layers = 4;
  r.plan.global_batch = ranks / 16 * 4;
  r.total_steps = 1000;
  const std::string id = st.submit(std::move(r), &a);
  const coord::Job* j = st.job(id);
  if (!j || static_cast<int>(j->ranks.size()) != ranks) throw std::runtime_error("sized_job: not placed");
  const int gen = j->generation;
  for (int k = 0; k < ranks; ++k) {
    st.worker_launched(id, gen, k, 100000 + k);
    st.register_worker(protocol, id, gen, k, j->ranks[k].host, 100000 + k, &a);
  }
  for (int k = 0; k < ranks; ++k)
    st.worker_where(id, gen, k, k % 97 == 0 ? "step 12: allreduce (dp)" : "step 12: forward layer 3");
  return id;
}

}  // namespace troupe::test

// CoordinatorState's hot spares (resources.spares): worker processes started with the job on
// devices of their own, registered and waiting. A relaunch gives a ready spare the place of a
// rank that failed (try_relaunch: place_spares, launch: the Reassign), so that place costs no
// process start, and then starts a new spare on a free device. A spare is known by its launch
// (generation, kFirstSpareRank + n) until it takes a place, and to its agent for its whole life.
#include <algorithm>

#include "actors/version.hpp"
#include "coordinator/state.hpp"

namespace troupe::coord {

Spare* CoordinatorState::find_spare(Job& job, int generation, int rank) {
  for (Spare& v : job.spares)
    if (v.launch_generation == generation && v.launch_rank == rank) return &v;
  return nullptr;
}

void CoordinatorState::launch_spares(Job& job, const std::vector<DeviceRef>& devices, Actions* out) {
  if (is_terminal(job.state)) return;  // the launch failed: its devices went back already
  for (const DeviceRef& d : devices) {
    const int n = job.spare_launches++;
    Spare v;
    v.launch_generation = job.generation;
    v.launch_rank = actors::kFirstSpareRank + n % actors::kSpareRanks;
    v.device = d;
    if (const Agent* a = registry_.agent(d.agent_id)) v.host = a->host;
    out->launches.push_back({d.agent_id, job.id, job.generation, v.launch_rank, d.device,
                             job.run_dir + "/workers/spare" + std::to_string(n) + ".log"});
    out->events.push_back({{"event", "log"},
                           {"job", job.id},
                           {"message", "spare " + std::to_string(n) + " starting on " + d.device + " on " +
                                           v.host + " (resources.spares)"}});
    job.spares.push_back(std::move(v));
  }
}

void CoordinatorState::replenish_spares(Job& job, Actions* out) {
  const int missing = job.request.spares - static_cast<int>(job.spares.size());
  if (missing <= 0 || is_terminal(job.state) || job.state == JobState::recovering) return;
  // Best effort: the job runs without them; the next relaunch tries again.
  const int n = std::min(missing, registry_.free(job.request.device_kind));
  if (n <= 0) return;
  std::string why;
  if (auto got = registry_.allocate(job.id, job.request.device_kind, n, &why, job.request.spread))
    launch_spares(job, *got, out);
}

void CoordinatorState::drop_spare(Job& job, int generation, int rank, const std::string& why, bool kill,
                                  bool release, Actions* out) {
  auto it = std::find_if(job.spares.begin(), job.spares.end(), [&](const Spare& v) {
    return v.launch_generation == generation && v.launch_rank == rank;
  });
  if (it == job.spares.end()) return;
  if (release && it->ready) out->releases.push_back({job.id, it->launch_generation, it->launch_rank, why});
  if (kill && registry_.agent(it->device.agent_id))
    out->kills.push_back(Kill{it->device.agent_id, job.id, {it->launch_generation}, {it->launch_rank}});
  registry_.release_device(job.id, it->device);
  out->events.push_back({{"event", "log"},
                         {"job", job.id},
                         {"message", "spare " + std::to_string(rank - actors::kFirstSpareRank) + " (pid " +
                                         std::to_string(it->pid) + ", " + it->device.device + " on " +
                                         it->host + ") is gone: " + why}});
  job.spares.erase(it);
}

int CoordinatorState::place_spares(Job& job, std::vector<DeviceRef>& devices, std::vector<bool>& taken,
                                   int need) {
  int placed = 0;
  size_t next = 0;
  for (Spare& v : job.spares) {
    v.rank = -1;
    if (!v.ready || placed >= need) continue;
    while (next < taken.size() && taken[next]) ++next;
    if (next >= taken.size()) break;
    v.rank = static_cast<int>(next);
    devices[next] = v.device;
    taken[next] = true;
    ++placed;
  }
  return placed;
}

}  // namespace troupe::coord

// In-memory snapshots (checkpoint.memory_every): after a step the rank copies what it holds of
// the training state — every chunk's flat fp32 parameters, AdamW's moments (its ZeRO part) and
// the loss scaler — into the older of two host buffers the worker process keeps across
// generations. The data position and the random streams follow from the step, so nothing
// else is needed to continue. A survivor of a failure restores its own; a rank started in a
// failed rank's place receives a data-parallel replica's (train.zero 0: every replica holds
// the same state) by a broadcast over the data-parallel group.
#include <algorithm>
#include <cstring>

#include "comm/groups.hpp"
#include "core/error.hpp"
#include "worker/engine_impl.hpp"
#include "worker/memory_snapshot.hpp"

namespace troupe {

// Host memory of CPU ranks only: a device rank's state would need staging (not built).
bool Engine::Impl::memory_snapshots() const {
  return asg.snapshots != nullptr && spec.checkpoint.memory_every > 0 && ctx.device == Device::cpu &&
         host_master.empty();
}

std::string Engine::Impl::memory_fingerprint() const {
  std::string f =
      layout().str() + " rank " + std::to_string(asg.rank) + " zero " + std::to_string(zero) + ":";
  for (auto* st : stage_ptrs) f += " " + std::to_string(st->store().flat_params().numel());
  f += " |";
  for (const ParamRef& r : refs) f += " " + std::to_string(r.numel);
  return f;
}

void Engine::Impl::take_memory_snapshot() {
  if (!memory_snapshots() || next_step % spec.checkpoint.memory_every != 0) return;
  set_where("step " + std::to_string(next_step - 1) + ": in-memory snapshot");
  RankState& s = asg.snapshots->begin();
  s.fingerprint = memory_fingerprint();
  s.tensors.resize(stage_ptrs.size() + 2 * refs.size());
  size_t t = 0;
  auto keep = [&](const float* data, size_t n) {
    std::vector<float>& out = s.tensors[t++];
    out.resize(n);
    std::memcpy(out.data(), data, n * sizeof(float));
  };
  for (auto* st : stage_ptrs) {
    const Tensor& flat = st->store().flat_params();
    keep(flat.f32(), size_t(flat.numel()));
  }
  for (size_t i = 0; i < refs.size(); ++i) {
    keep(opt->m(i).f32(), size_t(opt->m(i).numel()));
    keep(opt->v(i).f32(), size_t(opt->v(i).numel()));
  }
  s.loss_scale = scaler.state();
  s.replicated = zero == 0;
  asg.snapshots->commit(s, next_step);
}

void Engine::Impl::restore_memory(int64_t step) {
  const RankState* s = asg.snapshots ? asg.snapshots->find(step) : nullptr;
  TROUPE_CHECK(s != nullptr, "no in-memory snapshot of step ", step);
  TROUPE_CHECK(s->fingerprint == memory_fingerprint(), "the in-memory snapshot of step ", step,
               " was taken by \"", s->fingerprint, "\", this engine is \"", memory_fingerprint(), "\"");
  TROUPE_CHECK(s->tensors.size() == stage_ptrs.size() + 2 * refs.size(), "in-memory snapshot: tensor count");
  size_t t = 0;
  auto put = [&](const Tensor& into) {
    const std::vector<float>& in = s->tensors[t++];
    TROUPE_CHECK(int64_t(in.size()) == into.numel(), "in-memory snapshot: tensor ", t - 1, " size");
    std::memcpy(into.f32(), in.data(), in.size() * sizeof(float));
  };
  for (auto* st : stage_ptrs) put(st->store().flat_params());
  for (size_t i = 0; i < refs.size(); ++i) {
    put(opt->m(i));
    put(opt->v(i));
  }
  scaler.restore(s->loss_scale);
  next_step = step;
}

// Collective over the data-parallel group: every member ends with rank `root`'s parameters,
// moments, loss scale and step (root's own snapshot, restored before).
void Engine::Impl::heal_from_replica(int root) {
  TROUPE_CHECK(dp_group != nullptr && zero == 0 && host_master.empty(),
               "healing from a replica needs data parallelism with train.zero 0");
  const comm::GridGroups g = comm::grid_groups(layout().dp, layout().pp, layout().tp);
  const std::vector<int> members = comm::group_of(g.data, asg.rank);
  const auto at = std::find(members.begin(), members.end(), root);
  TROUPE_CHECK(at != members.end(), "heal root ", root, " is not in rank ", asg.rank,
               "'s data-parallel group");
  const int r = int(at - members.begin());
  set_where("receiving the training state of rank " + std::to_string(root));
  for (auto* st : stage_ptrs) {
    const Tensor& flat = st->store().flat_params();
    dp_group->broadcast(flat.f32(), size_t(flat.numel()), r, copt);
  }
  for (size_t i = 0; i < refs.size(); ++i) {
    dp_group->broadcast(opt->m(i).f32(), size_t(opt->m(i).numel()), r, copt);
    dp_group->broadcast(opt->v(i).f32(), size_t(opt->v(i).numel()), r, copt);
  }
  const parallel::LossScaleState ls = scaler.state();
  double head[4] = {double(next_step), ls.scale, double(ls.clean_steps), double(ls.skipped_steps)};
  dp_group->broadcast(head, 4, r, copt);
  next_step = int64_t(head[0]);
  scaler.restore(parallel::LossScaleState{head[1], int64_t(head[2]), int64_t(head[3])});
}

}  // namespace troupe

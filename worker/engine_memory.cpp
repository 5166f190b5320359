// In-memory snapshots (checkpoint.memory_every): after a step the rank copies what it holds of
// the training state — every chunk's flat fp32 parameters, AdamW's moments (its ZeRO part) and
// the loss scaler — into the older of two host buffers the worker process keeps across
// generations. The data position and the random streams follow from the step, so nothing
// else is needed to continue. A survivor of a failure restores its own; a rank started in a
// failed rank's place receives a data-parallel replica's (train.zero 0: every replica holds
// the same state) by a broadcast over the data-parallel group, or its buddy's copy
// (worker/snapshot_buddy.hpp) whatever the layout.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iostream>

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

int64_t Engine::Impl::state_bytes() const {
  int64_t n = 0;
  for (auto* st : stage_ptrs) n += st->store().flat_params().numel() * int64_t(sizeof(float));
  for (const ParamRef& r : refs) n += 2 * int64_t(r.numel * sizeof(float));
  return n;
}

// The buddy link's communicator: every rank of the world decides the same way (spec and
// assignment), so that all or none build it.
void Engine::Impl::start_buddies() {
  if (!memory_snapshots() || asg.buddy_shift <= 0 || world_size() < 2) return;
  TROUPE_CHECK(asg.held != nullptr && asg.buddy_shift < world_size(), "buddy shift ", asg.buddy_shift,
               " over ", world_size(), " ranks");
  set_where("connecting to the snapshot buddies");
  comm::CommConfig c = asg.comm;
  c.rank = asg.rank;
  c.size = world_size();
  c.generation = asg.generation;
  c.group = "buddy";
  // Its buddy and its partner only (gloo): two connections per rank, not a mesh of the world.
  const BuddyRing ring{world_size(), asg.buddy_shift};
  c.peers = std::vector<int>{ring.buddy(asg.rank), ring.partner(asg.rank)};
  // TROUPE_SNAPSHOT_FAULT=corrupt (fault injection): every copy this rank holds is damaged in
  // memory after its checksum was checked, so that healing from it must fail by name.
  const char* fault_env = std::getenv("TROUPE_SNAPSHOT_FAULT");
  const bool corrupt = fault_env != nullptr && std::string(fault_env) == "corrupt";
  share_snapshots();
  buddy = std::make_unique<BuddyLink>(comm::make_communicator(c), ring, asg.held, copt, corrupt,
                                      asg.snapshots->shared());
  if (!buddy->maps_partner())
    std::cout << "rank " << asg.rank << ": holds copies of rank " << ring.partner(asg.rank)
              << "'s snapshots (its memory not mapped: " << buddy->why_not_mapped() << ")" << std::endl;
}

// With buddies, the rank's snapshots lie in a segment a buddy on this host maps instead of
// receiving copies (worker/snapshot_segment.hpp). TROUPE_BUDDY_SHM=0 keeps them in private
// memory: every copy then travels over the link, as between hosts.
void Engine::Impl::share_snapshots() {
  const char* env = std::getenv("TROUPE_BUDDY_SHM");
  if (env != nullptr && std::string(env) == "0") {
    asg.snapshots->share(nullptr);
    return;
  }
  // Room for every tensor at its 64-byte boundary.
  const size_t need = size_t(state_bytes()) + 64 * (stage_ptrs.size() + 2 * refs.size() + 1);
  const auto& seg = asg.snapshots->shared();
  if (seg && seg->slot_bytes() >= need) return;
  std::string why;
  asg.snapshots->share(SnapshotSegment::create(need, &why));
  if (!asg.snapshots->shared())
    std::cout << "rank " << asg.rank << ": snapshots in private memory (" << why << ")" << std::endl;
}

// A survivor continues from its own snapshot; a new rank receives its buddy's copy
// (heal_from_buddy) or a data-parallel replica's (heal_root).
void Engine::Impl::resume_from_memory() {
  const int64_t step = asg.memory_step;
  if (asg.snapshots && asg.snapshots->find(step)) restore_memory(step);
  if (asg.heal_from_buddy || asg.heal_to_partner) {
    TROUPE_CHECK(buddy != nullptr && asg.snapshots != nullptr, "healing from a buddy needs buddies");
    set_where(asg.heal_from_buddy
                  ? "receiving this rank's state from rank " +
                        std::to_string(BuddyRing{world_size(), asg.buddy_shift}.buddy(asg.rank))
                  : "sending a copy of a rank's state");
    buddy->heal(asg.heal_from_buddy, asg.heal_to_partner, step, state_bytes(), *asg.snapshots);
    if (asg.heal_from_buddy) restore_memory(step, /*checked=*/true);
  }
  if (asg.heal_root >= 0) heal_from_replica(asg.heal_root);
  TROUPE_CHECK(next_step == step, "no in-memory snapshot of step ", step, " here and none to receive");
}

void Engine::Impl::take_memory_snapshot() {
  if (!memory_snapshots() || next_step % spec.checkpoint.memory_every != 0) return;
  set_where("step " + std::to_string(next_step - 1) + ": in-memory snapshot");
  // The slot written now may be the one the buddy link sends: its exchange ends first.
  if (buddy) buddy->wait();
  RankState& s = asg.snapshots->begin();
  s.fingerprint = memory_fingerprint();
  std::vector<const Tensor*> from;
  for (auto* st : stage_ptrs) from.push_back(&st->store().flat_params());
  for (size_t i = 0; i < refs.size(); ++i) {
    from.push_back(&opt->m(i));
    from.push_back(&opt->v(i));
  }
  std::vector<size_t> sizes;
  std::vector<const float*> data;
  for (const Tensor* t : from) {
    sizes.push_back(size_t(t->numel()));
    data.push_back(t->f32());
  }
  s.shape(sizes);
  s.loss_scale = scaler.state();
  s.replicated = zero == 0;
  s.rank = asg.rank;
  s.checksum = copy_into(s, data, next_step);  // what the buddy link sends with it
  asg.snapshots->commit(s, next_step);
  if (buddy) buddy->offer(&s);
}

void Engine::Impl::restore_memory(int64_t step, bool checked) {
  const RankState* s = asg.snapshots ? asg.snapshots->find(step) : nullptr;
  TROUPE_CHECK(s != nullptr, "no in-memory snapshot of step ", step);
  TROUPE_CHECK(s->fingerprint == memory_fingerprint(), "the in-memory snapshot of step ", step,
               " was taken by \"", s->fingerprint, "\", this engine is \"", memory_fingerprint(), "\"");
  TROUPE_CHECK(s->tensors.size() == stage_ptrs.size() + 2 * refs.size(), "in-memory snapshot: tensor count");
  // Its bytes as they were taken (the checksum was taken with the copy; a segment a buddy maps
  // is read-only to any other open, not to a stray write of this process).
  if (!checked && state_checksum(*s) != s->checksum)
    throw SnapshotCorrupt("the in-memory snapshot of rank " + std::to_string(asg.rank) + " of step " +
                          std::to_string(step) + " fails its checksum: not restored");
  size_t t = 0;
  auto put = [&](const Tensor& into) {
    const TensorView& in = s->tensors[t++];
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

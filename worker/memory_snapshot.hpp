// A rank's training state in host memory: the two newest snapshots its engine took, kept by
// the worker process across generations, so that after a failure the ranks that stay continue
// from the newest step every rank completed instead of the newest checkpoint on disk.
//
// Plain C++ (no actors, no engine): the engine writes and reads it (worker/engine_memory.cpp),
// the worker process owns it and reports what it holds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parallel/loss_scale.hpp"
#include "worker/snapshot_segment.hpp"

namespace troupe {

// One tensor of a snapshot: a range of floats in the state's storage.
struct TensorView {
  float* ptr = nullptr;
  size_t n = 0;
  float* data() const { return ptr; }
  size_t size() const { return n; }
  bool empty() const { return n == 0; }
  float& operator[](size_t i) const { return ptr[i]; }
};

struct RankState {
  int64_t next_step = -1;  // the step training continues with from this state; -1: empty
  // What the state fits: layout, rank and the sizes of its tensors. A snapshot is restored
  // only into an engine of the same fingerprint.
  std::string fingerprint;
  // Every chunk's flat parameters, then AdamW's m and v: views into one block (shape()).
  std::vector<TensorView> tensors;
  parallel::LossScaleState loss_scale;
  bool replicated = false;  // every data-parallel replica holds the same state (train.zero 0)
  int rank = -1;            // the rank that took it
  // XXH3-64 of all of the above (state_checksum), computed by the rank that took it: a copy
  // is restored only when its bytes still match.
  uint64_t checksum = 0;

  RankState() = default;
  RankState(RankState&& o) noexcept { *this = std::move(o); }
  RankState& operator=(RankState&& o) noexcept;  // `o` is left empty, its views cleared
  RankState(const RankState&) = delete;          // views into its own storage
  RankState& operator=(const RankState&) = delete;

  // Lays out tensors of `sizes` floats one after another (each at a 64-byte boundary): in the
  // segment slot given by place() when they fit there, else in a block of its own.
  void shape(const std::vector<size_t>& sizes);
  // Where shape() lays out next: slot `slot` of `seg` (this process's own segment).
  void place(std::shared_ptr<SnapshotSegment> seg, int slot);
  // A buddy's view of slot `slot` of a peer's mapped segment: tensors of `sizes` floats as
  // shape() lays them out there. False (nothing changed) when they do not fit the slot.
  bool attach(std::shared_ptr<SnapshotSegment> seg, int slot, const std::vector<size_t>& sizes);
  // The segment its tensors lie in (nullptr: its own block) and the slot.
  const SnapshotSegment* segment() const { return in_segment_ ? seg_.get() : nullptr; }
  int slot() const { return slot_; }
  // A copy in a peer's mapped segment that the peer has begun to overwrite.
  bool stale() const;
  // Sets next_step; in this process's own segment, also the step the slot announces to a buddy.
  void set_step(int64_t step);
  // Host memory this state keeps (a view of a peer's segment keeps none of its own).
  int64_t bytes() const;

 private:
  std::vector<float> own_;
  std::shared_ptr<SnapshotSegment> seg_;
  int slot_ = -1;
  bool in_segment_ = false;
};

// XXH3 (64 bits) over next_step, fingerprint, rank, replicated, the loss scale and every tensor's bytes.
uint64_t state_checksum(const RankState& s);
// Copies from[i] into s.tensors[i] (shaped already, each as long as its source) and returns
// what state_checksum(s) will be once s continues at `next_step`: each byte is hashed from
// the cache it was just written to, not read again.
uint64_t copy_into(RankState& s, const std::vector<const float*>& from, int64_t next_step);

class MemorySnapshots {
 public:
  MemorySnapshots() = default;
  // Destroyed, its shared slots are left as a process that ends leaves them (a buddy mapping
  // them still counts them); clear() and keep_only() mark them empty first.
  ~MemorySnapshots() = default;
  MemorySnapshots(const MemorySnapshots&) = delete;
  MemorySnapshots& operator=(const MemorySnapshots&) = delete;

  // The slot the snapshot of a newer step goes into (the older one, or an empty one), marked
  // empty until commit(): a snapshot interrupted half-way is never restored. With a shared
  // segment (share()), the slot lays its tensors out in the segment's slot of the same index.
  RankState& begin();
  void commit(RankState& slot, int64_t next_step);
  // The snapshot training continues with at `next_step`, nullptr when none is held.
  const RankState* find(int64_t next_step) const;
  // The steps held, newest first.
  std::vector<int64_t> held() const;
  // Whether the newest snapshot may heal a data-parallel replica.
  bool replicated() const;
  // The rank whose snapshots these are (-1: none held). A process holds its own, and copies of
  // its buddy partner's (worker/snapshot_buddy.hpp).
  int rank() const;
  int64_t bytes() const;
  void clear();
  // Drops every snapshot but the one of `next_step` (-1: all): what an engine that starts
  // from `next_step` keeps, so that no state of an abandoned run is restored later.
  void keep_only(int64_t next_step);
  // Snapshots taken from now on lie in `seg` (this process's own), which a buddy on the same
  // host may map; held ones stay where they are until replaced.
  void share(std::shared_ptr<SnapshotSegment> seg) { seg_ = std::move(seg); }
  const std::shared_ptr<SnapshotSegment>& shared() const { return seg_; }

 private:
  bool whole(const RankState& s) const { return s.next_step >= 0 && !s.stale(); }
  const RankState* newest() const;
  void drop(RankState& s);

  RankState slots_[2];
  std::shared_ptr<SnapshotSegment> seg_;
};

}  // namespace troupe

// A rank's training state in host memory: the two newest snapshots its engine took, kept by
// the worker process across generations, so that after a failure the ranks that stay continue
// from the newest step every rank completed instead of the newest checkpoint on disk.
//
// Plain C++ (no actors, no engine): the engine writes and reads it (worker/engine_memory.cpp),
// the worker process owns it and reports what it holds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallel/loss_scale.hpp"

namespace troupe {

struct RankState {
  int64_t next_step = -1;  // the step training continues with from this state; -1: empty
  // What the state fits: layout, rank and the sizes of its tensors. A snapshot is restored
  // only into an engine of the same fingerprint.
  std::string fingerprint;
  std::vector<std::vector<float>> tensors;  // every chunk's flat parameters, then AdamW's m and v
  parallel::LossScaleState loss_scale;
  bool replicated = false;  // every data-parallel replica holds the same state (train.zero 0)
  int rank = -1;            // the rank that took it
  // XXH3-64 of all of the above (state_checksum), computed by the rank that took it: a copy
  // is restored only when its bytes still match.
  uint64_t checksum = 0;
  int64_t bytes() const;
};

// XXH3 (64 bits) over next_step, fingerprint, rank, replicated, the loss scale and every tensor's bytes.
uint64_t state_checksum(const RankState& s);

class MemorySnapshots {
 public:
  // The slot the snapshot of a newer step goes into (the older one, or an empty one), marked
  // empty until commit(): a snapshot interrupted half-way is never restored.
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

 private:
  RankState slots_[2];
};

}  // namespace troupe

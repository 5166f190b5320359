// The ring of snapshot buddies (worker/snapshot_buddy.hpp): rank r's in-memory snapshots are
// copied into rank (r + shift) mod world's memory, and r holds the copies of rank
// (r - shift) mod world. The coordinator chooses the shift and plans healing with it; the
// workers copy along it. Plain arithmetic, no dependencies.
#pragma once

namespace troupe {

struct BuddyRing {
  int world = 1;
  int shift = 0;                                                                    // 0: no buddies
  int buddy(int rank) const { return (rank + shift) % world; }                      // holds rank's copy
  int partner(int rank) const { return ((rank - shift) % world + world) % world; }  // whose copy rank holds
};

}  // namespace troupe

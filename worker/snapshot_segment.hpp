// A rank's in-memory snapshots in shared memory: two slots in a sealed memfd segment that a
// buddy on the same host maps read-only instead of receiving a copy of every snapshot.
//
//   owner (rank r)                         buddy (rank r + s, same host)
//   memfd, sealed: no shrink, no grow      open /proc/<r's pid>/fd/<fd>, check seals, size and
//   ┌────────┬────────────┬────────────┐   token, mmap PROT_READ: the same pages
//   │ header │ slot 0     │ slot 1     │   a slot is the copy of step k while header.step[i] == k
//   └────────┴────────────┴────────────┘
//
// The pages outlive the owner's process while the buddy maps them, so a rank killed on this
// host is healed from them as from a copy. The owner marks a slot empty (step −1) before it
// writes it and sets the step when the snapshot is whole; a buddy counts a copy held only
// while the slot still carries its step, and the checksum the owner took travels in the
// per-step header over the buddy link (worker/snapshot_buddy.hpp), checked when a copy heals.
//
// A peer's announcement is not trusted: the descriptor must be a regular file (looked at through
// an O_PATH handle before it is opened for reading: a FIFO would block, a device act), a memfd
// whose size is sealed, of the size announced, carrying the random token announced, or nothing
// is mapped (the copy then travels over the link as between hosts). The seals keep the owner
// from truncating the pages under the buddy's mapping (a read past the end of a shrunk file is
// SIGBUS). The owner reserves the pages when it creates the segment (fallocate) and makes the
// file read-only to later opens (mode 0400: the owner's descriptor still writes), so another
// process of the same user may read the segment, as it may read /proc/PID/mem, but not write
// it; the buddy keeps no descriptor, only the mapping.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace troupe {

class SnapshotSegment {
 public:
  // A new segment of two slots of at least `slot_bytes` each, owned and writable by this
  // process; nullptr (and `why`) where the system gives none.
  static std::shared_ptr<SnapshotSegment> create(size_t slot_bytes, std::string* why);
  // Process `pid`'s segment `fd`, announced as `bytes` long and carrying `token`, mapped
  // read-only; nullptr (and `why`) when it is not that.
  static std::shared_ptr<SnapshotSegment> map_peer(int64_t pid, int64_t fd, uint64_t bytes, uint64_t token,
                                                   std::string* why);
  ~SnapshotSegment();
  SnapshotSegment(const SnapshotSegment&) = delete;
  SnapshotSegment& operator=(const SnapshotSegment&) = delete;

  bool owned() const { return owned_; }
  size_t slot_bytes() const { return slot_bytes_; }
  // Slot i's floats (i in {0, 1}); writable only in the owner's mapping.
  float* slot(int i) const;
  // The step slot i holds whole (−1: none, or being written).
  int64_t step(int i) const;
  void set_step(int i, int64_t step);  // the owner only

  // What a buddy needs to map it.
  int64_t pid() const { return pid_; }
  int64_t fd() const { return fd_; }
  uint64_t bytes() const { return bytes_; }
  uint64_t token() const { return token_; }

 private:
  struct Header;
  SnapshotSegment(int fd, void* base, size_t bytes, bool owned);
  Header* header() const;

  int fd_ = -1;
  void* base_ = nullptr;
  size_t bytes_ = 0;
  size_t slot_bytes_ = 0;
  bool owned_ = false;
  int64_t pid_ = 0;
  uint64_t token_ = 0;
};

}  // namespace troupe

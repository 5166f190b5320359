// Same-host fast path of the gloo backend: the collectives of a group whose
// ranks all run on this host go through one POSIX shared-memory segment
// instead of TCP. Point-to-point traffic stays on gloo.
//
// Segment: a header (barrier counter, failure word, pids) and one slot of
// kSlotBytes per rank. A collective moves its buffer through the slots in
// pieces; each piece is three steps separated by barriers, e.g. allreduce:
//   1. every rank copies its piece into its own slot;
//   2. rank r reduces element range r of the piece over all slots, in place
//      in its own slot (no other rank reads that range of slot r in this step);
//   3. every rank copies the reduced ranges of all slots into its buffer.
// Waits spin briefly, then sleep on a futex in 1 ms slices, checking the
// deadline, the failure word (abort or timeout of any rank) and whether each
// peer process still exists. All waits are bounded.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "comm/communicator.hpp"

namespace troupe::comm {

class ShmGroup {
 public:
  using Deadline = std::chrono::steady_clock::time_point;

  // Collective over the group. nullptr when the ranks are not all on this
  // host (hostname and namespaces differ). `store` is the group's prefixed store.
  static std::unique_ptr<ShmGroup> create(Store& store, int rank, int size,
                                          std::chrono::milliseconds timeout);
  ~ShmGroup();
  ShmGroup(const ShmGroup&) = delete;
  ShmGroup& operator=(const ShmGroup&) = delete;

  // Each throws CommError (peer_lost, timed_out, aborted) with a detail message.
  void allreduce(void* data, size_t count, DType dtype, ReduceOp op, Deadline dl);
  void reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op, Deadline dl);
  void allgather(const void* in, void* out, size_t count, DType dtype, Deadline dl);
  void broadcast(void* data, size_t count, DType dtype, int root, Deadline dl);
  void barrier(Deadline dl);
  // Any thread: fails this rank's wait with aborted, the peers' with peer_lost.
  void abort() { break_group(CommErrc::aborted); }
  // Marks the group failed by this rank with `code`; every waiting rank wakes.
  void break_group(CommErrc code);

  static constexpr size_t kSlotBytes = size_t{4} << 20;

 private:
  struct Header;
  ShmGroup(int rank, int size, void* base, size_t bytes);
  char* slot(int r) const;
  [[noreturn]] void throw_broken();

  int rank_;
  int size_;
  void* base_;
  size_t bytes_;
  Header* h_;
  uint32_t barriers_ = 0;  // completed by this rank
};

}  // namespace troupe::comm

// Buddies: every rank's in-memory snapshot also lives in another rank's memory, so that a
// rank started in a failed rank's place can continue from the newest completed step whatever
// the layout (no replica needed).
//
// The ranks form a ring of one shift s (chosen by the coordinator: the buddy sits on another
// agent whenever the job spans two): rank r's copy is held by rank (r + s) mod N, and r holds
// the copy of rank (r - s) mod N. After each snapshot the rank's link thread, over a gloo
// communicator of its own (never the training communicators), sends it to the buddy with its
// XXH3 checksum, receives the predecessor's into the older of two held slots, checks its checksum and
// acknowledges it; the sender's confirmed step advances on a good acknowledgement. All of it
// runs while the next step trains; the next snapshot waits for it.
//
//   rank r:  snapshot k ──send──▶ buddy (r+s)        buddy: checksum ok ──ack k──▶ r
//            held slot ◀──recv── predecessor (r-s)   r:     checksum ok ──ack k──▶ (r-s)
//
// At a generation that continues from memory, a rank started anew receives its state of step k
// from its buddy (heal()), which checks the checksum the state was taken with.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.hpp"
#include "core/buddy_ring.hpp"
#include "worker/memory_snapshot.hpp"

namespace troupe {

// Thrown when a received copy does not match the checksum its state was taken with.
class SnapshotCorrupt : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class BuddyLink {
 public:
  // `comm` spans the world (rank = world rank) and is used by the link only; `held` keeps the
  // partner's copies (the worker process owns it). `corrupt_held`: fault injection
  // (TROUPE_SNAPSHOT_FAULT=corrupt): every copy is damaged in memory after its check.
  // `own_segment`: this rank's snapshot segment (its MemorySnapshots' shared()), offered to the
  // buddy, which maps it when it runs on the same host (nullptr: every copy travels). The
  // constructor is collective with the buddy and the partner: they exchange their offers.
  BuddyLink(std::unique_ptr<comm::Communicator> comm, BuddyRing ring, MemorySnapshots* held,
            comm::Options opt, bool corrupt_held, std::shared_ptr<SnapshotSegment> own_segment = nullptr);
  ~BuddyLink();  // aborts an exchange in flight and joins the thread
  BuddyLink(const BuddyLink&) = delete;
  BuddyLink& operator=(const BuddyLink&) = delete;

  // Engine thread, at the start of a generation that continues from memory at `step`, on
  // every rank (collective over the ranks named): `receive`: this rank was started anew and
  // receives its state from its buddy into `own` (throws SnapshotCorrupt on a bad checksum);
  // `send`: its partner was, and is sent the copy held of it. `state_bytes`: what this rank's
  // engine holds of the state (bounds what a copy may announce).
  void heal(bool receive, bool send, int64_t step, int64_t state_bytes, MemorySnapshots& own);
  // Engine thread: `s` (committed in the rank's own snapshots with its checksum, not written
  // again before the next wait()) goes to the buddy while training goes on.
  void offer(const RankState* s);
  // Engine thread: waits for the exchange in flight and rethrows its failure (every time after
  // one: the link is done).
  void wait();
  // The newest step whose snapshot the buddy confirmed (-1: none yet).
  int64_t confirmed() const { return confirmed_.load(); }
  // Any thread: an exchange in flight fails at once.
  void abort();
  // Whether this rank maps its partner's segment (it holds no copy of its own); why not, when not.
  bool maps_partner() const { return from_seg_ != nullptr; }
  const std::string& why_not_mapped() const { return map_why_; }

 private:
  void share_segments();
  void run();
  void exchange(const RankState& mine);

  std::unique_ptr<comm::Communicator> comm_;
  BuddyRing ring_;
  int rank_;
  MemorySnapshots* held_;
  comm::Options opt_;
  bool corrupt_held_;
  std::shared_ptr<SnapshotSegment> own_seg_;   // offered to the buddy
  std::shared_ptr<SnapshotSegment> from_seg_;  // the partner's, mapped (nullptr: copies travel)
  bool to_shared_ = false;                     // the buddy maps own_seg_
  std::string map_why_;
  std::atomic<int64_t> confirmed_{-1};
  std::mutex mu_;
  std::condition_variable cv_;
  const RankState* pending_ = nullptr;  // offered, not yet exchanged
  bool busy_ = false;                   // an exchange runs
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

// The copy of a rank's state that travels: its header, then its tensors. Header and sizes are
// bounded and checked before anything is allocated (a peer is a stranger).
namespace buddy_wire {
// `checksum`: state_checksum of the state as it was taken (travels in the header). `where` 0:
// the tensors follow on the link; 1 + i: they lie in slot i of the sender's segment.
std::string encode_header(const RankState& s, uint64_t checksum, int where = 0);
struct Header {
  int64_t step = -1;          // the step the state continues with
  int where = 0;              // as encoded
  std::vector<size_t> sizes;  // of its tensors, in floats
};
// Fills `into`'s fields but its tensors, leaving it marked empty (next_step -1), and returns
// what else the header says; throws troupe::Error on a malformed header or one past
// `max_bytes` of tensors.
Header decode_header(const std::string& bytes, int64_t max_bytes, RankState* into);
}  // namespace buddy_wire

}  // namespace troupe

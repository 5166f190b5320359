// worker/snapshot_buddy.hpp: the copy of each rank's snapshot in its buddy's memory.
#include "worker/snapshot_buddy.hpp"

#include <xxhash.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#include "core/error.hpp"

namespace troupe {

namespace buddy_wire {

namespace {

constexpr uint32_t kMagic = 0x54524231;  // "TRB1"
constexpr size_t kMaxHeader = size_t(1) << 20;
constexpr size_t kMaxFingerprint = size_t(64) << 10;
constexpr uint32_t kMaxTensors = 1u << 16;

template <class T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

struct Reader {
  const std::string& in;
  size_t at = 0;
  template <class T>
  T get() {
    require(at + sizeof(T) <= in.size(), "snapshot copy: header ends early (", in.size(), " bytes)");
    T v;
    std::memcpy(&v, in.data() + at, sizeof v);
    at += sizeof v;
    return v;
  }
};

}  // namespace

std::string encode_header(const RankState& s, uint64_t checksum, int where) {
  std::string out;
  put<uint32_t>(out, kMagic);
  put<uint8_t>(out, uint8_t(where));
  put<int64_t>(out, s.next_step);
  put<int32_t>(out, s.rank);
  put<uint8_t>(out, s.replicated ? 1 : 0);
  put<uint64_t>(out, checksum);
  put<double>(out, s.loss_scale.scale);
  put<int64_t>(out, s.loss_scale.clean_steps);
  put<int64_t>(out, s.loss_scale.skipped_steps);
  put<uint32_t>(out, uint32_t(s.fingerprint.size()));
  out += s.fingerprint;
  put<uint32_t>(out, uint32_t(s.tensors.size()));
  for (const auto& t : s.tensors) put<uint64_t>(out, t.size());
  return out;
}

Header decode_header(const std::string& bytes, int64_t max_bytes, RankState* into) {
  require(bytes.size() <= kMaxHeader, "snapshot copy: header of ", bytes.size(), " bytes (at most ",
          kMaxHeader, ")");
  Reader r{bytes};
  require(r.get<uint32_t>() == kMagic, "snapshot copy: not a snapshot header");
  Header h;
  h.where = r.get<uint8_t>();
  require(h.where <= 2, "snapshot copy: malformed header (where ", int(h.where), ")");
  RankState& s = *into;
  s.next_step = r.get<int64_t>();
  s.rank = r.get<int32_t>();
  const uint8_t replicated = r.get<uint8_t>();
  require(replicated <= 1 && s.next_step >= 0 && s.rank >= 0, "snapshot copy: malformed header");
  s.replicated = replicated == 1;
  s.checksum = r.get<uint64_t>();
  s.loss_scale.scale = r.get<double>();
  s.loss_scale.clean_steps = r.get<int64_t>();
  s.loss_scale.skipped_steps = r.get<int64_t>();
  const uint32_t flen = r.get<uint32_t>();
  require(flen <= kMaxFingerprint && r.at + flen <= bytes.size(), "snapshot copy: fingerprint of ", flen,
          " bytes");
  s.fingerprint = bytes.substr(r.at, flen);
  r.at += flen;
  const uint32_t n = r.get<uint32_t>();
  require(n <= kMaxTensors, "snapshot copy: ", n, " tensors (at most ", kMaxTensors, ")");
  h.sizes.resize(n);
  uint64_t total = 0;
  for (auto& z : h.sizes) {
    const uint64_t v = r.get<uint64_t>();
    require(v <= uint64_t(max_bytes) / sizeof(float) && total + v * sizeof(float) <= uint64_t(max_bytes),
            "snapshot copy: more than ", max_bytes, " bytes of tensors");
    total += v * sizeof(float);
    z = size_t(v);
  }
  require(r.at == bytes.size(), "snapshot copy: ", bytes.size() - r.at, " bytes after the header");
  // Not a snapshot until its bytes arrived and matched: the slot stays marked empty.
  h.step = std::exchange(s.next_step, -1);
  return h;
}

}  // namespace buddy_wire

namespace {

enum Tag : uint32_t { kLength = 1, kHeader = 2, kTensor = 3, kAck = 4, kOffer = 5, kMapped = 6 };

// One copy from this rank to `to` (out) and one from `from` into `in`, either absent (-1):
// the header's length, the header, then the tensors, each stage one batch so that a rank may
// send to and receive from the same peer. `out_where` 0: out's tensors travel; 1 + i: they lie
// in slot i of this rank's segment, which the buddy maps (only the header travels). A header
// received that names a slot attaches `in` to `from_seg`, the partner's mapped segment.
// Returns the step the received copy continues with (-1: none received); `in` stays marked
// empty (next_step -1) for the caller to commit once it checked it.
int64_t transfer(comm::Communicator& c, int to, const RankState* out, uint64_t out_sum, int out_where,
                 int from, RankState* in, const std::shared_ptr<SnapshotSegment>& from_seg, int64_t max_bytes,
                 const comm::Options& opt) {
  using comm::P2POp;
  const std::string head_out = out ? buddy_wire::encode_header(*out, out_sum, out_where) : std::string();
  uint64_t len_out = head_out.size(), len_in = 0;
  std::vector<P2POp> ops;
  if (out) ops.push_back(P2POp::send(&len_out, sizeof len_out, to, kLength));
  if (in) ops.push_back(P2POp::recv(&len_in, sizeof len_in, from, kLength));
  c.batch(ops, opt);
  require(len_in <= (uint64_t(1) << 20), "snapshot copy from rank ", from, ": header of ", len_in, " bytes");
  std::string head_in(len_in, '\0');
  ops.clear();
  if (out) ops.push_back(P2POp::send(head_out.data(), head_out.size(), to, kHeader));
  if (in) ops.push_back(P2POp::recv(head_in.data(), head_in.size(), from, kHeader));
  c.batch(ops, opt);
  buddy_wire::Header h;
  if (in) {
    h = buddy_wire::decode_header(head_in, max_bytes, in);
    if (h.where == 0) {
      in->shape(h.sizes);
    } else {
      require(from_seg != nullptr, "snapshot copy from rank ", from,
              " announced in shared memory, which this rank does not map");
      require(in->attach(from_seg, h.where - 1, h.sizes), "snapshot copy from rank ", from,
              ": its tensors do not fit the slot of its segment");
    }
  }
  ops.clear();
  if (out && out_where == 0)
    for (const auto& t : out->tensors)
      if (!t.empty()) ops.push_back(P2POp::send(t.data(), t.size() * sizeof(float), to, kTensor));
  if (in && h.where == 0)
    for (auto& t : in->tensors)
      if (!t.empty()) ops.push_back(P2POp::recv(t.data(), t.size() * sizeof(float), from, kTensor));
  c.batch(ops, opt);
  return in ? h.step : -1;
}

// What a rank announces to its buddy about its segment (pid 0: none).
struct Offer {
  uint64_t magic = 0x54524f4646455231ull;  // "TROFFER1"
  uint64_t host = 0;                       // XXH3 of comm::host_identity()
  int64_t pid = 0;
  int64_t fd = -1;
  uint64_t bytes = 0;
  uint64_t token = 0;
};

std::string hex(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016" PRIx64, v);
  return b;
}

// The most bytes of tensors a copy may announce: a partner's stage may be larger than this
// rank's (the embedding), not without bound.
int64_t copy_limit(int64_t own_bytes) { return 8 * own_bytes + (int64_t(1) << 30); }

}  // namespace

BuddyLink::BuddyLink(std::unique_ptr<comm::Communicator> comm, BuddyRing ring, MemorySnapshots* held,
                     comm::Options opt, bool corrupt_held, std::shared_ptr<SnapshotSegment> own_segment)
    : comm_(std::move(comm)),
      ring_(ring),
      rank_(comm_->rank()),
      held_(held),
      opt_(opt),
      corrupt_held_(corrupt_held),
      own_seg_(std::move(own_segment)) {
  require(ring_.world == comm_->size() && ring_.shift > 0 && ring_.shift < ring_.world && held_ != nullptr,
          "buddy ring: shift ", ring_.shift, " over ", ring_.world, " ranks");
  share_segments();
  thread_ = std::thread([this] { run(); });
}

// Each rank announces its segment to its buddy, which maps it when it runs on the same host;
// both then know which way every copy goes.
void BuddyLink::share_segments() {
  const int to = ring_.buddy(rank_), from = ring_.partner(rank_);
  const std::string id = comm::host_identity();
  Offer mine, theirs;
  theirs.magic = 0;  // stays so unless an offer arrives
  mine.host = XXH3_64bits(id.data(), id.size());
  if (own_seg_) {
    mine.pid = own_seg_->pid();
    mine.fd = own_seg_->fd();
    mine.bytes = own_seg_->bytes();
    mine.token = own_seg_->token();
  }
  comm_->batch({comm::P2POp::send(&mine, sizeof mine, to, kOffer),
                comm::P2POp::recv(&theirs, sizeof theirs, from, kOffer)},
               opt_);
  if (theirs.magic != Offer{}.magic) {
    map_why_ = "rank " + std::to_string(from) + " sent no segment offer";
  } else if (theirs.pid == 0) {
    map_why_ = "rank " + std::to_string(from) + " shares no segment";
  } else if (theirs.host != mine.host) {
    map_why_ = "rank " + std::to_string(from) + " runs on another host";
  } else if (!own_seg_) {
    map_why_ = "shared snapshots are off here";
  } else {
    from_seg_ = SnapshotSegment::map_peer(theirs.pid, theirs.fd, theirs.bytes, theirs.token, &map_why_);
  }
  uint8_t mapped = from_seg_ ? 1 : 0, buddy_mapped = 0;
  comm_->batch(
      {comm::P2POp::send(&mapped, 1, from, kMapped), comm::P2POp::recv(&buddy_mapped, 1, to, kMapped)}, opt_);
  to_shared_ = buddy_mapped == 1 && own_seg_ != nullptr;
}

BuddyLink::~BuddyLink() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    if (busy_ || pending_) comm_->abort();
  }
  cv_.notify_all();
  thread_.join();
}

void BuddyLink::abort() { comm_->abort(); }

void BuddyLink::offer(const RankState* s) {
  std::lock_guard<std::mutex> lock(mu_);
  pending_ = s;
  cv_.notify_all();
}

void BuddyLink::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return error_ || (!busy_ && pending_ == nullptr); });
  if (error_) std::rethrow_exception(error_);  // every time: the link is done
}

void BuddyLink::run() {
  for (;;) {
    const RankState* s = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || pending_ != nullptr; });
      if (stop_) return;
      s = std::exchange(pending_, nullptr);
      busy_ = true;
    }
    std::exception_ptr err;
    try {
      exchange(*s);
    } catch (...) {
      err = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      busy_ = false;
      if (err && !error_) error_ = err;
    }
    cv_.notify_all();
    if (err) return;  // the communicator is poisoned: the engine fails at its next wait()
  }
}

void BuddyLink::exchange(const RankState& mine) {
  const uint64_t sum = mine.checksum;  // taken with the snapshot
  const int to = ring_.buddy(rank_), from = ring_.partner(rank_);
  // In this rank's segment, which the buddy maps: only the header travels.
  const int where = to_shared_ && mine.segment() == own_seg_.get() ? 1 + mine.slot() : 0;
  RankState& in = held_->begin();  // marked empty until it is checked
  const int64_t step_in =
      transfer(*comm_, to, &mine, sum, where, from, &in, from_seg_, copy_limit(mine.bytes()), opt_);
  // A copy that travelled is checked now (the checksum covers the step: as the sender took it);
  // the partner's own pages, when they heal a rank (its slot still carries the step meanwhile).
  in.next_step = step_in;
  const bool ok = in.rank == from && (in.segment() ? !in.stale() : state_checksum(in) == in.checksum);
  in.next_step = -1;
  if (ok) {
    held_->commit(in, step_in);
    if (corrupt_held_ && in.segment()) {
      in.checksum = ~in.checksum;  // the partner's pages are read-only here: its record is damaged
    } else if (corrupt_held_) {
      for (auto& t : in.tensors)
        if (!t.empty()) {
          t[0] = -t[0] + 1.0f;  // damaged in memory after its check
          break;
        }
    }
  }
  int64_t ack_out = ok ? step_in : -1, ack_in = -1;
  comm_->batch({comm::P2POp::send(&ack_out, sizeof ack_out, from, kAck),
                comm::P2POp::recv(&ack_in, sizeof ack_in, to, kAck)},
               opt_);
  if (ack_in == mine.next_step) confirmed_.store(mine.next_step);
}

void BuddyLink::heal(bool receive, bool send, int64_t step, int64_t state_bytes, MemorySnapshots& own) {
  const RankState* out = nullptr;
  const int partner = ring_.partner(rank_), buddy = ring_.buddy(rank_);
  if (send) {
    out = held_->find(step);
    require(out != nullptr && out->rank == partner, "rank ", rank_, " holds no copy of rank ", partner,
            "'s in-memory snapshot of step ", step);
  }
  RankState* in = receive ? &own.begin() : nullptr;
  if (!out && !in) return;
  const int64_t step_in = transfer(*comm_, partner, out, out ? out->checksum : 0, 0, buddy, in, nullptr,
                                   copy_limit(state_bytes), opt_);
  if (!in) return;
  in->next_step = step_in;
  const uint64_t sum = state_checksum(*in);
  in->next_step = -1;
  if (sum != in->checksum || in->rank != rank_ || step_in != step)
    throw SnapshotCorrupt("the in-memory snapshot of rank " + std::to_string(rank_) + " of step " +
                          std::to_string(step) + " held by rank " + std::to_string(buddy) +
                          " fails its checksum (XXH3 " + hex(sum) + ", taken as " + hex(in->checksum) +
                          "): not restored");
  own.commit(*in, step);
}

}  // namespace troupe

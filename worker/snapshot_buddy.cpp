// worker/snapshot_buddy.hpp: the copy of each rank's snapshot in its buddy's memory.
#include "worker/snapshot_buddy.hpp"

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

std::string encode_header(const RankState& s, uint64_t checksum) {
  std::string out;
  put<uint32_t>(out, kMagic);
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

int64_t decode_header(const std::string& bytes, int64_t max_bytes, RankState* into) {
  require(bytes.size() <= kMaxHeader, "snapshot copy: header of ", bytes.size(), " bytes (at most ",
          kMaxHeader, ")");
  Reader r{bytes};
  require(r.get<uint32_t>() == kMagic, "snapshot copy: not a snapshot header");
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
  std::vector<uint64_t> sizes(n);
  uint64_t total = 0;
  for (auto& z : sizes) {
    z = r.get<uint64_t>();
    require(z <= uint64_t(max_bytes) / sizeof(float) && total + z * sizeof(float) <= uint64_t(max_bytes),
            "snapshot copy: more than ", max_bytes, " bytes of tensors");
    total += z * sizeof(float);
  }
  require(r.at == bytes.size(), "snapshot copy: ", bytes.size() - r.at, " bytes after the header");
  s.tensors.resize(n);
  for (uint32_t i = 0; i < n; ++i) s.tensors[i].resize(sizes[i]);
  // Not a snapshot until its bytes arrived and matched: the slot stays marked empty.
  return std::exchange(s.next_step, -1);
}

}  // namespace buddy_wire

namespace {

enum Tag : uint32_t { kLength = 1, kHeader = 2, kTensor = 3, kAck = 4 };

// One copy from this rank to `to` (out) and one from `from` into `in`, either absent (-1):
// the header's length, the header, then the tensors, each stage one batch so that a rank may
// send to and receive from the same peer.
// Returns the step the received copy continues with (-1: none received); `in` stays marked
// empty (next_step -1) for the caller to commit once it checked the checksum.
int64_t transfer(comm::Communicator& c, int to, const RankState* out, uint64_t out_sum, int from,
                 RankState* in, int64_t max_bytes, const comm::Options& opt) {
  using comm::P2POp;
  const std::string head_out = out ? buddy_wire::encode_header(*out, out_sum) : std::string();
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
  const int64_t step_in = in ? buddy_wire::decode_header(head_in, max_bytes, in) : -1;
  ops.clear();
  if (out)
    for (const auto& t : out->tensors)
      if (!t.empty()) ops.push_back(P2POp::send(t.data(), t.size() * sizeof(float), to, kTensor));
  if (in)
    for (auto& t : in->tensors)
      if (!t.empty()) ops.push_back(P2POp::recv(t.data(), t.size() * sizeof(float), from, kTensor));
  c.batch(ops, opt);
  return step_in;
}

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
                     comm::Options opt, bool corrupt_held)
    : comm_(std::move(comm)),
      ring_(ring),
      rank_(comm_->rank()),
      held_(held),
      opt_(opt),
      corrupt_held_(corrupt_held) {
  require(ring_.world == comm_->size() && ring_.shift > 0 && ring_.shift < ring_.world && held_ != nullptr,
          "buddy ring: shift ", ring_.shift, " over ", ring_.world, " ranks");
  thread_ = std::thread([this] { run(); });
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
  const uint64_t sum = state_checksum(mine);
  const int to = ring_.buddy(rank_), from = ring_.partner(rank_);
  RankState& in = held_->begin();  // marked empty until its checksum matched
  const int64_t step_in = transfer(*comm_, to, &mine, sum, from, &in, copy_limit(mine.bytes()), opt_);
  // The checksum covers the step: checked as the sender took it.
  in.next_step = step_in;
  const bool ok = in.rank == from && state_checksum(in) == in.checksum;
  in.next_step = -1;
  if (ok) {
    held_->commit(in, step_in);
    if (corrupt_held_)
      for (auto& t : in.tensors)
        if (!t.empty()) {
          t[0] = -t[0] + 1.0f;  // damaged in memory after its check
          break;
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
  const int64_t step_in =
      transfer(*comm_, partner, out, out ? out->checksum : 0, buddy, in, copy_limit(state_bytes), opt_);
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

#include "comm/gloo/shm_group.hpp"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <random>
#include <thread>

#include "comm/reduce.hpp"

namespace troupe::comm {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kMaxRanks = 256;
constexpr size_t kHeaderBytes = 4096;

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, long ns) {
  struct timespec ts {
    0, ns
  };
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Element range [lo, hi) of part r when n elements are split into `parts`.
std::pair<size_t, size_t> part(size_t n, int parts, int r) {
  const size_t base = n / parts, extra = n % parts;
  const size_t lo = r * base + std::min<size_t>(r, extra);
  return {lo, lo + base + (static_cast<size_t>(r) < extra ? 1 : 0)};
}

}  // namespace

struct ShmGroup::Header {
  std::atomic<uint32_t> arrived;   // barrier arrivals, all ranks, ever (wraps)
  std::atomic<uint32_t> attached;  // ranks that mapped the segment
  std::atomic<uint32_t> broken;    // 0, or 1 once a rank failed the group
  std::atomic<int32_t> broken_by;
  std::atomic<int32_t> broken_code;
  std::atomic<int32_t> pids[kMaxRanks];
};
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "futex word");

std::unique_ptr<ShmGroup> ShmGroup::create(Store& store, int rank, int size,
                                           std::chrono::milliseconds timeout) {
  if (size < 2 || size > kMaxRanks) return nullptr;
  store.set("shm/host/" + std::to_string(rank), host_identity());
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back("shm/host/" + std::to_string(r));
  store.wait(keys, timeout);
  const std::string mine = host_identity();
  for (const auto& k : keys)
    if (store.get(k, timeout) != mine) return nullptr;

  const size_t bytes = kHeaderBytes + static_cast<size_t>(size) * kSlotBytes;
  std::string name;
  int fd = -1;
  if (rank == 0) {
    std::random_device rd;
    name = "/troupe-" + std::to_string(::getpid()) + "-" + std::to_string(rd());
    fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      if (fd >= 0) ::close(fd);
      ::shm_unlink(name.c_str());
      throw CommError(CommErrc::internal, "shm: cannot create " + name + ": " + std::strerror(errno));
    }
    store.set("shm/name", name);
  } else {
    name = store.get("shm/name", timeout);
    fd = ::shm_open(name.c_str(), O_RDWR, 0600);
    if (fd < 0) throw CommError(CommErrc::internal, "shm: cannot open " + name + ": " + std::strerror(errno));
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) {
    if (rank == 0) ::shm_unlink(name.c_str());
    throw CommError(CommErrc::internal, "shm: mmap failed: " + std::string(std::strerror(errno)));
  }
  std::unique_ptr<ShmGroup> g(new ShmGroup(rank, size, base, bytes));
  g->h_->pids[rank].store(static_cast<int32_t>(::getpid()));
  g->h_->attached.fetch_add(1);
  // Once everyone has mapped it the name is removed: a crash leaks nothing.
  const auto deadline = Clock::now() + timeout;
  while (g->h_->attached.load() < static_cast<uint32_t>(size)) {
    if (Clock::now() > deadline) {
      if (rank == 0) ::shm_unlink(name.c_str());
      throw CommError(CommErrc::timed_out, "shm: peers did not attach to " + name);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (rank == 0) ::shm_unlink(name.c_str());
  return g;
}

ShmGroup::ShmGroup(int rank, int size, void* base, size_t bytes)
    : rank_(rank), size_(size), base_(base), bytes_(bytes), h_(static_cast<Header*>(base)) {}

ShmGroup::~ShmGroup() { ::munmap(base_, bytes_); }

char* ShmGroup::slot(int r) const { return static_cast<char*>(base_) + kHeaderBytes + r * kSlotBytes; }

void ShmGroup::break_group(CommErrc code) {
  uint32_t zero = 0;
  if (h_->broken.compare_exchange_strong(zero, 2)) {
    h_->broken_by.store(rank_);
    h_->broken_code.store(static_cast<int32_t>(code));
    h_->broken.store(1);
  }
  futex_wake_all(&h_->arrived);
}

void ShmGroup::throw_broken() {
  while (h_->broken.load() != 1) std::this_thread::yield();  // the marker is mid-write
  const int by = h_->broken_by.load();
  const auto code = static_cast<CommErrc>(h_->broken_code.load());
  if (by == rank_) throw CommError(code, "shm: this rank failed the group");
  throw CommError(CommErrc::peer_lost,
                  "shm: rank " + std::to_string(by) + " failed the group (" + to_string(code) + ")");
}

void ShmGroup::barrier(Deadline dl) {
  ++barriers_;
  const uint32_t target = barriers_ * static_cast<uint32_t>(size_);
  const uint32_t now = h_->arrived.fetch_add(1) + 1;
  if (now == target) futex_wake_all(&h_->arrived);
  auto reached = [&](uint32_t v) { return static_cast<int32_t>(v - target) >= 0; };
  int spins = 0;
  auto next_check = Clock::now();
  for (;;) {
    const uint32_t v = h_->arrived.load();
    if (reached(v)) return;
    if (h_->broken.load()) throw_broken();
    if (++spins < 200) continue;
    futex_wait(&h_->arrived, v, 1000000);
    const auto t = Clock::now();
    if (t < next_check) continue;
    next_check = t + std::chrono::milliseconds(10);
    if (t > dl) {
      break_group(CommErrc::timed_out);
      throw CommError(CommErrc::timed_out, "shm: deadline passed waiting for the peers");
    }
    for (int r = 0; r < size_; ++r) {
      const pid_t pid = h_->pids[r].load();
      if (r != rank_ && ::kill(pid, 0) != 0 && errno == ESRCH) {
        break_group(CommErrc::peer_lost);
        throw CommError(CommErrc::peer_lost, "shm: rank " + std::to_string(r) + " (pid " +
                                                 std::to_string(pid) + ") no longer exists");
      }
    }
  }
}

void ShmGroup::allreduce(void* data, size_t count, DType dtype, ReduceOp op, Deadline dl) {
  const size_t esz = dtype_size(dtype), piece = kSlotBytes / esz;
  char* d = static_cast<char*>(data);
  for (size_t off = 0; off < count; off += piece) {
    const size_t m = std::min(piece, count - off);
    std::memcpy(slot(rank_), d + off * esz, m * esz);
    barrier(dl);
    const auto [lo, hi] = part(m, size_, rank_);
    // This rank's range, own slot first, then the others in rank order.
    std::vector<const void*> ins{slot(rank_) + lo * esz};
    for (int j = 0; j < size_; ++j)
      if (j != rank_) ins.push_back(slot(j) + lo * esz);
    reduce_all(dtype, op, slot(rank_) + lo * esz, ins, hi - lo);
    barrier(dl);
    for (int j = 0; j < size_; ++j) {
      const auto [l, h] = part(m, size_, j);
      std::memcpy(d + (off + l) * esz, slot(j) + l * esz, (h - l) * esz);
    }
    barrier(dl);
  }
}

void ShmGroup::reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                              Deadline dl) {
  const size_t esz = dtype_size(dtype), piece = kSlotBytes / esz / size_;
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  for (size_t off = 0; off < count; off += piece) {
    const size_t m = std::min(piece, count - off);
    // Slot layout for this piece: (size, m), row j = the part bound for rank j.
    for (int j = 0; j < size_; ++j)
      std::memcpy(slot(rank_) + j * m * esz, src + (j * count + off) * esz, m * esz);
    barrier(dl);
    std::vector<const void*> ins;
    for (int j = 0; j < size_; ++j) ins.push_back(slot(j) + rank_ * m * esz);
    reduce_all(dtype, op, dst + off * esz, ins, m);
    barrier(dl);
  }
}

void ShmGroup::allgather(const void* in, void* out, size_t count, DType dtype, Deadline dl) {
  const size_t esz = dtype_size(dtype), piece = kSlotBytes / esz;
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  for (size_t off = 0; off < count; off += piece) {
    const size_t m = std::min(piece, count - off);
    std::memcpy(slot(rank_), src + off * esz, m * esz);
    barrier(dl);
    for (int j = 0; j < size_; ++j) std::memmove(dst + (j * count + off) * esz, slot(j), m * esz);
    barrier(dl);
  }
}

void ShmGroup::broadcast(void* data, size_t count, DType dtype, int root, Deadline dl) {
  const size_t esz = dtype_size(dtype), piece = kSlotBytes / esz;
  char* d = static_cast<char*>(data);
  for (size_t off = 0; off < count; off += piece) {
    const size_t m = std::min(piece, count - off);
    if (rank_ == root) std::memcpy(slot(root), d + off * esz, m * esz);
    barrier(dl);
    if (rank_ != root) std::memcpy(d + off * esz, slot(root), m * esz);
    barrier(dl);
  }
}

}  // namespace troupe::comm

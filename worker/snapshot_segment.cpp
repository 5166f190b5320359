// worker/snapshot_segment.hpp: snapshots in a sealed memfd that a buddy on the host maps.
#include "worker/snapshot_segment.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <new>
#include <random>

namespace troupe {

namespace {

constexpr uint64_t kMagic = 0x5452534547303031ull;  // "TRSEG001"
constexpr size_t kHeaderBytes = 4096;
constexpr size_t kPage = 4096;
constexpr unsigned kSeals = F_SEAL_SHRINK | F_SEAL_GROW;
// A buddy maps at most this much of a peer's memory (a stage of a very large model is less).
constexpr uint64_t kMaxBytes = uint64_t(1) << 40;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

std::string sys_error(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

}  // namespace

struct SnapshotSegment::Header {
  uint64_t magic;
  uint64_t token;
  std::atomic<int64_t> step[2];
};
static_assert(std::atomic<int64_t>::is_always_lock_free, "a step word shared between processes");

SnapshotSegment::SnapshotSegment(int fd, void* base, size_t bytes, bool owned)
    : fd_(fd), base_(base), bytes_(bytes), slot_bytes_((bytes - kHeaderBytes) / 2), owned_(owned) {}

SnapshotSegment::~SnapshotSegment() {
  if (base_ != nullptr) ::munmap(base_, bytes_);
  if (fd_ >= 0) ::close(fd_);
}

SnapshotSegment::Header* SnapshotSegment::header() const {
  static_assert(sizeof(Header) <= kHeaderBytes, "segment header");
  return static_cast<Header*>(base_);
}

float* SnapshotSegment::slot(int i) const {
  return reinterpret_cast<float*>(static_cast<char*>(base_) + kHeaderBytes + size_t(i) * slot_bytes_);
}

int64_t SnapshotSegment::step(int i) const { return header()->step[i].load(std::memory_order_acquire); }

void SnapshotSegment::set_step(int i, int64_t step) {
  if (!owned_) return;
  if (step < 0) {
    // Marked empty before any byte of the slot changes (the writes that follow stay after it).
    header()->step[i].store(step, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
  } else {
    header()->step[i].store(step, std::memory_order_release);  // after every byte of it
  }
}

std::shared_ptr<SnapshotSegment> SnapshotSegment::create(size_t slot_bytes, std::string* why) {
  const size_t slot = round_up(slot_bytes > 0 ? slot_bytes : 1, kPage);
  const size_t bytes = kHeaderBytes + 2 * slot;
  if (bytes > kMaxBytes) {
    *why = "snapshot segment of " + std::to_string(bytes) + " bytes";
    return nullptr;
  }
  const int fd = ::memfd_create("troupe-snapshots", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    *why = sys_error("memfd_create");
    return nullptr;
  }
  // Sized and its pages reserved now (a write fault in a segment that cannot grow would be
  // SIGBUS, not an error); read-only to any later open (a reopen through /proc checks the
  // mode; this descriptor keeps writing); sealed against resizing.
  if (::ftruncate(fd, off_t(bytes)) != 0 || ::fallocate(fd, 0, 0, off_t(bytes)) != 0 ||
      ::fchmod(fd, S_IRUSR) != 0 || ::fcntl(fd, F_ADD_SEALS, kSeals | F_SEAL_SEAL) != 0) {
    *why = sys_error("sizing, reserving and sealing the snapshot segment");
    ::close(fd);
    return nullptr;
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    *why = sys_error("mmap of the snapshot segment");
    ::close(fd);
    return nullptr;
  }
  std::shared_ptr<SnapshotSegment> s(new SnapshotSegment(fd, base, bytes, true));
  uint64_t token = uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
  try {
    std::random_device rd;
    token ^= (uint64_t(rd()) << 32) ^ uint64_t(rd());
  } catch (const std::exception&) {
    // The clock alone: the token tells segments apart, it is not a secret.
  }
  s->token_ = token ^ (uint64_t(::getpid()) << 16);
  s->pid_ = ::getpid();
  Header* h = new (base) Header;
  h->magic = kMagic;
  h->token = s->token_;
  h->step[0].store(-1);
  h->step[1].store(-1);
  return s;
}

std::shared_ptr<SnapshotSegment> SnapshotSegment::map_peer(int64_t pid, int64_t fd, uint64_t bytes,
                                                           uint64_t token, std::string* why) {
  if (pid <= 0 || pid > (int64_t(1) << 22) || fd < 0 || fd > (int64_t(1) << 20) ||
      bytes < kHeaderBytes + 2 * kPage || bytes > kMaxBytes || (bytes - kHeaderBytes) % (2 * kPage) != 0) {
    *why = "a malformed announcement (pid " + std::to_string(pid) + ", fd " + std::to_string(fd) + ", " +
           std::to_string(bytes) + " bytes)";
    return nullptr;
  }
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  // What the descriptor is, before anything opens it for reading (a FIFO would block the
  // open, a device would act on it): a path handle first, then a regular file only.
  const int handle = ::open(path.c_str(), O_PATH | O_CLOEXEC);
  if (handle < 0) {
    *why = sys_error(("open " + path).c_str());
    return nullptr;
  }
  struct stat first {};
  if (::fstat(handle, &first) != 0 || !S_ISREG(first.st_mode) || uint64_t(first.st_size) != bytes) {
    *why = path + " is not a sealed segment of " + std::to_string(bytes) + " bytes";
    ::close(handle);
    return nullptr;
  }
  const std::string again = "/proc/self/fd/" + std::to_string(handle);
  const int f = ::open(again.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  ::close(handle);
  if (f < 0) {
    *why = sys_error(("open " + path).c_str());
    return nullptr;
  }
  struct stat st {};
  const int seals = ::fcntl(f, F_GET_SEALS);
  if (::fstat(f, &st) != 0 || st.st_ino != first.st_ino || st.st_dev != first.st_dev ||
      uint64_t(st.st_size) != bytes || seals < 0 || (unsigned(seals) & kSeals) != kSeals) {
    *why = path + " is not a sealed segment of " + std::to_string(bytes) + " bytes";
    ::close(f);
    return nullptr;
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, f, 0);
  ::close(f);  // the mapping keeps the pages; no descriptor stays open to them here
  if (base == MAP_FAILED) {
    *why = sys_error(("mmap " + path).c_str());
    return nullptr;
  }
  std::shared_ptr<SnapshotSegment> s(new SnapshotSegment(-1, base, bytes, false));
  const Header* h = s->header();
  if (h->magic != kMagic || h->token != token) {
    *why = path + " does not carry the token announced";
    return nullptr;
  }
  s->pid_ = pid;
  s->token_ = token;
  return s;
}

}  // namespace troupe

#include "checkpoint/verified.hpp"

#include <sys/stat.h>

#include "checkpoint/checkpoint.hpp"

namespace troupe::checkpoint {

VerifiedCheckpoints::VerifiedCheckpoints(size_t capacity) : capacity_(capacity), thread_([this] { run(); }) {}

VerifiedCheckpoints::~VerifiedCheckpoints() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::optional<VerifiedCheckpoints::Stamp> VerifiedCheckpoints::stamp(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  Stamp s;
  s.dev = st.st_dev;
  s.ino = st.st_ino;
  s.size = static_cast<int64_t>(st.st_size);
  s.mtime_ns = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  s.ctime_ns = int64_t(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
  return s;
}

bool VerifiedCheckpoints::unchanged(const std::string& dir, const Stamps& s) {
  for (const auto& [name, was] : s) {
    auto now = stamp(dir + "/" + name);
    if (!now || !(*now == was)) return false;
  }
  return true;
}

bool VerifiedCheckpoints::verify_and_remember(const std::string& dir, const std::atomic<bool>* stop) {
  // The files' identities before their bytes are read, and again after: a file written while
  // it was read is not remembered (its next check reads it again).
  Stamps before;
  const Manifest m = read_manifest(dir);
  std::vector<std::string> names = {"manifest.json"};
  for (const auto& f : m.files) names.push_back(f.name);
  for (const auto& n : names)
    if (auto s = stamp(dir + "/" + n)) before.push_back({n, *s});
  for (const auto& f : m.files) {
    if (stop && stop->load()) return false;
    verify_file(dir, f);
  }
  // A file verify_file passed is regular: every name has its stamp unless it changed since.
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++verifications_;
  }
  if (before.size() == names.size() && unchanged(dir, before)) remember(dir, std::move(before));
  return true;
}

void VerifiedCheckpoints::remember(const std::string& dir, Stamps s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ok_.count(dir) == 0) order_.push_back(dir);
  ok_[dir] = std::move(s);
  while (order_.size() > capacity_) {
    ok_.erase(order_.front());
    order_.pop_front();
  }
}

bool VerifiedCheckpoints::known(const std::string& dir) const {
  Stamps s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = ok_.find(dir);
    if (it == ok_.end()) return false;
    s = it->second;
  }
  return unchanged(dir, s);
}

void VerifiedCheckpoints::check(const std::string& dir) {
  if (known(dir)) return;
  verify_and_remember(dir, nullptr);
}

std::optional<std::string> VerifiedCheckpoints::latest_valid(const std::string& root,
                                                             std::vector<std::string>* skipped) {
  return checkpoint::latest_valid(root, skipped, [this](const std::string& dir) { check(dir); });
}

void VerifiedCheckpoints::verify_later(const std::string& dir) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(dir);
  }
  cv_.notify_all();
}

uint64_t VerifiedCheckpoints::verifications() const {
  std::lock_guard<std::mutex> lock(mu_);
  return verifications_;
}

void VerifiedCheckpoints::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return stop_ || (queue_.empty() && !busy_); });
}

void VerifiedCheckpoints::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    const std::string dir = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    try {
      if (!known(dir)) verify_and_remember(dir, &stop_);
    } catch (const std::exception&) {
      // Not remembered: the relaunch that picks a checkpoint checks it again and says why.
    }
    lock.lock();
    busy_ = false;
    cv_.notify_all();
  }
}

}  // namespace troupe::checkpoint

#include "comm/store.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "comm/error.hpp"

namespace troupe::comm {

namespace {

using Clock = std::chrono::steady_clock;

std::string missing_keys_message(const char* what, const std::vector<std::string>& keys,
                                 std::chrono::milliseconds timeout) {
  std::string s = std::string(what) + ": key(s) not set within " + std::to_string(timeout.count()) + " ms:";
  for (const auto& k : keys) s += " '" + k + "'";
  return s;
}

}  // namespace

// ---------------------------------------------------------------- MemoryStore

void MemoryStore::set(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(m_);
    kv_[key] = value;
  }
  cv_.notify_all();
}

std::string MemoryStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(m_);
  if (!cv_.wait_for(lock, timeout, [&] { return kv_.count(key) > 0; }))
    throw CommError(CommErrc::timed_out, missing_keys_message("store get", {key}, timeout));
  return kv_[key];
}

void MemoryStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(m_);
  auto all = [&] {
    for (const auto& k : keys)
      if (!kv_.count(k)) return false;
    return true;
  };
  if (!cv_.wait_for(lock, timeout, all))
    throw CommError(CommErrc::timed_out, missing_keys_message("store wait", keys, timeout));
}

int64_t MemoryStore::add(const std::string& key, int64_t delta) {
  int64_t v;
  {
    std::lock_guard<std::mutex> lock(m_);
    auto it = kv_.find(key);
    v = (it == kv_.end() ? 0 : std::stoll(it->second)) + delta;
    kv_[key] = std::to_string(v);
  }
  cv_.notify_all();
  return v;
}

// ---------------------------------------------------------------- FileStore

FileStore::FileStore(std::string dir, std::chrono::milliseconds poll) : dir_(std::move(dir)), poll_(poll) {
  if (::mkdir(dir_.c_str(), 0755) != 0 && errno != EEXIST)
    throw CommError(CommErrc::invalid_argument,
                    "file store: cannot create directory '" + dir_ + "': " + std::strerror(errno));
}

// Keys may hold '/', which a file name cannot: everything outside
// [A-Za-z0-9._-] is written as %XX.
std::string FileStore::path_of(const std::string& key) const {
  static const char* hex = "0123456789ABCDEF";
  std::string name;
  for (unsigned char c : key) {
    if (std::isalnum(c) || c == '.' || c == '_' || c == '-') {
      name += static_cast<char>(c);
    } else {
      name += '%';
      name += hex[c >> 4];
      name += hex[c & 15];
    }
  }
  return dir_ + "/" + name;
}

bool FileStore::try_read(const std::string& key, std::string* value) const {
  std::ifstream in(path_of(key), std::ios::binary);
  if (!in) return false;
  std::ostringstream os;
  os << in.rdbuf();
  *value = os.str();
  return true;
}

void FileStore::set(const std::string& key, const std::string& value) {
  static std::atomic<uint64_t> counter{0};
  const std::string path = path_of(key);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(value.data(), static_cast<std::streamsize>(value.size()));
    if (!out) throw CommError(CommErrc::internal, "file store: cannot write '" + tmp + "'");
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    throw CommError(CommErrc::internal,
                    "file store: rename to '" + path + "' failed: " + std::strerror(errno));
}

std::string FileStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::string value;
  while (!try_read(key, &value)) {
    if (Clock::now() >= deadline)
      throw CommError(CommErrc::timed_out, missing_keys_message("file store get", {key}, timeout));
    std::this_thread::sleep_for(poll_);
  }
  return value;
}

void FileStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (const auto& k : keys) {
    struct stat st;
    while (::stat(path_of(k).c_str(), &st) != 0) {
      if (Clock::now() >= deadline)
        throw CommError(CommErrc::timed_out, missing_keys_message("file store wait", {k}, timeout));
      std::this_thread::sleep_for(poll_);
    }
  }
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  // One lock file per store serialises read-modify-write across processes.
  const std::string lock_path = dir_ + "/.lock";
  int fd = ::open(lock_path.c_str(), O_CREAT | O_RDWR, 0644);
  if (fd < 0) throw CommError(CommErrc::internal, "file store: cannot open '" + lock_path + "'");
  ::flock(fd, LOCK_EX);
  int64_t v = 0;
  try {
    std::string old;
    if (try_read(key, &old)) v = std::stoll(old);
    v += delta;
    set(key, std::to_string(v));
  } catch (...) {
    ::flock(fd, LOCK_UN);
    ::close(fd);
    throw;
  }
  ::flock(fd, LOCK_UN);
  ::close(fd);
  return v;
}

// ---------------------------------------------------------------- PrefixStore

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : prefix_(std::move(prefix)), base_(std::move(base)) {}

void PrefixStore::set(const std::string& key, const std::string& value) { base_->set(prefix_ + key, value); }

std::string PrefixStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  return base_->get(prefix_ + key, timeout);
}

void PrefixStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const auto& k : keys) full.push_back(prefix_ + k);
  base_->wait(full, timeout);
}

int64_t PrefixStore::add(const std::string& key, int64_t delta) { return base_->add(prefix_ + key, delta); }

std::string store_prefix(const std::string& job, int64_t generation, const std::string& group) {
  return job + "/g" + std::to_string(generation) + "/" + group + "/";
}

}  // namespace troupe::comm

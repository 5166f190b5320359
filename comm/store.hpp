// Rendezvous store: the small key-value service through which the ranks of a
// group find each other (gloo addresses, the NCCL unique id).
//
// Values are opaque bytes. Every read waits with a deadline and fails with
// CommError{timed_out} naming the missing key. Keys are namespaced by
// PrefixStore with store_prefix(job, generation, group), so a relaunch under a
// new generation never reads the keys of an older one.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace troupe::comm {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Blocks until the key exists or the timeout passes (CommError{timed_out}).
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Blocks until every key exists or the timeout passes (CommError{timed_out}).
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  // Atomically adds delta to a decimal counter (missing = 0) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
};

// For ranks that are threads of one process.
class MemoryStore : public Store {
 public:
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;

 private:
  std::mutex m_;
  std::condition_variable cv_;
  std::map<std::string, std::string> kv_;
};

// For ranks that are processes of one host (or hosts sharing a file system):
// one file per key in a directory. A value appears atomically (written to a
// temporary name, then renamed); readers poll.
class FileStore : public Store {
 public:
  explicit FileStore(std::string dir, std::chrono::milliseconds poll = std::chrono::milliseconds(2));
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  const std::string& dir() const { return dir_; }

 private:
  std::string path_of(const std::string& key) const;
  bool try_read(const std::string& key, std::string* value) const;
  std::string dir_;
  std::chrono::milliseconds poll_;
};

// Prepends a fixed prefix to every key of an underlying store.
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  const std::string& prefix() const { return prefix_; }

 private:
  std::string prefix_;
  std::shared_ptr<Store> base_;
};

// "job/g<generation>/group/": the namespace of one group of one job launch.
std::string store_prefix(const std::string& job, int64_t generation, const std::string& group);

}  // namespace troupe::comm

// The checkpoints that verify() passed, each remembered with the identity of its files
// (device, inode, size, modification and change times): checking one again that did not
// change since costs a stat(2) per file instead of reading every byte. The coordinator picks
// the checkpoint of every relaunch through one of these, and verifies each checkpoint it
// commits on the verifier's own thread, so that the relaunch after it finds it verified and
// its actor thread reads no checkpoint's bytes.
//
//   VerifiedCheckpoints v;
//   v.verify_later("ckpt/step_000100");           // returns at once
//   auto dir = v.latest_valid("ckpt", &skipped);  // stats step_000100's files, if verified
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace troupe::checkpoint {

class VerifiedCheckpoints {
 public:
  explicit VerifiedCheckpoints(size_t capacity = 64);
  // Stops the verifier thread: a verification under way ends at its next file.
  ~VerifiedCheckpoints();
  VerifiedCheckpoints(const VerifiedCheckpoints&) = delete;
  VerifiedCheckpoints& operator=(const VerifiedCheckpoints&) = delete;

  // verify(dir) (checkpoint.hpp), unless dir passed before and none of its files changed
  // since. Throws what verify throws.
  void check(const std::string& dir);
  // checkpoint::latest_valid through check().
  std::optional<std::string> latest_valid(const std::string& root,
                                          std::vector<std::string>* skipped = nullptr);
  // Verifies dir on the verifier thread; what fails is forgotten (a later check says why).
  void verify_later(const std::string& dir);
  // dir passed and is unchanged (stats only; no verification).
  bool known(const std::string& dir) const;
  // Whole verifications done (synchronous and on the verifier thread): for tests.
  uint64_t verifications() const;
  // Waits until the verifier thread has nothing left to do: for tests.
  void drain();

 private:
  struct Stamp {
    dev_t dev = 0;
    ino_t ino = 0;
    int64_t size = 0, mtime_ns = 0, ctime_ns = 0;
    bool operator==(const Stamp& o) const {
      return dev == o.dev && ino == o.ino && size == o.size && mtime_ns == o.mtime_ns &&
             ctime_ns == o.ctime_ns;
    }
  };
  using Stamps = std::vector<std::pair<std::string, Stamp>>;  // manifest.json first, then its files
  static std::optional<Stamp> stamp(const std::string& path);
  static bool unchanged(const std::string& dir, const Stamps& s);
  // Verifies dir (stopping early when `stop` turns true) and remembers it when it passed and
  // did not change while it was read. Throws what verify throws; false when stopped.
  bool verify_and_remember(const std::string& dir, const std::atomic<bool>* stop);
  void remember(const std::string& dir, Stamps s);
  void run();

  const size_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Stamps> ok_;
  std::deque<std::string> order_;  // of ok_, oldest first
  std::deque<std::string> queue_;  // for the verifier thread
  bool busy_ = false;
  std::atomic<bool> stop_{false};
  uint64_t verifications_ = 0;
  std::thread thread_;
};

}  // namespace troupe::checkpoint

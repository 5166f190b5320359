// A caching allocator over another allocator: freed blocks are kept by size class and handed
// out again, so that a training step that allocates the same shapes every step asks the
// backing allocator (cudaMalloc, say: slow, and synchronizing) only during the first one.
//
// Size classes: requests up to 1 MiB round up to a multiple of 512 bytes, larger ones to a
// multiple of 2 MiB. A request is served by a cached block of exactly its class, or else by
// the backing allocator; when that fails (out of memory), every cached block is returned to
// it and the request is tried once more. Blocks are never split or merged, which keeps the
// bookkeeping two maps and every block's address stable.
//
// Streams: the cache is unaware of them. A block freed while a kernel on some stream still
// uses it may be handed to the next request at once; that is safe when every user of the
// cache runs on one stream (work on a stream runs in order), and the caller's business
// otherwise (record an event, wait for it before freeing).
//
// Thread-safe. The figures of stats() are those that the engine reports as memory metrics.
#pragma once

#include <cstddef>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/allocator.hpp"

namespace troupe {

class CachingAllocator final : public Allocator {
 public:
  struct Stats {
    size_t in_use_bytes = 0;       // blocks handed out and not yet freed, by size class
    size_t peak_in_use_bytes = 0;  // the most in_use_bytes has been (reset_peak() restarts it)
    size_t reserved_bytes = 0;     // in use + cached: what the backing allocator holds for us
    size_t cached_blocks = 0;
    size_t backing_allocations = 0;  // calls to the backing allocator's allocate that succeeded
    size_t backing_frees = 0;
    size_t cache_hits = 0;  // allocations served from the cache
  };

  static constexpr size_t kSmallLimit = size_t{1} << 20;
  static constexpr size_t kSmallGranule = 512;
  static constexpr size_t kLargeGranule = size_t{2} << 20;

  // `backing` must outlive this allocator.
  explicit CachingAllocator(Allocator& backing);
  ~CachingAllocator() override;  // returns every cached block; blocks still in use are leaked
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  Device device() const override { return backing_.device(); }
  const char* name() const override { return name_.c_str(); }
  void* allocate(size_t bytes) override;
  void deallocate(void* p) noexcept override;
  void zero(void* p, size_t bytes) override { backing_.zero(p, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override { backing_.copy(dst, src, bytes); }
  void copy_from_host(void* dst, const void* host_src, size_t bytes) override {
    backing_.copy_from_host(dst, host_src, bytes);
  }
  void copy_to_host(void* host_dst, const void* src, size_t bytes) override {
    backing_.copy_to_host(host_dst, src, bytes);
  }

  // The size class a request of `bytes` is served from (0 bytes take the smallest class).
  static size_t size_class(size_t bytes);

  // Returns every cached block to the backing allocator.
  void empty_cache();
  Stats stats() const;
  void reset_peak();

 private:
  void release_cached_locked() noexcept;

  Allocator& backing_;
  std::string name_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> cached_;     // size class -> free block
  std::unordered_map<void*, size_t> live_;  // block in use -> its size class
  Stats stats_;                             // all but cached_blocks, which is cached_.size()
};

}  // namespace troupe

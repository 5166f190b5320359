#include "core/caching_allocator.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace troupe {

CachingAllocator::CachingAllocator(Allocator& backing)
    : backing_(backing), name_(std::string("caching(") + backing.name() + ")") {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  release_cached_locked();
}

size_t CachingAllocator::size_class(size_t bytes) {
  if (bytes == 0) bytes = 1;
  const size_t g = bytes <= kSmallLimit ? kSmallGranule : kLargeGranule;
  TROUPE_CHECK(bytes <= ~size_t{0} - g, "allocation of ", bytes, " bytes is too large");
  return (bytes + g - 1) / g * g;
}

void* CachingAllocator::allocate(size_t bytes) {
  const size_t cls = size_class(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  void* p = nullptr;
  if (auto it = cached_.find(cls); it != cached_.end()) {
    p = it->second;
    cached_.erase(it);
    ++stats_.cache_hits;
  } else {
    try {
      p = backing_.allocate(cls);
    } catch (const Error&) {
      // Out of memory with blocks of other sizes cached: give them back and try once more.
      if (cached_.empty()) throw;
      release_cached_locked();
      p = backing_.allocate(cls);
    }
    ++stats_.backing_allocations;
    stats_.reserved_bytes += cls;
  }
  try {
    live_.emplace(p, cls);
  } catch (...) {  // no memory for the map node: the block goes back where it came from
    backing_.deallocate(p);
    ++stats_.backing_frees;
    stats_.reserved_bytes -= cls;
    throw;
  }
  stats_.in_use_bytes += cls;
  stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  return p;
}

void CachingAllocator::deallocate(void* p) noexcept {
  if (p == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(p);
  if (it == live_.end()) return;  // not ours (or freed twice): never hand a block out twice
  const size_t cls = it->second;
  live_.erase(it);
  stats_.in_use_bytes -= cls;
  try {
    cached_.emplace(cls, p);
  } catch (...) {  // no memory for the map node: return the block instead
    backing_.deallocate(p);
    ++stats_.backing_frees;
    stats_.reserved_bytes -= cls;
  }
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  release_cached_locked();
}

void CachingAllocator::release_cached_locked() noexcept {
  for (auto& [cls, p] : cached_) {
    backing_.deallocate(p);
    ++stats_.backing_frees;
    stats_.reserved_bytes -= cls;
  }
  cached_.clear();
}

CachingAllocator::Stats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s = stats_;
  s.cached_blocks = cached_.size();
  return s;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_in_use_bytes = stats_.in_use_bytes;
}

}  // namespace troupe

// The caching allocator (core/caching_allocator.hpp) over a counting host allocator: blocks
// come back by size class, the backing allocator is asked only for what the cache cannot
// serve, the statistics add up, and running out of memory empties the cache and retries.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "core/caching_allocator.hpp"
#include "core/error.hpp"
#include "core/tensor.hpp"

using namespace troupe;

namespace {

// Host memory, counting calls, with an optional limit on the bytes it holds at once.
class CountingAllocator final : public Allocator {
 public:
  Device device() const override { return Device::cpu; }
  const char* name() const override { return "counting"; }
  void* allocate(size_t bytes) override {
    TROUPE_CHECK(limit == 0 || held + bytes <= limit, "out of memory: ", bytes, " bytes asked, ", held,
                 " held of ", limit);
    ++allocs;
    held += bytes;
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    sizes[p] = bytes;
    return p;
  }
  void deallocate(void* p) noexcept override {
    ++frees;
    held -= sizes[p];
    sizes.erase(p);
    std::free(p);
  }
  void zero(void* p, size_t bytes) override { std::memset(p, 0, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override { std::memmove(dst, src, bytes); }

  size_t limit = 0, held = 0;
  int allocs = 0, frees = 0;
  std::map<void*, size_t> sizes;
};

}  // namespace

TEST_CASE("caching allocator: size classes", "[allocator][cache]") {
  using C = CachingAllocator;
  CHECK(C::size_class(0) == 512);
  CHECK(C::size_class(1) == 512);
  CHECK(C::size_class(512) == 512);
  CHECK(C::size_class(513) == 1024);
  CHECK(C::size_class(C::kSmallLimit) == C::kSmallLimit);
  CHECK(C::size_class(C::kSmallLimit + 1) == C::kLargeGranule);
  CHECK(C::size_class(5 * C::kLargeGranule - 7) == 5 * C::kLargeGranule);
  CHECK_THROWS_WITH(C::size_class(~size_t{0}), Catch::Contains("too large"));
}

TEST_CASE("caching allocator: a repeated step allocates from the backing allocator once",
          "[allocator][cache]") {
  CountingAllocator backing;
  CachingAllocator cache(backing);
  CHECK(std::string(cache.name()) == "caching(counting)");
  const std::vector<size_t> step = {100, 4096, 3 << 20, 100, 77 << 10, 1};
  std::vector<void*> first;
  for (int s = 0; s < 5; ++s) {
    std::vector<void*> ptrs;
    for (size_t b : step) {
      void* p = cache.allocate(b);
      std::memset(p, 0xab, b);  // the whole request is writable
      ptrs.push_back(p);
    }
    CHECK(std::set<void*>(ptrs.begin(), ptrs.end()).size() == ptrs.size());  // no block handed out twice
    if (s == 0) first = ptrs;
    CHECK(std::set<void*>(ptrs.begin(), ptrs.end()) == std::set<void*>(first.begin(), first.end()));
    for (void* p : ptrs) cache.deallocate(p);
  }
  CHECK(backing.allocs == int(step.size()));
  CHECK(backing.frees == 0);
  const auto st = cache.stats();
  CHECK(st.backing_allocations == step.size());
  CHECK(st.cache_hits == 4 * step.size());
  CHECK(st.in_use_bytes == 0);
  size_t total = 0;
  for (size_t b : step) total += CachingAllocator::size_class(b);
  CHECK(st.peak_in_use_bytes == total);
  CHECK(st.reserved_bytes == total);
  CHECK(st.reserved_bytes == backing.held);
  CHECK(st.cached_blocks == step.size());

  cache.empty_cache();
  CHECK(backing.frees == int(step.size()));
  CHECK(backing.held == 0);
  CHECK(cache.stats().reserved_bytes == 0);
  CHECK(cache.stats().cached_blocks == 0);
}

TEST_CASE("caching allocator: peak, reset and blocks that are not its own", "[allocator][cache]") {
  CountingAllocator backing;
  CachingAllocator cache(backing);
  void* a = cache.allocate(1000);
  void* b = cache.allocate(1000);
  CHECK(cache.stats().in_use_bytes == 2048);
  cache.deallocate(a);
  CHECK(cache.stats().in_use_bytes == 1024);
  CHECK(cache.stats().peak_in_use_bytes == 2048);
  cache.reset_peak();
  CHECK(cache.stats().peak_in_use_bytes == 1024);
  int stranger = 0;
  cache.deallocate(&stranger);  // ignored
  cache.deallocate(a);          // a second free of a cached block: ignored, never cached twice
  cache.deallocate(nullptr);
  CHECK(cache.stats().cached_blocks == 1);
  void* c = cache.allocate(600);  // the same class as a: a comes back
  void* d = cache.allocate(1024);
  CHECK(c == a);
  CHECK(d != a);
  CHECK(d != b);
  cache.deallocate(b);
  cache.deallocate(c);
  cache.deallocate(d);
}

TEST_CASE("caching allocator: out of memory empties the cache and tries once more", "[allocator][cache]") {
  CountingAllocator backing;
  backing.limit = 8 << 20;
  CachingAllocator cache(backing);
  void* big = cache.allocate(6 << 20);
  cache.deallocate(big);                  // cached: 6 MiB held by the backing allocator
  void* other = cache.allocate(4 << 20);  // 6 + 4 > 8: the cached block goes back first
  CHECK(backing.frees == 1);
  CHECK(cache.stats().reserved_bytes == (4u << 20));
  // Nothing cached and still too large: the backing allocator's error comes through.
  CHECK_THROWS_WITH(cache.allocate(6 << 20), Catch::Contains("out of memory"));
  CHECK(cache.stats().in_use_bytes == (4u << 20));
  cache.deallocate(other);
}

TEST_CASE("caching allocator: tensors and threads", "[allocator][cache]") {
  CountingAllocator backing;
  CachingAllocator cache(backing);
  {
    Tensor t = Tensor::zeros({16, 16}, DType::f32, cache);
    for (int i = 0; i < 256; ++i) CHECK(t.f32()[i] == 0.0f);
    CHECK(cache.stats().in_use_bytes >= 1024);
  }
  CHECK(cache.stats().in_use_bytes == 0);
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w)
    threads.emplace_back([&cache, w] {
      for (int i = 0; i < 500; ++i) {
        void* p = cache.allocate(size_t(64 + 512 * ((i + w) % 7)));
        std::memset(p, w, 64);
        cache.deallocate(p);
      }
    });
  for (auto& t : threads) t.join();
  const auto st = cache.stats();
  CHECK(st.in_use_bytes == 0);
  CHECK(st.backing_allocations + st.cache_hits == 1 + 4 * 500);
  CHECK(st.backing_allocations <= 1 + 4 * 7);  // each thread holds at most one block at a time
  CHECK(st.reserved_bytes == backing.held);
}

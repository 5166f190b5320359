#include "core/allocator.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "core/error.hpp"
#include "core/tensor.hpp"

namespace troupe {

namespace {

constexpr size_t kAlign = Tensor::kAlignment;

class CpuAllocator final : public Allocator {
 public:
  Device device() const override { return Device::cpu; }
  const char* name() const override { return "cpu"; }
  void* allocate(size_t bytes) override {
    // aligned_alloc wants a multiple of the alignment; a zero-size tensor still gets a buffer.
    size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    if (rounded == 0) rounded = kAlign;
    void* p = std::aligned_alloc(kAlign, rounded);
    TROUPE_CHECK(p != nullptr, "out of memory allocating ", bytes, " bytes");
    return p;
  }
  void deallocate(void* p) noexcept override { std::free(p); }
  void zero(void* p, size_t bytes) override {
    if (bytes > 0) std::memset(p, 0, bytes);
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0 && dst != src) std::memmove(dst, src, bytes);
  }
  void release(void* p, size_t bytes) override {
    if (bytes == 0) return;
    static const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
    const uintptr_t lo = reinterpret_cast<uintptr_t>(p), hi = lo + bytes;
    const uintptr_t plo = (lo + page - 1) / page * page, phi = hi / page * page;
    // No whole page inside (or no madvise): zero in place.
    if (plo >= phi || ::madvise(reinterpret_cast<void*>(plo), phi - plo, MADV_DONTNEED) != 0)
      return zero(p, bytes);
    zero(p, plo - lo);
    zero(reinterpret_cast<void*>(phi), hi - phi);
  }
};

// One slot per non-CPU Device value.
std::atomic<Allocator*> g_cuda{nullptr};

}  // namespace

Allocator& cpu_allocator() {
  // Never destroyed: tensors with static storage may be freed after main returns.
  static CpuAllocator* a = new CpuAllocator();
  return *a;
}

Allocator* allocator_for(Device device) {
  if (device == Device::cpu) return &cpu_allocator();
  return g_cuda.load(std::memory_order_acquire);
}

void register_allocator(Device device, Allocator* alloc) {
  TROUPE_CHECK(device != Device::cpu, "the CPU allocator is built in; register allocators for devices");
  TROUPE_CHECK(alloc == nullptr || alloc->device() == device, "allocator '", alloc->name(), "' is for ",
               device_name(alloc->device()), ", not ", device_name(device));
  g_cuda.store(alloc, std::memory_order_release);
}

}  // namespace troupe

// Helpers of the model tests: seeded byte tokens, and a CPU allocator that counts
// what it hands out (the activation memory a stage holds).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/allocator.hpp"
#include "core/rng.hpp"
#include "model/params.hpp"

namespace troupe::model::test {

// n tokens in [0, 256), a function of the seed alone.
inline std::vector<int32_t> tokens(uint64_t seed, size_t n) {
  rng::Stream s(seed, 5);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(s.below(256));
  return t;
}

// The bytes of a store's flat buffers (values, gradients, a separate compute copy): what a
// stage's allocator gives its parameters, besides its activations.
inline size_t param_store_bytes(const ParamStore& ps) {
  size_t n = ps.flat_params().nbytes() + ps.flat_grads().nbytes();
  if (ps.flat_compute().data() != ps.flat_params().data()) n += ps.flat_compute().nbytes();
  return n;
}

// A CPU allocator that counts the bytes it hands out.
class CountingAllocator final : public Allocator {
 public:
  Device device() const override { return Device::cpu; }
  const char* name() const override { return "counting"; }
  void* allocate(size_t n) override {
    bytes += n;
    return cpu_allocator().allocate(n);
  }
  void deallocate(void* p) noexcept override { cpu_allocator().deallocate(p); }
  void zero(void* p, size_t n) override { cpu_allocator().zero(p, n); }
  void copy(void* d, const void* s, size_t n) override { cpu_allocator().copy(d, s, n); }
  size_t bytes = 0;
};

}  // namespace troupe::model::test

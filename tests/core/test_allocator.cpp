// The allocator seam of Tensor: the CPU allocator by default, an explicit one, and a
// device allocator once registered (here a stand-in for a CUDA one, in host memory).
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>

#include "core/allocator.hpp"
#include "core/error.hpp"
#include "core/tensor.hpp"

using namespace troupe;

namespace {

// Host memory posing as a device's, counting what it hands out.
class FakeDeviceAllocator final : public Allocator {
 public:
  explicit FakeDeviceAllocator(Device d) : device_(d) {}
  Device device() const override { return device_; }
  const char* name() const override { return "fake"; }
  void* allocate(size_t bytes) override {
    ++live;
    return std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
  }
  void deallocate(void* p) noexcept override {
    --live;
    std::free(p);
  }
  void zero(void* p, size_t bytes) override {
    ++zeroes;
    std::memset(p, 0, bytes);
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    ++copies;
    std::memmove(dst, src, bytes);
  }
  int live = 0, zeroes = 0, copies = 0;

 private:
  Device device_;
};

}  // namespace

TEST_CASE("allocator: cuda tensors are refused until a device allocator is registered",
          "[tensor][allocator]") {
  REQUIRE(allocator_for(Device::cuda) == nullptr);
  CHECK_THROWS_WITH(Tensor::empty({4}, DType::f32, Device::cuda),
                    Catch::Contains("no allocator is registered for cuda tensors") &&
                        Catch::Contains("this build allocates CPU tensors only"));
  CHECK(allocator_for(Device::cpu) == &cpu_allocator());
  CHECK(cpu_allocator().device() == Device::cpu);

  FakeDeviceAllocator dev(Device::cuda);
  register_allocator(Device::cuda, &dev);
  {
    Tensor a = Tensor::zeros({3, 5}, DType::bf16, Device::cuda);
    CHECK(a.device() == Device::cuda);
    CHECK(a.dtype() == DType::bf16);
    CHECK(a.owns_storage());
    CHECK(dev.live == 1);
    CHECK(dev.zeroes == 1);  // zeros() fills through the device allocator, not memset
    Tensor b = a.clone();    // a device copy
    CHECK(dev.live == 2);
    CHECK(dev.copies == 1);
    CHECK_THROWS_WITH(b.copy_from(Tensor::zeros({15}, DType::bf16)), Catch::Contains("between devices"));
  }
  CHECK(dev.live == 0);
  register_allocator(Device::cuda, nullptr);
  CHECK(allocator_for(Device::cuda) == nullptr);
  FakeDeviceAllocator host(Device::cpu);
  CHECK_THROWS_AS(register_allocator(Device::cuda, &host), Error);
}

TEST_CASE("allocator: an explicit allocator owns the tensor and its views", "[tensor][allocator]") {
  FakeDeviceAllocator mine(Device::cpu);
  Tensor view;
  {
    Tensor t = Tensor::zeros({8, 2}, DType::f32, mine);
    CHECK(t.device() == Device::cpu);
    CHECK(reinterpret_cast<uintptr_t>(t.data()) % Tensor::kAlignment == 0);
    for (int i = 0; i < 16; ++i) CHECK(t.f32()[i] == 0.0f);
    view = t.slice(2, 4);
    CHECK(mine.live == 1);
  }
  CHECK(mine.live == 1);  // the view keeps the allocation
  view = Tensor();
  CHECK(mine.live == 0);
}

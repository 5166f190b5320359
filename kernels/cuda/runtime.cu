// The CUDA runtime around the kernels: devices, the thread's stream, the device allocator,
// copies, and the device-side range check of token and target ids.
#include <atomic>
#include <climits>
#include <cstring>

#include "kernels/cuda/common.cuh"

namespace troupe::kernels::cuda {

namespace {

thread_local cudaStream_t t_stream = nullptr;
std::atomic<bool> g_tf32{false};

// cudaMalloc on the current device; zero and copy on this thread's stream, waited for.
class DeviceAllocator final : public Allocator {
 public:
  Device device() const override { return Device::cuda; }
  const char* name() const override { return "cuda"; }
  void* allocate(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky: clear it for the next call
      TROUPE_CHECK(false, "cudaMalloc of ", bytes, " bytes failed: ", cudaGetErrorName(e), ": ",
                   cudaGetErrorString(e));
    }
    return p;
  }
  void deallocate(void* p) noexcept override {
    if (p != nullptr) (void)cudaFree(p);
  }
  void zero(void* p, size_t bytes) override {
    if (bytes == 0) return;
    TROUPE_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, detail::stream()));
    TROUPE_CUDA_CHECK(cudaStreamSynchronize(detail::stream()));
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0 || dst == src) return;
    TROUPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, detail::stream()));
    TROUPE_CUDA_CHECK(cudaStreamSynchronize(detail::stream()));
  }
  void copy_from_host(void* dst, const void* host_src, size_t bytes) override {
    to_device(dst, host_src, bytes);
  }
  void copy_to_host(void* host_dst, const void* src, size_t bytes) override { to_host(host_dst, src, bytes); }
};

// Page-locked host memory (cudaHostAlloc): what device <-> host copies run at full speed from.
class PinnedAllocator final : public Allocator {
 public:
  Device device() const override { return Device::cpu; }
  const char* name() const override { return "cuda-pinned"; }
  void* allocate(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, bytes == 0 ? 1 : bytes, cudaHostAllocDefault);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      TROUPE_CHECK(false, "cudaHostAlloc of ", bytes, " bytes failed: ", cudaGetErrorName(e), ": ",
                   cudaGetErrorString(e));
    }
    return p;
  }
  void deallocate(void* p) noexcept override {
    if (p != nullptr) (void)cudaFreeHost(p);
  }
  void zero(void* p, size_t bytes) override { std::memset(p, 0, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override { std::memmove(dst, src, bytes); }
};

__global__ void first_out_of_range(const int32_t* v, size_t n, int limit, unsigned long long* first) {
  TROUPE_GRID_STRIDE(i, n)
  if (v[i] < 0 || v[i] >= limit) atomicMin(first, (unsigned long long)i);
}

__global__ void column_sums(float* out, const float* x, int N, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float acc = out[c];
  for (int n = 0; n < N; ++n) acc += x[size_t(n) * C + c];
  out[c] = acc;
}

}  // namespace

namespace detail {

cudaStream_t stream() { return t_stream; }
bool tf32() { return g_tf32.load(std::memory_order_relaxed); }

void check_range(const int32_t* values, size_t n, int limit, const char* what, const char* where) {
  if (n == 0) return;
  Scratch first(sizeof(unsigned long long));
  auto* f = first.as<unsigned long long>();
  TROUPE_CUDA_CHECK(cudaMemsetAsync(f, 0xff, sizeof *f, stream()));
  first_out_of_range<<<grid_for(n), kThreads, 0, stream()>>>(values, n, limit, f);
  TROUPE_CUDA_LAUNCHED();
  unsigned long long at = 0;
  TROUPE_CUDA_CHECK(cudaMemcpyAsync(&at, f, sizeof at, cudaMemcpyDeviceToHost, stream()));
  TROUPE_CUDA_CHECK(cudaStreamSynchronize(stream()));
  if (at == ~0ull) return;
  int32_t bad = 0;
  TROUPE_CUDA_CHECK(cudaMemcpy(&bad, values + at, sizeof bad, cudaMemcpyDeviceToHost));
  TROUPE_CHECK(false, what, " ", bad, where, at, " outside [0,", limit, ")");
}

void add_column_sums(float* out, const float* x, int N, int C) {
  column_sums<<<column_blocks(C), kThreads, 0, stream()>>>(out, x, N, C);
  TROUPE_CUDA_LAUNCHED();
}

}  // namespace detail

int device_count(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    if (why) *why = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA device";
  return n;
}

void set_device(int device) { TROUPE_CUDA_CHECK(cudaSetDevice(device)); }

void set_stream(void* stream) { t_stream = static_cast<cudaStream_t>(stream); }
void* current_stream() { return t_stream; }
void synchronize() { TROUPE_CUDA_CHECK(cudaStreamSynchronize(t_stream)); }
void set_tf32(bool on) { g_tf32.store(on, std::memory_order_relaxed); }

CachingAllocator& allocator() {
  // Never destroyed: tensors with static storage may be freed after main returns, and the
  // CUDA runtime may be torn down before static destructors run.
  static auto* device = new DeviceAllocator();
  static auto* cache = new CachingAllocator(*device);
  return *cache;
}

Allocator& pinned_allocator() {
  static auto* pinned = new PinnedAllocator();
  return *pinned;
}

void install() { register_allocator(Device::cuda, &allocator()); }

void to_device(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  TROUPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, t_stream));
  TROUPE_CUDA_CHECK(cudaStreamSynchronize(t_stream));
}

void to_host(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  TROUPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, t_stream));
  TROUPE_CUDA_CHECK(cudaStreamSynchronize(t_stream));
}

}  // namespace troupe::kernels::cuda

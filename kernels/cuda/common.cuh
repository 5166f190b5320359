// What every CUDA kernel file shares: checked calls, the thread's stream, launch sizes,
// fixed-order block reductions and scratch memory from the caching allocator.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "core/error.hpp"
#include "kernels/cuda/cuda.hpp"

// TROUPE_CUDA_CHECK(call): throws troupe::Error "file:line: check failed: call: cudaErrorX: text".
#define TROUPE_CUDA_CHECK(call)                                                                            \
  do {                                                                                                     \
    const cudaError_t troupe_err_ = (call);                                                                \
    if (troupe_err_ != cudaSuccess)                                                                        \
      ::troupe::detail::check_failed(                                                                      \
          __FILE__, __LINE__, #call,                                                                       \
          ::troupe::detail::concat(cudaGetErrorName(troupe_err_), ": ", cudaGetErrorString(troupe_err_))); \
  } while (0)

// After a kernel launch: a bad configuration (or an earlier asynchronous fault) throws here.
#define TROUPE_CUDA_LAUNCHED() TROUPE_CUDA_CHECK(cudaGetLastError())

#define TROUPE_CUBLAS_CHECK(call)                                                                    \
  do {                                                                                               \
    const cublasStatus_t troupe_st_ = (call);                                                        \
    if (troupe_st_ != CUBLAS_STATUS_SUCCESS)                                                         \
      ::troupe::detail::check_failed(__FILE__, __LINE__, #call,                                      \
                                     ::troupe::detail::concat(cublasGetStatusName(troupe_st_), ": ", \
                                                              cublasGetStatusString(troupe_st_)));   \
  } while (0)

namespace troupe::kernels::cuda::detail {

// for (size_t i ...) over [0, n) with every thread of the grid, each taking every
// (gridDim.x * blockDim.x)-th index.
#define TROUPE_GRID_STRIDE(i, n) \
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < (n); i += size_t(gridDim.x) * blockDim.x)

constexpr int kThreads = 256;  // every block of these kernels; a power of two (block_reduce)

cudaStream_t stream();
bool tf32();

// Blocks of kThreads for a grid-stride loop over n elements.
inline unsigned grid_for(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return unsigned(std::max<size_t>(1, std::min<size_t>(blocks, size_t{1} << 16)));
}

// Blocks of kThreads with one thread per column of C columns.
inline unsigned column_blocks(int C) { return unsigned((C + kThreads - 1) / kThreads); }

// Device memory for the duration of one call, from the caching allocator.
class Scratch {
 public:
  explicit Scratch(size_t bytes) : p_(allocator().allocate(bytes)) {}
  ~Scratch() { allocator().deallocate(p_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_;
};

// The sum (or max) over the block of every thread's v, in a fixed tree order: the same bits
// every run. `shared` holds blockDim.x values; blockDim.x is a power of two. Every thread of
// the block must call it; every thread gets the result.
template <class T, class Op>
__device__ T block_reduce(T v, T* shared, Op op) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] = op(shared[threadIdx.x], shared[threadIdx.x + s]);
    __syncthreads();
  }
  const T r = shared[0];
  __syncthreads();
  return r;
}

struct Sum {
  template <class T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Checks on the device that values(n) lie in [0, limit); throws on the host (after waiting
// for the stream) naming the first one that does not, as the CPU twins do:
// "<what> v<where>i outside [0,limit)" (what "token", where " at "; "target", " of row ").
void check_range(const int32_t* values, size_t n, int limit, const char* what, const char* where);

// Column sums: out(C) += sum over rows of x(N,C), each column in row order (as the CPU's).
void add_column_sums(float* out, const float* x, int N, int C);

}  // namespace troupe::kernels::cuda::detail

// The 16-bit-output forms of the kernels whose results mixed precision keeps in 16 bits
// (a linear reads them): LayerNorm, RMSNorm, GELU and SwiGLU. Each runs the fp32 kernel over a
// few rows at a time into a small per-thread buffer that stays in cache and rounds it into
// the 16-bit output, so the result never travels through memory in f32: 2 bytes written per
// element instead of 4 written, 4 read back and 2 written. The rows are independent, so the
// bits are those of the fp32 kernel followed by to_half.
#include <algorithm>
#include <vector>

#include "core/error.hpp"
#include "kernels/cpu/gemm_half.hpp"
#include "kernels/cpu/kernels.hpp"

namespace troupe::kernels::cpu {

namespace {

constexpr size_t kChunkFloats = 16384;  // 64 KiB of f32 per chunk

void check_half(DType dt, const char* what) {
  TROUPE_CHECK(dt == DType::bf16 || dt == DType::f16, what, ": dtype ", is_valid(dt) ? dtype_name(dt) : "?",
               " is not bf16 or f16");
}

// out16(N, width) from f32(chunk, row0, rows), which writes rows [row0, row0 + rows) into chunk.
template <class F>
void by_rows(DType dt, uint16_t* out, int N, size_t width, F f32) {
  thread_local std::vector<float> chunk;
  const int rows = int(std::max<size_t>(1, kChunkFloats / std::max<size_t>(width, 1)));
  if (chunk.size() < size_t(rows) * width) chunk.resize(size_t(rows) * width);
  for (int r0 = 0; r0 < N; r0 += rows) {
    const int n = std::min(rows, N - r0);
    f32(chunk.data(), r0, n);
    to_half(dt, out + size_t(r0) * width, chunk.data(), size_t(n) * width);
  }
}

}  // namespace

void layernorm_forward_h(DType dt, uint16_t* out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int N, int C) {
  check_half(dt, "layernorm_forward_h");
  TROUPE_CHECK(N > 0 && C > 0, "layernorm: N=", N, " C=", C);
  TROUPE_CHECK(out && mean && rstd && inp && weight && bias, "null tensor");
  by_rows(dt, out, N, size_t(C), [&](float* o, int r0, int n) {
    layernorm_forward(o, mean + r0, rstd + r0, inp + size_t(r0) * C, weight, bias, n, C);
  });
}

void rmsnorm_forward_h(DType dt, uint16_t* out, float* rstd, const float* inp, const float* weight, int N,
                       int C, float eps) {
  check_half(dt, "rmsnorm_forward_h");
  TROUPE_CHECK(N > 0 && C > 0, "rmsnorm: N=", N, " C=", C);
  TROUPE_CHECK(out && rstd && inp && weight, "null tensor");
  by_rows(dt, out, N, size_t(C), [&](float* o, int r0, int n) {
    rmsnorm_forward(o, rstd + r0, inp + size_t(r0) * C, weight, n, C, eps);
  });
}

void gelu_forward_h(DType dt, uint16_t* out, const float* inp, size_t n) {
  check_half(dt, "gelu_forward_h");
  TROUPE_CHECK(out && inp, "null tensor");
  for (size_t i = 0; i < n; i += kChunkFloats) {
    const size_t m = std::min(kChunkFloats, n - i);
    by_rows(dt, out + i, 1, m, [&](float* o, int, int) { gelu_forward(o, inp + i, m); });
  }
}

void swiglu_forward_h(DType dt, uint16_t* out, const float* gu, int N, int F) {
  check_half(dt, "swiglu_forward_h");
  TROUPE_CHECK(N > 0 && F > 0, "swiglu: N=", N, " F=", F);
  TROUPE_CHECK(out && gu, "null tensor");
  by_rows(dt, out, N, size_t(F),
          [&](float* o, int r0, int n) { swiglu_forward(o, gu + size_t(r0) * 2 * F, n, F); });
}

}  // namespace troupe::kernels::cpu

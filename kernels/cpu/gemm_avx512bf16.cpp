// The bf16 micro-kernel on vdpbf16ps (AVX512-BF16): C(MR,NR) (+)= Ap Bp over packed
// k-pair panels (layout, loops and packing: gemm_bf16_packed.hpp / .cpp).
//
// 14 rows x 32 columns in 28 zmm accumulators, as the fp32 kernel (gemm_avx512.cpp).
// One k-pair step: 2 aligned loads of Bp (16 columns x 2 k each), then per row one
// 32-bit broadcast of Ap (that row's two k) and 2 vdpbf16ps, each of which adds,
// in lane j, a(2p+1) b(2p+1, j) + a(2p) b(2p, j). Packing pads with zeros, so the
// loop always runs whole vectors; the C update is masked to n columns and the
// row count is a template parameter.
//
// vdpbf16ps treats subnormal bf16 inputs as zero, flushes subnormal results and
// rounds to nearest even whatever MXCSR says; for the normal numbers of training
// it is fp32 accumulation like the scalar kernel beside the packing.
//
// Everything in this file is compiled for AVX-512 through the pragma below and is
// reached only after a runtime CPU check (gemm_half.cpp). It calls no std::
// functions, so that no AVX-512 instantiation of a shared inline function can
// leak to callers.
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/gemm_bf16_packed.hpp"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")

namespace troupe::kernels::cpu::detail {
namespace {

constexpr int kMR = kBf16MR;
constexpr int kNR = kBf16NR;
constexpr int kNV = 2;  // zmm vectors across the micro-tile
static_assert(kNR == 16 * kNV, "a panel row is two zmm of 16 lanes");
constexpr int kPrefetchB = 8;  // k-pair steps ahead that the B panel is prefetched into L1

// Lanes [0, n) set; n <= 0 gives an empty mask.
inline __mmask16 tail_mask(int n) {
  if (n <= 0) return 0;
  if (n >= 16) return 0xFFFF;
  return static_cast<__mmask16>((1u << n) - 1u);
}

// acc + a.bf16[2j+1] * b.bf16[2j+1] + a.bf16[2j] * b.bf16[2j] in every lane j.
#ifdef TROUPE_EMULATE_DPBF16
// For checking this file on an emulator that has AVX-512F but not AVX512-BF16 (the
// build never defines it): the two exact products as fp32 FMAs, high then low.
inline __m512 dot_bf16(__m512 acc, __m512i a, __m512i b) {
  const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  acc = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(a, hi)),
                        _mm512_castsi512_ps(_mm512_and_si512(b, hi)), acc);
  return _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(a, 16)),
                         _mm512_castsi512_ps(_mm512_slli_epi32(b, 16)), acc);
}
#else
inline __m512 dot_bf16(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}
#endif

// The Bf16MicroKernel contract for R rows (gemm_bf16_packed.hpp).
template <int R>
void micro_kernel(int n, int kp, const uint32_t* __restrict ap, const uint32_t* __restrict bp, float* c,
                  long ldc, const float* bias, bool accumulate) {
  __m512 acc[R][kNV];
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < kNV; ++v) acc[i][v] = _mm512_setzero_ps();

#pragma GCC unroll 16
  for (int i = 0; i < R; ++i) {
    _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc + 16), _MM_HINT_T0);
  }

#pragma GCC unroll 2
  for (int p = 0; p < kp; ++p) {
    __m512i bv[kNV];
#pragma GCC unroll 4
    for (int v = 0; v < kNV; ++v) {
      bv[v] = _mm512_load_si512(bp + 16 * v);
      _mm_prefetch(reinterpret_cast<const char*>(bp + kPrefetchB * kNR + 16 * v), _MM_HINT_T0);
    }
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i) {
      const __m512i ai = _mm512_set1_epi32(static_cast<int>(ap[i]));  // row i: k = 2p, 2p + 1
#pragma GCC unroll 4
      for (int v = 0; v < kNV; ++v) acc[i][v] = dot_bf16(acc[i][v], ai, bv[v]);
    }
    ap += kMR;
    bp += kNR;
  }

  __mmask16 mask[kNV];
  for (int v = 0; v < kNV; ++v) mask[v] = tail_mask(n - 16 * v);
  if (bias != nullptr) {
    __m512 vbias[kNV];
    for (int v = 0; v < kNV; ++v) vbias[v] = _mm512_maskz_loadu_ps(mask[v], bias + 16 * v);
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
      for (int v = 0; v < kNV; ++v)
        _mm512_mask_storeu_ps(c + i * ldc + 16 * v, mask[v], _mm512_add_ps(acc[i][v], vbias[v]));
  } else if (accumulate) {
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
      for (int v = 0; v < kNV; ++v) {
        float* out = c + i * ldc + 16 * v;
        const __m512 old = _mm512_maskz_loadu_ps(mask[v], out);
        _mm512_mask_storeu_ps(out, mask[v], _mm512_add_ps(old, acc[i][v]));
      }
  } else {
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
      for (int v = 0; v < kNV; ++v) _mm512_mask_storeu_ps(c + i * ldc + 16 * v, mask[v], acc[i][v]);
  }
}

using RowKernel = void (*)(int, int, const uint32_t*, const uint32_t*, float*, long, const float*, bool);

// kRowKernels[h] handles a tile of h rows, 1 <= h <= MR (a plain array: no std::).
constexpr RowKernel kRowKernels[kMR + 1] = {
    nullptr,          micro_kernel<1>,  micro_kernel<2>,  micro_kernel<3>,  micro_kernel<4>,
    micro_kernel<5>,  micro_kernel<6>,  micro_kernel<7>,  micro_kernel<8>,  micro_kernel<9>,
    micro_kernel<10>, micro_kernel<11>, micro_kernel<12>, micro_kernel<13>, micro_kernel<14>,
};
static_assert(kMR == 14, "kRowKernels lists one kernel per row count");

}  // namespace

void bf16_micro_kernel_avx512(int h, int n, int kp, const uint32_t* ap, const uint32_t* bp, float* c,
                              long ldc, const float* bias, bool accumulate) {
  kRowKernels[h](n, kp, ap, bp, c, ldc, bias, accumulate);
}

}  // namespace troupe::kernels::cpu::detail

#pragma GCC pop_options

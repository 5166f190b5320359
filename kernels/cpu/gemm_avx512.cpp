// Single-thread fp32 GEMM on AVX-512F, row-major, in the layered scheme of
// Goto / BLIS:
//
//   for jc in N step NC              B block (KC,NC) = (384,512): 768 KiB, stays in L2
//     for pc in K step KC
//       pack B -> Bp: NR-wide panels, (KC,NR) each, k-major
//       for ic in M step MC
//         pack A -> Ap, MR-tall panels, (KC,MR) each, k-major, except that A
//         not transposed is read in place (14 rows with stride lda) when its
//         stride does not crowd L1 sets
//         for ir in MC step MR       one A panel (KC*MR*4 = 21 KiB) stays in L1
//           for jr in NC step NR     B panels stream from L2, prefetched ahead
//             micro-kernel: C(MR,NR) (+)= Ap(MR,KC) Bp(KC,NR) in 28 zmm accumulators
//
// When A is packed and N spans several NC blocks, the first two loops swap
// (pc outer, jc inner) and all of A's rows for the K block are packed once, so
// that A is not repacked for every column block.
//
// The micro-kernel is 14 rows x 32 columns: 28 accumulators, 2 zmm for the B row,
// A values come as embedded broadcasts, so each k step is 2 loads + 28 FMAs and
// the two FMA ports stay busy. Packing pads edges with zeros, so the micro-kernel
// always runs full-width FMAs; only the C update is masked (columns) and
// shortened (rows, through a template on the row count).
//
// Transposes only change the packing: B is copied with masked vector loads, or,
// transposed, transposed back in 16x16 register tiles; A is copied when
// transposed, else read in place or (bad strides) transposed like B.
//
// Determinism: the blocking is fixed, so every C element sums its K products in
// the same order whatever the pointers, strides or thread.
//
// Everything in this file is compiled for AVX-512 through the pragma below and is
// only reached after a runtime CPU check (gemm.cpp). It calls no std:: functions
// (only compile-time std::array/integer_sequence), so that no AVX-512
// instantiation of a shared inline function can leak to callers.
#include <immintrin.h>

#include <array>
#include <cstdlib>
#include <new>
#include <utility>

#include "kernels/cpu/gemm_backends.hpp"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma")
// GCC 12 flags the deliberately undefined pass-through operand inside its own
// AVX-512 shuffle intrinsics (GCC PR 105593), a false positive.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace troupe::kernels::cpu::detail {
namespace {

constexpr int kMR = 14;        // rows of the micro-tile
constexpr int kNV = 2;         // zmm vectors across the micro-tile
constexpr int kNR = 16 * kNV;  // columns of the micro-tile
constexpr int kKC = 384;       // depth of a packed block
constexpr int kMC = kMR * 24;  // rows of a packed A block (only sizes the buffer)
constexpr int kNC = kNR * 16;  // columns of a packed B block
constexpr int kPrefetchB = 8;  // k steps ahead that the B panel is prefetched into L1

inline int min_int(int a, int b) { return a < b ? a : b; }

// Lanes [0, n) set; n <= 0 gives an empty mask.
inline __mmask16 tail_mask(int n) {
  if (n <= 0) return 0;
  if (n >= 16) return 0xFFFF;
  return static_cast<__mmask16>((1u << n) - 1u);
}

// In-place transpose of a 16x16 tile held as 16 rows.
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  // After this step, in each 128-bit lane l, r[4j+c] holds rows 4j..4j+3 of column 4l+c.
  for (int j = 0; j < 4; ++j) {
    const __m512d a0 = _mm512_castps_pd(t[4 * j]), a1 = _mm512_castps_pd(t[4 * j + 1]);
    const __m512d a2 = _mm512_castps_pd(t[4 * j + 2]), a3 = _mm512_castps_pd(t[4 * j + 3]);
    r[4 * j] = _mm512_castpd_ps(_mm512_unpacklo_pd(a0, a2));
    r[4 * j + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a0, a2));
    r[4 * j + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(a1, a3));
    r[4 * j + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(a1, a3));
  }
  // Gather lane l of r[c], r[4+c], r[8+c], r[12+c] into column 4l+c.
  for (int c = 0; c < 4; ++c) {
    const __m512 lo_even = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);
    const __m512 lo_odd = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xDD);
    const __m512 hi_even = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
    const __m512 hi_odd = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xDD);
    t[c] = _mm512_shuffle_f32x4(lo_even, hi_even, 0x88);
    t[8 + c] = _mm512_shuffle_f32x4(lo_even, hi_even, 0xDD);
    t[4 + c] = _mm512_shuffle_f32x4(lo_odd, hi_odd, 0x88);
    t[12 + c] = _mm512_shuffle_f32x4(lo_odd, hi_odd, 0xDD);
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

// dst(kc, W)[k][w] = src[k*ld + w] for w < valid, 0 for valid <= w < W.
// The operand is already k-major (A transposed, B not transposed).
void pack_copy(const float* src, int ld, int kc, int valid, int W, float* dst) {
  const int chunks = (W + 15) / 16;
  for (int k = 0; k < kc; ++k) {
    for (int c = 0; c < chunks; ++c) {
      const __m512 v = _mm512_maskz_loadu_ps(tail_mask(valid - 16 * c), src + 16 * c);
      _mm512_mask_storeu_ps(dst + 16 * c, tail_mask(W - 16 * c), v);
    }
    src += ld;
    dst += W;
  }
}

// dst(kc, W)[k][w] = src[w*ld + k] for w < valid, 0 for valid <= w < W.
// The operand is stored (W,kc) (A not transposed, B transposed): 16x16 tiles
// are loaded row by row and transposed in registers.
void pack_transpose(const float* src, int ld, int valid, int kc, int W, float* dst) {
  __m512 r[16];
  for (int w0 = 0; w0 < W; w0 += 16) {
    const __mmask16 store_mask = tail_mask(W - w0);
    for (int k0 = 0; k0 < kc; k0 += 16) {
      const int kk = min_int(16, kc - k0);
      const __mmask16 load_mask = tail_mask(kk);
      for (int j = 0; j < 16; ++j)
        r[j] = w0 + j < valid ? _mm512_maskz_loadu_ps(load_mask, src + static_cast<long>(w0 + j) * ld + k0)
                              : _mm512_setzero_ps();
      transpose16(r);
      for (int t = 0; t < kk; ++t) _mm512_mask_storeu_ps(dst + (k0 + t) * W + w0, store_mask, r[t]);
    }
  }
}

// C(R, n) = alpha * A(R, kc) Bp(kc, NR) + beta * C, n <= NR columns valid; with
// bias (n values, one per column; beta is then 0) C = alpha * A Bp + bias.
// a: packed (kc, MR), or with kDirectA the operand itself, (R, kc) with row
// stride lda (see direct_a in gemm_avx512). b: packed (kc, NR), 64-byte aligned.
// Both forms sum the same products in the same order, so they give the same bits.
// beta == 0 never reads C.
template <int R, bool kDirectA>
void micro_kernel(int kc, const float* __restrict a, long lda, const float* __restrict b, float* c, long ldc,
                  float alpha, float beta, const float* bias, int n) {
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

  // Direct A: rows are reached as base + {0,1,2} * lda from one base per three
  // rows, which x86 addressing does for free (base + index * 4 or 8); one
  // pointer per row would not fit the general-purpose registers.
  const float* base[(R + 2) / 3];
  for (int j = 0; j < (R + 2) / 3; ++j) base[j] = a + (kDirectA ? 3 * j * lda : 0);

#pragma GCC unroll 4
  for (int k = 0; k < kc; ++k) {
    __m512 bv[kNV];
#pragma GCC unroll 4
    for (int v = 0; v < kNV; ++v) {
      bv[v] = _mm512_load_ps(b + 16 * v);
      _mm_prefetch(reinterpret_cast<const char*>(b + kPrefetchB * kNR + 16 * v), _MM_HINT_T0);
    }
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i) {
      const __m512 ai = _mm512_set1_ps(kDirectA ? base[i / 3][(i % 3) * lda + k] : a[i]);
#pragma GCC unroll 4
      for (int v = 0; v < kNV; ++v) acc[i][v] = _mm512_fmadd_ps(ai, bv[v], acc[i][v]);
    }
    a += kDirectA ? 1 : kMR;
    b += kNR;
  }

  __mmask16 mask[kNV];
  for (int v = 0; v < kNV; ++v) mask[v] = tail_mask(n - 16 * v);
  const __m512 va = _mm512_set1_ps(alpha);
  if (bias != nullptr) {
    __m512 vbias[kNV];
    for (int v = 0; v < kNV; ++v) vbias[v] = _mm512_maskz_loadu_ps(mask[v], bias + 16 * v);
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
      for (int v = 0; v < kNV; ++v)
        _mm512_mask_storeu_ps(c + i * ldc + 16 * v, mask[v], _mm512_fmadd_ps(acc[i][v], va, vbias[v]));
  } else if (beta == 0.0f) {
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
      for (int v = 0; v < kNV; ++v)
        _mm512_mask_storeu_ps(c + i * ldc + 16 * v, mask[v], _mm512_mul_ps(acc[i][v], va));
  } else {
    const __m512 vb = _mm512_set1_ps(beta);
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
      for (int v = 0; v < kNV; ++v) {
        float* p = c + i * ldc + 16 * v;
        const __m512 old = _mm512_maskz_loadu_ps(mask[v], p);
        _mm512_mask_storeu_ps(p, mask[v], _mm512_fmadd_ps(acc[i][v], va, _mm512_mul_ps(old, vb)));
      }
  }
}

using MicroKernel = void (*)(int, const float*, long, const float*, float*, long, float, float, const float*,
                             int);

// kernels[h] handles a tile of h rows, 1 <= h <= MR.
template <bool kDirectA, int... I>
constexpr auto make_kernel_table(std::integer_sequence<int, I...>) {
  return std::array<MicroKernel, kMR + 1>{nullptr, micro_kernel<I + 1, kDirectA>...};
}
constexpr auto kPackedKernels = make_kernel_table<false>(std::make_integer_sequence<int, kMR>{});
constexpr auto kDirectKernels = make_kernel_table<true>(std::make_integer_sequence<int, kMR>{});

// Whether the MR rows of an operand with row stride ld floats would crowd one
// set of the L1 data cache (64 sets of 64-byte lines, 12 ways on the cores this
// targets; a stride of 1024 floats puts all 14 rows in the same set). Reading
// such rows in place evicts them between k steps; packing avoids it.
bool l1_set_conflict(long ld) {
  int rows_in_set[64] = {};
  int worst = 0;
  for (int i = 0; i < kMR; ++i) {
    const int set = static_cast<int>(((i * ld * 4) / 64) % 64);
    worst = ++rows_in_set[set] > worst ? rows_in_set[set] : worst;
  }
  return worst > 4;
}

// Rows of A packed at once, all column blocks reusing them (see gemm_avx512):
// (kMaxWholeRows, KC) is 6 MiB.
constexpr int kMaxWholeRows = 4096;

// Per-thread packing buffers, allocated on first use and kept: a training step
// calls GEMM hundreds of times with the same block sizes.
struct PackBuffers {
  float* a = nullptr;  // (rows, KC), rows >= MC
  float* b = nullptr;  // (KC, NC)
  int a_rows = 0;
  PackBuffers() : b(static_cast<float*>(std::aligned_alloc(64, sizeof(float) * kKC * kNC))) {
    reserve_a(kMC);
  }
  ~PackBuffers() {
    std::free(a);
    std::free(b);
  }
  // Room for `rows` packed rows of A (a multiple of MR).
  void reserve_a(int rows) {
    if (rows <= a_rows && a != nullptr) return;
    std::free(a);
    a = static_cast<float*>(std::aligned_alloc(64, sizeof(float) * static_cast<long>(rows) * kKC));
    a_rows = a != nullptr ? rows : 0;
  }
  PackBuffers(const PackBuffers&) = delete;
  PackBuffers& operator=(const PackBuffers&) = delete;
};

}  // namespace

void gemm_avx512(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                 const float* B, int ldb, float beta, float* C, int ldc, const float* bias) {
  thread_local PackBuffers buf;
  // A not transposed is read in place: its rows are what the micro-kernel
  // broadcasts from, and packing would cost a 16x16 transpose per 256 elements
  // (measured: 10-15 % on products with N <= 128, a few % on wide ones), unless
  // its row stride makes the 14 rows fight over a few L1 sets. A transposed
  // would put each k step on a new cache line, so it is packed (a plain copy).
  const bool direct_a = !trans_a && !l1_set_conflict(lda);
  // Packed A is the same for every column block: with more than one, all of A's
  // rows for a K block are packed once and every column block reuses them,
  // instead of repacking MC rows per column block (N / NC times in all).
  const bool whole_a = !direct_a && N > kNC && M <= kMaxWholeRows;
  const int mc_max = whole_a ? (M + kMR - 1) / kMR * kMR : kMC;
  buf.reserve_a(mc_max);
  float* const Ap = buf.a;
  float* const Bp = buf.b;
  if (Ap == nullptr || Bp == nullptr) throw std::bad_alloc();

  // Ap(mc, kc) in MR-tall panels <- rows [ic, ic + mc) of op(A), columns [pc, pc + kc).
  auto pack_a = [&](int ic, int mc, int pc, int kc) {
    for (int ir = 0; ir < mc; ir += kMR) {
      const int h = min_int(kMR, mc - ir);
      if (!trans_a)  // A (M,K): element (m,k) at A[m*lda + k]
        pack_transpose(A + static_cast<long>(ic + ir) * lda + pc, lda, h, kc, kMR, Ap + ir * kc);
      else  // A (K,M): element (m,k) at A[k*lda + m]
        pack_copy(A + static_cast<long>(pc) * lda + ic + ir, lda, kc, h, kMR, Ap + ir * kc);
    }
  };
  // Bp(kc, nc) in NR-wide panels <- rows [pc, pc + kc), columns [jc, jc + nc) of op(B).
  auto pack_b = [&](int jc, int nc, int pc, int kc) {
    for (int jr = 0; jr < nc; jr += kNR) {
      const int w = min_int(kNR, nc - jr);
      if (!trans_b)  // B (K,N): element (k,n) at B[k*ldb + n]
        pack_copy(B + static_cast<long>(pc) * ldb + jc + jr, ldb, kc, w, kNR, Bp + jr * kc);
      else  // B (N,K): element (k,n) at B[n*ldb + k]
        pack_transpose(B + static_cast<long>(jc + jr) * ldb + pc, ldb, w, kc, kNR, Bp + jr * kc);
    }
  };
  // C[ic:ic+mc, jc:jc+nc] (+)= the K block at pc; rows of A from Ap (packed) or in place.
  auto multiply = [&](int ic, int mc, int jc, int nc, int pc, int kc) {
    // Later K blocks accumulate onto what the first one wrote; the bias joins
    // the first, as it would if C were filled with it and beta were 1.
    const float beta_k = pc == 0 ? beta : 1.0f;
    const float* bias_k = pc == 0 && bias != nullptr ? bias + jc : nullptr;
    for (int ir = 0; ir < mc; ir += kMR) {
      const int h = min_int(kMR, mc - ir);
      float* c = C + static_cast<long>(ic + ir) * ldc + jc;
      if (direct_a) {  // A (M,K): element (m,k) at A[m*lda + k]
        const float* a = A + static_cast<long>(ic + ir) * lda + pc;
        for (int jr = 0; jr < nc; jr += kNR)
          kDirectKernels[h](kc, a, lda, Bp + jr * kc, c + jr, ldc, alpha, beta_k,
                            bias_k ? bias_k + jr : nullptr, min_int(kNR, nc - jr));
      } else {
        for (int jr = 0; jr < nc; jr += kNR)
          kPackedKernels[h](kc, Ap + ir * kc, 0, Bp + jr * kc, c + jr, ldc, alpha, beta_k,
                            bias_k ? bias_k + jr : nullptr, min_int(kNR, nc - jr));
      }
    }
  };

  // Every C element sums its K blocks in order pc = 0, 1, ... in both loop
  // orders, so they give the same bits.
  if (whole_a) {
    for (int pc = 0; pc < K; pc += kKC) {
      const int kc = min_int(kKC, K - pc);
      pack_a(0, M, pc, kc);
      for (int jc = 0; jc < N; jc += kNC) {
        const int nc = min_int(kNC, N - jc);
        pack_b(jc, nc, pc, kc);
        multiply(0, M, jc, nc, pc, kc);
      }
    }
    return;
  }
  for (int jc = 0; jc < N; jc += kNC) {
    const int nc = min_int(kNC, N - jc);
    for (int pc = 0; pc < K; pc += kKC) {
      const int kc = min_int(kKC, K - pc);
      pack_b(jc, nc, pc, kc);
      for (int ic = 0; ic < M; ic += kMC) {
        const int mc = min_int(kMC, M - ic);
        if (!direct_a) pack_a(ic, mc, pc, kc);
        multiply(ic, mc, jc, nc, pc, kc);
      }
    }
  }
}

}  // namespace troupe::kernels::cpu::detail

#pragma GCC diagnostic pop
#pragma GCC pop_options

// Packing and blocking of the bf16 GEMM (layout and loops: gemm_bf16_packed.hpp).
// Plain C++ for every CPU: the micro-kernel it calls is the only ISA-specific part.
#include "kernels/cpu/gemm_bf16_packed.hpp"

#include <cstddef>
#include <cstdlib>
#include <new>

#include "core/dtype_convert.hpp"

namespace troupe::kernels::cpu::detail {
namespace {

constexpr int kMR = kBf16MR, kNR = kBf16NR, kKC = kBf16KC, kMC = kBf16MC, kNC = kBf16NC;
static_assert(kKC % 2 == 0, "K blocks hold whole pairs, so only the last one pads k");
static_assert(kMC % kMR == 0, "A blocks hold whole panels");

inline int min_int(int a, int b) { return a < b ? a : b; }

// One 32-bit lane of a panel: k = 2p in the low half, k = 2p + 1 in the high half.
inline uint32_t pair(uint16_t lo, uint16_t hi) { return uint32_t{lo} | uint32_t{hi} << 16; }

uint32_t* alloc_lanes(size_t lanes) {
  const size_t bytes = (lanes * sizeof(uint32_t) + 63) / 64 * 64;  // aligned_alloc wants a multiple
  auto* p = static_cast<uint32_t*>(std::aligned_alloc(64, bytes));
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

// Per-thread panels, allocated on first use and kept (grow-only): a training step
// calls GEMM hundreds of times with the same block sizes.
struct PackBuffers {
  uint32_t* a = nullptr;  // A block: (MC / MR) panels of (KC/2, MR), fewer for small M
  uint32_t* b = nullptr;  // B block: (NC / NR) panels of (KC/2, NR)
  size_t a_lanes = 0;
  PackBuffers() : b(alloc_lanes(size_t(kNC) * (kKC / 2))) {}
  ~PackBuffers() {
    std::free(a);
    std::free(b);
  }
  uint32_t* reserve_a(size_t lanes) {
    if (lanes > a_lanes) {
      std::free(a);
      a = nullptr;  // stays empty if the allocation throws
      a_lanes = 0;
      a = alloc_lanes(lanes);
      a_lanes = lanes;
    }
    return a;
  }
  PackBuffers(const PackBuffers&) = delete;
  PackBuffers& operator=(const PackBuffers&) = delete;
};

}  // namespace

void pack_a_bf16(const uint16_t* a, int lda, bool trans_a, int h, int kc, uint32_t* ap) {
  const int full = kc / 2, kp = (kc + 1) / 2;
  if (!trans_a) {  // row i is contiguous in k: its pairs are adjacent
    for (int i = 0; i < h; ++i) {
      const uint16_t* row = a + static_cast<long>(i) * lda;
      for (int p = 0; p < full; ++p) ap[p * kMR + i] = pair(row[2 * p], row[2 * p + 1]);
      if (kc % 2 != 0) ap[full * kMR + i] = pair(row[kc - 1], 0);
    }
  } else {  // k is the row: a pair interleaves two rows
    for (int p = 0; p < full; ++p) {
      const uint16_t* r0 = a + static_cast<long>(2 * p) * lda;
      const uint16_t* r1 = r0 + lda;
      for (int i = 0; i < h; ++i) ap[p * kMR + i] = pair(r0[i], r1[i]);
    }
    if (kc % 2 != 0) {
      const uint16_t* r0 = a + static_cast<long>(kc - 1) * lda;
      for (int i = 0; i < h; ++i) ap[full * kMR + i] = pair(r0[i], 0);
    }
  }
  for (int p = 0; p < kp; ++p)
    for (int i = h; i < kMR; ++i) ap[p * kMR + i] = 0;
}

void pack_b_bf16(const uint16_t* b, int ldb, bool trans_b, int w, int kc, uint32_t* bp) {
  const int full = kc / 2, kp = (kc + 1) / 2;
  if (!trans_b) {  // k is the row: a pair interleaves two rows
    for (int p = 0; p < full; ++p) {
      const uint16_t* r0 = b + static_cast<long>(2 * p) * ldb;
      const uint16_t* r1 = r0 + ldb;
      for (int j = 0; j < w; ++j) bp[p * kNR + j] = pair(r0[j], r1[j]);
    }
    if (kc % 2 != 0) {
      const uint16_t* r0 = b + static_cast<long>(kc - 1) * ldb;
      for (int j = 0; j < w; ++j) bp[full * kNR + j] = pair(r0[j], 0);
    }
  } else {  // column j is contiguous in k: its pairs are adjacent
    for (int j = 0; j < w; ++j) {
      const uint16_t* col = b + static_cast<long>(j) * ldb;
      for (int p = 0; p < full; ++p) bp[p * kNR + j] = pair(col[2 * p], col[2 * p + 1]);
      if (kc % 2 != 0) bp[full * kNR + j] = pair(col[kc - 1], 0);
    }
  }
  for (int p = 0; p < kp; ++p)
    for (int j = w; j < kNR; ++j) bp[p * kNR + j] = 0;
}

void gemm_bf16_packed(Bf16MicroKernel kernel, bool trans_a, bool trans_b, int M, int N, int K,
                      const uint16_t* A, int lda, const uint16_t* B, int ldb, float beta, float* C, int ldc,
                      const float* bias) {
  thread_local PackBuffers buf;
  // Where op(A)(m, k) and op(B)(k, n) are: A is (M,K) or, transposed, (K,M); B is (K,N) or (N,K).
  auto a_at = [&](int m, int k) {
    return A + (trans_a ? static_cast<long>(k) * lda + m : static_cast<long>(m) * lda + k);
  };
  auto b_at = [&](int k, int n) {
    return B + (trans_b ? static_cast<long>(n) * ldb + k : static_cast<long>(k) * ldb + n);
  };

  for (int pc = 0; pc < K; pc += kKC) {
    const int kc = min_int(kKC, K - pc), kp = (kc + 1) / 2;
    // The first K block writes C (over beta * C or the bias), later ones add to it:
    // every C element sums its K blocks in order pc = 0, 1, ...
    const bool accumulate = pc > 0 || beta != 0.0f;
    const float* bias_k = pc == 0 ? bias : nullptr;
    for (int ic = 0; ic < M; ic += kMC) {
      const int mc = min_int(kMC, M - ic);
      const int panels_a = (mc + kMR - 1) / kMR;
      uint32_t* const ap = buf.reserve_a(static_cast<size_t>(panels_a) * kp * kMR);
      for (int qa = 0; qa < panels_a; ++qa)
        pack_a_bf16(a_at(ic + qa * kMR, pc), lda, trans_a, min_int(kMR, mc - qa * kMR), kc,
                    ap + static_cast<size_t>(qa) * kp * kMR);

      for (int jc = 0; jc < N; jc += kNC) {
        const int nc = min_int(kNC, N - jc);
        const int panels_b = (nc + kNR - 1) / kNR;
        for (int qb = 0; qb < panels_b; ++qb)
          pack_b_bf16(b_at(pc, jc + qb * kNR), ldb, trans_b, min_int(kNR, nc - qb * kNR), kc,
                      buf.b + static_cast<size_t>(qb) * kp * kNR);

        for (int qa = 0; qa < panels_a; ++qa) {
          const int h = min_int(kMR, mc - qa * kMR);
          const uint32_t* a_panel = ap + static_cast<size_t>(qa) * kp * kMR;
          float* c = C + static_cast<long>(ic + qa * kMR) * ldc + jc;
          for (int qb = 0; qb < panels_b; ++qb)
            kernel(h, min_int(kNR, nc - qb * kNR), kp, a_panel, buf.b + static_cast<size_t>(qb) * kp * kNR,
                   c + qb * kNR, ldc, bias_k != nullptr ? bias_k + jc + qb * kNR : nullptr, accumulate);
        }
      }
    }
  }
}

void bf16_micro_kernel_scalar(int h, int n, int kp, const uint32_t* ap, const uint32_t* bp, float* c,
                              long ldc, const float* bias, bool accumulate) {
  for (int i = 0; i < h; ++i)
    for (int j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int p = 0; p < kp; ++p) {
        const uint32_t a = ap[p * kMR + i], b = bp[p * kNR + j];
        // The products of two bf16 are exact in fp32; only the sums round.
        acc += bits_to_f32(a & 0xffff0000u) * bits_to_f32(b & 0xffff0000u);
        acc += bits_to_f32(a << 16) * bits_to_f32(b << 16);
      }
      float* out = c + i * ldc + j;
      *out = bias != nullptr ? acc + bias[j] : accumulate ? *out + acc : acc;
    }
}

}  // namespace troupe::kernels::cpu::detail

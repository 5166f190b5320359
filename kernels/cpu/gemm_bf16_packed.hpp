// The packed bf16 GEMM behind the avx512bf16 backend of gemm_half (gemm_half.hpp):
// the layered scheme of gemm_avx512.cpp (Goto / BLIS), with operands packed as
// k-pairs for vdpbf16ps, which per fp32 lane j adds
//
//   acc[j] += a.bf16[2j+1] * b.bf16[2j+1] + a.bf16[2j] * b.bf16[2j]
//
// so one 32-bit lane holds two consecutive k of one row of A or one column of B:
// the low half k = 2p, the high half k = 2p + 1.
//
//   for pc in K step KC                  A and B blocks of KC = 768 k (384 pairs)
//     for ic in M step MC                pack all of A's rows for the block (MC = 4088)
//       pack A -> Ap: MR-tall panels, (KC/2, MR) uint32 each
//       for jc in N step NC
//         pack B -> Bp: NR-wide panels, (KC/2, NR) uint32 each     (768 KiB, stays in L2)
//         for ir in MC step MR           one A panel (21 KiB) stays in L1
//           for jr in NC step NR
//             micro-kernel: C(MR,NR) (+)= Ap(MR,KC) Bp(KC,NR)
//
// Panels, worked for MR = 14, NR = 32 and kc = 5 (kp = 3 pairs, k = 5 padded):
//   Ap[p*MR + i] = A(i, 2p) | A(i, 2p+1) << 16     rows i >= h and k >= kc are 0
//   Bp[p*NR + j] = B(2p, j) | B(2p+1, j) << 16     columns j >= w and k >= kc are 0
// so each k-pair step of the micro-kernel loads NR lanes of Bp (two zmm) and
// broadcasts one 32-bit Ap lane per row. The zero padding (odd K, edge rows and
// columns) lets the micro-kernel always run whole vectors; only its C update is
// masked.
//
// The packing and the loops are plain C++ (gemm_bf16_packed.cpp), tested on every
// machine through a scalar micro-kernel that reads the same panels; only the
// micro-kernel itself is AVX-512 (gemm_avx512bf16.cpp).
//
// Determinism: the blocking is fixed, so every C element sums the same products in
// the same order whatever the pointers, strides or thread.
#pragma once

#include <cstdint>

namespace troupe::kernels::cpu::detail {

constexpr int kBf16MR = 14;            // rows of the micro-tile
constexpr int kBf16NR = 32;            // columns of the micro-tile (two zmm of fp32)
constexpr int kBf16KC = 768;           // k per packed block (even: whole pairs)
constexpr int kBf16MC = 14 * 292;      // rows of A packed at once (4088; 6 MiB of Ap)
constexpr int kBf16NC = kBf16NR * 16;  // columns of a packed B block

// C(h, n) = Ap(h, 2kp) Bp(2kp, n), plus C's old value when accumulate, plus bias(n)
// when bias is given (then accumulate is false); h <= MR rows and n <= NR columns
// of C (row stride ldc) are written, nothing else, and C is read only when
// accumulate. ap: one A panel, (kp, MR); bp: one B panel, (kp, NR), 64-byte aligned.
using Bf16MicroKernel = void (*)(int h, int n, int kp, const uint32_t* ap, const uint32_t* bp, float* c,
                                 long ldc, const float* bias, bool accumulate);

// Ap (kp, MR) <- op(A)(h, kc) starting at a: element (i, k) at a[i*lda + k], or,
// trans_a, at a[k*lda + i]. kp = (kc + 1) / 2; h <= MR.
void pack_a_bf16(const uint16_t* a, int lda, bool trans_a, int h, int kc, uint32_t* ap);
// Bp (kp, NR) <- op(B)(kc, w) starting at b: element (k, j) at b[k*ldb + j], or,
// trans_b, at b[j*ldb + k]. w <= NR.
void pack_b_bf16(const uint16_t* b, int ldb, bool trans_b, int w, int kc, uint32_t* bp);

// C(M,N) = op(A) op(B) (+ C when beta == 1; + bias(N) when bias, then beta == 0)
// through the loops above and `kernel`. Expects M, N, K > 0 and beta 0 or 1
// (gemm_half_with checks and handles the degenerate cases).
void gemm_bf16_packed(Bf16MicroKernel kernel, bool trans_a, bool trans_b, int M, int N, int K,
                      const uint16_t* A, int lda, const uint16_t* B, int ldb, float beta, float* C, int ldc,
                      const float* bias);

// The scalar micro-kernel: vdpbf16ps lane by lane (the high product, then the
// low one, each added in fp32), on every CPU. It tests the packing and the loops;
// the hardware may differ from it in the last bits (and treats subnormal bf16 as 0).
void bf16_micro_kernel_scalar(int h, int n, int kp, const uint32_t* ap, const uint32_t* bp, float* c,
                              long ldc, const float* bias, bool accumulate);

// The AVX-512 micro-kernel (gemm_avx512bf16.cpp). Requires AVX512-BF16 and
// AVX-512F/BW/VL/DQ: call only after half_gemm_backend_available(avx512bf16, bf16).
void bf16_micro_kernel_avx512(int h, int n, int kp, const uint32_t* ap, const uint32_t* bp, float* c,
                              long ldc, const float* bias, bool accumulate);

}  // namespace troupe::kernels::cpu::detail

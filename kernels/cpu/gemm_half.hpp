// GEMM on 16-bit inputs with fp32 accumulation and an fp32 result: the products
// of mixed-precision training (train.precision bf16 / fp16). Inputs are bit
// patterns (uint16_t) of the DType passed next to them (core/dtype.hpp).
//
//   C(M,N) = op(A) op(B) + beta * C,   or, with a bias, op(A) op(B) + bias(N)
//
// A is (M,K) or, transposed, (K,M); B is (K,N) or, transposed, (N,K); lda/ldb/ldc
// are row strides in elements. Every product of two 16-bit values is exact in
// fp32; the sums are fp32. beta is 0 or 1 (= or +=); beta == 0 never reads C.
//
// Backends (each shape runs the one measured fastest on it, gemm_dispatch.hpp;
// TROUPE_GEMM_HALF forces one):
//  * onednn      oneDNN's matmul primitive, where oneDNN has a real kernel for the
//                dtype on this CPU: AMX tiles on Sapphire Rapids and later,
//                vdpbf16ps on AVX512-BF16 (gemm_onednn.cpp).
//  * avx512bf16  bf16 only: a packed micro-kernel on vdpbf16ps (AVX512-BF16),
//                two k at a time per fp32 lane, where the CPU has it.
//  * convert     every CPU: the 16-bit operands widened to fp32 (exactly) panel
//                by panel, then the fp32 GEMM (kernels::cpu::gemm); f16 widens
//                through F16C where present.
// Deterministic: for a given backend the same inputs give the same bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/dtype.hpp"

namespace troupe::kernels::cpu {

enum class HalfGemmBackend { avx512bf16, convert, onednn };

// "avx512bf16", "convert" or "onednn" (the names TROUPE_GEMM_HALF accepts).
const char* half_gemm_backend_name(HalfGemmBackend b);

// avx512bf16: this CPU runs AVX512-BF16 (and AVX-512F/BW/VL) and dt is bf16;
// onednn: the build has oneDNN and oneDNN has more than its reference loop for dt here;
// convert: dt is bf16 or f16. TROUPE_MAX_CPU_ISA (cpu_features.hpp) hides the first two.
bool half_gemm_backend_available(HalfGemmBackend b, DType dt);

// The static choice for dt: TROUPE_GEMM_HALF when set (an unknown name, or one
// unavailable for dt, throws troupe::Error), else avx512bf16 where available, else
// convert. gemm_half() runs it when TROUPE_GEMM_HALF is set and for products too small
// to measure; otherwise the backend measured fastest on the shape (gemm_dispatch.hpp).
HalfGemmBackend half_gemm_default_backend(DType dt);

// For logs and `troupe version`: the forced backend, or "measured per shape: onednn
// (brg:avx512_core_amx) avx512bf16 convert" (the candidates for dt), or why there is none.
std::string half_gemm_description(DType dt);

// The backend that TROUPE_GEMM_HALF=name picks for dt: name null or empty gives the
// static preference, an unknown name or one unavailable for dt throws troupe::Error.
// half_gemm_default_backend(dt) is this of the environment, cached on first use.
HalfGemmBackend half_gemm_backend_for(const char* name, DType dt);

// dt is DType::bf16 or DType::f16. bias (N) may be null; with a bias, beta must be 0.
void gemm_half(DType dt, bool trans_a, bool trans_b, int M, int N, int K, const uint16_t* A, int lda,
               const uint16_t* B, int ldb, float beta, float* C, int ldc, const float* bias = nullptr);

// Same contract, through backend b (which must be available for dt).
void gemm_half_with(HalfGemmBackend b, DType dt, bool trans_a, bool trans_b, int M, int N, int K,
                    const uint16_t* A, int lda, const uint16_t* B, int ldb, float beta, float* C, int ldc,
                    const float* bias = nullptr);

// dst(n) = src(n) rounded to dt (bf16 or f16), to nearest even, NaN kept a NaN: the
// same bits as core/dtype_convert.hpp's f32_to_bf16 / f32_to_f16, vectorised
// (AVX2 for bf16, F16C for f16) where the CPU has it.
void to_half(DType dt, uint16_t* dst, const float* src, size_t n);
// dst(n) = src(n) widened to f32 (exact).
void from_half(DType dt, float* dst, const uint16_t* src, size_t n);

}  // namespace troupe::kernels::cpu

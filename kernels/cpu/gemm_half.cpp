// 16-bit GEMM entry point (contract: gemm_half.hpp): argument checks, the backend
// picked once per process and dtype, the convert backend, and the vectorised
// conversions to_half / from_half.
//
//  * avx512bf16  packed k-pair panels and a vdpbf16ps micro-kernel
//                (gemm_bf16_packed.hpp, gemm_avx512bf16.cpp), bf16 on AVX512-BF16.
//  * convert     blocks of the operands widened to fp32 (exact) into per-thread
//                scratch, then the fp32 GEMM of kernels.hpp on each block:
//
//      for jc in N step 2048          widen op(B)(768, 2048)   (6 MiB of scratch)
//        for pc in K step 768
//          for ic in M step 2048      widen op(A)(2048, 768)   (6 MiB)
//            C block (+)= gemm on the fp32 blocks
//
//                Widening costs O(MK N/2048 + KN) against the O(MNK) product, and
//                the scratch stays bounded for any shape (a 50k-row vocabulary
//                matrix would take 200 MiB widened whole). The first K block
//                applies beta or the bias, later ones accumulate (beta = 1).
//
//  * onednn      oneDNN's matmul primitive (gemm_onednn.cpp).
//
// Each shape runs the backend measured fastest on it (gemm_dispatch.hpp);
// TROUPE_GEMM_HALF=avx512bf16|convert|onednn forces one. Degenerate products (M, N or
// K == 0) never reach a backend, so beta == 0 never reads C anywhere.
#include "kernels/cpu/gemm_half.hpp"

#include <immintrin.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/dtype_convert.hpp"
#include "core/error.hpp"
#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/gemm_backends.hpp"
#include "kernels/cpu/gemm_bf16_packed.hpp"
#include "kernels/cpu/gemm_dispatch.hpp"
#include "kernels/cpu/kernels.hpp"

namespace troupe::kernels::cpu {
namespace {

// ---------------------------------------------------------------- CPU features

bool cpu_has_avx2() { return cpu_features().avx2; }
bool cpu_has_f16c() { return cpu_features().f16c; }

// ---------------------------------------------------------------- conversions
// Each vector loop does, 8 or 16 lanes at a time, what the scalar function of
// core/dtype_convert.hpp does to one value (the tails use that function itself),
// so both give the same bits for every input.

__attribute__((target("avx2"))) void bf16_to_f32_avx2(float* dst, const uint16_t* src, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  for (; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

// f32_to_bf16 on 8 lanes, the result in the low 16 bits of each 32-bit lane.
__attribute__((target("avx2"))) inline __m256i round_to_bf16(__m256i u) {
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i nan =
      _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x0040));
  const __m256i bias =
      _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(_mm256_srli_epi32(u, 16), one));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
  return _mm256_blendv_epi8(rounded, quiet, nan);
}

__attribute__((target("avx2"))) void f32_to_bf16_avx2(uint16_t* dst, const float* src, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i r0 = round_to_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    const __m256i r1 = round_to_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 8)));
    // packus works per 128-bit half: (r0 lo, r1 lo, r0 hi, r1 hi); the permute puts
    // the four 64-bit quarters back in order. Every lane is <= 0xffff, so no saturation.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r0, r1), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), packed);
  }
  for (; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

__attribute__((target("avx2,f16c"))) void f16_to_f32_f16c(float* dst, const uint16_t* src, size_t n) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fff), inf = _mm256_set1_epi32(0x7c00);
  const __m256i qnan = _mm256_set1_epi32(0x7e00), f32_quiet_bit = _mm256_set1_epi32(0x00400000);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m256i f = _mm256_castps_si256(_mm256_cvtph_ps(h));
    // vcvtph2ps quiets a signalling NaN (sets the f32 quiet bit); f16_to_f32 keeps
    // the payload as it is, so the bit is cleared again for those lanes.
    const __m256i a = _mm256_and_si256(_mm256_cvtepu16_epi32(h), abs_mask);
    const __m256i snan = _mm256_and_si256(_mm256_cmpgt_epi32(a, inf), _mm256_cmpgt_epi32(qnan, a));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm256_andnot_si256(_mm256_and_si256(snan, f32_quiet_bit), f));
  }
  for (; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

__attribute__((target("avx2,f16c"))) void f32_to_f16_f16c(uint16_t* dst, const float* src, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    // Round to nearest even by the immediate, whatever MXCSR's rounding mode is.
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  for (; i < n; ++i) dst[i] = f32_to_f16(src[i]);
}

void check_half(DType dt, const char* what) {
  TROUPE_CHECK(dt == DType::bf16 || dt == DType::f16, what, ": dtype ", is_valid(dt) ? dtype_name(dt) : "?",
               " is not bf16 or f16");
}

// ---------------------------------------------------------------- convert backend

constexpr int kConvKC = 768;   // a multiple of the fp32 kernel's K block (384)
constexpr int kConvMC = 2048;  // rows of op(A) widened at once
constexpr int kConvNC = 2048;  // columns of op(B) widened at once

// dst(rows, cols), compact <- src(rows, cols) with row stride ld, widened to fp32.
void widen_block(DType dt, const uint16_t* src, int ld, int rows, int cols, float* dst) {
  for (int r = 0; r < rows; ++r)
    from_half(dt, dst + static_cast<size_t>(r) * cols, src + static_cast<long>(r) * ld,
              static_cast<size_t>(cols));
}

// Per-thread fp32 blocks, grown on demand and kept: a training step calls GEMM
// hundreds of times with the same shapes.
struct WidenScratch {
  std::vector<float> a, b;
  static float* at_least(std::vector<float>& v, size_t n) {
    if (v.size() < n) v.resize(n);
    return v.data();
  }
};

void convert_gemm(DType dt, bool trans_a, bool trans_b, int M, int N, int K, const uint16_t* A, int lda,
                  const uint16_t* B, int ldb, float beta, float* C, int ldc, const float* bias) {
  thread_local WidenScratch scratch;
  for (int jc = 0; jc < N; jc += kConvNC) {
    const int nc = N - jc < kConvNC ? N - jc : kConvNC;
    for (int pc = 0; pc < K; pc += kConvKC) {
      const int kc = K - pc < kConvKC ? K - pc : kConvKC;
      // op(B)(kc, nc) at (pc, jc): B (K,N) gives a (kc, nc) block, B^T (N,K) an (nc, kc) one.
      float* const b = WidenScratch::at_least(scratch.b, static_cast<size_t>(kc) * nc);
      if (!trans_b)
        widen_block(dt, B + static_cast<long>(pc) * ldb + jc, ldb, kc, nc, b);
      else
        widen_block(dt, B + static_cast<long>(jc) * ldb + pc, ldb, nc, kc, b);
      const int ldb_w = trans_b ? kc : nc;
      for (int ic = 0; ic < M; ic += kConvMC) {
        const int mc = M - ic < kConvMC ? M - ic : kConvMC;
        // op(A)(mc, kc) at (ic, pc): A (M,K) gives an (mc, kc) block, A^T (K,M) a (kc, mc) one.
        float* const a = WidenScratch::at_least(scratch.a, static_cast<size_t>(mc) * kc);
        if (!trans_a)
          widen_block(dt, A + static_cast<long>(ic) * lda + pc, lda, mc, kc, a);
        else
          widen_block(dt, A + static_cast<long>(pc) * lda + ic, lda, kc, mc, a);
        const int lda_w = trans_a ? mc : kc;
        float* const c = C + static_cast<long>(ic) * ldc + jc;
        if (pc == 0 && bias != nullptr)
          gemm_bias(trans_a, trans_b, mc, nc, kc, 1.0f, a, lda_w, b, ldb_w, bias + jc, c, ldc);
        else
          gemm(trans_a, trans_b, mc, nc, kc, 1.0f, a, lda_w, b, ldb_w, pc == 0 ? beta : 1.0f, c, ldc);
      }
    }
  }
}

// ---------------------------------------------------------------- checks

void check_args(HalfGemmBackend b, DType dt, bool trans_a, bool trans_b, int M, int N, int K, int lda,
                int ldb, int ldc, float beta, const float* bias) {
  check_half(dt, "gemm_half");
  TROUPE_CHECK(M >= 0 && N >= 0 && K >= 0, "M=", M, " N=", N, " K=", K);
  TROUPE_CHECK(lda >= (trans_a ? (M > 0 ? M : 1) : (K > 0 ? K : 1)), "lda=", lda, " too small");
  TROUPE_CHECK(ldb >= (trans_b ? (K > 0 ? K : 1) : (N > 0 ? N : 1)), "ldb=", ldb, " too small");
  TROUPE_CHECK(ldc >= (N > 0 ? N : 1), "ldc=", ldc, " too small");
  TROUPE_CHECK(beta == 0.0f || beta == 1.0f, "beta=", beta, " is not 0 or 1");
  TROUPE_CHECK(bias == nullptr || beta == 0.0f, "a bias requires beta == 0, not ", beta);
  TROUPE_CHECK(half_gemm_backend_available(b, dt), "16-bit GEMM backend ", half_gemm_backend_name(b),
               " is not available for ", dtype_name(dt));
}

}  // namespace

const char* half_gemm_backend_name(HalfGemmBackend b) {
  switch (b) {
    case HalfGemmBackend::avx512bf16:
      return "avx512bf16";
    case HalfGemmBackend::convert:
      return "convert";
    case HalfGemmBackend::onednn:
      return "onednn";
  }
  return "?";
}

bool half_gemm_backend_available(HalfGemmBackend b, DType dt) {
  if (dt != DType::bf16 && dt != DType::f16) return false;
  switch (b) {
    case HalfGemmBackend::avx512bf16:
      return cpu_features().avx512_bf16 && dt == DType::bf16;
    case HalfGemmBackend::convert:
      return true;
    case HalfGemmBackend::onednn:
#ifdef TROUPE_HAVE_DNNL
      return detail::onednn_half_usable(dt);
#else
      return false;
#endif
  }
  return false;
}

HalfGemmBackend half_gemm_backend_for(const char* name, DType dt) {
  check_half(dt, "TROUPE_GEMM_HALF");
  if (name == nullptr || *name == '\0')
    return half_gemm_backend_available(HalfGemmBackend::avx512bf16, dt) ? HalfGemmBackend::avx512bf16
                                                                        : HalfGemmBackend::convert;
  for (HalfGemmBackend b : {HalfGemmBackend::avx512bf16, HalfGemmBackend::convert, HalfGemmBackend::onednn}) {
    if (std::strcmp(name, half_gemm_backend_name(b)) == 0) {
      TROUPE_CHECK(half_gemm_backend_available(b, dt), "TROUPE_GEMM_HALF=", name, " is not available for ",
                   dtype_name(dt), " on this machine");
      return b;
    }
  }
  TROUPE_CHECK(false, "TROUPE_GEMM_HALF=", name, " is not one of avx512bf16, convert, onednn");
  return HalfGemmBackend::convert;
}

HalfGemmBackend half_gemm_default_backend(DType dt) {
  check_half(dt, "half_gemm_default_backend");
  // One choice per dtype, made on first use (a throwing choice is retried next call).
  if (dt == DType::bf16) {
    static const HalfGemmBackend b = half_gemm_backend_for(std::getenv("TROUPE_GEMM_HALF"), DType::bf16);
    return b;
  }
  static const HalfGemmBackend b = half_gemm_backend_for(std::getenv("TROUPE_GEMM_HALF"), DType::f16);
  return b;
}

void gemm_half_with(HalfGemmBackend b, DType dt, bool trans_a, bool trans_b, int M, int N, int K,
                    const uint16_t* A, int lda, const uint16_t* B, int ldb, float beta, float* C, int ldc,
                    const float* bias) {
  check_args(b, dt, trans_a, trans_b, M, N, K, lda, ldb, ldc, beta, bias);
  if (M == 0 || N == 0) return;
  if (K == 0) {  // C = bias rows, 0, or unchanged (beta == 1)
    for (int i = 0; i < M; ++i) {
      float* row = C + static_cast<long>(i) * ldc;
      if (bias != nullptr)
        std::memcpy(row, bias, sizeof(float) * N);
      else if (beta == 0.0f)
        std::memset(row, 0, sizeof(float) * N);
    }
    return;
  }
  switch (b) {
    case HalfGemmBackend::avx512bf16:
      detail::gemm_bf16_packed(detail::bf16_micro_kernel_avx512, trans_a, trans_b, M, N, K, A, lda, B, ldb,
                               beta, C, ldc, bias);
      return;
    case HalfGemmBackend::convert:
      convert_gemm(dt, trans_a, trans_b, M, N, K, A, lda, B, ldb, beta, C, ldc, bias);
      return;
    case HalfGemmBackend::onednn:
#ifdef TROUPE_HAVE_DNNL
      detail::gemm_half_onednn(dt, trans_a, trans_b, M, N, K, A, lda, B, ldb, beta, C, ldc, bias);
#endif
      return;
  }
}

void gemm_half(DType dt, bool trans_a, bool trans_b, int M, int N, int K, const uint16_t* A, int lda,
               const uint16_t* B, int ldb, float beta, float* C, int ldc, const float* bias) {
  check_half(dt, "gemm_half");
  const auto b = static_cast<HalfGemmBackend>(gemm_dispatch(dt, trans_a, trans_b, M, N, K));
  gemm_half_with(b, dt, trans_a, trans_b, M, N, K, A, lda, B, ldb, beta, C, ldc, bias);
}

std::string half_gemm_description(DType dt) {
  try {
    if (const char* env = std::getenv("TROUPE_GEMM_HALF"); env != nullptr && *env != '\0')
      return half_gemm_backend_name(half_gemm_default_backend(dt));
    std::string s = "measured per shape:";
    for (HalfGemmBackend b :
         {HalfGemmBackend::onednn, HalfGemmBackend::avx512bf16, HalfGemmBackend::convert}) {
      if (!half_gemm_backend_available(b, dt)) continue;
      s += std::string(" ") + half_gemm_backend_name(b);
#ifdef TROUPE_HAVE_DNNL
      if (b == HalfGemmBackend::onednn) s += " (" + detail::onednn_half_impl(dt) + ")";
#endif
    }
    return s;
  } catch (const std::exception& e) {
    return std::string("unavailable: ") + e.what();
  }
}

void to_half(DType dt, uint16_t* dst, const float* src, size_t n) {
  check_half(dt, "to_half");
  if (dt == DType::bf16) {
    if (cpu_has_avx2()) return f32_to_bf16_avx2(dst, src, n);
  } else if (cpu_has_f16c()) {
    return f32_to_f16_f16c(dst, src, n);
  }
  convert(DType::f32, src, dt, dst, n);  // the scalar rounding of core/dtype_convert.hpp
}

void from_half(DType dt, float* dst, const uint16_t* src, size_t n) {
  check_half(dt, "from_half");
  if (dt == DType::bf16) {
    if (cpu_has_avx2()) return bf16_to_f32_avx2(dst, src, n);
  } else if (cpu_has_f16c()) {
    return f16_to_f32_f16c(dst, src, n);
  }
  convert(dt, src, DType::f32, dst, n);
}

}  // namespace troupe::kernels::cpu

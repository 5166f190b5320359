// The kernels a model stage calls, as a table of function pointers: the seam a
// CUDA (kernels/cuda/, not in this build) kernel set plugs into.
// model/ calls kernels only through a Kernels it is given (model::DeviceContext);
// kernels::cpu provides the CPU table, cpu_kernels(): fp32 kernels, and the 16-bit
// linear entries that mixed precision (train.precision bf16 / fp16) calls.
//
// Each entry has the signature and contract of the function of the same name in
// kernels/cpu/kernels.hpp (shapes, accumulate-vs-overwrite, determinism): read
// the contract there. One indirect call per layer op, never per element, so the
// CPU path runs the same code at the same speed as a direct call. Pointers are
// device pointers of the table's device; a table for another device or precision
// keeps these signatures where it can and adds entries where it must.
//
// Not in the table: GEMM (internal to linear_*; benchmarks call kernels::cpu::gemm
// and kernels::cpu::gemm_half).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.hpp"

namespace troupe::kernels {

// How a backward kernel writes an input gradient: += onto what is there, or = .
enum class Out { accumulate, overwrite };

struct Kernels {
  const char* name = nullptr;  // "cpu"
  Device device = Device::cpu;

  // linear: out(N,OC) = inp(N,IC) @ weight(OC,IC)^T + bias(OC)
  void (*linear_forward)(float* out, const float* inp, const float* weight, const float* bias, int N, int IC,
                         int OC) = nullptr;
  void (*linear_backward)(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const float* weight, int N, int IC, int OC, Out dinp_mode) = nullptr;
  // linear with 16-bit operands (mixed precision): inp and weight are bit patterns of
  // dt (bf16 or f16), products accumulate in f32, out and bias are f32.
  void (*linear_forward_h)(DType dt, float* out, const uint16_t* inp, const uint16_t* weight,
                           const float* bias, int N, int IC, int OC) = nullptr;
  // dout (f32) is rounded to dt into dout_h(N,OC) (scratch); dinp (+)= dout_h @ weight and
  // dweight += dout_h^T @ inp in f32; dbias += the column sums of the f32 dout.
  void (*linear_backward_h)(DType dt, float* dinp, float* dweight, float* dbias, const float* dout,
                            uint16_t* dout_h, const uint16_t* inp, const uint16_t* weight, int N, int IC,
                            int OC, Out dinp_mode) = nullptr;
  // dst(n) = src(n) rounded to dt (bf16 or f16) to nearest even (core/dtype_convert.hpp's bits).
  void (*to_half)(DType dt, uint16_t* dst, const float* src, size_t n) = nullptr;
  // embedding: out(B,T,C) = wte[tokens] + wpe[t]
  void (*embedding_forward)(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                            int T, int C, int V) = nullptr;
  void (*embedding_backward)(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                             int C, int V) = nullptr;
  // layernorm over C, eps 1e-5, saving mean(N), rstd(N)
  void (*layernorm_forward)(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                            const float* bias, int N, int C) = nullptr;
  void (*layernorm_backward)(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                             const float* weight, const float* mean, const float* rstd, int N,
                             int C) = nullptr;
  // causal attention core, fused (no T x T buffer), grouped-query with NKV key/value heads
  // (0 = NH): qkv(B,T,(NH+2*NKV)*HS) -> out(B,T,NH*HS), lse(B,NH,T)
  void (*attention_forward)(float* out, float* lse, const float* qkv, int B, int T, int NH, int HS,
                            int NKV) = nullptr;
  void (*attention_backward)(float* dqkv, const float* dout, const float* qkv, const float* out,
                             const float* lse, int B, int T, int NH, int HS, Out mode, int NKV) = nullptr;
  // the same with 16-bit qkv and out (bit patterns of dt), f32 statistics and dqkv
  void (*attention_forward_h)(DType dt, uint16_t* out, float* lse, const uint16_t* qkv, int B, int T, int NH,
                              int HS, int NKV) = nullptr;
  void (*attention_backward_h)(DType dt, float* dqkv, const float* dout, const uint16_t* qkv,
                               const uint16_t* out, const float* lse, int B, int T, int NH, int HS, Out mode,
                               int NKV) = nullptr;
  // llama: RMSNorm, rotary embeddings, SwiGLU, vocabulary-parallel embedding and loss
  void (*rmsnorm_forward)(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                          float eps) = nullptr;
  void (*rmsnorm_backward)(float* dinp, float* dweight, const float* dout, const float* inp,
                           const float* weight, const float* rstd, int N, int C) = nullptr;
  // inv_freq: HS/2 floats in host memory (model::rope_inv_freq)
  void (*rope_forward)(float* x, int B, int T, int n_heads, int HS, int ld, const float* inv_freq) = nullptr;
  void (*rope_backward)(float* dx, int B, int T, int n_heads, int HS, int ld,
                        const float* inv_freq) = nullptr;
  void (*swiglu_forward)(float* out, const float* gu, int N, int F) = nullptr;
  void (*swiglu_backward)(float* dgu, const float* dout, const float* gu, int N, int F) = nullptr;
  void (*embedding_rows_forward)(float* out, const int32_t* tokens, const float* wte, int N, int C, int v0,
                                 int Vl) = nullptr;
  void (*embedding_rows_backward)(float* dwte, const float* dout, const int32_t* tokens, int N, int C, int v0,
                                  int Vl) = nullptr;
  void (*cross_entropy_stats)(float* row_max, float* row_sum_exp, float* target_logit, const float* logits,
                              const int32_t* targets, int N, int Vl, int v0) = nullptr;
  void (*cross_entropy_shard_backward)(float* dlogits, const float* logits, const int32_t* targets,
                                       const float* lse, int N, int Vl, int v0, float dloss) = nullptr;
  // GELU, tanh form
  void (*gelu_forward)(float* out, const float* inp, size_t n) = nullptr;
  void (*gelu_backward)(float* dinp, const float* inp, const float* dout, size_t n) = nullptr;
  void (*gelu_backward_inplace)(float* d, const float* inp, size_t n) = nullptr;
  // element-wise
  void (*residual_forward)(float* out, const float* a, const float* b, size_t n) = nullptr;
  void (*add_inplace)(float* y, const float* x, size_t n) = nullptr;
  void (*scale_inplace)(float* y, float s, size_t n) = nullptr;
  // the same forwards with their output rounded to dt as it is made (mixed precision's kept outputs)
  void (*layernorm_forward_h)(DType dt, uint16_t* out, float* mean, float* rstd, const float* inp,
                              const float* weight, const float* bias, int N, int C) = nullptr;
  void (*rmsnorm_forward_h)(DType dt, uint16_t* out, float* rstd, const float* inp, const float* weight,
                            int N, int C, float eps) = nullptr;
  void (*gelu_forward_h)(DType dt, uint16_t* out, const float* inp, size_t n) = nullptr;
  void (*swiglu_forward_h)(DType dt, uint16_t* out, const float* gu, int N, int F) = nullptr;
  // softmax cross-entropy over logits(N,V): the SUM of the row losses
  double (*cross_entropy)(float* dlogits, const float* logits, const int32_t* targets, int N, int V,
                          float dloss) = nullptr;
  // optimizer and clipping
  void (*adamw_update)(float* param, const float* grad, float* m, float* v, size_t n, float lr, float beta1,
                       float beta2, float eps, float weight_decay, int64_t t) = nullptr;
  double (*sum_squares)(const float* x, size_t n) = nullptr;
};

// Every entry of Kernels, for code that treats them all alike (the tables' makers, the
// declarations of the CUDA twins, the tests of completeness): X(name) once per entry.
// clang-format off
#define TROUPE_KERNEL_ENTRIES(X)                                                                     \
  X(linear_forward) X(linear_backward) X(linear_forward_h) X(linear_backward_h) X(to_half)          \
  X(embedding_forward) X(embedding_backward) X(layernorm_forward) X(layernorm_backward)             \
  X(attention_forward) X(attention_backward) X(attention_forward_h) X(attention_backward_h)         \
  X(rmsnorm_forward) X(rmsnorm_backward)                                                            \
  X(rope_forward) X(rope_backward) X(swiglu_forward) X(swiglu_backward)                             \
  X(embedding_rows_forward) X(embedding_rows_backward) X(cross_entropy_stats)                       \
  X(cross_entropy_shard_backward) X(gelu_forward) X(gelu_backward) X(gelu_backward_inplace)         \
  X(residual_forward) X(add_inplace) X(scale_inplace) X(cross_entropy) X(adamw_update)              \
  X(sum_squares) X(layernorm_forward_h) X(rmsnorm_forward_h) X(gelu_forward_h) X(swiglu_forward_h)
// clang-format on

// The fp32 CPU kernels of kernels/cpu/ (defined there); lives for the whole process.
const Kernels& cpu_kernels();

}  // namespace troupe::kernels

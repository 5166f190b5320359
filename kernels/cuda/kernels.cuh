// The CUDA kernels, one per entry of the table (kernels/kernels.hpp), with the signatures and
// contracts of their CPU twins in kernels/cpu/kernels.hpp; pointers are device pointers.
// Internal to kernels/cuda/: the rest of troupe reaches them through cuda_kernels().
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/kernels.hpp"

namespace troupe::kernels::cuda {

void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int IC,
                    int OC);
void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int IC, int OC, Out dinp_mode);
void linear_forward_h(DType dt, float* out, const uint16_t* inp, const uint16_t* weight, const float* bias,
                      int N, int IC, int OC);
void linear_backward_h(DType dt, float* dinp, float* dweight, float* dbias, const float* dout,
                       uint16_t* dout_h, const uint16_t* inp, const uint16_t* weight, int N, int IC, int OC,
                       Out dinp_mode);
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                       int C, int V);
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                        int C, int V);
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C);
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int NH, int HS, int NKV);
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att,
                        int B, int T, int NH, int HS, Out mode, int NKV);
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps);
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int N, int C);
void rope_forward(float* x, int B, int T, int n_heads, int HS, int ld, double theta);
void rope_backward(float* dx, int B, int T, int n_heads, int HS, int ld, double theta);
void swiglu_forward(float* out, const float* gu, int N, int F);
void swiglu_backward(float* dgu, const float* dout, const float* gu, int N, int F);
void embedding_rows_forward(float* out, const int32_t* tokens, const float* wte, int N, int C, int v0,
                            int Vl);
void embedding_rows_backward(float* dwte, const float* dout, const int32_t* tokens, int N, int C, int v0,
                             int Vl);
void cross_entropy_stats(float* row_max, float* row_sum_exp, float* target_logit, const float* logits,
                         const int32_t* targets, int N, int Vl, int v0);
void cross_entropy_shard_backward(float* dlogits, const float* logits, const int32_t* targets,
                                  const float* lse, int N, int Vl, int v0, float dloss);
void to_half(DType dt, uint16_t* dst, const float* src, size_t n);
void gelu_forward(float* out, const float* inp, size_t n);
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n);
void gelu_backward_inplace(float* d, const float* inp, size_t n);
void residual_forward(float* out, const float* a, const float* b, size_t n);
void add_inplace(float* y, const float* x, size_t n);
void scale_inplace(float* y, float s, size_t n);
double cross_entropy(float* dlogits, const float* logits, const int32_t* targets, int N, int V, float dloss);
void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int64_t t);
double sum_squares(const float* x, size_t n);

}  // namespace troupe::kernels::cuda

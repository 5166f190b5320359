// CPU kernels: forward and backward of every layer the models use. model/ reaches
// them through the table kernels::cpu_kernels() (kernels/kernels.hpp).
//
// Conventions (another kernel set for the table keeps the same names and signatures):
//  * Raw fp32 pointers, row-major, shapes in the comment next to each pointer:
//    (B,T,C) means B*T*C contiguous floats, C fastest.
//  * Backward functions ACCUMULATE (+=) into every gradient they write, both
//    parameter and input gradients; the caller zeroes them. This makes micro-batch
//    gradient accumulation and residual branches free. Where an input gradient is
//    usually a fresh buffer, an Out::overwrite argument writes it (=) instead,
//    which spares the caller a pass to zero it.
//  * Deterministic: the same inputs give the same bits, whatever else runs.
//  * Preconditions (sizes > 0 where required, non-null pointers) are checked
//    with TROUPE_CHECK.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/kernels.hpp"

namespace troupe::kernels::cpu {

// How a backward kernel writes an input gradient (kernels/kernels.hpp).
using Out = kernels::Out;

// ---------------------------------------------------------------- GEMM
// Row-major C(M,N) = alpha * op(A) * op(B) + beta * C, op(X) = X or X^T.
// A is (M,K) or, transposed, (K,M); B is (K,N) or, transposed, (N,K).
// lda/ldb/ldc are row strides in elements. The fastest available path is used
// (see gemm.cpp); the result does not depend on which thread calls it.
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc);

// C(M,N) = alpha * op(A) * op(B) + bias(N) broadcast over rows; C is only written.
// The same bits as filling C's rows with bias and calling gemm() with beta = 1, in
// one pass over C instead of two.
void gemm_bias(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
               const float* B, int ldb, const float* bias, float* C, int ldc);

// The GEMM path in use, for benchmarks and logs: the forced backend ("avx512", "openblas",
// "dnnl" under TROUPE_GEMM), else "measured per shape: avx512 dnnl openblas" (the candidates).
const char* gemm_backend();

// ---------------------------------------------------------------- linear
// out(N,OC) = inp(N,IC) @ weight(OC,IC)^T + bias(OC). bias may be null.
void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int IC,
                    int OC);
// dinp(N,IC) += dout @ weight (= with Out::overwrite);  dweight(OC,IC) += dout^T @ inp;
// dbias(OC) += sum_n dout. Any of dinp, dweight, dbias may be null (not needed).
void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int IC, int OC, Out dinp_mode = Out::accumulate);

// 16-bit operands, f32 accumulation and results (mixed precision): inp and weight are
// bit patterns of dt (bf16 or f16), through gemm_half (kernels/cpu/gemm_half.hpp).
void linear_forward_h(DType dt, float* out, const uint16_t* inp, const uint16_t* weight, const float* bias,
                      int N, int IC, int OC);
// dout is rounded to dt into dout_h(N,OC) (scratch the caller owns); then
// dinp(N,IC) (+)= dout_h @ weight, dweight(OC,IC) += dout_h^T @ inp (f32), and
// dbias(OC) += sum_n dout (the f32 dout). dinp, dweight, dbias may be null.
void linear_backward_h(DType dt, float* dinp, float* dweight, float* dbias, const float* dout,
                       uint16_t* dout_h, const uint16_t* inp, const uint16_t* weight, int N, int IC, int OC,
                       Out dinp_mode = Out::accumulate);

// ---------------------------------------------------------------- embedding
// out(B,T,C) = wte[tokens[b,t]] + wpe[t]. tokens in [0,V). wpe may be null (MLP model).
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                       int C, int V);
// dwte(V,C) += scatter of dout by token; dwpe(T,C) += sum over b. dwpe may be null.
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                        int C, int V);

// ---------------------------------------------------------------- layernorm
// out(N,C) = (inp - mean) * rstd * weight + bias; saves mean(N), rstd(N). eps = 1e-5.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C);

// ---------------------------------------------------------------- attention
// Causal multi-head self-attention core (no projections), grouped-query when NKV < NH,
// fused (flash_attention.cpp): nothing of size T x T is ever stored.
// qkv(B,T,(NH+2*NKV)*HS): for each token, NH heads of q, then NKV heads of k, then NKV
// heads of v; query head h attends with key/value head h / (NH/NKV). NKV = 0 means NH
// (GPT: qkv(B,T,3*NH*HS)). out(B,T,NH*HS); lse(B,NH,T) saves each query's log-sum-exp of
// its scaled scores (scale = 1/sqrt(HS)), the one statistic the backward needs.
void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int NH, int HS, int NKV = 0);
// Checks attention's shapes (every size positive, NKV dividing NH) and returns NKV, with 0
// resolved to NH. Every kernel set's attention starts with it.
int attention_kv_heads(int B, int T, int NH, int HS, int NKV);
// dqkv(B,T,(NH+2*NKV)*HS) += (= with Out::overwrite) from dout(B,T,NH*HS); out and lse are
// the forward's. The probabilities are recomputed block by block from q, k and lse.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                        int B, int T, int NH, int HS, Out mode = Out::accumulate, int NKV = 0);
// 16 bits (mixed precision): qkv and out are bit patterns of dt (bf16 or f16); scores,
// statistics and sums are f32, the probabilities (and in the backward dout and the score
// gradients) are rounded to dt before the products that read them. dqkv and dout are f32.
void attention_forward_h(DType dt, uint16_t* out, float* lse, const uint16_t* qkv, int B, int T, int NH,
                         int HS, int NKV = 0);
void attention_backward_h(DType dt, float* dqkv, const float* dout, const uint16_t* qkv, const uint16_t* out,
                          const float* lse, int B, int T, int NH, int HS, Out mode = Out::accumulate,
                          int NKV = 0);

// The materialized path (attention.cpp), the tests' reference: att(B,NH,T,T) saves the
// softmax probabilities (upper triangle zero); scratch(B,NH,T,T) is workspace.
void attention_materialized_forward(float* out, float* att, const float* qkv, int B, int T, int NH, int HS,
                                    int NKV = 0);
void attention_materialized_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                                     const float* att, int B, int T, int NH, int HS,
                                     Out mode = Out::accumulate, int NKV = 0);

// ---------------------------------------------------------------- llama layers
// RMSNorm over C: out(N,C) = inp * rstd * weight, rstd(N) = 1/sqrt(mean(inp^2) + eps) saved.
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps);
// dinp(N,C) += dL/dinp; dweight(C) +=.
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int N, int C);
// Rotary position embeddings, in place, on heads [0, n_heads) at the start of each of the
// B*T rows of x (row stride ld floats, head h at h*HS): in the head of position t, channel
// pair (i, i + HS/2) turns by t * inv_freq[i] (Hugging Face's rotate_half layout). inv_freq
// (HS/2, host memory) is model::rope_inv_freq's table: theta^(-2i/HS), maybe llama3-scaled.
void rope_forward(float* x, int B, int T, int n_heads, int HS, int ld, const float* inv_freq);
// The transpose (inverse rotation), in place: dL/d(rotated) -> dL/d(input).
void rope_backward(float* dx, int B, int T, int n_heads, int HS, int ld, const float* inv_freq);
// SwiGLU: out(N,F) = silu(gate) * up over gu(N,2F), each row gate(F) | up(F).
void swiglu_forward(float* out, const float* gu, int N, int F);
// dgu(N,2F) = dL/dgu (overwritten).
void swiglu_backward(float* dgu, const float* dout, const float* gu, int N, int F);
// Vocabulary-parallel embedding over the shard of rows [v0, v0 + Vl) of the vocabulary,
// wte(Vl,C): out(N,C) = wte[token - v0], zero for tokens outside the shard (a sum over
// the shards completes it). Backward: dwte += dout rows of the shard's tokens.
void embedding_rows_forward(float* out, const int32_t* tokens, const float* wte, int N, int C, int v0,
                            int Vl);
void embedding_rows_backward(float* dwte, const float* dout, const int32_t* tokens, int N, int C, int v0,
                             int Vl);
// Vocabulary-parallel cross-entropy, the shard's part: for logits(N,Vl) of vocabulary
// columns [v0, v0 + Vl), per row its max, sum of e^(l - max), and the target's logit
// (0 when the target is another shard's). Combined over shards: lse = M + log(sum_r
// s_r e^(m_r - M)), M = max_r m_r, and a row's loss is lse - target logit.
void cross_entropy_stats(float* row_max, float* row_sum_exp, float* target_logit, const float* logits,
                         const int32_t* targets, int N, int Vl, int v0);
// dlogits(N,Vl) = (e^(l - lse) - onehot(target)) * dloss, overwritten; lse(N) combined.
void cross_entropy_shard_backward(float* dlogits, const float* logits, const int32_t* targets,
                                  const float* lse, int N, int Vl, int v0, float dloss);

// ---------------------------------------------------------------- GELU (tanh form)
void gelu_forward(float* out, const float* inp, size_t n);
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n);  // dinp += gelu'(inp) * dout
// d(n) = gelu'(inp) * d: the gradient after GELU becomes the one before it, in place.
void gelu_backward_inplace(float* d, const float* inp, size_t n);

// ---------------------------------------------------------------- element-wise
void residual_forward(float* out, const float* a, const float* b, size_t n);  // out = a + b
void add_inplace(float* y, const float* x, size_t n);                         // y += x
void scale_inplace(float* y, float s, size_t n);                              // y *= s

// ---------------------------------------------------------------- 16-bit outputs
// The forwards above with their output rounded to dt (bf16 or f16) as it is made
// (half_outputs.cpp): the bits of the fp32 kernel followed by to_half, the statistics
// (mean, rstd) f32 as before; for the outputs mixed precision keeps for a linear.
void layernorm_forward_h(DType dt, uint16_t* out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int N, int C);
void rmsnorm_forward_h(DType dt, uint16_t* out, float* rstd, const float* inp, const float* weight, int N,
                       int C, float eps);
void gelu_forward_h(DType dt, uint16_t* out, const float* inp, size_t n);
void swiglu_forward_h(DType dt, uint16_t* out, const float* gu, int N, int F);

// ---------------------------------------------------------------- loss
// Softmax cross-entropy over logits(N,V) with targets(N) in [0,V).
// Returns the SUM of the N per-row losses (in double, for determinism across layouts).
// If dlogits(N,V) is non-null, dlogits += (softmax - onehot) * dloss, where dloss is
// the gradient of the final loss with respect to each row's loss (e.g. 1/(B*T)).
double cross_entropy(float* dlogits, const float* logits, const int32_t* targets, int N, int V, float dloss);

// ---------------------------------------------------------------- optimizer
// One AdamW step with PyTorch semantics (torch.optim.AdamW):
//   p *= 1 - lr*weight_decay;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2;
//   p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
// t is the 1-based step count. Pass weight_decay = 0 for parameters that are not decayed.
void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int64_t t);

// adamw_update's scalar factors for step t (1-based), checked and formed in double, each
// rounded once: decay = 1 - lr*weight_decay, step_size = lr / (1 - beta1^t), bc2_sqrt =
// sqrt(1 - beta2^t). Every kernel set's AdamW uses these.
struct AdamWScalars {
  float decay, step_size, bc2_sqrt;
};
AdamWScalars adamw_scalars(float lr, float beta1, float beta2, float weight_decay, int64_t t);

// Sum of squares of x(n), accumulated in double (for global-norm clipping).
double sum_squares(const float* x, size_t n);

}  // namespace troupe::kernels::cpu

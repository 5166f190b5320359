// Embeddings (token + position; the vocabulary-parallel rows of Llama) and the softmax
// cross-entropy losses. Token and target ids are checked on the device first (a bad one
// throws naming it, as the CPU twin does): no kernel reads outside its tables. Scatters
// into an embedding gradient run one thread per channel over the positions in order, so a
// token that repeats adds up in the CPU twin's order.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.cuh"

namespace troupe::kernels::cuda {

namespace {

using detail::grid_for;
using detail::kThreads;
using detail::stream;

__global__ void k_embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                                    int T, int C, size_t n) {
  TROUPE_GRID_STRIDE(i, n) {
    const size_t bt = i / C;
    const int c = int(i % C);
    const float e = wte[size_t(tokens[bt]) * C + c];
    out[i] = wpe ? e + wpe[size_t(bt % T) * C + c] : e;
  }
}

// One thread per channel c: dwte[token] += dout over positions (b,t) in order.
__global__ void k_embedding_backward_wte(float* dwte, const float* dout, const int32_t* tokens, size_t N,
                                         int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (size_t bt = 0; bt < N; ++bt) dwte[size_t(tokens[bt]) * C + c] += dout[bt * C + c];
}

// One thread per (t,c): dwpe[t] += dout over b in order.
__global__ void k_embedding_backward_wpe(float* dwpe, const float* dout, int B, int T, int C) {
  TROUPE_GRID_STRIDE(i, size_t(T) * C) {
    const size_t t = i / C, c = i % C;
    float acc = dwpe[i];
    for (int b = 0; b < B; ++b) acc += dout[(size_t(b) * T + t) * C + c];
    dwpe[i] = acc;
  }
}

__global__ void k_embedding_rows_forward(float* out, const int32_t* tokens, const float* wte, int C, int v0,
                                         int Vl, size_t n) {
  TROUPE_GRID_STRIDE(i, n) {
    const size_t row = i / C;
    const int c = int(i % C);
    const int64_t r = int64_t{tokens[row]} - v0;
    out[i] = r >= 0 && r < Vl ? wte[size_t(r) * C + c] : 0.0f;
  }
}

__global__ void k_embedding_rows_backward(float* dwte, const float* dout, const int32_t* tokens, int N, int C,
                                          int v0, int Vl) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int n = 0; n < N; ++n) {
    const int64_t r = int64_t{tokens[n]} - v0;
    if (r >= 0 && r < Vl) dwte[size_t(r) * C + c] += dout[size_t(n) * C + c];
  }
}

// The block's row l(V): its max and the sum of e^(l - max), every thread getting both.
struct RowStats {
  float max, sum_exp;
};
__device__ RowStats row_stats(const float* l, int V, float* shared) {
  float mx = -INFINITY;
  for (int v = threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, l[v]);
  mx = detail::block_reduce(mx, shared, detail::Max{});
  float se = 0.0f;
  for (int v = threadIdx.x; v < V; v += blockDim.x) se += expf(l[v] - mx);
  return {mx, detail::block_reduce(se, shared, detail::Sum{})};
}

// One block per row: the row's loss into losses(N) (double), and dlogits += (softmax - onehot) * dloss.
__global__ void k_cross_entropy(float* dlogits, double* losses, const float* logits, const int32_t* targets,
                                int V, float dloss) {
  __shared__ float shared[kThreads];
  const size_t row = blockIdx.x;
  const float* l = logits + row * V;
  const auto [mx, se] = row_stats(l, V, shared);
  const int y = targets[row];
  if (threadIdx.x == 0) losses[row] = log(double(se)) + double(mx) - double(l[y]);
  if (dlogits) {
    float* dl = dlogits + row * V;
    const float s = (1.0f / se) * dloss;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
      float g = dl[v] + expf(l[v] - mx) * s;
      if (v == y) g -= dloss;
      dl[v] = g;
    }
  }
}

__global__ void k_sum_rows(const double* losses, int N, double* out) {
  __shared__ double shared[kThreads];
  double acc = 0.0;
  for (int i = threadIdx.x; i < N; i += blockDim.x) acc += losses[i];
  acc = detail::block_reduce(acc, shared, detail::Sum{});
  if (threadIdx.x == 0) *out = acc;
}

__global__ void k_cross_entropy_stats(float* row_max, float* row_sum_exp, float* target_logit,
                                      const float* logits, const int32_t* targets, int Vl, int v0) {
  __shared__ float shared[kThreads];
  const size_t row = blockIdx.x;
  const float* l = logits + row * Vl;
  const auto [mx, se] = row_stats(l, Vl, shared);
  if (threadIdx.x == 0) {
    row_max[row] = mx;
    row_sum_exp[row] = se;
    const int64_t r = int64_t{targets[row]} - v0;
    target_logit[row] = r >= 0 && r < Vl ? l[r] : 0.0f;
  }
}

__global__ void k_cross_entropy_shard_backward(float* dlogits, const float* logits, const int32_t* targets,
                                               const float* lse, int Vl, int v0, float dloss, size_t n) {
  TROUPE_GRID_STRIDE(i, n) {
    const size_t row = i / Vl;
    const int v = int(i % Vl);
    float g = expf(logits[i] - lse[row]) * dloss;
    if (int64_t{targets[row]} - v0 == v) g -= dloss;
    dlogits[i] = g;
  }
}

void check_rows(int N, int C, int v0, int Vl) {
  TROUPE_CHECK(N > 0 && C > 0 && v0 >= 0 && Vl > 0, "embedding rows: N=", N, " C=", C, " v0=", v0,
               " Vl=", Vl);
}

}  // namespace

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                       int C, int V) {
  TROUPE_CHECK(B > 0 && T > 0 && C > 0 && V > 0, "B=", B, " T=", T, " C=", C, " V=", V);
  TROUPE_CHECK(out && tokens && wte, "null tensor");
  detail::check_range(tokens, size_t(B) * T, V, "token", " at ");
  const size_t n = size_t(B) * T * C;
  k_embedding_forward<<<grid_for(n), kThreads, 0, stream()>>>(out, tokens, wte, wpe, T, C, n);
  TROUPE_CUDA_LAUNCHED();
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                        int C, int V) {
  TROUPE_CHECK(B > 0 && T > 0 && C > 0 && V > 0, "B=", B, " T=", T, " C=", C, " V=", V);
  TROUPE_CHECK(dwte && dout && tokens, "null tensor");
  detail::check_range(tokens, size_t(B) * T, V, "token", " at ");
  k_embedding_backward_wte<<<detail::column_blocks(C), kThreads, 0, stream()>>>(dwte, dout, tokens,
                                                                                size_t(B) * T, C);
  TROUPE_CUDA_LAUNCHED();
  if (dwpe) {
    k_embedding_backward_wpe<<<grid_for(size_t(T) * C), kThreads, 0, stream()>>>(dwpe, dout, B, T, C);
    TROUPE_CUDA_LAUNCHED();
  }
}

void embedding_rows_forward(float* out, const int32_t* tokens, const float* wte, int N, int C, int v0,
                            int Vl) {
  check_rows(N, C, v0, Vl);
  TROUPE_CHECK(out && tokens && wte, "null tensor");
  const size_t n = size_t(N) * C;
  k_embedding_rows_forward<<<grid_for(n), kThreads, 0, stream()>>>(out, tokens, wte, C, v0, Vl, n);
  TROUPE_CUDA_LAUNCHED();
}

void embedding_rows_backward(float* dwte, const float* dout, const int32_t* tokens, int N, int C, int v0,
                             int Vl) {
  check_rows(N, C, v0, Vl);
  TROUPE_CHECK(dwte && dout && tokens, "null tensor");
  k_embedding_rows_backward<<<detail::column_blocks(C), kThreads, 0, stream()>>>(dwte, dout, tokens, N, C, v0,
                                                                                 Vl);
  TROUPE_CUDA_LAUNCHED();
}

double cross_entropy(float* dlogits, const float* logits, const int32_t* targets, int N, int V, float dloss) {
  TROUPE_CHECK(N > 0 && V > 0, "N=", N, " V=", V);
  TROUPE_CHECK(logits && targets, "null tensor");
  detail::check_range(targets, size_t(N), V, "target", " of row ");
  detail::Scratch losses((size_t(N) + 1) * sizeof(double));
  double* l = losses.as<double>();
  k_cross_entropy<<<unsigned(N), kThreads, 0, stream()>>>(dlogits, l, logits, targets, V, dloss);
  TROUPE_CUDA_LAUNCHED();
  k_sum_rows<<<1, kThreads, 0, stream()>>>(l, N, l + N);
  TROUPE_CUDA_LAUNCHED();
  double total = 0.0;
  TROUPE_CUDA_CHECK(cudaMemcpyAsync(&total, l + N, sizeof total, cudaMemcpyDeviceToHost, stream()));
  TROUPE_CUDA_CHECK(cudaStreamSynchronize(stream()));
  return total;
}

void cross_entropy_stats(float* row_max, float* row_sum_exp, float* target_logit, const float* logits,
                         const int32_t* targets, int N, int Vl, int v0) {
  TROUPE_CHECK(N > 0 && Vl > 0 && v0 >= 0, "cross-entropy stats: N=", N, " Vl=", Vl, " v0=", v0);
  TROUPE_CHECK(row_max && row_sum_exp && target_logit && logits && targets, "null tensor");
  k_cross_entropy_stats<<<unsigned(N), kThreads, 0, stream()>>>(row_max, row_sum_exp, target_logit, logits,
                                                                targets, Vl, v0);
  TROUPE_CUDA_LAUNCHED();
}

void cross_entropy_shard_backward(float* dlogits, const float* logits, const int32_t* targets,
                                  const float* lse, int N, int Vl, int v0, float dloss) {
  TROUPE_CHECK(N > 0 && Vl > 0 && v0 >= 0, "cross-entropy backward: N=", N, " Vl=", Vl, " v0=", v0);
  TROUPE_CHECK(dlogits && logits && targets && lse, "null tensor");
  const size_t n = size_t(N) * Vl;
  k_cross_entropy_shard_backward<<<grid_for(n), kThreads, 0, stream()>>>(dlogits, logits, targets, lse, Vl,
                                                                         v0, dloss, n);
  TROUPE_CUDA_LAUNCHED();
}

}  // namespace troupe::kernels::cuda

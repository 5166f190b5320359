// kernels::cuda_kernels(): the functions of kernels/cuda/ as a kernels::Kernels table.
#include "kernels/cuda/cuda.hpp"
#include "kernels/cuda/kernels.cuh"

namespace troupe::kernels {

namespace {

Kernels make_cuda_table() {
  Kernels k;
  k.name = "cuda";
  k.device = Device::cuda;
  k.linear_forward = &cuda::linear_forward;
  k.linear_backward = &cuda::linear_backward;
  k.linear_forward_h = &cuda::linear_forward_h;
  k.linear_backward_h = &cuda::linear_backward_h;
  k.to_half = &cuda::to_half;
  k.embedding_forward = &cuda::embedding_forward;
  k.embedding_backward = &cuda::embedding_backward;
  k.layernorm_forward = &cuda::layernorm_forward;
  k.layernorm_backward = &cuda::layernorm_backward;
  k.attention_forward = &cuda::attention_forward;
  k.attention_backward = &cuda::attention_backward;
  k.rmsnorm_forward = &cuda::rmsnorm_forward;
  k.rmsnorm_backward = &cuda::rmsnorm_backward;
  k.rope_forward = &cuda::rope_forward;
  k.rope_backward = &cuda::rope_backward;
  k.swiglu_forward = &cuda::swiglu_forward;
  k.swiglu_backward = &cuda::swiglu_backward;
  k.embedding_rows_forward = &cuda::embedding_rows_forward;
  k.embedding_rows_backward = &cuda::embedding_rows_backward;
  k.cross_entropy_stats = &cuda::cross_entropy_stats;
  k.cross_entropy_shard_backward = &cuda::cross_entropy_shard_backward;
  k.gelu_forward = &cuda::gelu_forward;
  k.gelu_backward = &cuda::gelu_backward;
  k.gelu_backward_inplace = &cuda::gelu_backward_inplace;
  k.residual_forward = &cuda::residual_forward;
  k.add_inplace = &cuda::add_inplace;
  k.scale_inplace = &cuda::scale_inplace;
  k.cross_entropy = &cuda::cross_entropy;
  k.adamw_update = &cuda::adamw_update;
  k.sum_squares = &cuda::sum_squares;
  return k;
}

}  // namespace

const Kernels& cuda_kernels() {
  static const Kernels table = make_cuda_table();
  return table;
}

}  // namespace troupe::kernels

// kernels::cpu_kernels(): the CPU functions of kernels/cpu/kernels.hpp (fp32, and the
// 16-bit linear of mixed precision) as a kernels::Kernels table.
#include "kernels/cpu/gemm_half.hpp"
#include "kernels/cpu/kernels.hpp"
#include "kernels/kernels.hpp"

namespace troupe::kernels {

namespace {

Kernels make_cpu_table() {
  Kernels k;
  k.name = "cpu";
  k.device = Device::cpu;
  k.linear_forward = &cpu::linear_forward;
  k.linear_backward = &cpu::linear_backward;
  k.linear_forward_h = &cpu::linear_forward_h;
  k.linear_backward_h = &cpu::linear_backward_h;
  k.to_half = &cpu::to_half;
  k.embedding_forward = &cpu::embedding_forward;
  k.embedding_backward = &cpu::embedding_backward;
  k.layernorm_forward = &cpu::layernorm_forward;
  k.layernorm_backward = &cpu::layernorm_backward;
  k.attention_forward = &cpu::attention_forward;
  k.attention_backward = &cpu::attention_backward;
  k.rmsnorm_forward = &cpu::rmsnorm_forward;
  k.rmsnorm_backward = &cpu::rmsnorm_backward;
  k.rope_forward = &cpu::rope_forward;
  k.rope_backward = &cpu::rope_backward;
  k.swiglu_forward = &cpu::swiglu_forward;
  k.swiglu_backward = &cpu::swiglu_backward;
  k.embedding_rows_forward = &cpu::embedding_rows_forward;
  k.embedding_rows_backward = &cpu::embedding_rows_backward;
  k.cross_entropy_stats = &cpu::cross_entropy_stats;
  k.cross_entropy_shard_backward = &cpu::cross_entropy_shard_backward;
  k.gelu_forward = &cpu::gelu_forward;
  k.gelu_backward = &cpu::gelu_backward;
  k.gelu_backward_inplace = &cpu::gelu_backward_inplace;
  k.residual_forward = &cpu::residual_forward;
  k.add_inplace = &cpu::add_inplace;
  k.scale_inplace = &cpu::scale_inplace;
  k.cross_entropy = &cpu::cross_entropy;
  k.adamw_update = &cpu::adamw_update;
  k.sum_squares = &cpu::sum_squares;
  return k;
}

}  // namespace

const Kernels& cpu_kernels() {
  static const Kernels table = make_cpu_table();
  return table;
}

}  // namespace troupe::kernels

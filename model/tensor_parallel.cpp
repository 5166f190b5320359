#include "model/tensor_parallel.hpp"

#include "comm/communicator.hpp"
#include "core/error.hpp"

namespace troupe::model {

TensorGroup::TensorGroup(const TensorShard& s, comm::Communicator* c) : shard(s), comm(c) {
  TROUPE_CHECK(shard.size >= 1 && shard.rank >= 0 && shard.rank < shard.size, "tensor shard ", shard.rank,
               " outside a group of ", shard.size);
  if (shard.size == 1) return;
  TROUPE_CHECK(comm != nullptr, "tensor parallelism ", shard.size, " needs a communicator for the group");
  TROUPE_CHECK(comm->size() == shard.size && comm->rank() == shard.rank, "tensor shard ", shard.rank, "/",
               shard.size, " given the communicator of rank ", comm->rank(), "/", comm->size(), " (group '",
               comm->group(), "')");
}

void copy_to_tensor_region_forward(const TensorGroup&, const Tensor&) {}

void copy_to_tensor_region_backward(const TensorGroup& g, float* dx, size_t n) {
  if (g.size() > 1) g.comm->allreduce(dx, n, comm::ReduceOp::sum);
}

void reduce_from_tensor_region_forward(const TensorGroup& g, float* y, size_t n) {
  if (g.size() > 1) g.comm->allreduce(y, n, comm::ReduceOp::sum);
}

void reduce_from_tensor_region_backward(const TensorGroup&, const float*, size_t) {}

double tensor_parallel_grad_sum_squares(const TensorGroup& g, const std::vector<Param>& params,
                                        const kernels::Kernels& k) {
  double split = 0, replicated = 0;
  for (const Param& p : params) {
    if (p.tied_copy) continue;
    const double s = k.sum_squares(p.grad.f32(), static_cast<size_t>(p.grad.numel()));
    (p.split_dim >= 0 ? split : replicated) += s;
  }
  if (g.size() > 1) g.comm->allreduce(&split, 1, comm::ReduceOp::sum);
  return split + replicated;
}

}  // namespace troupe::model

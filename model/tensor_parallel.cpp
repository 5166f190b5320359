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

void copy_to_tensor_region_forward(const TensorGroup&, const float*, size_t) {}

void copy_to_tensor_region_backward(const TensorGroup& g, float* dx, size_t n) {
  if (g.size() > 1) g.comm->allreduce(dx, n, comm::ReduceOp::sum);
}

void reduce_from_tensor_region_forward(const TensorGroup& g, float* y, size_t n) {
  if (g.size() > 1) g.comm->allreduce(y, n, comm::ReduceOp::sum);
}

void reduce_from_tensor_region_backward(const TensorGroup&, const float*, size_t) {}

}  // namespace troupe::model

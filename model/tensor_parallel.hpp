// Tensor-parallel communication of a stage's layers (Megatron style), as
// forward/backward pairs named after the region they guard:
//
//   replicated x ─copy_to_tensor_region─> column-parallel linear (rows of W on each shard)
//     ─> per-shard activations (heads / hidden units) ─> row-parallel linear (columns of W)
//     ─reduce_from_tensor_region─> replicated y (+ the bias, once)
//
//   copy_to_tensor_region      forward: identity      backward: allreduce-sum of dL/dx
//   reduce_from_tensor_region  forward: allreduce-sum  backward: identity
//
// Each shard's column-parallel linear sees only its rows, so its dL/dx is a partial
// sum over the shard's outputs; the allreduce completes it. Each row-parallel
// linear's output is a partial sum over the shard's inputs; the allreduce completes
// it, and dL/dy is already whole on every shard. After either allreduce every shard
// holds the same bits, so replicated parameters (layernorms, row-parallel biases,
// embeddings, ln_f) receive the same gradients on every shard.
//
// With size 1 every function does nothing and needs no communicator.
#pragma once

#include <cstddef>
#include <vector>

#include "kernels/kernels.hpp"
#include "model/config.hpp"
#include "model/params.hpp"

namespace troupe::comm {
class Communicator;
}

namespace troupe::model {

// The tensor-parallel group a stage talks through: its shard and the communicator of
// the group (rank == shard.rank, size == shard.size; null when size == 1). Not owned.
struct TensorGroup {
  TensorShard shard;
  comm::Communicator* comm = nullptr;

  TensorGroup() = default;
  // Throws troupe::Error when size > 1 and the communicator is missing or disagrees
  // with the shard.
  TensorGroup(const TensorShard& shard, comm::Communicator* comm);
  int size() const { return shard.size; }
};

// x(n) enters a column-parallel linear.
void copy_to_tensor_region_forward(const TensorGroup& g, const Tensor& x);
// dx(n): on entry this shard's partial dL/dx, on return the sum over shards.
void copy_to_tensor_region_backward(const TensorGroup& g, float* dx, size_t n);

// y(n): on entry this shard's partial output of a row-parallel linear, on return the sum.
void reduce_from_tensor_region_forward(const TensorGroup& g, float* y, size_t n);
// dy(n) is already whole on every shard.
void reduce_from_tensor_region_backward(const TensorGroup& g, const float* dy, size_t n);

// Sum of squares of the gradients of the whole model part these shards hold, for
// global-norm clipping: split parameters (split_dim >= 0) summed over the shards, plus
// replicated ones counted once (they are the same on every shard). A tied copy
// (Param::tied_copy) is left out: the weight counts once, on the embedding's stage.
// Accumulated in double in parameter order; collective over the group, same bits on
// every shard. `k` computes the per-parameter sums.
double tensor_parallel_grad_sum_squares(const TensorGroup& g, const std::vector<Param>& params,
                                        const kernels::Kernels& k = kernels::cpu_kernels());

}  // namespace troupe::model

// Element-wise reductions shared by the CPU backends.
#pragma once

#include <cstddef>
#include <vector>

#include "comm/communicator.hpp"

namespace troupe::comm {

// out[i] = a[i] (op) b[i] for n elements; avg reduces as sum (see divide_by).
// out may alias a or b. bf16 / f16: each element is computed in f32 and rounded
// back (round to nearest even): a chain of these rounds once per step.
void reduce_into(DType dtype, ReduceOp op, void* out, const void* a, const void* b, size_t n);
// data[i] /= divisor: the second half of an average.
void divide_by(DType dtype, void* data, size_t n, int divisor);

// out(n) <- ins[0] (op) ins[1] (op) ... in that order, divided by ins.size() for avg.
// out may alias ins[0]. For f32, f64 and the integers this is reduce_into over the
// inputs in order, then divide_by; bf16 / f16 accumulate in f32 and round once.
void reduce_all(DType dtype, ReduceOp op, void* out, const std::vector<const void*>& ins, size_t n);

}  // namespace troupe::comm

// Element-wise reductions shared by the CPU backends.
#pragma once

#include <cstddef>

#include "comm/communicator.hpp"

namespace troupe::comm {

// out[i] = a[i] (op) b[i] for n elements; avg reduces as sum (see divide_by).
// out may alias a or b.
void reduce_into(DType dtype, ReduceOp op, void* out, const void* a, const void* b, size_t n);
// data[i] /= divisor: the second half of an average.
void divide_by(DType dtype, void* data, size_t n, int divisor);

}  // namespace troupe::comm

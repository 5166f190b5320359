// ZeRO stages 1 and 2 (DeepSpeed; Megatron's distributed optimizer): the optimizer state
// partitioned over the data-parallel group instead of replicated.
//
// Over a data group of dp ranks, rank d owns a 1/dp part of EVERY bucket of each stage's
// flat buffer (the buckets of data_parallel.hpp, cut from the end), as Megatron shards
// each bucket: the collective of a bucket then moves 1/dp of it per rank, and a rank's
// share is spread over the whole model, so it holds a part of nearly every parameter.
//   bucket of 10 floats, dp = 3: parts of ceil(10/3) = 4: d0 [0,4), d1 [4,8), d2 [8,10)
//
// Stage 1: the gradients are all-reduced as without ZeRO; each rank runs AdamW only on
// the pieces of parameters inside its parts (ZeroPartition::refs), so m and v cost
// 8 bytes per parameter / dp instead of 8; then allgather_params brings every rank's
// updated parts to everyone.
// Stage 2: reduce_scatter_grads replaces the all-reduce: each rank receives only the sum
// of its own parts and releases the rest of each bucket (zeroed, its whole pages handed
// back to the system: they hold no memory until the next backward writes them). The
// engine reduce-scatters every micro-batch's backward bucket by bucket as it finishes
// (an owner's part accumulates the sums; everyone else's rest starts from zero again),
// so between the buckets of a backward a rank holds its parts and the buckets in flight,
// not the whole gradient. Norms and clipping run on refs(), whose squared sums the caller
// adds up over the data group.
//
// Every rank of the group cuts the same buckets of the same buffers and calls these in
// the same order: the collectives are per bucket, never per piece.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "comm/communicator.hpp"
#include "model/stage.hpp"
#include "parallel/data_parallel.hpp"
#include "parallel/optimizer.hpp"

namespace troupe::parallel {

// Rank d's part [begin, end) of a bucket of `count` floats, relative to the bucket's start:
// parts of ceil(count/dp), the last shorter or empty. Every element is in exactly one part.
//   count 10, dp 4: [0,3) [3,6) [6,9) [9,10);  count 5, dp 4: [0,2) [2,4) [4,5) [5,5)
std::pair<size_t, size_t> bucket_part(size_t count, int dp, int d);

// The buckets [begin, end) of a flat buffer of n floats, as reduce_buckets and BucketReducer
// cut them, in the order they go (last first).
//   n 10, bucket 4: [6,10) [2,6) [0,2)
std::vector<std::pair<size_t, size_t>> buckets_of(size_t n, size_t bucket);

// Sum over `group` of every rank's g[0, count); rank d's part of g (bucket_part) receives
// the sum, the rest of g is released (Allocator::release of g's allocator: zero, its whole
// pages handed back to the system). One reduce_scatter of ceil(count/dp) per rank (padded
// with zeros in scratch when count % dp != 0). A group of one: nothing to do.
void reduce_scatter_bucket(comm::Communicator& group, float* g, size_t count, std::vector<float>& scratch,
                           const comm::Options& opt, Allocator& alloc = cpu_allocator());
// Every rank's part of x[0, count) to everyone: afterwards x holds all parts (one allgather
// of ceil(count/dp) per rank; what x held outside this rank's part is overwritten).
void allgather_bucket(comm::Communicator& group, float* x, size_t count, std::vector<float>& scratch,
                      const comm::Options& opt);

// This data-parallel rank's share of the flat buffers of its stages: the pieces of
// parameters inside its parts of every bucket (padding between parameters excluded), in
// flat order per stage, stages in the order given. Pieces of one parameter that follow
// each other are one piece (dp = 1: one piece per parameter, the plain optimizer).
//   a stage of params p0 [0,6) p1 [16,20) (padding [6,16)), one bucket, dp 2: parts
//   [0,10) [10,20); rank 0: {p0 off 0 len 6}; rank 1: {p1 off 0 len 4}
// The stages must outlive the partition; a tied copy of the embedding (Param::tied_copy)
// is a parameter like the others here.
class ZeroPartition {
 public:
  struct Piece {
    size_t stage = 0;   // index into the stages given
    size_t param = 0;   // index into stages[stage]->params()
    size_t flat = 0;    // first float in the stage's flat buffers
    size_t offset = 0;  // first float within the parameter (row-major local tensor)
    size_t len = 0;
  };

  ZeroPartition(const std::vector<model::Stage*>& stages, int dp, int d, size_t bucket_floats);

  const std::vector<Piece>& pieces() const { return pieces_; }
  // One ParamRef per piece (name = the parameter's name, data/grad = the piece's floats,
  // decay = the parameter's): what AdamW, clip_grads and grad_sum_squares run on.
  // AdamW(spec, refs()).m(i) is piece i's first moment.
  std::vector<ParamRef> refs() const;
  // Floats of optimizer state this rank holds per moment (sum of piece lengths).
  size_t owned_floats() const { return owned_floats_; }
  int dp() const { return dp_; }
  int rank() const { return d_; }
  size_t bucket_floats() const { return bucket_floats_; }

  // Stage 2 after the backward: reduce_scatter_bucket over every bucket of every stage's
  // flat gradients.
  void reduce_scatter_grads(comm::Communicator& group, const comm::Options& opt);
  // Stage 2 before a step: every stage's flat gradients zeroed by Allocator::release (a
  // memset would make every page resident again).
  void release_grads();
  // After the optimizer step: allgather_bucket over every bucket of every stage's flat
  // parameters (the caller refreshes the compute copies afterwards).
  void allgather_params(comm::Communicator& group, const comm::Options& opt);

  // Checkpoints store moments as slices of the full tensors: each rank writes local indices
  // [begin, end) along `dim` of some parameters (checkpoint::spread decides which;
  // copy_block's layout). Collective over the group (every dp rank calls it, each with its
  // own wants): moments are all-gathered bucket by bucket through one bucket of scratch
  // (never the full moments), and each want is filled from them.
  //   p (4, 6), dim 1, [2, 5): m holds 4 x 3 floats, row r = p's m[r][2..5)
  struct MomentPart {
    size_t stage = 0, param = 0;
    int dim = 0;
    int64_t begin = 0, end = 0;
    float* m = nullptr;  // (end-begin) x (the other dims) floats, copy_block layout
    float* v = nullptr;
  };
  void gather_moment_parts(comm::Communicator& group, const AdamW& opt, const std::vector<MomentPart>& want,
                           const comm::Options& opt_comm) const;
  // Resume: the full local moments of one parameter (read from a checkpoint) -> the pieces
  // this rank owns of it.
  void load_param_moments(size_t stage, size_t param, const float* m_full, const float* v_full,
                          AdamW& opt) const;

 private:
  // Where a parameter lies in its stage's flat buffers.
  struct Span {
    size_t flat = 0, numel = 0;
  };

  std::vector<model::Stage*> stages_;
  int dp_ = 1, d_ = 0;
  size_t bucket_floats_ = 0;
  std::vector<std::vector<Span>> spans_;  // [stage][param]
  std::vector<Piece> pieces_;
  size_t owned_floats_ = 0;
  std::vector<float> scratch_;  // padded buckets of reduce_scatter_grads / allgather_params
};

}  // namespace troupe::parallel

// Data-parallel gradient reduction: each replica's backward scales its share by
// 1/(global tokens), so the SUM over the data group of the flat gradient buffers is
// the mean gradient of the global batch.
//
// Buckets: fixed-size runs cut from the END of the flat buffer, so the first bucket
// complete during backward (which walks the buffer from its end, Stage::backward's
// on_ready) is the first to go; the partial one is [0, n mod size). The overlapped
// and the post-backward reductions cut the same buckets, so every element sees the
// same collective and the bits do not depend on which path ran.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "comm/communicator.hpp"
#include "model/stage.hpp"

namespace troupe::parallel {

// 4 Mi floats (16 MiB): large enough to run at the link's rate, small enough to overlap.
inline constexpr size_t kDefaultBucketFloats = size_t(4) << 20;

// Where the bucket ending at `end` begins.
inline size_t bucket_begin(size_t end, size_t bucket) { return end > bucket ? end - bucket : 0; }

// Allreduces (sum) g[0, n) over `group` bucket by bucket, last bucket first, on the
// calling thread; before_bucket(k) is told which bucket goes next (progress reports).
void reduce_buckets(comm::Communicator& group, float* g, size_t n, size_t bucket, const comm::Options& opt,
                    const std::function<void(size_t k)>& before_bucket = {});

// What BucketReducer does with each bucket: sum it on every rank (allreduce), or give
// each rank the sum of its part only (reduce_scatter_bucket, parallel/zero.hpp: ZeRO
// stage 2; the buckets of backward_overlapped are buckets_of()'s, so the parts are
// ZeroPartition's).
enum class BucketCollective { allreduce, reduce_scatter };

// Reduces gradient buckets over the data-parallel group on a thread of its own
// while the engine thread runs the rest of the backward. During a step only this
// thread uses the group; the first error is kept and rethrown by wait() on the
// engine thread.
class BucketReducer {
 public:
  using clock = std::chrono::steady_clock;
  using Span = std::pair<clock::time_point, clock::time_point>;

  // alloc: the allocator of the gradients (reduce_scatter releases what a rank does not own).
  BucketReducer(comm::Communicator* group, const comm::Options& opt, size_t bucket_floats,
                BucketCollective collective = BucketCollective::allreduce,
                Allocator& alloc = cpu_allocator());
  ~BucketReducer();
  BucketReducer(const BucketReducer&) = delete;
  BucketReducer& operator=(const BucketReducer&) = delete;

  void submit(float* data, size_t count);

  // Blocks until every submitted bucket is reduced (or dropped after an error); rethrows
  // the first error. Returns the busy intervals of the buckets since the last wait.
  std::vector<Span> wait();

  // The engine thread failed mid-backward: queued buckets are dropped, and one in flight
  // is released by aborting the group (its peers learn at once; the step is lost anyway).
  void cancel() noexcept;

  // A micro-batch's backward of `stage` (the last one's; under ZeRO 2 every one's), each
  // bucket of its flat gradients handed to this reducer as soon as the backward has
  // finished writing it. Returns when the
  // backward is done; buckets may still be in flight (wait()).
  void backward_overlapped(model::Stage& stage, float dloss);

 private:
  struct Bucket {
    float* data;
    size_t count;
  };
  void run();

  comm::Communicator* group_;
  comm::Options opt_;
  size_t bucket_floats_;
  BucketCollective collective_;
  Allocator* alloc_;
  std::mutex m_;
  std::condition_variable cv_, idle_;
  std::deque<Bucket> queue_;
  bool busy_ = false, stop_ = false;
  std::exception_ptr error_;
  std::vector<Span> spans_;
  std::thread thread_;  // last: starts once the members it uses exist
};

}  // namespace troupe::parallel

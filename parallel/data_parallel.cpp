#include "parallel/data_parallel.hpp"

#include "parallel/zero.hpp"

namespace troupe::parallel {

void reduce_buckets(comm::Communicator& group, float* g, size_t n, size_t bucket, const comm::Options& opt,
                    const std::function<void(size_t k)>& before_bucket) {
  size_t k = 0;
  for (size_t end = n; end > 0; end = bucket_begin(end, bucket), ++k) {
    if (before_bucket) before_bucket(k);
    const size_t begin = bucket_begin(end, bucket);
    group.allreduce(g + begin, end - begin, comm::ReduceOp::sum, opt);
  }
}

BucketReducer::BucketReducer(comm::Communicator* group, const comm::Options& opt, size_t bucket_floats,
                             BucketCollective collective, Allocator& alloc)
    : group_(group),
      opt_(opt),
      bucket_floats_(bucket_floats),
      collective_(collective),
      alloc_(&alloc),
      thread_(&BucketReducer::run, this) {}

BucketReducer::~BucketReducer() {
  {
    std::lock_guard<std::mutex> lock(m_);
    stop_ = true;
    queue_.clear();
  }
  cv_.notify_all();
  thread_.join();
}

void BucketReducer::submit(float* data, size_t count) {
  {
    std::lock_guard<std::mutex> lock(m_);
    queue_.push_back({data, count});
  }
  cv_.notify_all();
}

std::vector<BucketReducer::Span> BucketReducer::wait() {
  std::unique_lock<std::mutex> lock(m_);
  idle_.wait(lock, [&] { return queue_.empty() && !busy_; });
  auto spans = std::move(spans_);
  spans_.clear();
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
  return spans;
}

void BucketReducer::cancel() noexcept {
  std::unique_lock<std::mutex> lock(m_);
  queue_.clear();
  if (busy_) group_->abort();
  idle_.wait(lock, [&] { return !busy_; });
  spans_.clear();
  error_ = nullptr;
}

void BucketReducer::backward_overlapped(model::Stage& st, float dloss) {
  const Tensor& flat = st.store().flat_grads();
  float* g = flat.f32();
  const size_t n = size_t(flat.numel());
  size_t ready_from = n, next_end = n;
  auto ship = [&](size_t final_from) {
    while (next_end > 0 && bucket_begin(next_end, bucket_floats_) >= final_from) {
      const size_t begin = bucket_begin(next_end, bucket_floats_);
      submit(g + begin, next_end - begin);
      next_end = begin;
    }
  };
  try {
    st.backward(0, nullptr, dloss, [&](size_t first, size_t end) {
      if (end != ready_from) return;  // not the tail: waits for the flush below
      ready_from = first;
      ship(ready_from);
    });
    ship(0);
  } catch (...) {
    cancel();
    throw;
  }
}

void BucketReducer::run() {
  std::vector<float> scratch;  // reduce_scatter: padded buckets, this thread's only
  std::unique_lock<std::mutex> lock(m_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    const Bucket b = queue_.front();
    queue_.pop_front();
    if (error_) {
      if (queue_.empty()) idle_.notify_all();
      continue;
    }
    busy_ = true;
    lock.unlock();
    std::exception_ptr err;
    const auto t0 = clock::now();
    try {
      if (collective_ == BucketCollective::reduce_scatter)
        reduce_scatter_bucket(*group_, b.data, b.count, scratch, opt_, *alloc_);
      else
        group_->allreduce(b.data, b.count, comm::ReduceOp::sum, opt_);
    } catch (...) {
      err = std::current_exception();
    }
    const auto t1 = clock::now();
    lock.lock();
    busy_ = false;
    spans_.emplace_back(t0, t1);
    if (err && !error_) error_ = err;
    if (queue_.empty()) idle_.notify_all();
  }
}

}  // namespace troupe::parallel
